"""``jobgen profiles detect --scheduler ssh`` and ``jobgen doctor`` against the two sshd hosts of the
lab (sshlab.py): the detected profile is valid and runs a short 2-node job, doctor passes on it,
and a profile whose Python lacks jobgen, or that asks for GPUs the hosts lack, fails exactly that
check, naming each host.

The hosts share this machine's CPUs, memory and root file system (each has its own disk at the
work directory only), so what detect reads there is this machine's; they have no nvidia-smi.
The lab's PATH is sshd's default on every host, which a test cannot change for one host alone:
the GPU check is failed by a profile asking for GPUs instead of by a fake nvidia-smi.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from sshlab import SshLab
from test_jobgen_on_ssh_lab import Jobgen, hosts_of

from jobgen.specs.load import load_profile

pytestmark = pytest.mark.ssh_lab

SHORT_SPEC = """\
name: {name}
model: {{preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}}
data: {{max_bytes: 200000}}
trainer: {{precision: 32-true, micro_batch_size: 4, max_steps: 2, warmup_steps: 1, val_check_interval: 1000,
          limit_val_batches: 1, log_every_n_steps: 1}}
checkpoint: {{every_n_steps: 1000}}
"""


@pytest.fixture(scope="module")
def jobgen(ssh_lab: SshLab, tmp_path_factory: pytest.TempPathFactory) -> Jobgen:
    return Jobgen(ssh_lab, tmp_path_factory.mktemp("jobgen-ssh-doctor"))


@pytest.fixture(scope="module")
def detected(jobgen: Jobgen, ssh_lab: SshLab) -> Path:
    """``profiles/ssh-detected.yaml``, written by detect from the two hosts (the lab's key,
    known_hosts and work directory given with --profile-set)."""
    started = time.monotonic()
    path = jobgen.root / "profiles" / "ssh-detected.yaml"
    jobgen("profiles", "detect", "--scheduler", "ssh", *(a for ip in hosts_of(ssh_lab) for a in ("--host", f"root@{ip}")),
           "--python", sys.executable, "--profile-set", f"ssh.workdir={ssh_lab.workdir}",
           "--profile-set", f"ssh.identity_file={ssh_lab.identity_file}", "--profile-set", f"ssh.known_hosts={ssh_lab.known_hosts}",
           "--profile-set", "ssh.connect_timeout_s=3", "--out", str(path))
    print(f"\nssh detect of 2 lab hosts: {time.monotonic() - started:.1f} s")
    return path


def doctor(jobgen: Jobgen, profile: str, *spec: str) -> tuple[int, dict[str, dict]]:
    proc = jobgen("doctor", "--profile", profile, "--profiles-dir", str(jobgen.root / "profiles"), *spec, "-o", "json", check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, {check["name"]: check for check in json.loads(proc.stdout)["checks"]}


def derived(jobgen: Jobgen, name: str, text: str) -> str:
    (jobgen.root / "profiles" / f"{name}.yaml").write_text("extends: ssh-detected\n" + text)
    return name


def test_detect_writes_the_two_hosts_and_a_job_runs_with_it(jobgen, ssh_lab, detected, tmp_path):
    """The file loads as a profile of both hosts with this machine's shape (the hosts share its
    CPUs and memory), and the lab's short 2-node run submits and completes with it."""
    profile = load_profile(str(detected))
    ips = hosts_of(ssh_lab)
    assert (profile.scheduler, profile.ssh.hosts, profile.ssh.user, profile.max_nodes) == ("ssh", tuple(ips), "root", 2)
    assert (profile.gpus_per_node, profile.cpu_processes_per_node, profile.cpus_per_node) == (0, 1, len(os.sched_getaffinity(0)))
    text = detected.read_text()
    assert f"# no GPUs on {ips[0]} (no nvidia-smi): a CPU profile" in text
    assert "imports jobgen.train, torch and lightning on 2 of 2 host(s)" in text
    assert f"# `nproc` on {ips[0]} (host1), the fewest of the 2 host(s)" in text
    assert yaml.safe_load(text)["ssh"]["workdir"] == str(ssh_lab.workdir)
    started = time.monotonic()
    spec = tmp_path / "short.yaml"
    spec.write_text(SHORT_SPEC.format(name="ssh-detected-run"))
    handle = jobgen.submit(spec, "ssh-detected")
    status = jobgen.wait(handle, {"COMPLETED", "FAILED", "CANCELLED", "UNKNOWN"}, timeout=300)
    log = jobgen("logs", handle, check=False).stdout
    assert status["state"] == "COMPLETED", (status, log[-3000:])
    assert json.loads((ssh_lab.disk(ssh_lab.hosts[0]) / "ssh-detected-run" / "summary.json").read_text())["world_size"] == 2
    print(f"\n2-node run with the detected profile: submit to COMPLETED in {time.monotonic() - started:.1f} s")


def test_doctor_passes_on_the_detected_profile_and_finds_the_disks_unshared(jobgen, ssh_lab, detected, tmp_path):
    """Without a spec every check passes (shared_workdir skipped); with a spec that resumes, the
    lab's hosts, each with its own disk at the work directory, fail ssh.shared_workdir naming host2."""
    started = time.monotonic()
    code, found = doctor(jobgen, "ssh-detected")
    ips = hosts_of(ssh_lab)
    assert code == 0, found
    assert [n for n, c in found.items() if c["status"] != "pass"] == ["ssh.shared_workdir"], found
    assert set(found) == {f"ssh.{c}[{ip}]" for c in ("reachable", "python", "gpus", "workdir") for ip in ips} | {"ssh.shared_workdir"}
    assert "a directory the login can write" in found[f"ssh.workdir[{ips[1]}]"]["detail"]
    spec = tmp_path / "resumes.yaml"
    spec.write_text(SHORT_SPEC.format(name="ssh-doctor-resumes"))
    code, found = doctor(jobgen, "ssh-detected", str(spec))
    shared = found["ssh.shared_workdir"]
    assert code == 1 and shared["status"] == "fail", found
    assert f"on {ips[0]} is not there on {ips[1]}" in shared["detail"] and "checkpoint.resume: never" in shared["fix"]
    assert [n for n, c in found.items() if c["status"] == "fail"] == ["ssh.shared_workdir"], found
    assert not [p for p in ssh_lab.disk(ssh_lab.hosts[0]).iterdir() if p.name.startswith(".jobgen-")]  # its file is removed
    print(f"\nssh doctor, twice on 2 lab hosts: {time.monotonic() - started:.1f} s")


def test_a_python_without_jobgen_fails_exactly_the_python_check(jobgen, ssh_lab, detected):
    """``ssh.python: /usr/bin/python3`` (the lab's system Python, without jobgen): only
    ssh.python fails, once per host, naming the host, the import error and the install command."""
    started = time.monotonic()
    code, found = doctor(jobgen, derived(jobgen, "ssh-no-jobgen", "ssh:\n  python: /usr/bin/python3\n"))
    ips = hosts_of(ssh_lab)
    assert code == 1
    assert [n for n, c in found.items() if c["status"] == "fail"] == [f"ssh.python[{ip}]" for ip in ips], found
    for ip in ips:
        check = found[f"ssh.python[{ip}]"]
        assert check["detail"].startswith(f"{ip}: /usr/bin/python3 (Python ") and "cannot import jobgen.train: ModuleNotFoundError" \
            in check["detail"], check
        assert check["fix"].startswith(f"on {ip}: `/usr/bin/python3 -m pip install '<jobgen checkout or wheel>[train]'`"), check
    print(f"\nssh doctor, python without jobgen: {time.monotonic() - started:.1f} s")


def test_gpus_the_hosts_lack_fail_the_gpus_check(jobgen, ssh_lab, detected):
    started = time.monotonic()
    code, found = doctor(jobgen, derived(jobgen, "ssh-gpus", "gpus_per_node: 2\ngpu_type: A100\ngpu_mem_gib: 40\n"))
    ips = hosts_of(ssh_lab)
    assert code == 1
    assert [n for n, c in found.items() if c["status"] == "fail"] == [f"ssh.gpus[{ip}]" for ip in ips], found
    check = found[f"ssh.gpus[{ips[1]}]"]
    assert check["detail"] == f"the profile uses 2 GPU(s) per host; {ips[1]} has no nvidia-smi (no NVIDIA driver)", check
    assert check["fix"].endswith("or set gpus_per_node: 0 in ssh-gpus for a CPU profile"), check
    print(f"\nssh doctor, GPUs the hosts lack: {time.monotonic() - started:.1f} s")
