"""Strategy subclasses that let Lightning's FSDP and DeepSpeed run on CPU ranks (gloo), for
local rehearsal of the multi-GPU strategies.

Stock Lightning refuses both on CPU (measured with Lightning's stock strategies):

* ``FSDPStrategy`` with ``accelerator="cpu"``: the accelerator connector compares the
  strategy's exact type, and the model is wrapped with ``device_id=root_device.index``, which
  is ``None`` on CPU, so torch's FSDP looks for an accelerator and fails.
  :class:`CPUFSDPStrategy` wraps the model itself with ``device_id=torch.device("cpu")``.
* ``DeepSpeedStrategy``: ``setup_environment`` raises unless the accelerator is CUDA, and
  ``deepspeed.initialize`` gets ``args.device_rank=root_device.index`` (``None`` on CPU).
  :class:`CPUDeepSpeedStrategy` sets up the process group as DDP does (gloo) and passes the
  local rank instead.

Everything else (sharding, ZeRO partitioning and offload, checkpointing, precision) is left to
Lightning and the engines. Use sharded state-dict checkpoints with FSDP on CPU: gathering a
full state dict segfaults there.

Two of the overrides are private Lightning methods, as no public hook wraps the model or calls
``deepspeed.initialize``: ``FSDPStrategy._setup_model`` and
``DeepSpeedStrategy._setup_model_and_optimizer`` (lightning/pytorch/strategies/fsdp.py and
deepspeed.py, Lightning 2.6). tests/entrypoint/test_lightning_api.py pins them, their parameters,
that Lightning still calls them, and the FSDPStrategy attributes read here (``kwargs``,
``cpu_offload``, ``sharding_strategy``, ``mixed_precision_config``); setup.cfg bounds lightning.
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from typing import Any

import torch
from lightning.pytorch.plugins.precision import FSDPPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy
from torch import nn


class CPUFSDPPrecision(FSDPPrecision):
    """Lightning's FSDP precision plugin with CPU autocast for the mixed precisions.

    ``FSDPPrecision.forward_context`` opens ``torch.autocast("cuda")`` for ``bf16-mixed`` /
    ``16-mixed`` (lightning/pytorch/plugins/precision/fsdp.py, Lightning 2.6), which does
    nothing on a CPU rank: the forward then ran FSDP's bf16 parameters without autocast, unlike
    a GPU rank (peft's LoRA layers, which cast their input only where autocast is off, then
    fail with ``expected m1 and m2 to have the same dtype``).
    """

    def forward_context(self) -> AbstractContextManager:
        """``torch.autocast("cpu")`` in the mixed precisions; the parent's context otherwise."""
        if "mixed" in self.precision:
            return torch.autocast("cpu", dtype=torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16)
        return super().forward_context()


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy for CPU processes (gloo); same arguments as ``FSDPStrategy``.

    ``activation_checkpointing_policy`` works as in the parent: Lightning applies it after
    wrapping, also to a model wrapped here. The precision plugin Lightning hands over is
    replaced by :class:`CPUFSDPPrecision` (same precision and scaler).
    """

    @property
    def precision_plugin(self) -> FSDPPrecision:
        """The parent's plugin (see :class:`CPUFSDPPrecision` for the set-up)."""
        return FSDPStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        if type(plugin) is FSDPPrecision:
            plugin = CPUFSDPPrecision(plugin.precision, plugin.scaler)
        FSDPStrategy.precision_plugin.fset(self, plugin)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        """Wrap ``model`` in FSDP on the CPU, then let Lightning finish its set-up.

        Overrides the private ``FSDPStrategy._setup_model`` (called from ``FSDPStrategy.setup``),
        which wraps with ``device_id=root_device.index`` (``None`` on CPU) unless the model is
        already wrapped; the parent then applies activation checkpointing.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            model = FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                **self.kwargs,
            )
            # Already applied above; Lightning would otherwise warn that it is ignored.
            self.kwargs.pop("auto_wrap_policy", None)
        return super()._setup_model(model)


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy for CPU processes (gloo); same arguments as the parent.

    DeepSpeed's CPU accelerator runs ZeRO stages 1-3, with optimizer (and, on stage 3,
    parameter) offload to ``cpu`` when the optimizer is ``DeepSpeedCPUAdam`` (DeepSpeed rejects
    torch's AdamW with offload; :class:`jobgen.train.model.LitGPT` switches itself). fp16 is
    not available on CPU (DeepSpeed refuses it); use ``32-true`` or ``bf16``.
    """

    def setup_environment(self) -> None:
        """DDP's set-up (torch.distributed with gloo), without the parent's CUDA-only check."""
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        """Initialise the process group as DDP does; DeepSpeed then adopts it
        (``deepspeed.initialize(dist_init_required=False)``)."""
        DDPStrategy.setup_distributed(self)

    def _setup_model_and_optimizer(
        self, model: nn.Module, optimizer: Any, lr_scheduler: Any = None
    ) -> tuple[Any, Any]:
        """``deepspeed.initialize`` as in the parent, with ``device_rank`` = the local rank.

        Overrides the private ``DeepSpeedStrategy._setup_model_and_optimizer`` (called from
        ``DeepSpeedStrategy._initialize_deepspeed_train`` and ``_setup_model_and_optimizers``),
        which passes ``device_rank=root_device.index`` (``None`` on CPU).

        Returns:
            the ``DeepSpeedEngine`` and DeepSpeed's wrapped optimizer.
        """
        import deepspeed

        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),
            config=self.config,
            model=model,
            model_parameters=filter(lambda p: p.requires_grad, model.parameters()),
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, ds_optimizer
