"""A straggler on real hosts: once a 2-node job trains, host2's processes of it go under a CPU
quota, and the job names rank 1 and host2 as the straggler in its log, summary.json and
``jobgen status``.

The quota is the kernel's CFS bandwidth control on a cgroup (cgroup v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, or cgroup v2 ``cpu.max``): rank 1 gets a tenth of one CPU while rank 0
on host1 runs unthrottled. The job's processes move in after its first logged steps (start-up
at a tenth of a CPU would take minutes) and the group is removed when the test ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshlab import SshLab

from tests.conftest import skip_or_fail
from tests.integration.ssh.test_jobgen_on_ssh_lab import Jobgen, hosts_of, nothing_left

pytestmark = pytest.mark.ssh_lab

#: host2's share of one CPU: 10 ms in every 100 ms.
QUOTA_US, PERIOD_US = 10_000, 100_000
GROUP = "jobgen-ssh-lab-straggler"

SPEC = """\
name: ssh-straggler
model: {preset: null, n_layer: 2, n_head: 2, d_model: 128, block_size: 128}
data: {max_bytes: 200000}
trainer: {precision: 32-true, micro_batch_size: 8, max_steps: 60, warmup_steps: 1, val_check_interval: 1000,
          limit_val_batches: 1, log_every_n_steps: 5}
checkpoint: {every_n_steps: 1000}
watchdog: {hang_timeout_s: 60, straggler_factor: 1.5}
"""


def _cgroup_dirs() -> tuple[Path, Path, dict[str, str]]:
    """(the cpu hierarchy's root, the test's group, the files that set its quota) for cgroup v1's
    ``cpu`` controller or cgroup v2 with ``cpu`` enabled; :func:`skip_or_fail` when neither."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").is_file():
        return v1, v1 / GROUP, {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(QUOTA_US)}
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.subtree_control"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        return v2, v2 / GROUP, {"cpu.max": f"{QUOTA_US} {PERIOD_US}"}
    skip_or_fail("no cgroup cpu controller to put a CPU quota on host2 (cgroup v1 /sys/fs/cgroup/cpu, or v2 with cpu enabled)")


@pytest.fixture
def quota_group() -> Iterator[Path]:
    """A cgroup with :data:`QUOTA_US` of CPU time per :data:`PERIOD_US`; what is left in it moves
    back to the hierarchy's root and the group is removed afterwards."""
    root, group, settings = _cgroup_dirs()
    try:
        group.mkdir(exist_ok=True)
        for name, value in settings.items():
            (group / name).write_text(value)
    except OSError as exc:
        skip_or_fail(f"cannot set a CPU quota in {group}: {exc}")
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (root / "cgroup.procs").write_text(pid)
            except OSError:  # it exited meanwhile
                pass
        deadline = time.monotonic() + 15
        while True:  # rmdir waits for the group's last process (a closing ssh session) to leave
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


@pytest.fixture
def jobgen(ssh_lab: SshLab, tmp_path: Path) -> Jobgen:
    return Jobgen(ssh_lab, tmp_path / "jobgen")


def _throttle_once_training(lab: SshLab, node0: Path, group: Path, timeout: float = 240) -> list[int]:
    """Wait for rank 0's first logged steps (``step N/`` in node 0's log), then move every process
    of the job on host2 into ``group``; their PIDs."""
    deadline = time.monotonic() + timeout
    log = node0 / "node-0.log"
    while not (log.is_file() and "step 5/" in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"no training step logged in {timeout} s"
        time.sleep(0.2)
    pids = lab.job_pids()[lab.hosts[1].name]
    for pid in pids:
        (group / "cgroup.procs").write_text(str(pid))
    return pids


def test_a_host_under_a_cpu_quota_is_named_as_the_straggler(jobgen, ssh_lab, quota_group, tmp_path):
    started = time.monotonic()
    spec = tmp_path / "ssh-straggler.yaml"
    spec.write_text(SPEC)
    handle = jobgen.submit(spec, jobgen.profile("ssh-lab", hosts_of(ssh_lab)))
    throttled = _throttle_once_training(ssh_lab, ssh_lab.disk(ssh_lab.hosts[0]) / "ssh-straggler", quota_group)
    status = jobgen.wait(handle, {"COMPLETED", "FAILED", "CANCELLED", "UNKNOWN"}, timeout=420)
    node0 = ssh_lab.disk(ssh_lab.hosts[0]) / "ssh-straggler"
    log = jobgen("logs", handle, check=False).stdout
    assert status["state"] == "COMPLETED", (status, log[-3000:])
    found = json.loads((node0 / "summary.json").read_text())["straggler"]
    assert found is not None and found["rank"] == 1 and found["node"] == ssh_lab.hosts[1].name, found
    assert found["ratio"] > 1.5 and found["step_time_s"] > found["median_step_time_s"], found
    assert log.count("is a straggler") == 1 and f"jobgen: rank 1 on {ssh_lab.hosts[1].name} is a straggler" in log, log[-3000:]
    assert status["details"]["straggler"].startswith(f"rank 1 on {ssh_lab.hosts[1].name}: "), status
    assert nothing_left(ssh_lab) == {"host1": [], "host2": []}
    print(f"\nssh straggler: rank 1 on host2 at {found['ratio']:.1f}x the median, submit to COMPLETED in "
          f"{time.monotonic() - started:.1f} s (cgroup quota {QUOTA_US / PERIOD_US:.0%} of a CPU on {len(throttled)} process(es))")
