"""The Lightning Trainer a resolved spec asks for: its strategy (DDP, FSDP, DeepSpeed from the
rendered ds_config.json; the CPU variants on gloo), precision, intervals, clipping, loggers,
checkpoint and requeue callbacks, and the run directory's paths. Used by :func:`jobgen.train.run.train`.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, Strategy
from torch import nn

from jobgen.errors import ConfigError
from jobgen.jobdir.files import SUMMARY_FILE
from jobgen.specs.capabilities import capabilities
from jobgen.train.callbacks import FSDPGradNormClipping, LineProgress, LogIntervalBar, RequeueOnSignal, Throughput
from jobgen.train.checkpoints import StepCheckpoint
from jobgen.train.model import Block
from jobgen.train.notify import notify_callback
from jobgen.train.position import BatchLayout, TrainingPosition
from jobgen.train.resolved import ResolvedSpec, load_deepspeed_config
from jobgen.train.strategies import CPUDeepSpeedStrategy, CPUFSDPStrategy
from jobgen.train.tracking import TrackerLogger, TrackingCallback


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


def _fsdp_policies(
    resolved: ResolvedSpec, module: nn.Module | None = None
) -> tuple[Any, set[type] | None]:
    """FSDP auto-wrap policy and activation-checkpointing classes: the spec's class paths, else
    jobgen's GPT ``Block`` for the built-in GPT, the loaded model's decoder-layer classes for a
    Hugging Face model (:func:`jobgen.train.hf.decoder_layer_classes`, from ``module``), and no
    wrapping policy for a ``class_path`` model (the whole model is one FSDP unit). With LoRA the
    wrap policy is :func:`jobgen.train.hf.lora_wrap_policy` of those classes (each trainable
    adapter Linear is a unit of its own, so no unit mixes frozen and trainable parameters).

    Raises:
        ConfigError: a Hugging Face model that declares no ``_no_split_modules`` with
            ``trainer.activation_checkpointing`` and no ``fsdp_activation_checkpointing_policy``.
    """
    t, user = resolved.spec.trainer, resolved.spec.user_code
    from jobgen.usercode.classes import policy_classes

    if user:
        default: set[type] | None = None
    elif resolved.spec.model.is_hf:
        if module is None:
            raise ValueError("the FSDP policy of a Hugging Face model needs the loaded module")
        from jobgen.train.hf import decoder_layer_classes

        default = decoder_layer_classes(module) or None  # none declared: one FSDP unit
    else:
        default = {Block}
    if t.fsdp_auto_wrap_policy is not None:
        wrap: Any = policy_classes(t.fsdp_auto_wrap_policy, "spec.", "fsdp_auto_wrap_policy")
    else:
        wrap = default
    if not user and resolved.spec.model.is_hf and resolved.spec.model.lora is not None:
        from jobgen.train.hf import lora_wrap_policy

        wrap = lora_wrap_policy(wrap)
    if t.fsdp_activation_checkpointing_policy is not None:
        ckpt: set[type] | None = policy_classes(t.fsdp_activation_checkpointing_policy, "spec.",
                                                "fsdp_activation_checkpointing_policy")
    elif t.activation_checkpointing and not user:
        if default is None:
            raise ConfigError(
                f"trainer.activation_checkpointing is on, but {resolved.spec.model.hf_path} declares no "
                "decoder-layer classes (_no_split_modules) to recompute",
                location="spec.trainer.activation_checkpointing",
                hint="name the classes in trainer.fsdp_activation_checkpointing_policy (e.g. "
                "transformers.models.llama.modeling_llama.LlamaDecoderLayer), or turn it off",
            )
        ckpt = default
    else:
        ckpt = None
    return wrap, ckpt


def build_strategy(resolved: ResolvedSpec, spec_path: Path, module: nn.Module | None = None, *,
                   single_device: bool = False) -> Strategy | str:
    """The Lightning strategy for ``spec.trainer.strategy`` on ``launch.accelerator``.

    ``single_device``: the run takes Lightning's single-device path whatever the spec's strategy
    (``"auto"``; :func:`jobgen.train.speed.single_device` decides).

    ddp: ``DDPStrategy`` with gloo on CPU and NCCL on GPU (``"auto"`` for a single process),
    ``static_graph`` / ``gradient_as_bucket_view`` / ``find_unused_parameters`` from the spec.
    fsdp: ``FSDPStrategy`` wrapping each :class:`Block` (a Hugging Face model: each of its
    decoder layers, found in ``module``; or the spec's ``fsdp_auto_wrap_policy`` classes),
    sharded (or, on GPU, full) state-dict checkpoints, activation checkpointing of those classes
    when ``trainer.activation_checkpointing`` (or of the ``fsdp_activation_checkpointing_policy``
    classes), the spec's prefetch and all-gather settings (:class:`CPUFSDPStrategy` with gloo on
    CPU). Lightning keeps ``use_orig_params=True``, which lets one FSDP unit hold LoRA's frozen
    base weights beside its trainable adapters.
    deepspeed_stage_N: ``DeepSpeedStrategy`` configured by the rendered ``ds_config.json``, the
    one source of DeepSpeed settings (:class:`CPUDeepSpeedStrategy` with gloo on CPU).

    Args:
        module: the LightningModule to be trained (needed for a Hugging Face model under fsdp).

    Raises:
        ConfigError: the DeepSpeed config is unreadable or disagrees with the spec
            (see :func:`jobgen.train.resolved.load_deepspeed_config`); see :func:`_fsdp_policies`.
    """
    trainer, launch = resolved.spec.trainer, resolved.launch
    if single_device:
        return "auto"
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
        wrap, checkpointing = _fsdp_policies(resolved, module)
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


class ValidateEveryNSteps(Callback):
    """Validate when the optimizer step just taken makes ``trainer.global_step`` a multiple of
    ``every`` (plus when training stops early, as Lightning does), whatever the accumulation of
    the current epoch: under a ``gradient_accumulation_schedule`` Lightning's integer
    ``val_check_interval`` counts micro batches across epochs, which is ``every`` optimizer steps
    only while the accumulation stays what it was at the start.

    It replaces the fit loop's decision, ``_TrainingEpochLoop._should_check_val_fx`` (Lightning
    2.6, lightning/pytorch/loops/training_epoch_loop.py; called after each batch, once the
    optimizer step of that batch is counted in ``global_step``), on the Trainer it is attached to;
    tests/entrypoint/test_entrypoint_trainer.py trains under a schedule and would catch a change.
    """

    def __init__(self, every: int) -> None:
        self.every = every

    def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        loop = trainer.fit_loop.epoch_loop

        def should_check_val(data_fetcher: Any) -> bool:
            if trainer.should_stop and trainer.fit_loop._can_stop_early:
                return True
            stepped = not loop._should_accumulate()  # this batch ended an accumulation: one optimizer step
            return stepped and trainer.global_step > 0 and trainer.global_step % self.every == 0

        loop._should_check_val_fx = should_check_val


def build_trainer(
    resolved: ResolvedSpec, spec_path: Path, paths: RunPaths, throughput: Throughput,
    module: nn.Module | None = None, tracker: TrackerLogger | None = None, single_device: bool = False,
) -> tuple[Trainer, StepCheckpoint, CSVLogger]:
    """Create the Trainer (plus its checkpoint callback and CSV logger) for a resolved spec.

    Intervals in the spec count optimizer steps; Lightning's ``val_check_interval`` counts
    micro batches, so it is multiplied by ``gradient_accumulation_steps`` and counted across
    epochs (``check_val_every_n_epoch=None``; after a resume at another accumulation
    :class:`~jobgen.train.position.TrainingPosition` re-expresses the restored count); under a ``gradient_accumulation_schedule``
    :class:`ValidateEveryNSteps` counts the optimizer steps instead. With ``trainer.tensorboard`` a TensorBoardLogger
    writes into the CSV logger's version directory (``tensorboard/`` below it). ``tracker`` (for
    ``wandb`` / ``mlflow`` in ``trainer.loggers``) joins the loggers, with the
    :class:`~jobgen.train.tracking.TrackingCallback` that starts it on global rank zero.

    ``module`` (the LightningModule to be trained) picks the FSDP wrap classes of a Hugging
    Face model (:func:`build_strategy`). ``single_device``: train on Lightning's single-device
    path whatever the spec's strategy (:func:`jobgen.train.speed.single_device`).

    Raises:
        ConfigError: ``tensorboard`` is in ``trainer.loggers`` but the package is missing;
            see :func:`build_strategy`.
    """
    spec, launch = resolved.spec, resolved.launch
    t = spec.trainer
    checkpoint = StepCheckpoint(paths.checkpoints, every_n_steps=spec.checkpoint.every_n_steps, keep_last_k=spec.checkpoint.keep_last_k)
    # A smoke run (--smoke N) writes no checkpoints: the StepCheckpoint stays out of the Trainer.
    callbacks: list[Callback] = [throughput] if spec.smoke else [checkpoint, throughput]
    # the samples consumed and the batch layout, in every checkpoint; checked and applied on resume
    callbacks.append(TrainingPosition(
        BatchLayout(t.micro_batch_size, t.gradient_accumulation_steps, launch.world_size),
        elastic=launch.min_nodes is not None, scheduled=t.gradient_accumulation_schedule is not None))
    accumulation, scheduled = _accumulation(t)
    gradient_clip_val, clipping = _clipping(t, fsdp=t.strategy == "fsdp" and not single_device)
    show_bar = sys.stdout.isatty()
    # Either progress display reads the loss at log intervals only (no per-step host-device sync)
    callbacks += [*scheduled, *clipping, LogIntervalBar(t.log_every_n_steps) if show_bar else LineProgress(throughput, t.log_every_n_steps)]
    notify = notify_callback(resolved, paths.run_dir)  # rank zero of a spec with `notify:`
    if notify is not None:
        callbacks.append(notify)
    plugins, requeue = _requeue(launch, paths, notify)
    callbacks += requeue
    logger, loggers = _loggers(t, paths, tracker)
    if tracker is not None:
        callbacks.insert(0, TrackingCallback(tracker))  # started before the other callbacks' on_train_start
    trainer = Trainer(
        accelerator=launch.accelerator,
        devices=launch.devices_per_node,
        num_nodes=launch.num_nodes,
        strategy=build_strategy(resolved, spec_path, module, single_device=single_device),
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
        use_distributed_sampler=launch.world_size > 1,  # world size 1: no strategy swaps a loader's sampler
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


def _accumulation(t: Any) -> tuple[int | None, list[Callback]]:
    """(Lightning's ``accumulate_grad_batches``, the callbacks a ``gradient_accumulation_schedule``
    needs): under a schedule ``None`` (Lightning refuses ``accumulate_grad_batches != 1`` beside
    its ``GradientAccumulationScheduler``) and the scheduler plus :class:`ValidateEveryNSteps` (the
    validation interval in optimizer steps in every epoch); else the fixed steps and none."""
    if t.gradient_accumulation_schedule is None:
        return t.gradient_accumulation_steps, []
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    return None, [GradientAccumulationScheduler(dict(t.gradient_accumulation_schedule)), ValidateEveryNSteps(t.val_check_interval)]


def _clipping(t: Any, fsdp: bool) -> tuple[float | None, list[Callback]]:
    """(Lightning's ``gradient_clip_val``, the callbacks that clip instead): under FSDP, clipping
    by norm is :class:`FSDPGradNormClipping`'s (Lightning's FSDP plugin cannot clip by norm
    itself), so the Trainer gets ``None``."""
    if fsdp and t.gradient_clip_val is not None and t.gradient_clip_algorithm == "norm":
        return None, [FSDPGradNormClipping(t.gradient_clip_val)]
    return t.gradient_clip_val, []


def _requeue(launch: Any, paths: RunPaths, notify: Any) -> tuple[list[Any], list[Callback]]:
    """(the Trainer's plugins, the requeue callbacks) for a scheduler that requeues on
    ``launch.requeue_signal``: SLURM's environment with Lightning's own auto-requeue off (it saves
    inside the signal handler, which can deadlock the ranks; :class:`RequeueOnSignal` explains),
    and, inside a SLURM job, the :class:`RequeueOnSignal` that requeues instead (installed; it
    tells ``notify`` when it requeued). Elsewhere no plugin and no callback."""
    if not (capabilities(launch.scheduler).requeue and launch.requeue_signal):
        return [], []
    signum = getattr(signal, "SIG" + launch.requeue_signal)
    job_id = RequeueOnSignal.slurm_job_id()
    plugins = [SLURMEnvironment(auto_requeue=False, requeue_signal=signum)]
    if job_id is None:
        return plugins, []
    requeue = RequeueOnSignal(signum, paths.checkpoints, job_id)
    requeue.install()
    requeue.on_requeued = None if notify is None else notify.requeued
    return plugins, [requeue]


def _loggers(t: Any, paths: RunPaths, tracker: TrackerLogger | None) -> tuple[CSVLogger, list[Logger]]:
    """(the CSV logger, every logger): the CSV logger first (``trainer.logger``, the summary's
    metrics), then TensorBoard when ``trainer.loggers`` names it, then ``tracker``."""
    logger = CSVLogger(save_dir=paths.run_dir, name="logs")
    loggers: list[Logger] = [logger]
    if "tensorboard" in t.loggers:
        loggers.append(_tensorboard_logger(paths, logger.version))
    if tracker is not None:
        loggers.append(tracker)
    return logger, loggers


def _tensorboard_logger(paths: RunPaths, version: int | str) -> Logger:
    from lightning.pytorch.loggers import TensorBoardLogger

    try:
        return TensorBoardLogger(save_dir=paths.run_dir, name="logs", version=version, sub_dir="tensorboard")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"trainer.loggers has tensorboard but TensorBoard cannot be imported ({exc})",
            location="spec.trainer.loggers",
            hint="pip install tensorboard on every node, or remove tensorboard from trainer.loggers",
        ) from None
