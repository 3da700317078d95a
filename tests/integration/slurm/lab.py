#!/usr/bin/env python3
"""A real two-node SLURM cluster on this machine, for jobgen's integration tests.

One slurmctld ("controller") and two slurmd hosts ("node1", "node2"), each in its own network
namespace with its own IP, hostname and /etc/hosts, joined by a Linux bridge that also gives the
host an address, so sbatch/srun/squeue/scancel/sacct run on the host reach the cluster.
The pitfalls the recipe answers are numbered in docs/labs.md ("What the SLURM lab's recipe
answers"); comments below cite them as "pitfall N".

Needs root, iproute2, util-linux (unshare, nsenter) and apt (Debian 12: slurm-wlm 22.05,
munge). Everything the lab writes lives under ROOT; it never edits /etc/hosts and only kills
processes it started (by PID file) or that live inside its own namespaces.

By hand:

    python tests/integration/slurm/lab.py up --root /tmp/jobgen-slurm-lab [--accounting]
    eval "$(python tests/integration/slurm/lab.py env --root /tmp/jobgen-slurm-lab)"
    srun -N2 hostname
    python tests/integration/slurm/lab.py status --root /tmp/jobgen-slurm-lab
    python tests/integration/slurm/lab.py down --root /tmp/jobgen-slurm-lab

This module imports nothing from jobgen and only the standard library.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # imported as ``lab`` (its directory on sys.path) or run as a script: the repository's tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

# The generic helpers (labtools.py) and the SLURM clients (slurmjobs.py): the names tests and
# sshlab.py use are re-exported here, so ``from lab import ...`` keeps working.
from labtools import (  # noqa: E402, F401
    SBIN,
    LabCommandError,
    LabConflictError,
    LabError,
    LabInstallError,
    LabStartError,
    _comm,
    _ppid,
    _process_identity,
    _require,
    _tail,
    apt_install,
    find_binary,
    run,
    wait_for,
)
from slurmjobs import (  # noqa: E402, F401
    job_state,
    release_requeued,
    run_slurm,
    sbatch,
    wait_for_job,
)

from tests.netns import LabNetwork, host_argv, link_alias, link_exists, namespace_pids, netns_inode  # noqa: E402
from tests.processes import pid_alive, stop_pid  # noqa: E402  (sshlab.py takes pid_alive from here)

CLUSTER_NAME = "jobgenlab"
PARTITION = "lab"
SUBNET = ipaddress.ip_network("10.213.7.0/24")
BRIDGE = "jgbr0"
HOST_IP = "10.213.7.1"
#: Name of the host (root namespace) in the lab hosts file.
HOST_NAME = "jglabhost"
#: Prefix of the bridge's `ip link` alias: marks the bridge as a jobgen lab and names its root.
OWNER_TAG = "jobgen-slurm-lab root="
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
MARIADB_PORT = 3306
#: Password of the lab's MariaDB user (the database only listens on 127.0.0.1 inside the
#: controller namespace).
DB_PASSWORD = "jobgenlab"

BASE_PACKAGES = ("slurm-wlm", "munge")
#: mariadb-server-core has mariadbd and mariadb-install-db; the latter needs my_print_defaults,
#: which is in mariadb-client-core.
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server-core", "mariadb-client-core")
BASE_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scancel",
                 "scontrol", "sinfo", "sacct")
ACCOUNTING_BINARIES = ("slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db",
                       "my_print_defaults")
#: How long slurmctld keeps an ended job in squeue (slurm.conf MinJobAge; SLURM's default).
MIN_JOB_AGE_S = 300


@dataclass(frozen=True)
class LabHost:
    """One lab host: a network namespace with its own hostname and IP on the lab bridge."""

    name: str  #: hostname inside the namespace; also the SLURM NodeName
    netns: str  #: network namespace (`ip netns`), /run/netns/<netns>
    ip: str  #: address on the lab bridge (/24 of SUBNET)
    veth: str  #: host end of the veth pair, attached to the bridge
    peer: str  #: namespace end of the veth pair


CONTROLLER = LabHost("controller", "jgctl", "10.213.7.10", "jgvctl", "jgectl")
NODES = (
    LabHost("node1", "jgnode1", "10.213.7.11", "jgvnode1", "jgenode1"),
    LabHost("node2", "jgnode2", "10.213.7.12", "jgvnode2", "jgenode2"),
)
HOSTS = (CONTROLLER, *NODES)
#: The lab's bridge, namespaces and veths (every link name starts with ``jg``).
NETWORK = LabNetwork(BRIDGE, HOST_IP, SUBNET, OWNER_TAG, "jg", HOSTS)




# --------------------------------------------------------------------------- the lab


class SlurmLab:
    """A real SLURM cluster (controller + node1 + node2) in network namespaces on this machine.

    ``root`` holds everything: slurm.conf (etc/), munge key and socket, state, spool, PID files
    (run/), logs (log/), job completion records (log/jobcomp.txt) and lab.json, so ``down()``
    works from a new process given the same root. ``cpus_per_node`` and ``real_memory_mb`` (MB)
    are what each node advertises to SLURM (SlurmdParameters=config_overrides: they need not
    match the machine). One CPU per node by default: the nodes share this machine's cores (2
    on CI), and a rank per node with 2 OpenMP threads oversubscribes them (measured:
    2 ranks x OMP_NUM_THREADS=2 on 2 cores took 2.3x the wall time and 2.5x the CPU of
    OMP_NUM_THREADS=1 for the lab's job). ``accounting=True`` adds slurmdbd + MariaDB in the
    controller namespace so that plain ``sacct``/``sacct --json`` work; without it ``sacct -c`` (jobcomp/filetxt)
    still does (pitfall 8).
    """

    def __init__(self, root: Path, *, accounting: bool = False, cpus_per_node: int = 1,
                 real_memory_mb: int = 4000):
        self.root = Path(root).resolve()
        self.accounting = accounting
        self.cpus_per_node = cpus_per_node
        self.real_memory_mb = real_memory_mb
        #: Wall seconds of the phases of the last ``up()``: install, network, daemons, ready.
        self.timings: dict[str, float] = {}
        self._children: list[subprocess.Popen[bytes]] = []

    # ----- paths

    @property
    def conf_dir(self) -> Path:
        """root/etc: slurm.conf, slurmdbd.conf, the lab hosts file."""
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        """The lab's slurm.conf (what SLURM_CONF names)."""
        return self.conf_dir / "slurm.conf"

    @property
    def hosts_file(self) -> Path:
        """Bind-mounted over /etc/hosts inside each lab namespace (never the host's)."""
        return self.conf_dir / "hosts"

    @property
    def log_dir(self) -> Path:
        """root/log: daemon logs, <daemon>.launch.log, jobcomp.txt."""
        return self.root / "log"

    @property
    def run_dir(self) -> Path:
        """root/run: the daemons' PID files."""
        return self.root / "run"

    @property
    def munge_socket(self) -> Path:
        """The lab munged's socket (AuthInfo=socket=..., pitfall 5)."""
        return self.root / "munge" / "munge.socket"

    @property
    def jobcomp_file(self) -> Path:
        """JobCompLoc: one line per finished job, what `sacct -c` reads (pitfall 8)."""
        return self.log_dir / "jobcomp.txt"

    @property
    def state_file(self) -> Path:
        """root/lab.json: how the lab was started (accounting, sizes) and whether it is up."""
        return self.root / "lab.json"

    @property
    def hosts(self) -> tuple[LabHost, ...]:
        """Controller first, then the nodes (names, namespaces, IPs, veth names)."""
        return HOSTS

    @property
    def nodes(self) -> tuple[str, ...]:
        """SLURM node names, in order: ("node1", "node2")."""
        return tuple(n.name for n in NODES)

    @property
    def env(self) -> dict[str, str]:
        """What a SLURM client on the host needs: SLURM_CONF (pitfall 7); jobs inherit it."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def client_env(self) -> dict[str, str]:
        """os.environ without inherited SLURM_* job variables, plus ``env``.

        Use it for sbatch/srun/squeue/scancel/sacct/scontrol (or submitit) run on the host.
        """
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**base, **self.env}

    # ----- daemon bookkeeping

    def _daemons(self) -> list[tuple[str, str, LabHost | None, Path]]:
        """(key, process name, namespace host or None for the host, PID file)."""
        out: list[tuple[str, str, LabHost | None, Path]] = [
            ("munged", "munged", None, self.run_dir / "munged.pid")]
        if self._accounting_configured():
            out += [("mariadbd", "mariadbd", CONTROLLER, self.run_dir / "mariadbd.pid"),
                    ("slurmdbd", "slurmdbd", CONTROLLER, self.run_dir / "slurmdbd.pid")]
        out.append(("slurmctld", "slurmctld", CONTROLLER, self.run_dir / "slurmctld.pid"))
        out += [(f"slurmd@{n.name}", "slurmd", n, self.run_dir / f"slurmd.{n.name}.pid")
                for n in NODES]
        return out

    def _accounting_configured(self) -> bool:
        state = self._read_state()
        return bool(state.get("accounting", self.accounting))

    def _read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self, **changes: object) -> None:
        state = {**self._read_state(), **changes}
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_file)

    def _pid_from_file(self, key: str, comm: str, host: LabHost | None, pidfile: Path) -> int | None:
        """The live PID named by ``pidfile`` if it is really our daemon, else None.

        Checks the process name and (for namespaced daemons) that it lives in the lab namespace,
        so a reused PID is never taken for ours (pitfall 10: stop by PID file, never by name).
        """
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not pid_alive(pid) or _comm(pid) != comm:
            return None
        if host is not None:
            lab_ino = netns_inode(f"/run/netns/{host.netns}")
            if lab_ino is None or netns_inode(f"/proc/{pid}/ns/net") != lab_ino:
                return None
        else:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                return None
            sock = os.fsencode(str(self.munge_socket))
            if not any(arg == sock or arg.endswith(b"=" + sock) for arg in cmdline):
                return None
        return pid

    def daemon_pids(self) -> dict[str, int]:
        """Live daemon PIDs by key: munged, slurmctld, slurmd@node1, slurmd@node2 (and
        mariadbd, slurmdbd with accounting). A daemon that is not running is left out."""
        out = {}
        for key, comm, host, pidfile in self._daemons():
            pid = self._pid_from_file(key, comm, host, pidfile)
            if pid is not None:
                out[key] = pid
        return out

    def namespace_pids(self) -> dict[str, list[int]]:
        """Every live PID in each lab namespace (via `ip netns pids`), by host name."""
        return {host.name: namespace_pids(host.netns) for host in HOSTS}

    def node_pids(self) -> dict[str, list[int]]:
        """PIDs in each lab namespace other than the lab's daemons, by host name
        ("controller", "node1", "node2"): slurmstepd and job processes. A finished or cancelled
        job must leave every list empty."""
        daemons = set(self.daemon_pids().values())
        # slurmctld forks slurmscriptd (a daemon helper, not a job process).
        daemons |= {p for pids in self.namespace_pids().values() for p in pids
                    if _ppid(p) in daemons and _comm(p) == "slurmscriptd"}
        return {name: [p for p in pids if p not in daemons]
                for name, pids in self.namespace_pids().items()}

    def log_tails(self, lines: int = 25) -> str:
        """The last ``lines`` lines of every daemon/launcher log under root/log."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {path} (last {lines} lines)\n{_tail(path, lines)}")
        return "\n".join(parts) or f"(no logs under {self.log_dir})"

    # ----- up

    def up(self, *, timeout: float = 60.0, owner_pid: int | None = None) -> SlurmLab:
        """Install what is missing, build the network, start the daemons, wait for idle nodes.

        ``timeout`` (seconds) bounds the wait for both nodes to show ``idle`` in sinfo.
        ``owner_pid`` names the process that holds the lab (the pytest fixture passes its own):
        once it has exited, a later ``up()`` under any root may tear this lab down
        (:meth:`abandoned`). Without it (``lab.py up``) the lab is held until ``down``.
        Raises LabInstallError (packages), LabConflictError (names/subnet taken by something
        else), LabStartError (with the daemons' log tails) or LabCommandError. On any failure
        it tears down what it built, so the caller may still call ``down()`` (a no-op then).
        """
        if os.geteuid() != 0:
            raise LabError("the SLURM lab needs root (network namespaces, bridge, daemons)")
        if any(c.isspace() or c in "#=," for c in str(self.root)):
            raise LabError(f"root {str(self.root)!r} has whitespace or one of '#=,', which "
                           "slurm.conf can't hold; use another --root")
        if len(os.fsencode(str(self.munge_socket))) > 100:
            raise LabError(f"root {self.root} is too long for a unix socket path "
                           f"({self.munge_socket}); use a shorter --root")
        t0 = time.monotonic()
        self.install()
        self.timings = {"install_s": time.monotonic() - t0}
        self._check_conflicts()
        try:
            t1 = time.monotonic()
            self._write_state(root=str(self.root), accounting=self.accounting,
                              owner=_process_identity(owner_pid) if owner_pid else None,
                              cpus_per_node=self.cpus_per_node,
                              real_memory_mb=self.real_memory_mb, network=True, up=False)
            self._write_files()
            self._network_up()
            t2 = time.monotonic()
            self._start_daemons()
            t3 = time.monotonic()
            self._wait_idle(timeout)
            t4 = time.monotonic()
        except BaseException:
            try:
                self._teardown(drain_timeout=5)
            except Exception as exc:  # keep the original error; mention the cleanup one
                print(f"lab: cleanup after failed up() also failed: {exc}", file=sys.stderr)
            raise
        self.timings.update(network_s=t2 - t1, daemons_s=t3 - t2, ready_s=t4 - t3,
                            total_s=t4 - t0)
        self._write_state(up=True)
        return self

    def install(self) -> None:
        """apt-get install the SLURM (and accounting) packages whose binaries are missing
        (see :func:`apt_install`). Raises LabInstallError."""
        packages = list(BASE_PACKAGES)
        binaries = list(BASE_BINARIES)
        if self.accounting:
            packages += ACCOUNTING_PACKAGES
            binaries += ACCOUNTING_BINARIES
        apt_install(packages, binaries)

    def _check_conflicts(self) -> None:
        """Refuse to touch jg* names or the lab subnet when they belong to something else.

        A lab left by an earlier run with this same root is torn down first, and so is one
        under another root that :meth:`abandoned` says nobody holds (a test session killed
        before its fixture's teardown); a held one (or anything without our bridge alias)
        raises LabConflictError.
        """
        taken = NETWORK.taken()
        if taken:
            other = NETWORK.owner()
            if other == str(self.root):
                print(f"lab: tearing down a lab left running under {self.root}", file=sys.stderr)
                self._teardown(drain_timeout=10)
            elif other is not None and (why := SlurmLab(Path(other)).abandoned()):
                print(f"lab: tearing down the lab under {other}: {why}", file=sys.stderr)
                SlurmLab(Path(other))._teardown(drain_timeout=10)
            elif other is not None:
                raise LabConflictError(
                    f"another jobgen SLURM lab is up (root {other}; {', '.join(taken)}); stop it "
                    f"with: {sys.executable} {Path(__file__).resolve()} down --root {other}")
            else:
                raise LabConflictError(
                    f"{', '.join(taken)} already exist and are not a jobgen lab's "
                    f"(bridge {BRIDGE} alias: {link_alias(BRIDGE)!r}); refusing to touch them")
        # The subnet must not overlap any address or route outside the lab.
        why = NETWORK.overlap(lambda argv: run(argv).stdout)
        if why:
            raise LabConflictError(why)

    def _write_files(self) -> None:
        for sub in ("etc", "log", "run", "state/slurmctld", "munge",
                    *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # slurm.conf's dir must stay world-readable (pitfall 5); the root too.
        self.root.chmod(0o755)
        self.conf_dir.chmod(0o755)
        # munge: key 0400 in a 0700 dir; socket dir not writable by others (pitfall 5).
        key_dir = self.root / "munge-key"
        key_dir.mkdir(mode=0o700, exist_ok=True)
        key_dir.chmod(0o700)
        key = key_dir / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(1024))
        key.chmod(0o400)
        (self.root / "munge").chmod(0o755)
        # Own hosts file, bind-mounted over /etc/hosts inside each namespace only (pitfall 2).
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
                 f"{HOST_IP}\t{HOST_NAME}", *(f"{h.ip}\t{h.name}" for h in HOSTS)]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        self.hosts_file.chmod(0o644)
        self.slurm_conf.write_text(self.render_slurm_conf())
        self.slurm_conf.chmod(0o644)
        if self.accounting:
            dbd = self.conf_dir / "slurmdbd.conf"
            dbd.write_text(self.render_slurmdbd_conf())
            dbd.chmod(0o600)  # slurmdbd refuses a conf readable by others

    def render_slurm_conf(self) -> str:
        """slurm.conf text for this lab (no systemd, no cgroups: pitfalls 3, 4, 5, 8)."""
        r = self.root
        lines = [
            f"# jobgen SLURM lab ({r}); written by tests/integration/slurm/lab.py",
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={CONTROLLER.name}({CONTROLLER.ip})",  # pitfall 3
            f"SlurmctldPort={SLURMCTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",  # pitfall 5
            "SlurmUser=root",
            "SlurmdUser=root",
            # pitfall 4: works without systemd/cgroups
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",  # memory not consumed: jobs can share a node
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "JobRequeue=1",
            "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            # nodes advertise what the config says, whatever this machine has
            "SlurmdParameters=config_overrides",
            f"StateSaveLocation={r}/state/slurmctld",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd.%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd.%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # SIGTERM -> SIGKILL after 5 s on scancel (default 30) keeps cancel tests short
            "InactiveLimit=0",
            "KillWait=5",
            f"MinJobAge={MIN_JOB_AGE_S}",
            "Waittime=0",
            # pitfall 8: `sacct -c` works from the job completion file without slurmdbd
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp_file}",
        ]
        if self.accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                f"AccountingStorageHost={CONTROLLER.ip}",  # the host has no name for it
                f"AccountingStoragePort={SLURMDBD_PORT}",
                f"AccountingStoragePass={self.munge_socket}",  # pitfall 5
            ]
        else:
            lines.append("AccountingStorageType=accounting_storage/none")
        lines += [
            f"NodeName={n.name} NodeAddr={n.ip} NodeHostname={n.name} "
            f"CPUs={self.cpus_per_node} RealMemory={self.real_memory_mb} State=UNKNOWN"
            for n in NODES
        ]
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def render_slurmdbd_conf(self) -> str:
        """slurmdbd.conf: slurmdbd in the controller namespace, MariaDB on its 127.0.0.1."""
        return "\n".join([
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"DbdHost={CONTROLLER.name}",
            f"DbdAddr={CONTROLLER.ip}",
            f"DbdPort={SLURMDBD_PORT}",
            "SlurmUser=root",
            f"PidFile={self.run_dir}/slurmdbd.pid",
            f"LogFile={self.log_dir}/slurmdbd.log",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={MARIADB_PORT}",
            "StorageUser=slurm",
            f"StoragePass={DB_PASSWORD}",
            "StorageLoc=slurm_acct_db",
        ]) + "\n"

    def _network_up(self) -> None:
        """Bridge with the host's lab IP; per host a netns, a veth pair, an IP, lo up."""
        NETWORK.up(self.root, run)

    def _in_namespace(self, host: LabHost, argv: Sequence[str]) -> list[str]:
        """argv run as ``host``: its netns via nsenter (pitfall 1: not `ip netns exec`), a
        private UTS+mount namespace with its hostname and the lab hosts file (pitfall 2)."""
        return [*host_argv(host.netns, host.name, [(str(self.hosts_file), "/etc/hosts")]), *argv]

    def _daemon_env(self) -> dict[str, str]:
        env = self.client_env()
        env["PATH"] = os.pathsep.join([env.get("PATH", ""), *SBIN]).strip(os.pathsep)
        return env

    def _launch(self, key: str, argv: Sequence[str], pidfile: Path, comm: str,
                host: LabHost | None, *, foreground: bool = False, timeout: float = 30) -> int:
        """Start a daemon (it daemonizes itself unless ``foreground``), wait for its PID file.

        Launcher output goes to log/<key>.launch.log. Raises LabStartError with log tails.
        """
        pidfile.unlink(missing_ok=True)
        launch_log = self.log_dir / f"{key}.launch.log"
        full = self._in_namespace(host, argv) if host is not None else list(argv)
        with open(launch_log, "ab") as log:
            log.write(f"$ {shlex.join(full)}\n".encode())
            log.flush()
            proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=self._daemon_env(),
                                    start_new_session=True)
        self._children.append(proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not foreground:
                code = proc.poll()
                if code not in (None, 0):
                    raise LabStartError(f"{key} exited with {code} while starting\n"
                                        f"{self.log_tails()}")
            elif proc.poll() is not None:
                raise LabStartError(f"{key} exited with {proc.returncode} while starting\n"
                                    f"{self.log_tails()}")
            pid = self._pid_from_file(key, comm, host, pidfile)
            if pid is not None:
                if not foreground:  # the launcher exits once the daemon forked: reap it
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                return pid
            time.sleep(0.05)
        raise LabStartError(f"{key} wrote no PID file ({pidfile}) within {timeout:g} s\n"
                            f"{self.log_tails()}")

    def _start_daemons(self) -> None:
        # One munged on the host serves every namespace: its socket is a file (pitfall 5).
        munge_dir = self.root / "munge"
        # --force: munged refuses a socket under a dir others can't traverse (pytest's
        # /tmp/pytest-of-root is 0700); every lab client is root, so that check is moot.
        self._launch("munged", [_require("munged"), "--force", f"--socket={self.munge_socket}",
                                f"--key-file={self.root / 'munge-key' / 'munge.key'}",
                                f"--pid-file={self.run_dir / 'munged.pid'}",
                                f"--log-file={self.log_dir / 'munged.log'}",
                                f"--seed-file={munge_dir / 'munged.seed'}"],
                     self.run_dir / "munged.pid", "munged", None)
        wait_for(self.munge_socket.exists, 10, 0.05, what=f"munge socket {self.munge_socket}")
        if self.accounting:
            self._start_accounting()
        self._launch("slurmctld", [_require("slurmctld"), "-f", str(self.slurm_conf)],
                     self.run_dir / "slurmctld.pid", "slurmctld", CONTROLLER)
        for node in NODES:
            self._launch(f"slurmd@{node.name}",
                         [_require("slurmd"), "-f", str(self.slurm_conf), "-N", node.name],
                         self.run_dir / f"slurmd.{node.name}.pid", "slurmd", node)

    def _start_accounting(self) -> None:
        """MariaDB (foreground, own datadir) + slurmdbd in the controller namespace (pitfall 8)."""
        db = self.root / "db"
        data = db / "data"
        if not (data / "mysql").is_dir():
            data.mkdir(parents=True, exist_ok=True)
            run([_require("mariadb-install-db"), "--no-defaults", f"--datadir={data}",
                 "--user=root", "--auth-root-authentication-method=normal", "--skip-test-db"],
                timeout=300)
        init = db / "init.sql"
        init.write_text(
            f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}';\n"
            "GRANT ALL PRIVILEGES ON *.* TO 'slurm'@'127.0.0.1';\n")
        self._launch("mariadbd", [_require("mariadbd"), "--no-defaults", f"--datadir={data}",
                                  f"--socket={db / 'mysqld.sock'}",
                                  f"--pid-file={self.run_dir / 'mariadbd.pid'}",
                                  f"--log-error={self.log_dir / 'mariadbd.log'}",
                                  "--bind-address=127.0.0.1", f"--port={MARIADB_PORT}",
                                  "--skip-name-resolve", "--user=root",
                                  f"--init-file={init}"],
                     self.run_dir / "mariadbd.pid", "mariadbd", CONTROLLER, foreground=True,
                     timeout=60)
        self._launch("slurmdbd", [_require("slurmdbd")], self.run_dir / "slurmdbd.pid",
                     "slurmdbd", CONTROLLER, timeout=60)
        wait_for(lambda: run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                             env=self.client_env(), check=False, timeout=15).returncode == 0,
                 60, 0.5, what="slurmdbd answering sacctmgr")
        clusters = run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                       env=self.client_env(), timeout=15).stdout.split()
        if CLUSTER_NAME not in clusters:
            run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], env=self.client_env(),
                timeout=30)

    def node_states(self) -> dict[str, str]:
        """sinfo's long state per node ("idle", "alloc", "down*", ...); {} when there is no
        slurm.conf (clients would retry for 60 s) or slurmctld does not answer within 15 s."""
        if not self.slurm_conf.exists():
            return {}
        try:
            proc = run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N|%T"],
                       env=self.client_env(), check=False, timeout=15)
        except LabCommandError:
            return {}
        if proc.returncode != 0:
            return {}
        return dict(line.split("|", 1) for line in proc.stdout.split() if "|" in line)

    def _wait_idle(self, timeout: float) -> None:
        want = {n: "idle" for n in self.nodes}
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if states == want:
                return
            dead = [k for k, comm, host, pidfile in self._daemons()
                    if self._pid_from_file(k, comm, host, pidfile) is None]
            if dead:
                raise LabStartError(f"{', '.join(dead)} died while the lab came up "
                                    f"(sinfo: {states})\n{self.log_tails()}")
            time.sleep(0.2)
        raise LabStartError(f"nodes not idle after {timeout:g} s (sinfo: {states or 'no answer'})"
                            f"\n{self.log_tails()}")

    def set_min_job_age(self, seconds: int) -> None:
        """Make slurmctld forget ended jobs ``seconds`` after their end (slurm.conf MinJobAge,
        which ``scontrol reconfigure`` applies to the running controller; SLURM's minimum is 2)
        — what a test of "after squeue forgot the job" needs without waiting 300 s. The next
        ``up()`` writes :data:`MIN_JOB_AGE_S` again. Raises LabCommandError."""
        lines = [f"MinJobAge={seconds}" if line.startswith("MinJobAge=") else line
                 for line in self.slurm_conf.read_text().splitlines()]
        self.slurm_conf.write_text("\n".join(lines) + "\n")
        run_slurm(self, "scontrol", "reconfigure")

    # ----- down

    def down(self, *, drain_timeout: float = 30.0) -> None:
        """Cancel all lab jobs, wait (``drain_timeout`` s) for the queue to drain, stop the
        daemons by PID file, kill what is left inside the lab namespaces, delete namespaces,
        veths and bridge (pitfall 10). Kills only what the lab started; never by name.
        Idempotent, and safe after a failed ``up()``. Raises LabError listing what it could
        not remove (after trying everything)."""
        self._teardown(drain_timeout=drain_timeout)

    def _teardown(self, *, drain_timeout: float) -> None:
        problems: list[str] = []
        pids = self.daemon_pids()
        if "slurmctld" in pids:
            try:
                self._cancel_all(drain_timeout)
            except (LabError, TimeoutError) as exc:
                problems.append(f"draining the queue: {exc}")
        # slurmd first (they stop their steps), then slurmctld, slurmdbd, mariadbd, munged.
        order = ["slurmd@" + n.name for n in NODES] + ["slurmctld", "slurmdbd", "mariadbd",
                                                         "munged"]
        for key in order:
            if key in pids:
                self._stop(pids[key], key)
        ours = self._network_is_ours()
        if ours:
            for host in HOSTS:
                for pid in self.namespace_pids().get(host.name, []):
                    self._stop(pid, f"pid {pid} in {host.netns}", grace=2)
            problems += NETWORK.down()
        for proc in self._children:
            proc.poll()
        self._children = [p for p in self._children if p.returncode is None]
        if self.state_file.exists():
            self._write_state(up=False, network=False if ours else self._read_state()
                              .get("network", False))
        if problems:
            raise LabError("lab teardown incomplete: " + "; ".join(problems))

    def abandoned(self) -> str | None:
        """Why nobody holds this lab any more, or None while someone may.

        Abandoned: root/lab.json is gone (its temporary root was deleted), or it names an
        owner process (``up(owner_pid=...)``) that has exited; a PID reused since is told
        apart by its start time (/proc/<pid>/stat field 22).
        """
        if not self.state_file.exists():
            return f"{self.state_file} is gone"
        owner = self._read_state().get("owner")
        if owner and _process_identity(int(owner["pid"])) != owner:
            return f"its owner, pid {owner['pid']}, has exited"
        return None

    def _network_is_ours(self) -> bool:
        """True when the jg* bridge carries this root's alias, or it is gone and lab.json
        says this root built the network (so leftovers are ours to remove)."""
        return NETWORK.is_ours(self.root, built=bool(self._read_state().get("network")))

    def _cancel_all(self, drain_timeout: float) -> None:
        env = self.client_env()
        ids = run(["squeue", "-h", "-o", "%i"], env=env, timeout=20).stdout.split()
        if ids:
            run(["scancel", *ids], env=env, check=False, timeout=20)

        def drained() -> bool:
            out = run(["squeue", "-h", "-o", "%i"], env=env, check=False, timeout=20)
            return out.returncode == 0 and not out.stdout.strip()

        wait_for(drained, drain_timeout, 0.2, what="the lab queue to drain")

    @staticmethod
    def _stop(pid: int, what: str, *, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; reap it if it is our child (tests/processes.py)."""
        stop_pid(pid, what, grace, label="lab")

    # ----- status

    def status(self) -> dict[str, object]:
        """What is running: daemons (key -> PID), node states, other PIDs per namespace."""
        return {"root": str(self.root), "env": self.env, "daemons": self.daemon_pids(),
                "nodes": self.node_states() if "slurmctld" in self.daemon_pids() else {},
                "node_pids": self.node_pids(),
                "hosts": {h.name: {"ip": h.ip, "netns": h.netns} for h in HOSTS},
                "bridge": {"name": BRIDGE, "host_ip": HOST_IP,
                           "present": link_exists(BRIDGE)}}


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: up | down | status | env (each with --root); returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("up", "start the lab and print export lines"),
                       ("down", "stop the lab and remove its network"),
                       ("status", "show daemons, nodes and job PIDs as JSON"),
                       ("env", "print export lines for SLURM clients")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--root", type=Path, default=Path("/tmp/jobgen-slurm-lab"))
        if name == "up":
            p.add_argument("--accounting", action="store_true",
                           help="also run slurmdbd + MariaDB (plain sacct, sacct --json)")
            p.add_argument("--cpus-per-node", type=int, default=1)
            p.add_argument("--real-memory-mb", type=int, default=4000)
    args = parser.parse_args(argv)

    if args.command == "up":
        lab = SlurmLab(args.root, accounting=args.accounting, cpus_per_node=args.cpus_per_node,
                       real_memory_mb=args.real_memory_mb)
        try:
            lab.up()
        except LabError as exc:
            print(f"lab up failed: {exc}", file=sys.stderr)
            return 1
        times = ", ".join(f"{k} {v:.1f}" for k, v in lab.timings.items())
        print(f"# lab up ({times}); nodes: "
              + ", ".join(f"{h.name}={h.ip}" for h in HOSTS), file=sys.stderr)
    else:
        state = json.loads((args.root / "lab.json").read_text()) if (args.root / "lab.json").exists() else {}
        lab = SlurmLab(args.root, accounting=bool(state.get("accounting", False)))
    if args.command in ("up", "env"):
        for key, value in lab.env.items():
            print(f"export {key}={shlex.quote(value)}")
    elif args.command == "down":
        try:
            lab.down()
        except LabError as exc:
            print(f"lab down: {exc}", file=sys.stderr)
            return 1
    elif args.command == "status":
        print(json.dumps(lab.status(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
