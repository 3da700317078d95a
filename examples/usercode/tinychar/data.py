"""Character windows from text files (default: this package's own source, always present)."""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset


class Windows(Dataset):
    """``count`` windows of ``block_size + 1`` characters at evenly spread offsets of ``data``;
    sample i is (x, y) = (window[:-1], window[1:])."""

    def __init__(self, data: torch.Tensor, block_size: int, count: int):
        if len(data) <= block_size + 1:
            raise ValueError(f"{len(data)} characters are too few for block_size {block_size}")
        self.data, self.block_size, self.count = data, block_size, count
        self.stride = max(1, (len(data) - block_size - 1) // count)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (i * self.stride) % (len(self.data) - self.block_size - 1)
        window = self.data[start : start + self.block_size + 1]
        return window[:-1], window[1:]


class CharDataModule(LightningDataModule):
    """Character windows for :class:`tinychar.CharModel`; 90% of the text trains, 10% validates.

    Args:
        paths: text files to read (``[]``: the ``.py`` files of this package).
        block_size: characters per window (tokens per sample: ``tokens_per_sample``).
        batch_size: windows per micro batch per rank (jobgen passes trainer.micro_batch_size).
        vocab_size: characters above ``vocab_size - 1`` are clipped to it.
        train_samples: windows per training epoch (over all ranks).
        val_samples: windows in the validation set.
    """

    def __init__(self, paths: list[str] | None = None, block_size: int = 64, batch_size: int = 16, vocab_size: int = 128,
                 train_samples: int = 4096, val_samples: int = 256):
        super().__init__()
        self.paths = list(paths or [])
        self.block_size = block_size
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self.train_samples = train_samples
        self.val_samples = val_samples
        self.tokens_per_sample = block_size
        """Characters (tokens) per sample: jobgen reports tokens/s from it."""

    def _text(self) -> bytes:
        files = [Path(p) for p in self.paths] or sorted(Path(__file__).parent.glob("*.py"))
        return b"\n".join(f.read_bytes() for f in files)

    def setup(self, stage: str) -> None:
        data = torch.tensor(list(self._text()), dtype=torch.long).clamp_(max=self.vocab_size - 1)
        cut = int(len(data) * 0.9)
        self.train_set = Windows(data[:cut], self.block_size, self.train_samples)
        self.val_set = Windows(data[cut:], self.block_size, self.val_samples)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)
