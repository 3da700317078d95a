"""TrainingSpec: what to train, independent of where it runs.

A spec is loaded from YAML by :mod:`jobgen.load` and validated here (pydantic v2,
``extra="forbid"``, frozen). No I/O happens in this module. Units are in field names
(``time_limit_min``) or stated in the field description.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A dotted import path of a class: ``package.module.Class`` (at least one dot, identifiers only).
CLASS_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

#: GPT size presets: name -> (n_layer, n_head, d_model, block_size). Byte-level vocabulary
#: (256), so parameter counts are a little below the GPT-2 models of the same shape.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 4, "n_head": 4, "d_model": 128, "block_size": 256},
    "mini": {"n_layer": 6, "n_head": 6, "d_model": 384, "block_size": 256},
    "gpt2-124m": {"n_layer": 12, "n_head": 12, "d_model": 768, "block_size": 1024},
    "gpt2-350m": {"n_layer": 24, "n_head": 16, "d_model": 1024, "block_size": 1024},
    "gpt2-774m": {"n_layer": 36, "n_head": 20, "d_model": 1280, "block_size": 1024},
    "gpt2-1.5b": {"n_layer": 48, "n_head": 25, "d_model": 1600, "block_size": 1024},
}

Strategy = Literal["ddp", "fsdp", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"]
Precision = Literal["auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "transformer-engine"]
OffloadDevice = Literal["none", "cpu", "nvme"]


def check_shell_safe(value: str) -> str:
    """Reject NUL and newlines: a newline inside quotes still starts a new ``#SBATCH`` line.

    Raises:
        ValueError: the value holds a newline, carriage return or NUL.
    """
    if any(c in value for c in "\n\r\x00"):
        raise ValueError("newlines, carriage returns and NUL bytes are not allowed in values that reach a shell")
    return value


def check_env(env: dict[str, str]) -> dict[str, str]:
    """Validate an environment mapping (POSIX names, shell-safe values); returned sorted by name.

    Raises:
        ValueError: a key is not ``[A-Za-z_][A-Za-z0-9_]*`` or a value holds a newline/NUL.
    """
    for key, value in env.items():
        if not ENV_KEY_RE.match(key):
            raise ValueError(f"environment variable name {key!r} is not a valid name ([A-Za-z_][A-Za-z0-9_]*)")
        check_shell_safe(value)
    return dict(sorted(env.items()))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraSpec(_Model):
    """LoRA adapters (Hugging Face peft) on a Hugging Face model: only the adapters train."""

    r: int = Field(default=8, ge=1, le=4096, description="Rank of each adapter (the inner dimension of the A: in x r and B: r x out matrices).")
    alpha: float = Field(default=16.0, gt=0.0, description="LoRA scaling numerator: the adapter output is multiplied by ``alpha / r``.")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout probability on the adapter input.")
    target_modules: tuple[str, ...] = Field(default=("q_proj", "v_proj"), description=(
        "Names (last name component) of the Linear modules that get adapters, e.g. ``q_proj``."
    ))

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or any(not name.strip() for name in value):
            raise ValueError("give at least one module name, e.g. [q_proj, v_proj]")
        return value


def check_class_path(value: str) -> str:
    """The shape of a dotted class path (``pkg.mod.Class``); nothing is imported.

    Raises:
        ValueError: not identifiers joined by dots, or no dot at all.
    """
    if not CLASS_PATH_RE.match(value):
        raise ValueError(
            f"{value!r} is not a dotted class path; give the module and the class, e.g. my_pkg.models.MyModule"
        )
    return value


def _check_json_value(value: Any, where: str) -> Any:
    """``value`` with every mapping sorted by key, if it is plain JSON (null, bool, int, finite
    float, str, list, str-keyed mapping); spec.json must hold it as is."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a finite number (JSON has no NaN or infinity)")
        return value
    if isinstance(value, (list, tuple)):
        return [_check_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise ValueError(f"{where}: key {key!r} is not a string (JSON object keys are strings)")
        return {k: _check_json_value(value[k], f"{where}.{k}") for k in sorted(value)}
    raise ValueError(
        f"{where}: a {type(value).__name__} is not a JSON value; use null, true/false, numbers, strings, lists "
        "and mappings (quote dates and other YAML types)"
    )


class ClassSpec(_Model):
    """Your own class, in LightningCLI's convention: ``class_path`` + ``init_args``.

    ``model: {class_path: my_pkg.models.MyModule, init_args: {hidden: 64}}`` names a
    ``LightningModule``; ``data: {class_path: ..., init_args: {...}}`` a ``LightningDataModule``.
    Rendering never imports them (only the shape of the path is checked); ``jobgen validate
    --import`` and ``jobgen submit`` import them and bind ``init_args`` to the class's signature,
    and the entrypoint instantiates them with jsonargparse (what LightningCLI uses), so nested
    ``{class_path, init_args}`` values and type checks work as in LightningCLI.
    """

    class_path: str = Field(description=(
        "Dotted import path of the class, e.g. ``my_pkg.models.MyModule``; importable on every node\n"
        "(installed, or on PYTHONPATH)."
    ))
    init_args: dict[str, Any] = Field(default={}, description=(
        "Keyword arguments of the class's ``__init__`` (JSON values; nested ``{class_path,\n"
        "init_args}`` mappings are instantiated too). A data module whose ``__init__`` takes\n"
        "``batch_size`` gets ``trainer.micro_batch_size``: leave ``batch_size`` out (or equal to it)."
    ))

    @field_validator("class_path")
    @classmethod
    def _class_path_shape(cls, value: str) -> str:
        return check_class_path(value)

    @field_validator("init_args")
    @classmethod
    def _init_args_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not key.isidentifier():
                raise ValueError(f"init_args key {key!r} is not a Python argument name")
        return _check_json_value(value, "init_args")


def field_error(model: type[BaseModel], loc: tuple[str | int, ...], message: str, value: Any) -> ValidationError:
    """A ValidationError at ``loc`` (a field path below ``model``), for a rule a model validator
    checks across fields: pydantic prefixes the location like any field error, so the user sees
    the path of the field to change rather than the spec's root."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": message}), loc=loc, input=value)
    return ValidationError.from_exception_data(model.__name__, [detail])


def _user_or_builtin(value: Any) -> str:
    """Which branch of ``model``/``data`` a value is: a mapping with ``class_path`` is a
    :class:`ClassSpec`, anything else the built-in spec (so errors come from one branch)."""
    if isinstance(value, ClassSpec) or (isinstance(value, dict) and "class_path" in value):
        return USER_CLASS_TAG
    return BUILTIN_TAG


#: Tags of the ``model``/``data`` unions. pydantic puts them into error locations
#: (``model.<tag>.field``); :mod:`jobgen.load` drops them from the paths it prints.
USER_CLASS_TAG = "class-path-branch"
BUILTIN_TAG = "built-in-branch"


#: ModelSpec fields that are left out of the serialised spec while at their defaults, so that
#: specs without them keep the resolved spec files (and hashes) they had before the fields existed.
_HF_MODEL_FIELDS = {"hf_path": None, "lora": None, "load_in_4bit": False}
_GPT_SIZE_FIELDS = ("n_layer", "n_head", "d_model")
_HF_DEFAULT_BLOCK_SIZE = 512


def _omit_defaults(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if not (k in defaults and v == defaults[k])}


class ModelSpec(_Model):
    """The model: the built-in byte-level GPT (vocabulary of 256 bytes), or a Hugging Face
    causal language model loaded from a local directory (``hf_path``), optionally with LoRA.

    GPT: give a ``preset`` or explicit sizes; explicit sizes override the preset's values.
    Hugging Face: give ``hf_path`` (and no preset or sizes; ``block_size`` is the training
    sequence length, default 512).
    """

    preset: Literal["tiny", "mini", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"] | None = Field(default="tiny", description=(
        "Size preset (see MODEL_PRESETS); ``null`` when all four sizes are given explicitly."
    ))
    n_layer: int | None = Field(default=None, ge=1, le=256, description="Number of transformer blocks.")
    n_head: int | None = Field(default=None, ge=1, le=256, description="Attention heads per block; must divide d_model.")
    d_model: int | None = Field(default=None, ge=8, le=65536, description="Embedding / residual width (features).")
    block_size: int = Field(ge=8, le=131072, description="Context length in tokens (bytes for the GPT; training sequence length for ``hf_path``).")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout probability on attention and MLP outputs.")
    hf_path: str | None = Field(default=None, description=(
        "Local directory of a Hugging Face causal LM (``config.json`` + weights, as written by\n"
        "``save_pretrained``); loaded with ``local_files_only=True`` (never downloads). Excludes\n"
        "``preset`` and the GPT sizes."
    ))
    lora: LoraSpec | None = Field(default=None, description="LoRA adapters for the ``hf_path`` model (peft); ``null``: full fine-tuning.")
    load_in_4bit: bool = Field(default=False, description=(
        "QLoRA: load the ``hf_path`` model in 4-bit NF4 (bitsandbytes) and train LoRA adapters on\n"
        "it. Needs ``lora`` and CUDA GPUs (refused on CPU profiles)."
    ))

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("hf_path") is not None:
            given = [k for k in ("preset", *_GPT_SIZE_FIELDS) if data.get(k) is not None]
            if given:
                raise ValueError(
                    f"hf_path and {'/'.join(given)} are mutually exclusive: the Hugging Face model's "
                    "config.json sets its sizes; remove " + ", ".join(given) + " (or remove hf_path)"
                )
            return {"block_size": _HF_DEFAULT_BLOCK_SIZE, **data, "preset": None}
        explicit = all(data.get(k) is not None for k in (*_GPT_SIZE_FIELDS, "block_size"))
        preset = data.get("preset", None if explicit else "tiny")
        if isinstance(preset, str) and preset in MODEL_PRESETS:
            given = {k: v for k, v in data.items() if v is not None or k == "preset"}
            return {**MODEL_PRESETS[preset], **given, "preset": preset}
        if "preset" not in data:
            return {**data, "preset": None}
        return data

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSpec:
        if self.hf_path is None:
            missing = [k for k in _GPT_SIZE_FIELDS if getattr(self, k) is None]
            if missing:
                raise ValueError(
                    f"{', '.join(missing)} missing: with preset null give n_layer, n_head, d_model and "
                    "block_size (or a preset, or hf_path for a Hugging Face model)"
                )
            if self.lora is not None or self.load_in_4bit:
                raise ValueError(
                    "lora and load_in_4bit apply to Hugging Face models only; set hf_path (or remove them)"
                )
            if self.d_model % self.n_head:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_head={self.n_head}; "
                    "pick n_head so that d_model / n_head is a whole head dimension"
                )
        elif self.load_in_4bit and self.lora is None:
            raise ValueError(
                "load_in_4bit (QLoRA) trains LoRA adapters on a frozen 4-bit model: add a lora section "
                "(e.g. lora: {r: 8, target_modules: [q_proj, v_proj]})"
            )
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        if self.hf_path is None:
            return _omit_defaults(data, _HF_MODEL_FIELDS)
        return _omit_defaults(data, dict.fromkeys(_GPT_SIZE_FIELDS))

    @property
    def is_hf(self) -> bool:
        """Whether this is a Hugging Face model (``hf_path`` set) rather than the built-in GPT."""
        return self.hf_path is not None

    @property
    def n_params(self) -> int:
        """Parameter count of the GPT (tied input/output embedding, biases and LayerNorms
        included). 0 for a Hugging Face model: its size is known only once the entrypoint has
        read its config (the render path does no I/O)."""
        if self.hf_path is not None:
            return 0
        d, v = self.d_model, 256
        per_block = 12 * d * d + 13 * d  # qkv+proj (4d^2+4d), mlp (8d^2+5d), 2 LayerNorms (4d)
        return v * d + self.block_size * d + self.n_layer * per_block + 2 * d


#: TrainerSpec fields left out of the serialised spec while at their defaults (resolved spec
#: files and hashes of specs without them stay as they were).
_TRAINER_OPTIONAL_FIELDS = {
    "ddp_static_graph": False,
    "ddp_gradient_as_bucket_view": False,
    "fsdp_state_dict_type": "sharded",
    "tensorboard": False,
    "max_epochs": None,
    "gradient_clip_algorithm": "norm",
    "gradient_accumulation_schedule": None,
    "find_unused_parameters": False,
    "sync_batchnorm": False,
    "deterministic": False,
    "benchmark": None,
    "num_sanity_val_steps": 2,
    "profiler": None,
    "fsdp_auto_wrap_policy": None,
    "fsdp_activation_checkpointing_policy": None,
    "fsdp_backward_prefetch": None,
    "fsdp_forward_prefetch": False,
    "fsdp_limit_all_gathers": True,
}

#: TrainerSpec fields that are FSDP options (refused with other strategies when not at their defaults).
_FSDP_ONLY_FIELDS = ("fsdp_auto_wrap_policy", "fsdp_activation_checkpointing_policy", "fsdp_backward_prefetch",
                     "fsdp_forward_prefetch", "fsdp_limit_all_gathers")
#: TrainerSpec fields of jobgen's own optimiser (AdamW + warmup + cosine) for the built-in models;
#: a ``class_path`` model brings its own ``configure_optimizers``.
BUILTIN_OPTIMIZER_FIELDS = ("learning_rate", "warmup_steps", "weight_decay")

_DATA_FORMAT_FIELDS = {"format": "text", "token_dtype": None, "vocab_size": None, "tokenizer_path": None}


class DataSpec(_Model):
    """Training data: local text read as raw bytes (``format: text``, byte-level tokens, no
    tokenizer), pre-tokenized token files (``tokens``) or JSONL instruction data (``jsonl``).
    Nothing is ever downloaded."""

    paths: tuple[str, ...] = Field(default=(), description=(
        "Local files, directories (read recursively) or glob patterns. ``text``: any files; empty:\n"
        "the Python standard library source of the running interpreter (``*.py``, site-packages\n"
        "excluded). ``tokens``: ``*.bin`` files; ``jsonl``: ``*.jsonl`` files (required for both)."
    ))
    val_fraction: float = Field(default=0.05, gt=0.0, le=0.5, description=(
        "Fraction held out for validation, deterministic: whole byte blocks (``text``), the last\n"
        "tokens of the stream (``tokens``), every ``round(1/val_fraction)``-th record (``jsonl``)."
    ))
    max_bytes: int | None = Field(default=None, ge=4096, description=(
        "``text`` only: upper bound on bytes read from ``paths`` (files in sorted order); ``null``:\n"
        "no bound."
    ))
    format: Literal["text", "tokens", "jsonl"] = Field(default="text", description=(
        "``text``: raw bytes (built-in GPT only). ``tokens``: flat little-endian token ids\n"
        "(``uint16``/``uint32``), memory-mapped. ``jsonl``: one JSON object per line with\n"
        "``instruction``, optional ``input`` and ``output`` (alpaca); prompt tokens are masked out of\n"
        "the loss."
    ))
    token_dtype: Literal["uint16", "uint32"] | None = Field(default=None, description=(
        "``tokens``: element type of the ``.bin`` files; ``null``: read ``dtype`` from the sidecar\n"
        "``meta.json`` next to the files."
    ))
    vocab_size: int | None = Field(default=None, ge=1, description=(
        "``tokens``: vocabulary the files were encoded with (checked <= the model's vocabulary);\n"
        "``null``: ``vocab_size`` of the sidecar ``meta.json``, if any. Token ids are checked too."
    ))
    tokenizer_path: str | None = Field(default=None, description=(
        "``jsonl``: local directory of a Hugging Face tokenizer (``save_pretrained`` output),\n"
        "loaded with ``local_files_only=True``; ``null``: ``model.hf_path``."
    ))

    @field_validator("paths")
    @classmethod
    def _paths_shell_safe(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            check_shell_safe(path)
        return value

    @model_validator(mode="after")
    def _format_rules(self) -> DataSpec:
        if self.format != "text":
            if not self.paths:
                raise ValueError(f"format {self.format!r} needs paths (the default stdlib source is text)")
            if self.max_bytes is not None:
                raise ValueError(f"max_bytes applies to format 'text' only (format is {self.format!r})")
        if self.format != "tokens" and (self.token_dtype is not None or self.vocab_size is not None):
            raise ValueError("token_dtype and vocab_size apply to format 'tokens' only")
        if self.format != "jsonl" and self.tokenizer_path is not None:
            raise ValueError("tokenizer_path applies to format 'jsonl' only")
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        return _omit_defaults(handler(self), _DATA_FORMAT_FIELDS)


class TrainerSpec(_Model):
    """How to train: strategy, precision, batch arithmetic, optimisation and logging."""

    strategy: Strategy = Field(default="ddp", description="Distributed strategy: ``ddp``, ``fsdp`` or DeepSpeed ZeRO ``deepspeed_stage_1/2/3``.")
    offload_optimizer: OffloadDevice = Field(default="none", description="DeepSpeed: where optimizer states live (``cpu`` or ``nvme``; nvme needs stage 3).")
    offload_params: OffloadDevice = Field(default="none", description="Parameter offload: DeepSpeed stage 3 (``cpu``/``nvme``) or FSDP (``cpu``).")
    nvme_path: str | None = Field(default=None, description="Local NVMe directory for ``nvme`` offload (required when either offload is nvme).")
    fsdp_sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"] = Field(default="FULL_SHARD", description=(
        "FSDP sharding strategy (used only when ``strategy: fsdp``)."
    ))
    activation_checkpointing: bool = Field(default=False, description=(
        "FSDP: recompute each transformer block's activations in the backward pass instead of\n"
        "keeping them (less memory, about one extra forward pass of compute). ``strategy: fsdp`` only."
    ))
    fsdp_state_dict_type: Literal["sharded", "full"] = Field(default="sharded", description=(
        "FSDP checkpoints: ``sharded`` (a directory, one shard per rank: fast, no gather) or\n"
        "``full`` (one file gathered on rank 0: portable, slow and memory-hungry for large models;\n"
        "GPU only: gathering a full state dict segfaults on CPU ranks, LAB-NOTES)."
    ))
    ddp_static_graph: bool = Field(default=False, description=(
        "DDP: the set of parameters that get gradients is the same every step (lets DDP skip\n"
        "unused-parameter search and overlap better; torch ``DistributedDataParallel(static_graph)``)."
    ))
    ddp_gradient_as_bucket_view: bool = Field(default=False, description=(
        "DDP: gradients are views into the all-reduce buckets (saves one gradient-sized copy of\n"
        "memory; torch ``DistributedDataParallel(gradient_as_bucket_view)``)."
    ))
    precision: Precision = Field(default="auto", description=(
        "Numeric precision, in Lightning's names. ``auto`` is resolved at plan time from the\n"
        "profile (spec.json records the result): Ampere or newer GPUs -> ``bf16-mixed``, older GPUs\n"
        "-> ``16-mixed``, CPU -> ``32-true``. bf16 needs Ampere or newer GPUs;\n"
        "``transformer-engine`` (fp8 matmuls through NVIDIA Transformer Engine, bf16 weights) needs\n"
        "Hopper GPUs, the ``transformer_engine`` package on the nodes, and ``strategy: ddp``."
    ))
    micro_batch_size: int = Field(default=8, ge=1, description="Sequences per device (per data-parallel rank) per forward/backward pass.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro batches accumulated before each optimizer step.")
    global_batch_size: int | None = Field(default=None, ge=1, description=(
        "Sequences per optimizer step over all ranks. When given it must equal\n"
        "micro_batch_size x gradient_accumulation_steps x world size (checked at plan time)."
    ))
    max_steps: int | None = Field(default=1000, ge=1, description=(
        "Optimizer steps to train for; ``null`` (with ``max_epochs``): no step bound. With both,\n"
        "training stops at whichever comes first (Lightning's rule)."
    ))
    max_epochs: int | None = Field(default=None, ge=1, description=(
        "Epochs (passes over a ``class_path`` data module's training loader) to train for; the\n"
        "alternative to ``max_steps`` (give ``max_steps: null`` to train by epochs only). Needs\n"
        "``data.class_path``: the built-in data has no epochs of its own."
    ))
    learning_rate: float = Field(default=3e-3, gt=0.0, le=10.0, description="Peak learning rate (AdamW), reached after warmup, then cosine decay to 10%.")
    warmup_steps: int = Field(default=50, ge=0, description="Linear warmup length in optimizer steps.")
    weight_decay: float = Field(default=0.1, ge=0.0, description="AdamW decoupled weight decay (matrices only; no decay on biases, norms, embeddings).")
    gradient_clip_val: float | None = Field(default=1.0, gt=0.0, description=(
        "Clip the global gradient norm (or each value, see ``gradient_clip_algorithm``) to this value;\n"
        "``null`` disables clipping."
    ))
    gradient_clip_algorithm: Literal["norm", "value"] = Field(default="norm", description=(
        "``norm``: scale all gradients so that their global L2 norm is at most ``gradient_clip_val``;\n"
        "``value``: clamp each gradient element to +-``gradient_clip_val`` (not with DeepSpeed,\n"
        "whose ``gradient_clipping`` is a norm)."
    ))
    gradient_accumulation_schedule: dict[int, int] | None = Field(default=None, description=(
        "Per-epoch accumulation, ``{epoch: micro batches per optimizer step}`` from that epoch on,\n"
        "e.g. ``{0: 8, 5: 4}`` (Lightning's GradientAccumulationScheduler). Must start at epoch 0;\n"
        "``gradient_accumulation_steps`` is its epoch-0 value (the world's global batch at the\n"
        "start). Needs ``data.class_path``; not with DeepSpeed (its batch size is fixed in\n"
        "ds_config.json) nor with ``global_batch_size`` (the global batch changes by epoch)."
    ))
    find_unused_parameters: bool = Field(default=False, description=(
        "DDP: search the autograd graph for parameters that got no gradient every step (needed by\n"
        "models that skip parameters in some steps; costs a graph traversal per step). DDP only."
    ))
    sync_batchnorm: bool = Field(default=False, description=(
        "Replace BatchNorm layers by SyncBatchNorm: batch statistics over all ranks (Lightning's\n"
        "``sync_batchnorm``)."
    ))
    deterministic: bool = Field(default=False, description=(
        "Deterministic algorithms only (``torch.use_deterministic_algorithms``; an op without one\n"
        "raises). Slower; with CUDA it also needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in ``env``."
    ))
    benchmark: bool | None = Field(default=None, description=(
        "cuDNN autotuning (``torch.backends.cudnn.benchmark``); ``null``: Lightning's default\n"
        "(off, unless deterministic)."
    ))
    num_sanity_val_steps: int = Field(default=2, ge=-1, description=(
        "Validation micro batches run before training starts, to catch a broken validation step\n"
        "early (0: none, -1: the whole validation loader)."
    ))
    profiler: Literal["simple", "advanced", "pytorch"] | None = Field(default=None, description=(
        "Lightning profiler: ``simple`` (time per hook), ``advanced`` (cProfile per hook),\n"
        "``pytorch`` (torch.profiler); reports go to stdout and the log directory. ``null``: none."
    ))
    fsdp_auto_wrap_policy: tuple[str, ...] | None = Field(default=None, description=(
        "FSDP: dotted class paths of the submodules that become FSDP units (each is sharded and\n"
        "gathered on its own), e.g. ``[my_pkg.models.Block]``. ``null``: jobgen's GPT ``Block`` for\n"
        "the built-in GPT; the whole model as one unit for a ``class_path`` model."
    ))
    fsdp_activation_checkpointing_policy: tuple[str, ...] | None = Field(default=None, description=(
        "FSDP: dotted class paths of the submodules whose activations are recomputed in the\n"
        "backward pass. ``null``: with ``activation_checkpointing: true``, jobgen's GPT ``Block``\n"
        "(built-in GPT only; a ``class_path`` model must name its classes here)."
    ))
    fsdp_backward_prefetch: Literal["BACKWARD_PRE", "BACKWARD_POST"] | None = Field(default=None, description=(
        "FSDP: when to gather the next unit's parameters in the backward pass (``BACKWARD_PRE``:\n"
        "before the current unit's gradient, more overlap and memory); ``null``: torch's default."
    ))
    fsdp_forward_prefetch: bool = Field(default=False, description=(
        "FSDP: gather the next unit's parameters during the current unit's forward pass (helps\n"
        "CPU-bound models with a static graph)."
    ))
    fsdp_limit_all_gathers: bool = Field(default=True, description=(
        "FSDP: limit parameter all-gathers in flight (rate limiter; bounds memory). torch's default."
    ))
    seed: int = Field(default=1337, ge=0, le=2**32 - 1, description="Seed for model initialisation and data order (same seed -> same run).")
    val_check_interval: int = Field(default=100, ge=1, description="Validate every N optimizer steps (and once at the end).")
    limit_val_batches: int = Field(default=20, ge=1, description="Validation micro batches per rank per validation run.")
    log_every_n_steps: int = Field(default=10, ge=1, description=(
        "Write metrics (loss, learning rate, tokens/s, samples/s, MFU on GPUs, peak memory) every\n"
        "N optimizer steps."
    ))
    tensorboard: bool = Field(default=False, description=(
        "Also write TensorBoard event files (``<run_dir>/logs/version_<n>/tensorboard/``) beside\n"
        "the CSV metrics, which are always written; needs the ``tensorboard`` package on the nodes."
    ))

    @field_validator("nvme_path")
    @classmethod
    def _nvme_shell_safe(cls, value: str | None) -> str | None:
        return None if value is None else check_shell_safe(value)

    @field_validator("fsdp_auto_wrap_policy", "fsdp_activation_checkpointing_policy")
    @classmethod
    def _class_paths(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("give at least one class path, or null for the default")
        for path in value:
            check_class_path(path)
        return tuple(sorted(set(value)))

    @field_validator("gradient_accumulation_schedule")
    @classmethod
    def _schedule(cls, value: dict[int, int] | None) -> dict[int, int] | None:
        if value is None:
            return None
        bad = {k: v for k, v in value.items() if k < 0 or v < 1}
        if bad:
            raise ValueError(f"epochs must be >= 0 and accumulation factors >= 1, got {bad}")
        if 0 not in value:
            raise ValueError(
                f"the schedule must start at epoch 0 (got epochs {sorted(value)}); e.g. {{0: 8, 5: 4}}"
            )
        return dict(sorted(value.items()))

    @model_validator(mode="before")
    @classmethod
    def _accumulation_from_schedule(cls, data: Any) -> Any:
        # gradient_accumulation_steps is the schedule's epoch-0 value: one number for the batch rules
        if isinstance(data, dict) and isinstance(data.get("gradient_accumulation_schedule"), dict):
            schedule = data["gradient_accumulation_schedule"]
            first = schedule.get(0, schedule.get("0"))
            given = data.get("gradient_accumulation_steps")
            if first is not None and given is not None and given != first:
                raise ValueError(
                    f"gradient_accumulation_steps={given!r} but gradient_accumulation_schedule starts with {first!r} "
                    "at epoch 0; remove gradient_accumulation_steps (the schedule's epoch-0 value is used)"
                )
            if first is not None:
                return {**data, "gradient_accumulation_steps": first}
        return data

    @model_validator(mode="after")
    def _offload_rules(self) -> TrainerSpec:
        # Rules DeepSpeed's own validator misses (LAB-NOTES): offload_param on stage < 3,
        # NVMe offload without a path.
        ds_stage = int(self.strategy[-1]) if self.strategy.startswith("deepspeed") else None
        if self.offload_params != "none":
            if self.strategy == "fsdp":
                if self.offload_params != "cpu":
                    raise ValueError("FSDP can offload parameters to 'cpu' only; set offload_params: cpu")
            elif ds_stage != 3:
                raise ValueError(
                    f"offload_params={self.offload_params!r} needs strategy deepspeed_stage_3 or fsdp "
                    f"(got {self.strategy!r}); parameters are only partitioned under ZeRO-3"
                )
        if self.offload_optimizer != "none" and ds_stage is None:
            raise ValueError(
                f"offload_optimizer={self.offload_optimizer!r} is a DeepSpeed option "
                f"(strategy is {self.strategy!r}); use a deepspeed_stage_* strategy or set it to 'none'"
            )
        if "nvme" in (self.offload_optimizer, self.offload_params):
            if ds_stage != 3:
                raise ValueError("NVMe offload needs strategy deepspeed_stage_3 (ZeRO-Infinity)")
            if not self.nvme_path:
                raise ValueError("NVMe offload needs nvme_path: a directory on a local NVMe drive")
        if self.activation_checkpointing and self.strategy != "fsdp":
            raise ValueError(
                f"activation_checkpointing is applied through FSDP (strategy is {self.strategy!r}); "
                "use strategy fsdp or set activation_checkpointing: false"
            )
        if self.strategy != "ddp" and (self.ddp_static_graph or self.ddp_gradient_as_bucket_view):
            raise ValueError(
                f"ddp_static_graph / ddp_gradient_as_bucket_view are DDP options (strategy is {self.strategy!r}); "
                "remove them or use strategy ddp"
            )
        if self.fsdp_state_dict_type != "sharded" and self.strategy != "fsdp":
            raise ValueError(
                f"fsdp_state_dict_type is an FSDP option (strategy is {self.strategy!r}); remove it or use strategy fsdp"
            )
        if self.precision == "transformer-engine" and self.strategy != "ddp":
            raise ValueError(
                f"precision 'transformer-engine' (fp8) runs with strategy ddp in jobgen (strategy is "
                f"{self.strategy!r}); use ddp, or bf16-mixed with {self.strategy}"
            )
        if self.max_steps is not None and self.warmup_steps >= self.max_steps:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} must be smaller than max_steps={self.max_steps}"
            )
        if self.max_steps is None and self.max_epochs is None:
            raise ValueError("max_steps is null and max_epochs is not set: give max_steps, max_epochs or both")
        if self.find_unused_parameters and self.strategy != "ddp":
            raise ValueError(
                f"find_unused_parameters is a DDP option (strategy is {self.strategy!r}); remove it or use strategy ddp"
            )
        fsdp_set = [k for k in _FSDP_ONLY_FIELDS if getattr(self, k) != _TRAINER_OPTIONAL_FIELDS[k]]
        if fsdp_set and self.strategy != "fsdp":
            raise ValueError(
                f"{', '.join(fsdp_set)}: FSDP option(s) (strategy is {self.strategy!r}); remove them or use strategy fsdp"
            )
        if self.deepspeed_stage is not None:
            if self.gradient_clip_algorithm == "value":
                raise ValueError(
                    f"gradient_clip_algorithm 'value' with strategy {self.strategy!r}: DeepSpeed clips by norm only "
                    "(ds_config gradient_clipping); use gradient_clip_algorithm: norm, or strategy ddp/fsdp"
                )
            if self.gradient_accumulation_schedule is not None:
                raise ValueError(
                    f"gradient_accumulation_schedule with strategy {self.strategy!r}: DeepSpeed fixes the batch "
                    "(train_batch_size in ds_config.json) for the whole run; use gradient_accumulation_steps, or ddp/fsdp"
                )
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        return _omit_defaults(handler(self), _TRAINER_OPTIONAL_FIELDS)

    @property
    def deepspeed_stage(self) -> int | None:
        """ZeRO stage (1-3) when the strategy is DeepSpeed, else ``None``."""
        return int(self.strategy[-1]) if self.strategy.startswith("deepspeed") else None


class ResourcesSpec(_Model):
    """How much of the cluster the job asks for; unset fields take the profile's defaults."""

    nodes: int | None = Field(default=None, ge=1, description="Number of nodes (SLURM nodes, Kubernetes pods). Default: the profile's default_nodes.")
    devices_per_node: int | None = Field(default=None, ge=1, description=(
        "Processes (GPUs) per node. Default: all GPUs of a node (or the profile's CPU processes)."
    ))
    time_limit_min: int | None = Field(default=None, ge=1, description="Wall-clock limit in minutes. Default: the profile's time limit.")


class CheckpointSpec(_Model):
    """Checkpointing and resume."""

    every_n_steps: int = Field(default=100, ge=1, description="Save a checkpoint every N optimizer steps (plus ``last.ckpt`` and one at the end).")
    keep_last_k: int = Field(default=2, ge=1, description="Step checkpoints to keep (newest first); ``last.ckpt`` is kept in addition.")
    resume: Literal["auto", "never"] = Field(default="auto", description=(
        "``auto``: continue from the newest checkpoint in the run directory when one exists\n"
        "(what a requeued job needs); ``never``: always start from step 0."
    ))


class TrainingSpec(_Model):
    """A training job: model, data, trainer settings, resources, checkpointing and env."""

    name: str = Field(min_length=1, max_length=128, description="Job name; also the directory name under ``manifests/<profile>/`` and ``runs/``.")
    model: Annotated[
        Annotated[ModelSpec, Tag(BUILTIN_TAG)] | Annotated[ClassSpec, Tag(USER_CLASS_TAG)], Discriminator(_user_or_builtin)
    ] = Field(default_factory=lambda: ModelSpec.model_validate({}), description=(
        "The model to train: jobgen's built-in GPT / a Hugging Face model (ModelSpec), or your own\n"
        "LightningModule as ``{class_path, init_args}`` (ClassSpec)."
    ))
    data: Annotated[
        Annotated[DataSpec, Tag(BUILTIN_TAG)] | Annotated[ClassSpec, Tag(USER_CLASS_TAG)], Discriminator(_user_or_builtin)
    ] = Field(default=DataSpec(), validate_default=True, description=(
        "The training data: jobgen's formats (DataSpec), or your own LightningDataModule as\n"
        "``{class_path, init_args}`` (ClassSpec; needed by, and only with, a ``class_path`` model)."
    ))
    trainer: TrainerSpec = Field(default=TrainerSpec(), validate_default=True, description="Strategy, precision, batch sizes, optimisation.")
    resources: ResourcesSpec = Field(default=ResourcesSpec(), description="Nodes, devices per node and time limit.")
    checkpoint: CheckpointSpec = Field(default=CheckpointSpec(), description="Checkpoint cadence and resume behaviour.")
    env: dict[str, str] = Field(default={}, description=(
        "Extra environment variables for every rank (set after the profile's env). Values are\n"
        "written into the rendered files, so names that look like credentials (``*TOKEN*``,\n"
        "``*SECRET*``, ``*PASSWORD*``, ``*_API_KEY``, ...) are refused: use ``secrets``."
    ))
    secrets: tuple[str, ...] = Field(default=(), description=(
        "Names (never values) of environment variables that hold credentials, e.g.\n"
        "``[WANDB_API_KEY, HF_TOKEN]``; every rank gets them, no rendered file holds them. SLURM and\n"
        "local: ``jobgen submit`` takes each value from the environment it runs in and refuses\n"
        "(exit 2, nothing submitted) when one is unset; sbatch passes them to the job (its default\n"
        "``--export=ALL``; a profile's ``--export`` must keep them) and job.sbatch stops before\n"
        "``srun`` when one is missing. Kubernetes: each name must be mapped to a Secret by the\n"
        "profile's ``kubernetes.secret_env``."
    ))
    smoke: bool = Field(default=False, description=(
        "A smoke run, set by ``jobgen submit --smoke N`` together with ``trainer.max_steps: N``,\n"
        "``checkpoint.resume: never`` and the name ``<name>-smoke``: a cheap first run that writes\n"
        "no checkpoints (and resumes from none)."
    ))

    @field_validator("data")
    @classmethod
    def _data_fits_model(cls, value: DataSpec | ClassSpec, info: ValidationInfo) -> DataSpec | ClassSpec:
        model = info.data.get("model")
        if model is None:
            return value  # the model failed: its error is reported
        if isinstance(model, ClassSpec) and not isinstance(value, ClassSpec):
            raise ValueError(
                f"model.class_path ({model.class_path}) needs data.class_path: jobgen's data formats feed its own "
                "models' batches; give your LightningDataModule as data: {class_path: ..., init_args: {...}}"
            )
        if isinstance(value, ClassSpec) and not isinstance(model, ClassSpec):
            raise ValueError(
                f"data.class_path ({value.class_path}) needs model.class_path: the built-in GPT / Hugging Face models "
                "train on jobgen's data formats only; give your LightningModule as model: {class_path: ...}, or use "
                "a data format (text, tokens, jsonl)"
            )
        return value

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer_fits_model(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(info.data.get("model"), ClassSpec):
            return value
        if isinstance(value, TrainerSpec):  # the default (or a model instance): what it would serialise to
            value = value.model_dump(mode="json", exclude=set(BUILTIN_OPTIMIZER_FIELDS))
        if not isinstance(value, dict):
            return value
        given = [k for k in BUILTIN_OPTIMIZER_FIELDS if k in value]
        if given:
            raise ValueError(
                f"{', '.join(given)}: jobgen's optimiser settings for its built-in models; a model.class_path "
                "module brings its own configure_optimizers (and scheduler): remove them and set the learning "
                "rate in model.init_args"
            )
        # No jobgen warmup for a class_path model (its warmup_steps < max_steps rule does not apply).
        return {**value, "warmup_steps": 0}

    @field_validator("name")
    @classmethod
    def _name_is_a_directory_name(cls, value: str) -> str:
        check_shell_safe(value)
        if "/" in value or value in (".", "..") or value.startswith("-"):
            raise ValueError(
                "the job name becomes a directory name: it must not contain '/', start with '-', or be '.'/'..'"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_ok(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env(value)

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not ENV_KEY_RE.match(name):
                raise ValueError(f"environment variable name {name!r} is not a valid name ([A-Za-z_][A-Za-z0-9_]*); "
                                 "secrets lists names only, never values")
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return value

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # left out while empty/off: specs without them keep the spec.json (and hashes) they had
        data = handler(self)
        if not self.secrets:
            data = {k: v for k, v in data.items() if k != "secrets"}
        if not self.smoke:
            data = {k: v for k, v in data.items() if k != "smoke"}
        if self.user_code and isinstance(data.get("trainer"), dict):
            # jobgen's optimiser settings do not apply to a class_path model: not written
            data["trainer"] = {k: v for k, v in data["trainer"].items() if k not in BUILTIN_OPTIMIZER_FIELDS}
        return data

    @property
    def user_code(self) -> bool:
        """Whether the model (and so the data) is the user's own class (``class_path``)."""
        return isinstance(self.model, ClassSpec)

    def as_smoke(self, steps: int) -> TrainingSpec:
        """This spec as a smoke run (:meth:`smoke_doc`), validated again.

        Raises:
            pydantic.ValidationError: the changed spec breaks a rule (e.g. the name gets too long).
        """
        return TrainingSpec.model_validate(self.smoke_doc(steps))

    def smoke_doc(self, steps: int) -> dict[str, Any]:
        """This spec, as a document, changed into a smoke run of ``steps`` optimizer steps
        (``jobgen submit --smoke N``): name ``<name>-smoke``, ``max_steps: steps`` (no epoch
        bound), validation at most every ``steps`` steps, no checkpoints written or resumed
        (``smoke: true``, ``resume: never``), jobgen's warmup shortened to fit."""
        doc = self.model_dump(mode="json")
        t = doc["trainer"]
        t.update(max_steps=steps, max_epochs=None, val_check_interval=min(self.trainer.val_check_interval, steps))
        if not self.user_code:
            t["warmup_steps"] = min(self.trainer.warmup_steps, steps - 1)
        doc.update(name=f"{self.name}-smoke", smoke=True)
        doc["checkpoint"] = {**doc["checkpoint"], "resume": "never"}
        return doc

    @model_validator(mode="after")
    def _model_fits_data(self) -> TrainingSpec:
        m, d, t = self.model, self.data, self.trainer
        if self.smoke and self.checkpoint.resume != "never":
            raise field_error(TrainingSpec, ("checkpoint", "resume"), "smoke: true (a --smoke run) keeps no checkpoints "
                              "and resumes from none: it needs checkpoint.resume: never", self.checkpoint.resume)
        if isinstance(d, ClassSpec):
            batch = d.init_args.get("batch_size")
            if batch is not None and batch != t.micro_batch_size:
                raise field_error(TrainingSpec, ("data", "init_args", "batch_size"),
                    f"{batch!r} but trainer.micro_batch_size is {t.micro_batch_size}: jobgen passes "
                    "trainer.micro_batch_size to the data module (the global batch is computed from it); "
                    "remove data.init_args.batch_size and set trainer.micro_batch_size", batch)
        else:
            for key in ("max_epochs", "gradient_accumulation_schedule"):
                if getattr(t, key) is not None:
                    raise field_error(TrainingSpec, ("trainer", key),
                        f"{key} needs data.class_path (your LightningDataModule): jobgen's data formats have no "
                        "epochs of their own; use trainer.max_steps / gradient_accumulation_steps", getattr(t, key))
        if isinstance(m, ClassSpec):
            if t.strategy == "fsdp" and t.activation_checkpointing and t.fsdp_activation_checkpointing_policy is None:
                raise field_error(TrainingSpec, ("trainer", "activation_checkpointing"),
                    "with model.class_path, name the classes to recompute in trainer.fsdp_activation_checkpointing_policy "
                    "(the default policy is jobgen's GPT Block)", True)
            return self
        if m.is_hf and d.format == "text":
            raise ValueError(
                "model.hf_path with data.format 'text': raw bytes are the built-in GPT's tokens, not the "
                "Hugging Face model's; use data.format 'jsonl' (with its tokenizer) or 'tokens' (files "
                "encoded with the model's tokenizer)"
            )
        if d.format == "jsonl" and d.tokenizer_path is None and not m.is_hf:
            raise ValueError("data.format 'jsonl' needs data.tokenizer_path (or model.hf_path to use its tokenizer)")
        if m.is_hf and self.trainer.strategy != "ddp":
            raise ValueError(
                f"model.hf_path with trainer.strategy {self.trainer.strategy!r}: Hugging Face models run with "
                "strategy ddp in this version (FSDP/DeepSpeed wrapping of HF decoder layers is not wired up)"
            )
        return self
