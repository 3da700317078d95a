"""Preflight (``launch.preflight``): a 2-rank local gloo run under torchrun measures the
all-reduce, then trains on the process group the preflight created (Lightning does not
initialise its own); srun-style ranks that cannot meet fail within the timeout, naming the node.
The multi-node version with a cut network is tests/integration/slurm/test_preflight_on_lab.py."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobgen.train.preflight import NodeResult, bus_bandwidth, expand_nodelist, missing_message, node_results, slow_nodes
from tests.entrypoint.conftest import REPO, TINY_SPEC, resolved_doc
from tests.entrypoint.test_entrypoint_requeue import _kill, _srun_env
from tests.ports import next_port


@pytest.mark.slow
def test_two_rank_gloo_preflight_reports_bandwidth_then_training_uses_its_process_group(
        write_spec, run_entrypoint, tmp_path: Path) -> None:
    spec = write_spec(preflight=True, preflight_timeout_s=60)
    result = run_entrypoint("--spec", str(spec), "--run-dir", str(tmp_path / "run"), nproc=2)
    assert result.code == 0, result.output
    out = result.stdout
    host = socket.gethostname()
    assert re.search(r"preflight: all-reduce of 4 MiB over 2 ranks on 1 node\(s\) \(gloo", out), out
    line = re.search(rf"^preflight: {re.escape(host)}  ranks 0,1  busbw ([0-9.]+) GB/s  algbw ([0-9.]+) GB/s", out, re.M)
    assert line and float(line.group(1)) > 0, out
    assert float(line.group(1)) == pytest.approx(float(line.group(2)), rel=0.02)  # n = 2: busbw = algbw x 2(1)/2
    assert "preflight: ok in" in out
    # Lightning found the process group initialised and did not make its own (it logs this line when it does)
    assert "Initializing distributed" not in result.stdout + result.stderr, result.output
    assert out.index("preflight: ok") < out.index("step 5/20")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["global_step"] == 20 and summary["world_size"] == 2
    markers = sorted(p.name for p in (tmp_path / "run" / "preflight").glob("*/*"))
    assert markers == [f"0-{host}", f"1-{host}"], markers


@pytest.mark.slow
def test_a_complete_run_skips_the_preflight_and_says_so(write_spec, run_entrypoint, tmp_path: Path) -> None:
    """A run whose newest checkpoint reached max_steps (the entrypoint's "run already complete",
    e.g. a requeue after the last step) does not measure the network it will not use."""
    spec = write_spec(preflight=True, preflight_timeout_s=60)
    max_steps = TINY_SPEC["trainer"]["max_steps"]
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / f"step-{max_steps:08d}.ckpt").write_bytes(b"")  # step-N names are trusted unopened
    result = run_entrypoint("--spec", str(spec), "--run-dir", str(tmp_path / "run"), nproc=2)
    assert result.code == 0, result.output
    assert result.stdout.count(f"preflight: skipped, the run is already complete at step {max_steps}") == 1, result.output
    assert "all-reduce" not in result.stdout, result.output
    assert f"run already complete at step {max_steps}" in result.stdout
    assert not (tmp_path / "run" / "preflight").exists()


@pytest.mark.slow
def test_ranks_that_cannot_meet_fail_within_the_timeout_naming_the_node(tmp_path: Path) -> None:
    """Rank 1 is pointed at a port nobody listens on (its network to rank 0 is "cut"): rank 1
    names itself, rank 0 names rank 1's node (from its marker) - both exit 1 with one line."""
    doc = resolved_doc(TINY_SPEC,
                       scheduler="slurm", num_nodes=2, devices_per_node=1, world_size=2, preflight=True, preflight_timeout_s=6)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc))
    good, bad = next_port(), next_port()
    procs = []
    for rank, port in ((0, good), (1, bad)):
        env = _srun_env(tmp_path, rank, 2, port, 0) | {"SLURM_JOB_NODELIST": "node[1-2]"}
        out = tmp_path / f"out-{rank}.txt"
        with open(out, "w") as fh:
            procs.append((subprocess.Popen([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir",
                                            str(tmp_path / "run")], cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                           start_new_session=True), out))
    started = time.monotonic()
    try:
        codes = [p.wait(timeout=120) for p, _ in procs]
    finally:
        _kill(procs)
    elapsed = time.monotonic() - started
    logs = [o.read_text() for _, o in procs]
    assert codes == [1, 1], logs
    host = socket.gethostname()
    errors = [[line for line in log.splitlines() if "error: preflight:" in line] for log in logs]
    assert len(errors[0]) == 1 and len(errors[1]) == 1, logs
    assert f"node {host} (rank 1) did not join the rendezvous at 127.0.0.1:{good} within 6 s" in errors[0][0], errors
    assert "started (marker in" in errors[0][0], errors
    # rank 1 gives up connecting after 0.8 x the timeout, before rank 0 names it (srun would kill it then)
    assert f"node {host} (rank 1) cannot reach the rendezvous at 127.0.0.1:{bad} within 4.8 s" in errors[1][0], errors
    assert elapsed < 60, elapsed  # torch import + the 6 s timeout, not a hang
    assert not (tmp_path / "run" / "summary.json").exists()


def test_missing_rank_without_marker_is_named_from_slurms_node_list(tmp_path: Path) -> None:
    text = missing_message({1: ("node2", False)}, "node1:29500", 60, tmp_path / "preflight" / "slurm-7-0")
    assert text.startswith("preflight: node node2 (rank 1) did not join the rendezvous at node1:29500 within 60 s; no marker")
    from jobgen.train.preflight import missing_hosts

    found = missing_hosts([2, 3], tmp_path / "nothing", 2, {"SLURM_JOB_NODELIST": "gpu[01-02],login"})
    assert found == {2: ("gpu02", False), 3: ("gpu02", False)}


@pytest.mark.parametrize(("text", "hosts"), [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("gpu[01-02,10],login", ["gpu01", "gpu02", "gpu10", "login"]),
    ("a[1-2]-ib,b7", ["a1-ib", "a2-ib", "b7"]),
])
def test_expand_nodelist(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    # 64 MiB in 10 ms on 8 ranks: algbw 6.71 GB/s, busbw = algbw x 2 x 7 / 8
    assert bus_bandwidth(64 * 2**20, 0.010, 8) == pytest.approx(64 * 2**20 / 0.010 * 1.75)


def test_slow_rule_names_nodes_below_half_the_median() -> None:
    times = {0: ("n1", 0.010), 1: ("n1", 0.011), 2: ("n2", 0.010), 3: ("n3", 0.030), 4: ("n4", 0.012)}
    results = node_results(times, 2**20, 5)
    assert [r.host for r in results] == ["n1", "n2", "n3", "n4"]
    assert results[0].ranks == (0, 1) and results[0].seconds == 0.011  # a node counts its slowest rank
    slow, median = slow_nodes(results)
    assert [r.host for r in slow] == ["n3"]
    assert all(isinstance(r, NodeResult) for r in slow) and median > 0
    assert slow_nodes(node_results({0: ("a", 0.01), 1: ("b", 0.019)}, 2**20, 2))[0] == []


@pytest.mark.parametrize("first", [
    {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"},  # a static rendezvous (ssh hosts)
    {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "0"},
    {},
])
def test_each_start_restarted_by_jobgen_has_its_own_attempt(first: dict[str, str]) -> None:
    """A start jobgen restarts (``JOBGEN_RESTART_COUNT``: local, ssh, Kubernetes) keys its preflight
    markers and store prefixes apart from the start before it: a rank that did not join this start
    is never named from a marker of the last one."""
    from jobgen.train.preflight import attempt_id

    ids = [attempt_id({**first, **({"JOBGEN_RESTART_COUNT": str(n)} if n else {})}) for n in (0, 1, 2)]
    assert len(set(ids)) == 3, ids
    assert attempt_id({**first, "JOBGEN_RESTART_COUNT": "1; rm -rf /"}) == ids[0]  # not a count: ignored
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", i) for i in ids), ids
