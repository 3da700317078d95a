"""The byte-level GPT: parameter count vs ModelSpec.n_params, shapes, init loss, optimizer set-up."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from jobgen.specs.training import ModelSpec, TrainingSpec
from jobgen.train.model import GPT, VOCAB_SIZE, Block, LitGPT, lr_factor

SHAPES = [
    {"preset": "tiny"},
    {"preset": "mini"},
    {"preset": None, "n_layer": 3, "n_head": 3, "d_model": 48, "block_size": 40},
]


@pytest.mark.parametrize("shape", SHAPES, ids=["tiny", "mini", "odd-3x48"])
def test_parameter_count_matches_model_spec(shape: dict) -> None:
    spec = ModelSpec.model_validate(shape)
    model = GPT(spec.n_layer, spec.n_head, spec.d_model, spec.block_size)
    # parameters() de-duplicates the tied embedding / output projection, as n_params does.
    assert sum(p.numel() for p in model.parameters()) == spec.n_params


def test_lightning_module_from_spec_has_the_spec_parameter_count() -> None:
    spec = TrainingSpec.model_validate({"name": "x", "model": {"preset": "tiny"}})
    module = LitGPT.from_spec(spec)
    assert sum(p.numel() for p in module.parameters()) == spec.model.n_params
    assert module.hparams.max_steps == spec.trainer.max_steps


def test_block_parameter_count_is_12d2_plus_13d() -> None:
    d = 32
    assert sum(p.numel() for p in Block(d, 4, 0.0).parameters()) == 12 * d * d + 13 * d


def test_forward_shape_and_loss_at_init_is_about_ln256() -> None:
    torch.manual_seed(0)
    model = GPT(n_layer=2, n_head=2, d_model=64, block_size=32)
    idx = torch.randint(0, VOCAB_SIZE, (3, 32))
    logits = model(idx)
    assert logits.shape == (3, 32, VOCAB_SIZE)
    loss = LitGPT.loss(logits, torch.randint(0, VOCAB_SIZE, (3, 32)))
    assert abs(loss.item() - math.log(VOCAB_SIZE)) < 0.3


def test_output_projection_is_tied_to_token_embedding() -> None:
    model = GPT(n_layer=1, n_head=1, d_model=16, block_size=8)
    assert model.lm_head.weight is model.wte.weight


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = GPT(n_layer=2, n_head=2, d_model=32, block_size=16).eval()
    idx = torch.randint(0, VOCAB_SIZE, (1, 16))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % VOCAB_SIZE
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_sequence_longer_than_block_size_is_rejected() -> None:
    model = GPT(n_layer=1, n_head=1, d_model=16, block_size=8)
    with pytest.raises(ValueError, match="exceeds block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_residual_projections_use_scaled_init() -> None:
    torch.manual_seed(0)
    n_layer = 8
    model = GPT(n_layer=n_layer, n_head=4, d_model=256, block_size=16)
    residual = torch.cat([b.attn.c_proj.weight.flatten() for b in model.h])
    other = torch.cat([b.attn.c_attn.weight.flatten() for b in model.h])
    assert residual.std().item() == pytest.approx(0.02 / math.sqrt(2 * n_layer), rel=0.05)
    assert other.std().item() == pytest.approx(0.02, rel=0.05)


def test_weight_decay_applies_to_linear_matrices_only() -> None:
    module = LitGPT(n_layer=2, n_head=2, d_model=32, block_size=16, weight_decay=0.1)
    decay, no_decay = module.parameter_groups()
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    linear_weights = {id(m.weight) for m in module.modules() if isinstance(m, nn.Linear)}
    linear_weights.discard(id(module.model.wte.weight))  # tied output projection = embedding
    assert {id(p) for p in decay["params"]} == linear_weights
    assert all(p.dim() == 2 for p in decay["params"])
    no_decay_ids = {id(p) for p in no_decay["params"]}
    assert id(module.model.wte.weight) in no_decay_ids and id(module.model.wpe.weight) in no_decay_ids
    # every parameter is in exactly one group
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(module.parameters()))


def test_lr_schedule_warmup_then_cosine_to_ten_percent() -> None:
    warmup, max_steps = 10, 110
    assert lr_factor(0, warmup, max_steps) == pytest.approx(0.1)
    assert lr_factor(9, warmup, max_steps) == pytest.approx(1.0)
    assert lr_factor(10, warmup, max_steps) == pytest.approx(1.0)
    assert lr_factor(60, warmup, max_steps) == pytest.approx(0.55)
    assert lr_factor(110, warmup, max_steps) == pytest.approx(0.1)
    assert lr_factor(500, warmup, max_steps) == pytest.approx(0.1)
    factors = [lr_factor(s, warmup, max_steps) for s in range(warmup, max_steps)]
    assert all(a >= b for a, b in zip(factors, factors[1:], strict=False))


def test_constant_schedule_holds_the_peak_after_warmup_and_cosine_can_end_at_zero() -> None:
    warmup, max_steps = 10, 110
    assert [lr_factor(s, warmup, max_steps, schedule="constant") for s in (0, 9, 10, 60, 109, 500)] == \
        pytest.approx([0.1, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert lr_factor(60, warmup, max_steps, min_ratio=0.0) == pytest.approx(0.5)  # Hugging Face's cosine
    assert lr_factor(110, warmup, max_steps, min_ratio=0.0) == pytest.approx(0.0)


def test_spec_schedule_reaches_the_optimizer() -> None:
    from jobgen.specs.training import TrainingSpec

    spec = TrainingSpec.model_validate({"name": "s", "trainer": {
        "max_steps": 100, "warmup_ratio": 0.03, "lr_schedule": "constant", "learning_rate": 1e-3}})
    assert spec.trainer.warmup_steps == 3  # ceil(0.03 x 100)
    config = LitGPT.from_spec(spec).configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(8):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])


def test_lr_schedule_without_warmup_starts_at_peak() -> None:
    assert lr_factor(0, 0, 100) == pytest.approx(1.0)


def test_optimizer_steps_the_schedule_per_step() -> None:
    module = LitGPT(
        n_layer=1, n_head=1, d_model=16, block_size=8, learning_rate=1e-3, warmup_steps=4, max_steps=20
    )
    config = module.configure_optimizers()
    assert config["lr_scheduler"]["interval"] == "step"
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert isinstance(optimizer, torch.optim.AdamW)
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])


def _lrs_after_resume(saved_max: int, resumed_max: int, steps_before: int, steps_after: int,
                      optimizers_first: bool, checkpoint_extra: dict | None = None,
                      record: bool = True) -> tuple[list[float], list[float], LitGPT]:
    """Train ``steps_before`` schedule steps of a module with ``max_steps=saved_max``, save its
    optimizer and scheduler as Lightning does, resume them in a module with ``resumed_max`` and
    return (lrs before, lrs after, the resumed module). ``optimizers_first``: configure_optimizers
    runs before on_load_checkpoint (Lightning's order under DeepSpeed and FSDP, whose strategies
    restore after setup), else after (ddp). ``record``: the checkpoint carries the schedule
    record on_save_checkpoint writes (False: a checkpoint of an older jobgen)."""
    shape = {"n_layer": 1, "n_head": 1, "d_model": 16, "block_size": 8, "learning_rate": 1e-3, "warmup_steps": 4}
    first = LitGPT(**shape, max_steps=saved_max)
    config = first.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    before = []
    for _ in range(steps_before):
        before.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    checkpoint = {"hyper_parameters": dict(first.hparams), "optimizer_states": [optimizer.state_dict()],
                  "lr_schedulers": [scheduler.state_dict()], **(checkpoint_extra or {})}
    if record:
        first.on_save_checkpoint(checkpoint)
    resumed = LitGPT(**shape, max_steps=resumed_max)
    if not optimizers_first:
        resumed.on_load_checkpoint(checkpoint)
    config = resumed.configure_optimizers()
    if optimizers_first:
        resumed.on_load_checkpoint(checkpoint)
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    scheduler.load_state_dict(checkpoint["lr_schedulers"][0])
    after = []
    for _ in range(steps_after):
        after.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return before, after, resumed


@pytest.mark.parametrize("optimizers_first", [False, True], ids=["ddp_order", "deepspeed_fsdp_order"])
@pytest.mark.parametrize("record", [True, False], ids=["recorded", "older_checkpoint"])
def test_raising_max_steps_on_resume_keeps_the_schedule_end(optimizers_first: bool, record: bool) -> None:
    # a finished 60-step run trained longer (max_steps 60 -> 120) must not
    # re-stretch the cosine (the lr jumped from its end back up); it continues the old schedule's
    # tail: min_lr_ratio x learning_rate for every step past the old end.
    _, uninterrupted, _ = _lrs_after_resume(60, 60, 0, 60, optimizers_first)
    before, after, resumed = _lrs_after_resume(60, 120, 60, 60, optimizers_first, record=record)
    assert before == pytest.approx(uninterrupted)
    assert before[-1] == pytest.approx(1e-4, rel=0.05)  # the cosine's end: 0.1 x 1e-3
    assert after == pytest.approx([1e-4] * 60)
    assert resumed.schedule_steps() == (4, 60)
    # and the record survives the next save: a second resume (120 -> 200) keeps the end at 60
    checkpoint: dict = {"hyper_parameters": dict(resumed.hparams)}
    resumed.on_save_checkpoint(checkpoint)
    again = LitGPT(n_layer=1, n_head=1, d_model=16, block_size=8, learning_rate=1e-3, warmup_steps=4, max_steps=200)
    again.on_load_checkpoint(checkpoint)
    assert again.schedule_steps() == (4, 60)


def test_resume_in_the_middle_keeps_the_schedule_it_started_with() -> None:
    # stopped at step 30 of 60 and resumed with max_steps 120: the remaining steps follow the
    # 60-step cosine, not a 120-step one
    _, uninterrupted, _ = _lrs_after_resume(60, 60, 0, 60, False)
    _, after, _ = _lrs_after_resume(60, 120, 30, 90, False)
    assert after[:30] == pytest.approx(uninterrupted[30:])
    assert after[30:] == pytest.approx([1e-4] * 60)


def test_a_fresh_start_follows_its_own_max_steps() -> None:
    module = LitGPT(n_layer=1, n_head=1, d_model=16, block_size=8, warmup_steps=4, max_steps=120)
    assert module.schedule_steps() == (4, 120)
