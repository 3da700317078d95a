"""The ssh backend's restart watcher (jobgen.backends.ssh.restart) against fake hosts: the ssh
calls are replaced by :class:`FakeHosts` (scripted states and node outputs), emulating what the
lab's hosts do; the real hosts are tests/integration/ssh/test_ssh_restarts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.backends.ssh.launch import (
    DONE,
    LAUNCH_LINE,
    RESTARTS_FILE,
    NodeReport,
    pack_checkpoints_command,
    read_record,
    sees_command,
    stored_evidence,
    unpack_command,
)
from jobgen.backends.ssh.restart import Pace, node_evidence, watch

KILLED = """\
jobgen: node 1 of 2 on host2, rendezvous 10.0.0.1:29500
[default0]:step 3/100 | loss 2.1
E1129 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 77) of binary: python
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_10:00:00
  host      : host2
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 77)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 77
"""
LOST_PEER = """\
jobgen: node 0 of 2 on host1, rendezvous 10.0.0.1:29500
[default0]:step 3/100 | loss 2.1
[default0]:Traceback (most recent call last):
[default0]:  File "x.py", line 1, in <module>
[default0]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234
"""
USER_ERROR = """\
jobgen: node {rank} of 2 on host, rendezvous 10.0.0.1:29500
[default0]:Traceback (most recent call last):
[default0]:  File "model.py", line 9, in training_step
[default0]:ValueError: user code failed at step 3
"""


def launch_line(rank: int) -> str:
    return LAUNCH_LINE.format(rank=rank)


def nodes(*exits: int | None, procs: int = 0, hosts: tuple[str, ...] = ("host1", "host2")) -> list[NodeReport]:
    return [NodeReport(h, r, pid=100 + r, exit_code=e, procs=procs) for r, (h, e) in enumerate(zip(hosts, exits, strict=True))]


class FakeHosts:
    """Scripted hosts: ``states`` is a list of (state, node reports, {rank: output}) served one
    per look (the last repeats); records what the watcher did."""

    def __init__(self, states, *, shared: bool = True, summary: str | None = '{"global_step": 100}'):
        self.states, self.is_shared, self.summary = list(states), shared, summary
        self.calls: list[str] = []
        self.outputs: dict[int, str] = {}
        self.written: str | None = None
        self.notified: list[tuple[dict, int]] = []  # (restart record, budget) per restart event
        self.started: list[int] = []  # the restart count each start of the hosts was given

    def state(self):
        state, reports, outputs = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        self.outputs = outputs
        return state, reports

    def output(self, rank):
        return self.outputs.get(rank, "")

    def shared(self):
        return self.is_shared

    def copy_checkpoints(self):
        self.calls.append("copy")

    def kill(self):
        self.calls.append("kill")

    def start(self, restart):
        self.calls.append("start")
        self.started.append(restart)
        return []

    def read_summary(self):
        return self.summary

    def write_summary(self, text):
        self.written = text


def run(hosts: FakeHosts, job_dir: Path, budget: int) -> tuple[str, list[str]]:
    said: list[str] = []
    outcome = watch(hosts, job_dir, budget, launch_line, out=said.append, pace=Pace(poll_s=0, sleep=lambda s: None),
                    notify=lambda entry, budget: (hosts.calls.append("notify"), hosts.notified.append((dict(entry), budget))))
    return outcome, said


def test_a_killed_rank_is_restarted_within_the_budget_and_the_restart_recorded(tmp_path):
    failed = ("FAILED", nodes(1, 1), {0: LOST_PEER, 1: KILLED})
    hosts = FakeHosts([("RUNNING", nodes(None, None, procs=3), {}), failed, ("RUNNING", nodes(None, None, procs=3), {}),
                       ("COMPLETED", nodes(0, 0), {})])
    outcome, said = run(hosts, tmp_path, budget=1)
    # the restart event goes out once the restart is decided, before the hosts are started again
    assert outcome == "COMPLETED" and hosts.calls == ["notify", "kill", "start"], (hosts.calls, said)
    record = read_record(tmp_path)
    assert record["state"] == DONE and record["outcome"] == "COMPLETED" and len(record["restarts"]) == 1, record
    assert hosts.notified == [(record["restarts"][0], 1)]
    assert hosts.started == [1]  # the hosts' second start is restart 1 (JOBGEN_RESTART_COUNT there)
    entry = record["restarts"][0]
    assert (entry["restart"], entry["class"], entry["exit_code"]) == (1, "infrastructure", 1), entry
    assert entry["rule"] in ("lost-peer", "killed") and "node " in entry["evidence"], entry
    summary = json.loads(hosts.written)
    assert summary["global_step"] == 100 and summary["restarts"]["used"] == 1 and summary["restarts"]["max_restarts"] == 1
    assert summary["restarts"]["history"] == record["restarts"]
    assert any(line.startswith("jobgen: restart 1 of 1 (restart.max_restarts) after a failure classed infrastructure") for line in said)


def test_each_restart_starts_the_hosts_with_the_restarts_used_so_far(tmp_path):
    """The count reaches every host's launch (:func:`jobgen.backends.ssh.launch.start_command`), so
    the entrypoint's notifications name the restart, as a local run's and a SLURM job's do."""
    failed = ("FAILED", nodes(1, 1), {0: LOST_PEER, 1: KILLED})
    running = ("RUNNING", nodes(None, None, procs=3), {})
    hosts = FakeHosts([failed, running, failed, running, ("COMPLETED", nodes(0, 0), {})])
    assert run(hosts, tmp_path, budget=3)[0] == "COMPLETED"
    assert hosts.started == [1, 2] and [e["restart"] for e, _ in hosts.notified] == [1, 2], (hosts.started, hosts.notified)


def test_a_user_error_is_never_restarted_whatever_the_budget(tmp_path):
    hosts = FakeHosts([("FAILED", nodes(1, 1), {r: USER_ERROR.format(rank=r) for r in (0, 1)})])
    outcome, said = run(hosts, tmp_path, budget=3)
    assert outcome == "FAILED" and hosts.calls == [], said
    record = read_record(tmp_path)
    assert record["restarts"] == [] and record["failure"]["class"] == "user" and record["failure"]["rule"] == "exception"
    assert "a user failure is not restarted" in said[-1] and "restarts used: 0 of 3" in said[-1], said
    assert any(e.text.startswith("ValueError: user code failed") for e in stored_evidence(record))


def test_the_budget_is_spent_then_the_job_fails(tmp_path):
    failed = ("FAILED", nodes(1, 1), {0: LOST_PEER, 1: KILLED})
    hosts = FakeHosts([failed, ("RUNNING", nodes(None, None, procs=2), {}), failed])
    outcome, said = run(hosts, tmp_path, budget=1)
    assert outcome == "FAILED" and hosts.calls == ["notify", "kill", "start"], said
    assert "the budget is spent (1 of 1)" in said[-1], said


def test_a_run_directory_that_is_not_shared_gets_node_0s_checkpoints_before_the_restart(tmp_path):
    hosts = FakeHosts([("FAILED", nodes(1, 1), {0: LOST_PEER, 1: KILLED}), ("COMPLETED", nodes(0, 0), {})], shared=False)
    assert run(hosts, tmp_path, budget=2)[0] == "COMPLETED"
    assert hosts.calls == ["notify", "kill", "copy", "start"]


def test_a_launch_killed_without_an_exit_code_is_a_failure_nothing_explains_and_is_restarted(tmp_path):
    gone = [NodeReport("host1", 0, pid=5), NodeReport("host2", 1, pid=6)]
    hosts = FakeHosts([("UNKNOWN", gone, {}), ("COMPLETED", nodes(0, 0), {})])
    assert run(hosts, tmp_path, budget=1)[0] == "COMPLETED"
    assert read_record(tmp_path)["restarts"][0]["class"] == "unknown"


def test_unreached_hosts_are_waited_for_and_a_cancel_ends_the_watch(tmp_path):
    unreached = [NodeReport("host1", 0, reached=False, error="timeout"), NodeReport("host2", 1, pid=6, procs=2)]
    hosts = FakeHosts([("UNKNOWN", unreached, {}), ("CANCELLED", nodes(143, 143), {})])
    assert run(hosts, tmp_path, budget=1)[0] == "CANCELLED" and hosts.calls == []


def test_a_summary_that_is_not_a_json_object_is_left_alone(tmp_path):
    hosts = FakeHosts([("COMPLETED", nodes(0, 0), {})], summary="[1, 2]\n\xff")
    outcome, said = run(hosts, tmp_path, budget=1)
    assert outcome == "COMPLETED" and hosts.written is None and "no readable summary.json" in " ".join(said)


def test_node_evidence_reads_the_last_attempt_only_and_names_the_node_printably():
    earlier = USER_ERROR.format(rank=1)
    found = node_evidence(1, "host\n2\x1b", earlier + KILLED, 1, launch_line(1))
    assert not any("ValueError" in e.text for e in found), found  # the first attempt's error is not this one's
    assert found[-2].signal == 9 and found[-1].exit_code == 1, found
    assert all(e.source.startswith("node 1 (host\\n2\\x1b): ") for e in found), found
    assert node_evidence(0, "h", "", None, launch_line(0)) == []


@pytest.mark.parametrize("text", ["", "\xff", "[]", '{"max_restarts": "1", "pid": 1, "state": "x", "restarts": []}',
                                  '{"max_restarts": 1, "pid": true, "state": "x", "restarts": []}',
                                  '{"max_restarts": 1, "pid": 1, "state": "x", "restarts": [1]}',
                                  '{"max_restarts": 1, "pid": 1, "state": 3, "restarts": []}'])
def test_a_record_of_another_shape_reads_as_none(tmp_path, text):
    (tmp_path / RESTARTS_FILE).write_bytes(text.encode("utf-8", errors="surrogateescape") if text != "\xff" else b"\xff")
    assert read_record(tmp_path) is None


def test_stored_evidence_leaves_out_entries_of_another_shape():
    record = {"evidence": [{"source": "node 0", "exit_code": 1}, {"source": 1}, {"source": "x", "exit_code": True},
                           {"source": "x", "extra": 1}, "text", {"source": "n\n1", "text": "x" * 300}]}
    assert [e.source for e in stored_evidence(record)] == ["node 0", "n\n1"]


def test_the_remote_commands_quote_the_run_directory():
    run = "/w/it's a dir;rm -rf ~"
    for command in (sees_command(run, 0), pack_checkpoints_command(run), unpack_command(run)):
        assert "'/w/it'\"'\"'s a dir;rm -rf ~" in command, command


def test_the_record_says_done_only_after_the_summary_has_the_restarts(tmp_path):
    """``jobgen status`` keeps a completed job RUNNING until the watcher's record says done
    (:meth:`jobgen.backends.ssh.backend.SshBackend.status`); that holds the contract only if the
    record turns done after node 0's summary.json got ``restarts``."""
    states_at_write: list[str] = []

    class Recording(FakeHosts):
        def write_summary(self, text):
            states_at_write.append(read_record(tmp_path)["state"])
            super().write_summary(text)

    hosts = Recording([("FAILED", nodes(1, 1), {0: LOST_PEER, 1: KILLED}), ("COMPLETED", nodes(0, 0), {})])
    assert run(hosts, tmp_path, budget=1)[0] == "COMPLETED"
    assert states_at_write == ["watching"] and read_record(tmp_path)["state"] == DONE, states_at_write
    assert json.loads(hosts.written)["restarts"]["used"] == 1
