"""trainer_controller.py's pure parts without a cluster: the CRDs made for 1.20, the runtime patch
merge, and the JobSet and pods a jobgen TrainJob becomes (the lab tests run the same code against
kube-apiserver: test_trainer_emulation.py, test_trainjob_on_pods.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import yaml

from jobgen.backends import plan
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import EXAMPLES, REPO, TEMPLATES

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainer_controller as tc  # noqa: E402

CRDS = REPO / "jobgen" / "_crds"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are large: libyaml's parser when present


def _walk(node, found):
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            _walk(value, found)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found)
    return found


def test_crd_for_120_removes_only_what_120_cannot_parse():
    for rel in tc.CRD_FILES:
        shipped = yaml.load((CRDS / rel).read_text(), Loader=LOADER)
        kept = copy.deepcopy(shipped)
        made, removed = tc.crd_for_120(shipped)
        before, after = _walk(shipped, []), _walk(made, [])
        assert removed["empty_string_defaults"] == sum(1 for n in before if n.get("default") == "") > 0
        assert removed["cel_rule_lists"] == sum(1 for n in before if "x-kubernetes-validations" in n) > 0
        assert not any(n.get("default") == "" or "x-kubernetes-validations" in n for n in after)
        # Every other default, enum, type and required list is kept.
        for key in ("enum", "type", "required"):
            assert sum(1 for n in before if key in n) == sum(1 for n in after if key in n), (rel, key)
        assert sum(1 for n in before if "default" in n) - removed["empty_string_defaults"] == sum(1 for n in after if "default" in n)
        made_atomic = sum(1 for n in before if n.get("x-kubernetes-list-type") == "map") - sum(
            1 for n in after if n.get("x-kubernetes-list-type") == "map")
        assert made_atomic == removed["map_lists_made_atomic"] >= 1
        assert shipped == kept  # the input is not changed


def test_strategic_merge_merges_keyed_lists_and_replaces_the_others():
    base = {"containers": [{"name": "node", "image": "a", "env": [{"name": "X", "value": "1"}]}], "tolerations": [{"key": "a"}]}
    patch = {"containers": [{"name": "node", "env": [{"name": "Y", "value": "2"}]}, {"name": "side"}], "tolerations": [{"key": "b"}]}
    merged = tc.strategic_merge(base, patch)
    assert merged["containers"][0] == {"name": "node", "image": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}
    assert merged["containers"][1] == {"name": "side"} and merged["tolerations"] == [{"key": "b"}]


def _rendered_trainjob(tmp_path, nodes=3):
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": str(REPO / "cluster_profiles" / "k8s-h100.yaml"),
                                       "kubernetes": {"job_api": "trainjob", "priority_class": None}}))
    spec = load_spec(EXAMPLES / "quickstart.yaml", [f"resources.nodes={nodes}"])
    job_plan = plan(spec, load_profile(str(profile)), TEMPLATES)
    job = k8s_manifest.parse_manifest(job_plan.file("trainjob.yaml"), "trainjob.yaml")[1]
    job["metadata"]["uid"] = "0f0f0f0f-0000-4000-8000-000000000000"
    return job


def test_a_jobgen_trainjob_becomes_the_runtime_job_with_the_patch_merged_in(tmp_path):
    job = _rendered_trainjob(tmp_path)
    trainer = job["spec"]["trainer"]
    jobset = tc.desired_jobset(job, tc.torch_distributed_runtime())
    [rjob] = jobset["spec"]["replicatedJobs"]  # the patch merged into the runtime's "node" job, not appended or replacing it
    assert rjob["template"]["metadata"]["labels"][tc.ANCESTOR_LABEL] == tc.ANCESTOR_TRAINER
    assert rjob["template"]["spec"]["parallelism"] == rjob["template"]["spec"]["completions"] == trainer["numNodes"]
    [container] = rjob["template"]["spec"]["template"]["spec"]["containers"]
    assert (container["image"], container["command"]) == (trainer["image"], trainer["command"])
    assert container["resources"] == trainer["resourcesPerNode"]
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert env["PET_NNODES"] == str(trainer["numNodes"]) and env["PET_NPROC_PER_NODE"] == str(trainer["numProcPerNode"])
    assert env["PET_MASTER_ADDR"] == f"{job['metadata']['name']}-node-0-0.{job['metadata']['name']}"
    assert all(env[v["name"]] == v.get("value") for v in trainer["env"])
    patch_pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert container["volumeMounts"] == patch_pod["spec"]["containers"][0]["volumeMounts"]
    pods = [tc.desired_pod(jobset, rjob, 0, i) for i in range(trainer["numNodes"])]
    assert [p["spec"]["hostname"] for p in pods] == [f"{job['metadata']['name']}-node-0-{i}" for i in range(trainer["numNodes"])]
    assert [p["metadata"]["annotations"][tc.COMPLETION_INDEX] for p in pods] == [str(i) for i in range(trainer["numNodes"])]
    assert all(p["spec"]["subdomain"] == tc.desired_service(jobset)["metadata"]["name"] == job["metadata"]["name"] for p in pods)
    assert all(p["spec"]["restartPolicy"] == "OnFailure" for p in pods)
