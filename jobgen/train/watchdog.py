"""The progress watchdog: finds a job whose ranks stopped advancing, and ends it as hung.

Every rank runs one thread (:class:`ProgressWatchdog`, a Lightning callback that starts it at
``on_train_start``). Each tick of ``interval_s`` the thread

1. publishes this rank's heartbeat in the rendezvous store (torchrun's agent store, or rank
   zero's under srun: the TCPStore at MASTER_ADDR:MASTER_PORT that the process group, and the
   preflight, already use): ``beat/<rank>`` = its optimizer step, its phase (``train``,
   ``validate``, ``checkpoint``, ``done``), a counter that grows every tick, its host and pid;
2. on global rank zero, reads every rank's heartbeat (one ``multi_get``) and hands them to
   :class:`Observer`, the pure decision, timed by this process's own monotonic clock (no clock
   is compared across nodes); on the other ranks, reads only the verdict and rank zero's
   heartbeat, and watches those two ranks (itself and rank zero) with the same rule: the
   fallback for a stopped rank zero. Rank zero alone reads everything so that the store's load
   grows with the world size, not with its square.

The training loop's only work is the callback setting two attributes (step and phase) at batch
boundaries. The rule (:meth:`Observer.observe`): the job is hung when no rank advanced its
optimizer step for ``max(hang_timeout_s, step_time_factor x median step time)`` seconds (the
spec's ``watchdog``; defaults 600 s and 10). Validation and checkpoint saving are excluded by
design: the clock is paused while a rank reports ``validate`` or ``checkpoint`` (a validation
pass or a large save may take longer than any step), as long as every rank's heartbeat is live.
Once one has not changed for half of ``hang_timeout_s`` the pause is void and the clock runs:
the ranks waiting for a stopped peer inside a save's barrier report ``checkpoint`` too. So a
rank stopped in any phase is found, at most 1.5 x the limit after it stopped. A deadlock inside
validation or a save, every heartbeat live, is left to the process group's timeout.

A non-zero rank decides only when rank zero's heartbeat has stopped (or when rank zero has
not decided a full ``hang_timeout_s`` after the limit), so rank zero's verdict, which sees
every rank, is the one the log shows. The store is a fallback case of its own: under srun rank
zero's process hosts it, and when it stops answering for ``hang_timeout_s`` the watching ranks
call the job hung and name rank zero's node.

A job of one rank has no other rank to see its heartbeat stop when its whole process stops
(SIGSTOP, a native call holding the GIL): its rank starts a sentinel process, which the thread
sends each tick's step and limit through a pipe (:mod:`jobgen.train.sentinel`); it ends the rank
with SIGKILL, after printing the verdict, when no tick arrived for the limit.

When the job is hung, the rank that decides first writes the verdict to the store and to
``<run dir>/hang/verdict.json``, prints it (one line naming the rank(s) whose heartbeat stopped
first, their node and their last step), and every live rank writes the Python stacks of all its
threads (``faulthandler.dump_traceback(all_threads=True)``) to ``<run dir>/hang/stacks-rank<N>.txt``
and exits :data:`jobgen.reports.failure_class.EXIT_HUNG`.

Stragglers. Each heartbeat also carries the rank's compute time per batch: the median of its
newest :data:`COMPUTE_SAMPLES` times from ``on_train_batch_start`` to ``on_before_backward``
(Lightning's Callback hooks: the batch is loaded, the training step's forward and loss ran, the
backward has not started). That span, not the step time, because synchronous data parallel
training makes every rank's optimizer step take the same wall time: DDP's gradient all-reduce
runs inside the backward (its bucket hooks) and its end waits for the slowest rank, so a slow
rank makes its peers wait there and every step time, and every backward's end, is the slowest
rank's. The forward has no collective under DDP (no buffers broadcast: jobgen's models hold
none, and a user's module that registers buffers has DDP broadcast them at the forward's start),
so each rank's own speed shows in it. Under FSDP and DeepSpeed ZeRO-3 the forward gathers
parameters, so the peers of a slow rank wait inside it too and a straggler's ratio reads lower.
Rank zero compares the ranks (:func:`find_straggler`) every tick, and reports the first
straggler once: one line in the log, and ``summary.json``'s ``straggler``.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from jobgen.jobdir.files import HANG_DIR, HANG_NODES_FILE, HANG_VERDICT_FILE
from jobgen.reports.failure_class import EXIT_HUNG, HANG_VERDICT
from jobgen.train.sentinel import SLEPT_S

TRAIN, VALIDATE, CHECKPOINT, DONE = "train", "validate", "checkpoint", "done"
#: The phases that pause the clock while the rank reporting them has a live heartbeat.
PAUSED_PHASES = frozenset({VALIDATE, CHECKPOINT, DONE})
#: Step-time samples the median is taken over (the newest).
STEP_SAMPLES = 1000
#: A heartbeat unchanged for this many ticks counts as stopped when the verdict names ranks.
STALE_TICKS = 3
#: Compute-time samples (batches) a rank's published median is taken over (the newest).
COMPUTE_SAMPLES = 50
#: Batches a rank times before it publishes its median (the first ones carry one-off costs).
MIN_COMPUTE_SAMPLES = 5


def tick_seconds(hang_timeout_s: float) -> float:
    """How often the thread publishes and looks (seconds): a twentieth of the hang timeout,
    from 0.1 s to 5 s."""
    return min(max(hang_timeout_s / 20, 0.1), 5.0)


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat as published: ``step`` (optimizer step), ``phase``, ``count`` (grows
    every tick while its thread runs), ``host``, ``pid``, and ``compute_s``: the median of the
    rank's newest compute times per batch (seconds, see the module docstring), ``None`` before
    :data:`MIN_COMPUTE_SAMPLES` batches."""

    step: int
    phase: str
    count: int
    host: str
    pid: int
    compute_s: float | None = None

    def dumps(self) -> str:
        """The store's value (JSON)."""
        return json.dumps({"step": self.step, "phase": self.phase, "count": self.count, "host": self.host, "pid": self.pid,
                           "compute_s": self.compute_s})

    @classmethod
    def loads(cls, raw: bytes) -> Beat | None:
        """A beat from the store's value; ``None`` for anything else (a ``compute_s`` that is not a
        positive finite number reads as ``None``)."""
        try:
            doc = json.loads(raw)
            beat = cls(int(doc["step"]), str(doc["phase"]), int(doc["count"]), str(doc["host"]), int(doc["pid"]))
        except (ValueError, KeyError, TypeError):
            return None
        compute = doc.get("compute_s")
        if isinstance(compute, (int, float)) and not isinstance(compute, bool) and 0 < compute < float("inf"):
            return Beat(beat.step, beat.phase, beat.count, beat.host, beat.pid, float(compute))
        return beat


@dataclass
class _Seen:
    beat: Beat
    beat_at: float  # when its count last changed (observer's clock)
    step_at: float  # when its step last changed
    paused_since_step: bool = False


@dataclass(frozen=True)
class Stopped:
    """A rank named by a verdict: its rank, host, pid, last step, and seconds since its heartbeat changed."""

    rank: int
    host: str
    pid: int
    step: int | None
    silent_s: float


@dataclass(frozen=True)
class Verdict:
    """Why the job is hung.

    Attributes:
        idle_s: seconds since any rank advanced (or a pause held).
        limit_s: the limit it passed: ``max(hang_timeout_s, factor x median_step_s)``.
        median_step_s: the median step time the limit used (``None`` before any step).
        first: the rank(s) whose heartbeat stopped first (empty when every heartbeat is live).
        behind: when every heartbeat is live, the rank(s) at the lowest step.
        store: set when the verdict comes from the store not answering (its address).
    """

    idle_s: float
    limit_s: float
    median_step_s: float | None
    first: tuple[Stopped, ...] = ()
    behind: tuple[Stopped, ...] = ()
    store: str = ""

    def text(self, hang_timeout_s: float, factor: float) -> str:
        """The one-line verdict for the log."""
        median = "no step timed yet" if self.median_step_s is None else f"median step {self.median_step_s:.3g} s"
        limit = f"limit {self.limit_s:g} s = max(hang_timeout_s {hang_timeout_s:g}, {factor:g} x {median})"
        if self.store:
            return (f"{HANG_VERDICT}: the rendezvous store at {self.store} did not answer for {self.idle_s:.1f} s ({limit}); its host "
                    f"(rank 0's node under srun, node rank 0's torchrun agent) stopped or left")
        head = f"{HANG_VERDICT}: no rank advanced its optimizer step for {self.idle_s:.1f} s ({limit})"
        if self.first:
            who = "; ".join(f"rank {s.rank} on node {s.host} (pid {s.pid}) at step {_step(s.step)}, silent {s.silent_s:.1f} s"
                            for s in self.first)
            return f"{head}; heartbeat stopped first: {who}"
        who = ", ".join(f"rank {s.rank} on node {s.host} at step {_step(s.step)}" for s in self.behind)
        return f"{head}; every heartbeat is live (a deadlock: a collective some rank never joined?); furthest behind: {who}"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict for ``hang/verdict.json``."""
        def ranks(items: tuple[Stopped, ...]) -> list[dict[str, Any]]:
            return [{"rank": s.rank, "host": s.host, "pid": s.pid, "step": s.step, "silent_s": round(s.silent_s, 3)} for s in items]

        return {"verdict": HANG_VERDICT, "exit_code": EXIT_HUNG, "idle_s": round(self.idle_s, 3), "limit_s": round(self.limit_s, 3),
                "median_step_s": self.median_step_s, "heartbeat_stopped_first": ranks(self.first),
                "furthest_behind": ranks(self.behind), "store": self.store or None}


@dataclass(frozen=True)
class Straggler:
    """A rank slower than the others (:func:`find_straggler`): its ``rank``, its ``node`` (the
    host name it published), ``ratio`` = ``step_time_s`` / ``median_step_time_s``, where
    ``step_time_s`` is its compute time per batch and ``median_step_time_s`` the median of the
    other ranks' (seconds; see the module docstring for what is timed)."""

    rank: int
    node: str
    ratio: float
    step_time_s: float
    median_step_time_s: float

    def text(self) -> str:
        """The log's line."""
        return (f"jobgen: rank {self.rank} on {self.node} is a straggler: {self.ratio:.1f}x the median step time "
                f"({self.step_time_s:.2f} s vs {self.median_step_time_s:.2f} s)")

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s ``straggler``: ``rank``, ``node``, ``ratio``, ``step_time_s``, ``median_step_time_s``."""
        return {"rank": self.rank, "node": self.node, "ratio": round(self.ratio, 3), "step_time_s": round(self.step_time_s, 6),
                "median_step_time_s": round(self.median_step_time_s, 6)}


def find_straggler(beats: Mapping[int, Beat | None], factor: float) -> Straggler | None:
    """The slowest rank when its compute time is more than ``factor`` times the median of the
    other ranks' compute times, else ``None``.

    The median of the others, not of all ranks: with two ranks the median of all is the mean of
    the slow one and the fast one, and a rank twice as slow as its peer would read 1.33x. Ranks
    without a published time (``None``, or no ``compute_s`` yet) are left out; fewer than two
    with one: ``None``. The slowest rank by time, the lowest rank number between equal times.
    """
    timed = sorted((b.compute_s, -r, b.host) for r, b in beats.items() if b is not None and b.compute_s is not None)
    if len(timed) < 2:
        return None
    slow_s, minus_rank, host = timed[-1]
    others = statistics.median(t[0] for t in timed[:-1])
    if others <= 0 or slow_s <= factor * others:
        return None
    return Straggler(-minus_rank, host, slow_s / others, slow_s, others)


def _step(step: int | None) -> str:
    return "unknown" if step is None else str(step)


@dataclass
class Observer:
    """The pure decision: fed every rank's heartbeat each tick, says when the job is hung.

    Args:
        ranks: the ranks watched (every rank on rank zero; itself and rank zero elsewhere).
        hang_timeout_s: the floor of the limit (seconds).
        factor: the limit is at least ``factor`` x the median step time.
        interval_s: the tick; a heartbeat unchanged for :data:`STALE_TICKS` ticks counts as stopped.
        start: the observer clock's time the watch began (a rank never seen counts from there).
    """

    ranks: tuple[int, ...]
    hang_timeout_s: float
    factor: float
    interval_s: float
    start: float
    seen: dict[int, _Seen] = field(default_factory=dict)
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_SAMPLES))
    progress_at: float = 0.0
    store_ok_at: float = 0.0

    def __post_init__(self) -> None:
        self.progress_at = self.store_ok_at = self.start

    def skip(self, lost_s: float) -> None:
        """This process did not run for ``lost_s`` seconds (its thread's wait for the next tick
        took that much longer than asked: SLURM suspends a job by stopping every process of it,
        ``scontrol suspend``, gang scheduling, PreemptMode=SUSPEND, while the monotonic clock runs
        on). Every time the rule measures from moves forward by it, so that time counts neither as
        time without progress nor as a silent heartbeat."""
        self.start += lost_s
        self.progress_at += lost_s
        self.store_ok_at += lost_s
        for seen in self.seen.values():
            seen.beat_at += lost_s
            seen.step_at += lost_s

    def median_step_s(self) -> float | None:
        """The median of the step times seen (seconds), ``None`` before any."""
        return statistics.median(self.samples) if self.samples else None

    def limit_s(self) -> float:
        """``max(hang_timeout_s, factor x median step time)``."""
        median = self.median_step_s()
        return self.hang_timeout_s if median is None else max(self.hang_timeout_s, self.factor * median)

    def observe(self, now: float, beats: Mapping[int, Beat | None]) -> Verdict | None:
        """Take one tick's heartbeats (rank -> beat; ``None``: not published yet) at ``now``
        (seconds, the observer's monotonic clock); returns the verdict once the job is hung."""
        self.store_ok_at = now
        for rank, beat in beats.items():
            if beat is None:
                continue
            old = self.seen.get(rank)
            if old is None:
                self.seen[rank] = _Seen(beat, now, now, beat.phase in PAUSED_PHASES)
                continue
            if beat.count != old.beat.count:
                old.beat_at = now
            if beat.step > old.beat.step:
                if not old.paused_since_step and beat.phase not in PAUSED_PHASES:
                    self.samples.append((now - old.step_at) / (beat.step - old.beat.step))
                old.step_at, old.paused_since_step = now, False
                self.progress_at = now
            if beat.phase in PAUSED_PHASES:
                old.paused_since_step = True
            old.beat = beat
        # the pause holds while every heartbeat is live: a rank waiting for a stopped peer inside a
        # save's barrier or a validation's collective reports that phase too, and must not hold it
        void = any(now - s.beat_at >= self.hang_timeout_s / 2 for s in self.seen.values())
        if not void and any(s.beat.phase in PAUSED_PHASES for s in self.seen.values()):
            self.progress_at = now
        idle = now - self.progress_at
        limit = self.limit_s()
        if idle < limit:
            return None
        stale_s = STALE_TICKS * self.interval_s
        silent = {r: now - self.seen[r].beat_at if r in self.seen else now - self.start for r in self.ranks}
        stopped = sorted((r for r in self.ranks if silent[r] >= stale_s), key=lambda r: -silent[r])
        first: tuple[Stopped, ...] = ()
        behind: tuple[Stopped, ...] = ()
        if stopped:
            longest = silent[stopped[0]]
            first = tuple(self._named(r, silent[r]) for r in sorted(r for r in stopped if longest - silent[r] <= self.interval_s))
        else:
            low = min((s.beat.step for s in self.seen.values()), default=0)
            behind = tuple(self._named(r, silent[r]) for r in sorted(r for r, s in self.seen.items() if s.beat.step == low))
        return Verdict(idle, limit, self.median_step_s(), first, behind)

    def store_silent(self, now: float, address: str) -> Verdict | None:
        """A tick where the store did not answer: the verdict once it has been silent for
        ``hang_timeout_s`` (rank zero's node hosts it under srun)."""
        idle = now - self.store_ok_at
        if idle < self.hang_timeout_s:
            return None
        return Verdict(idle, self.hang_timeout_s, self.median_step_s(), store=address)

    def _named(self, rank: int, silent_s: float) -> Stopped:
        seen = self.seen.get(rank)
        if seen is None:
            return Stopped(rank, "unknown (never published)", 0, None, silent_s)
        return Stopped(rank, seen.beat.host, seen.beat.pid, seen.beat.step, silent_s)


def dump_stacks(path: Path, header: str) -> None:
    """Write ``header`` and the Python stacks of every thread of this process to ``path``
    (``faulthandler.dump_traceback(all_threads=True)``); never raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as out:
            out.write(header.rstrip("\n") + "\n\n")
            out.flush()
            faulthandler.dump_traceback(file=out, all_threads=True)
    except OSError as exc:
        print(f"python -m jobgen.train: warning: could not write the stacks to {path}: {exc}", file=sys.stderr, flush=True)


class _Board:
    """The heartbeats' keys in a store: publish, read, the verdict and the ranks' acknowledgements."""

    def __init__(self, store: Any):
        self.store = store

    def publish(self, rank: int, beat: Beat) -> None:
        self.store.set(f"beat/{rank}", beat.dumps())

    def read(self, ranks: tuple[int, ...]) -> dict[int, Beat | None]:
        """rank -> its beat (``None`` before it published); one round trip once every rank has."""
        keys = [f"beat/{r}" for r in ranks]
        if self.store.check(keys):
            return {r: Beat.loads(raw) for r, raw in zip(ranks, self.store.multi_get(keys), strict=True)}
        return {r: Beat.loads(self.store.get(k)) if self.store.check([k]) else None for r, k in zip(ranks, keys, strict=True)}

    def verdict(self) -> str | None:
        return self.store.get("verdict").decode() if self.store.check(["verdict"]) else None

    def decide(self, text: str) -> str:
        """Set the verdict unless another rank did first (``compare_set``); returns the one that holds."""
        return self.store.compare_set("verdict", "", text).decode()

    def ack(self, rank: int) -> None:
        self.store.set(f"dumped/{rank}", "")

    def wait_acks(self, ranks: list[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        wanted = [f"dumped/{r}" for r in ranks]
        while wanted and time.monotonic() < deadline:
            if self.store.check(wanted):
                return
            time.sleep(0.05)


@dataclass(frozen=True)
class WatchLimits:
    """The spec's ``watchdog`` settings (:class:`jobgen.specs.training.WatchdogSpec`) a
    :class:`WatchThread` applies.

    Fields:
        hang_timeout_s: the floor of the hang limit (seconds).
        step_time_factor: the limit is at least this many median step times.
        straggler_factor: a rank whose compute time per batch is more than this many times the
            others' median is a straggler (:func:`find_straggler`, rank zero).
    """

    hang_timeout_s: float
    step_time_factor: float
    straggler_factor: float = 1.5


class WatchThread:
    """The per-rank thread: publishes this rank's heartbeat, watches everyone's, ends the process
    as hung (see the module docstring). ``step`` and ``phase`` are set by the training loop.

    Args:
        store: a ``torch.distributed.Store`` every rank reaches (keys under a prefix of its own).
        rank, world_size: this rank and the number of ranks.
        limits: the spec's ``watchdog`` settings.
        run_dir: where ``hang/`` goes.
        address: the store's address, for the verdict when it stops answering.
        exit: how the process ends (``os._exit``; a test passes its own).

    ``compute``: this rank's compute times per batch (seconds, the newest :data:`COMPUTE_SAMPLES`),
    appended by the training loop; ``straggler``: on rank zero, the straggler it reported.
    ``sentinel``: the sentinel process this thread sends each tick's step and limit to (a job of
    one rank, :func:`start_sentinel`), or None; the thread closes its pipe and reaps it when it ends.
    """

    def __init__(self, store: Any, rank: int, world_size: int, limits: WatchLimits, run_dir: Path, address: str,
                 exit: Callable[[int], None] = os._exit, sentinel: subprocess.Popen[bytes] | None = None):
        self.board = _Board(store)
        self.rank, self.world_size = rank, world_size
        self.hang_timeout_s, self.factor = float(limits.hang_timeout_s), float(limits.step_time_factor)
        self.interval_s = tick_seconds(self.hang_timeout_s)
        self.run_dir, self.address, self._exit = run_dir, address, exit
        self.host, self.pid = node_name(), os.getpid()
        self.started_at = time.time()  # a verdict written since then is this start's (write_verdict)
        self.step, self.phase = 0, TRAIN
        self.straggler_factor = float(limits.straggler_factor)
        self.compute: deque[float] = deque(maxlen=COMPUTE_SAMPLES)
        self.straggler: Straggler | None = None
        self.sentinel = sentinel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobgen-watchdog", daemon=True)

    def start(self) -> None:
        """Start the thread (once)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the thread ends within a tick); publishes ``done`` first, best effort."""
        self.phase = DONE
        self._stop.set()

    def _run(self) -> None:
        try:
            self._watch()
        finally:  # however the watch ends short of the process's exit, the sentinel must not outlive it
            self._end_sentinel()

    def _watch(self) -> None:
        watched = tuple(range(self.world_size)) if self.rank == 0 else (0, self.rank)
        observer = Observer(watched, self.hang_timeout_s, self.factor, self.interval_s, time.monotonic())
        count = 0
        while not self._stop.is_set():
            count += 1
            began = time.monotonic()
            try:
                self.board.publish(self.rank, Beat(self.step, self.phase, count, self.host, self.pid, self._compute_s()))
                held = self.board.verdict()
                if held:
                    self._end(held, decided=False)
                    return
                beats = self.board.read(watched)
                spent = time.monotonic() - began
                if spent > SLEPT_S:  # the store answered, seconds later: this process was stopped meanwhile
                    observer.skip(spent)
                verdict = observer.observe(time.monotonic(), beats)
                if self.sentinel is not None and not self._tell_sentinel(observer.limit_s()):
                    self._end_sentinel()
                if self.rank == 0 and self.straggler is None:
                    self._look_for_straggler(beats)
            except Exception:  # noqa: BLE001 - the store did not answer (timeout, connection reset)
                verdict = observer.store_silent(time.monotonic(), self.address)
                if verdict is not None:
                    self._end(verdict.text(self.hang_timeout_s, self.factor), decided=True, doc=verdict.to_json(), store_ok=False)
                    return
            else:
                if verdict is not None and self._acts_on(verdict):
                    text = verdict.text(self.hang_timeout_s, self.factor)
                    try:
                        held = self.board.decide(text)
                    except Exception:  # noqa: BLE001 - the store went away between the two calls
                        held = text
                    self._end(held, decided=held == text, doc=verdict.to_json() if held == text else None)
                    return
            waited = time.monotonic()
            self._stop.wait(self.interval_s)
            overslept = time.monotonic() - waited - self.interval_s
            if overslept > SLEPT_S:  # this process was stopped meanwhile (a suspended job): not time without progress
                observer.skip(overslept)
        try:  # the others' clocks pause for a rank that is done
            self.board.publish(self.rank, Beat(self.step, DONE, count + 1, self.host, self.pid))
        except Exception:  # noqa: BLE001 - best effort: the job is ending
            pass

    def _tell_sentinel(self, limit_s: float | None) -> bool:
        """Send the sentinel this tick's step and limit, or (``limit_s`` None) that the watch is
        done: one line, never blocking (a full pipe drops it). Returns False when the sentinel is
        gone (or there is none)."""
        if self.sentinel is None or self.sentinel.stdin is None:
            return False
        doc = {"done": True} if limit_s is None else {"step": self.step, "limit_s": limit_s}
        try:
            os.write(self.sentinel.stdin.fileno(), (json.dumps(doc) + "\n").encode())
        except BlockingIOError:
            pass
        except (OSError, ValueError):
            return False
        return True

    def _end_sentinel(self) -> None:
        """Tell the sentinel the watch is done, close its pipe (it exits) and reap it; best effort."""
        self._tell_sentinel(None)
        proc, self.sentinel = self.sentinel, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(5.0)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass

    def _compute_s(self) -> float | None:
        """The median of :attr:`compute`, ``None`` before :data:`MIN_COMPUTE_SAMPLES` samples."""
        samples = list(self.compute)  # a copy: the training loop appends meanwhile
        return statistics.median(samples) if len(samples) >= MIN_COMPUTE_SAMPLES else None

    def _look_for_straggler(self, beats: Mapping[int, Beat | None]) -> None:
        """Report the first straggler :func:`find_straggler` names (one line, once)."""
        found = find_straggler(beats, self.straggler_factor)
        if found is not None:
            self.straggler = found
            print(found.text(), flush=True)

    def _acts_on(self, verdict: Verdict) -> bool:
        """Rank zero acts on every verdict; another rank only when rank zero's heartbeat stopped,
        or when rank zero has not decided ``hang_timeout_s`` after the limit."""
        if self.rank == 0:
            return True
        return any(s.rank == 0 for s in verdict.first) or verdict.idle_s >= verdict.limit_s + self.hang_timeout_s

    def _end(self, text: str, decided: bool, doc: dict[str, Any] | None = None, store_ok: bool = True) -> None:
        """Dump this rank's stacks, say so, and exit :data:`EXIT_HUNG` (the decider first writes
        the verdict and waits a few ticks for the other ranks' dumps)."""

        hang = self.run_dir / HANG_DIR
        stacks = hang / f"stacks-rank{self.rank}.txt"
        dump_stacks(stacks, f"rank {self.rank} on node {self.host} (pid {self.pid}) at step {self.step}, phase {self.phase}, "
                            f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n{text}")
        if decided:
            if doc is not None:
                write_verdict(self.run_dir, {**doc, "text": text, "decided_by_rank": self.rank}, since=self.started_at)
            print(f"python -m jobgen.train: error: {text}; the stacks of every live rank are in {hang} "
                  f"(exit {EXIT_HUNG})", file=sys.stderr, flush=True)
        else:
            print(f"python -m jobgen.train: rank {self.rank}: hung (another rank's verdict); stacks in {stacks}",
                  file=sys.stderr, flush=True)
        if store_ok:
            try:
                self.board.ack(self.rank)
                if decided:  # the others dump on their next tick
                    self.board.wait_acks([r for r in range(self.world_size) if r != self.rank], 3 * self.interval_s + 2.0)
            except Exception:  # noqa: BLE001 - the exit must happen whatever the store does
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(EXIT_HUNG)


def node_name(environ: Mapping[str, str] = os.environ) -> str:
    """This node's name as the scheduler knows it: ``SLURMD_NODENAME`` under srun (SLURM's
    NodeName, which ExcNodeList takes; the host name may be a longer FQDN), else the host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def write_verdict(run_dir: Path, doc: dict[str, Any], since: float) -> bool:
    """Write ``doc`` to ``<run dir>/hang/verdict.json`` and the stopped ranks' nodes to
    ``hang/stopped-nodes`` (:data:`~jobgen.jobdir.files.HANG_NODES_FILE`), unless a verdict written
    at or after ``since`` (this start's watch began; seconds since the epoch) is there: the first
    verdict of a start stands. A rank that was stopped and then resumed (srun sends SIGCONT before
    it ends a step) finds the others gone and would otherwise replace the verdict that named it.
    Best effort: False when it kept the existing verdict or could not write."""
    from jobgen.jobdir.files import write_atomic

    path = run_dir / HANG_VERDICT_FILE
    try:
        existing = json.loads(path.read_text())
    except (OSError, ValueError):
        existing = None
    written_at = existing.get("written_at") if isinstance(existing, dict) else None
    if isinstance(written_at, (int, float)) and not isinstance(written_at, bool) and written_at >= since:
        return False
    nodes = list(dict.fromkeys(str(s["host"]) for s in doc.get("heartbeat_stopped_first", ())))
    try:
        write_atomic(path, json.dumps({**doc, "written_at": time.time()}, indent=2) + "\n")
        write_atomic(run_dir / HANG_NODES_FILE, "".join(f"{n}\n" for n in nodes))
    except OSError:
        return False
    return True


def start_sentinel(run_dir: Path, hang_timeout_s: float) -> subprocess.Popen[bytes] | None:
    """Start this rank's sentinel (``python -m jobgen.train.sentinel``, :mod:`jobgen.train.sentinel`)
    with a pipe on its stdin, set not to block; its stderr is this process's. None (and a warning
    line) when it cannot start."""
    argv = [sys.executable, "-m", "jobgen.train.sentinel", "--pid", str(os.getpid()), "--host", node_name(),
            "--run-dir", str(run_dir), "--limit-s", f"{hang_timeout_s:g}", "--interval-s", f"{tick_seconds(hang_timeout_s):g}"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True)
    except OSError as exc:
        print(f"python -m jobgen.train: warning: no sentinel for the watchdog ({exc}); a stopped process goes unnoticed",
              file=sys.stderr, flush=True)
        return None
    assert proc.stdin is not None
    os.set_blocking(proc.stdin.fileno(), False)
    return proc


def connect_store(trainer: Trainer, timeout_s: float) -> tuple[Any, str]:
    """A store every rank reaches, under a key prefix of this start of the job, and its address:
    at world size 1 an in-process ``HashStore``; else a client of the TCPStore at the cluster
    environment's main address and port (torchrun's agent store, or rank zero's under srun),
    whose calls give up after ``timeout_s``.

    Raises:
        RuntimeError, OSError: the store cannot be reached (torch's DistNetworkError is a RuntimeError).
    """
    import torch.distributed as dist

    from jobgen.train.preflight import attempt_id

    prefix = f"jobgen-watchdog/{attempt_id(os.environ)}"
    if trainer.world_size == 1:
        return dist.PrefixStore(prefix, dist.HashStore()), "in-process"
    env = trainer.strategy.cluster_environment  # type: ignore[attr-defined]  # a parallel strategy's
    store = dist.TCPStore(env.main_address, env.main_port, None, False, datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return dist.PrefixStore(prefix, store), f"{env.main_address}:{env.main_port}"


class ProgressWatchdog(Callback):
    """The Lightning callback that runs this rank's :class:`WatchThread` from ``on_train_start``
    to ``on_train_end`` (or an exception) and tells it the optimizer step (``on_train_batch_end``,
    ``trainer.global_step``) and the phase (``on_validation_start``/``end``,
    ``on_save_checkpoint``, ``on_train_batch_start``). Lightning's public Callback hooks
    (Lightning 2.6 docs, "Callback"): ``on_save_checkpoint`` runs as a checkpoint is built, before
    it is written, and the next batch start ends the ``checkpoint`` phase.

    It times each batch's compute (``on_train_batch_start`` to ``on_before_backward``, see the
    module docstring) into the thread's :attr:`WatchThread.compute`.

    Args:
        hang_timeout_s, step_time_factor, straggler_factor: the spec's ``watchdog``.
        run_dir: where ``hang/`` goes.
    """

    def __init__(self, hang_timeout_s: float, step_time_factor: float, run_dir: Path, straggler_factor: float = 1.5):
        self.hang_timeout_s, self.step_time_factor, self.run_dir = hang_timeout_s, step_time_factor, run_dir
        self.straggler_factor = straggler_factor
        self.thread: WatchThread | None = None
        self._batch_started: float | None = None

    @property
    def straggler(self) -> dict[str, Any] | None:
        """On global rank zero, the straggler reported (:meth:`Straggler.to_json`); else ``None``."""
        found = self.thread.straggler if self.thread is not None else None
        return None if found is None else found.to_json()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.thread is not None:
            return
        interval = tick_seconds(self.hang_timeout_s)
        try:
            store, address = connect_store(trainer, max(5.0, 2 * interval))
        except Exception as exc:  # noqa: BLE001 - training goes on without the watchdog, said once per rank
            text = " ".join(str(exc).split())[:200]
            print(f"python -m jobgen.train: warning: rank {trainer.global_rank}: no progress watchdog (the rendezvous store "
                  f"did not answer: {type(exc).__name__}: {text})", file=sys.stderr, flush=True)
            return
        # one rank: nobody else sees its heartbeat stop
        sentinel = start_sentinel(self.run_dir, self.hang_timeout_s) if trainer.world_size == 1 else None
        limits = WatchLimits(self.hang_timeout_s, self.step_time_factor, self.straggler_factor)
        self.thread = WatchThread(store, trainer.global_rank, trainer.world_size, limits, self.run_dir, address, sentinel=sentinel)
        self.thread.step = trainer.global_step
        self.thread.start()
        if trainer.is_global_zero:
            print(f"watchdog: hung after max({self.hang_timeout_s:g} s, {self.step_time_factor:g} x median step) without an "
                  f"optimizer step on any rank (validation and checkpoint saves not counted); stacks then go to "
                  f"{self.run_dir / HANG_DIR}", flush=True)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.thread is not None:
            self.thread.phase = TRAIN
            self._batch_started = time.perf_counter()

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        if self.thread is not None and self._batch_started is not None:
            self.thread.compute.append(time.perf_counter() - self._batch_started)
            self._batch_started = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.thread is not None:
            self.thread.step = trainer.global_step

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.thread is not None:
            self.thread.phase = VALIDATE

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.thread is not None:
            self.thread.phase = TRAIN

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.thread is not None:
            self.thread.phase = CHECKPOINT

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.thread is not None:
            self.thread.stop()
