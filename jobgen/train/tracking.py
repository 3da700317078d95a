"""Experiment trackers of the entrypoint: Weights & Biases and MLflow runs that survive requeue.

``trainer.loggers: [wandb, mlflow]`` adds :class:`TrackerLogger` (a Lightning logger, beside the
CSV one) and :class:`TrackingCallback`. Only global rank zero creates a tracker and imports
``wandb`` / ``mlflow``, once Lightning knows the rank (``on_train_start``); the other ranks only
join one all-gather of their host names at setup.

One run per job. The run directory's :class:`~jobgen.jobdir.TrackingRecord` (made by ``jobgen
submit``, else by the first start) holds the run key:

- W&B: ``wandb.init(id=<run key>, resume="allow")`` on every start. Offline (``mode: offline``,
  or ``WANDB_MODE=offline`` on the node where the spec and profile leave ``mode`` unset) each start
  writes its own ``<run_dir>/wandb/offline-run-<time>-<run key>/`` (``$WANDB_DIR/wandb/...``
  where ``WANDB_DIR`` is set); W&B cannot resume
  offline, but every piece carries the same id, and ``wandb sync <run_dir>/wandb/offline-run-*``
  uploads the pieces of one run in order of start time into that run (wandb 0.31 ``wandb sync
  --help``). ``resume_from`` / ``fork_from`` (W&B's rewind and fork) are not used: wandb 0.31
  accepts them offline without error, but they are server-side operations that an offline run
  cannot check, and the gating below makes them unnecessary.
- MLflow: the first start creates the run (tags ``jobgen.run_key``, ``jobgen.job``,
  ``jobgen.run_dir``) and records its id; later starts resume it by id (status back to
  ``RUNNING``), or find it by the ``jobgen.run_key`` tag when the id was not recorded, or, when
  the record itself is lost but a checkpoint is resumed, by ``jobgen.job`` + ``jobgen.run_dir``.
- A new run: a new job name (a new run directory), ``checkpoint.resume: never`` (every start),
  or a start from step 0 after metrics were already sent (the checkpoints were removed).

No step is logged twice, and what a stopped run logged past its last checkpoint is superseded:
metrics reach the trackers when a checkpoint that covers their optimizer step has been written
(:func:`jobgen.train.checkpoints.save_checkpoint_atomically` tells the logger), plus the rest
when the run ends (finished or failed). A run stopped by a signal (pre-emption, SLURM requeue,
``scancel``, Ctrl-C, a pod eviction) sends nothing past its last checkpoint, and the resumed run
trains and logs those steps again from the checkpoint's step on. The CSV and TensorBoard logs stay
live; the trackers lag by at most ``checkpoint.every_n_steps``.

What a tracker holds, not what was sent, decides what a later start sends (seen on a SLURM requeue: SLURM's
SIGTERM on requeue reaches ``wandb-core`` too, and what it had not written was lost). W&B gets
one committed row per step (the step's rows merged first); ``wandb-core`` writes the run's file
every :data:`WANDB_FLUSH_S` s. The record keeps, per tracker, the highest step it confirmed
(``logged_steps``; ``logged_step`` the lowest): MLflow once its call returned, W&B offline once
the row is in the ``.wandb`` file (:class:`WandbFileSteps`). Each start reads back what each
tracker holds (:attr:`WandbRun.floor`, :attr:`MlflowRun.floor`; the record where it cannot
tell), sends a tracker nothing at or below it, and sends it from the earlier starts'
metrics.csv the steps up to the resumed checkpoint it lacks
(:func:`jobgen.train.metrics_csv.read_metrics_rows`). jobgen's own requeue ends the runs before
``scontrol requeue`` (:meth:`TrackerLogger.before_requeue`). A tracker whose call fails (W&B once
SLURM's SIGTERM has reached ``wandb-core`` before jobgen's rank) gets nothing more in that start;
the other trackers and training go on. After a failed run that sent its tail,
resumed from an earlier checkpoint, the first steps again are skipped, with a note.

Every rank defers SIGINT/SIGTERM from the end of each batch to the start of the next (the
span in which the step's checkpoint is written and its metrics logged and sent;
:meth:`TrackerLogger.hold_signals`): a stop right after a checkpoint of step S would otherwise
lose step S's metrics for good, as the resumed run continues at S + 1.

Status: the MLflow run ends ``FINISHED``, ``KILLED`` (a signal, a SLURM requeue: the next start
sets it ``RUNNING`` again) or ``FAILED`` (an exception); W&B's run is finished with exit code 0
or 1, after ``mark_preempting()`` when killed. A ``SIGKILL`` leaves the MLflow run ``RUNNING``
until the next start.

Logged: the resolved spec as hyper-parameters (W&B config; MLflow params, first value kept: MLflow
refuses to change a param), with URL credentials and the values of the spec's ``secrets`` and of
:data:`jobgen.planning.environment.TRACKER_CREDENTIALS` replaced by ``***``; the job handle, node list,
code commit and restart count (W&B config ``jobgen``, MLflow tags ``jobgen.*``); and every
metric the CSV logger gets (loss, learning rate, tokens/s, samples/s, MFU, peak memory), with
the optimizer step (``trainer.global_step``) as the step. ``summary.json`` gains ``tracking``
(:meth:`TrackerLogger.describe`).

The trackers themselves (what is sent, the run's identity, the W&B and MLflow clients) are
:mod:`jobgen.train.trackers`; this module is the Lightning glue, and its names stay importable here.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from jobgen.events.notifier import restart_count
from jobgen.jobdir.runs import TrackingRecord, write_tracking_record
from jobgen.jobdir.spec import ResolvedSpec
from jobgen.train.trackers import (
    WANDB_FLUSH_S,
    MlflowRun,
    Row,
    Status,
    WandbFileSteps,
    WandbRun,
    _flush_setting,
    flat_params,
    read_key_files,
    run_identity,
    say,
    scrub,
    secret_values,
)

#: Re-exported: the entrypoint's tests (and the labs) import the trackers' names from here.
__all__ = [
    "MlflowRun",
    "Row",
    "Status",
    "TrackerLogger",
    "TrackingCallback",
    "WANDB_FLUSH_S",
    "WandbFileSteps",
    "WandbRun",
    "_flush_setting",
    "flat_params",
    "read_key_files",
    "run_identity",
    "scrub",
    "secret_values",
]


def restart_tag(environ: Mapping[str, str]) -> str:
    """The trackers' ``restart`` tag of this start (``jobgen.restart`` in MLflow, ``jobgen.restart``
    of the W&B config): the restarts before it, as the notifications count them
    (:func:`jobgen.events.notifier.restart_count`: jobgen's own count first, then SLURM's, then torchrun's)."""
    return str(restart_count(environ))


# --------------------------------------------------------------------------- Lightning glue


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT/SIGTERM ignored inside (main thread): a launcher's second signal (torchrun sends
    one to every worker when it is stopped itself) must not cut the closing of a run short."""
    try:
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class TrackerLogger(Logger):
    """The trackers of ``spec.trainer.loggers`` as one Lightning logger (every rank holds one;
    only global rank zero starts trackers, in :meth:`start`). Metrics are held back until a
    checkpoint covers their step (see the module doc).

    Args:
        resolved: the resolved spec (trackers, their options, what is logged as parameters).
        run_dir: the run directory (absolute): the record, W&B's directory, MLflow's default database.
        resumed_step: the global step of the checkpoint this start resumes from; None: from step 0.
        code: the code snapshot record (``commit``, ...) or None.
        handle: the job handle, when the node can tell (:func:`jobgen.train.notify.job_handle`).
    """

    def __init__(self, resolved: ResolvedSpec, run_dir: Path, resumed_step: int | None,
                 code: Mapping[str, Any] | None = None, handle: str | None = None):
        super().__init__()
        self.resolved, self.run_dir, self.resumed_step = resolved, run_dir, resumed_step
        self.code, self.handle = code, handle
        self.trackers: list[WandbRun | MlflowRun] = []
        self.record: TrackingRecord | None = None
        self.safe_step = resumed_step or 0
        """Rows at or below this optimizer step are sent at once: a checkpoint covers them."""
        self.floors: dict[str, int] = {}
        """Per tracker, the highest step it held when this start began: it is sent nothing at or below it."""
        self.floor = -1
        """The lowest of :attr:`floors`: rows at or below it are sent to no tracker."""
        self.sent_step: int | None = None
        self.resent: dict[str, int] = {}
        """Per tracker, the rows of metrics.csv sent again at the start (steps the tracker lacked)."""
        self.skipped = 0
        self.failed: set[str] = set()
        """Trackers whose :meth:`log` raised in this start: they get nothing more until the next start."""
        self.signalled: int | None = None
        """SIGINT/SIGTERM seen on this rank since :meth:`start` (the run then ends KILLED)."""
        self.closed = False
        self._buffer: list[Row] = []
        self._held: dict[int, Any] | None = None
        self._pending: list[int] = []
        self._last_sent: dict[str, int] = {}
        self._trainer: Trainer | None = None
        self._nodes: list[str] = []

    @property
    def name(self) -> str:
        """Lightning's logger name."""
        return "jobgen-trackers"

    @property
    def version(self) -> str | None:
        """The run key (None before :meth:`start` and on other ranks)."""
        return None if self.record is None else self.record.run_key

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Nothing: the resolved spec is logged by :meth:`start` (the module's own hparams are part of it)."""

    def finalize(self, status: str) -> None:
        """Nothing: Lightning calls this at the end of each fit/validate; the run goes on until :meth:`close`."""

    def attach(self, trainer: Trainer) -> None:
        """Read optimizer steps from ``trainer`` (every rank, at setup)."""
        self._trainer = trainer

    def start(self, trainer: Trainer, nodes: list[str]) -> None:
        """Global rank zero: read the key files, settle the run's identity, start every tracker,
        log the parameters; watch for SIGINT/SIGTERM (a run stopped by one ends KILLED)."""
        self._trainer, self._nodes = trainer, nodes
        resolved, spec = self.resolved, self.resolved.spec
        read_key_files(resolved)
        record, lost = run_identity(self.run_dir, resolved, self.resumed_step)
        secrets = secret_values(resolved)
        doc = scrub(resolved.model_dump(mode="json"), secrets)
        meta = {"handle": self.handle, "nodes": ",".join(nodes), "commit": (self.code or {}).get("commit"),
                "resumed_from_step": self.resumed_step, "restart": restart_tag(os.environ)}
        meta = scrub({k: v for k, v in meta.items() if v is not None}, secrets)
        t = spec.trainer
        self.record = record
        try:
            # MLflow first: when the record was lost, the run it finds by its tags brings the
            # job's old run key back, and W&B continues under it
            if "mlflow" in t.trackers:
                assert t.mlflow is not None
                ml = MlflowRun(t.mlflow, record, lost, self.run_dir, spec.name, flat_params(doc),
                               {f"jobgen.{k}": str(v) for k, v in meta.items()}, resumed=self.resumed_step is not None)
                self.record = record = ml.record
                self.trackers.append(ml)
            if "wandb" in t.trackers:
                assert t.wandb is not None
                self.trackers.insert(0, WandbRun(t.wandb, record, self.run_dir, spec.name, {**doc, "jobgen": meta}))
        except BaseException:
            self.close("FAILED")
            raise
        self._settle_floors(record)
        self._watch_signals()
        self._resend()
        for tracker in self.trackers:
            where = tracker.describe()
            if isinstance(tracker, WandbRun):
                say(f"wandb run {where['id']} ({where['mode']}" + (f", {where['url']})" if where["url"] else f", {where['dir']})"))
            else:
                say(f"mlflow run {where['run_id']} in {where['tracking_uri']} (experiment {where['experiment_id']})")

    def _settle_floors(self, record: TrackingRecord) -> None:
        """Each tracker's floor: what the tracker itself says it holds (the earlier W&B pieces'
        files, the MLflow run's metrics, a resumed online W&B run's step), else the record's."""
        for tracker in self.trackers:
            held = tracker.floor
            if held is None:
                held = record.logged_steps.get(tracker.name, record.logged_step)
            self.floors[tracker.name] = -1 if held is None else held
        self.floor = min(self.floors.values(), default=-1)
        top = max(self.floors.values(), default=-1)
        if self.resumed_step is not None and self.resumed_step < top:
            say(f"the trackers have steps up to {top}, this start resumes from step {self.resumed_step}: "
                 f"steps up to {top} are not sent again to a tracker that has them (they are in metrics.csv)")

    def _resend(self) -> None:
        """Send each tracker the rows of metrics.csv (the earlier starts' versions) from its floor up
        to the resumed checkpoint's step: what an earlier start logged but the tracker never got
        (``wandb-core`` killed before writing them, a failed call)."""
        if self.resumed_step is None or all(f >= self.resumed_step for f in self.floors.values()):
            return
        from jobgen.train.metrics_csv import read_metrics_rows

        try:
            rows = read_metrics_rows(self.run_dir, upto=self.resumed_step)
        except (OSError, ValueError) as exc:
            say(f"warning: cannot read metrics.csv to send the steps the trackers lack: {type(exc).__name__}: {exc}")
            return
        for tracker in self.trackers:
            missing = [r for r in rows if r[0] > self.floors[tracker.name]]
            if not missing:
                continue
            try:
                tracker.log(missing)
                tracker.flush()
            except Exception as exc:  # noqa: BLE001 - the run goes on; the next start tries again
                say(f"warning: sending {tracker.name} the steps it lacks failed: {type(exc).__name__}: {exc}")
                continue
            self.resent[tracker.name] = len(missing)
            self.floors[tracker.name] = max(self.floors[tracker.name], missing[-1][0])
            say(f"{tracker.name}: sent again {len(missing)} step(s) {missing[0][0]}-{missing[-1][0]} from metrics.csv "
                 "(logged by an earlier start, never confirmed)")
        for step, metrics in rows:
            self._last_sent.update({k: max(step, self._last_sent.get(k, -1)) for k in metrics})
        self.floor = min(self.floors.values(), default=-1)

    def _watch_signals(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(signum)

            def observe(number: int, frame: Any, previous: Any = previous) -> None:
                self.signalled = self.signalled or number
                if callable(previous):
                    previous(number, frame)
                elif previous == signal.SIG_DFL:
                    signal.signal(number, signal.SIG_DFL)
                    signal.raise_signal(number)

            try:
                signal.signal(signum, observe)
            except ValueError:  # not the main thread: statuses fall back on the exception type
                return

    def hold_signals(self) -> None:
        """Defer SIGINT/SIGTERM (recorded, the run then ends KILLED) until :meth:`release_signals`:
        :class:`TrackingCallback` holds them on every rank from the end of each batch to the start of the next,
        the span in which the step's checkpoint is written and its metrics are logged and sent.
        Without it a stop after a checkpoint of step S, before step S's metrics were logged,
        would lose them for good (the resumed run continues at S + 1). Main thread only."""
        if self._held is not None or self.closed:
            return

        def record(number: int, frame: Any) -> None:
            self.signalled = self.signalled or number
            self._pending.append(number)

        try:
            self._held = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread
            self._held = None

    def release_signals(self, deliver: bool = True) -> None:
        """End :meth:`hold_signals`: restore the handlers and (``deliver``) raise each deferred signal again."""
        held, self._held = self._held, None
        if held is None:
            return
        for s, handler in held.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        pending, self._pending = list(dict.fromkeys(self._pending)), []
        if deliver:
            for number in pending:
                signal.raise_signal(number)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Hold or send one row, at the trainer's optimizer step (see the class doc)."""
        if not self.trackers or self.closed:
            return
        at = self._trainer.global_step if self._trainer is not None else int(step or 0)
        if at <= self.floor:
            self.skipped += 1
            return
        row = (at, {k: float(v) for k, v in metrics.items()})
        if at <= self.safe_step:
            self._send([row])
        else:
            self._buffer.append(row)

    def checkpoint_written(self, step: int) -> None:
        """A checkpoint of optimizer step ``step`` is complete (global rank zero; called by
        :func:`jobgen.train.checkpoints.save_checkpoint_atomically`): send what it covers."""
        if not self.trackers or self.closed:
            return
        self.safe_step = max(self.safe_step, step)
        self._flush(upto=self.safe_step)
        self._remember()

    def _flush(self, upto: int | None) -> None:
        ready = [r for r in self._buffer if upto is None or r[0] <= upto]
        self._buffer = [r for r in self._buffer if not (upto is None or r[0] <= upto)]
        if ready:
            self._send(ready)

    def _send(self, rows: list[Row]) -> None:
        # per metric, each step once: Lightning adds ``epoch`` to the training and the validation
        # row of the same step (the same value), and MLflow would keep both
        fresh: list[Row] = []
        for step, metrics in rows:
            kept = {k: v for k, v in metrics.items() if self._last_sent.get(k, -1) < step}
            self._last_sent.update(dict.fromkeys(kept, step))
            if kept:
                fresh.append((step, kept))
        if not fresh:
            return
        for tracker in self.trackers:
            own = [r for r in fresh if r[0] > self.floors.get(tracker.name, -1)]
            if own and tracker.name not in self.failed:
                try:
                    tracker.log(own)
                except Exception as exc:  # noqa: BLE001 - e.g. wandb-core SIGTERMed by SLURM: ConnectionResetError
                    # neither the other trackers nor training may stop on it (seen on the
                    # SLURM lab); what this tracker confirmed stays what it was, so the next start
                    # sends it the rest from metrics.csv
                    self.failed.add(tracker.name)
                    say(f"warning: {tracker.name} failed: {type(exc).__name__}: {exc}; it gets nothing more in this "
                         "start (the next start sends it what it lacks from metrics.csv)")
        self.sent_step = max(self.sent_step or 0, *(step for step, _ in fresh))

    def _remember(self) -> None:
        """Record, per tracker and for all of them, the highest step the trackers have confirmed
        (:attr:`TrackingRecord.logged_steps`, :attr:`TrackingRecord.logged_step`)."""
        if self.record is None:
            return
        steps: dict[str, int] = {}
        for tracker in self.trackers:
            try:
                held = tracker.confirmed_step()
            except Exception:  # noqa: BLE001 - a tracker that cannot tell has confirmed nothing new
                held = self.record.logged_steps.get(tracker.name)
            if held is not None:
                steps[tracker.name] = held
        every = min(steps.values()) if len(steps) == len(self.trackers) and steps else None
        if steps != self.record.logged_steps or every != self.record.logged_step:
            self.record = self.record.model_copy(update={"logged_steps": steps, "logged_step": every})
            write_tracking_record(self.run_dir, self.record)

    def status_of(self, exc: BaseException | None) -> Status:
        """The run's end for an exception leaving training: KILLED after SIGINT/SIGTERM (also
        Lightning's KeyboardInterrupt exit and SIGTERMException), FAILED otherwise."""
        seen = exc
        while seen is not None:
            if isinstance(seen, KeyboardInterrupt) or type(seen).__name__ == "SIGTERMException":
                return "KILLED"
            seen = seen.__context__
        return "KILLED" if self.signalled is not None else "FAILED"

    def close(self, status: Status) -> None:
        """End every tracker's run with ``status`` (once; global rank zero) and record what they
        confirmed. FINISHED and FAILED send the held-back rows first; KILLED drops them (the
        resumed run logs those steps again). Never raises: a tracker's failure here is printed."""
        self.release_signals(deliver=False)  # the run ends now: a deferred signal has been counted (KILLED)
        if self.closed or not self.trackers:
            self.closed = True
            return
        self.closed = True
        with _signals_ignored():
            try:
                if status == "KILLED":
                    if self._buffer:
                        say(f"{len(self._buffer)} metric row(s) after the last checkpoint (step {self.safe_step}) not "
                             "sent: the resumed run logs those steps again")
                    self._buffer = []
                else:
                    self._flush(upto=None)
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's own outcome
                say(f"warning: sending the last metrics failed: {type(exc).__name__}: {exc}")
            for tracker in self.trackers:
                try:
                    tracker.close(status)
                except Exception as exc:  # noqa: BLE001
                    say(f"warning: closing the {tracker.name} run failed: {type(exc).__name__}: {exc}")
            try:
                self._remember()  # after closing: a finished W&B run has written its whole file
            except Exception as exc:  # noqa: BLE001
                say(f"warning: recording the confirmed steps failed: {type(exc).__name__}: {exc}")
        if self.skipped:
            say(f"{self.skipped} metric row(s) at or below step {self.floor} were not sent again")
        say(f"runs ended {status}")

    def before_requeue(self, step: int) -> None:
        """Before jobgen's own ``scontrol requeue`` (global rank zero, the checkpoint of ``step``
        written): end the runs KILLED now, so that W&B has written every row when SLURM's
        SIGTERM reaches ``wandb-core`` with every other process of the step."""
        self.close("KILLED")

    def requeue_failed(self, step: int) -> None:
        """The requeue after :meth:`before_requeue` failed and training goes on: start the
        trackers again, resuming from ``step`` (a new offline W&B piece of the same run). A
        failure is printed; the runs then stay ended and a later start sends what they lack."""
        if not self.closed or self._trainer is None:
            return
        self.closed, self.trackers, self.skipped, self.failed = False, [], 0, set()
        self.resumed_step, self.safe_step = step, max(self.safe_step, step)
        try:
            self.start(self._trainer, self._nodes)
        except Exception as exc:  # noqa: BLE001 - training goes on without the trackers
            say(f"warning: the trackers could not start again after the failed requeue: {type(exc).__name__}: {exc}")
            self.closed = True

    def describe(self) -> dict[str, Any]:
        """``summary.json``'s ``tracking``: the run key and each tracker's run (ids, URLs or paths)."""
        return {"run_key": self.version, **{t.name: t.describe() for t in self.trackers}}


class TrackingCallback(Callback):
    """Starts :class:`TrackerLogger` on global rank zero when training starts (Lightning has set
    the ranks and restored the checkpoint by then), after every rank has shared its host name
    (one all-gather at setup: the node list)."""

    def __init__(self, logger: TrackerLogger):
        self.logger = logger
        self.nodes: list[str] = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Every rank: attach the logger to the trainer; gather the host names (collective)."""
        self.logger.attach(trainer)
        if stage != "fit" or self.nodes:
            return
        host = socket.gethostname()
        import torch.distributed as dist

        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            hosts: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(hosts, host)
            self.nodes = sorted({str(h) for h in hosts})
        else:
            self.nodes = [host]

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Global rank zero: start the trackers."""
        if trainer.is_global_zero and not self.logger.trackers:
            self.logger.start(trainer, self.nodes)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Every rank: defer SIGINT/SIGTERM while this step's checkpoint and metrics go out (this
        callback runs before the others, the checkpoint callback last). Every rank, so that a
        stop that reaches all of them (Ctrl-C, a launcher's signal) leaves them at the same
        point, after the step's collectives: a rank that left early would fail rank zero's
        checkpoint or validation before the step's metrics are logged."""
        self.logger.hold_signals()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Deliver what was deferred at the previous step."""
        self.logger.release_signals()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Deliver what was deferred at the last step."""
        self.logger.release_signals()
