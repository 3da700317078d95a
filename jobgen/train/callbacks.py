"""Callbacks of the entrypoint: throughput, line-per-interval progress, FSDP clipping, and
checkpoint-and-requeue on SLURM's pre-emption/time-limit signal."""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn

from jobgen.train.checkpoints import held_back, save_checkpoint_atomically
from jobgen.train.measure import mfu, peak_memory
from jobgen.train.speed import host_scalar, lever_on

STEADY_WINDOW = 1000
"""Steps in :attr:`Throughput.steady_seconds_per_step`'s span at most (the later half of the
last ``2 x STEADY_WINDOW`` timed steps)."""


class Throughput(Callback):
    """Measures training throughput over all ranks: ``tokens_per_s``, ``samples_per_s`` and,
    when a peak FLOP/s is known (GPUs), ``mfu``; at log intervals also ``peak_memory_mb``.

    Tokens per optimizer step = micro batch size x block size x gradient accumulation steps x
    world size. Time is measured between consecutive optimizer steps on each rank; the first
    ``warmup_steps`` steps of a process (start-up, allocation) are excluded from the means, and
    validation time is not counted.

    Lightning's ``ThroughputMonitor`` is not used: it needs ``flops_per_batch`` on the module,
    logs from rank zero only under its own metric names, synchronises CUDA after every micro
    batch, averages over a window that includes the first (start-up) step, and derives the peak
    from the runtime device name, so a CPU rehearsal and a GPU job would report differently;
    here FLOPs per token come from the model config and the peak from the profile's
    ``gpu_type`` (:mod:`jobgen.train.measure`).

    A ``class_path`` data module's batches are counted instead (``count_batches_of_world``):
    samples of a step = the samples in this rank's micro batches since the last step (Lightning's
    ``extract_batch_size``) x world size, so a per-epoch accumulation schedule or a loader with
    its own batch size is measured, not assumed; tokens only with ``tokens_per_sample`` (what the
    data module or model declares), else tokens/s is ``None`` ("n/a").

    Args:
        tokens_per_step: tokens per optimizer step over all ranks (``None``: counted or unknown).
        samples_per_step: sequences per optimizer step over all ranks (global batch size).
        flops_per_token: training FLOPs per token (``None``: unknown, no MFU).
        peak_flops_per_s: peak FLOP/s of all ranks together (``None``: unknown, e.g. CPU).
        warmup_steps: optimizer steps at the start of each process left out of the means.
        count_batches_of_world: count samples from the batches, times this world size.
        tokens_per_sample: with ``count_batches_of_world``: tokens in one sample, if known.
    """

    def __init__(
        self,
        tokens_per_step: int | None,
        samples_per_step: int | None = None,
        flops_per_token: int | None = None,
        peak_flops_per_s: float | None = None,
        warmup_steps: int = 1,
        count_batches_of_world: int | None = None,
        tokens_per_sample: int | None = None,
    ):
        self.tokens_per_step = tokens_per_step
        self.samples_per_step = samples_per_step
        self.count_batches_of_world = count_batches_of_world
        self.tokens_per_sample = tokens_per_sample
        self._batch_samples: int | None = 0
        """Samples (this rank) in the micro batches since the last optimizer step; None: uncountable."""
        self.samples_timed = 0
        """Samples (all ranks) of the timed steps, when counted."""
        self.flops_per_token = flops_per_token
        self.peak_flops_per_s = peak_flops_per_s
        self.warmup_steps = warmup_steps
        self.steps_timed = 0
        """Optimizer steps included in the mean."""
        self.seconds_timed = 0.0
        """Wall time of those steps (seconds)."""
        self.last_tokens_per_s: float | None = None
        """Throughput of the latest optimizer step (tokens/s)."""
        self.seconds_per_step: float | None = None
        """Mean wall time per optimizer step so far (seconds)."""
        self.peak_memory_bytes: int | None = None
        """This rank's peak memory at the latest log interval (see :func:`jobgen.train.measure.peak_memory`)."""
        self.peak_memory_kind: str | None = None
        """What ``peak_memory_bytes`` measures (a key of :data:`jobgen.train.measure.MEMORY_KINDS`)."""
        self._start_step: int | None = None
        self._last_step: int | None = None
        self._last_time = 0.0
        self._val_started: float | None = None
        self._paused = 0.0
        """Seconds spent in validation during fit so far (left out of the step clock)."""
        self._step_ends: deque[tuple[int, float]] = deque(maxlen=2 * STEADY_WINDOW)
        """``(global step, perf_counter)`` at the end of the latest timed steps (:attr:`steady_seconds_per_step`)."""
        self.host_logging = lever_on("host_logging")
        """Log the per-step rates as host tensors (:func:`jobgen.train.speed.host_scalar`)."""

    @property
    def mean_tokens_per_s(self) -> float | None:
        """Mean throughput over the timed steps (tokens/s over all ranks), ``None`` if none or unknown."""
        if self.steps_timed == 0 or self.seconds_timed <= 0:
            return None
        if self.count_batches_of_world is not None:
            rate = self.mean_samples_per_s
            return None if rate is None or self.tokens_per_sample is None else rate * self.tokens_per_sample
        if self.tokens_per_step is None:
            return None
        return self.steps_timed * self.tokens_per_step / self.seconds_timed

    @property
    def mean_samples_per_s(self) -> float | None:
        """Mean throughput over the timed steps (sequences/s over all ranks), ``None`` if none or unknown."""
        if self.steps_timed == 0 or self.seconds_timed <= 0:
            return None
        if self.count_batches_of_world is not None:
            return None if self._batch_samples is None else self.samples_timed / self.seconds_timed
        if self.samples_per_step is None:
            return None
        return self.steps_timed * self.samples_per_step / self.seconds_timed

    def _count_batch(self, batch: Any) -> None:
        if self._batch_samples is None:
            return
        from lightning.pytorch.utilities.data import extract_batch_size

        try:
            self._batch_samples += extract_batch_size(batch)
        except Exception:  # noqa: BLE001 - a batch without a tensor: samples/s stays unknown ("n/a")
            self._batch_samples = None

    @property
    def mean_mfu(self) -> float | None:
        """MFU of the mean throughput (a fraction), ``None`` without a peak (CPU) or FLOP count."""
        return mfu(self.mean_tokens_per_s, self.flops_per_token, self.peak_flops_per_s)

    @property
    def last_mfu(self) -> float | None:
        """MFU of the latest optimizer step (a fraction), ``None`` when unknown."""
        return mfu(self.last_tokens_per_s, self.flops_per_token, self.peak_flops_per_s)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start the clock at the step the run begins (or resumes) at."""
        self._start_step = self._last_step = trainer.global_step
        self._last_time = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After each optimizer step: time it and log the rates (and peak memory at log intervals)."""
        if self.count_batches_of_world is not None:
            self._count_batch(batch)
        step = trainer.global_step
        if self._last_step is None or step == self._last_step:
            return  # still accumulating gradients
        now = time.perf_counter()
        elapsed, steps = now - self._last_time, step - self._last_step
        self._last_step, self._last_time = step, now
        if self.count_batches_of_world is None:
            samples = None if self.samples_per_step is None else steps * self.samples_per_step
            tokens = None if self.tokens_per_step is None else steps * self.tokens_per_step
        else:
            samples = None if self._batch_samples is None else self._batch_samples * self.count_batches_of_world
            tokens = None if samples is None or self.tokens_per_sample is None else samples * self.tokens_per_sample
            if self._batch_samples is not None:
                self._batch_samples = 0
        log = self._log_host if self.host_logging else self._log_number
        if step % trainer.log_every_n_steps == 0 or step == trainer.max_steps:
            self.peak_memory_bytes, self.peak_memory_kind = peak_memory(pl_module.device)
            log(pl_module, "peak_memory_mb", self.peak_memory_bytes / 1e6)
        if elapsed <= 0:
            return
        self.last_tokens_per_s = None if tokens is None else tokens / elapsed
        if self.last_tokens_per_s is not None:
            log(pl_module, "tokens_per_s", self.last_tokens_per_s)
        if samples is not None:
            log(pl_module, "samples_per_s", samples / elapsed)
        if (step_mfu := self.last_mfu) is not None:
            log(pl_module, "mfu", step_mfu)
        if step <= self._start_step + self.warmup_steps:
            return  # start-up steps: allocation, first-call overheads
        self.steps_timed += steps
        self.seconds_timed += elapsed
        self.samples_timed += samples or 0
        self.seconds_per_step = self.seconds_timed / self.steps_timed
        self._step_ends.append((step, now - self._paused))

    @staticmethod
    def _log_host(pl_module: LightningModule, name: str, value: float) -> None:
        """``pl_module.log`` of a per-step number as a host tensor (no host-to-device copy)."""
        pl_module.log(name, host_scalar(value), on_step=True, on_epoch=False)

    @staticmethod
    def _log_number(pl_module: LightningModule, name: str, value: float) -> None:  # the lever off: as before
        pl_module.log(name, value, on_step=True, on_epoch=False)

    @property
    def steady_seconds_per_step(self) -> float | None:
        """Mean wall time of one optimizer step over the later half of the timed steps (at most
        the last :data:`STEADY_WINDOW`), in seconds; ``None`` before two timed steps.

        The full mean (``seconds_per_step``) includes every one-off after the first step
        (compiling a second graph, the allocator's growth, the after-effects of a validation).
        Clock to clock over a span of steps rather than a median of single steps: the host
        queues a GPU's work ahead of it between the log steps' reads, so a single step's host
        time is not its device time, while a span's is, to within the queue's depth.
        """
        if len(self._step_ends) < 3:
            return None
        points = list(self._step_ends)
        (s0, t0), (s1, t1) = points[len(points) // 2], points[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 and t1 > t0 else None

    @property
    def steady_tokens_per_s(self) -> float | None:
        """Tokens/s (all ranks) at :attr:`steady_seconds_per_step`; ``None`` when unknown or
        counted from the batches (a class_path data module: the step's tokens vary)."""
        spent = self.steady_seconds_per_step
        if spent is None or spent <= 0 or self.tokens_per_step is None or self.count_batches_of_world is not None:
            return None
        return self.tokens_per_step / spent

    @property
    def steady_mfu(self) -> float | None:
        """MFU at :attr:`steady_tokens_per_s` (a fraction), ``None`` when unknown."""
        return mfu(self.steady_tokens_per_s, self.flops_per_token, self.peak_flops_per_s)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Pause the clock: validation time is not training throughput."""
        self._val_started = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Resume the clock after validation."""
        if self._val_started is not None and trainer.state.fn == TrainerFn.FITTING:
            paused = time.perf_counter() - self._val_started
            self._last_time += paused
            self._paused += paused
        self._val_started = None


class StepTrace(Callback):
    """A ``torch.profiler`` trace of optimizer steps ``first`` to ``last`` (1-based, inclusive),
    exported as a Chrome trace (``chrome://tracing`` / Perfetto; gzip when the name ends in
    ``.gz``) by every rank to ``<directory>/steps-<first>-<last>-rank<global rank>.json.gz``.

    Set by ``JOBGEN_TRACE_STEPS=FIRST-LAST`` (:func:`trace_steps`): for looking at a few steady
    steps (CPU work, CUDA kernels, host-device copies and synchronisations) without profiling
    the whole run. The profiler starts before the first micro batch of step ``first`` and stops
    after step ``last``; the steps in between run slower by the profiler's own cost.

    Args:
        first: first optimizer step traced (>= 1).
        last: last optimizer step traced (>= first).
        directory: where the trace is written (created).
    """

    def __init__(self, first: int, last: int, directory: Path):
        self.first, self.last, self.directory = first, last, directory
        self.path: Path | None = None
        """The trace written (``None`` until the last traced step ends)."""
        self._profiler: Any = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Start the profiler at the first micro batch of step ``first``."""
        if self._profiler is None and self.path is None and trainer.global_step == self.first - 1:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self._profiler = profile(activities=activities, record_shapes=False)
            self._profiler.__enter__()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Stop and export after step ``last``."""
        if self._profiler is not None and trainer.global_step >= self.last:
            self._profiler.__exit__(None, None, None)
            self.directory.mkdir(parents=True, exist_ok=True)
            self.path = self.directory / f"steps-{self.first}-{self.last}-rank{trainer.global_rank}.json.gz"
            self._profiler.export_chrome_trace(str(self.path))
            self._profiler = None
            if trainer.is_global_zero:
                print(f"trace: steps {self.first}-{self.last} written to {self.path}", flush=True)


TRACE_STEPS_ENV = "JOBGEN_TRACE_STEPS"
"""Environment variable naming the optimizer steps :class:`StepTrace` traces, ``FIRST-LAST``."""


def trace_steps(value: str | None) -> tuple[int, int] | None:
    """``(first, last)`` from a ``JOBGEN_TRACE_STEPS`` value ``FIRST-LAST`` (``None``: unset or empty).

    Raises:
        ConfigError: not two positive integers with ``first <= last``.
    """
    if not value:
        return None
    match = re.fullmatch(r"([0-9]+)-([0-9]+)", value.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        from jobgen.errors import ConfigError

        raise ConfigError(f"{TRACE_STEPS_ENV}={value!r} is not FIRST-LAST optimizer steps",
                          location=f"${TRACE_STEPS_ENV}", hint="e.g. JOBGEN_TRACE_STEPS=61-63 (steps counted from 1)")
    return int(match.group(1)), int(match.group(2))


def _format_eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class LineProgress(Callback):
    """Prints one line per log interval on global rank zero (for jobs whose output is a file).

    Format: ``step 120/1000 | train_loss 2.4512 | lr 2.91e-03 | 23.4k tok/s | mfu 41.2% | peak mem
    1.23 GB | eta 0:03:12`` (``mfu`` only when a peak FLOP/s is known; ``peak mem`` is this
    rank's, GPU tensors or CPU RSS high-water mark),
    plus one line per validation: ``validation at step 100: val_loss 2.5012``.

    Args:
        throughput: the :class:`Throughput` callback of the same trainer (for tok/s and ETA).
        log_every_n_steps: print every N optimizer steps (and at the last step).
    """

    def __init__(self, throughput: Throughput, log_every_n_steps: int):
        self.throughput = throughput
        self.log_every_n_steps = log_every_n_steps
        self._printed_step: int | None = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Print a progress line when an optimizer step lands on the log interval."""
        step = trainer.global_step
        if not trainer.is_global_zero or step == self._printed_step or step == 0:
            return
        if step % self.log_every_n_steps and step != trainer.max_steps:
            return
        self._printed_step = step
        metrics = trainer.callback_metrics
        bounded = trainer.max_steps > 0
        parts = [f"step {step}/{trainer.max_steps}" if bounded else f"step {step} (epoch {trainer.current_epoch})"]
        if "train_loss" in metrics:
            parts.append(f"train_loss {float(metrics['train_loss']):.4f}")
        if "lr" in metrics:
            parts.append(f"lr {float(metrics['lr']):.2e}")
        if self.throughput.last_tokens_per_s is not None:
            parts.append(f"{self.throughput.last_tokens_per_s / 1000:.1f}k tok/s")
        elif self.throughput.count_batches_of_world is not None and self.throughput.mean_samples_per_s is not None:
            parts.append(f"{self.throughput.mean_samples_per_s:.1f} samples/s")
        if (step_mfu := self.throughput.last_mfu) is not None:
            parts.append(f"mfu {100 * step_mfu:.1f}%")
        if self.throughput.peak_memory_bytes is not None:
            kind = "rss" if self.throughput.peak_memory_kind == "cpu_max_rss" else "gpu"
            parts.append(f"peak mem {self.throughput.peak_memory_bytes / 1e9:.2f} GB {kind}")
        if self.throughput.seconds_per_step is not None and bounded:
            parts.append(f"eta {_format_eta((trainer.max_steps - step) * self.throughput.seconds_per_step)}")
        print(" | ".join(parts), flush=True)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the validation loss (not for the sanity check before training)."""
        if trainer.is_global_zero and not trainer.sanity_checking and "val_loss" in trainer.callback_metrics:
            val_loss = float(trainer.callback_metrics["val_loss"])
            print(f"validation at step {trainer.global_step}: val_loss {val_loss:.4f}", flush=True)


class LogIntervalBar(TQDMProgressBar):
    """Lightning's progress bar (interactive runs) with ``train_loss`` read at log intervals only.

    ``train_loss`` is not a progress-bar metric of the module (reading a GPU tensor every step
    would synchronise host and device every step); this bar reads the logged value when an
    optimizer step lands on ``log_every_n_steps`` (or is the last) and shows it until the next.

    Args:
        log_every_n_steps: the spec's ``trainer.log_every_n_steps``.
    """

    def __init__(self, log_every_n_steps: int):
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self._loss: float | None = None

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, int | str | float | dict[str, float]]:
        """Lightning's bar items plus the latest log interval's ``train_loss``."""
        items = super().get_metrics(trainer, pl_module)
        step = trainer.global_step
        at_log = step > 0 and (step % self.log_every_n_steps == 0 or step == trainer.max_steps)
        if trainer.training and at_log and "train_loss" in trainer.callback_metrics:
            self._loss = float(trainer.callback_metrics["train_loss"])
        if self._loss is not None:
            items["train_loss"] = f"{self._loss:.4f}"
        return items


class FSDPGradNormClipping(Callback):
    """Clips the global gradient norm of an FSDP model through FSDP's own ``clip_grad_norm_``.

    Lightning's FSDP precision plugin clips by value only (``Trainer(gradient_clip_val=...)``
    with the default ``"norm"`` algorithm raises; https://github.com/Lightning-AI/pytorch-lightning/issues/19235): the norm of sharded
    gradients needs the FSDP module, which reduces the per-shard norms across ranks. Runs after
    gradient accumulation and unscaling, right before each optimizer step.

    Args:
        max_norm: the largest allowed L2 norm of all gradients together.
    """

    def __init__(self, max_norm: float):
        self.max_norm = max_norm

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        """Clip before the step; the FSDP wrapper is ``trainer.strategy.model``."""
        trainer.strategy.model.clip_grad_norm_(self.max_norm)


class RequeueOnSignal(Callback):
    """Checkpoint and requeue a SLURM job when its requeue signal arrives, at a step all ranks agree on.

    SLURM sends ``--signal=<SIG>@<grace_s>`` (pre-emption, time limit) to every task on its own,
    so the ranks receive it at different points of a training step. Lightning's auto-requeue
    handler saves the checkpoint inside the signal handler; that save is collective (a barrier,
    FSDP/DeepSpeed gathers) and one rank's save can meet another rank's gradient all-reduce: the
    job then hangs until SLURM kills it at the time limit, without requeueing (seen on the lab
    cluster in CI). Here the handler only records the signal. At every optimizer step the ranks
    agree whether any of them got it by the step before (an asynchronous all-reduce of one flag
    in a gloo group, read one step later: no device sync, no wait; nothing with one process); if
    so, all ranks save ``hpc_ckpt_<n>.ckpt`` together (written under a hidden name, renamed when
    complete: :func:`jobgen.train.checkpoints.save_checkpoint_atomically`), global rank 0 runs
    ``scontrol requeue <job id>``, and training stops. ``resume: auto`` picks the checkpoint up
    when SLURM starts the job again (SLURM_RESTART_COUNT 1, 2, ...).

    If the requeue command fails, training goes on (the checkpoint stays for a manual resubmit)
    and the next signal tries again.

    Args:
        signum: the signal to catch, e.g. ``signal.SIGUSR2``.
        checkpoint_dir: where ``hpc_ckpt_<n>.ckpt`` is written (n = highest existing + 1, the
            numbering of Lightning's own HPC checkpoints).
        job_id: the SLURM job to requeue (``<array job id>_<task id>`` for array tasks).
        requeue_command: the command the job id is appended to.
    """

    def __init__(
        self,
        signum: signal.Signals,
        checkpoint_dir: Path,
        job_id: str,
        requeue_command: Sequence[str] = ("scontrol", "requeue"),
    ):
        if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job_id):
            raise ValueError(f"not a SLURM job id: {job_id!r}")
        self.signum = signum
        self.checkpoint_dir = checkpoint_dir
        self.job_id = job_id
        self.requeue_command = tuple(requeue_command)
        self.received = False
        """The signal arrived on this rank and has not been acted on yet."""
        self.requeued_at_step: int | None = None
        """The global step of the checkpoint written before a successful requeue."""
        self.on_requeued: Callable[[int], None] | None = None
        """Called on global rank 0 with the step after ``scontrol requeue`` succeeded (the
        ``requeued`` notification), before SLURM's SIGTERM is let through."""
        self.before_requeue: Callable[[int], None] | None = None
        """Called on global rank 0 with the step, its checkpoint written, right before the requeue
        command: SLURM's SIGTERM after a requeue reaches every process of the step at once, helper
        processes too (the trackers end their runs here: ``wandb-core``)."""
        self.requeue_failed: Callable[[int], None] | None = None
        """Called on global rank 0 with the step when the requeue command failed (training goes on)."""
        self._checked_step: int | None = None
        self._group: Any = None
        self._pending: tuple[Any, torch.Tensor] | None = None

    @staticmethod
    def slurm_job_id(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
        """The id ``scontrol requeue`` takes for this job (array tasks: ``<job>_<task>``), or None."""
        if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
            return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
        return environ.get("SLURM_JOB_ID") or None

    def install(self) -> None:
        """Catch the signal in this (main) thread from now on; call before ``Trainer.fit``."""
        signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the main thread: record only, act at the next step end.
        self.received = True

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Create the gloo group the flag travels in (collective: every rank runs this hook)."""
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            self._group = torch.distributed.new_group(backend="gloo")

    def _any_rank_received(self) -> bool:
        """Whether any rank had the signal by the previous step boundary (by this one: 1 process).

        Each step boundary starts an asynchronous MAX all-reduce of this rank's flag in a CPU
        (gloo) group and reads the one started at the previous boundary, which has long finished:
        no device synchronisation and no wait in the training loop. Every rank starts and reads
        the reductions at the same optimizer steps, so all ranks decide at the same step, one
        step after the first signal.
        """
        if self._group is None:
            return self.received
        decided = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            decided = bool(flag.item())
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32)
        work = torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending = (work, flag)
        if decided:
            work.wait()  # leave no reduction in flight across the checkpoint's own collectives
            self._pending = None
        return decided

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Wait for the last flag reduction (every rank started it) before the groups go away."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

    def next_checkpoint_path(self) -> Path:
        """``hpc_ckpt_<n>.ckpt`` with n one above the highest present (1 in an empty dir)."""
        numbers = [
            int(m.group(1))
            for p in (self.checkpoint_dir.iterdir() if self.checkpoint_dir.is_dir() else ())
            if (m := re.fullmatch(r"hpc_ckpt_([0-9]+)\.ckpt", p.name))
        ]
        return self.checkpoint_dir / f"hpc_ckpt_{max(numbers, default=0) + 1}.ckpt"

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After each optimizer step: agree on the signal; checkpoint, requeue and stop if any rank got it."""
        step = trainer.global_step
        if step == self._checked_step:
            return  # still accumulating gradients: not a step boundary
        self._checked_step = step
        if not self._any_rank_received():
            return
        name = signal.Signals(self.signum).name
        if trainer.is_global_zero:
            print(f"requeue: {name} received; saving a checkpoint at step {step} on all ranks", flush=True)
        path = self.next_checkpoint_path() if trainer.is_global_zero else None
        path = trainer.strategy.broadcast(path, src=0)
        save_checkpoint_atomically(trainer, path)  # a kill during the save leaves no half checkpoint to resume
        ok = True
        if trainer.is_global_zero:
            argv = [*self.requeue_command, self.job_id]
            if self.before_requeue is not None:
                self.before_requeue(step)
            # A successful requeue makes SLURM SIGTERM every task at once: hold that signal back
            # on this rank until the requeue is reported (and notified), then let it through.
            with held_back(signal.SIGTERM):
                try:
                    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
                    ok, detail = result.returncode == 0, (result.stderr or result.stdout).strip()
                except (OSError, subprocess.TimeoutExpired) as exc:
                    ok, detail = False, str(exc)
                if ok:
                    print(f"requeue: {' '.join(argv)} done; the next run resumes from {path}", flush=True)
                    if self.on_requeued is not None:
                        self.on_requeued(step)
            if not ok:
                print(
                    f"requeue: {' '.join(argv)} failed ({detail or 'no output'}); training goes on, "
                    f"{path} stays for a resubmit",
                    flush=True,
                )
                if self.requeue_failed is not None:
                    self.requeue_failed(step)
        ok = trainer.strategy.broadcast(ok, src=0)
        self.received = False
        if ok:
            self.requeued_at_step = step
            trainer.should_stop = True
