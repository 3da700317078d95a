"""Strategy subclasses that let Lightning's FSDP run on CPU ranks (gloo), for local rehearsal.

Stock Lightning refuses ``FSDPStrategy`` with ``accelerator="cpu"`` (the check compares the
strategy's exact type) and wraps the model with ``device_id=root_device.index``, which is
``None`` on CPU; torch's FSDP then looks for an accelerator and fails. The subclass wraps the
model itself with ``device_id=torch.device("cpu")`` and leaves everything else (sharding,
checkpointing, precision) to Lightning. Use sharded state-dict checkpoints on CPU: gathering a
full state dict segfaults there (LAB-NOTES).
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy for CPU processes (gloo); same arguments as ``FSDPStrategy``."""

    def _setup_model(self, model: nn.Module) -> nn.Module:
        """Wrap ``model`` in FSDP on the CPU, then let Lightning finish its set-up."""
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
