"""Training data: source discovery, the deterministic train/val split, windows and sharding."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from jobgen.errors import ConfigError
from jobgen.train.data import ByteTextDataModule, TrainWindows, ValWindows, window_offset
from jobgen.train.sources import (
    SPLIT_BLOCK_BYTES,
    bins_are_current,
    build_bins,
    check_enough_bytes,
    discover_sources,
    resolve_paths,
    split_layout,
)


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _corpus(tmp_path: Path, n_files: int = 5, size: int = 70_000) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n_files):
        _write(tmp_path / "corpus" / f"f{i}.txt", rng.integers(32, 127, size, dtype=np.uint8).tobytes())
    return tmp_path / "corpus"


def _unsplit(train: bytes, val: bytes, block: int, val_every: int) -> bytes:
    """Re-interleave the split blocks into the original stream."""
    out, t, v, j = bytearray(), 0, 0, 0
    while t < len(train) or v < len(val):
        if j % val_every == val_every - 1:
            out += val[v : v + block]
            v += block
        else:
            out += train[t : t + block]
            t += block
        j += 1
    return bytes(out)


def test_split_is_deterministic_disjoint_and_complete(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path, n_files=5, size=200_000)
    sources = discover_sources([str(corpus)], max_bytes=None)
    stream = b"".join(Path(f.path).read_bytes() for f in sources.files)
    layout_a = build_bins(tmp_path / "a", sources, val_fraction=0.25)
    layout_b = build_bins(tmp_path / "b", sources, val_fraction=0.25)
    assert layout_a == layout_b
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    train = (tmp_path / "a" / "train.bin").read_bytes()
    val = (tmp_path / "a" / "val.bin").read_bytes()
    # 16 blocks of 64 KiB (the last one partial); blocks 3, 7, 11 and 15 are validation.
    assert (layout_a.split_block_bytes, layout_a.val_every) == (SPLIT_BLOCK_BYTES, 4)
    assert len(val) == 3 * SPLIT_BLOCK_BYTES + (1_000_000 - 15 * SPLIT_BLOCK_BYTES)
    assert val[:SPLIT_BLOCK_BYTES] == stream[3 * SPLIT_BLOCK_BYTES : 4 * SPLIT_BLOCK_BYTES]
    # Disjoint and complete: every byte of the stream is in exactly one split, by whole blocks.
    assert len(train) + len(val) == len(stream) == 1_000_000
    assert _unsplit(train, val, layout_a.split_block_bytes, layout_a.val_every) == stream


def test_small_inputs_still_get_a_validation_block() -> None:
    layout = split_layout(10_000, val_fraction=0.05)
    assert layout.val_every == 20
    assert layout.split_block_bytes == 500
    assert layout.val_bytes == 500 and layout.train_bytes == 9_500


def test_large_inputs_use_64_kib_blocks() -> None:
    layout = split_layout(100 * SPLIT_BLOCK_BYTES, val_fraction=0.05)
    assert layout.split_block_bytes == SPLIT_BLOCK_BYTES
    assert layout.val_bytes == 5 * SPLIT_BLOCK_BYTES


def test_stdlib_default_finds_text_and_excludes_site_packages() -> None:
    sources = discover_sources([], max_bytes=None)
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    paths = [Path(f.path) for f in sources.files]
    assert len(paths) > 500
    assert all(p.suffix == ".py" for p in paths)
    assert all(stdlib in p.resolve().parents for p in paths)
    assert not any(part in ("site-packages", "dist-packages") for p in paths for part in p.parts)
    assert any(p.name == "os.py" and p.parent.resolve() == stdlib for p in paths)
    assert paths == sorted(paths, key=str)
    assert sources.total_bytes > 5_000_000
    text = Path(sources.files[0].path).read_bytes()[: sources.files[0].used].decode("utf-8", "replace")
    assert text.strip()


def test_max_bytes_caps_the_stream_in_sorted_file_order(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path, n_files=3, size=10_000)
    sources = discover_sources([str(corpus)], max_bytes=15_000)
    assert sources.total_bytes == 15_000
    assert [Path(f.path).name for f in sources.files] == ["f0.txt", "f1.txt"]
    assert [f.used for f in sources.files] == [10_000, 5_000]


def test_paths_matching_nothing_give_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'no/such/\*\.txt' matches no files") as info:
        discover_sources(["no/such/*.txt"], max_bytes=None, cwd=tmp_path)
    assert info.value.location == "spec.data.paths[0]"
    assert "data.paths" in (info.value.hint or "")


def test_too_little_text_gives_a_clear_error(tmp_path: Path) -> None:
    _write(tmp_path / "small.txt", b"x" * 1000)
    sources = discover_sources(["small.txt"], max_bytes=None, cwd=tmp_path)
    layout = split_layout(sources.total_bytes, 0.05)
    with pytest.raises(ConfigError, match="too little training text"):
        check_enough_bytes(layout, block_size=256, origin=sources.origin)


def test_only_empty_files_give_a_clear_error(tmp_path: Path) -> None:
    _write(tmp_path / "empty.txt", b"")
    with pytest.raises(ConfigError, match="hold no bytes"):
        discover_sources(["empty.txt"], max_bytes=None, cwd=tmp_path)


def test_resolve_paths_files_dirs_globs_sorted_deduplicated(tmp_path: Path) -> None:
    _write(tmp_path / "b" / "z.txt", b"z")
    _write(tmp_path / "b" / "sub" / "y.md", b"y")
    _write(tmp_path / "b" / ".git" / "objects" / "pack", b"binary")
    _write(tmp_path / "b" / ".hidden.txt", b"h")
    _write(tmp_path / "a.txt", b"a")
    found = resolve_paths(["b", "*.txt", str(tmp_path / "b" / "z.txt")], cwd=tmp_path)
    names = [p.relative_to(tmp_path).as_posix() for p in found]
    assert names == ["a.txt", "b/sub/y.md", "b/z.txt"]


def test_bins_are_reused_until_an_input_changes(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path, n_files=2, size=20_000)
    sources = discover_sources([str(corpus)], max_bytes=None)
    data_dir = tmp_path / "data"
    assert not bins_are_current(data_dir, sources, 0.05)
    build_bins(data_dir, sources, 0.05)
    assert bins_are_current(data_dir, sources, 0.05)
    assert not bins_are_current(data_dir, sources, 0.1)  # another split
    assert not any(p.name.startswith(".") for p in data_dir.iterdir())  # no temporary files left
    _write(corpus / "f1.txt", b"changed")
    assert not bins_are_current(data_dir, discover_sources([str(corpus)], max_bytes=None), 0.05)


def test_train_windows_are_deterministic_next_byte_pairs() -> None:
    data = np.arange(1000, dtype=np.int64).astype(np.uint8)
    ds = TrainWindows(data, block_size=16, seed=7, num_samples=100)
    x, y = ds[5]
    assert x.shape == y.shape == (16,) and x.dtype == torch.int64
    torch.testing.assert_close(x[1:], y[:-1])
    again = TrainWindows(data, block_size=16, seed=7, num_samples=100)[5]
    torch.testing.assert_close(again[0], x)
    other_seed = TrainWindows(data, block_size=16, seed=8, num_samples=100)
    assert any(not torch.equal(other_seed[i][0], ds[i][0]) for i in range(10))


def test_window_offsets_cover_the_whole_range() -> None:
    offsets = [window_offset(1337, i, num_bytes=100, block_size=10) for i in range(5000)]
    assert min(offsets) == 0 and max(offsets) == 89  # last window: bytes 89..99


def test_start_sample_continues_the_sample_sequence() -> None:
    data = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)
    fresh = TrainWindows(data, block_size=32, seed=1, num_samples=400)
    resumed = TrainWindows(data, block_size=32, seed=1, num_samples=400)
    resumed.start_sample = 160
    for i in range(20):
        torch.testing.assert_close(resumed[i][0], fresh[160 + i][0])


def test_distributed_sampler_shards_without_overlap() -> None:
    data = np.zeros(1000, dtype=np.uint8)
    ds = TrainWindows(data, block_size=8, seed=0, num_samples=64)
    shards = [
        list(DistributedSampler(ds, num_replicas=2, rank=r, shuffle=False, drop_last=True)) for r in range(2)
    ]
    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(64))


def test_validation_windows_are_fixed_and_spread_over_val_bytes() -> None:
    data = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8)
    ds = ValWindows(data, block_size=64, num_windows=8)
    assert len(ds) == 8
    assert ds.offsets[0] == 0 and ds.offsets[-1] == 10_000 - 65
    torch.testing.assert_close(ds[3][0], ValWindows(data, block_size=64, num_windows=8)[3][0])


def test_data_module_builds_bins_and_batches(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path, n_files=2, size=40_000)
    sources = discover_sources([str(corpus)], max_bytes=None)
    dm = ByteTextDataModule(
        sources,
        tmp_path / "run" / "data",
        block_size=32,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        world_size=1,
        max_steps=10,
        val_fraction=0.1,
        val_batches=3,
        seed=0,
    )
    dm.prepare_data()
    dm.setup("fit")
    assert sorted(os.listdir(tmp_path / "run" / "data")) == ["manifest.json", "train.bin", "val.bin"]
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 32)
    assert len(dm.train_dataloader()) == 10 * 2  # one epoch = the whole run: max_steps x accumulation
    assert len(dm.val_dataloader()) == 3
    assert dm.tokens_per_step == 4 * 32 * 2
