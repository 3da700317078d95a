"""What the entrypoint measures: FLOPs per token, MFU, peak memory, curves.png, TensorBoard.

The arithmetic is checked at unit level (no training); one real 2-process run on CPU checks
that the summary carries the measurements, that curves.png is a PNG and that TensorBoard
event files are written when ``trainer.tensorboard`` is on.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from jobgen.specs.training import TrainingSpec
from jobgen.train import measure
from jobgen.train.callbacks import Throughput
from tests.entrypoint.conftest import TINY_SPEC

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _gpt_spec(n_layer: int, n_head: int, d_model: int, block_size: int) -> TrainingSpec:
    return TrainingSpec.model_validate(
        {"name": "m", "model": {"preset": None, "n_layer": n_layer, "n_head": n_head, "d_model": d_model,
                                "block_size": block_size}}
    )  # fmt: skip


def test_gpt_flops_per_token_is_6n_plus_attention_by_hand() -> None:
    n_layer, d, t, vocab = 3, 48, 32, 256
    spec = _gpt_spec(n_layer, 4, d, t)
    # N by hand: token embedding (tied output matmul), blocks (qkv+proj 4d^2+4d, mlp 8d^2+5d,
    # two LayerNorms 4d), final LayerNorm 2d; the position embedding (t x d) is a lookup only.
    n = vocab * d + n_layer * (12 * d * d + 13 * d) + 2 * d
    assert measure.gpt_matmul_params(spec) == n
    assert measure.gpt_flops_per_token(spec) == 6 * n + 12 * n_layer * d * t
    # ... and the parameter count agrees with the real module.
    from jobgen.train.model import GPT

    model = GPT(n_layer, 4, d, t)
    assert sum(p.numel() for p in model.parameters()) - t * d == n


class _FakeConfig:
    num_hidden_layers = 2
    hidden_size = 8


class _FakeLM(torch.nn.Module):
    """An HF-shaped LM: embeddings tied to the output head, one frozen and one trainable Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.config = _FakeConfig()
        self.embed = torch.nn.Embedding(20, 8)
        self.pos = torch.nn.Embedding(16, 8)
        self.base = torch.nn.Linear(8, 8)  # frozen: 72 parameters
        self.adapter = torch.nn.Linear(8, 2, bias=False)  # trainable: 16 parameters
        self.head = torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight
        for p in self.base.parameters():
            p.requires_grad_(False)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


def test_hf_flops_count_frozen_weights_at_4_and_skip_lookups() -> None:
    model = _FakeLM()
    trainable = 20 * 8 + 8 * 2  # the tied embedding/head and the adapter
    frozen = 8 * 8 + 8
    assert measure.hf_flops_per_token(model, block_size=16) == 6 * trainable + 4 * frozen + 12 * 2 * 8 * 16
    model.config = object()  # no sizes: unknown, not a guess
    assert measure.hf_flops_per_token(model, block_size=16) is None


def test_peak_flops_table_dtype_and_cpu() -> None:
    assert measure.peak_flops_per_s("A100", "bf16-mixed") == 312e12
    assert measure.peak_flops_per_s("H100", "bf16-true") == 989.4e12
    assert measure.peak_flops_per_s("A100", "32-true", "highest") == 19.5e12
    assert measure.peak_flops_per_s("A100", "32-true", "high") == 156e12  # tf32 tensor cores
    assert measure.peak_flops_per_s("V100", "bf16-mixed") is None  # no bf16 units
    assert measure.peak_flops_per_s(None, "bf16-mixed") is None  # CPU: no invented peak
    assert measure.peak_flops_per_s("H100", "transformer-engine") == measure.peak_flops_per_s("H100", "bf16-mixed")  # fp8 vs the bf16 peak
    from typing import get_args

    from jobgen.specs.profile import GpuType

    assert set(measure.PEAK_FLOPS) == set(get_args(GpuType))


def test_mfu_arithmetic_and_null_without_peak() -> None:
    assert measure.mfu(1000.0, 6_000_000, None) is None
    assert measure.mfu(None, 6_000_000, 1e12) is None
    assert measure.mfu(1000.0, 6_000_000, 1.2e10) == pytest.approx(0.5)
    # The callback: a fake peak for 2 ranks, 10 timed steps of 256 tokens in 2 s.
    throughput = Throughput(256, samples_per_step=4, flops_per_token=1_000_000, peak_flops_per_s=2 * 640e6)
    throughput.steps_timed, throughput.seconds_timed = 10, 2.0
    assert throughput.mean_tokens_per_s == pytest.approx(1280.0)
    assert throughput.mean_samples_per_s == pytest.approx(20.0)
    assert throughput.mean_mfu == pytest.approx(1280.0 * 1_000_000 / 1280e6)
    assert Throughput(256, flops_per_token=1_000_000).mean_mfu is None  # CPU: no peak given


def test_curves_read_every_version_later_one_wins(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for version, rows in {0: [(5, 3.0), (10, 2.5), (15, 2.4)], 1: [(15, 2.2), (20, 2.0)]}.items():
        (logs / f"version_{version}").mkdir(parents=True)
        lines = ["epoch,step,train_loss,tokens_per_s"] + [f"0,{s},{v},100.0" for s, v in rows]
        (logs / f"version_{version}" / "metrics.csv").write_text("\n".join(lines) + "\n")
    assert measure._read_metrics(logs)["train_loss"] == {5: 3.0, 10: 2.5, 15: 2.2, 20: 2.0}
    png = measure.plot_curves(tmp_path)
    first = png.read_bytes()
    assert first.startswith(PNG_SIGNATURE)
    assert measure.plot_curves(tmp_path).read_bytes() == first  # same metrics, same bytes


@pytest.mark.slow
def test_tiny_run_reports_measurements_curves_and_tensorboard(run_entrypoint, write_spec, tmp_path: Path) -> None:
    write_spec({"trainer": {"tensorboard": True}})
    run_dir = tmp_path / "run"
    result = run_entrypoint("--spec", "spec.json", "--run-dir", str(run_dir), nproc=2, timeout=300)
    assert result.code == 0, result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    m = TINY_SPEC["model"]
    n = measure.gpt_matmul_params(_gpt_spec(m["n_layer"], m["n_head"], m["d_model"], m["block_size"]))
    assert summary["flops_per_token"] == 6 * n + 12 * m["n_layer"] * m["d_model"] * m["block_size"]
    assert summary["mfu_mean"] is None and summary["peak_flops_per_s"] is None  # CPU
    assert summary["samples_per_s_mean"] == pytest.approx(summary["tokens_per_s_mean"] / m["block_size"])
    assert summary["peak_memory_kind"] == "cpu_max_rss"
    assert summary["peak_memory_bytes"] > 50e6, summary  # torch + lightning alone are more than that
    assert "MFU n/a" in result.stdout and "peak mem" in result.stdout, result.output
    header = (run_dir / "logs" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"samples_per_s", "peak_memory_mb", "tokens_per_s"} <= set(header) and "mfu" not in header
    png = (run_dir / "curves.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", png[16:24])  # IHDR
    assert (width, height) == (800, 600)
    events = list((run_dir / "logs" / "version_0" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


class Params4bit(torch.nn.Parameter):
    """Stands in for bitsandbytes' class (matched by name): 4-bit values packed into its storage dtype."""


def test_logical_numel_unpacks_4bit_storage_of_any_dtype() -> None:
    class QuantState:
        shape = torch.Size([64, 32])

    for storage, per_element in [(torch.uint8, 2), (torch.bfloat16, 4), (torch.float32, 8)]:
        packed = Params4bit(torch.zeros(64 * 32 // per_element, 1, dtype=storage), requires_grad=False)
        assert measure.logical_numel(packed) == 64 * 32  # from the storage: numel x 2 x element size
        packed.quant_state = QuantState()
        assert measure.logical_numel(packed) == 64 * 32  # from bitsandbytes' quant state
    assert measure.logical_numel(torch.nn.Parameter(torch.zeros(3, 5))) == 15


def _drawn(monkeypatch, run_dir: Path, **kwargs) -> Any:
    """plot_curves' figure (caught as it is saved): its axes, to read what was drawn."""
    from matplotlib.figure import Figure

    caught = []
    save = Figure.savefig

    def keep(self, *args, **kw):
        caught.append(self)
        return save(self, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    measure.plot_curves(run_dir, **kwargs)
    return caught[0].axes


def _lines(ax) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.lines}


def test_curves_put_each_point_at_its_optimizer_step_and_show_a_single_point(tmp_path: Path, monkeypatch) -> None:
    """The curves are drawn over optimizer steps taken (metrics.csv's step is
    the optimizer step: the 50th step's row says 50); a smoke run's one row of each
    series was once drawn as a line of one point, which shows nothing; the loss axis says the unit the
    terminal's summary says (nats/byte for text data)."""
    smoke = tmp_path / "smoke"
    (smoke / "logs" / "version_0").mkdir(parents=True)
    # what `jobgen submit --smoke 5` wrote (log_every_n_steps 50: the last step's row only)
    (smoke / "logs" / "version_0" / "metrics.csv").write_text(
        "epoch,lr,peak_memory_mb,samples_per_s,step,tokens_per_s,train_loss,val_loss\n"
        "0,0.00097,426.1,320.5,5,20512.5,4.678,\n0,,,,5,,,4.423\n")
    loss_ax, rate_ax = _drawn(monkeypatch, smoke, loss_unit="byte")
    lines = {**_lines(loss_ax), **_lines(rate_ax)}
    for name in ("train_loss", "val_loss", "tokens_per_s"):
        assert list(lines[name].get_xdata()) == [5], name
        assert lines[name].get_marker() not in (None, "", " ", "None"), f"{name}: one point and no marker"
    assert loss_ax.get_ylabel() == "loss (nats/byte)"

    full = tmp_path / "full"
    (full / "logs" / "version_0").mkdir(parents=True)
    rows = [f"0,{s},{3.0 - s / 1000},," for s in range(10, 201, 10)] + [f"0,{s},,{2.5 - s / 1000}," for s in (50, 100, 150, 200)]
    (full / "logs" / "version_0" / "metrics.csv").write_text("epoch,step,train_loss,val_loss,tokens_per_s\n" + "\n".join(rows) + "\n")
    loss_ax, _ = _drawn(monkeypatch, full, loss_unit="token")
    assert list(_lines(loss_ax)["val_loss"].get_xdata()) == [50, 100, 150, 200]  # "every 50 steps"
    assert list(_lines(loss_ax)["train_loss"].get_xdata()) == list(range(10, 201, 10))
    assert loss_ax.get_ylabel() == "loss (nats/token)"
    loss_ax, _ = _drawn(monkeypatch, full, loss_unit=None)  # a class_path module's own loss
    assert loss_ax.get_ylabel() == "loss"
