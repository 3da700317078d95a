"""A character-level language model: embedding -> GRU -> residual MLP blocks -> logits."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """A residual MLP block (LayerNorm -> Linear -> GELU -> Linear); the unit an FSDP auto-wrap
    policy can name (``trainer.fsdp_auto_wrap_policy: [tinychar.model.Block]``)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class CharModel(LightningModule):
    """Predicts the next character (byte value below ``vocab_size``) of a window.

    Args:
        vocab_size: characters known (bytes >= vocab_size are mapped to vocab_size - 1 by the data).
        d_model: embedding and hidden width.
        n_layer: residual MLP blocks after the GRU.
        lr: AdamW learning rate (this module owns its optimiser; jobgen's trainer.learning_rate
            does not apply).
        weight_decay: AdamW weight decay.
    """

    def __init__(self, vocab_size: int = 128, d_model: int = 64, n_layer: int = 1, lr: float = 3e-3,
                 weight_decay: float = 0.0):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.rnn = nn.GRU(d_model, d_model, batch_first=True)
        self.blocks = nn.ModuleList(Block(d_model) for _ in range(n_layer))
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(x))
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
