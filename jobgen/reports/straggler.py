"""``jobgen status``'s line for a straggler that a run's ``summary.json`` records.

The entrypoint's watchdog (:mod:`jobgen.train.watchdog`) writes ``straggler``: ``{rank, node,
ratio, step_time_s, median_step_time_s}`` (seconds; ``null`` when no rank was slower than the
spec's ``watchdog.straggler_factor``). A run directory is read, never trusted: a record of
another shape shows nothing, and the node name is shown printable and cut.
"""

from __future__ import annotations

import math
from typing import Any

from jobgen.errors import printable

#: The longest node name shown.
NODE_CHARS = 100


def _number(value: Any) -> float | None:
    """``value`` when it is a finite int or float (not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def straggler_details(summary: Any) -> dict[str, str]:
    """``{"straggler": "rank 3 on node2: 2.1x the median step time (0.42 s vs 0.20 s)"}`` from a
    parsed ``summary.json`` that records one; ``{}`` when it records none or the record is not of
    the shape above."""
    record = summary.get("straggler") if isinstance(summary, dict) else None
    if not isinstance(record, dict):
        return {}
    rank, node = record.get("rank"), record.get("node")
    ratio, slow, median = (_number(record.get(k)) for k in ("ratio", "step_time_s", "median_step_time_s"))
    if isinstance(rank, bool) or not isinstance(rank, int) or not isinstance(node, str) or None in (ratio, slow, median):
        return {}
    shown = printable(node)
    shown = shown if len(shown) <= NODE_CHARS else shown[:NODE_CHARS - 3] + "..."
    return {"straggler": f"rank {rank} on {shown}: {ratio:.1f}x the median step time ({slow:.2f} s vs {median:.2f} s)"}
