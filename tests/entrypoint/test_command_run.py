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
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import require
from tests.entrypoint.conftest import REPO, run_process

pytestmark = [pytest.mark.usefixtures("_needs_lightning"), pytest.mark.slow]


@pytest.fixture
def _needs_lightning():
    require("torch")
    require("lightning")


def submit(spec: Path, runs: Path, cwd: Path, *sets: str, timeout: float = 180):
    argv = [sys.executable, "-m", "jobgen.cli", "submit", str(spec), "--profile", "local", "--runs-dir", str(runs)]
    for item in sets:
        argv += ["--set", item]
    return run_process(argv, cwd, timeout)


def project(root: Path, *, git: bool = False) -> Path:
    """The shipped command-mode examples and their scripts copied to ``root`` (laid out as in the
    repository), so that a run does not depend on the jobgen checkout being clean (command mode
    snapshots the git repository holding the spec); ``git``: committed as a repository."""
    import shutil
    import subprocess

    for name in ("command-ddp.yaml", "command-lightning-cli.yaml"):
        (root / "examples").mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "examples" / name, root / "examples" / name)
    shutil.copytree(REPO / "examples" / "scripts", root / "examples" / "scripts")
    if git:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
        (root / ".gitignore").write_text("runs/\n")
        for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "scripts"]):
            subprocess.run(["git", *argv], cwd=root, env=env, check=True, capture_output=True)
    return root


#: A sitecustomize whose atexit handler records, per process, the script it ran: atexit handlers
#: run at the start of interpreter teardown, so a process that leaves one ended through it.
EXIT_PROBE = """import atexit, json, os, sys

def _record():
    with open(os.path.join({directory!r}, str(os.getpid())), "w") as fh:
        json.dump(sys.argv, fh)

atexit.register(_record)
"""


def exit_probe(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put :data:`EXIT_PROBE` on the PYTHONPATH of every process a test starts; returns where its
    records land (one file per process that ended through interpreter teardown: its argv as JSON)."""
    records = directory / "records"
    records.mkdir(parents=True)
    (directory / "sitecustomize.py").write_text(EXIT_PROBE.format(directory=str(records)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH", "")) if p))
    return records


def assert_ranks_skipped_teardown(records: Path, script: str) -> None:
    """The example's ranks ended without interpreter teardown (no record of a process running
    ``script``), while
    jobgen's own CLI process, which exits normally, left one (the probe was loaded). A rank that
    tears the interpreter down can abort after a complete run: PyTorch's gloo worker thread drops
    its last collective's tensors after Python has begun finalising, needs the GIL to free their
    Python objects and is ended by the interpreter inside a destructor, which is std::terminate
    ("terminate called without an active exception"; README, "Command mode")."""
    ran = [json.loads(path.read_text()) for path in records.iterdir()]
    assert any(argv[0].endswith("jobgen/cli/__main__.py") for argv in ran), ran  # the probe was loaded
    assert not [argv for argv in ran if argv[0].endswith(script)], ran  # the ranks (torchrun's agent may)


def test_plain_torch_ddp_script_with_two_ranks(tmp_path, monkeypatch):
    proj = project(tmp_path / "proj")
    records = exit_probe(tmp_path / "probe", monkeypatch)
    result = submit(proj / "examples" / "command-ddp.yaml", tmp_path / "runs", proj)
    assert result.code == 0, result.output
    assert_ranks_skipped_teardown(records, "ddp_allreduce.py")
    for rank in (0, 1):
        assert f"ddp: rank {rank} of world size 2, local rank {rank}, node rank 0" in result.stdout, result.output
        assert f"ddp: rank {rank} all_reduce(sum of rank+1) = 3 (expected 3)" in result.stdout
        assert f"ddp: rank {rank} 3 step(s), weights in sync across ranks: True" in result.stdout
    assert f"cwd {proj}" in result.stdout  # the ranks run where jobgen submit ran
    assert (tmp_path / "runs" / "command-ddp" / "spec.json").is_file()


def test_in_a_git_repository_the_ranks_run_the_committed_script_from_the_snapshot(tmp_path):
    proj = project(tmp_path / "proj", git=True)
    script = proj / "examples" / "scripts" / "ddp_allreduce.py"
    script.write_text(script.read_text() + "\nraise SystemExit('the edited working tree ran')\n")  # uncommitted
    refused = submit(proj / "examples" / "command-ddp.yaml", tmp_path / "runs", proj)
    assert refused.code == 2 and "uncommitted" in refused.output, refused.output
    import subprocess

    subprocess.run(["git", "checkout", "--", "."], cwd=proj, check=True)
    result = submit(proj / "examples" / "command-ddp.yaml", tmp_path / "runs", proj)
    assert result.code == 0, result.output
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=proj, check=True, capture_output=True, text=True).stdout.strip()
    snapshot = (tmp_path / "runs" / "command-ddp" / "code" / commit).resolve()
    assert f"cwd {snapshot}" in result.stdout, result.output  # the submit directory's copy in the snapshot
    assert "ddp: rank 1 3 step(s), weights in sync across ranks: True" in result.stdout


def test_lightning_cli_script_gets_the_world_from_jobgen(tmp_path, monkeypatch):
    proj = project(tmp_path / "proj")
    records = exit_probe(tmp_path / "probe", monkeypatch)
    result = submit(proj / "examples" / "command-lightning-cli.yaml", tmp_path / "runs", proj)
    assert result.code == 0, result.output
    assert_ranks_skipped_teardown(records, "lightning_cli.py")
    for rank in (0, 1):
        assert (f"lightning: global rank {rank} of world size 2, num_nodes 1, devices 2, strategy DDPStrategy, "
                "precision 32-true, environment TorchElasticEnvironment") in result.stdout, result.output
        assert f"lightning: global rank {rank} finished at step 4" in result.stdout
    assert "--trainer.devices=2 --trainer.accelerator=cpu --trainer.strategy=ddp --trainer.precision=32-true" in result.stdout


def test_a_smoke_run_of_a_lightning_cli_script_stops_at_its_steps(tmp_path):
    # --smoke N in command mode: --trainer.max_steps=N after the script's --config (max_steps: 4) wins
    proj = project(tmp_path / "proj")
    argv = [sys.executable, "-m", "jobgen.cli", "submit", str(proj / "examples" / "command-lightning-cli.yaml"),
            "--profile", "local", "--runs-dir", str(tmp_path / "runs"), "--smoke", "2"]
    result = run_process(argv, proj, 180)
    assert result.code == 0, result.output
    for rank in (0, 1):
        assert f"lightning: global rank {rank} finished at step 2" in result.stdout, result.output
    assert (tmp_path / "runs" / "command-lightning-cli-smoke" / "output.log").is_file()


DS_CHECK = '''
import json, os
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

path = os.environ["PL_DEEPSPEED_CONFIG_PATH"]
cli = LightningCLI(BoringModel, BoringDataModule, run=False, save_config_callback=None, trainer_defaults={"logger": False})
strategy = cli.trainer.strategy
with open(path) as fh:
    on_disk = json.load(fh)
# One file per rank: two ranks printing to one unbuffered stdout can interleave within a line
# (print writes the text and its newline separately), which broke a stdout-based report in CI.
with open(os.path.join(os.path.dirname(path), f"ds-check.{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]), "path": path,
               "strategy": type(strategy).__name__, "config": strategy.config, "file": on_disk}, fh, sort_keys=True)
'''


def test_deepspeed_config_reaches_lightning_through_the_env_var(tmp_path, deepspeed_cpu_ops):
    require("deepspeed")
    (tmp_path / "ds_check.py").write_text(DS_CHECK)
    (tmp_path / "spec.yaml").write_text(
        "name: ds-cmd\nentrypoint:\n  script: ds_check.py\n  lightning_cli: true\n"
        "trainer:\n  strategy: deepspeed_stage_2\n  micro_batch_size: 3\n  gradient_accumulation_steps: 2\n"
    )
    result = submit(tmp_path / "spec.yaml", tmp_path / "runs", tmp_path)
    assert result.code == 0, result.output
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / "ds-cmd").glob("ds-check.*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1] and {r["world"] for r in reports} == {2}
    rendered = json.loads((tmp_path / "runs" / "ds-cmd" / "ds_config.json").read_text())
    for report in reports:
        assert report["path"] == str((tmp_path / "runs" / "ds-cmd" / "ds_config.json").resolve())
        assert report["strategy"] == "DeepSpeedStrategy"
        assert report["config"] == report["file"] == rendered
    assert rendered["zero_optimization"]["stage"] == 2 and rendered["train_micro_batch_size_per_gpu"] == 3
    assert rendered["train_batch_size"] == 3 * 2 * 2
