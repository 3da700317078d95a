"""Byte-level training data: datasets over ``train.bin``/``val.bin`` and a LightningDataModule.

Tokens are raw bytes (vocabulary 256, no tokenizer). The bins are built once per run directory
by :mod:`jobgen.train.sources` (global rank zero; other ranks wait at Lightning's barrier) and
memory-mapped by every rank.

Sampling: training sample ``g`` (a global sample number, counted from the start of the run) is
the window of ``block_size + 1`` bytes at a pseudo-random offset derived from ``(seed, g)``.
The dataset is map-style and sharded by a ``DistributedSampler`` that gives rank ``r`` of ``W``
the indices ``r, r + W, ...``: ranks never overlap. The data module passes that sampler itself,
with ``shuffle=False``, at every world size (1 included) and under every strategy: Lightning's
injected one always shuffles training data with a per-epoch permutation, which a mid-epoch
restart would replay from its start, and Lightning injects it wherever the loader has no
``DistributedSampler`` and the strategy is one it counts as distributed: DDP, FSDP and
DeepSpeed at any world size (so at world size 1 fsdp and deepspeed would read another order
than ddp). The windows are already pseudo-random, so order costs nothing. The sample order is
therefore the same for every strategy and world size (tests/entrypoint/test_sample_order.py).
On resume the dataset starts at the sample the checkpoint recorded
(:func:`jobgen.train.position.consumed_samples`: ``global_step x samples_per_step`` since the
start, as the global batch is kept), so a restarted run trains on exactly the samples an
uninterrupted run would have seen. Each optimizer step takes the next
``samples_per_step`` sample numbers in one contiguous block whatever the world size (rank ``r``
of ``W`` reads every ``W``-th of them), so this holds across a restart at another world size too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from jobgen.specs.training import TrainingSpec
from jobgen.train.position import consumed_samples
from jobgen.train.sources import TextSources, bins_are_current, build_bins

_MASK64 = (1 << 64) - 1

MAX_EPOCH_SAMPLES = 1 << 20
"""Upper bound on samples (over all ranks) in one Lightning epoch. ``DistributedSampler``
materialises its index list, so one epoch is capped; the data loaders are rebuilt every epoch
and continue from the global step."""


def _mix64(x: int) -> int:
    """SplitMix64 finaliser: a fast, platform-independent 64-bit integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def window_offset(seed: int, sample: int, num_bytes: int, block_size: int) -> int:
    """Start offset (bytes) of training sample ``sample`` in a stream of ``num_bytes`` bytes.

    Deterministic in ``(seed, sample)``; uniform over the ``num_bytes - block_size`` positions
    where a ``block_size + 1`` window fits.
    """
    return _mix64((_mix64(seed) + sample) & _MASK64) % (num_bytes - block_size)


def _window(data: np.ndarray, offset: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = torch.from_numpy(np.array(data[offset : offset + block_size + 1], dtype=np.int64))
    return chunk[:-1], chunk[1:]


class TrainWindows(Dataset):
    """Training windows at pseudo-random offsets.

    ``dataset[i]`` is global sample ``start_sample + i``: a pair ``(x, y)`` of int64 tensors of
    shape ``(block_size,)`` where ``y`` is ``x`` shifted left by one byte (next-byte targets).

    Args:
        data: the training bytes, shape ``(num_bytes,)``, dtype uint8 (usually a memmap).
        block_size: context length in tokens (bytes).
        seed: sampling seed (``spec.trainer.seed``).
        num_samples: dataset length (samples in one epoch, over all ranks).
    """

    def __init__(self, data: np.ndarray, block_size: int, seed: int, num_samples: int):
        if len(data) < block_size + 1:
            raise ValueError(f"need at least {block_size + 1} bytes for one window, got {len(data)}")
        self.data = data
        self.block_size = block_size
        self.seed = seed
        self.num_samples = num_samples
        self.start_sample = 0
        """Global sample number of index 0 (set from the global step when training resumes)."""

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        offset = window_offset(self.seed, self.start_sample + index, len(self.data), self.block_size)
        return _window(self.data, offset, self.block_size)


class ValWindows(Dataset):
    """A fixed set of ``num_windows`` evenly spaced validation windows.

    ``dataset[i]`` is ``(x, y)``, int64 tensors of shape ``(block_size,)``; the same windows are
    used at every validation, so validation losses are comparable across steps and runs.

    Args:
        data: the validation bytes, shape ``(num_bytes,)``, dtype uint8.
        block_size: context length in tokens (bytes).
        num_windows: number of windows (micro batches x micro batch size x world size).
    """

    def __init__(self, data: np.ndarray, block_size: int, num_windows: int):
        if len(data) < block_size + 1:
            raise ValueError(f"need at least {block_size + 1} bytes for one window, got {len(data)}")
        last = len(data) - block_size - 1
        self.data = data
        self.block_size = block_size
        self.offsets = [(j * last) // max(num_windows - 1, 1) for j in range(num_windows)]

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _window(self.data, self.offsets[index], self.block_size)


class ByteTextDataModule(LightningDataModule):
    """Local text as bytes: builds ``<run_dir>/data/{train,val}.bin`` once, then memory-maps them.

    Args:
        sources: the files to train on (from :func:`jobgen.train.sources.discover_sources`).
        data_dir: where the bins and their manifest live (``<run_dir>/data``).
        block_size: context length in tokens (bytes).
        micro_batch_size: sequences per rank per forward/backward pass.
        gradient_accumulation_steps: micro batches per optimizer step.
        world_size: number of data-parallel ranks.
        max_steps: optimizer steps of the whole run.
        val_fraction: fraction of the bytes held out for validation.
        val_batches: validation micro batches per rank per validation run.
        seed: sampling seed.
        pin_memory: the loaders pin their batches in page-locked host memory (GPU runs:
            :func:`jobgen.train.speed.pin_memory`), so that Lightning's non-blocking copies to the
            device overlap with compute; off on CPU, where it only costs host time.
    """

    def __init__(
        self,
        sources: TextSources,
        data_dir: Path,
        *,
        block_size: int,
        micro_batch_size: int,
        gradient_accumulation_steps: int,
        world_size: int,
        max_steps: int,
        val_fraction: float,
        val_batches: int,
        seed: int,
        pin_memory: bool = False,
    ):
        super().__init__()
        self.pin_memory = pin_memory
        # Only global rank zero builds the bins (Lightning calls prepare_data there, then barriers).
        self.prepare_data_per_node = False
        self.sources = sources
        self.data_dir = Path(data_dir)
        self.block_size = block_size
        self.micro_batch_size = micro_batch_size
        self.world_size = world_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.samples_per_step = micro_batch_size * gradient_accumulation_steps * world_size
        """Training samples per optimizer step over all ranks (global batch size)."""
        epoch_steps = max(1, min(max_steps, MAX_EPOCH_SAMPLES // self.samples_per_step))
        self.epoch_samples = epoch_steps * self.samples_per_step
        """Training samples per Lightning epoch over all ranks (a multiple of samples_per_step)."""
        self.num_val_windows = val_batches * micro_batch_size * world_size
        self.train_set: TrainWindows | None = None
        self.val_set: ValWindows | None = None

    @classmethod
    def from_spec(
        cls, spec: TrainingSpec, sources: TextSources, run_dir: Path, world_size: int, pin_memory: bool = False
    ) -> ByteTextDataModule:
        """Build the data module for ``spec`` with bins under ``<run_dir>/data`` (``pin_memory``: see the class)."""
        t = spec.trainer
        return cls(
            sources,
            Path(run_dir) / "data",
            block_size=spec.model.block_size,
            micro_batch_size=t.micro_batch_size,
            gradient_accumulation_steps=t.gradient_accumulation_steps,
            world_size=world_size,
            max_steps=t.max_steps,
            val_fraction=spec.data.val_fraction,
            val_batches=t.limit_val_batches,
            seed=t.seed,
            pin_memory=pin_memory,
        )

    def prepare_data(self) -> None:
        """Build the bins unless a matching manifest shows they are current (global rank zero)."""
        if not bins_are_current(self.data_dir, self.sources, self.val_fraction):
            layout = build_bins(self.data_dir, self.sources, self.val_fraction)
            print(
                f"data: wrote {layout.train_bytes:,} train + {layout.val_bytes:,} val bytes from "
                f"{len(self.sources.files)} file(s) of {self.sources.origin} to {self.data_dir}",
                flush=True,
            )

    def setup(self, stage: str) -> None:
        """Memory-map the bins and create the datasets (every rank)."""
        if not bins_are_current(self.data_dir, self.sources, self.val_fraction):
            # This node does not share a file system with global rank zero: build locally.
            build_bins(self.data_dir, self.sources, self.val_fraction)
        train = np.memmap(self.data_dir / "train.bin", dtype=np.uint8, mode="r")
        val = np.memmap(self.data_dir / "val.bin", dtype=np.uint8, mode="r")
        self.train_set = TrainWindows(train, self.block_size, self.seed, self.epoch_samples)
        self.val_set = ValWindows(val, self.block_size, self.num_val_windows)

    def train_dataloader(self) -> DataLoader:
        """Micro batches ``(x, y)`` of shape ``(micro_batch_size, block_size)``, continuing at the
        samples consumed (Lightning reloads this every epoch and after a restore)."""
        assert self.train_set is not None, "setup() must run first"
        trainer = self.trainer
        self.train_set.start_sample = 0 if trainer is None else consumed_samples(trainer, self.samples_per_step)
        return DataLoader(self.train_set, batch_size=self.micro_batch_size, sampler=self._sampler(self.train_set, True),
                          drop_last=True, **self._pin())

    def val_dataloader(self) -> DataLoader:
        """The fixed validation windows in micro batches of ``micro_batch_size`` (rank ``r`` of
        ``W``: windows ``r, r + W, ...``)."""
        assert self.val_set is not None, "setup() must run first"
        return DataLoader(self.val_set, batch_size=self.micro_batch_size, sampler=self._sampler(self.val_set, False),
                          shuffle=False, **self._pin())

    def _sampler(self, dataset: Dataset, drop_last: bool) -> DistributedSampler | None:
        """This rank's indices ``r, r + W, ...`` in order (``shuffle=False``), at EVERY world size,
        1 included: a loader without a ``DistributedSampler`` gets Lightning's own under any
        strategy it counts as distributed, which FSDP and DeepSpeed are at world size 1 too
        (``_DataConnector._requires_distributed_sampler``, Lightning 2.6), and for training that
        one shuffles. ``None`` without a trainer (plain iteration: the same order)."""
        trainer = self.trainer
        if trainer is None:
            return None
        return DistributedSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False,
                                  drop_last=drop_last)

    def _pin(self) -> dict[str, bool]:
        # passed only when on: a CPU run's DataLoader is built exactly as before the lever
        return {"pin_memory": True} if self.pin_memory else {}

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over all ranks."""
        return self.samples_per_step * self.block_size
