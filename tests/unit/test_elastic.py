"""Elastic jobs (``resources.nodes: "min:max"``): the range in the spec and the YAML loader, the
rendered PyTorchJob (elasticPolicy, Worker replicas, torchrun flags), the refusals (SLURM,
local, TrainJob, DeepSpeed, a global batch some node count cannot keep), offline validation of
broken elastic jobs, and the world the entrypoint takes from torchrun (the same global batch,
the accumulation recomputed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobgen import jobdir
from jobgen.backends import plan
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.backends.kubernetes.validate import validate_manifest
from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir import ResolvedSpec
from jobgen.jobdir.world import World
from jobgen.planning.rules import elastic_nodes
from jobgen.specs.load import load_profile, load_spec, validate
from jobgen.specs.training import ResourcesSpec, TrainingSpec
from jobgen.train.resolved import check_runtime_support, runtime_world
from tests.conftest import PROFILES, REPO, TEMPLATES, write

ELASTIC_SPEC = REPO / "tests" / "golden" / "specs" / "elastic-fsdp.yaml"


def profile_file(tmp_path: Path, kubernetes: dict[str, Any] | None = None, base: str = "k8s-a100") -> Path:
    doc: dict[str, Any] = {"extends": str(PROFILES / f"{base}.yaml")}
    if kubernetes is not None:
        doc["kubernetes"] = kubernetes
    return write(tmp_path / "site.yaml", yaml.safe_dump(doc))


#: A global batch every node count of the range keeps with 8 GPUs per node and micro batch 8:
#: a multiple of 8 x 8 x n for every n (2:4: lcm(128, 192, 256); 3:6: lcm(192, 256, 320, 384)).
KEEPS = {"2:4": 768, "3:6": 3840}


def plan_elastic(tmp_path: Path, nodes: str = "2:4", kubernetes: dict[str, Any] | None = None, base: str = "k8s-a100", **trainer: Any):
    """Plan a job of ``nodes`` on (a copy of) ``base``; a range of :data:`KEEPS` gets its global batch
    unless the test sets the batch itself."""
    if nodes in KEEPS and not {"global_batch_size", "gradient_accumulation_steps", "micro_batch_size"} & set(trainer):
        trainer["global_batch_size"] = KEEPS[nodes]
    profile = load_profile(str(profile_file(tmp_path, kubernetes, base)))
    spec = validate(TrainingSpec, {"name": "job", "resources": {"nodes": nodes}, "trainer": trainer}, "<spec>")
    return plan(spec, profile, TEMPLATES, spec_source="spec.yaml", profile_source="site.yaml")


def docs_of(job_plan) -> list[dict[str, Any]]:
    return k8s_manifest.parse_manifest(job_plan.file(jobdir.PYTORCHJOB_FILE), jobdir.PYTORCHJOB_FILE)


# --------------------------------------------------------------------------- the range


@pytest.mark.parametrize(("given", "nodes", "node_range"), [
    (2, 2, None), ("2:4", "2:4", (2, 4)), (" 1 : 8 ", "1:8", (1, 8)), ("3", 3, None), ("3:3", 3, None), (None, None, None),
])
def test_nodes_is_a_count_or_a_range(given, nodes, node_range):
    resources = ResourcesSpec(nodes=given)
    assert resources.nodes == nodes and resources.node_range == node_range


@pytest.mark.parametrize(("given", "match"), [
    (0, "at least 1"), ("4:2", r"minimum \(4\) above its maximum \(2\)"), ("0:2", "starts below 1 node"),
    ("two", "neither a node count"), ("1:2:3", "neither a node count"), (True, "neither a node count"), (2.5, "neither a node count"),
])
def test_bad_ranges_are_refused(given, match):
    with pytest.raises(ValueError, match=match):
        ResourcesSpec(nodes=given)


def test_unquoted_range_in_yaml_and_in_set_is_the_range_not_base_60(tmp_path):
    # YAML 1.1 (PyYAML's safe_load) reads 2:4 as 2 * 60 + 4 = 124
    assert yaml.safe_load("nodes: 2:4") == {"nodes": 124}
    spec = write(tmp_path / "spec.yaml", "name: job\nresources:\n  nodes: 2:4\n")
    assert load_spec(spec).resources.nodes == "2:4"
    assert load_spec(spec, ["resources.nodes=1:3"]).resources.node_range == (1, 3)
    bad = write(tmp_path / "bad.yaml", "name: job\nresources:\n  nodes: 4:2\n")
    with pytest.raises(ConfigError, match="resources.nodes"):
        load_spec(bad)


def test_fixed_jobs_keep_their_spec_json_without_min_nodes(tmp_path):
    fixed = plan_elastic(tmp_path, nodes=3)
    launch = json.loads(fixed.file("spec.json"))["launch"]
    assert "min_nodes" not in launch and launch["num_nodes"] == 3 and not fixed.world.elastic


# --------------------------------------------------------------------------- the rendered PyTorchJob


def test_elastic_pytorchjob_has_worker_replicas_at_max_and_an_elastic_policy(tmp_path):
    job_plan = plan_elastic(tmp_path, "2:4", strategy="fsdp")
    config_map, job = docs_of(job_plan)
    spec = job["spec"]
    assert spec["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "maxRestarts": 3}
    assert spec["nprocPerNode"] == "8"
    assert {role: r["replicas"] for role, r in spec["pytorchReplicaSpecs"].items()} == {"Worker": 4}
    container = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    assert container["command"] == [
        "python", "-m", "jobgen.train.launch", "--nnodes=2:4", "--nproc-per-node=8", "--rdzv-backend=c10d",
        "--rdzv-endpoint=$(PET_RDZV_ENDPOINT)", "--max-restarts=3",
        "-m", "jobgen.train", "--spec", "/etc/jobgen/spec.json", "--run-dir", "/workspace/runs/job"]
    assert not any(arg.startswith("--master-addr") for arg in container["command"])  # no Master: MASTER_ADDR is never set
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]  # the operator's rendezvous port
    written = json.loads(config_map["data"]["spec.json"])
    launch = written["launch"]
    assert (launch["min_nodes"], launch["num_nodes"], launch["world_size"]) == (2, 4, 32)
    # the global batch every world keeps, and the accumulation at the maximum: 768 = 8 x 3 x 32
    assert (written["spec"]["trainer"]["global_batch_size"], written["spec"]["trainer"]["gradient_accumulation_steps"]) == (768, 3)
    assert job_plan.world.global_batch_size == 768 and job_plan.world.gradient_accumulation_steps == 3
    assert job_plan.world.describe() == "2..4 node(s) x 8 gpu rank(s) = world size 16..32 (elastic)"
    assert "offline validation skipped" not in " ".join(job_plan.warnings)
    assert [str(s).split("   ")[0] for s in job_plan.submit_steps if "Pod from" in str(s)] == [
        "POST /api/v1/namespaces/training/pods?dryRun=All"]  # one pod template: Worker


def test_torchruns_group_restarts_are_apart_from_the_restart_budget_and_volcano_gangs_the_minimum(tmp_path):
    job_plan = plan_elastic(tmp_path, "3:6", kubernetes={"backoff_limit": 7, "scheduler_name": "volcano", "priority_class": None})
    _, job = docs_of(job_plan)
    assert job["spec"]["runPolicy"]["backoffLimit"] == 7  # the pods' failures: the budget
    assert job["spec"]["elasticPolicy"]["maxRestarts"] == 3  # the agent's worker-group restarts in a pod
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3}
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert "--max-restarts=3" in command and "--nnodes=3:6" in command
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}


def test_elastic_inputs_hash_includes_the_elastic_template_only_for_elastic_jobs(tmp_path):
    from jobgen.backends.kubernetes.backend import KubernetesBackend

    backend = KubernetesBackend()
    fixed = World(num_nodes=2, devices_per_node=8, accelerator="gpu")
    elastic = World(num_nodes=4, devices_per_node=8, accelerator="gpu", min_nodes=2)
    assert k8s_manifest.ELASTIC_TEMPLATE not in backend.templates_for(fixed)
    assert k8s_manifest.ELASTIC_TEMPLATE in backend.templates_for(elastic)


def test_memory_fit_is_checked_at_the_smallest_world():
    # 6.4B parameters, one A100 per pod: FULL_SHARD over 1 rank does not fit 80 GB, over 8 it does
    model = {"preset": None, "n_layer": 32, "n_head": 32, "d_model": 4096, "block_size": 1024}
    profile = load_profile("k8s-a100", PROFILES)

    def fit(nodes: Any, **trainer: Any) -> list[str]:
        spec = validate(TrainingSpec, {"name": "job", "model": model, "trainer": {"strategy": "fsdp", "micro_batch_size": 1, **trainer},
                                       "resources": {"nodes": nodes, "devices_per_node": 1}}, "<spec>")
        return [w for w in plan(spec, profile, TEMPLATES).warnings if "GiB per GPU" in w]

    assert fit(8) == [] and fit(1) != []
    # the elastic job is warned about its smallest world (840: a batch every count 1..8 keeps)
    assert fit("1:8", global_batch_size=840) == fit(1)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("profile", "match"), [
    ("slurm-a100", "SLURM cluster: an allocation has a fixed node count"),
    ("slurm-cpu", "SLURM cluster"),
    ("local", "runs on this one machine"),
])
def test_slurm_and_local_refuse_a_range(profile, match):
    spec = validate(TrainingSpec, {"name": "job", "resources": {"nodes": "2:4"}}, "<spec>")
    with pytest.raises(PlanError, match=match) as info:
        plan(spec, load_profile(profile, PROFILES), TEMPLATES, spec_source="spec.yaml")
    assert info.value.location == "spec.yaml: resources.nodes" and "resources.nodes=" in info.value.hint


def test_trainjob_profile_refuses_a_range(tmp_path):
    with pytest.raises(PlanError, match="TrainJob.*no elastic policy") as info:
        plan_elastic(tmp_path, kubernetes={"job_api": "trainjob", "priority_class": None})
    assert info.value.location == "spec.yaml: resources.nodes"
    assert "job_api: pytorchjob" in info.value.hint


# --------------------------------------------------------------------------- the global batch every world keeps


def test_a_range_whose_middle_cannot_keep_the_batch_is_refused_with_the_batch_that_fits(tmp_path):
    # micro 8 x accumulation 1 x 32 ranks = 256 at 4 nodes; at 3 nodes (24 ranks) 256 / (8 x 24) is not whole
    with pytest.raises(PlanError) as info:
        plan_elastic(tmp_path, "2:4", micro_batch_size=8)
    err = info.value
    assert err.location == "spec.yaml: resources.nodes"
    assert "global batch of 256 sequences (micro_batch_size 8 x gradient_accumulation_steps 1 x world size 32 at 4 node(s))" in err.message
    assert "256 is not a multiple of micro_batch_size 8 x world size at 3 node(s) (8 x 24 = 192)" in err.message
    assert "a multiple of 768" in err.hint and "e.g. 768" in err.hint and "2, 4 keep 256" in err.hint
    with pytest.raises(PlanError, match=r"1000 is not a multiple .* at 2 node\(s\) \(8 x 16 = 128\), 3 node\(s\) \(8 x 24 = 192\), 4 node\(s\)") as info:
        plan_elastic(tmp_path, "2:4", micro_batch_size=8, global_batch_size=1000)
    assert info.value.location == "spec.yaml: trainer.global_batch_size" and "e.g. 1536" in info.value.hint


@pytest.mark.parametrize(("nodes", "batch", "at_max"), [("2:4", 768, 3), ("3:6", 3840, 10), ("1:2", 256, 2)])
def test_the_planned_global_batch_is_kept_at_every_node_count(tmp_path, nodes, batch, at_max):
    resolved = _resolved(tmp_path, nodes, micro_batch_size=8, global_batch_size=batch)
    assert (resolved.spec.trainer.global_batch_size, resolved.spec.trainer.gradient_accumulation_steps) == (batch, at_max)
    low, high = resolved.spec.resources.node_range
    for n in range(low, high + 1):
        here = runtime_world(resolved, {"WORLD_SIZE": str(8 * n)})
        t = here.spec.trainer
        assert (here.launch.num_nodes, here.launch.world_size) == (n, 8 * n)
        assert t.micro_batch_size * t.gradient_accumulation_steps * here.launch.world_size == batch == t.global_batch_size
        assert here.world.global_batch_size == batch and here.world.gradient_accumulation_steps == batch // (64 * n)


def test_without_global_batch_size_the_batch_at_the_maximum_is_kept(tmp_path):
    # micro 4 x accumulation 2 x 16 ranks (2 nodes) = 128: the 1-node world accumulates 4
    resolved = _resolved(tmp_path, "1:2", micro_batch_size=4, gradient_accumulation_steps=2)
    assert resolved.spec.trainer.global_batch_size == 128
    one = runtime_world(resolved, {"WORLD_SIZE": "8"}).spec.trainer
    assert (one.gradient_accumulation_steps, one.global_batch_size) == (4, 128)


def test_accumulation_beside_a_global_batch_must_agree_at_the_maximum(tmp_path):
    with pytest.raises(PlanError, match=r"derives the accumulation from the global batch at every world size: 3 at 4") as info:
        plan_elastic(tmp_path, "2:4", micro_batch_size=8, gradient_accumulation_steps=2, global_batch_size=768)
    assert info.value.location == "spec.yaml: trainer.gradient_accumulation_steps" and "or set it to 3" in info.value.hint
    ok = _resolved(tmp_path, "2:4", micro_batch_size=8, gradient_accumulation_steps=3, global_batch_size=768)
    assert ok.spec.trainer.gradient_accumulation_steps == 3


def test_an_accumulation_schedule_is_refused_with_a_range(tmp_path):
    profile = load_profile(str(profile_file(tmp_path)))
    spec = validate(TrainingSpec, {
        "name": "job", "resources": {"nodes": "1:2"},
        "model": {"class_path": "mypkg.Model"}, "data": {"class_path": "mypkg.Data"},
        "trainer": {"gradient_accumulation_schedule": {0: 4, 2: 2}}}, "<spec>")
    with pytest.raises(PlanError, match="fixes the accumulation per epoch for one world size") as info:
        plan(spec, profile, TEMPLATES, spec_source="spec.yaml")
    assert info.value.location == "spec.yaml: trainer.gradient_accumulation_schedule"


@pytest.mark.parametrize("strategy", ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_deepspeed_is_refused_with_a_range(tmp_path, strategy):
    with pytest.raises(PlanError, match="DeepSpeed fixes train_batch_size") as info:
        plan_elastic(tmp_path, strategy=strategy)
    assert info.value.location == "spec.yaml: trainer.strategy" and "fsdp" in info.value.hint


def test_range_above_max_nodes_names_the_range(tmp_path):
    with pytest.raises(PlanError, match=r'resources.nodes="2:40"`, but profile .* allows at most 16'):
        plan_elastic(tmp_path, "2:40")


def test_cli_refusal_exits_2_with_file_field_and_hint(run_cli):
    out = run_cli("render", str(ELASTIC_SPEC), "-p", "slurm-h100", "--stdout")
    assert out.code == 2
    assert "elastic-fsdp.yaml: resources.nodes: You set the elastic range" in out.stderr and "hint:" in out.stderr
    ok = run_cli("validate", str(ELASTIC_SPEC), "-p", "k8s-h100", "-o", "json")
    assert ok.code == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["min_nodes"], doc["num_nodes"], doc["world_size"]) == (2, 4, 32)


# --------------------------------------------------------------------------- offline validation


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def _command(job: dict[str, Any]) -> list[str]:
    return _worker(job)["template"]["spec"]["containers"][0]["command"]


def _replace_flag(job: dict[str, Any], prefix: str, new: str | None) -> None:
    cmd = _command(job)
    i = next(i for i, a in enumerate(cmd) if a.startswith(prefix))
    if new is None:
        del cmd[i]
    else:
        cmd[i] = new


MUTATIONS = [  # (name, mutate(job), the message offline validation gives)
    ("min above max", lambda j: j["spec"]["elasticPolicy"].update(minReplicas=5), "is smaller than minReplicas 5"),
    ("min 0", lambda j: j["spec"]["elasticPolicy"].update(minReplicas=0), "minReplicas: must be at least 1"),
    ("Worker above max", lambda j: _worker(j).update(replicas=6), "6 is outside the elastic range [2, 4]"),
    ("Worker below min", lambda j: _worker(j).update(replicas=1), "1 is outside the elastic range [2, 4]"),
    ("a Master", lambda j: j["spec"]["pytorchReplicaSpecs"].update(Master=copy.deepcopy(_worker(j)) | {"replicas": 1}),
     "an elastic job runs Worker replicas only"),
    ("no Worker", lambda j: j["spec"]["pytorchReplicaSpecs"].update(Master=j["spec"]["pytorchReplicaSpecs"].pop("Worker") | {"replicas": 1}),
     "Worker: must be configured if elastic policy is used"),
    ("etcd backend", lambda j: j["spec"]["elasticPolicy"].update(rdzvBackend="etcd"), "rdzvBackend: 'etcd': use c10d"),
    ("no --nproc-per-node", lambda j: _replace_flag(j, "--nproc-per-node", None), "torchrun needs --nproc-per-node"),
    ("--nproc-per-node 4", lambda j: _replace_flag(j, "--nproc-per-node", "--nproc-per-node=4"), "spec.nprocPerNode is '8'"),
    ("--nproc-per-node and nprocPerNode 4", lambda j: (_replace_flag(j, "--nproc-per-node", "--nproc_per_node=4"),
                                                     j["spec"].update(nprocPerNode="4")), "8 GPU(s) per pod but torchrun starts 4"),
    ("--nnodes 1:4", lambda j: _replace_flag(j, "--nnodes", "--nnodes=1:4"), "--nnodes=1:4 but the elasticPolicy gives 2:4"),
    ("--max-restarts 9", lambda j: _replace_flag(j, "--max-restarts", "--max-restarts=9"), "--max-restarts=9 but the elasticPolicy gives 3"),
    ("deprecated nProcPerNode with nprocPerNode", lambda j: j["spec"]["elasticPolicy"].update(nProcPerNode=8),
     "nProcPerNode: must not be used with spec.nprocPerNode"),
    ("misspelt policy field", lambda j: j["spec"]["elasticPolicy"].update(maxReplica=4), "unknown field"),
    ("policy field of the wrong type", lambda j: j["spec"]["elasticPolicy"].update(maxReplicas="4"), "is not of type 'integer'"),
]


def test_rendered_elastic_job_passes_offline_validation(tmp_path):
    report = validate_manifest(docs_of(plan_elastic(tmp_path)), source="elastic")
    assert "PyTorchJob CRD schema (training-operator-v1.9.4, strict)" in report.checked and not report.skipped


@pytest.mark.parametrize(("name", "mutate", "message"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_offline_validation_catches_a_broken_elastic_job(tmp_path, name, mutate, message):
    docs = docs_of(plan_elastic(tmp_path))
    mutate(docs[1])
    with pytest.raises(PlanError) as info:
        validate_manifest(docs, source=name)
    assert message in info.value.message, info.value.message


def test_an_edited_template_that_drops_the_policy_is_caught(tmp_path):
    templates = tmp_path / "templates"
    for src in TEMPLATES.rglob("*.j2"):
        write(templates / src.relative_to(TEMPLATES), src.read_text())
    path = templates / k8s_manifest.ELASTIC_TEMPLATE
    path.write_text(path.read_text().replace("      replicas: {{ replicas }}", "      replicas: 3", 1))
    spec = validate(TrainingSpec, {"name": "job", "resources": {"nodes": "2:4"}, "trainer": {"global_batch_size": 768}}, "<spec>")
    with pytest.raises(ConfigError, match="expected Worker 4 with minReplicas 2 and maxReplicas 4"):
        plan(spec, load_profile("k8s-a100", PROFILES), templates)


# --------------------------------------------------------------------------- the world at run time


def _resolved(tmp_path: Path, nodes: Any = "2:4", **trainer: Any) -> ResolvedSpec:
    return ResolvedSpec.model_validate_json(plan_elastic(tmp_path, nodes, **trainer).file("spec.json"))


def test_entrypoint_takes_the_node_count_torchrun_formed(tmp_path):
    resolved = _resolved(tmp_path)
    at_three = runtime_world(resolved, {"WORLD_SIZE": "24", "LOCAL_WORLD_SIZE": "8"})
    launch = at_three.launch
    assert (launch.num_nodes, launch.world_size, launch.min_nodes) == (3, 24, 2)
    # the planned global batch (768) kept: micro 8 x accumulation 4 x 24 ranks
    assert at_three.world.world_size == 24 and at_three.world.global_batch_size == 8 * 4 * 24 == 768
    fixed = ResolvedSpec.model_validate_json(plan_elastic(tmp_path, 2).file("spec.json"))
    assert runtime_world(fixed, {"WORLD_SIZE": "999"}) is fixed  # a fixed world is the planned one


@pytest.mark.parametrize(("environ", "match"), [
    ({}, "WORLD_SIZE is unset: the entrypoint was not started by torchrun"),
    ({"WORLD_SIZE": "8"}, r"world of 8 process\(es\), but the job was planned for 2\.\.4 node\(s\) x 8"),
    ({"WORLD_SIZE": "40"}, "planned for 2..4"),
    ({"WORLD_SIZE": "20"}, "planned for 2..4"),  # not a multiple of 8 processes per node
])
def test_entrypoint_refuses_a_world_outside_the_plan(tmp_path, environ, match):
    with pytest.raises(PlanError, match=match):
        runtime_world(_resolved(tmp_path), environ)


def test_elastic_nodes_is_the_rule_the_entrypoint_uses():
    world = World(num_nodes=4, devices_per_node=2, accelerator="cpu", min_nodes=1)
    assert [elastic_nodes(world, {"WORLD_SIZE": str(n)}) for n in (2, 4, 6, 8)] == [1, 2, 3, 4]


def test_entrypoint_rechecks_the_batch_rules_of_an_edited_spec_json(tmp_path):
    resolved = _resolved(tmp_path)
    edited = resolved.model_copy(update={"spec": resolved.spec.model_copy(update={
        "trainer": resolved.spec.trainer.model_copy(update={"global_batch_size": 256, "gradient_accumulation_steps": 1})})})
    with pytest.raises(PlanError, match="elastic range") as info:
        check_runtime_support(edited)
    assert info.value.location == "spec.trainer.global_batch_size"
    # a world torchrun formed that cannot keep the batch stops before training, naming both sizes and the fix
    with pytest.raises(PlanError, match=r"torchrun formed a world of 3 node\(s\) x 8 process\(es\), but the job's global batch "
                                        r"256 is not a multiple of micro_batch_size 8 x world size at 3 node\(s\) \(8 x 24 = 192\)") as info:
        runtime_world(edited, {"WORLD_SIZE": "24"})
    assert info.value.location == "spec.trainer.global_batch_size" and "a multiple of 768" in info.value.hint
    assert runtime_world(edited, {"WORLD_SIZE": "16"}).spec.trainer.gradient_accumulation_steps == 2  # 2 nodes keep 256


def test_lightning_accepts_the_runtime_node_count_and_refuses_the_planned_maximum(tmp_path, monkeypatch):
    """Lightning's TorchElasticEnvironment (what torchrun-launched ranks get) checks devices x
    num_nodes == WORLD_SIZE: the planned maximum fails on a smaller world, the runtime count passes."""
    environments = pytest.importorskip("lightning.fabric.plugins.environments")
    monkeypatch.setenv("WORLD_SIZE", "24")
    resolved = runtime_world(_resolved(tmp_path), {"WORLD_SIZE": "24"})
    env = environments.TorchElasticEnvironment()
    env.validate_settings(num_devices=resolved.launch.devices_per_node, num_nodes=resolved.launch.num_nodes)
    with pytest.raises(ValueError, match="does not match the world size"):
        env.validate_settings(num_devices=8, num_nodes=4)
