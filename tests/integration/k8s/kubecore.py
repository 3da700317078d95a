"""The Kubernetes lab's shared parts (kubelab.py, kubebuild.py, kubenodes.py): the build recipe's
constants, the lab's errors, running a command, waiting, the ports a process listens on, where the
build cache and the CRDs are. kubelab.py re-exports the names tests and kubenodes.py use, so
``kubelab.X`` keeps working.

This module imports nothing from jobgen: the standard library and tests/ports.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

if __package__ in (None, ""):  # run as a script: make the repository's tests package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.ports import address_in_use  # noqa: E402

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
    path of ``jobgen.backends.kubernetes.validate.PACKAGED_CRDS_DIR``, spelt out: this module imports no jobgen)."""
    configured = os.environ.get("JOBGEN_CRDS_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / "jobgen" / "_crds"
