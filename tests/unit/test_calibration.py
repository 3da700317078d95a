"""The calibration of the time model (jobgen/planning/calibration.py, calibrate_runs.py):
hostile and malformed files refused naming the file and the field, the seeded table against
docs/evidence.md, and `jobgen calibrate` on a finished run directory.

The run directories are built here with summary.json and spec.json holding the keys and types the
entrypoint writes (jobgen/train/run.py, jobgen/jobdir): a real run would cost a training job per
test; benchmarks/predict_cpu.py calibrates from real runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobgen.cli import cli
from jobgen.errors import ConfigError
from jobgen.planning.calibration import SEED_MEASUREMENTS, load_file, load_for, lookup, seed_rows
from tests.conftest import EXAMPLES, REPO

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
GOOD_GPU = {"accelerator": "H100", "dtype": "bf16", "layout": "ddp", "size": "100M-1B", "mfu": 0.3, "runs": 2}
GOOD_CPU = {"accelerator": "cpu", "dtype": "fp32", "layout": "ddp", "size": "<10M", "flops_per_s_per_core": 5e10, "runs": 1}


def write_rows(path: Path, *rows: dict) -> Path:
    path.write_text(json.dumps({"version": 1, "rows": list(rows)}))
    return path


@pytest.mark.parametrize("row, field", [
    (GOOD_GPU | {"mfu": float("nan")}, "rows[0].mfu"),
    (GOOD_GPU | {"mfu": -0.3}, "rows[0].mfu"),
    (GOOD_GPU | {"mfu": 1.7}, "rows[0].mfu"),
    (GOOD_CPU | {"flops_per_s_per_core": float("inf")}, "rows[0].flops_per_s_per_core"),
    (GOOD_GPU | {"runs": 0}, "rows[0].runs"),
    (GOOD_GPU | {"accelerator": "H900"}, "rows[0].accelerator"),
    (GOOD_GPU | {"accelerator": "A" * 300}, "rows[0].accelerator"),
    (GOOD_GPU | {"device": "x" * 300}, "rows[0].device"),
    (GOOD_GPU | {"device": "line\nbreak \x1b[31m"}, "rows[0]"),
    (GOOD_GPU | {"date": "2026-11-29; rm -rf /"}, "rows[0].date"),
    (GOOD_GPU | {"flops_per_s_per_core": 1e9}, "rows[0]"),
    (GOOD_CPU | {"mfu": 0.5}, "rows[0]"),
    (GOOD_GPU | {"low": 0.5}, "rows[0]"),
    (GOOD_GPU | {"colour": "red"}, "rows[0].colour"),
])
def test_a_hostile_row_is_refused_naming_the_file_and_the_field(tmp_path, row, field):
    path = write_rows(tmp_path / "cal.json", row)
    with pytest.raises(ConfigError) as err:
        load_file(path)
    assert err.value.location == str(path)
    assert field in err.value.message, err.value.message
    assert "x" * 100 not in str(err.value)  # a 300-byte value is cut in the message


@pytest.mark.parametrize("content, words", [
    (b"version: 1\nrows: [\n", "not valid YAML"),
    (b"- just\n- a list\n", "not a mapping"),
    (b"version: 1\nrows:\n  - accelerator: \xff\xfe\n", "not UTF-8"),
    (b"version: 2\nrows: []\n", "version"),
])
def test_a_malformed_file_is_refused_naming_it(tmp_path, content, words):
    path = tmp_path / "cal.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_file(path)
    assert str(path) in str(err.value) and words in str(err.value), str(err.value)


def test_two_rows_for_one_key_and_a_directory_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="a second row for H100 bf16 ddp 100M-1B"):
        load_file(write_rows(tmp_path / "dup.json", GOOD_GPU, GOOD_GPU | {"mfu": 0.2}))
    with pytest.raises(ConfigError, match="not a regular file"):
        load_file(tmp_path)
    assert load_file(tmp_path / "missing.yaml") is None


def test_a_file_the_profile_names_from_another_gpu_type_is_refused(tmp_path):
    from jobgen.specs.load import load_profile

    path = write_rows(tmp_path / "team.json", GOOD_GPU)  # H100 rows only
    profile = load_profile("slurm-a100", None).model_copy(update={"calibration": str(path)})
    with pytest.raises(ConfigError) as err:
        load_for(profile, "A100")
    assert err.value.location == f"{path}: rows[0].accelerator" and "H100" in err.value.message and "A100" in err.value.message
    assert load_for(profile.model_copy(update={"calibration": str(path)}), "H100")[0].rows[0].mfu == 0.3


def test_plan_refuses_a_hostile_calibration_file_without_a_traceback(monkeypatch, tmp_path):
    path = write_rows(tmp_path / "cal.json", GOOD_GPU | {"mfu": -1})
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(path))
    result = CliRunner().invoke(cli, ["plan", QUICKSTART, "-p", "slurm-h100"], prog_name="jobgen")
    assert result.exit_code == 2 and str(path) in result.stderr and "rows[0].mfu" in result.stderr
    assert "Traceback" not in result.output + result.stderr


def test_the_seeded_table_agrees_with_the_evidence_page():
    """One fact in one place: every seeded run's tokens/s (and its MFU where the page prints one)
    is on docs/evidence.md; the gpt350m MFUs follow from tokens/s x 2,117,431,296 FLOPs per token
    / the bf16 dense peak."""
    page = (REPO / "docs" / "evidence.md").read_text()
    derived = {("gpt350m-fsdp-bf16", "H100"), ("llama7b-qlora-fsdp", "H200")}  # MFU computed, not printed
    for m in SEED_MEASUREMENTS:
        assert f"{m.tokens_per_s:,}" in page, m
        if (m.row, m.accelerator) not in derived:
            assert re.search(rf"{m.mfu * 100:.1f}%|~?{m.mfu * 100:g}%", page), m
        if m.n_params == 303_622_144:
            assert m.mfu == pytest.approx(m.tokens_per_s * 2_117_431_296 / 989.4e12, rel=0.07), m
    rows = {r.key: r for r in seed_rows()}
    h200 = rows[("H200", "bf16", "ddp", "100M-1B")]
    assert h200.runs == 4 and h200.low == 0.278 and h200.high == 0.370
    assert {r.key: r.runs for r in seed_rows(leave_out=SEED_MEASUREMENTS[0])}[("H200", "bf16", "ddp", "100M-1B")] == 3


def test_lookup_prefers_the_file_then_the_nearest_size_then_another_gpu(tmp_path):
    cal = load_file(write_rows(tmp_path / "cal.json", GOOD_GPU))
    hit = lookup(cal, "H100", "bf16", "ddp", "100M-1B")
    assert hit.origin == "file" and hit.exact and hit.row.mfu == 0.3
    near = lookup(None, "H100", "bf16", "ddp", "<10M")
    assert near.origin == "seed" and not near.exact and near.row.size == "100M-1B" and "nearest size" in near.note
    assert "upper limit" in near.note  # a model smaller than any measured: host-bound, not modeled
    other = lookup(None, "A100", "bf16", "fsdp", "1B-10B")
    assert other.row.accelerator == "H200" and other.row.layout == "fsdp" and "no A100 row" in other.note
    assert lookup(None, "cpu", "fp32", "ddp", "<10M") is None  # no CPU is seeded


def finished_run(root: Path, name: str = "run", *, tokens_per_s: float = 20_000.0, world: int = 2, accelerator: str = "cpu",
                 gpu_type: str | None = None, precision: str = "32-true", strategy: str = "ddp", **extra) -> Path:
    """A run directory as the entrypoint leaves it: summary.json and spec.json (their keys and types)."""
    run = root / name
    run.mkdir(parents=True)
    summary = {"name": name, "global_step": 40, "max_steps": 40, "tokens_per_s_mean": tokens_per_s * 1.01,
               "tokens_per_s_steady": tokens_per_s, "mfu_steady": None, "tokens_per_step": 8192, "flops_per_token": 6_529_536,
               "peak_flops_per_s": None, "world_size": world, "n_params": 858_880, "trainable_params": 858_880,
               "strategy": strategy, "layout": strategy, "precision": precision, "jobgen_version": "0.1.0", "profile": "local",
               "levers": {"matmul_precision": None}} | extra
    spec = {"jobgen_version": "0.1.0", "profile": "local", "spec": {"trainer": {"strategy": strategy}},
            "launch": {"accelerator": accelerator, "num_nodes": 1, "devices_per_node": world, "world_size": world,
                       "gpu_type": gpu_type}}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "spec.json").write_text(json.dumps(spec))
    return run


def calibrate(*args: str):
    return CliRunner().invoke(cli, ["calibrate", *args], prog_name="jobgen")


def test_calibrate_stores_the_mean_of_runs_and_the_plan_predicts_from_it(monkeypatch, tmp_path):
    path = tmp_path / "state" / "calibration.yaml"
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(path))
    a = finished_run(tmp_path, "a", tokens_per_s=20_000.0)
    result = calibrate(str(a), "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    per_core = 20_000.0 * 6_529_536 / 2  # 2 ranks x 1 core each (local: 2 cores / 2 ranks)
    assert doc["written"] and doc["file"] == str(path)
    assert doc["runs"][0]["value"] == pytest.approx(per_core) and doc["runs"][0]["cores_per_rank"] == 1
    assert doc["rows"][0]["runs"] == 1 and doc["rows"][0]["flops_per_s_per_core"] == pytest.approx(per_core)
    b = finished_run(tmp_path, "b", tokens_per_s=30_000.0)
    text = calibrate(str(b))
    assert text.exit_code == 0 and "stored cpu fp32 ddp <10M" in text.stdout and "(2 runs" in text.stdout
    row = load_file(path).rows[0]
    assert row.runs == 2 and row.value == pytest.approx(25_000.0 * 6_529_536 / 2)
    assert row.low == pytest.approx(per_core) and row.high == pytest.approx(30_000.0 * 6_529_536 / 2)
    first = path.read_bytes()
    assert calibrate(str(b), "--dry-run").exit_code == 0 and path.read_bytes() == first
    plan = json.loads(CliRunner().invoke(cli, ["plan", QUICKSTART, "-p", "local", "-o", "json"], prog_name="jobgen").stdout)
    ddp = next(r for r in plan["prediction"]["rows"] if r["layout"] == "ddp")
    assert ddp["tokens_per_s"]["value"] == pytest.approx(25_000.0, rel=1e-4)  # same shape, same ranks: the mean
    assert ddp["calibration"]["runs"] == 2 and "calibration.yaml" in plan["prediction"]["message"]


@pytest.mark.parametrize("change, field", [
    ({"tokens_per_s_steady": float("nan"), "tokens_per_s_mean": None}, "tokens_per_s_steady"),
    ({"flops_per_token": -5}, "flops_per_token"),
    ({"flops_per_token": None}, "flops_per_token"),
    ({"world_size": "two"}, "world_size"),
    ({"precision": "p" * 300}, "precision"),
    ({"precision": "banana"}, "precision"),
    ({"layout": ["ddp"]}, "layout"),
    ({"profile": "x\ny"}, "profile"),
])
def test_calibrate_refuses_a_run_with_hostile_figures(tmp_path, change, field):
    run = finished_run(tmp_path, **change)
    result = calibrate(str(run), "--file", str(tmp_path / "cal.yaml"))
    assert result.exit_code == 2 and field in result.stderr and "summary.json" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "cal.yaml").exists()


def test_calibrate_refuses_an_unfinished_or_non_utf8_run(tmp_path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    result = calibrate(str(unfinished), "--file", str(tmp_path / "cal.yaml"))
    assert result.exit_code == 2 and "has not finished" in result.stderr
    run = finished_run(tmp_path, "bad")
    (run / "summary.json").write_bytes(b'{"name": "\xff\xfe"}')
    result = calibrate(str(run), "--file", str(tmp_path / "cal.yaml"))
    assert result.exit_code == 2 and "not a JSON document in UTF-8" in result.stderr
    gpu = finished_run(tmp_path, "gpu", accelerator="gpu", gpu_type="H900")
    result = calibrate(str(gpu), "--file", str(tmp_path / "cal.yaml"))
    assert result.exit_code == 2 and "launch.gpu_type" in result.stderr


def test_calibrate_a_gpu_run_stores_mfu_of_the_compute_part(tmp_path):
    """A one-GPU run has no collectives: its MFU is tokens/s x FLOPs per token / the peak."""
    run = finished_run(tmp_path, "h100", tokens_per_s=100_000.0, world=1, accelerator="gpu", gpu_type="H100",
                       precision="bf16-mixed", flops_per_token=2_117_431_296, n_params=303_622_144, levers="on")
    result = calibrate(str(run), "--file", str(tmp_path / "cal.yaml"), "-o", "json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["rows"][0]
    assert (row["accelerator"], row["dtype"], row["layout"], row["size"]) == ("H100", "bf16", "ddp", "100M-1B")
    assert row["mfu"] == pytest.approx(100_000.0 * 2_117_431_296 / 989.4e12)


def test_the_leave_one_out_table_of_the_docs_is_current():
    """docs/predict.md's leave-one-out table is what :func:`leave_one_out` computes now (every seeded
    run predicted from the others), with the count within 25%."""
    from jobgen.planning.calibration import leave_one_out

    page = (REPO / "docs" / "predict.md").read_text()
    rows = leave_one_out()
    for r in rows:
        line = (f"| {r['row']} | {r['accelerator']} | {r['layout']} | {r['measured_tokens_per_s']:,} | "
                f"{r['predicted_tokens_per_s']:,} | {r['predicted_over_measured']:.2f} | {r['from']} |")
        assert line in page, line
    within = sum(0.75 <= r["predicted_over_measured"] <= 1.25 for r in rows)
    assert f"{within} of {len(rows)} predictions are within 25%" in page
    assert all(r["predicted_tokens_per_s"] for r in rows)  # every run has a row to fall back on


def test_the_profiles_time_model_fields_leave_the_inputs_hash_and_rendered_files_alone(tmp_path):
    """``calibration`` and ``bandwidth`` are jobgen plan's own: adding them to a profile changes no
    rendered file (the committed manifests stay current); a profile shown to copy keeps them."""
    from jobgen.api import plan_loaded
    from jobgen.specs.load import load_profile, load_spec
    from jobgen.specs.profile import PROFILE_FILE_CONTEXT, BandwidthSettings

    spec = load_spec(QUICKSTART, ())
    plain = load_profile("slurm-a100", None)
    tuned = plain.model_copy(update={"calibration": str(tmp_path / "cal.yaml"),
                                     "bandwidth": BandwidthSettings(intra_node_gb_per_s=200.0)})
    assert tuned.model_dump() == plain.model_dump()
    assert tuned.model_dump(context=PROFILE_FILE_CONTEXT)["bandwidth"] == {"intra_node_gb_per_s": 200.0,
                                                                           "inter_node_gb_per_s": None, "pcie_gb_per_s": None}
    one, two = (plan_loaded(spec, p, QUICKSTART, profile_source="slurm-a100") for p in (plain, tuned))
    assert one.inputs_sha256 == two.inputs_sha256 and one.files == two.files


def test_calibrate_a_multi_gpu_run_leaves_out_the_collectives_the_model_charges(tmp_path):
    """ZeRO-2 on 2 GPUs of slurm-h100: the parameter all-gather after the step (2 bytes x Ψ, half
    of it on each rank's link at the H100's 450 GB/s) overlaps nothing, so the stored MFU is of the
    step less that time."""
    psi = 303_622_144
    run = finished_run(tmp_path, "zero2", tokens_per_s=200_000.0, world=2, accelerator="gpu", gpu_type="H100",
                       precision="bf16-mixed", strategy="deepspeed_stage_2", flops_per_token=2_117_431_296, n_params=psi,
                       trainable_params=psi, tokens_per_step=16_384, profile="slurm-h100")
    result = calibrate(str(run), "--file", str(tmp_path / "cal.yaml"), "-o", "json")
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)["runs"][0]
    step = 16_384 / 200_000.0
    gather = 2 * psi * 0.5 / 450e9
    assert measured["comm_s"] == pytest.approx(gather) and measured["step_s"] == pytest.approx(step)
    assert measured["layout"] == "deepspeed"
    assert measured["value"] == pytest.approx(200_000.0 * 2_117_431_296 * step / (step - gather) / (2 * 989.4e12))


@pytest.mark.parametrize("field, value, words", [
    ("bandwidth", "{intra_node_gb_per_s: .nan}", "bandwidth.intra_node_gb_per_s"),
    ("bandwidth", "{inter_node_gb_per_s: -5}", "bandwidth.inter_node_gb_per_s"),
    ("bandwidth", "{pcie_gb_per_s: .inf}", "bandwidth.pcie_gb_per_s"),
    ("bandwidth", "{nvlink: 3}", "bandwidth.nvlink"),
    ("calibration", "'" + "c" * 5000 + "'", "calibration"),
    ("calibration", "''", "calibration"),
])
def test_hostile_time_model_fields_of_a_profile_are_refused(run_cli, tmp_path, field, value, words):
    profile = tmp_path / "site.yaml"
    profile.write_text(f"scheduler: local\n{field}: {value}\n")
    result = run_cli("plan", QUICKSTART, "-p", str(profile))
    assert result.code == 2 and words in result.stderr and str(profile) in result.stderr, result.stderr
    assert "c" * 200 not in result.stderr and "Traceback" not in result.stderr


def test_calibrate_names_a_hostile_run_directory_printably(tmp_path):
    odd = tmp_path / "run\nwith\x1b[31m escape"
    odd.mkdir()
    result = calibrate(str(odd), "--file", str(tmp_path / "cal.yaml"))
    assert result.exit_code == 2 and "run\\nwith\\x1b[31m escape" in result.stderr and "\x1b" not in result.stderr
