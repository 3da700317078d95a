"""RequeueOnSignal's hooks around jobgen's own ``scontrol requeue`` and the trackers
behind them: ``before_requeue`` runs before the command (SLURM's SIGTERM after a successful
requeue reaches ``wandb-core`` too), ``requeue_failed`` after a refused one, when training goes on.
A stand-in trainer and requeue command; the checkpoint save is replaced by a file."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.test_tracking_config import resolved_with


def _requeue(tmp_path: Path, rc: int, events: list[str], monkeypatch: pytest.MonkeyPatch):
    from jobgen.train import callbacks
    from jobgen.train.callbacks import RequeueOnSignal

    monkeypatch.setattr(callbacks, "save_checkpoint_atomically",
                        lambda trainer, path: (events.append(f"checkpoint {trainer.global_step}"), path.write_text("ckpt")))
    log = tmp_path / "scontrol.log"
    command = [sys.executable, "-c", f"import sys; open({str(log)!r}, 'a').write(' '.join(sys.argv[1:])); sys.exit({rc})"]
    requeue = RequeueOnSignal(signal.SIGUSR2, tmp_path, "4242", requeue_command=command)
    requeue.before_requeue = lambda step: events.append(f"before {step} ({'ran' if log.exists() else 'not run'})")
    requeue.on_requeued = lambda step: events.append(f"requeued {step}")
    requeue.requeue_failed = lambda step: events.append(f"failed {step} ({log.read_text()})")
    trainer = SimpleNamespace(global_step=30, is_global_zero=True, should_stop=False,
                              strategy=SimpleNamespace(broadcast=lambda value, src=0: value))
    requeue.received = True
    requeue.on_train_batch_end(trainer, None, None, None, 0)
    return requeue, trainer


def test_before_requeue_runs_after_the_checkpoint_and_before_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    requeue, trainer = _requeue(tmp_path, 0, events, monkeypatch)
    assert events == ["checkpoint 30", "before 30 (not run)", "requeued 30"]
    assert requeue.requeued_at_step == 30 and trainer.should_stop


def test_a_refused_requeue_calls_requeue_failed_and_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    requeue, trainer = _requeue(tmp_path, 1, events, monkeypatch)
    assert events == ["checkpoint 30", "before 30 (not run)", "failed 30 (4242)"], events
    assert requeue.requeued_at_step is None and not trainer.should_stop


def test_the_trackers_end_before_the_requeue_and_start_again_when_it_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install -e .[tracking])")
    from mlflow.tracking import MlflowClient

    from jobgen.jobdir import read_tracking_record
    from jobgen.train.tracking import TrackerLogger

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    logger = TrackerLogger(resolved_with(loggers=["mlflow"], mlflow={"tracking_uri": uri}), tmp_path, None)
    trainer = SimpleNamespace(global_step=0)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        logger.start(trainer, ["node-a"])
        for step in (5, 10):
            trainer.global_step = step
            logger.log_metrics({"train_loss": float(step)}, step)
        logger.checkpoint_written(10)
        logger.before_requeue(10)
        client, run_id = MlflowClient(tracking_uri=uri), read_tracking_record(tmp_path).mlflow_run_id
        assert client.get_run(run_id).info.status == "KILLED" and logger.closed
        trainer.global_step = 10
        logger.log_metrics({"train_loss": 10.5}, 10)  # the requeue step's row, after the requeue: not sent now
        logger.requeue_failed(10)
        assert not logger.closed and client.get_run(run_id).info.status == "RUNNING"
        for step in (15, 20):
            trainer.global_step = step
            logger.log_metrics({"train_loss": float(step)}, step)
        logger.close("FINISHED")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == [5, 10, 15, 20]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert read_tracking_record(tmp_path).logged_steps == {"mlflow": 20}
