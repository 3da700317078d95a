"""The data position and batch counters across a restart at another world size
(:mod:`jobgen.train.position`), on the real data module, sampler and Lightning progress objects;
only the Trainer is a stand-in carrying the step, the world and the callbacks. The end-to-end
run (real torchrun agents) is tests/entrypoint/test_elastic_resume.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from lightning.pytorch.loops.progress import _BatchProgress

from jobgen.errors import ConfigError
from jobgen.train.data import ByteTextDataModule
from jobgen.train.position import BatchLayout, TrainingPosition, realign_batch_progress
from jobgen.train.sources import discover_sources

MICRO, GLOBAL, MAX_STEPS = 4, 8, 12


def _trainer(step: int, world: int, rank: int, position: TrainingPosition, accumulation: int = 1) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, world_size=world, global_rank=rank, callbacks=[position], ckpt_path=None,
                           accumulate_grad_batches=accumulation)


def _samples_per_step(tmp_path: Path, world: int, step: int, position: TrainingPosition) -> list[list[int]]:
    """The global sample numbers each optimizer step from ``step`` on reads, over all ranks, at
    ``world`` ranks keeping the global batch: the data module's own loaders (sampler and batches)."""
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_bytes(np.random.default_rng(0).integers(32, 127, 60_000, dtype=np.uint8).tobytes())
    accumulation = GLOBAL // (MICRO * world)
    dm = ByteTextDataModule(discover_sources([str(corpus)], max_bytes=None), tmp_path / f"data-{world}", block_size=16,
                            micro_batch_size=MICRO, gradient_accumulation_steps=accumulation, world_size=world,
                            max_steps=MAX_STEPS, val_fraction=0.1, val_batches=1, seed=0)
    dm.prepare_data()
    dm.setup("fit")
    per_rank = []
    for rank in range(world):
        dm.trainer = _trainer(step, world, rank, position)
        loader = dm.train_dataloader()
        per_rank.append([[dm.train_set.start_sample + i for i in batch] for batch in loader.batch_sampler])
    steps = []
    for k in range(MAX_STEPS - step):  # one epoch holds the whole run here; the loader starts at the position
        window = range(k * accumulation, (k + 1) * accumulation)
        steps.append(sorted(s for batches in per_rank for j in window for s in batches[j]))
    return steps


@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)])
def test_each_step_reads_the_next_block_of_samples_and_a_restart_at_another_world_continues_it(tmp_path, first, then):
    before = TrainingPosition(BatchLayout(MICRO, GLOBAL // (MICRO * first), first))
    before.setup(_trainer(0, first, 0, before), None, "fit")
    steps = _samples_per_step(tmp_path, first, 0, before)[:5]
    before._trainer.global_step = 5
    state = before.state_dict()  # what the step-5 checkpoint records
    assert (state["samples_consumed"], state["world_size"], state["global_batch_size"]) == (5 * GLOBAL, first, GLOBAL)

    after = TrainingPosition(BatchLayout(MICRO, GLOBAL // (MICRO * then), then))
    after.setup(_trainer(5, then, 0, after), None, "fit")
    after.load_state_dict(state)
    steps += _samples_per_step(tmp_path, then, 5, after)
    # step k reads samples 8k..8k+7 at either world size: none twice, none skipped, the same as an uninterrupted run
    assert steps == [list(range(GLOBAL * k, GLOBAL * (k + 1))) for k in range(MAX_STEPS)]
    assert after.samples_consumed(MAX_STEPS) == MAX_STEPS * GLOBAL


def test_another_global_batch_is_refused_naming_both_layouts_and_the_fix():
    saved = TrainingPosition(BatchLayout(4, 1, 2))
    saved.setup(_trainer(5, 2, 0, saved), None, "fit")
    state = saved.state_dict()
    resumed = TrainingPosition(BatchLayout(4, 1, 1))
    resumed.setup(SimpleNamespace(ckpt_path="/runs/x/checkpoints/step-00000005.ckpt"), None, "fit")
    with pytest.raises(ConfigError) as info:
        resumed.load_state_dict(state)
    err = info.value
    assert err.location == "/runs/x/checkpoints/step-00000005.ckpt"
    assert "written at step 5 with global batch 8 (micro batch 4 x accumulation 1 x world size 2)" in err.message
    assert "this run's global batch is 4 (micro batch 4 x accumulation 1 x world size 1)" in err.message
    assert "set trainer.global_batch_size: 8" in err.hint and "checkpoint.resume: never" in err.hint
    # under an accumulation schedule the world size itself must match
    scheduled = TrainingPosition(BatchLayout(4, 2, 1), scheduled=True)
    with pytest.raises(ConfigError, match="gradient_accumulation_schedule fixes the accumulation per epoch"):
        scheduled.load_state_dict(state)


def test_restored_counters_move_to_whole_windows_of_the_new_accumulation():
    progress = _BatchProgress()
    # saved after the 5th optimizer step of the epoch at accumulation 1 (total: 13 steps), in
    # on_train_batch_end: ready = started = processed, completed one behind (Lightning's restart marker)
    for tracker, ready in ((progress.current, 5), (progress.total, 13)):
        tracker.ready = tracker.started = tracker.processed = ready
        tracker.completed = ready - 1
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))
    realign_batch_progress(trainer, before=1, after=2)
    assert (progress.current.ready, progress.current.started, progress.current.processed, progress.current.completed) == (10, 10, 10, 9)
    assert (progress.total.ready, progress.total.completed) == (26, 25)
    realign_batch_progress(trainer, before=2, after=4)
    assert (progress.current.ready, progress.total.ready) == (20, 52)
    # an unfinished window (3 of 4 micro batches; its gradients are not in the checkpoint) is dropped
    progress.current.ready = progress.current.started = progress.current.processed = 23
    progress.current.completed = 22
    realign_batch_progress(trainer, before=4, after=1)
    assert (progress.current.ready, progress.current.completed) == (5, 4)
