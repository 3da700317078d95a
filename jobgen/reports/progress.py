"""A run's progress from its own records: the optimizer step, ``max_steps``, tokens/s of the last
log interval and the time left, read from the newest ``logs/version_<n>/metrics.csv`` that rank
zero writes every ``trainer.log_every_n_steps`` (jobgen.train: its ``step`` column is the
optimizer step, ``tokens_per_s`` the whole job's over that interval).

For every backend whose run directory this machine can read: a local run, a SLURM run on a
filesystem the login node shares, an ssh run's first host when it is this machine. A Kubernetes
run's directory is inside its pods: no progress is read there. Pure file reading, no torch.
"""

from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_METRICS_BYTES = 64 * 2**20
"""metrics.csv is read from its last this-many bytes (a long run's file grows by one row per log step)."""


@dataclass(frozen=True)
class Progress:
    """Where a run is, from its metrics.csv.

    Attributes:
        step: the last logged optimizer step.
        max_steps: the spec's ``trainer.max_steps`` (``None``: the run ends by epochs).
        tokens_per_s: the whole job's tokens/s over the last log interval (``None``: not logged).
        tokens_per_step: tokens of one optimizer step (micro batch x block x accumulation x world), or ``None``.
        eta_s: seconds left at that rate to ``max_steps`` (0 once reached), or ``None``.
        updated_s_ago: seconds since metrics.csv was last written.
        source: the metrics.csv read.
    """

    step: int
    max_steps: int | None
    tokens_per_s: float | None
    tokens_per_step: int | None
    eta_s: float | None
    updated_s_ago: float
    source: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (seconds, tokens/s)."""
        return {"step": self.step, "max_steps": self.max_steps,
                "tokens_per_s": None if self.tokens_per_s is None else round(self.tokens_per_s, 1),
                "tokens_per_step": self.tokens_per_step, "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
                "updated_s_ago": round(self.updated_s_ago, 1), "source": self.source}


def newest_metrics(run_dir: Path) -> Path | None:
    """The metrics.csv of the highest ``logs/version_<n>`` (a resumed run's newest), or ``None``."""
    versions = []
    for path in (run_dir / "logs").glob("version_*/metrics.csv"):
        suffix = path.parent.name.removeprefix("version_")
        if suffix.isdigit():
            versions.append((int(suffix), path))
    return max(versions)[1] if versions else None


def read_progress(run_dir: Path, max_steps: int | None, tokens_per_step: int | None, now: float | None = None) -> Progress | None:
    """The run's progress, or ``None`` when it has logged no step yet (or its files cannot be read).

    Rows that are not numbers (a line cut while being written, a hostile file) are skipped; a
    value that is not finite and positive counts as not logged.
    """
    path = newest_metrics(run_dir)
    if path is None:
        return None
    try:
        with path.open("rb") as fh:
            size = path.stat().st_size
            fh.seek(max(0, size - MAX_METRICS_BYTES))
            raw = fh.read()
            mtime = path.stat().st_mtime
    except OSError:
        return None
    text = raw.decode("utf-8", errors="replace")
    lines = text.splitlines()
    if size > MAX_METRICS_BYTES:  # the header is the file's first line
        try:
            with path.open("rb") as fh:
                header = fh.readline().decode("utf-8", errors="replace").strip()
        except OSError:
            return None
        lines = [header, *lines[1:]]
    step, tps = None, None
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        s = _number(row.get("step"))
        if s is None or s != int(s):
            continue
        if step is None or s >= step:
            step = int(s)
            t = _number(row.get("tokens_per_s"))
            tps = t if t is not None else tps
    if step is None:
        return None
    eta = None
    if max_steps is not None:
        if step >= max_steps:
            eta = 0.0
        elif tps and tokens_per_step:
            eta = (max_steps - step) * tokens_per_step / tps
    return Progress(step, max_steps, tps, tokens_per_step, eta, max(0.0, (now or time.time()) - mtime), str(path))


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x >= 0 else None
