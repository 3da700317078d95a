"""Checkpoint discovery for ``resume: auto`` and the step checkpoint callback.

Checkpoints live in ``<run_dir>/checkpoints``: ``step-<global step>.ckpt`` every N optimizer
steps and at the end, ``last.ckpt``, and ``hpc_ckpt_<n>.ckpt`` written by
:class:`jobgen.train.callbacks.RequeueOnSignal` when SLURM signals a job before its time limit or
pre-emption. A checkpoint is a file, or a directory for
sharded strategies (FSDP sharded state dict, DeepSpeed). Checkpoints are written under a hidden
name (``.<name>.partial``) and renamed when complete; names starting with a dot are never resumed
from.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn

STEP_FILENAME = "step-{step:08d}"
"""Name template of the step checkpoints (``.ckpt`` is appended)."""
LAST_NAME = "last.ckpt"
"""The checkpoint rewritten after every step checkpoint."""

_STEP_NAME_RE = re.compile(r"step-(\d+)(?:-v\d+)?\.ckpt")
# Files inside a checkpoint directory that hold the trainer state (with "global_step"):
# FSDP sharded state dict (meta.pt); DeepSpeed ZeRO 1/2 (mp_rank_00_model_states.pt) and
# ZeRO 3 (one zero_pp_rank_<rank>_... file per rank; rank 0's is read), under the tag
# "checkpoint" that Lightning's DeepSpeedStrategy.save_checkpoint uses.
_STATE_FILES_IN_DIR = (
    "meta.pt",
    "checkpoint/mp_rank_00_model_states.pt",
    "checkpoint/zero_pp_rank_0_mp_rank_00_model_states.pt",
)


@dataclass(frozen=True)
class FoundCheckpoint:
    """A checkpoint in the run directory.

    Attributes:
        path: the checkpoint file or directory.
        global_step: optimizer steps completed when it was saved (``None``: unreadable).
        mtime: modification time (seconds since the epoch).
    """

    path: Path
    global_step: int | None
    mtime: float


def _load_state(path: Path) -> dict[str, Any]:
    # Our own checkpoints in our own run directory: full unpickling is needed for Lightning's
    # non-tensor state (loops, callbacks). mmap keeps this cheap for large files.
    return torch.load(path, map_location="cpu", mmap=True, weights_only=False)


def read_global_step(path: Path) -> int | None:
    """Global step stored in a Lightning checkpoint file or directory, ``None`` if unreadable.

    ``step-N.ckpt`` names are trusted without opening the file.
    """
    match = _STEP_NAME_RE.fullmatch(path.name)
    if match:
        return int(match.group(1))
    candidates = [path] if path.is_file() else [path / name for name in _STATE_FILES_IN_DIR]
    for candidate in candidates:
        if not candidate.is_file():
            continue
        try:
            step = _load_state(candidate).get("global_step")
        except Exception:  # noqa: BLE001 - a truncated or foreign file just does not count
            return None
        return int(step) if isinstance(step, int) else None
    return None


def find_checkpoints(ckpt_dir: Path) -> list[FoundCheckpoint]:
    """All ``*.ckpt`` files/directories in ``ckpt_dir``, newest first.

    Newest = highest global step; unreadable checkpoints come last; ties are broken by
    modification time, then name.
    """
    if not ckpt_dir.is_dir():
        return []
    found = [
        FoundCheckpoint(p, read_global_step(p), p.stat().st_mtime)
        for p in ckpt_dir.iterdir()
        if p.name.endswith(".ckpt") and not p.name.startswith(".")
    ]
    found.sort(
        key=lambda c: (c.global_step is not None, c.global_step or 0, c.mtime, c.path.name), reverse=True
    )
    return found


def newest_checkpoint(ckpt_dir: Path) -> FoundCheckpoint | None:
    """The checkpoint to resume from (see :func:`find_checkpoints`), or ``None``."""
    found = find_checkpoints(ckpt_dir)
    return found[0] if found else None


def reached_max_steps(found: FoundCheckpoint | None, max_steps: int | None) -> bool:
    """Whether resuming from ``found`` finds the run complete: its global step is at least
    ``max_steps`` (a run bounded by ``max_steps``; never for ``None`` or an unreadable step)."""
    return found is not None and found.global_step is not None and max_steps is not None and found.global_step >= max_steps


def completed_checkpoint(spec: Any, ckpt_dir: Path) -> FoundCheckpoint | None:
    """The checkpoint in ``ckpt_dir`` that the run (``spec``, a TrainingSpec) would resume
    from and find complete (:func:`reached_max_steps`), or None: the run has work left, or it
    does not resume (a smoke run, ``checkpoint.resume: never``)."""
    if spec.smoke or spec.checkpoint.resume == "never":
        return None
    found = newest_checkpoint(ckpt_dir)
    return found if reached_max_steps(found, spec.trainer.max_steps) else None


def _remove_path(path: Path) -> None:
    """Delete a checkpoint file, directory or symlink; nothing if absent."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _move_into_place(partial: Path, final: Path) -> None:
    """Rename a finished checkpoint (file or directory) to its final name.

    A file replaces a file in one atomic ``os.replace``. A directory (sharded checkpoint) cannot
    replace another one atomically: the old one is first renamed to a hidden name, so a reader
    finds the old checkpoint, for an instant none, or the new one, never a half-written one.
    """
    if partial.is_file() and not (final.is_dir() and not final.is_symlink()):
        os.replace(partial, final)
        return
    aside = final.with_name(f".{final.name}.old")
    _remove_path(aside)
    if final.exists() or final.is_symlink():
        os.replace(final, aside)
    os.replace(partial, final)
    _remove_path(aside)


@contextlib.contextmanager
def held_back(*signums: signal.Signals) -> Iterator[None]:
    """Record ``signums`` instead of handling them inside the block; afterwards restore the
    handlers and raise each signal that came again (main thread only)."""
    got: list[int] = []
    previous = {s: signal.signal(s, lambda number, frame: got.append(number)) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for number in dict.fromkeys(got):
            signal.raise_signal(number)


@runtime_checkable
class CheckpointListener(Protocol):
    """A logger told when a checkpoint is complete (:class:`jobgen.train.tracking.TrackerLogger`:
    the trackers get the metrics a checkpoint covers)."""

    def checkpoint_written(self, step: int) -> None:
        """The checkpoint of optimizer step ``step`` is in place (called on global rank zero)."""


def save_checkpoint_atomically(trainer: Trainer, path: Path) -> None:
    """``trainer.save_checkpoint`` to ``.<name>.partial``, then renamed to ``path`` (collective).

    Every rank must call this, as :meth:`lightning.pytorch.Trainer.save_checkpoint` requires (it
    ends with a barrier); the strategy decides who writes what: global rank zero the whole file
    under DDP and full state dicts, every rank its shard under FSDP sharded state dicts and
    DeepSpeed (a directory). Global rank zero then renames the result. A job killed during the
    save leaves only the hidden partial, which :func:`find_checkpoints` skips and the next save
    to the same name clears; never a truncated checkpoint under a name that resume picks.
    Sharded checkpoints need a directory all nodes share, as resuming from them does.

    Once the checkpoint is in place, global rank zero tells every logger that is a
    :class:`CheckpointListener` (the experiment trackers send the metrics it covers).
    """
    partial = path.with_name(f".{path.name}.partial")
    if trainer.is_global_zero:
        _remove_path(partial)
    trainer.strategy.barrier("jobgen-checkpoint-partial")
    trainer.save_checkpoint(partial, weights_only=False)
    if trainer.is_global_zero:
        _move_into_place(partial, path)
        for logger in trainer.loggers:
            if isinstance(logger, CheckpointListener):
                logger.checkpoint_written(trainer.global_step)
    trainer.strategy.barrier("jobgen-checkpoint-renamed")


class StepCheckpoint(Checkpoint):
    """Saves ``step-<global step>.ckpt`` every ``every_n_steps`` optimizer steps and at
    ``max_steps``, keeps the newest ``keep_last_k`` of them, and rewrites ``last.ckpt`` after each.

    Lightning's ``ModelCheckpoint(every_n_train_steps=N)`` saves on multiples of N only, so a run
    whose ``max_steps`` is not a multiple would end with an older ``last.ckpt`` and a resumed job
    would repeat steps. This callback uses public Lightning API only: the base class for custom
    checkpoint callbacks (``lightning.pytorch.callbacks.Checkpoint``: the Trainer then adds no
    ModelCheckpoint of its own and runs this callback after the others, as it runs ModelCheckpoint),
    the callback hooks, :meth:`Trainer.save_checkpoint` (through
    :func:`save_checkpoint_atomically`), ``Strategy.remove_checkpoint`` (global rank zero deletes)
    and ``Strategy.barrier``. Its decisions depend only on the global step and the checkpointed
    state, the same on every rank.

    It writes the files the ModelCheckpoint subclass it replaces wrote (``ModelCheckpoint(
    every_n_train_steps=N, save_top_k=k, monitor="step", mode="max", save_last=True,
    enable_version_counter=False)`` plus a save at ``max_steps``; Lightning 2.6,
    ``lightning/pytorch/callbacks/model_checkpoint.py``):

    * at optimizer step ``s`` with ``s % every_n_steps == 0`` or ``s == max_steps``, once per step,
      only in ``fit`` and not in the sanity check: ``step-<s>.ckpt``, then ``last.ckpt``;
    * retention (ModelCheckpoint's top k of the monitored ``step``, mode ``max``): of the step
      checkpoints this run saved and those the checkpoint it resumed from had kept in the same
      directory, the newest ``keep_last_k`` stay; an older one is deleted after the new one is
      written, unless it is the checkpoint the run resumed from or lies outside ``dirpath``
      (``ModelCheckpoint._should_remove_checkpoint``); files it never kept are left alone;
    * when training ends without any save in this process (a requeue before the first interval),
      ``last.ckpt`` is written at the end (``ModelCheckpoint.on_train_end``, ``save_last=True``).

    Where it differs from Lightning 2.6's ModelCheckpoint, deliberately:

    * a resumed run does not save again at the step it resumed from: with gradient accumulation
      ModelCheckpoint did, after the first micro batch, in the middle of an accumulation window;
    * a save step that ends a Lightning epoch is saved at that step: ModelCheckpoint with a
      monitor deferred it to the next validation end, a later step unless validation ran then;
    * a smaller ``keep_last_k`` on resume deletes down to the new k (ModelCheckpoint kept all);
    * each file or directory is written under a hidden name and renamed into place.

    ``state_dict`` has ModelCheckpoint's keys and ``state_key`` is the one the ModelCheckpoint
    subclass had, so a run resumes across this change, either way, with its retention state.

    Args:
        dirpath: the checkpoint directory (``<run_dir>/checkpoints``).
        every_n_steps: optimizer steps between step checkpoints.
        keep_last_k: step checkpoints to keep (newest first); ``last.ckpt`` is kept in addition.
    """

    def __init__(self, dirpath: str | Path, every_n_steps: int, keep_last_k: int):
        if every_n_steps < 1 or keep_last_k < 1:
            raise ValueError(f"every_n_steps and keep_last_k must be >= 1, got {every_n_steps} and {keep_last_k}")
        # Resolved as ModelCheckpoint resolves it: checkpointed state is matched against it.
        self.dirpath = os.path.realpath(os.path.expanduser(dirpath))
        self.every_n_steps = every_n_steps
        self.keep_last_k = keep_last_k
        self.kept: dict[str, int] = {}
        """The step checkpoints kept: path -> global step."""
        self.best_model_path = ""
        """The newest kept step checkpoint (ModelCheckpoint's name: best by the monitored step)."""
        self.last_model_path = ""
        """``<dirpath>/last.ckpt`` once written."""
        self._last_saved_step: int | None = None
        self._saved_in_this_process = False

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint: the ModelCheckpoint subclass's key
        (``Callback._generate_state_key`` of its monitor, mode and triggers), kept so that
        checkpoints written before and after this class replaced it restore each other's state."""
        triggers = {"monitor": "step", "mode": "max", "every_n_train_steps": self.every_n_steps}
        return "StepCheckpoint" + repr({**triggers, "every_n_epochs": 0, "train_time_interval": None})

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Training starts (or resumes) at a step that needs no new checkpoint."""
        self._last_saved_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After an optimizer step that is a multiple of ``every_n_steps`` or ``max_steps``: save."""
        step = trainer.global_step
        if step == self._last_saved_step or trainer.fast_dev_run or trainer.sanity_checking:
            return  # also every micro batch but the last of an accumulation window
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if step % self.every_n_steps == 0 or (trainer.max_steps > 0 and step >= trainer.max_steps):
            self._save_step(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Write ``last.ckpt`` if this process has saved nothing (training stopped early); a run
        that ended by ``max_epochs`` between two intervals saves its final step too."""
        epochs_done = trainer.max_epochs is not None and trainer.max_epochs > 0 and trainer.current_epoch >= trainer.max_epochs
        if epochs_done and self._last_saved_step != trainer.global_step and trainer.state.fn == TrainerFn.FITTING:
            self._save_step(trainer)
        elif not self._saved_in_this_process:
            self._save_last(trainer)

    def _save_step(self, trainer: Trainer) -> None:
        step = trainer.global_step
        path = os.path.join(self.dirpath, STEP_FILENAME.format(step=step) + ".ckpt")
        self.kept[path] = step
        dropped = []
        while len(self.kept) > self.keep_last_k:
            oldest = min(self.kept, key=self.kept.__getitem__)
            del self.kept[oldest]
            dropped.append(oldest)
        # Set before saving: the checkpoint carries the state that includes itself.
        self.best_model_path = max(self.kept, key=self.kept.__getitem__)
        self.last_model_path = os.path.join(self.dirpath, LAST_NAME)
        save_checkpoint_atomically(trainer, Path(path))
        self._mark_saved(trainer)
        for old in dropped:
            if self._may_remove(trainer, old, path):
                trainer.strategy.remove_checkpoint(old)
        self._save_last(trainer)

    def _save_last(self, trainer: Trainer) -> None:
        self.last_model_path = os.path.join(self.dirpath, LAST_NAME)
        save_checkpoint_atomically(trainer, Path(self.last_model_path))
        self._mark_saved(trainer)

    def _mark_saved(self, trainer: Trainer) -> None:
        self._last_saved_step = trainer.global_step
        self._saved_in_this_process = True

    def _may_remove(self, trainer: Trainer, old: str, new: str) -> bool:
        """Not the file just written, not the one resumed from, and inside ``dirpath``."""
        old_real = os.path.realpath(old)
        if old_real == os.path.realpath(new):
            return False
        if trainer.ckpt_path is not None and old_real == os.path.realpath(trainer.ckpt_path):
            return False
        return Path(self.dirpath) in Path(old_real).parents

    def state_dict(self) -> dict[str, Any]:
        """ModelCheckpoint's state (Lightning 2.6 ``ModelCheckpoint.state_dict``) for ``step``, mode ``max``."""
        scores = {path: torch.tensor(step) for path, step in self.kept.items()}
        kth = min(self.kept, key=self.kept.__getitem__) if len(self.kept) >= self.keep_last_k else ""
        best = scores.get(self.best_model_path)
        return {
            "monitor": "step",
            "best_model_score": best,
            "best_model_path": self.best_model_path,
            "current_score": best,
            "dirpath": self.dirpath,
            "best_k_models": scores,
            "kth_best_model_path": kth,
            "kth_value": scores[kth] if kth else torch.tensor(-torch.inf),
            "last_model_path": self.last_model_path,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the kept checkpoints, if they were kept in this ``dirpath`` (as ModelCheckpoint does)."""
        saved_dir = state_dict.get("dirpath", self.dirpath)
        if saved_dir == self.dirpath:
            self.kept = {str(path): int(step) for path, step in state_dict.get("best_k_models", {}).items()}
            self.last_model_path = state_dict.get("last_model_path", self.last_model_path)
        else:
            warnings.warn(
                f"the checkpoint kept its step checkpoints in {saved_dir!r}, this run keeps them in "
                f"{self.dirpath!r}: those in {saved_dir!r} are not counted towards keep_last_k",
                stacklevel=2,
            )
        self.best_model_path = state_dict.get("best_model_path", "")


def number_optimizer_state_by_parameter(checkpoint: dict[str, Any], module: LightningModule,
                                        optimizers: list[torch.optim.Optimizer]) -> None:
    """Key each plain optimizer state of ``checkpoint`` (``optimizer_states``: torch's
    ``Optimizer.state_dict()``, integer ids) by its parameter's position in
    ``module.parameters()``, in place.

    torch numbers a state's parameters by their position in the optimizer's parameter groups and
    maps them back by that position, whatever the numbers are (``Optimizer.load_state_dict``), so
    a resume on the same path is unchanged. Lightning's FSDPStrategy loads a single-file
    checkpoint's plain state through ``FSDP.rekey_optim_state_dict(state, PARAM_NAME, model)``,
    which takes the numbers to be positions in ``model.parameters()`` (Lightning 2.6,
    ``FSDPStrategy.load_checkpoint``): with jobgen's two AdamW groups (decayed matrices, then the
    rest) the group numbering named the wrong tensors, and a run begun on the single-device path
    could not continue under FSDP at a larger world size. States keyed otherwise
    (FSDP's own, by parameter name) and optimizers over parameters the module does not own are
    left as they are.
    """
    states = checkpoint.get("optimizer_states") or []
    position = {id(p): i for i, p in enumerate(module.parameters())}
    for state, optimizer in zip(states, optimizers, strict=False):
        groups = state.get("param_groups") if isinstance(state, dict) else None
        if not groups or not all(isinstance(k, int) for k in state.get("state", {})):
            continue
        params = [p for group in optimizer.param_groups for p in group["params"]]
        numbers = [n for group in groups for n in group["params"]]
        if len(params) != len(numbers) or any(id(p) not in position for p in params):
            continue
        renumber = {n: position[id(p)] for n, p in zip(numbers, params, strict=True)}
        state["state"] = {renumber[n]: value for n, value in state["state"].items()}
        for group in groups:
            group["params"] = [renumber[n] for n in group["params"]]
