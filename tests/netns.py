"""The labs' network (the SLURM, ssh and Kubernetes node labs under tests/integration/): a bridge
on this machine with a host address, and per lab host a network namespace joined to it by a veth
pair, with its own address on the bridge's subnet; running a command as such a host (this file
as a script: :func:`host_argv`); tearing it all down.

Each lab passes its own names and subnet (:class:`LabNetwork`), so labs can be up at once. The
bridge's ``ip link`` alias (``<owner tag><root>``) marks it as a lab's and names the root that
built it: a lab touches only names whose bridge carries its own tag.
Standard library (and tests/processes.py) only, so each lab module can import it as a script too.
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

if __package__ in (None, ""):  # run as a script (host_argv): the repository's tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.processes import pid_alive  # noqa: E402

#: ``mount(2)`` flag MS_BIND (linux/mount.h).
MS_BIND = 4096


def link_exists(name: str) -> bool:
    """True when this machine's network namespace has a link called ``name``."""
    return Path("/sys/class/net", name).exists()


def link_alias(name: str) -> str:
    """The ``ip link`` alias of link ``name`` ("" when it has none or does not exist)."""
    try:
        return Path("/sys/class/net", name, "ifalias").read_text().strip()
    except OSError:
        return ""


def netns_exists(name: str) -> bool:
    """True when the named network namespace (``ip netns``, /run/netns/<name>) exists."""
    return Path("/run/netns", name).exists()


def netns_inode(path: str) -> int | None:
    """The inode of a network namespace file (``/proc/<pid>/ns/net`` or ``/run/netns/<name>``):
    equal inodes are the same namespace. None when the path is gone."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class NetnsHost(Protocol):
    """What :class:`LabNetwork` needs of a lab host (each lab's host dataclass has these fields)."""

    @property
    def netns(self) -> str: ...  # network namespace, /run/netns/<netns>
    @property
    def ip(self) -> str: ...  # address on the bridge's subnet
    @property
    def veth(self) -> str: ...  # host end of the veth pair, on the bridge
    @property
    def peer(self) -> str: ...  # namespace end of the veth pair


@dataclass(frozen=True)
class LabNetwork:
    """One lab's bridge and hosts.

    ``bridge`` gets ``host_ip`` on ``subnet``; every host its namespace, veth pair and address.
    ``owner_tag`` prefixes the bridge's alias (then the lab root). ``prefix`` starts every link
    name of the lab (bridge and veths): addresses and routes on such links are the lab's own
    in :meth:`overlap`. Raises ValueError when a link name lacks the prefix."""

    bridge: str
    host_ip: str
    subnet: ipaddress.IPv4Network
    owner_tag: str
    prefix: str
    hosts: tuple[NetnsHost, ...]

    def __post_init__(self) -> None:
        stray = [n for n in self.links if not n.startswith(self.prefix)]
        if stray:
            raise ValueError(f"link names {stray} do not start with the lab prefix {self.prefix!r}")

    @property
    def links(self) -> list[str]:
        """The lab's links in this machine's namespace: the bridge, then each host's veth."""
        return [self.bridge, *(h.veth for h in self.hosts)]

    def alias(self, root: Path | str) -> str:
        """The bridge alias of the lab under ``root``."""
        return self.owner_tag + str(root)

    def taken(self) -> list[str]:
        """The lab's names that exist now: links by name, namespaces as ``netns <name>``."""
        return [n for n in self.links if link_exists(n)] + [f"netns {h.netns}" for h in self.hosts if netns_exists(h.netns)]

    def owner(self) -> str | None:
        """The root named by the bridge's alias, or None when the bridge is absent or its alias
        is not this kind of lab's (a bridge of the same name that something else made)."""
        alias = link_alias(self.bridge)
        return alias[len(self.owner_tag):] if alias.startswith(self.owner_tag) else None

    def is_ours(self, root: Path | str, *, built: bool) -> bool:
        """True when the bridge carries ``root``'s alias, or it is gone and ``built`` (the lab's
        own record says this root made the network): then what is left of it is ours to remove."""
        if link_exists(self.bridge):
            return link_alias(self.bridge) == self.alias(root)
        return built

    def overlap(self, run: Callable[[list[str]], str], nets: Iterable[ipaddress.IPv4Network] = ()) -> str | None:
        """Why the lab's address ranges (``subnet`` and ``nets``) cannot be used, or None: an
        address or a route (other than the default route) of this machine outside the lab's
        links overlaps one. ``run`` runs an ``ip`` command and returns its output."""
        ranges = [self.subnet, *nets]
        shown = ", ".join(map(str, ranges))
        for line in run(["ip", "-o", "-4", "addr", "show"]).splitlines():
            fields = line.split()
            dev, cidr = fields[1], fields[3]
            if not dev.startswith(self.prefix) and any(ipaddress.ip_interface(cidr).network.overlaps(n) for n in ranges):
                return f"{dev} has {cidr}, which overlaps the lab's {shown}"
        for line in run(["ip", "-4", "route", "show"]).splitlines():
            dest = line.split()[0]
            if dest == "default" or f" dev {self.prefix}" in f" {line}":
                continue
            try:
                net = ipaddress.ip_network(dest, strict=False)
            except ValueError:
                continue
            if any(net.overlaps(n) for n in ranges):
                return f"route {line!r} overlaps the lab's {shown}"
        return None

    def up(self, root: Path | str, run: Callable[[list[str]], object]) -> None:
        """Make the bridge (alias for ``root``, host address, up), then per host its namespace,
        the veth pair (host end on the bridge, the peer in the namespace), the host's address,
        the peer and loopback up. ``run`` runs one command and raises the lab's error when it
        fails; what was made before a failure stays for :meth:`down`."""
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        run(["ip", "link", "set", self.bridge, "alias", self.alias(root)])
        run(["ip", "addr", "add", f"{self.host_ip}/{self.subnet.prefixlen}", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        for h in self.hosts:
            run(["ip", "netns", "add", h.netns])
            run(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", h.peer])
            run(["ip", "link", "set", h.peer, "netns", h.netns])
            run(["ip", "link", "set", h.veth, "master", self.bridge])
            run(["ip", "link", "set", h.veth, "up"])
            run(["ip", "-n", h.netns, "addr", "add", f"{h.ip}/{self.subnet.prefixlen}", "dev", h.peer])
            run(["ip", "-n", h.netns, "link", "set", h.peer, "up"])
            run(["ip", "-n", h.netns, "link", "set", "lo", "up"])

    def down(self) -> list[str]:
        """Delete the namespaces, the veths and the bridge (only call it when :meth:`is_ours`;
        stop the processes in the namespaces first). Never raises for a failed command; returns
        what went wrong (``could not delete netns X``, ``still present: ...``), empty when all is gone."""
        problems = []
        for h in self.hosts:
            if netns_exists(h.netns) and _ip("netns", "del", h.netns):
                problems.append(f"could not delete netns {h.netns}")
        for name in [*(h.veth for h in self.hosts), self.bridge]:
            if link_exists(name):
                _ip("link", "del", name)
        left = [n for n in self.links if link_exists(n)] + [h.netns for h in self.hosts if netns_exists(h.netns)]
        if left:
            problems.append(f"still present: {', '.join(left)}")
        return problems


def _ip(*args: str) -> int:
    """Run ``ip ARGS``; its exit status (124 when it ran past 60 s)."""
    try:
        return subprocess.run(["ip", *args], capture_output=True, timeout=60).returncode
    except subprocess.TimeoutExpired:
        return 124


def host_argv(netns: str, hostname: str, binds: Sequence[tuple[str, str]]) -> list[str]:
    """The argv prefix that runs a command as a lab host: its network namespace through
    ``nsenter --net`` (``ip netns exec`` would also remount /sys), a private UTS and mount
    namespace (``unshare``), then this file as a script (:func:`enter_host`): the hostname, and each
    ``(source, target)`` of ``binds`` bind-mounted in that mount namespace only (the lab hosts file
    over /etc/hosts, a host's own disk...). Append the command; nsenter, unshare and this script
    exec each other, so the process started is the command's."""
    bind_args = [arg for source, target in binds for arg in ("--bind", source, target)]
    return ["nsenter", f"--net=/run/netns/{netns}", "--", "unshare", "--uts", "--mount", "--propagation", "private", "--",
            sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--hostname", hostname, *bind_args, "--"]


def enter_host(hostname: str, binds: Sequence[tuple[str, str]], argv: Sequence[str]) -> None:
    """Inside :func:`host_argv`'s namespaces: set the hostname, bind-mount each ``(source,
    target)``, then exec ``argv`` (looked up on PATH). Raises OSError when a step fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    name = hostname.encode()
    if libc.sethostname(name, len(name)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sethostname({hostname}): {os.strerror(err)}")
    for source, target in binds:
        if libc.mount(source.encode(), target.encode(), None, MS_BIND, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"bind-mount {source} over {target}: {os.strerror(err)}")
    os.execvp(argv[0], list(argv))


def namespace_pids(netns: str) -> list[int]:
    """The live PIDs in the named network namespace (``ip netns pids``), sorted; empty when the
    namespace does not exist."""
    if not netns_exists(netns):
        return []
    try:
        out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30).stdout
    except subprocess.TimeoutExpired:
        return []
    return sorted(p for p in (int(x) for x in out.split() if x.isdigit()) if pid_alive(p))


def main(argv: Sequence[str] | None = None) -> int:
    """``--hostname NAME [--bind SOURCE TARGET]... -- COMMAND...``: :func:`enter_host` (the tail of
    :func:`host_argv`); returns 1 only when exec did not happen (argparse exits 2 on bad arguments)."""
    parser = argparse.ArgumentParser(description="Run COMMAND as a lab host (inside host_argv's namespaces).")
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--bind", nargs=2, action="append", default=[], metavar=("SOURCE", "TARGET"))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    enter_host(args.hostname, [tuple(b) for b in args.bind], command)
    return 1  # not reached: exec


if __name__ == "__main__":
    sys.exit(main())
