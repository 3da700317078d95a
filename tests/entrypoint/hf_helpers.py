"""Builders shared by the Hugging Face entrypoint tests: a tiny Llama saved with
``save_pretrained``, a word-level tokenizer that covers jobgen's instruction prompts, and JSONL
records with a learnable mapping. Nothing is downloaded. Callers check that transformers,
tokenizers and peft are importable (``tests.conftest.require``) before building.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 128
LORA_R = 4
TARGETS = ["q_proj", "v_proj"]

#: case id -> trainer overrides: the strategies the Hugging Face tests rehearse on 2 CPU ranks.
STRATEGY_CASES: dict[str, dict[str, str]] = {
    "ddp": {"strategy": "ddp"},
    "fsdp_full_shard": {"strategy": "fsdp", "fsdp_sharding_strategy": "FULL_SHARD"},
    "zero2": {"strategy": "deepspeed_stage_2"},
    "zero3": {"strategy": "deepspeed_stage_3"},
}

COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]
ANIMALS = ["cat", "dog", "fox", "owl", "cow", "pig", "bee", "ant"]


def records() -> list[dict[str, str]]:
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


def write_records(path: Path) -> Path:
    """Write :func:`records` as JSONL to ``path``; returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records()))
    return path


def lora_spec(model_dir: Path, tok_dir: Path, data: Path, max_steps: int) -> dict:
    """Spec overrides (merged over TINY_SPEC) for LoRA on :func:`records` with the tiny Llama."""
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
