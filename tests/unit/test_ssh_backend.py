"""``scheduler: ssh`` without the lab: the profile's rules, the planned launch script and command
lines, their quoting (the remote commands run here under a real shell, in directories with odd
names), the job's state from the hosts' reports, and submit's order (every host probed before
anything is copied; what starts is what the plan shows) through a fake ssh runner.
The real thing, two sshd hosts, is tests/integration/ssh."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jobgen import api
from jobgen.backends import plan as plan_job
from jobgen.backends.base import LogOptions, SubmitOptions
from jobgen.backends.ssh import backend as ssh
from jobgen.backends.ssh.launch import (
    NodeReport,
    copy_command,
    handle_for,
    job_state,
    job_tag,
    parse_report,
    run_dir,
    ssh_argv,
    start_command,
    status_command,
    stop_command,
)
from jobgen.errors import ConfigError, PlanError, SubmitError
from jobgen.jobdir import (
    LAUNCH_FILE,
    SPEC_FILE,
    SSH_JOB_ENV,
    SUBMISSION_FILE,
    JobHandle,
    Submission,
    find_submission,
    read_resolved_spec,
    state_record_path,
)
from jobgen.specs.load import load_profile, load_spec
from jobgen.specs.profile import ClusterProfile, SshSettings
from tests.conftest import ADVERSARIAL, EXAMPLES, PROFILES, TEMPLATES, lint_bash, site_profile, write


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))


def ssh_profile(tmp_path: Path, ssh_section: str, **top: object) -> ClusterProfile:
    fields = {"scheduler": "ssh", "max_nodes": 2, "default_nodes": 2, **top}
    text = "".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()) + f"ssh: {ssh_section}\n"
    write(tmp_path / "profiles" / "site.yaml", text)
    return load_profile("site", tmp_path / "profiles")


# --------------------------------------------------------------------------- the profile


@pytest.mark.parametrize(("section", "top", "message"), [
    ('{hosts: [a, "box 1"], workdir: /w}', {}, r"ssh\.hosts: host 'box 1' holds ' ', which OpenSSH refuses"),
    ("{hosts: [a, -oProxyCommand=x], workdir: /w}", {}, r"starts with '-'"),
    ("{hosts: [a, a], workdir: /w}", {}, r"lists a more than once"),
    ("{hosts: [a, 'b;c'], workdir: /w}", {}, r"holds ';'"),
    ("{hosts: [a, b], workdir: runs}", {}, r"ssh\.workdir: .*not an absolute path"),
    ('{hosts: [a, b], workdir: "/w\\nx"}', {}, r"newlines"),
    ('{hosts: [a, b], workdir: /w, known_hosts: "/my keys/kh"}', {}, r"known_hosts '/my keys/kh' is empty or holds ' '"),
    ("{hosts: [a, b], workdir: /w, identity_file: /k/id_%h}", {}, r"identity_file .* holds '%'"),
    ("{hosts: [a, b], workdir: /w, options: [BatchMode=no]}", {}, r"jobgen sets BatchMode itself"),
    ("{hosts: [a, b], workdir: /w, options: [Port=2222]}", {}, r"use ssh\.port"),
    ("{hosts: [a, b], workdir: /w, options: [ProxyJump]}", {}, r"is not Key=Value"),
    ("{hosts: [a, b], workdir: /w}", {"max_nodes": 3}, r"max_nodes=3 but ssh\.hosts lists 2 host\(s\)"),
    ("{hosts: [a, b], workdir: /w, user: '-l'}", {}, r"user '-l' is empty or starts with '-'"),
    # OpenSSH (9.6 valid_ruser) refuses '-' after a blank and '\' at the end of a user name
    ("{hosts: [a, b], workdir: /w, user: 'bob -oProxyCommand=touch x'}", {}, r"ssh\.user: .*'-' after a blank"),
    ("{hosts: [a, b], workdir: /w, user: 'alice smith -i'}", {}, r"ssh\.user: .*'-' after a blank"),
    ("{hosts: [a, b], workdir: /w, user: 'bob\\'}", {}, r"ssh\.user: .*holds '\\\\'"),
    # options that run a program (or load code) on the submitting machine: one rule
    *[("{hosts: [a, b], workdir: /w, options: ['" + key + "=x']}", {}, rf"ssh\.options: .*{key}.*runs a program or loads code on this machine")
      for key in ("ProxyCommand", "proxycommand", "KnownHostsCommand", "LocalCommand", "PermitLocalCommand", "PKCS11Provider",
                  "SecurityKeyProvider", "XAuthLocation")],
])
def test_bad_ssh_settings_are_refused_at_load(tmp_path, section, top, message):
    with pytest.raises(ConfigError, match=message):
        ssh_profile(tmp_path, section, **top)


def test_scheduler_ssh_needs_its_section(tmp_path):
    write(tmp_path / "profiles" / "site.yaml", "scheduler: ssh\n")
    with pytest.raises(ConfigError, match="scheduler 'ssh' needs an 'ssh:' section"):
        load_profile("site", tmp_path / "profiles")


def test_a_user_name_with_a_space_is_one_argument_and_quoted_where_shown(tmp_path):
    prof = ssh_profile(tmp_path, "{hosts: [gpu-a, gpu-b], workdir: /w, user: 'alice smith', port: 2222, "
                                 "identity_file: '~/.ssh/lab key', known_hosts: /etc/jobgen/known_hosts, options: [ProxyJump=bastion]}")
    argv = ssh_argv(prof.ssh, "gpu-b", "true")
    assert argv[:5] == ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
    assert argv[argv.index("-l") + 1] == "alice smith" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-i") + 1] == "~/.ssh/lab key" and "IdentitiesOnly=yes" in argv
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/etc/jobgen/known_hosts" in argv
    assert "ProxyJump=bastion" in argv and argv[-3:] == ("--", "gpu-b", "true")
    job_plan = plan_job(load_spec(EXAMPLES / "quickstart.yaml"), prof, TEMPLATES)
    assert "-l 'alice smith'" in str(job_plan) and "-i '~/.ssh/lab key'" in str(job_plan)
    default = SshSettings(hosts=("h",), workdir="/w")
    assert "StrictHostKeyChecking=accept-new" in ssh_argv(default, "h", "true") and "-l" not in ssh_argv(default, "h", "true")


# --------------------------------------------------------------------------- the plan


def test_launch_script_and_per_host_lines(tmp_path):
    job_plan = plan_job(load_spec(EXAMPLES / "quickstart.yaml"), load_profile("ssh-2node", PROFILES), TEMPLATES)
    assert job_plan.scheduler == "ssh" and sorted(dict(job_plan.files)) == [LAUNCH_FILE, SPEC_FILE]
    script = job_plan.file(LAUNCH_FILE)
    for rank, host in enumerate(("node1.example.org", "node2.example.org")):
        assert (f"#   {host}: bash launch.sh {rank}\n#       = python3 -m torch.distributed.run --nnodes 2 --node-rank {rank} "
                "--nproc-per-node 1 --master-addr node1.example.org --master-port 29500 --tee 3 -m jobgen.train "
                '--spec "${JOB_DIR}"/spec.json --run-dir "${RUN_DIR}"\n') in script
    assert ('python3 -m torch.distributed.run --nnodes 2 --node-rank "${NODE_RANK}" --nproc-per-node 1 --master-addr '
            "node1.example.org --master-port 29500") in script
    path = write(tmp_path / LAUNCH_FILE, script)
    lint_bash(path)
    launch = json.loads(job_plan.file(SPEC_FILE))["launch"]
    assert launch["scheduler"] == "ssh" and launch["ssh"]["hosts"] == ["node1.example.org", "node2.example.org"]
    starts = [s for s in job_plan.submit_steps if "launch.sh" in s.argv[-1]]
    assert [s.argv[-3:-1] for s in starts] == [("--", "node1.example.org"), ("--", "node2.example.org")]
    assert ["bash job/launch.sh 0" in starts[0].argv[-1], "bash job/launch.sh 1" in starts[1].argv[-1]] == [True, True]


def test_gpu_hosts_run_one_rank_per_gpu_with_the_nccl_preset(tmp_path):
    prof = ssh_profile(tmp_path, "{hosts: [a, b, c], workdir: /w, master_addr: 10.0.0.1, master_port: 29999}", max_nodes=3,
                       gpus_per_node=8, gpu_type="H100", cpus_per_node=64, network_fabric="infiniband")
    job_plan = plan_job(load_spec(EXAMPLES / "quickstart.yaml"), prof, TEMPLATES)
    script = job_plan.file(LAUNCH_FILE)
    assert "--nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr 10.0.0.1 --master-port 29999" in script
    assert "export NCCL_IB_DISABLE=0\n" in script and "export OMP_NUM_THREADS=8\n" in script
    assert "#   c: bash launch.sh" not in script  # a 2-node job runs on the first 2 hosts
    assert json.loads(job_plan.file(SPEC_FILE))["launch"]["ssh"]["hosts"] == ["a", "b"]


def test_elastic_ranges_and_command_mode_are_refused_at_plan_time(tmp_path):
    prof = load_profile("ssh-2node", PROFILES)
    spec = load_spec(EXAMPLES / "quickstart.yaml", ["resources.nodes=1:2"])
    with pytest.raises(PlanError, match="starts a fixed list of hosts over ssh"):
        plan_job(spec, prof, TEMPLATES)
    with pytest.raises(PlanError, match=r"entrypoint.*runs the bundled entrypoint"):
        plan_job(load_spec(EXAMPLES / "command-ddp.yaml"), prof, TEMPLATES)


def test_handles_name_the_first_host():
    handle = JobHandle.parse("ssh://gpu-a/srv/jobgen runs/quickstart")
    assert (handle.scheduler, handle.cluster, handle.path) == ("ssh", "gpu-a", "gpu-a/srv/jobgen runs/quickstart")
    settings = SshSettings(hosts=("gpu-a", "gpu-b"), workdir="/srv/jobgen runs/")
    assert handle_for(settings, "quickstart") == handle and run_dir(settings, "quickstart") == "/srv/jobgen runs/quickstart"


# --------------------------------------------------------------------------- the remote commands, run by a shell here


def stub_python(tmp_path: Path) -> Path:
    """An interpreter stand-in for launch.sh's torchrun line: records its arguments and the
    secret it sees, then waits (as training would) until it is stopped."""
    return write(tmp_path / "bin" / "python", '#!/bin/bash\nprintf "%s\\n" "$@" > "${RUN_DIR}/argv"\n'
                 'printf "%s" "${HF_TOKEN:-}" > "${RUN_DIR}/secret"\n'
                 'printf "%s" "${JOBGEN_SPEC_SOURCE:-}" > "${RUN_DIR}/spec_source"\n'
                 'printf "%s" "${JOBGEN_RESTART_COUNT-unset}" > "${RUN_DIR}/restart_count"\nexec sleep 60\n')


def sh(command: str, *, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``command`` as a remote login shell gets it from ssh (``bash -c``)."""
    return subprocess.run(["bash", "-c", command], input=data, capture_output=True, timeout=30, cwd="/")


@pytest.mark.parametrize("name", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_remote_commands_quote_odd_work_directories(tmp_path, name, monkeypatch):
    """Copy, start, status and cancel, as the hosts run them, in a work directory named ``name``:
    the files land there, the launch gets its node rank and run directory intact, a secret arrives
    through stdin, the spec file's name (the same odd name, a newline and an escape added)
    arrives printable, a restart's count arrives as JOBGEN_RESTART_COUNT, status sees the job's
    processes, cancel leaves none, nothing else is touched."""
    stub = stub_python(tmp_path)
    stub.chmod(0o755)
    settings = SshSettings(hosts=("h",), workdir=str(tmp_path / name), python=str(stub))
    prof = ClusterProfile(name="t", scheduler="ssh", max_nodes=1, ssh=settings)
    spec = load_spec(EXAMPLES / "quickstart.yaml", ["secrets=[HF_TOKEN]"])
    job_plan = plan_job(spec, prof, TEMPLATES)
    job_dir = tmp_path / "local" / "job"
    job_plan.write(job_dir)
    archive = io.BytesIO()
    ssh.pack(job_dir, None, archive)
    run = run_dir(settings, "quickstart")
    handle = handle_for(settings, "quickstart")
    assert sh(copy_command(run), data=archive.getvalue()).returncode == 0
    assert (Path(run) / "job" / LAUNCH_FILE).is_file() and os.access(Path(run) / "job" / LAUNCH_FILE, os.X_OK)
    secret = "va'l ue $(touch PWNED) \\"
    try:
        spec_source = f"/specs/{name}\n\x1b[2J.yaml"
        started = sh(start_command(run, 0, handle, code_dir=None, secrets=("HF_TOKEN",), spec_source=spec_source, restart=2),
                     data=f"HF_TOKEN={secret}\n".encode())
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 20
        while not (Path(run) / "argv").is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        report = parse_report("h", 0, sh(status_command(run, 0, handle)).stdout.decode())
        assert report.pid is not None and report.procs == 2 and report.exit_code is None  # launch.sh + the stand-in
        assert job_state([report])[0] == "RUNNING"
        argv = (Path(run) / "argv").read_text().splitlines()
        assert argv[argv.index("--node-rank") + 1] == "0" and argv[argv.index("--run-dir") + 1] == run
        assert argv[argv.index("--spec") + 1] == f"{run}/job/{SPEC_FILE}"
        time.sleep(0.2)
        assert (Path(run) / "secret").read_text() == secret
        assert (Path(run) / "spec_source").read_text() == f"/specs/{name}\\n\\x1b[2J.yaml"
        assert (Path(run) / "restart_count").read_text() == "2"
        assert sh(stop_command(run, 0, handle)).returncode == 0
        deadline = time.monotonic() + 20
        while (report := parse_report("h", 0, sh(status_command(run, 0, handle)).stdout.decode())).procs and time.monotonic() < deadline:
            time.sleep(0.1)
        assert report.procs == 0 and report.cancelled and report.exit_code is not None
        assert job_state([report])[0] == "CANCELLED"
    finally:
        sh(ssh.kill_command(handle, 0))
    assert not list(tmp_path.rglob("PWNED")) and not Path("/PWNED").exists()


def test_status_never_reads_no_processes_and_no_exit_code_for_a_launch_that_ended(tmp_path):
    """CI saw a cancelled launch reported with 0 processes and no exit code: status read the exit
    file, then the launch wrote it and ended, then status counted 0 processes. The process count
    comes first, so a launch that counted as gone wrote its exit code before status reads it. A
    ``grep`` that waits 0.6 s before counting holds status in that window: the stand-in launch
    (tagged like a job's process) writes its exit code and ends 0.3 s after status starts."""
    run = tmp_path / "run"
    run.mkdir()
    handle = JobHandle("ssh", "h/w/job")
    real_grep = subprocess.run(["bash", "-c", "command -v grep"], capture_output=True, text=True).stdout.strip()
    slow = write(tmp_path / "bin" / "grep", f'#!/bin/bash\nsleep 0.6\nexec {real_grep} "$@"\n')
    slow.chmod(0o755)
    env = {**os.environ, SSH_JOB_ENV: job_tag(handle, 0)}
    launch = subprocess.Popen(["bash", "-c", "sleep 0.3; echo 143 > node-0.exit.tmp && mv node-0.exit.tmp node-0.exit"],
                              cwd=run, env=env)
    try:
        out = subprocess.run(["bash", "-c", status_command(str(run), 0, handle)], capture_output=True, timeout=30,
                             env={**os.environ, "PATH": f"{slow.parent}:{os.environ['PATH']}"})
    finally:
        launch.wait(timeout=30)
    report = parse_report("h", 0, out.stdout.decode())
    assert report.procs == 0 and report.exit_code == 143, report


# --------------------------------------------------------------------------- the job's state


def node(rank: int, **fields: object) -> NodeReport:
    return NodeReport(f"h{rank}", rank, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("nodes", "state", "detail"), [
    ([node(0, pid=1, procs=3), node(1, pid=2, exit_code=1)], "RUNNING", ("node 1", "h1: 0 process(es), exit 1")),
    ([node(0, pid=1, exit_code=0), node(1, pid=2, exit_code=0)], "COMPLETED", ("exit_code", "0")),
    ([node(0, pid=1, exit_code=0), node(1, pid=2, exit_code=3)], "FAILED", ("exit_code", "3")),
    ([node(0, pid=1, exit_code=143, cancelled=True), node(1, pid=2, exit_code=143, cancelled=True)], "CANCELLED", None),
    ([node(0, pid=1, exit_code=1, cancelled=True), node(1, reached=False, error="timed out")], "UNKNOWN", ("reason", "not reached: h1")),
    ([node(0, pid=1), node(1)], "PENDING", ("node 1", "h1: 0 process(es), not started")),
    ([node(0, pid=1), node(1, pid=2, exit_code=0)], "UNKNOWN", ("reason", "the launch ended without an exit code on h0")),
    ([node(0, run_dir=False), node(1, pid=2, exit_code=0)], "UNKNOWN", ("reason", "no run directory on h0")),
])
def test_the_jobs_state_from_every_hosts_report(nodes, state, detail):
    got, details = job_state(nodes)
    assert got == state
    if detail is not None:
        assert details[detail[0]] == detail[1]


def test_reports_are_read_from_the_status_commands_lines():
    assert parse_report("h", 0, "pid=12\nexit=\ncancelled=0\nprocs=3\n") == NodeReport("h", 0, pid=12, procs=3)
    assert parse_report("h", 1, "pid=\nexit=0\ncancelled=1\nprocs=0\n") == NodeReport("h", 1, exit_code=0, cancelled=True)
    assert parse_report("h", 0, "dir=missing\n") == NodeReport("h", 0, run_dir=False)


# --------------------------------------------------------------------------- submit, through a fake ssh


class FakeHosts:
    """Stands in for :func:`jobgen.backends.ssh.backend.run_ssh`: records (argv, stdin bytes); hosts in
    ``down`` do not answer (exit 255), ``missing`` tools are reported by the probe, and each
    status says the launch runs."""

    def __init__(self, down: tuple[str, ...] = (), missing: str = "", fail_start: str = "", dead: str = "",
                 on_start: Callable[[str], None] | None = None):
        self.calls: list[tuple[tuple[str, ...], bytes | None]] = []
        self.down, self.missing, self.fail_start, self.dead, self.on_start = down, missing, fail_start, dead, on_start

    def __call__(self, argv, *, stdin=None, data=None, timeout_s=60.0):
        argv = tuple(argv)
        host, remote = argv[argv.index("--") + 1], argv[-1]
        self.calls.append((argv, stdin.read() if stdin is not None else data))
        if host in self.down:
            return subprocess.CompletedProcess(argv, 255, b"", b"ssh: connect to host " + host.encode() + b" port 22: No route to host\n")
        if remote.startswith("for tool in") and self.missing:
            return subprocess.CompletedProcess(argv, 0, f"jobgen-missing: {self.missing}\n".encode(), b"")
        if "setsid -f" in remote and host == self.fail_start:
            return subprocess.CompletedProcess(argv, 1, b"", b"bash: setsid: Permission denied\n")
        if "setsid -f" in remote and self.on_start is not None:
            self.on_start(host)
        if "procs=" in remote and host == self.dead:  # the launch ended before it wrote its PID
            return subprocess.CompletedProcess(argv, 0, b"pid=\nexit=\ncancelled=0\nprocs=0\n", b"")
        if "tail -c" in remote and host == self.dead:
            return subprocess.CompletedProcess(argv, 0, b"bash: job/launch.sh: No such file or directory\n", b"")
        if "procs=" in remote:
            return subprocess.CompletedProcess(argv, 0, b"pid=42\nexit=\ncancelled=0\nprocs=3\n", b"")
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    def of(self, word: str) -> list[tuple[str, ...]]:
        return sorted(argv for argv, _ in self.calls if word in argv[-1])


@pytest.fixture
def quickstart(tmp_path):
    spec = tmp_path / "quickstart.yaml"  # outside a git work tree: no code snapshot
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text())
    return api.plan_job(spec, str(site_profile(tmp_path / "site", "ssh-2node")))  # its example hosts set: submit takes it


def test_submit_runs_the_planned_commands_and_records_the_hosts(tmp_path, monkeypatch, quickstart):
    fake = FakeHosts()
    monkeypatch.setattr(ssh, "run_ssh", fake)
    result = api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    steps = [s.argv for s in quickstart.submit_steps]
    probes, copies, starts = steps[:2], steps[2:4], steps[4:6]
    # the plan's start commands, plus the spec file submit read (named by the entrypoint's input errors)
    source = f"JOBGEN_SPEC_SOURCE={tmp_path / 'quickstart.yaml'}"
    starts = [(*argv[:-1], argv[-1].replace(" setsid -f ", f" {source} setsid -f ")) for argv in starts]
    assert [argv for argv, _ in fake.calls[:2]] in (probes, probes[::-1])  # every host probed first
    assert fake.of("tar -x") == sorted(copies) and fake.of("setsid -f") == sorted(starts)
    order = [next(i for i, (a, _) in enumerate(fake.calls) if a == argv) for argv in (*probes, *copies, *starts)]
    assert max(order[:2]) < min(order[2:4]) and max(order[2:4]) < min(order[4:])
    archive = next(body for argv, body in fake.calls if argv == copies[1])
    names = tarfile.open(fileobj=io.BytesIO(archive)).getnames()
    assert "job/launch.sh" in names and "job/spec.json" in names and not any(SUBMISSION_FILE in n for n in names)
    assert result.action == "submitted" and str(result.handle) == "ssh://node1.example.org/srv/jobgen-runs/quickstart"
    record = Submission.load(tmp_path / "runs" / "quickstart" / "job" / SUBMISSION_FILE)
    assert record.ssh is not None and record.ssh.hosts == ("node1.example.org", "node2.example.org")
    assert record.run_dir == "/srv/jobgen-runs/quickstart" and api.status(str(result.handle)).state == "RUNNING"


def test_an_unreachable_host_is_named_and_nothing_is_copied_or_started(tmp_path, monkeypatch, quickstart):
    fake = FakeHosts(down=("node2.example.org",))
    monkeypatch.setattr(ssh, "run_ssh", fake)
    with pytest.raises(SubmitError, match=r"1 of 2 host\(s\) not ready; nothing was copied or started:\n  node2\.example\.org "
                                          r"\(node 1\): cannot be reached: ssh: connect to host node2\.example\.org port 22: No route"):
        api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert all(argv[-1].startswith("for tool in") for argv, _ in fake.calls) and len(fake.calls) == 2
    assert not (tmp_path / "runs" / "quickstart").exists()  # the rendered job directory is taken back too


def test_a_missing_tool_is_named_before_anything_is_copied(tmp_path, monkeypatch, quickstart):
    monkeypatch.setattr(ssh, "run_ssh", fake := FakeHosts(missing="setsid"))
    with pytest.raises(SubmitError, match=r"node1\.example\.org \(node 0\): lacks setsid") as info:
        api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert "util-linux" in info.value.hint and not fake.of("tar -x")


def test_a_start_that_fails_on_one_host_stops_the_others(tmp_path, monkeypatch, quickstart):
    monkeypatch.setattr(ssh, "run_ssh", fake := FakeHosts(fail_start="node2.example.org"))
    with pytest.raises(SubmitError, match=r"what started was stopped again:\n  node2\.example\.org \(node 1\): bash: setsid"):
        api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert len(fake.of("kill -KILL")) == 2


def test_secrets_reach_the_start_on_stdin_only(tmp_path, monkeypatch):
    spec = tmp_path / "quickstart.yaml"
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text() + "secrets: [HF_TOKEN]\n")
    job_plan = api.plan_job(spec, str(site_profile(tmp_path / "site", "ssh-2node")))
    monkeypatch.setattr(ssh, "run_ssh", fake := FakeHosts())
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="HF_TOKEN"):
        api.submit(job_plan, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert fake.calls == []  # refused before any host was asked
    monkeypatch.setenv("HF_TOKEN", "s3cret value")
    api.submit(job_plan, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    starts = [(argv, body) for argv, body in fake.calls if "setsid -f" in argv[-1]]
    assert [body for _, body in starts] == [b"HF_TOKEN=s3cret value\n"] * 2
    assert not any("s3cret" in " ".join(argv) for argv, _ in fake.calls)
    assert "s3cret" not in read_resolved_spec(tmp_path / "runs" / "quickstart" / "job").model_dump_json()


def test_a_restart_starts_every_host_with_its_restart_count(tmp_path, monkeypatch, quickstart):
    """The restart watcher's start of the hosts (:func:`~jobgen.backends.ssh.backend.restart_hosts`)
    hands each launch ``JOBGEN_RESTART_COUNT=<restarts used>``, which the entrypoint's
    notifications read (``restart``); submit's first start sets none (the count is 0 there, as a
    SLURM job's first start has no ``SLURM_RESTART_COUNT``)."""
    monkeypatch.setattr(ssh, "run_ssh", fake := FakeHosts())
    result = api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    first = fake.of("setsid -f")
    assert len(first) == 2 and not any("JOBGEN_RESTART_COUNT" in argv[-1] for argv in first), first
    fake.calls.clear()
    assert ssh.restart_hosts(result.handle, spec_source=str(tmp_path / "quickstart.yaml"), restart=1) == []
    again = fake.of("setsid -f")
    assert len(again) == 2 and all("JOBGEN_RESTART_COUNT=1" in shlex.split(argv[-1]) for argv in again), again
    # otherwise the start is the first one's: same hosts, node ranks and run directory
    assert [a[-1].replace(" JOBGEN_RESTART_COUNT=1", "") for a in again] == [a[-1] for a in first]


def test_logs_name_the_nodes_of_the_job(tmp_path, monkeypatch, quickstart):
    monkeypatch.setattr(ssh, "run_ssh", FakeHosts())
    result = api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    with pytest.raises(ConfigError, match=r"(?s)--replica .node-2. is not a node of .*hint: one of: node-0 \(node1\.example\.org\), node-1"):
        api.logs(str(result.handle), LogOptions(replica="node-2"), lambda _: None)
    with pytest.raises(ConfigError, match=r"--rank does not apply to ssh jobs"):
        api.logs(str(result.handle), LogOptions(rank="0"), lambda _: None)
    with pytest.raises(ConfigError, match="no submission of ssh://elsewhere/x is recorded on this machine"):
        api.status("ssh://elsewhere/x")


# --------------------------------------------------------------------------- hostile names and workdirs

#: Names that tar (or another remote tool) would read as escapes: GNU tar un-escapes ``\057`` (``/``),
#: ``\t``, ``\\`` in its ``-C`` directory, so ``..\057..\057escaped`` left the run directory.
TAR_ESCAPES = ["..\\057..\\057escaped", "tab\\tand\\\\", "oct\\101\\", "nel\x85del\x7f", "日本語 é"]


@pytest.mark.parametrize("where", ["name", "workdir"])
@pytest.mark.parametrize("name", [*TAR_ESCAPES, *[a for a in ADVERSARIAL if not a.startswith("-")]])
def test_the_copy_lands_in_the_run_directory_whatever_the_job_and_workdir_names(tmp_path, name, where):
    """The copy, as a host runs it, with ``name`` as the job name or in the workdir: launch.sh
    and spec.json arrive in ``<workdir>/<job name>/job/`` byte for byte, and nothing is written
    anywhere else on the host (``a/escaped`` exists, as a directory an attacker aims at would)."""
    host = tmp_path / "host"
    (host / "a" / "escaped").mkdir(parents=True)
    workdir = host / "a" / "b" / "runs"
    settings = SshSettings(hosts=("h",), workdir=str(workdir / name if where == "workdir" else workdir))
    prof = ClusterProfile(name="t", scheduler="ssh", max_nodes=1, ssh=settings)
    job_name = name if where == "name" else "quickstart"
    spec = load_spec(EXAMPLES / "quickstart.yaml", [f"name={json.dumps(job_name)}"])
    assert spec.name == job_name
    job_plan = plan_job(spec, prof, TEMPLATES)
    job_dir = tmp_path / "local" / "job"
    job_plan.write(job_dir)
    archive = io.BytesIO()
    ssh.pack(job_dir, None, archive)
    run = run_dir(settings, job_name)
    copied = sh(copy_command(run), data=archive.getvalue())
    assert copied.returncode == 0, copied.stderr
    for file in (LAUNCH_FILE, SPEC_FILE):
        assert (Path(run) / "job" / file).read_bytes() == (job_dir / file).read_bytes()
    inside = Path(run).relative_to(host)
    written = [p.relative_to(host) for p in host.rglob("*")]
    strays = [p for p in written if not (p == inside or inside in p.parents or p in inside.parents or p.parts == ("a", "escaped"))]
    assert strays == []


def test_a_launch_that_ends_before_it_starts_fails_the_submit_and_is_undone(tmp_path, monkeypatch, quickstart):
    """A launch that ends without writing its PID (``bash: job/launch.sh: No such file or
    directory``, as after the tar escape) fails the submit: it names the host and its output,
    stops every host, and keeps no record (never "submitted" with a status PENDING for ever)."""
    monkeypatch.setattr(ssh, "START_WAIT_S", 3.0)
    monkeypatch.setattr(ssh, "POLL_S", 0.05)
    monkeypatch.setattr(ssh, "run_ssh", fake := FakeHosts(dead="node2.example.org"))
    with pytest.raises(SubmitError, match=r"(?s)did not start on every host.*node2\.example\.org \(node 1\).*"
                                          r"bash: job/launch\.sh: No such file or directory") as info:
        api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert info.value.exit_code == 1 and "node1.example.org (node 0)" not in info.value.message
    assert len(fake.of("kill -KILL")) == 2  # what started elsewhere is stopped
    assert find_submission(JobHandle.parse("ssh://node1.example.org/srv/jobgen-runs/quickstart")) is None


def test_the_record_is_written_before_any_host_starts(tmp_path, monkeypatch, quickstart):
    handle = JobHandle.parse("ssh://node1.example.org/srv/jobgen-runs/quickstart")
    seen: list[bool] = []
    monkeypatch.setattr(ssh, "run_ssh", FakeHosts(on_start=lambda host: seen.append(find_submission(handle) is not None)))
    api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert seen == [True, True]


@pytest.mark.parametrize(("hosts", "workdir"), [
    (["gpu-a", "gpu-b"], "/srv/" + "w" * 230 + "/runs"),
    (["日" * 100, "gpu-b"], "/srv/runs"),
])
def test_long_hosts_and_workdirs_are_recorded_under_a_bounded_file_name(tmp_path, monkeypatch, hosts, workdir):
    """A workdir component of 230 characters or a host of 100 x 日 made the state record's file
    name longer than 255 bytes: ``OSError: File name too long`` after the job had started."""
    write(tmp_path / "profiles" / "site.yaml", f"scheduler: ssh\nmax_nodes: 2\ndefault_nodes: 2\n"
          f"ssh: {json.dumps({'hosts': hosts, 'workdir': workdir})}\n")
    spec = write(tmp_path / "quickstart.yaml", (EXAMPLES / "quickstart.yaml").read_text())
    job_plan = api.plan_job(spec, "site", profiles_dir=tmp_path / "profiles")
    monkeypatch.setattr(ssh, "run_ssh", FakeHosts())
    result = api.submit(job_plan, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert str(result.handle) == f"ssh://{hosts[0]}{workdir}/quickstart"
    path = state_record_path(result.handle)
    assert path.is_file() and len(path.name.encode()) <= 255
    assert api.status(str(result.handle)).state == "RUNNING"


def test_short_handles_keep_the_state_record_name_of_earlier_versions(tmp_path):
    """Records written by earlier versions are still found: a name that fits is spelt as before."""
    assert state_record_path(JobHandle.parse("ssh://gpu-a/srv/runs/q")).name == "gpu-a__srv__runs__q.json"
    long_one = state_record_path(JobHandle.parse("ssh://gpu-a/srv/" + "é" * 200))
    other = state_record_path(JobHandle.parse("ssh://gpu-a/srv/" + "é" * 199 + "e"))
    assert len(long_one.name.encode()) <= 255 and long_one != other


# --------------------------------------------------------------------------- the default workdir


def test_two_hosts_and_a_name_are_a_profile_and_jobs_run_under_the_login_home(tmp_path):
    """Without ``workdir`` jobs run in ``~/jobgen-runs/<job name>`` of each host's login (as SkyPilot
    has ``~/sky_workdir``): every remote command finds it through $HOME, the handle names it, and
    launch.sh hands the entrypoint and the code snapshot absolute paths."""
    write(tmp_path / "profiles" / "two.yaml", "scheduler: ssh\nmax_nodes: 2\nssh: {hosts: [gpu-a, gpu-b]}\n")
    prof = load_profile("two", tmp_path / "profiles")
    assert prof.ssh.workdir == "~/jobgen-runs"
    assert run_dir(prof.ssh, "quickstart") == "~/jobgen-runs/quickstart"
    handle = handle_for(prof.ssh, "quickstart")
    assert str(handle) == "ssh://gpu-a/~/jobgen-runs/quickstart" and handle.cluster == "gpu-a"
    assert JobHandle.parse(str(handle)) == handle
    with pytest.raises(ConfigError, match=r"ssh\.workdir: .*not an absolute path or ~/"):
        ssh_profile(tmp_path, "{hosts: [a, b], workdir: '~alice/runs'}")

    home = tmp_path / "home 'x'"
    home.mkdir()
    stub = write(tmp_path / "bin" / "python", '#!/bin/bash\nprintf "%s\\n" "$@" > "${RUN_DIR}/argv"\n'
                 'printf "%s" "${JOBGEN_CODE_DIR}" > "${RUN_DIR}/code_dir"\nexec sleep 60\n')
    stub.chmod(0o755)
    settings = SshSettings(hosts=("h",), python=str(stub))
    one = ClusterProfile(name="t", scheduler="ssh", max_nodes=1, ssh=settings)
    job_plan = plan_job(load_spec(EXAMPLES / "quickstart.yaml"), one, TEMPLATES)
    job_dir = tmp_path / "local" / "job"
    job_plan.write(job_dir)
    archive = io.BytesIO()
    ssh.pack(job_dir, None, archive)
    run, handle = run_dir(settings, "quickstart"), handle_for(settings, "quickstart")

    def at_home(command: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        # ssh starts the remote command in the login's home directory; here from / with HOME set,
        # so a command that leaned on the start directory instead of $HOME would miss
        return subprocess.run(["bash", "-c", command], input=data, capture_output=True, timeout=30, cwd="/",
                              env={**os.environ, "HOME": str(home)})

    copied = at_home(copy_command(run), archive.getvalue())
    assert copied.returncode == 0, copied.stderr
    real = home / "jobgen-runs" / "quickstart"
    assert (real / "job" / LAUNCH_FILE).is_file()
    try:
        started = at_home(start_command(run, 0, handle, code_dir=f"{run}/code/abc"))
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 20
        while not ((real / "argv").is_file() and (real / "code_dir").is_file()) and time.monotonic() < deadline:
            time.sleep(0.05)
        argv = (real / "argv").read_text().splitlines()
        assert argv[argv.index("--run-dir") + 1] == str(real) and argv[argv.index("--spec") + 1] == f"{real}/job/{SPEC_FILE}"
        assert (real / "code_dir").read_text() == f"{real}/code/abc"
        report = parse_report("h", 0, at_home(status_command(run, 0, handle)).stdout.decode())
        assert report.run_dir and report.pid is not None and report.procs == 2, report
        assert at_home(stop_command(run, 0, handle)).returncode == 0
    finally:
        at_home(ssh.kill_command(handle, 0))
    assert (real / "cancelled").is_file()


class EndedHosts(FakeHosts):
    """Every node's launch ended with exit code ``code``."""

    def __init__(self, code: int):
        super().__init__()
        self.code = code

    def __call__(self, argv, *, stdin=None, data=None, timeout_s=60.0):
        if "procs=" in argv[-1]:
            return subprocess.CompletedProcess(tuple(argv), 0, f"pid=42\nexit={self.code}\ncancelled=0\nprocs=0\n".encode(), b"")
        return super().__call__(argv, stdin=stdin, data=data, timeout_s=timeout_s)


def test_a_budget_starts_the_restart_watcher_and_status_reads_its_record(tmp_path, monkeypatch):
    """Submit with restart.max_restarts starts the watcher (jobgen.backends.ssh.restart; its
    start replaced here); status then shows its restarts, RESTARTING while it decides, and the
    class of the failure it recorded once it is done."""
    from jobgen.backends.ssh.launch import RESTARTS_FILE

    spec = tmp_path / "quickstart.yaml"
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text() + "restart: {max_restarts: 2}\n")
    job_plan = api.plan_job(spec, str(site_profile(tmp_path / "site", "ssh-2node")))
    started: list[tuple] = []
    monkeypatch.setattr(ssh, "start_watcher", lambda *args: started.append(args) or 4242)
    monkeypatch.setattr(ssh, "run_ssh", FakeHosts())
    said: list[str] = []
    result = api.submit(job_plan, SubmitOptions(runs_dir=tmp_path / "runs"), echo=said.append)
    job_dir = tmp_path / "runs" / "quickstart" / "job"
    assert started == [(job_dir, str(result.handle), str(spec.resolve()))], started
    assert any("restart budget 2 (restart.max_restarts): this machine watches the job (pid 4242" in line for line in said), said
    entry = {"restart": 1, "class": "infrastructure", "rule": "killed", "reason": "killed", "evidence": "node 1: signal 9"}
    record = {"max_restarts": 2, "restarts": [entry], "state": "watching", "pid": 4242,
              "evidence": [{"source": "node 0 (h): rank 0", "kind": "traceback", "text": "ValueError: bad"}]}
    (job_dir / RESTARTS_FILE).write_text(json.dumps(record))
    running = api.status(str(result.handle))
    assert running.state == "RUNNING" and running.details["restarts_used"] == "1 of 2", running
    assert running.details["restart_1"] == "infrastructure (killed): killed [node 1: signal 9]"
    monkeypatch.setattr(ssh, "run_ssh", EndedHosts(1))
    monkeypatch.setattr(ssh, "watcher_alive", lambda record: True)
    deciding = api.status(str(result.handle))
    assert deciding.state == "RESTARTING" and "restart watcher (pid 4242) is classing the failure" in deciding.details["reason"]
    (job_dir / RESTARTS_FILE).write_text(json.dumps(record | {"state": "done"}))
    failed = api.status(str(result.handle))
    assert failed.state == "FAILED" and (failed.failure.cls, failed.failure.rule) == ("user", "exception"), failed
    (job_dir / RESTARTS_FILE).write_bytes(b"\xff not json")  # an unreadable record: the hosts' word only
    plain = api.status(str(result.handle))
    assert plain.state == "FAILED" and "restarts_used" not in plain.details


def test_a_completed_job_stays_running_until_the_watcher_has_recorded_its_restarts(tmp_path, monkeypatch):
    """Node 0's summary.json gets ``restarts`` from the restart watcher once every node exited 0
    (jobgen.backends.ssh.restart); its record says done only after that write. So while the
    watcher runs and its record is not done, status of a job whose hosts all exited 0 is RUNNING,
    with a reason naming the watcher: whoever reads summary.json once status says COMPLETED gets
    the restarts. A watcher that is gone (this machine restarted) leaves the hosts' word."""
    from jobgen.backends.ssh.launch import RESTARTS_FILE

    spec = tmp_path / "quickstart.yaml"
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text() + "restart: {max_restarts: 2}\n")
    job_plan = api.plan_job(spec, str(site_profile(tmp_path / "site", "ssh-2node")))
    monkeypatch.setattr(ssh, "start_watcher", lambda *args: 4242)
    monkeypatch.setattr(ssh, "run_ssh", FakeHosts())
    handle = str(api.submit(job_plan, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None).handle)
    job_dir = tmp_path / "runs" / "quickstart" / "job"
    entry = {"restart": 1, "class": "infrastructure", "rule": "killed", "reason": "killed", "evidence": "node 1: signal 9"}
    record = {"max_restarts": 2, "restarts": [entry], "state": "watching", "pid": 4242, "evidence": []}
    (job_dir / RESTARTS_FILE).write_text(json.dumps(record))
    monkeypatch.setattr(ssh, "run_ssh", EndedHosts(0))
    monkeypatch.setattr(ssh, "watcher_alive", lambda record: True)
    finishing = api.status(handle)
    assert finishing.state == "RUNNING" and not finishing.finished, finishing
    assert "restart watcher (pid 4242) is recording the restarts in node 0's summary.json" in finishing.details["reason"], finishing
    assert finishing.details["restarts_used"] == "1 of 2"
    (job_dir / RESTARTS_FILE).write_text(json.dumps(record | {"state": "done", "outcome": "COMPLETED"}))
    assert api.status(handle).state == "COMPLETED"
    (job_dir / RESTARTS_FILE).write_text(json.dumps(record))
    monkeypatch.setattr(ssh, "watcher_alive", lambda record: False)
    gone = api.status(handle)
    assert gone.state == "COMPLETED" and "reason" not in gone.details, gone


def test_without_a_budget_no_watcher_starts(tmp_path, monkeypatch, quickstart):
    from jobgen.backends.ssh.launch import RESTARTS_FILE

    monkeypatch.setattr(ssh, "start_watcher", lambda *args: pytest.fail("a watcher without a budget"))
    monkeypatch.setattr(ssh, "run_ssh", FakeHosts())
    api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None)
    assert not (tmp_path / "runs" / "quickstart" / "job" / RESTARTS_FILE).exists()


def test_status_of_a_completed_job_shows_the_straggler_node_0s_summary_records(tmp_path, monkeypatch, quickstart):
    class Completed(EndedHosts):
        def __init__(self, summary: bytes):
            super().__init__(0)
            self.summary = summary

        def __call__(self, argv, *, stdin=None, data=None, timeout_s=60.0):
            if argv[-1].startswith("if [ -f ") and "summary.json" in argv[-1] and " cat " in argv[-1]:
                assert argv[argv.index("--") + 1] == "node1.example.org"  # node 0's host: global rank 0 writes it
                return subprocess.CompletedProcess(tuple(argv), 0, self.summary, b"")
            return super().__call__(argv, stdin=stdin, data=data, timeout_s=timeout_s)

    monkeypatch.setattr(ssh, "run_ssh", FakeHosts())
    handle = str(api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None).handle)
    record = {"rank": 1, "node": "node2\x1b[2J", "ratio": 2.1, "step_time_s": 0.42, "median_step_time_s": 0.2}
    monkeypatch.setattr(ssh, "run_ssh", Completed(json.dumps({"straggler": record}).encode()))
    done = api.status(handle)
    assert done.state == "COMPLETED" and done.details["straggler"] == \
        "rank 1 on node2\\x1b[2J: 2.1x the median step time (0.42 s vs 0.20 s)", done.details
    for body in (b"\xff{", b'{"straggler": null}', b"[]"):
        monkeypatch.setattr(ssh, "run_ssh", Completed(body))
        assert "straggler" not in api.status(handle).details


def test_status_and_cancel_read_the_submission_record_once(tmp_path, monkeypatch, quickstart):
    """The API resolves a job once (jobgen.backends.base.SubmittedJob) and the backend reads its
    record from that: status and cancel each load the record one time, however many steps (hosts,
    run directory, restart watcher, the polls of cancel) use it."""
    monkeypatch.setattr(ssh, "run_ssh", FakeHosts())
    handle = str(api.submit(quickstart, SubmitOptions(runs_dir=tmp_path / "runs"), echo=lambda _: None).handle)
    loads: list[Path] = []
    load = Submission.load.__func__

    def counted(cls, path):
        loads.append(Path(path))
        return load(cls, path)

    monkeypatch.setattr(Submission, "load", classmethod(counted))
    assert api.status(handle).state == "RUNNING"
    assert loads == [state_record_path(JobHandle.parse(handle))], loads
    loads.clear()
    monkeypatch.setattr(ssh, "run_ssh", EndedHosts(0))
    assert api.cancel(handle, wait_s=1.0, echo=lambda _: None).state == "COMPLETED"
    assert loads == [state_record_path(JobHandle.parse(handle))], loads
