"""``jobgen profiles detect --scheduler kubernetes`` and ``jobgen doctor`` against the real
kube-apiserver 1.20 of the ``k8s_lab`` fixture, and ``doctor --probe``'s image pull on the
kubelet nodes of ``k8s_nodes``.

The API-server lab has no kubelet: two Node objects are created and their status written as a
kubelet with NVIDIA's device plugin and GPU feature discovery reports it (allocatable
``nvidia.com/gpu: 8``, the ``nvidia.com/gpu.product`` and ``nvidia.com/gpu.memory`` labels), in
a namespace of this module's own (the ``training`` namespace is the other tests'). The Nodes,
the namespace and what is in it are deleted afterwards. The lab's 1.20 server takes the
PyTorchJob CRD and refuses Trainer v2's (kubelab.py), so a profile asking for a TrainJob is the
profile whose operator CRD the cluster lacks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kubelab import K8sLab  # noqa: E402

from jobgen.cli import cli  # noqa: E402
from tests.conftest import EXAMPLES, write  # noqa: E402

pytestmark = pytest.mark.k8s_lab

NAMESPACE = "jk-detect"
NODES = ("gpu-node-1", "gpu-node-2")
PRODUCT = "NVIDIA-H100-80GB-HBM3"
IMAGE = "registry.example/jobgen-train:1.0@sha256:" + "a" * 64


def _ok(lab: K8sLab, method: str, path: str, body: Any = None) -> dict[str, Any]:
    status, answer = lab.request(method, path, body)
    assert status in (200, 201), (method, path, status, answer)
    return answer


def _gpu_node(lab: K8sLab, name: str) -> None:
    """A Node whose status says what a GPU node's kubelet, device plugin and GPU feature discovery say."""
    _ok(lab, "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.memory": "81559"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}})
    node = _ok(lab, "GET", f"/api/v1/nodes/{name}")
    resources = {"cpu": "96", "memory": "1000Gi", "nvidia.com/gpu": "8", "pods": "110"}
    node["status"] = {"capacity": resources, "allocatable": resources,
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "lab"}]}
    _ok(lab, "PUT", f"/api/v1/nodes/{name}/status", node)


def _claim(lab: K8sLab, name: str, mode: str) -> None:
    """A PersistentVolumeClaim, Bound (the lab runs no volume controller: the status is written)."""
    path = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
    claim = _ok(lab, "POST", path, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                                    "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}}})
    claim["status"] = {"phase": "Bound", "accessModes": [mode], "capacity": {"storage": "1Gi"}}
    _ok(lab, "PUT", f"{path}/{name}/status", claim)


@pytest.fixture(scope="module")
def gpu_lab(k8s_lab: K8sLab) -> Iterator[K8sLab]:
    """The session's API-server lab with two GPU Nodes, namespace ``jk-detect`` holding a
    ReadWriteMany claim ``runs``, a ReadWriteOnce claim ``scratch`` and Secret ``hf`` (key
    ``token``); all deleted afterwards."""
    k8s_lab.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for name in NODES:
        _gpu_node(k8s_lab, name)
    _claim(k8s_lab, "runs", "ReadWriteMany")
    _claim(k8s_lab, "scratch", "ReadWriteOnce")
    k8s_lab.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": NAMESPACE},
                   "stringData": {"token": "lab-secret-value"}})
    try:
        yield k8s_lab
    finally:
        for name in NODES:
            k8s_lab.request("DELETE", f"/api/v1/nodes/{name}")
        k8s_lab.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")


def jobgen(lab: K8sLab, monkeypatch: pytest.MonkeyPatch, *args: str):
    """``jobgen ARGS`` in-process against ``lab`` (its kubeconfig; no context or namespace override)."""
    monkeypatch.setenv("KUBECONFIG", str(lab.kubeconfig))
    for key in ("JOBGEN_K8S_CONTEXT", "JOBGEN_K8S_NAMESPACE"):
        monkeypatch.delenv(key, raising=False)
    return CliRunner().invoke(cli, list(args), prog_name="jobgen")


@pytest.fixture(scope="module")
def detected(gpu_lab: K8sLab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The profile ``detect`` writes for namespace ``jk-detect`` of the lab."""
    out = tmp_path_factory.mktemp("detect") / "lab-h100.yaml"
    with pytest.MonkeyPatch.context() as mp:
        result = jobgen(gpu_lab, mp, "profiles", "detect", "--scheduler", "kubernetes", "--context", "jobgen-lab",
                        "--namespace", NAMESPACE, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def site(directory: Path, detected: Path, name: str, kubernetes: dict[str, Any]) -> Path:
    """A profile extending the detected one that sets ``kubernetes.image`` (the documented way to
    replace a placeholder) and the other ``kubernetes:`` fields given."""
    doc = {"extends": str(detected), "kubernetes": {"image": IMAGE, **kubernetes}}
    return write(directory / f"{name}.yaml", yaml.safe_dump(doc, sort_keys=True))


def test_detect_reads_the_gpu_nodes_and_its_profile_passes_the_server_dry_run(gpu_lab, detected, tmp_path, monkeypatch):
    doc = yaml.safe_load(detected.read_text())
    assert (doc["max_nodes"], doc["gpus_per_node"], doc["gpu_type"], doc["gpu_mem_gib"]) == (2, 8, "H100", 79.6)
    assert (doc["cpus_per_node"], doc["mem_gib_per_node"]) == (96, 1000.0)
    k = doc["kubernetes"]
    assert (k["context"], k["namespace"], k["job_api"], k["version"]) == ("jobgen-lab", NAMESPACE, "pytorchjob", "1.20")
    assert (k["runs_volume_claim"], k["node_selector"], k["queue_label"]) == ("runs", {"nvidia.com/gpu.product": PRODUCT}, None)
    assert k["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "# PriorityClasses: 'training-high'; null: set one" in detected.read_text()
    assert list(doc["placeholders"]) == ["kubernetes.image"]
    spec = str(EXAMPLES / "quickstart.yaml")
    refused = jobgen(gpu_lab, monkeypatch, "submit", spec, "-p", str(detected))
    assert refused.exit_code == 2 and "holds example values" in refused.output and "kubernetes.image" in refused.output
    profile = site(tmp_path, detected, "lab-site", {})
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    result = jobgen(gpu_lab, monkeypatch, "submit", spec, "-p", str(profile), "--set", "resources.nodes=2", "--dry-run=server")
    assert result.exit_code == 0, result.output
    assert "(from the PyTorchJob's pod template): valid" in result.output and "nothing was queued or created" in result.output


def doctor(lab: K8sLab, monkeypatch: pytest.MonkeyPatch, profile: Path, *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = jobgen(lab, monkeypatch, "doctor", "--profile", str(profile), "-o", "json", *args)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, {c["name"].split(".", 1)[1]: c for c in json.loads(result.stdout)["checks"]}


GOOD = {"priority_class": "training-high", "secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}}}
#: (what is wrong, the profile's kubernetes fields, the check that fails, words its fix must hold)
MISMATCHES = [
    ("a ReadWriteOnce claim", {"runs_volume_claim": "scratch"}, "claim", "ReadWriteMany"),
    ("an operator whose CRD the cluster lacks", {"job_api": "trainjob"}, "crd", "kubectl apply --server-side -k"),
    ("a missing Secret", {"secret_env": {"HF_TOKEN": {"secret": "hf-missing", "key": "token"}}}, "secrets",
     f"kubectl -n {NAMESPACE} create secret generic hf-missing"),
    ("a missing PriorityClass", {"priority_class": "no-such-class"}, "priority_class", "training-high"),
]


def test_doctor_passes_the_site_profile_and_each_mismatch_fails_only_its_check(gpu_lab, detected, tmp_path, monkeypatch):
    code, checks = doctor(gpu_lab, monkeypatch, site(tmp_path, detected, "good", GOOD))
    assert code == 0, checks
    assert {n: c["status"] for n, c in checks.items()} == {
        "api": "pass", "crd": "pass", "operator": "skip", "namespace": "pass", "claim": "pass", "priority_class": "pass",
        "local_queue": "skip", "secrets": "pass", "nodes": "pass", "image": "skip"}
    assert "v1.20.2" in checks["api"]["detail"] and "2 schedulable node(s)" in checks["nodes"]["detail"]
    for what, fields, failing, fix in MISMATCHES:
        code, checks = doctor(gpu_lab, monkeypatch, site(tmp_path, detected, failing, {**GOOD, **fields}))
        failed = {n: c for n, c in checks.items() if c["status"] == "fail"}
        assert code == 1 and list(failed) == [failing], (what, checks)
        assert fix in failed[failing]["fix"], (what, failed)
    assert "lab-secret-value" not in json.dumps(checks)


def test_probe_with_an_image_no_node_has_fails_the_image_check(k8s_nodes, tmp_path, monkeypatch):
    """On the kubelet nodes: the probe pod's image cannot be pulled (no registry answers), the
    check fails with the kubelet's pull error, and the pod is gone afterwards."""
    lab, _ = k8s_nodes
    profile = write(tmp_path / "probe.yaml", yaml.safe_dump({
        "scheduler": "kubernetes", "cpus_per_node": 1, "mem_gib_per_node": 1,
        "kubernetes": {"namespace": "default", "image": "registry.invalid/jobgen/absent:1.0", "image_pull_policy": "IfNotPresent"}}))
    code, checks = doctor(lab, monkeypatch, profile, "--probe", "--timeout", "60")
    assert code == 1
    image = checks["image"]
    assert image["status"] == "fail", checks
    assert "cannot pull 'registry.invalid/jobgen/absent:1.0'" in image["detail"], image
    assert any(reason in image["detail"] for reason in ("ErrImagePull", "ImagePullBackOff")), image
    status, pods = lab.request("GET", "/api/v1/namespaces/default/pods?labelSelector=jobgen.io%2Fdoctor-probe")
    assert status == 200 and [p["metadata"]["name"] for p in pods["items"]
                              if not p["metadata"].get("deletionTimestamp")] == [], pods
    print(f"\nprobe: {image['detail']}", file=sys.stderr)
