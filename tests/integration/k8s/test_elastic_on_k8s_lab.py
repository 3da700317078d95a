"""Elastic PyTorchJobs (``resources.nodes: "min:max"``) against the real kube-apiserver lab:
offline validation and the server's dry run (dryRun=All: ConfigMap, PyTorchJob, a Pod from the
Worker template) agree, the job is created with its elasticPolicy and Worker replicas intact, and
(with the optional 1.36 CRD server) it passes strict field validation with nothing pruned.

The 1.20 lab has no training-operator webhook, so the operator's elastic rules (min <= max,
Worker within the range, no Master) are offline-only; the test records that the server accepts
them while jobgen refuses them."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobgen.backends import plan
from jobgen.backends.base import SubmitOptions
from jobgen.backends.kubernetes import api as k8s_api
from jobgen.backends.kubernetes import backend as k8s
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.backends.kubernetes.validate import validate_manifest
from jobgen.errors import PlanError, SubmitError
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import PROFILES, REPO, TEMPLATES, site_profile

pytestmark = pytest.mark.k8s_lab
ELASTIC_SPEC = REPO / "tests" / "golden" / "specs" / "elastic-fsdp.yaml"
K8S_PROFILES = sorted(p.stem for p in PROFILES.glob("k8s-*.yaml"))


def cli(lab, cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m jobgen.cli ARGS`` against the lab (its kubeconfig, a private state dir)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(lab.kubeconfig), "JOBGEN_STATE_DIR": str(cwd / "state")}
    for key in ("JOBGEN_K8S_CONTEXT", "JOBGEN_K8S_NAMESPACE", "JOBGEN_DEBUG"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _elastic_plan(profile: str, *overrides: str):
    return plan(load_spec(ELASTIC_SPEC, list(overrides)), load_profile(profile, PROFILES), TEMPLATES)


@pytest.mark.parametrize("profile", K8S_PROFILES)
def test_elastic_job_passes_offline_and_server_dry_run(k8s_lab, profile, tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    job_plan = _elastic_plan(profile)  # offline validators run inside
    assert job_plan.world.elastic and (job_plan.world.min_nodes, job_plan.world.num_nodes) == (2, 4)
    assert not [w for w in job_plan.warnings if "offline validation skipped" in w], job_plan.warnings
    job_plan.write(tmp_path / "job")
    options = SubmitOptions(context="jobgen-lab", kubeconfig=str(k8s_lab.kubeconfig), dry_run=True)
    result = k8s.KubernetesBackend().submit(tmp_path / "job", options, lambda _: None)
    assert result.action == "validated" and result.handle is None
    checked = [line for line in result.lines if line.endswith("valid (no pruned fields)")]
    assert len(checked) == 3, result.lines  # ConfigMap, PyTorchJob, one Pod from the Worker template (no Master)
    assert any("elastic-fsdp-worker-0 (from the PyTorchJob's pod template)" in line for line in checked), result.lines
    assert k8s_lab.request("GET", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/elastic-fsdp")[0] == 404


def test_cli_creates_the_elastic_job_as_rendered_and_cancels_it(k8s_lab, tmp_path):
    profile = str(site_profile(tmp_path / "lab-profiles", "k8s-h100"))  # the shipped example values set: a real submit takes it
    out = cli(k8s_lab, tmp_path, "submit", str(ELASTIC_SPEC), "-p", profile)
    assert out.returncode == 0, out.stdout + out.stderr
    handle = "k8s://jobgen-lab/training/elastic-fsdp"
    assert f"created {handle}" in out.stdout
    status, job = k8s_lab.request("GET", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/elastic-fsdp")
    assert status == 200, job
    spec = job["spec"]
    assert spec["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "maxRestarts": 3}
    assert spec["nprocPerNode"] == "8"
    assert {role: r["replicas"] for role, r in spec["pytorchReplicaSpecs"].items()} == {"Worker": 4}
    command = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert command[3:8] == ["--nnodes=2:4", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=$(PET_RDZV_ENDPOINT)",
                            "--max-restarts=3"]
    job_dir = tmp_path / "runs" / "elastic-fsdp" / "job"
    written = json.loads((job_dir / "spec.json").read_text())
    launch = written["launch"]
    assert (launch["min_nodes"], launch["num_nodes"]) == (2, 4)
    # the global batch every pod count keeps, and the accumulation at 4 pods (768 = 8 x 3 x 32)
    assert (written["spec"]["trainer"]["global_batch_size"], written["spec"]["trainer"]["gradient_accumulation_steps"]) == (768, 3)
    logs = cli(k8s_lab, tmp_path, "logs", handle)  # no Master: the default replica is worker-0 (no kubelet: no pod yet)
    assert logs.returncode == 0 and "no pod for worker-0 yet" in logs.stdout, logs.stdout + logs.stderr
    assert "global rank 0 may run on another worker" in logs.stdout, logs.stdout  # worker-0 is not assumed to be rank 0
    gone = cli(k8s_lab, tmp_path, "cancel", handle, "--wait-s", "60")
    assert gone.returncode == 0 and f"{handle}  DELETED" in gone.stdout, gone.stdout + gone.stderr


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def test_offline_elastic_rules_go_beyond_the_bare_server(k8s_lab, tmp_path, monkeypatch):
    """Each broken elastic job is refused offline; the 1.20 server (no operator webhook) says
    what it says, printed as a table: the operator and torchrun rules are jobgen's to check."""
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    docs = k8s_manifest.parse_manifest(_elastic_plan("k8s-h100").file("pytorchjob.yaml"), "pytorchjob.yaml")
    cluster = k8s_api.connect("jobgen-lab", str(k8s_lab.kubeconfig))
    cases = [  # (name, mutate, does the 1.20 server reject it?)
        ("minReplicas above maxReplicas", lambda j: j["spec"]["elasticPolicy"].update(minReplicas=5), False),
        ("Worker replicas above maxReplicas", lambda j: _worker(j).update(replicas=6), False),
        ("a Master beside the policy", lambda j: j["spec"]["pytorchReplicaSpecs"].update(Master=copy.deepcopy(_worker(j)) | {"replicas": 1}), False),
        ("etcd rendezvous", lambda j: j["spec"]["elasticPolicy"].update(rdzvBackend="etcd"), False),
        ("misspelt policy field", lambda j: j["spec"]["elasticPolicy"].update(maxReplica=4), True),  # pruned: the check sees it
    ]
    table = []
    for name, mutate, server_rejects in cases:
        bad = copy.deepcopy(docs)
        mutate(bad[1])
        with pytest.raises(PlanError):
            validate_manifest(bad, source=name)
        try:
            k8s.server_dry_run(cluster, k8s_manifest.PYTORCHJOB, tuple(bad), out=lambda _: None)
            verdict = "accepted"
        except SubmitError as exc:
            verdict = "rejected: " + exc.message.splitlines()[0][:160]
        table.append(f"{name:36} offline: rejected | server 1.20: {verdict}")
        assert verdict.startswith("rejected") == server_rejects, (name, verdict)
    print("\n" + "\n".join(table))


def test_crd_server_accepts_the_elastic_job_with_strict_fields(k8s_lab, k8s_crd_server):
    cluster = k8s_api.connect(k8s_crd_server, str(k8s_lab.kubeconfig))
    assert cluster.server_version is not None and cluster.server_version >= (1, 36) and cluster.field_validation
    for profile in K8S_PROFILES:
        job = k8s_manifest.parse_manifest(_elastic_plan(profile).file("pytorchjob.yaml"), "pytorchjob.yaml")[1]
        query = [("dryRun", "All"), ("fieldValidation", "Strict")]
        returned = cluster.request("POST", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs", query=query, body=job)
        assert k8s.pruned_paths(job, returned) == [], profile
        assert returned["spec"]["elasticPolicy"]["minReplicas"] == 2
