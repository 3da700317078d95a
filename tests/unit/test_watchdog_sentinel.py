"""The watchdog's sentinel (jobgen/train/sentinel.py): its decision on fed heartbeat lines, its
loop on a real pipe (a fake clock, kill and parent), and the real process a one-rank watchdog
thread starts and ends. A stopped one-rank training ended by it: tests/entrypoint/test_watchdog.py."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from jobgen.reports.failure_class import Evidence, classify
from jobgen.train.sentinel import EXIT_KILLED, System, Watch, watch
from jobgen.train.watchdog import WatchLimits, WatchThread, start_sentinel


def line(step: int, limit_s: float = 2.0) -> bytes:
    return json.dumps({"step": step, "limit_s": limit_s}).encode()


def test_no_heartbeat_for_the_limit_is_a_hang_and_each_line_restarts_the_wait():
    w = Watch(limit_s=5, start=0.0)
    assert not w.hung(4.9) and w.hung(5.0)  # nothing yet: from the start
    w.beat(4.0, line(7, limit_s=3))
    assert (w.step, w.limit_s) == (7, 3.0) and not w.hung(6.9) and w.hung(7.0)  # the rank's own limit from then on
    w.beat(6.0, line(7, limit_s=3))  # a live heartbeat, the same step: not the sentinel's to judge
    assert not w.hung(8.9)
    text = w.verdict(9.5, "node1", 42)
    assert text.startswith("hang: no rank advanced its optimizer step for 5.5 s (limit 3 s); heartbeat stopped first: "
                           "rank 0 on node node1 (pid 42) at step 7, silent 3.5 s;"), text
    assert text.endswith("its sentinel ended it with SIGKILL and no stacks were written (exit 137)")
    # the failure table reads the line as the watchdog's: a hang, infrastructure
    decided = classify([Evidence("rank 0", kind="error", text=f"python -m jobgen.train: error: {text}")])
    assert decided is not None and (decided.cls, decided.rule) == ("infrastructure", "hang"), decided


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b"[1, 2]", b'{"step": "7", "limit_s": 2}', b'{"step": true, "limit_s": 2}',
                                 b'{"step": 7, "limit_s": 0}', b'{"step": 7, "limit_s": NaN}', b'{"step": 7, "limit_s": Infinity}',
                                 b'{"step": 7}', b'{"done": 1}', b"x" * 300 + b"\n\x1b[31m", b'{"step": 7, "limit_s": false}'])
def test_a_line_that_is_not_a_heartbeat_is_ignored(raw):
    w = Watch(limit_s=5, start=0.0)
    w.beat(4.0, raw)
    assert (w.step, w.beat_at, w.limit_s, w.done) == (None, 0.0, 5.0, False)


def test_a_hostile_host_name_is_shown_printable():
    text = Watch(limit_s=1, start=0.0).verdict(2.0, "node\n1\x1b[2J 'x'", 7)
    assert "\n" not in text and "\x1b" not in text and "rank 0 on node node\\n1\\x1b[2J 'x' (pid 7) at step unknown" in text, text


class Clock:
    """A fake monotonic clock: each call returns the next of ``times``, then the last one."""

    def __init__(self, *times: float):
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]


def run_watch(tmp_path: Path, writes: list[bytes], clock, *, close: bool = False, parent: int = 42, limit_s: float = 2.0):
    read, write = os.pipe()
    for chunk in writes:
        os.write(write, chunk)
    if close:
        os.close(write)
    killed: list[tuple[int, int]] = []
    err = io.StringIO()
    try:
        with os.fdopen(read, "rb", buffering=0) as pipe:
            code = watch(pipe, 42, "node1", tmp_path, limit_s, 0.01,
                         System(clock=clock, parent=lambda: parent, kill=lambda pid, sig: killed.append((pid, sig)), err=err))
    finally:
        if not close:
            os.close(write)
    return code, killed, err.getvalue()


def test_the_loop_kills_its_silent_parent_once_prints_the_verdict_and_writes_it(tmp_path):
    clock = Clock(0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 2.4, 2.4, 2.6)
    code, killed, err = run_watch(tmp_path, [line(3) + b"\n" + line(4)[:5]], clock)  # one beat, then half a line
    assert code == EXIT_KILLED and killed == [(42, signal.SIGKILL)], (code, killed, err)
    assert err.startswith("python -m jobgen.train: error: hang: no rank advanced its optimizer step for 2.1 s (limit 2 s); "
                          "heartbeat stopped first: rank 0 on node node1 (pid 42) at step 3, silent 2.1 s;"), err
    doc = json.loads((tmp_path / "hang" / "verdict.json").read_text())
    assert (doc["verdict"], doc["exit_code"], doc["decided_by"], doc["text"]) == ("hang", 137, "sentinel", err.split("error: ", 1)[1].strip())
    assert doc["heartbeat_stopped_first"] == [{"rank": 0, "host": "node1", "pid": 42, "step": 3, "silent_s": 2.1}], doc


def test_a_silence_the_sentinel_slept_through_does_not_count(tmp_path):
    # the wait asked for 0.01 s took 100 s (the job was suspended): the clock starts again at 100
    clock = Clock(0.0, 0.0, 100.0, 100.0, 101.0, 101.0, 101.9, 101.9, 102.0)
    code, killed, err = run_watch(tmp_path, [], clock)
    assert code == EXIT_KILLED and "silent 2.0 s" in err, err


@pytest.mark.parametrize("case", ["closed", "done", "orphaned"])
def test_the_loop_ends_without_a_kill_when_the_pipe_closes_the_rank_is_done_or_the_parent_changed(tmp_path, case):
    writes = [line(3) + b'\n{"done": true}\n'] if case == "done" else [line(3) + b"\n"]
    clock = Clock(*[i * 0.001 for i in range(100)], 1000.0)
    code, killed, err = run_watch(tmp_path, writes, clock, close=case == "closed", parent=1 if case == "orphaned" else 42)
    assert (code, killed, err) == (0, [], "")
    assert not (tmp_path / "hang").exists()


def test_a_one_rank_thread_feeds_its_sentinel_process_and_ends_it_when_it_stops(tmp_path):
    store = dist.PrefixStore("w", dist.HashStore())
    proc = start_sentinel(tmp_path, hang_timeout_s=2)
    assert proc is not None
    try:  # a sentinel left running would end this process (its parent) once the lines stop
        thread = WatchThread(store, 0, 1, limits=WatchLimits(2, 10), run_dir=tmp_path, address="in-process",
                             exit=lambda code: None, sentinel=proc)
        thread.start()
        for _ in range(15):  # longer than the limit: the thread's lines keep the sentinel from acting
            thread.step += 1
            time.sleep(0.2)
        assert proc.poll() is None
        thread.stop()
        thread._thread.join(10)
        assert proc.returncode == 0 and thread.sentinel is None  # told done, exited, reaped
        assert not (tmp_path / "hang").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_sentinel_ends_with_a_thread_that_ends_without_exiting_the_process(tmp_path):
    """The in-process verdict exits the process; where it does not (a test's exit), the thread's end
    still ends the sentinel, which would otherwise kill its live parent once the lines stop."""
    proc = start_sentinel(tmp_path, hang_timeout_s=1)
    assert proc is not None
    try:
        thread = WatchThread(dist.PrefixStore("w", dist.HashStore()), 0, 1, limits=WatchLimits(1, 10), run_dir=tmp_path,
                             address="in-process", exit=lambda code: None, sentinel=proc)
        thread.start()
        thread._thread.join(30)  # no step: the thread's own verdict after 1 s, then its end
        assert proc.wait(10) == 0 and json.loads((tmp_path / "hang" / "verdict.json").read_text())["exit_code"] == 201
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
