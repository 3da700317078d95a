"""A per-user cache of data derived from jobgen's static inputs, so a render does not redo work
whose inputs have not changed: the Kubeflow CRD schemas parsed from YAML, Jinja's compiled
templates and the template include graph.

What may be cached: values computed from file *contents* that the key covers completely (a
sha256 of the bytes, plus a format version). Never a rendered file, a plan or the result of a
check on one: those depend on the spec and profile and are computed every time.

Where: ``$JOBGEN_CACHE_DIR``, else ``$XDG_CACHE_HOME/jobgen``, else ``~/.cache/jobgen`` (XDG
Base Directory spec). ``JOBGEN_CACHE_DIR=off`` turns the cache off. The cache is optional: a
directory that cannot be created or written, or an entry that cannot be read or parsed, is a
miss and the value is computed as without a cache; no error reaches the user. Entries are
written atomically (a reader never sees half an entry). Deleting the directory is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2

#: Bumped when the layout or the meaning of an entry changes: old entries are then never read.
FORMAT = "1"
OFF = "off"


def cache_dir() -> Path | None:
    """The cache directory, or ``None`` when the cache is off (``JOBGEN_CACHE_DIR=off``)."""
    explicit = os.environ.get("JOBGEN_CACHE_DIR")
    if explicit == OFF:
        return None
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jobgen"


def content_key(*parts: str | bytes) -> str:
    """sha256 (hex) over ``parts`` and :data:`FORMAT`, each part length-prefixed (no two
    different part lists give the same key)."""
    digest = hashlib.sha256(FORMAT.encode())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; any OSError is swallowed (the cache is optional)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def cached_json(namespace: str, key: str, compute: Callable[[], Any]) -> Any:
    """The JSON value stored under ``namespace/key``, or ``compute()`` (stored for next time).

    ``compute()`` must return plain JSON data (dicts, lists, strings, numbers, booleans, None)
    that depends only on what ``key`` covers. Exceptions from ``compute`` propagate and nothing
    is stored.
    """
    directory = cache_dir()
    if directory is None:
        return compute()
    path = directory / namespace / f"{key}.json"
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        pass
    value = compute()
    _write(path, json.dumps(value, separators=(",", ":")).encode())
    return value


class TemplateBytecodeCache(jinja2.BytecodeCache):
    """Jinja's compiled templates under ``<cache dir>/jinja2``.

    Jinja keys an entry by the template's name and file name and checks a checksum of its source
    before using it, so an edited template is compiled again. Unreadable or unwritable entries
    are misses (unlike ``jinja2.FileSystemBytecodeCache``, which raises on a failed write).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, bucket: jinja2.bccache.Bucket) -> Path:
        return self.directory / f"{bucket.key}-py{content_key(jinja2.__version__)[:12]}.cache"

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            with open(self._path(bucket), "rb") as fh:
                bucket.load_bytecode(fh)
        except Exception:  # noqa: BLE001 - unreadable or corrupt (pickle, marshal, I/O): a miss
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        import io

        buffer = io.BytesIO()
        bucket.write_bytecode(buffer)
        _write(self._path(bucket), buffer.getvalue())


def template_bytecode_cache() -> TemplateBytecodeCache | None:
    """The bytecode cache for the Jinja Environment, or ``None`` when the cache is off."""
    directory = cache_dir()
    return None if directory is None else TemplateBytecodeCache(directory / "jinja2")
