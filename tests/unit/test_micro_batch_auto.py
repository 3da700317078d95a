"""``trainer.micro_batch_size: auto``: resolved at plan time from the memory plan, with
its margin, recorded in spec.json; a clear rule on CPU profiles; refused where it cannot work."""

from __future__ import annotations

import json

import pytest

from jobgen.backends import plan
from jobgen.errors import ConfigError, PlanError
from jobgen.planning.estimate_hf import plan_memory
from jobgen.planning.micro_batch import AUTO_MICRO_BATCH_MARGIN, CPU_AUTO_MICRO_BATCH, resolve_micro_batch
from jobgen.planning.rules import resolve_precision
from jobgen.specs.load import load_profile, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, TEMPLATES

GPT350M = {"preset": "gpt2-350m", "block_size": 1024}


def spec(model=None, **trainer) -> TrainingSpec:  # noqa: ANN001
    return validate(TrainingSpec, {"name": "t", "model": model or GPT350M, "trainer": {"micro_batch_size": "auto", **trainer}},
                    "<test>")  # fmt: skip


def planned_fraction(s: TrainingSpec, profile, batch: int) -> float:  # noqa: ANN001
    """The spec's own layout's plan at ``batch`` as a fraction of the per-rank budget."""
    s = resolve_precision(s, profile)
    s = s.model_copy(update={"trainer": s.trainer.model_copy(update={"micro_batch_size": batch})})
    mp = plan_memory(s, profile, 1, profile.devices_per_node)
    return mp.spec_row.estimate.total_bytes / mp.budget_bytes


@pytest.mark.parametrize(("profile", "trainer"), [("slurm-h100", {}), ("slurm-a100", {"strategy": "fsdp"}),
                                                  ("k8s-a100", {"strategy": "deepspeed_stage_2"})])
def test_gpu_auto_is_the_largest_power_of_two_the_plan_fits_with_the_margin(profile: str, trainer: dict) -> None:
    prof = load_profile(profile, PROFILES)
    chosen = resolve_micro_batch(spec(**trainer), prof).trainer.micro_batch_size
    assert isinstance(chosen, int) and chosen & (chosen - 1) == 0, chosen
    assert planned_fraction(spec(**trainer), prof, chosen) <= 1 - AUTO_MICRO_BATCH_MARGIN
    assert planned_fraction(spec(**trainer), prof, 2 * chosen) > 1 - AUTO_MICRO_BATCH_MARGIN  # the next one does not
    assert chosen > 8  # a 350M GPT on an 80 GB GPU takes more than the default


def test_auto_is_recorded_in_spec_json_and_a_number_is_left_alone() -> None:
    prof = load_profile("slurm-h100", PROFILES)
    chosen = resolve_micro_batch(spec(), prof).trainer.micro_batch_size
    job = plan(spec(), prof, TEMPLATES, spec_source="s.yaml")
    assert json.loads(job.file("spec.json"))["spec"]["trainer"]["micro_batch_size"] == chosen
    fixed = validate(TrainingSpec, {"name": "t", "trainer": {"micro_batch_size": 4}}, "<t>")
    assert resolve_micro_batch(fixed, prof) is fixed


def test_cpu_auto_is_eight_unless_less_fits() -> None:
    local = load_profile("local", PROFILES)
    tiny = {"preset": "tiny"}
    assert resolve_micro_batch(spec(tiny), local).trainer.micro_batch_size == CPU_AUTO_MICRO_BATCH == 8
    # a model whose micro batch of 8 does not fit the CPU rank's share of host memory gets less
    big = {"preset": None, "n_layer": 6, "n_head": 8, "d_model": 512, "block_size": 2048}  # 8 is planned at 1.13x
    got = resolve_micro_batch(spec(big), local).trainer.micro_batch_size
    assert got == 4 and planned_fraction(spec(big), local, got) <= 1 - AUTO_MICRO_BATCH_MARGIN


def test_auto_refusals_name_the_field() -> None:
    prof = load_profile("slurm-h100", PROFILES)
    with pytest.raises(PlanError, match="a global batch fixes the micro batch") as info:
        resolve_micro_batch(spec(global_batch_size=64), prof, "s.yaml")
    assert info.value.location == "s.yaml: trainer.micro_batch_size"
    huge = {"preset": None, "n_layer": 96, "n_head": 96, "d_model": 12288, "block_size": 2048}  # ~175B
    with pytest.raises(PlanError, match="even a micro batch of 1"):
        resolve_micro_batch(spec(huge), prof, "s.yaml")


def test_the_entrypoint_refuses_an_unresolved_auto(tmp_path) -> None:
    from jobgen.jobdir import LaunchSpec, ResolvedSpec
    from jobgen.train.resolved import check_runtime_support

    resolved = ResolvedSpec.model_construct(
        jobgen_version="0", inputs_sha256="0" * 64, profile="local", spec=spec({"preset": "tiny"}, precision="32-true"),
        launch=LaunchSpec.model_construct(scheduler="local", accelerator="cpu", num_nodes=1, devices_per_node=1, world_size=1))
    with pytest.raises(ConfigError, match="'auto', which `jobgen plan`"):
        check_runtime_support(resolved)
