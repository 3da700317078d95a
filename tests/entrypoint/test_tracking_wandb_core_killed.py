"""W&B rows survive a SIGTERM to ``wandb-core``, without SLURM and without training.

On a SLURM requeue slurmstepd sends SIGTERM to every process of the step, ``wandb-core``
included, at the moment jobgen's rank zero gets its own; the rows W&B had not yet written to the
run's ``.wandb`` file are gone. Each piece of a job here is one process
(:mod:`tests.entrypoint.tracking_piece`: jobgen's own ``TrackerLogger`` with a real offline W&B run
and a real MLflow run): the first logs steps 1-30 and has its ``wandb-core`` killed right after the
rows of its last checkpoint (step 30) were sent; the second resumes from step 30 and runs to 40.

What must hold: every step jobgen records as sent (``.jobgen-tracking.json``) is in the killed
piece's file; the two pieces hold every step 1-40 exactly once, each step's train and validation
rows in one W&B row; MLflow (which confirms each call) has every step once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.entrypoint.conftest import REPO
from tests.entrypoint.test_tracking import metric_steps, mlflow_client, tracker_env, wandb_history
from tests.tracker_files import read_wandb_file

pytest.importorskip("wandb", reason="wandb not installed (pip install -e .[tracking])")
pytest.importorskip("mlflow", reason="mlflow not installed (pip install -e .[tracking])")

WANDB_HEADER_ONLY = b":W&B\xe1\xbe\x00"
"""What ``wandb-core`` 0.31 leaves in a run file it was killed before writing to: the 7-byte
format header (``:W&B``, a magic number, the format version) and no record."""


def _piece(tmp_path: Path, run_dir: Path, uri: str, first: int, last: int, end: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.entrypoint.tracking_piece", str(run_dir), uri, str(first), str(last), end],
                         cwd=REPO, env=tracker_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("RECORD "))
    return json.loads(line.removeprefix("RECORD "))


def _readers_agree(path: Path, key: str, env: dict[str, str], killed: bool) -> None:
    """jobgen reads W&B run files itself (``WandbFileSteps``: wandb 0.31 has no Python reader), as
    does ``wandb_history`` here: both must agree with wandb's own reader, on a killed piece's file
    too. The run record is in every file, except the file of a ``wandb-core`` killed before its
    first write (the format header alone, no record at all)."""
    from jobgen.train.tracking import WandbFileSteps

    theirs = read_wandb_file(path, env)
    empty = killed and path.stat().st_size <= len(WANDB_HEADER_ONLY)  # the header alone: no record at all
    assert theirs.run_ids == ([] if empty else [key]) and wandb_history(path) == theirs.history, (path, theirs)
    assert WandbFileSteps(path).read() == max(theirs.steps, default=None), (path, theirs.steps)


def test_readers_agree_on_the_file_of_a_wandb_core_killed_before_its_first_write(tmp_path: Path) -> None:
    path = tmp_path / "run-k.wandb"
    path.write_bytes(WANDB_HEADER_ONLY)
    _readers_agree(path, "k", tracker_env(tmp_path), killed=True)
    with pytest.raises(AssertionError):  # a piece that finished wrote its run record
        _readers_agree(path, "k", tracker_env(tmp_path), killed=False)


@pytest.mark.slow
def test_rows_sent_before_wandb_core_is_killed_are_kept_or_sent_again_once(tmp_path: Path) -> None:
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir.mkdir()
    record = _piece(tmp_path, run_dir, uri, 1, 30, "kill")
    key = record["run_key"]
    (killed,) = sorted((run_dir / "wandb").glob(f"offline-run-*-{key}"))
    kept = [step for step, _ in wandb_history(killed / f"run-{key}.wandb")]
    confirmed = record.get("logged_step")
    # what jobgen records as sent is what survived the kill
    assert confirmed is None or set(range(1, confirmed + 1)) <= set(kept), (confirmed, kept)

    record = _piece(tmp_path, run_dir, uri, 31, 40, "finish")
    assert record["run_key"] == key and record["logged_step"] == 40, record
    pieces = sorted((run_dir / "wandb").glob(f"offline-run-*-{key}"))
    assert len(pieces) == 2, pieces
    rows = [row for piece in pieces for row in wandb_history(piece / f"run-{key}.wandb")]
    assert [step for step, _ in rows] == list(range(1, 41)), (kept, rows)
    for step, metrics in rows:  # the step's rows merged: train and validation in one W&B row
        assert set(metrics) == ({"train_loss", "epoch", "val_loss"} if step % 10 == 0 else {"train_loss", "epoch"}), (step, metrics)
        assert metrics["train_loss"] == pytest.approx(10.0 - step / 100)
    for piece in pieces:
        _readers_agree(piece / f"run-{key}.wandb", key, tracker_env(tmp_path), killed=piece == killed)
    client = mlflow_client(uri)
    steps = metric_steps(client, record["mlflow_run_id"])
    assert steps["train_loss"] == list(range(1, 41)) and steps["val_loss"] == [10, 20, 30, 40], steps
    assert client.get_run(record["mlflow_run_id"]).info.status == "FINISHED"


def test_the_private_wandb_flush_setting_jobgen_sets_still_exists() -> None:
    """jobgen shortens wandb-core's write interval through a private (``x_``) setting,
    ``x_transaction_log_flush_interval`` (setup.cfg: tested with wandb 0.31): without it the rows
    of the last ~15 s before a SIGTERM are lost again, silently. A wandb that drops or renames it
    fails here."""
    import wandb

    from jobgen.train.tracking import WANDB_FLUSH_S, _flush_setting

    assert _flush_setting(wandb) == {"x_transaction_log_flush_interval": WANDB_FLUSH_S}
    assert wandb.Settings(**_flush_setting(wandb)).x_transaction_log_flush_interval == WANDB_FLUSH_S
