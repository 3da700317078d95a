"""The time model of `jobgen plan` (jobgen/planning/time_model.py): each layout's collectives
against hand-computed volumes for a tiny configuration, the overlap rule, the band, the ranking,
and the plan's prediction (text and -o json) with and without a calibration."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from jobgen.cli import cli
from jobgen.planning.calibration import CalibrationFile, CalibrationRow, dumps
from jobgen.planning.estimate import Layout
from jobgen.planning.flops import shape_flops_per_token
from jobgen.planning.time_model import (
    Band,
    Link,
    RowPrediction,
    TimePlan,
    Workload,
    collectives,
    exposed_comm_s,
    predict,
    rank,
)
from tests.conftest import EXAMPLES

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
PSI = 1000  # trainable parameters of the tiny configuration


def bus(layout: Layout, precision: str = "bf16-mixed", nodes: int = 1, per_node: int = 4) -> list[tuple[str, str, float, int]]:
    return [(c.kind, c.over, c.bus_bytes(), c.ranks) for c in collectives(layout, PSI, precision, nodes, per_node)]


def test_each_layouts_collective_bytes_match_hand_computed_volumes():
    # 4 ranks, bf16-mixed: 16-bit parameters/gradients on the wire (2 bytes), DDP's fp32 gradients (4 bytes)
    # all-reduce S x 2(n-1)/n; all-gather / reduce-scatter S x (n-1)/n (nccl-tests' busbw)
    assert bus(Layout("ddp")) == [("all_reduce", "world", 4000 * 2 * 3 / 4, 4)]
    assert bus(Layout("fsdp", "FULL_SHARD")) == [("all_gather", "world", 1500, 4), ("all_gather", "world", 1500, 4),
                                                  ("reduce_scatter", "world", 1500, 4)]
    assert bus(Layout("fsdp", "SHARD_GRAD_OP")) == [("all_gather", "world", 1500, 4), ("reduce_scatter", "world", 1500, 4)]
    assert bus(Layout("fsdp", "NO_SHARD")) == bus(Layout("ddp"))
    # HYBRID_SHARD on 2 nodes x 2: sharded within the node (group 2), gradient shards all-reduced across nodes
    assert bus(Layout("fsdp", "HYBRID_SHARD"), nodes=2, per_node=2) == [
        ("all_gather", "intra", 1000, 2), ("all_gather", "intra", 1000, 2), ("reduce_scatter", "intra", 1000, 2),
        ("all_reduce", "inter", 1000, 2)]
    zero12 = [("reduce_scatter", "world", 1500, 4), ("all_gather", "world", 1500, 4)]
    assert bus(Layout("deepspeed_stage_1")) == bus(Layout("deepspeed_stage_2")) == zero12
    assert bus(Layout("deepspeed_stage_3")) == [("all_gather", "world", 1500, 4), ("all_gather", "world", 1500, 4),
                                                 ("reduce_scatter", "world", 1500, 4)]
    # optimizer offload: the fp32 gradient partition out (4 x 1000 / 4) and the 16-bit one back (2 x 1000 / 4)
    assert bus(Layout("deepspeed_stage_2", offload_optimizer="cpu"))[2:] == [("pcie", "pcie", 1000, 1), ("pcie", "pcie", 500, 1)]
    assert bus(Layout("deepspeed_stage_3", offload_optimizer="cpu", offload_params="cpu"))[-1] == ("pcie", "pcie", 1000, 1)
    assert bus(Layout("fsdp", "FULL_SHARD", offload_params="cpu"))[-2:] == [("pcie", "pcie", 2000, 1), ("pcie", "pcie", 500, 1)]
    # fp32: 4-byte parameters on the wire; one rank: nothing to communicate
    assert bus(Layout("fsdp", "SHARD_GRAD_OP"), "32-true") == [("all_gather", "world", 3000, 4), ("reduce_scatter", "world", 3000, 4)]
    assert bus(Layout("ddp"), per_node=1) == [] and bus(Layout("deepspeed_stage_3"), per_node=1) == []


def test_collectives_beyond_the_compute_they_overlap_are_exposed():
    link = Link(1.0, None, 1.0, 1, ())  # 1 GB/s: bus bytes / 1e9 seconds
    ddp = 6000 / 1e9
    assert exposed_comm_s(collectives(Layout("ddp"), PSI, "bf16-mixed", 1, 4), link, 0.0) == pytest.approx(ddp)
    # the gradient all-reduce overlaps backward, 2/3 of the compute
    assert exposed_comm_s(collectives(Layout("ddp"), PSI, "bf16-mixed", 1, 4), link, 1.5 * ddp) == pytest.approx(0.0)
    assert exposed_comm_s(collectives(Layout("ddp"), PSI, "bf16-mixed", 1, 4), link, 0.75 * ddp) == pytest.approx(ddp / 2)
    # ZeRO-2's parameter all-gather after the step overlaps nothing
    assert exposed_comm_s(collectives(Layout("deepspeed_stage_2"), PSI, "bf16-mixed", 1, 4), link, 1.0) == pytest.approx(1500 / 1e9)
    # FSDP: gathers and the reduce-scatter together overlap the whole compute
    assert exposed_comm_s(collectives(Layout("fsdp"), PSI, "bf16-mixed", 1, 4), link, 3000 / 1e9) == pytest.approx(1500 / 1e9)
    # the band's high end: half the bandwidth
    assert exposed_comm_s(collectives(Layout("deepspeed_stage_2"), PSI, "bf16-mixed", 1, 4), link, 1.0, 2.0) == pytest.approx(3000 / 1e9)


def cpu_file(value: float, runs: int = 1, low: float | None = None, high: float | None = None) -> CalibrationFile:
    return CalibrationFile(rows=(CalibrationRow(accelerator="cpu", dtype="fp32", layout="ddp", size="<10M",
                                                flops_per_s_per_core=value, low=low, high=high, runs=runs),))


def test_a_cpu_prediction_is_the_calibrated_flops_per_core_times_the_cores():
    link = Link(1.0, None, None, 1, ())
    p = predict(Layout("ddp"), Workload(flops_per_token=6_529_536, tokens_per_step=8192, trainable=858_880, n_params=858_880,
                precision="32-true", accelerator="cpu", num_nodes=1, devices_per_node=2, link=link, cal=cpu_file(1e10),
                max_steps=600, cores_per_rank=1, cpus_per_node=2))
    compute = 8192 * 6_529_536 / 2e10
    assert p.compute_s.value == pytest.approx(compute) and p.comm_s.value == 0.0  # 3.4 MB at 1 GB/s hides in backward
    assert p.tokens_per_s.value == pytest.approx(2e10 / 6_529_536)
    # one run: a +-20% band on the rate; low/high ordered for every figure
    assert p.tokens_per_s.low == pytest.approx(0.8 * p.tokens_per_s.value)
    assert p.tokens_per_s.high == pytest.approx(1.2 * p.tokens_per_s.value)
    for band in (p.step_s, p.tokens_per_s, p.wall_s, p.device_hours):
        assert band.low <= band.value <= band.high
    assert p.wall_s.value == pytest.approx(600 * p.step_s.value) and p.device_hours.value == pytest.approx(2 * 600 * p.step_s.value / 3600)
    assert p.cost is None  # CPU: no GPU-hour price
    # a row of several runs: its smallest and largest are the band
    spread = predict(Layout("ddp"), Workload(flops_per_token=6_529_536, tokens_per_step=8192, trainable=858_880, n_params=858_880,
                     precision="32-true", accelerator="cpu", num_nodes=1, devices_per_node=2, link=link,
                     cal=cpu_file(1e10, 3, 0.9e10, 1.3e10), cores_per_rank=1, cpus_per_node=2))
    assert spread.tokens_per_s.low == pytest.approx(1.8e10 / 6_529_536) and spread.tokens_per_s.high == pytest.approx(2.6e10 / 6_529_536)
    assert spread.wall_s is None  # no max_steps


def test_a_gpu_prediction_uses_the_datasheet_peak_the_seeded_mfu_and_the_price():
    link = Link(450.0, None, 64.0, 1, ())
    p = predict(Layout("ddp"), Workload(flops_per_token=2_117_431_296, tokens_per_step=8192, trainable=303_622_144,
                n_params=303_622_144, precision="bf16-mixed", accelerator="H200", num_nodes=1, devices_per_node=1, link=link,
                cal=None, max_steps=1000, price=3.0))
    row = p.lookup.row
    assert p.lookup.origin == "seed" and p.lookup.exact and row.key == ("H200", "bf16", "ddp", "100M-1B") and row.runs == 4
    assert p.tokens_per_s.value == pytest.approx(989.4e12 * row.mfu / 2_117_431_296)
    assert p.tokens_per_s.low == pytest.approx(989.4e12 * row.low / 2_117_431_296)
    assert p.cost.value == pytest.approx(p.device_hours.value * 3.0) and p.device_hours.value == pytest.approx(p.wall_s.value / 3600)


def test_flops_per_token_of_the_planned_gpt_is_the_entrypoints_count():
    from jobgen.planning.estimate import Shape

    gpt350m = Shape(24, 16, 1024, 1024, 8)
    assert gpt350m.n_params == 303_622_144
    assert shape_flops_per_token(gpt350m) == 2_117_431_296  # summary.json's flops_per_token of every gpt350m row


def fake_plan(labels_fits: list[tuple[str, bool]]) -> SimpleNamespace:
    rows = [SimpleNamespace(estimate=SimpleNamespace(layout=Layout(*label.split(":"))), fits=fits) for label, fits in labels_fits]
    return SimpleNamespace(rows=rows)


def fake_time(steps: dict[str, tuple[float, float, float]]) -> TimePlan:
    rows = {label: RowPrediction(Layout(*label.split(":")), Band(*s), Band(0, 0, 0), Band(*s), Band(1, 1, 1), None, None, None,
                                 None, ()) for label, s in steps.items()}  # type: ignore[arg-type]
    return TimePlan(rows, 1, 1, None, 1, "GPU", None, "x", False, False, None, "")


def test_the_recommendation_is_the_fastest_layout_that_fits_beyond_the_bands():
    mp = fake_plan([("ddp", False), ("fsdp:FULL_SHARD", True), ("fsdp:SHARD_GRAD_OP", True)])
    guide = Layout("fsdp", "FULL_SHARD")
    # SHARD_GRAD_OP clearly faster (its high end below FULL_SHARD's low end); ddp fastest but does not fit
    clear = fake_time({"ddp": (0.1, 0.1, 0.1), "fsdp:FULL_SHARD": (2.0, 1.8, 2.2), "fsdp:SHARD_GRAD_OP": (1.0, 0.9, 1.1)})
    chosen, lines = rank(mp, clear, guide)
    assert chosen == Layout("fsdp", "SHARD_GRAD_OP") and "beyond both bands -> recommended" in lines[-1]
    assert lines[0].index("fsdp:SHARD_GRAD_OP") < lines[0].index("fsdp:FULL_SHARD") and "ddp" not in lines[0]
    # bands overlap: the strategy guide's pick stays
    close = fake_time({"fsdp:FULL_SHARD": (2.0, 1.6, 2.4), "fsdp:SHARD_GRAD_OP": (1.9, 1.5, 2.3)})
    chosen, lines = rank(mp, close, guide)
    assert chosen == guide and "the guide's pick stays" in lines[-1]
    # no prediction: the guide's pick, no lines
    assert rank(mp, fake_time({}), guide) == (guide, [])


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="jobgen")


def test_plan_on_a_cpu_profile_without_calibration_says_it_has_none(monkeypatch, tmp_path):
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(tmp_path / "none.yaml"))
    result = invoke("plan", QUICKSTART, "-p", "local", "-o", "json")
    assert result.exit_code == 0, result.output
    pred = json.loads(result.stdout)["prediction"]
    assert pred["available"] is False and pred["rows"] == [] and pred["calibration_file_found"] is False
    assert "no prediction" in pred["message"] and "jobgen calibrate" in pred["message"]
    text = invoke("plan", QUICKSTART, "-p", "local").stdout
    assert "time: no prediction: no calibration file" in text and "tokens/s" not in text


def test_plan_json_prediction_fields_and_a_calibrated_cpu_row(monkeypatch, tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text(dumps(cpu_file(5e10, 2, 4e10, 6e10)))
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(path))
    result = invoke("plan", QUICKSTART, "-p", "local", "-o", "json", "--set", "trainer.max_steps=100")
    assert result.exit_code == 0, result.output
    pred = json.loads(result.stdout)["prediction"]
    assert set(pred) == {"available", "message", "flops_per_token", "tokens_per_step", "max_steps", "devices", "device_kind",
                         "price_per_device_hour", "calibration_file", "calibration_file_found", "calibration_file_from_profile",
                         "bandwidth", "rows"}
    assert pred["available"] and pred["tokens_per_step"] == 16 * 256 * 2 and pred["flops_per_token"] == 6_529_536
    ddp = next(r for r in pred["rows"] if r["layout"] == "ddp")
    assert set(ddp) == {"layout", "step_s", "compute_s", "comm_s", "tokens_per_s", "wall_s", "device_hours", "cost", "calibration",
                        "collectives"}
    assert ddp["tokens_per_s"]["value"] == pytest.approx(2 * 5e10 / 6_529_536, rel=1e-5)
    assert ddp["tokens_per_s"]["low"] == pytest.approx(2 * 4e10 / 6_529_536, rel=1e-5)
    assert ddp["calibration"]["origin"] == "file" and ddp["calibration"]["runs"] == 2 and ddp["calibration"]["exact"]
    assert ddp["wall_s"]["value"] == pytest.approx(100 * ddp["step_s"]["value"], rel=1e-5) and ddp["cost"] is None
    fsdp = next(r for r in pred["rows"] if r["layout"] == "fsdp:FULL_SHARD")
    assert not fsdp["calibration"]["exact"] and "layout family differs" in fsdp["calibration"]["note"]
    text = invoke("plan", QUICKSTART, "-p", "local", "--set", "trainer.max_steps=100").stdout
    assert "calibration rows used: cpu fp32 ddp <10M: 50.00 GFLOP/s per core (2 runs" in text and str(path) in text


def test_plan_on_a_gpu_profile_without_a_file_uses_the_seeded_table(monkeypatch, tmp_path):
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(tmp_path / "none.yaml"))
    result = invoke("plan", QUICKSTART, "-p", "slurm-h100", "-o", "json")
    pred = json.loads(result.stdout)["prediction"]
    assert pred["available"] and "seeded table only" in pred["message"]
    assert all(r["calibration"]["origin"] == "seed" for r in pred["rows"])
    assert pred["bandwidth"]["intra_node_gb_per_s"] == 450


def test_a_calibration_file_the_profile_names_but_nobody_wrote_yet_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    profile = tmp_path / "site.yaml"
    profile.write_text("scheduler: slurm\ngpus_per_node: 8\ncpus_per_node: 64\nmem_gib_per_node: 512\ngpu_type: H100\n"
                       "calibration: team/cal.yaml\nslurm: {partition: gpu}\n")
    pred = json.loads(invoke("plan", QUICKSTART, "-p", str(profile), "-o", "json").stdout)["prediction"]
    assert pred["calibration_file_from_profile"] and pred["calibration_file"] == "team/cal.yaml"
    assert "the profile's calibration file team/cal.yaml does not exist yet" in pred["message"] and pred["available"]
