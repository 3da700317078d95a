"""The Lightning API jobgen overrides or relies on is still there, with the same parameters.

No training: classes are inspected and a Trainer is constructed at most. A Lightning upgrade
that renames a hook, changes its parameters or drops an attribute jobgen reads fails here, by
name, instead of deep inside a 2-rank training run (or silently: an override Lightning no longer
calls just stops applying). setup.cfg bounds lightning (>=2.4,<2.7; tested with 2.6.6).

What is pinned:

* every method jobgen's Lightning subclasses define that Lightning's base also defines
  (strategy overrides in jobgen/train/strategies.py, callback hooks in callbacks.py and
  checkpoints.py, LightningModule and LightningDataModule hooks): :data:`OVERRIDES`, complete
  (a new override must be added) and each with the base's parameter names;
* the private Lightning API jobgen still uses, and that Lightning still calls it:
  ``FSDPStrategy._setup_model`` and ``DeepSpeedStrategy._setup_model_and_optimizer``, overridden
  by the CPU strategies (no public hook wraps the model or calls ``deepspeed.initialize``);
* ``_LoggerConnector.should_update_logs``, which LitGPT reads to know a log step
  (jobgen.train.speed.LogStepLoss), and that the epoch loop calls the module's
  ``on_train_batch_end`` (where a late log step's loss is logged) before it hands the step's
  metrics to the loggers;
* the fit-loop privates ValidateEveryNSteps replaces and reads (``_should_check_val_fx``,
  ``_should_accumulate``, ``_can_stop_early``: no public hook decides when to validate);
* that the Trainer hands CPUFSDPStrategy its FSDPPrecision through the ``precision_plugin``
  setter (swapped there for CPU autocast) and Lightning's own still autocasts CUDA only;
* the attributes and public calls jobgen relies on (FSDPStrategy's ``kwargs`` & co., its
  private ``_state_dict_type`` and default ``use_orig_params=True`` read for LoRA,
  ``Trainer.save_checkpoint``, ``Strategy.remove_checkpoint``/``barrier``/``broadcast``, the
  ``Checkpoint`` base class contract, ``SLURMEnvironment``, the rank-zero logger name).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

import lightning
import pytest
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, Strategy

TESTED = "2.6.6"
"""The Lightning version jobgen's training tests ran with (setup.cfg: lightning>=2.4,<2.7)."""

#: jobgen class -> the Lightning base whose API it overrides -> the names it overrides.
OVERRIDES: dict[str, tuple[type, set[str]]] = {
    "jobgen.train.strategies.CPUFSDPStrategy": (FSDPStrategy, {"_setup_model", "precision_plugin"}),
    "jobgen.train.strategies.CPUFSDPPrecision": (FSDPPrecision, {"forward_context"}),
    "jobgen.train.strategies.CPUDeepSpeedStrategy": (
        DeepSpeedStrategy, {"setup_environment", "setup_distributed", "_setup_model_and_optimizer"},
    ),
    "jobgen.train.checkpoints.StepCheckpoint": (
        Checkpoint, {"state_key", "on_train_start", "on_train_batch_end", "on_train_end", "state_dict", "load_state_dict"},
    ),
    "jobgen.train.callbacks.Throughput": (
        Callback, {"on_train_start", "on_train_batch_end", "on_validation_start", "on_validation_end"},
    ),
    "jobgen.train.callbacks.LineProgress": (Callback, {"on_train_batch_end", "on_validation_end"}),
    "jobgen.train.callbacks.FSDPGradNormClipping": (Callback, {"on_before_optimizer_step"}),
    "jobgen.train.callbacks.StepTrace": (Callback, {"on_train_batch_start", "on_train_batch_end"}),
    "jobgen.train.callbacks.LogIntervalBar": (TQDMProgressBar, {"get_metrics"}),
    "jobgen.train.trainer.ValidateEveryNSteps": (Callback, {"setup"}),
    "jobgen.train.callbacks.RequeueOnSignal": (Callback, {"setup", "on_train_batch_end", "on_train_end"}),
    "jobgen.train.model.LitGPT": (
        LightningModule, {"forward", "training_step", "on_before_optimizer_step", "on_train_batch_end", "validation_step",
                          "on_validation_epoch_end",
                          "configure_optimizers", "configure_gradient_clipping", "on_save_checkpoint", "on_load_checkpoint"},
    ),
    "jobgen.train.hf.LitHFCausalLM": (LightningModule, {"forward", "on_save_checkpoint", "on_load_checkpoint"}),
    "jobgen.train.data.ByteTextDataModule": (
        LightningDataModule, {"prepare_data", "setup", "train_dataloader", "val_dataloader"},
    ),
    "jobgen.train.format_data.TokenDataModule": (LightningDataModule, {"prepare_data", "setup"}),
    "jobgen.train.format_data.InstructionDataModule": (LightningDataModule, {"prepare_data", "setup"}),
}  # fmt: skip

#: Modules whose Lightning subclasses must all appear in OVERRIDES (with every override).
MODULES = ("strategies", "checkpoints", "callbacks", "model", "hf", "data", "format_data", "trainer")


def _fail(what: str, fix: str) -> None:
    pytest.fail(
        f"Lightning {lightning.__version__} (jobgen is tested with {TESTED}; setup.cfg allows "
        f">=2.4,<2.7): {what}\nFix: {fix}",
        pytrace=False,
    )


def _load(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _lightning_subclasses() -> dict[str, type]:
    """Every class defined in jobgen.train.<MODULES> that derives from a Lightning class."""
    found = {}
    for name in MODULES:
        module = importlib.import_module(f"jobgen.train.{name}")
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and obj.__module__ == module.__name__
                and any(base.__module__.startswith("lightning.") for base in obj.__mro__[1:])
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def _overridden(cls: type, base: type) -> set[str]:
    own = {n for n in vars(cls) if not (n.startswith("__") and n.endswith("__")) and n != "_abc_impl"}
    return {n for n in own if hasattr(base, n)}


def _parameters(fn: Any) -> list[str] | None:
    """Parameter names after ``self``; ``None`` when the signature takes ``*args``/``**kwargs``."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return [p.name for p in params]


def test_overrides_table_lists_every_lightning_subclass_and_override() -> None:
    found = _lightning_subclasses()
    if set(found) != set(OVERRIDES):
        _fail(
            f"jobgen's Lightning subclasses {sorted(found)} differ from OVERRIDES {sorted(OVERRIDES)}",
            "list each jobgen subclass of a Lightning class in OVERRIDES with the base it extends",
        )
    for qualified, (base, names) in OVERRIDES.items():
        cls = found[qualified]
        if not issubclass(cls, base):
            _fail(f"{qualified} no longer derives from {base.__qualname__}", "fix OVERRIDES or the class")
        extra = _overridden(cls, base) - names
        if extra:
            _fail(
                f"{qualified} overrides {sorted(extra)} of {base.__qualname__}, not listed in OVERRIDES",
                "add them to OVERRIDES so their signatures are checked against Lightning's",
            )


@pytest.mark.parametrize("qualified", sorted(OVERRIDES))
def test_overridden_hooks_still_exist_with_the_same_parameters(qualified: str) -> None:
    base, names = OVERRIDES[qualified]
    cls = _load(qualified)
    for name in sorted(names):
        where = f"{base.__module__}.{base.__qualname__}.{name}"
        if not hasattr(base, name):
            _fail(
                f"{where} is gone, but jobgen's {qualified} overrides it: the override is never called",
                f"find what replaced {name} in Lightning's {base.__qualname__} and move the override there",
            )
        ours, theirs = inspect.getattr_static(cls, name), inspect.getattr_static(base, name)
        if isinstance(theirs, property) != isinstance(ours, property):
            _fail(f"{where} and {qualified}.{name}: one is a property, the other not", f"match {where}")
        if isinstance(theirs, property) or not callable(getattr(base, name)):
            continue
        expected = _parameters(getattr(base, name))
        if expected is not None and _parameters(getattr(cls, name)) != expected:
            _fail(
                f"{where}{inspect.signature(getattr(base, name))} has parameters {expected}; jobgen's "
                f"{qualified}.{name} takes {_parameters(getattr(cls, name))}",
                f"update {qualified}.{name} to Lightning's signature (and what it does with the arguments)",
            )


def test_private_strategy_methods_jobgen_overrides_are_still_called_by_lightning() -> None:
    """No public hook lets a strategy wrap the model in FSDP with a CPU device id, or call
    ``deepspeed.initialize`` with a CPU rank: the CPU strategies override these private methods,
    so Lightning must still call them from the strategy's set-up."""
    for base, name in ((FSDPStrategy, "_setup_model"), (DeepSpeedStrategy, "_setup_model_and_optimizer")):
        if f"self.{name}(" not in inspect.getsource(base):
            _fail(
                f"{base.__qualname__} no longer calls self.{name}(...): jobgen's CPU override in "
                "jobgen/train/strategies.py would be skipped",
                "find where Lightning now wraps the model / initialises DeepSpeed and override that",
            )
    if not issubclass(DeepSpeedStrategy, DDPStrategy):
        _fail(
            "DeepSpeedStrategy is no longer a DDPStrategy: CPUDeepSpeedStrategy calls "
            "DDPStrategy.setup_environment/setup_distributed on itself",
            "set up the gloo process group in CPUDeepSpeedStrategy another way",
        )


def test_the_fit_loop_privates_validate_every_n_steps_replaces_and_reads() -> None:
    """ValidateEveryNSteps (jobgen/train/trainer.py) replaces the epoch loop's
    ``_should_check_val_fx(data_fetcher)`` and reads ``_should_accumulate()`` and the fit loop's
    ``_can_stop_early``; the loop must still call the attribute it replaces."""
    from lightning.pytorch.loops.fit_loop import _FitLoop
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    fx = getattr(_TrainingEpochLoop, "_should_check_val_fx", None)
    if fx is None or _parameters(fx) != ["data_fetcher"]:
        _fail("_TrainingEpochLoop._should_check_val_fx(data_fetcher) changed or is gone",
              "find where Lightning now decides to validate and move ValidateEveryNSteps there")
    if "self._should_check_val_fx(" not in inspect.getsource(_TrainingEpochLoop):
        _fail("_TrainingEpochLoop no longer calls self._should_check_val_fx", "move ValidateEveryNSteps' override")
    if _parameters(_TrainingEpochLoop._should_accumulate) != []:
        _fail("_TrainingEpochLoop._should_accumulate() changed", "update ValidateEveryNSteps")
    if not isinstance(inspect.getattr_static(_FitLoop, "_can_stop_early", None), property):
        _fail("_FitLoop._can_stop_early is no longer a property", "update ValidateEveryNSteps")


def test_the_log_step_private_litgpt_reads_and_the_hook_order_it_relies_on() -> None:
    """LitGPT._log_step reads ``trainer._logger_connector.should_update_logs`` (a property), and
    logs a late log step's ``train_loss`` (a requeue's stop) in ``on_train_batch_end``, which the
    epoch loop must call before ``update_train_step_metrics`` (where the loggers get the step's
    metrics) for the value to reach that step's row."""
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

    if not isinstance(inspect.getattr_static(_LoggerConnector, "should_update_logs", None), property):
        _fail("_LoggerConnector.should_update_logs is no longer a property", "update LitGPT._log_step")
    source = inspect.getsource(_TrainingEpochLoop.advance)
    hook = source.find('_call_lightning_module_hook(trainer, "on_train_batch_end"')
    handed = source.find("update_train_step_metrics()")
    if hook < 0 or handed < 0 or hook > handed:
        _fail("the epoch loop no longer calls the module's on_train_batch_end before update_train_step_metrics",
              "log LitGPT's train_loss where the step's metrics are still open (jobgen.train.speed.LogStepLoss)")


def test_fsdp_strategy_attributes_the_cpu_strategy_reads() -> None:
    from jobgen.train.model import Block
    from jobgen.train.strategies import CPUFSDPStrategy

    strategy = CPUFSDPStrategy(auto_wrap_policy={Block}, state_dict_type="sharded", process_group_backend="gloo")
    for name in ("kwargs", "cpu_offload", "sharding_strategy", "mixed_precision_config"):
        if not hasattr(strategy, name):
            _fail(
                f"FSDPStrategy has no attribute {name!r}; CPUFSDPStrategy._setup_model passes it to FSDP",
                "read the setting where FSDPStrategy keeps it now (see FSDPStrategy._setup_model)",
            )
    if not isinstance(strategy.kwargs, dict) or "auto_wrap_policy" not in strategy.kwargs:
        _fail("FSDPStrategy.kwargs no longer holds the auto_wrap_policy", "see FSDPStrategy.__init__")


def test_the_cpu_fsdp_strategy_gets_cpu_autocast_for_mixed_precision() -> None:
    """CPUFSDPStrategy swaps the FSDPPrecision plugin the Trainer hands it (through the
    ``precision_plugin`` setter) for CPUFSDPPrecision, whose forward context is CPU autocast:
    Lightning's own opens CUDA autocast, a no-op on a CPU rank."""
    import torch

    from jobgen.train.strategies import CPUFSDPPrecision, CPUFSDPStrategy

    trainer = Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", logger=False,
                      strategy=CPUFSDPStrategy(process_group_backend="gloo"))
    plugin = trainer.strategy.precision_plugin
    if not isinstance(plugin, CPUFSDPPrecision) or plugin.precision != "bf16-mixed":
        _fail(f"the Trainer's FSDP precision plugin reached CPUFSDPStrategy as {plugin!r}, not through the "
              "precision_plugin setter", "see how the accelerator connector hands the strategy its precision")
    with plugin.forward_context():
        if not torch.is_autocast_enabled("cpu"):
            _fail("CPUFSDPPrecision.forward_context does not enable CPU autocast", "see jobgen/train/strategies.py")
    with FSDPPrecision("bf16-mixed").forward_context():
        if torch.is_autocast_enabled("cpu"):
            _fail("Lightning's FSDPPrecision now autocasts on CPU itself", "drop CPUFSDPPrecision")


def test_fsdp_strategy_state_dict_type_and_orig_params_the_hf_module_relies_on() -> None:
    """LitHFCausalLM reads the private ``_state_dict_type`` to keep LoRA's frozen base in sharded
    checkpoints (Lightning's sharded load asks for every key); LoRA under FSDP runs with
    ``use_orig_params=True`` (the parameter names checkpoints and the AdamW groups use; the
    adapters are units of their own, jobgen.train.hf.lora_wrap_policy), which Lightning sets
    unless told otherwise and jobgen never overrides."""
    for kind in ("sharded", "full"):
        if getattr(FSDPStrategy(state_dict_type=kind), "_state_dict_type", None) != kind:
            _fail("FSDPStrategy no longer keeps state_dict_type in ._state_dict_type",
                  "update LitHFCausalLM._state_dict_in_checkpoint (jobgen/train/hf.py)")
    if FSDPStrategy().kwargs.get("use_orig_params") is not True:
        _fail("FSDPStrategy no longer defaults to use_orig_params=True",
              "pass use_orig_params=True in jobgen.train.trainer.build_strategy (LoRA's checkpoint keys "
              "and AdamW groups are the original parameter names)")


def test_deepspeed_strategy_attributes_the_cpu_strategy_reads() -> None:
    pytest.importorskip("deepspeed")
    from jobgen.train.strategies import CPUDeepSpeedStrategy

    strategy = CPUDeepSpeedStrategy(config={"train_micro_batch_size_per_gpu": 1}, process_group_backend="gloo")
    if not isinstance(getattr(strategy, "config", None), dict) or not hasattr(strategy, "local_rank"):
        _fail("DeepSpeedStrategy has no .config dict or .local_rank", "see DeepSpeedStrategy._setup_model_and_optimizer")


def test_public_calls_jobgen_makes_keep_their_parameters() -> None:
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    expected = {
        Trainer.save_checkpoint: ["filepath", "weights_only"],
        Strategy.remove_checkpoint: ["filepath"],
        Strategy.barrier: ["name"],
        Strategy.broadcast: ["obj", "src"],
        SLURMEnvironment.__init__: ["auto_requeue", "requeue_signal"],
    }
    for fn, names in expected.items():
        params = list(inspect.signature(fn).parameters)
        if params[1 : 1 + len(names)] != names:
            _fail(f"{fn.__qualname__}{inspect.signature(fn)} no longer starts with {names}", "update the callers in jobgen/train")
    if not isinstance(inspect.getattr_static(Trainer, "ckpt_path"), property):
        _fail("Trainer.ckpt_path is gone; StepCheckpoint never deletes the checkpoint a run resumed from", "see StepCheckpoint._may_remove")


def test_a_checkpoint_subclass_replaces_the_default_model_checkpoint(tmp_path) -> None:
    """StepCheckpoint derives from the public ``Checkpoint`` base: the Trainer must then add no
    ModelCheckpoint of its own and order it after the other callbacks (as ModelCheckpoint)."""
    from jobgen.train.checkpoints import StepCheckpoint

    checkpoint, other = StepCheckpoint(tmp_path, every_n_steps=10, keep_last_k=2), Callback()
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, callbacks=[checkpoint, other])
    if any(isinstance(cb, ModelCheckpoint) for cb in trainer.callbacks) or trainer.checkpoint_callback is not checkpoint:
        _fail(
            "a Checkpoint subclass in callbacks no longer stops the Trainer from adding a default ModelCheckpoint",
            "pass enable_checkpointing=False in jobgen.train.trainer.build_trainer",
        )
    if trainer.callbacks[-1] is not checkpoint:
        _fail(
            "the Trainer no longer runs Checkpoint callbacks last",
            "append StepCheckpoint last in build_trainer: its saves must follow Throughput and RequeueOnSignal",
        )


def test_lightning_tips_are_dropped_by_the_logger_name_jobgen_filters() -> None:
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from jobgen.train.run import _quiet_lightning

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(str(record.msg))

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler = Keep(level=logging.INFO)
    logger.addHandler(handler)
    try:
        _quiet_lightning()
        rank_zero_info("💡 Tip: an advertisement")
        rank_zero_info("a real message")
    finally:
        logger.removeHandler(handler)
    if seen != ["a real message"]:
        _fail(
            f"rank_zero_info no longer logs through 'lightning.pytorch.utilities.rank_zero' as jobgen expects (saw {seen})",
            "attach jobgen.train.run._DropTips to the logger Lightning's rank_zero_info uses now",
        )


def test_rank_zero_only_still_carries_the_rank() -> None:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if not isinstance(getattr(rank_zero_only, "rank", None), int):
        _fail("rank_zero_only.rank is gone; jobgen.train.run.rank_zero_print reads it", "use trainer.is_global_zero")
