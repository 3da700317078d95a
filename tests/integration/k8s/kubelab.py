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
import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository's tests package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

# The build (kubebuild.py) and the shared helpers (kubecore.py): their names used elsewhere are
# re-exported here, so tests and kubenodes.py keep using ``kubelab.X``.
from kubebuild import (  # noqa: E402, F401
    BUILD_PRIORITIES,
    BUILD_PRIORITY_ENV,
    DPKG_LOCK_WAIT_S,
    PrivateApt,
    _dpkg_version,
    _installed,
    _locked,
    apt_install,
    background_build_argv,
    background_priority_args,
    bin_dir,
    build_in_background,
    build_running,
    debian_mirror,
    ensure_binaries,
    ensure_crd_server,
    go_build_env,
    lowest_cpu_priority,
    shared_tree,
    unpack_source,
)
from kubecore import (  # noqa: E402, F401
    BINARIES,
    BUILD_PACKAGES,
    BUILD_TAGS,
    CACHE_ENV,
    CONTEXT,
    CRD_CONTEXT,
    CRD_FILES,
    GO_GC_FLAGS,
    KUBE_VERSION,
    RECIPE,
    SHARED_TREE_STAMP,
    SOURCE_PACKAGE,
    TOKEN,
    LabCommandError,
    LabError,
    LabStartError,
    LabUnavailable,
    _tail,
    cache_dir,
    default_crds_dir,
    listening_ports,
    run,
    wait_for,
)

from tests.ports import ATTEMPTS, next_port  # noqa: E402
from tests.processes import cmdline, pid_alive, stop_pid, wait_exec  # noqa: E402  (kubenodes.py uses them through this module)

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
        if pid_alive(pid) and cmdline(pid)[:1] == [expected]:
            self._stop(pid, name)
        pidfile.unlink(missing_ok=True)

    def daemon_pids(self) -> dict[str, int]:
        """Running daemons: name -> PID (from the PID files, checked against /proc)."""
        out = {}
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "apiextensions-apiserver"):
            try:
                pid, expected = self._pidfile(name).read_text().split()[:2]
                if pid_alive(int(pid)) and cmdline(int(pid))[:1] == [expected]:
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
        time.sleep(0.05)  # a daemon whose flags it rejects exits at once: say so here
        if not wait_exec(proc) or proc.poll() is not None:
            raise LabStartError(f"{name} exited with {proc.wait()} at once\n{_tail(log)}")
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
        return cmdline(int(pidfile.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return []


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
