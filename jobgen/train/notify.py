"""Notifications from the entrypoint: ``started``, ``requeued``, ``finished``, ``failed``, and
``restart`` at the start of a restart that the SLURM batch script or the Kubernetes launch wrapper
decided and recorded (:func:`jobgen.events.notifier.restart_of_this_start`). jobgen itself sends
``restart`` where it decides one (a local run, the ssh watcher: :meth:`jobgen.events.notifier.Notifier.send_restart`).

The spec's ``notify:`` (:class:`jobgen.specs.training.NotifySpec`) names a webhook (a JSON body POSTed
with :mod:`urllib.request`, stdlib only) and/or a command (argv, the JSON body on stdin). Only
global rank zero sends. Every attempt is bounded by ``notify.timeout_s`` and retried once; a
failed notification prints one warning on stderr and never fails or stops training.

When each event is sent:

- ``started``: at the start of training (``on_train_start``), on every (re)start; in a
  background thread, so the training loop does not wait for it.
- ``requeued``: after SLURM accepted ``scontrol requeue`` (:class:`RequeueOnSignal` calls
  :meth:`NotifyCallback.requeued`; SLURM's SIGTERM is held back until the notification went out).
- ``finished``: after ``summary.json`` is written (max_steps reached).
- ``failed``: the entrypoint raised, or training stopped before max_steps
  (:func:`notify_failure`, called by ``jobgen.train.__main__``). Not sent when the job requeued
  itself, and not on SIGTERM (``scancel``, pre-emption, time limit): SLURM may requeue the job
  then, and its next start sends ``started`` with ``restart`` > 0.

The body (:meth:`Notifier.body`), one JSON object::

    {"event": "finished", "job": "quickstart", "handle": "slurm://a100/4242", "step": 1000,
     "max_steps": 1000, "train_loss": 1.71, "val_loss": 1.76, "gpu_hours": 2.13,
     "time": "2025-01-31T12:00:00Z", "host": "gpu-017", "run_dir": "/shared/runs/quickstart",
     "profile": "slurm-a100", "restart": 0, "error": null}

``restart``: :data:`jobgen.events.notifier.RESTART_COUNT_ENV` (a local run's restarts, the ssh
restart watcher's, or a Kubernetes pod's from the launch wrapper's ledger), else ``SLURM_RESTART_COUNT``, else
``TORCHELASTIC_RESTART_COUNT``. A ``restart`` body adds ``class``, ``reason``,
``restarts_used`` and ``max_restarts`` (:func:`jobgen.events.notifier.restart_fields`).

``handle``: ``slurm://<cluster>/<SLURM_JOB_ID>`` on SLURM (an array task:
``<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>``), ``local://<run dir>`` for a local run,
``ssh://<first host><run dir>`` on hosts over ssh (from the job's tag every launch sets,
:data:`jobgen.jobdir.files.SSH_JOB_ENV`; ``null`` when it is missing or malformed), ``null`` on
Kubernetes (a pod does not know the kubeconfig context of its handle). ``gpu_hours``:
GPUs (world size) x the wall time of this process so far, on GPU jobs; ``null`` on CPU. Losses
are the latest logged values (``null`` before the first). ``error``: one line, ``failed`` only.

The entrypoint imports this module (and so Lightning) only for specs with ``notify``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch import Callback

from jobgen.events.notifier import (  # noqa: F401 - the sending half, re-exported for the entrypoint's callers
    RETRY_DELAY_S,
    Notifier,
    global_rank,
    job_handle,
    process_start_time,
    restart_fields,
    restart_of_this_start,
    warn,
)

if TYPE_CHECKING:
    from jobgen.jobdir.spec import ResolvedSpec


def _metric(metrics: Mapping[str, Any], name: str) -> float | None:
    value = metrics.get(name)
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def make_notifier(resolved: ResolvedSpec, run_dir: Path, environ: Mapping[str, str] = os.environ) -> Notifier | None:
    """The :class:`Notifier` of this process: global rank zero of a spec with ``notify``; else None."""
    if resolved.spec.notify is None or global_rank(environ) != 0:
        return None
    return Notifier(resolved.spec.notify, resolved, run_dir, environ)


class NotifyCallback(Callback):
    """Sends ``started`` when training starts; :meth:`requeued`, :meth:`finished` for the other
    events (called by RequeueOnSignal and the entrypoint). Keeps the trainer, so that a failure
    notification carries the step and losses reached (:func:`notify_failure`).

    Args:
        notifier: rank zero's notifier (every other rank keeps none and sends nothing).
    """

    #: The callback of the running trainer in this process, for :func:`notify_failure`.
    active: NotifyCallback | None = None

    def __init__(self, notifier: Notifier):
        self.notifier = notifier
        self.trainer: Any = None
        self.sent_requeued = False

    def state(self) -> dict[str, Any]:
        """Step and latest losses of the trainer (nothing before training started)."""
        trainer = self.trainer
        if trainer is None:
            return {}
        metrics = trainer.callback_metrics
        return {"step": trainer.global_step, "train_loss": _metric(metrics, "train_loss"), "val_loss": _metric(metrics, "val_loss")}

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Remember the trainer (for the step and losses of later events)."""
        self.trainer = trainer
        NotifyCallback.active = self

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """``started``, in the background (the first step does not wait for the webhook); first
        ``restart`` when this start is a restart recorded by the SLURM batch script or the
        Kubernetes launch wrapper (:func:`jobgen.events.notifier.restart_of_this_start`)."""
        record = restart_of_this_start(self.notifier.environ)
        budget = self.notifier.resolved.spec.restart.max_restarts
        first = [] if record is None else [("restart", {**self.state(), "restart": restart_fields(record, budget)})]
        self.notifier.send_in_order_in_background(*first, ("started", self.state()))

    def requeued(self, step: int) -> None:
        """``requeued`` at ``step`` (rank zero, after ``scontrol requeue`` succeeded)."""
        self.notifier.wait()
        self.sent_requeued = True
        self.notifier.send("requeued", **{**self.state(), "step": step})

    def finished(self) -> None:
        """``finished``, with the final step and validation loss."""
        self.notifier.wait()
        self.notifier.send("finished", **self.state())


def notify_failure(resolved: ResolvedSpec | None, run_dir: Path | None, error: str) -> None:
    """Send ``failed`` from global rank zero (the entrypoint's error path); never raises.

    Uses the running trainer's step and losses when training had started. Nothing is sent
    without a spec (it could not be read), without ``notify``, on other ranks, or when the job
    had requeued itself.
    """
    try:
        callback = NotifyCallback.active
        if callback is not None:
            if callback.sent_requeued:
                return
            callback.notifier.wait()
            callback.notifier.send("failed", **callback.state(), error=error)
            return
        if resolved is None or run_dir is None:
            return
        notifier = make_notifier(resolved, run_dir)
        if notifier is not None:
            notifier.send("failed", error=error)
    except Exception as exc:  # noqa: BLE001 - a notification never fails (or masks) the real error
        warn(f"notification 'failed' not sent: {type(exc).__name__}: {exc}")


def notify_callback(resolved: ResolvedSpec, run_dir: Path) -> NotifyCallback | None:
    """The callback for ``build_trainer``: on global rank zero of a spec with ``notify``; else None."""
    notifier = make_notifier(resolved, run_dir)
    return None if notifier is None else NotifyCallback(notifier)


def notify_finished(trainer: Any) -> None:
    """Send ``finished`` through the trainer's :class:`NotifyCallback`, if it has one (rank zero)."""
    for callback in trainer.callbacks:
        if isinstance(callback, NotifyCallback):
            callback.finished()
