"""The seed benchmark table: measured throughput and per-GPU memory of Llama-7B QLoRA recipes.

Provenance: the throughput table of SparkTrainer's Distributed Training Guide (public). jobgen did not
measure these figures (its build machines have no GPU); they are the reference ``jobgen plan``
prints next to its estimate (:mod:`jobgen.planning.estimate_hf`) and the test of that estimate
(tests/unit/test_estimate_hf.py) compares against. This module is their one home.

Recipe of every row (stated with the FSDP row, assumed for the others, which the table gives no
batch for): Llama-7B, QLoRA (4-bit NF4 base, double quantisation), LoRA r 64, alpha 16 on the seven
projections (q/k/v/o/gate/up/down_proj), bf16, sequence 2048, micro batch 4, gradient
accumulation 4.

Units: the table prints "GB". jobgen reads it as GB = 10**9 bytes (:data:`SEED_GB`): that is
what the unit says, and the table names no tool that would print binary units under a decimal
name. Read as GiB the figures would be 7.4% larger; the comparison's tolerance
(tests/unit/test_estimate_hf.py) is wider than that, so the choice does not decide a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

SEED_GB = 10**9
"""Bytes in the table's "GB" (decimal; see the module docstring)."""

SEED_SOURCE = "SparkTrainer's Distributed Training Guide, its throughput table"
"""Where the figures come from (printed with them)."""


@dataclass(frozen=True)
class SeedRow:
    """One measured recipe: a strategy on ``gpus`` GPUs, its throughput and peak memory per GPU."""

    recipe: str
    """The table's name for it, e.g. ``FSDP + QLoRA``."""
    strategy: str
    """The spec's ``trainer.strategy`` that runs it (``ddp``, ``fsdp``, ``deepspeed_stage_N``)."""
    gpus: int
    """World size (GPUs in all)."""
    tokens_per_s: int
    """Training throughput of the whole job, tokens per second."""
    mem_gb_per_gpu: float
    """Measured peak memory of one GPU, in the table's GB (:data:`SEED_GB` bytes)."""
    micro_batch_size: int = 4
    block_size: int = 2048
    gradient_accumulation_steps: int = 4
    lora_r: int = 64
    lora_alpha: float = 16.0
    quantized: bool = True
    """QLoRA (4-bit base)."""

    @property
    def mem_bytes_per_gpu(self) -> int:
        """:attr:`mem_gb_per_gpu` in bytes."""
        return int(self.mem_gb_per_gpu * SEED_GB)


#: Llama-7B QLoRA recipes (all rows: sequence 2048, micro batch 4, accumulation 4, r 64, bf16).
LLAMA_7B_QLORA: tuple[SeedRow, ...] = (
    SeedRow("FSDP + QLoRA", "fsdp", 4, 31_200, 22),
    SeedRow("DDP + QLoRA", "ddp", 1, 2_100, 24),
    SeedRow("DeepSpeed ZeRO-2 + QLoRA", "deepspeed_stage_2", 4, 28_800, 20),
    SeedRow("DeepSpeed ZeRO-3 + QLoRA", "deepspeed_stage_3", 8, 54_000, 18),
)

SEVEN_B_RANGE = (6_000_000_000, 8_000_000_000)
"""Parameter counts treated as "~7B" when matching a spec to the table (Llama-7B: 6.74B)."""


def match(strategy: str, world_size: int, quantized: bool, n_params: int) -> SeedRow | None:
    """The seed row for a spec: same strategy (FSDP of any sharding strategy counts as ``fsdp``),
    same world size, QLoRA, and a ~7B model (:data:`SEVEN_B_RANGE`); ``None`` when none matches."""
    if not quantized or not SEVEN_B_RANGE[0] <= n_params <= SEVEN_B_RANGE[1]:
        return None
    return next((row for row in LLAMA_7B_QLORA if row.strategy == strategy and row.gpus == world_size), None)
