"""`str(plan)` shows exactly what submit does: for each backend, submit runs through a fake
runner that records every command or API request, and the record must equal the plan's
submit steps (placeholders filled in)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobgen import api
from jobgen.backends import get_backend
from jobgen.backends.base import SubmitOptions
from jobgen.backends.kubernetes import backend as k8s
from jobgen.backends.local import LocalBackend
from jobgen.planning.plan import ApiRequest, Command
from tests.conftest import EXAMPLES
from tests.unit.test_k8s_submit import FakeCluster


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))


def test_slurm_submit_runs_the_planned_sbatch_command(tmp_path, monkeypatch):
    from jobgen.backends.slurm import backend as slurm
    from jobgen.backends.slurm.script import RUNS_DIR_PLACEHOLDER

    job_plan = api.plan_job(EXAMPLES / "quickstart.yaml", "slurm-cpu")
    job_dir = tmp_path / "manifests" / "slurm-cpu" / "quickstart"
    api.render(job_plan, tmp_path / "manifests")
    ran: list[tuple[list[str], Path | None, dict[str, str]]] = []

    def fake_run(argv, *, cwd=None, env=None, timeout_s=60.0, what="command"):
        ran.append((list(argv), cwd, dict(env or {})))
        return subprocess.CompletedProcess(argv, 0, stdout="4242\n", stderr="")

    monkeypatch.setattr(slurm, "run_command", fake_run)
    runs = tmp_path / "runs"
    result = get_backend("slurm").submit(job_dir, SubmitOptions(runs_dir=runs))
    assert str(result.handle).endswith("/4242") and result.action == "submitted"
    (step,) = job_plan.submit_steps
    assert isinstance(step, Command)
    filled = [arg.replace(RUNS_DIR_PLACEHOLDER, str(runs.resolve())) for arg in step.argv]
    argv, cwd, env = ran[0]
    assert argv == filled and cwd == job_dir.resolve()
    for key, value in step.env:
        assert env[key] == value.replace(RUNS_DIR_PLACEHOLDER, str(runs.resolve()))
    assert str(step) in str(job_plan)  # what `render --stdout` prints
    assert result.record is not None and list(result.record.argv or ()) == argv


def test_kubernetes_submit_makes_the_planned_api_requests(tmp_path, monkeypatch):
    job_plan = api.plan_job(EXAMPLES / "quickstart.yaml", "k8s-h100", overrides=["resources.nodes=2"])
    api.render(job_plan, tmp_path / "manifests")
    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    result = get_backend("kubernetes").submit(tmp_path / "manifests" / job_plan.job_subdir, SubmitOptions(), lambda _: None)
    assert result.action == "created"
    made = [(method, path, tuple(q for q in query if q[0] != "fieldValidation")) for method, path, query in cluster.calls
            if path != "/version"]
    planned = [(s.method, s.path, s.query) for s in job_plan.submit_steps if isinstance(s, ApiRequest) and not s.when.startswith("--replace")]
    assert made == planned
    assert all(str(s) in str(job_plan) for s in job_plan.submit_steps)


def test_local_submit_runs_the_planned_command(tmp_path):
    spec = tmp_path / "quickstart.yaml"  # outside a git work tree: no code snapshot (see test_code_snapshot.py)
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text())
    job_plan = api.plan_job(spec, "local")
    ran: list[tuple[list[str], Path, dict[str, str]]] = []

    def runner(argv, cwd, env):
        ran.append((argv, cwd, env))
        return 0

    options = SubmitOptions(runs_dir=tmp_path / "runs")
    backend = get_backend("local")
    job_dir = backend.job_dir(job_plan, tmp_path, options)
    job_plan.write(job_dir)
    result = LocalBackend(runner=runner).submit(job_dir, options, lambda _: None, plan=job_plan)
    (step,) = job_plan.submit_steps
    argv, cwd, env = ran[0]
    assert argv == [sys.executable if a == "python" else a for a in step.argv] and cwd == job_dir.resolve()
    assert all(env[k] == v for k, v in step.env)
    assert result.action == "completed" and str(result.handle) == f"local://{job_dir.resolve()}"
    # A written local job directory re-plans the same command (refused when its inputs differ).
    ran.clear()
    LocalBackend(runner=runner).submit(job_dir, options, lambda _: None)
    assert ran[0][0] == argv


def test_an_option_of_another_scheduler_is_refused_with_its_counterpart():
    from jobgen.errors import ConfigError

    with pytest.raises(ConfigError, match="--test-only does not apply to kubernetes") as info:
        get_backend("kubernetes").check_options(SubmitOptions(test_only=True))
    assert "--dry-run=server" in (info.value.hint or "")
    with pytest.raises(ConfigError, match="--replace does not apply to slurm"):
        get_backend("slurm").check_options(SubmitOptions(replace=True))


def test_the_plan_names_the_secrets_submit_takes_from_the_environment(tmp_path, monkeypatch):
    """Secrets are passed by name: the plan shows which variables submit reads from the
    submitting environment, and their values appear in no planned file or step."""
    from jobgen.backends.slurm import backend as slurm

    monkeypatch.setenv("WANDB_API_KEY", "marker-value-123")
    for profile in ("slurm-cpu", "local"):
        job_plan = api.plan_job(EXAMPLES / "quickstart.yaml", profile, overrides=["secrets=[WANDB_API_KEY]"])
        (step,) = job_plan.submit_steps
        assert isinstance(step, Command) and step.inherits == ("WANDB_API_KEY",)
        assert "from your environment: WANDB_API_KEY" in str(job_plan) and "marker-value-123" not in str(job_plan)
    ran = []
    monkeypatch.setattr(slurm, "run_command", lambda argv, **kw: ran.append(kw["env"]) or subprocess.CompletedProcess(argv, 0, "7\n", ""))
    job_plan = api.plan_job(EXAMPLES / "quickstart.yaml", "slurm-cpu", overrides=["secrets=[WANDB_API_KEY]"])
    api.render(job_plan, tmp_path / "m")
    get_backend("slurm").submit(tmp_path / "m" / job_plan.job_subdir, SubmitOptions(runs_dir=tmp_path / "runs"))
    assert ran[0]["WANDB_API_KEY"] == "marker-value-123"


# --------------------------------------------------------------------------- command mode (spec entrypoint)


def test_command_mode_local_submit_runs_the_planned_command_in_the_submit_dir(tmp_path, monkeypatch):
    """The planned torchrun command with its placeholders filled: cwd = where submit runs,
    RUN_DIR and PL_DEEPSPEED_CONFIG_PATH absolute in the job directory."""
    from jobgen.planning.plan import JOB_DIR_PLACEHOLDER, SUBMIT_DIR_PLACEHOLDER

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    spec = tmp_path / "command-ddp.yaml"  # outside the jobgen checkout: no snapshot of it (see test_code_snapshot)
    spec.write_text((EXAMPLES / "command-ddp.yaml").read_text())
    job_plan = api.plan_job(spec, "local", overrides=["trainer.strategy=deepspeed_stage_2"])
    ran: list[tuple[list[str], Path, dict[str, str]]] = []
    options = SubmitOptions(runs_dir=tmp_path / "runs")
    backend = get_backend("local")
    job_dir = backend.job_dir(job_plan, tmp_path, options)
    job_plan.write(job_dir)
    LocalBackend(runner=lambda a, c, e: ran.append((a, c, e)) or 0).submit(job_dir, options, lambda _: None, plan=job_plan)
    (step,) = job_plan.submit_steps
    assert isinstance(step, Command) and step.cwd == SUBMIT_DIR_PLACEHOLDER
    argv, cwd, env = ran[0]
    assert argv == [sys.executable if a == "python" else a for a in step.argv] and cwd == project
    fill = {JOB_DIR_PLACEHOLDER: str(job_dir.resolve()), SUBMIT_DIR_PLACEHOLDER: str(project)}
    assert all(env[k] == step.filled(fill).env[i][1] for i, (k, _) in enumerate(step.env))
    assert env["PL_DEEPSPEED_CONFIG_PATH"] == str(job_dir.resolve() / "ds_config.json")
    assert (job_dir / "ds_config.json").is_file() and env["RUN_DIR"] == str(job_dir.resolve())
    assert str(step) in str(job_plan)
    ran.clear()  # a written command-mode job directory re-plans the same command
    LocalBackend(runner=lambda a, c, e: ran.append((a, c, e)) or 0).submit(job_dir, options, lambda _: None)
    assert ran[0][0] == argv and ran[0][1] == project


def test_command_mode_slurm_submit_passes_the_submit_dir(tmp_path, monkeypatch):
    from jobgen.backends.slurm import backend as slurm
    from jobgen.backends.slurm.script import RUNS_DIR_PLACEHOLDER
    from jobgen.planning.plan import SUBMIT_DIR_PLACEHOLDER

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    job_plan = api.plan_job(EXAMPLES / "command-ddp.yaml", "slurm-cpu", overrides=["resources.devices_per_node=1"])
    api.render(job_plan, tmp_path / "manifests")
    ran = []
    monkeypatch.setattr(slurm, "run_command", lambda argv, **kw: ran.append((list(argv), kw["env"])) or
                        subprocess.CompletedProcess(argv, 0, "11\n", ""))
    runs = tmp_path / "runs"
    get_backend("slurm").submit(tmp_path / "manifests" / job_plan.job_subdir, SubmitOptions(runs_dir=runs))
    (step,) = job_plan.submit_steps
    filled = step.filled({RUNS_DIR_PLACEHOLDER: str(runs.resolve()), SUBMIT_DIR_PLACEHOLDER: str(project)})
    argv, env = ran[0]
    assert argv == list(filled.argv)
    assert all(env[k] == v for k, v in filled.env) and env["JOBGEN_WORKDIR"] == str(project)
    assert str(step) in str(job_plan)


def test_command_mode_kubernetes_submit_makes_the_planned_api_requests(tmp_path, monkeypatch):
    job_plan = api.plan_job(EXAMPLES / "command-lightning-cli.yaml", "k8s-h100", overrides=["resources.nodes=2"])
    api.render(job_plan, tmp_path / "manifests")
    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    result = get_backend("kubernetes").submit(tmp_path / "manifests" / job_plan.job_subdir, SubmitOptions(), lambda _: None)
    assert result.action == "created"
    made = [(method, path, tuple(q for q in query if q[0] != "fieldValidation")) for method, path, query in cluster.calls
            if path != "/version"]
    planned = [(s.method, s.path, s.query) for s in job_plan.submit_steps if isinstance(s, ApiRequest) and not s.when.startswith("--replace")]
    assert made == planned
    assert "examples/scripts/lightning_cli.py" in job_plan.file("pytorchjob.yaml")
