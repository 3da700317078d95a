"""``jobgen status``'s line for a straggler that a run's ``summary.json`` records.

The entrypoint's watchdog (:mod:`jobgen.train.watchdog`) writes ``straggler``: ``{rank, node,
ratio, step_time_s, median_step_time_s}`` (seconds; ``null`` when no rank was slower than the
spec's ``watchdog.straggler_factor``; :class:`jobgen.jobdir.summary.StragglerRecord`). A run
directory is read, never trusted: a record of another shape reads as none
(:func:`jobgen.jobdir.summary.read_summary`), and the node name is shown printable and cut.
"""

from __future__ import annotations

from jobgen.errors import printable
from jobgen.jobdir.summary import RunSummary

#: The longest node name shown.
NODE_CHARS = 100


def straggler_details(summary: RunSummary | None) -> dict[str, str]:
    """``{"straggler": "rank 3 on node2: 2.1x the median step time (0.42 s vs 0.20 s)"}`` from a
    ``summary.json`` (:func:`jobgen.jobdir.summary.read_summary` / ``parse_summary``) that records
    one; ``{}`` when there is no summary or it records none (or none of the record's shape)."""
    record = None if summary is None else summary.straggler
    if record is None:
        return {}
    shown = printable(record.node)
    shown = shown if len(shown) <= NODE_CHARS else shown[:NODE_CHARS - 3] + "..."
    return {"straggler": f"rank {record.rank} on {shown}: {record.ratio:.1f}x the median step time "
                         f"({record.step_time_s:.2f} s vs {record.median_step_time_s:.2f} s)"}
