#!/usr/bin/env python3
"""The training image the Kubernetes pod lab runs, built from this repository without a registry
or docker: an OCI image-layout tarball that ``ctr -n k8s.io images import`` accepts.

What is in it (one layer, a root filesystem assembled on this machine):

- the Python interpreter that runs this module (its base installation, ``sys.base_prefix``:
  pyenv's 3.11 on the dev machine) at /usr/local, with its standard library minus the test
  suite, IDLE, tkinter, ensurepip and the host's site-packages; ``python``/``python3`` on PATH;
- ``jobgen[train]`` with the torch of examples/image/constraints.txt (the CPU wheel the machine's
  pip configuration finds), installed by pip with ``--prefix`` from a wheel of this work tree
  (non-editable) and the package index, the versions held to that constraints file (the one the
  shipped recipe, examples/image/Containerfile, installs with): no dev-venv copy, so nothing of
  mlflow/wandb/docs tools rides along;
- the host's shared libraries all of it needs, found with ``ldd`` on every ELF file of the tree
  (glibc, libstdc++, libgcc_s, libssl, ...), and ``/bin/sh`` (dash), the one program besides
  Python, for the libraries that shell out. Not a Debian rootfs: the ldd closure is 30 libraries,
  16 MB, found in ~5 s, where ``debootstrap --variant=minbase bookworm`` took 59 s and 206 MB
  (before any Python package), needs the mirror, and brings a second libc build beside the one
  the interpreter was built against;
- /etc/passwd and /etc/group (root, nobody), /etc/hosts (localhost; the kubelet mounts its
  own), /tmp (1777), /root (HOME), mount points /proc /sys /dev /dev/shm /etc/jobgen.

Reproducible: files are written to the layer in sorted order with mtime ``SOURCE_DATE_EPOCH``
(default 0), uid/gid 0 and no user or group names, normalised modes; bytecode is compiled once
with ``--invalidation-mode unchecked-hash`` (no source mtimes inside) and in-image file names
(``-s``/``-p``); pip's ``direct_url.json`` (which names the host's wheel path) is dropped and
console-script shebangs point at /usr/local/bin/python3.11. Two builds from the same inputs give
the same bytes (test_kubeimage.py checks it on the small variant; the full image, built twice by
hand in separate directories, gave the same 1.37 GB archive). The interpreter's own binaries keep
the build-time prefix (RUNPATH, compiled-in PREFIX): the host's bytes, unused in the image.

The layer is an uncompressed tar by default: the archive never leaves the machine, and on 2
shared cores CPU is what is short. Measured on the full image (AMD EPYC, 2 cores, loaded):
writing the layer 19 s uncompressed, 30 s with gzip level 1 (1.37 GB -> 436 MB); ``ctr images
import`` 26 s uncompressed vs 32 s gzip (containerd 1.6.20). ``--compress gzip`` saves ~0.9 GB
of disk per copy (archive, containerd's content store) for that CPU.

Cached in ``$JOBGEN_K8S_CACHE/image/<key>/`` (default /var/cache/jobgen-k8s, the directory
kubelab.py uses), the key a hash of the inputs: this recipe, jobgen's source files (setup.cfg,
pyproject.toml, README.md, jobgen/, templates/, cluster_profiles/), the requirements (setup.cfg's
``train`` extra and the torch pin) and the constraints file, the interpreter's version and binary,
the host's libc. The packages the constraints file pins get its versions; the others (their
dependencies) whatever the index resolves when the key is first built (recorded in
BUILD-INFO.json and the image's labels); delete the cache entry to rebuild.

By hand:

    python tests/integration/k8s/kubeimage.py build --out DIR     # -> DIR/jobgen-train-<tag>.oci.tar
    python tests/integration/k8s/kubeimage.py smoke                # build (cached) + runc checks
    ctr -n k8s.io images import DIR/jobgen-train-<tag>.oci.tar     # on a node: jobgen.local/train:<tag>

Standard library only at import (jobgen is imported, lazily, to render the smoke test's spec).
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

REPO = Path(__file__).resolve().parents[3]
#: Bump when the recipe changes: a cached image of another recipe is rebuilt.
RECIPE = 2
CACHE_ENV = "JOBGEN_K8S_CACHE"
DEFAULT_CACHE = Path("/var/cache/jobgen-k8s")
IMAGE_NAME = "jobgen.local/train"
#: The versions pip installs (``pip install -c``): the list the shipped recipe,
#: examples/image/Containerfile, installs with (tests/unit/test_image_recipe.py checks both).
CONSTRAINTS = REPO / "examples" / "image" / "constraints.txt"


def _torch_pin(constraints: Path = CONSTRAINTS) -> str:
    """The ``torch==<version>`` line of ``constraints``."""
    match = re.search(r"^torch==(\S+)\s*$", constraints.read_text(), re.M)
    if match is None:
        raise RuntimeError(f"{constraints} pins no torch==<version>")
    return f"torch=={match.group(1)}"


#: The CPU build of the constraints' torch (this machine's pip finds the local +cpu wheel for it;
#: see the README's CPU path).
TORCH_PIN = _torch_pin()
EXTRA = "train"
#: Files of the repository that make up the jobgen wheel (setup.cfg's package_dir and data).
SOURCE_PATHS = ("setup.cfg", "pyproject.toml", "README.md", "jobgen", "templates", "cluster_profiles")
#: Top-level stdlib directories left out: the test suite, GUI and installer bits, the host's
#: third-party packages, the static library and build config.
STDLIB_SKIP_TOP = frozenset({"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages"})
#: Nested test packages of the stdlib (ctypes/test, unittest/test, ...), left out too.
STDLIB_SKIP_NESTED = frozenset({"test", "tests", "idle_test"})
#: lib-dynload modules left out: CPython's own test modules and tkinter's binding (needs Tk).
DYNLOAD_SKIP = re.compile(r"^(_test|_ctypes_test|_xxtestfuzz|xxlimited|_tkinter)")
#: Libraries loaded with dlopen (ldd cannot see them) that glibc or torch may need.
DLOPEN_LIBS = ("libgcc_s.so.1",)
MULTIARCH = "x86_64-linux-gnu"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = {"none": "application/vnd.oci.image.layer.v1.tar", "gzip": "application/vnd.oci.image.layer.v1.tar+gzip"}
REF_ANNOTATION = "org.opencontainers.image.ref.name"
#: containerd's own name annotation; ``ctr images import`` prefers it to the OCI ref name.
CONTAINERD_NAME = "io.containerd.image.name"
#: The smoke containers' hostname (a pod's is its name).
HOSTNAME = "jobgen-smoke"
ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1")

Log = Callable[[str], None]


class ImageError(RuntimeError):
    """The image cannot be built or does not run; the message says which step and why."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- inputs and cache


def cache_dir() -> Path:
    """``$JOBGEN_K8S_CACHE`` or /var/cache/jobgen-k8s (shared with kubelab.py); images under ``image/``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def source_date_epoch() -> int:
    """The layer's file mtimes and the config's ``created``: ``$SOURCE_DATE_EPOCH`` or 0."""
    return int(os.environ.get("SOURCE_DATE_EPOCH") or 0)


def source_files(repo: Path = REPO) -> list[Path]:
    """The repository files the jobgen wheel is built from, sorted (no caches, no egg-info)."""
    found: list[Path] = []
    for name in SOURCE_PATHS:
        path = repo / name
        if path.is_file():
            found.append(path)
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.endswith(".egg-info"))
            found.extend(Path(dirpath, f) for f in filenames if not f.endswith((".pyc", ".pyo")))
    return sorted(found)


def requirements(repo: Path = REPO, extra: str | None = EXTRA) -> list[str]:
    """The packages pip installs beside jobgen: setup.cfg's ``extra`` (comments dropped) and the torch pin."""
    if extra is None:
        return []
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(repo / "setup.cfg")
    lines = [line.split("#", 1)[0].strip() for line in cfg["options.extras_require"][extra].splitlines()]
    return [line for line in lines if line] + [TORCH_PIN]


def base_python() -> Path:
    """The interpreter the image carries: the base installation of the one running this module."""
    return Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_inputs(repo: Path = REPO, variant: str = "full") -> dict[str, Any]:
    """What the image is a function of; its hash is the cache key (and the image tag's suffix)."""
    source = hashlib.sha256()
    for path in source_files(repo):
        source.update(path.relative_to(repo).as_posix().encode() + b"\0")
        source.update(hashlib.sha256(path.read_bytes()).digest())
    return {
        "recipe": RECIPE,
        "variant": variant,
        "jobgen_source_sha256": source.hexdigest(),
        "requirements": requirements(repo, EXTRA if variant == "full" else None),
        "constraints": (repo / CONSTRAINTS.relative_to(REPO)).read_text() if variant == "full" else None,
        "python": platform.python_version(),
        "python_binary_sha256": _sha256_file(base_python()),
        "libc": "-".join(platform.libc_ver()),
        "machine": platform.machine(),
        "source_date_epoch": source_date_epoch(),
    }


def inputs_key(inputs: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of :func:`build_inputs`."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def jobgen_version(repo: Path = REPO) -> str:
    """jobgen's ``__version__`` read from the source (no import)."""
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)', (repo / "jobgen" / "__init__.py").read_text(), re.M)
    return match.group(1) if match else "0"


def image_tag(inputs: dict[str, Any], repo: Path = REPO) -> str:
    """``<jobgen version>-<first 12 hex of the key>`` (``-small`` for the small variant)."""
    suffix = "" if inputs["variant"] == "full" else f"-{inputs['variant']}"
    return f"{jobgen_version(repo)}-{inputs_key(inputs)[:12]}{suffix}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(argv: list[str], log: Log, timeout: float = 1800, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (lowest CPU priority), raising :class:`ImageError` with its output's tail."""
    argv = ["nice", "-n", "19", *map(str, argv)]
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"timed out after {timeout} s: {' '.join(argv)}") from exc
    if proc.returncode != 0:
        raise ImageError(f"exit {proc.returncode}: {' '.join(argv)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    log(f"  {time.monotonic() - start:.1f} s: {' '.join(argv[3:])[:160]}")
    return proc


# --------------------------------------------------------------------------- the root filesystem


def _copy_stdlib(src: Path, dst: Path) -> None:
    def ignore(directory: str, names: list[str]) -> set[str]:
        here = Path(directory)
        skipped = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))}
        if here == src:
            skipped |= {n for n in names if n in STDLIB_SKIP_TOP or n.startswith("config-")}
        elif here.name == "lib-dynload":
            skipped |= {n for n in names if DYNLOAD_SKIP.match(n)}
        else:
            skipped |= {n for n in names if n in STDLIB_SKIP_NESTED and (here / n).is_dir()}
        return skipped

    shutil.copytree(src, dst, symlinks=True, ignore=ignore)


def _install_interpreter(root: Path, log: Log) -> None:
    prefix = Path(sys.base_prefix)
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    usr_local = root / "usr" / "local"
    (usr_local / "bin").mkdir(parents=True)
    (usr_local / "lib").mkdir(parents=True)
    shutil.copy2(base_python(), usr_local / "bin" / f"python{ver}")
    for alias in ("python3", "python"):
        (usr_local / "bin" / alias).symlink_to(f"python{ver}")
    libpython = prefix / "lib" / f"libpython{ver}.so.1.0"
    if libpython.exists():  # a shared-library build (pyenv's is)
        shutil.copy2(libpython, usr_local / "lib" / libpython.name)
    _copy_stdlib(prefix / "lib" / f"python{ver}", usr_local / "lib" / f"python{ver}")
    (usr_local / "lib" / f"python{ver}" / "site-packages").mkdir()
    # sysconfig's build-time data names the host prefix: point it at the image's.
    for data in (usr_local / "lib" / f"python{ver}").glob("_sysconfigdata_*.py"):
        data.write_text(data.read_text().replace(str(prefix), "/usr/local"))
    log(f"interpreter {platform.python_version()} from {prefix}")


def _build_wheel(repo: Path, work: Path, log: Log) -> Path:
    """A jobgen wheel from a copy of :func:`source_files` (the work tree stays untouched)."""
    src = work / "src"
    for path in source_files(repo):
        target = src / path.relative_to(repo)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    # This interpreter's setuptools when it can build the wheel (seconds), else pip's isolated build.
    isolation = ["--no-build-isolation"] if _has_setuptools_70() else []
    _run([sys.executable, "-m", "pip", "wheel", *isolation, "--no-deps", "-q", "-w", work / "wheel", src], log)
    (wheel,) = (work / "wheel").glob("jobgen-*.whl")
    return wheel


def _has_setuptools_70() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return tuple(int(p) for p in setuptools.__version__.split(".")[:2]) >= (70, 1)


def _pip_install(root: Path, wheel: Path, reqs: list[str], log: Log) -> None:
    """pip (this interpreter's) installs the wheel, its ``train`` extra and the torch pin into the
    tree's /usr/local, held to :data:`CONSTRAINTS`; ``--ignore-installed`` so nothing counts as
    present because the host has it."""
    target = ["-c", CONSTRAINTS, f"{wheel}[{EXTRA}]", TORCH_PIN] if reqs else ["--no-deps", str(wheel)]
    argv = [sys.executable, "-m", "pip", "install", "-q", "--ignore-installed", "--no-compile", "--no-warn-script-location",
            "--prefix", root / "usr" / "local", *target]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    _run(argv, log, env=env)


def _fix_installed(root: Path) -> None:
    """Drop what names the host (direct_url.json, the installing interpreter in shebangs)."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "usr" / "local" / "lib" / f"python{ver}" / "site-packages"
    for direct in sorted(site.glob("*.dist-info/direct_url.json")):
        direct.unlink()
        record = direct.parent / "RECORD"
        if record.exists():
            lines = [line for line in record.read_text().splitlines(keepends=True) if not line.startswith(f"{direct.parent.name}/direct_url.json,")]
            record.write_text("".join(lines))
    shebang = re.compile(rb"^#![^\n]*python[0-9.]*[^\n]*\n")
    for script in sorted((root / "usr" / "local" / "bin").iterdir()):
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(b"#!") and shebang.match(data) and not data.startswith(f"#!/usr/local/bin/python{ver}".encode()):
            script.write_bytes(shebang.sub(f"#!/usr/local/bin/python{ver}\n".encode(), data, count=1))


def _elf_files(root: Path) -> list[Path]:
    found = []
    for dirpath, _dirs, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                continue
            with path.open("rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    found.append(path)
    return sorted(found)


_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+|not found)\s*(?:\(0x[0-9a-f]+\))?\s*$")


def _add_shared_libraries(root: Path, log: Log) -> list[str]:
    """Copy into the tree every host library its ELF files load (ldd, with the tree's own
    /usr/local/lib first), plus :data:`DLOPEN_LIBS`; returns the copied paths. A library
    already in the tree (torch/lib, numpy.libs, ...: found through $ORIGIN) is not copied."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(root / "usr" / "local" / "lib"))
    needed: set[str] = set()
    missing: dict[str, set[str]] = {}
    elves = _elf_files(root)
    for elf in elves:
        proc = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode != 0:  # "not a dynamic executable" (static), or an ELF ldd refuses
            continue
        for line in proc.stdout.splitlines():
            match = _LDD_LINE.match(line)
            if not match:
                continue
            name, path = match.groups()
            if path == "not found":
                missing.setdefault(name or "?", set()).add(str(elf.relative_to(root)))
            elif not Path(path).resolve().is_relative_to(root.resolve()):
                needed.add(path)
    for lib in DLOPEN_LIBS:
        needed.add(f"/lib/{MULTIARCH}/{lib}")
    copied = []
    for path in sorted(needed):
        dest = root / path.lstrip("/")
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), dest)  # the file itself, under the name the loader asks for
        copied.append(path)
    log(f"shared libraries: {len(copied)} copied from the host for {len(elves)} ELF files")
    if missing:
        log("  not found (optional plugins; listed for the record): "
            + "; ".join(f"{n} <- {sorted(w)[0]}" for n, w in sorted(missing.items())))
    return copied


def _add_system_files(root: Path) -> None:
    """usrmerge links, /bin/sh, the /etc files, the empty directories a container needs."""
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / target).mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(target)
    shutil.copy2(os.path.realpath("/bin/sh"), root / "usr" / "bin" / "sh")
    etc = root / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    (etc / "ld.so.conf").write_text(f"/usr/local/lib\n/lib/{MULTIARCH}\n/usr/lib/{MULTIARCH}\n")
    for directory in ("tmp", "root", "proc", "sys", "dev", "dev/shm", "etc/jobgen", "var/tmp"):
        (root / directory).mkdir(parents=True, exist_ok=True)


def _compile_bytecode(root: Path, log: Log) -> list[str]:
    """Compile every .py once, in-image file names, hash-based (no mtimes): reproducible, and
    nothing is compiled again at run time. Files this interpreter cannot parse (torch ships
    Python 3.12-only test helpers) stay uncompiled; returns their in-image paths."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    lib = root / "usr" / "local" / "lib" / f"python{ver}"
    argv = ["nice", "-n", "19", str(base_python()), "-I", "-m", "compileall", "-q", "-j", "1", "--invalidation-mode", "unchecked-hash",
            "-s", str(root), "-p", "/", "-x", r"/(test|tests)/|bad_coding|badsyntax", str(lib)]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"})
    failed = sorted("/" + Path(m).relative_to(root).as_posix() for m in re.findall(r"^\*\*\* Error compiling '([^']+)'", proc.stdout, re.M))
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not failed):
        raise ImageError(f"compileall exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    log(f"  {time.monotonic() - start:.1f} s: bytecode compiled; not compilable by {platform.python_version()}: {failed or 'none'}")
    return failed


def _ldconfig(root: Path, log: Log) -> None:
    """/etc/ld.so.cache for the tree (the loader then finds /usr/local/lib without LD_LIBRARY_PATH)."""
    _run(["ldconfig", "-r", root, "-X"], log)


def build_rootfs(root: Path, repo: Path = REPO, variant: str = "full", log: Log = _stderr) -> dict[str, Any]:
    """Assemble the image's file tree under ``root`` (which must not exist); returns what went in."""
    root.mkdir(parents=True)
    timings: dict[str, float] = {}
    start = time.monotonic()
    _add_system_files(root)
    _install_interpreter(root, log)
    timings["interpreter_s"] = round(time.monotonic() - start, 1)
    with tempfile.TemporaryDirectory(prefix="kubeimage-wheel-") as tmp:
        t = time.monotonic()
        wheel = _build_wheel(repo, Path(tmp), log)
        reqs = requirements(repo, EXTRA if variant == "full" else None)
        _pip_install(root, wheel, reqs, log)
        timings["pip_s"] = round(time.monotonic() - t, 1)
    _fix_installed(root)
    t = time.monotonic()
    libs = _add_shared_libraries(root, log)
    _ldconfig(root, log)
    timings["libraries_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    uncompiled = _compile_bytecode(root, log)
    timings["bytecode_s"] = round(time.monotonic() - t, 1)
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "usr" / "local" / "lib" / f"python{ver}" / "site-packages"
    packages = sorted(p.name.removesuffix(".dist-info") for p in site.glob("*.dist-info"))
    return {"host_libraries": libs, "packages": packages, "timings": timings, "uncompiled": uncompiled}


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


# --------------------------------------------------------------------------- build (cached)


def cached_home(repo: Path = REPO, variant: str = "full", compress: str = "none", cache: Path | None = None) -> Path | None:
    """The cache entry holding the image these inputs give, or None when it has not been built."""
    inputs = build_inputs(repo, variant)
    home = (cache or cache_dir()) / "image" / f"{inputs_key(inputs)[:32]}-{compress}"
    name = f"jobgen-train-{image_tag(inputs, repo)}.oci.tar"
    return home if (home / "BUILD-INFO.json").exists() and (home / name).exists() else None


def build_in_background(log_path: Path) -> subprocess.Popen[bytes] | None:
    """Start ``kubeimage.py build`` (the full image into the cache) in a session of its own, at the
    priority ``$JOBGEN_K8S_BUILD_PRIORITY`` gives (kubelab.background_priority_args: the lowest
    by default), its output appended to ``log_path``; None when the cache has it. The tests that
    need the image then wait for the build's lock in :func:`build` and find it cached. Used by the
    k8s tests' collection hook (conftest.py) so the minutes of a cold build overlap other tests."""
    from kubelab import background_priority_args  # this directory is on sys.path (the k8s conftest)

    if cached_home() is not None:
        return None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as fh:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "build", *background_priority_args()],
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def build(out: Path | None = None, repo: Path = REPO, variant: str = "full", compress: str = "none",
          cache: Path | None = None, use_cache: bool = True, log: Log = _stderr) -> dict[str, Any]:
    """Build (or reuse) the image and return its BUILD-INFO (ref, digests, archive path, timings).

    With ``use_cache`` the archive lives in ``<cache>/image/<key>-<compress>/`` and a second call
    with the same inputs returns it at once; ``out`` (a directory) receives a hard link (or copy)
    named ``jobgen-train-<tag>.oci.tar``. Without ``use_cache`` everything is built under ``out``.
    """
    start = time.monotonic()
    inputs = build_inputs(repo, variant)
    key = inputs_key(inputs)
    tag = image_tag(inputs, repo)
    ref = f"{IMAGE_NAME}:{tag}"
    name = f"jobgen-train-{tag}.oci.tar"
    if use_cache:
        home = (cache or cache_dir()) / "image" / f"{key[:32]}-{compress}"
    else:
        if out is None:
            raise ImageError("build without the cache needs --out")
        home = out
    info_path = home / "BUILD-INFO.json"
    with _locked((cache or cache_dir()) / "image" / ".lock") if use_cache else contextlib.nullcontext():
        if use_cache and info_path.exists() and (home / name).exists():
            info = json.loads(info_path.read_text())
            info["cached"] = True
            log(f"cached image {ref} ({info['manifest_digest']}) in {home}")
        else:
            home.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="kubeimage-root-", dir=home) as tmp:
                root = Path(tmp) / "rootfs"
                log(f"building {ref} (inputs {key[:12]}) in {root}")
                contents = build_rootfs(root, repo, variant, log)
                unpacked = _tree_size(root)
                labels = {"org.opencontainers.image.title": "jobgen training image",
                          "org.opencontainers.image.version": jobgen_version(repo),
                          "dev.jobgen.inputs-sha256": key,
                          "dev.jobgen.packages": " ".join(contents["packages"])}
                oci = write_oci_archive(root, home / name, ref, compress, labels, log)
            info = {**oci, "archive": str(home / name), "inputs": inputs, "inputs_sha256": key, "tag": tag,
                    "unpacked_bytes": unpacked, "packages": contents["packages"], "host_libraries": contents["host_libraries"],
                    "uncompiled": contents["uncompiled"], "timings": contents["timings"], "build_s": round(time.monotonic() - start, 1)}
            info_path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            info["cached"] = False
    if out is not None and use_cache:
        out.mkdir(parents=True, exist_ok=True)
        target = out / name
        if not target.exists():
            try:
                os.link(home / name, target)
            except OSError:
                shutil.copyfile(home / name, target)
        info["archive"] = str(target)
    info["elapsed_s"] = round(time.monotonic() - start, 1)
    return info


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


# --------------------------------------------------------------------------- running it (runc)


def unpack_bundle(archive: Path, bundle: Path) -> Path:
    """Extract the image's layer into ``bundle/rootfs`` (GNU tar, as a runtime would) and return it."""
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    meta = read_oci_archive(archive, verify=False)
    (layer,) = meta["manifest"]["layers"]
    with tarfile.open(archive, "r:") as tar:
        fh = tar.extractfile(f"blobs/sha256/{layer['digest'].split(':', 1)[1]}")
        assert fh is not None
        flags = ["-z"] if layer["mediaType"].endswith("+gzip") else []
        proc = subprocess.Popen(["tar", "-x", *flags, "-f", "-", "-C", str(rootfs), "--numeric-owner"], stdin=subprocess.PIPE)
        assert proc.stdin is not None
        shutil.copyfileobj(fh, proc.stdin, 1 << 20)
        proc.stdin.close()
        if proc.wait(600) != 0:
            raise ImageError(f"tar could not unpack the layer of {archive}")
    return rootfs


def runtime_config(args: list[str], binds: list[tuple[Path, str, bool]], env: list[str] | None = None,
                   hostname: str | None = None) -> dict[str, Any]:
    """A minimal OCI runtime config: the image's environment, root without extra capabilities,
    new pid/ipc/uts/mount/network namespaces (runc brings up ``lo`` in the new network
    namespace), /dev/shm a 1 GiB tmpfs (the pod gets one sized by the profile's shm_size_gib),
    ``binds``: (host path, container path, read-only)."""
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=1g"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    for host, dest, readonly in binds:
        mounts.append({"destination": dest, "type": "bind", "source": str(host),
                       "options": ["rbind", "ro" if readonly else "rw"]})
    return {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "env": env or list(ENV), "cwd": "/",
                    "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
                    "noNewPrivileges": True},
        "root": {"path": "rootfs", "readonly": False},
        "hostname": hostname or HOSTNAME,
        "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
                  "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
                  "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]},
    }


def runc_binary() -> str | None:
    """runc on PATH (Debian's package: ``apt-get install -y runc``), or None."""
    return shutil.which("runc")


def run_container(bundle: Path, args: list[str], binds: list[tuple[Path, str, bool]], timeout: float = 600,
                  env: list[str] | None = None, name: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in the unpacked image at ``bundle`` with runc (its state under ``bundle/state``);
    a run past ``timeout`` is killed and deleted. Returns the completed process (exit code, output)."""
    runc = runc_binary()
    if runc is None:
        raise ImageError("runc not found (apt-get install -y runc)")
    (bundle / "config.json").write_text(json.dumps(runtime_config(args, binds, env), indent=2))
    state = bundle / "state"
    state.mkdir(exist_ok=True)
    cid = name or f"jobgen-smoke-{os.getpid()}-{time.monotonic_ns()}"
    argv = [runc, "--root", str(state), "run", "--bundle", str(bundle), cid]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        subprocess.run([runc, "--root", str(state), "kill", cid, "KILL"], capture_output=True, timeout=30)
        raise ImageError(f"container {cid} ran past {timeout} s: {exc.stdout!r} {exc.stderr!r}") from exc
    finally:
        subprocess.run([runc, "--root", str(state), "delete", "--force", cid], capture_output=True, timeout=60)


def cpu_profile(ref: str, processes: int = 1) -> dict[str, Any]:
    """A Kubernetes cluster profile (a dict to write as YAML) for pods of this image on CPU nodes:
    ``processes`` gloo ranks per pod, no GPUs, node selector, tolerations, RDMA or runs claim,
    ``imagePullPolicy: Never`` (the image is imported on each node: there is no registry)."""
    return {
        "description": "the pod lab: CPU pods of the locally built training image",
        "scheduler": "kubernetes", "max_nodes": 4, "default_nodes": 1,
        "gpus_per_node": 0, "cpu_processes_per_node": processes, "cpus_per_node": 2, "mem_gib_per_node": 8,
        "network_fabric": "tcp",
        "kubernetes": {"namespace": "training", "image": ref, "image_pull_policy": "Never", "shm_size_gib": 1,
                       "master_port": 23456},
    }


def render_smoke_spec(directory: Path, ref: str, repo: Path = REPO) -> Path:
    """spec.json for a tiny CPU model, rendered by jobgen (the repository's, imported here) for a
    Kubernetes profile with 1 pod x 1 CPU process whose image is ``ref``: the file the ConfigMap
    would carry to /etc/jobgen/spec.json. Returns its path; pytorchjob.yaml is written beside it."""
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    import yaml

    from jobgen.backends import plan
    from jobgen.specs.load import load_profile, load_spec

    directory.mkdir(parents=True, exist_ok=True)
    profile = directory / "k8s-cpu-image.yaml"
    profile.write_text(yaml.safe_dump(cpu_profile(ref)))
    spec = directory / "image-smoke.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "image-smoke",
        "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
        "data": {"max_bytes": 200_000},
        "trainer": {"strategy": "ddp", "precision": "32-true", "micro_batch_size": 4, "max_steps": 2, "warmup_steps": 1,
                    "val_check_interval": 2, "limit_val_batches": 1, "log_every_n_steps": 1},
        "resources": {"nodes": 1, "devices_per_node": 1},
        "checkpoint": {"every_n_steps": 2, "keep_last_k": 1},
    }))
    job_plan = plan(load_spec(spec), load_profile(str(profile)), repo / "templates")
    (directory / "spec.json").write_text(job_plan.file("spec.json"))
    (directory / "pytorchjob.yaml").write_text(job_plan.file("pytorchjob.yaml"))
    return directory / "spec.json"


def master_container(pytorchjob_yaml: Path) -> tuple[list[str], dict[str, str], str]:
    """What the kubelet runs in the Master pod (index 0) of the rendered PyTorchJob: the
    container's command with ``$(VAR)`` expanded, its environment (the container's ``env`` plus
    what the training-operator v1.9 appends: see test_rank_semantics.py), and the Master's
    Service name (MASTER_ADDR), which the pod's /etc/hosts must resolve."""
    import yaml

    job = next(d for d in yaml.safe_load_all(pytorchjob_yaml.read_text()) if d and d.get("kind") == "PyTorchJob")
    specs = job["spec"]["pytorchReplicaSpecs"]
    container = specs["Master"]["template"]["spec"]["containers"][0]
    nproc = str(job["spec"]["nprocPerNode"])
    pods = sum(r["replicas"] for r in specs.values())
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port")
    master = f"{job['metadata']['name']}-master-0"
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    env |= {"PYTHONUNBUFFERED": "0", "MASTER_PORT": str(port), "MASTER_ADDR": master, "WORLD_SIZE": str(pods * int(nproc)),
            "RANK": "0", "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": "0", "PET_NNODES": str(pods)}
    expand = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))")
    argv = [expand.sub(lambda m: "$" if m.group(1) == "$" else env.get(m.group(2), m.group(0)), a) for a in container["command"]]
    return argv, env, master


def smoke(archive: Path, work: Path, ref: str, log: Log = _stderr) -> dict[str, Any]:
    """Unpack ``archive`` into a runc bundle under ``work`` and run, in the container: the imports
    (torch, lightning, deepspeed, jobgen.train) and a 2-step CPU training of the bundled entrypoint
    under torch.distributed.run with the spec.json jobgen renders (bind-mounted read-only at
    /etc/jobgen/spec.json, like the ConfigMap) and the run directory bind-mounted at /tmp/run.
    Returns timings and outputs; raises :class:`ImageError` when a step fails."""
    result: dict[str, Any] = {}
    t = time.monotonic()
    bundle = work / "bundle"
    unpack_bundle(archive, bundle)
    result["unpack_s"] = round(time.monotonic() - t, 1)
    spec_json = render_smoke_spec(work / "rendered", ref)
    argv, env, master = master_container(spec_json.parent / "pytorchjob.yaml")
    # The kubelet mounts an /etc/hosts that resolves the pod's hostname (torchrun's c10d store
    # names it; unresolvable, the agent waits for ever); the Master's Service name resolves through
    # the cluster's DNS, here through the same file.
    hosts = work / "hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost {HOSTNAME} {master}\n")
    run_dir = work / "run"
    run_dir.mkdir()
    binds = [(spec_json, "/etc/jobgen/spec.json", True), (hosts, "/etc/hosts", True), (run_dir, "/tmp/run", False)]
    t = time.monotonic()
    code = ("import sys, torch, lightning, deepspeed, jobgen.train; "
            "print(torch.__version__, lightning.__version__, deepspeed.__version__, sys.version.split()[0])")
    proc = run_container(bundle, ["python", "-c", code], binds, timeout=300)
    result["import_s"] = round(time.monotonic() - t, 1)
    result["import_output"] = (proc.stdout + proc.stderr).strip()[-2000:]
    if proc.returncode != 0:
        raise ImageError(f"imports failed in the container (exit {proc.returncode}):\n{result['import_output']}")
    result["versions"] = dict(zip(("torch", "lightning", "deepspeed", "python"), proc.stdout.split()[-4:], strict=True))
    log(f"container imports in {result['import_s']} s: {result['versions']}")
    t = time.monotonic()
    train = ["python", "-m", "torch.distributed.run", "--nproc-per-node=1", "-m", "jobgen.train",
             "--spec", "/etc/jobgen/spec.json", "--run-dir", "/tmp/run"]
    proc = run_container(bundle, train, binds, timeout=600, env=[*ENV, "OMP_NUM_THREADS=1"])
    result["train_s"] = round(time.monotonic() - t, 1)
    result["train_returncode"] = proc.returncode
    result["train_output"] = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode != 0:
        raise ImageError(f"training failed in the container (exit {proc.returncode}):\n{result['train_output']}")
    result["run_files"] = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    log(f"container trained 2 steps in {result['train_s']} s; run dir: {len(result['run_files'])} files")
    # The rendered Master pod's own command and environment, and its runs volume (an emptyDir there).
    runs = work / "pod-runs"
    runs.mkdir()
    pod_binds = [(spec_json, "/etc/jobgen/spec.json", True), (hosts, "/etc/hosts", True), (runs, "/workspace/runs", False)]
    t = time.monotonic()
    proc = run_container(bundle, argv, pod_binds, timeout=600, env=[*ENV, *(f"{k}={v}" for k, v in env.items())])
    result["pod_command"] = argv
    result["pod_train_s"] = round(time.monotonic() - t, 1)
    result["pod_train_returncode"] = proc.returncode
    result["pod_train_output"] = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode != 0:
        raise ImageError(f"the rendered pod command failed in the container (exit {proc.returncode}):\n{result['pod_train_output']}")
    result["pod_run_files"] = sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*") if p.is_file())
    log(f"the rendered Master pod command trained in {result['pod_train_s']} s: {' '.join(argv)}")
    return result


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "smoke"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--out", type=Path, help="directory for the archive (build: a link to the cached one)")
        cmd.add_argument("--variant", choices=("full", "small"), default="full",
                         help="small: the interpreter and jobgen without its train extra (tests)")
        cmd.add_argument("--compress", choices=("none", "gzip"), default="none")
        cmd.add_argument("--no-cache", action="store_true", help="build under --out, neither reading nor filling the cache")
        cmd.add_argument("--lowest-priority", action="store_true",
                         help="only the CPU other work leaves idle (kubelab.lowest_cpu_priority: nice 19 for the process and its session)")
    sub.choices["smoke"].add_argument("--work", type=Path, help="bundle/run directory (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    if args.lowest_priority:
        from kubelab import lowest_cpu_priority  # this directory: sys.path[0] when run as a script

        lowest_cpu_priority()
    info = build(args.out, variant=args.variant, compress=args.compress, use_cache=not args.no_cache)
    summary = {k: info[k] for k in ("ref", "manifest_digest", "archive", "archive_size", "unpacked_bytes", "build_s", "elapsed_s", "cached")}
    if args.command == "smoke":
        with contextlib.ExitStack() as stack:
            work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kubeimage-smoke-")))
            summary["smoke"] = {k: v for k, v in smoke(Path(info["archive"]), work, info["ref"]).items() if not k.endswith("train_output")}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
