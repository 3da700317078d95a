"""The training samples every rank sees: the same order under ddp, fsdp and deepspeed, at world
size 1 and 2, and after a resume.

Each case is the real entrypoint (``python -m jobgen.train`` through
tests/entrypoint/record_batches.py, which only adds a callback recording the input tensor of
every training micro batch, per rank) under ``torch.distributed.run`` with 1 or 2 CPU ranks
(gloo). Same tiny GPT, seed and 200 kB of text; a global batch of 4 sequences at both world sizes
(micro batch 2; accumulation 2 at world size 1, 1 at world size 2) for ``STEPS`` optimizer steps.

The data module's contract (jobgen/train/data.py): optimizer step ``s`` reads global samples
``4s .. 4s+3``, and rank ``r`` of ``W`` reads every ``W``-th of them, so interleaving the ranks'
samples gives the run's global sequence, which must be sample ``g`` = the window
``TrainWindows(train.bin, seed)[g]`` for ``g = 0, 1, ...`` in every case. Before the fix
the world-size-1 fsdp and deepspeed runs failed it: the data module passed no sampler
at world size 1 and Lightning, which counts FSDP and DeepSpeed as distributed at any world size,
put in its own ``DistributedSampler(shuffle=True)``: a permutation of the epoch's samples. A
resume from the step-2 checkpoint must then read exactly what the uninterrupted run read at
steps 3 and 4 (with the shuffling sampler a restart re-permuted the rest of the epoch).

A user's ``class_path`` data module (Lightning's BoringDataModule: a plain sequential loader)
must read the same samples under fsdp and deepspeed as under ddp at each world size: its own
order at world size 1, Lightning's seeded ``DistributedSampler`` at 2. Before the fix
``users...[fsdp-ws1]`` and ``[deepspeed-ws1]`` failed (Lightning shuffled there, not under ddp).

The last test checks each jobgen data module (text, tokens, jsonl) in-process against
Lightning's own sampler rule under FSDP; ``[text-1]``, ``[tokens-1]``, ``[jsonl-1]`` failed before.

Wall time on the shared 2-core machine, each half beside a second copy of itself:
jobgen's data (6 runs, 2 resumes, the in-process test) 6 min 30 s, the user's modules
(6 runs) 3 min 20 s; 15-30 s per run, mostly start-up.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import require
from tests.entrypoint.conftest import TINY_SPEC, _merge, resolved_doc, run_process

require("deepspeed", "deepspeed not installed (pip install -e .[train])")

RECORDER = Path(__file__).with_name("record_batches.py")
STEPS = 4
MICRO = 2
GLOBAL_BATCH = 4
#: case id -> trainer overrides. Layouts that run Lightning's FSDP and DeepSpeed strategies at
#: world size 1 too: plain fsdp and ZeRO-1/2 take the single-device path there
#: (``TrainerSpec.single_device_reason``), activation checkpointing and ZeRO-3 keep
#: the strategy (a ``class_path`` model names the classes to recompute: :data:`USER_EXTRA`).
STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "ddp"},
    "fsdp": {"strategy": "fsdp", "activation_checkpointing": True},
    "deepspeed": {"strategy": "deepspeed_stage_3"},
}
#: case id -> further trainer overrides for the user's modules
USER_EXTRA: dict[str, dict[str, Any]] = {"fsdp": {"fsdp_activation_checkpointing_policy": ["torch.nn.Linear"]}}
CASES = [(name, world) for world in (1, 2) for name in STRATEGIES]
OVERRIDES = {
    "data": {"max_bytes": 200_000},
    "trainer": {"max_steps": STEPS, "micro_batch_size": MICRO, "val_check_interval": STEPS, "limit_val_batches": 1,
                "log_every_n_steps": 1, "num_sanity_val_steps": 0},
    "checkpoint": {"every_n_steps": 2, "keep_last_k": 3},
}  # fmt: skip


def _job(job_dir: Path, strategy: str, world: int) -> Path:
    """Write the resolved spec (and, for DeepSpeed, the rendered ds_config.json) for ``world`` CPU ranks."""
    from jobgen.jobdir.world import World
    from jobgen.planning.deepspeed import deepspeed_config, dumps
    from jobgen.specs.training import TrainingSpec

    accumulation = GLOBAL_BATCH // (MICRO * world)
    spec = _merge(_merge(TINY_SPEC, OVERRIDES),
                  {"trainer": {**STRATEGIES[strategy], "gradient_accumulation_steps": accumulation}})
    launch: dict[str, Any] = {"devices_per_node": world, "world_size": world}
    job_dir.mkdir(parents=True)
    if strategy == "deepspeed":
        config = deepspeed_config(TrainingSpec.model_validate(spec),
                                  World(1, world, "cpu", micro_batch_size=MICRO, gradient_accumulation_steps=accumulation))
        (job_dir / "ds_config.json").write_text(dumps(config))
        launch["deepspeed_config"] = "ds_config.json"
    (job_dir / "spec.json").write_text(json.dumps(resolved_doc(spec, **launch)))
    return job_dir


#: A user's own modules (``class_path``): Lightning's BoringModel and BoringDataModule, whose
#: training loader is a plain ``DataLoader(dataset)`` (sequential, batch size 1, no sampler).
BORING = "lightning.pytorch.demos.boring_classes"


def _user_job(job_dir: Path, strategy: str, world: int) -> Path:
    """:func:`_job` for the BoringModel on the BoringDataModule (one sample per micro batch, no accumulation)."""
    from jobgen.jobdir.world import World
    from jobgen.planning.deepspeed import deepspeed_config, dumps
    from jobgen.specs.training import TrainingSpec

    trainer = {k: v for k, v in _merge(TINY_SPEC, OVERRIDES)["trainer"].items()
               if k not in ("learning_rate", "warmup_steps", "weight_decay")}
    spec = {"name": "boring", "model": {"class_path": f"{BORING}.BoringModel", "init_args": {}},
            "data": {"class_path": f"{BORING}.BoringDataModule", "init_args": {}},
            "trainer": trainer | {**STRATEGIES[strategy], **USER_EXTRA.get(strategy, {}), "micro_batch_size": 1}, "checkpoint": OVERRIDES["checkpoint"]}
    launch: dict[str, Any] = {"devices_per_node": world, "world_size": world}
    job_dir.mkdir(parents=True)
    if strategy == "deepspeed":
        config = deepspeed_config(TrainingSpec.model_validate(spec), World(1, world, "cpu", micro_batch_size=1))
        config["zero_allow_untested_optimizer"] = True  # BoringModel trains with SGD
        (job_dir / "ds_config.json").write_text(dumps(config))
        launch["deepspeed_config"] = "ds_config.json"
    (job_dir / "spec.json").write_text(json.dumps(resolved_doc(spec, **launch)))
    return job_dir


def _train(job_dir: Path, world: int, record: str) -> str:
    """Run the entrypoint on ``world`` ranks in ``job_dir`` (run dir ``run``), recording into ``job_dir/record``."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
            str(RECORDER), str(job_dir / record), "--spec", "spec.json", "--run-dir", "run"]  # fmt: skip
    result = run_process(argv, cwd=job_dir, timeout=240)
    assert result.code == 0, result.output
    return result.stdout


def _global_sequence(record: Path, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(steps, inputs): every sample of the run in global order, ``(n,)`` and ``(n, T)``, by
    interleaving the ranks' samples (rank ``r`` holds global positions ``r, r + W, ...``)."""
    ranks = [torch.load(record / f"rank{r}.pt") for r in range(world)]
    per_rank = [(d["step"].repeat_interleave(d["x"].shape[1]), d["x"].reshape(-1, d["x"].shape[-1])) for d in ranks]
    n = min(len(x) for _, x in per_rank)
    assert all(len(x) == n for _, x in per_rank), "the ranks saw different numbers of samples"
    steps = torch.stack([s for s, _ in per_rank], dim=1).reshape(-1)
    inputs = torch.stack([x for _, x in per_rank], dim=1).reshape(n * world, -1)
    return steps, inputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, deepspeed_cpu_ops: None) -> dict[tuple[str, int], Path]:
    """(strategy, world size) -> job directory of one uninterrupted run."""
    root = tmp_path_factory.mktemp("order")
    out = {}
    for strategy, world in CASES:
        job_dir = _job(root / f"{strategy}-{world}", strategy, world)
        _train(job_dir, world, "record")
        out[(strategy, world)] = job_dir
    return out


@pytest.fixture(scope="module")
def user_runs(tmp_path_factory: pytest.TempPathFactory, deepspeed_cpu_ops: None) -> dict[tuple[str, int], Path]:
    """(strategy, world size) -> job directory of one run of the user's modules."""
    root = tmp_path_factory.mktemp("user_order")
    out = {}
    for strategy, world in CASES:
        job_dir = _user_job(root / f"{strategy}-{world}", strategy, world)
        _train(job_dir, world, "record")
        out[(strategy, world)] = job_dir
    return out


def _reference(job_dir: Path) -> torch.Tensor:
    """The first ``STEPS x GLOBAL_BATCH`` training samples by the data module's definition, ``(n, T)``."""
    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.data import TrainWindows

    spec = load_resolved_spec(job_dir / "spec.json").spec
    data = np.memmap(job_dir / "run" / "data" / "train.bin", dtype=np.uint8, mode="r")
    windows = TrainWindows(data, spec.model.block_size, spec.trainer.seed, STEPS * GLOBAL_BATCH)
    return torch.stack([windows[g][0] for g in range(STEPS * GLOBAL_BATCH)])


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "world"), CASES, ids=[f"{s}-ws{w}" for s, w in CASES])
def test_every_strategy_and_world_size_reads_the_same_samples(runs, strategy: str, world: int) -> None:
    job_dir = runs[(strategy, world)]
    steps, inputs = _global_sequence(job_dir / "record", world)
    assert inputs.shape == (STEPS * GLOBAL_BATCH, TINY_SPEC["model"]["block_size"])
    assert steps.tolist() == [s for s in range(STEPS) for _ in range(GLOBAL_BATCH)]
    torch.testing.assert_close(inputs, _reference(job_dir), rtol=0, atol=0)
    # the same bytes as the plain single-process run (same text, same split)
    reference_dir = runs[("ddp", 1)]
    assert (job_dir / "run" / "data" / "train.bin").read_bytes() == (reference_dir / "run" / "data" / "train.bin").read_bytes()


def _drop_checkpoints_after(checkpoints: Path, step: int) -> None:
    for path in checkpoints.iterdir():
        later = path.name.startswith("step-") and int(path.name[5:13]) > step
        if later or path.name.startswith("last"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_a_resume_reads_exactly_the_samples_of_the_uninterrupted_run(runs, strategy: str, tmp_path: Path) -> None:
    """World size 1 (where Lightning would otherwise shuffle): resume from the step-2 checkpoint."""
    src = runs[(strategy, 1)]
    job_dir = tmp_path / "resume"
    shutil.copytree(src, job_dir)
    shutil.rmtree(job_dir / "record")
    _drop_checkpoints_after(job_dir / "run" / "checkpoints", 2)
    (job_dir / "run" / "summary.json").unlink()
    stdout = _train(job_dir, 1, "record")
    assert "(step 2)" in stdout, stdout
    steps, inputs = _global_sequence(job_dir / "record", 1)
    full_steps, full_inputs = _global_sequence(src / "record", 1)
    assert steps.tolist() == [s for s in range(2, STEPS) for _ in range(GLOBAL_BATCH)]
    torch.testing.assert_close(inputs, full_inputs[full_steps >= 2], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "world"), [c for c in CASES if c[0] != "ddp"],
                         ids=[f"{s}-ws{w}" for s, w in CASES if s != "ddp"])
def test_a_users_data_module_reads_the_same_samples_under_every_strategy(user_runs, strategy: str, world: int) -> None:
    """A ``class_path`` data module's loaders are the user's: at world size 1 Lightning leaves them
    as they are under every strategy (the order ddp always had: here sequential), above it
    Lightning puts in its ``DistributedSampler`` (shuffled with the run's seed) under every
    strategy alike. Before the fix fsdp and deepspeed got that shuffling sampler at world size 1
    too, ddp did not."""
    for rank in range(world):
        seen = torch.load(user_runs[(strategy, world)] / "record" / f"rank{rank}.pt")
        ddp = torch.load(user_runs[("ddp", world)] / "record" / f"rank{rank}.pt")
        assert seen["step"].tolist() == ddp["step"].tolist() == list(range(STEPS))
        torch.testing.assert_close(seen["x"], ddp["x"], rtol=0, atol=0)
    if world == 1:  # ddp's order at world size 1 is the loader's own: BoringDataModule's first samples
        from lightning.pytorch import seed_everything
        from lightning.pytorch.demos.boring_classes import BoringDataModule

        spec = json.loads((user_runs[(strategy, world)] / "spec.json").read_text())["spec"]
        seed_everything(spec["trainer"]["seed"], verbose=False)  # as the entrypoint does before building the modules
        from lightning.pytorch.demos.boring_classes import BoringModel

        BoringModel()  # built first, from the same random stream
        data = BoringDataModule()
        expected = torch.stack([data.random_full[i] for i in range(STEPS)]).unsqueeze(1)
        torch.testing.assert_close(seen["x"], expected, rtol=0, atol=0)


# --- Every jobgen data module against Lightning's sampler rule, in-process (no training) -------


class _WordTokenizer:
    """Enough of a Hugging Face tokenizer for InstructionDataModule: one id per word."""

    eos_token_id = 1
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [2 + len(word) for word in text.split()]}


def _data_module(kind: str, tmp_path: Path, world: int) -> Any:
    from jobgen.train.data import ByteTextDataModule
    from jobgen.train.format_data import InstructionDataModule, TokenDataModule
    from jobgen.train.formats import InstructionFiles, InstructionRecord, discover_token_files
    from jobgen.train.sources import discover_sources

    sizes = {"block_size": 64, "micro_batch_size": 2, "gradient_accumulation_steps": 1, "world_size": world,
             "max_steps": 5, "val_fraction": 0.1, "val_batches": 2, "seed": 3}  # fmt: skip
    if kind == "text":
        module = ByteTextDataModule(discover_sources([], max_bytes=50_000), tmp_path / "data", **sizes)
        module.prepare_data()
    elif kind == "tokens":
        (tmp_path / "tok").mkdir()
        (np.arange(3000) % 500).astype("uint16").tofile(tmp_path / "tok" / "part0.bin")
        files = discover_token_files([str(tmp_path / "tok")], "uint16", None, 0.1, block_size=64)
        module = TokenDataModule(files, tmp_path / "data", **sizes)
    else:
        records = tuple(InstructionRecord(f"say {w}", "", f"{w} {w}", f"x.jsonl:{i + 1}") for i, w in enumerate("abcdefgh"))
        module = InstructionDataModule(InstructionFiles(("x.jsonl",), records[:6], records[6:]), _WordTokenizer(),
                                       tmp_path / "data", **sizes)
    module.setup("fit")
    return module


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("kind", ["text", "tokens", "jsonl"])
def test_lightning_keeps_every_data_modules_sampler_under_fsdp(kind: str, world: int, tmp_path: Path) -> None:
    """Lightning (2.6) puts its own ``DistributedSampler`` (``shuffle=True`` for training) into
    any loader without one under a strategy it counts as distributed, FSDP at world size 1
    included, unless ``use_distributed_sampler=False``. Each jobgen data module (text, tokens,
    jsonl) passes its own at every world size, so even a stock Trainer leaves the order alone:
    rank 0 of ``W`` reads training samples ``0, W, 2W, ...`` and validation windows likewise."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.trainer.states import RunningStage

    from jobgen.train.strategies import CPUFSDPStrategy

    trainer = Trainer(accelerator="cpu", devices=world, strategy=CPUFSDPStrategy(process_group_backend="gloo"),
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    assert trainer._accelerator_connector.is_distributed and trainer._accelerator_connector.use_distributed_sampler
    module = _data_module(kind, tmp_path, world)
    module.trainer = trainer
    connector = trainer._data_connector  # what fit does to each loader: _process_dataloader -> _prepare_dataloader
    train = connector._prepare_dataloader(module.train_dataloader(), shuffle=True, mode=RunningStage.TRAINING)
    val = connector._prepare_dataloader(module.val_dataloader(), shuffle=False, mode=RunningStage.VALIDATING)
    assert list(train.sampler) == list(range(0, len(module.train_set), world))
    assert list(val.sampler) == list(range(0, len(module.val_set), world))
    first = next(iter(train))[0]
    torch.testing.assert_close(first, torch.stack([module.train_set[i][0] for i in (0, world)]), rtol=0, atol=0)
