"""CLI behaviour a user sees: exit codes, messages without tracebacks, --help, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, site_profile, write

QUICKSTART = str(EXAMPLES / "quickstart.yaml")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("name: x\ntrainer:\n  max_step: 10\n", r"trainer.max_step: unknown key (did you mean 'max_steps'?)"),
        ("name: x\ntrainer:\n  micro_batch_size: many\n", "trainer.micro_batch_size: expected a positive integer or 'auto' (got 'many')\n"),
        ("name: x\ntrainer:\n  micro_batch_size: 4\n  global_batch_size: 100\n", "trainer.global_batch_size"),
    ],
    ids=["misspelt-key", "wrong-type", "batch-inconsistent"],
)
def test_bad_spec_exits_2_with_path_and_hint(run_cli, tmp_path, body, expected):
    spec = write(tmp_path / "bad.yaml", body)
    result = run_cli("render", str(spec), "--profile", "slurm-a100", "--out", str(tmp_path / "out"))
    assert result.code == 2
    assert expected in result.stderr
    assert "hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists(), "bad input must not leave files behind"


def test_debug_shows_traceback(run_cli, tmp_path):
    spec = write(tmp_path / "bad.yaml", "name: x\nbogus: 1\n")
    result = run_cli("--debug", "validate", str(spec))
    assert result.code == 2 and "Traceback" in result.stderr


def test_render_twice_is_byte_identical(run_cli, tmp_path):
    outs = []
    for i in range(2):
        result = run_cli("render", QUICKSTART, "--profile", "k8s-h100", "--out", str(tmp_path / str(i)))
        assert result.code == 0, result.stderr
        outs.append({p.name: p.read_bytes() for p in (tmp_path / str(i) / "k8s-h100" / "quickstart").iterdir()})
    assert outs[0] == outs[1] and set(outs[0]) == {"kustomization.yaml", "pytorchjob.yaml", "spec.json"}


def test_render_writes_where_documented(run_cli, tmp_path):
    result = run_cli("render", QUICKSTART, "--profile", "slurm-a100", cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert (tmp_path / "manifests" / "slurm-a100" / "quickstart" / "job.sbatch").is_file()


def test_set_override_and_stdout(run_cli):
    result = run_cli("render", QUICKSTART, "-p", "slurm-a100", "--stdout", "--set", "resources.nodes=3")
    assert result.code == 0, result.stderr
    assert "#SBATCH --nodes=3" in result.stdout


@pytest.mark.parametrize("command", [[], ["render"], ["submit"], ["validate"], ["profiles"], ["profiles", "show"], ["profiles", "detect"],
                                     ["schema"]])
def test_help_explains_with_example(run_cli, command):
    result = run_cli(*command, "--help")
    assert result.code == 0
    assert "Usage:" in result.stdout
    if command in (["render"], ["submit"], ["validate"], ["profiles", "detect"], []):
        assert "jobgen " in result.stdout.split("Options:")[0] and ("Example" in result.stdout or "Quick start" in result.stdout)


def test_profiles_list_and_show_resolve_inheritance(run_cli):
    listed = run_cli("profiles", "list")
    assert listed.code == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [
        "k8s-a100", "k8s-h100", "local", "slurm-a100", "slurm-cpu", "slurm-cpu-array", "slurm-h100", "ssh-2node"]
    shown = run_cli("profiles", "show", "k8s-h100", "-o", "yaml")
    assert shown.code == 0 and "gpu_type: H100" in shown.stdout and "namespace: training" in shown.stdout


@pytest.mark.parametrize("kind", ["spec", "profile"])
def test_schema_is_json_schema(run_cli, kind):
    result = run_cli("schema", kind)
    schema = json.loads(result.stdout)
    assert schema["type"] == "object" and schema["additionalProperties"] is False


def test_unknown_profile_exit_2(run_cli):
    result = run_cli("render", QUICKSTART, "--profile", "slurm-a10")
    assert result.code == 2 and "did you mean 'slurm-a100'" in result.stderr


def test_validate_reports_fit(run_cli):
    result = run_cli("validate", QUICKSTART, "--profile", "local")
    assert result.code == 0, result.stderr
    assert "world size 2" in result.stdout


def test_submit_to_slurm_without_sbatch_fails_clearly_and_leaves_nothing(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    spec = write(tmp_path / "quickstart.yaml", Path(QUICKSTART).read_text())  # outside a git work tree: no code snapshot
    profile = str(site_profile(tmp_path / "site", "slurm-a100"))  # the shipped one's example partition is refused first
    result = run_cli("submit", str(spec), "--profile", profile, cwd=tmp_path)
    assert result.code == 1 and "sbatch not found" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr
    # nothing was submitted, so nothing stays written (`jobgen render` writes the job
    # directory on its own); nor does a submit write into the user's manifests/ unless asked
    assert not (tmp_path / "manifests").exists() and not (tmp_path / "runs").exists()
    asked = run_cli("submit", str(spec), "--profile", profile, "--out", "manifests", cwd=tmp_path)
    assert asked.code == 1 and not (tmp_path / "manifests").exists()


def test_submit_refuses_overrides_for_a_rendered_directory(run_cli, tmp_path):
    assert run_cli("render", QUICKSTART, "--profile", "slurm-cpu", "--out", str(tmp_path)).code == 0
    result = run_cli("submit", str(tmp_path / "slurm-cpu" / "quickstart"), "--set", "trainer.max_steps=5")
    assert result.code == 2 and "rendered job directory" in result.stderr and "re-render" in result.stderr


@pytest.mark.parametrize("job", ["not-a-handle", "slurm://lab/abc", "k8s://ctx/ns/name"])
def test_status_of_a_job_it_cannot_name_or_reach_is_a_clear_error(run_cli, job):
    result = run_cli("status", job)
    assert result.code == 2 and "hint:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_local_submit_trains_and_resumes(run_cli, tmp_path):
    """The local backend end to end: torchrun with 2 CPU ranks, then a rerun that finds the run complete."""
    spec = write(tmp_path / "tiny.yaml", (
        "name: tiny\nmodel: {preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}\n"
        "data: {max_bytes: 200000}\n"
        "trainer: {precision: 32-true, micro_batch_size: 2, max_steps: 6, warmup_steps: 1, val_check_interval: 3,"
        " limit_val_batches: 2, log_every_n_steps: 3}\n"
        "checkpoint: {every_n_steps: 3}\n"
    ))
    first = run_cli("submit", str(spec), "--profile", "local", cwd=tmp_path, timeout=300)
    assert first.code == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())
    assert summary["global_step"] == 6 and summary["world_size"] == 2
    handle = f"local://{(tmp_path / 'runs' / 'tiny').resolve()}"
    assert f"completed {handle}" in first.stdout
    state = run_cli("status", handle, "-o", "json", cwd=tmp_path)
    assert json.loads(state.stdout)["state"] == "COMPLETED", state.stderr
    # The same run through its job directory (the run directory holds the submission record).
    assert json.loads(run_cli("status", str(tmp_path / "runs" / "tiny"), "-o", "json", cwd=tmp_path).stdout)["state"] == "COMPLETED"
    again = run_cli("submit", str(spec), "--profile", "local", cwd=tmp_path, timeout=300)
    assert again.code == 0 and "run already complete at step 6" in again.stdout


def test_read_commands_take_output_json(run_cli):
    """validate, plan, profiles list/show and status share one -o/--output json option."""
    valid = json.loads(run_cli("validate", str(EXAMPLES / "quickstart.yaml"), "-p", "slurm-a100", "-o", "json").stdout)
    assert valid["precision"] == "bf16-mixed" and valid["world_size"] == 8 and valid["global_batch_size"] == 8 * 16
    cpu = json.loads(run_cli("validate", str(EXAMPLES / "quickstart.yaml"), "-p", "local", "--output", "json").stdout)
    assert cpu["precision"] == "32-true"
    listed = json.loads(run_cli("profiles", "list", "-o", "json").stdout)
    assert {p["name"] for p in listed} >= {"local", "slurm-a100", "k8s-h100"}
    shown = json.loads(run_cli("profiles", "show", "slurm-a100", "-o", "json").stdout)
    assert shown["name"] == "slurm-a100" and shown["scheduler"] == "slurm"
    planned = json.loads(run_cli("plan", str(EXAMPLES / "quickstart.yaml"), "-p", "slurm-a100", "-o", "json").stdout)
    assert planned["profile"] == "slurm-a100"
