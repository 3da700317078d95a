"""Train a resolved spec, validate, write ``summary.json`` (the Trainer itself is built by
:mod:`jobgen.train.trainer`).

Imported by :mod:`jobgen.train.__main__` only after the spec and data sources were checked,
so that bad input fails fast without importing torch and Lightning.

Run directory layout (``<run_dir>``)::

    data/{train,val}.bin, data/manifest.json   the byte stream (built once, reused)
    checkpoints/step-<N>.ckpt, last.ckpt       step checkpoints; hpc_ckpt_<n>.ckpt on SLURM requeue
    logs/version_<n>/metrics.csv               CSV metrics, one version per (re)start
    logs/version_<n>/tensorboard/              TensorBoard events (``tensorboard`` in ``trainer.loggers``)
    .jobgen-tracking.json, wandb/, mlflow.db   W&B / MLflow: the run's key and ids, W&B's (offline) run dirs, MLflow's
                                               default database (``wandb`` / ``mlflow`` in ``trainer.loggers``)
    hang/verdict.json, hang/stacks-rank<N>.txt the watchdog's verdict and every live rank's Python stacks (a hung job)
    summary.json                               final step, val_loss, throughput, MFU, peak memory, checkpoints, code,
                                               the trackers' runs (``tracking``), the prediction beside what was
                                               measured (``prediction``)
    code/<commit>[-dirty-<sha>]/               the code snapshot jobgen submit took (SLURM, local; $JOBGEN_CODE_DIR)
    curves.png                                 loss and tokens/s over steps, all versions (rank zero, at the end)
"""

from __future__ import annotations

import logging
import math
import os
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
from lightning.pytorch.loggers import CSVLogger

from jobgen.errors import ConfigError
from jobgen.jobdir.runs import check_run_dir
from jobgen.jobdir.summary import RunSummary, SpeedLevers, write_summary
from jobgen.planning.prediction import summary_block
from jobgen.reports.usage import run_usage
from jobgen.train.build import DataSources, build_datamodule, build_module
from jobgen.train.callbacks import TRACE_STEPS_ENV, RequeueOnSignal, StepTrace, Throughput, trace_steps
from jobgen.train.checkpoints import FoundCheckpoint, newest_checkpoint, reached_max_steps
from jobgen.train.hf import ParamCounts
from jobgen.train.measure import MEMORY_KINDS, flops_per_token, peak_flops_per_s, peak_memory, plot_curves
from jobgen.train.metrics_csv import log_at_optimizer_steps
from jobgen.train.notify import notify_finished
from jobgen.train.resolved import ResolvedSpec
from jobgen.train.sources import SplitLayout
from jobgen.train.trainer import RunPaths, build_trainer
from jobgen.train.watchdog import ProgressWatchdog

# Known, harmless for this entrypoint; they would only confuse people reading job logs.
_QUIET_WARNINGS = (
    # Data is a memory-mapped byte file: loading in the main process is fast enough.
    r".*does not have many workers.*",
    # The data module continues at the samples consumed (jobgen.train.position), so mid-epoch resume is exact.
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


@dataclass
class _Run:
    """One start of the entrypoint, from what :func:`_prepare` found to what :func:`_build` made
    (the module, the data, the Trainer and the callbacks :func:`_fit` and :func:`_summarize` read)."""

    resolved: ResolvedSpec
    spec_path: Path
    paths: RunPaths
    started: float
    code: dict[str, Any] | None
    resume: FoundCheckpoint | None
    levers: SpeedLevers
    module: Any = None
    datamodule: Any = None
    counts: ParamCounts | None = None
    throughput: Throughput | None = None
    trainer: Any = None
    checkpoint: Any = None
    logger: Any = None
    tracker: Any = None
    watchdog: ProgressWatchdog | None = None
    validated: _ValidationTracker | None = None


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
    ``summary.json``: :func:`_prepare` (resume, levers), :func:`_build` (module, data, Trainer),
    :func:`_fit` (training, final validation) and :func:`_summarize` (the summary, rank zero).

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

    Raises:
        ConfigError: another run's directory, an unknown lever in ``JOBGEN_LEVERS_OFF``, a resume
            the strategy cannot load, user classes that do not bind.
    """
    run = _prepare(resolved, spec_path, RunPaths(run_dir), started, code)
    if run is None:
        return 0
    _build(run, sources, layout)
    try:
        return _fit(run)
    except BaseException as exc:
        if run.tracker is not None:
            run.tracker.close(run.tracker.status_of(exc))  # KILLED after a signal, FAILED otherwise (never raises)
        raise
    finally:
        _destroy_process_group()


def _prepare(resolved: ResolvedSpec, spec_path: Path, paths: RunPaths, started: float,
             code: dict[str, Any] | None) -> _Run | None:
    """Check the run directory, find the checkpoint to resume, seed, choose the speed levers;
    None when the run is already complete (nothing to do).

    Raises:
        ConfigError: see :func:`train`.
    """
    spec, t = resolved.spec, resolved.spec.trainer
    _quiet_lightning(spec.user_code)
    # a run directory holds one run: another profile's or shape's is not resumed (jobgen.jobdir.check_run_dir)
    check_run_dir(paths.run_dir, resolved, claim=rank_zero_only.rank == 0)
    resume = None if spec.smoke else _describe_resume(resolved, paths)
    if spec.smoke:
        rank_zero_print(f"smoke run: {t.max_steps} step(s), no checkpoints written or resumed")
    if reached_max_steps(resume, t.max_steps):
        rank_zero_print(
            f"run already complete at step {resume.global_step} (max_steps={t.max_steps}); "
            f"nothing to do. Summary: {paths.summary}"
        )
        return None
    lightning.seed_everything(t.seed, workers=True, verbose=False)
    levers = _speed_levers(resolved, resume)
    check_resume_layout(resume, "ddp" if levers.single_device else t.strategy, resolved.launch.world_size)
    return _Run(resolved, spec_path, paths, started, code, resume, levers)


def _layout(strategy: str, levers: SpeedLevers) -> str:
    """The strategy that trains: ``single_device`` where the spec's has nothing to shard (world
    size 1, :func:`jobgen.train.speed.single_device`), else the spec's own."""
    return "single_device" if levers.single_device else strategy


def _build(run: _Run, sources: DataSources | None, layout: SplitLayout | None) -> None:
    """Build the module, the data module, the Trainer and jobgen's callbacks into ``run``, print
    the banner and apply the levers (TF32, torch.compile).

    Raises:
        ConfigError: user classes that do not bind (:func:`build_user_code`).
    """
    resolved, levers = run.resolved, run.levers
    spec, launch, t = resolved.spec, resolved.launch, resolved.spec.trainer
    model_line, data_line, batch_line = _build_model_and_data(run, sources, layout)
    if t.trackers:  # W&B / MLflow: one run per job (jobgen.train.tracking); started on global rank zero only
        from jobgen.train.notify import job_handle
        from jobgen.train.tracking import TrackerLogger

        run.tracker = TrackerLogger(resolved, run.paths.run_dir, None if run.resume is None else run.resume.global_step,
                                    code=run.code, handle=job_handle(resolved, run.paths.run_dir))
    # The module first: the FSDP wrap classes of a Hugging Face model come from the loaded model.
    trainer, run.checkpoint, logger = build_trainer(resolved, run.spec_path, run.paths, run.throughput, run.module,
                                                    tracker=run.tracker, single_device=bool(levers.single_device))
    run.trainer, run.logger = trainer, log_at_optimizer_steps(trainer, logger)  # metrics.csv's step: the optimizer step
    requeue = next((c for c in trainer.callbacks if isinstance(c, RequeueOnSignal)), None)
    if requeue is not None and run.tracker is not None:  # the trackers end their runs before jobgen's own requeue
        requeue.before_requeue, requeue.requeue_failed = run.tracker.before_requeue, run.tracker.requeue_failed
    run.validated = _ValidationTracker()
    trainer.callbacks.insert(0, run.validated)  # the checkpoint callback stays last
    watch = spec.watchdog  # a hang ends the job with failure_class.EXIT_HUNG (jobgen.train.watchdog)
    run.watchdog = ProgressWatchdog(watch.hang_timeout_s, watch.step_time_factor, run.paths.run_dir, watch.straggler_factor)
    trainer.callbacks.insert(0, run.watchdog)
    traced = trace_steps(os.environ.get(TRACE_STEPS_ENV))
    if traced is not None:  # a torch.profiler trace of a few steps (callbacks.StepTrace)
        trainer.callbacks.insert(0, StepTrace(*traced, run.paths.run_dir / "traces"))
    counts = run.counts
    assert counts is not None
    rank_zero_print(
        f"jobgen.train: {spec.name}: {model_line}, strategy {t.strategy}, precision {t.precision}\n"
        f"  parameters: trainable {counts.trainable:,} / total {counts.total:,}\n"
        f"  world size {launch.world_size} = {launch.num_nodes} node(s) x {launch.devices_per_node} "
        f"{launch.accelerator} process(es); {batch_line}\n"
        f"  data: {data_line}\n"
        f"  run dir: {run.paths.run_dir}"
    )
    _apply_levers(run)


def _build_model_and_data(run: _Run, sources: DataSources | None, layout: SplitLayout | None) -> tuple[str, str, str]:
    """The module, the data module, the parameter counts and the throughput meter into ``run``;
    the banner's model, data and batch lines."""
    resolved = run.resolved
    spec, launch, t = resolved.spec, resolved.launch, resolved.spec.trainer
    if spec.user_code:
        run.module, run.datamodule, run.counts, model_line, data_line, tokens_per_sample = build_user_code(spec)
        run.throughput = Throughput(None, count_batches_of_world=launch.world_size, tokens_per_sample=tokens_per_sample)
        batch_line = (f"samples per optimizer step counted from the batches (micro batch {t.micro_batch_size} x "
                      f"accumulation {t.gradient_accumulation_steps} x world size {launch.world_size} = "
                      f"{resolved.world.global_batch_size} when the data module takes batch_size); tokens per sample "
                      + ("unknown (tokens/s n/a)" if tokens_per_sample is None else f"{tokens_per_sample:,}"))
        return model_line, data_line, batch_line
    assert sources is not None
    # the MFU peak of the dtype the matmuls run in: 32-true with the TF32 lever against TF32 (None: the current setting)
    peak_flops = (peak_flops_per_s(launch.gpu_type, t.precision, run.levers.matmul_precision)
                  if launch.accelerator == "gpu" else None)
    layout_strategy = "ddp" if run.levers.single_device else t.strategy  # the strategy that trains
    run.module, run.counts, model_line = build_module(spec, launch.accelerator, layout_strategy)
    run.datamodule, data_line = build_datamodule(spec, sources, layout, run.paths.run_dir, launch.world_size,
                                                 run.counts.vocab_size, pin_memory=bool(run.levers.pin_memory))
    run.throughput = Throughput(
        run.datamodule.tokens_per_step,
        samples_per_step=run.datamodule.samples_per_step,
        flops_per_token=flops_per_token(spec, run.module),
        peak_flops_per_s=None if peak_flops is None else peak_flops * launch.world_size,
    )
    batch_line = (f"tokens per optimizer step {run.datamodule.tokens_per_step:,} "
                  f"= micro batch {t.micro_batch_size} x block {spec.model.block_size} x accumulation "
                  f"{t.gradient_accumulation_steps} x world size {launch.world_size}")
    return model_line, data_line, batch_line


def _apply_levers(run: _Run) -> None:
    """The single-device note, TF32 matmuls and torch.compile of the network, as ``run.levers`` say."""
    t, levers = run.resolved.spec.trainer, run.levers
    if levers.single_device:
        rank_zero_print(f"  layout: {t.single_device_reason(run.resolved.launch.world_size)}")
    if levers.matmul_precision is not None:
        torch.set_float32_matmul_precision(levers.matmul_precision)
        rank_zero_print(f"  fp32 matmuls: TF32 (torch.set_float32_matmul_precision({levers.matmul_precision!r}), "
                        "compute capability >= 8.0)")
    if levers.compile:
        # The network itself, compiled in place (nn.Module.compile: state-dict keys unchanged, so
        # checkpoints resume with or without compile). Not the LightningModule, as Lightning's
        # guide shows: dynamo then traces training_step's self.log, which fails (torch 2.13,
        # Lightning 2.6: "'method' object has no attribute '__dict__'").
        run.module.model.compile()
        why = " (trainer.compile: auto on a GPU)" if t.compile == "auto" else ""
        rank_zero_print(f"  torch.compile: on{why} (the first steps include compilation)")


def _fit(run: _Run) -> int:
    """Train, validate at the final step where fit did not, and (global rank zero) write the
    summary; the exit code: 0 when training reached its end (or was requeued), 1 when it
    stopped before ``max_steps``."""
    trainer, tracker, t = run.trainer, run.tracker, run.resolved.spec.trainer
    trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=None if run.resume is None else str(run.resume.path))
    requeue = next((c for c in trainer.callbacks if isinstance(c, RequeueOnSignal)), None)
    if requeue is not None and requeue.requeued_at_step is not None:
        rank_zero_print(f"requeued at step {trainer.global_step}; SLURM will run the job again")
        if tracker is not None:
            tracker.close("KILLED")  # the next start continues the same runs
        return 0
    epochs_done = t.max_epochs is not None and trainer.current_epoch >= t.max_epochs
    if t.max_steps is not None and trainer.global_step < t.max_steps and not epochs_done:
        rank_zero_print(f"training stopped at step {trainer.global_step} before max_steps={t.max_steps}")
        if tracker is not None:
            tracker.close(tracker.status_of(None))
        return 1
    assert run.validated is not None
    if run.validated.step != trainer.global_step and _can_validate(run.module, run.datamodule):
        trainer.validate(run.module, datamodule=run.datamodule, verbose=False)  # val_loss at the final step
    memory = _peak_memory_all_ranks(trainer)
    if trainer.is_global_zero:
        summary = _summarize(run, memory)
        write_summary(run.paths.summary, summary)
        _print_summary(summary, run.paths)
        _plot_curves(run.logger, run.paths, summary.data_format or "")
        notify_finished(trainer)
        if tracker is not None:
            tracker.close("FINISHED")
    trainer.strategy.barrier("jobgen-summary")  # all ranks leave together
    return 0


def _summarize(run: _Run, memory: tuple[int, str]) -> RunSummary:
    """``summary.json`` of this start (:class:`~jobgen.jobdir.summary.RunSummary`), with the time
    model's prediction beside what it measured (:func:`jobgen.planning.prediction.summary_block`;
    null without a prediction file beside spec.json). ``memory``: the peak over the ranks, bytes, and its kind."""
    resolved, trainer, throughput = run.resolved, run.trainer, run.throughput
    spec, launch, t = resolved.spec, resolved.launch, resolved.spec.trainer
    assert throughput is not None and run.counts is not None and run.watchdog is not None
    wall_s = time.time() - run.started
    user = bool(spec.user_code)
    summary = RunSummary(
        name=spec.name, global_step=trainer.global_step, max_steps=t.max_steps,
        val_loss=_float_or_none(trainer.callback_metrics.get("val_loss")),
        newest_step_checkpoint=run.checkpoint.best_model_path or None, last_checkpoint=run.checkpoint.last_model_path or None,
        wall_time_s=round(wall_s, 3),
        # GPU-hours (CPU-hours on CPU) of this run: world size x wall time (jobgen.reports.usage.run_usage)
        usage=run_usage(launch.accelerator, trainer.world_size, time.time() - run.started, launch.gpu_hour_price).to_json(),
        tokens_per_s_mean=throughput.mean_tokens_per_s, tokens_per_s_steady=throughput.steady_tokens_per_s,
        mfu_steady=throughput.steady_mfu, samples_per_s_mean=throughput.mean_samples_per_s,
        tokens_per_step=None if user else getattr(run.datamodule, "tokens_per_step", None),
        flops_per_token=throughput.flops_per_token, peak_flops_per_s=throughput.peak_flops_per_s, mfu_mean=throughput.mean_mfu,
        peak_memory_bytes=memory[0], peak_memory_kind=memory[1], world_size=trainer.world_size,
        # The count before sharding: under FSDP and ZeRO-3 module.parameters() are this rank's shards.
        n_params=run.counts.total, trainable_params=run.counts.trainable, total_params=run.counts.total,
        model=spec.model.class_path if user else (spec.model.hf_path or "gpt"),
        data_format="class_path" if user else spec.data.format,
        data=spec.data.class_path if user else None, epoch=trainer.current_epoch if user else None,
        smoke=True if spec.smoke else None, straggler=run.watchdog.straggler,
        resumed_from=None if run.resume is None else str(run.resume.path),
        resumed_from_step=None if run.resume is None else run.resume.global_step,
        metrics_csv=os.path.join(run.logger.log_dir, "metrics.csv"),
        strategy=t.strategy, layout=_layout(t.strategy, run.levers), precision=t.precision,
        levers=run.levers.model_copy(update={"fused_adamw": _fused(trainer)}),
        jobgen_version=resolved.jobgen_version, inputs_sha256=resolved.inputs_sha256, profile=resolved.profile,
        code=run.code, tracking=None if run.tracker is None else run.tracker.describe(),
    )
    prediction = summary_block(run.spec_path, summary.to_json(), resolved.inputs_sha256)
    restarts = recorded_restarts({}, spec.restart.max_restarts).get("restarts")
    return summary.model_copy(update={"prediction": prediction, "restarts": restarts})


def recorded_restarts(summary: dict[str, Any], budget: int, environ: Any = os.environ) -> dict[str, Any]:
    """``summary`` with ``restarts`` (``max_restarts``, ``used``, ``history``:
    :func:`jobgen.reports.attempts.with_restarts`) from the restart records of a run whose restarts
    the SLURM batch script or the Kubernetes launch wrapper decided
    (:data:`jobgen.events.notifier.RESTART_RECORD_ENV`); unchanged without a budget or that variable
    (a local or ssh run: jobgen adds them after the run)."""
    from jobgen.events.notifier import RESTART_RECORD_ENV, read_restart_records
    from jobgen.reports.attempts import with_restarts

    path = environ.get(RESTART_RECORD_ENV, "")
    if not budget or not path:
        return summary
    return with_restarts(summary, budget, read_restart_records(path))


def _speed_levers(resolved: ResolvedSpec, resume: FoundCheckpoint | None = None) -> SpeedLevers:
    """The speed levers of this rank (:mod:`jobgen.train.speed`; :class:`~jobgen.jobdir.summary.SpeedLevers`):
    ``compile``, ``matmul_precision`` (``"high"`` or None), ``pin_memory``, ``single_device``,
    ``host_logging``, ``fused_clip`` (fused AdamW may clip under ``bf16-mixed``), ``off`` (the
    names ``JOBGEN_LEVERS_OFF`` turned off, sorted); ``fused_adamw`` is known only after fit.
    The device query runs only for GPU launches.

    The single-device path is not taken when ``resume`` is a checkpoint directory (an FSDP
    sharded or DeepSpeed checkpoint that only its strategy can load): that run keeps its strategy.

    Raises:
        ConfigError: ``JOBGEN_LEVERS_OFF`` names an unknown lever.
    """
    from jobgen.train.speed import compile_on, cuda_capability, levers_off, matmul_precision, pin_memory, single_device

    spec, launch = resolved.spec, resolved.launch
    off = levers_off()
    accelerator = launch.accelerator
    capability = cuda_capability() if accelerator == "gpu" and "tf32" not in off else None
    sharded_resume = resume is not None and resume.path.is_dir()
    one = single_device(spec.trainer, launch.world_size, lever="single_device" not in off) and not sharded_resume
    compiled = compile_on(spec.trainer, accelerator, hf_model=spec.model.is_hf if not spec.user_code else False,
                          user_code=bool(spec.user_code), strategy="ddp" if one else None)
    if "compile_auto" in off and spec.trainer.compile == "auto":
        compiled = False
    return SpeedLevers(
        compile=compiled,
        matmul_precision=matmul_precision(accelerator, capability),
        pin_memory=pin_memory(accelerator) and "pin_memory" not in off,
        single_device=one,
        host_logging="host_logging" not in off,
        fused_clip="fused_clip" not in off,
        off=sorted(off),
    )


def check_resume_layout(resume: FoundCheckpoint | None, strategy: str, world_size: int) -> None:
    """Refuse, before anything is built, a resume DeepSpeed's engine cannot load: a one-file
    checkpoint (written on the single-device path, as ZeRO-1/2 at world size 1 do, or under
    ddp) where ``strategy`` (the one that trains, after the single-device choice) is DeepSpeed,
    whose engine loads only its own checkpoint directories (Lightning 2.6's DeepSpeedStrategy
    raised FileNotFoundError "not a valid DeepSpeed checkpoint" once the ranks had started).
    FSDP loads such a file at any world size (its optimizer state keyed by parameter position,
    :func:`jobgen.train.checkpoints.number_optimizer_state_by_parameter`).

    Raises:
        ConfigError: the checkpoint is a file and ``strategy`` is DeepSpeed (exit 2).
    """
    if resume is None or not strategy.startswith("deepspeed") or resume.path.is_dir():
        return
    raise ConfigError(
        "resume: this is a one-file checkpoint (written at world size 1 on the single-device path, or under ddp), "
        f"but this run trains under {strategy} at world size {world_size}: DeepSpeed's engine loads only its own "
        "checkpoint directories",
        location=str(resume.path),
        hint="continue it at world size 1 (ZeRO-1/2 without offload train on the single-device path there), or under "
             "strategy fsdp (which loads it at any world size), or start from step 0 (checkpoint.resume: never, or "
             "another run directory)",
    )


def _fused(trainer: Trainer) -> bool:
    """Whether the first optimizer is torch's fused AdamW (after fit built it)."""
    optimizers = trainer.optimizers
    return bool(optimizers and getattr(optimizers[0], "defaults", {}).get("fused"))


class _ValidationTracker(Callback):
    """Remembers the global step of the latest validation run (the sanity check does not count),
    and has fit's own loop validate after the last optimizer step.

    The last validation runs inside ``fit`` because a separate ``trainer.validate`` after it
    cannot run under FSDP: Lightning's FSDPStrategy sees the decoder blocks fit wrapped, does
    not wrap the root again, and the root's parameters are still flat shards ("'weight' must
    be 2-D"). Setting ``trainer.should_stop`` (public) at ``max_steps`` makes Lightning's
    training epoch loop validate before it stops (``_should_check_val_fx``, Lightning 2.6;
    tests/entrypoint/test_entrypoint_train.py checks FSDP ends validated off the interval).
    """

    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: lightning.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True

    def on_validation_end(self, trainer: Trainer, pl_module: lightning.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.step = trainer.global_step


def _can_validate(module: Any, datamodule: Any) -> bool:
    """Whether a validation run is possible: a ``validation_step`` and a validation loader."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    return is_overridden("validation_step", module) and is_overridden("val_dataloader", datamodule)


def build_user_code(spec: Any) -> tuple[Any, Any, ParamCounts, str, str, int | None]:
    """The user's LightningModule and LightningDataModule (``class_path``), instantiated by
    jsonargparse (:mod:`jobgen.usercode.classes`); their parameter counts, banner lines and the tokens
    per sample they declare (``tokens_per_sample`` on the data module, else the module: a
    positive int, else ``None`` and tokens/s is not reported).

    Raises:
        ConfigError: see :func:`jobgen.usercode.classes.bind_user_code` (located at ``spec.<field>``).
    """
    from jobgen.usercode.classes import bind_user_code

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


def loss_unit(data_format: str) -> str | None:
    """What the built-in loss is per for ``data_format`` (summary.json's): ``byte`` (text),
    ``token`` (tokenized data); ``None`` for a ``class_path`` module's own loss."""
    return {"text": "byte", "class_path": None}.get(data_format, "token")


def _plot_curves(logger: CSVLogger, paths: RunPaths, data_format: str) -> None:
    """Write curves.png; a failure is reported and never fails the run."""
    try:
        logger.save()  # flush rows still buffered
        plot_curves(paths.run_dir, paths.curves, loss_unit(data_format))
    except Exception as exc:  # noqa: BLE001 - plotting is a convenience, the run succeeded
        print(f"warning: could not write {paths.curves}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _destroy_process_group() -> None:
    # Exiting with a live gloo/NCCL process group can abort in its C++ destructor
    # ("terminate called without an active exception") on one rank while others finish.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _print_summary(summary: RunSummary, paths: RunPaths) -> None:
    """The run's last lines: step, wall time, val_loss, throughput, MFU, peak memory and where its files are."""
    start = "fresh start" if summary.resumed_from is None else f"resumed from step {summary.resumed_from_step}"
    val = summary.val_loss
    unit = loss_unit(summary.data_format or "")
    if val is None:
        val_text = "n/a"
    elif unit is None:  # the user's module logs its own val_loss, in its own units
        val_text = f"{val:.4f}"
    else:
        val_text = f"{val:.4f} nats/{unit} ({val / math.log(2):.3f} bits/{unit})"
    rate = summary.tokens_per_s_mean
    rate_text = "n/a tok/s" if rate is None else f"{rate / 1000:.1f}k tok/s"
    if summary.samples_per_s_mean is not None:
        rate_text += f", {summary.samples_per_s_mean:.1f} samples/s"
    rate_text += ", MFU " + ("n/a" if summary.mfu_mean is None else f"{100 * summary.mfu_mean:.1f}%")
    memory = f"peak memory {(summary.peak_memory_bytes or 0) / 1e9:.2f} GB ({MEMORY_KINDS[summary.peak_memory_kind or '']})"
    print(
        f"done: {summary.name} at step {summary.global_step}/{summary.max_steps or '-'} "
        f"({start}) in {summary.wall_time_s or 0.0:.1f} s\n"
        f"  val_loss {val_text} | mean {rate_text} over {summary.world_size} rank(s)\n"
        f"  {memory}\n"
        f"  last checkpoint {summary.last_checkpoint}\n"
        f"  summary {paths.summary} | metrics {summary.metrics_csv} | curves {paths.curves}",
        flush=True,
    )
