"""Real training of the user's own classes (``model``/``data`` by ``class_path``) through
``jobgen submit ... --profile local``: torchrun, gloo on CPU, the bundled entrypoint
instantiating the classes with jsonargparse.

- examples/usercode.yaml (the tinychar package of examples/usercode) with 2 ranks: trains,
  writes summary.json with measured samples/s and tokens/s (the data module declares
  tokens_per_sample), checkpoints; a second run resumes from the checkpoint's global step.
- the example by epochs with a per-epoch accumulation schedule (1 rank), and under FSDP with
  the spec's auto-wrap and activation-checkpointing classes (2 ranks).
- a LightningModule shipped by another library (Lightning's own BoringModel +
  BoringDataModule) with 1 rank; and a smoke run of it (``--smoke N``), which keeps no
  checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.entrypoint.conftest import REPO, Result, child_env

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "usercode.yaml"
EXAMPLE_PACKAGE = REPO / "examples" / "usercode"
BORING = "lightning.pytorch.demos.boring_classes"
TIMEOUT_S = 300


def example(tmp_path: Path) -> Path:
    """examples/usercode.yaml and its package committed in a git repository of their own under
    ``tmp_path`` (laid out as in jobgen's): submit snapshots it and the ranks import tinychar from
    the snapshot (``code.python_path``), whatever state the jobgen checkout is in."""
    import shutil
    import subprocess

    proj = tmp_path / "proj"
    (proj / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, proj / "examples" / EXAMPLE.name)
    shutil.copytree(EXAMPLE_PACKAGE, proj / "examples" / EXAMPLE_PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__"))
    git_env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
               "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tinychar"]):
        subprocess.run(["git", *argv], cwd=proj, env=git_env, check=True, capture_output=True)
    return proj / "examples" / EXAMPLE.name


def _submit(cwd: Path, *args: str) -> Result:
    import subprocess

    env = child_env()  # no tinychar on PYTHONPATH: the ranks import it from the code snapshot
    argv = [sys.executable, "-m", "jobgen.cli", "submit", *args]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_example_package_trains_on_two_ranks_and_resumes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    common = ("--profile", "local", "--runs-dir", str(runs), "--set", "trainer.val_check_interval=6",
              "--set", "checkpoint.every_n_steps=6", "--set", "trainer.log_every_n_steps=3",
              "--set", "data.init_args.train_samples=512")
    spec_file = example(tmp_path)
    first = _submit(tmp_path, str(spec_file), *common, "--set", "trainer.max_steps=12")
    assert first.code == 0, first.output
    run_dir = runs / "usercode"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 12 and summary["world_size"] == 2
    assert summary["model"] == "tinychar.CharModel" and summary["data"] == "tinychar.CharDataModule"
    assert summary["resumed_from"] is None
    assert summary["val_loss"] is not None and summary["val_loss"] < 4.85  # init: ln 128 = 4.85 nats/char
    # measured from the batches (16 per rank x 2 ranks per step), tokens from tokens_per_sample (64)
    assert summary["samples_per_s_mean"] > 0
    assert abs(summary["tokens_per_s_mean"] - 64 * summary["samples_per_s_mean"]) < 1e-6 * summary["tokens_per_s_mean"]
    assert summary["flops_per_token"] is None and summary["mfu_mean"] is None  # not known: not invented
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt", "step-00000006.ckpt", "step-00000012.ckpt"]
    spec = json.loads((run_dir / "spec.json").read_text())["spec"]
    assert spec["model"]["class_path"] == "tinychar.CharModel" and "learning_rate" not in spec["trainer"]
    assert first.stdout.count("step 12/12 |") == 1, first.output  # rank zero prints

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=spec_file.parent, check=True, capture_output=True, text=True).stdout.strip()
    assert summary["code"]["commit"] == commit and summary["code"]["dir"] == str(run_dir / "code" / commit), summary["code"]
    resumed = _submit(tmp_path, str(spec_file), *common, "--set", "trainer.max_steps=18")
    assert resumed.code == 0, resumed.output
    assert "resume: auto - resuming from" in resumed.stdout and "(step 12)" in resumed.stdout, resumed.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 18 and summary["resumed_from_step"] == 12


def _boring_spec(tmp_path: Path) -> Path:
    spec = {
        "name": "boring",
        "model": {"class_path": f"{BORING}.BoringModel"},
        "data": {"class_path": f"{BORING}.BoringDataModule"},
        "trainer": {"precision": "32-true", "micro_batch_size": 1, "max_steps": 4, "val_check_interval": 2,
                    "limit_val_batches": 2, "log_every_n_steps": 2},
        "checkpoint": {"every_n_steps": 2},
        "resources": {"devices_per_node": 1},
    }
    path = tmp_path / "boring.yaml"
    path.write_text(json.dumps(spec))
    return path


def test_another_librarys_module_trains_on_one_rank_and_smoke_keeps_no_checkpoints(tmp_path: Path) -> None:
    spec, runs = _boring_spec(tmp_path), tmp_path / "runs"
    result = _submit(tmp_path, str(spec), "--profile", "local", "--runs-dir", str(runs))
    assert result.code == 0, result.output
    summary = json.loads((runs / "boring" / "summary.json").read_text())
    assert summary["global_step"] == 4 and summary["world_size"] == 1
    assert summary["model"] == f"{BORING}.BoringModel"
    assert summary["samples_per_s_mean"] > 0 and summary["tokens_per_s_mean"] is None  # no tokens_per_sample
    assert sorted(p.name for p in (runs / "boring" / "checkpoints").iterdir()) == [
        "last.ckpt", "step-00000002.ckpt", "step-00000004.ckpt"]
    assert "takes no batch_size" in result.stderr + result.stdout  # the user is told micro_batch_size does not reach it

    smoke = _submit(tmp_path, str(spec), "--profile", "local", "--runs-dir", str(runs), "--smoke", "3")
    assert smoke.code == 0, smoke.output
    smoke_dir = runs / "boring-smoke"
    assert "smoke run: 3 step(s)" in smoke.stdout, smoke.output
    summary = json.loads((smoke_dir / "summary.json").read_text())
    assert summary["global_step"] == 3 and summary["smoke"] is True and summary["last_checkpoint"] is None
    assert not (smoke_dir / "checkpoints").exists()
    assert json.loads((smoke_dir / "spec.json").read_text())["spec"]["smoke"] is True
    assert (runs / "boring" / "summary.json").is_file()  # the real run's directory is left alone


def test_entrypoint_refuses_init_args_the_class_does_not_take(run_entrypoint, resolved_doc, tmp_path: Path) -> None:
    # what a node sees when its code differs from the submitter's (or spec.json was edited): exit 2, one line
    spec = {"name": "mine", "model": {"class_path": f"{BORING}.DemoModel", "init_args": {"out_dm": 3}},
            "data": {"class_path": f"{BORING}.BoringDataModule"}, "trainer": {"precision": "32-true", "max_steps": 2}}
    (tmp_path / "spec.json").write_text(json.dumps(resolved_doc(spec, devices_per_node=1, world_size=1)))
    result = run_entrypoint("--spec", "spec.json", timeout=TIMEOUT_S)
    assert result.code == 2, result.output
    assert ("python -m jobgen.train: error: spec.json: spec.model.init_args.out_dm: "
            f"{BORING}.DemoModel takes no argument 'out_dm' (did you mean 'out_dim'?); hint: its arguments: "
            "learning_rate, out_dim") in result.stderr, result.output
    assert "Traceback" not in result.stderr


def test_smoke_run_of_the_builtin_gpt_writes_no_checkpoints(run_entrypoint, write_spec, tmp_path: Path) -> None:
    write_spec({"name": "tiny-smoke", "smoke": True, "trainer": {"max_steps": 3, "warmup_steps": 1},
                "checkpoint": {"resume": "never"}}, devices_per_node=1, world_size=1)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a real run's checkpoint is not resumed from
    (tmp_path / "run" / "checkpoints" / "step-00000020.ckpt").write_bytes(b"not read")
    result = run_entrypoint("--spec", "spec.json", "--run-dir", str(tmp_path / "run"), timeout=TIMEOUT_S)
    assert result.code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["global_step"] == 3 and summary["smoke"] is True and summary["resumed_from"] is None
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000020.ckpt"]


def test_epochs_and_an_accumulation_schedule_on_one_rank(tmp_path: Path) -> None:
    # 256 windows / micro batch 16 = 16 batches per epoch; epoch 0 accumulates 2 (8 steps), epoch 1 1 (16 steps)
    runs = tmp_path / "runs"
    result = _submit(tmp_path, str(example(tmp_path)), "--profile", "local", "--runs-dir", str(runs), "--set", "resources.devices_per_node=1",
                     "--set", "trainer.max_steps=null", "--set", "trainer.max_epochs=2", "--set", "trainer.gradient_accumulation_schedule={0: 2, 1: 1}",
                     "--set", "trainer.val_check_interval=100", "--set", "checkpoint.every_n_steps=100",
                     "--set", "data.init_args.train_samples=256")
    assert result.code == 0, result.output
    summary = json.loads((runs / "usercode" / "summary.json").read_text())
    assert (summary["global_step"], summary["epoch"], summary["max_steps"]) == (24, 2, None)
    assert summary["val_loss"] is not None  # validated at the end (the interval was never reached)
    # the final step is checkpointed although 24 is no multiple of every_n_steps: a resume continues from it
    assert sorted(p.name for p in (runs / "usercode" / "checkpoints").iterdir()) == ["last.ckpt", "step-00000024.ckpt"]


def test_fsdp_with_the_spec_s_policies_trains_on_two_ranks(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = _submit(tmp_path, str(example(tmp_path)), "--profile", "local", "--runs-dir", str(runs), "--set", "trainer.strategy=fsdp",
                     "--set", "trainer.fsdp_auto_wrap_policy=[tinychar.model.Block]",
                     "--set", "trainer.fsdp_activation_checkpointing_policy=[tinychar.model.Block]",
                     "--set", "trainer.max_steps=4", "--set", "trainer.val_check_interval=4", "--set", "checkpoint.every_n_steps=4",
                     "--set", "data.init_args.train_samples=256")
    assert result.code == 0, result.output
    summary = json.loads((runs / "usercode" / "summary.json").read_text())
    assert summary["global_step"] == 4 and summary["strategy"] == "fsdp" and summary["world_size"] == 2
    assert (runs / "usercode" / "checkpoints" / "step-00000004.ckpt").is_dir()  # sharded: one directory, a shard per rank
    # (that the policy reaches FSDPStrategy is tested in-process: test_entrypoint_trainer.py)
