#!/usr/bin/env python3
"""Where a test run's time went: phases recorded as JSON lines and printed as one table.

``.ci/run`` sets ``$JOBGEN_PHASES_FILE`` and records its own steps (the installs, the test
command); the Kubernetes lab's background build records each part it builds
(``kubelab.build``); the lab fixtures record how long a test waited for a build; the test session
records each tier (:func:`tier_of`). At the end ``.ci/run`` prints :func:`report`. Without the
variable nothing is written.

A record is ``{"phase": str, "start": float, "end": float}`` (Unix seconds), plus ``"note"``.
The table gives each phase's start and end as minutes from the earliest record, and its length.
The test session also writes one record per test to the same file, ``{"test": node ID, "tier":
str, "seconds": float, "worker": str}`` (:func:`record_tests`); the report ends with the
:data:`SLOWEST_SHOWN` slowest of them and each tier's sum (:func:`tests_report`).

Command line (what ``.ci/run`` calls)::

    python3 tests/phases.py record NAME START END [--note TEXT]
    python3 tests/phases.py record NAME START --until-start-of PHASE   # END: that phase's start
    python3 tests/phases.py report [FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ENV = "JOBGEN_PHASES_FILE"
#: The longest phase name the table prints (longer ones are cut; a phase name is the recorder's text).
NAME_WIDTH = 60


def phases_file() -> Path | None:
    """``$JOBGEN_PHASES_FILE`` as a path, or None when it is unset or empty."""
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def record(name: str, start: float, end: float, note: str = "") -> None:
    """Append one phase to :func:`phases_file` (no-op without it). ``start``/``end``: Unix
    seconds. Appends under an exclusive lock: the build, the workers and the shell all write."""
    path = phases_file()
    if path is None:
        return
    entry: dict[str, Any] = {"phase": name, "start": round(start, 3), "end": round(end, 3)}
    if note:
        entry["note"] = note
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


@contextlib.contextmanager
def phase(name: str, note: str = "") -> Iterator[None]:
    """Record the ``with`` block as phase ``name`` (also when it raises: the note then says so)."""
    start = time.time()
    failed = True
    try:
        yield
        failed = False
    finally:
        record(name, start, time.time(), note + (" (failed)" if failed else ""))


#: A wait shorter than this is not a phase (a cached build answers in milliseconds).
WAIT_RECORDED_S = 1.0


@contextlib.contextmanager
def waited(what: str) -> Iterator[None]:
    """Record the ``with`` block as the phase ``what`` when it took at least
    :data:`WAIT_RECORDED_S`: a test waiting for a build (or building in the foreground). The note
    names the xdist worker."""
    start = time.time()
    try:
        yield
    finally:
        if time.time() - start >= WAIT_RECORDED_S:
            record(what, start, time.time(), f"worker {os.environ.get('PYTEST_XDIST_WORKER', 'main')}")


def read(path: Path) -> list[dict[str, Any]]:
    """The records of ``path`` in order of start; lines that are not records are skipped."""
    entries = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (isinstance(entry, dict) and isinstance(entry.get("phase"), str)
                and all(isinstance(entry.get(k), (int, float)) and math.isfinite(entry[k]) for k in ("start", "end"))):
            entries.append(entry)
    return sorted(entries, key=lambda e: (e["start"], e["end"]))


def report(entries: list[dict[str, Any]]) -> str:
    """The table of ``entries`` (from :func:`read`): phase, start and end in minutes from the
    first record's start, and the length in minutes and seconds."""
    if not entries:
        return "phases: none recorded\n"
    origin = min(e["start"] for e in entries)
    rows = [("phase", "start min", "end min", "length")]
    for e in entries:
        name = e["phase"].replace("\n", " ")[:NAME_WIDTH]
        if e.get("note"):
            name = f"{name} [{str(e['note']).replace(chr(10), ' ')[:NAME_WIDTH]}]"
        length = e["end"] - e["start"]
        rows.append((name, f"{(e['start'] - origin) / 60:.1f}", f"{(e['end'] - origin) / 60:.1f}",
                     f"{length / 60:.1f} min ({length:.0f} s)"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    total = max(e["end"] for e in entries) - origin
    return "\n".join(["Where the time went (tests/phases.py):", *lines, f"first start to last end: {total / 60:.1f} min ({total:.0f} s)"]) + "\n"


#: How many of the slowest tests the report lists.
SLOWEST_SHOWN = 25
#: The longest test node ID the report prints (longer ones are cut at the end).
TEST_WIDTH = 140


def record_tests(tests: Iterable[dict[str, Any]]) -> None:
    """Append one record per test to :func:`phases_file` (no-op without it), in one write under
    an exclusive lock. Each of ``tests`` is ``{"test": node ID, "tier": str, "seconds": float
    (setup + call + teardown), "worker": xdist worker ID or "main"}``."""
    path = phases_file()
    if path is None:
        return
    lines = [json.dumps({"test": t["test"], "tier": t["tier"], "seconds": round(float(t["seconds"]), 3), "worker": t["worker"]},
                        sort_keys=True) + "\n" for t in tests]
    if not lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write("".join(lines))


def read_tests(path: Path) -> list[dict[str, Any]]:
    """The test records of ``path`` (:func:`record_tests`), in file order; lines that are not
    test records (phases, hostile lines) are skipped."""
    tests = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("test", "tier", "worker"))
                and isinstance(entry.get("seconds"), (int, float)) and not isinstance(entry["seconds"], bool)
                and math.isfinite(entry["seconds"]) and entry["seconds"] >= 0):
            tests.append(entry)
    return tests


def _printable(text: str, width: int) -> str:
    """``text`` on one line: control characters as ``?``, cut to ``width`` characters."""
    return "".join(c if c.isprintable() else "?" for c in text)[:width]


def tests_report(tests: list[dict[str, Any]], shown: int = SLOWEST_SHOWN) -> str:
    """The ``shown`` slowest of ``tests`` (from :func:`read_tests`; ties in node ID order) with
    their seconds, tier and worker, then each tier's number of tests and summed seconds (largest
    sum first). Empty when there are no tests. The same records give the same text, in any order."""
    if not tests:
        return ""
    ordered = sorted(tests, key=lambda t: (-t["seconds"], t["test"], t["tier"], t["worker"]))
    rows = [("seconds", "tier", "worker", "test")]
    rows += [(f"{t['seconds']:.1f}", _printable(t["tier"], NAME_WIDTH), _printable(t["worker"], 20), _printable(t["test"], TEST_WIDTH))
             for t in ordered[:shown]]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"The {min(shown, len(tests))} slowest tests (seconds: setup + call + teardown; a module or session fixture's "
             "setup counts to the first test that uses it):"]
    lines += ["  ".join([r[0].rjust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]), r[3]]).rstrip() for r in rows]
    tiers: dict[str, list[float]] = {}
    for t in tests:
        tier = tiers.setdefault(_printable(t["tier"], NAME_WIDTH), [0, 0.0])
        tier[0] += 1
        tier[1] += t["seconds"]
    lines.append("Test time per tier:")
    tier_rows = [(name, f"{int(count)} tests", f"{summed:.0f} s") for name, (count, summed) in
                 sorted(tiers.items(), key=lambda kv: (-kv[1][1], kv[0]))]
    tier_rows.append(("all", f"{len(tests)} tests", f"{sum(t['seconds'] for t in tests):.0f} s"))
    tier_widths = [max(len(r[i]) for r in tier_rows) for i in range(3)]
    lines += [f"  {r[0].ljust(tier_widths[0])}  {r[1].rjust(tier_widths[1])}  {r[2].rjust(tier_widths[2])}" for r in tier_rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="append one phase to $JOBGEN_PHASES_FILE")
    rec.add_argument("name")
    rec.add_argument("start", type=float)
    rec.add_argument("end", type=float, nargs="?")
    rec.add_argument("--note", default="")
    rec.add_argument("--until-start-of", metavar="PHASE", help="END is the start of the first recorded PHASE (nothing is recorded without one)")
    rep = sub.add_parser("report", help="print the table of a phases file and its slowest tests")
    rep.add_argument("file", nargs="?", type=Path, help="default: $JOBGEN_PHASES_FILE")
    args = parser.parse_args(argv)
    if args.command == "record":
        end = args.end
        if args.until_start_of is not None:
            path = phases_file()
            found = ([e["start"] for e in read(path) if e["phase"] == args.until_start_of]
                     if path is not None and path.exists() else [])
            if not found:
                print(f"phases: no phase {args.until_start_of!r} recorded; {args.name!r} left out", file=sys.stderr)
                return 0
            end = min(found)
        if end is None:
            parser.error("record needs END or --until-start-of")
        record(args.name, args.start, end, args.note)
        return 0
    path = args.file or phases_file()
    if path is None:
        print(f"phases: no file given and ${ENV} is not set", file=sys.stderr)
        return 2
    try:
        entries, tests = read(path), read_tests(path)
    except OSError as exc:
        print(f"phases: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 2
    sys.stdout.write(report(entries) + tests_report(tests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
