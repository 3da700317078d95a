"""A LightningModule for the watchdog's and the restart budget's tests: Lightning's BoringModel
whose chosen rank sleeps in its hooks (slow but advancing, long validation and checkpoint
saves, a slow forward: a straggler) or raises at a chosen step (an exception in user code)."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch.demos.boring_classes import BoringModel


class SlowRankModel(BoringModel):
    """BoringModel; on global rank ``rank``: sleeps ``step_sleep_s`` after every training batch,
    ``validation_sleep_s`` at the end of every validation (the sanity check too) and
    ``checkpoint_sleep_s`` in every checkpoint save, ``forward_sleep_s`` in every training step
    (before the loss is returned: the compute the straggler watch times); raises RuntimeError at
    optimizer step ``raise_at_step`` (every rank when ``rank`` is -1)."""

    def __init__(self, rank: int = 1, step_sleep_s: float = 0.0, validation_sleep_s: float = 0.0,
                 checkpoint_sleep_s: float = 0.0, raise_at_step: int | None = None, forward_sleep_s: float = 0.0):
        super().__init__()
        self.forward_sleep_s = forward_sleep_s
        self.rank, self.step_sleep_s = rank, step_sleep_s
        self.validation_sleep_s, self.checkpoint_sleep_s, self.raise_at_step = validation_sleep_s, checkpoint_sleep_s, raise_at_step

    def _mine(self) -> bool:
        return self.rank in (-1, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self._mine() and self.forward_sleep_s:
            time.sleep(self.forward_sleep_s)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._mine() and self.raise_at_step is not None and self.trainer.global_step >= self.raise_at_step:
            raise RuntimeError(f"user code failed at step {self.trainer.global_step}")
        if self._mine():
            time.sleep(self.step_sleep_s)

    def on_validation_epoch_end(self) -> None:
        if self._mine():
            time.sleep(self.validation_sleep_s)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._mine():
            time.sleep(self.checkpoint_sleep_s)
