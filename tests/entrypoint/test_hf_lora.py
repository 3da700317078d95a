"""Hugging Face causal LM + LoRA on JSONL instruction data, through the real entrypoint.

A tiny Llama (hidden 64, 2 layers, 4 heads) and a word-level tokenizer are built and saved
locally with ``save_pretrained`` (no downloads); ``python -m jobgen.train`` runs as a real
subprocess with LoRA on q_proj/v_proj, then resumes from its checkpoint.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from tests.conftest import require

transformers = require("transformers", "transformers not installed (pip install -e .[train])")
require("peft", "peft not installed (pip install -e .[train])")
tokenizers = require("tokenizers", "tokenizers not installed (pip install -e .[train], with transformers)")

TIMEOUT_S = 300
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 128
LORA_R = 4
TARGETS = ["q_proj", "v_proj"]

COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]
ANIMALS = ["cat", "dog", "fox", "owl", "cow", "pig", "bee", "ant"]


def _records() -> list[dict[str, str]]:
    # A learnable mapping: the response repeats the input's words in reverse order.
    out = []
    for i, colour in enumerate(COLOURS):
        for j, animal in enumerate(ANIMALS):
            rec = {"instruction": "reverse the words", "input": f"{colour} {animal}", "output": f"{animal} {colour}"}
            if (i + j) % 5 == 0:
                rec = {"instruction": f"name the colour of the {animal}", "output": colour}
            out.append(rec)
    return out


def build_tiny_llama(directory: Path) -> tuple[Path, Path]:
    """Save a word-level tokenizer and a tiny random Llama under ``directory``; return their dirs."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from jobgen.train.formats import PROMPT_NO_INPUT, PROMPT_WITH_INPUT

    text = " ".join([PROMPT_WITH_INPUT, PROMPT_NO_INPUT, *COLOURS, *ANIMALS, "reverse the words name the colour of"])
    words = sorted(set(re.findall(r"\w+|[^\w\s]", text.replace("{instruction}", " ").replace("{input}", " "))))
    vocab = {"<unk>": 0, "<pad>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    tok_dir = directory / "tokenizer"
    fast.save_pretrained(tok_dir)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
        pad_token_id=1, eos_token_id=2, bos_token_id=None,
        # Stand-in for a pretrained model: with the default std 0.02 the frozen random lm_head
        # yields logits too small for q/v adapters to move the loss in a few dozen steps.
        initializer_range=0.2,
    )  # fmt: skip
    import torch

    torch.manual_seed(0)
    model_dir = directory / "llama"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    return model_dir, tok_dir


def expected_lora_params() -> int:
    """r x (in + out) per adapted Linear: q_proj is hidden -> hidden, v_proj hidden -> kv heads x head dim."""
    head_dim = HIDDEN // HEADS
    shapes = {"q_proj": (HIDDEN, HEADS * head_dim), "v_proj": (HIDDEN, KV_HEADS * head_dim)}
    return LAYERS * sum(LORA_R * (i + o) for i, o in (shapes[t] for t in TARGETS))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> tuple[Path, Path]:
    return build_tiny_llama(tmp_path_factory.mktemp("hf"))


def _spec(model_dir: Path, tok_dir: Path, data: Path, max_steps: int) -> dict:
    return {
        # n_layer/n_head/d_model: None clears TINY_SPEC's GPT sizes (write_spec merges over it).
        "model": {"preset": None, "n_layer": None, "n_head": None, "d_model": None, "hf_path": str(model_dir), "block_size": 96,
                  "lora": {"r": LORA_R, "alpha": 8, "target_modules": TARGETS}},
        "data": {"format": "jsonl", "paths": [str(data)], "tokenizer_path": str(tok_dir), "val_fraction": 0.125,
                 "max_bytes": None},
        "trainer": {"max_steps": max_steps, "micro_batch_size": 8, "learning_rate": 2e-2, "warmup_steps": 2,
                    "val_check_interval": 15, "limit_val_batches": 2, "log_every_n_steps": 1, "weight_decay": 0.0},
        "checkpoint": {"every_n_steps": 15},
    }  # fmt: skip


def _train_losses(metrics_csv: Path) -> dict[int, float]:
    with open(metrics_csv, newline="") as f:
        return {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(f) if row["train_loss"]}


def test_lora_on_jsonl_trains_only_adapters_checkpoints_and_resumes(
    tiny_llama, write_spec, run_entrypoint, tmp_path: Path
) -> None:
    model_dir, tok_dir = tiny_llama
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    write_spec(_spec(model_dir, tok_dir, data, 30), filename="spec30.json", devices_per_node=1, world_size=1)
    write_spec(_spec(model_dir, tok_dir, data, 40), filename="spec40.json", devices_per_node=1, world_size=1)
    run_dir = tmp_path / "run"

    first = run_entrypoint("--spec", "spec30.json", "--run-dir", str(run_dir), timeout=TIMEOUT_S)
    assert first.code == 0, first.output
    summary = json.loads((run_dir / "summary.json").read_text())
    expected = expected_lora_params()
    assert summary["trainable_params"] == expected, summary
    assert summary["total_params"] > 10 * expected
    assert f"trainable {expected:,} / total {summary['total_params']:,}" in first.stdout, first.output
    assert summary["global_step"] == 30 and summary["data_format"] == "jsonl"
    losses = _train_losses(Path(summary["metrics_csv"]))
    first_loss, last_loss = losses[min(losses)], losses[max(losses)]
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    assert first_loss > 0.8 * math.log(vocab), losses  # random init: about ln(vocab)
    assert last_loss < 0.6 * first_loss, losses  # the adapters learned the responses
    assert summary["val_loss"] < 0.6 * first_loss, summary

    # Checkpoints hold only the adapter tensors (the frozen base reloads from hf_path).
    import torch

    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert state and all("lora_" in k for k in state), sorted(state)[:5]
    assert sum(v.numel() for v in state.values()) == expected

    resumed = run_entrypoint("--spec", "spec40.json", "--run-dir", str(run_dir), timeout=TIMEOUT_S)
    assert resumed.code == 0, resumed.output
    assert "resume: auto - resuming from" in resumed.stdout and "(step 30)" in resumed.stdout, resumed.output
    summary2 = json.loads((run_dir / "summary.json").read_text())
    assert summary2["global_step"] == 40 and summary2["resumed_from_step"] == 30
    resumed_losses = _train_losses(Path(summary2["metrics_csv"]))
    # Adapters were restored: the first logged loss after resume is near the end of run 1, not ln(vocab).
    assert resumed_losses[min(resumed_losses)] < 0.6 * first_loss, resumed_losses


def test_malformed_jsonl_line_is_named_with_file_line_and_field(
    tiny_llama, write_spec, run_entrypoint, tmp_path: Path
) -> None:
    model_dir, tok_dir = tiny_llama
    data = tmp_path / "bad.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n\n{"instruction": "c", "output": 3}\n')
    write_spec(_spec(model_dir, tok_dir, data, 5), devices_per_node=1, world_size=1)
    result = run_entrypoint("--spec", "spec.json", timeout=60)
    assert result.code == 2, result.output
    assert f"{data}:3: output: field 'output' must be a string, got int" in result.stderr, result.output
    assert "Traceback" not in result.stderr


def test_lora_target_module_missing_from_model_is_a_config_error(
    tiny_llama, write_spec, run_entrypoint, tmp_path: Path
) -> None:
    model_dir, tok_dir = tiny_llama
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    spec = _spec(model_dir, tok_dir, data, 5)
    spec["model"]["lora"]["target_modules"] = ["c_attn"]
    write_spec(spec, devices_per_node=1, world_size=1)
    result = run_entrypoint("--spec", "spec.json", timeout=TIMEOUT_S)
    assert result.code == 2, result.output
    assert "spec.model.lora.target_modules" in result.stderr and "q_proj" in result.stderr, result.output


def test_every_precision_has_a_load_dtype_for_hf_weights() -> None:
    from typing import get_args

    from jobgen.spec import Precision
    from jobgen.train.hf import _LOAD_DTYPE

    # `auto` never reaches a node: the planner resolves it and spec.json refuses it.
    assert set(get_args(Precision)) - {"auto"} == set(_LOAD_DTYPE)
