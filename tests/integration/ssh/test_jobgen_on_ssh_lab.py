"""jobgen against two real sshd hosts (``scheduler: ssh``): a 2-node job trains, cancel leaves
nothing behind, an unreachable host is named before anything starts.

Every job goes through the ``jobgen`` CLI with a profile naming the lab's hosts by address, its
key and known_hosts; the work directory has a space and a quote in its name (sshlab.WORKDIR_NAME),
so every command jobgen sends to a host must quote it. Each host has its own disk: what a test
reads from ``lab.disk(host)`` is what that host alone saw.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sshlab import NOBODY, SshLab

from tests.conftest import REPO
from tests.integration.usercode_repo import user_repo

pytestmark = pytest.mark.ssh_lab

PROFILE = """\
description: jobgen ssh lab, 2 hosts x 1 gloo rank
scheduler: ssh
max_nodes: 2
default_nodes: 2
gpus_per_node: 0
cpu_processes_per_node: 1
cpus_per_node: 1
mem_gib_per_node: 2
ssh:
  hosts: {hosts}
  user: root
  workdir: {workdir}
  python: {python}
  identity_file: {identity}
  known_hosts: {known_hosts}
  connect_timeout_s: 3
"""

LONG_SPEC = """\
name: {name}
model: {{preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}}
data: {{max_bytes: 200000}}
trainer: {{precision: 32-true, micro_batch_size: 4, max_steps: 100000, warmup_steps: 1, val_check_interval: 1000,
          limit_val_batches: 1, log_every_n_steps: 1}}
checkpoint: {{every_n_steps: 1000}}
"""


class Jobgen:
    """The jobgen CLI with the lab's profiles and its own state directory."""

    def __init__(self, lab: SshLab, root: Path):
        self.lab, self.root = lab, root
        self.env = {**os.environ, "JOBGEN_STATE_DIR": str(root / "state"), "PYTHONPATH": str(REPO)}
        self.env.pop("JOBGEN_DEBUG", None)
        (root / "profiles").mkdir(parents=True, exist_ok=True)

    def __call__(self, *args: str, cwd: Path | None = None, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=cwd or self.root, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"jobgen {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def profile(self, name: str, hosts: list[str]) -> str:
        text = PROFILE.format(hosts=json.dumps(hosts), workdir=json.dumps(str(self.lab.workdir)), python=json.dumps(sys.executable),
                              identity=json.dumps(str(self.lab.identity_file)), known_hosts=json.dumps(str(self.lab.known_hosts)))
        (self.root / "profiles" / f"{name}.yaml").write_text(text)
        return name

    def submit(self, spec: Path, profile: str, *, cwd: Path | None = None) -> str:
        # --no-import-check: importing torch and Lightning here is not what these tests are about
        out = self("submit", str(spec), "--profile", profile, "--profiles-dir", str(self.root / "profiles"),
                   "--runs-dir", str(self.root / "runs"), "--no-import-check", "-o", "json", cwd=cwd).stdout
        return json.loads(out)["handle"]

    def state(self, handle: str) -> dict:
        return json.loads(self("status", handle, "-o", "json").stdout)

    def wait(self, handle: str, states: set[str], timeout: float) -> dict:
        """Poll ``jobgen status`` every 4 s (each is a process plus an ssh per host: on 2 shared
        cores, polling faster slows the job it waits for)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.state(handle)
            if status["state"] in states or time.monotonic() > deadline:
                return status
            time.sleep(4)


@pytest.fixture(scope="module")
def jobgen(ssh_lab: SshLab, tmp_path_factory: pytest.TempPathFactory) -> Jobgen:
    return Jobgen(ssh_lab, tmp_path_factory.mktemp("jobgen-ssh"))


def hosts_of(lab: SshLab) -> list[str]:
    return [h.ip for h in lab.hosts]


def nothing_left(lab: SshLab, timeout: float = 15) -> dict[str, list[int]]:
    """The processes left in the hosts' namespaces besides sshd, once the last ssh sessions have
    closed (waits up to ``timeout`` s for them to be none)."""
    deadline = time.monotonic() + timeout
    while True:
        left = lab.job_pids()
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_two_node_job_trains_to_completion(jobgen, ssh_lab, tmp_path):
    """A user-code job (tinychar, committed in its own git repository) on both hosts: each gets
    the job directory and the code snapshot on its own disk, node 1 joins node 0's rendezvous,
    rank 0 writes the summary on host1, status says COMPLETED with exit 0 on both, and nothing
    of the job runs afterwards."""
    started = time.monotonic()
    repo, spec, head = user_repo(tmp_path, "ssh-two-node", max_steps=6, every=3)
    handle = jobgen.submit(spec, jobgen.profile("ssh-lab", hosts_of(ssh_lab)), cwd=repo)
    assert handle == f"ssh://{ssh_lab.hosts[0].ip}{ssh_lab.workdir}/ssh-two-node"
    status = jobgen.wait(handle, {"COMPLETED", "FAILED", "CANCELLED", "UNKNOWN"}, timeout=420)
    node0, node1 = (ssh_lab.disk(h) / "ssh-two-node" for h in ssh_lab.hosts)
    assert status["state"] == "COMPLETED", (status, (node0 / "node-0.log").read_text()[-3000:],
                                            (node1 / "node-1.log").read_text()[-3000:])
    assert status["details"]["exit_code"] == "0" and status["source"] == "ssh"
    summary = json.loads((node0 / "summary.json").read_text())
    assert summary["global_step"] == 6 and summary["world_size"] == 2
    assert summary["code"]["commit"] == head and summary["code"]["dir"] == f"{ssh_lab.workdir}/ssh-two-node/code/{head}"
    for disk in (node0, node1):  # each host has its own copy of the job and of the snapshot
        assert (disk / "job" / "launch.sh").is_file() and (disk / "job" / "spec.json").is_file()
        assert (disk / "code" / head / "usercode" / "tinychar").is_dir()
        assert not (disk / "job" / ".jobgen-submission.json").exists()
    assert not (node1 / "summary.json").exists()  # rank 0 lives on host1
    assert (node0 / "node-0.exit").read_text().strip() == "0" and (node1 / "node-1.exit").read_text().strip() == "0"
    shown = jobgen("logs", "--replica", "node-1", handle).stdout
    assert "jobgen: node 1 of 2 on host2" in shown and "GLOBAL_RANK: 1" in shown, shown
    assert "done: ssh-two-node at step 6/6" in jobgen("logs", handle).stdout
    listed = {row["handle"]: row for row in json.loads(jobgen("ls", "--state", "completed", "-o", "json").stdout)}
    assert (listed[handle]["state"], listed[handle]["source"]) == ("COMPLETED", "ssh"), listed  # ls as status says
    assert nothing_left(ssh_lab) == {"host1": [], "host2": []}
    print(f"\n2-node ssh job: submit to COMPLETED in {time.monotonic() - started:.1f} s (under load)")


def test_cancel_stops_every_process_on_both_hosts(jobgen, ssh_lab, tmp_path):
    spec = tmp_path / "ssh-cancel.yaml"
    spec.write_text(LONG_SPEC.format(name="ssh-cancel"))
    handle = jobgen.submit(spec, jobgen.profile("ssh-lab", hosts_of(ssh_lab)))
    deadline = time.monotonic() + 120
    while True:  # training on both hosts: the launch, torchrun and a worker each
        status = jobgen.state(handle)
        per_host = ssh_lab.job_pids()
        if status["state"] == "RUNNING" and all(len(p) >= 3 for p in per_host.values()):
            break
        assert status["state"] in ("PENDING", "RUNNING") and time.monotonic() < deadline, (status, per_host)
        time.sleep(1)
    started = time.monotonic()
    cancelled = json.loads(jobgen("cancel", handle, "-o", "json").stdout)
    assert cancelled["state"] == "CANCELLED", cancelled
    assert nothing_left(ssh_lab) == {"host1": [], "host2": []}
    assert jobgen.state(handle)["state"] == "CANCELLED"
    listed = {row["handle"]: row["state"] for row in json.loads(jobgen("ls", "--state", "CANCELLED", "-o", "json").stdout)}
    assert listed.get(handle) == "CANCELLED", listed  # ls as status says
    print(f"\nssh cancel: every process gone in {time.monotonic() - started:.1f} s (under load)")


def test_a_failed_job_is_failed_with_its_exit_code_in_status_and_ls(jobgen, ssh_lab, tmp_path):
    """A job whose entrypoint refuses its input on both hosts (its data matches no file)
    ends FAILED with torchrun's non-zero exit code in `jobgen status`, and `jobgen ls --state
    FAILED` lists it; the entrypoint's error is in the node's log and names the spec file `jobgen
    submit` read (a space and a quote in its name) and the field as written there, not spec.json."""
    started = time.monotonic()
    spec = tmp_path / "ssh fails's.yaml"
    spec.write_text(LONG_SPEC.format(name="ssh-fails").replace("data: {max_bytes: 200000}", "data: {paths: [no-such-dir/*.txt]}"))
    handle = jobgen.submit(spec, jobgen.profile("ssh-lab", hosts_of(ssh_lab)))
    status = jobgen.wait(handle, {"COMPLETED", "FAILED", "CANCELLED", "UNKNOWN"}, timeout=180)
    log = jobgen("logs", handle, check=False).stdout
    assert status["state"] == "FAILED", (status, log[-3000:])
    assert status["details"]["exit_code"] not in ("", "0") and status["source"] == "ssh", status
    assert f"python -m jobgen.train: error: {spec.resolve()}: data.paths[0]: 'no-such-dir/*.txt' matches no files" in log, log[-3000:]
    listed = {row["handle"]: row for row in json.loads(jobgen("ls", "--state", "FAILED", "-o", "json").stdout)}
    assert (listed[handle]["state"], listed[handle]["source"]) == ("FAILED", "ssh"), listed
    assert nothing_left(ssh_lab) == {"host1": [], "host2": []}
    print(f"\nssh failed job: FAILED (exit {status['details']['exit_code']}) in {time.monotonic() - started:.1f} s")


def test_an_unreachable_host_is_named_before_anything_starts(jobgen, ssh_lab, tmp_path):
    spec = tmp_path / "ssh-unreachable.yaml"
    spec.write_text(LONG_SPEC.format(name="ssh-unreachable"))
    profile = jobgen.profile("ssh-lab-down", [ssh_lab.hosts[0].ip, NOBODY])
    proc = jobgen("submit", str(spec), "--profile", profile, "--profiles-dir", str(jobgen.root / "profiles"),
                  "--runs-dir", str(jobgen.root / "runs"), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{NOBODY} (node 1): cannot be reached" in proc.stderr and "nothing was copied or started" in proc.stderr, proc.stderr
    assert "1 of 2 host(s) not ready" in proc.stderr and f"{ssh_lab.hosts[0].ip} (node 0)" not in proc.stderr, proc.stderr
    assert not (ssh_lab.disk(ssh_lab.hosts[0]) / "ssh-unreachable").exists()  # nothing copied to the host that answered
    assert not (jobgen.root / "runs" / "ssh-unreachable").exists()  # nor left here
    assert nothing_left(ssh_lab) == {"host1": [], "host2": []}


RESTART_SPEC = """\
name: {name}
model: {{preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}}
data: {{max_bytes: 200000}}
trainer: {{precision: 32-true, micro_batch_size: 4, max_steps: 150, warmup_steps: 1, val_check_interval: 1000,
          limit_val_batches: 1, log_every_n_steps: 1}}
checkpoint: {{every_n_steps: 20, keep_last_k: 20}}
watchdog: {{hang_timeout_s: 20}}
restart: {{max_restarts: {budget}}}
"""


def _rank_pid(lab: SshLab, host: str, rank: int) -> int | None:
    """The PID of the training worker with RANK=<rank> among ``host``'s processes (torchrun sets it)."""
    for pid in lab.job_pids()[host]:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"jobgen.train" in cmdline:
            return pid
    return None


def _watcher_records(jobgen: Jobgen, name: str) -> list[tuple[Path, dict]]:
    """The restart watcher's record of job ``name`` (in its job directory, ``<runs>/<name>/job/``)."""
    from jobgen.backends.ssh.launch import RESTARTS_FILE

    return [(path, json.loads(path.read_text())) for path in jobgen.root.rglob(RESTARTS_FILE) if path.parent.parent.name == name]


def _stop_watcher(jobgen: Jobgen, name: str) -> None:
    """SIGKILL the job's restart watcher if a failed test left it running."""
    from jobgen.backends.ssh.launch import watcher_alive

    for _, record in _watcher_records(jobgen, name):
        if watcher_alive(record):
            os.kill(record["pid"], 9)


def test_a_rank_killed_mid_run_is_restarted_on_every_host_and_the_job_completes(jobgen, ssh_lab, tmp_path):
    """restart.max_restarts 1: rank 1's worker on host2 is SIGKILLed after step 25; the watcher
    classes the failure infrastructure, copies node 0's checkpoints to host2 (the hosts' disks
    are not shared), starts both hosts again, they resume from the newest checkpoint and
    complete; status and node 0's summary.json record the restart (summary.json has it as soon as
    status says COMPLETED), the watcher sends the ``restart`` notification from this machine
    before the hosts start again (the hosts send no ``restart``), and global rank 0's ``started``
    of the restarted start counts it (``restart`` 1, from the JOBGEN_RESTART_COUNT the watcher
    hands the launches; 0 on the first start)."""
    started = time.monotonic()
    name = "ssh-restart"
    spec = tmp_path / f"{name}.yaml"
    received = tmp_path / "notified.jsonl"
    recorder = tmp_path / "recorder.py"
    recorder.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n")
    notify = (f"notify: {{command: [{json.dumps(sys.executable)}, {json.dumps(str(recorder))}, {json.dumps(str(received))}], "
              "events: [started, restart]}\n")
    spec.write_text(RESTART_SPEC.format(name=name, budget=1) + notify)
    handle = jobgen.submit(spec, jobgen.profile("ssh-lab", hosts_of(ssh_lab)))
    node0, node1 = (ssh_lab.disk(h) / name for h in ssh_lab.hosts)
    try:
        deadline = time.monotonic() + 240
        while True:
            log = (node0 / "node-0.log").read_text(errors="replace") if (node0 / "node-0.log").exists() else ""
            steps = [int(s) for s in re.findall(r"step (\d+)/150", log)]
            pid = _rank_pid(ssh_lab, "host2", 1)
            first_started = received.exists() and '"started"' in received.read_text()  # sent in the background
            if steps and max(steps) >= 25 and pid is not None and first_started:
                break
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(0.5)
        os.kill(pid, 9)
        killed = time.monotonic()
        status = jobgen.wait(handle, {"COMPLETED", "FAILED", "CANCELLED", "UNKNOWN"}, timeout=420)
        logs = ((node0 / "node-0.log").read_text()[-3000:], (node1 / "node-1.log").read_text()[-3000:])
        assert status["state"] == "COMPLETED", (status, logs)
        assert status["details"]["restarts_used"] == "1 of 1", status
        assert status["details"]["restart_1"].startswith("infrastructure ("), status
        # read as soon as status says COMPLETED, without waiting: the watcher is done and summary.json has the restarts
        records = _watcher_records(jobgen, name)
        assert [(r["state"], r.get("outcome")) for _, r in records] == [("done", "COMPLETED")], records
        summary = json.loads((node0 / "summary.json").read_text())
        assert summary["global_step"] == 150 and summary["resumed_from_step"] >= 20, summary
        assert (summary["restarts"]["used"], summary["restarts"]["history"][0]["class"]) == (1, "infrastructure"), summary
        assert (node1 / "checkpoints" / f"step-{summary['resumed_from_step']:08d}.ckpt").is_file()  # copied from host1
        bodies = [json.loads(line) for line in received.read_text().splitlines()]
        assert [(b["event"], b["restart"]) for b in bodies] == [("started", 0), ("restart", 1), ("started", 1)], bodies
        assert [b["handle"] for b in bodies] == [str(handle)] * 3, bodies  # the hosts' bodies too, from JOBGEN_SSH_JOB
        body = bodies[1]
        assert (body["event"], body["handle"], body["class"], body["restarts_used"], body["max_restarts"]) == \
               ("restart", str(handle), "infrastructure", 1, 1), body
        assert body["reason"] == summary["restarts"]["history"][0]["reason"], body
        for node, log in ((node0, "node-0.log"), (node1, "node-1.log")):  # two starts on each host
            assert (node / log).read_text().count("jobgen: node ") == 2
        assert nothing_left(ssh_lab) == {"host1": [], "host2": []}
    finally:
        _stop_watcher(jobgen, name)
    print(f"\nssh restart: submit to COMPLETED in {time.monotonic() - started:.1f} s, "
          f"{time.monotonic() - killed:.1f} s of it after the kill (under load)")


def test_a_user_error_with_a_budget_fails_after_one_start(jobgen, ssh_lab, tmp_path):
    """restart.max_restarts 3 and data that matches no file (the entrypoint's input error, exit
    2 on both hosts): FAILED, class user, no restart."""
    started = time.monotonic()
    name = "ssh-user-error"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(RESTART_SPEC.format(name=name, budget=3).replace("data: {max_bytes: 200000}", "data: {paths: [none/*.txt]}"))
    handle = jobgen.submit(spec, jobgen.profile("ssh-lab", hosts_of(ssh_lab)))
    try:
        status = jobgen.wait(handle, {"COMPLETED", "FAILED", "CANCELLED", "UNKNOWN"}, timeout=180)
        assert status["state"] == "FAILED", status
        assert (status["failure"]["class"], status["details"]["restarts_used"]) == ("user", "0 of 3"), status
        node0 = ssh_lab.disk(ssh_lab.hosts[0]) / name
        assert (node0 / "node-0.log").read_text().count("jobgen: node 0 of 2") == 1
    finally:
        _stop_watcher(jobgen, name)
    print(f"\nssh user error with a budget: FAILED in {time.monotonic() - started:.1f} s")
