"""QLoRA (4-bit NF4 base + LoRA adapters) rehearsed on CPU under every strategy.

bitsandbytes (>= 0.48.1) quantises and runs 4-bit layers on the CPU, so the sharded QLoRA
recipes the GPUs run are checked here without a GPU: the tiny Llama of
:mod:`tests.entrypoint.hf_helpers` with ``load_in_4bit: true`` + LoRA r=4 on q_proj/v_proj,
planned by jobgen's real planner for the ``local`` profile and trained by
``torch.distributed.run --nproc-per-node 2 -m jobgen.train`` (2 CPU ranks, gloo) under ddp, fsdp
FULL_SHARD, deepspeed_stage_2 and deepspeed_stage_3, ``bf16-mixed`` as in
``examples/llama-7b-qlora-fsdp.yaml``. Each must finish its ``STEPS`` optimizer steps with a
finite validation loss that went down between the validations at ``STEPS // 2`` and ``STEPS``,
and the four must end within ``ENDS_ATOL`` of each other.

Wall time of this file on the shared 2-core machine (load average ~14): 4 min 34 s; each run
40-55 s (ddp 43.8 s, fsdp 39.9 s, ZeRO-2 44.0 s, ZeRO-3 54.6 s of training wall time).

Before the fix the plan was refused on the CPU profile ("has no GPUs; 4-bit
quantisation (bitsandbytes) runs on CUDA GPUs only") and, with that rule out of the way, fsdp
crashed while wrapping with the GPU's error: ``Must flatten tensors with uniform dtype but got
torch.bfloat16 and torch.float32``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.entrypoint.hf_helpers import STRATEGY_CASES as CASES
from tests.entrypoint.hf_helpers import expected_lora_params, lora_spec

require("transformers", "transformers not installed (pip install -e .[train])")
require("peft", "peft not installed (pip install -e .[train])")
require("deepspeed", "deepspeed not installed (pip install -e .[train])")
require("bitsandbytes", "bitsandbytes not installed (pip install -e .[qlora])")

from tests.entrypoint.test_strategy_matrix import plan_job, train  # noqa: E402

STEPS = 8
"""Optimizer steps of each run (validations at ``STEPS // 2`` and ``STEPS``)."""

ENDS_ATOL = 0.25
"""Allowed spread of the final val_loss across the strategies, nats/token. Measured here (torch
2.13.0+cpu, bitsandbytes 0.50.2, peft 0.21.2, deepspeed 0.19.8, 2 ranks, lr 2e-2): ddp 3.4294,
ZeRO-2 3.4630, fsdp 3.5091, ZeRO-3 3.5716 (spread 0.142) from 3.81-3.89 at step 4 and ~5.3
train loss at step 1; identical to 4 digits with and without gradient checkpointing. A strategy
that stopped training after step 4 would stay ~0.35 above the others."""


def _base(hf_dir: Path) -> dict[str, Any]:
    spec = lora_spec(hf_dir / "llama", hf_dir / "tokenizer", hf_dir / "train.jsonl", STEPS)
    spec["model"]["load_in_4bit"] = True
    spec["trainer"] |= {"micro_batch_size": 4, "val_check_interval": STEPS // 2, "precision": "bf16-mixed",
                        "num_sanity_val_steps": 0}
    spec["checkpoint"] = {"every_n_steps": STEPS, "keep_last_k": 1}
    return spec


def _val_losses(summary: dict[str, Any]) -> dict[int, float]:
    """step -> val_loss from the run's metrics CSV (its step column is the optimizer step)."""
    out = {}
    with open(summary["metrics_csv"], newline="") as f:
        for row in csv.DictReader(f):
            if row.get("val_loss"):
                out[int(row["step"])] = float(row["val_loss"])
    return out


@pytest.fixture(scope="module")
def runs(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory, deepspeed_cpu_ops: None) -> dict[str, dict[str, Any]]:
    """Case id -> summary.json (plus ``"val"``: step -> val_loss) of one 2-rank QLoRA run."""
    root = tmp_path_factory.mktemp("hf_qlora")
    out: dict[str, dict[str, Any]] = {}
    for case, trainer in CASES.items():
        job = plan_job(root / case, trainer, base=_base(hf_dir))
        _, summary = train(job, timeout=400)
        out[case] = summary | {"val": _val_losses(summary)}
    rows = [
        f"{case:16s} val_loss {s['val']}  {s['tokens_per_s_mean'] / 1000:5.2f}k tok/s  wall {s['wall_time_s']:5.1f} s"
        for case, s in out.items()
    ]
    print("\nQLoRA strategy matrix (2 CPU ranks, bf16-mixed):\n" + "\n".join(rows))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_qlora_trains_under_every_strategy(runs, case: str) -> None:
    summary = runs[case]
    assert summary["global_step"] == STEPS and summary["world_size"] == 2
    assert summary["strategy"] == CASES[case]["strategy"]
    assert summary["trainable_params"] == expected_lora_params()
    val = summary["val"]
    middle, end = val[STEPS // 2], val[STEPS]
    assert math.isfinite(middle) and math.isfinite(end)
    # Below a uniform guess over the vocabulary (~ln 51 = 3.93), and it went down.
    assert end < middle < 4.5, val


@pytest.mark.slow
def test_qlora_losses_agree_across_strategies(runs) -> None:
    """Same data, seed and adapter initialisation; the numerics differ by recipe: ddp and ZeRO-2
    hold the unquantised weights in fp32 (``prepare_model_for_kbit_training``), fsdp and ZeRO-3
    in bf16, and DeepSpeed computes with bf16 copies of the adapters. See ``ENDS_ATOL``."""
    ends = {case: s["val"][STEPS] for case, s in runs.items()}
    assert max(ends.values()) - min(ends.values()) < ENDS_ATOL, ends


# --- Planning and loading, no training --------------------------------------------------------


def test_plan_accepts_qlora_on_the_cpu_profile(hf_dir: Path, tmp_path: Path) -> None:
    job = plan_job(tmp_path / "job", {"strategy": "fsdp"}, base=_base(hf_dir))
    assert (job / "spec.json").is_file()


def _load(write_spec, hf_dir: Path, strategy: str) -> Any:
    """The LightningModule the entrypoint builds for the QLoRA spec under ``strategy`` (on CPU)."""
    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.build import build_module

    base = _base(hf_dir)
    path = write_spec({**base, "trainer": {**base["trainer"], "strategy": strategy}})
    module, _, _ = build_module(load_resolved_spec(path).spec, "cpu")
    return module


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_3"])
def test_sharded_qlora_holds_a_bf16_frozen_base_and_fp32_adapters_with_checkpointing(
    write_spec, hf_dir: Path, strategy: str
) -> None:
    """The dtype decision (hf.load_causal_lm): frozen base (4-bit storage included) bf16, adapters
    fp32 (their master copy); and gradient checkpointing on, as the memory plan counts it."""
    import torch

    module = _load(write_spec, hf_dir, strategy)
    frozen = {p.dtype for p in module.parameters() if not p.requires_grad}
    trainable = {p.dtype for p in module.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trainable == {torch.float32}
    assert module.model.is_gradient_checkpointing


def test_replica_qlora_is_prepared_by_peft(write_spec, hf_dir: Path) -> None:
    import torch

    module = _load(write_spec, hf_dir, "ddp")
    assert {p.dtype for p in module.parameters() if not p.requires_grad} == {torch.uint8, torch.float32}
    assert {p.dtype for p in module.parameters() if p.requires_grad} == {torch.float32}
    assert module.model.is_gradient_checkpointing


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_validation_pass_leaves_the_4bit_layers_differentiable(write_spec, hf_dir: Path, strategy: str) -> None:
    """bitsandbytes 0.50 repacks a Linear4bit's weight, in place, for its AVX512-BF16 CPU
    inference kernel on the first forward in eval mode without grad (a validation pass), and
    from then on runs the layer through that kernel in training too, outside autograd: the
    gradient to the layer's input is lost in every later backward (the base model's path; under
    ddp the adapters train on wrong gradients, under FSDP and ZeRO backward fails). jobgen's
    loader turns the repacking off. The gradient comparison can fail only on a CPU with
    AVX512-BF16 (where bitsandbytes repacks); the flag holds on every CPU."""
    import bitsandbytes as bnb
    import torch

    module = _load(write_spec, hf_dir, strategy)
    layers = [m for m in module.modules() if isinstance(m, bnb.nn.Linear4bit)]
    layer = layers[0]
    x = torch.randn(2, layer.in_features, requires_grad=True)

    def input_grad() -> torch.Tensor | None:
        layer.train()
        x.grad = None
        layer(x).float().sum().backward()
        return x.grad

    before = input_grad().clone()
    layer.eval()
    with torch.no_grad():
        layer(torch.randn(2, layer.in_features))
    after = input_grad()
    assert after is not None and torch.equal(before, after), "the validation pass cut the layer out of autograd"
    assert not [m for m in layers if m.support_avx512bf16_for_cpu]


def test_fsdp_units_of_qlora_each_hold_one_dtype_and_one_requires_grad(write_spec, hf_dir: Path) -> None:
    """Every FSDP unit the strategy's policy makes (plus the root) flattens parameters of one
    dtype and one requires_grad: the condition whose breach crashed the GPU run."""
    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.build import build_module
    from jobgen.train.trainer import build_strategy

    base = _base(hf_dir)
    path = write_spec({**base, "trainer": {**base["trainer"], "strategy": "fsdp"}})
    resolved = load_resolved_spec(path)
    module, _, _ = build_module(resolved.spec, "cpu")
    policy = build_strategy(resolved, path, module).kwargs["auto_wrap_policy"]
    units = [m for m in module.modules() if policy._lambda_fn(m)]  # torch's CustomPolicy predicate
    assert len(units) == 2 + 2 * 2 * 2  # decoder layers + (q_proj, v_proj) x (A, B) per layer

    def own(unit) -> set[tuple]:  # parameters of `unit` that no nested unit takes
        nested = {id(p) for sub in unit.modules() if sub is not unit and sub in units for p in sub.parameters()}
        return {(p.dtype, p.requires_grad) for p in unit.parameters() if id(p) not in nested}

    for unit in [module, *units]:
        assert len(own(unit)) <= 1, (type(unit).__name__, own(unit))


def test_qlora_on_cpu_without_a_cpu_capable_bitsandbytes_is_a_located_error(
    write_spec, hf_dir: Path, monkeypatch
) -> None:
    import importlib.metadata

    from jobgen.errors import NotSupportedError

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.45.5")
    with pytest.raises(NotSupportedError, match="bitsandbytes 0.45.5 is older than") as info:
        _load(write_spec, hf_dir, "ddp")
    assert info.value.location == "spec.model.load_in_4bit" and "bitsandbytes>=" in info.value.hint


def test_flops_per_token_is_the_logical_models_in_every_quant_storage(write_spec, hf_dir: Path) -> None:
    """MFU's FLOPs per token come from the model's logical shape: the same
    number whether bitsandbytes stores the 4-bit weights as uint8 (ddp, ZeRO-2: two values per
    element) or as bf16 (fsdp, ZeRO-3: four per element), equal to 6 x adapters + 4 x frozen +
    attention with the frozen count read off the planner's config shape (every decoder Linear,
    the norms and the untied lm_head; the input embedding is a lookup), and to the same LoRA
    model loaded without quantisation. Before the fix the bf16-storage layouts counted each
    4-bit weight at half its size (this tiny Llama: 467,456 FLOPs per token under ddp and ZeRO-2,
    320,000 under fsdp and ZeRO-3; 467,456 in all four after it)."""
    import torch

    from jobgen.jobdir import load_resolved_spec
    from jobgen.planning.estimate_hf import read_hf_shape
    from jobgen.train.build import build_module
    from jobgen.train.measure import flops_per_token

    def logical(p: torch.Tensor) -> int:  # bitsandbytes keeps a 4-bit weight's own shape in its quant state
        return math.prod(p.quant_state.shape) if type(p).__name__ == "Params4bit" else p.numel()

    base = _base(hf_dir)
    block = base["model"]["block_size"]
    shape = read_hf_shape(hf_dir / "llama" / "config.json", block, 1)
    assert not shape.tied
    frozen = shape.n_layer * shape.block_params + shape.norm_params + shape.vocab_size * shape.d_model
    expected = 6 * expected_lora_params() + 4 * frozen + 12 * shape.n_layer * shape.d_model * block

    per_layout = {}
    for strategy, storage in [("ddp", torch.uint8), ("deepspeed_stage_2", torch.uint8), ("fsdp", torch.bfloat16),
                              ("deepspeed_stage_3", torch.bfloat16)]:
        path = write_spec({**base, "trainer": {**base["trainer"], "strategy": strategy}}, filename=f"{strategy}.json")
        spec = load_resolved_spec(path).spec
        module, counts, _ = build_module(spec, "cpu")
        packed = [p for p in module.parameters() if type(p).__name__ == "Params4bit"]
        assert packed and {p.dtype for p in packed} == {storage}, strategy
        # 4 bits per weight: the storage holds a quarter (bf16) or half (uint8) as many elements
        assert sum(logical(p) for p in packed) == shape.quantized_params
        assert sum(p.numel() for p in packed) * 8 * storage.itemsize // 4 == shape.quantized_params
        assert counts.total == sum(logical(p) for p in module.parameters())  # peft's count agrees
        per_layout[strategy] = flops_per_token(spec, module)
    assert set(per_layout.values()) == {expected}, per_layout

    plain = {**base, "model": {**base["model"], "load_in_4bit": False}}
    path = write_spec({**plain, "trainer": {**plain["trainer"], "strategy": "ddp", "precision": "32-true"}},
                      filename="plain.json")
    spec = load_resolved_spec(path).spec
    module, _, _ = build_module(spec, "cpu")
    assert flops_per_token(spec, module) == expected
