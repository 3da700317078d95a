"""``jobgen profiles detect --scheduler ssh`` and ``jobgen doctor`` on ssh profiles, without ssh.

Two emulations stand in for the hosts (the ssh lab, tests/integration/ssh, runs both commands
against real sshd hosts):

- :func:`scripted`: each host answers with probe output written by the test, so hostile values
  (spaces, quotes, line breaks, 300 bytes, bytes that are not UTF-8, malformed JSON) reach the
  parser exactly as a host could print them;
- :func:`this_machine`: the real probe script runs in ``sh`` on this machine, as the remote
  login shell would run it (``$PATH`` may hold a fake ``nvidia-smi``); host ``down`` answers as
  ssh does for a host it cannot reach (exit 255, its message on stderr).

Both replace :func:`jobgen.backends.ssh.backend.run_ssh`, the one place jobgen runs ssh.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import jobgen.backends.ssh.backend as ssh_backend
from jobgen.backends.ssh.detect import parse_host_option, parse_probe, probe_argv
from jobgen.cli import cli
from jobgen.errors import ConfigError
from jobgen.specs.load import load_profile
from jobgen.specs.profile import SshSettings
from tests.conftest import EXAMPLES, write

DOWN = "down.example.org"
DOWN_MESSAGE = b"ssh: connect to host down.example.org port 22: Connection refused\r\n"
H100 = b"NVIDIA H100 80GB HBM3, 81559 MiB\n"


def invoke(*args: str, cwd: Path | None = None):
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args), prog_name="jobgen")
    finally:
        os.chdir(old)


def probe_output(marker: str, *, hostname: bytes = b"node", cpus: bytes = b"16", mem: bytes = b"MemTotal:       65536000 kB",
                 gpus: bytes | None = None, gpu_exit: int = 0, python: bytes | None = None, workdir: bytes = b"writable",
                 cut: str | None = None) -> bytes:
    """What the probe script prints on a host (module docstring of jobgen.backends.ssh.detect);
    ``cut``: the output ends before that section (a script that did not run to its end)."""
    m = marker.encode()
    if python is None:
        python = json.dumps({"version": "3.11.2", "executable": "/usr/bin/python3", "jobgen.train": "0.1.0",
                             "torch": "2.13.0", "lightning": "2.6.6"}).encode()
    parts = [(b"hostname", hostname + b"\n"), (b"cpus", cpus + b"\n"), (b"memory", mem + b"\n"),
             (b"gpus", m + b" absent\n" if gpus is None else gpus + b"\n" + m + b" exit %d\n" % gpu_exit),
             (b"python", python + b"\n" + m + b" exit 0\n"), (b"workdir", m + b" workdir " + workdir + b"\n/srv/runs\n"), (b"end", b"")]
    out = b""
    for name, body in parts:
        if cut is not None and name.decode() == cut:
            break
        out += b"\n" + m + b" section " + name + b"\n" + body
    return out


def marker_of(argv) -> str:
    """The probe's marker: the word after ``sh -s --`` in the remote command."""
    return shlex.split(argv[-1])[3]


@pytest.fixture
def scripted(monkeypatch):
    """``answers[host] = callable(marker) -> stdout bytes``; hosts not in it are not reached."""
    answers: dict[str, object] = {}

    def run_ssh(argv, *, stdin=None, data=None, timeout_s=60.0):
        host = argv[argv.index("--") + 1]
        if host not in answers:
            return subprocess.CompletedProcess(list(argv), 255, b"", DOWN_MESSAGE)
        return subprocess.CompletedProcess(list(argv), 0, answers[host](marker_of(argv)), b"")

    monkeypatch.setattr(ssh_backend, "run_ssh", run_ssh)
    return answers


@pytest.fixture
def this_machine(monkeypatch, tmp_path):
    """Every host but ``down`` is this machine: the remote command runs in ``sh -c`` (in an empty
    directory, so no checkout is importable from it) with ``bin/`` first on ``$PATH``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    # a login environment with OMP_NUM_THREADS set (GNU nproc prints it instead of the CPUs when set)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home),
           "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)) + 7)}
    env.pop("PYTHONPATH", None)

    def run_ssh(argv, *, stdin=None, data=None, timeout_s=60.0):
        host = argv[argv.index("--") + 1]
        if host == DOWN:
            return subprocess.CompletedProcess(list(argv), 255, b"", DOWN_MESSAGE)
        return subprocess.run(["sh", "-c", argv[-1]], input=data, stdin=None if data is not None else subprocess.DEVNULL,
                              capture_output=True, cwd=home, env=env, timeout=timeout_s)

    monkeypatch.setattr(ssh_backend, "run_ssh", run_ssh)
    bare = bin_dir / "bare-python"  # this Python without site-packages: no jobgen, torch or lightning
    bare.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S \"$@\"\n")
    bare.chmod(0o755)
    return bin_dir


def fake_nvidia_smi(bin_dir: Path, lines: str) -> None:
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{lines}EOF\n")
    tool.chmod(0o755)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("value", "host", "port", "user"), [
    ("node1", "node1", None, None), ("alice@node1:2222", "node1", 2222, "alice"), ("a@b@node1", "node1", None, "a@b"),
    ("[fe80::1]:22", "fe80::1", 22, None), ("fe80::1", "fe80::1", None, None),
])
def test_host_option(value, host, port, user):
    assert parse_host_option(value) == (user, host, port)


@pytest.mark.parametrize("value", ["node1:0", "node1:99999", "node1:x", "@node1", "alice@", "[fe80::1", "[fe80::1]x"])
def test_bad_host_option_is_refused_naming_it(value):
    with pytest.raises(ConfigError) as err:
        parse_host_option(value)
    assert err.value.location == "--host" and repr(value) in err.value.message


def test_the_probe_quotes_python_and_workdir():
    settings = SshSettings(hosts=("n1",), python="/opt/my env/bin/python", workdir="~/runs 'a'")
    remote = probe_argv(settings, "n1", "jobgen-abc")[-1]
    assert remote == "sh -s -- jobgen-abc '/opt/my env/bin/python' \"$HOME\"/'runs '\"'\"'a'\"'\"''"


HOSTILE = [b"a b 'c' \"d\"", b"x" * 300, b"caf\xe9 \xff\xfe", b"tab\there \x1b[31mred", b"{not json", b"nul\x00 byte"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_host_output_never_raises(value):
    """Every hostile value in every section: parse_probe returns facts, never raises, and every
    text it keeps is printable and at most 203 characters."""
    for field in ("hostname", "cpus", "mem", "gpus", "python"):
        out = probe_output("M", **{field: value}).decode("utf-8", "surrogateescape")
        facts = parse_probe("n1", out, "M")
        for text in (facts.hostname, facts.gpu_error, facts.python_error, *facts.problems):
            assert text.isprintable() and len(text) <= 260, (field, text)


def test_a_line_break_in_a_gpu_name_or_a_cut_output_is_said():
    facts = parse_probe("n1", probe_output("M", gpus=b"NVIDIA H100\nevil, 80 MiB").decode(), "M")
    assert facts.gpu_error.startswith("nvidia-smi printed 'NVIDIA H100'")
    facts = parse_probe("n1", probe_output("M", cut="python").decode(), "M")
    assert facts.python is None and "lacks section(s) python, workdir, end" in facts.problems[0]
    facts = parse_probe("n1", probe_output("M", python=b'{"version": 3}').decode(), "M")
    assert facts.python is None and facts.python_error.startswith("did not run the probe")


def test_a_host_cannot_forge_a_section():
    """A GPU name holding a section line of another marker stays a GPU line (the marker is random per probe)."""
    facts = parse_probe("n1", probe_output("M1", gpus=b"OTHER section python, 5 MiB").decode(), "M1")
    assert facts.gpus is not None and facts.gpus[0].name == "OTHER section python" and facts.python is not None


# --------------------------------------------------------------------------- detect


def test_detect_writes_the_least_of_the_hosts_with_sources(scripted, tmp_path):
    scripted["n1"] = lambda m: probe_output(m, gpus=H100 * 8, cpus=b"64")
    scripted["n2"] = lambda m: probe_output(m, gpus=H100 * 4, cpus=b"32", mem=b"MemTotal: 1048576 kB")
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "alice@n1:2222", "--host", "alice@n2:2222",
                    "--python", "/opt/venv/bin/python", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    path = tmp_path / "cluster_profiles" / "ssh-n1.yaml"
    assert f"wrote {path.relative_to(tmp_path)}: profile ssh-n1 (2 host(s) (n1, n2), 2 node(s), 4x H100)" in result.stdout
    text = path.read_text()
    profile = load_profile(str(path))
    assert (profile.gpus_per_node, profile.gpu_type, profile.gpu_mem_gib, profile.cpus_per_node, profile.mem_gib_per_node) == (
        4, "H100", 79.6, 32, 1.0)
    assert (profile.ssh.hosts, profile.ssh.user, profile.ssh.port, profile.ssh.python) == (("n1", "n2"), "alice", 2222, "/opt/venv/bin/python")
    assert "# nvidia-smi on n2: 4 GPU(s), the fewest of the 2 host(s)\ngpus_per_node: 4" in text
    assert "# nvidia-smi name 'NVIDIA H100 80GB HBM3' on n1\ngpu_type: H100" in text
    assert "# note: the hosts differ in GPUs (nvidia-smi): n1 8, n2 4; the profile takes the fewest" in text
    assert "# note: the hosts differ in CPUs: n1 64, n2 32" in text
    again = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "alice@n1:2222", "--host", "alice@n2:2222",
                   "--python", "/opt/venv/bin/python", cwd=tmp_path)
    assert again.exit_code == 2 and "exists; jobgen does not overwrite" in again.stderr
    printed = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "alice@n1:2222", "--host", "alice@n2:2222",
                     "--python", "/opt/venv/bin/python", "-o", "yaml", cwd=tmp_path)
    assert printed.stdout == text  # deterministic: the same answers give the same file
    doc = json.loads(invoke("profiles", "detect", "--scheduler", "ssh", "--host", "alice@n1:2222", "--host", "alice@n2:2222",
                            "-o", "json", cwd=tmp_path).stdout)
    assert doc["hosts"] == ["n1", "n2"] and doc["profile"]["gpus_per_node"] == 4 and "partition" not in doc


def test_a_host_that_does_not_answer_is_named_with_ssh_message(scripted, tmp_path):
    scripted["n1"] = lambda m: probe_output(m)
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", "--host", DOWN, cwd=tmp_path)
    assert result.exit_code == 1, result.output
    assert f"1 of 2 host(s) did not answer over ssh:\n  {DOWN} (node 1): ssh: connect to host {DOWN} port 22: Connection refused" \
        in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "cluster_profiles").exists()


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_hostnames_and_gpu_names_are_quoted_or_refused_naming_the_host(scripted, tmp_path, value):
    scripted["n1"] = lambda m: probe_output(m, hostname=value, gpus=b"NVIDIA A100 " + value + b", 40960 MiB")
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", "-o", "yaml", cwd=tmp_path)
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code == 0:
        doc = yaml.safe_load(result.stdout)
        assert doc["gpu_type"] == "A100" and doc["gpu_mem_gib"] == 40.0
        assert all(line.isprintable() for line in result.stdout.splitlines())  # comments show host text escaped
    else:
        assert result.exit_code == 2 and "host n1: nvidia-smi printed" in result.output, result.output


@pytest.mark.parametrize(("answers", "needle"), [
    ({"cpus": b"many"}, "host n1: nproc printed 'many', not a CPU count"),
    ({"mem": b"MemTotal: lots"}, "host n1: /proc/meminfo's MemTotal line reads 'MemTotal: lots'"),
    ({"cut": "memory"}, "host n1: the probe's output lacks section(s) memory"),
    ({"gpus": b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", "gpu_exit": 9},
     "host n1: nvidia-smi failed (exit 9): NVIDIA-SMI has failed"),
])
def test_output_a_profile_needs_and_cannot_read_is_refused_naming_the_host(scripted, tmp_path, answers, needle):
    scripted["n1"] = lambda m: probe_output(m, **answers)
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", cwd=tmp_path)
    assert result.exit_code == 2 and needle in result.stderr, result.output
    assert "Traceback" not in result.output


def test_gpu_models_unknown_or_mixed_are_refused_and_gpu_type_decides(scripted, tmp_path):
    scripted["n1"] = lambda m: probe_output(m, gpus=b"Acme Tensor 9000, 16384 MiB")
    unknown = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", cwd=tmp_path)
    assert unknown.exit_code == 2 and "'Acme Tensor 9000', of no model jobgen knows" in unknown.stderr and "--gpu-type" in unknown.stderr
    given = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", "--gpu-type", "L4", "-o", "yaml", cwd=tmp_path)
    assert given.exit_code == 0 and "# --gpu-type\ngpu_type: L4\n" in given.stdout, given.output
    scripted["n2"] = lambda m: probe_output(m, gpus=H100)
    scripted["n1"] = lambda m: probe_output(m, gpus=b"NVIDIA A100-SXM4-80GB, 81920 MiB")
    mixed = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", "--host", "n2", cwd=tmp_path)
    assert mixed.exit_code == 2 and "GPUs of several models (n1: A100; n2: H100)" in mixed.stderr


def test_hosts_with_different_users_or_ports_and_misplaced_options_are_refused(scripted, tmp_path):
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "a@n1", "--host", "b@n2", cwd=tmp_path)
    assert result.exit_code == 2 and "the hosts differ in user" in result.stderr
    assert invoke("profiles", "detect", "--scheduler", "ssh", cwd=tmp_path).exit_code == 2
    assert invoke("profiles", "detect", "--scheduler", "slurm", "--host", "n1", cwd=tmp_path).exit_code == 2
    bad = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "-oProxyCommand=x", cwd=tmp_path)
    assert bad.exit_code == 2 and "starts with '-'" in bad.stderr


@pytest.mark.parametrize("host", ["node 1", "a'b", "n1;touch x", "n1\nn2", "é" * 150 + " x", "-n1", ""])
def test_hostile_host_options_are_refused_before_any_ssh(scripted, tmp_path, host):
    called = []
    scripted["n1"] = lambda m: called.append(m) or probe_output(m)
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", host, cwd=tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.output and "--host" in result.stderr, result.output
    assert called == [] and not (tmp_path / "cluster_profiles").exists()


def test_profile_set_reaches_the_hosts_and_the_file(scripted, tmp_path):
    seen = []
    scripted["n1"] = lambda m: seen.append(m) or probe_output(m)
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", "--profile-set", "ssh.workdir=/scratch/my runs",
                    "--profile-set", "network_fabric=infiniband", "-o", "yaml", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.stdout)
    assert doc["ssh"]["workdir"] == "/scratch/my runs" and doc["network_fabric"] == "infiniband"
    assert "  # --profile-set\n  workdir: /scratch/my runs" in result.stdout


def test_the_real_probe_on_this_machine(this_machine, tmp_path):
    """The probe script itself, in sh: this machine's CPUs (not the login's OMP_NUM_THREADS) and
    memory, a fake nvidia-smi's GPUs, and an interpreter without jobgen noted (the profile is
    still written)."""
    fake_nvidia_smi(this_machine, "NVIDIA L4, 23034 MiB\nNVIDIA L4, 23034 MiB\n")
    result = invoke("profiles", "detect", "--scheduler", "ssh", "--host", "n1", "--python", "bare-python", "-o", "yaml",
                    cwd=tmp_path)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.stdout)
    mem_kib = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:")).split()[1])
    assert doc["cpus_per_node"] == len(os.sched_getaffinity(0)) and doc["mem_gib_per_node"] == int(mem_kib * 100 / 1024 / 1024) / 100
    assert (doc["gpus_per_node"], doc["gpu_type"], doc["gpu_mem_gib"]) == (2, "L4", 22.4)
    assert "# note: host n1: bare-python cannot import jobgen.train: ModuleNotFoundError" in result.stdout


# --------------------------------------------------------------------------- doctor


def ssh_profile(tmp_path: Path, hosts: list[str], python: str = sys.executable, extra: str = "", workdir: str | None = None) -> Path:
    workdir = workdir or str(tmp_path / "work dir's")
    return write(tmp_path / "prof.yaml", f"scheduler: ssh\nmax_nodes: {len(hosts)}\ndefault_nodes: {len(hosts)}\n{extra}"
                 f"ssh:\n  hosts: {json.dumps(hosts)}\n  python: {json.dumps(python)}\n  workdir: {json.dumps(workdir)}\n")


def doctor(profile: Path, *args: str) -> tuple[int, dict[str, dict]]:
    result = invoke("doctor", "--profile", str(profile), *args, "-o", "json")
    assert "Traceback" not in result.output, result.output
    return result.exit_code, {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def test_doctor_python_without_jobgen_fails_only_its_line_naming_the_host(this_machine, tmp_path):
    code, found = doctor(ssh_profile(tmp_path, ["n1"], python="bare-python"))
    assert code == 1
    assert [n for n, c in found.items() if c["status"] == "fail"] == ["ssh.python[n1]"], found
    check = found["ssh.python[n1]"]
    assert "n1: bare-python (Python " in check["detail"] and "cannot import jobgen.train: ModuleNotFoundError" in check["detail"]
    assert "on n1: `bare-python -m pip install '<jobgen checkout or wheel>[train]'`" in check["fix"]
    assert found["ssh.gpus[n1]"]["status"] == "pass" and "CPU profile" in found["ssh.gpus[n1]"]["detail"]
    assert found["ssh.workdir[n1]"]["status"] == "pass" and "missing; submit creates it" in found["ssh.workdir[n1]"]["detail"]


def test_doctor_names_an_unreachable_host_and_skips_its_other_checks(this_machine, tmp_path):
    code, found = doctor(ssh_profile(tmp_path, ["n1", DOWN], python="/bin/no-such-python"))
    assert code == 1
    assert found[f"ssh.reachable[{DOWN}]"]["status"] == "fail" and "Connection refused" in found[f"ssh.reachable[{DOWN}]"]["detail"]
    assert "BatchMode=yes" in found[f"ssh.reachable[{DOWN}]"]["fix"]
    assert {found[f"ssh.{c}[{DOWN}]"]["detail"] for c in ("python", "gpus", "workdir")} == {f"not checked: ssh.reachable[{DOWN}] failed"}
    assert found["ssh.python[n1]"]["status"] == "fail" and "not found" in found["ssh.python[n1]"]["detail"]
    assert found["ssh.shared_workdir"]["status"] == "skip" and "no spec given" in found["ssh.shared_workdir"]["detail"]


def test_doctor_gpus_and_workdir_fail_with_the_fix(this_machine, tmp_path):
    fake_nvidia_smi(this_machine, "NVIDIA A100-SXM4-40GB, 40960 MiB\n")
    afile = write(tmp_path / "a file", "")
    profile = ssh_profile(tmp_path, ["n1"], python="bare-python", extra="gpus_per_node: 8\ngpu_type: H100\n", workdir=str(afile))
    code, found = doctor(profile)
    assert code == 1
    gpus = found["ssh.gpus[n1]"]
    assert gpus["status"] == "fail" and gpus["detail"] == "the profile uses 8 GPU(s) per host; n1 has 1 GPU(s) (NVIDIA A100-SXM4-40GB)"
    assert gpus["fix"] == f"set gpus_per_node: 1 in {profile}"
    assert found["ssh.workdir[n1]"]["status"] == "fail" and "exists and is not a directory" in found["ssh.workdir[n1]"]["detail"]
    code, found = doctor(ssh_profile(tmp_path, ["n1"], python="bare-python", extra="gpus_per_node: 1\ngpu_type: H100\n"))
    assert found["ssh.gpus[n1]"]["status"] == "fail" and found["ssh.gpus[n1]"]["fix"].startswith("set gpu_type: A100 in ")


def test_doctor_shared_workdir_is_skipped_when_the_spec_does_not_resume(this_machine, tmp_path):
    code, found = doctor(ssh_profile(tmp_path, ["n1", "n2"], python="bare-python"), str(EXAMPLES / "quickstart.yaml"),
                         "--set", "checkpoint.resume=never")
    assert found["ssh.shared_workdir"]["status"] == "skip" and "does not resume" in found["ssh.shared_workdir"]["detail"]
