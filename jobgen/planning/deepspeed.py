"""TrainingSpec -> DeepSpeed config dict (serialised with json.dumps, never Jinja).

The dict is what DeepSpeed runs: the entrypoint passes the rendered ``ds_config.json`` to
Lightning's DeepSpeedStrategy. Batch keys follow DeepSpeed's rule
``train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size``
(deepspeed/runtime/config.py ``_batch_assertion``).
"""

from __future__ import annotations

from typing import Any

from jobgen.errors import DeepSpeedConfigError, PlanError, did_you_mean
from jobgen.jobdir.files import pretty_json
from jobgen.jobdir.world import World
from jobgen.specs.training import TrainingSpec

#: Bucket sizes in elements (DeepSpeed's defaults are 5e8; 2e8 halves the communication
#: buffers with no measurable loss of overlap on A100/H100 per DeepSpeed's tuning guide).
BUCKET_ELEMENTS = 200_000_000

#: Top-level keys DeepSpeed 0.19.8 reads: every key ``deepspeed.runtime.config.DeepSpeedConfig``
#: looks up (recorded by running it on a dict that logs lookups), plus the sections read
#: elsewhere (optimizer/scheduler, activation checkpointing, AIO, flops profiler, autotuning).
#: DeepSpeed silently ignores any other key (measured), so a typo there changes nothing.
DEEPSPEED_TOP_LEVEL_KEYS = frozenset({
    "activation_checkpointing", "aio", "amp", "autotuning", "bf16", "bfloat16", "checkpoint", "comet",
    "comms_logger", "communication_data_type", "compile", "compression_training", "csv_monitor",
    "curriculum_learning", "data_efficiency", "data_types", "dataloader_drop_last", "datastates_ckpt",
    "disable_allgather", "disable_python_gc", "dump_state", "eigenvalue", "elasticity", "expert_parallel",
    "flops_profiler", "fp16", "fp32_allreduce", "gradient_accumulation_steps", "gradient_allreduce_op",
    "gradient_clipping", "gradient_predivide_factor", "graph_harvesting", "hybrid_engine", "log_level",
    "managed_gradient_accumulation", "memory_breakdown", "nebula", "optimizer", "pipeline",
    "prescale_gradients", "progressive_layer_drop", "quantize_training", "scheduler",
    "seq_parallel_communication_data_type", "sequence_parallel_size", "sparse_attention",
    "sparse_gradients", "steps_per_print", "tensor_parallel", "tensorboard", "timers", "torch_autocast",
    "train_batch_size", "train_micro_batch_size_per_gpu", "use_data_before_expert_parallelism",
    "vocabulary_size", "wall_clock_breakdown", "wandb", "weight_quantization",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "zero_optimization",
})  # fmt: skip


def deepspeed_config(spec: TrainingSpec, world: World) -> dict[str, Any]:
    """Build the DeepSpeed config for ``spec`` on ``world`` (its ``global_batch_size`` is
    DeepSpeed's ``train_batch_size``).

    Raises:
        PlanError: the strategy is not DeepSpeed, or the batch keys would not be consistent.
        DeepSpeedConfigError: see :func:`check_deepspeed_config` (not reachable from a valid spec).
    """
    t = spec.trainer
    stage = t.deepspeed_stage
    if stage is None:
        raise PlanError(f"strategy {t.strategy!r} is not a DeepSpeed strategy")
    train_batch = world.global_batch_size
    if t.global_batch_size is not None and t.global_batch_size != train_batch:
        raise PlanError(
            f"DeepSpeed train_batch_size would be {train_batch} but global_batch_size is {t.global_batch_size}"
        )
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": BUCKET_ELEMENTS,
    }
    if stage in (1, 2):
        zero["allgather_bucket_size"] = BUCKET_ELEMENTS
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = BUCKET_ELEMENTS // 4
        zero["stage3_param_persistence_threshold"] = 1_000_000
    if t.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(t.offload_optimizer, t.nvme_path)
    if t.offload_params != "none":
        zero["offload_param"] = _offload(t.offload_params, t.nvme_path)
    config: dict[str, Any] = {
        "train_batch_size": train_batch,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "gradient_clipping": t.gradient_clip_val if t.gradient_clip_val is not None else 0.0,
        "zero_optimization": zero,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer is on by default and synchronises the device at the start
        # and end of every micro batch (deepspeed/utils/timer.py ThroughputTimer, 0.19.8) to time
        # samples/s, which jobgen's entrypoint measures itself without a sync.
        "timers": {"throughput": {"enabled": False}},
    }
    if t.precision.startswith("bf16"):
        config["bf16"] = {"enabled": True}
    elif t.precision == "16-mixed":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1}
    check_deepspeed_config(config, "<rendered ds_config.json>")  # the spec's validators make this hold
    return config


def check_deepspeed_config(config: dict[str, Any], source: str) -> None:
    """Check what DeepSpeed's own validator accepts but cannot run as meant (measured
    against ``DeepSpeedConfig`` of deepspeed 0.19.8).

    Run on every config jobgen renders (plan time) and on the ``ds_config.json`` the entrypoint
    reads, which may have been edited by hand after rendering.

    Args:
        config: the DeepSpeed config dict.
        source: where it came from (a file name), used as the error location prefix.

    Raises:
        DeepSpeedConfigError: an unknown top-level key (ignored by DeepSpeed); ``offload_param``
            with ZeRO stage < 3 (ignored: parameters are partitioned only by stage 3); NVMe
            offload without ``nvme_path``; a negative ``gradient_clipping`` (DeepSpeed takes
            any value > 0 as a norm bound and silently skips clipping otherwise).
    """
    for key in config:
        if key not in DEEPSPEED_TOP_LEVEL_KEYS:
            suggestion = did_you_mean(str(key), DEEPSPEED_TOP_LEVEL_KEYS)
            raise DeepSpeedConfigError(
                f"unknown DeepSpeed config key {key!r}: DeepSpeed ignores it silently"
                + (f" ({suggestion})" if suggestion else ""),
                location=f"{source}: {key}",
                hint="remove the key or fix its spelling (see https://www.deepspeed.ai/docs/config-json/)",
            )
    clip = config.get("gradient_clipping")
    if isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip < 0:
        raise DeepSpeedConfigError(
            f"gradient_clipping={clip!r} is negative; DeepSpeed would silently not clip",
            location=f"{source}: gradient_clipping",
            hint="give the maximum gradient norm (> 0), or 0.0 for no clipping "
            "(in the spec: trainer.gradient_clip_val, null for none)",
        )
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    stage = zero.get("stage", 0)
    for section in ("offload_optimizer", "offload_param"):
        offload = zero.get(section)
        if not isinstance(offload, dict) or offload.get("device", "none") == "none":
            continue
        where = f"{source}: zero_optimization.{section}"
        if section == "offload_param" and stage != 3:
            raise DeepSpeedConfigError(
                f"offload_param (device {offload.get('device')!r}) with zero_optimization.stage={stage!r}: "
                "only ZeRO stage 3 partitions parameters, so DeepSpeed ignores it",
                location=where,
                hint="use strategy deepspeed_stage_3, or remove offload_param (trainer.offload_params: none)",
            )
        if offload.get("device") == "nvme" and not offload.get("nvme_path"):
            raise DeepSpeedConfigError(
                f"{section}.device is 'nvme' but {section}.nvme_path is not set",
                location=f"{where}.nvme_path",
                hint="set trainer.nvme_path to a directory on a local NVMe drive and re-render",
            )


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        out["nvme_path"] = nvme_path
    return out


def dumps(config: dict[str, Any]) -> str:
    """Serialise a DeepSpeed config deterministically (sorted keys, 2-space indent, final newline)."""
    return pretty_json(config)
