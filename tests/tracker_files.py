"""What a job left in its trackers and in metrics.csv, read with the trackers' own readers.

- W&B: an offline run file (``run-<id>.wandb``, the transaction log ``wandb-core`` writes) through
  wandb's own CLI, ``python -m wandb leet inspect --json FILE`` (wandb 0.31: one JSON line per
  record, read by ``wandb-core``'s transaction-log reader; it reads a file whose ``wandb-core``
  was killed up to the last complete record and says so on stderr). wandb 0.31 has no Python
  reader of these files (``wandb.sdk.internal.datastore`` is gone); this is the public one.
- metrics.csv: every ``logs/version_<n>/metrics.csv`` of a run directory, each step taken from the
  newest version that has it (a resumed start supersedes what an earlier one logged past its
  checkpoint), read here without jobgen's own reader.

No import of wandb or mlflow at module level: the SLURM lab's tests import this module.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

Row = tuple[int, dict[str, float]]


@dataclass
class WandbFile:
    """One offline W&B run file as wandb reads it."""

    run_ids: list[str] = field(default_factory=list)
    """The ``run_id`` of each run record, in file order (one per start of the run)."""
    history: list[Row] = field(default_factory=list)
    """The history rows, in file order: (step, the row's own metrics; W&B's ``_step``,
    ``_runtime``, ``_timestamp`` left out)."""
    complete: bool = True
    """False when wandb reports the file incomplete (its ``wandb-core`` was killed or is still writing)."""

    @property
    def steps(self) -> list[int]:
        """The history steps, in file order."""
        return [step for step, _ in self.history]


def read_wandb_file(path: Path, env: dict[str, str] | None = None, timeout: float = 120) -> WandbFile:
    """``path`` (a ``run-<id>.wandb``) through ``python -m wandb leet inspect --json``.

    Raises:
        AssertionError: wandb could not read it (its message attached), or printed a record that
            is not JSON.
    """
    environ = {**(os.environ if env is None else env), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                          capture_output=True, text=True, timeout=timeout, env=environ)
    assert proc.returncode == 0, f"wandb leet inspect {path} -> {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    out = WandbFile(complete="incomplete" not in proc.stderr)
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        kind = record.get("type")
        if kind == "run":
            out.run_ids.append(record["run"]["run_id"])
        elif kind == "history":
            history = record["history"]
            metrics = {k: float(v) for k, v in history.get("item", {}).items() if not k.startswith("_")}
            out.history.append((int(history.get("step", {}).get("num", 0)), metrics))
    return out


def csv_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """The rows of the run's metrics.csv files by step (the step's rows merged, empty cells left
    out), each step from the newest version that has the step."""
    by_step: dict[int, dict[str, float]] = {}
    for path in sorted((run_dir / "logs").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1])):
        own: dict[int, dict[str, float]] = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                merged = own.setdefault(int(row["step"]), {})
                merged.update({k: float(v) for k, v in row.items() if k != "step" and v not in ("", None)})
        by_step.update(own)
    return dict(sorted(by_step.items()))


def csv_steps(run_dir: Path, metric: str) -> list[int]:
    """The steps of ``metric`` in the run's metrics.csv files (:func:`csv_rows`)."""
    return [step for step, row in csv_rows(run_dir).items() if metric in row]
