"""``jobgen doctor`` on Kubernetes profiles against the emulated API server of
tests/unit/test_k8s_detect.py (the real one: tests/integration/k8s/test_k8s_detect_doctor.py):
the order of the checks, a server that cannot be reached, and Secrets whose values never reach
the report."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from jobgen.backends.kubernetes import api as k8s_api
from jobgen.cli import cli
from tests.conftest import EXAMPLES, write
from tests.unit.test_k8s_detect import FakeCluster, cluster_answers

ORDER = ["api", "crd", "operator", "namespace", "claim", "priority_class", "local_queue", "secrets", "nodes", "image"]
PROFILE = """\
scheduler: kubernetes
max_nodes: 3
gpus_per_node: 8
gpu_type: H100
cpus_per_node: 96
mem_gib_per_node: 900
kubernetes:
  namespace: training
  image: registry.example/train@sha256:{digest}
  node_selector: {{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}}
  runs_volume_claim: runs
  queue_label: team-a
  priority_class: training-high
  secret_env: {{HF_TOKEN: {{secret: hf, key: token}}}}
""".format(digest="0" * 64)


@pytest.fixture
def fake(monkeypatch):
    answers = cluster_answers()
    answers["/api/v1/namespaces/training/persistentvolumeclaims/runs"] = {
        "metadata": {"name": "runs"}, "spec": {"accessModes": ["ReadWriteMany"]}, "status": {"phase": "Bound"}}
    answers["/apis/kueue.x-k8s.io/v1beta1/namespaces/training/localqueues/team-a"] = {"metadata": {"name": "team-a"}}
    answers["/apis/scheduling.k8s.io/v1/priorityclasses/training-high"] = {"metadata": {"name": "training-high"}}
    answers["/api/v1/namespaces/training/secrets/hf"] = {"metadata": {"name": "hf"}, "data": {"token": "aHVudGVyMi1zZWNyZXQ="}}
    answers["/api/v1/pods"] = {"items": []}
    cluster = FakeCluster(answers)
    monkeypatch.setattr(k8s_api, "connect", lambda context=None, kubeconfig=None: cluster)
    for key in ("JOBGEN_K8S_CONTEXT", "JOBGEN_K8S_NAMESPACE"):
        monkeypatch.delenv(key, raising=False)
    return cluster


def doctor(tmp_path, text: str = PROFILE, *args: str):
    profile = write(tmp_path / "site.yaml", text)
    result = CliRunner().invoke(cli, ["doctor", "--profile", str(profile), "-o", "json", *args], prog_name="jobgen")
    return result, {c["name"].split(".", 1)[1]: c for c in json.loads(result.stdout)["checks"]} if result.stdout else {}


def test_a_matching_profile_passes_every_check_in_order_and_no_secret_value_is_shown(fake, tmp_path):
    result, checks = doctor(tmp_path)
    assert result.exit_code == 0, result.output
    assert list(checks) == ORDER
    assert {n: c["status"] for n, c in checks.items()} == {**dict.fromkeys(ORDER, "pass"), "operator": "skip", "image": "skip"}
    assert "control-plane=kubeflow-training-operator" in checks["operator"]["detail"]
    assert "--probe" in checks["image"]["detail"]
    assert "HF_TOKEN: Secret hf key token" in checks["secrets"]["detail"]
    assert "aHVudGVy" not in result.output and "hunter2" not in result.output


def test_a_missing_key_names_the_keys_the_secret_has_but_no_value(fake, tmp_path):
    fake.answers["/api/v1/namespaces/training/secrets/hf"]["data"] = {"hf-token": "aHVudGVyMi1zZWNyZXQ="}
    result, checks = doctor(tmp_path)
    assert result.exit_code == 1
    assert [n for n, c in checks.items() if c["status"] == "fail"] == ["secrets"]
    assert "has no key token (keys: 'hf-token')" in checks["secrets"]["detail"]
    assert "kubernetes.secret_env.HF_TOKEN.key" in checks["secrets"]["fix"]
    assert "aHVudGVy" not in result.output


def test_an_unreachable_server_fails_api_and_skips_the_rest(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    result, checks = doctor(tmp_path)
    assert result.exit_code == 1
    assert list(checks) == ORDER
    assert checks["api"]["status"] == "fail" and "does not exist" in checks["api"]["detail"] and "KUBECONFIG" in checks["api"]["fix"]
    assert all(c["status"] == "skip" and "kubernetes.api failed" in c["detail"] for n, c in checks.items() if n != "api")


class ProbeCluster(FakeCluster):
    """The fake cluster that also takes the probe pod: POST answers it with a name, each GET of
    it returns the next of ``states`` (the last one repeats), DELETE is recorded."""

    def __init__(self, answers, states):
        super().__init__(answers)
        self.states, self.created, self.deleted = list(states), [], []

    def request(self, method, path, *, query=None, body=None, timeout=30.0, stream=False):
        if method == "POST" and path.endswith("/pods"):
            self.created.append(body)
            return {**body, "metadata": {**body["metadata"], "name": "jobgen-doctor-probe-x1"}}
        if path.endswith("/pods/jobgen-doctor-probe-x1"):
            if method == "DELETE":
                self.deleted.append(path)
                return {}
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return {"spec": {"nodeName": "node 'a'\n"}, "status": {"phase": "Pending", "containerStatuses": [{"state": state}]}}
        return super().request(method, path, query=query, body=body)


@pytest.mark.parametrize(("state", "status", "words"), [
    ({"waiting": {"reason": "ErrImagePull", "message": 'pull "img":\nfailed \x1b[31m' + "x" * 300}}, "fail", "ErrImagePull"),
    ({"terminated": {"exitCode": 0, "reason": "Completed"}}, "pass", "imports jobgen.train"),
    ({"terminated": {"exitCode": 1, "reason": "Error", "message": "ModuleNotFoundError: No module named 'jobgen'"}}, "fail",
     "exit code 1"),
], ids=["pull-error", "imports", "no-jobgen"])
def test_the_probe_reports_the_pod_and_always_deletes_it(fake, monkeypatch, tmp_path, state, status, words):
    cluster = ProbeCluster(fake.answers, [{"waiting": {"reason": "ContainerCreating"}}, state])
    monkeypatch.setattr(k8s_api, "connect", lambda context=None, kubeconfig=None: cluster)
    monkeypatch.setattr("time.sleep", lambda s: None)
    result, checks = doctor(tmp_path, PROFILE, "--probe", "--timeout", "5")
    image = checks["image"]
    assert image["status"] == status and words in image["detail"], image
    assert image["detail"].isprintable() and len(image["detail"]) < 700, image  # cluster text escaped and cut
    assert cluster.deleted == ["/api/v1/namespaces/training/pods/jobgen-doctor-probe-x1"]
    pod = cluster.created[0]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["containers"][0]["image"].startswith("registry.example/train@sha256:")
    assert result.exit_code == (0 if status == "pass" else 1)


def test_a_spec_asking_for_more_nodes_than_match_fails_nodes(fake, tmp_path):
    profile = write(tmp_path / "site.yaml", PROFILE.replace("max_nodes: 3", "max_nodes: 8"))
    spec = str(EXAMPLES / "quickstart.yaml")
    args = ["doctor", "--profile", str(profile), spec, "-o", "json"]
    result = CliRunner().invoke(cli, [*args, "--set", "resources.nodes=3"], prog_name="jobgen")
    assert result.stdout.startswith("{"), result.output
    nodes = {c["name"]: c for c in json.loads(result.stdout)["checks"]}["kubernetes.nodes"]
    assert result.exit_code == 0 and nodes["status"] == "pass" and "the spec needs 3" in nodes["detail"], result.output
    result = CliRunner().invoke(cli, [*args, "--set", "resources.nodes=4"], prog_name="jobgen")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert result.exit_code == 1 and [n for n, c in checks.items() if c["status"] == "fail"] == ["kubernetes.nodes"], checks
    assert "3 schedulable node(s)" in checks["kubernetes.nodes"]["detail"] and "GPU nodes have: 4x A100, 8x H100" in \
        checks["kubernetes.nodes"]["detail"]


class ForbiddingCluster(FakeCluster):
    """The fake cluster whose credentials may read ``/version`` only: every other GET is a 403."""

    def request(self, method: str, path: str, *, query=None, body=None, timeout=30.0, stream=False):
        if path != "/version":
            raise k8s_api.ApiError(f"GET {path}: 403 Forbidden", status=403, reason="Forbidden")
        return super().request(method, path, query=query, body=body, timeout=timeout, stream=stream)


def test_reads_the_credentials_may_not_make_are_skipped_naming_what_was_not_read(fake, monkeypatch, tmp_path):
    cluster = ForbiddingCluster(fake.answers)
    monkeypatch.setattr(k8s_api, "connect", lambda context=None, kubeconfig=None: cluster)
    result, checks = doctor(tmp_path)
    assert result.exit_code == 0, result.output
    assert list(checks) == ORDER and checks["api"]["status"] == "pass"
    forbidden = {"crd": "CustomResourceDefinitions", "namespace": "namespace training",
                 "claim": "PersistentVolumeClaims in namespace training", "priority_class": "PriorityClasses",
                 "local_queue": "Kueue LocalQueues in namespace training", "secrets": "Secrets in namespace training",
                 "nodes": "the nodes"}
    for name, what in forbidden.items():
        assert checks[name]["status"] == "skip", checks[name]
        assert checks[name]["detail"].startswith(f"not checked: your credentials may not read {what}")
        assert checks[name]["detail"].endswith("(403 Forbidden)")
    assert checks["operator"]["status"] == "skip" and "kubernetes.crd" in checks["operator"]["detail"]
