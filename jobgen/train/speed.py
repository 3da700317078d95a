"""The entrypoint's GPU speed levers, each a small decision from the device and the spec.

Every lever is chosen here by one function that the GPU path and the CPU tests both call, with
the device query as an argument (unit tests fake it); on CPU each lever is off and the CPU path
is what it was before the levers existed:

* :func:`matmul_precision`: ``torch.set_float32_matmul_precision("high")`` (TF32 matmuls) on
  GPUs of compute capability >= 8.0 (Ampere and newer: TF32 tensor cores). It only changes fp32
  matmuls: under ``bf16-mixed`` the few fp32 ones left (e.g. an fp32 loss head); under
  ``32-true`` all of them (10-bit mantissa products, fp32 accumulation; PyTorch's "CUDA semantics:
  TensorFloat-32" note). Lightning itself suggests the same setting on such GPUs.
* :func:`compile_on`: ``trainer.compile: auto`` -> on for jobgen's built-in GPT under ``ddp`` on
  CUDA GPUs (issue 21's H100 measurement: +14% tokens/s for gpt2-124m, +19% for gpt2-350m);
  off on CPU (the quickstart would pay compilation for nothing), under FSDP (torch.compile over
  FSDP-wrapped blocks is not measured here), DeepSpeed (its engine wraps the module),
  ``transformer-engine``, and Hugging Face models (bitsandbytes' 4-bit layers are not measured
  to compile).
* :func:`fused_adamw`: ``torch.optim.AdamW(fused=True)`` when every parameter is on CUDA, the
  strategy is not DeepSpeed (whose ZeRO optimizer wraps the torch one and owns the fp32 master
  copy; its CPU-offload path uses ``DeepSpeedCPUAdam``) and the run does not clip gradients under
  Lightning's mixed-precision plugin (which refuses clipping with an optimizer that unscales
  itself, under bf16-mixed as under 16-mixed). One multi-tensor kernel per step instead
  of torch's ``foreach`` default (litgpt and nanoGPT do the same).
* :func:`pin_memory`: page-locked host buffers for the data loaders on GPUs, so Lightning's
  ``non_blocking=True`` host-to-device copies (``lightning.fabric.utilities.apply_func``:
  non-blocking for every device but CPU and MPS) overlap with compute.

Torch is imported lazily: the module is importable on the render path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

AMPERE = (8, 0)
"""The first compute capability with TF32 tensor cores (A100)."""


def cuda_capability() -> tuple[int, int] | None:
    """Compute capability ``(major, minor)`` of the current CUDA device, ``None`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]


def matmul_precision(accelerator: str, capability: tuple[int, int] | None) -> str | None:
    """The ``torch.set_float32_matmul_precision`` value for this device: ``"high"`` (TF32) on a GPU
    of compute capability >= 8.0, else ``None`` (leave torch's default ``"highest"``)."""
    if accelerator == "gpu" and capability is not None and tuple(capability) >= AMPERE:
        return "high"
    return None


def compile_on(trainer: Any, accelerator: str, *, hf_model: bool, user_code: bool) -> bool:
    """Whether to ``torch.compile`` the network: ``trainer.compile`` when it is ``true``/``false``;
    for ``auto`` on only for the built-in GPT, ``ddp``, a precision other than
    ``transformer-engine``, on GPUs (see the module docstring for why each is off elsewhere).

    Args:
        trainer: the spec's ``trainer`` (:class:`jobgen.specs.trainer.TrainerSpec`).
        accelerator: ``gpu`` or ``cpu`` (``launch.accelerator``).
        hf_model: the model is a Hugging Face one (``model.hf_path``).
        user_code: the model is the user's ``class_path`` module (never compiled by jobgen).
    """
    if user_code:
        return False
    if trainer.compile != "auto":
        return bool(trainer.compile)
    return (accelerator == "gpu" and not hf_model and trainer.strategy == "ddp"
            and trainer.precision != "transformer-engine")


def fused_adamw(params: Iterable[Any], *, deepspeed: bool, amp_clipping: bool = False) -> bool:
    """Whether ``torch.optim.AdamW`` gets ``fused=True``: every parameter is a CUDA tensor, the
    strategy is not DeepSpeed, and the run does not clip gradients under Lightning's mixed
    precision plugin (``amp_clipping``: ``16-mixed`` or ``bf16-mixed`` outside FSDP/DeepSpeed with
    ``gradient_clip_val`` > 0). A fused optimizer unscales inside its own step, and
    ``lightning.pytorch.plugins.precision.amp.MixedPrecision.clip_gradients`` (2.6) refuses to clip
    for any such optimizer, loss scaling or not ("does not allow for gradient clipping"; seen on
    an H200 with bf16-mixed). Without clipping, 16-mixed takes it too (GradScaler steps fused
    optimizers itself). ``params``: tensors, or AdamW parameter groups (dicts with ``params``)."""
    if deepspeed or amp_clipping:
        return False
    tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
    return bool(tensors) and all(p.device.type == "cuda" for p in tensors)


def pin_memory(accelerator: str) -> bool:
    """Whether data loaders pin their batches: on GPUs only (pinning costs host time on CPU runs)."""
    return accelerator == "gpu"
