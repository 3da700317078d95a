"""``logs/version_<n>/metrics.csv``: written at optimizer steps, and read back.

Lightning's loggers get a training row's step from ``fit_loop.epoch_loop._batches_that_stepped``,
which Lightning increments after the row is logged (``training_epoch_loop.on_advance_end``,
Lightning 2.6), and a validation row's from the same counter: the CSV rows of optimizer step N
carried N - 1, while the trackers (:mod:`jobgen.train.tracking`), the step checkpoints, the
progress lines and ``summary.json`` count N. :class:`OptimizerStepCSVLogger` writes
``trainer.global_step`` instead, so that metrics.csv and the trackers agree row for row, and
:func:`read_metrics_rows` can send a tracker the rows an earlier start logged but the tracker
never confirmed.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

Row = tuple[int, dict[str, float]]


class OptimizerStepCSVLogger(CSVLogger):
    """Lightning's CSV logger with ``trainer.global_step`` (the optimizer steps done) in the
    ``step`` column, for training and validation rows alike.

    Args:
        trainer: the Trainer whose steps are written.
        **kwargs: :class:`~lightning.pytorch.loggers.CSVLogger`'s arguments.
    """

    def __init__(self, trainer: Trainer, **kwargs: Any):
        super().__init__(**kwargs)
        self._trainer = trainer

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:  # type: ignore[override]
        """Write one row at the trainer's optimizer step (``step``, Lightning's count, is ignored)."""
        super().log_metrics(dict(metrics), self._trainer.global_step)


def log_at_optimizer_steps(trainer: Trainer, logger: CSVLogger) -> OptimizerStepCSVLogger:
    """Put an :class:`OptimizerStepCSVLogger` of ``logger``'s directory and version in its place
    among ``trainer``'s loggers (before ``fit``; ``logger`` has written nothing yet); returns it.
    It appends its rows to metrics.csv at every logged step."""
    # written at every logged step (Lightning's default waits for a step that is 99 mod 100, which the
    # log steps of log_every_n_steps: 20 never reach): `jobgen status` reads a running job's progress here
    steps = OptimizerStepCSVLogger(trainer, save_dir=logger.save_dir, name=logger.name, version=logger.version,
                                   flush_logs_every_n_steps=1)
    trainer.loggers = [steps if each is logger else each for each in trainer.loggers]
    return steps


def read_metrics_rows(run_dir: Path, upto: int) -> list[Row]:
    """The rows of every ``<run_dir>/logs/version_<n>/metrics.csv`` up to optimizer step ``upto``,
    one per step in step order (the step's rows merged; empty cells left out). A step a later
    start logged again (it resumed from an earlier checkpoint) is taken from that later version
    only: the earlier training past the checkpoint was superseded.

    Raises:
        OSError, ValueError: a file cannot be read or its ``step`` column is not a number.
    """
    versions = []
    for path in (run_dir / "logs").glob("version_*/metrics.csv"):
        match = re.fullmatch(r"version_([0-9]+)", path.parent.name)
        if match:
            versions.append((int(match.group(1)), path))
    by_step: dict[int, dict[str, float]] = {}
    for _, path in sorted(versions):
        own: dict[int, dict[str, float]] = {}
        with open(path, newline="", encoding="utf-8") as f:
            for line in csv.DictReader(f):
                step = int(float(line["step"]))
                if step > upto:
                    continue
                row = own.setdefault(step, {})
                for key, text in line.items():
                    if key is None or key == "step" or text in (None, ""):
                        continue
                    value = float(text)
                    if not math.isnan(value):
                        row[key] = value
        by_step.update(own)  # a later version's step replaces the earlier one's whole
    return [(step, by_step[step]) for step in sorted(by_step) if by_step[step]]
