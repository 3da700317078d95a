"""tests/netns.py, the network the SLURM, ssh and Kubernetes node labs build, without building one
(root and the labs' own tests do that): which addresses and routes of the machine stop a lab, the
prefix every lab link name must carry, the argv that enters a host, and the entry script's
refusal of a call without a command."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import netns
from tests.netns import LabNetwork, host_argv


@dataclass(frozen=True)
class Host:
    netns: str
    ip: str
    veth: str
    peer: str


HOSTS = (Host("jxhost1", "10.213.99.11", "jxvhost1", "jxehost1"), Host("jxhost2", "10.213.99.12", "jxvhost2", "jxehost2"))
NETWORK = LabNetwork("jxbr0", "10.213.99.1", ipaddress.ip_network("10.213.99.0/24"), "jobgen-x-lab root=", "jx", HOSTS)


def machine(addresses: str, routes: str = ""):
    """A stand-in for ``run``: ``ip -o -4 addr show`` and ``ip -4 route show`` answer these."""
    def run(argv: list[str]) -> str:
        return addresses if "addr" in argv else routes
    return run


ADDRESSES = "1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet 192.168.1.5/24 brd 192.168.1.255 scope global eth0\n"


def test_a_machine_clear_of_the_lab_ranges_passes():
    routes = "default via 192.168.1.1 dev eth0\n192.168.1.0/24 dev eth0 proto kernel scope link src 192.168.1.5\n"
    assert NETWORK.overlap(machine(ADDRESSES, routes)) is None


@pytest.mark.parametrize(("addresses", "routes", "named"), [
    (ADDRESSES + "3: docker0    inet 10.213.99.7/16 scope global docker0\n", "", "docker0 has 10.213.99.7/16"),
    (ADDRESSES, "10.213.0.0/16 via 192.168.1.1 dev eth0\n", "route '10.213.0.0/16 via 192.168.1.1 dev eth0'"),
    (ADDRESSES + "3: wg0    inet 10.213.98.1/23 scope global wg0\n", "", "wg0 has 10.213.98.1/23"),
])
def test_an_address_or_route_outside_the_lab_on_its_range_is_named(addresses, routes, named):
    why = NETWORK.overlap(machine(addresses, routes))
    assert why is not None and named in why and "10.213.99.0/24" in why


def test_the_labs_own_links_and_the_default_route_do_not_count():
    addresses = ADDRESSES + "3: jxbr0    inet 10.213.99.1/24 scope global jxbr0\n"
    routes = "default via 10.213.99.254 dev eth0\n10.213.99.0/24 dev jxbr0 proto kernel scope link src 10.213.99.1\n"
    assert NETWORK.overlap(machine(addresses, routes)) is None


def test_extra_ranges_are_checked_too():
    pods = ipaddress.ip_network("10.213.100.0/24")
    why = NETWORK.overlap(machine(ADDRESSES, "10.213.100.0/24 via 192.168.1.9 dev eth0\n"), [pods])
    assert why is not None and "10.213.100.0/24" in why


def test_every_link_name_carries_the_lab_prefix():
    with pytest.raises(ValueError, match="jzbr0"):
        LabNetwork("jzbr0", "10.213.99.1", ipaddress.ip_network("10.213.99.0/24"), "t=", "jx", HOSTS)


LABS_NETWORKS = """
import ipaddress, json, sys
sys.path[:0] = sys.argv[1:]
import kubenodes, lab, sshlab
nets = [lab.NETWORK, sshlab.NETWORK, kubenodes.NETWORK]
print(json.dumps({"names": [n for net in nets for n in [*net.links, *(h.netns for h in net.hosts)]],
                  "prefixes": [net.prefix for net in nets],
                  "ranges": [str(net.subnet) for net in nets] + [n.pod_cidr for n in kubenodes.NODES]}))
"""


def test_the_real_labs_use_their_own_names_and_subnets():
    """Labs that may be up at once share no link name, namespace, link prefix or address range
    (read in a process of its own: the lab modules put their directories on sys.path)."""
    labs = [str(Path(netns.__file__).parent / "integration" / d) for d in ("slurm", "ssh", "k8s")]
    out = subprocess.run([sys.executable, "-c", LABS_NETWORKS, *labs], capture_output=True, text=True, timeout=120, check=True).stdout
    found = json.loads(out)
    assert len(found["names"]) == len(set(found["names"])) >= 10
    assert sorted(found["prefixes"]) == ["jg", "jk", "js"]
    ranges = [ipaddress.ip_network(r) for r in found["ranges"]]
    assert not [(a, b) for i, a in enumerate(ranges) for b in ranges[i + 1:] if a.overlaps(b)]


def test_host_argv_enters_the_namespace_then_this_script_with_each_bind():
    hostile = "work dir's \"x\" $(touch PWNED)"
    argv = host_argv("jxhost1", "host1", [("/r/hosts", "/etc/hosts"), (f"/r/{hostile}", hostile)])
    assert argv[:3] == ["nsenter", "--net=/run/netns/jxhost1", "--"]
    script = argv.index(str(Path(netns.__file__).resolve()))
    assert argv[3:script] == ["unshare", "--uts", "--mount", "--propagation", "private", "--", sys.executable, "-I", "-S"]
    assert argv[script + 1:] == ["--hostname", "host1", "--bind", "/r/hosts", "/etc/hosts", "--bind", f"/r/{hostile}", hostile, "--"]


def test_the_entry_script_refuses_a_call_without_a_command():
    script = str(Path(netns.__file__).resolve())
    proc = subprocess.run([sys.executable, "-I", "-S", script, "--hostname", "h", "--"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no command" in proc.stderr
