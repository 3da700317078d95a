"""The CPU strategy matrix: the same tiny job under every strategy jobgen rehearses on CPU.

Each case is planned by jobgen's real planner for the ``local`` profile (2 CPU ranks, gloo) —
``spec.json`` and, for DeepSpeed, ``ds_config.json`` exactly as ``jobgen render`` writes them —
and trained by ``torch.distributed.run --nproc-per-node 2 -m jobgen.train`` in a subprocess: no
mocks. Same model (TINY_SPEC: 2 layers, d_model 64, ~120k parameters), same seed, same 1 MB of
standard-library text, 20 optimizer steps of 2 x 4 sequences of 64 bytes, ``32-true``.

Tolerance: every final ``val_loss`` must be within ``LOSS_ATOL = 1e-3`` nats/byte of the DDP
run. Measured here (torch 2.13.0+cpu, lightning 2.6.6, deepspeed 0.19.8, 2 ranks, two runs of
this file) all eight cases end at 3.24146 and differ by at most 2.4e-7 (3.2414610 for ddp,
zero3, zero3_offload; 3.2414613 for the FSDP and ZeRO-2 cases): fp32 reduction order (DDP's
bucketed all-reduce, FSDP's reduce-scatter, DeepSpeed's partitioned reduction, the fused
DeepSpeedCPUAdam update). Between the
validations at steps 10 and 20 val_loss falls from 3.631 to 3.2415, ~0.04 per optimizer step,
so 1e-3 is ~40x below the effect of one skipped or repeated step and ~4000x above the observed
spread: it catches a strategy that trains differently (lost clipping, schedule, weight decay,
a replayed batch), not rounding, and leaves room for another CPU's summation order.

Wall time of this file on the shared 2-core machine: 2 min 10 s (4 min 40 s when the machine
was busy); each training run takes 8-12 s of which most is start-up.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PROFILES, TEMPLATES, require
from tests.entrypoint.conftest import TINY_SPEC, Result, _merge, run_process

pytestmark = pytest.mark.slow

require("deepspeed", "deepspeed not installed (pip install -e .[train])")

LOSS_ATOL = 1e-3
"""Allowed |val_loss - val_loss(ddp)| in nats/byte (see the module docstring)."""

#: case id -> trainer overrides of TINY_SPEC.
CASES: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "ddp"},
    "fsdp_full_shard": {"strategy": "fsdp", "fsdp_sharding_strategy": "FULL_SHARD"},
    "fsdp_shard_grad_op": {"strategy": "fsdp", "fsdp_sharding_strategy": "SHARD_GRAD_OP"},
    "fsdp_full_shard_act_ckpt": {"strategy": "fsdp", "activation_checkpointing": True},
    "zero2": {"strategy": "deepspeed_stage_2"},
    "zero3": {"strategy": "deepspeed_stage_3"},
    "zero2_offload": {"strategy": "deepspeed_stage_2", "offload_optimizer": "cpu"},
    "zero3_offload": {"strategy": "deepspeed_stage_3", "offload_optimizer": "cpu", "offload_params": "cpu"},
}


def plan_job(
    job_dir: Path, trainer: dict[str, Any], max_steps: int | None = None, base: dict[str, Any] | None = None
) -> Path:
    """Plan TINY_SPEC (merged with ``base``, then the ``trainer`` overrides) for the ``local``
    profile with jobgen's planner and write its files into ``job_dir``; returns ``job_dir``."""
    from jobgen.backends import plan
    from jobgen.specs.load import load_profile, validate
    from jobgen.specs.training import TrainingSpec

    overrides: dict[str, Any] = {"trainer": trainer}
    if max_steps is not None:
        overrides["trainer"] = {**trainer, "max_steps": max_steps}
    spec = validate(TrainingSpec, _merge(_merge(TINY_SPEC, base or {}), overrides), "<matrix>")
    plan(spec, load_profile("local", PROFILES), TEMPLATES).write(job_dir)
    return job_dir


def train(job_dir: Path, timeout: float = 240) -> tuple[Result, dict[str, Any]]:
    """Run the planned job on 2 CPU ranks in ``job_dir`` (run directory ``job_dir/run``)."""
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "jobgen.train", "--spec", "spec.json", "--run-dir", "run",
    ]  # fmt: skip
    result = run_process(argv, cwd=job_dir, timeout=timeout)
    assert result.code == 0, result.output
    return result, json.loads((job_dir / "run" / "summary.json").read_text())


def deepspeed_state_file(ckpt: Path) -> Path:
    """The file of a DeepSpeed checkpoint directory that holds the client (Lightning) state and
    the config the engine ran with (ZeRO 1/2: one file; ZeRO 3: one per rank, rank 0's)."""
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (ckpt / "checkpoint" / name).is_file():
            return ckpt / "checkpoint" / name
    raise AssertionError(f"no DeepSpeed model states in {ckpt}: {sorted(p.name for p in ckpt.rglob('*'))}")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, deepspeed_cpu_ops: None) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Case id -> (job directory, summary.json), one 2-rank training run per case, run once for
    the module (the cases are compared with each other)."""
    root = tmp_path_factory.mktemp("matrix")
    out = {}
    for case, trainer in CASES.items():
        job_dir = plan_job(root / case, trainer)
        _, summary = train(job_dir)
        out[case] = (job_dir, summary)
    rows = [
        f"{case:26s} {s['tokens_per_s_mean'] / 1000:6.1f}k tok/s  val_loss {s['val_loss']:.6f}  wall {s['wall_time_s']:5.1f} s"
        for case, (_, s) in out.items()
    ]
    print("\nstrategy matrix (2 CPU ranks, 32-true):\n" + "\n".join(rows))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_strategy_trains_to_the_same_loss_as_ddp(matrix, case: str) -> None:
    job_dir, summary = matrix[case]
    reference = matrix["ddp"][1]["val_loss"]
    assert summary["global_step"] == 20 and summary["world_size"] == 2
    assert summary["strategy"] == CASES[case]["strategy"]
    assert summary["tokens_per_s_mean"] > 0
    assert summary["n_params"] == 120_576  # the whole model, also when parameters are sharded
    assert summary["val_loss"] == pytest.approx(reference, abs=LOSS_ATOL)
    assert summary["val_loss"] < 4.0  # it learned: ln 256 = 5.55 at the start
    last = Path(summary["last_checkpoint"])
    assert last.exists(), summary


@pytest.mark.parametrize("case", [c for c, t in CASES.items() if t["strategy"].startswith("deepspeed")])
def test_deepspeed_engine_ran_the_rendered_config(matrix, case: str) -> None:
    """The config DeepSpeed's engine ran with (it stores it in every checkpoint) is the rendered
    ds_config.json, dict-equal: the entrypoint only lets Lightning re-add
    gradient_accumulation_steps, with the same value."""
    import torch

    job_dir, summary = matrix[case]
    rendered = json.loads((job_dir / "ds_config.json").read_text())
    state = torch.load(deepspeed_state_file(Path(summary["last_checkpoint"])), map_location="cpu", weights_only=False)
    assert state["ds_config"] == rendered
    assert state["global_step"] == 20


def test_resume_from_a_deepspeed_checkpoint_continues_the_run(matrix, tmp_path: Path) -> None:
    """ZeRO-3 with optimizer and parameter offload: drop the step-20 checkpoints, resume from the
    step-10 checkpoint directory, and land on the uninterrupted run's loss (same data order,
    optimizer state and learning-rate schedule)."""
    src_dir, full = matrix["zero3_offload"]
    job_dir = tmp_path / "resume"
    shutil.copytree(src_dir, job_dir)
    checkpoints = job_dir / "run" / "checkpoints"
    for name in ("last.ckpt", "step-00000020.ckpt"):
        shutil.rmtree(checkpoints / name)
    (job_dir / "run" / "summary.json").unlink()
    result, summary = train(job_dir)
    assert "resuming from" in result.stdout and "(step 10)" in result.stdout, result.output
    assert summary["resumed_from_step"] == 10
    assert Path(summary["resumed_from"]).name == "step-00000010.ckpt"
    assert summary["global_step"] == 20
    assert summary["val_loss"] == pytest.approx(full["val_loss"], abs=LOSS_ATOL)


def test_fsdp_resumes_from_its_sharded_checkpoint_and_validates_inside_fit(matrix, tmp_path: Path) -> None:
    """FULL_SHARD's checkpoint is sharded (a directory: one file per rank plus ``meta.pt``), and a
    run given more steps resumes from it. 25 is off the validation interval (10): the last
    validation runs inside fit, as a separate trainer.validate() cannot re-enter a model FSDP has
    wrapped (jobgen.train.run._ValidationTracker). (Formerly test_entrypoint_train's
    FSDP test, which trained its own DDP and FSDP runs for the comparison that
    test_strategy_trains_to_the_same_loss_as_ddp makes; it resumes the matrix's FSDP run now.)"""
    src_dir, full = matrix["fsdp_full_shard"]
    last = Path(full["last_checkpoint"])
    assert last.is_dir() and (last / "meta.pt").is_file(), last
    job_dir = tmp_path / "resume"
    shutil.copytree(src_dir, job_dir)
    plan_job(job_dir, CASES["fsdp_full_shard"], max_steps=25)
    _, resumed = train(job_dir)
    assert resumed["resumed_from_step"] == 20 and resumed["global_step"] == 25
    assert resumed["val_loss"] < full["val_loss"]
    # the resumed run (its own metrics file) validated once: at its last step, inside fit (metrics.csv's
    # step is the optimizer step)
    with open(resumed["metrics_csv"], newline="") as fh:
        assert [int(row["step"]) for row in csv.DictReader(fh) if row.get("val_loss")] == [25]
