"""jobgen.estimate: the formulas (ZeRO paper, Korthikanti et al.), the recommender, determinism.

Expected values are computed here from the published formulas, not pasted from outputs.
"""

from __future__ import annotations

import pytest

from jobgen import estimate as E
from jobgen.load import load_profile, load_spec
from jobgen.profiles import ClusterProfile
from jobgen.spec import MODEL_PRESETS, ModelSpec
from tests.conftest import EXAMPLES

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
SEVEN_B = ("model.preset=null", "model.n_layer=32", "model.n_head=32", "model.d_model=4096", "model.block_size=4096")
BIG = E.Shape(n_layer=32, n_head=32, d_model=4096, block_size=4096, micro_batch_size=1)


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_parameter_count_matches_the_spec(preset):
    m = ModelSpec.model_validate({"preset": preset})
    assert E.Shape(m.n_layer, m.n_head, m.d_model, m.block_size, 1).n_params == m.n_params


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_zero_stages_follow_the_paper(n, precision):
    """Rajbhandari et al. 2020, 3.1: 2Ψ + 2Ψ + 12Ψ/N (P_os), 2Ψ + 14Ψ/N (P_os+g), 16Ψ/N (P_os+g+p),
    after removing the implementation terms the estimator adds and names (fp32 gradient partition,
    communication buckets, ZeRO-3 working set)."""
    psi = BIG.n_params
    for stage, expected in ((1, 2 * psi + 2 * psi + 12 * psi // n), (2, 2 * psi + 2 * psi // n + 12 * psi // n),
                            (3, 2 * psi // n + 2 * psi // n + 12 * psi // n)):
        est = E.estimate(BIG, precision, E.Layout(f"deepspeed_stage_{stage}"), num_nodes=1, devices_per_node=n)
        buckets = (int(E.DEEPSPEED_OVERLAP_COMM_FACTOR * 2 * E.DEEPSPEED_BUCKET_ELEMENTS * 2) if stage < 3
                   else E.DEEPSPEED_BUCKET_ELEMENTS * 2)
        working = est.params_bytes - 2 * psi // n if stage == 3 else 0
        paper = est.model_states_bytes - buckets - 4 * psi // n - working
        assert paper == pytest.approx(expected, rel=1e-6), stage
        persistent = 13 * BIG.d_model * BIG.n_layer + 2 * BIG.d_model  # biases and LayerNorms stay gathered
        assert working == (2 * (BIG.largest_module_params + E.DEEPSPEED_STAGE3_PREFETCH_ELEMENTS + persistent) if stage == 3 else 0)


def test_sharding_divides_by_the_data_parallel_degree():
    e8 = E.estimate(BIG, "bf16-mixed", E.Layout("fsdp"), num_nodes=1, devices_per_node=8)
    e16 = E.estimate(BIG, "bf16-mixed", E.Layout("fsdp"), num_nodes=2, devices_per_node=8)
    # fp32 moments (8Ψ/N) + foreach temporary (4Ψ/N): 12Ψ/N
    assert e8.optimizer_bytes == pytest.approx(12 * BIG.n_params / 8, abs=16)
    assert e16.optimizer_bytes == pytest.approx(e8.optimizer_bytes / 2, rel=1e-6)
    hybrid = E.estimate(BIG, "bf16-mixed", E.Layout("fsdp", "HYBRID_SHARD"), num_nodes=2, devices_per_node=8)
    assert hybrid.optimizer_bytes == e8.optimizer_bytes  # shards within a node only
    no_shard = E.estimate(BIG, "bf16-mixed", E.Layout("fsdp", "NO_SHARD"), num_nodes=2, devices_per_node=8)
    assert no_shard.optimizer_bytes == pytest.approx(e8.optimizer_bytes * 8, rel=1e-6)


def test_more_sharding_never_costs_more_for_a_big_model():
    totals = [E.estimate(BIG, "bf16-mixed", E.Layout(s), num_nodes=1, devices_per_node=8).model_states_bytes
              for s in ("ddp", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3")]
    assert totals == sorted(totals, reverse=True)
    offloaded = E.estimate(BIG, "bf16-mixed", E.Layout("deepspeed_stage_3", offload_optimizer="cpu", offload_params="cpu"),
                           num_nodes=1, devices_per_node=8)
    assert offloaded.optimizer_bytes == 0 and offloaded.host_bytes_per_node > 16 * BIG.n_params // 8 * 8 * 0.9


def test_fp32_ddp_on_one_cpu_rank_is_16_bytes_per_parameter():
    est = E.estimate(BIG, "32-true", E.Layout("ddp"), num_nodes=1, devices_per_node=1, accelerator="cpu", overhead_bytes=0)
    psi = BIG.n_params
    assert (est.params_bytes, est.grads_bytes) == (4 * psi, 4 * psi)
    assert est.optimizer_bytes == 8 * psi + 4 * BIG.largest_module_params  # moments + per-tensor step temporary


def test_activations_reduce_to_korthikanti_eq1():
    """34sbh + 5as²b bytes per layer (16-bit, dropout, unfused attention): the difference between
    2 and 1 layers is one layer."""
    s, b, h, a = 2048, 4, 1024, 16
    one, two = (E.Shape(n, a, h, s, b, dropout=0.1) for n in (1, 2))
    per_layer = (E.activation_bytes(two, "bf16-mixed", fused_attention=False)
                 - E.activation_bytes(one, "bf16-mixed", fused_attention=False))
    assert per_layer == 34 * s * b * h + 5 * a * s * s * b
    # fp32 doubles the 2-byte terms; masks stay 1 byte
    fp32 = E.activation_bytes(two, "32-true", fused_attention=False) - E.activation_bytes(one, "32-true", fused_attention=False)
    assert fp32 == 2 * 32 * s * b * h + 2 * s * b * h + 9 * a * s * s * b


def test_activation_checkpointing_keeps_block_inputs():
    full = E.activation_bytes(BIG, "bf16-mixed")
    ckpt = E.activation_bytes(BIG, "bf16-mixed", checkpointing=True)
    t = BIG.block_size * BIG.micro_batch_size * BIG.d_model
    assert ckpt < full / 5
    assert ckpt - E.activation_bytes(E.Shape(1, 32, 4096, 4096, 1), "bf16-mixed") == (BIG.n_layer * t * 2) - 0


def _plan(overrides=(), profile="slurm-a100"):
    spec = load_spec(QUICKSTART, overrides)
    prof = load_profile(profile)
    from jobgen.plan import resolve_world

    w = resolve_world(spec, prof)
    return E.plan_memory(spec, prof, w.num_nodes, w.devices_per_node)


def test_7b_on_a100_ddp_does_not_fit_fsdp_does():
    mp = _plan(SEVEN_B + ("trainer.micro_batch_size=1",))
    rows = {r.estimate.layout.label: r for r in mp.rows}
    assert not rows["ddp"].fits and rows["ddp"].is_spec
    assert rows["ddp"].estimate.total_bytes > 16 * mp.n_params > mp.budget_bytes  # ZeRO's 16Ψ alone exceeds 80 GiB
    assert mp.chosen == E.Layout("fsdp", "FULL_SHARD") and rows["fsdp:FULL_SHARD"].fits
    assert any("does not fit" in r and r.startswith("ddp") for r in mp.reasons)
    assert E.fit_warning(load_spec(QUICKSTART, SEVEN_B + ("trainer.micro_batch_size=1",)), load_profile("slurm-a100"), 1, 8)


def test_nothing_fits_says_what_would():
    mp = _plan(SEVEN_B)  # micro batch 16 x 4096 tokens: activations alone exceed 80 GiB
    assert mp.chosen is None
    text = "\n".join(mp.suggestions)
    assert "micro_batch_size=1" in text and "activation checkpointing" in text and "offload" in text


def test_small_model_gets_ddp_huge_model_gets_zero3():
    assert _plan().chosen == E.Layout("ddp")
    huge = ("model.preset=null", "model.n_layer=64", "model.n_head=64", "model.d_model=8192", "model.block_size=2048",
            "trainer.micro_batch_size=1", "resources.nodes=16")
    mp = _plan(huge)
    assert mp.n_params > E.LARGE_MODEL_PARAMS
    assert mp.chosen is not None and mp.chosen.strategy == "deepspeed_stage_3"


def test_cpu_profile_budget_and_no_render_warning():
    mp = _plan(profile="local")
    assert mp.accelerator == "cpu" and mp.budget_bytes == 8 * E.GIB // 2
    assert all(not r.estimate.layout.strategy.startswith("deepspeed") for r in mp.rows)
    assert E.fit_warning(load_spec(QUICKSTART, SEVEN_B), load_profile("local"), 1, 2) is None


def test_missing_gpu_memory_assumes_the_smallest_variant():
    prof = ClusterProfile(name="x", scheduler="slurm", gpus_per_node=8, gpu_type="A100")
    spec = load_spec(QUICKSTART)
    mp = E.plan_memory(spec, prof, 1, 8)
    assert mp.budget_bytes == 40 * E.GIB and any("gpu_mem_gib" in a for a in mp.assumptions)


def test_plan_is_deterministic():
    assert _plan(SEVEN_B).to_json() == _plan(SEVEN_B).to_json()
