"""One piece of a tracked job, without training: jobgen's own :class:`TrackerLogger`
with a real W&B run (offline) and a real MLflow run (SQLite), fed rows the way Lightning feeds
them, run in its own process like one start of a SLURM job.

``python -m tests.entrypoint.tracking_piece <run_dir> <mlflow uri> <first step> <last step> <kill|finish>``

Logs one train row per step from ``first`` to ``last`` (and a validation row, a separate log
call, at every step divisible by 10), in Lightning's order (the checkpoint at the batch's end,
then the step's train row, then its validation row), writes them to ``<run_dir>/logs/version_<n>/metrics.csv`` as the
CSV logger would (step = optimizer step), and tells the logger of a checkpoint every 10 steps.
``first > 1`` resumes from the checkpoint at ``first - 1``. ``kill``: right after the last
checkpoint (its rows just sent), SIGTERM to this process's ``wandb-core`` child, as slurmstepd
sends it to every process of a requeued step, then the logger closes ``KILLED`` as the
entrypoint does after SLURM's SIGTERM; ``finish``: it closes ``FINISHED``. Prints the record.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def wandb_core_children() -> list[int]:
    """The ``wandb-core`` processes whose parent is this process (wandb starts one per process)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if comm == "wandb-core" and int(rest[1]) == os.getpid():
            found.append(int(entry))
    return found


def main(run_dir: Path, uri: str, first: int, last: int, end: str) -> None:
    from jobgen.jobdir import ResolvedSpec, read_tracking_record
    from jobgen.train.tracking import TrackerLogger
    from tests.entrypoint.conftest import TINY_SPEC, resolved_doc

    spec = {**TINY_SPEC, "name": "piece", "trainer": {
        **TINY_SPEC["trainer"], "max_steps": 100, "loggers": ["wandb", "mlflow"],
        "wandb": {"mode": "offline", "project": "jobgen-test"}, "mlflow": {"tracking_uri": uri, "experiment": "pieces"}}}
    resolved = ResolvedSpec.model_validate(resolved_doc(spec, num_nodes=1, devices_per_node=1, world_size=1))
    logs = run_dir / "logs"
    version = len(list(logs.glob("version_*"))) if logs.is_dir() else 0
    csv_path = logs / f"version_{version}" / "metrics.csv"
    csv_path.parent.mkdir(parents=True)
    trainer = SimpleNamespace(global_step=first - 1)
    logger = TrackerLogger(resolved, run_dir, None if first == 1 else first - 1)
    logger.start(trainer, ["node-a"])
    rows: list[dict[str, float]] = []
    for step in range(first, last + 1):
        trainer.global_step = step
        if step % 10 == 0:
            logger.checkpoint_written(step)  # at the batch's end, before Lightning logs the step's rows
        train = {"train_loss": 10.0 - step / 100, "epoch": 0.0}
        logger.log_metrics(train, step)
        rows.append({"step": step, **train})
        if step % 10 == 0:  # the validation after the step: its own row, its own log call
            val = {"val_loss": 11.0 - step / 100, "epoch": 0.0}
            logger.log_metrics(val, step)
            rows.append({"step": step, **val})
    with open(csv_path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["step", "epoch", "train_loss", "val_loss"])
        writer.writeheader()
        writer.writerows(rows)
    if end == "kill":
        cores = wandb_core_children()
        assert len(cores) == 1, cores
        os.kill(cores[0], signal.SIGTERM)
        deadline = time.monotonic() + 30
        while wandb_core_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        logger.close("KILLED")
    else:
        logger.close("FINISHED")
    record = read_tracking_record(run_dir)
    print("RECORD " + json.dumps(None if record is None else record.model_dump(mode="json")), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
