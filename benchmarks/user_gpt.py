"""jobgen's byte-level GPT written as a user's own LightningModule and LightningDataModule.

What ``benchmarks/user_module_overhead.py`` trains through the ``model: {class_path, init_args}``
/ ``data: {class_path, init_args}`` path, to compare with the built-in ``model: {preset: null,
...}`` + ``data: {format: text}`` path on the same model and data. Nothing here is imported by
jobgen itself; the spec names the classes (``user_gpt.UserGPT``, ``user_gpt.UserByteData``) and
the benchmark's worker runs with this directory first on ``sys.path``, as a user's
``PYTHONPATH`` would put it.

The network, its initialisation, the loss, the AdamW parameter groups and the warmup + cosine
schedule are jobgen's own (:mod:`jobgen.train.model`), reused rather than copied so that the
two paths cannot drift apart: same seed, same init, same steps -> the same losses (the benchmark
prints both). The data module reuses jobgen's byte windows (:class:`ByteTextDataModule`: the
same bins, sampling and ``DistributedSampler``) behind a user-style signature. It declares
``tokens_per_sample`` (= ``block_size``): without it jobgen cannot turn the samples it counts
into tokens and reports tokens/s as ``n/a``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from jobgen.train.data import ByteTextDataModule
from jobgen.train.model import GPT, LitGPT, lr_factor
from jobgen.train.sources import discover_sources


class UserGPT(LightningModule):
    """jobgen's :class:`~jobgen.train.model.GPT` with AdamW (betas 0.9/0.95, decay on Linear
    weight matrices only) and per-step linear warmup + cosine decay to 10%, as
    :class:`~jobgen.train.model.LitGPT` trains it; logs ``train_loss`` and ``lr`` every step and
    ``val_loss`` (nats/byte), as LitGPT does.

    Args:
        n_layer, n_head, d_model, block_size, dropout: the network (see :class:`GPT`).
        lr: peak learning rate, reached after ``warmup_steps``.
        weight_decay: AdamW decoupled weight decay of the Linear weight matrices.
        warmup_steps: linear warmup length in optimizer steps.
        max_steps: end of the cosine decay in optimizer steps.
    """

    def __init__(self, n_layer: int, n_head: int, d_model: int, block_size: int, dropout: float = 0.0,
                 lr: float = 3e-3, weight_decay: float = 0.1, warmup_steps: int = 50, max_steps: int = 1000):
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(n_layer, n_head, d_model, block_size, dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-byte logits ``(B, T, 256)`` for byte ids ``(B, T)``."""
        return self.model(idx)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Cross entropy (nats/byte) of one micro batch ``(x, y)``, each ``(B, T)``."""
        x, y = batch
        loss = LitGPT.loss(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Validation cross entropy, averaged over batches and ranks as ``val_loss``."""
        x, y = batch
        loss = LitGPT.loss(self(x), y)
        self.log("val_loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True)
        return loss

    # LitGPT's groups (they read self.modules() and self.hparams.weight_decay only).
    parameter_groups = LitGPT.parameter_groups

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW over LitGPT's parameter groups, stepped by a per-optimizer-step LambdaLR."""
        hp = self.hparams
        optimizer = torch.optim.AdamW(self.parameter_groups(), lr=hp.lr, betas=(0.9, 0.95))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, hp.warmup_steps, hp.max_steps)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class UserByteData(ByteTextDataModule):
    """Byte windows of local text (jobgen's ``data.format: text`` pipeline) with a user's
    signature: bins under ``data_dir``, ``batch_size`` from jobgen (``trainer.micro_batch_size``).

    Args:
        data_dir: where ``train.bin``, ``val.bin`` and their manifest are built (once).
        block_size: bytes per sample (the model's context length).
        batch_size: samples per micro batch per rank.
        paths: text files or globs (``[]``: the Python standard library, as jobgen's default).
        max_bytes: cap on the bytes read from ``paths``.
        val_fraction: fraction of the bytes held out for validation.
        val_batches: validation micro batches per rank.
        max_steps: optimizer steps of the run (the length of one epoch of windows).
        seed: window sampling seed.
        world_size: data-parallel ranks (samples per step = batch_size x world_size).
    """

    def __init__(self, data_dir: str, block_size: int, batch_size: int = 8, paths: list[str] | None = None,
                 max_bytes: int | None = None, val_fraction: float = 0.05, val_batches: int = 2,
                 max_steps: int = 1000, seed: int = 1337, world_size: int = 1):
        super().__init__(
            discover_sources(paths or [], max_bytes), Path(data_dir), block_size=block_size,
            micro_batch_size=batch_size, gradient_accumulation_steps=1, world_size=world_size,
            max_steps=max_steps, val_fraction=val_fraction, val_batches=val_batches, seed=seed,
        )
        self.tokens_per_sample = block_size
        """Bytes (tokens) per sample: jobgen reports tokens/s only when a module declares this."""
