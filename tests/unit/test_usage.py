"""jobgen.reports.usage: TRES parsing, sacct/Kubernetes times, GPU-hours and cost (squeue's times: test_slurm_json.py)."""

from __future__ import annotations

from datetime import datetime, timezone

from jobgen.reports.usage import Usage, from_iso, parse_tres, span_seconds


def test_parse_tres_counts_cpus_nodes_and_gpus_once():
    assert parse_tres("cpu=64,mem=512G,node=2,billing=64,gres/gpu=8,gres/gpu:a100=8") == {"cpu": 64, "node": 2, "gpu": 8}
    assert parse_tres("cpu=4,gres/gpu:a100=2,gres/gpu:h100=2") == {"cpu": 4, "gpu": 4}  # typed only: summed
    assert parse_tres("cpu=2,node=2,billing=2") == {"cpu": 2, "node": 2}
    assert parse_tres("") == {}


def test_iso_times():
    assert from_iso("2026-11-23T06:00:00Z") == datetime(2026, 11, 23, 6, tzinfo=timezone.utc)
    assert from_iso("Unknown") is None and from_iso("") is None and from_iso("garbage") is None
    local = from_iso("2026-11-23T06:00:00", local=True)
    assert local is not None and local.tzinfo is not None


def test_hours_and_cost():
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    gpu = Usage("gpu", 8, 5400.0, "test", start, None, gpu_hour_price=2.0)
    assert gpu.device_hours == 12.0 and gpu.cost == 24.0
    assert gpu.to_json()["gpu_hours"] == 12.0 and gpu.to_json()["cost"] == 24.0
    assert Usage("cpu", 4, 3600.0, "test", gpu_hour_price=2.0).cost is None  # a GPU price does not price CPUs
    assert Usage("gpu", 8, None, "test").device_hours is None
    assert Usage("gpu", 16, 3600.0, "pods", device_seconds=8 * 3600 + 8 * 1800).device_hours == 12.0
    assert span_seconds(start, None, datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)) == 600.0
    assert span_seconds(None, None, start) is None


def test_a_gpu_hour_price_reaches_spec_json_and_is_refused_on_cpu_profiles(tmp_path):
    import pytest

    from jobgen import api
    from jobgen.errors import ConfigError
    from jobgen.specs.load import load_profile
    from tests.conftest import EXAMPLES, PROFILES

    (tmp_path / "priced.yaml").write_text("extends: slurm-a100\ngpu_hour_price: 3.25\n")
    (tmp_path / "cpu-priced.yaml").write_text("extends: slurm-cpu\ngpu_hour_price: 3.25\n")
    job_plan = api.plan_job(EXAMPLES / "quickstart.yaml", "priced", profiles_dir=tmp_path)
    assert '"gpu_hour_price": 3.25' in dict(job_plan.files)["spec.json"]
    unpriced = api.plan_job(EXAMPLES / "quickstart.yaml", "slurm-a100", profiles_dir=PROFILES)
    assert "gpu_hour_price" not in dict(unpriced.files)["spec.json"]
    with pytest.raises(ConfigError, match="gpu_hour_price prices GPU-hours"):
        load_profile("cpu-priced", tmp_path)
