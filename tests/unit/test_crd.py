"""Rendered PyTorchJobs validate against the Kubeflow training-operator v1.9.4 CRD schema,
with unknown fields rejected (the apiserver would prune them silently)."""

from __future__ import annotations

import copy

import pytest
import yaml

from jobgen.backends import plan
from jobgen.backends.kubernetes.validate import strict
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import CRDS, EXAMPLES, PROFILES, TEMPLATES, require

jsonschema = require("jsonschema", "jsonschema not installed (pip install -e .[dev])")
CRD_FILE = CRDS / "training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"


@pytest.fixture(scope="module")
def validator():
    crd = yaml.safe_load(CRD_FILE.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def rendered_jobs():
    for profile in ("k8s-a100", "k8s-h100"):
        for example in sorted(EXAMPLES.glob("*.yaml")):
            job_plan = plan(load_spec(example), load_profile(profile, PROFILES), TEMPLATES)
            yield pytest.param(job_plan.file("pytorchjob.yaml"), id=f"{profile}-{example.stem}")


@pytest.mark.parametrize("manifest", list(rendered_jobs()))
def test_rendered_pytorchjob_matches_crd(validator, manifest):
    config_map, job = yaml.safe_load_all(manifest)
    errors = sorted(validator.iter_errors(job), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert config_map["metadata"]["name"] == job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"][1]["configMap"]["name"]


def test_strict_schema_rejects_a_misspelt_field(validator):
    job = list(yaml.safe_load_all(next(iter(rendered_jobs())).values[0]))[1]
    bad = copy.deepcopy(job)
    bad["spec"]["nprocsPerNode"] = bad["spec"].pop("nprocPerNode")
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    messages = [e.message for e in validator.iter_errors(bad)]
    assert any("nprocsPerNode" in m for m in messages) and any("imagePullPolicyy" in m for m in messages)
