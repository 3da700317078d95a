"""``jobgen submit --smoke N`` (:meth:`jobgen.specs.training.TrainingSpec.smoke_doc`): the warmup of a
smoke run scales with N (or is dropped when no step would be left after it), command-mode specs
get a smoke run too, and every shipped example plans as a smoke run on every shipped profile that
holds the full run. Pure: plans only, nothing trains."""

from __future__ import annotations

import json
import math

import pytest

from jobgen import api
from jobgen.errors import JobgenError
from jobgen.specs.load import load_spec
from tests.conftest import EXAMPLES, PROFILES

LLAMA = EXAMPLES / "llama-7b-qlora-fsdp.yaml"


def _spec_json(spec_file, profile: str, steps: int) -> dict:
    return json.loads(api.plan_job(spec_file, profile, profiles_dir=PROFILES, smoke=steps).file("spec.json"))["spec"]


def test_smoke_of_a_spec_with_a_warmup_ratio_scales_the_warmup() -> None:
    # The refusal a smoke run of such a spec once met: "warmup_steps=7 and warmup_ratio=0.03 (= 1 of max_steps 8) disagree".
    full = load_spec(LLAMA)
    assert (full.trainer.warmup_ratio, full.trainer.warmup_steps, full.trainer.max_steps) == (0.03, 30, 1000)
    trainer = _spec_json(LLAMA, "slurm-a100", 8)["trainer"]
    # spec.json says the warmup scaled: the ratio is kept and the steps are ceil(0.03 x 8).
    assert (trainer["max_steps"], trainer["warmup_ratio"], trainer["warmup_steps"]) == (8, 0.03, math.ceil(0.03 * 8))
    trainer = _spec_json(LLAMA, "slurm-a100", 100)["trainer"]
    assert (trainer["warmup_ratio"], trainer["warmup_steps"]) == (0.03, 3)


def test_smoke_turns_fixed_warmup_steps_into_the_same_fraction_of_the_smoke_run() -> None:
    full = load_spec(EXAMPLES / "quickstart.yaml")
    fraction = full.trainer.warmup_steps / full.trainer.max_steps  # 30 of 600
    smoke = full.as_smoke(40)
    assert smoke.trainer.warmup_ratio == fraction
    assert smoke.trainer.warmup_steps == math.ceil(fraction * 40) == 2


@pytest.mark.parametrize("spec_file", [LLAMA, EXAMPLES / "quickstart.yaml"], ids=lambda p: p.stem)
def test_smoke_drops_the_warmup_when_no_step_would_follow_it(spec_file) -> None:
    # one step: any warmup would be the whole run (warmup_steps < max_steps)
    trainer = _spec_json(spec_file, "slurm-a100", 1)["trainer"]
    assert trainer["max_steps"] == 1 and trainer["warmup_steps"] == 0
    assert trainer.get("warmup_ratio") is None  # dropped: spec.json holds no ratio


def test_smoke_keeps_a_spec_without_warmup_without_one(tmp_path) -> None:
    spec = load_spec(EXAMPLES / "quickstart.yaml", ["trainer.warmup_steps=0"]).as_smoke(5)
    assert (spec.trainer.warmup_steps, spec.trainer.warmup_ratio) == (0, None)


def test_smoke_of_a_lightning_cli_command_sets_its_max_steps() -> None:
    spec = _spec_json(EXAMPLES / "command-lightning-cli.yaml", "local", 8)
    assert spec["name"] == "command-lightning-cli-smoke" and spec["smoke"] is True
    assert spec["entrypoint"]["args"][-1] == "--trainer.max_steps=8"
    assert spec["env"]["JOBGEN_SMOKE_STEPS"] == "8"


def test_smoke_of_a_plain_command_script_tells_it_the_steps() -> None:
    spec = _spec_json(EXAMPLES / "command-ddp.yaml", "local", 3)
    assert spec["name"] == "command-ddp-smoke" and spec["smoke"] is True
    assert spec["entrypoint"]["args"] == list(load_spec(EXAMPLES / "command-ddp.yaml").entrypoint.args)  # unchanged
    assert spec["env"]["JOBGEN_SMOKE_STEPS"] == "3"


def _plans(spec_file, profile: str, **kwargs) -> bool:
    try:
        api.plan_job(spec_file, profile, profiles_dir=PROFILES, **kwargs)
    except JobgenError:
        return False
    return True


#: The shipped examples that do not fit a shipped profile, and the field the refusal names: a
#: multi-node example on the one-machine profile, a GPU example's devices or batch on CPU profiles,
#: command mode on ssh. A pair that starts or stops fitting fails the test below until listed here.
EXPECTED_REFUSALS = {
    ("command-ddp", "ssh-2node"): "entrypoint",
    ("command-lightning-cli", "ssh-2node"): "entrypoint",
    ("gpt2-124m-fsdp", "local"): "resources.nodes",
    ("gpt2-124m-fsdp", "slurm-cpu"): "trainer.global_batch_size",
    ("gpt2-124m-fsdp", "slurm-cpu-array"): "trainer.global_batch_size",
    ("gpt2-124m-fsdp", "ssh-2node"): "trainer.global_batch_size",
    ("gpt2-350m-zero3", "local"): "resources.nodes",
    ("llama-7b-qlora-fsdp", "local"): "resources.devices_per_node",
    ("llama-7b-qlora-fsdp", "slurm-cpu"): "resources.devices_per_node",
    ("llama-7b-qlora-fsdp", "slurm-cpu-array"): "resources.devices_per_node",
    ("llama-7b-qlora-fsdp", "ssh-2node"): "resources.devices_per_node",
}


@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILES.glob("*.yaml")))
@pytest.mark.parametrize("spec_file", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_example_plans_as_a_smoke_run_where_it_plans(spec_file, profile) -> None:
    """Each example x profile either plans, and then plans as a smoke run of 1 and 8 steps, or
    is refused naming the field :data:`EXPECTED_REFUSALS` lists for it."""
    expected = EXPECTED_REFUSALS.get((spec_file.stem, profile))
    if expected is not None:
        with pytest.raises(JobgenError) as refused:
            api.plan_job(spec_file, profile, profiles_dir=PROFILES)
        assert f": {expected}:" in str(refused.value).splitlines()[0], str(refused.value)
        return
    for steps in (1, 8):
        spec = _spec_json(spec_file, profile, steps)  # raises (fails the test) where it is refused
        assert spec["smoke"] is True and spec["name"].endswith("-smoke")
        if spec.get("entrypoint") is None:
            assert spec["trainer"]["max_steps"] == steps
            assert spec["trainer"].get("warmup_steps", 0) < steps


def test_the_llama_qlora_example_plans_as_a_smoke_run_on_every_gpu_profile() -> None:
    # the 4-GPU example holds on every GPU profile
    gpu_profiles = [p for p in ("slurm-a100", "slurm-h100", "k8s-a100", "k8s-h100")]
    assert all(_plans(LLAMA, p, smoke=8) for p in gpu_profiles)
