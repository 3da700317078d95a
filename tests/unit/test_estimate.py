"""jobgen.planning.estimate: the formulas (ZeRO paper, Korthikanti et al.); jobgen.planning.memory_plan: the recommender; determinism.

Expected values are computed here from the published formulas, not pasted from outputs.
"""

from __future__ import annotations

import pytest

from jobgen.planning import estimate as E
from jobgen.planning import memory_plan as M
from jobgen.specs.load import load_profile, load_spec
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import MODEL_PRESETS, ModelSpec
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
        # stage_1_and_2.py setup_buckets: two reduce_bucket_size buffers in bf16 (overlap_comm); stage 3: one
        buckets = 2 * E.DEEPSPEED_BUCKET_ELEMENTS * 2 if stage < 3 else E.DEEPSPEED_BUCKET_ELEMENTS * 2
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


def _parts(shape, e=2, r=2):
    """(per layer, head, backward working set) in bytes, written out from the docstring's terms:
    fused attention, no dropout."""
    s, b, h, a = shape.block_size, shape.micro_batch_size, shape.d_model, shape.n_head
    t = s * b * h
    per_layer = 2 * t * r + 14 * t * e + t * e + 4 * a * s * b  # LN inputs; QKV in, QKV, proj in, MLP; SDPA out + lse
    head = 2 * t * r + t * e + s * b * E.VOCAB_SIZE * (e + 8)
    return per_layer, head, 10 * t * e


def test_activation_peak_is_saved_plus_the_larger_of_head_and_transient():
    """Head tensors (logits, loss) and a layer's recomputation/backward buffers are never alive
    together: the peak adds the larger of the two to what is saved, not both."""
    t = BIG.block_size * BIG.micro_batch_size * BIG.d_model
    per_layer, head, backward = _parts(BIG)
    full = E.activation_bytes(BIG, "bf16-mixed")
    ckpt = E.activation_bytes(BIG, "bf16-mixed", checkpointing=True)
    assert full == BIG.n_layer * per_layer + max(head, backward)
    assert ckpt == BIG.n_layer * t * 2 + max(head, per_layer + backward)
    assert ckpt < full / 5
    wide_vocab = E.Shape(2, 2, 32, 4096, 8)  # logits dominate: the head term wins
    p2, h2, b2 = _parts(wide_vocab)
    assert h2 > p2 + b2
    assert E.activation_bytes(wide_vocab, "bf16-mixed", checkpointing=True) == 2 * 4096 * 8 * 32 * 2 + h2


def test_ddp_mixed_precision_keeps_an_fp32_residual_stream():
    """Autocast over fp32 weights leaves the embedding output and residual adds in fp32 (4 bytes);
    DeepSpeed and FSDP compute on 16-bit parameters (2 bytes). Only the residual terms differ."""
    assert E.residual_bytes("bf16-mixed", "ddp") == 4
    assert E.residual_bytes("bf16-mixed", "fsdp") == E.residual_bytes("bf16-mixed", "deepspeed_stage_2") == 2
    assert E.residual_bytes("bf16-true", "ddp") == 2 and E.residual_bytes("32-true", "fsdp") == 4
    shape = E.Shape(4, 8, 512, 1024, 4)
    t = 1024 * 4 * 512
    p4, h4, b4 = _parts(shape, r=4)
    assert E.activation_bytes(shape, "bf16-mixed", residual=4) == 4 * p4 + max(h4, b4)
    assert (E.activation_bytes(shape, "bf16-mixed", checkpointing=True, residual=4)
            - E.activation_bytes(shape, "bf16-mixed", checkpointing=True, residual=2)) == 4 * t * 2 + 2 * t * 2
    ddp = E.estimate(shape, "bf16-mixed", E.Layout("ddp"), num_nodes=1, devices_per_node=1)
    states = E.model_states(shape, "bf16-mixed", E.Layout("ddp"), num_nodes=1, devices_per_node=1)
    assert ddp.activations_bytes == E.activation_bytes(shape, "bf16-mixed", residual=4) - states.late_bytes


def test_gradients_and_step_temporaries_are_not_alive_at_the_activation_peak():
    """Without accumulation the gradients appear while backward frees activations, and AdamW's
    foreach temporary / DeepSpeed's fp32 gradient partition exist only in the step: the peak is
    states + max(activations, late). With accumulation the previous gradients are alive."""
    one = E.Shape(4, 8, 512, 1024, 4)
    four = E.Shape(4, 8, 512, 1024, 4, accumulation=4)
    psi = one.n_params
    for layout, late_one, late_four in (
            (E.Layout("ddp"), 4 * psi + 4 * psi, 4 * psi),                        # .grad + foreach sqrt(v) / sqrt(v)
            (E.Layout("deepspeed_stage_2"), 4 * psi + 2 * psi, 4 * psi)):         # fp32 partition + bf16 grads
        acts = E.activation_bytes(one, "bf16-mixed", residual=E.residual_bytes("bf16-mixed", layout.strategy))
        a = E.estimate(one, "bf16-mixed", layout, num_nodes=1, devices_per_node=1)
        b = E.estimate(four, "bf16-mixed", layout, num_nodes=1, devices_per_node=1)
        assert (a.late_bytes, b.late_bytes) == (late_one, late_four)
        assert a.model_states_bytes == b.model_states_bytes  # same memory, different timing
        assert a.total_bytes == a.model_states_bytes + max(0, acts - late_one) + a.overhead_bytes
        assert b.total_bytes == b.model_states_bytes + max(0, acts - late_four) + b.overhead_bytes
        assert any("activations peak at" in n for n in a.notes)


def test_zero12_buckets_are_two_reduce_buckets_whatever_the_model_size():
    """deepspeed/runtime/zero/stage_1_and_2.py setup_buckets (0.19.8): one reduce_bucket_size buffer
    in the gradient dtype, a second with overlap_comm, allocated in full for any model."""
    for psi in (10**6, 10**9):
        assert E.deepspeed_bucket_bytes(2, 2, psi) == 2 * E.DEEPSPEED_BUCKET_ELEMENTS * 2
        assert E.deepspeed_bucket_bytes(1, 4, psi) == 2 * E.DEEPSPEED_BUCKET_ELEMENTS * 4
    assert E.deepspeed_bucket_bytes(3, 2, 10**6) == 2 * 10**6


def _plan(overrides=(), profile="slurm-a100"):
    spec = load_spec(QUICKSTART, overrides)
    prof = load_profile(profile)
    from jobgen.planning.plan import resolve_world

    w = resolve_world(spec, prof)
    return M.plan_memory(spec, prof, w.num_nodes, w.devices_per_node)


def test_7b_on_a100_ddp_does_not_fit_fsdp_does():
    mp = _plan(SEVEN_B + ("trainer.micro_batch_size=1",))
    rows = {r.estimate.layout.label: r for r in mp.rows}
    assert not rows["ddp"].fits and rows["ddp"].is_spec
    assert rows["ddp"].estimate.total_bytes > 16 * mp.n_params > mp.budget_bytes  # ZeRO's 16Ψ alone exceeds 80 GiB
    assert mp.chosen == E.Layout("fsdp", "FULL_SHARD") and rows["fsdp:FULL_SHARD"].fits
    assert any("does not fit" in r and r.startswith("ddp") for r in mp.reasons)
    assert M.fit_warning(load_spec(QUICKSTART, SEVEN_B + ("trainer.micro_batch_size=1",)), load_profile("slurm-a100"), 1, 8)


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
    assert mp.n_params > M.LARGE_MODEL_PARAMS
    assert mp.chosen is not None and mp.chosen.strategy == "deepspeed_stage_3"


def test_cpu_profile_budget_and_no_render_warning():
    mp = _plan(profile="local")
    assert mp.accelerator == "cpu" and mp.budget_bytes == 8 * E.GIB // 2
    assert all(not r.estimate.layout.strategy.startswith("deepspeed") for r in mp.rows)
    assert M.fit_warning(load_spec(QUICKSTART, SEVEN_B), load_profile("local"), 1, 2) is None


def test_missing_gpu_memory_assumes_the_smallest_variant():
    prof = ClusterProfile(name="x", scheduler="slurm", gpus_per_node=8, gpu_type="A100")
    spec = load_spec(QUICKSTART)
    mp = M.plan_memory(spec, prof, 1, 8)
    assert mp.budget_bytes == 40 * E.GIB and any("gpu_mem_gib" in a for a in mp.assumptions)


def test_plan_is_deterministic():
    assert _plan(SEVEN_B).to_json() == _plan(SEVEN_B).to_json()


def test_cpu_ranks_count_no_reuse():
    """CPU budgets are RSS, which keeps freed memory (glibc malloc): the estimate adds the gradients
    and step temporaries on top of the activations, and the head to the backward working set."""
    shape = E.Shape(4, 8, 256, 512, 8)
    est = E.estimate(shape, "32-true", E.Layout("ddp"), num_nodes=1, devices_per_node=1, accelerator="cpu")
    assert est.late_bytes == 0
    assert est.activations_bytes == E.activation_bytes(shape, "32-true", reuse=False)
    per_layer, head, backward = _parts(shape, e=4, r=4)
    assert est.activations_bytes == 4 * per_layer + head + backward  # summed, not max(head, backward)
