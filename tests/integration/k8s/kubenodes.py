#!/usr/bin/env python3
"""Two kubelet nodes for the Kubernetes lab (kubelab.py): pods that really run on this machine.

``kubelab.py up --with-nodes`` starts the lab's etcd + kube-apiserver +
kube-controller-manager and, with this module:

- a bridge ``jkbr0`` (10.213.16.1/24, its ``ip link`` alias naming the lab root) and two
  network namespaces ``jknode1``/``jknode2`` (10.213.16.11/.12 on veth pairs), the "nodes";
- in each node's namespace its own containerd (Debian's 1.6.20, socket, root and state under
  the lab root, runc 1.1.5, cgroupfs, overlayfs) and kubelet 1.20.2 (``--cgroup-driver=cgroupfs``,
  its own ``--cgroup-root``), registered as ``jk-node1``/``jk-node2``;
- a CNI bridge network per node (containernetworking-plugins 1.1.1: ``bridge`` + ``host-local``),
  pod CIDRs 10.213.17.0/24 and 10.213.18.0/24, routed between the nodes (each node has a route
  to the other's pod CIDR; the host has both, for DNS answers and ``kubectl logs``); the nodes
  have no default route: pods reach the lab, not the machine's network;
- kube-scheduler 1.20.2 (host namespace, the admin kubeconfig);
- cluster DNS: dnsmasq on 10.213.16.1:53 (``kubelet --cluster-dns``) answering from a hosts
  file that a small watcher (:func:`dns_watch`, this file's ``dns-watch`` command) rewrites from
  the Services and Endpoints it polls: ``<service>.<namespace>.svc.cluster.local`` for headless
  Services (one record per ready address) and ``<hostname>.<service>.<namespace>.svc.cluster.local``
  for addresses with a hostname. It stands in for CoreDNS (not in Debian 12). ClusterIP Services do
  not work: there is no kube-proxy.
- apiserver -> kubelet (``kubectl logs``/exec): each kubelet serves on its node IP, port 10250,
  with a self-signed certificate (the API server does not verify it: no
  ``--kubelet-certificate-authority``), and accepts only client certificates of the lab's own CA
  (``--anonymous-auth=false --client-ca-file``), authorizing every authenticated request
  (``--authorization-mode=AlwaysAllow``); the API server presents such a certificate
  (``--kubelet-client-certificate``). Kubelets reach the API server with the lab's admin token.
- images without a registry: the pause container compiled from the source tree's
  ``build/pause/linux/pause.c`` (static gcc) and a test image from Debian's busybox-static, both
  written by :func:`write_image_tar` as docker-archive tarballs (fixed mtimes, sorted entries:
  byte-for-byte reproducible) and imported with ``ctr -n k8s.io images import``; pods use
  ``imagePullPolicy: Never`` (:data:`PAUSE_IMAGE`, :data:`BUSYBOX_IMAGE`).

Binaries: kubelet and kube-scheduler are built with kubelab.py's recipe (same source package,
the reflect2 fix, ``providerless``, Go 1.19, the cache's shared Go build cache) into a cache entry
of their own, ``nodes-recipe<N>/`` with its own BUILD-INFO.json, so kube-apiserver's cached build
stays valid. containerd, runc, the CNI plugins, dnsmasq (with the three libraries it links that
are not installed) and busybox-static are ``apt-get download`` + ``dpkg -x`` into the same entry
(nothing installed on the machine: no service is started or enabled by a package).

``down`` deletes every pod through the API server (kubelet stops them with CNI teardown), stops
what is left through containerd, stops the daemons by PID file, unmounts anything left under the
root, removes the cgroups (``/jobgen-<hash of the root>-<node>`` in every hierarchy), the
namespaces, the veths and the bridge, and puts back the kernel settings the kubelets changed
(``kernel.panic``, ``vm.overcommit_memory``...: kubelet 1.20 sets them at start). A few machine
paths are written whatever the flags say (:data:`MACHINE_PATHS`: pod logs in /var/log/pods,
kubelet's device-plugin socket, containerd's shim sockets, libcni's result cache); ``down``
removes the lab's entries there and the directories that did not exist before.

The node tests run in the lab tier, after the other k8s lab tests; ``JOBGEN_SKIP_K8S_NODES=1`` skips them (conftest.py).
Notes and measured times: docs/labs-k8s-nodes-notes.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# kubelab is imported as the k8s conftest imports it (this directory on sys.path), so both see one
# module and its exception classes.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import kubelab  # noqa: E402
from kubelab import (  # noqa: E402
    TOKEN,
    K8sLab,
    LabCommandError,
    LabError,
    LabStartError,
    _tail,
    cmdline,
    pid_alive,
    run,
    wait_exec,
    wait_for,
)

# The node build (nodebuild.py), the shared definitions (nodecore.py) and the teardown (nodedown.py):
# their names used elsewhere are re-exported here (``kubenodes.X``).
from nodebuild import (  # noqa: E402, F401
    BUSYBOX_IMAGE,
    IMAGE_MTIME,
    NODE_RECIPE,
    PAUSE_IMAGE,
    RUNTIME_LIBRARIES,
    RUNTIME_PACKAGES,
    Entry,
    cached_nodes,
    ensure_node_binaries,
    missing_libraries,
    node_dir,
    runtime_path,
    write_image_tar,
)
from nodecore import (  # noqa: E402, F401
    BRIDGE,
    CLUSTER_DOMAIN,
    HOST_IP,
    KERNEL_TUNABLES,
    KUBELET_PORT,
    LAB_NETS,
    MACHINE_PATHS,
    NETWORK,
    NODES,
    Node,
    _cgroup_hierarchies,
    _stop_pid,
)
from nodedown import NodeTeardown  # noqa: E402

from tests.netns import link_alias  # noqa: E402  (the repository on sys.path: kubelab.py)

# --------------------------------------------------------------------------- the nodes


class NodeLab(NodeTeardown):
    """The node part of a lab under ``root`` (``root/nodes/``): network, containerd + kubelet per
    node, kube-scheduler, dnsmasq and its watcher. Use :func:`lab_args` for the K8sLab it
    needs, :meth:`prepare` before ``K8sLab.up``, :meth:`up` after it, :meth:`down` before
    ``K8sLab.down``."""

    def __init__(self, root: Path, cache: Path | None = None):
        self.root = Path(root).resolve()  # it names the bridge's owner and the cgroups: one spelling
        self.cache = cache or kubelab.cache_dir()
        self.base = self.root / "nodes"
        self.timings: dict[str, float] = {}
        self._children: list[subprocess.Popen[bytes]] = []

    # ----- paths

    def node_dir(self, node: Node) -> Path:
        """Everything one node writes: containerd root/state, kubelet root, CNI config."""
        return self.base / node.name

    def socket(self, node: Node) -> Path:
        """The node's containerd socket."""
        return self.node_dir(node) / "containerd.sock"

    @property
    def pki(self) -> Path:
        """The lab CA and the API server's kubelet-client certificate."""
        return self.base / "pki"

    def _pidfile(self, name: str) -> Path:
        return self.base / "run" / f"{name}.pid"

    def ctr(self, node: Node, *args: str, timeout: float = 120) -> str:
        """``ctr --address <node's socket> -n k8s.io ARGS``; returns its output."""
        return run([str(runtime_path(self.cache, "usr/bin/ctr")), "--address", str(self.socket(node)), "-n", "k8s.io", *args],
                   timeout=timeout)

    def containers(self, node: Node) -> list[str]:
        """IDs of the containers (sandboxes included) in the node's containerd, k8s.io namespace."""
        return self.ctr(node, "containers", "ls", "-q").split()

    # ----- the API server side

    def lab_args(self) -> dict[str, Any]:
        """Keyword arguments of the K8sLab the nodes need (see K8sLab.__init__)."""
        return {
            "bind_address": "0.0.0.0", "extra_san_ips": (HOST_IP,),
            # endpoint: the Endpoints cluster DNS serves; nodelifecycle: removes the
            # node.kubernetes.io/not-ready taint kubelet registers with (else nothing schedules);
            # persistentvolume-binder: binds a PersistentVolumeClaim to its PersistentVolume (the
            # pod tests' shared run directory, a hostPath PV; the scheduler waits for the binding).
            "controllers": ("garbagecollector", "namespace", "endpoint", "nodelifecycle", "persistentvolume-binder"),
            "extra_apiserver_args": (f"--kubelet-client-certificate={self.pki / 'apiserver-kubelet-client.crt'}",
                                     f"--kubelet-client-key={self.pki / 'apiserver-kubelet-client.key'}",
                                     "--kubelet-preferred-address-types=InternalIP"),
        }

    def prepare(self) -> None:
        """Before K8sLab.up: tear down a node lab left under this root, check the names and
        subnets are free, write the PKI the API server's flags name, build the network."""
        started = time.monotonic()
        self.down()
        self._check_conflicts()
        for node in NODES:  # an earlier run's containerd root, IP allocations, kubelet state
            kubelab.shutil.rmtree(self.node_dir(node), ignore_errors=True)
        for sub in ("run", "log", "pki", "dns"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._write_pki()
        self._save_kernel_tunables()
        machine_paths = self.base / "machine-paths.json"
        if not machine_paths.is_file():
            machine_paths.write_text(json.dumps({path: os.path.lexists(path) for path in MACHINE_PATHS}, indent=2) + "\n")
        self._network_up()
        self.timings["network_s"] = round(time.monotonic() - started, 2)

    def up(self, lab: K8sLab, *, timeout: float = 120.0) -> NodeLab:
        """After K8sLab.up: dnsmasq + its watcher, kube-scheduler, then per node containerd (the
        images imported) and kubelet; waits until both Node objects are Ready. Raises
        LabStartError with the log tails."""
        started = time.monotonic()
        binaries = node_dir(self.cache) / "bin"
        self._write_dns_files()
        self._launch("dnsmasq", self._dnsmasq_argv(), env={**os.environ, "LD_LIBRARY_PATH": str(runtime_path(
            self.cache, RUNTIME_LIBRARIES))})
        self._wait_listening("dnsmasq", 53, timeout)
        self._launch("dns-watch", [sys.executable, str(Path(__file__).resolve()), "dns-watch", "--root", str(self.root),
                                   "--server", lab.server])
        self._launch("kube-scheduler", [str(binaries / "kube-scheduler"), f"--kubeconfig={lab.kubeconfig}", "--leader-elect=false",
                                        "--port=0", "--secure-port=0", "--v=1"])
        for node in NODES:
            node_started = time.monotonic()
            self._start_containerd(node, timeout)
            self.timings[f"{node.name}_containerd_s"] = round(time.monotonic() - node_started, 2)
            self._start_kubelet(node, lab)
        for node in NODES:
            try:
                wait_for(lambda n=node: self.node_ready(lab, n), timeout, 0.5, what=f"node {node.name} Ready")
            except TimeoutError as exc:
                raise LabStartError(f"{exc}\n{self.log_tails()}") from None
        self.timings["nodes_ready_s"] = round(time.monotonic() - started, 2)
        return self

    def _wait_listening(self, name: str, port: int, timeout: float) -> None:
        """Wait until daemon ``name`` itself listens on TCP ``port``; LabStartError (with its log
        tail) when it exits or does not within ``timeout``."""
        def listening() -> bool:
            pid = self.daemon_pids().get(name)
            if pid is None:
                raise LabStartError(f"{name} exited\n{_tail(self.base / 'log' / f'{name}.log', 30)}")
            return port in kubelab.listening_ports(pid)
        try:
            wait_for(listening, timeout, 0.1, what=f"{name} listening on port {port}")
        except TimeoutError as exc:
            raise LabStartError(f"{exc}\n{_tail(self.base / 'log' / f'{name}.log', 30)}") from None

    @staticmethod
    def node_ready(lab: K8sLab, node: Node) -> bool:
        """Whether the Node object exists and its Ready condition is True."""
        status, answer = lab.request("GET", f"/api/v1/nodes/{node.name}")
        if status != 200 or not isinstance(answer, dict):
            return False
        conditions = (answer.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    # ----- network

    def _check_conflicts(self) -> None:
        """Refuse when the jk* names belong to another root or to something else, or the lab's
        address ranges overlap an address or route outside the lab."""
        taken = NETWORK.taken()
        if taken:
            other = NETWORK.owner()
            if other is not None:
                raise LabError(f"another jobgen k8s lab with nodes is up (root {other}; {', '.join(taken)}); stop it with: "
                               f"{sys.executable} {Path(kubelab.__file__).resolve()} down --root {other}")
            raise LabError(f"{', '.join(taken)} already exist and are not this lab's (bridge {BRIDGE} alias {link_alias(BRIDGE)!r})")
        why = NETWORK.overlap(run, LAB_NETS[1:])
        if why:
            raise LabError(why)

    def _network_up(self) -> None:
        """The bridge (host address, owner alias), per node a namespace + veth, routes: each
        node to the other's pod CIDR directly, the host to both; no default route in the nodes."""
        (self.base / "network").write_text("up\n")
        NETWORK.up(self.root, run)
        for node in NODES:
            # No default route: the nodes need only the lab subnet (API server, DNS on the host)
            # and the other node's pod CIDR. Anything else fails at once (ENETUNREACH) instead of
            # timing out on the host, which forwards nothing: kubelet 1.20 links the AWS ECR
            # credential provider and cAdvisor's cloud detection whatever the build tags, and with
            # a default route via the host each waited ~5 s (169.254.169.254, the host's
            # nameserver) at every kubelet start.
            run(["ip", "netns", "exec", node.netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
            run(["ip", "route", "add", node.pod_cidr, "via", node.ip, "dev", BRIDGE])
        for node in NODES:
            for other in NODES:
                if other != node:
                    run(["ip", "-n", node.netns, "route", "add", other.pod_cidr, "via", other.ip])

    def _network_is_ours(self) -> bool:
        return NETWORK.is_ours(self.root, built=(self.base / "network").is_file())

    def _network_down(self, problems: list[str]) -> None:
        if not self._network_is_ours():
            return
        problems += NETWORK.down()
        (self.base / "network").unlink(missing_ok=True)

    # ----- PKI

    def _write_pki(self) -> None:
        """A lab CA (kubelets trust it for clients) and the API server's client certificate."""
        pki = self.pki
        if (pki / "apiserver-kubelet-client.crt").is_file():
            return

        def ssl(*args: str) -> None:
            run(["openssl", *args], cwd=pki, timeout=60)
        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=jobgen-lab-ca", "-keyout", "ca.key", "-out", "ca.crt")
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "-keyout", "apiserver-kubelet-client.key", "-out", "apiserver-kubelet-client.csr")
        ssl("x509", "-req", "-in", "apiserver-kubelet-client.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "30",
            "-out", "apiserver-kubelet-client.crt")
        for path in pki.iterdir():
            path.chmod(0o600)

    # ----- kernel settings kubelet changes

    def _save_kernel_tunables(self) -> None:
        saved = self.base / "kernel-tunables.json"
        if saved.is_file():
            return
        values = {}
        for key in KERNEL_TUNABLES:
            with contextlib.suppress(OSError):
                values[key] = (Path("/proc/sys") / key).read_text().strip()
        saved.write_text(json.dumps(values, indent=2) + "\n")

    def _restore_kernel_tunables(self) -> None:
        saved = self.base / "kernel-tunables.json"
        try:
            values = json.loads(saved.read_text())
        except (OSError, ValueError):
            return
        for key, value in values.items():
            with contextlib.suppress(OSError):
                if (Path("/proc/sys") / key).read_text().strip() != value:
                    (Path("/proc/sys") / key).write_text(value + "\n")
        saved.unlink()

    # ----- DNS

    @property
    def hosts_file(self) -> Path:
        """The file dnsmasq serves (``--addn-hosts``), rewritten by the watcher."""
        return self.base / "dns" / "hosts"

    def _write_dns_files(self) -> None:
        self.hosts_file.write_text("")
        # The kubelets' --resolv-conf: no search domains or options of the machine's own leak into pods.
        (self.base / "dns" / "resolv.conf").write_text(f"nameserver {HOST_IP}\n")

    def _dnsmasq_argv(self) -> list[str]:
        return [str(runtime_path(self.cache, "usr/sbin/dnsmasq")), "--keep-in-foreground", "--log-facility=-", "--conf-file=/dev/null",
                "--no-resolv", "--no-hosts", "--no-negcache", f"--addn-hosts={self.hosts_file}", f"--listen-address={HOST_IP}",
                "--bind-interfaces", "--port=53", f"--local=/{CLUSTER_DOMAIN}/", "--local=/#/", "--pid-file=", "--user=root", "--group=root"]

    # ----- containerd, kubelet

    def _in_netns(self, node: Node, argv: list[str], *, mount_ns: bool = False) -> list[str]:
        """argv in the node's network namespace (nsenter; not ``ip netns exec``, which also
        remounts /sys and so hides /sys/fs/cgroup from the kubelet); with ``mount_ns`` also in
        the node's mount namespace (:meth:`_make_mount_ns`)."""
        mount = [f"--mount={self.node_dir(node) / 'mntns'}"] if mount_ns else []
        return ["nsenter", f"--net=/run/netns/{node.netns}", *mount, "--", *argv]

    def _make_mount_ns(self, node: Node) -> None:
        """A mount namespace for the node's containerd and kubelet (and so its shims and pods),
        kept by a bind mount on ``<node dir>/mntns``, in which /var/log/pods and
        /var/log/containers are the node's own directories. kubelet 1.20 writes pod logs to the
        fixed /var/log/pods, and its container GC removes every log directory there of a pod it
        does not know: with one shared directory each kubelet deleted the other node's pod logs
        within a minute (the API server then answers a log request with 200 and kubelet's "failed
        to try resolving symlinks" text). Copied from the host's mounts, private: the mounts the
        kubelet makes (emptyDir on tmpfs, ...) stay in this namespace, seen by this node's
        containerd and runc only, as on a real node; the rest of the file system is shared."""
        d = self.node_dir(node)
        binds = []
        for fixed in ("/var/log/pods", "/var/log/containers"):
            own = d / "var-log" / Path(fixed).name
            own.mkdir(parents=True, exist_ok=True)
            Path(fixed).mkdir(parents=True, exist_ok=True)  # recorded in machine-paths.json: down removes it if it was absent
            binds.append(f"mount --bind {own} {fixed}")
        (d / "mntns").touch()
        run(["unshare", f"--mount={d / 'mntns'}", "--propagation", "private", "sh", "-c", " && ".join(binds)], timeout=30)

    def _containerd_config(self, node: Node) -> str:
        d = self.node_dir(node)
        runtime = node_dir(self.cache) / "runtime"
        return f"""\
version = 2
root = "{d / 'containerd-root'}"
state = "{d / 'containerd-state'}"
plugin_dir = ""
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.socket(node)}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'containerd-opt'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  # This machine withholds CAP_SYS_RESOURCE even from root: runc cannot lower oom_score_adj to
  # the -998 kubelet asks for the pause container ("nsexec: failed to update
  # /proc/self/oom_score_adj: Permission denied"). Restricted, it is clamped to containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_tls_streaming = false
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runtime / 'usr/sbin/runc'}"
        Root = "{d / 'containerd-state' / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{runtime / 'usr/lib/cni'}"
    conf_dir = "{d / 'cni'}"
    max_conf_num = 1
"""

    def _cni_config(self, node: Node) -> dict[str, Any]:
        return {"cniVersion": "0.4.0", "name": "jobgen-lab", "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr, "gateway": node.gateway}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.node_dir(node) / "cni-ipam")},
        }]}

    def _start_containerd(self, node: Node, timeout: float) -> None:
        d = self.node_dir(node)
        (d / "cni").mkdir(parents=True, exist_ok=True)
        (d / "containerd.toml").write_text(self._containerd_config(node))
        (d / "cni" / "10-jobgen-lab.conflist").write_text(json.dumps(self._cni_config(node), indent=2) + "\n")
        runtime = node_dir(self.cache) / "runtime"
        env = {**os.environ, "PATH": f"{runtime / 'usr/bin'}:{runtime / 'usr/sbin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self._make_mount_ns(node)
        self._launch(f"containerd-{node.name}", self._in_netns(node, [str(runtime / "usr/bin/containerd"), "--config",
                                                                     str(d / "containerd.toml")], mount_ns=True), env=env)

        def serving() -> bool:
            if f"containerd-{node.name}" not in self.daemon_pids():
                raise LabStartError(f"containerd of {node.name} exited\n{_tail(self.base / 'log' / f'containerd-{node.name}.log', 40)}")
            try:
                self.ctr(node, "version", timeout=10)
            except LabCommandError:
                return False
            return True
        try:
            wait_for(serving, timeout, 0.2, what=f"containerd of {node.name}")
        except TimeoutError as exc:
            raise LabStartError(f"{exc}\n{_tail(self.base / 'log' / f'containerd-{node.name}.log', 40)}") from None
        for image in ("pause.tar", "busybox.tar"):
            self.ctr(node, "images", "import", str(node_dir(self.cache) / "images" / image), timeout=300)

    def _make_cgroup_root(self, node: Node) -> None:
        """The kubelet's --cgroup-root must exist in every hierarchy; cpuset needs its cpus/mems."""
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / node.cgroup(self.root).lstrip("/")
            path.mkdir(exist_ok=True)
            if (hierarchy / "cpuset.cpus").exists():
                for key in ("cpuset.cpus", "cpuset.mems"):
                    if not (path / key).read_text().strip():
                        (path / key).write_text((hierarchy / key).read_text())

    def _start_kubelet(self, node: Node, lab: K8sLab) -> None:
        d = self.node_dir(node)
        kubeconfig = d / "kubelet.kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": f"https://{HOST_IP}:{lab.port}", "certificate-authority": str(lab.ca_file)}}],
            "users": [{"name": "kubelet", "user": {"token": TOKEN}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "kubelet"}}]}, indent=2) + "\n")
        kubeconfig.chmod(0o600)
        self._make_cgroup_root(node)
        sock = f"unix://{self.socket(node)}"
        env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}  # (see _network_up)
        self._launch(f"kubelet-{node.name}", self._in_netns(node, [
            str(node_dir(self.cache) / "bin" / "kubelet"), f"--kubeconfig={kubeconfig}", f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-pki'}", f"--volume-plugin-dir={d / 'volume-plugins'}",
            "--container-runtime=remote", f"--container-runtime-endpoint={sock}", f"--image-service-endpoint={sock}",
            "--runtime-request-timeout=5m", f"--hostname-override={node.name}", f"--node-ip={node.ip}",
            f"--node-labels=jobgen.io/lab-node={node.name}", f"--pod-cidr={node.pod_cidr}",
            "--cgroup-driver=cgroupfs", f"--cgroup-root={node.cgroup(self.root)}", "--cgroups-per-qos=true", "--fail-swap-on=false",
            f"--cluster-dns={HOST_IP}", f"--cluster-domain={CLUSTER_DOMAIN}", f"--resolv-conf={self.base / 'dns' / 'resolv.conf'}",
            f"--address={node.ip}", f"--port={KUBELET_PORT}", "--read-only-port=0", "--healthz-port=0",
            "--anonymous-auth=false", f"--client-ca-file={self.pki / 'ca.crt'}", "--authorization-mode=AlwaysAllow",
            "--make-iptables-util-chains=false", f"--pod-infra-container-image={PAUSE_IMAGE}",
            "--image-gc-high-threshold=100", "--image-gc-low-threshold=99",
            "--eviction-hard=memory.available<50Mi,nodefs.available<1%,imagefs.available<1%", "--max-pods=30",
            "--serialize-image-pulls=false",
            # The first status after registration says NotReady (the runtime check has not run
            # yet); the default 10 s until the next one was half of the lab's start-up.
            "--node-status-update-frequency=4s",
            # A deleted pod leaves the API server only once kubelet saw its resources reclaimed,
            # which can wait for the next full pod sync (default 1 min: one pod took 60 s to go).
            "--sync-frequency=10s", "--v=1",
        ], mount_ns=True), env=env)

    # ----- processes

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        log = self.base / "log" / f"{name}.log"
        with open(log, "ab") as fh:
            fh.write(f"$ {' '.join(argv)}\n".encode())
            fh.flush()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self._children.append(proc)
        # nsenter execs its command: the PID stays, argv[0] becomes the daemon's (checked on stop).
        expected = argv[argv.index("--") + 1] if argv[0] == "nsenter" else argv[0]
        self._pidfile(name).write_text(f"{proc.pid} {expected}\n")
        time.sleep(0.05)  # a daemon whose flags it rejects exits at once: say so here
        if not wait_exec(proc) or proc.poll() is not None:
            raise LabStartError(f"{name} exited with {proc.wait()} at once\n{_tail(log)}")
        return proc.pid

    def daemon_pids(self) -> dict[str, int]:
        """Running node daemons: name -> PID (PID files checked against /proc)."""
        out = {}
        for pidfile in sorted((self.base / "run").glob("*.pid")):
            with contextlib.suppress(OSError, ValueError):
                pid, expected = pidfile.read_text().split()[:2]
                argv = cmdline(int(pid))
                if pid_alive(int(pid)) and argv and (argv[0] == expected or (argv[0] == "nsenter" and expected in argv)):
                    out[pidfile.stem] = int(pid)
        return out

    def _stop_daemon(self, name: str, grace: float = 10.0) -> None:
        pid = self.daemon_pids().get(name)
        if pid is not None:
            _stop_pid(pid, name, grace)
        self._pidfile(name).unlink(missing_ok=True)

    def log_tails(self, lines: int = 30) -> str:
        """The last lines of every node daemon's log."""
        return "\n".join(f"--- {p.name}\n{_tail(p, lines)}" for p in sorted((self.base / "log").glob("*.log")))


def attach(root: Path, cache: Path | None = None) -> K8sLab:
    """A K8sLab handle on the lab running under ``root`` (its port from ``lab.json``): enough to
    call its API and stop it."""
    lab = K8sLab(root, {"etcd": ""}, cache=cache)
    with contextlib.suppress(OSError, ValueError, KeyError):
        lab.port = int(json.loads((Path(root) / "lab.json").read_text())["server"].rsplit(":", 1)[1])
    return lab


def up_with_nodes(root: Path, *, cache: Path | None = None, timeout: float = 180.0,
                  log: Callable[[str], None] = lambda _: None) -> tuple[K8sLab, NodeLab]:
    """The whole lab with its two nodes under ``root``: the binaries (cached or built), the
    node network, etcd + kube-apiserver + kube-controller-manager, then the nodes. On failure
    everything started is stopped again and the error raised."""
    cache = cache or kubelab.cache_dir()
    info = kubelab.ensure_binaries(cache, log=log)
    ensure_node_binaries(cache, log=log)
    started = time.monotonic()
    nodes = NodeLab(root, cache)
    old = attach(root, cache)
    nodes.down(old)
    old.down()
    # A fresh cluster: objects kept in an earlier run's etcd (Nodes reported Ready, pods bound to
    # them) would be taken for the new nodes' state and started again by the new kubelets.
    kubelab.shutil.rmtree(Path(root) / "etcd-data", ignore_errors=True)
    lab = K8sLab(root, info, cache=cache, **nodes.lab_args())
    try:
        nodes.prepare()
        lab.up()
        nodes.up(lab, timeout=timeout)
    except BaseException:
        with contextlib.suppress(LabError):
            nodes.down(lab)
        lab.down()
        raise
    lab.timings["with_nodes_total_s"] = round(time.monotonic() - started, 2)
    return lab, nodes


def down_with_nodes(root: Path, *, cache: Path | None = None) -> None:
    """Stop the lab under ``root``, its nodes first (pods deleted through the API server while
    it still runs). Raises LabError naming what was left."""
    lab = attach(root, cache)
    try:
        NodeLab(root, cache).down(lab)
    finally:
        lab.down()


def down_and_check(lab: kubelab.K8sLab, nodes: NodeLab) -> list[str]:
    """Take the lab with nodes down (:func:`down_with_nodes`) and return what is left of it (empty:
    nothing): a daemon that was not running before (etcd, kube-apiserver, kube-controller-manager,
    kube-scheduler, dnsmasq, dns-watch), a network namespace, link, mount, process or cgroup of the
    lab, libcni's cached results. The ``k8s_nodes`` fixture's teardown asserts it is empty."""
    root = nodes.root
    pids = {**lab.daemon_pids(), **nodes.daemon_pids()}
    problems = [f"not running before down: {name}" for name in
                sorted({"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "dnsmasq", "dns-watch"} - set(pids))]
    started = time.monotonic()
    down_with_nodes(root)
    print(f"k8s nodes: down took {time.monotonic() - started:.1f} s", file=sys.stderr)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    problems += [f"network namespace {node.netns}" for node in NODES if node.netns in netns]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    problems += [f"link {name}" for name in (BRIDGE, *(n.veth for n in NODES)) if name in links]
    problems += [f"mount {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(root) in line]
    problems += [f"process {name} (pid {pid})" for name, pid in pids.items()
                 if Path(f"/proc/{pid}").exists() and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()]
    problems += [f"cgroup {path}" for node in NODES for path in Path("/sys/fs/cgroup").glob(f"*{node.cgroup(root)}")]
    problems += [f"libcni result {path}" for path in Path("/var/lib/cni/results").glob("jobgen-lab-*")]
    problems += [f"daemon pid file {name}" for name in (*lab.daemon_pids(), *nodes.daemon_pids())]
    return problems


# --------------------------------------------------------------------------- cluster DNS feed


def dns_records(services: Sequence[dict[str, Any]], endpoints: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(ip, name)`` records for the headless Services: ``<svc>.<ns>.svc.<domain>`` for every
    ready address of its Endpoints, ``<hostname>.<svc>.<ns>.svc.<domain>`` for addresses with a
    hostname (pods with ``hostname`` + ``subdomain``). Sorted."""
    headless = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services
                if (s.get("spec") or {}).get("clusterIP") == "None"}
    records = set()
    for ep in endpoints:
        key = (ep["metadata"]["namespace"], ep["metadata"]["name"])
        if key not in headless:
            continue
        name = f"{key[1]}.{key[0]}.svc.{CLUSTER_DOMAIN}"
        for subset in ep.get("subsets") or []:
            for address in subset.get("addresses") or []:
                records.add((address["ip"], name))
                if address.get("hostname"):
                    records.add((address["ip"], f"{address['hostname']}.{name}"))
    return sorted(records)


def dns_watch(root: Path, server: str, *, interval: float = 0.5) -> None:
    """Poll the API server's Services and Endpoints every ``interval`` seconds and, when the
    records change, rewrite the hosts file and SIGHUP dnsmasq (which rereads it). Runs until killed."""
    nodes = NodeLab(root)
    lab = K8sLab(root, {"etcd": ""})
    lab.port = int(server.rsplit(":", 1)[1])
    last: list[tuple[str, str]] | None = None
    while True:
        try:
            s_status, services = lab.request("GET", "/api/v1/services", timeout=10)
            e_status, endpoints = lab.request("GET", "/api/v1/endpoints", timeout=10)
        except OSError:
            time.sleep(interval)
            continue
        if s_status == 200 and e_status == 200 and isinstance(services, dict) and isinstance(endpoints, dict):
            records = dns_records(services.get("items") or [], endpoints.get("items") or [])
            if records != last:
                tmp = nodes.hosts_file.with_name("hosts.tmp")
                tmp.write_text("".join(f"{ip}\t{name}\n" for ip, name in records))
                os.replace(tmp, nodes.hosts_file)
                pid = nodes.daemon_pids().get("dnsmasq")
                if pid:
                    os.kill(pid, signal.SIGHUP)
                last = records
        time.sleep(interval)


def main(argv: Sequence[str] | None = None) -> int:
    """``build`` (the node entry of the cache) | ``dns-watch`` (internal: the DNS feed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find cached) kubelet, kube-scheduler, pause, the runtime and the images")
    watch = sub.add_parser("dns-watch", help="(internal) feed dnsmasq from the Endpoints")
    watch.add_argument("--root", type=Path, required=True)
    watch.add_argument("--server", required=True)
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            print(json.dumps(ensure_node_binaries(log=lambda m: print(m, file=sys.stderr)), indent=2, sort_keys=True))
        except LabError as exc:
            print(f"k8s nodes: {exc}", file=sys.stderr)
            return 1
    else:
        dns_watch(args.root, args.server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
