"""`jobgen submit` of a spec with ``secrets`` against fake SLURM client commands, without a
cluster: the values reach sbatch through the environment only, a missing one submits nothing, and
``$SBATCH_EXPORT`` must pass them. The fakes and their conventions: tests/unit/test_slurm_offline.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PROFILES
from tests.fakes.slurm.fakeslurm import reply
from tests.unit.test_slurm_offline import JOB_NAME, PROFILE, job_dir, sbatch_argv

SECRET_VALUE = "mArKeR-5e1d-secret-value"


@pytest.fixture
def submit_secrets(run_cli, tmp_path, monkeypatch):
    """``jobgen submit`` of a spec with ``secrets: [WANDB_API_KEY, HF_TOKEN]``; the fake sbatch
    records those two variables of the environment it gets."""
    monkeypatch.setenv("FAKE_SLURM_RECORD_ENV", "WANDB_API_KEY,HF_TOKEN")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: {JOB_NAME}\nsecrets: [WANDB_API_KEY, HF_TOKEN]\n")

    def _submit(*extra: str):
        return run_cli("submit", str(spec), "--profile", PROFILE, "--profiles-dir", str(PROFILES), "--out", str(tmp_path / "manifests"),
                       "--runs-dir", str(tmp_path / "runs"), *extra, cwd=tmp_path)

    return _submit


def _files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_submit_passes_the_secrets_to_sbatch_through_the_environment_only(slurm, submit_secrets, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", SECRET_VALUE)
    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE + "-hf")
    slurm.respond("sbatch", reply("123\n"))
    result = submit_secrets()
    assert result.code == 0, result.stderr
    assert slurm.argvs() == [sbatch_argv(tmp_path)]
    env = slurm.calls("sbatch")[0]["env"]
    assert env["WANDB_API_KEY"] == SECRET_VALUE and env["HF_TOKEN"] == SECRET_VALUE + "-hf"
    assert "for secret in WANDB_API_KEY HF_TOKEN; do" in (job_dir(tmp_path) / "job.sbatch").read_text()
    for root in (tmp_path / "manifests", tmp_path / "runs", tmp_path / "state"):
        assert _files_holding(root, SECRET_VALUE) == [], f"a secret's value was written under {root}"
    assert SECRET_VALUE not in result.stdout + result.stderr


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_submit_without_a_secret_exits_2_and_submits_nothing(slurm, submit_secrets, tmp_path, monkeypatch, value):
    monkeypatch.setenv("HF_TOKEN", "hf")
    if value is None:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    else:
        monkeypatch.setenv("WANDB_API_KEY", value)
    slurm.respond("sbatch", reply("123\n"))
    result = submit_secrets()
    assert result.code == 2, result.stderr
    assert "secret WANDB_API_KEY of the spec (`secrets`) is not set" in result.stderr and "Nothing was submitted" in result.stderr
    assert "hint: export WANDB_API_KEY=..." in result.stderr and "Traceback" not in result.stderr
    assert f"{tmp_path / 'spec.yaml'}: secrets" in result.stderr and "spec.json" not in result.stderr
    assert slurm.argvs() == [] and not (job_dir(tmp_path) / ".jobgen-submission.json").exists()
    # "Nothing was submitted" and nothing written: neither the job directory nor the run directory
    assert not (tmp_path / "manifests").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("export", "dropped"), [("NONE", "WANDB_API_KEY, HF_TOKEN"), ("PATH,HF_TOKEN", "WANDB_API_KEY"),
                                                 ("ALL", None), ("PATH,HF_TOKEN,WANDB_API_KEY", None)])
def test_sbatch_export_in_the_environment_must_pass_the_secrets(slurm, submit_secrets, tmp_path, monkeypatch, export, dropped):
    """$SBATCH_EXPORT overrides the script's directives (sbatch(1)), so submit checks it too."""
    monkeypatch.setenv("WANDB_API_KEY", SECRET_VALUE)
    monkeypatch.setenv("HF_TOKEN", "hf")
    monkeypatch.setenv("SBATCH_EXPORT", export)
    slurm.respond("sbatch", reply("123\n"))
    result = submit_secrets()
    if dropped is None:
        assert result.code == 0, result.stderr
        assert slurm.argvs() == [sbatch_argv(tmp_path)]
    else:
        assert result.code == 2, result.stderr
        assert f"SBATCH_EXPORT={export} is set" in result.stderr and f"secrets {dropped} to the job" in result.stderr
        assert slurm.argvs() == []
