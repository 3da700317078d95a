"""Writing the training image as an OCI image-layout tarball (one reproducible layer: sorted entries,
fixed mtimes, normalised owners and modes) and reading one back with its digests checked
(kubeimage.py builds the root filesystem and calls these). kubeimage.py re-exports the names tests
use.

Standard library only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from imagebase import (
    CONTAINERD_NAME,
    ENV,
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER,
    MEDIA_MANIFEST,
    RECIPE,
    REF_ANNOTATION,
    ImageError,
    Log,
    _stderr,
    source_date_epoch,
)

# --------------------------------------------------------------------------- the layer and the OCI layout


class _HashingWriter(io.RawIOBase):
    """A write-only stream that hashes (sha256) and counts what passes to ``target`` (or nowhere)."""

    def __init__(self, target: BinaryIO | None) -> None:
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += len(view)
        if self.target is not None:
            self.target.write(view)
        return len(view)


def _tar_info(path: Path, name: str, mtime: int) -> tarfile.TarInfo:
    st = path.lstat()
    info = tarfile.TarInfo(name)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        info.mode = 0o1777 if name in ("tmp", "var/tmp") else 0o755
    elif stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    else:
        raise ImageError(f"unexpected file type in the image tree: {path}")
    return info


def _walk_sorted(directory: Path) -> Iterator[Path]:
    """Every entry under ``directory`` depth first, each directory's entries sorted by name and a
    directory right before its contents (symlinks to directories are entries, not followed)."""
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        path = Path(entry.path)
        yield path
        if entry.is_dir(follow_symlinks=False):
            yield from _walk_sorted(path)


def write_layer(root: Path, out: BinaryIO, compress: str = "none", mtime: int | None = None) -> tuple[str, str, int]:
    """Write ``root`` as a layer tarball to ``out``: entries in sorted order (each directory
    before its contents), fixed mtime, uid/gid 0, no names, normalised modes; hard links written
    as regular files. Returns (diff_id, digest, size): the uncompressed tar's sha256, the
    blob's sha256 and its size (equal to the diff_id for ``compress="none"``)."""
    mtime = source_date_epoch() if mtime is None else mtime
    blob = _HashingWriter(out)
    if compress == "gzip":
        # mtime=0 and no file name in the gzip header: the same bytes every time. Level 1: the
        # layer is built on 2 cores and never leaves the machine (the module docstring's figures).
        gz = gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=1, mtime=0, filename="")
        tar_stream: _HashingWriter = _HashingWriter(gz)  # type: ignore[arg-type]
    elif compress == "none":
        gz = None
        tar_stream = blob
    else:
        raise ImageError(f"unknown compression {compress!r} (none, gzip)")
    buffered = io.BufferedWriter(tar_stream, buffer_size=1 << 20)
    with tarfile.open(fileobj=buffered, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk_sorted(root):
            info = _tar_info(path, path.relative_to(root).as_posix(), mtime)
            if info.type == tarfile.REGTYPE:
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    buffered.flush()
    if gz is not None:
        gz.close()
    diff_id = tar_stream.sha.hexdigest()
    return f"sha256:{diff_id}", f"sha256:{blob.sha.hexdigest()}", blob.size


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = len(data), mtime, 0o644, 0, 0, "", ""
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = tarfile.DIRTYPE, mtime, 0o755, 0, 0, "", ""
    tar.addfile(info)


def write_oci_archive(root: Path, archive: Path, ref: str, compress: str = "none",
                      labels: dict[str, str] | None = None, log: Log = _stderr) -> dict[str, Any]:
    """Write ``root`` as a one-layer OCI image layout in a tar file (``oci-layout``,
    ``index.json``, ``blobs/sha256/``) named ``ref``; returns the digests and sizes."""
    mtime = source_date_epoch()
    archive.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.NamedTemporaryFile(dir=archive.parent, prefix=".layer-", delete=False) as tmp:
        layer_path = Path(tmp.name)
        try:
            diff_id, layer_digest, layer_size = write_layer(root, tmp, compress, mtime)  # type: ignore[arg-type]
        except BaseException:
            layer_path.unlink()
            raise
    layer_s = round(time.monotonic() - start, 1)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
    config = {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine()),
        "os": "linux",
        "created": created,
        "config": {"Env": list(ENV), "Cmd": ["python"], "WorkingDir": "/", "Labels": dict(sorted((labels or {}).items()))},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": f"tests/integration/k8s/kubeimage.py recipe {RECIPE}"}],
    }
    config_bytes = _canonical(config)
    config_desc = {"mediaType": MEDIA_CONFIG, "digest": "sha256:" + hashlib.sha256(config_bytes).hexdigest(), "size": len(config_bytes)}
    manifest = {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST, "config": config_desc,
                "layers": [{"mediaType": MEDIA_LAYER[compress], "digest": layer_digest, "size": layer_size}]}
    manifest_bytes = _canonical(manifest)
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [{
        "mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": len(manifest_bytes),
        "platform": {"architecture": config["architecture"], "os": "linux"},
        "annotations": {REF_ANNOTATION: ref, CONTAINERD_NAME: ref}}]}
    blobs = sorted([(config_desc["digest"], config_bytes), (manifest_digest, manifest_bytes), (layer_digest, None)])
    partial = archive.with_name(f".{archive.name}.partial")
    try:
        with partial.open("wb") as fh, tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _add_dir(tar, "blobs", mtime)
            _add_dir(tar, "blobs/sha256", mtime)
            for digest, data in blobs:
                name = f"blobs/sha256/{digest.split(':', 1)[1]}"
                if data is None:
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = layer_size, mtime, 0o644, 0, 0, "", ""
                    with layer_path.open("rb") as layer_fh:
                        tar.addfile(info, layer_fh)
                else:
                    _add_bytes(tar, name, data, mtime)
            _add_bytes(tar, "index.json", _canonical(index), mtime)
            _add_bytes(tar, "oci-layout", _canonical({"imageLayoutVersion": "1.0.0"}), mtime)
        partial.replace(archive)
    finally:
        layer_path.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    log(f"OCI archive {archive} ({archive.stat().st_size / 1e6:.0f} MB, layer {compress} {layer_size / 1e6:.0f} MB "
        f"in {layer_s} s), manifest {manifest_digest}")
    return {"ref": ref, "manifest_digest": manifest_digest, "config_digest": config_desc["digest"], "layer_digest": layer_digest,
            "diff_id": diff_id, "layer_size": layer_size, "archive_size": archive.stat().st_size, "compress": compress,
            "layer_s": layer_s}


# --------------------------------------------------------------------------- reading an archive back


def read_oci_archive(archive: Path, verify: bool = True) -> dict[str, Any]:
    """Parse an OCI layout tarball: index, manifest, config. With ``verify``, every blob's sha256
    and size are checked against its descriptor and the layers' diff_ids against their
    uncompressed contents (raises :class:`ImageError` on a mismatch)."""
    with tarfile.open(archive, "r:") as tar:
        members = {m.name: m for m in tar.getmembers()}

        def blob(digest: str) -> tarfile.TarInfo:
            name = f"blobs/sha256/{digest.split(':', 1)[1]}"
            if name not in members:
                raise ImageError(f"{archive}: {digest} is referenced but not in blobs/")
            return members[name]

        def read(member: tarfile.TarInfo) -> bytes:
            fh = tar.extractfile(member)
            assert fh is not None
            return fh.read()

        layout = json.loads(read(members["oci-layout"]))
        index = json.loads(read(members["index.json"]))
        (entry,) = index["manifests"]
        manifest_bytes = read(blob(entry["digest"]))
        manifest = json.loads(manifest_bytes)
        config_bytes = read(blob(manifest["config"]["digest"]))
        config = json.loads(config_bytes)
        if verify:
            for desc, data in ((entry, manifest_bytes), (manifest["config"], config_bytes)):
                if "sha256:" + hashlib.sha256(data).hexdigest() != desc["digest"] or len(data) != desc["size"]:
                    raise ImageError(f"{archive}: blob {desc['digest']} does not match its descriptor")
            for desc, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
                fh = tar.extractfile(blob(desc["digest"]))
                assert fh is not None
                plain = _HashingWriter(None)
                packed = hashlib.sha256()
                raw = io.BufferedReader(_TeeReader(fh, packed), 1 << 20)  # type: ignore[arg-type]
                stream: Any = gzip.GzipFile(fileobj=raw) if desc["mediaType"].endswith("+gzip") else raw
                while block := stream.read(1 << 20):
                    plain.write(block)
                size = raw.raw.size  # type: ignore[attr-defined]
                if "sha256:" + packed.hexdigest() != desc["digest"] or size != desc["size"]:
                    raise ImageError(f"{archive}: layer blob {desc['digest']} does not match its descriptor")
                if "sha256:" + plain.sha.hexdigest() != diff_id:
                    raise ImageError(f"{archive}: layer {desc['digest']}'s uncompressed sha256 is not its diff_id {diff_id}")
    return {"layout": layout, "index": index, "manifest": manifest, "config": config, "members": sorted(members)}


class _TeeReader(io.RawIOBase):
    """Reads from ``source`` and feeds every byte read into ``sha`` (counting them)."""

    def __init__(self, source: BinaryIO, sha: Any) -> None:
        self.source, self.sha, self.size = source, sha, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        self.sha.update(data)
        self.size += len(data)
        buffer[: len(data)] = data
        return len(data)
