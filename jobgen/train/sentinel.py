"""The watchdog's sentinel: a small process that watches a rank no other rank watches.

A rank's watchdog thread (:mod:`jobgen.train.watchdog`) lives in the rank's process. When the
whole process stops (SIGSTOP, a native call that holds the GIL, a process frozen in the
kernel), its thread stops with it, and only another rank can see its heartbeat stop. A job of
one rank has no other rank, so its rank starts this process (``python -m
jobgen.train.sentinel``, stdlib and jobgen's light modules only) with a pipe on its stdin. The
rank's watchdog thread writes one line per tick: ``{"step": <optimizer step>, "limit_s":
<the watchdog's limit, max(hang_timeout_s, step_time_factor x median step)>}``, and
``{"done": true}`` when it stops watching (the rank's data-loader workers, forked with the pipe
open, can keep it from closing).

The rule: the rank is hung when no line arrived for the last limit it sent (the watchdog's own
rule, seen from outside: a rank whose heartbeat stopped advances no step either). A rank whose
heartbeat is live but whose step stands still is its own watchdog thread's to find (it writes
the stacks). When the rank is hung, the sentinel

1. prints the verdict to stderr, one line in the watchdog's words
   (``python -m jobgen.train: error: hang: ...; heartbeat stopped first: rank 0 on node <host>
   (pid <pid>) at step <step>, silent <s> s; ...``);
2. ends the rank with SIGKILL, the one signal a stopped process obeys (it runs no handler, so
   it writes no stacks). The launcher then reports it killed: exit 137, srun's ``Killed``, an
   infrastructure failure (:mod:`jobgen.reports.failure_class`), which a restart budget retries;
3. writes ``<run dir>/hang/verdict.json`` (after the kill: a frozen file system must not hold it
   up), with ``exit_code`` 137 and ``decided_by`` ``sentinel``.

It kills only its parent, the rank that started it, and only while that is still its parent.
It exits when the pipe closes (the rank ended, or stopped watching) or when its parent is gone.

A silence the sentinel itself slept through does not count: when one wait for the pipe took
:data:`SLEPT_S` longer than asked (SLURM suspends a job, ``scontrol suspend``, by stopping every
process of it with SIGSTOP, the sentinel included), it starts its clock again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jobgen.errors import printable
from jobgen.reports.failure_class import HANG_VERDICT

#: The exit status of a process ended by SIGKILL, as launchers report it (128 + 9).
EXIT_KILLED = 128 + signal.SIGKILL
#: A wait for the pipe that took this many seconds longer than asked: the sentinel did not run.
SLEPT_S = 2.0
#: The longest heartbeat line read (bytes); longer ones are not a heartbeat.
LINE_BYTES = 4096


@dataclass
class Watch:
    """The pure decision: fed the rank's heartbeat lines and the sentinel's clock (seconds,
    monotonic), says when the rank is hung.

    Args:
        limit_s: the limit until the rank sends its own (``watchdog.hang_timeout_s``).
        start: the clock's time the watch began (no line yet counts from there).
    """

    limit_s: float
    start: float
    step: int | None = None
    beat_at: float = 0.0
    step_at: float = 0.0
    done: bool = False

    def __post_init__(self) -> None:
        self.beat_at = self.step_at = self.start

    def beat(self, now: float, line: bytes) -> None:
        """Take one heartbeat line at ``now``; a line that is not one (JSON with an integer
        ``step`` and a positive ``limit_s``, or ``done`` true) is ignored."""
        try:
            doc = json.loads(line)
            if isinstance(doc, dict) and doc.get("done") is True:
                self.done = True
                return
            step, limit = doc["step"], doc["limit_s"]
        except (ValueError, TypeError, KeyError):
            return
        if not isinstance(step, int) or isinstance(step, bool) or not isinstance(limit, (int, float)) \
                or isinstance(limit, bool) or not 0 < limit < float("inf"):
            return
        self.beat_at = now
        if self.step is None or step > self.step:
            self.step, self.step_at = step, now
        self.limit_s = float(limit)

    def restart_clock(self, now: float) -> None:
        """Count from ``now``: the sentinel itself did not run meanwhile."""
        self.beat_at = self.step_at = now

    def hung(self, now: float) -> bool:
        """Whether no heartbeat arrived for the limit."""
        return now - self.beat_at >= self.limit_s

    def verdict(self, now: float, host: str, pid: int) -> str:
        """The verdict's line (without the ``python -m jobgen.train: error:`` prefix)."""
        silent = now - self.beat_at
        step = "unknown" if self.step is None else str(self.step)
        return (f"{HANG_VERDICT}: no rank advanced its optimizer step for {now - self.step_at:.1f} s (limit {self.limit_s:g} s); "
                f"heartbeat stopped first: rank 0 on node {printable(host)} (pid {pid}) at step {step}, silent {silent:.1f} s; "
                f"the rank's process did not answer (stopped or frozen), so its sentinel ended it with SIGKILL and no stacks "
                f"were written (exit {EXIT_KILLED})")

    def to_json(self, now: float, host: str, pid: int, text: str) -> dict[str, Any]:
        """``hang/verdict.json``: the watchdog's keys, ``exit_code`` 137 and ``decided_by`` ``sentinel``."""
        return {"verdict": HANG_VERDICT, "exit_code": EXIT_KILLED, "idle_s": round(now - self.step_at, 3),
                "limit_s": round(self.limit_s, 3), "median_step_s": None,
                "heartbeat_stopped_first": [{"rank": 0, "host": host, "pid": pid, "step": self.step,
                                             "silent_s": round(now - self.beat_at, 3)}],
                "furthest_behind": [], "store": None, "text": text, "decided_by": "sentinel",
                "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


@dataclass(frozen=True)
class System:
    """What the sentinel asks of the system: a monotonic clock (seconds), its parent's pid, a
    signal sender and the stream for the verdict line. Tests pass their own."""

    clock: Callable[[], float] = time.monotonic
    parent: Callable[[], int] = os.getppid
    kill: Callable[[int, int], None] = os.kill
    err: IO[str] | None = None  # None: sys.stderr at the time of the write


def watch(pipe: IO[bytes], pid: int, host: str, run_dir: Path, limit_s: float, interval_s: float,
          system: System = System()) -> int:
    """Watch the rank ``pid`` on ``host`` through ``pipe`` (its heartbeat lines); returns this
    process's exit code: 0 when the pipe closed, the rank said done or the parent is gone, :data:`EXIT_KILLED` after
    ending a hung rank (see the module docstring). ``interval_s``: how long one wait lasts."""
    from jobgen.jobdir.files import HANG_VERDICT_FILE, write_atomic

    clock, parent, kill = system.clock, system.parent, system.kill
    err = system.err if system.err is not None else sys.stderr
    state = Watch(limit_s, clock())
    buffered = b""
    fd = pipe.fileno()
    while True:
        before = clock()
        ready, _, _ = select.select([fd], [], [], interval_s)
        now = clock()
        if now - before > interval_s + SLEPT_S:
            state.restart_clock(now)
        if ready:
            chunk = os.read(fd, LINE_BYTES)
            if not chunk:
                return 0
            *lines, buffered = (buffered + chunk).split(b"\n")
            buffered = buffered[-LINE_BYTES:]
            for line in lines:
                state.beat(now, line)
        if state.done or parent() != pid:
            return 0
        if state.hung(now):
            text = state.verdict(now, host, pid)
            print(f"python -m jobgen.train: error: {text}", file=err, flush=True)
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                return 0
            try:
                write_atomic(run_dir / HANG_VERDICT_FILE, json.dumps(state.to_json(now, host, pid, text), indent=2) + "\n")
            except OSError:
                pass
            return EXIT_KILLED


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobgen.train.sentinel --pid P --host H --run-dir D --limit-s L --interval-s I``
    (what :func:`jobgen.train.watchdog.start_sentinel` runs); the heartbeat comes on stdin."""
    parser = argparse.ArgumentParser(prog="python -m jobgen.train.sentinel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--limit-s", type=float, required=True)
    parser.add_argument("--interval-s", type=float, required=True)
    args = parser.parse_args(argv)
    # Ctrl-C, and the signals SLURM warns a job with before its time limit, are the rank's: its exit closes the pipe
    for number in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)
    return watch(sys.stdin.buffer, args.pid, args.host, args.run_dir, args.limit_s, args.interval_s)


if __name__ == "__main__":
    sys.exit(main())
