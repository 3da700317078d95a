"""Building the Kubernetes node lab's binaries and images into the cache (kubenodes.py): kubelet and
kube-scheduler with kubelab.py's recipe, the runtime packages unpacked with ``dpkg -x``, and the
pause and busybox images written as reproducible docker-archive tarballs. kubenodes.py re-exports
the names tests use.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubelab
from kubelab import (
    BUILD_PACKAGES,
    BUILD_TAGS,
    SOURCE_PACKAGE,
    LabCommandError,
    LabUnavailable,
    PrivateApt,
    _dpkg_version,
    _installed,
    _locked,
    apt_install,
    debian_mirror,
    go_build_env,
    run,
    unpack_source,
)

#: Bump when the node build recipe changes (binaries, runtime packages, images). 2: kubelab's
#: recipe 4 (no optimisation; the API server build's source tree and Go build cache reused).
NODE_RECIPE = 2
NODE_TARGETS = ("cmd/kubelet", "cmd/kube-scheduler")
NODE_BINARIES = ("kubelet", "kube-scheduler")
#: Debian 12 packages fetched with ``apt-get download`` and unpacked with ``dpkg -x``; the ones
#: after busybox-static are the libraries dnsmasq links (with theirs) that a minimal Debian lacks:
#: it runs with LD_LIBRARY_PATH, and the build checks that it finds each (:func:`missing_libraries`).
RUNTIME_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "dnsmasq-base", "busybox-static",
                    "libnetfilter-conntrack3", "libnfnetlink0", "libmnl0", "libnftables1", "libnftnl11", "libjansson4",
                    "libxtables12")
#: Where the unpacked runtime packages keep their libraries (dnsmasq's LD_LIBRARY_PATH).
RUNTIME_LIBRARIES = "usr/lib/x86_64-linux-gnu"
PAUSE_IMAGE = "jobgen.local/pause:3.4"
BUSYBOX_IMAGE = "jobgen.local/busybox:1.35"
#: Every file of the images gets this mtime (reproducible tarballs): 2021-01-01T00:00:00Z.
IMAGE_MTIME = 1609459200


# --------------------------------------------------------------------------- build (cached)


def node_dir(cache: Path) -> Path:
    """The cache entry of the node binaries, runtime and images: ``nodes-recipe<NODE_RECIPE>``."""
    return cache / f"nodes-recipe{NODE_RECIPE}"


def cached_nodes(cache: Path) -> dict[str, Any] | None:
    """The node entry's stamp when it matches :data:`NODE_RECIPE` and its files are there, else None."""
    base = node_dir(cache)
    try:
        info = json.loads((base / "BUILD-INFO.json").read_text())
    except (OSError, ValueError):
        return None
    needed = [base / "bin" / b for b in (*NODE_BINARIES, "pause")] + [runtime_path(cache, "usr/bin/containerd")]
    if info.get("recipe") != NODE_RECIPE or not all(os.access(p, os.X_OK) for p in needed):
        return None
    if not all((base / "images" / f).is_file() for f in ("pause.tar", "busybox.tar")):
        return None
    return info


def runtime_path(cache: Path, rel: str) -> Path:
    """A file of the unpacked runtime packages (``rel`` as in the packages: ``usr/bin/ctr``)."""
    return node_dir(cache) / "runtime" / rel


def ensure_node_binaries(cache: Path | None = None, *, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Make sure the node entry is complete (building it if needed) and return its stamp:
    ``recipe``, ``source_version``, ``go_version``, ``runtime`` (package -> version), ``compile_s``,
    ``build_s``, ``cpu`` and ``cached``. Holds the cache's ``.lock-nodes`` while building.

    Raises LabUnavailable (no apt, mirror or packages) or LabCommandError (the build failed)."""
    cache = cache or kubelab.cache_dir()
    info = cached_nodes(cache)
    if info is not None:
        return {**info, "cached": True}
    with _locked(cache / ".lock-nodes"):
        info = cached_nodes(cache)
        if info is not None:
            return {**info, "cached": True}
        return {**_build_nodes(cache, log), "cached": False}


def _build_nodes(cache: Path, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    base = node_dir(cache)
    base.mkdir(parents=True, exist_ok=True)
    build_log = base / "build.log"
    build_log.write_text("")
    missing = [pkg for pkg, marker in BUILD_PACKAGES.items() if not _installed(marker)]
    if not _installed("gcc"):
        missing.append("gcc")
    if missing:
        log(f"k8s nodes: installing {' '.join(missing)}")
        apt_install(missing, build_log)
    dsc = next(iter(sorted((cache / "src").glob(f"{SOURCE_PACKAGE}_*.dsc"))), None)
    if dsc is None:  # kubelab's build keeps the source package; fetch it when that one never ran
        uri, suite = debian_mirror()
        apt = PrivateApt(cache / "apt", uri, suite)
        try:
            apt.update(build_log)
            dsc = apt.source(SOURCE_PACKAGE, cache / "src", build_log)
        except LabCommandError as exc:
            raise LabUnavailable(f"cannot download the {SOURCE_PACKAGE} source package: {exc}") from None
    # kubelab's build keeps its tree for this one (kubelab.build): the OpenAPI code is generated
    # and the packages shared with kube-apiserver are in the tree's Go build cache.
    tree = kubelab.shared_tree(cache, dsc)
    shared = tree is not None
    where = "the API server build's tree" if shared else "a tree of its own"
    log(f"k8s nodes: building {' '.join(NODE_TARGETS)} and pause in {where} (log: {build_log})")
    env = go_build_env(cache)
    compile_started = time.monotonic()
    if tree is None:
        tree = base / "src-tree"
        unpack_source(dsc, tree, build_log)
        run(["make", "gen_openapi"], cwd=tree, env=env, log=build_log, timeout=3600)
    run(["hack/make-rules/build.sh", *NODE_TARGETS], cwd=tree, env=env, log=build_log, timeout=3600)
    compile_s = time.monotonic() - compile_started
    bins = base / "bin"
    bins.mkdir(exist_ok=True)
    for name in NODE_BINARIES:
        built = next(iter(sorted(tree.glob(f"_output/**/{name}"))), None)
        if built is None:
            raise LabCommandError(["build.sh"], 0, f"the build produced no {name}")
        _install_file(built, bins / name)
    # The pause container as build/pause/Makefile compiles it (CFLAGS there), statically.
    run(["gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=v3.4-jobgen", "-o", str(bins / ".pause.tmp"),
         str(tree / "build" / "pause" / "linux" / "pause.c")], log=build_log, timeout=300)
    run(["strip", str(bins / ".pause.tmp")], log=build_log, timeout=60)
    os.replace(bins / ".pause.tmp", bins / "pause")
    source_version = dsc.name[len(SOURCE_PACKAGE) + 1:-4]
    kubelab.shutil.rmtree(tree, ignore_errors=True)
    runtime = _fetch_runtime(cache, build_log)
    _write_images(cache)
    info = {
        "recipe": NODE_RECIPE, "kube_version": kubelab.KUBE_VERSION, "source_version": source_version, "tags": list(BUILD_TAGS),
        "targets": list(NODE_TARGETS), "go_version": _dpkg_version("golang-1.19-go"),
        "reflect2_version": _dpkg_version("golang-github-modern-go-reflect2-dev"), "runtime": runtime,
        "images": {"pause": PAUSE_IMAGE, "busybox": BUSYBOX_IMAGE}, "cpu": _cpu_model(), "cores": os.cpu_count(),
        "compile_s": round(compile_s, 1), "build_s": round(time.monotonic() - started, 1), "shared_tree": shared,
        "gc_flags": kubelab.GO_GC_FLAGS, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (base / "BUILD-INFO.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def _install_file(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp")
    kubelab.shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def _fetch_runtime(cache: Path, build_log: Path) -> dict[str, str]:
    """``apt-get download`` :data:`RUNTIME_PACKAGES` and ``dpkg -x`` them into ``runtime/``;
    returns package -> version (from the .deb names)."""
    base = node_dir(cache)
    debs = base / "debs"
    kubelab.shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    try:
        run(["apt-get", "download", *RUNTIME_PACKAGES], cwd=debs, log=build_log, timeout=900)
    except LabCommandError:
        run(["apt-get", "-o", f"DPkg::Lock::Timeout={kubelab.DPKG_LOCK_WAIT_S}", "update"], log=build_log, timeout=600)
        run(["apt-get", "download", *RUNTIME_PACKAGES], cwd=debs, log=build_log, timeout=900)
    root = base / "runtime"
    kubelab.shutil.rmtree(root, ignore_errors=True)
    versions = {}
    for deb in sorted(debs.glob("*.deb")):
        run(["dpkg", "-x", str(deb), str(root)], log=build_log, timeout=300)
        name, version = deb.name.split("_")[:2]
        versions[name] = version.replace("%3a", ":")
    missing = missing_libraries(root / "usr" / "sbin" / "dnsmasq", root / RUNTIME_LIBRARIES)
    if missing:
        raise LabCommandError(["ldd", str(root / "usr" / "sbin" / "dnsmasq")], 0,
                              f"dnsmasq from {versions.get('dnsmasq-base')} needs {', '.join(missing)}, which neither the machine nor "
                              "RUNTIME_PACKAGES has: add the package that ships each")
    return versions


def missing_libraries(binary: Path, library_path: Path) -> list[str]:
    """The shared libraries the dynamic loader cannot find for ``binary`` run with
    ``LD_LIBRARY_PATH=library_path`` (ldd(1)'s ``NAME => not found`` lines), in ldd's order.
    Only the machine's own libraries and ``library_path`` count: a library another test
    installed on the machine hides a missing one, so the build runs this before any lab test.

    Raises LabCommandError when ldd cannot run on ``binary``."""
    out = run(["ldd", str(binary)], env={**os.environ, "LD_LIBRARY_PATH": str(library_path)}, timeout=60)
    return [line.split("=>", 1)[0].strip() for line in out.splitlines() if line.rstrip().endswith("=> not found")]


# --------------------------------------------------------------------------- images (docker-archive tarballs)


@dataclass(frozen=True)
class Entry:
    """One entry of an image layer: a directory (``data`` None, no ``link``), a file or a symlink."""

    path: str
    mode: int = 0o755
    data: bytes | None = None
    link: str = ""


def layer_tar(entries: Iterable[Entry]) -> bytes:
    """An uncompressed layer tarball of ``entries``, sorted by path, owned by root, every mtime
    :data:`IMAGE_MTIME`: the same entries always give the same bytes (so the same digest)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(entry.path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = IMAGE_MTIME, 0, 0, "root", "root"
            info.mode = entry.mode
            if entry.link:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
                tar.addfile(info)
            elif entry.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buf.getvalue()


def write_image_tar(path: Path, name: str, entries: Iterable[Entry], config: dict[str, Any]) -> str:
    """Write a one-layer image as a docker-archive tarball (``manifest.json``, the config blob,
    the layer; what ``docker save`` writes and ``ctr images import`` reads) tagged ``name``.
    Reproducible: fixed mtimes, sorted entries, sorted JSON keys. Returns the image's config digest."""
    layer = layer_tar(entries)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    image_config = {"architecture": "amd64", "os": "linux", "created": "2021-01-01T00:00:00Z", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                    "history": [{"created": "2021-01-01T00:00:00Z", "created_by": "jobgen kubenodes.write_image_tar"}]}
    config_bytes = json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    layer_name = f"{diff_id[7:]}/layer.tar"
    manifest = json.dumps([{"Config": f"{config_digest}.json", "RepoTags": [name], "Layers": [layer_name]}],
                          sort_keys=True, separators=(",", ":")).encode()
    files = {f"{config_digest}.json": config_bytes, layer_name: layer, "manifest.json": manifest}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname in sorted({*files, f"{diff_id[7:]}/"}):
            info = tarfile.TarInfo(arcname.rstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = IMAGE_MTIME, 0, 0, "root", "root"
            if arcname.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.mode, info.size = 0o644, len(files[arcname])
                tar.addfile(info, io.BytesIO(files[arcname]))
    os.replace(tmp, path)
    return "sha256:" + config_digest


#: Busybox applets the test image links (``/bin/<applet> -> busybox``).
BUSYBOX_APPLETS = ("sh", "cat", "echo", "env", "hostname", "httpd", "ip", "ls", "mkdir", "nc", "nslookup", "ps", "seq",
                   "sleep", "test", "true", "false", "wget", "date", "grep", "head", "tail", "sed", "id", "uname")


def _write_images(cache: Path) -> None:
    """The pause image (``/pause``) and the busybox test image, into the entry's ``images/``."""
    base = node_dir(cache)
    pause = (base / "bin" / "pause").read_bytes()
    write_image_tar(base / "images" / "pause.tar", PAUSE_IMAGE, [Entry("pause", 0o755, pause)],
                    {"Entrypoint": ["/pause"], "User": "65535:65535"})
    busybox = runtime_path(cache, "bin/busybox").read_bytes()
    entries = [Entry("bin"), Entry("etc"), Entry("tmp", 0o1777), Entry("www"), Entry("bin/busybox", 0o755, busybox),
               Entry("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
               Entry("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n"), Entry("root", 0o700)]
    entries += [Entry(f"bin/{applet}", link="busybox") for applet in BUSYBOX_APPLETS]
    write_image_tar(base / "images" / "busybox.tar", BUSYBOX_IMAGE, entries,
                    {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "WorkingDir": "/"})
