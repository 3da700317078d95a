"""`jobgen ls`: every recorded submission, refreshed from its backend, filtered, never guessed.

SLURM answers through the fake client commands (tests/fakes/slurm); the Kubernetes record names
a context no kubeconfig has, so that backend cannot be asked; the local run has a summary.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen import api
from jobgen.jobdir import SUMMARY_FILE, Submission, recorded_submissions
from tests.conftest import EXAMPLES, PROFILES
from tests.fakes.slurm.fakeslurm import json_reply, squeue_24_05


@pytest.fixture
def state(slurm, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    slurm.respond("squeue", json_reply(squeue_24_05(42, ["RUNNING"], tres_alloc="cpu=4,node=2,billing=4", start=1700000000, end=1700001800)))

    slurm_dir = api.render(api.plan_job(EXAMPLES / "quickstart.yaml", "slurm-cpu", profiles_dir=PROFILES), tmp_path / "m")[0].parent
    Submission(handle="slurm://cpu/42", job_dir=str(slurm_dir), run_dir=str(tmp_path / "runs" / "quickstart"),
               submitted_at="2026-11-23T06:00:00+00:00").save()

    local_dir = tmp_path / "runs" / "local-run"
    api.plan_job(EXAMPLES / "quickstart.yaml", "local", overrides=["name=local-run"]).write(local_dir)
    (local_dir / SUMMARY_FILE).write_text(json.dumps({"wall_time_s": 1800.0}))
    Submission(handle=f"local://{local_dir}", job_dir=str(local_dir), run_dir=str(local_dir),
               submitted_at="2026-11-23T07:00:00+00:00").save()

    k8s_dir = tmp_path / "k8s-job"
    k8s_dir.mkdir()
    Submission(handle="k8s://gone-context/training/quickstart", job_dir=str(k8s_dir), run_dir="/workspace/runs/quickstart",
               submitted_at="2026-11-23T05:00:00+00:00").save()
    return tmp_path


def test_every_record_is_refreshed_and_an_unreachable_cluster_is_said_not_guessed(state, run_cli):
    result = run_cli("ls", "-o", "json")
    assert result.code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["handle"] for r in rows] == [f"local://{state / 'runs' / 'local-run'}", "slurm://cpu/42",
                                          "k8s://gone-context/training/quickstart"]  # newest first
    local, slurm, k8s = rows
    assert (local["state"], local["cluster"], local["usage"]["cpu_hours"]) == ("COMPLETED", "local", round(2 * 1800 / 3600, 6))
    assert (slurm["state"], slurm["source"], slurm["name"], slurm["num_nodes"]) == ("RUNNING", "squeue", "quickstart", 2)
    assert slurm["usage"]["devices"] == 4 and slurm["usage"]["end"] is None
    assert k8s["state"] == "UNREACHABLE" and k8s["usage"] is None and "not reachable" in k8s["stale"]
    assert "job directory unreadable" not in (slurm["stale"] or "")


def test_filters_by_cluster_and_state(state, run_cli):
    only_slurm = json.loads(run_cli("ls", "--cluster", "cpu", "-o", "json").stdout)
    assert [r["handle"] for r in only_slurm] == ["slurm://cpu/42"]
    completed = json.loads(run_cli("ls", "--state", "completed", "-o", "json").stdout)
    assert [r["cluster"] for r in completed] == ["local"]
    assert run_cli("ls", "--state", "FAILED").stdout == "no jobs matching the filters\n"


def test_the_table_shows_world_usage_and_notes(state, run_cli):
    result = run_cli("ls")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["HANDLE", "NAME", "STATE", "NODES", "x", "DEV", "STARTED", "(UTC)", "ELAPSED", "DEVICE", "TIME", "COST",
                                "ETA", "/", "VS", "PREDICTED"]
    slurm = next(line for line in lines if line.startswith("slurm://cpu/42"))
    assert "RUNNING" in slurm and "2 x 1 cpu" in slurm and "2023-11-14 22:13" in slurm
    local = next(line for line in lines if line.startswith("local://"))
    assert "0:30:00" in local and "1.000 CPU-hours" in local
    assert any(line.startswith("note: k8s://gone-context/training/quickstart: kubernetes not reachable") for line in lines)


def test_an_unreadable_record_does_not_hide_the_others(state):
    (state / "state" / "slurm" / "broken.json").write_text("{not json")
    assert len(recorded_submissions()) == 3


def test_a_finished_runs_measured_over_predicted_step_time_and_a_hostile_summary(state, run_cli):
    local_dir = state / "runs" / "local-run"
    (local_dir / SUMMARY_FILE).write_text(json.dumps({"wall_time_s": 1800.0, "prediction": {
        "available": True, "measured_over_predicted": {"step_s": 1.18, "tokens_per_s": 0.847, "wall_s": 1.3, "device_hours": 1.3,
                                                       "cost": None}}}))
    hostile_dir = state / "runs" / "hostile-run"
    api.plan_job(EXAMPLES / "quickstart.yaml", "local", overrides=["name=hostile-run"]).write(hostile_dir)
    (hostile_dir / SUMMARY_FILE).write_text('{"wall_time_s": 60, "prediction": {"measured_over_predicted": {"step_s": NaN}}}')
    Submission(handle=f"local://{hostile_dir}", job_dir=str(hostile_dir), run_dir=str(hostile_dir),
               submitted_at="2026-11-23T08:00:00+00:00").save()
    rows = {r["name"]: r for r in json.loads(run_cli("ls", "-o", "json").stdout)}
    assert rows["local-run"]["measured_over_predicted"]["step_s"] == 1.18 and rows["local-run"]["prediction_note"] is None
    assert rows["hostile-run"]["measured_over_predicted"] is None
    assert rows["hostile-run"]["prediction_note"] == f"{hostile_dir / SUMMARY_FILE}: prediction.measured_over_predicted.step_s " \
                                                    "is not a finite number above 0"
    assert rows["quickstart"]["measured_over_predicted"] is None and rows["quickstart"]["progress"] is None  # no run dir here
    result = run_cli("ls")
    assert result.code == 0 and "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert next(line for line in lines if line.startswith(f"local://{local_dir} ")).endswith("1.18x step time")
    assert next(line for line in lines if line.startswith(f"local://{hostile_dir} ")).endswith("n/a")
    assert f"note: local://{hostile_dir}: prediction n/a: {hostile_dir / SUMMARY_FILE}: prediction.measured_over_predicted" in result.stdout
