"""Checks of a resolved spec that the entrypoint makes before any rank starts (torch-free).

The file format itself (:class:`jobgen.jobdir.ResolvedSpec`, read with
:func:`jobgen.jobdir.load_resolved_spec`) is the job directory's contract; the rules that tie
a spec to a world are :mod:`jobgen.planning.rules`, the same ones the planner applied. Everything here
raises :class:`jobgen.errors.JobgenError` subclasses (exit 2) with the file and JSON path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir.spec import ResolvedSpec
from jobgen.planning.deepspeed import check_deepspeed_config
from jobgen.planning.rules import check_elastic, check_support, elastic_nodes, elastic_world


def check_runtime_support(resolved: ResolvedSpec) -> None:
    """Refuse what this node cannot run, with the planner's words (:func:`jobgen.planning.rules.check_support`
    for the launch's accelerator and GPU type, plus the packages the node needs), and a
    DeepSpeed strategy without its config.

    Raises:
        PlanError: see :func:`jobgen.planning.rules.check_support`; the location is ``spec.<field>``.
        ConfigError: a DeepSpeed strategy without ``launch.deepspeed_config``; an unresolved
            ``micro_batch_size: auto``.
    """
    launch = resolved.launch
    if resolved.spec.entrypoint is not None:
        e = resolved.spec.entrypoint
        raise ConfigError(
            f"this job runs its own entrypoint ({'module ' + e.module if e.module else 'script ' + str(e.script)}), "
            "not python -m jobgen.train",
            location="spec.entrypoint",
            hint="submit the job directory with `jobgen submit DIR` (it launches the entrypoint), or remove entrypoint",
        )
    if resolved.spec.trainer.micro_batch_size == "auto":
        raise ConfigError("trainer.micro_batch_size is 'auto', which `jobgen plan`/`render`/`submit` resolve to a number; "
                          "this spec.json was not made by them", location="spec.trainer.micro_batch_size",
                          hint="render the job with jobgen (spec.json then records the number), or give a number")
    try:
        check_support(resolved.spec, launch.accelerator, launch.gpu_type, where="this node", on_node=True)
    except PlanError as exc:
        exc.location = f"spec.{exc.location}"  # the field inside spec.json; main() prefixes the file
        raise
    try:
        check_elastic(resolved.spec, resolved.world, spec_source="")
    except PlanError as exc:
        exc.location = f"spec.{(exc.location or '').removeprefix(': ')}"
        raise
    if resolved.spec.trainer.deepspeed_stage is not None and not launch.deepspeed_config:
        raise ConfigError(
            f"strategy {resolved.spec.trainer.strategy!r} needs launch.deepspeed_config (the rendered ds_config.json)",
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
            :func:`jobgen.planning.deepspeed.check_deepspeed_config`).
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
    trainer = resolved.spec.trainer
    expected = {
        "gradient_accumulation_steps": trainer.gradient_accumulation_steps,
        "train_micro_batch_size_per_gpu": trainer.micro_batch_size,
        "train_batch_size": resolved.world.global_batch_size,
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


def runtime_world(resolved: ResolvedSpec, environ: Mapping[str, str]) -> ResolvedSpec:
    """``resolved`` with the world this process runs in. A fixed world is the planned one. An
    elastic job's (``launch.min_nodes`` set) is the one torchrun's rendezvous formed, somewhere
    in ``min_nodes..num_nodes`` (:func:`jobgen.planning.rules.elastic_nodes`: WORLD_SIZE over the
    processes per node): Lightning's TorchElasticEnvironment stops every rank unless
    Trainer(devices x num_nodes) equals WORLD_SIZE, and the data module's samples per step and
    DistributedSampler follow the same count. The global batch stays the planned one and the
    accumulation is recomputed for this world (:func:`jobgen.planning.rules.elastic_world`): the
    returned spec's ``trainer.gradient_accumulation_steps`` is the accumulation here and its
    ``trainer.global_batch_size`` the batch every world keeps. ``min_nodes`` stays, so the job
    is still known to be elastic. Call it after :func:`check_runtime_support`, which checks the
    planned range.

    Raises:
        PlanError: not started by torchrun, a world outside the planned range, or one that
            cannot keep the global batch.
    """
    launch = resolved.launch
    if launch.min_nodes is None:
        return resolved
    planned = resolved.world
    world = elastic_world(planned, elastic_nodes(planned, environ))
    launch = launch.model_copy(update={"num_nodes": world.num_nodes, "world_size": world.world_size})
    trainer = resolved.spec.trainer.model_copy(update={
        "gradient_accumulation_steps": world.gradient_accumulation_steps, "global_batch_size": world.global_batch_size})
    return resolved.model_copy(update={"launch": launch, "spec": resolved.spec.model_copy(update={"trainer": trainer})})
