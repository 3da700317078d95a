"""``jobgen profiles detect --scheduler kubernetes`` and ``jobgen doctor``'s Kubernetes checks
against an emulated API server: a dict of GET paths -> JSON answers behind the client's
:class:`~jobgen.backends.kubernetes.api.Cluster` interface (the real API server runs in the k8s lab,
tests/integration/k8s/test_k8s_detect_doctor.py; here the answers are hostile in ways a real
server's validation would not let through: names and labels with spaces, quotes, line breaks,
300-byte values, lone surrogates and bytes that are not UTF-8).

Every case ends in a profile that loads back as written, with each value under a comment naming
its source and no cluster value able to end a comment, or in a refusal (exit 1 or 2) naming the
source; never in a traceback.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from jobgen.backends.kubernetes import api as k8s_api
from jobgen.backends.kubernetes.api import ApiError, Cluster
from jobgen.backends.kubernetes.detect import read_nodes
from jobgen.cli import cli
from jobgen.errors import JobgenError, SubmitError
from jobgen.specs.load import load_profile


def gpu_node(name: str, *, gpus: str = "8", product: str = "NVIDIA-H100-80GB-HBM3", cpu: str = "191500m",
             memory: str = "2113012Mi", taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Node as the kubelet, NVIDIA's device plugin and GPU feature discovery report it."""
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product,
                                                  "nvidia.com/gpu.memory": "81559"}},
            "spec": {"taints": taints if taints is not None else [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus, "pods": "110"}}}


def crd(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"versions": [{"name": version, "served": True, "storage": True}]}}


def cluster_answers() -> dict[str, Any]:
    """A GPU cluster: three 8x H100 nodes and one 4x A100 node, the training operator and Kueue,
    namespace ``training`` with one ReadWriteMany claim and one LocalQueue."""
    return {
        "/version": {"major": "1", "minor": "29+", "gitVersion": "v1.29.4"},
        "/api/v1/nodes": {"items": [gpu_node("gpu-a"), gpu_node("gpu-b"), gpu_node("gpu-c", cpu="180"),
                                    gpu_node("a100-a", gpus="4", product="NVIDIA-A100-SXM4-40GB")]},
        "/api/v1/namespaces/training": {"metadata": {"name": "training"}, "status": {"phase": "Active"}},
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org": crd("pytorchjobs.kubeflow.org", "v1"),
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/localqueues.kueue.x-k8s.io": crd("localqueues.kueue.x-k8s.io", "v1beta1"),
        "/apis/kueue.x-k8s.io/v1beta1/namespaces/training/localqueues": {"items": [{"metadata": {"name": "team-a"}}]},
        "/apis/scheduling.k8s.io/v1/priorityclasses": {"items": [{"metadata": {"name": "training-high"}},
                                                                 {"metadata": {"name": "system-node-critical"}}]},
        "/api/v1/namespaces/training/persistentvolumeclaims": {"items": [
            {"metadata": {"name": "runs"}, "spec": {"accessModes": ["ReadWriteMany"]}},
            {"metadata": {"name": "scratch"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]},
    }


class FakeCluster(Cluster):
    """:class:`Cluster` answering GETs from ``answers`` (404 for other paths; an answer that is an
    ApiError is raised); ``raw`` maps a path to the bytes of its body, decoded as the real client does."""

    def __init__(self, answers: dict[str, Any], context: str = "prod", raw: dict[str, bytes] | None = None):
        super().__init__(api=None, context=context)
        self.answers, self.raw = answers, raw or {}

    def request(self, method: str, path: str, *, query=None, body=None, timeout=30.0, stream=False) -> Any:
        if path in self.raw:
            raise AssertionError("unused")
        answer = self.answers.get(path)
        if isinstance(answer, ApiError):
            raise answer
        if answer is None:
            raise ApiError(f"GET {path}: 404 NotFound", status=404, reason="NotFound")
        return copy.deepcopy(answer)


@pytest.fixture
def fake(monkeypatch):
    """Install a FakeCluster as what :func:`jobgen.backends.kubernetes.api.connect` returns; the test edits its answers."""
    cluster = FakeCluster(cluster_answers())
    monkeypatch.setattr(k8s_api, "connect", lambda context=None, kubeconfig=None: cluster)
    for key in ("JOBGEN_K8S_CONTEXT", "JOBGEN_K8S_NAMESPACE"):
        monkeypatch.delenv(key, raising=False)
    return cluster


def detect(tmp_path: Path, *args: str):
    """``jobgen profiles detect --scheduler kubernetes --namespace training --out FILE ARGS``."""
    out = tmp_path / "detected.yaml"
    result = CliRunner().invoke(cli, ["profiles", "detect", "--scheduler", "kubernetes", "--namespace", "training",
                                      "--out", str(out), *args], prog_name="jobgen")
    return result, out


def assert_commented_and_loads(path: Path) -> dict[str, Any]:
    """Each value detect reads from the cluster (every top-level and ``kubernetes:`` key but
    description, scheduler, default_nodes) follows a comment line; the file loads back as a valid
    profile. Returns the document."""
    lines = path.read_text(encoding="utf-8").split("\n")
    unsourced = ("description:", "scheduler:", "default_nodes:", "kubernetes:", "  - ", "    ")
    for i, line in enumerate(lines):
        if line and not line.lstrip().startswith("#") and not line.startswith(unsourced) and lines[i - 1] != "placeholders:":
            assert lines[i - 1].lstrip().startswith("#"), f"no source comment above {line!r}"
    load_profile(str(path))
    return yaml.safe_load("\n".join(lines))


def test_detect_writes_the_profile_the_nodes_describe(fake, tmp_path):
    result, out = detect(tmp_path)
    assert result.exit_code == 0, result.output
    doc = assert_commented_and_loads(out)
    assert (doc["max_nodes"], doc["gpus_per_node"], doc["gpu_type"], doc["gpu_mem_gib"]) == (3, 8, "H100", 79.6)
    assert (doc["cpus_per_node"], doc["mem_gib_per_node"]) == (180, 2063.48)  # the smallest: gpu-c's 180 cores
    k = doc["kubernetes"]
    assert (k["context"], k["namespace"], k["job_api"], k["version"]) == ("prod", "training", "pytorchjob", "1.29")
    assert (k["runs_volume_claim"], k["queue_label"], k["priority_class"]) == ("runs", "team-a", None)
    assert k["node_selector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert k["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert list(doc["placeholders"]) == ["kubernetes.image"]
    text = out.read_text()
    assert "# PriorityClasses: 'training-high'; null: set one" in text
    assert "1 GPU node(s) of other models or counts left out" in text
    assert load_profile(str(out)).placeholders["kubernetes.image"].reason.startswith("an example image")


def test_detect_is_deterministic_and_keeps_an_existing_file(fake, tmp_path):
    result, out = detect(tmp_path)
    assert result.exit_code == 0, result.output
    first = out.read_bytes()
    result, _ = detect(tmp_path)
    assert result.exit_code == 2 and "--force" in result.output and out.read_bytes() == first
    result, _ = detect(tmp_path, "--force")
    assert result.exit_code == 0 and out.read_bytes() == first


def test_detect_prints_yaml_and_json(fake, tmp_path):
    args = ["profiles", "detect", "--scheduler", "kubernetes", "--namespace", "training"]
    as_yaml = CliRunner().invoke(cli, [*args, "-o", "yaml"], prog_name="jobgen")
    as_json = CliRunner().invoke(cli, [*args, "-o", "json"], prog_name="jobgen")
    assert as_yaml.exit_code == 0 and as_json.exit_code == 0, as_yaml.output + as_json.output
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)["profile"]
    assert not (tmp_path / "cluster_profiles").exists()


def test_gpu_type_takes_that_models_nodes_and_trainjob_only_clusters_get_trainjob(fake, tmp_path):
    del fake.answers["/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"]
    fake.answers["/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainjobs.trainer.kubeflow.org"] = crd("trainjobs", "v1alpha1")
    fake.answers["/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"] = {"items": [{"metadata": {"name": "torch-distributed"}}]}
    result, out = detect(tmp_path, "--gpu-type", "A100")
    assert result.exit_code == 0, result.output
    doc = assert_commented_and_loads(out)
    assert (doc["max_nodes"], doc["gpus_per_node"], doc["gpu_type"]) == (1, 4, "A100")
    assert (doc["kubernetes"]["job_api"], doc["kubernetes"]["trainer_runtime"]) == ("trainjob", "torch-distributed")


def test_a_cluster_without_gpus_gives_a_cpu_profile_and_forbidden_reads_leave_comments(fake, tmp_path):
    for node in fake.answers["/api/v1/nodes"]["items"]:
        del node["status"]["allocatable"]["nvidia.com/gpu"]
        node["spec"]["taints"] = []
    forbidden = ApiError("forbidden", status=403, reason="Forbidden")
    fake.answers["/api/v1/namespaces/training/persistentvolumeclaims"] = forbidden
    fake.answers["/apis/scheduling.k8s.io/v1/priorityclasses"] = forbidden
    result, out = detect(tmp_path)
    assert result.exit_code == 0, result.output
    doc = assert_commented_and_loads(out)
    assert (doc["gpus_per_node"], doc["max_nodes"], doc["kubernetes"]["runs_volume_claim"]) == (0, 4, None)
    assert "note: the claims: not read, your credentials may not GET /api/v1/namespaces/training/persistentvolumeclaims" in out.read_text()


def test_nodes_that_cannot_be_listed_are_an_error_with_a_hint(fake, tmp_path):
    fake.answers["/api/v1/nodes"] = ApiError("forbidden", status=403, reason="Forbidden")
    result, out = detect(tmp_path)
    assert result.exit_code == 2 and not out.exists()
    assert "the nodes cannot be listed" in result.output and "write the profile by hand" in result.output


HOSTILE = ["gpu node 'a' \"b\"", "gpu\nnode: injected", "x" * 300, "gpu-\udcff-node", "\x1b[31mred\x1b[0m", "H100\u2028next"]


@pytest.mark.parametrize("where", ["node name", "product label", "taint key", "claim", "queue", "priority class", "context"])
@pytest.mark.parametrize("value", HOSTILE, ids=["quotes", "newline", "300-bytes", "surrogate", "escape", "u2028"])
def test_hostile_cluster_values_are_quoted_or_refused(fake, tmp_path, where, value):
    nodes = fake.answers["/api/v1/nodes"]["items"]
    if where == "node name":
        nodes[0]["metadata"]["name"] = value
    elif where == "product label":
        for node in nodes[:3]:
            node["metadata"]["labels"]["nvidia.com/gpu.product"] = value + " H100"
    elif where == "taint key":
        for node in nodes:
            node["spec"]["taints"] = [{"key": value, "effect": "NoSchedule"}]
    elif where == "claim":
        fake.answers["/api/v1/namespaces/training/persistentvolumeclaims"]["items"][0]["metadata"]["name"] = value
    elif where == "queue":
        fake.answers["/apis/kueue.x-k8s.io/v1beta1/namespaces/training/localqueues"]["items"][0]["metadata"]["name"] = value
    elif where == "priority class":
        fake.answers["/apis/scheduling.k8s.io/v1/priorityclasses"]["items"][0]["metadata"]["name"] = value
    else:
        fake.context = value
    result, out = detect(tmp_path)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code != 0:
        assert result.exit_code in (1, 2) and not out.exists(), result.output
        assert "Traceback" not in result.output and ("kubeconfig" in result.output or "GET /api" in result.output), result.output
        return
    text = out.read_text(encoding="utf-8")
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)  # no raw control character, line break or escape in any line
    doc = assert_commented_and_loads(out)
    found = json.dumps(doc, ensure_ascii=False)
    if "\n" in value or "\udcff" in value:
        assert value not in found  # never written as it is
    if where in ("claim", "queue"):
        key = {"claim": "runs_volume_claim", "queue": "queue_label"}[where]
        assert doc["kubernetes"][key] is None  # not a name a profile can hold: left null, listed in the comment


def test_read_nodes_takes_any_types_without_a_traceback():
    nodes, notes = read_nodes({"items": [None, 3, {"metadata": "x"}, {"metadata": {"name": "n"}, "status": {"allocatable": []}},
                                         {"metadata": {"name": "half"}, "status": {"allocatable": {"nvidia.com/gpu": "0.5"}}},
                                         {"metadata": {"name": "big"}, "status": {"allocatable": {"nvidia.com/gpu": "1e400"}}}]})
    assert [n.name for n in nodes] == ["n"] and nodes[0].gpus == 0 and nodes[0].cpus is None
    assert sum("left out" in note for note in notes) == 5, notes
    with pytest.raises(JobgenError, match="no 'items' list"):
        read_nodes(["not", "a", "NodeList"])


class _Response:
    def __init__(self, body: bytes):
        self.status, self.reason, self.body = 200, "OK", body

    def read(self) -> bytes:
        return self.body


class _Api:
    """The two calls :meth:`Cluster.request` makes on the client's ApiClient, answering ``body``."""

    def __init__(self, body: bytes):
        self.body = body

    def param_serialize(self, **kwargs: Any) -> tuple[Any, ...]:
        return ()

    def call_api(self, *args: Any, **kwargs: Any) -> _Response:
        return _Response(self.body)


def test_an_answer_that_is_not_json_is_a_submit_error_and_bytes_not_utf8_are_kept_escaped():
    """An answer that is not JSON raises SubmitError naming the request; bytes that are not UTF-8
    come back as lone surrogates (refused where a value is used); neither is a traceback."""
    with pytest.raises(SubmitError, match="GET /api/v1/nodes: the API server's answer is not JSON"):
        Cluster(_Api(b"<html>proxy error</html>"), "prod").request("GET", "/api/v1/nodes")
    doc = Cluster(_Api(b'{"items": [{"metadata": {"name": "\xff\xfe"}}]}'), "prod").request("GET", "/api/v1/nodes")
    assert doc["items"][0]["metadata"]["name"] == "\udcff\udcfe"


@pytest.mark.parametrize(("scheduler", "flag"), [("kubernetes", "--partition"), ("slurm", "--context"), ("slurm", "--namespace")])
def test_an_option_of_the_other_scheduler_is_a_usage_error(scheduler, flag):
    result = CliRunner().invoke(cli, ["profiles", "detect", "--scheduler", scheduler, flag, "x"], prog_name="jobgen")
    assert result.exit_code == 2 and f"{flag} does not apply to --scheduler {scheduler}" in result.output
