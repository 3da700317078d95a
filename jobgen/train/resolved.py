"""The resolved spec file the planner writes for every job, and checks that need no torch.

Format (JSON)::

    {"jobgen_version": "0.1.0", "inputs_sha256": "<hex>", "profile": "local",
     "spec": {... TrainingSpec ...},
     "launch": {"scheduler": "local", "accelerator": "cpu", "num_nodes": 1,
                "devices_per_node": 2, "world_size": 2, "deepspeed_config": null,
                "requeue_signal": null, "gpu_type": null, "cluster": null}}

``launch.deepspeed_config`` is relative to the spec file's directory. Unknown keys are ignored
(newer planners may add some) and reported as a warning. Everything here raises
:class:`jobgen.errors.JobgenError` subclasses (exit 2) with the file and JSON path.
"""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobgen.deepspeed import check_deepspeed_config
from jobgen.errors import ConfigError, NotSupportedError, json_path
from jobgen.spec import TrainingSpec


class LaunchSpec(BaseModel):
    """Where and how the job was launched, as decided by the planner."""

    model_config = ConfigDict(extra="ignore", frozen=True, use_attribute_docstrings=True)

    scheduler: Literal["local", "slurm", "kubernetes"]
    """Which backend launched the job."""
    accelerator: Literal["cpu", "gpu"]
    """Device type of every rank."""
    num_nodes: int = Field(ge=1)
    """Nodes (SLURM nodes, Kubernetes pods, 1 for local)."""
    devices_per_node: int = Field(ge=1)
    """Processes (GPUs) per node."""
    world_size: int = Field(ge=1)
    """Total processes = num_nodes x devices_per_node."""
    deepspeed_config: str | None = None
    """DeepSpeed JSON config, relative to the spec file's directory (DeepSpeed strategies only)."""
    requeue_signal: str | None = None
    """SLURM: the signal (name without ``SIG``) that asks the job to checkpoint and requeue."""
    gpu_type: str | None = None
    """GPU model (informational)."""
    cluster: str | None = None
    """SLURM cluster name from the profile (informational; used in job handles)."""

    @field_validator("requeue_signal")
    @classmethod
    def _known_signal(cls, value: str | None) -> str | None:
        if value is not None and not isinstance(getattr(signal, "SIG" + value, None), signal.Signals):
            raise ValueError(f"unknown signal {value!r}; give a name without 'SIG', e.g. 'USR1' or 'USR2'")
        return value

    @model_validator(mode="after")
    def _world_size_is_product(self) -> LaunchSpec:
        if self.world_size != self.num_nodes * self.devices_per_node:
            raise ValueError(
                f"world_size={self.world_size} but num_nodes x devices_per_node = "
                f"{self.num_nodes} x {self.devices_per_node} = {self.num_nodes * self.devices_per_node}"
            )
        return self


class ResolvedSpec(BaseModel):
    """The whole resolved spec file: training spec plus launch facts."""

    model_config = ConfigDict(extra="ignore", frozen=True, use_attribute_docstrings=True)

    jobgen_version: str | None = None
    """Version of jobgen that planned the job."""
    inputs_sha256: str | None = None
    """Hash of the planner's inputs (spec + profile)."""
    profile: str | None = None
    """Cluster profile name."""
    spec: TrainingSpec
    """What to train."""
    launch: LaunchSpec
    """Where it runs."""


def _unknown_keys(raw: dict[str, Any]) -> list[str]:
    unknown = [k for k in raw if k not in ResolvedSpec.model_fields]
    launch = raw.get("launch")
    if isinstance(launch, dict):
        unknown += [f"launch.{k}" for k in launch if k not in LaunchSpec.model_fields]
    return unknown


def load_resolved_spec(path: Path) -> tuple[ResolvedSpec, list[str]]:
    """Read and validate a resolved spec file.

    Returns:
        the spec, and the unknown keys that were ignored (for a warning).

    Raises:
        ConfigError: missing/unreadable file, invalid JSON, or a field that fails validation.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the spec file: {exc.strerror or exc}",
            location=str(path),
            hint="pass the spec.json that `jobgen` rendered next to the job script",
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", location=str(path)
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"expected a JSON object with 'spec' and 'launch', got {type(raw).__name__}", location=str(path)
        )
    try:
        resolved = ResolvedSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more error(s))" if exc.error_count() > 1 else ""
        raise ConfigError(
            f"{first['msg']}{more}",
            location=f"{path}: {json_path(first['loc'])}",
            hint="re-render the job with `jobgen` after fixing the training spec",
        ) from None
    return resolved, _unknown_keys(raw)


def check_runtime_support(resolved: ResolvedSpec) -> None:
    """Reject combinations this entrypoint cannot run on the launch's accelerator.

    Raises:
        NotSupportedError: FSDP's HYBRID_SHARD, a full FSDP state dict, fp8
            (``transformer-engine``) or QLoRA (``load_in_4bit``) on CPU (DeepSpeed ZeRO 1-3 and
            the other FSDP sharding strategies rehearse on CPU with gloo); fp8 on a GPU node
            without the ``transformer_engine`` package.
        ConfigError: fp16 on CPU; a DeepSpeed strategy without a DeepSpeed config.
    """
    trainer, launch = resolved.spec.trainer, resolved.launch
    if launch.accelerator == "cpu":
        if trainer.strategy == "fsdp" and trainer.fsdp_sharding_strategy == "HYBRID_SHARD":
            # Measured with this check bypassed (2 CPU ranks, the strategy-matrix job): it runs
            # but does not train the same model: val_loss 3.3004 vs 3.2415 for ddp, FULL_SHARD,
            # SHARD_GRAD_OP and ZeRO 2/3; torch derives the intra-node shard group from the
            # accelerator's device count. A silent divergence is worse than a refusal.
            raise NotSupportedError(
                "fsdp_sharding_strategy 'HYBRID_SHARD' on CPU: hybrid sharding needs one GPU per rank",
                location="spec.trainer.fsdp_sharding_strategy",
                hint="use FULL_SHARD, SHARD_GRAD_OP or NO_SHARD for local runs",
            )
        if resolved.spec.model.load_in_4bit:
            raise NotSupportedError(
                "model.load_in_4bit (QLoRA, bitsandbytes 4-bit) on CPU: 4-bit quantisation runs on CUDA GPUs only",
                location="spec.model.load_in_4bit",
                hint="remove load_in_4bit to train plain LoRA adapters on CPU, or run on a GPU profile",
            )
        if trainer.precision == "transformer-engine":
            raise NotSupportedError(
                "precision 'transformer-engine' (fp8) cannot run on CPU",
                location="spec.trainer.precision",
                hint="use '32-true' or 'bf16-mixed' on CPU",
            )
        if trainer.strategy == "fsdp" and trainer.fsdp_state_dict_type == "full":
            raise NotSupportedError(
                "fsdp_state_dict_type 'full' on CPU: gathering a full FSDP state dict segfaults on CPU ranks",
                location="spec.trainer.fsdp_state_dict_type",
                hint="use 'sharded' for local runs",
            )
        if trainer.precision == "16-mixed":
            raise ConfigError(
                "precision '16-mixed' (fp16) cannot run on CPU",
                location="spec.trainer.precision",
                hint="use '32-true' or 'bf16-mixed' on CPU",
            )
    elif trainer.precision == "transformer-engine" and importlib.util.find_spec("transformer_engine") is None:
        raise NotSupportedError(
            "precision 'transformer-engine' needs NVIDIA Transformer Engine, which is not installed here",
            location="spec.trainer.precision",
            hint="install it on the nodes (pip install 'transformer-engine[pytorch]'), or use bf16-mixed",
        )
    if trainer.deepspeed_stage is not None and not launch.deepspeed_config:
        raise ConfigError(
            f"strategy {trainer.strategy!r} needs launch.deepspeed_config (the rendered ds_config.json)",
            location="launch.deepspeed_config",
            hint="re-render the job with `jobgen`, which writes ds_config.json next to spec.json",
        )


def load_deepspeed_config(resolved: ResolvedSpec, spec_path: Path) -> tuple[Path, dict[str, Any]]:
    """Read the rendered DeepSpeed config and check it against the spec.

    The file is the source of truth for DeepSpeed settings. Lightning sets
    ``gradient_accumulation_steps`` itself (from ``accumulate_grad_batches``) and refuses a
    config that already has it, so the key is checked against the spec and removed.

    Returns:
        the resolved path and the config dict to hand to ``DeepSpeedStrategy(config=...)``.

    Raises:
        ConfigError: unreadable file, or batch sizes / ZeRO stage that disagree with the spec.
        DeepSpeedConfigError: a rule DeepSpeed does not check (see
            :func:`jobgen.deepspeed.check_deepspeed_config`).
    """
    if not resolved.launch.deepspeed_config:
        check_runtime_support(resolved)  # raises the "needs launch.deepspeed_config" error
        raise ConfigError("launch.deepspeed_config is empty", location="launch.deepspeed_config")
    path = Path(resolved.launch.deepspeed_config)
    if not path.is_absolute():
        path = spec_path.parent / path
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the DeepSpeed config: {exc}", location=str(path)) from None
    if not isinstance(config, dict):
        raise ConfigError("the DeepSpeed config must be a JSON object", location=str(path))
    check_deepspeed_config(config, str(path))  # the file may have been edited after rendering
    trainer, world_size = resolved.spec.trainer, resolved.launch.world_size
    expected = {
        "gradient_accumulation_steps": trainer.gradient_accumulation_steps,
        "train_micro_batch_size_per_gpu": trainer.micro_batch_size,
        "train_batch_size": trainer.micro_batch_size * trainer.gradient_accumulation_steps * world_size,
    }
    for key, want in expected.items():
        if key in config and config[key] != want:
            raise ConfigError(
                f"{key}={config[key]!r} in the DeepSpeed config, but the spec gives {want}",
                location=f"{path}: {key}",
                hint="re-render the job with `jobgen` so spec.json and ds_config.json agree",
            )
    stage = (config.get("zero_optimization") or {}).get("stage")
    if stage is not None and stage != trainer.deepspeed_stage:
        raise ConfigError(
            f"zero_optimization.stage={stage!r} in the DeepSpeed config, but the spec's strategy is "
            f"{trainer.strategy!r}",
            location=f"{path}: zero_optimization.stage",
            hint="re-render the job with `jobgen` so spec.json and ds_config.json agree",
        )
    config.pop("gradient_accumulation_steps", None)
    return path, config
