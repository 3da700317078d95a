"""Running the training image without a cluster (kubeimage.py's ``smoke`` command): unpack an archive
into a runc bundle, run containers in it with bind mounts, and check the imports, a 2-step CPU
training and the rendered Master pod's own command. kubeimage.py re-exports the names tests use.

Standard library only at import (jobgen is imported, lazily, to render the smoke test's spec).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from imagebase import (
    ENV,
    HOSTNAME,
    REPO,
    ImageError,
    Log,
    _stderr,
)
from ociarchive import (
    read_oci_archive,
)

# --------------------------------------------------------------------------- running it (runc)


def unpack_bundle(archive: Path, bundle: Path) -> Path:
    """Extract the image's layer into ``bundle/rootfs`` (GNU tar, as a runtime would) and return it."""
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True)
    meta = read_oci_archive(archive, verify=False)
    (layer,) = meta["manifest"]["layers"]
    with tarfile.open(archive, "r:") as tar:
        fh = tar.extractfile(f"blobs/sha256/{layer['digest'].split(':', 1)[1]}")
        assert fh is not None
        flags = ["-z"] if layer["mediaType"].endswith("+gzip") else []
        proc = subprocess.Popen(["tar", "-x", *flags, "-f", "-", "-C", str(rootfs), "--numeric-owner"], stdin=subprocess.PIPE)
        assert proc.stdin is not None
        shutil.copyfileobj(fh, proc.stdin, 1 << 20)
        proc.stdin.close()
        if proc.wait(600) != 0:
            raise ImageError(f"tar could not unpack the layer of {archive}")
    return rootfs


def runtime_config(args: list[str], binds: list[tuple[Path, str, bool]], env: list[str] | None = None,
                   hostname: str | None = None) -> dict[str, Any]:
    """A minimal OCI runtime config: the image's environment, root without extra capabilities,
    new pid/ipc/uts/mount/network namespaces (runc brings up ``lo`` in the new network
    namespace), /dev/shm a 1 GiB tmpfs (the pod gets one sized by the profile's shm_size_gib),
    ``binds``: (host path, container path, read-only)."""
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=1g"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    for host, dest, readonly in binds:
        mounts.append({"destination": dest, "type": "bind", "source": str(host),
                       "options": ["rbind", "ro" if readonly else "rw"]})
    return {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "env": env or list(ENV), "cwd": "/",
                    "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
                    "noNewPrivileges": True},
        "root": {"path": "rootfs", "readonly": False},
        "hostname": hostname or HOSTNAME,
        "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
                  "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
                  "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]},
    }


def runc_binary() -> str | None:
    """runc on PATH (Debian's package: ``apt-get install -y runc``), or None."""
    return shutil.which("runc")


def run_container(bundle: Path, args: list[str], binds: list[tuple[Path, str, bool]], timeout: float = 600,
                  env: list[str] | None = None, name: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in the unpacked image at ``bundle`` with runc (its state under ``bundle/state``);
    a run past ``timeout`` is killed and deleted. Returns the completed process (exit code, output)."""
    runc = runc_binary()
    if runc is None:
        raise ImageError("runc not found (apt-get install -y runc)")
    (bundle / "config.json").write_text(json.dumps(runtime_config(args, binds, env), indent=2))
    state = bundle / "state"
    state.mkdir(exist_ok=True)
    cid = name or f"jobgen-smoke-{os.getpid()}-{time.monotonic_ns()}"
    argv = [runc, "--root", str(state), "run", "--bundle", str(bundle), cid]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        subprocess.run([runc, "--root", str(state), "kill", cid, "KILL"], capture_output=True, timeout=30)
        raise ImageError(f"container {cid} ran past {timeout} s: {exc.stdout!r} {exc.stderr!r}") from exc
    finally:
        subprocess.run([runc, "--root", str(state), "delete", "--force", cid], capture_output=True, timeout=60)


def cpu_profile(ref: str, processes: int = 1) -> dict[str, Any]:
    """A Kubernetes cluster profile (a dict to write as YAML) for pods of this image on CPU nodes:
    ``processes`` gloo ranks per pod, no GPUs, node selector, tolerations, RDMA or runs claim,
    ``imagePullPolicy: Never`` (the image is imported on each node: there is no registry)."""
    return {
        "description": "the pod lab: CPU pods of the locally built training image",
        "scheduler": "kubernetes", "max_nodes": 4, "default_nodes": 1,
        "gpus_per_node": 0, "cpu_processes_per_node": processes, "cpus_per_node": 2, "mem_gib_per_node": 8,
        "network_fabric": "tcp",
        "kubernetes": {"namespace": "training", "image": ref, "image_pull_policy": "Never", "shm_size_gib": 1,
                       "master_port": 23456},
    }


def render_smoke_spec(directory: Path, ref: str, repo: Path = REPO) -> Path:
    """spec.json for a tiny CPU model, rendered by jobgen (the repository's, imported here) for a
    Kubernetes profile with 1 pod x 1 CPU process whose image is ``ref``: the file the ConfigMap
    would carry to /etc/jobgen/spec.json. Returns its path; pytorchjob.yaml is written beside it."""
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    import yaml

    from jobgen.backends import plan
    from jobgen.specs.load import load_profile, load_spec

    directory.mkdir(parents=True, exist_ok=True)
    profile = directory / "k8s-cpu-image.yaml"
    profile.write_text(yaml.safe_dump(cpu_profile(ref)))
    spec = directory / "image-smoke.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "image-smoke",
        "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
        "data": {"max_bytes": 200_000},
        "trainer": {"strategy": "ddp", "precision": "32-true", "micro_batch_size": 4, "max_steps": 2, "warmup_steps": 1,
                    "val_check_interval": 2, "limit_val_batches": 1, "log_every_n_steps": 1},
        "resources": {"nodes": 1, "devices_per_node": 1},
        "checkpoint": {"every_n_steps": 2, "keep_last_k": 1},
    }))
    job_plan = plan(load_spec(spec), load_profile(str(profile)), repo / "templates")
    (directory / "spec.json").write_text(job_plan.file("spec.json"))
    (directory / "pytorchjob.yaml").write_text(job_plan.file("pytorchjob.yaml"))
    return directory / "spec.json"


def master_container(pytorchjob_yaml: Path) -> tuple[list[str], dict[str, str], str]:
    """What the kubelet runs in the Master pod (index 0) of the rendered PyTorchJob: the
    container's command with ``$(VAR)`` expanded, its environment (the container's ``env`` plus
    what the training-operator v1.9 appends: see test_rank_semantics.py), and the Master's
    Service name (MASTER_ADDR), which the pod's /etc/hosts must resolve."""
    import yaml

    job = next(d for d in yaml.safe_load_all(pytorchjob_yaml.read_text()) if d and d.get("kind") == "PyTorchJob")
    specs = job["spec"]["pytorchReplicaSpecs"]
    container = specs["Master"]["template"]["spec"]["containers"][0]
    nproc = str(job["spec"]["nprocPerNode"])
    pods = sum(r["replicas"] for r in specs.values())
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port")
    master = f"{job['metadata']['name']}-master-0"
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    env |= {"PYTHONUNBUFFERED": "0", "MASTER_PORT": str(port), "MASTER_ADDR": master, "WORLD_SIZE": str(pods * int(nproc)),
            "RANK": "0", "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": "0", "PET_NNODES": str(pods)}
    expand = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))")
    argv = [expand.sub(lambda m: "$" if m.group(1) == "$" else env.get(m.group(2), m.group(0)), a) for a in container["command"]]
    return argv, env, master


def smoke(archive: Path, work: Path, ref: str, log: Log = _stderr) -> dict[str, Any]:
    """Unpack ``archive`` into a runc bundle under ``work`` and run, in the container: the imports
    (torch, lightning, deepspeed, jobgen.train) and a 2-step CPU training of the bundled entrypoint
    under torch.distributed.run with the spec.json jobgen renders (bind-mounted read-only at
    /etc/jobgen/spec.json, like the ConfigMap) and the run directory bind-mounted at /tmp/run.
    Returns timings and outputs; raises :class:`ImageError` when a step fails."""
    result: dict[str, Any] = {}
    t = time.monotonic()
    bundle = work / "bundle"
    unpack_bundle(archive, bundle)
    result["unpack_s"] = round(time.monotonic() - t, 1)
    spec_json = render_smoke_spec(work / "rendered", ref)
    argv, env, master = master_container(spec_json.parent / "pytorchjob.yaml")
    # The kubelet mounts an /etc/hosts that resolves the pod's hostname (torchrun's c10d store
    # names it; unresolvable, the agent waits for ever); the Master's Service name resolves through
    # the cluster's DNS, here through the same file.
    hosts = work / "hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost {HOSTNAME} {master}\n")
    run_dir = work / "run"
    run_dir.mkdir()
    binds = [(spec_json, "/etc/jobgen/spec.json", True), (hosts, "/etc/hosts", True), (run_dir, "/tmp/run", False)]
    t = time.monotonic()
    code = ("import sys, torch, lightning, deepspeed, jobgen.train; "
            "print(torch.__version__, lightning.__version__, deepspeed.__version__, sys.version.split()[0])")
    proc = run_container(bundle, ["python", "-c", code], binds, timeout=300)
    result["import_s"] = round(time.monotonic() - t, 1)
    result["import_output"] = (proc.stdout + proc.stderr).strip()[-2000:]
    if proc.returncode != 0:
        raise ImageError(f"imports failed in the container (exit {proc.returncode}):\n{result['import_output']}")
    result["versions"] = dict(zip(("torch", "lightning", "deepspeed", "python"), proc.stdout.split()[-4:], strict=True))
    log(f"container imports in {result['import_s']} s: {result['versions']}")
    t = time.monotonic()
    train = ["python", "-m", "torch.distributed.run", "--nproc-per-node=1", "-m", "jobgen.train",
             "--spec", "/etc/jobgen/spec.json", "--run-dir", "/tmp/run"]
    proc = run_container(bundle, train, binds, timeout=600, env=[*ENV, "OMP_NUM_THREADS=1"])
    result["train_s"] = round(time.monotonic() - t, 1)
    result["train_returncode"] = proc.returncode
    result["train_output"] = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode != 0:
        raise ImageError(f"training failed in the container (exit {proc.returncode}):\n{result['train_output']}")
    result["run_files"] = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    log(f"container trained 2 steps in {result['train_s']} s; run dir: {len(result['run_files'])} files")
    # The rendered Master pod's own command and environment, and its runs volume (an emptyDir there).
    runs = work / "pod-runs"
    runs.mkdir()
    pod_binds = [(spec_json, "/etc/jobgen/spec.json", True), (hosts, "/etc/hosts", True), (runs, "/workspace/runs", False)]
    t = time.monotonic()
    proc = run_container(bundle, argv, pod_binds, timeout=600, env=[*ENV, *(f"{k}={v}" for k, v in env.items())])
    result["pod_command"] = argv
    result["pod_train_s"] = round(time.monotonic() - t, 1)
    result["pod_train_returncode"] = proc.returncode
    result["pod_train_output"] = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode != 0:
        raise ImageError(f"the rendered pod command failed in the container (exit {proc.returncode}):\n{result['pod_train_output']}")
    result["pod_run_files"] = sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*") if p.is_file())
    log(f"the rendered Master pod command trained in {result['pod_train_s']} s: {' '.join(argv)}")
    return result
