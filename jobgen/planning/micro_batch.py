"""``trainer.micro_batch_size: auto``: the largest micro batch whose memory plan fits the profile.

Sits above the memory plan (:mod:`jobgen.planning.estimate_hf`, which covers the built-in GPT and Hugging
Face models) and the world rules (:mod:`jobgen.planning.rules`); used by the planner and ``jobgen plan``.
Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobgen.errors import PlanError
from jobgen.planning.estimate_hf import plan_memory
from jobgen.planning.rules import resolve_world

if TYPE_CHECKING:
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.training import TrainingSpec

AUTO_MICRO_BATCH_MARGIN = 0.10
"""``micro_batch_size: auto`` leaves this fraction of the per-rank budget unplanned: a margin for
the memory plan's own error (measured peak / plan 0.86-1.05 on one H100 for the GPU suite's GPT
and QLoRA rows: tests/unit/test_estimate_measured.py)."""
AUTO_MICRO_BATCH_MAX = 1024
"""The largest micro batch ``auto`` tries (powers of two up to it)."""
CPU_AUTO_MICRO_BATCH = 8
"""``micro_batch_size: auto`` on CPU profiles: at most this (the field's default). A CPU rank's
tokens/s does not grow with the batch, and the host's memory would allow batches so large that
one step takes minutes."""


def resolve_micro_batch(spec: TrainingSpec, profile: ClusterProfile, spec_source: str = "<spec>",
                        hf_config: str | None = None) -> TrainingSpec:
    """``spec`` with ``trainer.micro_batch_size: auto`` replaced by a number (any other value is
    returned unchanged); call after :func:`resolve_precision`. ``hf_config``: a Hugging Face
    model's ``config.json`` when it is not under ``model.hf_path`` (``jobgen plan --hf-config``).

    The number is the largest power of two ``b <= AUTO_MICRO_BATCH_MAX`` (GPU profiles) or
    ``<= CPU_AUTO_MICRO_BATCH`` (CPU profiles) for which the memory plan of the spec's own layout
    (:func:`jobgen.planning.estimate_hf.plan_memory`, at the smallest world of an elastic range) fits
    ``(1 - AUTO_MICRO_BATCH_MARGIN)`` of the per-rank budget and the node's host memory. Powers
    of two keep the matmul shapes tensor-core friendly and the search to ~10 plans.

    Raises:
        PlanError: ``model.class_path`` (its size is unknown at plan time), ``global_batch_size``
            given (it fixes the micro batch already), or not even a micro batch of 1 fits.
        ConfigError: a Hugging Face config that cannot be read (see ``plan_memory``).
    """
    t = spec.trainer
    if t.micro_batch_size != "auto":
        return spec
    location = f"{spec_source}: trainer.micro_batch_size"
    if spec.user_code or spec.entrypoint is not None:
        what = "a `model.class_path` module" if spec.user_code else "your own entrypoint's (command mode)"
        raise PlanError(f"You set `trainer.micro_batch_size: auto`, but the model is {what}, whose "
                        "memory jobgen cannot plan before it is built.", location=location,
                        hint="Give a number (a --smoke run's summary.json has peak_memory_bytes to size it).")
    if t.global_batch_size is not None:
        raise PlanError(f"You set `trainer.micro_batch_size: auto` and `trainer.global_batch_size={t.global_batch_size}`; "
                        "a global batch fixes the micro batch already.", location=location,
                        hint="Remove global_batch_size (auto then sets the micro batch, and gradient_accumulation_steps "
                             "the global batch), or give micro_batch_size a number.")
    def with_batch(b: int) -> TrainingSpec:
        return spec.model_copy(update={"trainer": t.model_copy(update={"micro_batch_size": b})})

    world = resolve_world(with_batch(1), profile, spec_source)
    limit = AUTO_MICRO_BATCH_MAX if profile.gpus_per_node else CPU_AUTO_MICRO_BATCH

    def fits(b: int) -> tuple[bool, int, int]:
        mp = plan_memory(with_batch(b), profile, world.fewest_nodes, world.devices_per_node, hf_config=hf_config,
                         spec_source=spec_source)
        est = mp.spec_row.estimate
        ok = est.total_bytes <= (1 - AUTO_MICRO_BATCH_MARGIN) * mp.budget_bytes and \
            est.host_bytes_per_node <= mp.host_bytes_per_node
        return ok, est.total_bytes, mp.budget_bytes

    ok, need, budget = fits(1)
    if not ok:
        raise PlanError(f"You set `trainer.micro_batch_size: auto`, but even a micro batch of 1 is planned at "
                        f"{need / 2**30:.1f} GiB per rank, above {100 * (1 - AUTO_MICRO_BATCH_MARGIN):.0f}% of the "
                        f"{budget / 2**30:.1f} GiB budget of profile {profile.name!r}.", location=location,
                        hint="Run `jobgen plan` on the spec with micro_batch_size 1: it names the layouts that fit.")
    b = 1
    while b * 2 <= limit and fits(b * 2)[0]:
        b *= 2
    return with_batch(b)
