"""Hugging Face causal language models (transformers), LoRA (peft) and QLoRA (bitsandbytes).

Imported by :mod:`jobgen.train.run` only, and only for specs with ``model.hf_path``: jobgen's
render path never imports torch, transformers or peft.

Everything is loaded from local directories with ``local_files_only=True``: a job never
downloads weights or tokenizers. Shapes: ``B`` = micro batch size, ``T`` = ``block_size``,
``V`` = the model's vocabulary (rows of its input embedding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from jobgen.errors import ConfigError, NotSupportedError
from jobgen.spec import ModelSpec, TrainingSpec
from jobgen.train.model import LitGPT

# Precision (Lightning's names) -> dtype the weights are loaded in. Mixed precision keeps fp32
# weights (autocast computes in bf16/fp16); bf16-true trains bf16 weights, and so does
# transformer-engine (Lightning's TransformerEnginePrecision keeps bf16 weights, fp8 matmuls).
_LOAD_DTYPE = {"32-true": torch.float32, "bf16-mixed": torch.float32, "16-mixed": torch.float32,
               "bf16-true": torch.bfloat16, "transformer-engine": torch.bfloat16}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a loaded model.

    Attributes:
        trainable: parameters updated by the optimizer (the LoRA adapters with ``lora``).
        total: all parameters (base model + adapters; 4-bit packed weights counted unpacked).
        vocab_size: rows of the input embedding (token ids must be below this).
    """

    trainable: int
    total: int
    vocab_size: int


def _check_dir(path: str, location: str, what: str) -> Path:
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ConfigError(
            f"{what} directory {str(directory)!r} does not exist",
            location=location,
            hint="give a local directory written by save_pretrained(); jobgen never downloads models "
            "(copy the files onto the cluster's shared file system first)",
        )
    return directory


def load_tokenizer(path: str, location: str) -> Any:
    """``AutoTokenizer.from_pretrained(path, local_files_only=True)``.

    Raises:
        ConfigError: the directory is missing or holds no loadable tokenizer.
    """
    from transformers import AutoTokenizer

    directory = _check_dir(path, location, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"cannot load a tokenizer from {str(directory)!r}: {' '.join(str(exc).split())[:300]}",
            location=location,
            hint="the directory needs tokenizer.json / tokenizer_config.json as written by "
            "tokenizer.save_pretrained()",
        ) from None


def _quantization_config() -> Any:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise NotSupportedError(
            "model.load_in_4bit needs the bitsandbytes package, which is not installed",
            location="spec.model.load_in_4bit",
            hint="pip install 'jobgen[qlora]' on the GPU nodes (CUDA only)",
        ) from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def load_causal_lm(model: ModelSpec, precision: str, accelerator: str = "cpu") -> torch.nn.Module:
    """Load ``model.hf_path`` with ``AutoModelForCausalLM`` and add LoRA adapters if asked.

    Without ``lora`` every parameter trains (full fine-tuning). With ``lora``, peft's
    ``get_peft_model`` freezes the base model and adds adapters (A: in x r, B: r x out) to the
    ``target_modules``. With ``load_in_4bit`` the base is loaded in 4-bit NF4 (bitsandbytes) and
    prepared with ``prepare_model_for_kbit_training`` (QLoRA; CUDA only).

    Raises:
        ConfigError: missing directory, no loadable model there, ``block_size`` above the
            model's ``max_position_embeddings``, LoRA target modules not in the model.
        NotSupportedError: ``load_in_4bit`` on CPU or without bitsandbytes.
    """
    from transformers import AutoModelForCausalLM

    assert model.hf_path is not None
    directory = _check_dir(model.hf_path, "spec.model.hf_path", "model")
    kwargs: dict[str, Any] = {"local_files_only": True}
    if model.load_in_4bit:
        if accelerator != "gpu" or not torch.cuda.is_available():
            raise NotSupportedError(
                "model.load_in_4bit (QLoRA) needs a CUDA GPU; this rank has none",
                location="spec.model.load_in_4bit",
                hint="remove load_in_4bit to train plain LoRA adapters, or run on a GPU profile",
            )
        kwargs["quantization_config"] = _quantization_config()
        kwargs["device_map"] = {"": torch.cuda.current_device()}
    else:
        kwargs["dtype"] = _LOAD_DTYPE.get(precision, torch.float32)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"cannot load a causal LM from {str(directory)!r}: {' '.join(str(exc).split())[:300]}",
            location="spec.model.hf_path",
            hint="the directory needs config.json and model weights as written by model.save_pretrained()",
        ) from None
    max_positions = getattr(hf_model.config, "max_position_embeddings", None)
    if isinstance(max_positions, int) and model.block_size > max_positions:
        raise ConfigError(
            f"block_size {model.block_size} exceeds the model's max_position_embeddings {max_positions}",
            location="spec.model.block_size",
            hint=f"set model.block_size to at most {max_positions}",
        )
    if model.lora is None:
        return hf_model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if model.load_in_4bit:
        hf_model = prepare_model_for_kbit_training(hf_model)
    config = LoraConfig(
        r=model.lora.r,
        lora_alpha=model.lora.alpha,
        lora_dropout=model.lora.dropout,
        target_modules=list(model.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(hf_model, config)
    except ValueError as exc:
        linear = sorted({name.rsplit(".", 1)[-1] for name, m in hf_model.named_modules()
                         if isinstance(m, torch.nn.Linear)})
        raise ConfigError(
            f"LoRA target modules {list(model.lora.target_modules)} do not fit the model: "
            f"{' '.join(str(exc).split())[:200]}",
            location="spec.model.lora.target_modules",
            hint=f"pick from the model's Linear modules: {', '.join(linear)}",
        ) from None


def count_parameters(module: torch.nn.Module) -> ParamCounts:
    """Trainable and total parameter counts of a (peft or plain) model, and its vocabulary size.

    peft models count through ``get_nb_trainable_parameters`` (4-bit weights unpacked).
    """
    if hasattr(module, "get_nb_trainable_parameters"):
        trainable, total = module.get_nb_trainable_parameters()
    else:
        seen: set[int] = set()
        trainable = total = 0
        for p in module.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
            trainable += p.numel() if p.requires_grad else 0
    return ParamCounts(int(trainable), int(total), int(module.get_input_embeddings().weight.shape[0]))


class LitHFCausalLM(LitGPT):
    """LightningModule for a Hugging Face causal LM; training, validation, the AdamW groups and
    the warmup + cosine schedule are :class:`LitGPT`'s (only parameters with
    ``requires_grad`` reach the optimizer, so LoRA trains the adapters only).

    With LoRA, checkpoints hold the trainable (adapter) tensors only and the frozen base is
    reloaded from ``hf_path`` on resume (``strict_loading`` is off; missing adapter tensors
    still raise).

    Args:
        spec: the training spec (``spec.model.hf_path`` set).
        accelerator: ``"cpu"`` or ``"gpu"`` (QLoRA refuses CPU).
    """

    def __init__(self, spec: TrainingSpec, accelerator: str = "cpu"):
        LightningModule.__init__(self)  # LitGPT.__init__ would build the byte-level GPT
        m, t = spec.model, spec.trainer
        self.save_hyperparameters(
            {
                "hf_path": m.hf_path,
                "lora": None if m.lora is None else m.lora.model_dump(mode="json"),
                "load_in_4bit": m.load_in_4bit,
                "block_size": m.block_size,
                "learning_rate": t.learning_rate,
                "weight_decay": t.weight_decay,
                "warmup_steps": t.warmup_steps,
                "max_steps": t.max_steps,
                "cpu_adam": t.offload_optimizer != "none",
                "lr_schedule": t.lr_schedule,
                "min_lr_ratio": t.min_lr_ratio,
            }
        )
        self.model = load_causal_lm(m, t.precision, accelerator)
        self.counts = count_parameters(self.model)
        """Trainable / total parameters and vocabulary size (see :class:`ParamCounts`)."""
        self.adapters_only = m.lora is not None
        self.strict_loading = not self.adapters_only
        self.last_val_step: int | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, V)`` for token ids ``(B, T)``."""
        return self.model(input_ids=idx).logits

    def _trainable_keys(self) -> set[str]:
        return {name for name, p in self.named_parameters() if p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """With LoRA keep only the trainable (adapter) tensors in the checkpoint's state dict."""
        if self.adapters_only and "state_dict" in checkpoint:
            keep = self._trainable_keys()
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """With LoRA, require every adapter tensor in the checkpoint (loading is not strict).

        Raises:
            ConfigError: the checkpoint lacks adapter tensors (different ``lora`` settings).
        """
        if self.adapters_only and "state_dict" in checkpoint:
            missing = sorted(self._trainable_keys() - set(checkpoint["state_dict"]))
            if missing:
                raise ConfigError(
                    f"the checkpoint lacks {len(missing)} LoRA tensor(s) of this model (e.g. {missing[0]})",
                    location="spec.model.lora",
                    hint="resume with the lora settings the checkpoint was written with, or set "
                    "checkpoint.resume: never",
                )
