"""Offline validation of rendered manifests (jobgen.backends.kubernetes.validate): each check catches its class of
mistake, names the path and the rule's source, and a missing input skips with a clear reason."""

from __future__ import annotations

import copy
import subprocess
import sys
from decimal import Decimal

import pytest

from jobgen.backends import plan
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.backends.kubernetes import validate as kv
from jobgen.errors import ConfigError, PlanError
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import CRDS, EXAMPLES, PROFILES, REPO, TEMPLATES, require

require("kubernetes_validate", "kubernetes-validate not installed (pip install -e .[k8s])")


@pytest.fixture(scope="module")
def docs():
    job_plan = plan(load_spec(EXAMPLES / "gpt2-350m-zero3.yaml"), load_profile("k8s-h100", PROFILES), TEMPLATES)
    return k8s_manifest.parse_manifest(job_plan.file("pytorchjob.yaml"), "pytorchjob.yaml")


def problems_after(docs, mutate) -> str:
    bad = copy.deepcopy(docs)
    mutate(bad[1])
    with pytest.raises(PlanError) as info:
        kv.validate_manifest(bad, source="test")
    return info.value.message


def worker(job):
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


def test_rendered_manifest_passes(docs):
    report = kv.validate_manifest(docs, source="ok")
    assert any("admission rules" in c for c in report.checked) and any("kubernetes-validate" in c for c in report.checked)


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda j: j["spec"].__setitem__("nprocsPerNode", "8"), "spec: Additional properties are not allowed ('nprocsPerNode'"),
    (lambda j: j["spec"]["runPolicy"].__setitem__("backofLimit", 3), "spec.runPolicy: Additional properties are not allowed ('backofLimit'"),
    (lambda j: worker(j).__setitem__("imagePullPolicyy", "Always"), "containers[0]: Additional properties are not allowed ('imagePullPolicyy'"),
])
def test_strict_crd_schema_rejects_misspelt_fields_that_a_server_would_prune(docs, mutate, path):
    message = problems_after(docs, mutate)
    assert path in message and "kubeflow.org_pytorchjobs.yaml (strict)" in message and "drop it silently" in message


def test_misspelt_metadata_field_is_caught_as_objectmeta(docs):
    message = problems_after(docs, lambda j: j["metadata"].__setitem__("lables", {}))
    assert "metadata: Additional properties are not allowed ('lables'" in message and "ObjectMeta" in message


@pytest.mark.parametrize(("mutate", "fragment"), [
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].__setitem__("replicas", 2), "Master.replicas: must be 1 (got 2)"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].__setitem__("Chief", copy.deepcopy(j["spec"]["pytorchReplicaSpecs"]["Worker"])),
     "replica type 'Chief' is not supported: only Master and Worker"),
    (lambda j: worker(j).__setitem__("name", "trainer"), "Worker.template.spec.containers: must have a container named 'pytorch'"),
    (lambda j: worker(j).__setitem__("image", ""), "containers[0].image: must be set"),
    (lambda j: j["metadata"].__setitem__("name", "Bad_Name"), "metadata.name: 'Bad_Name' is not a DNS-1035 label"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__("replicas", 0), "Worker.replicas: must be at least 1"),
])
def test_operator_webhook_rules(docs, mutate, fragment):
    message = problems_after(docs, mutate)
    assert fragment in message and "[training-operator PyTorchJob webhook]" in message


@pytest.mark.parametrize("policy", ["ExitCodes", "exitcode", "Exit\nCode", "x" * 300])
def test_a_replica_restart_policy_outside_the_operators_four_is_refused(docs, policy):
    """The CRD types restartPolicy as any string; the operator copies it into each pod, which the API server refuses."""
    assert all(r["restartPolicy"] == "ExitCode" for r in docs[1]["spec"]["pytorchReplicaSpecs"].values())
    message = problems_after(docs, lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__("restartPolicy", policy))
    assert "Worker.restartPolicy: " in message and "is not one of Always, OnFailure, Never, ExitCode" in message
    assert "common_types.go RestartPolicy" in message


@pytest.mark.parametrize(("mutate", "fragment"), [
    (lambda j: worker(j)["resources"]["limits"].__setitem__("cpu", "4"), "'180' must be less than or equal to cpu limit '4'"),
    (lambda j: worker(j)["resources"]["requests"].__setitem__("memory", "3Ti"), "'3Ti' must be less than or equal to memory limit"),
    (lambda j: (worker(j)["resources"]["requests"].__setitem__("nvidia.com/gpu", "1"),), "must be equal to nvidia.com/gpu limit ('8')"),
    (lambda j: worker(j)["resources"]["limits"].__setitem__("nvidia.com/gpu", "1.5"), "nvidia.com/gpu must be a whole number"),
    (lambda j: worker(j)["volumeMounts"].append({"name": "nope", "mountPath": "/x"}), "no volume named 'nope' in the pod"),
    (lambda j: worker(j)["env"].append({"name": "1BAD", "value": "x"}), "'1BAD' is not a valid environment variable name"),
    (lambda j: worker(j)["ports"][0].__setitem__("name", "a-very-long-port-name"), "is not an IANA service name"),
    (lambda j: worker(j)["resources"]["limits"].__setitem__("memory", "lots"), "'lots' is not a quantity"),
])
def test_pod_rules_no_schema_expresses(docs, mutate, fragment):
    message = problems_after(docs, mutate)
    assert fragment in message and "[core/v1 Pod validation]" in message


def test_core_schema_catches_wrong_types_in_pod_templates(docs):
    message = problems_after(docs, lambda j: worker(j).__setitem__("imagePullPolicy", 3))
    assert "imagePullPolicy" in message and "PodTemplate" in message


def test_quantities():
    assert kv.parse_quantity("1500m") == Decimal("1.5")
    assert kv.parse_quantity("64Gi") == 64 * 2**30
    assert kv.parse_quantity("1e3") == 1000 and kv.parse_quantity(2) == 2
    assert kv.parse_quantity("12Mb") is None and kv.parse_quantity(True) is None


def test_strict_keeps_preserve_unknown_fields_open():
    schema = {"type": "object", "properties": {"a": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                                    "properties": {"b": {"type": "string"}}}}}
    out = kv.strict(schema)
    assert out["additionalProperties"] is False and "additionalProperties" not in out["properties"]["a"]


def test_crds_default_to_the_packaged_copies_and_every_check_runs(monkeypatch, docs):
    monkeypatch.delenv(kv.ENV_CRDS_DIR, raising=False)
    assert kv.crds_dir() == CRDS == REPO / "jobgen" / "_crds"
    report = kv.validate_manifest(docs, source="x")
    assert report.warnings == ()
    assert "PyTorchJob CRD schema (training-operator-v1.9.4, strict)" in report.checked


def test_cli_render_from_a_directory_with_nothing_beside_it_validates_against_packaged_crds(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv(kv.ENV_CRDS_DIR, raising=False)
    out = run_cli("render", str(EXAMPLES / "quickstart.yaml"), "-p", "k8s-h100", "--stdout", cwd=tmp_path)
    assert out.code == 0, out.stderr
    assert "kind: PyTorchJob" in out.stdout and "offline validation skipped" not in out.stderr


def test_missing_crds_skip_with_a_clear_reason_and_render_still_works(tmp_path, monkeypatch, docs):
    monkeypatch.setenv(kv.ENV_CRDS_DIR, str(tmp_path))
    report = kv.validate_manifest(docs, source="x")
    assert report.skipped and "PyTorchJob CRD schema: no kubeflow.org_pytorchjobs.yaml in" in report.warnings[0]
    job_plan = plan(load_spec(EXAMPLES / "quickstart.yaml"), load_profile("k8s-a100", PROFILES), TEMPLATES)
    assert any(w.startswith("offline validation skipped: PyTorchJob CRD schema") for w in job_plan.warnings)


def test_crds_dir_that_does_not_exist_is_bad_input(tmp_path, monkeypatch, docs):
    monkeypatch.setenv(kv.ENV_CRDS_DIR, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is not a directory"):
        kv.validate_manifest(docs, source="x")


def test_cli_says_validation_was_skipped(run_cli, tmp_path):
    out = run_cli("render", str(EXAMPLES / "quickstart.yaml"), "-p", "k8s-a100", "--stdout", "--crds-dir", str(tmp_path))
    assert out.code == 0 and "warning: offline validation skipped: PyTorchJob CRD schema" in out.stderr


def test_without_kubernetes_validate_the_core_check_is_skipped(monkeypatch, docs):
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)
    report = kv.validate_manifest(docs, source="x")
    assert any("kubernetes-validate is not installed" in s for s in report.skipped)


def test_without_jsonschema_only_the_rule_checks_run(monkeypatch, docs):
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    report = kv.validate_manifest(docs, source="x")
    assert report.checked == ("PyTorchJob admission rules",)
    assert report.skipped == ("CRD and core/v1 schemas: jsonschema is not installed (pip install 'jobgen[k8s]')",)
    bad = copy.deepcopy(docs)
    bad[1]["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 3
    with pytest.raises(PlanError, match="must be 1"):
        kv.validate_manifest(bad, source="x")


def test_old_kubernetes_versions_use_the_oldest_bundled_schema(docs):
    report = kv.validate_manifest(docs, source="x", k8s_version="1.20")
    assert any("checked against 1.25 instead of 1.20" in s for s in report.skipped)


def test_core_definitions_are_read_once_for_all_core_validators(docs):
    """kubernetes-validate's _definitions.json (1.8 MB) is parsed once per version, not once per
    schema file: the ObjectMeta, ConfigMap and PodTemplate validators share it."""
    kv._core_validator.cache_clear()
    kv._core_definitions.cache_clear()
    kv.validate_manifest(docs, source="x", k8s_version="1.30")
    assert kv._core_validator.cache_info().misses == 3
    assert kv._core_definitions.cache_info().misses == 1


def test_trainjob_rules_and_crd():
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "x" * 70},
           "spec": {"runtimeRef": {"name": "torch-distributed"},
                    "trainer": {"image": "i", "env": [{"name": "PET_NNODES", "value": "2"}], "numNodes": 2, "numProcPerNod": 2}}}
    with pytest.raises(PlanError) as info:
        kv.validate_manifest([job], source="t")
    message = info.value.message
    assert "metadata.name must be no more than 63 characters" in message
    assert "must not have reserved envs, invalid envs configured: ['PET_NNODES']" in message
    assert "'numProcPerNod' was unexpected" in message and "trainer.kubeflow.org_trainjobs.yaml (strict)" in message


def test_render_path_imports_no_heavy_modules_and_validation_is_lazy():
    """Rendering a SLURM job imports no validator; a Kubernetes render imports jsonschema but not
    the kubernetes client, torch or numpy."""
    code = (
        "import sys\n"
        "from jobgen.cli import main\n"
        "for profile in ('slurm-a100', 'k8s-h100'):\n"
        "    try:\n"
        f"        main(['render', {str(EXAMPLES / 'quickstart.yaml')!r}, '--profile', profile, '--stdout'])\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "    print(profile, sorted(m for m in ('kubernetes', 'torch', 'numpy', 'jsonschema', 'kubernetes_validate') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith(("slurm-a100", "k8s-h100"))]
    assert lines[0] == "slurm-a100 []"
    assert "kubernetes'" not in lines[1] and "torch" not in lines[1] and "numpy" not in lines[1]
    assert "jsonschema" in lines[1]
