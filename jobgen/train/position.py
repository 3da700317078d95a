"""Where training stands, carried across a restart at another world size (an elastic job that
lost or gained nodes, or a job directory rendered again for another node count).

A checkpoint records the optimizer step; what that step means depends on the global batch
(global = micro batch x accumulation x world size): the learning-rate schedule and ``max_steps``
count optimizer steps, and the data position is ``steps x global batch`` samples. jobgen keeps
the global batch across world sizes (:func:`jobgen.planning.rules.elastic_world` recomputes the
accumulation), and :class:`TrainingPosition` makes the rest explicit:

- it records, in every checkpoint (its ``state_dict``), the samples consumed, the optimizer
  step, and the layout that wrote it (micro batch, accumulation, world size, global batch);
- on load it refuses a checkpoint written at another global batch (a :class:`ConfigError`
  naming both layouts and the fix), as the schedule and the data position would shift;
- the data modules continue at the recorded sample (:func:`consumed_samples`), not at
  ``step x`` whatever the batch is now;
- it re-expresses Lightning's restored batch counters in the new accumulation (below).

What Lightning 2.6 does on resume (``lightning/pytorch/loops/training_epoch_loop.py``,
``fit_loop.py``), found by reading it:

- ``accumulate_grad_batches`` is not in the checkpoint: the resumed Trainer uses its own.
- The fit loop restores its batch counters (``epoch_loop.batch_progress``: micro batches per
  rank, this epoch and in total) as they were, in the old world's micro batches. The optimizer
  steps when ``batch_progress.current.ready % accumulate_grad_batches == 0``, the epoch ends when
  ``current.ready`` reaches the new loader's length, and with ``check_val_every_n_epoch=None`` it
  validates when ``total.ready`` is a multiple of ``val_check_interval`` micro batches. Left
  as they are after the accumulation changed, the first window after the restart is short (an
  optimizer step on part of the global batch) and validation drifts off its steps.
- The data loader is not resumed unless it is stateful (``state_dict``/``load_state_dict``);
  jobgen's data modules instead start their sample numbering at the recorded position (their
  samples are a pure function of ``(seed, sample number)``, :mod:`jobgen.train.data`).

So on a resume whose accumulation differs from the checkpoint's, both counters are moved to
the same number of whole optimizer windows in the new accumulation. A window that was
unfinished when the checkpoint was written (its gradients are not in a checkpoint) is dropped
and read again: the data position counts finished optimizer steps only.

A ``class_path`` data module is the user's: its loaders start over (Lightning's
"dataloader is not resumable" warning), unless they implement ``state_dict``.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from jobgen.errors import ConfigError

STATE_VERSION = 1
"""Version of the state this callback writes (``version`` in its state dict)."""


@dataclass(frozen=True)
class BatchLayout:
    """How one run splits its global batch.

    Attributes:
        micro_batch_size: sequences per rank per forward/backward pass.
        gradient_accumulation_steps: micro batches per optimizer step.
        world_size: data-parallel ranks.
    """

    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step over all ranks: micro x accumulation x world size."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.world_size

    def describe(self) -> str:
        """``"256 (micro batch 8 x accumulation 2 x world size 16)"``."""
        return (f"{self.global_batch_size} (micro batch {self.micro_batch_size} x accumulation "
                f"{self.gradient_accumulation_steps} x world size {self.world_size})")


class TrainingPosition(Callback):
    """Records the data position and the batch layout in every checkpoint and, on resume,
    checks the global batch and re-expresses Lightning's batch counters in this run's
    accumulation (see the module doc).

    Its checkpoint state (``checkpoint["callbacks"]["TrainingPosition"]``)::

        {"version": 1, "global_step": 20, "samples_consumed": 640, "micro_batch_size": 4,
         "gradient_accumulation_steps": 1, "world_size": 2, "global_batch_size": 8}

    Args:
        layout: this run's batch layout.
        elastic: the job is elastic: at setup every node's local rank 0 prints where global
            rank 0 runs (the rendezvous decides it).
        scheduled: a ``gradient_accumulation_schedule`` sets the accumulation per epoch; the
            counters are then left alone and a checkpoint of another world size is refused.
    """

    def __init__(self, layout: BatchLayout, *, elastic: bool = False, scheduled: bool = False) -> None:
        self.layout = layout
        self.elastic = elastic
        self.scheduled = scheduled
        self.restored: dict[str, int] | None = None
        """The state of the checkpoint this run resumed from (``None``: a fresh start, or a
        checkpoint written before jobgen recorded it)."""
        self._trainer: Trainer | None = None

    def samples_consumed(self, global_step: int) -> int:
        """Training samples (over all ranks) consumed by the first ``global_step`` optimizer
        steps: the restored count plus the global batch per step since."""
        base_step, base_samples = 0, 0
        if self.restored is not None:
            base_step, base_samples = self.restored["global_step"], self.restored["samples_consumed"]
        return base_samples + (global_step - base_step) * self.layout.global_batch_size

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Keep the trainer (the checkpoint's path and step are read from it); an elastic job
        says where global rank 0 runs (a broadcast: every rank runs this hook)."""
        self._trainer = trainer
        if self.elastic and stage == "fit":
            here = socket.gethostname()
            zero = trainer.strategy.broadcast(here, src=0)
            if trainer.local_rank == 0:
                print(f"elastic: global rank 0 runs on {zero}; this node is {here}, node rank {trainer.node_rank} of "
                      f"{trainer.num_nodes} (the rendezvous assigns node ranks; it need not be worker 0)", flush=True)

    def state_dict(self) -> dict[str, Any]:
        """The position and layout at the trainer's current step (see the class doc)."""
        step = 0 if self._trainer is None else self._trainer.global_step
        layout = self.layout
        if self.scheduled and self._trainer is not None:  # the accumulation of the current epoch
            layout = BatchLayout(layout.micro_batch_size, self._trainer.accumulate_grad_batches, layout.world_size)
        return {"version": STATE_VERSION, "global_step": step, "samples_consumed": self.samples_consumed(step),
                **asdict(layout), "global_batch_size": layout.global_batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the checkpoint's position; refuse one whose global batch (or, under an
        accumulation schedule, world size) differs from this run's.

        Raises:
            ConfigError: the checkpoint's layout does not fit this run (exit 2).
        """
        keys = ("global_step", "samples_consumed", "micro_batch_size", "gradient_accumulation_steps", "world_size")
        state = {key: int(state_dict[key]) for key in keys}
        saved = BatchLayout(state["micro_batch_size"], state["gradient_accumulation_steps"], state["world_size"])
        where = "the checkpoint" if self._trainer is None or not self._trainer.ckpt_path else str(self._trainer.ckpt_path)
        if self.scheduled:
            if saved.world_size != self.layout.world_size or saved.micro_batch_size != self.layout.micro_batch_size:
                raise ConfigError(
                    f"{where} was written at step {state['global_step']} with micro batch {saved.micro_batch_size} x world "
                    f"size {saved.world_size}, but this run has micro batch {self.layout.micro_batch_size} x world size "
                    f"{self.layout.world_size}, and trainer.gradient_accumulation_schedule fixes the accumulation per epoch, "
                    "so the global batch would change",
                    location=where,
                    hint="resume at the world size and micro batch that wrote it, or start from step 0 "
                         "(checkpoint.resume: never, or another run directory)",
                )
        elif saved.global_batch_size != self.layout.global_batch_size:
            raise ConfigError(
                f"{where} was written at step {state['global_step']} with global batch {saved.describe()}, but this run's "
                f"global batch is {self.layout.describe()}: the learning-rate schedule and max_steps count optimizer steps "
                f"and the data position is {state['samples_consumed']} samples, so resuming would change what a step means",
                location=where,
                hint=f"keep the global batch: set trainer.global_batch_size: {saved.global_batch_size} (an elastic range "
                     "derives the accumulation from it; a fixed world also needs gradient_accumulation_steps = "
                     f"{saved.global_batch_size} / (micro batch x world size)), or start from step 0 "
                     "(checkpoint.resume: never, or another run directory)",
            )
        self.restored = state | {"gradient_accumulation_steps": saved.gradient_accumulation_steps}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """After Lightning restored its loops and before the epoch loop resets: put the batch
        counters of a checkpoint written at another accumulation into this run's."""
        if self.restored is None or self.scheduled:
            return
        before = self.restored["gradient_accumulation_steps"]
        after = trainer.accumulate_grad_batches
        if before != after:
            realign_batch_progress(trainer, before, after)
            if trainer.is_global_zero:
                print(f"resume: the checkpoint's world size {self.restored['world_size']} took {before} micro batch(es) "
                      f"per optimizer step, this world size {trainer.world_size} takes {after}: same global batch "
                      f"{self.layout.global_batch_size}, step {trainer.global_step}, sample "
                      f"{self.samples_consumed(trainer.global_step)}", flush=True)


def realign_batch_progress(trainer: Trainer, before: int, after: int) -> None:
    """Move the fit loop's restored micro-batch counters (this epoch's and the total) from
    windows of ``before`` micro batches to the same number of whole windows of ``after``; every
    counter of a tracker moves by the same amount, so Lightning's restart bookkeeping (which
    compares them) reads as it did. An unfinished window is dropped (see the module doc)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    for tracker in (progress.total, progress.current):
        shift = (tracker.ready // before) * after - tracker.ready
        tracker.ready += shift
        tracker.started += shift
        tracker.processed += shift
        tracker.completed += shift


def consumed_samples(trainer: Trainer, samples_per_step: int) -> int:
    """Where a data module's training samples continue: the :class:`TrainingPosition` callback's
    count at the trainer's step, else (no such callback) ``global_step x samples_per_step``."""
    position = next((c for c in trainer.callbacks if isinstance(c, TrainingPosition)), None)
    if position is None:
        return trainer.global_step * samples_per_step
    return position.samples_consumed(trainer.global_step)
