"""Building the Kubernetes lab's binaries into the cache (kubelab.py's build recipe): a private apt
configuration for Debian source and binary packages, the cached kube-apiserver, kube-controller-
manager and etcd, the optional 1.36 CRD server, and the background build a test session starts early
at the lowest CPU priority. kubelab.py re-exports the names tests and kubenodes.py use."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kubecore import (
    BINARIES,
    BUILD_PACKAGES,
    BUILD_TAGS,
    BUILD_TARGETS,
    CACHE_ENV,
    ETCD_PACKAGE,
    GO_GC_FLAGS,
    GO_ROOT_BIN,
    KUBE_VERSION,
    RECIPE,
    REFLECT2_SRC,
    SHARED_TREE_STAMP,
    SOURCE_PACKAGE,
    LabCommandError,
    LabError,
    LabUnavailable,
    cache_dir,
    run,
)

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
    """``kubelab.py build [--crd-server] [--with-nodes] [--lowest-priority]`` (kubelab.py, beside this
    file, as a script; this interpreter; the priority from :func:`background_priority_args`)."""
    return [sys.executable, str(Path(__file__).resolve().with_name("kubelab.py")), "build", *(["--crd-server"] if crd_server else []),
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
