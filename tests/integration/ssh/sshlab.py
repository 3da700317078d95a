#!/usr/bin/env python3
"""Two ssh hosts on this machine, for jobgen's ``scheduler: ssh`` integration tests.

Each host is Debian's OpenSSH server (``sshd``, installed with apt when missing) in its own
network namespace with its own IP, hostname and /etc/hosts (``host1`` 10.213.9.11, ``host2``
10.213.9.12), joined by a bridge that gives this machine 10.213.9.1, so ``ssh`` run here reaches
them. Each host also has its own disk: a private mount namespace binds ``<root>/disks/<host>``
over the lab's work directory (:attr:`SshLab.workdir`), so what jobgen copies to one host is not
on the other, as on real machines. Login is root with a key generated for the lab (no password),
host keys are generated too and listed in a known_hosts file of the lab.

The recipe follows the SLURM lab (tests/integration/slurm/lab.py): daemons entered with
``nsenter --net`` (``ip netns exec`` would remount /sys for them), a private UTS + mount namespace
per host with a bind-mounted hosts file (each host its own hostname and name resolution), a
policy-rc.d while apt installs (so the package does not start a system sshd). Names and subnet differ from the SLURM
lab's (``js*``, 10.213.9.0/24), so both labs can be up at once.

Needs root, iproute2, util-linux (unshare, nsenter) and apt. Everything lives under ROOT except
``/run/sshd`` (sshd's privilege-separation directory, created when missing as Debian's package
does at boot); it never edits /etc/hosts and only kills what it started or what lives in its
namespaces.

By hand:

    python tests/integration/ssh/sshlab.py up --root /tmp/jobgen-ssh-lab
    ssh -i /tmp/jobgen-ssh-lab/id_ed25519 -o UserKnownHostsFile=/tmp/jobgen-ssh-lab/known_hosts root@10.213.9.11 hostname
    python tests/integration/ssh/sshlab.py down --root /tmp/jobgen-ssh-lab

Imports nothing from jobgen; the generic helpers come from the SLURM lab's module.
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "slurm"))

from lab import (  # noqa: E402
    LabConflictError,
    LabError,
    _process_identity,
    apt_install,
    find_binary,
    pid_alive,
    run,
    stop_pid,
    wait_for,
)

from tests.netns import LabNetwork, host_argv, namespace_pids, netns_inode  # noqa: E402  (the repository on sys.path: lab.py)

SUBNET = ipaddress.ip_network("10.213.9.0/24")
BRIDGE = "jsbr0"
HOST_IP = "10.213.9.1"
#: Prefix of the bridge's `ip link` alias: marks the bridge as this lab's and names its root.
OWNER_TAG = "jobgen-ssh-lab root="
PACKAGES = ("openssh-server",)
BINARIES = ("sshd", "ssh-keygen", "ssh")
#: The lab's work directory: a space and a quote in it, so every command jobgen sends must quote it.
WORKDIR_NAME = "work dir's"
#: An address on the lab subnet where nothing answers (for the unreachable-host test).
NOBODY = "10.213.9.99"


@dataclass(frozen=True)
class SshHost:
    """One lab host: a network namespace with its own hostname, IP and disk."""

    name: str  #: hostname inside the namespace
    netns: str  #: network namespace, /run/netns/<netns>
    ip: str  #: address on the lab bridge
    veth: str  #: host end of the veth pair (on the bridge)
    peer: str  #: namespace end of the veth pair


HOSTS = (
    SshHost("host1", "jshost1", "10.213.9.11", "jsvhost1", "jsehost1"),
    SshHost("host2", "jshost2", "10.213.9.12", "jsvhost2", "jsehost2"),
)
#: The lab's bridge, namespaces and veths (every link name starts with ``js``).
NETWORK = LabNetwork(BRIDGE, HOST_IP, SUBNET, OWNER_TAG, "js", HOSTS)


class SshLab:
    """The two sshd hosts under ``root``: keys (``id_ed25519``, ``known_hosts``,
    ``authorized_keys``), per-host ``sshd_config`` and host key (``<host>/``), disks
    (``disks/<host>/``), logs (``log/``) and ``lab.json`` (the sshd PIDs), so ``down()`` works
    from a new process given the same root."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        #: Wall seconds of the last ``up()``: install, keys, network, sshd, total.
        self.timings: dict[str, float] = {}

    # ----- paths

    @property
    def workdir(self) -> Path:
        """The directory every host sees its own disk at (the profile's ``ssh.workdir``)."""
        return self.root / WORKDIR_NAME

    def disk(self, host: SshHost) -> Path:
        """What ``host`` sees at :attr:`workdir` (read it from here, outside the lab)."""
        return self.root / "disks" / host.name

    @property
    def identity_file(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def hosts(self) -> tuple[SshHost, ...]:
        return HOSTS

    def ssh(self, host: SshHost, command: str, *, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ssh root@<host> <command>`` with the lab's key and known_hosts (BatchMode)."""
        return run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=yes",
                    "-o", f"UserKnownHostsFile={self.known_hosts}", "-i", str(self.identity_file), "-o", "IdentitiesOnly=yes",
                    "-l", "root", "--", host.ip, command], timeout=timeout, check=check)

    # ----- bookkeeping

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

    def sshd_pids(self) -> dict[str, int]:
        """Live sshd PIDs by host name (checked: an sshd in that host's namespace)."""
        out = {}
        for host in HOSTS:
            pid = self._read_state().get("sshd", {}).get(host.name)
            if pid and pid_alive(pid) and netns_inode(f"/proc/{pid}/ns/net") == netns_inode(f"/run/netns/{host.netns}"):
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    continue
                if comm == "sshd":
                    out[host.name] = pid
        return out

    def namespace_pids(self) -> dict[str, list[int]]:
        """Every live PID in each host's network namespace (``ip netns pids``), by host name."""
        return {host.name: namespace_pids(host.netns) for host in HOSTS}

    def job_pids(self) -> dict[str, list[int]]:
        """PIDs in each host's namespace other than its sshd listener: sessions and what jobs
        started. A finished or cancelled job (and no open session) leaves every list empty."""
        daemons = set(self.sshd_pids().values())
        return {name: [p for p in pids if p not in daemons] for name, pids in self.namespace_pids().items()}

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()
            parts.append(f"--- {path} (last {lines} lines)\n" + "\n".join(text[-lines:]))
        return "\n".join(parts) or f"(no logs under {self.log_dir})"

    # ----- up

    def up(self, *, timeout: float = 30.0, owner_pid: int | None = None) -> SshLab:
        """Install openssh-server if missing, make keys, network and disks, start sshd on each
        host and wait until ``ssh <host> true`` works. Raises LabInstallError, LabConflictError
        or LabError (with the sshd logs); on failure it tears down what it built.

        ``owner_pid`` names the process that holds the lab (the pytest fixture passes its own):
        once it has exited, another ``up()`` takes the lab over (:meth:`abandoned`)."""
        if os.geteuid() != 0:
            raise LabError("the ssh lab needs root (network namespaces, bridge, sshd)")
        t0 = time.monotonic()
        apt_install(PACKAGES, BINARIES)
        t1 = time.monotonic()
        self._check_conflicts()
        try:
            self._write_state(root=str(self.root), network=True, sshd={},
                              owner=_process_identity(owner_pid) if owner_pid else None)
            self._write_files()
            t2 = time.monotonic()
            self._network_up()
            t3 = time.monotonic()
            self._start_sshd()
            for host in HOSTS:
                wait_for(lambda h=host: self.ssh(h, "true", check=False).returncode == 0, timeout, 0.2,
                         what=f"ssh to {host.name} ({host.ip})")
            t4 = time.monotonic()
        except BaseException:
            try:
                self.down()
            except Exception as exc:  # keep the original error
                print(f"ssh lab: cleanup after a failed up() also failed: {exc}", file=sys.stderr)
            raise
        self.timings = {"install_s": t1 - t0, "files_s": t2 - t1, "network_s": t3 - t2, "sshd_s": t4 - t3, "total_s": t4 - t0}
        return self

    def abandoned(self) -> str | None:
        """Why nobody holds this lab any more, or None while someone may.

        Abandoned: root/lab.json is gone (its temporary root was deleted); it names an owner
        process (``up(owner_pid=...)``) that has exited, a PID reused since told apart by its
        start time; or it names no owner and none of the sshd it started is alive (a session
        killed before its teardown: the network stays, its processes do not).
        """
        if not self.state_file.exists():
            return f"{self.state_file} is gone"
        state = self._read_state()
        owner = state.get("owner")
        if owner:
            return None if _process_identity(int(owner["pid"])) == owner else f"its owner, pid {owner['pid']}, has exited"
        if state.get("sshd") and not self.sshd_pids():
            return "none of its sshd processes is alive"
        return None

    def _check_conflicts(self) -> None:
        """Refuse to touch js* names or the lab subnet when they belong to something else; a
        lab left under this root, or under another that :meth:`abandoned` says nobody holds, is
        torn down first."""
        taken = NETWORK.taken()
        if taken:
            other = NETWORK.owner()
            why = "it has this root" if other == str(self.root) else other and SshLab(Path(other)).abandoned()
            if other is not None and why:
                print(f"ssh lab: tearing down the lab left under {other}: {why}", file=sys.stderr)
                SshLab(Path(other)).down()
            elif other is not None:
                raise LabConflictError(f"another jobgen ssh lab is up (root {other}); stop it with: "
                                       f"{sys.executable} {Path(__file__).resolve()} down --root {other}")
            else:
                raise LabConflictError(f"{', '.join(taken)} exist and are not a jobgen ssh lab's; refusing to touch them")
        why = NETWORK.overlap(lambda argv: run(argv).stdout)
        if why:
            raise LabConflictError(why)

    def _keygen(self, path: Path, comment: str) -> str:
        if not path.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
        return path.with_name(path.name + ".pub").read_text().strip()

    def _write_files(self) -> None:
        for sub in ("log", "run", *(f"disks/{h.name}" for h in HOSTS), *(h.name for h in HOSTS)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.workdir.mkdir(exist_ok=True)  # the mount point; each host binds its disk over it
        user_key = self._keygen(self.identity_file, "jobgen-ssh-lab")
        (self.root / "authorized_keys").write_text(user_key + "\n")
        known = []
        for host in HOSTS:
            host_key = self._keygen(self.root / host.name / "ssh_host_ed25519_key", f"jobgen-ssh-lab-{host.name}")
            known.append(f"{host.ip} {' '.join(host_key.split()[:2])}")
            (self.root / host.name / "sshd_config").write_text("\n".join([
                f"# jobgen ssh lab, {host.name}; written by {Path(__file__).name}",
                f"ListenAddress {host.ip}",
                "Port 22",
                f"HostKey {self.root / host.name / 'ssh_host_ed25519_key'}",
                f"PidFile {self.root / 'run' / f'sshd.{host.name}.pid'}",
                f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",  # the lab's files live under a temporary directory
                "UseDNS no",
                "PrintMotd no",
                "PrintLastLog no",
                "X11Forwarding no",
                "MaxStartups 100",
                "LogLevel VERBOSE",
            ]) + "\n")
        self.known_hosts.write_text("\n".join(known) + "\n")
        lines = ["127.0.0.1\tlocalhost", f"{HOST_IP}\tjslabhost", *(f"{h.ip}\t{h.name}" for h in HOSTS)]
        (self.root / "hosts").write_text("\n".join(lines) + "\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory

    def _network_up(self) -> None:
        NETWORK.up(self.root, run)

    def _start_sshd(self) -> None:
        sshd = find_binary("sshd")
        if sshd is None:
            raise LabError("sshd not found after installing openssh-server")
        pids = {}
        for host in HOSTS:
            argv = [*host_argv(host.netns, host.name, [(str(self.root / "hosts"), "/etc/hosts"), (str(self.disk(host)), str(self.workdir))]),
                    sshd, "-D", "-e", "-f", str(self.root / host.name / "sshd_config")]
            log = (self.log_dir / f"sshd.{host.name}.log").open("ab")
            log.write(f"$ {shlex.join(argv)}\n".encode())
            log.flush()
            # nsenter, unshare and tests/netns.py exec each other: the PID is sshd's
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            pids[host.name] = proc.pid
            self._write_state(sshd=pids)

    # ----- down

    def down(self) -> None:
        """Stop sshd and everything else in the lab namespaces, delete namespaces, veths and
        the bridge. Idempotent. Raises LabError naming what could not be removed."""
        if not NETWORK.is_ours(self.root, built=bool(self._read_state().get("network"))):
            return
        for pids in self.namespace_pids().values():
            for pid in pids:
                self._stop(pid)
        problems = NETWORK.down()
        if self.state_file.exists():
            self._write_state(network=False, sshd={})
        if problems:
            raise LabError("ssh lab teardown incomplete: " + "; ".join(problems))

    @staticmethod
    def _stop(pid: int, grace: float = 3.0) -> None:
        stop_pid(pid, "sshd", grace, label="ssh lab")


def main(argv: list[str] | None = None) -> int:
    """up | down (with --root); returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down"):
        sub.add_parser(name).add_argument("--root", type=Path, default=Path("/tmp/jobgen-ssh-lab"))
    args = parser.parse_args(argv)
    lab = SshLab(args.root)
    try:
        if args.command == "up":
            lab.up()
            print(f"# ssh lab up in {lab.timings['total_s']:.1f} s: " + ", ".join(f"{h.name}={h.ip}" for h in HOSTS), file=sys.stderr)
            print(f"# ssh -i {lab.identity_file} -o UserKnownHostsFile={lab.known_hosts} root@{HOSTS[0].ip}")
        else:
            lab.down()
    except LabError as exc:
        print(f"ssh lab {args.command} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
