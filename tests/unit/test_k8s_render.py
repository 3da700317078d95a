"""PyTorchJob / TrainJob rendering: replicas, launch command, resources, RDMA, scheduling,
secrets, runPolicy, names, and the errors bad profile values give (exit 2, path + hint)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobgen import jobdir
from jobgen.backends import plan
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.errors import ConfigError, PlanError
from jobgen.specs.load import load_profile, load_spec, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import ADVERSARIAL, EXAMPLES, PROFILES, TEMPLATES, write


def profile_file(tmp_path: Path, kubernetes: dict[str, Any] | None = None, name: str = "site", **top: Any) -> Path:
    """A profile extending the shipped k8s-a100 with ``top`` fields and ``kubernetes`` settings."""
    doc: dict[str, Any] = {"extends": str(PROFILES / "k8s-a100.yaml"), **top}
    if kubernetes is not None:
        doc["kubernetes"] = kubernetes
    return write(tmp_path / f"{name}.yaml", yaml.safe_dump(doc))


def render(tmp_path: Path, kubernetes: dict[str, Any] | None = None, spec: dict[str, Any] | None = None, **top: Any):
    profile = load_profile(str(profile_file(tmp_path, kubernetes, **top)))
    training = validate(TrainingSpec, {"name": "job", **(spec or {})}, "<spec>")
    job_plan = plan(training, profile, TEMPLATES, spec_source="spec.yaml", profile_source="site.yaml")
    manifest = jobdir.TRAINJOB_FILE if profile.kubernetes.job_api == "trainjob" else jobdir.PYTORCHJOB_FILE
    docs = k8s_manifest.parse_manifest(job_plan.file(manifest), manifest)
    return job_plan, docs


def pod(job: dict[str, Any], role: str = "Master") -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]


def container(job: dict[str, Any], role: str = "Master") -> dict[str, Any]:
    return pod(job, role)["containers"][0]


@pytest.mark.parametrize(("nodes", "expected"), [(1, {"Master": 1}), (2, {"Master": 1, "Worker": 1}), (5, {"Master": 1, "Worker": 4})])
def test_master_one_and_workers_nodes_minus_one(tmp_path, nodes, expected):
    _, (_, job) = render(tmp_path, spec={"resources": {"nodes": nodes}})
    assert {role: r["replicas"] for role, r in job["spec"]["pytorchReplicaSpecs"].items()} == expected
    assert all(r["restartPolicy"] == "ExitCode" for r in job["spec"]["pytorchReplicaSpecs"].values())


def test_launch_command_is_torchrun_with_the_operators_master_address(tmp_path):
    _, (config_map, job) = render(tmp_path, spec={"resources": {"nodes": 2, "devices_per_node": 4}})
    assert job["spec"]["nprocPerNode"] == "4"  # PET_NPROC_PER_NODE = GPUs per pod
    c = container(job, "Worker")
    assert c["name"] == "pytorch"
    # jobgen's launcher runs torchrun with these arguments and exits with the failure's class (restartPolicy ExitCode)
    assert c["command"][:5] == ["python", "-m", "jobgen.train.launch", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]
    assert c["command"][5:] == ["-m", "jobgen.train", "--spec", "/etc/jobgen/spec.json", "--run-dir", "/workspace/runs/job"]
    assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE", "PET_NNODES"} & set(env)  # the operator's to set
    assert env["OMP_NUM_THREADS"] == "24"  # 96 cores / 4 processes
    spec_json = json.loads(config_map["data"]["spec.json"])
    assert spec_json["launch"]["world_size"] == 8 and spec_json["launch"]["devices_per_node"] == 4


def test_resources_requests_within_limits_and_memory_backed_shm(tmp_path):
    _, (_, job) = render(tmp_path, {"cpu_limit": 100, "mem_request_gib": 800})
    res = container(job)["resources"]
    assert res["requests"] == {"cpu": "96", "memory": "819200Mi", "nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}
    assert res["limits"] == {"cpu": "100", "memory": "921600Mi", "nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}
    volumes = {v["name"]: v for v in pod(job)["volumes"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "65536Mi"}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container(job)["volumeMounts"]
    assert volumes["runs"] == {"name": "runs", "persistentVolumeClaim": {"claimName": "training-runs"}}
    assert volumes["jobgen-config"] == {"name": "jobgen-config", "configMap": {"name": "job-config"}}


def test_fractional_cpu_limit_is_millicores(tmp_path):
    _, (_, job) = render(tmp_path, {"cpu_limit": 96.5})
    assert container(job)["resources"]["limits"]["cpu"] == "96500m"


@pytest.mark.parametrize(("fabric", "rdma"), [("infiniband", True), ("roce", True), ("efa", True), ("tcp", False)])
def test_rdma_fabrics_get_ipc_lock_and_their_device_resource(tmp_path, fabric, rdma):
    job_plan, (_, job) = render(tmp_path, {"rdma_resource": "vpc.amazonaws.com/efa", "rdma_devices": 4}, network_fabric=fabric)
    c = container(job)
    assert (c.get("securityContext") == {"capabilities": {"add": ["IPC_LOCK"]}}) is rdma
    assert (c["resources"]["limits"].get("vpc.amazonaws.com/efa") == "4") is rdma
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NCCL_IB_DISABLE"] == ("1" if fabric in ("tcp", "efa") else "0")
    if fabric == "efa":
        assert env["FI_PROVIDER"] == "efa"


def test_rdma_fabric_without_a_device_resource_warns(tmp_path):
    job_plan, (_, job) = render(tmp_path, {"rdma_resource": None})
    assert any("no kubernetes.rdma_resource" in w for w in job_plan.warnings)
    assert container(job)["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


def test_scheduling_fields_and_kueue_label_on_the_job_only(tmp_path):
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app.kubernetes.io/name": "job"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    _, (_, job) = render(tmp_path, {"queue_label": "team-a", "priority_class": "high", "service_account": "trainer",
                                    "affinity": affinity, "image_pull_secrets": ["regcred"]})
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    spec = pod(job)
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"]
    assert spec["priorityClassName"] == "high" and spec["serviceAccountName"] == "trainer"
    assert spec["affinity"] == affinity and spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_volcano_gang_scheduling(tmp_path):
    _, (_, job) = render(tmp_path, {"scheduler_name": "volcano", "volcano_queue": "research", "priority_class": "high"},
                         spec={"resources": {"nodes": 3}})
    assert pod(job, "Worker")["schedulerName"] == "volcano"
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3, "queue": "research", "priorityClass": "high"}


def test_run_policy(tmp_path):
    _, (_, job) = render(tmp_path, {"backoff_limit": 0, "clean_pod_policy": "Running", "ttl_seconds_after_finished": 3600,
                                    "time_limit_min": 90})
    assert job["spec"]["runPolicy"] == {"backoffLimit": 0, "cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 3600,
                                        "activeDeadlineSeconds": 5400}
    _, (_, job) = render(tmp_path, {"time_limit_min": 90}, spec={"resources": {"time_limit_min": 30}})
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 1800  # the spec wins


@pytest.mark.parametrize(("profile_limit", "spec_budget", "expected"), [(None, 0, 0), (None, 2, 2), (5, 0, 5), (5, 1, 1), (0, 3, 3)])
def test_the_restart_budget_is_the_backoff_limit_of_every_exit_code_replica(tmp_path, profile_limit, spec_budget, expected):
    """One budget: the spec's restart.max_restarts when above 0, else the profile's backoff_limit (null: 0).
    backoffLimit 0 with ExitCode: the operator fails the job at its first failed pod (no restarts)."""
    settings = {} if profile_limit is None else {"backoff_limit": profile_limit}
    _, (_, job) = render(tmp_path, settings, spec={"resources": {"nodes": 2}, "restart": {"max_restarts": spec_budget}})
    assert job["spec"]["runPolicy"]["backoffLimit"] == expected
    assert {role: r["restartPolicy"] for role, r in job["spec"]["pytorchReplicaSpecs"].items()} == {"Master": "ExitCode",
                                                                                                     "Worker": "ExitCode"}
    for role in ("Master", "Worker"):
        command = container(job, role)["command"]
        assert command[:3] == ["python", "-m", "jobgen.train.launch"]
        own = [arg for arg in command if arg.startswith("--restart-")]
        if expected:  # the launcher spends the budget: v1.9 bounds ExitCode restarts by backoffLimit only at 0
            assert own[0] == f"--restart-budget={expected}" and own[1].startswith("--restart-ledger=/workspace/runs/job/restarts/")
            assert command.index(own[1]) == 4  # ahead of torchrun's arguments
        else:
            assert own == []


def test_a_budget_without_a_shared_run_directory_warns(tmp_path):
    job_plan, _ = render(tmp_path, {"runs_volume_claim": None}, spec={"restart": {"max_restarts": 2}})
    assert any("restart budget 2 without kubernetes.runs_volume_claim" in w for w in job_plan.warnings), job_plan.warnings
    for settings, budget in (({}, 2), ({"runs_volume_claim": None}, 0)):  # k8s-a100 mounts a claim; no budget, no restarts
        job_plan, _ = render(tmp_path, settings, spec={"restart": {"max_restarts": budget}})
        assert not any("runs_volume_claim" in w for w in job_plan.warnings), job_plan.warnings


def test_secrets_are_references_never_values(tmp_path):
    job_plan, (config_map, job) = render(tmp_path, {"secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"},
                                                                    "WANDB_API_KEY": {"secret": "wandb", "key": "api-key", "optional": True}}})
    env = container(job)["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in env
    assert {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key", "optional": True}}} in env


def test_adversarial_env_values_round_trip_without_kubelet_expansion(tmp_path):
    values = {f"V{i}": v for i, v in enumerate([*ADVERSARIAL, "$(HOME)", "a$$(b)"])}
    _, (config_map, job) = render(tmp_path, spec={"env": values})
    env = {e["name"]: e["value"] for e in container(job)["env"]}
    for key, value in values.items():
        assert env[key] == value.replace("$", "$$"), key  # the kubelet turns $$ back into $ (test_k8s_expansion.py)
    assert json.loads(config_map["data"]["spec.json"])["spec"]["env"] == dict(sorted(values.items()))


def test_dns_1035_names_are_kept_or_derived_with_a_hash(tmp_path):
    job_plan, (config_map, job) = render(tmp_path, spec={"name": "My Job_v2!"})
    name = job["metadata"]["name"]
    assert name.startswith("my-job-v2-") and len(name) <= k8s_manifest.MAX_NAME and job_plan.warnings
    assert config_map["metadata"]["name"] == f"{name}-config"
    long = "a" * 80
    assert k8s_manifest.k8s_name(long)[0] != k8s_manifest.k8s_name("a" * 81)[0]
    assert len(k8s_manifest.k8s_name(long)[0]) <= k8s_manifest.MAX_NAME


def test_deterministic(tmp_path):
    first, _ = render(tmp_path, {"secret_env": {"B_TOKEN": {"secret": "b", "key": "k"}, "A_TOKEN": {"secret": "a", "key": "k"}}})
    second, _ = render(tmp_path, {"secret_env": {"A_TOKEN": {"secret": "a", "key": "k"}, "B_TOKEN": {"secret": "b", "key": "k"}}})
    assert first.files == second.files


# --------------------------------------------------------------------------- TrainJob


def test_trainjob_output_references_the_runtime_and_carries_the_same_pod_settings(tmp_path):
    job_plan, (config_map, job) = render(tmp_path, {"job_api": "trainjob", "trainer_runtime": "torch-distributed",
                                                    "secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}}},
                                         spec={"resources": {"nodes": 2}})
    assert dict(job_plan.files).keys() >= {"trainjob.yaml", "kustomization.yaml", "spec.json"} and "pytorchjob.yaml" not in dict(job_plan.files)
    assert job_plan.apply_files == ("trainjob.yaml",) and job_plan.cluster_object.kind == "TrainJob"
    assert '"trainjob.yaml"' in job_plan.file("kustomization.yaml")
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    assert trainer["command"] == ["python", "-m", "jobgen.train.launch", "-m", "jobgen.train", "--spec", "/etc/jobgen/spec.json",
                                  "--run-dir", "/workspace/runs/job"]  # the Trainer sets PET_MASTER_ADDR itself
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in trainer["env"]
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "node"
    pod_spec = patch["template"]["spec"]["template"]["spec"]
    assert [v["name"] for v in pod_spec["volumes"]] == ["dshm", "jobgen-config", "runs"]
    assert pod_spec["containers"][0]["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert not [w for w in job_plan.warnings if "TrainJob CRD schema" in w]


@pytest.mark.parametrize("field", ["priority_class", "scheduler_name"])
def test_trainjob_refuses_what_runtime_patches_cannot_set(tmp_path, field):
    with pytest.raises(PlanError, match=rf"kubernetes\.{field}") as info:
        render(tmp_path, {"job_api": "trainjob", field: "volcano"})
    assert "ClusterTrainingRuntime" in info.value.hint


# --------------------------------------------------------------------------- bad profile values


@pytest.mark.parametrize(("kubernetes", "top", "where", "message"), [
    ({"cpu_limit": 8}, {}, "kubernetes.cpu_limit", "exceeds its limit"),
    ({"mem_request_gib": 1000}, {}, "kubernetes.mem_request_gib", "exceeds its limit"),
    ({"shm_size_gib": 2000}, {}, "kubernetes.shm_size_gib", "counts against that limit"),
    ({}, {"env": {"HF_TOKEN": "hf_abc"}}, "env.HF_TOKEN", "looks like a credential"),
    ({}, {"env": {"MASTER_ADDR": "10.0.0.1"}}, "env.MASTER_ADDR", "set by the launcher"),
    ({}, {"env": {"PET_NNODES": "4"}}, "env.PET_NNODES", "set by the launcher"),
])
def test_bad_profile_values_are_plan_errors_with_path_and_hint(tmp_path, kubernetes, top, where, message):
    with pytest.raises(PlanError, match=message) as info:
        render(tmp_path, kubernetes, **top)
    assert info.value.location == f"site.yaml: {where}" and info.value.hint and info.value.exit_code == 2


@pytest.mark.parametrize(("kubernetes", "top", "fragment"), [
    ({"secret_env": {"HF_TOKEN": "hf_abcdef"}}, {}, "kubernetes.secret_env: secret_env.HF_TOKEN is a literal value"),
    ({}, {"gpus_per_node": -1}, "gpus_per_node: Input should be greater than or equal to 0"),
    ({"secret_env": {"X": {"secret": "Bad_Name", "key": "k"}}}, {}, "is not a DNS-1123 subdomain"),
    ({"queue_label": "has space"}, {}, "is not a valid label value"),
    ({"volcano_queue": "q"}, {}, "volcano_queue needs scheduler_name: volcano"),
    ({"extra_resources": {"cpu": 1}}, {}, "is not an extended resource name"),
    ({"version": "1.3x"}, {}, "is not MAJOR.MINOR"),
])
def test_bad_profile_fields_are_config_errors_naming_the_field(tmp_path, kubernetes, top, fragment):
    with pytest.raises(ConfigError, match="invalid configuration") as info:
        load_profile(str(profile_file(tmp_path, kubernetes, **top)))
    assert fragment in str(info.value) and str(tmp_path / "site.yaml") == info.value.location


def test_a_name_with_nothing_dns_can_keep_is_refused(tmp_path):
    with pytest.raises(PlanError, match="not even a letter") as info:
        render(tmp_path, spec={"name": "1234_5678"})
    assert info.value.location == "spec.yaml: name" and "--set name=" in info.value.hint


@pytest.mark.parametrize(("args", "fragment"), [
    (["--set", "resources.devices_per_node=-2"], "resources.devices_per_node: Input should be greater than or equal to 1"),
    (["--set", "name=____"], "not even a letter"),
])
def test_cli_exit_2_with_path_and_hint(run_cli, args, fragment):
    out = run_cli("render", str(EXAMPLES / "quickstart.yaml"), "-p", "k8s-a100", "--stdout", *args)
    assert out.code == 2, out.stderr
    assert fragment in out.stderr and "hint:" in out.stderr and "Traceback" not in out.stderr


def test_cli_secret_value_in_profile_exit_2(run_cli, tmp_path):
    profile = profile_file(tmp_path, {"secret_env": {"HF_TOKEN": "hf_abcdef"}})
    out = run_cli("render", str(EXAMPLES / "quickstart.yaml"), "-p", str(profile), "--out", str(tmp_path / "m"))
    assert out.code == 2 and "kubernetes.secret_env" in out.stderr and "hint:" in out.stderr
    assert not (tmp_path / "m").exists()  # nothing half-written


def test_shipped_profiles_render_every_example_without_skipped_checks():
    for profile in ("k8s-a100", "k8s-h100"):
        for example in sorted(EXAMPLES.glob("*.yaml")):
            job_plan = plan(load_spec(example), load_profile(profile, PROFILES), TEMPLATES)
            assert not [w for w in job_plan.warnings if "skipped" in w], (profile, example.name, job_plan.warnings)
