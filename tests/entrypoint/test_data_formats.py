"""Token files (.bin, uint16/uint32, memory-mapped) and JSONL instruction masking, in process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from jobgen.errors import ConfigError
from jobgen.train.data import TrainWindows
from jobgen.train.format_data import (
    IGNORE_INDEX,
    TokenDataModule,
    TokenStream,
    check_token_vocab,
    encode_instruction,
    instruction_window,
)
from jobgen.train.formats import discover_token_files, parse_instruction_line


def _write_tokens(directory: Path, dtype: str, arrays: list[np.ndarray], meta: dict | None = None) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, arr in enumerate(arrays):
        path = directory / f"part{i}.bin"
        arr.astype(dtype).tofile(path)
        paths.append(str(path))
    if meta is not None:
        (directory / "meta.json").write_text(json.dumps(meta))
    return paths


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_files_are_memory_mapped_split_and_windows_deterministic(tmp_path: Path, dtype: str) -> None:
    big = 70_000 if dtype == "uint32" else 60_000  # uint32 ids above 65535 must survive
    tokens = (np.arange(3000) * 7919 % big).astype(dtype)
    _write_tokens(tmp_path / "d", dtype, [tokens[:1200], tokens[1200:]], meta={"dtype": dtype, "vocab_size": big})
    files = discover_token_files([str(tmp_path / "d")], None, None, 0.1, block_size=16)
    assert files.dtype == dtype and files.vocab_size == big
    assert files.total_tokens == 3000 and files.val_tokens == 300 and files.train_tokens == 2700

    module = TokenDataModule(files, tmp_path / "data", block_size=16, micro_batch_size=2, gradient_accumulation_steps=1,
                             world_size=1, max_steps=10, val_fraction=0.1, val_batches=2, seed=3)  # fmt: skip
    module.setup("fit")
    arrays = module.train_set.data.arrays
    assert all(isinstance(a, np.memmap) and a.dtype == np.dtype(dtype) for a in arrays)
    for i in (0, 5, 17):  # every window is a contiguous slice of the stream, y = x shifted by one
        x, y = module.train_set[i]
        start = int(np.flatnonzero(tokens == x[0].item())[0])
        assert torch.equal(x, torch.from_numpy(tokens[start : start + 16].astype(np.int64)))
        assert torch.equal(y, torch.from_numpy(tokens[start + 1 : start + 17].astype(np.int64)))
        assert start + 17 <= 2700  # never reaches into the validation tokens
    again = TrainWindows(module.train_set.data, 16, 3, 100)
    assert all(torch.equal(module.train_set[i][0], again[i][0]) for i in range(20))
    other_seed = TrainWindows(module.train_set.data, 16, 4, 100)
    assert not all(torch.equal(module.train_set[i][0], other_seed[i][0]) for i in range(20))
    xv, _ = module.val_set[0]
    assert int(np.flatnonzero(tokens == xv[0].item())[0]) >= 2700  # validation windows from the tail


def test_token_stream_slices_across_files() -> None:
    stream = TokenStream([np.arange(5), np.arange(5, 9), np.arange(9, 12)], start=2, stop=11)
    assert len(stream) == 9
    assert stream[0:9].tolist() == list(range(2, 11))
    assert stream[2:8].tolist() == list(range(4, 10))


def test_token_file_checks(tmp_path: Path) -> None:
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(ConfigError, match="not a whole number of uint16 tokens"):
        discover_token_files([str(tmp_path / "odd.bin")], "uint16", None, 0.1, 8)
    paths = _write_tokens(tmp_path / "nodtype", "uint16", [np.arange(100)])
    with pytest.raises(ConfigError, match="element type .* unknown") as info:
        discover_token_files(paths, None, None, 0.1, 8)
    assert info.value.location == "spec.data.token_dtype"
    paths = _write_tokens(tmp_path / "clash", "uint16", [np.arange(100)], meta={"dtype": "uint32"})
    with pytest.raises(ConfigError, match="spec.data.token_dtype says 'uint16'"):
        discover_token_files(paths, "uint16", None, 0.1, 8)


def test_token_ids_and_declared_vocab_must_fit_the_model(tmp_path: Path) -> None:
    paths = _write_tokens(tmp_path / "a", "uint16", [np.arange(400) % 300])
    files = discover_token_files(paths, "uint16", None, 0.1, 8)
    check_token_vocab(files, 300)
    with pytest.raises(ConfigError, match="token id 299, but the model's vocabulary has 256"):
        check_token_vocab(files, 256)
    declared = discover_token_files(paths, "uint16", 50_000, 0.1, 8)
    with pytest.raises(ConfigError, match="declare vocab_size 50000") as info:
        check_token_vocab(declared, 32_000)
    assert info.value.location == "spec.data.vocab_size"


class _CharTokenizer:
    """A deterministic stand-in tokenizer: one id per character (ord), optional BOS, eos 3."""

    eos_token_id = 3
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}


def test_jsonl_prompt_is_masked_and_response_labels_are_token_ids() -> None:
    record = parse_instruction_line('{"instruction": "Add", "input": "1 2", "output": "3"}', "f.jsonl:1")
    tok = _CharTokenizer()
    prompt = tok(record.prompt())["input_ids"]
    ids, labels = encode_instruction(tok, record, block_size=1000)
    assert ids == prompt + [ord("3"), 3]
    assert labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
    assert labels[len(prompt) :] == [ord("3"), 3]
    assert "### Input:\n1 2" in record.prompt()

    x, y = instruction_window(ids, labels, block_size=len(ids) + 4, pad_id=0)
    assert x.tolist() == ids[:-1] + [0] * 5
    assert y.tolist() == labels[1:] + [IGNORE_INDEX] * 5
    assert (y != IGNORE_INDEX).sum().item() == 2  # only the response (and eos) is learned

    # Truncation that leaves no response token drops the record.
    assert encode_instruction(tok, record, block_size=len(prompt) - 1) is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "f.jsonl:7: not valid JSON"),
        ("[1, 2]", "f.jsonl:7: expected a JSON object, got list"),
        ('{"output": "x"}', "f.jsonl:7: instruction: field 'instruction' is missing"),
        ('{"instruction": "x"}', "f.jsonl:7: output: field 'output' is missing"),
        ('{"instruction": "x", "input": 3, "output": "y"}', "f.jsonl:7: input: field 'input' must be a string"),
        ('{"instruction": "  ", "output": "y"}', "f.jsonl:7: instruction: field 'instruction' is empty"),
    ],
)
def test_malformed_jsonl_lines_name_file_line_and_field(line: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_instruction_line(line, "f.jsonl:7")
    assert f"{info.value.location}: {info.value.message}".startswith(message)
