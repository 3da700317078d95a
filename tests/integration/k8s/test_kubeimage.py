"""The pod lab's training image (kubeimage.py): an OCI image-layout tarball built from this
repository without a registry or docker, and run with runc.

- The layer and layout writer on a hand-made tree (quick): same tree, same digests, whatever the
  files' mtimes and owners on disk; every digest and diff_id checks out; a changed byte does not.
- The small variant (the interpreter, its stdlib, the shared libraries ldd finds and jobgen
  without its extra: ~14 s a build) built twice from scratch: byte-identical archives (the
  reproducibility the full image has: same recipe, ~1 GB more of the same kinds of files), a
  valid layout, no staging-directory names inside, and the gzip layer's diff_id equal to the
  uncompressed one's digest.
- The full image (jobgen[train], torch CPU: minutes cold, seconds cached) run with runc: the
  imports and a 2-step CPU training of the bundled entrypoint under torch.distributed.run with
  a spec.json jobgen rendered, bind-mounted like the ConfigMap. Opt-in (``JOBGEN_K8S_IMAGE_SMOKE=1``):
  the pod tests (test_jobgen_on_pods.py and the other ``pods`` modules) run this image in real
  pods in the lab tier, which covers all of it; this check, 2-3 minutes without a kubelet, is
  the quicker diagnostic when they fail.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import kubeimage
import pytest

from tests.conftest import skip_or_fail

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the image is a Linux root filesystem")


def _tree(root: Path, mtime: int, mode: int) -> Path:
    """A small tree with a file, an executable, a symlink, a hard link and /tmp."""
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    tool = root / "usr" / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o700)
    (root / "usr" / "bin" / "alias").symlink_to("tool")
    os.link(root / "etc" / "passwd", root / "etc" / "passwd-")
    (root / "etc" / "passwd").chmod(mode)
    for path in root.rglob("*"):
        if not path.is_symlink():
            os.utime(path, (mtime, mtime))
    return root


@linux_only
def test_layer_and_layout_depend_on_contents_only(tmp_path, monkeypatch):
    """Two trees with the same contents but other mtimes, permission bits (beyond x) and a
    different staging path give the same archive bytes; the layer's entries are sorted, owned by
    0:0 without names, dated SOURCE_DATE_EPOCH, /tmp 1777, the hard link a regular file."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    first = _tree(tmp_path / "a" / "rootfs", 1_700_000_000, 0o600)
    second = _tree(tmp_path / "other-name" / "rootfs", 1_600_000_000, 0o644)
    one = kubeimage.write_oci_archive(first, tmp_path / "one.tar", "jobgen.local/train:t", log=lambda _m: None)
    two = kubeimage.write_oci_archive(second, tmp_path / "two.tar", "jobgen.local/train:t", log=lambda _m: None)
    assert one["manifest_digest"] == two["manifest_digest"]
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    meta = kubeimage.read_oci_archive(tmp_path / "one.tar")
    layer = _layer_members(tmp_path / "one.tar", meta)
    names = [m.name for m in layer]
    assert names == ["etc", "etc/passwd", "etc/passwd-", "tmp", "usr", "usr/bin", "usr/bin/alias", "usr/bin/tool"]
    assert all((m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", 0) for m in layer)
    modes = {m.name: (m.type, m.mode) for m in layer}
    assert modes["tmp"] == (tarfile.DIRTYPE, 0o1777)
    assert modes["usr/bin/tool"] == (tarfile.REGTYPE, 0o755)
    assert modes["etc/passwd"] == modes["etc/passwd-"] == (tarfile.REGTYPE, 0o644)
    assert modes["usr/bin/alias"][0] == tarfile.SYMTYPE


@linux_only
def test_a_changed_blob_or_diff_id_is_refused(tmp_path):
    """read_oci_archive checks each blob against its descriptor: flip one byte of the layer
    (keeping its name) and it says so."""
    root = _tree(tmp_path / "rootfs", 0, 0o644)
    archive = tmp_path / "image.tar"
    info = kubeimage.write_oci_archive(root, archive, "jobgen.local/train:t", log=lambda _m: None)
    broken = tmp_path / "broken.tar"
    with tarfile.open(archive) as src, tarfile.open(broken, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name.endswith(info["layer_digest"].split(":")[1]):
                data = bytes([data[0] ^ 1]) + data[1:]  # type: ignore[index]
            dst.addfile(member, None if data is None else io.BytesIO(data))
    with pytest.raises(kubeimage.ImageError, match="does not match its descriptor"):
        kubeimage.read_oci_archive(broken)


def _layer_members(archive: Path, meta: dict[str, Any]) -> list[tarfile.TarInfo]:
    (layer,) = meta["manifest"]["layers"]
    with tarfile.open(archive) as outer:
        blob = outer.extractfile(f"blobs/sha256/{layer['digest'].split(':')[1]}")
        mode = "r|gz" if layer["mediaType"].endswith("+gzip") else "r|"
        with tarfile.open(fileobj=blob, mode=mode) as inner:
            return list(inner)


@pytest.fixture(scope="module")
def small_builds(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The small variant built three times without the cache: twice uncompressed, once gzip."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the image is a Linux root filesystem")
    if shutil.which("ldd") is None or shutil.which("ldconfig") is None:
        skip_or_fail("ldd/ldconfig (libc-bin) not found: the image's shared libraries are found with them")
    builds = []
    for name, compress in (("first", "none"), ("second", "none"), ("gzip", "gzip")):
        out = tmp_path_factory.mktemp(f"kubeimage-{name}")
        builds.append(kubeimage.build(out, variant="small", compress=compress, use_cache=False, log=lambda _m: None))
    return builds


@pytest.mark.slow
@linux_only
def test_small_image_builds_are_identical(small_builds):
    """Two builds from scratch, in different directories: the same archive, byte for byte."""
    first, second, _ = small_builds
    assert first["manifest_digest"] == second["manifest_digest"]
    assert hashlib.sha256(Path(first["archive"]).read_bytes()).digest() == hashlib.sha256(Path(second["archive"]).read_bytes()).digest()
    assert first["ref"] == second["ref"] and first["ref"].startswith("jobgen.local/train:") and first["ref"].endswith("-small")


@pytest.mark.slow
@linux_only
def test_small_image_layout_is_valid_oci(small_builds):
    """index.json -> manifest -> config and layer, every digest and size checked
    (read_oci_archive), the ref annotations ctr import reads, an amd64/linux config with the
    layer's diff_id, and the files the pods need."""
    for info in small_builds:
        archive = Path(info["archive"])
        meta = kubeimage.read_oci_archive(archive)  # raises on any digest/size/diff_id mismatch
        assert meta["layout"] == {"imageLayoutVersion": "1.0.0"}
        assert set(meta["members"]) == {"blobs", "blobs/sha256", "index.json", "oci-layout",
                                        *(f"blobs/sha256/{d.split(':')[1]}" for d in (info["manifest_digest"], info["config_digest"], info["layer_digest"]))}
        (entry,) = meta["index"]["manifests"]
        assert entry["annotations"] == {"org.opencontainers.image.ref.name": info["ref"], "io.containerd.image.name": info["ref"]}
        assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        config = meta["config"]
        assert (config["architecture"], config["os"]) == ("amd64", "linux")
        assert config["rootfs"] == {"type": "layers", "diff_ids": [info["diff_id"]]}
        assert "PATH=/usr/local/bin:/usr/bin:/bin" in config["config"]["Env"]
        assert config["config"]["Labels"]["dev.jobgen.inputs-sha256"] == info["inputs_sha256"]
    plain, _, packed = small_builds
    assert packed["diff_id"] == plain["diff_id"] == plain["layer_digest"], "gzip must wrap the same tar"
    assert packed["layer_size"] < plain["layer_size"]


@pytest.mark.slow
@linux_only
def test_small_image_holds_a_runnable_tree_and_no_staging_names(small_builds):
    """The tree: python on PATH (a link to the copied interpreter), its stdlib without the test
    suite, the loader and libc, /bin/sh, /etc/passwd, /tmp, /dev/shm, HOME; bytecode for jobgen.
    No file names or contents mention the staging directory the build used."""
    info = small_builds[0]
    meta = kubeimage.read_oci_archive(Path(info["archive"]), verify=False)
    members = {m.name: m for m in _layer_members(Path(info["archive"]), meta)}
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert members["usr/local/bin/python"].linkname == members["usr/local/bin/python3"].linkname == f"python{ver}"
    assert members[f"usr/local/bin/python{ver}"].isfile()
    for name in ("bin", "lib", "lib64"):
        assert members[name].issym()
    for name in ("usr/bin/sh", "etc/passwd", "etc/group", "etc/hosts", "etc/ld.so.cache", "usr/lib64/ld-linux-x86-64.so.2",
                 "usr/lib/x86_64-linux-gnu/libc.so.6", f"usr/local/lib/python{ver}/os.py", "usr/local/lib/libpython3.11.so.1.0"):
        assert members[name].isfile(), name
    for name in ("tmp", "dev/shm", "root", "proc", "sys", "etc/jobgen"):
        assert members[name].isdir(), name
    assert not any(n.startswith(f"usr/local/lib/python{ver}/test/") for n in members)
    assert any(n.startswith(f"usr/local/lib/python{ver}/site-packages/jobgen/__pycache__/") for n in members)
    assert not any(n.endswith("direct_url.json") for n in members)
    staging = "kubeimage-root-"
    assert not any(staging in n for n in members)
    with tarfile.open(info["archive"]) as outer:
        blob = outer.extractfile(f"blobs/sha256/{info['layer_digest'].split(':')[1]}")
        assert blob is not None
        assert staging.encode() not in blob.read(), "a file in the image names the build's staging directory"


def test_smoke_spec_and_pod_command_are_jobgens_render(tmp_path):
    """The spec.json the smoke run bind-mounts and the pod command it runs come from jobgen's own
    render for :func:`kubeimage.cpu_profile`: 1 pod x 1 CPU rank, the image by its ref, pulled
    never, the container command with the operator's $(MASTER_ADDR)/$(MASTER_PORT) expanded."""
    pytest.importorskip("yaml")
    spec_json = kubeimage.render_smoke_spec(tmp_path, "jobgen.local/train:t")
    launch = json.loads(spec_json.read_text())["launch"]
    assert (launch["scheduler"], launch["accelerator"], launch["world_size"]) == ("kubernetes", "cpu", 1)
    manifest = (tmp_path / "pytorchjob.yaml").read_text()
    assert 'image: "jobgen.local/train:t"' in manifest and 'imagePullPolicy: "Never"' in manifest
    argv, env, master = kubeimage.master_container(tmp_path / "pytorchjob.yaml")
    assert argv[:3] == ["python", "-m", "jobgen.train.launch"] and f"--master-addr={master}" in argv
    assert argv[argv.index("--spec") + 1] == "/etc/jobgen/spec.json"
    assert (env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["RANK"]) == ("1", "1", "1", "0")


def _smoke_opt_in() -> None:
    if os.environ.get("JOBGEN_K8S_IMAGE_SMOKE") != "1":
        pytest.skip("the pod tests run the full image in real pods; its runc smoke runs with JOBGEN_K8S_IMAGE_SMOKE=1")
    if not sys.platform.startswith("linux"):
        skip_or_fail(f"runc runs Linux containers (platform: {sys.platform})")
    if os.geteuid() != 0:
        skip_or_fail(f"runc needs root here (uid {os.geteuid()})")
    if kubeimage.runc_binary() is None:
        skip_or_fail("runc not installed (apt-get install -y runc)")


@pytest.mark.lab
@pytest.mark.slow
def test_full_image_imports_and_trains_under_runc(tmp_path):
    """The image the pods run, from the cache (or built): in a runc container it imports torch
    (the CPU build), Lightning, DeepSpeed and jobgen.train, and the bundled entrypoint trains 2
    steps under torch.distributed.run from the spec.json jobgen renders for a CPU pod."""
    _smoke_opt_in()
    info = kubeimage.build(tmp_path / "out", log=lambda m: print(m, file=sys.stderr))
    print(json.dumps({k: info[k] for k in ("ref", "manifest_digest", "archive_size", "unpacked_bytes", "build_s", "cached")}),
          file=sys.stderr)
    result = kubeimage.smoke(Path(info["archive"]), tmp_path / "smoke", info["ref"])
    assert result["versions"]["torch"] == "2.13.0+cpu", result["import_output"]
    assert result["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert result["train_returncode"] == 0 and result["pod_train_returncode"] == 0
    for files in (result["run_files"], [f.split("/", 1)[1] for f in result["pod_run_files"]]):
        assert {"summary.json", "checkpoints/step-00000002.ckpt", "logs/version_0/metrics.csv"} <= set(files), files
