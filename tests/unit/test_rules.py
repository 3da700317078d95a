"""The rules that tie a spec to a world: one wording at plan time and on the node, and the
numbers World derives once."""

from __future__ import annotations

import pytest

from jobgen.backends import plan
from jobgen.errors import PlanError
from jobgen.load import load_profile, validate
from jobgen.rules import World, resolve_world
from jobgen.spec import TrainingSpec
from tests.conftest import PROFILES, TEMPLATES

#: Every CPU refusal: (trainer/model overrides, the field it is reported at).
CPU_REFUSALS = [
    ({"trainer": {"precision": "16-mixed"}}, "trainer.precision"),
    ({"trainer": {"precision": "transformer-engine"}}, "trainer.precision"),
    ({"trainer": {"strategy": "fsdp", "fsdp_state_dict_type": "full"}}, "trainer.fsdp_state_dict_type"),
    ({"trainer": {"strategy": "fsdp", "fsdp_sharding_strategy": "HYBRID_SHARD"}}, "trainer.fsdp_sharding_strategy"),
    ({"model": {"preset": None, "hf_path": "/models/llama", "load_in_4bit": True, "lora": {"r": 8}},
      "data": {"format": "jsonl", "paths": ["/data/x.jsonl"], "tokenizer_path": "/models/llama"}}, "model.load_in_4bit"),
]


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
    from jobgen.rules import resolve_precision

    resolved = ResolvedSpec(jobgen_version="0", inputs_sha256="0", profile="local", spec=resolve_precision(spec, profile),
                            launch=LaunchSpec(scheduler="local", accelerator="cpu", num_nodes=1, devices_per_node=2, world_size=2))
    with pytest.raises(PlanError) as on_node:
        check_runtime_support(resolved)
    assert on_node.value.location == f"spec.{field}"
    assert on_node.value.message == at_plan.value.message.replace("profile 'local'", "this node")
    assert on_node.value.hint == at_plan.value.hint


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
    from jobgen.rules import resolve_precision

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
