"""First-failure triage of a distributed job's output (``jobgen logs --first-error``).

When one rank of a multi-node job fails, every other rank fails soon after (a closed
connection, a collective that times out, the launcher killing its peers), and the job's output
holds N tracebacks. The one that explains the failure is the earliest. This module finds each
rank's first failure in its output and orders them:

- by timestamp when every failure has one (Kubernetes pod logs read with ``timestamps=true``:
  the kubelet's RFC 3339 receive time of each line);
- else by position in the merged stream (SLURM's one output file: srun writes the ranks' lines
  in the order they arrive, ``srun --label`` naming each line's task; a local run's output.log,
  ``torchrun --tee 3`` naming each line's rank: :func:`torchrun_lines`);
- in both, a rank's error that only says it lost a peer (:data:`PEER_LOST_RE`) after the others.

A failure is, per source (a rank, or a pod when ranks are not labelled):

- a Python traceback (``Traceback (most recent call last):`` up to the exception line; also
  as torch.distributed's excepthook writes it, each line prefixed ``[rank<N>]: ``),
- an NCCL error line (``NCCL WARN``, ``ncclSystemError`` and the other ``nccl*Error`` codes,
  ``ProcessGroupNCCL``'s watchdog timeout),
- the entrypoint's own one-line error (``python -m jobgen.train: error: ...``), or
- a C++ abort: ``terminate called ...``, the line libstdc++'s terminate handler writes before
  ``abort()`` (an uncaught C++ exception, with its ``what():`` line, or none: "without an active
  exception", which a torch.distributed rank hits at interpreter teardown: :data:`TEARDOWN_HINT`), or
- failing all of those, for a rank its launcher reports as exited non-zero (torchrun's
  ChildFailedError report, srun's ``Exited with exit code N``): the rank's last output line
  (kind ``exit``), which is what ``sys.exit("message")`` / ``raise SystemExit("message")`` leaves
  (the message on stderr, no traceback). These come after every other kind of failure.

Pure: no I/O. The backends read the output and pass lines in.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

TRACEBACK_START = "Traceback (most recent call last):"
#: NCCL failures as NCCL and torch's ProcessGroupNCCL print them.
NCCL_ERROR_RE = re.compile(
    r"NCCL WARN|NCCL ERROR|\bnccl(?:System|Internal|InvalidUsage|Invalid|UnhandledCuda|Remote)Error\b"
    r"|ProcessGroupNCCL.*(?:[Tt]imeout|[Ww]atchdog caught)|DistBackendError"
)
#: libstdc++'s verbose terminate handler (the default): the line it writes before ``abort()``.
TERMINATE_RE = re.compile(r"^terminate called (?:without an active exception|after throwing an instance of |recursively)")
#: An uncaught exception's message, on the line after :data:`TERMINATE_RE`'s.
TERMINATE_WHAT_PREFIX = "  what():"
#: What an abort "without an active exception" most often is in a training job, and its remedy
#: (docs/own-code.md, "Command mode", where the core dump behind it is described).
TEARDOWN_HINT = (
    "std::terminate with no exception: when it follows the rank's last output, a torch.distributed worker thread "
    "freed tensors while Python was shutting down; end the script with destroy_process_group() and then "
    "os._exit(0) once its work is written and flushed (docs/own-code.md, \"Command mode\")"
)
#: The bundled entrypoint's one-line error (jobgen.train.__main__: ``<prog>: error: ...``).
ENTRYPOINT_ERROR_RE = re.compile(r"^python -m jobgen\.train: error: ")
#: ``srun: error: <node>: task <N>: ...`` / ``tasks <N>-<M>: ...``: which node a task ran on.
SRUN_TASK_RE = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.*)$")
#: torch.distributed's excepthook (installed by init_process_group, torch >= 2.2) writes every
#: line of an uncaught exception's traceback as ``[rank<N>]: <line>``.
TORCH_RANK_PREFIX_RE = re.compile(r"^\[rank\d+\]: ")
#: ``torchrun --tee 3`` labels each line a worker writes with its role and local rank:
#: ``[default1]:<line>`` (torch.distributed.elastic's TailLog prefix ``[{role}{local_rank}]:``).
TORCHRUN_TEE_RE = re.compile(r"^\[(?P<role>[A-Za-z_][A-Za-z_]*?)(?P<rank>\d+)\]:(?P<text>.*)$")
#: Errors a rank gets because a peer died (its collective's connection closed or was aborted):
#: consequences, not causes. :func:`triage` orders them after every other failure, since which
#: of the two is printed first is a race (seen on 2 local gloo ranks: rank 0's
#: "Connection closed by peer" line came out before the ValueError rank 1 raised).
PEER_LOST_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crashing|ncclRemoteError"
    r"|remote process exited|[Cc]ommunicator was aborted"
)
#: Lines of context kept after an NCCL or entrypoint error line (and before a rank's last line).
CONTEXT_LINES = 3
#: torchrun's ChildFailedError report, one failed worker: ``  rank      : 1 (local_rank: 1)`` then
#: ``  exitcode  : 1 (pid: 4243)`` (torch.distributed.elastic.multiprocessing.errors).
TORCHRUN_REPORT_RANK_RE = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+)\b")
TORCHRUN_REPORT_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+)\b")
#: srun's report of a task's end (the ``what`` of :data:`SRUN_TASK_RE`).
SRUN_EXIT_RE = re.compile(r"Exited with exit code (?P<code>\d+)")
#: What the ``exit`` kind means.
EXIT_HINT = ("the rank exited with code {code} without a traceback; its last output line is shown (what "
             "sys.exit(\"message\") or raise SystemExit(\"message\") prints; all of its output is in the log)")


@dataclass(frozen=True)
class LogLine:
    """One line of a job's output.

    Attributes:
        source: who wrote it: ``rank 3`` (a labelled SLURM task), ``pod worker-0``.
        rank: the global rank when the source is one rank, else ``None``.
        node: the node it ran on when known.
        position: its index in the stream it came from (orders lines without timestamps).
        timestamp: when it was written/received, if the output carries times.
        text: the line without its label or timestamp.
    """

    source: str
    rank: int | None
    node: str | None
    position: int
    timestamp: datetime | None
    text: str


@dataclass(frozen=True)
class Failure:
    """One source's first failure.

    Attributes:
        source, rank, node: as in :class:`LogLine` (``node`` completed from srun's task lines).
        kind: ``traceback``, ``nccl``, ``error`` (the entrypoint's one-line error), ``abort``
            (a C++ ``terminate called ...``) or ``exit`` (a rank its launcher reports as exited
            non-zero, with none of those: its last output line).
        headline: the line that says what failed (the exception line of a traceback; an abort's
            terminate line and its ``what():`` line, joined).
        lines: the traceback, or the error line with a little context.
        position, timestamp: of the failure's first line.
        hint: what to do, for a failure whose usual cause is known (:data:`TEARDOWN_HINT`).
        exit_code: kind ``exit``: the code its launcher reported (torchrun's ``-N``: killed by
            signal N); else ``None``.
    """

    source: str
    rank: int | None
    node: str | None
    kind: str
    headline: str
    lines: tuple[str, ...]
    position: int
    timestamp: datetime | None = None
    hint: str | None = None
    exit_code: int | None = None

    def to_json(self) -> dict[str, object]:
        """JSON-ready dict (timestamp as ISO 8601)."""
        return {"source": self.source, "rank": self.rank, "node": self.node, "kind": self.kind,
                "headline": self.headline, "timestamp": None if self.timestamp is None else self.timestamp.isoformat(),
                "lines": list(self.lines), "hint": self.hint, "exit_code": self.exit_code}


@dataclass(frozen=True)
class Triage:
    """Every source's first failure, earliest first, and how they were ordered.

    Attributes:
        failures: one per failed source, ``failures[0]`` the first.
        ordered_by: ``timestamp`` or ``position`` (see the module docstring).
        exits: srun's per-task exit lines (``node: task N: Exited with exit code 1``).
    """

    failures: tuple[Failure, ...]
    ordered_by: str
    exits: tuple[str, ...] = field(default=())

    @property
    def first(self) -> Failure | None:
        """The earliest failure, or ``None`` when the output shows none."""
        return self.failures[0] if self.failures else None


def _traceback_end(texts: list[str], start: int) -> int:
    """Index of the exception line of the traceback starting at ``start`` (chained tracebacks
    included: "During handling of the above exception ..." continues it)."""
    i = start + 1
    while i < len(texts):
        text = texts[i]
        if text.startswith((" ", "\t")) or not text.strip():
            i += 1
            continue
        # the exception line; a chained traceback may follow it
        j = i + 1
        while j < len(texts) and not texts[j].strip():
            j += 1
        if j + 2 < len(texts) and texts[j].startswith(("During handling of the above exception", "The above exception was the direct cause")):
            k = j + 1
            while k < len(texts) and not texts[k].strip():
                k += 1
            if k < len(texts) and texts[k].startswith(TRACEBACK_START):
                i = k + 1
                continue
        return i
    return len(texts) - 1


def _first_failure(lines: list[LogLine]) -> Failure | None:
    texts = [TORCH_RANK_PREFIX_RE.sub("", line.text, count=1) for line in lines]
    for i, text in enumerate(texts):
        kind, hint = None, None
        if text.startswith(TRACEBACK_START):
            end = _traceback_end(texts, i)
            body = tuple(texts[i:end + 1])
            headline = texts[end] if end > i else text
            kind = "traceback"
        elif ENTRYPOINT_ERROR_RE.search(text):
            kind, headline, body = "error", text, tuple(texts[i:i + 1 + CONTEXT_LINES])
        elif NCCL_ERROR_RE.search(text):
            kind, headline, body = "nccl", text, tuple(texts[i:i + 1 + CONTEXT_LINES])
        elif TERMINATE_RE.search(text):
            kind, headline, body = "abort", text, tuple(texts[i:i + 1 + CONTEXT_LINES])
            if i + 1 < len(texts) and texts[i + 1].startswith(TERMINATE_WHAT_PREFIX):
                headline = f"{text.rstrip()}: {texts[i + 1].strip()}"
            elif "without an active exception" in text:
                hint = TEARDOWN_HINT
        if kind is not None:
            first = lines[i]
            return Failure(first.source, first.rank, first.node, kind, headline.strip(), body, first.position,
                           first.timestamp, hint)
    return None


def _task_nodes(lines: Iterable[LogLine]) -> tuple[dict[int, str], tuple[str, ...]]:
    """Task -> node from srun's ``srun: error: <node>: task N: ...`` lines, and those lines."""
    nodes: dict[int, str] = {}
    exits: list[str] = []
    for line in lines:
        match = SRUN_TASK_RE.match(line.text)
        if match is None:
            continue
        exits.append(line.text.removeprefix("srun: error: "))
        for part in match.group("tasks").split(","):
            low, _, high = part.partition("-")
            for task in range(int(low), int(high or low) + 1):
                nodes.setdefault(task, match.group("node"))
    return nodes, tuple(exits)


def _exited_ranks(lines: list[LogLine]) -> dict[int, int]:
    """Rank -> exit code of the ranks their launcher reports as exited non-zero: torchrun's
    ChildFailedError report (its own, unlabelled lines) and srun's task lines."""
    exited: dict[int, int] = {}
    rank: int | None = None
    for line in lines:
        if line.rank is not None:
            continue
        srun = SRUN_TASK_RE.match(line.text)
        if srun is not None:
            code = SRUN_EXIT_RE.search(srun.group("what"))
            for part in srun.group("tasks").split(",") if code is not None and code.group("code") != "0" else ():
                low, _, high = part.partition("-")
                for task in range(int(low), int(high or low) + 1):
                    exited.setdefault(task, int(code.group("code")))
            continue
        match = TORCHRUN_REPORT_RANK_RE.match(line.text)
        if match is not None:
            rank = int(match.group("rank"))
            continue
        match = TORCHRUN_REPORT_EXIT_RE.match(line.text)
        if match is not None and rank is not None:
            if match.group("code") != "0":
                exited.setdefault(rank, int(match.group("code")))
            rank = None
    return exited


def _last_words(lines: list[LogLine], code: int) -> Failure | None:
    """A rank's ``exit`` failure: its last non-blank line, with the lines before it."""
    texts = [TORCH_RANK_PREFIX_RE.sub("", line.text, count=1) for line in lines]
    last = next((i for i in range(len(texts) - 1, -1, -1) if texts[i].strip()), None)
    if last is None:
        return None
    line = lines[last]
    return Failure(line.source, line.rank, line.node, "exit", texts[last].strip(),
                   tuple(texts[max(0, last - CONTEXT_LINES):last + 1]), line.position, line.timestamp,
                   EXIT_HINT.format(code=code), code)


def lost_peer(failure: Failure) -> bool:
    """Whether ``failure`` is a rank's reaction to a dead peer (:data:`PEER_LOST_RE`)."""
    return PEER_LOST_RE.search(failure.headline) is not None


def triage(lines: Iterable[LogLine]) -> Triage:
    """Each source's first failure in ``lines``, earliest first (see the module docstring),
    except that failures from a lost peer (:func:`lost_peer`) come after all others.

    Args:
        lines: the job's output, any number of sources interleaved or one after another;
            ``position`` orders lines within a stream.

    Returns:
        the failures; ``Triage.first`` is ``None`` when no line looks like a failure.
    """
    every = list(lines)
    nodes, exits = _task_nodes(every)
    exited = _exited_ranks(every)
    by_source: dict[str, list[LogLine]] = {}
    for line in every:
        if line.rank is not None or line.source.startswith("pod "):
            by_source.setdefault(line.source, []).append(line)
    failures = []
    for source_lines in by_source.values():
        source_lines.sort(key=lambda line: line.position)
        found = _first_failure(source_lines)
        rank = source_lines[0].rank
        if found is None and rank is not None and rank in exited:
            found = _last_words(source_lines, exited[rank])
        if found is not None and found.node is None and found.rank is not None and found.rank in nodes:
            found = dataclasses.replace(found, node=nodes[found.rank])
        if found is not None:
            failures.append(found)
    timed = bool(failures) and all(f.timestamp is not None for f in failures)
    if timed:
        failures.sort(key=lambda f: (lost_peer(f), f.kind == "exit", f.timestamp, f.position, f.source))
    else:
        failures.sort(key=lambda f: (lost_peer(f), f.kind == "exit", f.position, f.source))
    return Triage(tuple(failures), "timestamp" if timed else "position", exits)


def torchrun_lines(texts: Iterable[str]) -> list[LogLine]:
    """The output of one ``torchrun --standalone --tee 3`` (one node: the local rank is the
    rank) as :class:`LogLine` s: a labelled line (:data:`TORCHRUN_TEE_RE`) is ``rank N``'s, an
    unlabelled one torchrun's own (source ``torchrun``, rank ``None``: :func:`triage` skips it,
    so its ChildFailedError report is never taken for a rank's failure)."""
    return [torchrun_line(text, position) for position, text in enumerate(texts)]


def torchrun_line(text: str, position: int) -> LogLine:
    """One line of :func:`torchrun_lines` (``position``: its index in the output)."""
    match = TORCHRUN_TEE_RE.match(text)
    if match is None:
        return LogLine("torchrun", None, None, position, None, text)
    rank = int(match.group("rank"))
    return LogLine(f"rank {rank}", rank, None, position, None, match.group("text"))


#: Lines that continue a traceback after its exception line (a chained exception follows).
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


class LiveFilter:
    """Which lines of a running local job (:func:`torchrun_lines`) reach the terminal: every
    rank's (without torchrun's label, as they were printed) and torchrun's own, without
    failures, so that a failed run's terminal shows jobgen's triage (:func:`format_triage`)
    instead of every rank's traceback and torchrun's ChildFailedError report.
    Failures are tracebacks (up to the exception line, chained ones included), the entrypoint's
    error line, NCCL error lines and C++ abort lines, as :func:`triage` finds them; after the
    first failure torchrun's own lines are held back too (its worker exit reports and
    ChildFailedError block). Every line still goes to the run's log.
    """

    def __init__(self) -> None:
        self._state: dict[str, str] = {}  # source -> "traceback" (inside one) | "after" (its exception line seen)
        self.failed = False  #: whether a failure has been seen (on any source)

    def show(self, line: LogLine) -> str | None:
        """The text to print for ``line`` now, or ``None`` to keep it in the log only."""
        text = TORCH_RANK_PREFIX_RE.sub("", line.text, count=1)
        state = self._state.pop(line.source, None)
        if state == "traceback":
            # indented frames and blank lines continue it; the first other line is the exception
            self._state[line.source] = "traceback" if text.startswith((" ", "\t")) or not text.strip() else "after"
            return None
        if state == "after" and (text.startswith(_CHAINED) or not text.strip()):
            self._state[line.source] = "after"
            return None
        if text.startswith(TRACEBACK_START):
            self._state[line.source] = "traceback"
            self.failed = True
            return None
        if ENTRYPOINT_ERROR_RE.search(text) or NCCL_ERROR_RE.search(text) or TERMINATE_RE.search(text):
            self.failed = True
            return None
        if line.rank is None:
            return None if self.failed else text
        return line.text


def parse_rfc3339(text: str) -> datetime | None:
    """A Kubernetes log timestamp (``2026-11-23T07:01:02.123456789Z``) as an aware datetime
    (nanoseconds cut to microseconds), or ``None`` when ``text`` is not one."""
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", text)
    if match is None:
        return None
    fraction = (match.group(2) or "0")[:6].ljust(6, "0")
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    try:
        return datetime.fromisoformat(f"{match.group(1)}.{fraction}{zone}")
    except ValueError:
        return None


def format_triage(result: Triage, handle: str) -> list[str]:
    """Human-readable lines: the first failure with its traceback, then the others in one line each."""
    first = result.first
    if first is None:
        lines = [f"{handle}: no rank's output shows a traceback, an NCCL error, an entrypoint error or a C++ abort"]
        return lines + [f"  srun: {e}" for e in result.exits]
    where = first.source + (f" on {first.node}" if first.node else "")
    when = f" at {first.timestamp.isoformat()}" if first.timestamp else ""
    order = "earliest timestamp" if result.ordered_by == "timestamp" else "first in the job's output"
    def seen(f: Failure) -> tuple[object, ...]:
        return (f.timestamp, f.position) if result.ordered_by == "timestamp" else (f.position,)

    earlier = [f.source for f in result.failures[1:] if lost_peer(f) and seen(f) < seen(first)]  # see triage
    after = f"; {', '.join(earlier)} reported a lost peer earlier" if earlier else ""
    lines = [f"first failure: {where}{when} ({first.kind}; {order} of {len(result.failures)} failed source(s){after})",
             f"  {first.headline}"]
    if [text.strip() for text in first.lines] != [first.headline.strip()]:  # a one-line error is its headline: once
        lines += ["", *(f"  | {text}" for text in first.lines)]
    if first.hint:
        lines += ["", f"  hint: {first.hint}"]
    if len(result.failures) > 1:
        lines += ["", "then:"]
        for other in result.failures[1:]:
            node = f" on {other.node}" if other.node else ""
            lines.append(f"  {other.source}{node}: {other.headline}")
    if result.exits:
        lines += ["", "srun:"] + [f"  {e}" for e in result.exits]
    return lines
