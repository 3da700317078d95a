"""The Kubernetes node lab's shared definitions (kubenodes.py, nodebuild.py, nodedown.py): the nodes,
their network (:data:`NETWORK`, tests/netns.py), the kernel settings and machine paths the node
daemons change, and the /proc and cgroup readers the teardown uses. kubenodes.py re-exports the names
tests use, so ``kubenodes.X`` keeps working.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import kubelab

from tests.netns import LabNetwork  # the repository is on sys.path once kubelab is imported

SUBNET = ipaddress.ip_network("10.213.16.0/24")
HOST_IP = "10.213.16.1"
BRIDGE = "jkbr0"
#: The bridge's ``ip link`` alias: marks it as this lab's and names the root.
OWNER_TAG = "jobgen-k8s-nodes root="
CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250


@dataclass(frozen=True)
class Node:
    """One lab node: a network namespace with a veth on the lab bridge and its own pod CIDR."""

    name: str  #: the Node object's name (kubelet --hostname-override)
    netns: str
    ip: str
    veth: str  #: host end, on the bridge
    peer: str  #: namespace end
    pod_cidr: str

    @property
    def gateway(self) -> str:
        """The node's address on its CNI bridge (its pods' default gateway)."""
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    def cgroup(self, root: Path) -> str:
        """The kubelet's --cgroup-root for a lab under ``root`` (the pods' cgroups live below it):
        the root's hash in the name, so a lab under another root never touches these."""
        return f"/jobgen-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}-{self.name}"


NODES = (
    Node("jk-node1", "jknode1", "10.213.16.11", "jkvnode1", "jkenode1", "10.213.17.0/24"),
    Node("jk-node2", "jknode2", "10.213.16.12", "jkvnode2", "jkenode2", "10.213.18.0/24"),
)
#: The address ranges the lab uses (checked against the machine's addresses and routes).
LAB_NETS = (SUBNET, *(ipaddress.ip_network(n.pod_cidr) for n in NODES))
#: The lab's bridge, node namespaces and veths (every link name starts with ``jk``).
NETWORK = LabNetwork(BRIDGE, HOST_IP, SUBNET, OWNER_TAG, "jk", NODES)
#: Kernel settings kubelet 1.20 changes at start (pkg/kubelet/cm/container_manager_linux.go
#: setupKernelTunables): saved before the first kubelet starts and put back by ``down``.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
CGROUP_FS = Path("/sys/fs/cgroup")
#: Machine paths the node daemons write whatever their flags say: kubelet 1.20's device-plugin
#: socket (/var/lib/kubelet/device-plugins/kubelet.sock) and pod logs (/var/log/pods,
#: /var/log/containers), containerd 1.6's shim sockets (/run/containerd/s) and libcni's result
#: cache (/var/lib/cni/results). ``down`` removes what the lab left there, and a directory of
#: this list that did not exist before ``prepare`` once it is empty.
MACHINE_PATHS = ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet", "/var/log/pods", "/var/log/containers",
                 "/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni")

# --------------------------------------------------------------------------- helpers


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (from /proc/self/mountinfo), deepest first."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def _cgroup_hierarchies() -> list[Path]:
    """The cgroup hierarchies mounted under /sys/fs/cgroup: the v1 controllers (cpu, memory, ...,
    name=systemd) and the hybrid layout's cgroup2 at ``unified``, where runc makes the
    containers' cgroups too (``down`` must remove them there as well)."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if fields[2] in ("cgroup", "cgroup2") and fields[1].startswith(str(CGROUP_FS) + "/"):
                out.append(Path(fields[1]))
    return sorted(out)

def _stop_pid(pid: int, what: str, grace: float) -> None:
    kubelab.stop_pid(pid, what, grace, label="k8s nodes")
