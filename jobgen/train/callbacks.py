"""Callbacks of the entrypoint: throughput measurement and line-per-interval progress."""

from __future__ import annotations

import datetime
import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn


class Throughput(Callback):
    """Measures training throughput in tokens/s over all ranks and logs it as ``tokens_per_s``.

    Tokens per optimizer step = micro batch size x block size x gradient accumulation steps x
    world size. Time is measured between consecutive optimizer steps on each rank; the first
    step of a process (start-up, allocation) is excluded from the mean.

    Args:
        tokens_per_step: tokens per optimizer step over all ranks.
    """

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.steps_timed = 0
        """Optimizer steps included in the mean."""
        self.seconds_timed = 0.0
        """Wall time of those steps (seconds)."""
        self.last_tokens_per_s: float | None = None
        """Throughput of the latest optimizer step (tokens/s)."""
        self.seconds_per_step: float | None = None
        """Mean wall time per optimizer step so far (seconds)."""
        self._start_step: int | None = None
        self._last_step: int | None = None
        self._last_time = 0.0
        self._val_started: float | None = None

    @property
    def mean_tokens_per_s(self) -> float | None:
        """Mean throughput over the timed steps (tokens/s over all ranks), ``None`` if none."""
        if self.steps_timed == 0 or self.seconds_timed <= 0:
            return None
        return self.steps_timed * self.tokens_per_step / self.seconds_timed

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start the clock at the step the run begins (or resumes) at."""
        self._start_step = self._last_step = trainer.global_step
        self._last_time = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After each optimizer step: time it and log ``tokens_per_s``."""
        step = trainer.global_step
        if self._last_step is None or step == self._last_step:
            return  # still accumulating gradients
        now = time.perf_counter()
        elapsed, steps = now - self._last_time, step - self._last_step
        first = self._last_step == self._start_step
        self._last_step, self._last_time = step, now
        if elapsed <= 0:
            return
        self.last_tokens_per_s = steps * self.tokens_per_step / elapsed
        pl_module.log("tokens_per_s", self.last_tokens_per_s, on_step=True, on_epoch=False)
        if first:
            return  # the first step carries start-up costs
        self.steps_timed += steps
        self.seconds_timed += elapsed
        self.seconds_per_step = self.seconds_timed / self.steps_timed

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Pause the clock: validation time is not training throughput."""
        self._val_started = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Resume the clock after validation."""
        if self._val_started is not None and trainer.state.fn == TrainerFn.FITTING:
            self._last_time += time.perf_counter() - self._val_started
        self._val_started = None


def _format_eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class LineProgress(Callback):
    """Prints one line per log interval on global rank zero (for jobs whose output is a file).

    Format: ``step 120/1000 | train_loss 2.4512 | lr 2.91e-03 | 23.4k tok/s | eta 0:03:12``,
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
        parts = [f"step {step}/{trainer.max_steps}"]
        if "train_loss" in metrics:
            parts.append(f"train_loss {float(metrics['train_loss']):.4f}")
        if "lr" in metrics:
            parts.append(f"lr {float(metrics['lr']):.2e}")
        if self.throughput.last_tokens_per_s is not None:
            parts.append(f"{self.throughput.last_tokens_per_s / 1000:.1f}k tok/s")
        if self.throughput.seconds_per_step is not None:
            parts.append(f"eta {_format_eta((trainer.max_steps - step) * self.throughput.seconds_per_step)}")
        print(" | ".join(parts), flush=True)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the validation loss (not for the sanity check before training)."""
        if trainer.is_global_zero and not trainer.sanity_checking and "val_loss" in trainer.callback_metrics:
            val_loss = float(trainer.callback_metrics["val_loss"])
            print(f"validation at step {trainer.global_step}: val_loss {val_loss:.4f}", flush=True)


class FSDPGradNormClipping(Callback):
    """Clips the global gradient norm of an FSDP model through FSDP's own ``clip_grad_norm_``.

    Lightning's FSDP precision plugin clips by value only (``Trainer(gradient_clip_val=...)``
    with the default ``"norm"`` algorithm raises; Lightning issue #19235): the norm of sharded
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
