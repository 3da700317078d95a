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


_NODE_RANGE = re.compile(r"\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?")


class ResourcesSpec(_Model):
    """How much of the cluster the job asks for; unset fields take the profile's defaults."""

    nodes: Annotated[int, Field(ge=1)] | Annotated[str, Field(pattern=r"^[0-9]+:[0-9]+$")] | None = Field(default=None, description=(
        "Number of nodes (SLURM nodes, Kubernetes pods), or an elastic range ``\"min:max\"`` (e.g.\n"
        "``\"2:4\"``) for a Kubernetes PyTorchJob with an ``elasticPolicy`` (torchrun\n"
        "``--nnodes=min:max``; refused on SLURM, local and TrainJob profiles). jobgen reads an\n"
        "unquoted 2:4 as the range, not as YAML 1.1's base-60 number 124; quote it for other YAML\n"
        "tools. A range whose ends are equal is that fixed count. Default: the profile's default_nodes."
    ))
    devices_per_node: int | None = Field(default=None, ge=1, description=(
        "Processes (GPUs) per node. Default: all GPUs of a node (or the profile's CPU processes)."
    ))
    time_limit_min: int | None = Field(default=None, ge=1, description="Wall-clock limit in minutes. Default: the profile's time limit.")

    @field_validator("nodes", mode="before")
    @classmethod
    def _node_count_or_range(cls, value: Any) -> int | str | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError(f"nodes must be at least 1 (got {value})")
            return value
        match = _NODE_RANGE.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"{value!r} is neither a node count (e.g. 2) nor an elastic range \"min:max\" (e.g. \"2:4\")")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if low < 1:
            raise ValueError(f"the elastic range {value!r} starts below 1 node; give at least 1 as the minimum")
        if low > high:
            raise ValueError(f"the elastic range {value!r} has its minimum ({low}) above its maximum ({high}); write \"{high}:{low}\"")
        return low if low == high else f"{low}:{high}"

    @property
    def node_range(self) -> tuple[int, int] | None:
        """``(min, max)`` nodes of an elastic range (``nodes: "2:4"``); ``None`` for a fixed count."""
        if not isinstance(self.nodes, str):
            return None
        low, high = self.nodes.split(":")
        return int(low), int(high)


class CheckpointSpec(_Model):
    """Checkpointing and resume."""

    every_n_steps: int = Field(default=100, ge=1, description="Save a checkpoint every N optimizer steps (plus ``last.ckpt`` and one at the end).")
    keep_last_k: int = Field(default=2, ge=1, description="Step checkpoints to keep (newest first); ``last.ckpt`` is kept in addition.")
    resume: Literal["auto", "never"] = Field(default="auto", description=(
        "``auto``: continue from the newest checkpoint in the run directory when one exists\n"
        "(what a requeued job needs); ``never``: always start from step 0."
    ))


_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: TrainerSpec fields that still apply in command mode (``entrypoint`` set): they decide the
#: world, the DeepSpeed config and the ``--trainer.*`` arguments of a LightningCLI script.
#: Every other trainer field configures the built-in entrypoint only.
COMMAND_TRAINER_FIELDS = frozenset({
    "strategy", "precision", "micro_batch_size", "gradient_accumulation_steps", "global_batch_size",
    "offload_optimizer", "offload_params", "nvme_path", "gradient_clip_val",
})
#: TrainingSpec sections that configure the built-in entrypoint only (refused in command mode).
BUILTIN_SECTIONS = ("model", "data", "checkpoint")


class EntrypointSpec(_Model):
    """Command mode: run your own training script under jobgen's launch contracts instead of
    the bundled ``python -m jobgen.train``. Give ``module`` or ``script``.

    The ranks run in the directory ``jobgen submit`` runs in (local and SLURM; on SLURM it must
    be on a filesystem the nodes share) or in the image's working directory (Kubernetes), so a
    relative ``script`` and relative paths in ``args`` resolve there. Each rank finds its world
    in MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK (``init_process_group("env://")``
    works on every backend); DeepSpeed specs get ``PL_DEEPSPEED_CONFIG_PATH`` (the rendered
    ``ds_config.json``, an absolute path on the node).
    """

    module: str | None = Field(default=None, description=(
        "Python module to run as ``python -m MODULE`` (e.g. ``pkg.train``); importable on the\n"
        "nodes (``jobgen validate`` checks it is importable here)."
    ))
    script: str | None = Field(default=None, description=(
        "Python script to run as ``python SCRIPT``, relative to the ranks' working directory (the\n"
        "directory ``jobgen submit`` runs in; Kubernetes: the image's working directory) or absolute."
    ))
    args: tuple[str, ...] = Field(default=(), description=(
        "Arguments after the module/script, each passed as one argument (quoted by jobgen; no\n"
        "newlines), e.g. ``[fit, --config, configs/train.yaml]``."
    ))
    lightning_cli: bool = Field(default=False, description=(
        "The script is a LightningCLI script: jobgen appends ``--trainer.num_nodes``,\n"
        "``--trainer.devices``, ``--trainer.accelerator``, ``--trainer.strategy`` and\n"
        "``--trainer.precision`` from the world, and ``jobgen validate`` refuses a ``--config`` file\n"
        "whose ``trainer:`` section contradicts them."
    ))

    @field_validator("module")
    @classmethod
    def _module_name(cls, value: str | None) -> str | None:
        if value is not None and not _MODULE_RE.match(value):
            raise ValueError(f"{value!r} is not a Python module name (dotted identifiers, e.g. pkg.train)")
        return value

    @field_validator("script")
    @classmethod
    def _script_path(cls, value: str | None) -> str | None:
        if value is None:
            return value
        check_shell_safe(value)
        if not value.strip() or value.startswith("-"):
            raise ValueError(f"script {value!r} must be a file path (not empty, not starting with '-')")
        return value

    @field_validator("args")
    @classmethod
    def _args_shell_safe(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            check_shell_safe(arg)
        return value

    @model_validator(mode="after")
    def _one_target(self) -> EntrypointSpec:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of module (python -m MODULE) or script (python SCRIPT)")
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


#: A full git commit id (SHA-1: 40 hex digits; SHA-256 repositories: 64).
_COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
#: ``code.python_path``: a plain relative directory (it is placed into job.sbatch as shell text).
_SUBDIR_RE = re.compile(r"^[A-Za-z0-9._/-]*$")


class CodeGitSource(_Model):
    """Kubernetes: the code as one commit of a git repository, checked out in every pod before
    torchrun starts (the profile's image needs ``git`` and ``sh``)."""

    url: str = Field(min_length=1, description=(
        "URL every pod fetches (``https://...`` or ``ssh://...``); credentials are not\n"
        "written here (a public repository, or a URL the cluster's git setup can read)."
    ))
    ref: str = Field(description=(
        "The commit to check out: its full 40-hex id (64 for SHA-256 repositories), never a branch\n"
        "or tag (they move: a restarted pod would run other code). ``git rev-parse HEAD`` prints it."
    ))

    @field_validator("url")
    @classmethod
    def _shell_safe(cls, value: str) -> str:
        return check_shell_safe(value)

    @field_validator("ref")
    @classmethod
    def _full_commit(cls, value: str) -> str:
        if not _COMMIT_RE.match(value):
            raise ValueError(
                f"ref {value!r} is not a full commit id: a branch or tag moves, so a restarted pod would run other "
                "code; give the 40-hex commit (git rev-parse <branch>, e.g. git rev-parse HEAD)"
            )
        return value


class CodeSpec(_Model):
    """The user's code, shipped as an immutable snapshot (ARCHITECTURE.md, "User code").

    SLURM and local: at submit, ``git archive HEAD`` of the repository holding ``repo`` is
    extracted into ``<run dir>/code/<commit>/`` and put first on every rank's PYTHONPATH.
    Kubernetes: the image is the code, or ``git`` (every pod checks out one commit).
    Without a ``code`` section, a spec that runs the user's code (an ``entrypoint``, or a
    ``class_path`` model or data module) snapshots the repository holding the spec file (none
    when the spec is not in a git work tree); one of the built-in models and data does not.
    """

    repo: str = Field(default=".", min_length=1, description=(
        "A directory in the git work tree to snapshot, relative to the spec file; the whole\n"
        "repository holding it is snapshotted (its committed tree, ``git archive HEAD``)."
    ))
    python_path: str = Field(default="", description=(
        "Sub-directory of the repository put first on PYTHONPATH, e.g. ``src``; empty: the\n"
        "repository root."
    ))
    snapshot: bool = Field(default=True, description=(
        "``false``: no snapshot; the ranks import the code found when they start (as before)."
    ))
    git: CodeGitSource | None = Field(default=None, description=(
        "Kubernetes only: every pod checks out this commit into an emptyDir volume before torchrun\n"
        "starts and puts it first on PYTHONPATH (PyTorchJob and TrainJob). ``null``: the image is\n"
        "the code (pin it by digest, ``image: repo@sha256:...``)."
    ))

    @field_validator("repo")
    @classmethod
    def _repo_shell_safe(cls, value: str) -> str:
        return check_shell_safe(value)

    @field_validator("python_path")
    @classmethod
    def _relative_subdir(cls, value: str) -> str:
        parts = value.split("/")
        if not _SUBDIR_RE.match(value) or value.startswith("/") or ".." in parts:
            raise ValueError(
                f"python_path {value!r} must be a sub-directory of the repository: relative, without '..', of letters, "
                "digits and . _ - / only (e.g. src)"
            )
        return "/".join(p for p in parts if p not in ("", "."))


NotifyEvent = Literal["started", "requeued", "finished", "failed"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("started", "requeued", "finished", "failed")

#: Query parameter names (whole words, case-insensitive) that carry credentials in a webhook URL:
#: ``?token=``, ``?api_key=``, ``?apiKey=``, ``?sig=``, ``?X-Amz-Signature=``, ``?access_token=``.
_URL_SECRET_WORDS = frozenset({
    "token", "key", "apikey", "secret", "password", "passwd", "pass", "pwd", "auth", "authorization",
    "sig", "signature", "credential", "credentials", "session", "code",
})


def _url_secret_params(query: str) -> list[str]:
    """Names of query parameters in ``query`` whose name looks like a credential."""
    from urllib.parse import parse_qsl

    found = []
    for name, _ in parse_qsl(query, keep_blank_values=True):
        words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
        if set(re.split(r"[^a-z0-9]+", words)) & _URL_SECRET_WORDS or name.lower() in _URL_SECRET_WORDS:
            found.append(name)
    return found


class WebhookSpec(_Model):
    """An HTTP(S) endpoint that gets each notification as a JSON body (``POST``,
    ``Content-Type: application/json``). Credentials only by reference: the token is read from
    an environment variable on the node (``token_env``) and sent as ``Authorization: Bearer``."""

    url: str | None = Field(default=None, description=(
        "``http://`` or ``https://`` URL the JSON body is POSTed to. Written into spec.json, so it may\n"
        "not carry a credential: user:password@ and query parameters named like token/key/secret/\n"
        "sig are refused (use ``token_env``, or ``url_env`` for URLs that are secrets themselves)."
    ))
    url_env: str | None = Field(default=None, description=(
        "Name of an environment variable that holds the URL, for URLs that are credentials\n"
        "themselves (e.g. Slack incoming webhooks); must also be listed in the spec's ``secrets``.\n"
        "Exactly one of ``url`` and ``url_env``."
    ))
    token_env: str | None = Field(default=None, description=(
        "Name (never the value) of an environment variable holding a bearer token, sent as\n"
        "``Authorization: Bearer <token>``; must also be listed in the spec's ``secrets`` so that it\n"
        "reaches the ranks. ``null``: no Authorization header."
    ))

    @field_validator("url")
    @classmethod
    def _url_without_credentials(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from urllib.parse import urlsplit

        check_shell_safe(value)
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("the URL carries user:password@; it would be written into spec.json. Remove it and "
                             "put a token in an environment variable named by token_env (listed in secrets)")
        secret = _url_secret_params(parts.query)
        if secret:
            raise ValueError(f"the URL's query parameter(s) {', '.join(secret)} look like a credential; it would be "
                             "written into spec.json (and committed). Send the token by reference instead: "
                             "token_env: <VARIABLE> (listed in secrets), or give the whole URL by url_env")
        return value

    @field_validator("url_env", "token_env")
    @classmethod
    def _env_names(cls, value: str | None) -> str | None:
        if value is not None and not ENV_KEY_RE.match(value):
            raise ValueError(f"{value!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); "
                             "give the variable's NAME, never its value")
        return value

    @model_validator(mode="after")
    def _one_url(self) -> WebhookSpec:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url and url_env")
        return self


class NotifySpec(_Model):
    """Notifications about the run, sent by global rank zero: a webhook and/or a command, each
    getting the same JSON body (event, job, handle, step, losses, GPU-hours, time). A failed
    notification warns on stderr and never fails or stops training."""

    webhook: WebhookSpec | None = Field(default=None, description="POST the JSON body to this URL.")
    command: tuple[str, ...] | None = Field(default=None, description=(
        "Run this argv (no shell) on rank zero's node with the JSON body on stdin, e.g.\n"
        "``[/usr/local/bin/notify-team, --channel, ml]``."
    ))
    events: tuple[NotifyEvent, ...] = Field(default=NOTIFY_EVENTS, description=(
        "Which events to send: ``started`` (each start, also after a requeue), ``requeued`` (the job\n"
        "checkpointed and requeued itself on SLURM's signal), ``finished`` (max_steps reached),\n"
        "``failed`` (the entrypoint raised or stopped early)."
    ))
    timeout_s: float = Field(default=10.0, gt=0.0, le=120.0, description=(
        "Seconds one attempt may take (HTTP request or command); a failed attempt is retried once."
    ))

    @field_validator("command")
    @classmethod
    def _command_argv(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            if not value or not value[0].strip():
                raise ValueError("command needs at least the program, e.g. [/usr/local/bin/notify-team]")
            for arg in value:
                check_shell_safe(arg)
        return value

    @field_validator("events")
    @classmethod
    def _some_events(cls, value: tuple[NotifyEvent, ...]) -> tuple[NotifyEvent, ...]:
        if not value:
            raise ValueError(f"give at least one event of {', '.join(NOTIFY_EVENTS)} (or remove notify)")
        return value

    @model_validator(mode="after")
    def _a_target(self) -> NotifySpec:
        if self.webhook is None and self.command is None:
            raise ValueError("notify needs a webhook ({url: ...}) or a command ([argv ...]), or both")
        return self


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
    entrypoint: EntrypointSpec | None = Field(default=None, description=(
        "Command mode: run your own script (``module`` or ``script`` + ``args``) under jobgen's\n"
        "launchers instead of the built-in entrypoint; ``model``, ``data``, ``checkpoint`` and the\n"
        "trainer's optimisation fields do not apply then (refused when set). ``null``: the built-in\n"
        "entrypoint (``python -m jobgen.train``)."
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
    code: CodeSpec | None = Field(default=None, description=(
        "The user's code as an immutable snapshot (see CodeSpec); ``null``: for a spec that runs the\n"
        "user's code (``entrypoint``, or a ``class_path`` model/data), the git repository holding the\n"
        "spec file, snapshotted at submit (none when the spec is not in one); for the built-in models\n"
        "and data, no snapshot."
    ))
    notify: NotifySpec | None = Field(default=None, description=(
        "Notifications (webhook and/or command) on started / requeued / finished / failed, sent\n"
        "by rank zero; ``null``: none."
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
        # left out while empty/unset/off: specs without them keep the spec.json (and hashes) they had
        data = handler(self)
        if self.entrypoint is None:  # left out while unset, like secrets
            data = {k: v for k, v in data.items() if k != "entrypoint"}
        else:  # command mode: only what applies (spec.json reads back without "explicitly set" refusals)
            data = {k: v for k, v in data.items() if k not in BUILTIN_SECTIONS}
            data["trainer"] = {k: v for k, v in data["trainer"].items() if k in COMMAND_TRAINER_FIELDS}
        if self.user_code and isinstance(data.get("trainer"), dict):
            # jobgen's optimiser settings do not apply to a class_path model: not written
            data["trainer"] = {k: v for k, v in data["trainer"].items() if k not in BUILTIN_OPTIMIZER_FIELDS}
        omit = {key for key, empty in (("secrets", not self.secrets), ("code", self.code is None),
                                       ("notify", self.notify is None), ("smoke", not self.smoke)) if empty}
        return {k: v for k, v in data.items() if k not in omit}

    @property
    def user_code(self) -> bool:
        """Whether the model (and so the data) is the user's own class (``class_path``)."""
        return isinstance(self.model, ClassSpec)

    @property
    def runs_user_code(self) -> bool:
        """Whether the job runs the user's code (an ``entrypoint``, or a ``class_path`` model or
        data module) rather than only jobgen's built-in models and data: such specs are
        snapshotted at submit by default (:mod:`jobgen.snapshot`)."""
        return self.entrypoint is not None or self.user_code or isinstance(self.data, ClassSpec)

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
    def _command_mode(self) -> TrainingSpec:
        if self.entrypoint is None:
            return self
        target = f"module {self.entrypoint.module}" if self.entrypoint.module else f"script {self.entrypoint.script}"
        given = [name for name in BUILTIN_SECTIONS if name in self.model_fields_set]
        given += [f"trainer.{name}" for name in sorted(self.trainer.model_fields_set - COMMAND_TRAINER_FIELDS)]
        if given:
            raise ValueError(
                f"entrypoint is set (command mode: your {target} trains), so {', '.join(given)} would do nothing: "
                "they configure the built-in entrypoint only. Remove them and configure your script through "
                "entrypoint.args (e.g. [fit, --config, train.yaml]); what still applies: resources, trainer."
                f"{{{','.join(sorted(COMMAND_TRAINER_FIELDS))}}}, env, secrets"
            )
        return self

    @model_validator(mode="after")
    def _notify_secrets_listed(self) -> TrainingSpec:
        hook = self.notify.webhook if self.notify is not None else None
        for field in ("token_env", "url_env"):
            name = getattr(hook, field, None) if hook is not None else None
            if name is not None and name not in self.secrets:
                raise ValueError(
                    f"notify.webhook.{field} names {name}, which is not in secrets; list it there "
                    f"(secrets: [{', '.join((*self.secrets, name))}]) so that its value reaches the ranks "
                    "from your environment (or a Kubernetes Secret) and no file holds it"
                )
        return self

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
