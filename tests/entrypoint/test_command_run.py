"""Command mode for real: `jobgen submit SPEC --profile local` runs the user's script under
torchrun --standalone with 2 ranks (subprocesses, no mocks).

- the shipped plain-torch DDP example: world size 2, ranks 0 and 1, the all-reduce result;
- the shipped LightningCLI example: jobgen's --trainer.* arguments reach the Trainer (2 ranks,
  DDP, 32-true) and it fits a few steps of Lightning's BoringModel;
- a DeepSpeed spec: the script gets PL_DEEPSPEED_CONFIG_PATH (absolute, the rendered
  ds_config.json) and Lightning's DeepSpeedStrategy, built by LightningCLI from jobgen's
  --trainer.strategy=deepspeed_stage_2, holds exactly that file's config. (Stock
  DeepSpeedStrategy refuses to *run* on CPU — setup_environment requires CUDA — so the CPU
  proof stops at the strategy Lightning built; see the README.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import require
from tests.entrypoint.conftest import REPO, run_process

pytestmark = pytest.mark.usefixtures("_needs_lightning")


@pytest.fixture
def _needs_lightning():
    require("torch")
    require("lightning")


def submit(spec: Path, runs: Path, cwd: Path, *sets: str, timeout: float = 180):
    argv = [sys.executable, "-m", "jobgen.cli", "submit", str(spec), "--profile", "local", "--runs-dir", str(runs)]
    for item in sets:
        argv += ["--set", item]
    return run_process(argv, cwd, timeout)


def test_plain_torch_ddp_script_with_two_ranks(tmp_path):
    result = submit(REPO / "examples" / "command-ddp.yaml", tmp_path / "runs", REPO)
    assert result.code == 0, result.output
    for rank in (0, 1):
        assert f"ddp: rank {rank} of world size 2, local rank {rank}, node rank 0" in result.stdout, result.output
        assert f"ddp: rank {rank} all_reduce(sum of rank+1) = 3 (expected 3)" in result.stdout
        assert f"ddp: rank {rank} 3 step(s), weights in sync across ranks: True" in result.stdout
    assert f"cwd {REPO}" in result.stdout  # the ranks run where jobgen submit ran
    assert (tmp_path / "runs" / "command-ddp" / "spec.json").is_file()


def test_lightning_cli_script_gets_the_world_from_jobgen(tmp_path):
    result = submit(REPO / "examples" / "command-lightning-cli.yaml", tmp_path / "runs", REPO)
    assert result.code == 0, result.output
    for rank in (0, 1):
        assert (f"lightning: global rank {rank} of world size 2, num_nodes 1, devices 2, strategy DDPStrategy, "
                "precision 32-true, environment TorchElasticEnvironment") in result.stdout, result.output
        assert f"lightning: global rank {rank} finished at step 4" in result.stdout
    assert "--trainer.devices=2 --trainer.accelerator=cpu --trainer.strategy=ddp --trainer.precision=32-true" in result.stdout


DS_CHECK = '''
import json, os
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

path = os.environ["PL_DEEPSPEED_CONFIG_PATH"]
cli = LightningCLI(BoringModel, BoringDataModule, run=False, save_config_callback=None, trainer_defaults={"logger": False})
strategy = cli.trainer.strategy
with open(path) as fh:
    on_disk = json.load(fh)
print("ds-check: " + json.dumps({"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]), "path": path,
                                 "strategy": type(strategy).__name__, "config": strategy.config, "file": on_disk}, sort_keys=True))
'''


def test_deepspeed_config_reaches_lightning_through_the_env_var(tmp_path):
    require("deepspeed")
    (tmp_path / "ds_check.py").write_text(DS_CHECK)
    (tmp_path / "spec.yaml").write_text(
        "name: ds-cmd\nentrypoint:\n  script: ds_check.py\n  lightning_cli: true\n"
        "trainer:\n  strategy: deepspeed_stage_2\n  micro_batch_size: 3\n  gradient_accumulation_steps: 2\n"
    )
    result = submit(tmp_path / "spec.yaml", tmp_path / "runs", tmp_path)
    assert result.code == 0, result.output
    reports = [json.loads(line.split("ds-check: ", 1)[1]) for line in result.stdout.splitlines() if "ds-check: " in line]
    assert sorted(r["rank"] for r in reports) == [0, 1] and {r["world"] for r in reports} == {2}
    rendered = json.loads((tmp_path / "runs" / "ds-cmd" / "ds_config.json").read_text())
    for report in reports:
        assert report["path"] == str((tmp_path / "runs" / "ds-cmd" / "ds_config.json").resolve())
        assert report["strategy"] == "DeepSpeedStrategy"
        assert report["config"] == report["file"] == rendered
    assert rendered["zero_optimization"]["stage"] == 2 and rendered["train_micro_batch_size_per_gpu"] == 3
    assert rendered["train_batch_size"] == 3 * 2 * 2
