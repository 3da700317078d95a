"""Model FLOPs per token and peak FLOP/s per GPU type: what a run's MFU is measured against
(:mod:`jobgen.train.measure`) and what the time model predicts from (:mod:`jobgen.planning.time_model`).

Pure arithmetic, no torch import: ``jobgen plan`` reads it without loading the training stack.
"""

from __future__ import annotations

from typing import Any

# Dense (no 2:4 sparsity) peak tensor-core / vector FLOP/s of one GPU, per compute dtype.
# Sources: NVIDIA datasheets; where a datasheet gives "with sparsity" figures (marked * there),
# the dense figure is half of it.
#   V100 SXM2: V100 datasheet (fp32 15.7 TFLOPS, tensor fp16 125 TFLOPS; no tf32/bf16 units).
#   T4: T4 datasheet (fp32 8.1 TFLOPS, fp16 mixed 65 TFLOPS; no tf32/bf16 units).
#   A10G: A10 datasheet (fp32 31.2, tf32 62.5, bf16/fp16 125 TFLOPS); AWS's A10G is assumed to
#     match it (as Lightning's lightning.fabric.utilities.throughput table does).
#   A100 (SXM and PCIe): A100 datasheet (fp32 19.5, tf32 156, bf16/fp16 312 TFLOPS).
#   L4: L4 datasheet (fp32 30.3, tf32 120*, bf16/fp16 242* TFLOPS).
#   L40S: L40S datasheet (fp32 91.6, tf32 366*, bf16/fp16 733* TFLOPS).
#   H100 (SXM5 assumed; PCIe is ~24% lower): H100 datasheet (fp32 67, tf32 989*, bf16/fp16 1979* TFLOPS).
#   H200 (SXM): H200 datasheet (fp32 67, tf32 989*, bf16/fp16 1979* TFLOPS; same compute as H100 SXM).
#   B200: HGX B200 datasheet, 8 GPUs (fp32 600 TFLOPS, tf32 18*, bf16/fp16 36* PFLOPS) / 8.
# Pre-Ampere GPUs have no bf16 or tf32 tensor cores: bf16 is absent (MFU n/a), tf32 = fp32.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "V100": {"fp32": 15.7e12, "tf32": 15.7e12, "fp16": 125e12},
    "T4": {"fp32": 8.1e12, "tf32": 8.1e12, "fp16": 65e12},
    "A10G": {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "L4": {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
    "L40S": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 366.5e12, "fp16": 366.5e12},
    "H100": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "H200": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "B200": {"fp32": 75e12, "tf32": 1.125e15, "bf16": 2.25e15, "fp16": 2.25e15},
}
"""Dense peak FLOP/s of one GPU per compute dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``),
keyed by :data:`jobgen.specs.profile.GpuType`; sources in the comment above."""

#: GPU types whose tensor cores run fp32 matmuls as TF32 (compute capability >= 8.0), where the
#: entrypoint's ``tf32`` lever sets ``torch.set_float32_matmul_precision("high")`` (jobgen.train.speed).
TF32_GPUS = frozenset({"A10G", "A100", "L4", "L40S", "H100", "H200", "B200"})

#: ``transformer-engine`` (fp8 matmuls, bf16 weights) is measured against the bf16 peak, the
#: usual convention for MFU of fp8 runs (the fp8 dense peak is twice that): MFU stays comparable
#: with the bf16 run of the same model.
_PRECISION_DTYPE = {
    "bf16-mixed": "bf16", "bf16-true": "bf16", "16-mixed": "fp16", "16-true": "fp16", "transformer-engine": "bf16",
}


def planned_compute_dtype(precision: str, gpu_type: str | None) -> str:
    """The dtype a run's matmuls will use (``bf16``, ``fp16``, ``tf32``, ``fp32``), as the
    entrypoint decides it: 16-bit precisions by name (``transformer-engine`` against the bf16
    peak, see :mod:`jobgen.train.measure`), ``32-true`` as TF32 on :data:`TF32_GPUS` (the
    ``tf32`` lever), fp32 elsewhere (older GPUs, CPU ranks: ``gpu_type`` ``None``)."""
    if precision in _PRECISION_DTYPE:
        return _PRECISION_DTYPE[precision]
    return "tf32" if gpu_type in TF32_GPUS else "fp32"


def transformer_flops_per_token(
    n_layer: int, d_model: int, block_size: int, trainable_params: int, frozen_params: int = 0
) -> int:
    """Training FLOPs per token (forward + backward) of a decoder-only transformer.

    ``6 N + 12 n_layer d_model block_size`` (PaLM appendix B; Kaplan et al. 2020, section 2.1,
    give the forward half, ``2 N + 2 n_layer n_ctx d_attn``): a multiply-add is 2 FLOPs, each
    weight is used once per token in the forward pass (2 N) and twice in the backward pass
    (gradient of the activations and of the weight, 4 N); the attention score and value matmuls
    add ``12 n_layer d_model block_size`` (the causal mask is not discounted, as in PaLM).

    A frozen weight (LoRA's base model) still passes activation gradients back but needs no
    weight gradient: 4 FLOPs per frozen parameter instead of 6.

    Args:
        n_layer: transformer blocks.
        d_model: attention width (heads x head dimension; the residual width for these models).
        block_size: sequence length in tokens.
        trainable_params: parameters used in matmuls that get gradients (N).
        frozen_params: parameters used in matmuls that do not (0 for full training).
    """
    return 6 * trainable_params + 4 * frozen_params + 12 * n_layer * d_model * block_size


def shape_flops_per_token(shape: Any, trainable_params: int | None = None) -> int:
    """Training FLOPs per token of a planned model shape, counted as the entrypoint counts them
    (:func:`jobgen.train.measure.gpt_flops_per_token`, :func:`jobgen.train.measure.hf_flops_per_token`),
    so a prediction and the run's own ``flops_per_token`` agree.

    * the built-in GPT (:class:`jobgen.planning.estimate.Shape`): N = every parameter but the
      position embedding (the token embedding is the tied output projection);
    * a Hugging Face model (:class:`jobgen.planning.estimate_hf.HFShape`): N = every parameter but
      the embedding lookups (the input embedding unless tied to ``lm_head``, GPT-2's position
      embedding); with LoRA (``trainable_params`` = the adapters) the base counts as frozen
      (4 FLOPs per parameter) and the adapters as trainable (6).

    Raises:
        TypeError: a shape of neither kind.
    """
    if hasattr(shape, "vocab_size"):  # HFShape
        lookups = (0 if shape.tied else shape.vocab_size * shape.d_model) + shape.positions * shape.d_model
        matmul = shape.n_params - lookups
        if trainable_params is None or trainable_params >= shape.n_params:
            return transformer_flops_per_token(shape.n_layer, shape.d_model, shape.block_size, matmul)
        return transformer_flops_per_token(shape.n_layer, shape.d_model, shape.block_size, trainable_params, matmul)
    if hasattr(shape, "block_params") and hasattr(shape, "d_model"):
        matmul = shape.n_params - shape.block_size * shape.d_model
        return transformer_flops_per_token(shape.n_layer, shape.d_model, shape.block_size, matmul)
    raise TypeError(f"no FLOPs count for a {type(shape).__name__}")
