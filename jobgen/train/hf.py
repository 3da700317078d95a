"""Hugging Face causal language models (transformers), LoRA (peft) and QLoRA (bitsandbytes).

Imported by :mod:`jobgen.train.run` only, and only for specs with ``model.hf_path``: jobgen's
render path never imports torch, transformers or peft.

Everything is loaded from local directories with ``local_files_only=True``: a job never
downloads weights or tokenizers. Shapes: ``B`` = micro batch size, ``T`` = ``block_size``,
``V`` = the model's vocabulary (rows of its input embedding).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from jobgen.errors import ConfigError, NotSupportedError
from jobgen.specs.training import ModelSpec, TrainingSpec
from jobgen.train.model import LitGPT

# Name components FSDP (torch.distributed.fsdp's FSDP_WRAPPED_MODULE) and activation
# checkpointing (checkpoint_wrapper's _CHECKPOINT_WRAPPED_MODULE) insert into parameter names.
_FSDP_PREFIX = "_fsdp_wrapped_module."
_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."

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


#: Strategies that flatten and shard the model's parameters across ranks (FSDP flat parameters,
#: ZeRO-3 partitions): a QLoRA model under them needs a float quant-storage dtype and is placed
#: on its device by the strategy, not by ``from_pretrained``.
PARAM_SHARDING_STRATEGIES = frozenset({"fsdp", "deepspeed_stage_3"})


@dataclass(frozen=True)
class QLoRALoad:
    """How ``from_pretrained`` loads a 4-bit (QLoRA) base model under a strategy.

    Attributes:
        bnb: keyword arguments of ``transformers.BitsAndBytesConfig`` (NF4, double quantisation,
            bf16 compute; with a parameter-sharding strategy also ``bnb_4bit_quant_storage``).
        dtype: ``from_pretrained(dtype=...)`` for the weights that stay unquantised (embeddings,
            norms, ``lm_head``); ``None`` keeps transformers' default.
        pin_to_local_device: load onto this rank's GPU (``device_map={"": LOCAL_RANK}``).
        prepare_kbit: run peft's ``prepare_model_for_kbit_training`` (which casts every
            non-4-bit parameter to fp32).
    """

    bnb: dict[str, Any]
    dtype: torch.dtype | None
    pin_to_local_device: bool
    prepare_kbit: bool


def qlora_load(strategy: str, on_gpu: bool = True) -> QLoRALoad:
    """The QLoRA loading recipe for ``trainer.strategy`` (``on_gpu``: the rank has a CUDA GPU).

    ddp, deepspeed_stage_1/2 keep a full replica per rank: the 4-bit weights are stored as uint8
    (bitsandbytes' default), the model is pinned to the rank's GPU (Lightning cannot ``.to()`` a
    4-bit model; on CPU it simply loads into memory) and prepared with peft's
    ``prepare_model_for_kbit_training`` (fp32 non-4-bit weights, gradient checkpointing on).

    fsdp and deepspeed_stage_3 flatten parameters into one tensor per unit, which must be a
    float dtype shared by every parameter in it (FSDP refuses integer and mixed dtypes). Source:
    bitsandbytes' "FSDP-QLoRA" guide (docs/source/fsdp_qlora.md): ``bnb_4bit_quant_storage`` =
    bf16 and the unquantised weights loaded in bf16 too; the strategy moves the shards to the
    GPU (no ``device_map`` pinning), and ``prepare_model_for_kbit_training`` is skipped because
    its fp32 up-cast would break the uniform bf16 dtype; :func:`load_causal_lm` turns on the
    gradient checkpointing it would have turned on. The LoRA adapters stay fp32 (peft's
    default) under every strategy; see :func:`load_causal_lm` for where their fp32 master copy
    lives. Rehearsed on 2 CPU ranks (bitsandbytes' CPU backend) by
    tests/entrypoint/test_hf_qlora.py.
    """
    bnb: dict[str, Any] = {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": torch.bfloat16,
    }
    if strategy in PARAM_SHARDING_STRATEGIES:
        return QLoRALoad({**bnb, "bnb_4bit_quant_storage": torch.bfloat16}, torch.bfloat16,
                         pin_to_local_device=False, prepare_kbit=False)
    return QLoRALoad(bnb, None, pin_to_local_device=on_gpu, prepare_kbit=True)


def _quantization_config(recipe: QLoRALoad) -> Any:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise NotSupportedError(
            "model.load_in_4bit needs the bitsandbytes package, which is not installed",
            location="spec.model.load_in_4bit",
            hint="pip install 'jobgen[qlora]' on the GPU nodes (CUDA only)",
        ) from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**recipe.bnb)


def load_causal_lm(
    model: ModelSpec, precision: str, accelerator: str = "cpu", strategy: str = "ddp"
) -> torch.nn.Module:
    """Load ``model.hf_path`` with ``AutoModelForCausalLM`` and add LoRA adapters if asked.

    Without ``lora`` every parameter trains (full fine-tuning). With ``lora``, peft's
    ``get_peft_model`` freezes the base model and adds adapters (A: in x r, B: r x out) to the
    ``target_modules``. With ``load_in_4bit`` the base is loaded in 4-bit NF4 (bitsandbytes) and
    placed and prepared as :func:`qlora_load` says for ``strategy`` (QLoRA; CUDA only).

    Raises:
        ConfigError: missing directory, no loadable model there, ``block_size`` above the
            model's ``max_position_embeddings``, LoRA target modules not in the model.
        NotSupportedError: ``load_in_4bit`` on CPU or without bitsandbytes.
    """
    from transformers import AutoModelForCausalLM

    assert model.hf_path is not None
    directory = _check_dir(model.hf_path, "spec.model.hf_path", "model")
    kwargs = _load_kwargs(model, precision, accelerator, strategy)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"cannot load a causal LM from {str(directory)!r}: {' '.join(str(exc).split())[:300]}",
            location="spec.model.hf_path",
            hint="the directory needs config.json and model weights as written by model.save_pretrained()",
        ) from None
    if model.load_in_4bit:
        keep_4bit_layers_in_autograd(hf_model)
    max_positions = getattr(hf_model.config, "max_position_embeddings", None)
    if isinstance(max_positions, int) and model.block_size > max_positions:
        raise ConfigError(
            f"block_size {model.block_size} exceeds the model's max_position_embeddings {max_positions}",
            location="spec.model.block_size",
            hint=f"set model.block_size to at most {max_positions}",
        )
    if model.lora is None:
        return hf_model
    return _with_lora(hf_model, model, strategy)


def _load_kwargs(model: ModelSpec, precision: str, accelerator: str, strategy: str) -> dict[str, Any]:
    """The keyword arguments of ``AutoModelForCausalLM.from_pretrained`` for ``model``: local files
    only, and either the dtype of ``precision`` or, with ``load_in_4bit``, the quantization config,
    dtype and device placement :func:`qlora_load` gives for ``strategy``.

    Raises:
        NotSupportedError: ``load_in_4bit`` on a rank without a CUDA GPU and without bitsandbytes'
            CPU backend.
    """
    kwargs: dict[str, Any] = {"local_files_only": True}
    if model.load_in_4bit:
        on_gpu = accelerator == "gpu" and torch.cuda.is_available()
        if not on_gpu:
            from jobgen.planning.rules import BNB_CPU_MIN_VERSION, bitsandbytes_cpu_problem

            problem = bitsandbytes_cpu_problem()
            if problem is not None:
                raise NotSupportedError(
                    f"model.load_in_4bit (QLoRA) on a rank without a CUDA GPU needs bitsandbytes' CPU backend, but {problem}",
                    location="spec.model.load_in_4bit",
                    hint=f"pip install 'bitsandbytes>={BNB_CPU_MIN_VERSION}', remove load_in_4bit to train plain LoRA "
                    "adapters, or run on a GPU profile",
                )
        recipe = qlora_load(strategy, on_gpu)
        kwargs["quantization_config"] = _quantization_config(recipe)
        if recipe.dtype is not None:
            kwargs["dtype"] = recipe.dtype
        if recipe.pin_to_local_device:
            # The module is built before Lightning sets the CUDA device: the current device is
            # still 0 on every rank. Every jobgen launcher (torchrun, the SLURM script) exports LOCAL_RANK.
            kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    else:
        kwargs["dtype"] = _LOAD_DTYPE.get(precision, torch.float32)
    return kwargs


def _with_lora(hf_model: torch.nn.Module, model: ModelSpec, strategy: str) -> torch.nn.Module:
    """``hf_model`` with ``model.lora``'s adapters (peft's ``get_peft_model``), a 4-bit base first
    prepared as :func:`qlora_load` says for ``strategy``.

    Raises:
        ConfigError: LoRA target modules not in the model.
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if model.load_in_4bit:
        if qlora_load(strategy).prepare_kbit:
            hf_model = prepare_model_for_kbit_training(hf_model)
        else:
            # What prepare_model_for_kbit_training would switch on, without its fp32 up-cast: the
            # memory plan counts QLoRA activations as checkpointed (jobgen.planning.estimate_hf).
            hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
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


def keep_4bit_layers_in_autograd(module: torch.nn.Module) -> None:
    """Turn off bitsandbytes' CPU inference repacking on every 4-bit layer of ``module``.

    bitsandbytes (0.50.2: ``bnb.nn.Linear4bit.forward``) repacks a layer's 4-bit weight, in place,
    for its AVX512-BF16 CPU kernel on the first forward in eval mode without grad (a validation
    pass) when the layer's ``support_avx512bf16_for_cpu`` is set, which it is on CPUs with
    AVX512-BF16; every later forward, in training too, then runs through that kernel outside
    autograd, so backward loses the gradient to the layer's input (the base model's path). Seen
    on a Xeon with AVX512/AMX: under ddp the adapters trained on those wrong gradients, under FSDP
    and ZeRO backward failed ("All sharded parameters that received a gradient in the
    post-backward should use `_saved_grad_shard`", "'NoneType' object has no attribute 'view'").
    A training rank needs the layers differentiable, so the flag is cleared (an undocumented
    attribute: tests/entrypoint/test_hf_qlora.py checks the gradient across a validation pass).
    GPU ranks never take that path; clearing it there changes nothing.
    """
    import bitsandbytes as bnb

    for layer in module.modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            layer.support_avx512bf16_for_cpu = False


def decoder_layer_classes(module: torch.nn.Module) -> set[type[torch.nn.Module]]:
    """The classes FSDP wraps (and activation checkpointing recomputes) for a loaded model.

    Source: the model's own ``_no_split_modules`` (class names transformers declares for every
    ``PreTrainedModel`` whose instances must stay whole, e.g. ``["LlamaDecoderLayer"]``; peft
    keeps the base model inside), resolved against ``type(m)`` of the modules actually loaded,
    so no list of architectures lives in jobgen.

    Returns:
        the module classes named by any ``_no_split_modules`` in ``module``; empty when the
        model declares none (or none of its names is instantiated).
    """
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return {type(m) for m in module.modules() if type(m).__name__ in names}


def _trainable_leaf(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return next(module.children(), None) is None and isinstance(weight, torch.Tensor) and weight.requires_grad


def lora_wrap_policy(layer_classes: set[type[torch.nn.Module]] | None) -> Any:
    """FSDP auto-wrap policy for a LoRA model: ``layer_classes`` plus every leaf module whose
    weight trains (each LoRA ``lora_A`` / ``lora_B`` Linear becomes its own FSDP unit).

    FSDP flattens each unit into one tensor, which must hold a single dtype and a single
    ``requires_grad``: a decoder layer holding a frozen (4-bit storage or bf16) base beside its
    trainable fp32 adapters fails to wrap (``Must flatten tensors with uniform dtype``) or, with
    ``use_orig_params=True``, keeps gradient memory for the whole unit. With the adapters in
    units of their own every flat parameter is all-frozen or all-trainable and of one dtype.
    The rule is peft's ``fsdp_auto_wrap_policy`` (peft/utils/other.py; peft's "FSDP" guide),
    built here from torch's public ``CustomPolicy`` so that the spec's
    ``fsdp_auto_wrap_policy`` classes can stand in for the model's decoder layers (peft's reads
    them from ``_no_split_modules`` or an environment variable).

    Args:
        layer_classes: the decoder-layer classes to wrap (:func:`decoder_layer_classes`, or the
            spec's); ``None`` or empty: the adapters only (the rest is the root unit).

    Returns:
        a ``torch.distributed.fsdp.wrap.CustomPolicy`` (FSDP's ``auto_wrap_policy``).
    """
    from torch.distributed.fsdp.wrap import CustomPolicy

    classes = tuple(layer_classes or ())
    return CustomPolicy(lambda module: isinstance(module, classes) or _trainable_leaf(module))


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

    With LoRA, checkpoint files hold the trainable (adapter) tensors only and the frozen base is
    reloaded from ``hf_path`` on resume (``strict_loading`` is off; missing adapter tensors
    still raise). Per checkpoint format (see :meth:`on_save_checkpoint`): a single ``.ckpt``
    file (ddp, one process; FSDP ``full`` on GPU) is filtered to the adapters; an FSDP sharded
    directory keeps every tensor (each rank writes its own shard of the base too), as does a
    DeepSpeed directory (the engine writes the module and optimizer states itself).

    Args:
        spec: the training spec (``spec.model.hf_path`` set).
        accelerator: ``"cpu"`` or ``"gpu"`` (QLoRA refuses CPU).
        strategy: the strategy the run trains with when it is not ``spec.trainer.strategy`` (``ddp``
            on the single-device path, :func:`jobgen.train.speed.single_device`); ``None``: the spec's.
    """

    def __init__(self, spec: TrainingSpec, accelerator: str = "cpu", strategy: str | None = None):
        LightningModule.__init__(self)  # LitGPT.__init__ would build the byte-level GPT
        self._init_levers()
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
        # the strategy that runs (ddp on the single-device path: jobgen.train.speed.single_device)
        self.model = load_causal_lm(m, t.precision, accelerator, strategy or t.strategy)
        # from_pretrained returns the model in eval mode, and Lightning keeps the modes it finds
        # at fit (it only warns): without this, lora.dropout and the model's dropouts never apply.
        self.model.train()
        self.counts = count_parameters(self.model)
        """Trainable / total parameters and vocabulary size (see :class:`ParamCounts`)."""
        self.adapters_only = m.lora is not None
        self.strict_loading = not self.adapters_only
        self.last_val_step: int | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, V)`` for token ids ``(B, T)``."""
        return self.model(input_ids=idx).logits

    def parameter_groups(self) -> list[dict[str, Any]]:
        """:meth:`LitGPT.parameter_groups` without empty groups.

        With LoRA every trainable tensor is a Linear weight (``lora_A``/``lora_B``), so the
        no-decay group is empty; DeepSpeed's ZeRO optimizers drop empty groups, and the
        learning-rate schedule built over the two groups then fails on its first step.
        """
        return [group for group in super().parameter_groups() if group["params"]]

    def _trainable_keys(self) -> set[str]:
        # Names as in the state dict: without the prefixes FSDP and activation checkpointing add
        # to the wrapped submodules (their state-dict hooks strip them, named_parameters does not).
        return {name.replace(_FSDP_PREFIX, "").replace(_CHECKPOINT_PREFIX, "")
                for name, p in self.named_parameters() if p.requires_grad}

    def _state_dict_in_checkpoint(self) -> bool:
        """Whether the checkpoint's ``state_dict`` is loaded back as a (non-strict) state dict.

        Not with an FSDP *sharded* state dict: Lightning's ``FSDPStrategy.load_checkpoint`` asks
        torch.distributed.checkpoint for every key of the wrapped model, so the frozen base must
        be in the directory (reads the strategy's private ``_state_dict_type``, pinned in
        tests/entrypoint/test_lightning_api.py).
        """
        from lightning.pytorch.strategies import FSDPStrategy

        strategy = self.trainer.strategy
        return not (isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "sharded")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """With LoRA keep only the trainable (adapter) tensors in the checkpoint's state dict;
        the learning-rate schedule is recorded as :meth:`LitGPT.on_save_checkpoint` does.

        Skipped for FSDP sharded checkpoints (see :meth:`_state_dict_in_checkpoint`); DeepSpeed
        checkpoints have no ``state_dict`` here (Lightning leaves the module to the engine).
        """
        super().on_save_checkpoint(checkpoint)
        if self.adapters_only and "state_dict" in checkpoint and self._state_dict_in_checkpoint():
            keep = self._trainable_keys()
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """With LoRA, require every adapter tensor in the checkpoint (loading is not strict); then
        keep the run's learning-rate schedule as :meth:`LitGPT.on_load_checkpoint` does.

        Only where the checkpoint still carries its ``state_dict`` at this point (a ``.ckpt``
        file); FSDP-sharded and DeepSpeed directories were loaded by the strategy already
        (FSDP: every key of the model required; DeepSpeed: the engine's own module states).

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
        super().on_load_checkpoint(checkpoint)
