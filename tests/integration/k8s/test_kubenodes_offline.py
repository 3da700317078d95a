"""The parts of kubenodes.py that need no lab: the image tarballs are byte-for-byte reproducible
and in the docker-archive layout ``ctr images import`` reads, and the DNS feed's records for
headless Services (what dnsmasq serves to the pods)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubenodes  # noqa: E402
from kubenodes import Entry, dns_records, write_image_tar  # noqa: E402

ENTRIES = [Entry("bin"), Entry("bin/tool", 0o755, b"#!/bin/sh\necho hi\n"), Entry("bin/alias", link="tool"), Entry("tmp", 0o1777)]


def test_image_tarball_is_reproducible_and_docker_archive_shaped(tmp_path):
    first = write_image_tar(tmp_path / "a.tar", "jobgen.local/t:1", ENTRIES, {"Cmd": ["/bin/tool"]})
    second = write_image_tar(tmp_path / "b.tar", "jobgen.local/t:1", list(reversed(ENTRIES)), {"Cmd": ["/bin/tool"]})
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()  # entry order does not matter
    with tarfile.open(tmp_path / "a.tar") as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        assert manifest[0]["RepoTags"] == ["jobgen.local/t:1"]
        config_bytes = tar.extractfile(manifest[0]["Config"]).read()
        assert "sha256:" + hashlib.sha256(config_bytes).hexdigest() == first
        layer_bytes = tar.extractfile(manifest[0]["Layers"][0]).read()
        config = json.loads(config_bytes)
        assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]
        assert {m.mtime for m in tar.getmembers()} == {kubenodes.IMAGE_MTIME}
    layer = tarfile.open(fileobj=io.BytesIO(layer_bytes))
    members = layer.getmembers()
    assert [m.name for m in members] == sorted(e.path for e in ENTRIES)
    assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, kubenodes.IMAGE_MTIME)}
    assert layer.getmember("bin/alias").issym() and layer.getmember("bin/alias").linkname == "tool"


def _svc(name: str, cluster_ip: str) -> dict:
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"clusterIP": cluster_ip}}


def test_dns_records_serve_headless_services_only():
    services = [_svc("headless", "None"), _svc("plain", "10.213.0.7")]
    endpoints = [
        {"metadata": {"namespace": "ns", "name": "headless"},
         "subsets": [{"addresses": [{"ip": "10.213.17.4", "hostname": "master-0"}, {"ip": "10.213.18.3"}],
                      "notReadyAddresses": [{"ip": "10.213.18.9"}]}]},
        {"metadata": {"namespace": "ns", "name": "plain"}, "subsets": [{"addresses": [{"ip": "10.213.17.5"}]}]},
    ]
    assert dns_records(services, endpoints) == [
        ("10.213.17.4", "headless.ns.svc.cluster.local"),
        ("10.213.17.4", "master-0.headless.ns.svc.cluster.local"),
        ("10.213.18.3", "headless.ns.svc.cluster.local"),
    ]


def test_missing_libraries_names_what_the_dynamic_loader_cannot_find(tmp_path):
    """The node build checks that dnsmasq, run from the unpacked packages with LD_LIBRARY_PATH,
    finds every library (kubenodes.missing_libraries); a library the machine happens to have
    (installed by another lab's test) must not hide one the build forgot."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None or shutil.which("ldd") is None:
        from tests.conftest import skip_or_fail

        skip_or_fail("gcc and ldd are needed to build a program with a library of its own")
    lib = tmp_path / "lib with space"
    lib.mkdir()
    (tmp_path / "jg.c").write_text("int jobgen_probe(void) { return 7; }\n")
    (tmp_path / "main.c").write_text("int jobgen_probe(void);\nint main(void) { return jobgen_probe() == 7 ? 0 : 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / "libjgprobe.so.1"), "-Wl,-soname,libjgprobe.so.1", str(tmp_path / "jg.c")],
                   check=True, timeout=120)
    (lib / "libjgprobe.so").symlink_to("libjgprobe.so.1")
    subprocess.run(["gcc", "-o", str(tmp_path / "prog"), str(tmp_path / "main.c"), f"-L{lib}", "-ljgprobe"], check=True, timeout=120)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert kubenodes.missing_libraries(tmp_path / "prog", empty) == ["libjgprobe.so.1"]
    assert kubenodes.missing_libraries(tmp_path / "prog", lib) == []


def test_the_runtime_packages_carry_the_libraries_of_bookworms_dnsmasq():
    """dnsmasq-base 2.90 in Debian 12 links libnftables (its nftset support): a machine without
    nftables installed could not start the node lab's DNS."""
    assert {"libnftables1", "libnftnl11", "libjansson4", "libxtables12"} <= set(kubenodes.RUNTIME_PACKAGES)


def test_the_exit_barrier_race_is_the_only_agent_traceback_left_out():
    """podlab.without_exit_barrier_race on a worker's output seen on the pod lab: the agent's
    traceback after "Error waiting on exit barrier" goes; a rank's traceback, and an agent record
    about anything else, stay."""
    from podlab import without_exit_barrier_race

    agent = "E1129 08:14:26.635000 1 usr/local/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py:1008] "
    race = "".join(agent + line + "\n" for line in (
        "Error waiting on exit barrier. Elapsed: 0.03142118453979492 seconds", "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.11/site-packages/torch/distributed/elastic/utils/store.py", line 201, in barrier',
        "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes."))
    done = "[default0]:done: quickstart at step 24/24 (fresh start)\n"
    assert without_exit_barrier_race(done + race) == done
    rank = '[default0]:Traceback (most recent call last):\n[default0]:  File "train.py", line 1\n'
    assert "Traceback" in without_exit_barrier_race(rank + race)
    other = agent + "Traceback (most recent call last): worker group failed\n"
    assert without_exit_barrier_race(other + done) == other + done
    assert "Traceback" in without_exit_barrier_race(race + done + other)
