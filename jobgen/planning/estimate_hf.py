"""Per-rank memory of fine-tuning a Hugging Face causal LM: full, LoRA and QLoRA.

The model's shape comes from its ``config.json`` (read as JSON: no torch or transformers import,
``jobgen plan`` stays pure arithmetic). The model-state formulas are :mod:`jobgen.planning.estimate`'s
(ZeRO, Rajbhandari et al. 2020; FSDP; DeepSpeed's implementation terms), applied to the
parameters that train; this module adds what a Hugging Face model has and the built-in GPT has
not. Every number is in **bytes per rank** unless a name says otherwise.

Sources
-------
* Shapes and parameter counts: the model families' ``config.json`` fields as transformers reads
  them (``LlamaConfig``/``MistralConfig``/``Qwen2Config``: gated MLP ``gate/up/down_proj``,
  grouped-query attention with ``num_key_value_heads``, RMSNorm weight only; ``GPT2Config``:
  ``c_attn``/``c_proj``/``c_fc`` with biases, LayerNorm weight + bias, learned positions, tied
  head). Checked against published totals: Llama-2-7B 6,738,415,616 (Touvron et al. 2023,
  arXiv:2307.09288; the count transformers reports for ``meta-llama/Llama-2-7b-hf``), GPT-2 small
  124,439,808 (Radford et al. 2019 "124M"; transformers' ``gpt2``).
* QLoRA base weights: Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"
  (arXiv:2305.14314), section 3: 4-bit NormalFloat with blocksize 64 and double quantisation
  (8-bit first-level constants, blocksize 256, fp32 second-level constants) costs
  ``4 + 8/64 + 32/(64·256) = 4.127`` bits per parameter (:data:`NF4_DQ_BITS`). Only the decoder
  layers' Linear weights are quantised (bitsandbytes via transformers keeps ``lm_head``, the
  embeddings and the norms out); for ddp and ZeRO-1/2 jobgen's loader (jobgen.train.hf) then
  calls peft's ``prepare_model_for_kbit_training``, which casts those non-quantised parameters
  to fp32 (:data:`QLORA_UNQUANTIZED_BYTES`; DeepSpeed casts them back to bf16:
  :func:`unquantized_bytes`) and turns on gradient checkpointing
  (``use_gradient_checkpointing=True`` by default).
* Assumption: QLoRA trains with activation checkpointing under every layout. In an earlier version the
  fsdp / deepspeed_stage_3 recipe (bf16 load, :data:`QLORA_BF16_LOAD_STRATEGIES`) skips
  ``prepare_model_for_kbit_training`` and with it the checkpointing: the GPU suite's ZeRO-3 run on one
  H100 peaked at 67.8 GiB, which the estimate *without* checkpointing matches (69.5 GiB, measured
  / planned 0.97; row ``llama7b-qlora-ds3`` of tests/unit/test_estimate_measured.py) while the
  plan with it says 13.1 GiB. At world size 1 ZeRO-3 partitions nothing, so transformers
  skipping ``zero.Init`` for quantised models cannot explain that run. No trustworthy FSDP QLoRA
  peak exists yet (the run crashed while wrapping); its plan assumes the checkpointed,
  bf16-stored model of the bitsandbytes FSDP-QLoRA recipe with fp32 adapters.
* LoRA: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models" (arXiv:2106.09685):
  one adapter on a ``d_in x d_out`` Linear adds ``r·(d_in + d_out)`` parameters (A: d_in x r,
  B: r x d_out); peft's ``lora_dropout`` keeps its output (and mask) for A's backward.
* Activations: Korthikanti et al. 2022 (arXiv:2205.05198) eq. (1) as in
  :func:`jobgen.planning.estimate.activation_bytes`, re-derived for the Llama block (gated MLP with
  ``intermediate_size``, RMSNorm, rotary embeddings, SDPA): see :func:`hf_activation_bytes`.

Frozen base weights under each layout (they have no gradients or optimizer states):

* ``ddp``, ``deepspeed_stage_1/2``, FSDP ``NO_SHARD``: every rank holds the whole base.
* FSDP ``FULL_SHARD``/``HYBRID_SHARD``: the base divided by the shard group, plus two gathered
  decoder layers (current + prefetched) and the root unit (embeddings, final norm, head) in
  their stored width; ``SHARD_GRAD_OP``: the whole base stays gathered between forward and
  backward. ``offload_params: cpu`` puts the shards in host memory.
* ``deepspeed_stage_3``: the base divided by the world, plus the gathered working set (largest
  module + the prefetch bucket); ``offload_params`` puts the partition on the host.

Caveats: the estimate is the peak of one step as :mod:`jobgen.planning.estimate` builds it, calibrated
against the measured one-GPU QLoRA peaks of the GPU suite (ddp 15.6 GiB, ZeRO-2 11.1 GiB: measured /
planned 1.05 and 0.86, tests/unit/test_estimate_measured.py). It does not know the caching
allocator's reserved-but-free memory, bitsandbytes' per-call dequantisation buffers beyond the
largest Linear, or a framework's own copies. The seed table (:mod:`jobgen.planning.seeds`) is a looser
reference: tests/unit/test_estimate_hf.py states how far from it the estimate may be.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jobgen.errors import ConfigError, NotSupportedError
from jobgen.planning import seeds
from jobgen.planning.estimate import _16BIT, DEEPSPEED_STAGE3_PREFETCH_ELEMENTS, Estimate, Layout, model_states, residual_bytes, with_activations
from jobgen.planning.memory_plan import MemoryPlan, SizedModel
from jobgen.planning.memory_plan import plan_memory as generic_plan_memory

NF4_DQ_BITS = 4 + 8 / 64 + 32 / (64 * 256)
"""Bits per quantised weight for 4-bit NF4 with double quantisation (Dettmers et al. 2023, sec. 3:
"4.127 bits per parameter"): 4-bit values, an 8-bit constant per block of 64, an fp32 constant
per 256 of those."""

QLORA_UNQUANTIZED_BYTES = 4
"""Bytes per non-quantised parameter (embeddings, norms, ``lm_head``, biases) under QLoRA where
jobgen's loader runs peft's ``prepare_model_for_kbit_training``, which casts every 16-bit
non-``Params4bit`` parameter to fp32 (see :func:`unquantized_bytes` for the other layouts)."""

QLORA_BF16_LOAD_STRATEGIES = frozenset({"fsdp", "deepspeed_stage_3"})
"""Strategies whose QLoRA recipe loads the non-quantised weights in bf16 (4-bit storage bf16) and
skips ``prepare_model_for_kbit_training``: jobgen.train.hf.PARAM_SHARDING_STRATEGIES, copied here
because this module must not import torch (tests/unit/test_estimate_hf.py checks the two agree)."""

LLAMA_TYPES = ("llama", "mistral", "qwen2")
"""``model_type`` values read as a Llama-family decoder (gated MLP, GQA, RMSNorm)."""
GPT2_TYPES = ("gpt2",)
"""``model_type`` values read as a GPT-2 decoder."""

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GPT2_LINEARS = ("c_attn", "c_proj", "c_fc")


@dataclass(frozen=True)
class HFShape:
    """A Hugging Face decoder's shape (from ``config.json``) and one micro batch.

    Attribute names shared with :class:`jobgen.planning.estimate.Shape` (``n_layer``, ``n_head``,
    ``d_model``, ``block_size``, ``micro_batch_size``, ``dropout``, ``n_params``, ``block_params``,
    ``root_params``, ``largest_module_params``) mean the same, so :func:`jobgen.planning.estimate.estimate`
    applies its model-state formulas to it unchanged.
    """

    model_type: str
    d_model: int
    intermediate: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    vocab_size: int
    tied: bool
    block_size: int
    micro_batch_size: int
    positions: int = 0
    """Learned position embeddings (GPT-2's ``n_positions``); 0 for rotary models."""
    attention_bias: bool = False
    """q/k/v (and GPT-2: every) Linear has a bias (Qwen2: q/k/v)."""
    mlp_bias: bool = False
    gated: bool = True
    """Gated MLP (gate_proj, up_proj, down_proj) rather than fc -> act -> proj."""
    layer_norm: bool = False
    """LayerNorm (weight + bias) rather than RMSNorm (weight)."""
    dropout: float = 0.0
    """Activation dropout (0 for the supported families as fine-tuned here)."""
    source: str = "config.json"
    """The config file read (for error locations)."""
    accumulation: int = 1
    """``gradient_accumulation_steps`` (see :attr:`jobgen.planning.estimate.Shape.accumulation`)."""

    @property
    def linears(self) -> dict[str, tuple[tuple[int, int, bool], ...]]:
        """Linear modules of one decoder layer: name -> ``((d_in, d_out, has_bias), ...)`` (GPT-2's
        ``c_proj`` names two modules, the attention and the MLP projection)."""
        h, i, a, kv, hd = self.d_model, self.intermediate, self.n_head, self.n_kv_head, self.head_dim
        if self.model_type in GPT2_TYPES:
            return {"c_attn": ((h, 3 * h, True),), "c_proj": ((h, h, True), (i, h, True)), "c_fc": ((h, i, True),)}
        ab, mb = self.attention_bias, self.mlp_bias
        return {"q_proj": ((h, a * hd, ab),), "k_proj": ((h, kv * hd, ab),), "v_proj": ((h, kv * hd, ab),),
                "o_proj": ((a * hd, h, ab and self.model_type != "qwen2"),), "gate_proj": ((h, i, mb),),
                "up_proj": ((h, i, mb),), "down_proj": ((i, h, mb),)}

    @property
    def linear_weight_params(self) -> int:
        """Weights of one layer's Linears (what 4-bit quantisation replaces)."""
        return sum(din * dout for mods in self.linears.values() for din, dout, _ in mods)

    @property
    def block_params(self) -> int:
        """Parameters of one decoder layer: Linear weights and biases, and its two norms."""
        bias = sum(dout for mods in self.linears.values() for _, dout, has in mods if has)
        return self.linear_weight_params + bias + 2 * self.norm_params

    @property
    def norm_params(self) -> int:
        """Parameters of one norm: ``h`` (RMSNorm) or ``2h`` (LayerNorm)."""
        return (2 if self.layer_norm else 1) * self.d_model

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers: token (+ position) embeddings, final norm and
        ``lm_head`` unless tied to the embeddings."""
        v, h = self.vocab_size, self.d_model
        return v * h + self.positions * h + self.norm_params + (0 if self.tied else v * h)

    @property
    def n_params(self) -> int:
        """All parameters: ``L·block_params + root_params``."""
        return self.n_layer * self.block_params + self.root_params

    @property
    def quantized_params(self) -> int:
        """Parameters stored in 4 bits under QLoRA: the decoder layers' Linear weights."""
        return self.n_layer * self.linear_weight_params

    @property
    def largest_module_params(self) -> int:
        """Largest single module (the embedding table or the biggest Linear)."""
        biggest = max(din * dout for mods in self.linears.values() for din, dout, _ in mods)
        return max(biggest, self.vocab_size * self.d_model)

    def lora_layer_params(self, r: int, targets: tuple[str, ...]) -> int:
        """LoRA parameters in one decoder layer: ``r·(d_in + d_out)`` per targeted Linear (Hu et al.
        2021); ``targets`` must be names of :attr:`linears` (see :func:`check_targets`)."""
        return sum(r * (din + dout) for name in targets for din, dout, _ in self.linears[name])


def _field(doc: dict[str, Any], key: str, source: str, *, default: Any = None, kind: type = int) -> Any:
    value = doc.get(key, default)
    if value is None:
        raise ConfigError(f"{source} has no {key!r}, which jobgen plan needs to size the model",
                          location=f"{source}: {key}",
                          hint=f"add {key} to the config (the value from the model's published config.json), "
                               "or pass the model's own config with --hf-config FILE")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{source}: {key} is {value!r}; expected a positive integer", location=f"{source}: {key}",
                          hint="use the model's published config.json")
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: {key} is {value!r}; expected true or false", location=f"{source}: {key}",
                          hint="use the model's published config.json")
    return value


def config_path(hf_path: str, hf_config: str | None, spec_source: str = "spec") -> Path:
    """The ``config.json`` to read: ``hf_config`` (a file, or a directory holding one) when
    given, else ``<hf_path>/config.json``.

    Raises:
        ConfigError: the file does not exist (hint: ``--hf-config``).
    """
    path = Path(hf_config) if hf_config is not None else Path(hf_path) / "config.json"
    if path.is_dir():  # --hf-config naming a model directory (save_pretrained output)
        path = path / "config.json"
    if not path.is_file():
        where = "--hf-config" if hf_config is not None else f"{spec_source}: model.hf_path"
        raise ConfigError(
            f"no model config at {str(path)!r}: jobgen plan reads the Hugging Face model's config.json to size it",
            location=where,
            hint="pass a local copy of the model's config.json with --hf-config FILE (e.g. "
                 "examples/hf-configs/llama-2-7b/config.json) when hf_path is a cluster path",
        )
    return path


def read_hf_shape(path: Path, block_size: int, micro_batch_size: int) -> HFShape:
    """Read a decoder's shape from a ``config.json`` (JSON only; no weights, no transformers).

    Args:
        path: the config file.
        block_size: training sequence length in tokens (the spec's ``model.block_size``).
        micro_batch_size: sequences per rank per step.

    Raises:
        ConfigError: unreadable JSON, an unknown ``model_type``, a missing or malformed field
            (location: the file and the key).
    """
    source = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {source} as JSON: {exc}", location=source,
                          hint="give the model's config.json (as save_pretrained writes it)") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source} is not a JSON object", location=source, hint="give the model's config.json")
    model_type = doc.get("model_type")
    if model_type in LLAMA_TYPES:
        h = _field(doc, "hidden_size", source)
        heads = _field(doc, "num_attention_heads", source)
        kv = _field(doc, "num_key_value_heads", source, default=heads)
        if heads % kv:
            raise ConfigError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                              location=f"{source}: num_key_value_heads", hint="use the model's published config.json")
        return HFShape(
            model_type, h, _field(doc, "intermediate_size", source), _field(doc, "num_hidden_layers", source), heads, kv,
            _field(doc, "head_dim", source, default=h // heads), _field(doc, "vocab_size", source),
            _field(doc, "tie_word_embeddings", source, default=False, kind=bool), block_size, micro_batch_size,
            attention_bias=_field(doc, "attention_bias", source, default=model_type == "qwen2", kind=bool),
            mlp_bias=_field(doc, "mlp_bias", source, default=False, kind=bool), source=source)
    if model_type in GPT2_TYPES:
        h = _field(doc, "n_embd", source)
        heads = _field(doc, "n_head", source)
        inner = doc.get("n_inner") or 4 * h
        return HFShape(
            model_type, h, inner, _field(doc, "n_layer", source), heads, heads, h // heads, _field(doc, "vocab_size", source),
            _field(doc, "tie_word_embeddings", source, default=True, kind=bool), block_size, micro_batch_size,
            positions=_field(doc, "n_positions", source), attention_bias=True, mlp_bias=True, gated=False,
            layer_norm=True, source=source)
    known = ", ".join(LLAMA_TYPES + GPT2_TYPES)
    raise ConfigError(f"{source}: model_type {model_type!r} is not one jobgen plan can size (known: {known})",
                      location=f"{source}: model_type",
                      hint="plan a known model of similar shape (e.g. a llama config with the same hidden_size, "
                           "intermediate_size, num_hidden_layers, num_attention_heads) via --hf-config FILE")


def check_targets(shape: HFShape, targets: tuple[str, ...], spec_source: str = "spec") -> None:
    """Raise when a LoRA target names no Linear of ``shape``'s family.

    Raises:
        ConfigError: unknown target (the message lists the known ones).
    """
    unknown = [t for t in targets if t not in shape.linears]
    if unknown:
        raise ConfigError(
            f"LoRA target module(s) {', '.join(map(repr, unknown))} are not Linear layers of a {shape.model_type} "
            f"decoder layer (known: {', '.join(shape.linears)})",
            location=f"{spec_source}: model.lora.target_modules",
            hint=f"pick from {', '.join(shape.linears)}")


#: Which input a LoRA target's ``lora_A`` reads, per family: targets that share an input (q/k/v
#: read the same normed hidden state) save it once when ``lora_dropout`` is 0.
_LORA_INPUTS = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "o_proj": "o", "gate_proj": "mlp",
                "up_proj": "mlp", "down_proj": "down", "c_attn": "attn", "c_fc": "mlp"}


def hf_activation_bytes(shape: HFShape, precision: str, *, checkpointing: bool = False, lora: Any = None,
                        residual: int | None = None, frozen_base: bool = False, reuse: bool = True) -> int:
    """Peak bytes of activations on one rank for one micro batch of a Hugging Face decoder
    (Korthikanti et al. 2022 eq. (1), re-derived for the Llama block; the peak structure
    ``saved + max(head, transient)`` of :func:`jobgen.planning.estimate.activation_bytes`).

    In elements of ``t = s·b·h`` at the activation width ``e`` (2 bytes in 16-bit, 4 in fp32)
    or the residual width ``r`` (:func:`jobgen.planning.estimate.residual_bytes`), per layer with a
    trainable base: attention 6t at ``e`` (q/k/v input, rotary q, k and v as SDPA saves them —
    k and v after ``repeat_kv``, so full width even with GQA —, SDPA output, o_proj input) plus
    SDPA's fp32 log-sum-exp ``4·a·s·b`` bytes; MLP ``t + 4·(i/h)·t`` gated (input; gate, its
    activation, up, their product) or ``t + 2·(i/h)·t`` (GPT-2: fc input, fc output, GELU
    output); two norm inputs ``2t`` at ``r`` plus, for RMSNorm below fp32, the fp32 copy
    transformers' ``LlamaRMSNorm`` makes (``2·4·s·b·h`` bytes).

    ``frozen_base`` (LoRA, QLoRA): a frozen Linear saves no input (autograd keeps a matmul's
    input only for its weight's gradient; bitsandbytes' ``MatMul4Bit`` keeps the 4-bit weight
    only), nor does a frozen norm weight keep the normalised output. Per layer that leaves q, k,
    v and the SDPA output (4t at ``e``), the gated MLP's gate, activation and up outputs
    (``3·(i/h)·t``; GPT-2: the fc output), and each norm's saved input (RMSNorm: its fp32 copy,
    4 bytes; LayerNorm: ``r``). LoRA adds per targeted Linear the A output ``r·s·b`` elements
    and, with ``lora_dropout > 0``, the dropout output ``d_in·s·b`` elements at ``e`` (what
    ``lora_A`` saves; under autocast its 16-bit cast) plus a one-byte mask each; with
    ``lora_dropout = 0`` ``lora_A`` saves its input itself, once per distinct input.

    Head (saved at the end of forward): the final norm's input (``r``, RMSNorm: at least its
    fp32 copy), with a trainable base also the embedding output (``r``) and the head input
    (``e``), and the logits ``s·b·V`` at ``e`` plus their fp32 copy and log-softmax
    (``8·s·b·V``), as in :func:`jobgen.planning.estimate.activation_bytes`. Backward working set: one
    layer's MLP gradients ``(2·i/h + 2)·t`` at ``e`` (estimate.py's ``10t`` for ``i = 4h``).
    Activation checkpointing keeps ``t`` per layer at ``r`` and one layer's activations during
    recomputation. ``reuse=False`` (CPU ranks) sums the head and the transient instead of taking
    the larger, as :func:`jobgen.planning.estimate.activation_bytes` does. ``lora``: the spec's
    :class:`jobgen.specs.model.LoraSpec` (its ``r``, ``target_modules``, ``dropout``), or ``None``
    (no adapters).

    Returns:
        bytes.
    """
    lora_r, lora_targets, lora_dropout = (0, (), 0.0) if lora is None else (lora.r, lora.target_modules, lora.dropout)
    e = 2 if precision in _16BIT else 4
    r = e if residual is None else residual
    s, b, h, a = shape.block_size, shape.micro_batch_size, shape.d_model, shape.n_head
    t = s * b * h
    ir = shape.intermediate / h
    rms = not shape.layer_norm
    norm_saved = (4 if rms else r) * t  # what one frozen norm keeps: RMSNorm's fp32 copy, LayerNorm's input
    if frozen_base:
        mlp = (3 if shape.gated else 1) * ir * t
        per_layer = (4 * t + mlp) * e + 4 * a * s * b + 2 * max(norm_saved, r * t)
        head = max(norm_saved, r * t)
    else:
        mlp = t + (4 if shape.gated else 2) * ir * t
        per_layer = (6 * t + mlp) * e + 4 * a * s * b + 2 * t * r + (2 * 4 * t if rms and r < 4 else 0)
        head = 2 * t * r + t * e + (4 * t if rms and r < 4 else 0)
    inputs = {"attn": t, "o": t, "mlp": t, "down": ir * t}
    shared: set[str] = set()
    for name in lora_targets:
        for din, _dout, _ in shape.linears.get(name, ()):
            per_layer += lora_r * s * b * e
            if lora_dropout > 0:
                per_layer += din * s * b * (e + 1)
            elif frozen_base:
                key = _LORA_INPUTS.get(name, name) if name != "c_proj" else ("o" if din == h else "down")
                if key not in shared:
                    shared.add(key)
                    per_layer += inputs.get(key, din * s * b) * e
    head += s * b * shape.vocab_size * (e + 8)
    backward = (2 * ir + 2) * t * e
    peak = max if reuse else (lambda x, y: x + y)
    if checkpointing:
        return int(shape.n_layer * t * r + peak(head, per_layer + backward))
    return int(shape.n_layer * per_layer + peak(head, backward))


@dataclass(frozen=True)
class AdapterShape:
    """The trainable LoRA adapters seen as a model, so :func:`jobgen.planning.estimate.estimate` applies its
    formulas to them: ``block_params`` per decoder layer (FSDP's unit), no root parameters."""

    n_layer: int
    n_head: int
    d_model: int
    block_size: int
    micro_batch_size: int
    block_params: int
    largest_module_params: int
    dropout: float = 0.0
    root_params: int = 0
    accumulation: int = 1

    @property
    def n_params(self) -> int:
        """``n_layer · block_params``."""
        return self.n_layer * self.block_params


def adapter_shape(shape: HFShape, r: int, targets: tuple[str, ...]) -> AdapterShape:
    """The LoRA adapters of ``shape`` (rank ``r`` on ``targets``) as an :class:`AdapterShape`."""
    largest = max(r * max(din, dout) for name in targets for din, dout, _ in shape.linears[name])
    return AdapterShape(shape.n_layer, shape.n_head, shape.d_model, shape.block_size, shape.micro_batch_size,
                        shape.lora_layer_params(r, targets), largest, accumulation=shape.accumulation)


def unquantized_bytes(precision: str, quantized: bool, strategy: str = "ddp") -> int:
    """Bytes per stored base parameter that is not 4-bit, on the GPU during training.

    DeepSpeed (any stage, 16-bit precision): 2 — the engine casts every floating-point
    parameter to its 16-bit dtype (``DeepSpeedEngine._cast_module_mixed_precision``, deepspeed
    0.19.8), whatever the loader produced. QLoRA otherwise: :data:`QLORA_UNQUANTIZED_BYTES` (4)
    where the loader runs ``prepare_model_for_kbit_training``, 2 under
    :data:`QLORA_BF16_LOAD_STRATEGIES`. LoRA and full fine-tuning: jobgen.train.hf loads fp32
    weights under mixed precision (autocast computes in 16-bit) and bf16 under
    ``bf16-true``/``transformer-engine``: 4 or 2.
    """
    if strategy.startswith("deepspeed_") and precision in _16BIT:
        return 2
    if quantized:
        return 2 if strategy in QLORA_BF16_LOAD_STRATEGIES else QLORA_UNQUANTIZED_BYTES
    return 2 if precision in ("bf16-true", "transformer-engine") else 4


def base_bytes(shape: HFShape, precision: str, quantized: bool, strategy: str = "ddp") -> tuple[int, int, int]:
    """``(whole base, one decoder layer, root)`` in bytes as stored on the GPU for ``strategy``:
    QLoRA's Linear weights at :data:`NF4_DQ_BITS`, every other parameter at
    :func:`unquantized_bytes`."""
    w = unquantized_bytes(precision, quantized, strategy)
    if quantized:
        layer_q = shape.linear_weight_params
        layer = int(layer_q * NF4_DQ_BITS / 8) + (shape.block_params - layer_q) * w
    else:
        layer = shape.block_params * w
    root = shape.root_params * w
    return shape.n_layer * layer + root, layer, root


@dataclass(frozen=True)
class Adapters:
    """What fine-tunes a frozen Hugging Face base: the spec's LoRA adapters
    (:class:`jobgen.specs.model.LoraSpec`), on a 4-bit base for QLoRA (``quantized``, the spec's
    ``model.load_in_4bit``)."""

    lora: Any
    quantized: bool = False


def estimate_hf(shape: HFShape, precision: str, layout: Layout, *, num_nodes: int, devices_per_node: int,
                adapters: Adapters | None = None, accelerator: str = "gpu", checkpointing: bool = False) -> Estimate:
    """Peak memory of one rank fine-tuning ``shape`` with ``layout``.

    Full fine-tuning (``adapters`` None): :func:`jobgen.planning.estimate.estimate` on the whole model (its
    DDP/FSDP/ZeRO formulas, fp32 weights under mixed precision as jobgen's loader has them) with
    the activations of :func:`hf_activation_bytes`.

    LoRA / QLoRA: :func:`jobgen.planning.estimate.estimate` on the adapters alone (:class:`AdapterShape`:
    their weights, gradients, AdamW states, DDP bucket copy, FSDP/ZeRO sharding and buckets), plus
    the frozen base (:func:`base_bytes`) placed as the module docstring says per layout, plus, for
    QLoRA, one 16-bit dequantised copy of the largest quantised Linear (bitsandbytes dequantises a
    weight per matmul). Activations: :func:`hf_activation_bytes` of a frozen base at the layout's
    residual width (:func:`jobgen.planning.estimate.residual_bytes`), joined to the states by
    :func:`jobgen.planning.estimate.with_activations`. QLoRA always counts activation checkpointing (the
    module docstring's assumption).

    Args:
        shape: the model and micro batch.
        precision: the spec's (resolved) precision.
        layout: strategy and sharding.
        num_nodes, devices_per_node: the world.
        adapters: the LoRA adapters and whether the base is 4-bit, or ``None`` (full fine-tuning).
        accelerator: ``gpu`` or ``cpu``.
        checkpointing: activation checkpointing.

    Returns:
        the :class:`~jobgen.planning.estimate.Estimate` (bytes per rank).
    """
    world = dict(num_nodes=num_nodes, devices_per_node=devices_per_node, accelerator=accelerator)
    residual = residual_bytes(precision, layout.strategy)
    reuse = accelerator == "gpu"
    if adapters is None:
        est = model_states(shape, precision, layout, **world)
        return with_activations(est, hf_activation_bytes(shape, precision, checkpointing=checkpointing,
                                                         residual=residual, reuse=reuse))
    lora, quantized = adapters.lora, adapters.quantized
    checkpointing = checkpointing or quantized
    est = model_states(adapter_shape(shape, lora.r, lora.target_modules), precision, layout, **world)
    base, host = _placed_base(shape, precision, quantized, layout, num_nodes * devices_per_node, devices_per_node)
    notes = list(est.notes)
    if quantized:
        base += 2 * max(din * dout for mods in shape.linears.values() for din, dout, _ in mods)
        notes.append(f"base: decoder Linear weights 4-bit NF4 + double quantisation ({NF4_DQ_BITS:.3f} bits), "
                     "the rest fp32 (peft prepare_model_for_kbit_training)")
    acts = hf_activation_bytes(shape, precision, checkpointing=checkpointing, lora=lora, residual=residual,
                               frozen_base=True, reuse=reuse)
    est = replace(est, params_bytes=est.params_bytes + base, host_bytes_per_node=est.host_bytes_per_node + host,
                  notes=tuple(notes))
    return with_activations(est, acts)


def _placed_base(shape: HFShape, precision: str, quantized: bool, layout: Layout, n: int, devices_per_node: int) -> tuple[int, int]:
    """(bytes of the frozen base on one rank, bytes it puts in a node's host memory) under
    ``layout`` on ``n`` ranks: FSDP shards it over its group and holds the gathered units, ZeRO-3
    partitions it and holds a working set, the others keep it whole (module docstring)."""
    whole, layer, root = base_bytes(shape, precision, quantized, layout.strategy)
    if layout.strategy == "fsdp":
        group = {"FULL_SHARD": n, "SHARD_GRAD_OP": n, "HYBRID_SHARD": devices_per_node, "NO_SHARD": 1}[layout.fsdp_sharding_strategy]
        if layout.fsdp_sharding_strategy == "NO_SHARD":
            gathered = 0
        elif layout.fsdp_sharding_strategy == "SHARD_GRAD_OP":
            gathered = whole
        else:
            gathered = min(2, shape.n_layer) * layer + root
        shard = whole // group
        if layout.offload_params == "cpu":
            return (gathered if group > 1 else whole), shard * devices_per_node
        return (shard + gathered if group > 1 else whole), 0
    if layout.strategy == "deepspeed_stage_3":
        part = whole // n
        working = min(whole, max(layer, root) + 2 * DEEPSPEED_STAGE3_PREFETCH_ELEMENTS)
        if layout.offload_params != "none":
            return working, part * devices_per_node
        return part + working, 0
    return whole, 0


def hf_shape_of(spec: Any, hf_config: str | None, spec_source: str = "spec") -> HFShape:
    """The :class:`HFShape` of ``spec.model`` (``hf_path``) at the spec's micro batch, its LoRA
    targets checked.

    Raises:
        ConfigError: missing/unreadable config, unknown model type or field, unknown LoRA target.
        NotSupportedError: QLoRA on a GPT-2 config (transformers' ``Conv1D`` is not quantised).
    """
    m = spec.model
    path = config_path(m.hf_path, hf_config, spec_source)
    shape = replace(read_hf_shape(path, m.block_size, spec.trainer.micro_batch_size),
                    accumulation=spec.trainer.gradient_accumulation_steps)
    if m.lora is not None:
        check_targets(shape, m.lora.target_modules, spec_source)
    if m.load_in_4bit and shape.model_type in GPT2_TYPES:
        raise NotSupportedError("jobgen plan sizes QLoRA for Llama-family models only: GPT-2's Conv1D layers are "
                                "not quantised by bitsandbytes", location=f"{spec_source}: model.load_in_4bit",
                                hint="plan without load_in_4bit, or with a llama/mistral/qwen2 config")
    return shape


def seed_comparison(spec: Any, n_params: int, world_size: int, spec_row: Any) -> dict[str, Any] | None:
    """The seed table's row (:mod:`jobgen.planning.seeds`) for this spec next to the estimate of the spec's
    layout, or ``None`` when no row matches (strategy, world size, QLoRA, ~7B)."""
    row = seeds.match(spec.trainer.strategy, world_size, spec.model.load_in_4bit, n_params)
    if row is None:
        return None
    est = spec_row.estimate.total_bytes
    return {"recipe": row.recipe, "gpus": row.gpus, "tokens_per_s": row.tokens_per_s,
            "measured_gb_per_gpu": row.mem_gb_per_gpu, "measured_bytes_per_gpu": row.mem_bytes_per_gpu,
            "estimate_bytes_per_gpu": est, "estimate_over_measured": round(est / row.mem_bytes_per_gpu, 3),
            "source": seeds.SEED_SOURCE}


def describe(spec: Any, shape: HFShape) -> tuple[dict[str, Any], list[str]]:
    """``(facts for -o json, assumption lines)`` of a Hugging Face plan: the config read, the
    parameter split (total, trainable, quantised) and the fine-tuning mode."""
    m = spec.model
    adapters = 0 if m.lora is None else shape.n_layer * shape.lora_layer_params(m.lora.r, m.lora.target_modules)
    mode = "qlora" if m.load_in_4bit else "lora" if m.lora is not None else "full"
    info = {"config": shape.source, "model_type": shape.model_type, "mode": mode, "n_params": shape.n_params,
            "trainable_params": adapters if m.lora is not None else shape.n_params,
            "quantized_params": shape.quantized_params if m.load_in_4bit else 0,
            "lora_r": None if m.lora is None else m.lora.r,
            "lora_targets": [] if m.lora is None else list(m.lora.target_modules)}
    lines = [f"Hugging Face {shape.model_type} from {shape.source}: {mode} fine-tuning"]
    if m.lora is not None:
        lines.append(f"LoRA r={m.lora.r} on {', '.join(m.lora.target_modules)}: {adapters / 1e6:,.1f}M trainable "
                     "parameters (weights, gradients, AdamW states as for the GPT); the base is frozen")
    if m.load_in_4bit:
        lines.append(f"QLoRA base: {shape.quantized_params / 1e6:,.1f}M Linear weights at {NF4_DQ_BITS:.3f} bits "
                     "(NF4 + double quantisation, Dettmers et al. 2023), the rest fp32 under ddp (peft), bf16 under "
                     "DeepSpeed (its cast) and the fsdp/ZeRO-3 recipe; activation checkpointing assumed under every "
                     "layout (jobgen/planning/estimate_hf.py)")
    elif m.lora is not None:
        lines.append("LoRA base: fp32 weights under mixed precision (jobgen.train.hf), 16-bit under bf16-true")
    return info, lines


def plan_memory(spec: Any, profile: Any, num_nodes: int, devices_per_node: int, *,
                hf_config: str | None = None, spec_source: str = "spec") -> MemoryPlan:
    """:func:`jobgen.planning.memory_plan.plan_memory` for any spec: a Hugging Face model (``model.hf_path``)
    is sized from its ``config.json`` (``hf_config``, or ``<hf_path>/config.json``) by this
    module (full fine-tuning, LoRA, QLoRA), and its plan also carries :attr:`MemoryPlan.hf` and,
    when the spec matches a row of the seed table (:mod:`jobgen.planning.seeds`), :attr:`MemoryPlan.seed`;
    any other spec goes to the generic plan unchanged.

    Raises:
        NotSupportedError: ``model.class_path`` (see :func:`jobgen.planning.memory_plan.plan_memory`); QLoRA on GPT-2.
        ConfigError: a Hugging Face config that is missing, unreadable, of an unknown model type
            or without a needed key; an unknown LoRA target module.
    """
    m = spec.model
    if spec.user_code or m.hf_path is None:  # a class_path model has no hf_path: the generic plan refuses it
        return generic_plan_memory(spec, profile, num_nodes, devices_per_node, spec_source=spec_source)
    shape = hf_shape_of(spec, hf_config, spec_source)
    size = functools.partial(estimate_hf, adapters=None if m.lora is None else Adapters(m.lora, m.load_in_4bit))
    mp = generic_plan_memory(spec, profile, num_nodes, devices_per_node, model=SizedModel(shape, size, m.load_in_4bit),
                             spec_source=spec_source)
    info, more = describe(spec, shape)
    seed = seed_comparison(spec, shape.n_params, num_nodes * devices_per_node, mp.spec_row)
    return replace(mp, assumptions=(*mp.assumptions, *more), hf=info, seed=seed)
