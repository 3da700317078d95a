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
  CUDA GPUs (measured on an H100: +14% tokens/s for gpt2-124m, +19% for gpt2-350m);
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

* :func:`single_device`: ``fsdp`` and ZeRO-1/2 at world size 1 (no offload, no activation
  checkpointing) train on Lightning's single-device path, as ``ddp`` does there
  (:meth:`jobgen.specs.trainer.TrainerSpec.single_device_reason` says when and why).
* :func:`host_scalar`: values the loop logs every step (``lr``, ``tokens_per_s``, ...) are
  host tensors: Lightning turns a logged Python number into ``torch.tensor(value,
  device=module.device)``, a blocking host-to-device copy on a GPU every step.
* :class:`LogStepLoss`: at a log step (every ``trainer.log_every_n_steps``) ``train_loss`` is
  read from a host copy started right after the forward, instead of Lightning's ``.item()`` once
  the optimizer step is queued, which empties the GPU's queue every log interval.

Each lever can be turned off for a before/after measurement with ``JOBGEN_LEVERS_OFF``, a
comma-separated list of :data:`LEVERS` (e.g. ``JOBGEN_LEVERS_OFF=single_device,fused_clip``):
a run then takes the path it took before that lever existed (``summary.json`` records the
levers used). Unknown names are refused, so a typo cannot pass for a measurement.

Torch is imported lazily: the module is importable on the render path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from jobgen.errors import ConfigError

LEVERS = ("single_device", "fused_clip", "host_logging", "compile_auto", "tf32", "pin_memory", "loss_read")
"""Names ``JOBGEN_LEVERS_OFF`` takes: :func:`single_device`, the fused AdamW with clipping under
``bf16-mixed`` (:func:`fused_adamw`), :func:`host_scalar` logging, :func:`compile_on`'s
``auto``, :func:`matmul_precision`, :func:`pin_memory` and :class:`LogStepLoss`."""

LEVERS_OFF_ENV = "JOBGEN_LEVERS_OFF"
"""Environment variable with the levers turned off (comma-separated names of :data:`LEVERS`)."""


def levers_off(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The levers ``JOBGEN_LEVERS_OFF`` turns off (empty when unset).

    Raises:
        ConfigError: a name that is not in :data:`LEVERS`.
    """
    raw = (os.environ if environ is None else environ).get(LEVERS_OFF_ENV, "")
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = sorted(names - set(LEVERS))
    if unknown:
        raise ConfigError(f"{LEVERS_OFF_ENV} names unknown lever(s) {', '.join(map(repr, unknown))}",
                          location=f"${LEVERS_OFF_ENV}", hint=f"known levers: {', '.join(LEVERS)}")
    return names


def lever_on(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether lever ``name`` (one of :data:`LEVERS`) is on: not named in ``JOBGEN_LEVERS_OFF``."""
    assert name in LEVERS, name
    return name not in levers_off(environ)


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


def compile_on(trainer: Any, accelerator: str, *, hf_model: bool, user_code: bool, strategy: str | None = None) -> bool:
    """Whether to ``torch.compile`` the network: ``trainer.compile`` when it is ``true``/``false``;
    for ``auto`` on only for the built-in GPT, ``ddp`` (or the single-device path a sharding
    strategy takes at world size 1, :func:`single_device`), a precision other than
    ``transformer-engine``, on GPUs (see the module docstring for why each is off elsewhere).

    Args:
        trainer: the spec's ``trainer`` (:class:`jobgen.specs.trainer.TrainerSpec`).
        accelerator: ``gpu`` or ``cpu`` (``launch.accelerator``).
        hf_model: the model is a Hugging Face one (``model.hf_path``).
        user_code: the model is the user's ``class_path`` module (never compiled by jobgen).
        strategy: the strategy that trains (``ddp`` on the single-device path); ``None``: the spec's.
    """
    if user_code:
        return False
    if trainer.compile != "auto":
        return bool(trainer.compile)
    return (accelerator == "gpu" and not hf_model and (strategy or trainer.strategy) == "ddp"
            and trainer.precision != "transformer-engine")


def single_device(trainer: Any, world_size: int, *, lever: bool = True) -> bool:
    """Whether the run trains on Lightning's single-device path although the spec names a
    sharding strategy: :meth:`jobgen.specs.trainer.TrainerSpec.single_device_reason` is not
    ``None`` (``fsdp``/ZeRO-1/2 at world size 1 without offload or activation checkpointing) and
    the lever is on (``lever``: not turned off by ``JOBGEN_LEVERS_OFF``)."""
    return lever and trainer.single_device_reason(world_size) is not None


def fused_adamw(params: Iterable[Any], *, deepspeed: bool, amp_clipping: bool = False) -> bool:
    """Whether ``torch.optim.AdamW`` gets ``fused=True``: every parameter is a CUDA tensor, the
    strategy is not DeepSpeed, and the run does not clip gradients under a loss scaler
    (``amp_clipping``: ``16-mixed`` with ``gradient_clip_val`` > 0).

    A fused optimizer unscales inside its own step, so the gradients a GradScaler scaled cannot
    be clipped before it; Lightning's ``MixedPrecision.clip_gradients`` (2.6) refuses to clip for
    any such optimizer. Under ``bf16-mixed`` there is no scaler and nothing to unscale: jobgen's
    modules clip there themselves (:meth:`jobgen.train.model.LitGPT.configure_gradient_clipping`;
    Lightning-AI/pytorch-lightning#21435), so fused AdamW stays on. Without clipping, 16-mixed
    takes it too (GradScaler steps fused optimizers itself). ``params``: tensors, or AdamW
    parameter groups (dicts with ``params``)."""
    if deepspeed or amp_clipping:
        return False
    tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
    return bool(tensors) and all(p.device.type == "cuda" for p in tensors)


def host_scalar(value: float) -> Any:
    """``value`` as a 0-dim float32 tensor in host memory, for ``LightningModule.log``.

    Lightning logs a Python number as ``torch.tensor(value, device=module.device)``
    (``LightningModule.__to_tensor``, Lightning 2.6): on a GPU a host-to-device copy from
    pageable memory, which waits for the device, every step. A host tensor is cloned on the
    host and its result metric follows its device (``_ResultCollection.log``), so nothing
    reaches the GPU; the logger reads it at log intervals as it would any metric. float32 is
    the dtype Lightning gives a logged number.
    """
    import torch

    return torch.tensor(value, dtype=torch.float32)


class LogStepLoss:
    """The training loss of a log step, read without emptying the device's queue.

    At a log step, the logged loss tensor is read on the host (``float``/``.item()``) by the
    job-log line and the progress bar (callbacks' ``on_train_batch_end``) and by Lightning when it
    hands the step's metrics to the loggers (``_LoggerConnector.update_train_step_metrics``), by
    which time the step's backward and optimizer step are queued behind the loss: the read waits
    for all of them, and the GPU then idles while the host prepares the next step (its batch,
    Lightning's hooks, the launches). With ``torch.compile`` the host is otherwise steps ahead,
    so this wait every ``log_every_n_steps`` is what the plain loop (which reads its loss once, at
    the end) does not pay.

    Instead, :meth:`keep` (called in ``training_step`` with the micro batch's loss, a 0-dim
    tensor) starts, at a log step, a non-blocking copy into page-locked host memory and records
    a CUDA event behind it; :meth:`read` (called in ``on_before_optimizer_step``, once the last
    micro batch's backward is queued) waits for that event only, which the GPU passes before the
    work queued after it, and returns the host copy, which Lightning and the callbacks then read
    without a synchronisation. The value and the step it is logged at are Lightning's own (the
    last micro batch's loss, at the optimizer step).

    A loss on the CPU is already on the host (no copy, no event); on other devices, or at a step
    that became a log step after the forward (a callback set ``trainer.should_stop``),
    :meth:`read` returns the device tensor itself (Lightning's read, as without this lever).
    """

    def __init__(self) -> None:
        self._loss: Any = None
        self._host: Any = None
        self._event: Any = None
        self._log_step = False

    def keep(self, loss: Any, *, log_step: bool) -> None:
        """Remember this micro batch's loss; at a log step on CUDA start its copy to the host."""
        import torch

        self._loss, self._event, self._log_step = loss.detach(), None, log_step
        if not log_step or self._loss.device.type != "cuda":
            return
        if self._host is None or self._host.dtype != self._loss.dtype or self._host.shape != self._loss.shape:
            self._host = torch.empty(self._loss.shape, dtype=self._loss.dtype, pin_memory=True)
        self._host.copy_(self._loss, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    @property
    def at_log_step(self) -> bool:
        """The ``log_step`` :meth:`keep` was last given (on CUDA: it started a copy)."""
        return self._log_step

    def read(self) -> Any:
        """The kept loss for ``LightningModule.log``: a host tensor where :meth:`keep` copied it
        (after waiting for that copy only), else the kept tensor itself.

        Raises:
            RuntimeError: nothing kept yet (no ``training_step`` ran).
        """
        if self._loss is None:
            raise RuntimeError("LogStepLoss.read before any keep")
        if self._event is None:
            return self._loss
        self._event.synchronize()
        return self._host.clone()


def pin_memory(accelerator: str) -> bool:
    """Whether data loaders pin their batches: on GPUs only (pinning costs host time on CPU runs)."""
    return accelerator == "gpu"
