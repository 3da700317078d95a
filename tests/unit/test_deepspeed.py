"""Every DeepSpeed config jobgen renders passes DeepSpeed's own validator at its target world size."""

from __future__ import annotations

import itertools

import pytest

from jobgen.errors import PlanError
from jobgen.jobdir.world import World
from jobgen.planning.deepspeed import deepspeed_config
from jobgen.specs.load import validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import require

ds_config = require("deepspeed.runtime.config", "deepspeed not installed (pip install -e .[train])")

def _world(spec: TrainingSpec, world_size: int) -> World:
    """``world_size`` ranks on one node with the spec's batch arithmetic."""
    t = spec.trainer
    return World(1, world_size, "cpu", micro_batch_size=t.micro_batch_size, gradient_accumulation_steps=t.gradient_accumulation_steps)


CASES = [
    {"strategy": "deepspeed_stage_1"},
    {"strategy": "deepspeed_stage_2", "offload_optimizer": "cpu", "precision": "16-mixed"},
    {"strategy": "deepspeed_stage_3", "offload_optimizer": "cpu", "offload_params": "cpu", "gradient_clip_val": None},
    {"strategy": "deepspeed_stage_3", "offload_optimizer": "nvme", "offload_params": "nvme", "nvme_path": "/local/nvme"},
    {"strategy": "deepspeed_stage_2", "precision": "32-true", "micro_batch_size": 3, "gradient_accumulation_steps": 7},
]


@pytest.mark.parametrize(("trainer", "world_size"), list(itertools.product(CASES, [1, 8, 16])))
def test_deepspeed_accepts_rendered_config(monkeypatch, trainer, world_size):
    spec = validate(TrainingSpec, {"name": "x", "trainer": trainer}, "<test>")
    config = deepspeed_config(spec, _world(spec, world_size))
    # DeepSpeedConfig asks deepspeed.comm for rank and world size (1 when not initialised);
    # give it the target world size so its batch assertion checks what the cluster will run.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: world_size)
    parsed = ds_config.DeepSpeedConfig(dict(config))
    assert parsed.world_size == world_size
    assert parsed.train_batch_size == spec.trainer.micro_batch_size * spec.trainer.gradient_accumulation_steps * world_size
    assert parsed.zero_optimization_stage == spec.trainer.deepspeed_stage


def test_deepspeed_rejects_a_wrong_world_size(monkeypatch):
    """Guard for the test above: the validator really checks the batch against the world size."""
    spec = validate(TrainingSpec, {"name": "x", "trainer": {"strategy": "deepspeed_stage_2"}}, "<test>")
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 4)
    with pytest.raises(AssertionError, match="train_batch_size"):
        ds_config.DeepSpeedConfig(deepspeed_config(spec, _world(spec, 8)))


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"strategy": "deepspeed_stage_2", "offload_params": "cpu"}, "needs strategy deepspeed_stage_3"),
        ({"strategy": "deepspeed_stage_3", "offload_optimizer": "nvme"}, "needs nvme_path"),
        ({"strategy": "deepspeed_stage_2", "offload_optimizer": "nvme", "nvme_path": "/x"}, "NVMe offload needs strategy deepspeed_stage_3"),
        ({"strategy": "deepspeed_stage_2", "gradient_clip_val": -1.0}, "greater than 0"),
        ({"strategy": "ddp", "offload_optimizer": "cpu"}, "is a DeepSpeed option"),
    ],
)
def test_jobgen_rejects_what_deepspeed_misses(trainer, message):
    """DeepSpeed's own validator accepts offload_param on stage 2, NVMe without a path, negative clipping."""
    from jobgen.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        validate(TrainingSpec, {"name": "x", "trainer": trainer}, "<test>")


def test_not_a_deepspeed_strategy():
    with pytest.raises(PlanError):
        deepspeed_config(spec := validate(TrainingSpec, {"name": "x"}, "<test>"), _world(spec, 1))


@pytest.mark.parametrize(
    ("config", "location", "message"),
    [
        ({"zero_optimisation": {"stage": 2}}, "ds.json: zero_optimisation", "did you mean 'zero_optimization'"),
        ({"gradient_clipping": -1.0}, "ds.json: gradient_clipping", "is negative"),
        (
            {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
            "ds.json: zero_optimization.offload_param",
            "only ZeRO stage 3 partitions parameters",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
            "ds.json: zero_optimization.offload_optimizer.nvme_path",
            "nvme_path is not set",
        ),
    ],
)
def test_check_deepspeed_config_catches_what_deepspeed_accepts(monkeypatch, config, location, message):
    """Each config passes DeepSpeed's own validator, and jobgen refuses it with the
    file, the field path and a hint."""
    from jobgen.errors import DeepSpeedConfigError
    from jobgen.planning.deepspeed import check_deepspeed_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 1)
    ds_config.DeepSpeedConfig({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, **config})
    with pytest.raises(DeepSpeedConfigError, match=message) as excinfo:
        check_deepspeed_config(config, "ds.json")
    assert excinfo.value.location == location
    assert excinfo.value.hint


def test_check_deepspeed_config_accepts_what_jobgen_renders_and_offload_none():
    from jobgen.planning.deepspeed import check_deepspeed_config

    for trainer in CASES:
        spec = validate(TrainingSpec, {"name": "x", "trainer": trainer}, "<test>")
        check_deepspeed_config(deepspeed_config(spec, _world(spec, 8)), "ds.json")
    check_deepspeed_config({"zero_optimization": {"stage": 1, "offload_param": {"device": "none"}}}, "ds.json")
