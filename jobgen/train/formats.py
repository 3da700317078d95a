"""Pre-tokenized token files and JSONL instruction data: discovery and checks without torch.

Like :mod:`jobgen.train.sources`, this module imports neither torch nor numpy, so the
entrypoint rejects bad data (exit 2, file + line + field) before importing the training stack.

``format: tokens``
    Flat little-endian token ids, ``uint16`` or ``uint32``, one or more ``*.bin`` files read in
    sorted path order as one stream (as nanoGPT's ``prepare.py`` writes them). The element type
    comes from ``data.token_dtype`` or from a sidecar ``meta.json`` in the files' directory
    (``{"dtype": "uint16", "vocab_size": 50257}``). The last ``ceil(val_fraction x N)`` tokens of
    the stream are the validation split, the rest the training split.

``format: jsonl``
    One JSON object per line (blank lines skipped) with string fields ``instruction`` (required,
    non-empty), ``input`` (optional) and ``output`` (required): the alpaca layout. Record ``i``
    (0-based over all files in sorted order) is a validation record when
    ``i % val_every == val_every - 1`` with ``val_every = max(2, round(1 / val_fraction))``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jobgen.errors import ConfigError
from jobgen.train.sources import resolve_paths

TOKEN_DTYPES: dict[str, int] = {"uint16": 2, "uint32": 4}
"""Supported token element types -> bytes per token."""

SIDECAR_NAME = "meta.json"
"""Name of the optional sidecar next to token files: ``{"dtype": ..., "vocab_size": ...}``."""

#: The alpaca prompt templates (with and without an ``input``); the response follows directly.
PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def _select(paths: Sequence[str], suffix: str, what: str) -> list[Path]:
    files = [p for p in resolve_paths(paths) if p.name.endswith(suffix)]
    if not files:
        raise ConfigError(
            f"data.paths match no {suffix} files",
            location="spec.data.paths",
            hint=f"point data.paths at {what} ({suffix} files or directories holding them)",
        )
    return files


@dataclass(frozen=True)
class TokenFiles:
    """Token files of ``format: tokens`` and their split.

    Attributes:
        files: ``(absolute path, tokens in the file)`` in read order.
        dtype: ``"uint16"`` or ``"uint32"``.
        vocab_size: declared vocabulary size (spec or sidecar), ``None`` when not declared.
        val_tokens: tokens at the end of the stream held out for validation.
    """

    files: tuple[tuple[str, int], ...]
    dtype: str
    vocab_size: int | None
    val_tokens: int

    @property
    def total_tokens(self) -> int:
        """Tokens in the concatenated stream."""
        return sum(n for _, n in self.files)

    @property
    def train_tokens(self) -> int:
        """Tokens in the training split (the start of the stream)."""
        return self.total_tokens - self.val_tokens

    def describe(self) -> str:
        """One line for the start-up banner."""
        vocab = "undeclared vocab" if self.vocab_size is None else f"vocab {self.vocab_size:,}"
        return (
            f"{self.train_tokens:,} train / {self.val_tokens:,} val tokens ({self.dtype}, {vocab}) from "
            f"{len(self.files)} token file(s)"
        )


def _read_sidecar(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the token sidecar: {exc}", location=str(path)) from None
    if not isinstance(meta, dict):
        raise ConfigError("the token sidecar must be a JSON object", location=str(path),
                          hint='write {"dtype": "uint16", "vocab_size": 50257}')
    return meta


def discover_token_files(
    paths: Sequence[str],
    token_dtype: str | None,
    vocab_size: int | None,
    val_fraction: float,
    block_size: int,
) -> TokenFiles:
    """List and check the ``*.bin`` token files of ``spec.data`` (``format: tokens``).

    Args:
        paths: ``spec.data.paths`` (files, directories, globs; only ``*.bin`` files are used).
        token_dtype: ``spec.data.token_dtype`` or ``None`` (then the sidecar's ``dtype``).
        vocab_size: ``spec.data.vocab_size`` or ``None`` (then the sidecar's, if any).
        val_fraction: fraction of the tokens held out (taken from the end of the stream).
        block_size: context length; each split needs ``block_size + 1`` tokens.

    Raises:
        ConfigError: no ``.bin`` files; no dtype anywhere, or spec and sidecar disagree; a file
            size that is not a whole number of tokens; too few tokens for one window per split.
    """
    files = _select(paths, ".bin", "pre-tokenized token files")
    sidecars = sorted({f.parent / SIDECAR_NAME for f in files if (f.parent / SIDECAR_NAME).is_file()}, key=str)
    dtype, declared = token_dtype, vocab_size
    for sidecar in sidecars:
        meta = _read_sidecar(sidecar)
        side_dtype, side_vocab = meta.get("dtype"), meta.get("vocab_size")
        if side_dtype is not None and side_dtype not in TOKEN_DTYPES:
            raise ConfigError(f"dtype {side_dtype!r} is not supported", location=f"{sidecar}: dtype",
                              hint="use uint16 (vocabularies up to 65536) or uint32")
        if side_dtype is not None:
            if dtype is not None and dtype != side_dtype:
                where = "spec.data.token_dtype" if token_dtype is not None else "another sidecar"
                raise ConfigError(
                    f"dtype {side_dtype!r} here, but {where} says {dtype!r}",
                    location=f"{sidecar}: dtype",
                    hint="make spec.data.token_dtype and every meta.json agree (or drop token_dtype)",
                )
            dtype = side_dtype
        if side_vocab is not None:
            if not isinstance(side_vocab, int) or isinstance(side_vocab, bool) or side_vocab < 1:
                raise ConfigError(f"vocab_size must be a positive integer, got {side_vocab!r}",
                                  location=f"{sidecar}: vocab_size")
            declared = side_vocab if declared is None else max(declared, side_vocab)
    if dtype is None:
        raise ConfigError(
            "the element type of the token files is unknown",
            location="spec.data.token_dtype",
            hint=f"set data.token_dtype (uint16 or uint32), or write {SIDECAR_NAME} with "
            '{"dtype": "uint16"} next to the .bin files',
        )
    itemsize = TOKEN_DTYPES[dtype]
    if declared is not None and dtype == "uint16" and declared > 1 << 16:
        raise ConfigError(f"vocab_size {declared} does not fit in uint16 token files",
                          location="spec.data.vocab_size", hint="encode the tokens as uint32")
    listed: list[tuple[str, int]] = []
    for path in files:
        size = path.stat().st_size
        if size % itemsize:
            raise ConfigError(
                f"{size} bytes is not a whole number of {dtype} tokens ({itemsize} bytes each)",
                location=str(path),
                hint="check data.token_dtype / meta.json dtype, or re-export the file",
            )
        if size:
            listed.append((str(path), size // itemsize))
    total = sum(n for _, n in listed)
    val = min(max(math.ceil(total * val_fraction), 1), total)
    window = block_size + 1
    if total - val < window or val < window:
        raise ConfigError(
            f"too few tokens: {total} tokens give {total - val} train / {val} validation tokens, but each "
            f"split needs at least block_size + 1 = {window}",
            location="spec.data.paths",
            hint="add token files, raise data.val_fraction, or lower model.block_size",
        )
    return TokenFiles(tuple(listed), dtype, declared, val)


@dataclass(frozen=True)
class InstructionRecord:
    """One alpaca-style record of a JSONL file.

    Attributes:
        instruction: the task (non-empty).
        input: optional context (``""`` when absent).
        output: the response the model learns to produce.
        source: ``"<file>:<line>"`` (1-based line) for error messages.
    """

    instruction: str
    input: str
    output: str
    source: str

    def prompt(self) -> str:
        """The alpaca prompt (everything before the response; masked out of the loss)."""
        if self.input:
            return PROMPT_WITH_INPUT.format(instruction=self.instruction, input=self.input)
        return PROMPT_NO_INPUT.format(instruction=self.instruction)


def parse_instruction_line(text: str, source: str) -> InstructionRecord:
    """Parse one JSONL line into an :class:`InstructionRecord`.

    Raises:
        ConfigError: not JSON, not an object, ``instruction``/``output`` missing, a field that is
            not a string, or an empty ``instruction``; located at ``source`` and the field.
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at column {exc.colno}", location=source,
                          hint="write one JSON object per line (JSON Lines)") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"expected a JSON object, got {type(obj).__name__}", location=source,
                          hint='write {"instruction": ..., "input": ..., "output": ...} per line')
    for field, required in (("instruction", True), ("input", False), ("output", True)):
        value = obj.get(field)
        if value is None and required:
            raise ConfigError(f"field {field!r} is missing", location=f"{source}: {field}",
                              hint="each line needs string fields 'instruction' and 'output' ('input' is optional)")
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"field {field!r} must be a string, got {type(value).__name__}",
                              location=f"{source}: {field}")
    if not obj["instruction"].strip():
        raise ConfigError("field 'instruction' is empty", location=f"{source}: instruction")
    return InstructionRecord(obj["instruction"], obj.get("input") or "", obj["output"], source)


@dataclass(frozen=True)
class InstructionFiles:
    """The records of ``format: jsonl`` and their split.

    Attributes:
        files: the JSONL files, in read order.
        train: training records.
        val: validation records.
    """

    files: tuple[str, ...]
    train: tuple[InstructionRecord, ...]
    val: tuple[InstructionRecord, ...]

    def describe(self) -> str:
        """One line for the start-up banner."""
        return f"{len(self.train):,} train / {len(self.val):,} val instruction records from {len(self.files)} JSONL file(s)"


def read_instruction_files(paths: Sequence[str], val_fraction: float) -> InstructionFiles:
    """Read and check every line of the ``*.jsonl`` files of ``spec.data`` (``format: jsonl``).

    Raises:
        ConfigError: no ``.jsonl`` files, an unreadable file or non-UTF-8 text, a malformed line
            (see :func:`parse_instruction_line`), or fewer than one record per split.
    """
    files = _select(paths, ".jsonl", "JSONL instruction data")
    records: list[InstructionRecord] = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, start=1):
                    if line.strip():
                        records.append(parse_instruction_line(line, f"{path}:{lineno}"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"not UTF-8 text: {exc.reason}", location=str(path)) from None
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror or exc}", location=str(path)) from None
    val_every = max(2, round(1.0 / val_fraction))
    train = tuple(r for i, r in enumerate(records) if i % val_every != val_every - 1)
    val = tuple(r for i, r in enumerate(records) if i % val_every == val_every - 1)
    if not train or not val:
        raise ConfigError(
            f"{len(records)} record(s) give {len(train)} train / {len(val)} validation records; each split needs one",
            location="spec.data.paths",
            hint=f"provide at least {val_every} records (every {val_every}th record is held out for validation)",
        )
    return InstructionFiles(tuple(str(f) for f in files), train, val)
