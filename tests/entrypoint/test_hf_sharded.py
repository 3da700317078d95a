"""A Hugging Face causal LM with LoRA under every strategy jobgen rehearses on CPU.

The tiny Llama of :mod:`tests.entrypoint.hf_helpers` (hidden 64, 2 decoder layers, LoRA r=4 on
q_proj/v_proj: 1,792 trainable of 82,368 parameters) on its JSONL records, planned by jobgen's
real planner for the ``local`` profile (``spec.json`` and, for DeepSpeed, the rendered
``ds_config.json``) and trained by ``torch.distributed.run --nproc-per-node 2 -m jobgen.train``
(2 CPU ranks, gloo): ddp, fsdp FULL_SHARD (wrapped per ``LlamaDecoderLayer``, found from the
model's ``_no_split_modules``, and per trainable adapter Linear), deepspeed_stage_2 and deepspeed_stage_3. Same seed and data,
``STEPS`` optimizer steps of 2 x 4 sequences of 96 tokens, ``32-true``, a checkpoint every
``STEPS // 2`` steps. Then each case resumes from its own mid-run checkpoint in its own format
(ddp: a ``.ckpt`` file holding the adapters only; fsdp: a sharded directory; DeepSpeed: the
engine's directory) and must continue at that step and land on its uninterrupted run's loss.

Tolerance: final ``val_loss`` within ``LOSS_ATOL = 1e-3`` nats/token of the DDP run (and of the
case's own uninterrupted run after a resume). Measured here (torch 2.13.0+cpu, lightning 2.6.6,
deepspeed 0.19.8, transformers + peft of the venv, 2 ranks): ddp and fsdp end at 3.3177617,
ZeRO-2 and ZeRO-3 at 3.3177619 (spread 2e-7: fp32 reduction order only, DDP's all-reduce vs
FSDP's reduce-scatter vs ZeRO's partitioned reduction), and every resume reproduced its run's
value to all 7 printed digits. Between the validations at steps 6 and 12 val_loss falls from
3.3764 to 3.3178, ~0.01 per optimizer step, so 1e-3 is ~10x below the effect of one skipped or
repeated step and far below a resume that lost the adapters (it would restart near
ln(51) = 3.93), and ~5000x above the observed spread. An adapters-only filter applied to the
FSDP sharded checkpoint makes its resume fail ("Missing key in checkpoint state_dict:
...embed_tokens.weight"): checked by hand, caught by the resume test.

Wall time of this file on the shared 2-core machine: 96 s (8 training runs of 4-13 s wall each
plus start-up; throughput 25k tok/s ddp, 14k fsdp, 20k ZeRO-2, 5.5k ZeRO-3).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.entrypoint.hf_helpers import STRATEGY_CASES as CASES
from tests.entrypoint.hf_helpers import expected_lora_params, lora_spec

require("transformers", "transformers not installed (pip install -e .[train])")
require("peft", "peft not installed (pip install -e .[train])")
require("deepspeed", "deepspeed not installed (pip install -e .[train])")

from tests.entrypoint.test_strategy_matrix import deepspeed_state_file, plan_job, train  # noqa: E402

STEPS = 12
"""Optimizer steps of each run (checkpoints and validations every ``STEPS // 2``)."""
LOSS_ATOL = 1e-3
"""Allowed |val_loss - reference| in nats/token (see the module docstring)."""



def _base(hf_dir: Path) -> dict[str, Any]:
    spec = lora_spec(hf_dir / "llama", hf_dir / "tokenizer", hf_dir / "train.jsonl", STEPS)
    spec["trainer"] |= {"micro_batch_size": 4, "val_check_interval": STEPS // 2}
    spec["checkpoint"] = {"every_n_steps": STEPS // 2, "keep_last_k": 4}
    return spec




@pytest.fixture(scope="module")
def runs(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory, deepspeed_cpu_ops: None) -> dict[str, dict[str, Any]]:
    """Case id -> {"job": job dir, "full": summary of the uninterrupted run, "resumed": summary
    and "resume_stdout" of the run resumed from the step STEPS // 2 checkpoint}."""
    root = tmp_path_factory.mktemp("hf_sharded")
    out: dict[str, dict[str, Any]] = {}
    for case, trainer in CASES.items():
        job = plan_job(root / case, trainer, base=_base(hf_dir))
        _, full = train(job)
        resume_job = root / f"{case}_resume"
        shutil.copytree(job, resume_job)
        checkpoints = resume_job / "run" / "checkpoints"
        for name in ("last.ckpt", f"step-{STEPS:08d}.ckpt"):
            path = checkpoints / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        (resume_job / "run" / "summary.json").unlink()
        result, resumed = train(resume_job)
        out[case] = {"job": job, "full": full, "resumed": resumed, "resume_stdout": result.stdout}
    rows = [
        f"{case:16s} val_loss {r['full']['val_loss']:.7f}  {r['full']['tokens_per_s_mean'] / 1000:5.1f}k tok/s  "
        f"wall {r['full']['wall_time_s']:5.1f} s | resumed at step {r['resumed']['resumed_from_step']} -> "
        f"{r['resumed']['global_step']}: val_loss {r['resumed']['val_loss']:.7f}  wall {r['resumed']['wall_time_s']:5.1f} s"
        for case, r in out.items()
    ]
    print("\nHF LoRA strategy matrix (2 CPU ranks, 32-true):\n" + "\n".join(rows))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_lora_trains_to_the_same_loss_under_every_strategy(runs, case: str) -> None:
    full = runs[case]["full"]
    assert full["global_step"] == STEPS and full["world_size"] == 2
    assert full["strategy"] == CASES[case]["strategy"]
    # Counted before sharding: the whole model and its adapters, under ZeRO-3 and FSDP too.
    assert full["trainable_params"] == expected_lora_params()
    assert full["total_params"] == runs["ddp"]["full"]["total_params"] > 10 * expected_lora_params()
    assert full["val_loss"] == pytest.approx(runs["ddp"]["full"]["val_loss"], abs=LOSS_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_resume_from_its_own_checkpoint_format_continues_at_the_saved_step(runs, case: str) -> None:
    run = runs[case]
    resumed = run["resumed"]
    middle = STEPS // 2
    assert f"(step {middle})" in run["resume_stdout"], run["resume_stdout"][-2000:]
    assert resumed["resumed_from_step"] == middle
    assert Path(resumed["resumed_from"]).name == f"step-{middle:08d}.ckpt"
    assert resumed["global_step"] == STEPS
    # The adapters, optimizer state and schedule came back: the same end as without the break.
    assert resumed["val_loss"] == pytest.approx(run["full"]["val_loss"], abs=LOSS_ATOL)


@pytest.mark.slow
def test_ddp_checkpoint_file_holds_the_adapters_only(runs) -> None:
    import torch

    ckpt = Path(runs["ddp"]["full"]["last_checkpoint"])
    assert ckpt.is_file()
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert state and all("lora_" in k for k in state), sorted(state)[:5]
    assert sum(v.numel() for v in state.values()) == expected_lora_params()


@pytest.mark.slow
def test_fsdp_sharded_checkpoint_keeps_the_frozen_base(runs) -> None:
    """Lightning's sharded load asks torch.distributed.checkpoint for every key of the model, so
    the adapters-only filter must not apply here: the directory holds base and adapters."""
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = Path(runs["fsdp_full_shard"]["full"]["last_checkpoint"])
    assert ckpt.is_dir() and (ckpt / "meta.pt").is_file()
    keys = {k.removeprefix("model.") for k in FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
            if k.startswith("model.")}
    lora = {k for k in keys if "lora_" in k}
    assert len(lora) == 2 * 2 * 2  # layers x (q_proj, v_proj) x (A, B)
    assert any(k.endswith("embed_tokens.weight") for k in keys), sorted(keys)[:10]
    assert any(k.endswith("q_proj.base_layer.weight") for k in keys), sorted(keys)[:10]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["zero2", "zero3"])
def test_deepspeed_checkpoint_is_the_engines_directory(runs, case: str) -> None:
    """DeepSpeed checkpoints are written by the engine (Lightning passes no ``state_dict``), so
    the adapter filter and the missing-adapter check are skipped: the engine restores the module."""
    import torch

    ckpt = Path(runs[case]["full"]["last_checkpoint"])
    state = torch.load(deepspeed_state_file(ckpt), map_location="cpu", weights_only=False)
    assert state["global_step"] == STEPS and "state_dict" not in state


# --- Strategy and loading configuration, no training ----------------------------------------


def _fsdp_strategy(write_spec, hf_dir: Path, trainer: dict[str, Any], accelerator: str = "cpu") -> Any:
    """build_strategy for the tiny Llama + LoRA under ``trainer`` overrides, with the loaded module."""
    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.build import build_module
    from jobgen.train.trainer import build_strategy

    base = _base(hf_dir)
    path = write_spec({**base, "trainer": {**base["trainer"], **trainer}}, accelerator=accelerator)
    resolved = load_resolved_spec(path)
    module, _, _ = build_module(resolved.spec, "cpu")  # the module loads on CPU either way
    _LOADED[:] = [module]
    return build_strategy(resolved, path, module)


def test_fsdp_wraps_and_recomputes_the_decoder_layers_the_model_declares(write_spec, hf_dir: Path) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from jobgen.train.strategies import CPUFSDPStrategy

    strategy = _fsdp_strategy(write_spec, hf_dir, {"strategy": "fsdp", "activation_checkpointing": True})
    assert isinstance(strategy, CPUFSDPStrategy)
    # LoRA: the decoder layers and, in units of their own, the trainable adapter Linears.
    assert _wrapped_kinds(strategy) == {"LlamaDecoderLayer", "lora"}
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {LlamaDecoderLayer}
    assert strategy.kwargs["use_orig_params"] is True  # no unit mixes frozen and trainable parameters


def _wrapped_kinds(strategy: Any) -> set[str]:
    """What the strategy's FSDP auto-wrap policy (a CustomPolicy) makes units of, in the tiny
    Llama + LoRA: class names, with every trainable adapter Linear reported as ``"lora"``.
    Reads torch's private ``CustomPolicy._lambda_fn``."""
    policy = strategy.kwargs.get("auto_wrap_policy")
    if policy is None:
        return set()
    kinds = set()
    for name, module in _LOADED[0].named_modules():
        if policy._lambda_fn(module):
            trainable = any(p.requires_grad for p in module.parameters())
            kinds.add("lora" if trainable and ".lora_" in name else type(module).__name__)
    return kinds


_LOADED: list[Any] = []  # the module the last _fsdp_strategy call built


def test_the_hf_module_starts_in_train_mode(write_spec, hf_dir: Path) -> None:
    """from_pretrained returns eval mode; Lightning keeps it, which would switch LoRA dropout off."""
    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.build import build_module

    module, _, _ = build_module(load_resolved_spec(write_spec(_base(hf_dir))).spec, "cpu")
    assert all(m.training for m in module.modules())


def test_the_spec_policies_override_the_models_own(write_spec, hf_dir: Path) -> None:
    import torch

    strategy = _fsdp_strategy(write_spec, hf_dir, {
        "strategy": "fsdp", "fsdp_auto_wrap_policy": ["torch.nn.Linear"],
        "fsdp_activation_checkpointing_policy": ["torch.nn.Embedding"],
    }, accelerator="gpu")  # fmt: skip
    assert _wrapped_kinds(strategy) == {"Linear", "lora"}  # every Linear (the adapters' too)
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {torch.nn.Embedding}


def test_decoder_layer_classes_resolve_the_declared_names_against_loaded_modules() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from jobgen.train.hf import decoder_layer_classes

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = LlamaForCausalLM(config)
    assert {c.__name__ for c in decoder_layer_classes(model)} == set(model._no_split_modules)
    # A name the model declares but never instantiates resolves to nothing; a plain module declares none.
    for m in model.modules():  # LlamaForCausalLM and the LlamaModel inside both declare it
        if hasattr(m, "_no_split_modules"):
            m._no_split_modules = ["NoSuchLayer"]
    assert decoder_layer_classes(model) == set()
    assert decoder_layer_classes(torch.nn.Sequential(torch.nn.Linear(2, 2))) == set()


def test_activation_checkpointing_without_declared_layers_is_a_located_error(write_spec, hf_dir: Path, monkeypatch) -> None:
    from jobgen.errors import ConfigError
    from jobgen.train import hf

    monkeypatch.setattr(hf, "decoder_layer_classes", lambda module: set())
    with pytest.raises(ConfigError, match="declares no decoder-layer classes") as info:
        _fsdp_strategy(write_spec, hf_dir, {"strategy": "fsdp", "activation_checkpointing": True})
    assert info.value.location == "spec.trainer.activation_checkpointing"
    # Without activation checkpointing the model is one FSDP unit, less the adapters (their own units).
    strategy = _fsdp_strategy(write_spec, hf_dir, {"strategy": "fsdp"})
    assert _wrapped_kinds(strategy) == {"lora"}


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_3"])
def test_qlora_under_parameter_sharding_stores_4bit_weights_as_bf16(strategy: str) -> None:
    import torch
    from transformers import BitsAndBytesConfig

    from jobgen.train.hf import qlora_load

    recipe = qlora_load(strategy)
    config = BitsAndBytesConfig(**recipe.bnb)  # the kwargs are real BitsAndBytesConfig fields
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_quant_storage == torch.bfloat16 == recipe.dtype  # one float dtype to flatten
    assert not recipe.pin_to_local_device  # the strategy places the shards
    assert not recipe.prepare_kbit  # its fp32 up-cast would mix dtypes in a flat parameter


@pytest.mark.parametrize("strategy", ["ddp", "deepspeed_stage_1", "deepspeed_stage_2"])
def test_qlora_with_a_full_replica_per_rank_pins_it_to_the_local_gpu(strategy: str) -> None:
    import torch
    from transformers import BitsAndBytesConfig

    from jobgen.train.hf import qlora_load

    recipe = qlora_load(strategy)
    config = BitsAndBytesConfig(**recipe.bnb)
    assert config.bnb_4bit_quant_storage == torch.uint8  # bitsandbytes' default
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    assert recipe.dtype is None and recipe.pin_to_local_device and recipe.prepare_kbit


def test_parameter_sharding_strategies_are_spec_strategies() -> None:
    from typing import get_args

    from jobgen.specs.trainer import Strategy
    from jobgen.train.hf import PARAM_SHARDING_STRATEGIES

    assert PARAM_SHARDING_STRATEGIES <= set(get_args(Strategy))


def test_parameter_name_prefixes_match_torch() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_WRAPPED_MODULE
    from torch.distributed.fsdp._common_utils import FSDP_WRAPPED_MODULE

    from jobgen.train.hf import _CHECKPOINT_PREFIX, _FSDP_PREFIX

    assert (_FSDP_PREFIX, _CHECKPOINT_PREFIX) == (FSDP_WRAPPED_MODULE + ".", _CHECKPOINT_WRAPPED_MODULE + ".")
