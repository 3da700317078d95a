"""Build the Lightning Trainer from a resolved spec, train, validate, write ``summary.json``.

Imported by :mod:`jobgen.train.__main__` only after the spec and data sources were checked,
so that bad input fails fast without importing torch and Lightning.

Run directory layout (``<run_dir>``)::

    data/{train,val}.bin, data/manifest.json   the byte stream (built once, reused)
    checkpoints/step-<N>.ckpt, last.ckpt       step checkpoints; hpc_ckpt_<n>.ckpt on SLURM requeue
    logs/version_<n>/metrics.csv               CSV metrics, one version per (re)start
    logs/version_<n>/tensorboard/              TensorBoard events (``trainer.tensorboard: true``)
    summary.json                               final step, val_loss, throughput, MFU, peak memory, checkpoints, code
    code/<commit>[-dirty-<sha>]/               the code snapshot jobgen submit took (SLURM, local; $JOBGEN_CODE_DIR)
    curves.png                                 loss and tokens/s over steps, all versions (rank zero, at the end)
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, Strategy

from jobgen.errors import ConfigError
from jobgen.jobdir import SUMMARY_FILE, write_atomic
from jobgen.train.build import DataSources, build_datamodule, build_module
from jobgen.train.callbacks import FSDPGradNormClipping, LineProgress, RequeueOnSignal, Throughput
from jobgen.train.checkpoints import FoundCheckpoint, StepCheckpoint, newest_checkpoint
from jobgen.train.hf import ParamCounts
from jobgen.train.measure import MEMORY_KINDS, flops_per_token, peak_flops_per_s, peak_memory, plot_curves
from jobgen.train.model import Block
from jobgen.train.notify import notify_callback, notify_finished
from jobgen.train.resolved import ResolvedSpec, load_deepspeed_config
from jobgen.train.sources import SplitLayout
from jobgen.train.strategies import CPUDeepSpeedStrategy, CPUFSDPStrategy
from jobgen.usage import run_usage

# Known, harmless for this entrypoint; they would only confuse people reading job logs.
_QUIET_WARNINGS = (
    # Data is a memory-mapped byte file: loading in the main process is fast enough.
    r".*does not have many workers.*",
    # The data module continues at global_step x samples_per_step, so mid-epoch resume is exact.
    r".*resuming from a checkpoint that ended before the epoch ended.*",
    # FSDP sharded checkpoints: torch's own deprecation notice, and the intended overwrite of last.ckpt.
    r".*Please use DTensor instead and we are deprecating ShardedTensor.*",
    r".*Detected an existing checkpoint in .*, overwriting since self.overwrite=True.*",
    # Lightning's own use of a deprecated torch pytree API (lightning 2.6 + torch 2.13).
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    # DeepSpeed's collectives on gloo use torch APIs that torch 2.13 deprecates (every step).
    r".*`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated.*",
)


class _DropTips(logging.Filter):
    """Drops Lightning's advertising lines ("💡 Tip: ... litlogger ...") from job logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡")


def _quiet_lightning(user_code: bool = False) -> None:
    for pattern in _QUIET_WARNINGS:
        if user_code and "resuming from a checkpoint" in pattern:
            continue  # a user's loaders restart their epoch on a mid-epoch resume: Lightning's warning stays
        warnings.filterwarnings("ignore", message=pattern)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropTips())


def rank_zero_print(*args: Any) -> None:
    """``print`` on global rank zero only (flushed: job logs are files)."""
    if rank_zero_only.rank == 0:
        print(*args, flush=True)


@dataclass(frozen=True)
class RunPaths:
    """Paths inside a run directory."""

    run_dir: Path

    @property
    def checkpoints(self) -> Path:
        """``<run_dir>/checkpoints``: step checkpoints, ``last.ckpt``, ``hpc_ckpt_*.ckpt``."""
        return self.run_dir / "checkpoints"

    @property
    def data(self) -> Path:
        """``<run_dir>/data``: ``train.bin``, ``val.bin``, ``manifest.json``."""
        return self.run_dir / "data"

    @property
    def summary(self) -> Path:
        """``<run_dir>/summary.json``."""
        return self.run_dir / SUMMARY_FILE

    @property
    def curves(self) -> Path:
        """``<run_dir>/curves.png``: loss and tokens/s over optimizer steps."""
        return self.run_dir / "curves.png"


def _fsdp_policies(resolved: ResolvedSpec) -> tuple[set[type] | None, set[type] | None]:
    """FSDP auto-wrap and activation-checkpointing classes: the spec's class paths, else jobgen's
    GPT ``Block`` for the built-in GPT (and no wrapping policy for a ``class_path`` model: the
    whole model is one FSDP unit)."""
    t, user = resolved.spec.trainer, resolved.spec.user_code
    from jobgen.user_code import policy_classes

    if t.fsdp_auto_wrap_policy is not None:
        wrap: set[type] | None = policy_classes(t.fsdp_auto_wrap_policy, "spec.", "fsdp_auto_wrap_policy")
    else:
        wrap = None if user else {Block}
    if t.fsdp_activation_checkpointing_policy is not None:
        ckpt: set[type] | None = policy_classes(t.fsdp_activation_checkpointing_policy, "spec.",
                                                "fsdp_activation_checkpointing_policy")
    else:
        ckpt = {Block} if t.activation_checkpointing and not user else None
    return wrap, ckpt


def build_strategy(resolved: ResolvedSpec, spec_path: Path) -> Strategy | str:
    """The Lightning strategy for ``spec.trainer.strategy`` on ``launch.accelerator``.

    ddp: ``DDPStrategy`` with gloo on CPU and NCCL on GPU (``"auto"`` for a single process),
    ``static_graph`` / ``gradient_as_bucket_view`` / ``find_unused_parameters`` from the spec.
    fsdp: ``FSDPStrategy`` wrapping each :class:`Block` (or the spec's
    ``fsdp_auto_wrap_policy`` classes), sharded (or, on GPU, full) state-dict checkpoints,
    activation checkpointing of each :class:`Block` when ``trainer.activation_checkpointing``
    (or of the ``fsdp_activation_checkpointing_policy`` classes), the spec's prefetch and
    all-gather settings (:class:`CPUFSDPStrategy` with gloo on CPU).
    deepspeed_stage_N: ``DeepSpeedStrategy`` configured by the rendered ``ds_config.json``, the
    one source of DeepSpeed settings (:class:`CPUDeepSpeedStrategy` with gloo on CPU).

    Raises:
        ConfigError: the DeepSpeed config is unreadable or disagrees with the spec
            (see :func:`jobgen.train.resolved.load_deepspeed_config`).
    """
    trainer, launch = resolved.spec.trainer, resolved.launch
    if trainer.strategy == "ddp":
        if launch.world_size == 1:
            return "auto"
        # find_unused_parameters is passed only when on (torch's default is off), as the FSDP
        # knobs below only when set: the kwargs of specs without them stay what they were
        extra = {"find_unused_parameters": True} if trainer.find_unused_parameters else {}
        return DDPStrategy(
            process_group_backend="gloo" if launch.accelerator == "cpu" else "nccl",
            static_graph=trainer.ddp_static_graph,
            gradient_as_bucket_view=trainer.ddp_gradient_as_bucket_view,
            **extra,
        )
    if trainer.strategy == "fsdp":
        wrap, checkpointing = _fsdp_policies(resolved)
        fsdp_kwargs: dict[str, Any] = {}
        if trainer.fsdp_forward_prefetch:
            fsdp_kwargs["forward_prefetch"] = True
        if not trainer.fsdp_limit_all_gathers:
            fsdp_kwargs["limit_all_gathers"] = False
        if trainer.fsdp_backward_prefetch is not None:
            from torch.distributed.fsdp import BackwardPrefetch

            fsdp_kwargs["backward_prefetch"] = BackwardPrefetch[trainer.fsdp_backward_prefetch]
        if launch.accelerator == "cpu":
            # Parameters already live in CPU memory: there is nothing to offload.
            return CPUFSDPStrategy(
                sharding_strategy=trainer.fsdp_sharding_strategy,
                auto_wrap_policy=wrap,
                activation_checkpointing_policy=checkpointing,
                state_dict_type="sharded",
                process_group_backend="gloo",
                **fsdp_kwargs,
            )
        return FSDPStrategy(
            sharding_strategy=trainer.fsdp_sharding_strategy,
            auto_wrap_policy=wrap,
            activation_checkpointing_policy=checkpointing,
            cpu_offload=trainer.offload_params == "cpu",
            state_dict_type=trainer.fsdp_state_dict_type,
            **fsdp_kwargs,
        )
    _, config = load_deepspeed_config(resolved, spec_path)
    if launch.accelerator == "cpu":
        return CPUDeepSpeedStrategy(config=config, process_group_backend="gloo")
    return DeepSpeedStrategy(config=config)


def build_trainer(
    resolved: ResolvedSpec, spec_path: Path, paths: RunPaths, throughput: Throughput
) -> tuple[Trainer, StepCheckpoint, CSVLogger]:
    """Create the Trainer (plus its checkpoint callback and CSV logger) for a resolved spec.

    Intervals in the spec count optimizer steps; Lightning's ``val_check_interval`` counts
    micro batches, so it is multiplied by ``gradient_accumulation_steps`` and counted across
    epochs (``check_val_every_n_epoch=None``). With ``trainer.tensorboard`` a TensorBoardLogger
    writes into the CSV logger's version directory (``tensorboard/`` below it).

    Raises:
        ConfigError: ``trainer.tensorboard`` is on but the ``tensorboard`` package is missing.
    """
    spec, launch = resolved.spec, resolved.launch
    t = spec.trainer
    checkpoint = StepCheckpoint(
        paths.checkpoints, every_n_steps=spec.checkpoint.every_n_steps, keep_last_k=spec.checkpoint.keep_last_k
    )
    # A smoke run (--smoke N) writes no checkpoints: the StepCheckpoint stays out of the Trainer.
    callbacks: list[Callback] = [throughput] if spec.smoke else [checkpoint, throughput]
    accumulation: int | None = t.gradient_accumulation_steps
    if t.gradient_accumulation_schedule is not None:
        from lightning.pytorch.callbacks import GradientAccumulationScheduler

        callbacks.append(GradientAccumulationScheduler(dict(t.gradient_accumulation_schedule)))
        accumulation = None  # Lightning refuses accumulate_grad_batches != 1 beside the scheduler
    gradient_clip_val = t.gradient_clip_val
    if t.strategy == "fsdp" and gradient_clip_val is not None and t.gradient_clip_algorithm == "norm":
        callbacks.append(FSDPGradNormClipping(gradient_clip_val))
        gradient_clip_val = None  # Lightning's FSDP plugin cannot clip by norm itself
    show_bar = sys.stdout.isatty()
    if not show_bar:
        callbacks.append(LineProgress(throughput, t.log_every_n_steps))
    notify = notify_callback(resolved, paths.run_dir)  # rank zero of a spec with `notify:`
    if notify is not None:
        callbacks.append(notify)
    plugins = []
    if launch.scheduler == "slurm" and launch.requeue_signal:
        signum = getattr(signal, "SIG" + launch.requeue_signal)
        job_id = RequeueOnSignal.slurm_job_id()
        # Lightning's own auto-requeue saves inside the signal handler, which can deadlock the
        # ranks (RequeueOnSignal explains); it stays off and RequeueOnSignal does the requeue.
        plugins.append(SLURMEnvironment(auto_requeue=False, requeue_signal=signum))
        if job_id is not None:
            requeue = RequeueOnSignal(signum, paths.checkpoints, job_id)
            requeue.install()
            requeue.on_requeued = None if notify is None else notify.requeued
            callbacks.append(requeue)
    logger = CSVLogger(save_dir=paths.run_dir, name="logs")
    loggers: list[Logger] = [logger]  # the CSV logger first: trainer.logger, the summary's metrics
    if t.tensorboard:
        loggers.append(_tensorboard_logger(paths, logger.version))
    trainer = Trainer(
        accelerator=launch.accelerator,
        devices=launch.devices_per_node,
        num_nodes=launch.num_nodes,
        strategy=build_strategy(resolved, spec_path),
        precision=t.precision,
        max_steps=-1 if t.max_steps is None else t.max_steps,
        max_epochs=-1 if t.max_epochs is None else t.max_epochs,
        accumulate_grad_batches=accumulation or 1,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=t.gradient_clip_algorithm if gradient_clip_val is not None else None,
        val_check_interval=t.val_check_interval * t.gradient_accumulation_steps,
        check_val_every_n_epoch=None,
        limit_val_batches=t.limit_val_batches,
        log_every_n_steps=t.log_every_n_steps,
        num_sanity_val_steps=t.num_sanity_val_steps,
        sync_batchnorm=t.sync_batchnorm,
        deterministic=t.deterministic,
        benchmark=t.benchmark,
        profiler=t.profiler,
        enable_checkpointing=not spec.smoke,
        # jobgen's data modules rebuild their windows per epoch; a user's loaders are built once.
        reload_dataloaders_every_n_epochs=0 if spec.user_code else 1,
        logger=loggers,
        callbacks=callbacks,
        plugins=plugins or None,
        enable_progress_bar=show_bar,
        # The run directory, not checkpoints/: under SLURM, Lightning turns ckpt_path=None into
        # the newest hpc_ckpt_<n>.ckpt in default_root_dir (checkpoint_connector._parse_ckpt_path),
        # so `resume: never` would resume anyway and the final validate() would load stale weights.
        # jobgen chooses what to resume from itself (newest_checkpoint, RequeueOnSignal's files).
        default_root_dir=paths.run_dir,
    )
    return trainer, checkpoint, logger


def _tensorboard_logger(paths: RunPaths, version: int | str) -> Logger:
    from lightning.pytorch.loggers import TensorBoardLogger

    try:
        return TensorBoardLogger(save_dir=paths.run_dir, name="logs", version=version, sub_dir="tensorboard")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"trainer.tensorboard is on but TensorBoard cannot be imported ({exc})",
            location="spec.trainer.tensorboard",
            hint="pip install tensorboard on every node, or set trainer.tensorboard: false",
        ) from None


def _describe_resume(resolved: ResolvedSpec, paths: RunPaths) -> FoundCheckpoint | None:
    if resolved.spec.checkpoint.resume == "never":
        if paths.checkpoints.is_dir() and any(paths.checkpoints.iterdir()):
            rank_zero_print(
                f"resume: never - starting from step 0; checkpoints in {paths.checkpoints} "
                "will be overwritten"
            )
        return None
    found = newest_checkpoint(paths.checkpoints)
    if found is None:
        rank_zero_print(f"resume: auto - no checkpoint in {paths.checkpoints}, starting from step 0")
    else:
        step = "unknown step" if found.global_step is None else f"step {found.global_step}"
        rank_zero_print(f"resume: auto - resuming from {found.path} ({step})")
    return found


def train(
    resolved: ResolvedSpec,
    spec_path: Path,
    run_dir: Path,
    sources: DataSources | None,
    layout: SplitLayout | None,
    started: float,
    code: dict[str, Any] | None = None,
) -> int:
    """Train to ``spec.trainer.max_steps`` (or ``max_epochs``), run a final validation, write
    ``summary.json``.

    Args:
        resolved: the validated spec file.
        spec_path: where it was read from (DeepSpeed config paths are relative to it).
        run_dir: the run directory (absolute).
        sources: the training data for ``spec.data.format`` (already checked); ``None`` for a
            ``class_path`` data module.
        layout: the byte split of ``text`` sources (already checked to hold a window each);
            ``None`` for the other formats.
        started: ``time.time()`` when the process started (for the wall time).
        code: the code snapshot this rank runs (its :class:`~jobgen.jobdir.CodeSnapshot` record
            plus ``dir``), recorded in ``summary.json`` as ``code``; None: no snapshot.

    Returns:
        the process exit code: 0 when training reached ``max_steps`` (or had already).
    """
    spec, launch = resolved.spec, resolved.launch
    t = spec.trainer
    paths = RunPaths(run_dir)
    _quiet_lightning(spec.user_code)

    resume = None if spec.smoke else _describe_resume(resolved, paths)
    if spec.smoke:
        rank_zero_print(f"smoke run: {t.max_steps} step(s), no checkpoints written or resumed")
    if (resume is not None and resume.global_step is not None and t.max_steps is not None
            and resume.global_step >= t.max_steps):
        rank_zero_print(
            f"run already complete at step {resume.global_step} (max_steps={t.max_steps}); "
            f"nothing to do. Summary: {paths.summary}"
        )
        return 0

    lightning.seed_everything(t.seed, workers=True, verbose=False)
    peak_flops = peak_flops_per_s(launch.gpu_type, t.precision) if launch.accelerator == "gpu" else None
    if spec.user_code:
        module, datamodule, counts, model_line, data_line, tokens_per_sample = build_user_code(spec)
        throughput = Throughput(None, count_batches_of_world=launch.world_size, tokens_per_sample=tokens_per_sample)
        batch_line = (f"samples per optimizer step counted from the batches (micro batch {t.micro_batch_size} x "
                      f"accumulation {t.gradient_accumulation_steps} x world size {launch.world_size} = "
                      f"{resolved.world.global_batch_size} when the data module takes batch_size); tokens per sample "
                      + ("unknown (tokens/s n/a)" if tokens_per_sample is None else f"{tokens_per_sample:,}"))
    else:
        assert sources is not None
        module, counts, model_line = build_module(spec, launch.accelerator)
        datamodule, data_line = build_datamodule(spec, sources, layout, run_dir, launch.world_size, counts.vocab_size)
        throughput = Throughput(
            datamodule.tokens_per_step,
            samples_per_step=datamodule.samples_per_step,
            flops_per_token=flops_per_token(spec, module),
            peak_flops_per_s=None if peak_flops is None else peak_flops * launch.world_size,
        )
        batch_line = (f"tokens per optimizer step {datamodule.tokens_per_step:,} "
                      f"= micro batch {t.micro_batch_size} x block {spec.model.block_size} x accumulation "
                      f"{t.gradient_accumulation_steps} x world size {launch.world_size}")
    trainer, checkpoint, logger = build_trainer(resolved, spec_path, paths, throughput)
    validated = _ValidationTracker()
    trainer.callbacks.insert(0, validated)  # the checkpoint callback stays last

    rank_zero_print(
        f"jobgen.train: {spec.name}: {model_line}, strategy {t.strategy}, precision {t.precision}\n"
        f"  parameters: trainable {counts.trainable:,} / total {counts.total:,}\n"
        f"  world size {launch.world_size} = {launch.num_nodes} node(s) x {launch.devices_per_node} "
        f"{launch.accelerator} process(es); {batch_line}\n"
        f"  data: {data_line}\n"
        f"  run dir: {run_dir}"
    )

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=None if resume is None else str(resume.path))
        requeue = next((c for c in trainer.callbacks if isinstance(c, RequeueOnSignal)), None)
        if requeue is not None and requeue.requeued_at_step is not None:
            rank_zero_print(f"requeued at step {trainer.global_step}; SLURM will run the job again")
            return 0
        epochs_done = t.max_epochs is not None and trainer.current_epoch >= t.max_epochs
        if t.max_steps is not None and trainer.global_step < t.max_steps and not epochs_done:
            rank_zero_print(f"training stopped at step {trainer.global_step} before max_steps={t.max_steps}")
            return 1
        if validated.step != trainer.global_step and _can_validate(module, datamodule):
            trainer.validate(module, datamodule=datamodule, verbose=False)  # val_loss at the final step
        memory_bytes, memory_kind = _peak_memory_all_ranks(trainer)
        if trainer.is_global_zero:
            summary = {
                "name": spec.name,
                "global_step": trainer.global_step,
                "max_steps": t.max_steps,
                "val_loss": _float_or_none(trainer.callback_metrics.get("val_loss")),
                "best_checkpoint": checkpoint.best_model_path or None,
                "last_checkpoint": checkpoint.last_model_path or None,
                "wall_time_s": round(time.time() - started, 3),
                # GPU-hours (CPU-hours on CPU) of this run: world size x wall time (jobgen.usage.run_usage)
                "usage": run_usage(launch.accelerator, trainer.world_size, time.time() - started,
                                   launch.gpu_hour_price).to_json(),
                "tokens_per_s_mean": throughput.mean_tokens_per_s,
                "samples_per_s_mean": throughput.mean_samples_per_s,
                "tokens_per_step": getattr(datamodule, "tokens_per_step", None) if not spec.user_code else None,
                # Model FLOPs per token (jobgen.train.measure); MFU needs a GPU peak: null on CPU.
                "flops_per_token": throughput.flops_per_token,
                "peak_flops_per_s": throughput.peak_flops_per_s,
                "mfu_mean": throughput.mean_mfu,
                # The largest over the ranks; what it measures: measure.MEMORY_KINDS.
                "peak_memory_bytes": memory_bytes,
                "peak_memory_kind": memory_kind,
                "world_size": trainer.world_size,
                # The count before sharding: under FSDP and ZeRO-3 module.parameters() are this rank's shards.
                "n_params": counts.total,
                "trainable_params": counts.trainable,
                "total_params": counts.total,
                "model": spec.model.class_path if spec.user_code else (spec.model.hf_path or "gpt"),
                "data_format": "class_path" if spec.user_code else spec.data.format,
                **({"data": spec.data.class_path, "epoch": trainer.current_epoch} if spec.user_code else {}),
                **({"smoke": True} if spec.smoke else {}),
                "resumed_from": None if resume is None else str(resume.path),
                "resumed_from_step": None if resume is None else resume.global_step,
                "metrics_csv": os.path.join(logger.log_dir, "metrics.csv"),
                "strategy": t.strategy,
                "precision": t.precision,
                "jobgen_version": resolved.jobgen_version,
                "inputs_sha256": resolved.inputs_sha256,
                "profile": resolved.profile,
                # The code snapshot (commit, dirty, diff_sha256, repo, python_path, dir) or null.
                "code": code,
            }
            write_atomic(paths.summary, json.dumps(summary, indent=2) + "\n")
            _print_summary(summary, paths)
            _plot_curves(logger, paths)
            notify_finished(trainer)
        trainer.strategy.barrier("jobgen-summary")  # all ranks leave together
        return 0
    finally:
        _destroy_process_group()


class _ValidationTracker(Callback):
    """Remembers the global step of the latest validation run (the sanity check does not count)."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_validation_end(self, trainer: Trainer, pl_module: lightning.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.step = trainer.global_step


def _can_validate(module: Any, datamodule: Any) -> bool:
    """Whether a validation run is possible: a ``validation_step`` and a validation loader."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden("validation_step", module) and is_overridden("val_dataloader", datamodule)


def build_user_code(spec: Any) -> tuple[Any, Any, ParamCounts, str, str, int | None]:
    """The user's LightningModule and LightningDataModule (``class_path``), instantiated by
    jsonargparse (:mod:`jobgen.user_code`); their parameter counts, banner lines and the tokens
    per sample they declare (``tokens_per_sample`` on the data module, else the module: a
    positive int, else ``None`` and tokens/s is not reported).

    Raises:
        ConfigError: see :func:`jobgen.user_code.bind_user_code` (located at ``spec.<field>``).
    """
    from jobgen.user_code import bind_user_code

    user = bind_user_code(spec, "spec.")
    module = user.model.instantiate()
    datamodule = user.data.instantiate()
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    counts = ParamCounts(trainable, total, 0)
    tokens_per_sample = None
    for owner in (datamodule, module):
        value = getattr(owner, "tokens_per_sample", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            tokens_per_sample = value
            break
    args = ", ".join(f"{k}={v!r}" for k, v in user.model.init_args.items())
    model_line = f"{spec.model.class_path}({args}) {total / 1e6:.2f}M params"
    data_args = ", ".join(f"{k}={v!r}" for k, v in user.data.init_args.items())
    data_line = f"{spec.data.class_path}({data_args})" + "".join(f"\n  note: {n}" for n in user.notes())
    return module, datamodule, counts, model_line, data_line, tokens_per_sample


def _peak_memory_all_ranks(trainer: Trainer) -> tuple[int, str]:
    """The largest peak memory over all ranks, in bytes, and its kind (collective: every rank calls)."""
    own, kind = peak_memory(trainer.strategy.root_device)
    value = torch.tensor(own, dtype=torch.int64, device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(value, reduce_op="max")), kind


def _plot_curves(logger: CSVLogger, paths: RunPaths) -> None:
    """Write curves.png; a failure is reported and never fails the run."""
    try:
        logger.save()  # flush rows still buffered
        plot_curves(paths.run_dir, paths.curves)
    except Exception as exc:  # noqa: BLE001 - plotting is a convenience, the run succeeded
        print(f"warning: could not write {paths.curves}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _destroy_process_group() -> None:
    # Exiting with a live gloo/NCCL process group can abort in its C++ destructor
    # ("terminate called without an active exception") on one rank while others finish.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _print_summary(summary: dict[str, Any], paths: RunPaths) -> None:
    start = (
        "fresh start"
        if summary["resumed_from"] is None
        else f"resumed from step {summary['resumed_from_step']}"
    )
    val = summary["val_loss"]
    unit = {"text": "byte", "class_path": None}.get(summary["data_format"], "token")
    if val is None:
        val_text = "n/a"
    elif unit is None:  # the user's module logs its own val_loss, in its own units
        val_text = f"{val:.4f}"
    else:
        val_text = f"{val:.4f} nats/{unit} ({val / math.log(2):.3f} bits/{unit})"
    rate = summary["tokens_per_s_mean"]
    rate_text = "n/a tok/s" if rate is None else f"{rate / 1000:.1f}k tok/s"
    if summary["samples_per_s_mean"] is not None:
        rate_text += f", {summary['samples_per_s_mean']:.1f} samples/s"
    rate_text += ", MFU " + ("n/a" if summary["mfu_mean"] is None else f"{100 * summary['mfu_mean']:.1f}%")
    memory = f"peak memory {summary['peak_memory_bytes'] / 1e9:.2f} GB ({MEMORY_KINDS[summary['peak_memory_kind']]})"
    print(
        f"done: {summary['name']} at step {summary['global_step']}/{summary['max_steps'] or '-'} "
        f"({start}) in {summary['wall_time_s']:.1f} s\n"
        f"  val_loss {val_text} | mean {rate_text} over {summary['world_size']} rank(s)\n"
        f"  {memory}\n"
        f"  last checkpoint {summary['last_checkpoint']}\n"
        f"  summary {paths.summary} | metrics {summary['metrics_csv']} | curves {paths.curves}",
        flush=True,
    )
