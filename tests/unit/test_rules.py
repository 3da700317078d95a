"""The rules that tie a spec to a world: one wording at plan time and on the node, and the
numbers World derives once."""

from __future__ import annotations

import pytest

from jobgen.backends import plan
from jobgen.errors import PlanError
from jobgen.jobdir.world import World
from jobgen.planning.rules import resolve_world
from jobgen.specs.load import load_profile, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, TEMPLATES

#: Every CPU refusal: (trainer/model overrides, the field it is reported at).
CPU_REFUSALS = [
    ({"trainer": {"precision": "16-mixed"}}, "trainer.precision"),
    ({"trainer": {"precision": "transformer-engine"}}, "trainer.precision"),
    ({"trainer": {"strategy": "fsdp", "fsdp_state_dict_type": "full"}}, "trainer.fsdp_state_dict_type"),
    ({"trainer": {"strategy": "fsdp", "fsdp_sharding_strategy": "HYBRID_SHARD"}}, "trainer.fsdp_sharding_strategy"),
]

QLORA = {"model": {"preset": None, "hf_path": "/models/llama", "load_in_4bit": True, "lora": {"r": 8}},
         "data": {"format": "jsonl", "paths": ["/data/x.jsonl"], "tokenizer_path": "/models/llama"}}


def _spec(doc: dict) -> TrainingSpec:
    return validate(TrainingSpec, {"name": "x", **doc}, "<test>")


@pytest.mark.parametrize(("doc", "field"), CPU_REFUSALS)
def test_plan_and_entrypoint_refuse_with_the_same_words(doc, field):
    """The planner (profile local) and the entrypoint (a spec.json on a CPU node) raise the same
    error class with the same message, differing only in where: the profile or this node."""
    from jobgen.train.resolved import check_runtime_support

    spec = _spec(doc)
    profile = load_profile("local", PROFILES)
    with pytest.raises(PlanError) as at_plan:
        plan(spec, profile, TEMPLATES, spec_source="spec.yaml")
    assert at_plan.value.location == f"spec.yaml: {field}" and at_plan.value.hint

    from jobgen.jobdir import LaunchSpec, ResolvedSpec
    from jobgen.planning.rules import resolve_precision

    resolved = ResolvedSpec(jobgen_version="0", inputs_sha256="0", profile="local", spec=resolve_precision(spec, profile),
                            launch=LaunchSpec(scheduler="local", accelerator="cpu", num_nodes=1, devices_per_node=2, world_size=2))
    with pytest.raises(PlanError) as on_node:
        check_runtime_support(resolved)
    assert on_node.value.location == f"spec.{field}"
    assert on_node.value.message == at_plan.value.message.replace("profile 'local'", "this node")
    assert on_node.value.hint == at_plan.value.hint


@pytest.mark.parametrize(("installed", "problem"), [
    (None, "bitsandbytes is not installed"),
    ("0.45.5", "bitsandbytes 0.45.5 is older than 0.48.1"),
    ("0.48.1", None),
    ("0.50.2.dev0+cpu", None),
])  # fmt: skip
def test_qlora_plans_for_cpu_and_the_node_checks_bitsandbytes(monkeypatch, installed, problem):
    """QLoRA renders for a CPU profile (the render machine's bitsandbytes proves nothing); the
    entrypoint refuses it on a CPU node whose bitsandbytes cannot run 4-bit layers there."""
    import importlib.metadata

    from jobgen.planning.rules import check_support

    def version(name: str) -> str:
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    spec = _spec(QLORA)
    check_support(spec, "cpu", None, where="profile 'local'")  # plan time: accepted
    check_support(spec, "gpu", "A100", where="this node", on_node=True)  # GPUs: CUDA bitsandbytes
    if problem is None:
        check_support(spec, "cpu", None, where="this node", on_node=True)
        return
    with pytest.raises(PlanError, match=problem) as info:
        check_support(spec, "cpu", None, where="this node", on_node=True)
    assert info.value.location == "model.load_in_4bit" and "bitsandbytes>=0.48.1" in info.value.hint


def test_world_derives_every_number_once():
    spec = _spec({"trainer": {"micro_batch_size": 3, "gradient_accumulation_steps": 5}, "resources": {"nodes": 2}})
    profile = load_profile("slurm-a100", PROFILES)
    world = resolve_world(spec, profile)
    assert world.world_size == 2 * profile.gpus_per_node
    assert world.global_batch_size == 3 * 5 * world.world_size
    assert world.cpus_per_rank == profile.cpus_per_node // profile.gpus_per_node
    assert world.time_limit_min == profile.slurm_settings.time_limit_min
    timed = resolve_world(_spec({"resources": {"time_limit_min": 17}}), profile)
    assert timed.time_limit_min == 17
    assert World(1, 2, "cpu").global_batch_size == 2


def test_bf16_on_a_pre_ampere_gpu_is_refused_at_plan_time(tmp_path):
    profile = load_profile("slurm-a100", PROFILES).model_copy(update={"gpu_type": "V100", "name": "v100"})
    with pytest.raises(PlanError, match=r"V100 GPUs \(compute capability 7.0\); bf16 needs Ampere"):
        plan(_spec({"trainer": {"precision": "bf16-mixed"}}), profile, TEMPLATES)


@pytest.mark.parametrize(("profile", "expected"), [("slurm-a100", "bf16-mixed"), ("k8s-h100", "bf16-mixed"), ("local", "32-true")])
def test_precision_auto_resolves_from_the_profile_and_spec_json_records_it(profile, expected):
    import json

    prof = load_profile(profile, PROFILES)
    job_plan = plan(_spec({"trainer": {"precision": "auto"}}), prof, TEMPLATES)
    assert json.loads(job_plan.file("spec.json"))["spec"]["trainer"]["precision"] == expected


def test_precision_auto_on_pre_ampere_gpus_is_fp16():
    from jobgen.planning.rules import resolve_precision

    v100 = load_profile("slurm-a100", PROFILES).model_copy(update={"gpu_type": "V100"})
    assert resolve_precision(_spec({}), v100).trainer.precision == "16-mixed"
    assert resolve_precision(_spec({"trainer": {"precision": "32-true"}}), v100).trainer.precision == "32-true"


def test_a_spec_json_with_precision_auto_is_refused(tmp_path):
    from jobgen.errors import ConfigError
    from jobgen.jobdir import load_resolved_spec

    job_plan = plan(_spec({"trainer": {"precision": "32-true"}}), load_profile("local", PROFILES), TEMPLATES)
    path = tmp_path / "spec.json"
    path.write_text(job_plan.file("spec.json").replace('"32-true"', '"auto"'))
    with pytest.raises(ConfigError, match="resolves it from the profile"):
        load_resolved_spec(path)


@pytest.mark.parametrize(("flags", "warned"), [("fpu sse avx2", True), ("fpu avx2 avx512_bf16", False), ("fpu amx_bf16", False)])
def test_local_bf16_warning_follows_the_cpu_flags(tmp_path, flags, warned):
    from jobgen.backends.local import bf16_emulation_warning

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    text = bf16_emulation_warning("bf16-mixed", "cpu", cpuinfo)
    assert (text is not None) == warned
    if warned:
        assert "--set trainer.precision=auto" in text and "25x" in text
    assert bf16_emulation_warning("32-true", "cpu", cpuinfo) is None
    assert bf16_emulation_warning("bf16-mixed", "gpu", cpuinfo) is None
    assert bf16_emulation_warning("bf16-mixed", "cpu", tmp_path / "missing") is None


@pytest.mark.parametrize("strategy", ["deepspeed_stage_3", "deepspeed_stage_2", "fsdp"])
def test_validate_warns_before_queueing_qlora_under_zero3_on_gpus(run_cli, strategy):
    """ZeRO-3 + QLoRA peaked at 3.8x its plan on an H100; until a GPU run confirms the
    fix the planner says so and names the layouts that fitted; other layouts stay silent."""
    from tests.conftest import REPO

    spec = str(REPO / "examples" / "llama-lora-jsonl.yaml")
    qlora = ("--set", f"trainer.strategy={strategy}", "--set", "model.load_in_4bit=true")
    result = run_cli("validate", spec, "-p", "slurm-a100", *qlora)
    assert result.code == 0, result.stderr
    warned = "QLoRA under deepspeed_stage_3 peaked at 3.8x" in result.stderr
    assert warned == (strategy == "deepspeed_stage_3"), result.stderr
    if warned:
        assert "deepspeed_stage_2" in result.stderr and "ddp" in result.stderr
    # CPU profiles plan GPU memory for nothing: no warning there.
    on_cpu = run_cli("validate", spec, "-p", "local", *qlora, "--set", "resources.devices_per_node=2")
    assert on_cpu.code == 0 and "peaked at 3.8x" not in on_cpu.stderr, on_cpu.stderr
