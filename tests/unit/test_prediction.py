"""The prediction a job is submitted with (jobgen/planning/prediction.py): written by submit beside
spec.json from the time model's row of the spec's layout, read back with every field checked
(hostile files are refused naming the file), and compared with what a run measured as
summary.json's ``prediction`` block; `jobgen ls` reads that block back.

Training itself is not run here: the entrypoint's summary.json is covered in
tests/entrypoint/test_summary_fields.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobgen import api
from jobgen.errors import ConfigError
from jobgen.jobdir.files import PREDICTION_FILE, SPEC_FILE, DirUndo
from jobgen.jobdir.spec import read_resolved_spec
from jobgen.planning.calibration import dumps
from jobgen.planning.estimate_hf import plan_memory
from jobgen.planning.prediction import (
    compare,
    describe,
    measured_figures,
    predict_spec,
    ratio_of_summary,
    read_prediction,
    summary_block,
    write_predictions,
)
from jobgen.planning.time_model import plan_time
from jobgen.specs.load import load_profile
from tests.conftest import EXAMPLES, PROFILES
from tests.unit.test_time_model import cpu_file

HOSTILE_300 = "x" * 150 + "\n\x1b[31m'\"" + "é" * 140
TOO_LONG = "y" * 1001


@pytest.fixture
def calibrated(tmp_path, monkeypatch) -> Path:
    """A calibration file with a CPU row of 50 GFLOP/s per core (2 runs, 40-60)."""
    path = tmp_path / "cal.yaml"
    path.write_text(dumps(cpu_file(5e10, 2, 4e10, 6e10)))
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(path))
    return path


def local_job(tmp_path: Path, *overrides: str) -> Path:
    job_dir = tmp_path / "runs" / "quickstart"
    api.plan_job(EXAMPLES / "quickstart.yaml", "local", overrides=["trainer.max_steps=100", *overrides]).write(job_dir)
    return job_dir


def test_the_prediction_is_the_time_models_row_of_the_specs_layout(tmp_path, calibrated):
    job_dir = local_job(tmp_path)
    profile = load_profile("local", PROFILES)
    [path] = write_predictions(job_dir, profile)
    assert path == job_dir / PREDICTION_FILE
    doc = read_prediction(path)
    resolved = read_resolved_spec(job_dir)
    tp = plan_time(resolved.spec, profile, plan_memory(resolved.spec, profile, 1, 2))
    row = tp.rows["ddp"].to_json()
    assert doc["available"] and doc["layout"] == "ddp" and doc["inputs_sha256"] == resolved.inputs_sha256
    for name in ("step_s", "tokens_per_s", "wall_s", "device_hours"):
        assert doc[name] == row[name], name
    # 2 ranks x 1 core x 50 GFLOP/s over 6,529,536 FLOPs per token; 100 steps of 8,192 tokens
    assert doc["tokens_per_s"]["value"] == pytest.approx(2 * 5e10 / 6_529_536, rel=1e-5)
    assert doc["wall_s"]["value"] == pytest.approx(100 * 8192 / doc["tokens_per_s"]["value"], rel=1e-4)
    assert doc["cost"] is None and doc["device_kind"] == "cpu" and doc["calibration"]["origin"] == "file"
    assert doc["calibration_file"] == str(calibrated) and doc["max_steps"] == 100
    assert describe(path).startswith("ddp: step ") and "CPU-hours" in describe(path)
    # without a profile object, the one spec.json names is loaded by name: the same figures
    [again] = write_predictions(job_dir, None)
    assert {k: v for k, v in read_prediction(again).items() if k != "made_at"} == {k: v for k, v in doc.items() if k != "made_at"}


def test_no_prediction_says_why_and_a_profile_that_cannot_be_loaded_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(tmp_path / "none.yaml"))
    job_dir = local_job(tmp_path)
    [path] = write_predictions(job_dir, load_profile("local", PROFILES))
    doc = read_prediction(path)
    assert not doc["available"] and doc["step_s"] is None and "no calibration file" in doc["message"]
    assert "no calibration file" in describe(path)
    spec = json.loads((job_dir / SPEC_FILE).read_text())
    spec["profile"] = "no-such-profile"  # spec.json is not re-validated against the profile's name
    (job_dir / SPEC_FILE).write_text(json.dumps(spec))
    [path] = write_predictions(job_dir, None)
    assert "profile 'no-such-profile' cannot be loaded here" in read_prediction(path)["message"]


def test_a_hostile_calibration_file_at_submit_is_named_with_its_field(tmp_path, monkeypatch):
    """The prediction submit writes says why there is none: a calibration file that does not
    validate is named with the field, as `jobgen plan` names them."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"version": 1, "rows": [{"accelerator": "cpu", "dtype": "fp32", "layout": "ddp", "size": "<10M",
                                                        "flops_per_s_per_core": float("nan"), "runs": 1}]}))
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(path))
    [written] = write_predictions(local_job(tmp_path), load_profile("local", PROFILES))
    doc = read_prediction(written)
    assert not doc["available"] and str(path) in doc["message"] and "rows[0].flops_per_s_per_core" in doc["message"], doc["message"]
    assert str(path) in describe(written)


def test_a_gpu_profile_predicts_cost_from_its_price(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(tmp_path / "none.yaml"))
    profile = tmp_path / "priced.yaml"
    profile.write_text("extends: slurm-h100\ngpu_hour_price: 2.5\n")
    job_plan = api.plan_job(EXAMPLES / "quickstart.yaml", str(profile), profiles_dir=PROFILES, overrides=["trainer.max_steps=1000"])
    job_dir = tmp_path / "job"
    job_plan.write(job_dir)
    [path] = write_predictions(job_dir, job_plan.cluster_profile)
    doc = read_prediction(path)
    assert doc["available"] and doc["device_kind"] == "gpu" and doc["calibration"]["origin"] == "seed"
    assert doc["cost"]["value"] == pytest.approx(doc["device_hours"]["value"] * 2.5, rel=1e-4)
    assert "cost " in describe(path)


@pytest.mark.parametrize(("content", "why"), [
    (b'{"version": 1, "step_s": {"value": NaN, "low": 1, "high": 2}}', "NaN is not a number JSON allows"),
    (b"not json at all", "not a prediction file"),
    (b"\xff\xfe\x00", "not a prediction file"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"version": 2}', "version: expected 1"),
    (b"{" + b" " * (70 * 1024) + b"}", "larger than 65536 bytes"),
])
def test_a_malformed_prediction_file_is_refused_naming_it(tmp_path, content, why):
    path = tmp_path / "dir with 'quote'" / PREDICTION_FILE
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=why) as info:
        read_prediction(path)
    assert info.value.location == str(path)
    assert describe(path).startswith(f"n/a ({path}: ")


def good_doc(**changes) -> dict:
    band = {"value": 0.5, "low": 0.4, "high": 0.6}
    doc = {"version": 1, "inputs_sha256": "a" * 64, "profile": "local", "made_at": "2026-11-29T10:00:00+00:00",
           "available": True, "message": "prediction from the calibration file", "layout": "ddp",
           "step_s": band, "tokens_per_s": {"value": 16384.0, "low": 13653.3, "high": 20480.0},
           "wall_s": {"value": 50.0, "low": 40.0, "high": 60.0}, "device_hours": {"value": 0.0278, "low": 0.0222, "high": 0.0333},
           "cost": None, "device_kind": "cpu", "devices": 2, "max_steps": 100, "price_per_device_hour": None,
           "tokens_per_step": 8192, "flops_per_token": 6529536,
           "calibration": {"accelerator": "cpu", "layout": "ddp", "value": 5e10, "origin": "file", "note": ""},
           "calibration_file": "/tmp/cal.yaml"}
    return doc | changes


@pytest.mark.parametrize(("changes", "why"), [
    ({"step_s": {"value": -1.0, "low": -2.0, "high": 1.0}}, "step_s: every figure must be a finite number above 0"),
    ({"wall_s": {"value": 5.0, "low": 6.0, "high": 7.0}}, "wall_s: low <= value <= high"),
    ({"tokens_per_s": {"value": 1e999, "low": 1.0, "high": 2.0}}, "Infinity is not a number JSON allows"),
    ({"cost": "12 dollars"}, r"cost: expected \{value, low, high\}"),
    ({"message": TOO_LONG}, "message: longer than 1000 characters"),
    ({"layout": 7}, "layout: expected text"),
    ({"available": "yes"}, "available: expected true or false"),
    ({"step_s": None}, "available is true but step_s"),
    ({"max_steps": -3}, "max_steps: expected a whole number above 0"),
    ({"price_per_device_hour": float("nan")}, "NaN is not a number"),
    ({"device_kind": "tpu"}, "device_kind: expected gpu or cpu"),
    ({"calibration": {"note": TOO_LONG}}, "calibration.note: longer than 1000"),
    ({"calibration": [1]}, "calibration: expected the calibration row used"),
])
def test_hostile_values_in_a_prediction_file_are_refused_naming_the_field(tmp_path, changes, why):
    path = tmp_path / PREDICTION_FILE
    path.write_text(json.dumps(good_doc(**changes)))
    with pytest.raises(ConfigError, match=why) as info:
        read_prediction(path)
    assert info.value.location == str(path) and "\n" not in info.value.message and "\x1b" not in info.value.message


def summary(**changes) -> dict:
    base = {"tokens_per_s_steady": 12288.0, "tokens_per_step": 8192, "wall_time_s": 75.0, "resumed_from": None,
            "usage": {"unit": "CPU-hours", "devices": 2, "cpu_hours": 0.041667, "cost": None}}
    return base | changes


def test_the_summary_block_holds_prediction_measurement_and_their_ratio(tmp_path):
    spec = tmp_path / SPEC_FILE
    (tmp_path / PREDICTION_FILE).write_text(json.dumps(good_doc()))
    block = summary_block(spec, summary(), "a" * 64)
    assert block["predicted"]["step_s"] == {"value": 0.5, "low": 0.4, "high": 0.6} and block["layout"] == "ddp"
    # measured step: 8,192 tokens / 12,288 tokens/s = 0.6667 s; predicted 0.5 s
    assert block["measured"]["step_s"] == pytest.approx(0.666667) and block["measured"]["tokens_per_s"] == 12288.0
    assert block["measured_over_predicted"] == {"step_s": 1.333, "tokens_per_s": 0.75, "wall_s": 1.5,
                                                "device_hours": pytest.approx(1.499, abs=1e-3), "cost": None}
    assert block["calibration"]["origin"] == "file" and block["file"] == str(tmp_path / PREDICTION_FILE)
    json.dumps(block, allow_nan=False)  # summary.json stays strict JSON
    # a resumed start did only part of the steps: its wall time and device-hours are not compared
    resumed = summary_block(spec, summary(resumed_from="/x/last.ckpt"), "a" * 64)["measured_over_predicted"]
    assert resumed["step_s"] == 1.333 and resumed["wall_s"] is None and resumed["device_hours"] is None
    # a prediction made for other inputs (the directory rendered again after the submit) is not compared
    other = summary_block(spec, summary(), "b" * 64)
    assert set(other) == {"file", "error"} and "made for other inputs" in other["error"]
    assert summary_block(tmp_path / "elsewhere" / SPEC_FILE, summary(), "a" * 64) is None  # no file: null


def test_a_hostile_prediction_file_loses_only_the_comparison(tmp_path):
    (tmp_path / PREDICTION_FILE).write_bytes(b'{"version": 1, "step_s": {"value": NaN}}')
    block = summary_block(tmp_path / SPEC_FILE, summary(), "a" * 64)
    assert set(block) == {"file", "error"} and str(tmp_path / PREDICTION_FILE) in block["error"]
    (tmp_path / PREDICTION_FILE).write_text(json.dumps(good_doc(message=TOO_LONG)))
    assert "longer than 1000" in summary_block(tmp_path / SPEC_FILE, summary(), "a" * 64)["error"]


def test_a_300_byte_message_with_control_characters_is_shown_escaped(tmp_path):
    path = tmp_path / PREDICTION_FILE
    path.write_text(json.dumps(good_doc(available=False, message=HOSTILE_300, layout=HOSTILE_300)))
    line = describe(path)
    assert line.startswith("x" * 150 + "\\n\\x1b[31m'\"") and "\n" not in line and "\x1b" not in line


def test_measured_figures_ignore_values_that_are_not_finite_and_positive():
    got = measured_figures({"tokens_per_s_steady": float("nan"), "tokens_per_step": -5, "wall_time_s": "long",
                            "usage": "not a dict"})
    assert got == dict.fromkeys(("step_s", "tokens_per_s", "wall_s", "device_hours", "cost"))
    assert compare(good_doc(), got, whole_run=True) == dict.fromkeys(got)


def write_summary(path: Path, ratios: object, **extra) -> Path:
    path.write_text(json.dumps({"wall_time_s": 1.0, "prediction": {"available": True, "measured_over_predicted": ratios, **extra}}))
    return path


def test_ls_reads_the_ratio_back_and_refuses_hostile_summaries_naming_the_file(tmp_path):
    good = write_summary(tmp_path / "summary.json", {"step_s": 1.25, "tokens_per_s": 0.8, "wall_s": None})
    block, note = ratio_of_summary(good)
    assert note is None and block["measured_over_predicted"]["step_s"] == 1.25 and block["available"]
    assert ratio_of_summary(tmp_path / "missing.json") == (None, None)  # not finished, or not readable from here
    (tmp_path / "old.json").write_text('{"wall_time_s": 1}')
    assert ratio_of_summary(tmp_path / "old.json") == (None, None)  # a summary from before predictions
    bad = {
        "nan.json": b'{"prediction": {"measured_over_predicted": {"step_s": NaN}}}',
        "negative.json": json.dumps({"prediction": {"measured_over_predicted": {"step_s": -2}}}).encode(),
        "string.json": json.dumps({"prediction": {"measured_over_predicted": {"step_s": HOSTILE_300}}}).encode(),
        "list.json": json.dumps({"prediction": {"measured_over_predicted": [1]}}).encode(),
        "error.json": json.dumps({"prediction": {"file": "p", "error": HOSTILE_300 * 2}}).encode(),
        "bytes.json": b"\xff\xfe{",
        "array.json": b"[]",
    }
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
        block, note = ratio_of_summary(tmp_path / name)
        assert block is None and note.startswith(str(tmp_path / name)), (name, note)
        assert "\n" not in note and "\x1b" not in note and len(note) < 400, (name, note)


def test_a_refused_submit_of_a_job_directory_leaves_its_prediction_as_it_was(tmp_path):
    job_dir = local_job(tmp_path)
    undo = DirUndo.capture(job_dir)
    (job_dir / PREDICTION_FILE).write_text("{}")
    undo.restore_prediction()
    assert not (job_dir / PREDICTION_FILE).exists()
    (job_dir / PREDICTION_FILE).write_text("before")
    undo = DirUndo.capture(job_dir)
    (job_dir / PREDICTION_FILE).write_text("after")
    undo.undo()
    assert (job_dir / PREDICTION_FILE).read_text() == "before"


@pytest.mark.parametrize("example", ["command-ddp.yaml", "usercode.yaml"])
def test_specs_whose_flops_the_model_does_not_know_have_no_figures(tmp_path, calibrated, example):
    job_dir = tmp_path / "job"
    api.plan_job(EXAMPLES / example, "local").write(job_dir)
    doc = predict_spec(read_resolved_spec(job_dir), load_profile("local", PROFILES))
    assert not doc["available"] and doc["step_s"] is None and "built-in and Hugging Face models only" in doc["message"]


def test_deeply_nested_json_is_refused_not_a_recursion_error(tmp_path):
    path = tmp_path / PREDICTION_FILE
    path.write_text("[" * 30000 + "]" * 30000)
    with pytest.raises(ConfigError, match="not a prediction file"):
        read_prediction(path)
    summary_path = tmp_path / "summary.json"
    summary_path.write_text("[" * 100000 + "]" * 100000)
    assert ratio_of_summary(summary_path)[0] is None


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=40)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)), max_leaves=20)
prediction_docs = st.fixed_dictionaries({}, optional={key: json_values for key in good_doc()}) | st.builds(
    lambda changes: good_doc(**changes), st.dictionaries(st.sampled_from(sorted(good_doc())), json_values, max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=prediction_docs)
def test_any_prediction_file_reads_clean_or_is_refused_and_the_summary_block_never_raises(tmp_path, doc):
    path = tmp_path / PREDICTION_FILE
    path.write_text(json.dumps(doc))
    try:
        checked = read_prediction(path)
    except ConfigError as exc:
        assert exc.location == str(path)
    else:
        for name in ("step_s", "tokens_per_s", "wall_s", "device_hours", "cost"):
            band = checked[name]
            assert band is None or 0 < band["low"] <= band["value"] <= band["high"] < float("inf")
    block = summary_block(tmp_path / SPEC_FILE, summary(), str(doc.get("inputs_sha256")))
    json.dumps(block, allow_nan=False)
    summary_path = tmp_path / "summary.json"
    summary_path.write_text(json.dumps({"prediction": doc}))
    shown, note = ratio_of_summary(summary_path)
    assert shown is None or all(v is None or 0 < v < float("inf") for v in shown["measured_over_predicted"].values())
