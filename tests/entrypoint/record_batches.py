"""``python -m jobgen.train`` with one callback added: it records the training batches this rank sees.

Usage (every rank, e.g. under ``torch.distributed.run``)::

    python tests/entrypoint/record_batches.py OUT_DIR --spec spec.json --run-dir run

The entrypoint runs unchanged (its own ``main``); only ``jobgen.train.run.build_trainer`` is
wrapped so that the Trainer it builds also carries :class:`RecordBatches`, which writes
``OUT_DIR/rank<global rank>.pt`` when training ends: ``{"step": int64 (n,), "x": int64 (n, B, T)}``,
the optimizer step (``trainer.global_step``) at which each micro batch started and the batch's
inputs as the training step receives them (``x`` of jobgen's ``(x, y)``; a tensor batch whole). Used by tests/entrypoint/test_sample_order.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback


class RecordBatches(Callback):
    """Keep ``(global_step, batch[0])`` of every training micro batch; save them at the end of fit."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.steps: list[int] = []
        self.inputs: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.steps.append(trainer.global_step)
        x = batch[0] if isinstance(batch, (list, tuple)) else batch  # jobgen's (x, y) or a user's tensor
        self.inputs.append(x.detach().cpu().clone())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        torch.save({"step": torch.tensor(self.steps, dtype=torch.int64), "x": torch.stack(self.inputs)},
                   self.out / f"rank{trainer.global_rank}.pt")


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]).resolve(), argv[1:]
    import jobgen.train.run as run

    build = run.build_trainer

    def build_trainer(*args: Any, **kwargs: Any) -> Any:
        trainer, checkpoint, logger = build(*args, **kwargs)
        trainer.callbacks.insert(0, RecordBatches(out))
        return trainer, checkpoint, logger

    run.build_trainer = build_trainer
    from jobgen.train.__main__ import main as entrypoint

    return entrypoint(rest)


if __name__ == "__main__":
    from jobgen.train.__main__ import exit_process

    exit_process(main(sys.argv[1:]))  # as ``python -m jobgen.train`` ends: no interpreter teardown after training
