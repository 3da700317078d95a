"""metrics.csv is on disk at every logged step, not only at the end: `jobgen status` reads a
running job's progress from it (jobgen/reports/progress.py)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import require


def test_each_logged_step_reaches_metrics_csv_before_the_run_ends(tmp_path: Path):
    require("lightning")
    from lightning.pytorch.loggers import CSVLogger

    from jobgen.train.metrics_csv import log_at_optimizer_steps

    plain = CSVLogger(save_dir=tmp_path, name="logs")
    trainer = SimpleNamespace(global_step=0, loggers=[plain])
    steps = log_at_optimizer_steps(trainer, plain)  # type: ignore[arg-type]
    path = Path(steps.log_dir) / "metrics.csv"
    for step, tps in ((20, 1000.0), (40, 1100.0)):
        trainer.global_step = step
        steps.log_metrics({"tokens_per_s": tps, "train_loss": 3.0}, step=step - 1)
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["step"]) for r in rows][-1] == step and float(rows[-1]["tokens_per_s"]) == tps
    trainer.global_step = 40
    steps.log_metrics({"val_loss": 2.5}, step=39)  # a new column: the file is rewritten with it
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [20, 40, 40] and rows[-1]["val_loss"] == "2.5"
