"""A run begun on the single-device path (``fsdp`` at world size 1) continued at world
size 2 under FSDP: the documented way (the run directory's identity and summary.json moved away
on purpose, the global batch kept) must resume with the optimizer state it saved.

Lightning's FSDPStrategy loads a single-file checkpoint's optimizer state through
``FSDP.rekey_optim_state_dict(state, PARAM_NAME, model)``, which takes the state's integer ids
to be positions in ``model.parameters()``. torch numbers them by position in the optimizer's
parameter groups, and jobgen's AdamW has two groups (decayed matrices, then the rest), so the
ids named the wrong tensors: before the fix the resume died with "The size of tensor a
(49152) must match the size of tensor b (65536)". DeepSpeed's engine cannot load such a file at
all: that continuation is refused up front. The tests run the real entrypoint under
``torch.distributed.run`` with CPU ranks (gloo). The single-device run to step 4 and its
continuation at world size 1 are trained once for the module (:func:`single_device`); each
continuation starts from a copy of that run directory.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.entrypoint.conftest import TINY_SPEC, Result, _merge, resolved_doc, run_process

pytestmark = pytest.mark.slow

STEPS, MORE = 4, 6
MICRO, GLOBAL_BATCH = 2, 4


def _spec(world_size: int, max_steps: int, strategy: str = "fsdp") -> dict:
    return resolved_doc(_merge(TINY_SPEC, {
        "trainer": {"strategy": strategy, "max_steps": max_steps, "micro_batch_size": MICRO,
                    "gradient_accumulation_steps": GLOBAL_BATCH // (MICRO * world_size), "val_check_interval": 100,
                    "log_every_n_steps": 1, "warmup_steps": 1},
        "checkpoint": {"every_n_steps": 2, "resume": "auto"},
    }), devices_per_node=world_size, world_size=world_size)


def _train(run_entrypoint, tmp_path: Path, world_size: int, max_steps: int, run: Path,  # noqa: ANN001, ANN202
           strategy: str = "fsdp"):
    doc = _spec(world_size, max_steps, strategy)
    if strategy.startswith("deepspeed"):  # the ds_config.json render writes beside spec.json
        from jobgen.jobdir.world import World
        from jobgen.planning.deepspeed import deepspeed_config
        from jobgen.specs.training import TrainingSpec

        config = deepspeed_config(TrainingSpec.model_validate(doc["spec"]), World(1, world_size, "cpu", micro_batch_size=MICRO))
        (tmp_path / f"ds_config-{world_size}.json").write_text(json.dumps(config))
        doc["launch"]["deepspeed_config"] = f"ds_config-{world_size}.json"
    spec = tmp_path / f"spec-{strategy}-{world_size}-{max_steps}.json"
    spec.write_text(json.dumps(doc))
    return run_entrypoint("--spec", str(spec), "--run-dir", str(run), nproc=world_size, timeout=300)


def _entrypoint(cwd: Path) -> Callable[..., Result]:
    """The ``run_entrypoint`` fixture's runner (tests/entrypoint/conftest.py) for a module-scoped
    fixture: ``torch.distributed.run --standalone --nproc-per-node N -m jobgen.train ARGS`` in ``cwd``."""

    def _run(*args: str, nproc: int, timeout: float = 300) -> Result:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                "-m", "jobgen.train", *args]  # fmt: skip
        return run_process(argv, cwd=cwd, timeout=timeout)

    return _run


@pytest.fixture(scope="module")
def single_device(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The fsdp run on the single-device path (world size 1) to step ``STEPS``, once for the
    module: ``"first"`` its result, ``"run"`` its run directory (left as the run left it: copy it
    before continuing), ``"ws1"`` a copy of it continued at world size 1 to ``MORE``, ``"more"``
    that continuation's result."""
    root = tmp_path_factory.mktemp("resume_layout")
    run_entrypoint = _entrypoint(root)
    run = root / "run"
    first = _train(run_entrypoint, root, 1, STEPS, run)
    assert first.code == 0, first.output
    ws1 = root / "run-1"
    shutil.copytree(run, ws1)
    more = _train(run_entrypoint, root, 1, MORE, ws1)
    assert more.code == 0, more.output
    return {"first": first, "run": run, "ws1": ws1, "more": more}


def test_a_single_device_checkpoint_numbers_optimizer_state_by_parameter_position(single_device: dict) -> None:
    """The optimizer state of a single-device checkpoint is keyed by each parameter's position in
    ``module.parameters()`` (what FSDP's rekeying assumes); the single-device resume, which maps by
    position in the groups, continues as before."""
    from jobgen.specs.training import TrainingSpec
    from jobgen.train.model import LitGPT

    first, run = single_device["first"], single_device["run"]
    assert "single-device path" in first.stdout, first.output
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    params = list(LitGPT.from_spec(TrainingSpec.model_validate(_spec(1, STEPS)["spec"])).parameters())
    state = checkpoint["optimizer_states"][0]["state"]
    assert sorted(state) == list(range(len(params)))
    for index, entry in state.items():
        assert entry["exp_avg"].shape == params[index].shape, (index, entry["exp_avg"].shape, params[index].shape)
    summary = json.loads((single_device["ws1"] / "summary.json").read_text())
    assert (summary["global_step"], summary["resumed_from_step"]) == (MORE, STEPS), single_device["more"].output


def test_a_single_device_run_continues_at_world_size_2_under_fsdp(single_device: dict, run_entrypoint, tmp_path: Path) -> None:
    """ws 1 (single-device path) to step 4, then ws 2 under FSDP (same global batch) from that
    checkpoint to step 6: it resumes, and its weights at
    step 6 are those of the same continuation at world size 1 (the same samples; only the
    reduction order differs), which a lost or misplaced optimizer state would not give (a fresh
    AdamW's first steps move every weight by about the learning rate)."""
    run = tmp_path / "run-2"
    shutil.copytree(single_device["run"], run)
    # on purpose: the run directory is this continuation's now
    (run / ".jobgen-run.json").unlink()
    (run / "summary.json").rename(run / "summary.ws1.json")
    more = _train(run_entrypoint, tmp_path, 2, MORE, run)
    assert more.code == 0, more.output
    runs = {}
    for world_size, directory in ((1, single_device["ws1"]), (2, run)):
        summary = json.loads((directory / "summary.json").read_text())
        assert summary["global_step"] == MORE and summary["resumed_from_step"] == STEPS, summary
        assert summary["world_size"] == world_size
        runs[world_size] = _weights(directory / "checkpoints" / "last.ckpt", tmp_path / f"weights-{world_size}.pt")
    assert runs[1].keys() == runs[2].keys()
    worst = max((runs[2][k] - runs[1][k]).abs().max().item() for k in runs[1])
    assert worst < 1e-5, worst


def _weights(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """The module weights of a checkpoint file, or of FSDP's sharded directory (torch's
    ``dcp_to_torch_save`` gathers it into one file; Lightning keeps them under ``model``)."""
    if checkpoint.is_file():
        return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, scratch)
    return torch.load(scratch, map_location="cpu", weights_only=False)["model"]


def test_deepspeed_refuses_to_continue_a_one_file_checkpoint_before_the_ranks_build_anything(
        run_entrypoint, tmp_path: Path, deepspeed_cpu_ops) -> None:  # noqa: ANN001
    """ZeRO-2 at world size 1 trains on the single-device path and writes one-file checkpoints;
    DeepSpeed's engine at world size 2 loads only its own directories. The continuation is
    refused as bad input (the ranks exit 2, the file named, the ways out in the hint) before any training;
    before the fix the ranks started and died with FileNotFoundError (exit 1)."""
    run = tmp_path / "run"
    first = _train(run_entrypoint, tmp_path, 1, STEPS, run, "deepspeed_stage_2")
    assert first.code == 0, first.output
    (run / ".jobgen-run.json").unlink()
    (run / "summary.json").rename(run / "summary.ws1.json")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    refused = _train(run_entrypoint, tmp_path, 2, MORE, run, "deepspeed_stage_2")
    assert refused.code != 0 and "(exitcode: 2)" in refused.stderr, refused.output  # bad input; torchrun itself exits 1
    assert "one-file checkpoint" in refused.stderr and "last.ckpt" in refused.stderr, refused.output
    assert "strategy fsdp" in refused.stderr and "world size 1" in refused.stderr, refused.output
    assert "python -m jobgen.train: error: " in refused.stderr and "FileNotFoundError" not in refused.stderr, refused.output
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    assert not (run / "summary.json").exists()
