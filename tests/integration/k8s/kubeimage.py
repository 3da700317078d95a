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
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The recipe's inputs (imagebase.py), the OCI archive (ociarchive.py) and the runc smoke check
# (imagesmoke.py): their names used elsewhere are re-exported here (``kubeimage.X``).
from imagebase import (  # noqa: F401
    CONSTRAINTS,
    DLOPEN_LIBS,
    DYNLOAD_SKIP,
    EXTRA,
    IMAGE_NAME,
    MULTIARCH,
    REPO,
    SOURCE_PATHS,
    STDLIB_SKIP_NESTED,
    STDLIB_SKIP_TOP,
    TORCH_PIN,
    ImageError,
    Log,
    _locked,
    _run,
    _stderr,
    base_python,
    build_inputs,
    cache_dir,
    image_tag,
    inputs_key,
    jobgen_version,
    requirements,
    source_files,
)
from imagesmoke import (  # noqa: F401
    cpu_profile,
    master_container,
    render_smoke_spec,
    runc_binary,
    smoke,
)
from ociarchive import (  # noqa: F401
    read_oci_archive,
    write_oci_archive,
)

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
