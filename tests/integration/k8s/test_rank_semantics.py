"""Rank semantics of the rendered PyTorchJob without a cluster: two local "pods" (processes)
get exactly the environment the training-operator injects for a 2-pod x 2-process job, run the
rendered container command as the kubelet would (``$(VAR)`` expanded), and train together with
world size 4 and distinct global ranks 0..3.

What the operator injects is :func:`operator_env` of tests/integration/k8s/training_operator.py (the
emulated training-operator v1.9, which documents each variable and its source: envvar.go,
master.go, elastic.go). For this job: PYTHONUNBUFFERED=1, MASTER_PORT and PET_MASTER_PORT (the
Master's ``pytorchjob-port``), MASTER_ADDR and PET_MASTER_ADDR (``<job>-master-0``, the Master's
Service), WORLD_SIZE (= pods x nprocPerNode), RANK and PET_NODE_RANK (= the pod's index: Master 0,
Worker i -> i+1: a *pod* rank, not a process rank), PET_NPROC_PER_NODE (= spec.nprocPerNode),
PET_NNODES (= pods).

Locally the Master's Service name resolves to 127.0.0.1, and both pods share one run directory
(a ReadWriteMany volume in a cluster). Needs torch + lightning (jobgen[train]); skips otherwise (fails under CI).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobgen.backends import plan
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import REPO, TEMPLATES, require
from tests.integration.k8s.training_operator import operator_env, replica_name
from tests.ports import ATTEMPTS, address_in_use, next_port

pytestmark = pytest.mark.slow

torch_run = require("torch.distributed.run", "torch not installed (pip install -e .[train])")
require("lightning", "lightning not installed (pip install -e .[train])")

#: Records each training process's view of the world (the launchers' variables) at start-up.
OBSERVER = '''
import json, os
if os.environ.get("TORCHELASTIC_RUN_ID") and "LOCAL_RANK" in os.environ:
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "JOBGEN_POD")
    with open(os.path.join(os.environ["JOBGEN_RANKS_DIR"], f"{os.getpid()}.json"), "w") as fh:
        json.dump({k: os.environ.get(k) for k in keys}, fh)
'''


def _cpu_profile(tmp_path: Path, port: int) -> Path:
    """A Kubernetes profile with CPU pods of 2 processes each (gloo), else the shipped k8s-a100."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "k8s-cpu-sim.yaml").write_text(yaml.safe_dump({
        "extends": str(REPO / "cluster_profiles" / "k8s-a100.yaml"),
        "gpus_per_node": 0, "gpu_type": None, "cpu_processes_per_node": 2, "cpus_per_node": 2, "mem_gib_per_node": 8,
        "network_fabric": "tcp",
        "kubernetes": {"shm_size_gib": 1, "master_port": port, "python": sys.executable, "rdma_resource": None},
    }))
    return profiles / "k8s-cpu-sim.yaml"


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "ranks.yaml"
    path.write_text(yaml.safe_dump({
        "name": "rank-check",
        "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
        "data": {"max_bytes": 400_000},
        "trainer": {"strategy": "ddp", "precision": "32-true", "micro_batch_size": 4, "max_steps": 6, "warmup_steps": 1,
                    "val_check_interval": 6, "limit_val_batches": 2, "log_every_n_steps": 2},
        "resources": {"nodes": 2, "devices_per_node": 2},
        "checkpoint": {"every_n_steps": 6, "keep_last_k": 1},
    }))
    return path


def on_this_machine(env: dict[str, str], job: dict[str, Any]) -> dict[str, str]:
    """``env`` with the Master's Service name resolved as it is here: 127.0.0.1."""
    service = replica_name(job["metadata"]["name"], "Master", 0)
    return {key: "127.0.0.1" if value == service else value for key, value in env.items()}


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command/args (``$$`` escapes; unknown references stay)."""
    return re.sub(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))",
                  lambda m: "$" if m.group(1) == "$" else env.get(m.group(2), m.group(0)), text)


def _render(tmp_path: Path, port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    job_plan = plan(load_spec(_spec(tmp_path)), load_profile(str(_cpu_profile(tmp_path, port))), TEMPLATES)
    config_map, job = k8s_manifest.parse_manifest(job_plan.file("pytorchjob.yaml"), "pytorchjob.yaml")
    return config_map, job


def test_torchrun_reads_the_operators_master_address(tmp_path):
    """Every worker pod's torchrun must rendezvous on the Master's Service, not on itself (its
    --master-addr defaults to 127.0.0.1, and it ignores MASTER_ADDR). The rendered command passes
    --master-addr=$(MASTER_ADDR); the v1.9 operator also sets PET_MASTER_ADDR (since v1.7.0,
    kubeflow/training-operator#1840), which torchrun reads when the flag is absent: both name the
    Master's Service, so the flag agrees with the operator and is what works with an operator
    older than 1.7 (MASTER_ADDR only)."""
    _, job = _render(tmp_path, 23456)
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= operator_env(job, "worker", 0)
    argv = [kubelet_expand(a, env) for a in container["command"]]
    run_index = argv.index("jobgen.train.launch")  # jobgen's launcher hands these arguments to torchrun's parse_args
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        args = torch_run.get_args_parser().parse_args(argv[run_index + 1:])
        bare = torch_run.get_args_parser().parse_args(["-m", "jobgen.train"])
        del os.environ["PET_MASTER_ADDR"]  # what a pre-1.7 operator leaves: MASTER_ADDR only
        pre_1_7 = torch_run.get_args_parser().parse_args(["-m", "jobgen.train"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert (args.master_addr, args.master_port) == ("rank-check-master-0", 23456)
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "2", 1)
    assert bare.master_addr == "rank-check-master-0", "without --master-addr: the v1.9 operator's PET_MASTER_ADDR"
    assert pre_1_7.master_addr == "127.0.0.1", "without --master-addr and PET_MASTER_ADDR torchrun would rendezvous on the pod itself"


def test_two_pods_of_two_processes_train_with_world_size_4_and_ranks_0_to_3(tmp_path):
    # Both pods' torchrun need the master port up front (the master's agent binds it), so the
    # listener cannot pick it: ports come from tests/ports.py, and when the master still finds
    # its port taken (EADDRINUSE) both pods are stopped and started again on the next one.
    for attempt in range(ATTEMPTS):
        root = tmp_path / f"attempt-{attempt}"
        root.mkdir()
        procs, lost_port = _run_pods(root, next_port())
        if not lost_port:
            break
    else:
        pytest.fail(f"the master found each of {ATTEMPTS} ports taken (EADDRINUSE)")
    output = _logs(root, procs)
    assert [proc.returncode for _, _, proc in procs] == [0, 0], output
    assert not address_in_use(output), output
    views = [json.loads(p.read_text()) for p in sorted((root / "ranks").glob("*.json"))]
    assert len(views) == 4, views
    assert sorted(int(v["RANK"]) for v in views) == [0, 1, 2, 3]
    assert {v["WORLD_SIZE"] for v in views} == {"4"}
    by_pod = {pod: sorted(int(v["RANK"]) for v in views if v["JOBGEN_POD"] == pod) for pod, _, _ in procs}
    assert by_pod == {"master-0": [0, 1], "worker-0": [2, 3]}
    assert sorted(int(v["LOCAL_RANK"]) for v in views) == [0, 0, 1, 1]
    summary = json.loads((root / "runs" / "rank-check" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["global_step"] == 6, summary


def _run_pods(tmp_path: Path, port: int) -> tuple[list[tuple[str, Any, Any]], bool]:
    """Run the two pods to the end with master port ``port``; returns them and whether the master
    exited because the port was taken (then the worker is stopped at once, not left waiting)."""
    config_map, job = _render(tmp_path, port)
    runs = tmp_path / "runs"  # one RWX volume for both pods
    ranks_dir = tmp_path / "ranks"
    observer = tmp_path / "observer"
    for d in (runs, ranks_dir, observer):
        d.mkdir()
    (observer / "sitecustomize.py").write_text(OBSERVER)
    procs = []
    pods = [("master", 0), *[("worker", i) for i in range(job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])]]
    assert len(pods) == 2
    for role, index in pods:
        pod = f"{role}-{index}"
        config = tmp_path / pod / "etc-jobgen"  # the ConfigMap volume
        config.mkdir(parents=True)
        for name, body in config_map["data"].items():
            (config / name).write_text(body)
        container = job["spec"]["pytorchReplicaSpecs"][role.capitalize()]["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        env |= on_this_machine(operator_env(job, role, index), job)
        argv = [kubelet_expand(a, env) for a in container["command"]]
        argv = [a.replace(k8s_manifest.CONFIG_MOUNT, str(config)).replace(k8s_manifest.RUN_ROOT, str(runs)) for a in argv]
        base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG", "TMPDIR") if key in os.environ}
        process_env = {**base, **env, "PYTHONPATH": os.pathsep.join([str(observer), str(REPO)]),
                       "JOBGEN_RANKS_DIR": str(ranks_dir), "JOBGEN_POD": pod}
        log = open(tmp_path / f"{pod}.log", "w")  # noqa: SIM115 (closed below)
        procs.append((pod, log, subprocess.Popen(argv, cwd=tmp_path / pod, env=process_env, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True)))
    deadline = time.monotonic() + 420
    master = procs[0][2]
    lost_port = False
    try:
        while any(proc.poll() is None for _, _, proc in procs):
            if master.poll() not in (None, 0) and address_in_use((tmp_path / "master-0.log").read_text()):
                lost_port = True
                break
            if time.monotonic() > deadline:
                pytest.fail("the two pods hung (rendezvous never completed?)\n" + _logs(tmp_path, procs))
            time.sleep(0.2)
    finally:
        for _, log, proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.close()
    return procs, lost_port


def _logs(tmp_path: Path, procs: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(f"--- {pod}\n" + (tmp_path / f"{pod}.log").read_text()[-4000:] for pod, _, _ in procs)
