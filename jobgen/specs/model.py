"""``model:`` of a training spec when it is one of jobgen's built-in models: the byte-level GPT
(size presets or explicit sizes) or a Hugging Face causal LM from a local directory, with LoRA.
(The user's own LightningModule is :class:`jobgen.specs.user.ClassSpec`.) No I/O."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from jobgen.specs.base import _Model, _omit_defaults

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


#: ModelSpec fields that are left out of the serialised spec while at their defaults, so that
#: specs without them keep the resolved spec files (and hashes) they had before the fields existed.
_HF_MODEL_FIELDS = {"hf_path": None, "lora": None, "load_in_4bit": False}
_GPT_SIZE_FIELDS = ("n_layer", "n_head", "d_model")
_HF_DEFAULT_BLOCK_SIZE = 512


def _block_size_optional_in_a_file(schema: dict[str, Any]) -> None:
    """JSON Schema hook: a spec file may leave ``block_size`` out (the preset, or the Hugging Face
    default of 512, fills it in before the model's own requirement is checked)."""
    required = [name for name in schema.get("required", []) if name != "block_size"]
    if required:
        schema["required"] = required
    else:
        schema.pop("required", None)


class ModelSpec(_Model):
    """The model: the built-in byte-level GPT (vocabulary of 256 bytes), or a Hugging Face
    causal language model loaded from a local directory (``hf_path``), optionally with LoRA.

    GPT: give a ``preset`` or explicit sizes; explicit sizes override the preset's values.
    Hugging Face: give ``hf_path`` (and no preset or sizes; ``block_size`` is the training
    sequence length, default 512).
    """

    model_config = ConfigDict(json_schema_extra=_block_size_optional_in_a_file)

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
        "it. Needs ``lora``; CUDA GPUs, or CPU ranks with bitsandbytes >= 0.48.1 (checked on the node)."
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
