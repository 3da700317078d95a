"""Checkpoint discovery for ``resume: auto`` and the step checkpoint callback.

Checkpoints live in ``<run_dir>/checkpoints``: ``step-<global step>.ckpt`` every N optimizer
steps and at the end, ``last.ckpt``, and ``hpc_ckpt_<n>.ckpt`` written by
:class:`jobgen.train.callbacks.RequeueOnSignal` when SLURM signals a job before its time limit or
pre-emption. A checkpoint is a file, or a directory for
sharded strategies (FSDP sharded state dict, DeepSpeed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

STEP_FILENAME = "step-{step:08d}"
"""ModelCheckpoint filename template of the step checkpoints (``.ckpt`` is appended)."""

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


class StepCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that also saves when training reaches ``max_steps``.

    Stock ModelCheckpoint with ``every_n_train_steps`` saves only on multiples of N, so a run
    whose ``max_steps`` is not a multiple would end with an older ``last.ckpt`` and a resumed
    job would repeat steps. Relies on ModelCheckpoint's internal save helpers (Lightning 2.6).
    """

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Save every N steps (stock behaviour) and once more at ``max_steps``."""
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if (
            trainer.max_steps > 0
            and trainer.global_step >= trainer.max_steps
            and not self._should_skip_saving_checkpoint(trainer)
        ):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
