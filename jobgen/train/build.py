"""Model and data construction for :func:`jobgen.train.run.train`, per model kind and data format.

The built-in byte-level GPT (:class:`~jobgen.train.model.LitGPT`) or a Hugging Face causal LM
(:class:`~jobgen.train.hf.LitHFCausalLM`, optionally with LoRA); byte-level text, token files
or JSONL instructions (:mod:`jobgen.train.format_data`). The data is checked against the
model's vocabulary here, before ``fit`` starts, so a mismatch is an exit-2 error on every rank
rather than an index error inside a forward pass.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import LightningDataModule

from jobgen.errors import ConfigError
from jobgen.specs.training import TrainingSpec
from jobgen.train.data import ByteTextDataModule
from jobgen.train.formats import InstructionFiles, TokenFiles
from jobgen.train.hf import ParamCounts
from jobgen.train.model import VOCAB_SIZE, LitGPT
from jobgen.train.sources import SplitLayout, TextSources

DataSources = TextSources | TokenFiles | InstructionFiles
"""What the entrypoint found for ``spec.data`` (by format: text, tokens, jsonl)."""


def build_module(spec: TrainingSpec, accelerator: str, strategy: str | None = None) -> tuple[LitGPT, ParamCounts, str]:
    """The LightningModule for ``spec.model``, its parameter counts and a banner line.

    ``strategy``: the strategy the run trains with, when it is not ``spec.trainer.strategy``
    (``ddp`` on the single-device path, :func:`jobgen.train.speed.single_device`): a QLoRA model
    is loaded for it (:func:`jobgen.train.hf.qlora_load`).

    Raises:
        ConfigError, NotSupportedError: a Hugging Face model that cannot be loaded as asked
            (see :func:`jobgen.train.hf.load_causal_lm`).
    """
    m = spec.model
    if not m.is_hf:
        module = LitGPT.from_spec(spec)
        total = sum(p.numel() for p in module.parameters())  # every GPT parameter trains
        counts = ParamCounts(total, total, VOCAB_SIZE)
        line = (
            f"GPT {m.n_params / 1e6:.2f}M params (n_layer {m.n_layer}, n_head {m.n_head}, d_model {m.d_model}, "
            f"block_size {m.block_size})"
        )
        return module, counts, line
    from jobgen.train.hf import LitHFCausalLM

    hf_module = LitHFCausalLM(spec, accelerator, strategy)
    c = hf_module.counts
    if m.lora is None:
        how = "full fine-tuning"
    else:
        quant = ", 4-bit NF4 base (QLoRA)" if m.load_in_4bit else ""
        how = (f"LoRA r={m.lora.r} alpha={m.lora.alpha:g} dropout={m.lora.dropout:g} on "
               f"{', '.join(m.lora.target_modules)}{quant}")
    line = (
        f"{type(hf_module.model.config).__name__.removesuffix('Config')} from {m.hf_path}: "
        f"{c.total / 1e6:.2f}M params, trainable {c.trainable:,} / {c.total:,} "
        f"({100 * c.trainable / max(c.total, 1):.2f}%), {how}, vocab {c.vocab_size:,}, block_size {m.block_size}"
    )
    return hf_module, c, line


def build_datamodule(
    spec: TrainingSpec,
    sources: DataSources,
    layout: SplitLayout | None,
    run_dir: Path,
    world_size: int,
    model_vocab: int,
    pin_memory: bool = False,
) -> tuple[LightningDataModule, str]:
    """The data module for ``spec.data.format`` and a banner line (``pin_memory``: the loaders pin
    their batches, :func:`jobgen.train.speed.pin_memory`).

    Raises:
        ConfigError: token files or a tokenizer whose vocabulary does not fit ``model_vocab``;
            an unloadable tokenizer; JSONL records whose prompts leave no response token.
    """
    t, d = spec.trainer, spec.data
    if isinstance(sources, TextSources):
        assert layout is not None
        dm = ByteTextDataModule.from_spec(spec, sources, run_dir, world_size, pin_memory)
        line = (f"{layout.train_bytes:,} train / {layout.val_bytes:,} val bytes from "
                f"{len(sources.files)} file(s) of {sources.origin}")
        return dm, line
    kwargs = dict(
        block_size=spec.model.block_size,
        micro_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        world_size=world_size,
        max_steps=t.max_steps,
        val_fraction=d.val_fraction,
        val_batches=t.limit_val_batches,
        seed=t.seed,
        pin_memory=pin_memory,
    )
    if isinstance(sources, TokenFiles):
        from jobgen.train.format_data import TokenDataModule, check_token_vocab

        check_token_vocab(sources, model_vocab)
        return TokenDataModule(sources, Path(run_dir) / "data", **kwargs), sources.describe()
    from jobgen.train.format_data import InstructionDataModule
    from jobgen.train.hf import load_tokenizer

    location = "spec.data.tokenizer_path" if d.tokenizer_path else "spec.model.hf_path"
    tokenizer = load_tokenizer(d.tokenizer_path or spec.model.hf_path or "", location)
    if len(tokenizer) > model_vocab:
        raise ConfigError(
            f"the tokenizer has {len(tokenizer):,} tokens, but the model's vocabulary has {model_vocab:,}",
            location=location,
            hint="use the tokenizer the model was trained with (data.tokenizer_path)",
        )
    dm = InstructionDataModule(sources, tokenizer, Path(run_dir) / "data", **kwargs)
    line = sources.describe() + f", tokenizer {type(tokenizer).__name__} ({len(tokenizer):,} tokens)"
    if dm.dropped:
        line += f"; {dm.dropped} record(s) dropped (prompt fills block_size)"
    return dm, line
