"""The training image's recipe inputs (kubeimage.py): its constants, its error, the inputs that key the
cache (source files, requirements, interpreter, libc), the build lock and the logged command runner.
kubeimage.py re-exports the names tests use, so ``kubeimage.X`` keeps working.

Standard library only.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
