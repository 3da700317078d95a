"""Taking the Kubernetes node lab down (kubenodes.py's :class:`NodeLab` inherits
:class:`NodeTeardown`): delete the pods through the API server, stop what is left through
containerd, stop the daemons, unmount, remove the cgroups, the pod logs, the network and the
machine paths the daemons wrote, and put back the kernel settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubelab
from kubelab import (
    K8sLab,
    LabCommandError,
    LabError,
    cmdline,
    wait_for,
)
from nodecore import (
    BRIDGE,
    MACHINE_PATHS,
    NODES,
    Node,
    _cgroup_hierarchies,
    _mounts_under,
    _stop_pid,
)

from tests.netns import link_exists  # the repository is on sys.path once kubelab is imported


class NodeTeardown:
    """The teardown half of :class:`kubenodes.NodeLab` (a base class of it): its methods use the
    lab's paths (``root``, ``base``, :meth:`node_dir`, :meth:`socket`), its containerd client
    (:meth:`ctr`, :meth:`containers`), its daemons (:meth:`daemon_pids`, :meth:`_stop_daemon`),
    network and kernel-setting methods, ``_children`` and ``timings``."""

    # ----- down

    def down(self, lab: K8sLab | None = None, *, drain_timeout: float = 60.0) -> None:
        """Stop everything :meth:`prepare`/:meth:`up` started under this root and remove what
        they made (see the module docstring). ``lab``, when its API server still runs, is used
        to delete the pods first so the kubelets stop them cleanly. Raises LabError naming what
        could not be removed."""
        if not self.base.exists():
            return
        started = time.monotonic()
        problems: list[str] = []
        pids = self.daemon_pids()
        if lab is not None and "kube-apiserver" in lab.daemon_pids() and any(k.startswith("kubelet-") for k in pids):
            try:
                self._delete_all_pods(lab, drain_timeout)
            except (LabError, TimeoutError, OSError) as exc:
                # Not fatal: what the kubelets did not stop, containerd is told to kill below.
                print(f"k8s nodes: the pods were not stopped through the API server ({exc}"[:300]
                      + "); stopping the containers through containerd", file=sys.stderr)
        for node in NODES:
            self._stop_daemon(f"kubelet-{node.name}")
        for node in NODES:
            if f"containerd-{node.name}" in pids:
                self._remove_containers(node)
            self._stop_daemon(f"containerd-{node.name}")
            self._stop_shims(node)
        for name in ("kube-scheduler", "dns-watch", "dnsmasq"):
            self._stop_daemon(name, grace=5)
        for node in NODES:
            self._kill_cgroup(node)
        for point in _mounts_under(self.base):
            if subprocess.run(["umount", point], capture_output=True).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True)
        left = _mounts_under(self.base)
        if left:
            problems.append(f"mounts left: {', '.join(left[:5])}")
        for node in NODES:
            self._remove_cgroup(node, problems)
            self._remove_pod_logs(node)
        self._network_down(problems)
        if not (link_exists(BRIDGE) and not self._network_is_ours()):  # not while another root's kubelets run
            self._restore_kernel_tunables()
            self._clean_machine_paths()
        for child in self._children:
            with contextlib.suppress(Exception):
                child.wait(timeout=1)
        self._children.clear()
        self.timings["down_s"] = round(time.monotonic() - started, 2)
        if problems:
            raise LabError("node lab teardown incomplete: " + "; ".join(problems))

    def _delete_all_pods(self, lab: K8sLab, timeout: float) -> None:
        """Delete every pod (grace period 0) and wait until no container runs on either node."""
        status, answer = lab.request("GET", "/api/v1/pods")
        for pod in (answer.get("items") or []) if status == 200 and isinstance(answer, dict) else []:
            meta = pod["metadata"]
            lab.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})

        def stopped() -> bool:
            return all(not self.ctr(node, "tasks", "ls", "-q", timeout=20).split() for node in NODES)
        wait_for(stopped, timeout, 0.5, what="the pods' containers to stop")

    def _remove_containers(self, node: Node) -> None:
        """Kill and delete whatever containerd still has (kubelet gone: no CNI teardown, the
        node's namespace goes with its bridge; libcni's cached results of those sandboxes are
        dropped here)."""
        with contextlib.suppress(LabCommandError):
            for container in self.containers(node):
                for cached in Path("/var/lib/cni/results").glob(f"*-{container}-*"):
                    cached.unlink(missing_ok=True)
            for task in self.ctr(node, "tasks", "ls", "-q", timeout=20).split():
                with contextlib.suppress(LabCommandError):
                    self.ctr(node, "tasks", "kill", "-s", "SIGKILL", task, timeout=20)
                with contextlib.suppress(LabCommandError):
                    self.ctr(node, "tasks", "delete", "-f", task, timeout=30)
            for container in self.containers(node):
                with contextlib.suppress(LabCommandError):
                    self.ctr(node, "containers", "delete", container, timeout=30)

    def _stop_shims(self, node: Node) -> None:
        """containerd-shim processes of this node's containerd (their argv names its socket)."""
        sock = str(self.socket(node))
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                argv = cmdline(int(entry.name))
                if argv and "containerd-shim" in argv[0] and sock in argv:
                    _stop_pid(int(entry.name), f"shim {entry.name}", 5)

    def _kill_cgroup(self, node: Node) -> None:
        """SIGKILL every process left in the node's cgroups (containers whose shim is gone)."""
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / node.cgroup(self.root).lstrip("/")
            if not top.is_dir():
                continue
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    for pid in procs.read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)

    def _clean_machine_paths(self) -> None:
        """After the daemons stopped: kubelet's device-plugin socket, then every directory of
        :data:`MACHINE_PATHS` that did not exist before :meth:`prepare`, once empty."""
        saved = self.base / "machine-paths.json"
        try:
            existed = json.loads(saved.read_text())
        except (OSError, ValueError):
            return
        if not existed.get("/var/lib/kubelet/device-plugins"):
            for name in ("kubelet.sock", "DEPRECATION"):
                with contextlib.suppress(OSError):
                    (Path("/var/lib/kubelet/device-plugins") / name).unlink()
        for path in MACHINE_PATHS:  # children before their parents
            if not existed.get(path, True):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
        saved.unlink()

    def _remove_pod_logs(self, node: Node) -> None:
        """The pods' log directories kubelet 1.20 keeps in the fixed /var/log/pods (named
        ``<namespace>_<pod>_<uid>``) and their links in /var/log/containers, for every pod UID the
        node's kubelet root still lists: normally none are left (kubelet removes them with the pod).
        Both the machine's directories and the node's own (its mount namespace's, :meth:`_make_mount_ns`)."""
        uids = {p.name for p in (self.node_dir(node) / "kubelet" / "pods").glob("*")}
        if not uids:
            return
        own = self.node_dir(node) / "var-log"
        for path in [*Path("/var/log/pods").glob("*_*_*"), *(own / "pods").glob("*_*_*")]:
            if path.name.rsplit("_", 1)[-1] in uids:
                kubelab.shutil.rmtree(path, ignore_errors=True)
        for link in [*Path("/var/log/containers").glob("*.log"), *(own / "containers").glob("*.log")]:
            if link.is_symlink() and not link.exists():
                target = os.readlink(link)
                if any(f"_{uid}/" in target for uid in uids):
                    link.unlink()

    def _remove_cgroup(self, node: Node, problems: list[str]) -> None:
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / node.cgroup(self.root).lstrip("/")
            if not top.is_dir():
                continue
            for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
                for _ in range(20):
                    try:
                        path.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
            if top.is_dir():
                problems.append(f"cgroup {top} left")
