#!/usr/bin/env python3
"""A real Kubernetes API server on this machine, for jobgen's integration tests.

etcd + kube-apiserver 1.20 (+ kube-controller-manager running only the garbage collector and
the namespace controller, so foreground deletion and namespace deletion finish) on 127.0.0.1,
static token auth (group system:masters), RBAC, a self-signed serving certificate, and the
Kubeflow CRDs from jobgen/_crds installed. There is no kubelet and no scheduler: pods are
accepted but never run, unless the lab is started with its nodes (``up --with-nodes``,
kubenodes.py: two kubelets, kube-scheduler, cluster DNS; docs/labs-k8s-nodes-notes.md). The
recipe (docs/labs.md has it for users of the lab):

- kube-apiserver and kube-controller-manager are built from Debian bookworm's ``kubernetes``
  SOURCE package (1.20.2, vendored) with ``golang-1.19-go`` + ``rsync``:
  ``make gen_openapi`` then ``hack/make-rules/build.sh cmd/...`` with ``GOPROXY=off
  CGO_ENABLED=0 KUBE_GIT_VERSION=v1.20.2`` and the ``providerless`` build tag (no in-tree cloud
  providers: less to compile). Only the OpenAPI code is generated: the tarball carries every
  other generated file (deepcopy, conversion, defaults, prerelease-lifecycle), which ``make
  WHAT=...`` would build five generators to regenerate (a quarter of the CPU). The source
  comes from a PRIVATE apt configuration (a ``deb-src`` line for the machine's configured
  Debian mirror, its own lists directory): the system's sources are never edited.
- The vendored ``github.com/modern-go/reflect2`` v1.0.1 segfaults on the first custom-resource
  request under Go >= 1.18; it is replaced by Debian's golang-github-modern-go-reflect2-dev (1.0.2).
- etcd is Debian's ``etcd-server`` 3.4 (``apt-get download`` + ``dpkg -x``; nothing installed).
- Optional: Debian sid's ``apiextensions-apiserver`` 0.36 (strict field validation, CEL, accepts the
  Trainer v2 CRDs that 1.20 rejects), built from sid's Go source packages (a private apt
  configuration for sid, ``dpkg -x``, ``GO111MODULE=off go build``) and started beside the lab
  with authentication/authorization delegated to the 1.20 server (context ``jobgen-lab-crds``).

Binaries are cached between runs in ``$JOBGEN_K8S_CACHE`` (default /var/cache/jobgen-k8s),
keyed by the recipe, the source package version, the reflect2 and Go versions
(``bin-recipe<N>/BUILD-INFO.json``); a cold build takes minutes, a warm start seconds. Everything a
running lab writes lives under its ROOT; it stops only the processes it started (PID files).

By hand:

    python tests/integration/k8s/kubelab.py build [--crd-server]  # fill the cache
    python tests/integration/k8s/kubelab.py up --root /tmp/jobgen-k8s-lab [--crd-server] [--with-nodes]
    export KUBECONFIG=/tmp/jobgen-k8s-lab/kubeconfig           # context jobgen-lab
    python tests/integration/k8s/kubelab.py down --root /tmp/jobgen-k8s-lab

This module imports nothing from jobgen: the standard library, PyYAML to read the CRDs, and the
test suite's port picker (tests/ports.py) and process stopper (tests/processes.py).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):  # run as a script: make the repository's tests package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.ports import ATTEMPTS, address_in_use, next_port  # noqa: E402
from tests.processes import pid_alive, stop_pid  # noqa: E402  (kubenodes.py uses both through this module)

#: Bump when the build recipe changes: a cached build with another recipe is rebuilt.
#: 2: built with the ``providerless`` tag. 3: ``make gen_openapi`` + ``build.sh`` instead of
#: ``make WHAT=`` (the same binaries, ~100 s less CPU on 2 cores: 273 s instead of 376 s for
#: kube-apiserver alone, measured). 4: compiled without optimisation or inlining
#: (:data:`GO_GC_FLAGS`), the source tree kept for the node binaries' build (:data:`SHARED_TREE_STAMP`).
RECIPE = 4
CACHE_ENV = "JOBGEN_K8S_CACHE"
DEFAULT_CACHE = Path("/var/cache/jobgen-k8s")
KUBE_VERSION = "v1.20.2"
SOURCE_PACKAGE = "kubernetes"
BUILD_TARGETS = ("cmd/kube-apiserver", "cmd/kube-controller-manager")
#: Go build tags: ``providerless`` leaves the in-tree cloud providers (AWS, Azure, GCE, OpenStack,
#: vSphere SDKs) out of both binaries (kubernetes 1.20's cmd/*/app/*_providerless.go); the lab has
#: no cloud, and they were a large part of the compile.
BUILD_TAGS = ("providerless",)
BINARIES = ("kube-apiserver", "kube-controller-manager")
#: Packages the build needs (installed with apt-get when missing): the Go toolchain, rsync
#: (the kube build scripts), the reflect2 fix, make, dpkg-source, openssl (certificates).
BUILD_PACKAGES = {
    "golang-1.19-go": "/usr/lib/go-1.19/bin/go",
    "rsync": "rsync",
    "golang-github-modern-go-reflect2-dev": "/usr/share/gocode/src/github.com/modern-go/reflect2/reflect2.go",
    "make": "make",
    "dpkg-dev": "dpkg-source",
    "openssl": "openssl",
}
GO_ROOT_BIN = "/usr/lib/go-1.19/bin"
#: ``GOGCFLAGS`` of the kube build scripts (hack/lib/golang.sh passes it to ``-gcflags``, ``all=``
#: for every package): the compiler's optimisation and inlining off. The lab's daemons serve a few
#: hundred requests, so optimised code is compile time they never pay back (the CRD server's
#: :data:`CRD_SERVER_GO_FLAGS` rest on the same rule). The scripts already link with ``-s -w``.
GO_GC_FLAGS = "all=-N -l"
#: The file a kept source tree holds (``<cache>/src/tree``): the .dsc it was unpacked from and
#: :data:`RECIPE`. The node build (kubenodes.py) compiles kubelet and kube-scheduler in such a
#: tree, so the packages the four binaries share compile once (the tree's Go build cache) and the
#: OpenAPI code is generated once.
SHARED_TREE_STAMP = ".jobgen-tree.json"
REFLECT2_SRC = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")
ETCD_PACKAGE = "etcd-server"
CONTEXT = "jobgen-lab"
#: The optional 1.36 CRD server's context (same user/token, its own endpoint).
CRD_CONTEXT = "jobgen-lab-crds"
TOKEN = "jobgen-lab-admin-token"
#: CRDs installed from the CRDs directory (relative paths); the first must be accepted.
CRD_FILES = (
    "training-operator-v1.9.4/kubeflow.org_pytorchjobs.yaml",
    "trainer-v2.3.0/trainer.kubeflow.org_trainjobs.yaml",
    "trainer-v2.3.0/trainer.kubeflow.org_clustertrainingruntimes.yaml",
)


# --------------------------------------------------------------------------- errors


class LabError(RuntimeError):
    """Anything that stops the lab from being built, coming up or going down."""


class LabCommandError(LabError):
    """A command failed: argv, return code (None: timed out) and the tail of its output."""

    def __init__(self, argv: Sequence[str], returncode: int | None, output: str, note: str = ""):
        self.argv = [str(a) for a in argv]
        self.returncode = returncode
        self.output = output
        status = "timed out" if returncode is None else f"exit {returncode}"
        super().__init__(f"{' '.join(self.argv)}: {status}{note}\n{output.strip()[-3000:]}")


class LabUnavailable(LabError):
    """The machine cannot host the lab (no apt, no Debian source for the package, no network):
    tests skip with this message."""


class LabStartError(LabError):
    """A daemon did not start or become ready; the message has its log tail."""

    @property
    def port_taken(self) -> bool:
        """The log tail says a port was held by another process ("address already in use")."""
        return address_in_use(str(self))


# --------------------------------------------------------------------------- helpers


def run(argv: Sequence[str | os.PathLike[str]], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
        timeout: float = 600, log: Path | None = None) -> str:
    """Run argv (no shell); return its output (stdout + stderr). With ``log``, the output is
    appended to that file instead of being captured in memory (long builds).

    Raises LabCommandError on a non-zero exit, a timeout or a missing program.
    """
    argv = [os.fspath(a) for a in argv]
    try:
        if log is not None:
            with open(log, "ab") as fh:
                fh.write(f"$ {' '.join(argv)}\n".encode())
                fh.flush()
                proc = subprocess.run(argv, cwd=cwd, env=None if env is None else dict(env), stdout=fh,
                                      stderr=subprocess.STDOUT, timeout=timeout, stdin=subprocess.DEVNULL)
            output = _tail(log, 40)
        else:
            proc = subprocess.run(argv, cwd=cwd, env=None if env is None else dict(env), capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
            output = (proc.stdout or "") + (proc.stderr or "")
    except subprocess.TimeoutExpired:
        raise LabCommandError(argv, None, _tail(log, 40) if log else "", f" after {timeout:g} s") from None
    except FileNotFoundError as exc:
        raise LabCommandError(argv, 127, str(exc)) from None
    if proc.returncode != 0:
        raise LabCommandError(argv, proc.returncode, output)
    return output


def _tail(path: Path | None, lines: int = 25) -> str:
    if path is None or not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.2, what: str = "") -> T:
    """Call ``predicate`` until it returns something truthy (returned); TimeoutError after
    ``timeout`` seconds naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"gave up waiting for {what or predicate} after {timeout:g} s (last value: {value!r})")
        time.sleep(interval)


def listening_ports(pid: int) -> set[int]:
    """The TCP ports (IPv4 and IPv6) process ``pid`` itself listens on: its socket inodes
    (``/proc/PID/fd`` links ``socket:[INODE]``) matched against the LISTEN rows (state ``0A``) of
    ``/proc/PID/net/tcp`` and ``tcp6`` (proc(5)). Empty when the process is gone."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = row.split()
                if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def cache_dir() -> Path:
    """Where builds are cached: ``$JOBGEN_K8S_CACHE``, else /var/cache/jobgen-k8s."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def default_crds_dir() -> Path:
    """``$JOBGEN_CRDS_DIR``, else the CRDs packaged in the repository's ``jobgen/_crds/`` (the
    path of ``jobgen.backends.k8s_validate.PACKAGED_CRDS_DIR``, spelt out: this module imports no jobgen)."""
    configured = os.environ.get("JOBGEN_CRDS_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / "jobgen" / "_crds"


# --------------------------------------------------------------------------- apt (private configuration)


def debian_mirror() -> tuple[str, str]:
    """``(URI, suite)`` of the machine's configured Debian archive (not -security/-updates),
    from /etc/apt/sources.list.d/*.sources (deb822) or the one-line lists.

    Raises LabUnavailable when no Debian archive is configured.
    """
    entries: list[tuple[str, str]] = []
    apt_dir = Path("/etc/apt")
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                for uri in fields.get("uris", "").split():
                    for suite in fields.get("suites", "").split():
                        entries.append((uri, suite))
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if match:
                entries.append((match.group(1), match.group(2)))
    for uri, suite in entries:
        if "security" not in uri and "-" not in suite and "debian" in uri:
            return uri.rstrip("/"), suite
    raise LabUnavailable("no Debian archive (deb line) in /etc/apt: cannot fetch the kubernetes source package")


class PrivateApt:
    """apt-get/apt-cache with their own source list, lists, package cache and (empty) dpkg status
    under ``root`` (Dir::Etc::SourceList, Dir::Etc::SourceParts, Dir::State::Lists, Dir::Cache,
    Dir::State::status): one ``deb-src`` (or ``deb``) line for the machine's Debian mirror, and
    the system's apt configuration, lists and caches stay untouched."""

    def __init__(self, root: Path, uri: str, suite: str, kind: str = "deb-src"):
        self.root = root
        self.uri = uri
        self.suite = suite
        self.kind = kind

    def options(self) -> list[str]:
        """The ``-o`` options that point apt-get at this configuration."""
        return ["-o", f"Dir::Etc::SourceList={self.root / 'sources.list'}", "-o", f"Dir::Etc::SourceParts={self.root / 'parts'}",
                "-o", f"Dir::State::Lists={self.root / 'lists'}", "-o", f"Dir::Cache={self.root / 'cache'}",
                "-o", f"Dir::State::status={self.root / 'status'}", "-o", "APT::Sandbox::User=root", "-o", "Debug::NoLocking=1"]

    def update(self, log: Path) -> None:
        """Write the source list and download its indices."""
        for sub in ("parts", "lists/partial", "cache/archives/partial"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        signed = f"[signed-by={keyring}] " if Path(keyring).is_file() else ""
        (self.root / "sources.list").write_text(
            f"# jobgen k8s lab: a private list (the system's apt sources are not touched)\n"
            f"{self.kind} {signed}{self.uri} {self.suite} main\n")
        run(["apt-get", *self.options(), "update"], log=log, timeout=600)

    def dependency_closure(self, package: str) -> list[str]:
        """``package`` and everything it depends on (Depends/PreDepends, recursively), sorted."""
        out = run(["apt-cache", *self.options(), "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                   "--no-breaks", "--no-replaces", "--no-enhances", package], timeout=300)
        return sorted({line.strip() for line in out.splitlines() if line and not line.startswith((" ", "<"))})

    def download(self, packages: Sequence[str], into: Path, log: Path) -> list[Path]:
        """``apt-get download`` the binary packages into ``into`` (nothing is installed)."""
        into.mkdir(parents=True, exist_ok=True)
        run(["apt-get", *self.options(), "download", *packages], cwd=into, log=log, timeout=1800)
        return sorted(into.glob("*.deb"))

    def source(self, package: str, into: Path, log: Path) -> Path:
        """``apt-get source --download-only PACKAGE`` into ``into``; returns the .dsc file."""
        into.mkdir(parents=True, exist_ok=True)
        for old in into.glob(f"{package}_*"):
            old.unlink()
        run(["apt-get", *self.options(), "source", "--download-only", package], cwd=into, log=log, timeout=900)
        found = sorted(into.glob(f"{package}_*.dsc"))
        if not found:
            raise LabUnavailable(f"apt-get source {package} downloaded no .dsc into {into}")
        return found[-1]


#: How long apt-get waits for another apt/dpkg run to release dpkg's lock, seconds.
DPKG_LOCK_WAIT_S = 600


def apt_install(packages: Sequence[str], log: Path) -> None:
    """``apt-get install`` (no recommends), running ``apt-get update`` only when the first try fails.

    Raises LabUnavailable when there is no apt-get or the packages cannot be installed."""
    if shutil.which("apt-get") is None:
        raise LabUnavailable(f"need {', '.join(packages)} and there is no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Wait for dpkg's lock (a build in the background may install while the SLURM lab does).
    argv = ["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}", "install", "-y", "--no-install-recommends", *packages]
    try:
        run(argv, env=env, log=log, timeout=1200)
    except LabCommandError as first:
        try:
            run(["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}", "update"], env=env, log=log, timeout=600)
            run(argv, env=env, log=log, timeout=1200)
        except LabCommandError as second:
            raise LabUnavailable(f"could not install {' '.join(packages)}: {second}\n(before apt-get update: {first})") from None


def _installed(marker: str) -> bool:
    return Path(marker).exists() if marker.startswith("/") else shutil.which(marker) is not None


def _dpkg_version(package: str) -> str:
    try:
        return run(["dpkg-query", "-W", "-f=${Version}", package], timeout=30).strip()
    except LabCommandError:
        return ""


# --------------------------------------------------------------------------- build (cached)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path``: two test sessions never build into one cache at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: The locks a build of the cache holds while it runs (:func:`ensure_binaries`, :func:`ensure_crd_server`).
BUILD_LOCKS = (".lock", ".lock-crd-server", ".lock-nodes")  # the last: kubenodes.ensure_node_binaries


def build_running(cache: Path) -> bool:
    """Whether another open file holds one of ``cache``'s :data:`BUILD_LOCKS`, i.e. a build into
    it is under way (``.ci/run`` starts one before pytest). Tries each lock without waiting."""
    for name in BUILD_LOCKS:
        path = cache / name
        if not path.exists():
            continue
        with open(path, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def bin_dir(cache: Path) -> Path:
    """Where the cache keeps this recipe's binaries: ``bin-recipe<RECIPE>``, so checkouts that
    build by different recipes (branches, an older jobgen) share one cache without rebuilding
    over each other."""
    return cache / f"bin-recipe{RECIPE}"


def build_info_path(cache: Path) -> Path:
    """The cache's stamp: what was built, from what, and how long it took."""
    return bin_dir(cache) / "BUILD-INFO.json"


def cached_binaries(cache: Path) -> dict[str, Any] | None:
    """The cache's stamp when it matches this recipe and every binary is there, else None."""
    try:
        info = json.loads(build_info_path(cache).read_text())
    except (OSError, ValueError):
        return None
    paths = [bin_dir(cache) / b for b in BINARIES] + [Path(info.get("etcd", "/nonexistent"))]
    if info.get("recipe") != RECIPE or not all(os.access(p, os.X_OK) for p in paths):
        return None
    return info


def ensure_binaries(cache: Path | None = None, *, log: Callable[[str], None] = lambda _: None,
                    keep_tree: bool = False) -> dict[str, Any]:
    """Make sure kube-apiserver, kube-controller-manager and etcd are in the cache (building
    them if needed) and return the stamp: ``{"recipe", "kube_version", "source_version",
    "reflect2_version", "go_version", "etcd", "build_s", "built_at"}`` plus ``"cached": bool``.
    ``keep_tree``: a build leaves its source tree and Go build cache in ``<cache>/src/tree``
    (~1 GB, :data:`SHARED_TREE_STAMP`) for the node binaries' build, which removes it.

    Raises:
        LabUnavailable: apt, the Debian mirror or the packages are not available.
        LabCommandError: the build itself failed (its log tail is in the message).
    """
    cache = cache or cache_dir()
    info = cached_binaries(cache)
    if info is not None:
        return {**info, "cached": True}
    with _locked(cache / ".lock"):
        info = cached_binaries(cache)  # another session may have built it meanwhile
        if info is not None:
            return {**info, "cached": True}
        return {**_build(cache, log, keep_tree=keep_tree), "cached": False}


def shared_tree(cache: Path, dsc: Path) -> Path | None:
    """The source tree a kube build kept (``ensure_binaries(keep_tree=True)``) when it was
    unpacked from ``dsc`` by this :data:`RECIPE` (its OpenAPI code generated), else None."""
    tree = cache / "src" / "tree"
    try:
        stamp = json.loads((tree / SHARED_TREE_STAMP).read_text())
    except (OSError, ValueError):
        return None
    return tree if stamp == {"dsc": dsc.name, "recipe": RECIPE} else None


def _build(cache: Path, log: Callable[[str], None], *, keep_tree: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    logs = cache / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    build_log = logs / "build.log"
    build_log.write_text("")
    missing = [pkg for pkg, marker in BUILD_PACKAGES.items() if not _installed(marker)]
    if missing:
        log(f"k8s lab: installing {' '.join(missing)}")
        apt_install(missing, build_log)
    uri, suite = debian_mirror()
    apt = PrivateApt(cache / "apt", uri, suite)
    log(f"k8s lab: fetching the {SOURCE_PACKAGE} source package from {uri} {suite} (private apt lists)")
    try:
        apt.update(build_log)
        dsc = apt.source(SOURCE_PACKAGE, cache / "src", build_log)
    except LabCommandError as exc:
        raise LabUnavailable(f"cannot download the {SOURCE_PACKAGE} source package: {exc}") from None
    tree = cache / "src" / "tree"
    unpack_source(dsc, tree, build_log)
    env = go_build_env(cache)
    log(f"k8s lab: building {' '.join(BUILD_TARGETS)} (log: {build_log})")
    compile_started = time.monotonic()
    # The one generated file the tarball lacks (pkg/generated/openapi); then the binaries, which
    # `make WHAT=` would build only after regenerating every other generated file too.
    run(["make", "gen_openapi"], cwd=tree, env=env, log=build_log, timeout=3600)
    run(["hack/make-rules/build.sh", *BUILD_TARGETS], cwd=tree, env=env, log=build_log, timeout=3600)
    compile_s = time.monotonic() - compile_started
    binaries = bin_dir(cache)
    binaries.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        built = next(iter(sorted(tree.glob(f"_output/**/{name}"))), None)
        if built is None:
            raise LabCommandError(["make"], 0, f"the build produced no {name}")
        shutil.copy2(built, binaries / f".{name}.tmp")
        os.replace(binaries / f".{name}.tmp", binaries / name)
    etcd = _fetch_etcd(cache, build_log)
    source_version = dsc.name[len(SOURCE_PACKAGE) + 1:-4]
    # ~1 GB, and with it the Go build cache: hack/lib/golang.sh sets GOCACHE to the tree's
    # _output/local/go/cache, whatever go_build_env says, so a build in a new tree is a cold one.
    if keep_tree:
        (tree / SHARED_TREE_STAMP).write_text(json.dumps({"dsc": dsc.name, "recipe": RECIPE}))
    else:
        shutil.rmtree(tree, ignore_errors=True)
    info = {
        "recipe": RECIPE, "kube_version": KUBE_VERSION, "source_version": source_version, "tags": list(BUILD_TAGS),
        "reflect2_version": _dpkg_version("golang-github-modern-go-reflect2-dev"), "go_version": _dpkg_version("golang-1.19-go"),
        "etcd": str(etcd), "etcd_version": _dpkg_version_of_deb(bin_dir(cache) / "debs"), "mirror": f"{uri} {suite}", "gc_flags": GO_GC_FLAGS,
        "build_s": round(time.monotonic() - started, 1), "compile_s": round(compile_s, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    build_info_path(cache).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def unpack_source(dsc: Path, tree: Path, build_log: Path) -> None:
    """``dpkg-source -x`` the source package ``dsc`` into ``tree`` (replacing it) and apply the
    one fix of the recipe: the vendored reflect2 v1.0.1 replaced by Debian's 1.0.2 (Go >= 1.18
    segfaults on custom resources with 1.0.1). Shared by this build and the node binaries'
    (kubenodes.py), so both compile the same source. ``--no-copy``: the upstream tarball (33 MB)
    is not copied next to a tree unpacked away from the .dsc."""
    shutil.rmtree(tree, ignore_errors=True)
    tree.parent.mkdir(parents=True, exist_ok=True)
    run(["dpkg-source", "--no-check", "--no-copy", "-x", str(dsc.resolve()), tree.name], cwd=tree.parent, log=build_log, timeout=900)
    vendored = tree / "vendor" / "github.com" / "modern-go" / "reflect2"
    shutil.rmtree(vendored)
    shutil.copytree(REFLECT2_SRC, vendored, symlinks=False)
    (vendored / "go.mod").unlink(missing_ok=True)


def go_build_env(cache: Path) -> dict[str, str]:
    """The environment of the recipe's ``make``/``build.sh``: Debian's Go 1.19 first in PATH, no
    module proxy, static binaries, the version stamp, the vendored modules with
    :data:`BUILD_TAGS`, no optimisation (:data:`GO_GC_FLAGS`). (Its GOCACHE reaches ``go`` only outside the kube build scripts:
    hack/lib/golang.sh points GOCACHE into the source tree's _output.)"""
    return {
        **os.environ, "PATH": f"{GO_ROOT_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "GOPROXY": "off", "CGO_ENABLED": "0",
        "KUBE_GIT_VERSION": KUBE_VERSION, "GOFLAGS": f"-mod=vendor -tags={','.join(BUILD_TAGS)}", "GOCACHE": str(cache / "gocache"),
        "GOPATH": str(cache / "gopath"), "HOME": str(cache), "GOGCFLAGS": GO_GC_FLAGS,
    }


def _fetch_etcd(cache: Path, log: Path) -> Path:
    """``apt-get download etcd-server`` + ``dpkg -x`` into the cache (nothing is installed)."""
    debs = bin_dir(cache) / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    try:
        run(["apt-get", "download", ETCD_PACKAGE], cwd=debs, log=log, timeout=600)
    except LabCommandError:
        run(["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}", "update"], log=log, timeout=600)
        run(["apt-get", "download", ETCD_PACKAGE], cwd=debs, log=log, timeout=600)
    deb = next(iter(sorted(debs.glob(f"{ETCD_PACKAGE}_*.deb"))))
    root = bin_dir(cache) / "etcd"
    shutil.rmtree(root, ignore_errors=True)
    run(["dpkg", "-x", str(deb), str(root)], log=log, timeout=300)
    etcd = next((p for p in (root / "usr" / "bin" / "etcd", root / "usr" / "sbin" / "etcd") if p.is_file()), None)
    if etcd is None:
        raise LabCommandError(["dpkg", "-x", str(deb)], 0, "no etcd binary in the package")
    return etcd


def _dpkg_version_of_deb(debs: Path) -> str:
    found = sorted(debs.glob(f"{ETCD_PACKAGE}_*.deb"))
    return found[-1].name.split("_")[1] if found else ""


def lowest_cpu_priority() -> None:
    """Give this process, and every process it starts, only the CPU that other work leaves idle:
    nice 19 for the process and for its session's autogroup.

    Linux (CONFIG_SCHED_AUTOGROUP, on where ``/proc/sys/kernel/sched_autogroup_enabled`` is 1)
    puts the processes of each session in one scheduling group and shares the CPU between groups
    by the group's nice value (sched(7), "The autogroup feature"), so ``setsid nice -n 19 CMD``
    runs CMD in a group of its own at nice 0, as heavy as the whole test session: two such CPU
    hogs slowed a CPU-bound loop 3x on 2 cores, 1.1x once their group's nice was 19.
    Without autogroups only the process's nice counts, and the write is skipped."""
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text("19")


#: ``$JOBGEN_K8S_BUILD_PRIORITY``: ``lowest`` (the default: a background build takes only the CPU
#: the tests leave idle, :func:`lowest_cpu_priority`) or ``normal`` (its session's scheduling
#: group weighs as much as the test session's: ``.ci/run`` on a cold machine, where the node level
#: waits for the builds and they are the run's longest chain).
BUILD_PRIORITY_ENV = "JOBGEN_K8S_BUILD_PRIORITY"
BUILD_PRIORITIES = ("lowest", "normal")


def background_priority_args() -> list[str]:
    """``["--lowest-priority"]`` unless :data:`BUILD_PRIORITY_ENV` says ``normal``.

    Raises LabError when the variable holds anything else."""
    value = os.environ.get(BUILD_PRIORITY_ENV, "lowest").strip() or "lowest"
    if value not in BUILD_PRIORITIES:
        raise LabError(f"${BUILD_PRIORITY_ENV} is {value!r}; use one of {', '.join(BUILD_PRIORITIES)}")
    return ["--lowest-priority"] if value == "lowest" else []


def background_build_argv(*, crd_server: bool, with_nodes: bool = False) -> list[str]:
    """``kubelab.py build [--crd-server] [--with-nodes] [--lowest-priority]`` (this file as a
    script, this interpreter; the priority from :func:`background_priority_args`)."""
    return [sys.executable, str(Path(__file__).resolve()), "build", *(["--crd-server"] if crd_server else []),
            *(["--with-nodes"] if with_nodes else []), *background_priority_args()]


def build_in_background(*, crd_server: bool, log: Path, cache: Path | None = None, with_nodes: bool = False) -> subprocess.Popen[bytes] | None:
    """Start :func:`background_build_argv` in a session of its own, by default at the lowest CPU
    priority (:func:`lowest_cpu_priority`; :data:`BUILD_PRIORITY_ENV`), its output appended to ``log``; returns the process, or None
    when the cache already holds what is asked for or a build into it is under way
    (:func:`build_running`: the tests wait for that one's lock instead).

    The build takes minutes of CPU on 2 cores; started early, it runs in the CPU a test session
    leaves idle (a single-threaded test, a lab waiting on a scheduler), and the ``k8s_build``
    fixture's :func:`ensure_binaries` (and :func:`ensure_crd_server`) then wait for its lock and
    read its cache instead of building in series with the tests. Nothing else changes: a failed
    background build leaves no stamp, and the fixture builds again in the foreground, reporting
    the error. Stop it with ``os.killpg(proc.pid, SIGTERM)``.
    """
    cache = cache or cache_dir()
    if with_nodes:
        import kubenodes  # it imports this module: only here, where the node level is asked for

        with_nodes = kubenodes.cached_nodes(cache) is None
    if cached_binaries(cache) is not None and (not crd_server or cached_crd_server(cache) is not None) and not with_nodes:
        return None
    if build_running(cache):
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        return subprocess.Popen(background_build_argv(crd_server=crd_server, with_nodes=with_nodes), stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, CACHE_ENV: str(cache)})


# --------------------------------------------------------------------------- optional: 1.36 CRD semantics

#: Debian sid's k8s.io/apiextensions-apiserver (0.36.x) with all its Go dependencies: a
#: standalone CRD server with strict field validation and CEL, which 1.20 lacks.
CRD_SERVER_PACKAGE = "golang-k8s-apiextensions-apiserver-dev"
#: 2: compiled without optimisation or inlining and linked without debug information (see
#: :func:`_build_crd_server`).
CRD_SERVER_RECIPE = 2
#: ``go build`` flags of the CRD server: the lab sends it a few dozen requests, so the compiler's
#: optimisation (``-N -l`` turns it and inlining off) and the DWARF tables (``-s -w``) are build
#: time it never pays back. Measured with one cold build each on 2 cores: 284 s of
#: compile CPU with Go's defaults, 220 s with these; the lab's tests took the same time with both.
CRD_SERVER_GO_FLAGS = ("-gcflags=all=-N -l", "-ldflags=-s -w")


def crd_server_info_path(cache: Path) -> Path:
    """The optional CRD server's stamp."""
    return cache / "crd-server" / "BUILD-INFO.json"


def cached_crd_server(cache: Path) -> dict[str, Any] | None:
    """The CRD server's stamp when it matches :data:`CRD_SERVER_RECIPE` and its binary is there, else None."""
    try:
        info = json.loads(crd_server_info_path(cache).read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("recipe") == CRD_SERVER_RECIPE and os.access(info.get("binary", ""), os.X_OK) else None


def ensure_crd_server(cache: Path | None = None, *, log: Callable[[str], None] = lambda _: None,
                      before_compile: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Build (or find cached) ``apiextensions-apiserver`` from Debian sid's Go source packages:
    the package's dependency closure is downloaded with a private apt configuration for sid and
    unpacked with ``dpkg -x`` (nothing is installed), then ``GO111MODULE=off go build`` with sid's
    Go. Returns the stamp (``binary``, ``package_version``, ``go``, ``build_s``, ``cached``).
    ``before_compile`` is called between the download and the compile (the ``build`` command
    downloads while the binaries the lab needs first compile, and compiles after them).

    Raises:
        LabUnavailable: any step fails (sid moves: this level is optional; tests skip).
    """
    cache = cache or cache_dir()
    info = cached_crd_server(cache)
    if info is not None:
        return {**info, "cached": True}
    with _locked(cache / ".lock-crd-server"):
        info = cached_crd_server(cache)  # another session (or a background build) may have built it meanwhile
        if info is not None:
            return {**info, "cached": True}
        try:
            return {**_build_crd_server(cache, log, before_compile), "cached": False}
        except (LabCommandError, OSError, StopIteration) as exc:
            raise LabUnavailable(f"the optional 1.36 apiextensions-apiserver did not build: {exc}"[:2000]) from None


def _build_crd_server(cache: Path, log: Callable[[str], None], before_compile: Callable[[], None] = lambda: None) -> dict[str, Any]:
    started = time.monotonic()
    base = cache / "crd-server"
    base.mkdir(parents=True, exist_ok=True)
    build_log = base / "build.log"
    build_log.write_text("")
    uri, _ = debian_mirror()
    apt = PrivateApt(base / "apt", uri, "sid", kind="deb")
    log(f"k8s lab: fetching {CRD_SERVER_PACKAGE} and its Go dependencies from {uri} sid (private apt lists)")
    apt.update(build_log)
    closure = [p for p in apt.dependency_closure(CRD_SERVER_PACKAGE) if p.startswith("golang-")]
    if CRD_SERVER_PACKAGE not in closure:
        raise LabUnavailable(f"{CRD_SERVER_PACKAGE} is not in sid any more")
    debs = base / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    files = apt.download(closure, debs, build_log)
    root = base / "root"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    for deb in files:
        run(["dpkg", "-x", str(deb), str(root)], timeout=300)
    goroot = max(root.glob("usr/lib/go-1.*"), key=lambda p: tuple(int(x) for x in p.name.split("-")[1].split(".")))
    package_version = next(f.name.split("_")[1] for f in files if f.name.startswith(CRD_SERVER_PACKAGE + "_"))
    bin_dir = base / "bin"
    bin_dir.mkdir(exist_ok=True)
    env = {"PATH": f"{goroot / 'bin'}:/usr/bin:/bin", "GOROOT": str(goroot), "GOPATH": str(root / "usr" / "share" / "gocode"),
           "GO111MODULE": "off", "CGO_ENABLED": "0", "GOCACHE": str(base / "gocache"), "GOTOOLCHAIN": "local", "HOME": str(base)}
    fetch_s = time.monotonic() - started
    before_compile()
    log(f"k8s lab: building k8s.io/apiextensions-apiserver {package_version} with {goroot.name} (log: {build_log})")
    compile_started = time.monotonic()
    run([str(goroot / "bin" / "go"), "build", *CRD_SERVER_GO_FLAGS, "-o", str(bin_dir / "apiextensions-apiserver"), "k8s.io/apiextensions-apiserver"],
        cwd=base, env=env, log=build_log, timeout=3600)
    compile_s = time.monotonic() - compile_started
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(debs, ignore_errors=True)
    info = {"recipe": CRD_SERVER_RECIPE, "binary": str(bin_dir / "apiextensions-apiserver"), "package_version": package_version,
            "go": goroot.name, "go_flags": list(CRD_SERVER_GO_FLAGS), "packages": len(files),
            "build_s": round(time.monotonic() - started, 1), "fetch_s": round(fetch_s, 1), "compile_s": round(compile_s, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    crd_server_info_path(cache).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


# --------------------------------------------------------------------------- the running lab


class K8sLab:
    """etcd + kube-apiserver (+ kube-controller-manager: garbagecollector, namespace) under ``root``.

    After :meth:`up`: ``kubeconfig`` (context ``jobgen-lab``, token auth, the serving cert as
    CA), ``server`` (https://127.0.0.1:<port>), ``crd_rejections`` (CRD file -> the server's
    message, for CRDs this server version cannot take), ``timings`` (seconds).
    """

    def __init__(self, root: Path, build: Mapping[str, Any], *, cache: Path | None = None, crds_dir: Path | None = None,
                 controller_manager: bool = True, bind_address: str = "127.0.0.1", extra_san_ips: Sequence[str] = (),
                 extra_apiserver_args: Sequence[str] = (), controllers: Sequence[str] = ("garbagecollector", "namespace")):
        """``bind_address``, ``extra_san_ips``, ``extra_apiserver_args`` and ``controllers`` are
        for the nodes (kubenodes.py): kubelets in their own network namespaces reach the API
        server on the lab bridge's address (in the certificate too), the API server reaches them
        with a client certificate, and the endpoint controller fills the Endpoints that cluster
        DNS serves. The defaults are the node-less lab."""
        self.root = Path(root)
        self.bind_address = bind_address
        self.extra_san_ips = tuple(extra_san_ips)
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.controllers = tuple(controllers)
        binaries = bin_dir(cache or cache_dir())
        self.bin = {name: str(binaries / name) for name in BINARIES} | {"etcd": str(build.get("etcd", ""))}
        self.crds_dir = crds_dir or default_crds_dir()
        self.controller_manager = controller_manager
        self.timings: dict[str, float] = {}
        self.crd_rejections: dict[str, str] = {}
        self.installed_crds: list[str] = []
        self.port = 0
        self.crd_port = 0
        self.crd_server_crds: dict[str, str] = {}
        self._children: list[subprocess.Popen[bytes]] = []

    # ----- paths

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig clients use (context ``jobgen-lab``)."""
        return self.root / "kubeconfig"

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The serving certificate (self-signed: it is its own CA)."""
        return self.root / "pki" / "apiserver.crt"

    def _pidfile(self, name: str) -> Path:
        return self.root / "run" / f"{name}.pid"

    def log_tails(self, lines: int = 30) -> str:
        """The last lines of every daemon log, for error messages."""
        return "\n".join(f"--- {p.name}\n{_tail(p, lines)}" for p in sorted((self.root / "log").glob("*.log")))

    # ----- API access (stdlib)

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 30, server: str | None = None) -> tuple[int, Any]:
        """``(status, decoded JSON)`` of one API call with the admin token (stdlib urllib), to
        the lab's API server or ``server``."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request((server or self.server) + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=context, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw.strip().startswith(b"{") else raw.decode()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, raw.decode(errors="replace")

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` (core/v1, scheduling, rbac, ... by its apiVersion), or leave it if it exists."""
        group_version = obj["apiVersion"]
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        plural = {"Namespace": "namespaces", "PriorityClass": "priorityclasses", "Secret": "secrets",
                  "ServiceAccount": "serviceaccounts", "ClusterTrainingRuntime": "clustertrainingruntimes"}[obj["kind"]]
        namespace = obj.get("metadata", {}).get("namespace")
        path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
        status, answer = self.request("POST", path, obj)
        if status not in (200, 201, 409):
            raise LabError(f"creating {obj['kind']} {obj['metadata']['name']}: {status} {answer}")
        return answer if isinstance(answer, dict) else {}

    # ----- up / down

    def up(self, *, timeout: float = 60.0) -> K8sLab:
        """Start etcd, kube-apiserver and (optionally) kube-controller-manager, write the
        kubeconfig, install the CRDs. Raises LabStartError (with log tails)."""
        started = time.monotonic()
        self.down()  # a lab left running under this root by an interrupted session
        for sub in ("pki", "run", "log", "etcd-data"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._write_pki()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self._start_core(timeout, started)
                break
            except LabStartError as exc:
                # The daemons are told their ports before they bind them (kube-apiserver cannot
                # pick its own: --secure-port=0 turns HTTPS off), so a port can be taken in
                # between. tests/ports.py picks them below the kernel's ephemeral range (no
                # bind(0) or outgoing connection gets them) and _start_core waits until each
                # daemon itself listens on its port; a daemon that lost its port says so in
                # its log: start again on fresh ports and a fresh etcd.
                self.down()
                if attempt == ATTEMPTS or not exc.port_taken:
                    raise
                print(f"kubelab: a port was taken, starting again on fresh ports: {str(exc).splitlines()[0]}",
                      file=sys.stderr)
                shutil.rmtree(self.root / "etcd-data", ignore_errors=True)
                (self.root / "etcd-data").mkdir()
        crd_started = time.monotonic()
        self._install_crds(timeout)
        self.timings["crds_s"] = round(time.monotonic() - crd_started, 2)
        # After the CRDs: the garbage collector discovers the resources it watches when it starts
        # and again only every 30 s (kube-controller-manager 1.20), so one started first left the
        # custom resources unwatched, and a foreground deletion of a PyTorchJob waiting, for up to
        # 30 s (a cancel --wait took 29 s of a 96 s session).
        if self.controller_manager:
            self._launch("kube-controller-manager", [
                self.bin["kube-controller-manager"], f"--kubeconfig={self.kubeconfig}", f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false", "--port=0", "--secure-port=0", "--use-service-account-credentials=false", "--v=1",
            ])
        self.timings["total_s"] = round(time.monotonic() - started, 2)
        (self.root / "lab.json").write_text(json.dumps({"server": self.server, "kubeconfig": str(self.kubeconfig),
                                                        "timings": self.timings, "crd_rejections": self.crd_rejections}, indent=2))
        return self

    def _start_core(self, timeout: float, started: float) -> None:
        """Start etcd and kube-apiserver on fresh ports (tests/ports.py) and wait until each
        listens on its own ports and /readyz answers 200. Raises LabStartError (with log tails)."""
        etcd_port, peer_port, self.port = next_port(), next_port(), next_port()
        self._launch("etcd", [self.bin["etcd"], "--name", "jobgen-lab", "--data-dir", str(self.root / "etcd-data"),
                              "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                              "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                              "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                              "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                              "--initial-cluster", f"jobgen-lab=http://127.0.0.1:{peer_port}",
                              "--log-level", "warn"])
        self._wait_http(f"http://127.0.0.1:{etcd_port}/health", "etcd", timeout, listens=(etcd_port, peer_port))
        self.timings["etcd_s"] = round(time.monotonic() - started, 2)
        pki = self.root / "pki"
        apiserver_started = time.monotonic()
        self._launch("kube-apiserver", [
            self.bin["kube-apiserver"], f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.bind_address}", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.213.0.0/24",
            # No controller-manager token controller and no kubelet: pods with the default
            # service account would wait for a token forever; the plugin is off.
            "--disable-admission-plugins=ServiceAccount",
            "--enable-priority-and-fairness=false", "--v=1", *self.extra_apiserver_args,
        ])
        self._write_kubeconfig()
        try:
            wait_for(self._ready, timeout, 0.2, what=f"kube-apiserver /readyz on {self.server}")
        except TimeoutError as exc:
            raise LabStartError(f"{exc}\n{self.log_tails()}") from None
        self.timings["apiserver_ready_s"] = round(time.monotonic() - apiserver_started, 2)

    def start_crd_server(self, binary: str, *, timeout: float = 90.0) -> str:
        """Start the optional 1.36 apiextensions-apiserver next to the running lab: its own etcd
        prefix, the lab's serving certificate, authentication and authorization delegated to the
        1.20 server (TokenReview, SubjectAccessReview with the lab's token). Adds the kubeconfig
        context ``jobgen-lab-crds`` and installs every CRD of :data:`CRD_FILES` there.

        Returns the context name. Raises LabStartError (with its log tail)."""
        started = time.monotonic()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self._start_crd_server(binary, timeout)
                break
            except LabStartError as exc:  # its port taken before it bound it: see up()
                self._stop_daemon("apiextensions-apiserver")
                if attempt == ATTEMPTS or not exc.port_taken:
                    raise
        self.timings["crd_server_ready_s"] = round(time.monotonic() - started, 2)
        self.crd_server_crds = self._install_crds(timeout, server=self.crd_server)
        return CRD_CONTEXT

    def _start_crd_server(self, binary: str, timeout: float) -> None:
        """One start of the CRD server on a fresh port, until /readyz answers 200."""
        pki = self.root / "pki"
        self.crd_port = next_port()
        etcd = next(a for a in _read_argv(self._pidfile("kube-apiserver")) if a.startswith("--etcd-servers="))
        self._launch("apiextensions-apiserver", [
            binary, etcd, "--etcd-prefix=/registry-crd-server", "--bind-address=127.0.0.1", f"--secure-port={self.crd_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", "--authentication-skip-lookup",
            # The 1.20 core server lacks the APIs these 1.36 admission plugins and flow control watch.
            "--disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
            "ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
            "--enable-priority-and-fairness=false", "--v=1",
        ])
        self._write_kubeconfig()

        def ready() -> bool:
            if "apiextensions-apiserver" not in self.daemon_pids():
                raise LabStartError(f"apiextensions-apiserver exited\n{_tail(self.root / 'log' / 'apiextensions-apiserver.log', 40)}")
            if not self._listens("apiextensions-apiserver", (self.crd_port,)):
                return False
            try:
                status, _ = self.request("GET", "/readyz", timeout=3, server=self.crd_server)
            except (OSError, urllib.error.URLError, ssl.SSLError):
                return False
            return status == 200
        try:
            wait_for(ready, timeout, 0.3, what="apiextensions-apiserver /readyz")
        except TimeoutError as exc:
            raise LabStartError(f"{exc}\n{_tail(self.root / 'log' / 'apiextensions-apiserver.log', 40)}") from None

    @property
    def crd_server(self) -> str:
        """The optional CRD server's URL (after :meth:`start_crd_server`)."""
        return f"https://127.0.0.1:{self.crd_port}"

    def down(self) -> None:
        """Stop the daemons this root's PID files name (SIGTERM, then SIGKILL), newest first."""
        for name in ("apiextensions-apiserver", "kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop_daemon(name)
        for child in self._children:
            with contextlib.suppress(Exception):
                child.wait(timeout=1)
        self._children.clear()

    def _stop_daemon(self, name: str) -> None:
        """Stop daemon ``name`` if its PID file names a live process of its binary; drop the file."""
        pidfile = self._pidfile(name)
        try:
            pid = int(pidfile.read_text().split()[0])
            expected = pidfile.read_text().split()[1]
        except (OSError, ValueError, IndexError):
            return
        if pid_alive(pid) and _cmdline(pid).startswith(expected):
            self._stop(pid, name)
        pidfile.unlink(missing_ok=True)

    def daemon_pids(self) -> dict[str, int]:
        """Running daemons: name -> PID (from the PID files, checked against /proc)."""
        out = {}
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "apiextensions-apiserver"):
            try:
                pid, expected = self._pidfile(name).read_text().split()[:2]
                if pid_alive(int(pid)) and _cmdline(int(pid)).startswith(expected):
                    out[name] = int(pid)
            except (OSError, ValueError):
                continue
        return out

    # ----- internals

    def _write_pki(self) -> None:
        pki = self.root / "pki"
        san = ",".join(["IP:127.0.0.1", *(f"IP:{ip}" for ip in self.extra_san_ips), "DNS:localhost"])
        san_file = pki / "apiserver.san"
        if not (pki / "apiserver.crt").is_file() or (self.extra_san_ips and _read(san_file) != san):
            run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=jobgen-lab-apiserver",
                 "-addext", f"subjectAltName={san}", "-keyout", str(pki / "apiserver.key"),
                 "-out", str(pki / "apiserver.crt")], timeout=60)
            san_file.write_text(san)
            run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"], timeout=60)
            run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")], timeout=60)
        (pki / "tokens.csv").write_text(f'{TOKEN},jobgen-admin,jobgen-admin-uid,"system:masters"\n')
        for path in pki.iterdir():
            path.chmod(0o600)

    def _write_kubeconfig(self) -> None:
        config: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Config", "current-context": CONTEXT, "preferences": {},
            "clusters": [{"name": CONTEXT, "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "jobgen-admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": "jobgen-admin", "namespace": "default"}}],
        }
        if self.crd_port:
            config["clusters"].append({"name": CRD_CONTEXT, "cluster": {"server": self.crd_server, "certificate-authority": str(self.ca_file)}})
            config["contexts"].append({"name": CRD_CONTEXT, "context": {"cluster": CRD_CONTEXT, "user": "jobgen-admin", "namespace": "default"}})
        self.kubeconfig.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
        self.kubeconfig.chmod(0o600)

    def _launch(self, name: str, argv: list[str]) -> int:
        log = self.root / "log" / f"{name}.log"
        with open(log, "ab") as fh:
            fh.write(f"$ {' '.join(argv)}\n".encode())
            fh.flush()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self._children.append(proc)
        self._pidfile(name).write_text(f"{proc.pid} {argv[0]}\n")
        time.sleep(0.05)
        if proc.poll() is not None:
            raise LabStartError(f"{name} exited with {proc.returncode} at once\n{_tail(log)}")
        return proc.pid

    def _listens(self, name: str, ports: Sequence[int]) -> bool:
        """Whether daemon ``name`` itself listens on all of ``ports`` (not merely some process:
        a port another process holds would answer for it). Raises LabStartError when it is not
        running."""
        pid = self.daemon_pids().get(name)
        if pid is None:
            raise LabStartError(f"{name} is not running\n{self.log_tails()}")
        return set(ports) <= listening_ports(pid)

    def _wait_http(self, url: str, what: str, timeout: float, *, listens: Sequence[int]) -> None:
        """Wait until daemon ``what`` listens on ``listens`` and ``url`` answers 200."""
        def healthy() -> bool:
            if not self._listens(what, listens):
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return resp.status == 200
            except (OSError, urllib.error.URLError):
                return False
        try:
            wait_for(healthy, timeout, 0.1, what=f"{what} on port(s) {', '.join(map(str, listens))}")
        except TimeoutError as exc:
            raise LabStartError(f"{exc}\n{self.log_tails()}") from None

    def _ready(self) -> bool:
        self._listens("etcd", ())
        if not self._listens("kube-apiserver", (self.port,)):
            return False
        try:
            status, _ = self.request("GET", "/readyz", timeout=3)
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False
        return status == 200

    def _install_crds(self, timeout: float, *, server: str | None = None) -> dict[str, str]:
        """POST every CRD of :data:`CRD_FILES` to ``server`` (default: the lab's) and wait until
        each accepted one is Established; returns the rejections (file -> the server's message).
        On the lab's own server the PyTorchJob CRD must be accepted."""
        import yaml

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        rejections: dict[str, str] = {}
        installed: list[str] = []
        for rel in CRD_FILES:
            path = self.crds_dir / rel
            if not path.is_file():
                rejections[rel] = f"not found in {self.crds_dir}"
                continue
            crd = yaml.load(path.read_text(), Loader=loader)
            status, answer = self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, timeout=60, server=server)
            if status in (200, 201, 409):
                installed.append(crd["metadata"]["name"])
            else:
                message = answer.get("message", answer) if isinstance(answer, dict) else answer
                text = str(message)
                rejections[rel] = text if len(text) <= 600 else f"{text[:600]} ... ({text.count('Invalid value')} errors in all)"
        if server is None:
            self.crd_rejections, self.installed_crds = rejections, installed
            if CRD_FILES[0] in rejections:
                raise LabStartError(f"the PyTorchJob CRD was not installed: {rejections[CRD_FILES[0]]}")
        for name in installed:
            def established(crd_name: str = name) -> bool:
                status, answer = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}", server=server)
                conditions = (answer.get("status") or {}).get("conditions") or [] if isinstance(answer, dict) else []
                return status == 200 and any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
            wait_for(established, timeout, 0.1, what=f"CRD {name} Established")
        return {**rejections, **{name: "installed" for name in installed}}

    def _stop(self, pid: int, what: str, grace: float = 10.0) -> None:
        stop_pid(pid, what, grace)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _read_argv(pidfile: Path) -> list[str]:
    """The full argv of the daemon a PID file names (from /proc)."""
    try:
        pid = int(pidfile.read_text().split()[0])
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except (OSError, ValueError, IndexError):
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


# --------------------------------------------------------------------------- command line


def build(*, crd_server: bool, with_nodes: bool, log: Callable[[str], None]) -> dict[str, Any]:
    """Fill the cache in the order the lab's tests need it, on the critical path first:
    kube-apiserver + kube-controller-manager (every lab test), then kubelet + kube-scheduler in
    the same source tree (the node level, run after the API-server tests), then the optional CRD
    server (its few tests run last), whose download from sid runs in a thread from the start so
    the network time overlaps the compiles. Each part is recorded as a phase (tests/phases.py).
    Returns the stamps: the binaries' with ``crd_server`` and ``nodes`` added as asked.

    Raises LabError (LabUnavailable, LabCommandError) from the first part that fails; the CRD
    server's is raised after the others finished."""
    import threading

    from tests import phases

    cache = cache_dir()
    go_on = threading.Event()
    crd: dict[str, Any] = {}

    def crd_build() -> None:
        try:
            with phases.phase("build: CRD server (sid download, then compile)"):
                crd["info"] = ensure_crd_server(cache, log=log, before_compile=go_on.wait)
        except LabError as exc:
            crd["error"] = exc

    thread = threading.Thread(target=crd_build, name="crd-server", daemon=True) if crd_server else None
    if thread is not None:
        thread.start()
    try:
        with phases.phase("build: kube-apiserver + kube-controller-manager + etcd"):
            info = ensure_binaries(cache, log=log, keep_tree=with_nodes)
        if with_nodes:
            import kubenodes
            with phases.phase("build: kubelet + kube-scheduler + node runtime"):
                info = {**info, "nodes": kubenodes.ensure_node_binaries(cache, log=log)}
    finally:
        go_on.set()
        if thread is not None:
            thread.join()
    if "error" in crd:
        raise crd["error"]
    if thread is not None:
        info = {**info, "crd_server": crd["info"]}
    return info


def main(argv: Sequence[str] | None = None) -> int:
    """``build`` | ``up`` | ``down`` | ``status`` (each with ``--root``); returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build (or find cached) kube-apiserver, kube-controller-manager and etcd")
    build_cmd.add_argument("--crd-server", action="store_true", help="also the optional 1.36 apiextensions-apiserver (Debian sid)")
    build_cmd.add_argument("--with-nodes", action="store_true", help="also kubelet, kube-scheduler, the runtime and images (kubenodes.py)")
    build_cmd.add_argument("--lowest-priority", action="store_true",
                       help="nice 19 for this build and its session's scheduling group (start it with setsid)")
    for name, text in (("up", "start the lab"), ("down", "stop it"), ("status", "show daemon PIDs")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--root", type=Path, default=Path("/tmp/jobgen-k8s-lab"))
        if name == "up":
            p.add_argument("--crd-server", action="store_true", help="also start the optional 1.36 CRD server (context jobgen-lab-crds)")
            p.add_argument("--with-nodes", action="store_true",
                           help="also two kubelet nodes, kube-scheduler and cluster DNS: pods run (kubenodes.py)")
    args = parser.parse_args(argv)
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        if args.command == "build":
            if args.lowest_priority:
                lowest_cpu_priority()
            print(json.dumps(build(crd_server=args.crd_server, with_nodes=args.with_nodes, log=say), indent=2, sort_keys=True))
        elif args.command == "up":
            nodes = None
            if args.with_nodes:
                import kubenodes
                lab, nodes = kubenodes.up_with_nodes(args.root, log=say)
            else:
                lab = K8sLab(args.root, ensure_binaries(log=say)).up()
            if args.crd_server:
                lab.start_crd_server(ensure_crd_server(log=say)["binary"])
            print(json.dumps({"kubeconfig": str(lab.kubeconfig), "server": lab.server, "timings": lab.timings,
                              "crd_rejections": lab.crd_rejections, "crd_server_crds": lab.crd_server_crds,
                              "nodes_timings": nodes.timings if nodes else None}, indent=2))
            print(f"export KUBECONFIG={lab.kubeconfig}", file=sys.stderr)
        elif args.command == "down":
            if (args.root / "nodes").is_dir():
                import kubenodes
                kubenodes.down_with_nodes(args.root)
            else:
                K8sLab(args.root, {"etcd": ""}).down()
        else:
            pids = K8sLab(args.root, {"etcd": ""}).daemon_pids()
            if (args.root / "nodes").is_dir():
                import kubenodes
                pids |= kubenodes.NodeLab(args.root).daemon_pids()
            print(json.dumps(pids, indent=2))
    except LabError as exc:
        print(f"k8s lab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Run main() of this file imported as ``kubelab`` (as the tests and kubenodes.py import it), not
    # of ``__main__``: one copy of the module, so kubenodes' LabError is the one main() catches.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kubelab

    sys.exit(kubelab.main())
