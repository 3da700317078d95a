"""One attempt of a torchrun job (a start of its ranks) and the restarts made within its budget:
the pieces the local and ssh backends share.

- :func:`logged_restarts`: the restart count a pod's log states (the Kubernetes launch wrapper's
  :data:`RESTART_LINE`);
- :func:`torchrun_evidence`: how an attempt ended, from one torchrun's output (``--tee 3``: every
  rank's line labelled), for :func:`jobgen.reports.failure_class.classify`;
- :func:`restart_entry`, :func:`restart_details` and :func:`with_restarts`: one restart's record
  (``summary.json``'s ``restarts.history`` and ``jobgen status``'s ``restart_<n>``), the status
  lines of a budget, and a summary with the budget added.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from jobgen.reports.failure_class import Classification, Evidence, triage_evidence
from jobgen.reports.triage import Triage, torchrun_lines, triage

#: torchrun's report of a failed run (torch.distributed.elastic ``ChildFailedError.format_msg``):
#: the first rank that failed, then its ``exitcode  : N (pid: P)``.
ROOT_CAUSE_RE = re.compile(r"^Root Cause \(first observed failure\):\n(?:(?!\s*exitcode\s*:).*\n){0,8}?\s*exitcode\s*:\s*(-?\d+)",
                           re.M)


#: The Kubernetes launch wrapper's name in its lines (``python -m jobgen.train.launch``).
LAUNCH_PROG = "jobgen.train.launch"
#: The line a restarted pod's log starts with, printed by the launch wrapper (``jobgen status``
#: reads the count from it: :func:`logged_restarts`).
RESTART_LINE = LAUNCH_PROG + ": restart {restarts} of {budget} (restart.max_restarts)"
_RESTART_LINE_RE = re.compile(r"^(?:\S+ )?" + re.escape(LAUNCH_PROG) + r": restart (\d{1,6}) of (\d{1,6}) \(restart\.max_restarts\)$")


def logged_restarts(text: str) -> tuple[int, int] | None:
    """``(restarts, budget)`` from the first :data:`RESTART_LINE` in a pod's log ``text`` (a line
    may start with the kubelet's timestamp); None when no line is one (a first start, or a log
    that says something else)."""
    for line in text.splitlines():
        found = _RESTART_LINE_RE.match(line.strip())
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def root_cause_exit_code(text: str) -> int | None:
    """The exit code of the first rank that failed, from the last torchrun report in ``text``
    ("Root Cause (first observed failure)" ... ``exitcode``; negative: killed by that signal);
    torchrun itself exits 1 whatever it was. ``None``: no report (torchrun did not get that far)."""
    found = list(ROOT_CAUSE_RE.finditer(text))
    return int(found[-1].group(1)) if found else None


def attempt_triage(lines: Iterable[str]) -> Triage:
    """:func:`~jobgen.reports.triage.triage` of one torchrun's output lines."""
    return triage(torchrun_lines(lines))


def torchrun_evidence(lines: Sequence[str], source: str = "torchrun report (first failing rank)") -> list[Evidence]:
    """The evidence in one attempt's output of one torchrun: each rank's first failure (the
    triage's order), then the exit code of the first rank that failed (torchrun's report, as
    ``source``; a negative code is a signal)."""
    found = triage_evidence(attempt_triage(lines))
    ranks = root_cause_exit_code("\n".join(lines) + "\n")
    if ranks is not None:
        found.append(Evidence(source, exit_code=None if ranks < 0 else ranks, signal=-ranks if ranks < 0 else None))
    return found


def restart_entry(number: int, decided: Classification, exit_code: int | None) -> dict[str, Any]:
    """One restart's record: ``restart`` (1, 2, ...), ``class``, ``reason``, ``rule``,
    ``evidence``, ``exit_code`` (torchrun's, or ``None``), ``at`` (now, UTC, ISO 8601)."""
    return {"restart": number, "class": decided.cls, "reason": decided.reason, "rule": decided.rule,
            "evidence": decided.evidence, "exit_code": exit_code, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def restart_details(max_restarts: int, restarts: Iterable[dict[str, Any]]) -> dict[str, str]:
    """``jobgen status`` details of a budget: ``restarts_used`` (``"1 of 3"``) once the spec has
    a budget, and ``restart_<n>``: ``<class> (<rule>): <reason> [<evidence>]`` per restart."""
    if not max_restarts:
        return {}
    items = list(restarts)
    details = {"restarts_used": f"{len(items)} of {max_restarts}"}
    for item in items:
        details[f"restart_{item.get('restart')}"] = f"{item.get('class')} ({item.get('rule')}): {item.get('reason')} [{item.get('evidence')}]"
    return details


def with_restarts(summary: dict[str, Any], max_restarts: int, restarts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``summary`` with ``restarts``: ``max_restarts``, ``used`` and ``history`` (one
    :func:`restart_entry` per restart, oldest first)."""
    return {**summary, "restarts": {"max_restarts": max_restarts, "used": len(restarts), "history": list(restarts)}}
