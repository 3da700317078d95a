"""benchmarks/gpu_suite.py in CPU mode: its smallest CPU row trains through jobgen submit, the GPU
rows are listed as unmeasured with the reason, and the JSON holds every selected row in order."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.slow

require("lightning", "lightning not installed (pip install -e .[train])")

REPO = Path(__file__).resolve().parents[2]
ROWS = ["llama-qlora-bf16", "cpu-gpt-fp32", "gpt124m-bf16", "llama7b-qlora-ds3", "gpt350m-fsdp-bf16"]  # not the suite's own order


def test_cpu_mode_runs_the_cpu_row_and_marks_gpu_rows_unmeasured(tmp_path: Path) -> None:
    import torch

    from tests.entrypoint.conftest import child_env

    out = tmp_path / "results"
    argv = [sys.executable, str(REPO / "benchmarks" / "gpu_suite.py"), "--cpu", "--out", str(out), "--rows", ",".join(ROWS),
            "--steps", "3"]  # fmt: skip
    proc = subprocess.run(argv, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[2/5] cpu-gpt-fp32: running 3 steps" in proc.stdout, proc.stdout  # progress lines, in the order given

    doc = json.loads((out / "gpu_suite.json").read_text())
    assert doc["mode"] == "cpu" and doc["steps"] == 3
    assert doc["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    rows = {r["name"]: r for r in doc["rows"]}
    assert [r["name"] for r in doc["rows"]] == ROWS  # the order --rows gave
    reason = "unmeasured: no CUDA device" if not torch.cuda.is_available() else "unmeasured: --cpu given"
    for name in (n for n in ROWS if n != "cpu-gpt-fp32"):
        assert rows[name]["status"] == reason, rows[name]
        assert "tokens_per_s" not in rows[name]

    cpu = rows["cpu-gpt-fp32"]
    assert cpu["status"] == "ok", cpu
    assert cpu["tokens_per_s"] > 0 and math.isfinite(cpu["final_loss"]), cpu
    assert cpu["peak_memory_kind"] == "cpu_max_rss" and cpu["mfu"] is None  # no CPU peak FLOP/s is invented
    assert cpu["planned_bytes"] > 0 and cpu["ratio"] > 0, cpu  # jobgen plan's estimate of the same spec
    summary = json.loads(Path(cpu["summary_json"]).read_text())
    assert summary["global_step"] == 3 and summary["smoke"] is True
    assert "trainer.precision=32-true" in cpu["overrides"]
    # the ceiling beside the row: the same GPT, seed, windows and batch in a plain PyTorch loop (fp32 on CPU)
    assert cpu["plain_status"] == "ok", cpu
    plain = cpu["plain"]
    assert plain["device"] == "cpu" and plain["precision"] == "32-true" and plain["steps"] == 3, plain
    assert plain["compile"] is False and plain["fused_adamw"] is False, plain
    assert cpu["plain_tokens_per_s"] > 0 and cpu["jobgen_over_plain"] == round(cpu["tokens_per_s"] / cpu["plain_tokens_per_s"], 3)
    assert math.isfinite(plain["final_loss"]), plain
    assert "cpu-gpt-fp32: plain loop ok" in proc.stdout and "jobgen / plain" in proc.stdout, proc.stdout
    assert "trainer.compile=false" in cpu["overrides"]  # rows without -compile stay eager under compile: auto
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith("cpu-gpt-fp32 ")]
    assert len(table) == 1 and table[0].endswith("  ok"), proc.stdout  # the printed table's row


def test_llama7b_rows_plan_the_example_recipe_on_a_gpu_profile(tmp_path: Path, monkeypatch) -> None:
    """The four llama7b rows' specs are the example's recipe with the row's
    strategy, and `jobgen plan` sizes each from the shipped 7B config (the weights are not built
    here: a placeholder safetensors file stands in for the random-init save)."""
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location("gpu_suite", REPO / "benchmarks" / "gpu_suite.py")
    suite = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_suite", suite)  # its dataclasses resolve their module
    spec.loader.exec_module(suite)  # type: ignore[union-attr]
    model_dir = tmp_path / "hf" / "llama-2-7b"
    model_dir.mkdir(parents=True)
    shutil.copy(REPO / "examples" / "hf-configs" / "llama-2-7b" / "config.json", model_dir)
    (model_dir / "model.safetensors").write_bytes(b"")  # llama7b_spec builds nothing when weights are present
    gpu = {"count": 1, "name": "NVIDIA H100 80GB HBM3", "gpu_type": "H100", "mem_gib": 79.1}
    profile = suite.write_profile(tmp_path, gpu)
    path = suite.spec_file(tmp_path, "llama7b")
    doc = json.loads(path.read_text())
    assert doc["model"]["hf_path"] == str(model_dir) and doc["model"]["load_in_4bit"] is True
    assert doc["model"]["lora"]["r"] == 64 and len(doc["model"]["lora"]["target_modules"]) == 7
    assert (doc["model"]["block_size"], doc["trainer"]["micro_batch_size"], doc["trainer"]["gradient_accumulation_steps"]) == (2048, 4, 4)
    rows = [r for r in suite.ROWS if r.model == "llama7b"]
    assert [r.strategy for r in rows] == ["ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3"]
    for row in rows:
        sets = [*row.overrides(), "resources.devices_per_node=1"]
        planned, note, _ = suite.planned_bytes(path, profile, sets)
        assert note is None and planned is not None and 4 * 2**30 < planned < 79 * 2**30, (row.name, note, planned)
