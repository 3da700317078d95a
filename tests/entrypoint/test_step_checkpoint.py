"""StepCheckpoint in-process (one CPU process, a 3-parameter model, seconds): which checkpoints
exist after N steps, when they are written, what a resume keeps and deletes, and its state.

The end-to-end runs (tests/entrypoint/test_entrypoint_train.py, test_strategy_matrix.py,
test_entrypoint_requeue.py) pin the same names for 2-rank DDP, FSDP and DeepSpeed jobs; these
cover the cases they do not reach: gradient accumulation across a resume, epochs shorter than
the run, a resumed-from checkpoint falling out of the newest k, a stop before the first interval.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from jobgen.train.checkpoints import (
    StepCheckpoint,
    _move_into_place,
    find_checkpoints,
    newest_checkpoint,
    read_global_step,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated"),
    pytest.mark.filterwarnings("ignore:.*ended before the epoch ended.*"),
]


class _Tiny(LightningModule):
    """A linear layer on fixed data; ``epoch_steps`` optimizer steps per Lightning epoch."""

    def __init__(self, epoch_batches: int):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.epoch_batches = epoch_batches

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.linspace(0, 1, 2 * self.epoch_batches).view(-1, 2)), batch_size=1)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=1)


class _StopAt(Callback):
    """Stops training after optimizer step ``step`` (as RequeueOnSignal does after a requeue)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def _fit(
    ckpt_dir: Path,
    max_steps: int,
    *,
    every: int = 10,
    keep: int = 2,
    accumulate: int = 1,
    epoch_steps: int = 1000,
    val_every: int = 10,
    resume: Path | None = None,
    stop_at: int | None = None,
) -> tuple[StepCheckpoint, list[tuple[int, str]]]:
    """Train to ``max_steps`` with a StepCheckpoint in ``ckpt_dir``; returns it and its saves
    as (global step, final file name), in order."""
    checkpoint = StepCheckpoint(ckpt_dir, every_n_steps=every, keep_last_k=keep)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1, accumulate_grad_batches=accumulate,
        val_check_interval=val_every * accumulate, check_val_every_n_epoch=None, limit_val_batches=1,
        logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=ckpt_dir,
        callbacks=[checkpoint] + ([_StopAt(stop_at)] if stop_at else []),
    )  # fmt: skip
    saves: list[tuple[int, str]] = []
    save = trainer.save_checkpoint

    def recording_save(path: Any, *args: Any, **kwargs: Any) -> None:
        name = Path(path).name
        assert name.startswith(".") and name.endswith(".partial"), name  # written under a hidden name
        saves.append((trainer.global_step, name[1 : -len(".partial")]))
        save(path, *args, **kwargs)

    trainer.save_checkpoint = recording_save  # type: ignore[method-assign]
    trainer.fit(_Tiny(epoch_steps * accumulate), ckpt_path=None if resume is None else str(resume))
    return checkpoint, saves


def _files(ckpt_dir: Path) -> dict[str, int | None]:
    """Every entry of the directory (hidden ones too) -> the global step stored in it."""
    return {p.name: read_global_step(p) for p in sorted(ckpt_dir.iterdir())}


def test_saves_every_n_steps_and_at_max_steps_keeping_the_newest_k(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    checkpoint, saves = _fit(ckpts, 26, keep=2)
    assert saves == [
        (10, "step-00000010.ckpt"), (10, "last.ckpt"),
        (20, "step-00000020.ckpt"), (20, "last.ckpt"),
        (26, "step-00000026.ckpt"), (26, "last.ckpt"),
    ]  # fmt: skip
    # No partial or moved-aside leftovers; last.ckpt holds the final step.
    assert _files(ckpts) == {"last.ckpt": 26, "step-00000020.ckpt": 20, "step-00000026.ckpt": 26}
    assert Path(checkpoint.best_model_path) == (ckpts / "step-00000026.ckpt").resolve()
    assert Path(checkpoint.last_model_path) == (ckpts / "last.ckpt").resolve()
    assert newest_checkpoint(ckpts).global_step == 26  # type: ignore[union-attr]


def test_resume_continues_the_retention_and_does_not_save_the_resumed_step_again(tmp_path: Path) -> None:
    # Gradient accumulation: after a resume at step 20, the first micro batch ends with
    # global_step still 20; Lightning 2.6's ModelCheckpoint saved step 20 again there.
    ckpts = tmp_path / "checkpoints"
    _, saves = _fit(ckpts, 20, accumulate=2)
    assert [s for s, _ in saves] == [10, 10, 20, 20]
    _, saves = _fit(ckpts, 30, accumulate=2, resume=ckpts / "last.ckpt")
    assert saves == [(30, "step-00000030.ckpt"), (30, "last.ckpt")]
    # step-10 came from the first run's kept list, restored from last.ckpt: deleted now.
    assert _files(ckpts) == {"last.ckpt": 30, "step-00000020.ckpt": 20, "step-00000030.ckpt": 30}


def test_the_checkpoint_resumed_from_is_never_deleted(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    _fit(ckpts, 30, keep=2)
    _, saves = _fit(ckpts, 50, keep=2, resume=ckpts / "step-00000020.ckpt")
    assert [s for s, _ in saves] == [30, 30, 40, 40, 50, 50]
    # step-20 fell out of the newest two at step 40 but is the checkpoint this run resumed from.
    assert _files(ckpts) == {
        "last.ckpt": 50, "step-00000020.ckpt": 20, "step-00000040.ckpt": 40, "step-00000050.ckpt": 50,
    }  # fmt: skip


def test_a_copied_checkpoint_keeps_its_old_directory_out_of_the_retention(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _fit(first, 20, keep=2)
    second.mkdir()
    shutil.copy(first / "step-00000020.ckpt", second)
    with pytest.warns(UserWarning, match="not counted towards keep_last_k"):
        _fit(second, 40, keep=2, resume=second / "step-00000020.ckpt")
    assert _files(first) == {"last.ckpt": 20, "step-00000010.ckpt": 10, "step-00000020.ckpt": 20}
    assert _files(second) == {
        "last.ckpt": 40, "step-00000020.ckpt": 20, "step-00000030.ckpt": 30, "step-00000040.ckpt": 40,
    }  # fmt: skip


def test_a_smaller_keep_last_k_on_resume_deletes_down_to_it(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    _fit(ckpts, 30, keep=3)
    _fit(ckpts, 40, keep=1, resume=ckpts / "last.ckpt")
    assert _files(ckpts) == {"last.ckpt": 40, "step-00000040.ckpt": 40}


def test_interval_steps_at_epoch_ends_are_saved_at_their_step(tmp_path: Path) -> None:
    # Epochs of 5 steps, validation every 7: steps 10, 20 and 30 all end an epoch. Lightning
    # 2.6's ModelCheckpoint (monitor="step") deferred those saves to the next validation end
    # and wrote step-14 and step-21 instead of step-10 and step-20.
    ckpts = tmp_path / "checkpoints"
    _, saves = _fit(ckpts, 30, epoch_steps=5, val_every=7)
    assert [s for s, _ in saves] == [10, 10, 20, 20, 30, 30]
    assert _files(ckpts) == {"last.ckpt": 30, "step-00000020.ckpt": 20, "step-00000030.ckpt": 30}


def test_a_stop_before_the_first_interval_still_writes_last(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    _, saves = _fit(ckpts, 40, stop_at=7)
    assert saves == [(7, "last.ckpt")]  # at the end of training, as ModelCheckpoint(save_last=True) did
    assert _files(ckpts) == {"last.ckpt": 7}


def test_a_stop_after_an_interval_writes_nothing_more(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    _, saves = _fit(ckpts, 40, stop_at=13)
    assert [s for s, _ in saves] == [10, 10]
    assert _files(ckpts) == {"last.ckpt": 10, "step-00000010.ckpt": 10}


def test_leftovers_of_a_killed_save_are_skipped_and_cleared(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / ".step-00000010.ckpt.partial").write_bytes(b"truncated")
    (ckpts / ".last.ckpt.partial" / "checkpoint").mkdir(parents=True)  # a sharded save cut short
    assert find_checkpoints(ckpts) == []  # resume never picks a partial checkpoint
    _fit(ckpts, 10)
    assert sorted(os.listdir(ckpts)) == ["last.ckpt", "step-00000010.ckpt"]


@pytest.mark.parametrize("partial_kind", ["file", "dir"])
@pytest.mark.parametrize("final_kind", ["none", "file", "dir"])
def test_move_into_place_replaces_files_and_directories(tmp_path: Path, partial_kind: str, final_kind: str) -> None:
    def make(path: Path, kind: str, content: str) -> None:
        if kind == "file":
            path.write_text(content)
        elif kind == "dir":
            (path / "checkpoint").mkdir(parents=True)
            (path / "checkpoint" / content).write_text(content)

    partial, final = tmp_path / ".last.ckpt.partial", tmp_path / "last.ckpt"
    make(partial, partial_kind, "new")
    make(final, final_kind, "old")
    _move_into_place(partial, final)
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]  # nothing partial or set aside is left
    if partial_kind == "file":
        assert final.read_text() == "new"
    else:
        assert os.listdir(final / "checkpoint") == ["new"]


def test_state_is_model_checkpoints_under_the_same_key(tmp_path: Path) -> None:
    """A run resumes across the change from the ModelCheckpoint subclass, either way: the same
    state key (the one Lightning 2.6 generated for it) and ModelCheckpoint's state keys."""
    checkpoint = StepCheckpoint(tmp_path, every_n_steps=10, keep_last_k=2)
    assert checkpoint.state_key == (
        "StepCheckpoint{'monitor': 'step', 'mode': 'max', 'every_n_train_steps': 10, "
        "'every_n_epochs': 0, 'train_time_interval': None}"
    )
    stock = ModelCheckpoint(dirpath=tmp_path, monitor="step", mode="max", save_top_k=2, every_n_train_steps=10)
    assert set(checkpoint.state_dict()) == set(stock.state_dict())

    d = str(tmp_path.resolve())
    checkpoint.kept = {f"{d}/step-00000010.ckpt": 10, f"{d}/step-00000020.ckpt": 20}
    checkpoint.best_model_path, checkpoint.last_model_path = f"{d}/step-00000020.ckpt", f"{d}/last.ckpt"
    stock.load_state_dict(checkpoint.state_dict())  # what the ModelCheckpoint subclass restores
    assert {p: int(v) for p, v in stock.best_k_models.items()} == checkpoint.kept
    assert stock.kth_best_model_path == f"{d}/step-00000010.ckpt" and int(stock.kth_value) == 10
    assert stock.best_model_path == checkpoint.best_model_path and stock.last_model_path == checkpoint.last_model_path

    restored = StepCheckpoint(tmp_path, every_n_steps=10, keep_last_k=2)
    restored.load_state_dict(stock.state_dict())  # a checkpoint the ModelCheckpoint subclass wrote
    assert restored.kept == checkpoint.kept
    assert (restored.best_model_path, restored.last_model_path) == (checkpoint.best_model_path, checkpoint.last_model_path)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StepCheckpoint(tmp_path, 10, 2).load_state_dict(StepCheckpoint(tmp_path, 10, 2).state_dict())  # empty state


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        StepCheckpoint(tmp_path, every_n_steps=0, keep_last_k=2)
    with pytest.raises(ValueError, match="must be >= 1"):
        StepCheckpoint(tmp_path, every_n_steps=10, keep_last_k=0)
