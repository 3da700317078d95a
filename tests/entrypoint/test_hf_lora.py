"""Hugging Face causal LM + LoRA on JSONL instruction data, through the real entrypoint.

A tiny Llama (hidden 64, 2 layers, 4 heads) and a word-level tokenizer are built and saved
locally with ``save_pretrained`` (no downloads); ``python -m jobgen.train`` runs as a real
subprocess with LoRA on q_proj/v_proj, then resumes from its checkpoint.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from tests.conftest import require

transformers = require("transformers", "transformers not installed (pip install -e .[train])")
require("peft", "peft not installed (pip install -e .[train])")
tokenizers = require("tokenizers", "tokenizers not installed (pip install -e .[train], with transformers)")

from tests.entrypoint.hf_helpers import build_tiny_llama, expected_lora_params, lora_spec, write_records  # noqa: E402

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> tuple[Path, Path]:
    return build_tiny_llama(tmp_path_factory.mktemp("hf"))


def _train_losses(metrics_csv: Path) -> dict[int, float]:
    with open(metrics_csv, newline="") as f:
        return {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(f) if row["train_loss"]}


def _lrs(metrics_csv: Path) -> dict[int, float]:
    with open(metrics_csv, newline="") as f:
        return {int(row["step"]): float(row["lr"]) for row in csv.DictReader(f) if row.get("lr")}


@pytest.mark.slow
def test_lora_on_jsonl_trains_only_adapters_checkpoints_and_resumes(
    tiny_llama, write_spec, run_entrypoint, tmp_path: Path
) -> None:
    model_dir, tok_dir = tiny_llama
    data = write_records(tmp_path / "train.jsonl")
    write_spec(lora_spec(model_dir, tok_dir, data, 30), filename="spec30.json", devices_per_node=1, world_size=1)
    write_spec(lora_spec(model_dir, tok_dir, data, 40), filename="spec40.json", devices_per_node=1, world_size=1)
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
    # The 30-step cosine is kept, not re-stretched to 40: steps 31-40 train at
    # min_lr_ratio x learning_rate = 0.1 x 2e-2, as LitGPT's do.
    assert "resume: max_steps 30 -> 40; the learning-rate schedule keeps" in resumed.stdout, resumed.output
    lrs = _lrs(Path(summary2["metrics_csv"]))
    assert [lrs[i] for i in range(31, 41)] == pytest.approx([2e-3] * 10), lrs  # metrics.csv: 1-based optimizer steps


def test_malformed_jsonl_line_is_named_with_file_line_and_field(
    tiny_llama, write_spec, run_entrypoint, tmp_path: Path
) -> None:
    model_dir, tok_dir = tiny_llama
    data = tmp_path / "bad.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n\n{"instruction": "c", "output": 3}\n')
    write_spec(lora_spec(model_dir, tok_dir, data, 5), devices_per_node=1, world_size=1)
    result = run_entrypoint("--spec", "spec.json", timeout=60)
    assert result.code == 2, result.output
    assert f"{data}:3: output: field 'output' must be a string, got int" in result.stderr, result.output
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_lora_target_module_missing_from_model_is_a_config_error(
    tiny_llama, write_spec, run_entrypoint, tmp_path: Path
) -> None:
    model_dir, tok_dir = tiny_llama
    data = write_records(tmp_path / "train.jsonl")
    spec = lora_spec(model_dir, tok_dir, data, 5)
    spec["model"]["lora"]["target_modules"] = ["c_attn"]
    write_spec(spec, devices_per_node=1, world_size=1)
    result = run_entrypoint("--spec", "spec.json", timeout=TIMEOUT_S)
    assert result.code == 2, result.output
    assert "spec.model.lora.target_modules" in result.stderr and "q_proj" in result.stderr, result.output


def test_every_precision_has_a_load_dtype_for_hf_weights() -> None:
    from typing import get_args

    from jobgen.specs.training import Precision
    from jobgen.train.hf import _LOAD_DTYPE

    # `auto` never reaches a node: the planner resolves it and spec.json refuses it.
    assert set(get_args(Precision)) - {"auto"} == set(_LOAD_DTYPE)
