"""How the Trainer is built from a resolved spec (constructed in-process; nothing is launched)."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

from jobgen.jobdir import load_resolved_spec
from jobgen.jobdir.world import World
from jobgen.train import data as data_module
from jobgen.train.callbacks import FSDPGradNormClipping, LineProgress, RequeueOnSignal, Throughput
from jobgen.train.checkpoints import StepCheckpoint, find_checkpoints, newest_checkpoint, read_global_step
from jobgen.train.model import Block, LitGPT
from jobgen.train.sources import discover_sources
from jobgen.train.strategies import CPUDeepSpeedStrategy, CPUFSDPStrategy
from jobgen.train.trainer import RunPaths, build_strategy, build_trainer
from tests.conftest import require


def _build(spec_path: Path, tmp_path: Path):
    resolved = load_resolved_spec(spec_path)
    return build_trainer(resolved, spec_path, RunPaths(tmp_path / "run"), Throughput(1))


def test_trainer_counts_intervals_in_optimizer_steps(write_spec, tmp_path: Path) -> None:
    spec_path = write_spec({"trainer": {"gradient_accumulation_steps": 4, "val_check_interval": 25}})
    trainer, checkpoint, logger = _build(spec_path, tmp_path)
    assert trainer.max_steps == 20
    assert trainer.accumulate_grad_batches == 4
    assert trainer.val_check_interval == 100  # 25 optimizer steps x 4 micro batches
    assert trainer.check_val_every_n_epoch is None  # counted across epochs
    assert trainer.limit_val_batches == 4
    assert trainer.log_every_n_steps == 5
    assert trainer.gradient_clip_val == 1.0
    assert trainer.precision == "32-true"
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.strategy._process_group_backend == "gloo"
    assert trainer.num_devices == 2 and trainer.num_nodes == 1
    assert isinstance(checkpoint, StepCheckpoint)
    assert Path(checkpoint.dirpath) == (tmp_path / "run" / "checkpoints").resolve()
    assert checkpoint.keep_last_k == 2 and checkpoint.every_n_steps == 10
    # The checkpoint callback Lightning knows (a Checkpoint): no default ModelCheckpoint is added,
    # and it runs after the other callbacks, as ModelCheckpoint did.
    assert trainer.checkpoint_callbacks == [checkpoint] and trainer.callbacks[-1] is checkpoint
    assert Path(logger.root_dir) == tmp_path / "run" / "logs"
    # pytest captures stdout (not a TTY): one line per log interval instead of a progress bar
    assert any(isinstance(cb, LineProgress) for cb in trainer.callbacks)
    assert not trainer.progress_bar_callback


def test_single_process_uses_no_process_group(write_spec, tmp_path: Path) -> None:
    spec_path = write_spec(devices_per_node=1, world_size=1)
    resolved = load_resolved_spec(spec_path)
    assert build_strategy(resolved, spec_path) == "auto"


def test_slurm_requeue_signal_reaches_lightning(write_spec, tmp_path: Path, monkeypatch) -> None:
    for key, value in {
        "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "123", "SLURM_JOB_NAME": "tiny",
        "SLURM_NODELIST": "node1",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    spec_path = write_spec(scheduler="slurm", requeue_signal="USR2")
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        trainer, _, _ = _build(spec_path, tmp_path)
        handler = signal.getsignal(signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    environment = trainer.strategy.cluster_environment
    assert isinstance(environment, SLURMEnvironment)
    # Lightning's auto-requeue (collective save inside the signal handler) stays off: RequeueOnSignal does it.
    assert not environment.auto_requeue and environment.requeue_signal == signal.SIGUSR2
    [requeue] = [c for c in trainer.callbacks if isinstance(c, RequeueOnSignal)]
    assert handler == requeue._on_signal and requeue.job_id == "123"
    # HPC checkpoints (hpc_ckpt_N.ckpt) land where resume: auto looks.
    assert requeue.next_checkpoint_path() == tmp_path / "run" / "checkpoints" / "hpc_ckpt_1.ckpt"


def test_requeue_job_id_names_array_tasks() -> None:
    assert RequeueOnSignal.slurm_job_id({"SLURM_JOB_ID": "77"}) == "77"
    env = {"SLURM_JOB_ID": "78", "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "3"}
    assert RequeueOnSignal.slurm_job_id(env) == "70_3"
    assert RequeueOnSignal.slurm_job_id({}) is None


def test_gpu_strategies_are_lightnings_own(write_spec, tmp_path: Path) -> None:
    spec_path = write_spec(
        {"trainer": {"strategy": "fsdp", "fsdp_sharding_strategy": "SHARD_GRAD_OP"}}, accelerator="gpu"
    )
    resolved = load_resolved_spec(spec_path)
    fsdp = build_strategy(resolved, spec_path)
    assert isinstance(fsdp, FSDPStrategy)
    assert fsdp.sharding_strategy.name == "SHARD_GRAD_OP"
    assert fsdp.kwargs["auto_wrap_policy"]._module_classes == {Block}  # one FSDP unit per Block
    assert fsdp.kwargs["use_orig_params"]  # AdamW groups are built from the original parameters
    assert fsdp._state_dict_type == "sharded"

    ddp_path = write_spec(filename="ddp.json", accelerator="gpu")
    resolved = load_resolved_spec(ddp_path)
    ddp = build_strategy(resolved, ddp_path)
    assert isinstance(ddp, DDPStrategy) and ddp._process_group_backend == "nccl"
    assert ddp._ddp_kwargs == {"static_graph": False, "gradient_as_bucket_view": False}

    tuned_path = write_spec(
        {"trainer": {"ddp_static_graph": True, "ddp_gradient_as_bucket_view": True}}, filename="tuned.json", accelerator="gpu"
    )
    resolved = load_resolved_spec(tuned_path)
    assert build_strategy(resolved, tuned_path)._ddp_kwargs == {"static_graph": True, "gradient_as_bucket_view": True}

    full_path = write_spec(
        {"trainer": {"strategy": "fsdp", "fsdp_state_dict_type": "full"}}, filename="full.json", accelerator="gpu"
    )
    resolved = load_resolved_spec(full_path)
    assert build_strategy(resolved, full_path)._state_dict_type == "full"


def test_fp8_is_refused_on_cpu_and_without_transformer_engine(write_spec) -> None:
    from jobgen.errors import PlanError  # the rules' one error class, at plan time and on the node
    from jobgen.train.resolved import check_runtime_support

    cpu = load_resolved_spec(write_spec({"trainer": {"precision": "transformer-engine"}}, filename="cpu.json"))
    with pytest.raises(PlanError, match="this node has no GPUs; Transformer Engine's fp8"):
        check_runtime_support(cpu)
    gpu_path = write_spec({"trainer": {"precision": "transformer-engine"}}, filename="gpu.json", accelerator="gpu")
    gpu = load_resolved_spec(gpu_path)
    if importlib.util.find_spec("transformer_engine") is None:
        with pytest.raises(PlanError, match="NVIDIA Transformer Engine is not installed") as info:
            check_runtime_support(gpu)
        assert "transformer-engine[pytorch]" in info.value.hint
    else:
        check_runtime_support(gpu)


def test_fsdp_on_cpu_uses_the_cpu_subclass_with_gloo(write_spec, tmp_path: Path) -> None:
    spec_path = write_spec({"trainer": {"strategy": "fsdp"}})
    trainer, _, _ = _build(spec_path, tmp_path)  # stock FSDPStrategy would be refused on CPU here
    assert isinstance(trainer.strategy, CPUFSDPStrategy)
    assert trainer.strategy._process_group_backend == "gloo"
    assert trainer.gradient_clip_val is None  # clipped by norm through FSDP instead:
    assert [cb.max_norm for cb in trainer.callbacks if isinstance(cb, FSDPGradNormClipping)] == [1.0]


def test_deepspeed_strategy_reads_the_rendered_config(write_spec, tmp_path: Path) -> None:
    require("deepspeed", "deepspeed not installed (pip install -e .[train])")
    (tmp_path / "ds_config.json").write_text(
        '{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, '
        '"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}'
    )
    spec_path = write_spec(
        {"trainer": {"strategy": "deepspeed_stage_3", "precision": "bf16-mixed"}},
        accelerator="gpu",
        deepspeed_config="ds_config.json",
    )
    resolved = load_resolved_spec(spec_path)
    strategy = build_strategy(resolved, spec_path)
    assert isinstance(strategy, DeepSpeedStrategy)
    assert strategy.config["zero_optimization"] == {"stage": 3}
    assert "gradient_accumulation_steps" not in strategy.config


def test_fsdp_activation_checkpointing_wraps_each_block(write_spec, tmp_path: Path) -> None:
    spec_path = write_spec({"trainer": {"strategy": "fsdp", "activation_checkpointing": True}})
    resolved = load_resolved_spec(spec_path)
    strategy = build_strategy(resolved, spec_path)
    assert isinstance(strategy, CPUFSDPStrategy)
    policy = strategy._activation_checkpointing_kwargs["auto_wrap_policy"]
    assert policy._module_classes == {Block}
    off = write_spec({"trainer": {"strategy": "fsdp"}}, filename="off.json")
    resolved = load_resolved_spec(off)
    assert build_strategy(resolved, off)._activation_checkpointing_kwargs == {}


def test_activation_checkpointing_needs_fsdp() -> None:
    from jobgen.errors import ConfigError
    from jobgen.specs.load import validate
    from jobgen.specs.training import TrainingSpec

    with pytest.raises(ConfigError, match="activation_checkpointing is applied through FSDP"):
        validate(TrainingSpec, {"name": "x", "trainer": {"activation_checkpointing": True}}, "<test>")


def test_deepspeed_on_cpu_uses_the_cpu_subclass_with_gloo(write_spec, tmp_path: Path) -> None:
    require("deepspeed", "deepspeed not installed (pip install -e .[train])")
    from jobgen.planning.deepspeed import deepspeed_config, dumps
    from jobgen.specs.training import TrainingSpec

    (tmp_path / "ds_config.json").write_text(
        dumps(deepspeed_config(TrainingSpec.model_validate({"name": "x", "trainer": {"strategy": "deepspeed_stage_3", "micro_batch_size": 4}}),
                                World(1, 2, "cpu", micro_batch_size=4)))
    )
    spec_path = write_spec({"trainer": {"strategy": "deepspeed_stage_3"}}, deepspeed_config="ds_config.json")
    trainer, _, _ = _build(spec_path, tmp_path)  # stock DeepSpeedStrategy refuses CPU in setup_environment
    assert isinstance(trainer.strategy, CPUDeepSpeedStrategy)
    assert trainer.strategy._process_group_backend == "gloo"
    assert trainer.strategy.zero_stage_3


def test_resume_finds_deepspeed_checkpoint_directories(tmp_path: Path) -> None:
    """Lightning's DeepSpeedStrategy saves a directory per checkpoint (tag "checkpoint"): one
    model-states file on ZeRO 1/2, one per rank on ZeRO 3; a SLURM requeue checkpoint
    (hpc_ckpt_N.ckpt) has no step in its name, so its global step is read from inside."""
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step-00000010.ckpt" / "checkpoint").mkdir(parents=True)
    (ckpts / "hpc_ckpt_1.ckpt" / "checkpoint").mkdir(parents=True)
    (ckpts / "last.ckpt" / "checkpoint").mkdir(parents=True)
    torch.save({"global_step": 15}, ckpts / "hpc_ckpt_1.ckpt" / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt")
    torch.save({"global_step": 12}, ckpts / "last.ckpt" / "checkpoint" / "mp_rank_00_model_states.pt")
    assert [(c.path.name, c.global_step) for c in find_checkpoints(ckpts)] == [
        ("hpc_ckpt_1.ckpt", 15), ("last.ckpt", 12), ("step-00000010.ckpt", 10),
    ]  # fmt: skip


def test_newest_checkpoint_prefers_highest_step_then_mtime(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    torch.save({"global_step": 30}, ckpts / "hpc_ckpt_1.ckpt")
    torch.save({"global_step": 20}, ckpts / "last.ckpt")
    (ckpts / "step-00000020.ckpt").write_bytes(b"")  # the name is trusted, the file not opened
    (ckpts / "broken.ckpt").write_bytes(b"not a checkpoint")
    os.utime(ckpts / "broken.ckpt", (4e9, 4e9))  # newest by mtime, but unreadable
    assert read_global_step(ckpts / "step-00000020.ckpt") == 20
    assert read_global_step(ckpts / "broken.ckpt") is None
    newest = newest_checkpoint(ckpts)
    assert newest is not None and newest.path.name == "hpc_ckpt_1.ckpt" and newest.global_step == 30
    assert [c.path.name for c in find_checkpoints(ckpts)][-1] == "broken.ckpt"
    assert newest_checkpoint(tmp_path / "missing") is None


class _RecordBatches(Callback):
    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.inputs.append(batch[0].clone())


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated")
def test_samples_continue_across_epoch_boundaries(tmp_path: Path, monkeypatch) -> None:
    """Epochs are capped (DistributedSampler materialises its indices); the data loader is
    rebuilt every epoch and continues at global_step x samples_per_step, never repeating."""
    monkeypatch.setattr(data_module, "MAX_EPOCH_SAMPLES", 20)  # 5 optimizer steps of 4 samples
    sources = discover_sources([], max_bytes=200_000)
    dm = data_module.ByteTextDataModule(
        sources, tmp_path / "data", block_size=16, micro_batch_size=4, gradient_accumulation_steps=1,
        world_size=1, max_steps=12, val_fraction=0.05, val_batches=1, seed=3,
    )  # fmt: skip
    recorder = _RecordBatches()
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=12, max_epochs=-1, reload_dataloaders_every_n_epochs=1,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[recorder],
    )  # fmt: skip
    trainer.fit(LitGPT(n_layer=1, n_head=1, d_model=16, block_size=16), datamodule=dm)
    assert trainer.global_step == 12 and trainer.current_epoch >= 2  # epochs of 5, 5 and 2 steps
    reference = data_module.TrainWindows(dm.train_set.data, block_size=16, seed=3, num_samples=48)
    expected = [reference[g][0] for g in range(12 * 4)]
    seen = torch.cat(recorder.inputs)
    assert seen.shape == (48, 16)
    torch.testing.assert_close(seen, torch.stack(expected))


def test_lightning_does_not_swap_in_an_hpc_checkpoint_under_slurm(write_spec, tmp_path: Path, monkeypatch) -> None:
    """Under SLURM Lightning replaces ckpt_path=None by the newest hpc_ckpt_<n>.ckpt in
    default_root_dir; jobgen's hpc checkpoints live in checkpoints/, and jobgen decides what to
    resume from, so with `resume: never` (and for the final validate) nothing may be swapped in."""
    from lightning.pytorch.trainer.states import TrainerFn

    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "job", "SLURM_JOB_ID": "42", "SLURM_NODELIST": "n1",
                       "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}.items():
        monkeypatch.setenv(key, value)
    trainer, checkpoint, _ = _build(write_spec(), tmp_path)
    hpc = Path(checkpoint.dirpath) / "hpc_ckpt_1.ckpt"
    hpc.parent.mkdir(parents=True, exist_ok=True)
    hpc.write_bytes(b"x")
    connector = trainer._checkpoint_connector  # Lightning-internal; pinned by test_lightning_api's version bound
    assert connector._parse_ckpt_path(TrainerFn.VALIDATING, None, model_provided=True, model_connected=True) is None
    assert connector._parse_ckpt_path(TrainerFn.FITTING, None, model_provided=True, model_connected=True) is None


# --------------------------------------------------------------------------- user-module options

_USER = {
    "model": {"class_path": "lightning.pytorch.demos.boring_classes.BoringModel", "preset": None},
    "data": {"class_path": "lightning.pytorch.demos.boring_classes.BoringDataModule"},
}


def _user_spec(write_spec, trainer: dict, **launch):
    """A class_path spec (TINY_SPEC's GPT and optimiser fields replaced) written as spec.json."""
    from tests.entrypoint.conftest import TINY_SPEC

    t = {k: v for k, v in TINY_SPEC["trainer"].items() if k not in ("learning_rate", "warmup_steps")} | trainer
    import json

    path = write_spec(filename="user.json", **launch)
    doc = json.loads(path.read_text())
    doc["spec"]["model"] = {"class_path": _USER["model"]["class_path"], "init_args": {}}
    doc["spec"]["data"] = {"class_path": _USER["data"]["class_path"], "init_args": {}}
    doc["spec"]["trainer"] = {k: v for k, v in doc["spec"]["trainer"].items()
                              if k not in ("learning_rate", "warmup_steps", "weight_decay")} | t
    path.write_text(json.dumps(doc))
    return path


def test_trainer_options_for_user_modules_reach_the_trainer(write_spec, tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import GradientAccumulationScheduler
    from lightning.pytorch.profilers import SimpleProfiler

    spec_path = _user_spec(write_spec, {
        "max_steps": None, "max_epochs": 3, "gradient_accumulation_schedule": {0: 4, 2: 2}, "gradient_accumulation_steps": 4,
        "gradient_clip_algorithm": "value",
        "find_unused_parameters": True, "sync_batchnorm": True, "deterministic": True, "num_sanity_val_steps": 0,
        "profiler": "simple",
    })
    benchmark = torch.backends.cudnn.benchmark
    try:
        trainer, checkpoint, _ = _build(spec_path, tmp_path)
        assert torch.are_deterministic_algorithms_enabled()  # Trainer(deterministic=True) sets the torch flag
    finally:  # a process-wide flag: leave it as the other tests expect
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = benchmark
    assert trainer.max_steps == -1 and trainer.max_epochs == 3
    schedulers = [cb for cb in trainer.callbacks if isinstance(cb, GradientAccumulationScheduler)]
    assert len(schedulers) == 1 and schedulers[0].scheduling == {0: 4, 2: 2}
    assert trainer.accumulate_grad_batches == 1  # Lightning's rule beside the scheduler
    assert trainer.gradient_clip_algorithm == "value" and trainer.gradient_clip_val == 1.0
    assert trainer.strategy._ddp_kwargs["find_unused_parameters"] is True
    assert trainer._accelerator_connector._layer_sync is not None  # sync_batchnorm: TorchSyncBatchNorm
    assert trainer.num_sanity_val_steps == 0
    assert isinstance(trainer.profiler, SimpleProfiler)
    assert trainer.reload_dataloaders_every_n_epochs == 0  # the user's loaders are built once
    assert trainer.checkpoint_callbacks == [checkpoint]


def test_fsdp_policies_come_from_the_spec_for_a_user_model(write_spec, tmp_path: Path) -> None:
    spec_path = _user_spec(write_spec, {
        "strategy": "fsdp", "fsdp_auto_wrap_policy": ["torch.nn.Linear"], "fsdp_activation_checkpointing_policy": ["torch.nn.Linear"],
        "fsdp_backward_prefetch": "BACKWARD_POST", "fsdp_forward_prefetch": True, "fsdp_limit_all_gathers": False,
    }, accelerator="gpu")
    fsdp = build_strategy(load_resolved_spec(spec_path), spec_path)
    assert fsdp.kwargs["auto_wrap_policy"]._module_classes == {torch.nn.Linear}  # not jobgen's GPT Block
    assert fsdp._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {torch.nn.Linear}
    assert fsdp.kwargs["backward_prefetch"].name == "BACKWARD_POST"
    assert fsdp.kwargs["forward_prefetch"] is True and fsdp.kwargs["limit_all_gathers"] is False

    plain = _user_spec(write_spec, {"strategy": "fsdp"}, accelerator="gpu")
    fsdp = build_strategy(load_resolved_spec(plain), plain)
    assert "auto_wrap_policy" not in fsdp.kwargs or fsdp.kwargs["auto_wrap_policy"] is None  # one FSDP unit


def test_a_missing_policy_class_is_a_located_error(write_spec, tmp_path: Path) -> None:
    from jobgen.errors import ConfigError

    spec_path = _user_spec(write_spec, {"strategy": "fsdp", "fsdp_auto_wrap_policy": ["torch.nn.Linearr"]}, accelerator="gpu")
    with pytest.raises(ConfigError, match=r"'torch.nn' has no attribute 'Linearr' \(did you mean 'Linear'\?\)") as info:
        build_strategy(load_resolved_spec(spec_path), spec_path)
    assert info.value.location == "spec.trainer.fsdp_auto_wrap_policy[0]"


def test_a_smoke_run_has_no_checkpoint_callback(write_spec, tmp_path: Path) -> None:
    spec_path = write_spec({"smoke": True, "checkpoint": {"resume": "never"}})
    trainer, _, _ = _build(spec_path, tmp_path)
    assert trainer.checkpoint_callbacks == []
    assert not any(isinstance(cb, StepCheckpoint) for cb in trainer.callbacks)


def test_validation_under_an_accumulation_schedule_runs_every_n_optimizer_steps(write_spec, tmp_path: Path) -> None:
    """``val_check_interval`` counts optimizer steps in every epoch, also after the schedule
    changed the accumulation (Lightning's own interval counts micro batches: 5 steps x epoch 0's 4
    micro batches would validate every 10 steps once epoch 1 accumulates 2)."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule

    schedule, every = {0: 4, 1: 2}, 5
    spec_path = _user_spec(write_spec, {
        "max_steps": None, "max_epochs": 2, "gradient_accumulation_schedule": schedule, "gradient_accumulation_steps": 4,
        "val_check_interval": every, "num_sanity_val_steps": 0,
    }, devices_per_node=1, world_size=1)
    trainer, _, _ = _build(spec_path, tmp_path)
    seen: list[int] = []

    class Record(Callback):
        def on_validation_start(self, trainer, pl_module):
            seen.append(trainer.global_step)

    trainer.callbacks.append(Record())
    data = BoringDataModule()
    data.setup("fit")
    batches = len(data.train_dataloader())
    steps = sum(-(-batches // schedule[epoch]) for epoch in (0, 1))  # a short last accumulation steps too
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer.fit(BoringModel(), datamodule=BoringDataModule())
    assert trainer.global_step == steps
    assert seen == list(range(every, steps + 1, every))
