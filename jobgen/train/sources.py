"""Training text sources: find the files, split their bytes into ``train.bin`` / ``val.bin``.

This module imports neither torch nor numpy, so the entrypoint can check a spec's data
section (and fail with exit 2) before it pays for importing the training stack.

Layout of the byte stream: the selected files are read in sorted path order and concatenated
(after the ``max_bytes`` cap). The stream is cut into *split blocks* of ``split_block_bytes``
(64 KiB, smaller for small inputs so that validation gets at least one block); every
``val_every``-th block (block index ``j`` with ``j % val_every == val_every - 1``) goes to
``val.bin``, all others to ``train.bin``. Same inputs -> byte-identical files.
"""

from __future__ import annotations

import glob
import json
import os
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobgen.errors import ConfigError
from jobgen.jobdir.files import write_atomic

SPLIT_BLOCK_BYTES = 64 * 1024
"""Size of the whole blocks the train/val split is made of (bytes)."""

MANIFEST_VERSION = 1
_READ_CHUNK_BYTES = 1 << 20
_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class SourceFile:
    """One input file and how many of its bytes are used.

    Attributes:
        path: absolute path.
        size: file size in bytes when it was listed.
        used: bytes taken from the start of the file (``< size`` only for the file that hits
            ``max_bytes``).
    """

    path: str
    size: int
    used: int


@dataclass(frozen=True)
class SplitLayout:
    """How the concatenated byte stream is divided into train and validation bytes.

    Attributes:
        total_bytes: length of the concatenated stream (bytes).
        split_block_bytes: size of each split block (bytes); the last block may be shorter.
        val_every: every ``val_every``-th block goes to validation.
        train_bytes: bytes in ``train.bin``.
        val_bytes: bytes in ``val.bin``.
    """

    total_bytes: int
    split_block_bytes: int
    val_every: int
    train_bytes: int
    val_bytes: int

    def is_val_block(self, index: int) -> bool:
        """Whether split block ``index`` (0-based) belongs to the validation set."""
        return index % self.val_every == self.val_every - 1


@dataclass(frozen=True)
class TextSources:
    """The files a run trains on, after sorting, de-duplication and the ``max_bytes`` cap.

    Attributes:
        origin: human-readable description (``"spec.data.paths"`` or the stdlib directory).
        files: the files, in read order.
        max_bytes: the cap that was applied (``None``: no cap).
    """

    origin: str
    files: tuple[SourceFile, ...]
    max_bytes: int | None

    @property
    def total_bytes(self) -> int:
        """Bytes in the concatenated stream."""
        return sum(f.used for f in self.files)


def stdlib_python_files() -> list[Path]:
    """All ``*.py`` files of the running interpreter's standard library, sorted.

    Directories named ``site-packages``/``dist-packages`` (third-party code) and
    ``__pycache__`` are skipped.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
        found.extend(Path(dirpath, name) for name in filenames if name.endswith(".py"))
    return sorted(found, key=str)


def _walk_files(directory: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(directory):
        # Hidden directories (.git, .venv, ...) hold binaries and caches, not training text.
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        for name in filenames:
            if not name.startswith("."):
                yield Path(dirpath, name)


def resolve_paths(patterns: Sequence[str], cwd: Path | None = None) -> list[Path]:
    """Expand files, directories (recursively) and glob patterns into a sorted list of files.

    Relative entries are resolved against ``cwd`` (default: the current directory); ``~`` is
    expanded. Hidden files and directories inside a directory entry are skipped. The result is
    de-duplicated and sorted by absolute path, so it does not depend on the order of
    ``patterns`` or of the file system.

    Raises:
        ConfigError: an entry matches nothing (names the entry).
    """
    base = Path.cwd() if cwd is None else cwd
    files: set[Path] = set()
    for i, pattern in enumerate(patterns):
        expanded = os.path.expanduser(pattern)
        absolute = expanded if os.path.isabs(expanded) else str(base / expanded)
        if _GLOB_CHARS & set(pattern):
            matches = [Path(m) for m in glob.glob(absolute, recursive=True)]
        else:
            matches = [Path(absolute)] if os.path.exists(absolute) else []
        hits: list[Path] = []
        for match in matches:
            if match.is_dir():
                hits.extend(_walk_files(match))
            elif match.is_file():
                hits.append(match)
        if not hits:
            raise ConfigError(
                f"{pattern!r} matches no files (looked for {absolute})",
                location=f"spec.data.paths[{i}]",
                hint="give existing text files, directories or glob patterns; relative paths are "
                "resolved against the job's working directory. Leave data.paths empty to train on "
                "the Python standard library source",
            )
        files.update(p.resolve() for p in hits)
    return sorted(files, key=str)


def discover_sources(paths: Sequence[str], max_bytes: int | None, cwd: Path | None = None) -> TextSources:
    """List the training files for ``spec.data`` and apply the ``max_bytes`` cap.

    Args:
        paths: ``spec.data.paths``; empty selects the interpreter's stdlib ``*.py`` files.
        max_bytes: cap on the concatenated bytes (files in sorted order), or ``None``.
        cwd: directory relative paths are resolved against (default: current directory).

    Raises:
        ConfigError: nothing matched, or the matched files are empty.
    """
    if paths:
        origin = "spec.data.paths"
        candidates = resolve_paths(paths, cwd)
    else:
        origin = f"Python standard library ({sysconfig.get_paths()['stdlib']})"
        candidates = stdlib_python_files()
    chosen: list[SourceFile] = []
    remaining = max_bytes
    for path in candidates:
        if remaining is not None and remaining <= 0:
            break
        size = path.stat().st_size
        if size == 0:
            continue
        used = size if remaining is None else min(size, remaining)
        chosen.append(SourceFile(str(path), size, used))
        if remaining is not None:
            remaining -= used
    sources = TextSources(origin=origin, files=tuple(chosen), max_bytes=max_bytes)
    if sources.total_bytes == 0:
        raise ConfigError(
            f"the training files hold no bytes ({len(candidates)} file(s) matched, all empty)",
            location="spec.data.paths",
            hint="point data.paths at non-empty text files",
        )
    return sources


def split_layout(total_bytes: int, val_fraction: float) -> SplitLayout:
    """Compute the deterministic block split of a ``total_bytes`` stream.

    ``val_every = max(2, round(1 / val_fraction))``; the split block is 64 KiB, or
    ``total_bytes // val_every`` when that is smaller, so at least one block is held out.
    """
    val_every = max(2, round(1.0 / val_fraction))
    block = max(1, min(SPLIT_BLOCK_BYTES, total_bytes // val_every))
    n_blocks = -(-total_bytes // block)
    val_bytes = 0
    for j in range(val_every - 1, n_blocks, val_every):
        val_bytes += min(block, total_bytes - j * block)
    return SplitLayout(total_bytes, block, val_every, total_bytes - val_bytes, val_bytes)


def check_enough_bytes(layout: SplitLayout, block_size: int, origin: str) -> None:
    """Require room for at least one ``block_size + 1`` window in both splits.

    Raises:
        ConfigError: too little text (states how much is needed).
    """
    window = block_size + 1
    if layout.train_bytes < window or layout.val_bytes < window:
        need = window * layout.val_every
        raise ConfigError(
            f"too little training text: {layout.total_bytes} bytes from {origin} give "
            f"{layout.train_bytes} train / {layout.val_bytes} validation bytes, but each split needs at "
            f"least block_size + 1 = {window} bytes",
            location="spec.data",
            hint=f"provide at least {need} bytes of text (raise data.max_bytes or add files), "
            "or lower model.block_size",
        )


def _manifest_inputs(sources: TextSources, val_fraction: float) -> dict:
    return {
        "version": MANIFEST_VERSION,
        "files": [[f.path, f.size, f.used] for f in sources.files],
        "max_bytes": sources.max_bytes,
        "val_fraction": val_fraction,
    }


def bins_are_current(data_dir: Path, sources: TextSources, val_fraction: float) -> bool:
    """Whether ``data_dir`` already holds train/val bins built from exactly these inputs.

    Compares the manifest (paths, sizes, bytes used, ``max_bytes``, ``val_fraction``) and the
    sizes of both bins.
    """
    try:
        manifest = json.loads((data_dir / "manifest.json").read_text())
        return (
            manifest.get("inputs") == _manifest_inputs(sources, val_fraction)
            and (data_dir / "train.bin").stat().st_size == manifest["train_bytes"]
            and (data_dir / "val.bin").stat().st_size == manifest["val_bytes"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def build_bins(data_dir: Path, sources: TextSources, val_fraction: float) -> SplitLayout:
    """Write ``train.bin`` and ``val.bin`` (raw uint8 bytes) plus ``manifest.json``.

    Each file is written to a temporary name and renamed into place (``os.replace``), the
    manifest last, so a crash or a concurrent builder never leaves a half-written file under
    the final name. Safe to call from several processes at once: all write identical bytes.

    Returns:
        the layout that was written.
    """
    layout = split_layout(sources.total_bytes, val_fraction)
    data_dir.mkdir(parents=True, exist_ok=True)
    suffix = f".tmp.{os.getpid()}"
    tmp_train = data_dir / f".train.bin{suffix}"
    tmp_val = data_dir / f".val.bin{suffix}"
    position = 0
    try:
        with open(tmp_train, "wb") as train_out, open(tmp_val, "wb") as val_out:
            for source in sources.files:
                left = source.used
                with open(source.path, "rb") as src:
                    while left > 0:
                        chunk = src.read(min(_READ_CHUNK_BYTES, left))
                        if not chunk:
                            raise ConfigError(
                                f"{source.path} shrank while it was read ({source.size} bytes listed)",
                                hint="do not modify the training files while a job prepares its data",
                            )
                        left -= len(chunk)
                        view = memoryview(chunk)
                        while view:
                            block_index, in_block = divmod(position, layout.split_block_bytes)
                            take = min(len(view), layout.split_block_bytes - in_block)
                            out = val_out if layout.is_val_block(block_index) else train_out
                            out.write(view[:take])
                            view = view[take:]
                            position += take
        os.replace(tmp_train, data_dir / "train.bin")
        os.replace(tmp_val, data_dir / "val.bin")
    finally:
        for tmp in (tmp_train, tmp_val):
            tmp.unlink(missing_ok=True)
    manifest = {
        "inputs": _manifest_inputs(sources, val_fraction),
        "origin": sources.origin,
        "total_bytes": layout.total_bytes,
        "split_block_bytes": layout.split_block_bytes,
        "val_every": layout.val_every,
        "train_bytes": layout.train_bytes,
        "val_bytes": layout.val_bytes,
    }
    write_atomic(data_dir / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return layout
