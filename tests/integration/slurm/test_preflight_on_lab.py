"""The preflight (``jobgen submit --preflight``) on the real 2-node lab cluster.

1. Healthy: the job prints one bandwidth line per node (node1, node2), then trains to COMPLETED.
2. One node's training network cut: in node2's network namespace every TCP packet to node1's
   rendezvous port (MASTER_ADDR = node1, the first node; slurm-cpu has ``exclusive: false``, so
   the port is one of ``master_port`` + the job id mod 1000: the whole window) is
   dropped (nftables, else iptables). SLURM's own traffic (slurmctld 6817, slurmd 6818, srun's
   I/O) is untouched, so the job starts on both nodes; the rank on node2 cannot reach rank 0 and
   rank 0 never sees it join. The job must end FAILED within a minute of the preflight's start
   (timeout 30 s here), with rank 0's one-line error naming node2.

Cutting the whole veth (``ip link set ... down``) would be closer to "unplugged", but then
slurmctld loses node2 too and the job never starts there - a different failure than the one
the preflight is for.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from lab import NODES, LabInstallError, apt_install, find_binary, run_slurm

from tests.conftest import skip_or_fail
from tests.integration.slurm.test_jobgen_on_lab import job_id, jobgen  # noqa: F401 - the fixture

pytestmark = pytest.mark.slurm_lab

NODE1, NODE2 = NODES
MASTER_PORT = 29500  # slurm-cpu's slurm.master_port (SlurmSettings default); the lab profile keeps it
#: The ports a job on shared nodes takes its rendezvous port from (jobgen.backends.slurm.script.MASTER_PORT_WINDOW).
LAST_PORT = MASTER_PORT + 999


def _firewall_argv(verb: str) -> list[list[str]]:
    """Commands (run in node2's netns) that add (``verb='add'``) or remove the drop rule.

    nft, else iptables; with neither, nftables is installed with apt as the lab installs SLURM
    (a machine that cannot: skipped with the reason, failed under CI)."""
    nft, iptables = find_binary("nft"), find_binary("iptables")
    if nft is None and iptables is None:
        try:
            apt_install(["nftables"], ["nft"])
        except LabInstallError as exc:
            skip_or_fail(f"cutting a lab node's network needs nft or iptables on this machine: {exc}")
        nft = find_binary("nft")
    if nft:
        if verb == "add":
            return [[nft, "add", "table", "inet", "jgpreflight"],
                    [nft, "add", "chain", "inet", "jgpreflight", "out", "{ type filter hook output priority 0 ; }"],
                    [nft, "add", "rule", "inet", "jgpreflight", "out", "ip", "daddr", NODE1.ip, "tcp", "dport",
                     f"{MASTER_PORT}-{LAST_PORT}", "drop"]]
        return [[nft, "delete", "table", "inet", "jgpreflight"]]
    flag = "-A" if verb == "add" else "-D"
    return [[iptables, flag, "OUTPUT", "-p", "tcp", "-d", NODE1.ip, "--dport", f"{MASTER_PORT}:{LAST_PORT}", "-j", "DROP"]]


def _in_node2(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net=/run/netns/{NODE2.netns}", "--", *argv], capture_output=True, text=True,
                          timeout=30, check=check)


def _spec(jg, name: str, max_steps: int) -> str:
    return jg.spec(name, max_steps=max_steps, every=max_steps)


def test_preflight_prints_bandwidth_per_node_then_trains(jobgen):  # noqa: F811 - the fixture
    jobgen.profile()
    handle = jobgen.submit(_spec(jobgen, "lab-preflight", 40), "slurm-lab", "--preflight")
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=400)
    log = jobgen("logs", handle).stdout
    assert final == "COMPLETED", (seen, jobgen("logs", "--rank", "all", handle).stdout[-4000:])
    assert "preflight: all-reduce of 4 MiB over 2 ranks on 2 node(s) (gloo" in log, log[-4000:]
    for node in ("node1", "node2"):
        line = re.search(rf"^preflight: {node}  ranks \d+  busbw ([0-9.]+) GB/s", log, re.M)
        assert line and float(line.group(1)) > 0, log[-4000:]
    assert "preflight: ok in" in log
    assert log.index("preflight: ok") < log.index("step 40/40"), log[-4000:]
    # the lab's nodes have no GPUs (slurm-cpu): rank zero says the GPU check was skipped, once
    assert log.count("preflight: GPU check skipped: the profile's nodes have no GPUs") == 1, log[-4000:]
    print("\n" + "\n".join(line for line in log.splitlines() if line.startswith("preflight:")))


def test_cut_node_fails_the_job_within_a_minute_naming_it(jobgen, slurm_lab):  # noqa: F811 - the fixture
    jobgen.profile()
    profile = jobgen.root / "profiles" / "slurm-lab.yaml"
    profile.write_text(profile.read_text() + "preflight_timeout_s: 30\n")
    for argv in _firewall_argv("add"):
        _in_node2(argv)
    try:
        handle = jobgen.submit(_spec(jobgen, "lab-preflight-cut", 100000), "slurm-lab", "--preflight")
        jobgen.wait_log(handle, "preflight: 2 ranks joining", 180)
        started = time.monotonic()
        final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=180)
        elapsed = time.monotonic() - started
    finally:
        for argv in _firewall_argv("delete"):
            _in_node2(argv, check=False)
    everything = jobgen("logs", "--rank", "all", handle).stdout
    assert final == "FAILED", (seen, everything[-4000:])
    assert elapsed < 60, f"FAILED {elapsed:.0f} s after the preflight began\n{everything[-4000:]}"
    rank0 = [line for line in everything.splitlines() if line.startswith("0: ") and "error: preflight:" in line]
    assert len(rank0) == 1 and "node node2 (rank 1) did not join the rendezvous" in rank0[0], everything[-4000:]
    rank1 = [line for line in everything.splitlines() if line.startswith("1: ") and "error: preflight:" in line]
    assert rank1 and "node node2 (rank 1) cannot reach the rendezvous" in rank1[0], everything[-4000:]
    first = jobgen("logs", "--first-error", handle, check=False).stdout
    assert "node2" in first, first
    assert not list(run_slurm(slurm_lab, "squeue", "-h", "-j", job_id(handle), "-o", "%i").stdout.split())
