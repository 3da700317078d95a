"""Datasets and data modules for pre-tokenized token files and JSONL instruction data.

Both follow the byte-level data module's contract (:mod:`jobgen.train.data`): a batch is
``(x, y)``, int64 tensors of shape ``(B, T)`` with ``T = block_size``, where ``y[t]`` is the
target for the prediction made at ``x[:, :t+1]``; training sample ``g`` (counted from the start
of the run) depends only on ``(seed, g)``; ranks take disjoint indices through a
``DistributedSampler`` (``shuffle=False``, passed by the byte module's loaders at every world
size, so the order is the same under every strategy); after a restart the dataset continues at the
sample the checkpoint recorded (:func:`jobgen.train.position.consumed_samples`). Targets equal to ``-100`` are ignored by the loss.

Tokens: windows of ``block_size + 1`` tokens at pseudo-random offsets of the training part of
the memory-mapped stream (numpy ``memmap``, nothing copied); fixed, evenly spaced validation
windows.

Instructions: each record becomes ``prompt ids + response ids + eos``; the labels are ``-100``
over the prompt and the token ids over the response, truncated to ``block_size + 1`` and
right-padded (pad positions: label ``-100``; causal attention keeps them from affecting earlier
positions). Training sample ``g`` is record ``hash(seed, g) mod n`` (sampling with
replacement, deterministic).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from jobgen.errors import ConfigError
from jobgen.train.data import _MASK64, ByteTextDataModule, TrainWindows, ValWindows, _mix64
from jobgen.train.formats import InstructionFiles, InstructionRecord, TokenFiles

IGNORE_INDEX = -100
"""Label value the loss ignores (``torch.nn.functional.cross_entropy``'s default)."""


class TokenStream:
    """Several 1-D token arrays (usually memmaps) seen as one, restricted to ``[start, stop)``.

    Supports ``len()`` and contiguous slicing (``stream[a:b]`` -> a new ``np.ndarray`` holding
    the tokens, copied only where a slice spans two files), which is all the window datasets use.

    Args:
        arrays: the token arrays, in stream order.
        start, stop: the token range of the concatenated stream this view exposes
            (``stop=None``: to the end).
    """

    def __init__(self, arrays: Sequence[np.ndarray], start: int = 0, stop: int | None = None):
        self.arrays = list(arrays)
        self.bounds = np.cumsum([0] + [len(a) for a in self.arrays]).tolist()
        total = self.bounds[-1]
        self.start = start
        self.stop = total if stop is None else stop
        if not 0 <= self.start <= self.stop <= total:
            raise ValueError(f"range [{start}, {stop}) outside a stream of {total} tokens")

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("TokenStream supports contiguous slices only")
        a, b, _ = key.indices(len(self))
        a, b = self.start + a, self.start + max(a, b)
        pieces = []
        for i, arr in enumerate(self.arrays):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            if hi <= a or lo >= b:
                continue
            pieces.append(arr[max(a, lo) - lo : min(b, hi) - lo])
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=self.arrays[0].dtype)


def open_token_stream(files: TokenFiles) -> TokenStream:
    """Memory-map every token file (read-only) as one :class:`TokenStream` over all tokens."""
    return TokenStream([np.memmap(path, dtype=files.dtype, mode="r") for path, _ in files.files])


def max_token_id(files: TokenFiles, chunk_tokens: int = 1 << 24) -> int:
    """Largest token id in the files (one read pass, ``chunk_tokens`` at a time)."""
    stream = open_token_stream(files)
    best = 0
    for a in range(0, len(stream), chunk_tokens):
        best = max(best, int(stream[a : a + chunk_tokens].max()))
    return best


def check_token_vocab(files: TokenFiles, model_vocab: int) -> None:
    """Require the token files to fit the model's vocabulary.

    Raises:
        ConfigError: the declared ``vocab_size`` exceeds ``model_vocab``, or a token id is
            ``>= model_vocab`` (an embedding lookup would fail or read garbage).
    """
    if files.vocab_size is not None and files.vocab_size > model_vocab:
        raise ConfigError(
            f"the token files declare vocab_size {files.vocab_size}, but the model's vocabulary has "
            f"{model_vocab} entries",
            location="spec.data.vocab_size",
            hint="encode the data with the model's own tokenizer (or pick the model that matches the data)",
        )
    top = max_token_id(files)
    if top >= model_vocab:
        raise ConfigError(
            f"the token files hold token id {top}, but the model's vocabulary has {model_vocab} entries",
            location="spec.data.paths",
            hint="encode the data with the model's own tokenizer, or check data.token_dtype",
        )


class TokenDataModule(ByteTextDataModule):
    """``format: tokens``: windows over memory-mapped token files (see the module docstring).

    Batch arithmetic, sharding and resume are :class:`ByteTextDataModule`'s; only the source
    of the windows differs (no bins are built: the token files are mapped in place).

    Args:
        files: the checked token files (:func:`jobgen.train.formats.discover_token_files`).
        data_dir: unused (kept for the parent's signature).
        **kwargs: the parent's keyword arguments (block_size, micro_batch_size, ...).
    """

    def __init__(self, files: TokenFiles, data_dir: Path, **kwargs: Any):
        super().__init__(None, data_dir, **kwargs)  # type: ignore[arg-type]
        self.files = files

    def prepare_data(self) -> None:
        """Nothing to prepare: the token files are used as they are."""

    def setup(self, stage: str) -> None:
        """Memory-map the token files and create the datasets (every rank)."""
        stream = open_token_stream(self.files)
        train = TokenStream(stream.arrays, 0, self.files.train_tokens)
        val = TokenStream(stream.arrays, self.files.train_tokens, None)
        self.train_set = TrainWindows(train, self.block_size, self.seed, self.epoch_samples)  # type: ignore[arg-type]
        self.val_set = ValWindows(val, self.block_size, self.num_val_windows)  # type: ignore[arg-type]


def encode_instruction(
    tokenizer: Any, record: InstructionRecord, block_size: int
) -> tuple[list[int], list[int]] | None:
    """Token ids and labels of one record, at most ``block_size + 1`` long.

    ``ids = prompt + response + [eos]`` (prompt encoded with the tokenizer's special tokens,
    response without; eos only if the tokenizer has one); ``labels`` equals ``ids`` except
    ``-100`` at every prompt position. Prompt and response are encoded separately, so the
    boundary is exact.

    Returns:
        ``(ids, labels)``, or ``None`` when truncation leaves no response token to learn.
    """
    prompt = list(tokenizer(record.prompt(), add_special_tokens=True)["input_ids"])
    response = list(tokenizer(record.output, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response.append(int(tokenizer.eos_token_id))
    ids = (prompt + response)[: block_size + 1]
    labels = ([IGNORE_INDEX] * len(prompt) + response)[: block_size + 1]
    if all(label == IGNORE_INDEX for label in labels[1:]):
        return None
    return ids, labels


def instruction_window(
    ids: Sequence[int], labels: Sequence[int], block_size: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of shape ``(block_size,)``: ``x = ids[:-1]`` padded with ``pad_id``,
    ``y = labels[1:]`` padded with ``-100`` (next-token targets, prompt masked)."""
    x = list(ids[:-1])[:block_size]
    y = list(labels[1:])[:block_size]
    x += [pad_id] * (block_size - len(x))
    y += [IGNORE_INDEX] * (block_size - len(y))
    return torch.tensor(x, dtype=torch.int64), torch.tensor(y, dtype=torch.int64)


class InstructionSamples(Dataset):
    """Training samples over encoded records: ``dataset[i]`` is global sample ``start_sample + i``,
    the window of record ``hash(seed, start_sample + i) mod len(examples)``.

    Args:
        examples: ``(ids, labels)`` per record (from :func:`encode_instruction`).
        block_size: sequence length of ``x`` and ``y``.
        pad_id: token id used to pad ``x``.
        seed: sampling seed.
        num_samples: dataset length (samples in one epoch, over all ranks).
    """

    def __init__(self, examples: Sequence[tuple[list[int], list[int]]], block_size: int, pad_id: int, seed: int,
                 num_samples: int):
        if not examples:
            raise ValueError("no examples")
        self.examples = examples
        self.block_size = block_size
        self.pad_id = pad_id
        self.seed = seed
        self.num_samples = num_samples
        self.start_sample = 0
        """Global sample number of index 0 (set from the global step when training resumes)."""

    def record_index(self, sample: int) -> int:
        """Record used for global sample ``sample`` (deterministic in ``(seed, sample)``)."""
        return _mix64((_mix64(self.seed) + sample) & _MASK64) % len(self.examples)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, labels = self.examples[self.record_index(self.start_sample + index)]
        return instruction_window(ids, labels, self.block_size, self.pad_id)


class InstructionVal(Dataset):
    """The first ``num_windows`` validation records (all of them if fewer), in file order."""

    def __init__(self, examples: Sequence[tuple[list[int], list[int]]], block_size: int, pad_id: int,
                 num_windows: int):
        self.examples = list(examples[:num_windows])
        self.block_size = block_size
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, labels = self.examples[index]
        return instruction_window(ids, labels, self.block_size, self.pad_id)


def _encode_all(tokenizer: Any, records: Sequence[InstructionRecord], block_size: int, split: str
                ) -> tuple[list[tuple[list[int], list[int]]], int]:
    encoded, dropped = [], 0
    for record in records:
        pair = encode_instruction(tokenizer, record, block_size)
        if pair is None:
            dropped += 1
        else:
            encoded.append(pair)
    if not encoded:
        raise ConfigError(
            f"every {split} record's prompt fills the whole block_size: no response token is left to learn",
            location="spec.model.block_size",
            hint="raise model.block_size or shorten the prompts",
        )
    return encoded, dropped


class InstructionDataModule(ByteTextDataModule):
    """``format: jsonl``: alpaca records, prompt masked out of the loss (see the module docstring).

    Records are encoded once, on construction (every rank; deterministic). Records whose prompt
    leaves no response token within ``block_size + 1`` are dropped (counted in ``dropped``).

    Args:
        records: the checked records (:func:`jobgen.train.formats.read_instruction_files`).
        tokenizer: a Hugging Face tokenizer (``__call__`` -> ``input_ids``, ``eos_token_id``,
            ``pad_token_id``).
        data_dir: unused (kept for the parent's signature).
        **kwargs: the parent's keyword arguments (block_size, micro_batch_size, ...).
    """

    def __init__(self, records: InstructionFiles, tokenizer: Any, data_dir: Path, **kwargs: Any):
        super().__init__(None, data_dir, **kwargs)  # type: ignore[arg-type]
        self.records = records
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.train_examples, dropped_train = _encode_all(tokenizer, records.train, self.block_size, "training")
        self.val_examples, dropped_val = _encode_all(tokenizer, records.val, self.block_size, "validation")
        self.dropped = dropped_train + dropped_val
        """Records dropped because truncation left no response token."""

    def prepare_data(self) -> None:
        """Nothing to prepare: records were encoded on construction."""

    def setup(self, stage: str) -> None:
        """Create the datasets (every rank)."""
        self.train_set = InstructionSamples(  # type: ignore[assignment]
            self.train_examples, self.block_size, self.pad_id, self.seed, self.epoch_samples
        )
        self.val_set = InstructionVal(  # type: ignore[assignment]
            self.val_examples, self.block_size, self.pad_id, self.num_val_windows
        )
