"""The entrypoint's GPU speed levers (jobgen.train.speed, issue 21), tested on CPU: each lever is
chosen by the function the GPU path calls, with the device query faked, and the CPU path stays
as it was (no lever on). Plus the hot loop's host-device synchronisation, counted by a spy."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from jobgen.specs.trainer import TrainerSpec
from jobgen.train import speed
from tests.conftest import require

require("lightning", "lightning not installed (pip install -e .[train])")


# --- TF32 -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("accelerator", "capability", "expected"), [
    ("gpu", (9, 0), "high"),   # H100
    ("gpu", (8, 0), "high"),   # A100: the first with TF32
    ("gpu", (8, 6), "high"),   # A10G
    ("gpu", (7, 5), None),     # T4: no TF32 tensor cores
    ("gpu", (7, 0), None),     # V100
    ("gpu", None, None),       # no CUDA device visible
    ("cpu", None, None),
])  # fmt: skip
def test_tf32_only_on_ampere_and_newer(accelerator, capability, expected) -> None:
    assert speed.matmul_precision(accelerator, capability) == expected


def test_the_entrypoint_sets_tf32_from_the_faked_device_query(monkeypatch) -> None:
    from jobgen.train import run

    resolved = SimpleNamespace(spec=SimpleNamespace(trainer=TrainerSpec(), model=SimpleNamespace(is_hf=False),
                                                    user_code=None),
                               launch=SimpleNamespace(accelerator="gpu"))  # fmt: skip
    monkeypatch.setattr(speed, "cuda_capability", lambda: (9, 0))
    levers = run._speed_levers(resolved)
    assert levers == {"compile": True, "matmul_precision": "high", "pin_memory": True}
    monkeypatch.setattr(speed, "cuda_capability", lambda: (7, 0))
    assert run._speed_levers(resolved)["matmul_precision"] is None
    resolved.launch.accelerator = "cpu"
    monkeypatch.setattr(speed, "cuda_capability", lambda: pytest.fail("a CPU launch queried the GPU"))
    assert run._speed_levers(resolved) == {"compile": False, "matmul_precision": None, "pin_memory": False}


# --- torch.compile ----------------------------------------------------------------------------

@pytest.mark.parametrize(("trainer", "accelerator", "hf", "expected"), [
    ({}, "gpu", False, True),                                   # auto: the built-in GPT under ddp on a GPU
    ({}, "cpu", False, False),                                  # auto: CPU quickstart unchanged
    ({"compile": False}, "gpu", False, False),                  # the switch turns it off
    ({"compile": True}, "cpu", False, True),                    # and on, where the user asks
    ({"strategy": "fsdp"}, "gpu", False, False),                # auto: not under FSDP
    ({"strategy": "fsdp", "compile": True}, "gpu", False, True),
    ({"strategy": "deepspeed_stage_2"}, "gpu", False, False),   # auto: DeepSpeed wraps the module
    ({"precision": "transformer-engine"}, "gpu", False, False),
    ({}, "gpu", True, False),                                   # auto: Hugging Face models stay eager
    ({"compile": True}, "gpu", True, True),
])  # fmt: skip
def test_compile_switch(trainer, accelerator, hf, expected) -> None:
    assert speed.compile_on(TrainerSpec(**trainer), accelerator, hf_model=hf, user_code=False) is expected


def test_compile_auto_is_the_default_and_stays_out_of_spec_json() -> None:
    t = TrainerSpec()
    assert t.compile == "auto"
    assert "compile" not in t.model_dump()  # resolved spec files of specs without it are unchanged
    assert TrainerSpec(compile=False).model_dump()["compile"] is False
    # auto with DeepSpeed is allowed (it resolves to off); an explicit true is still refused
    assert TrainerSpec(strategy="deepspeed_stage_2").compile == "auto"
    with pytest.raises(ValueError, match="compile with 'deepspeed_stage_2'"):
        TrainerSpec(strategy="deepspeed_stage_2", compile=True)


# --- fused AdamW ------------------------------------------------------------------------------

def _fake_params(device: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(device=torch.device(device)) for _ in range(3)]


def test_fused_adamw_only_when_every_parameter_is_on_cuda_outside_deepspeed() -> None:
    assert speed.fused_adamw(_fake_params("cuda"), deepspeed=False) is True
    assert speed.fused_adamw([{"params": _fake_params("cuda")}, {"params": []}], deepspeed=False) is True
    assert speed.fused_adamw(_fake_params("cuda"), deepspeed=True) is False  # ZeRO owns the optimizer
    assert speed.fused_adamw(_fake_params("cpu"), deepspeed=False) is False  # CPU ranks, FSDP CPU offload
    assert speed.fused_adamw(_fake_params("cuda") + _fake_params("cpu"), deepspeed=False) is False
    assert speed.fused_adamw([], deepspeed=False) is False
    # clipping under Lightning's MixedPrecision: it refuses optimizers that unscale themselves
    assert speed.fused_adamw(_fake_params("cuda"), deepspeed=False, amp_clipping=True) is False


def test_configure_optimizers_passes_fused_from_the_parameters_device(monkeypatch) -> None:
    from jobgen.train.model import LitGPT

    module = LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8)
    made: list[dict] = []
    real = torch.optim.AdamW

    def spy(params, **kwargs):  # noqa: ANN001
        made.append(dict(kwargs))
        kwargs.pop("fused", None)  # CPU tensors: build the real (unfused) optimizer
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    module.configure_optimizers()
    assert "fused" not in made[-1]  # CPU: exactly the call of before
    monkeypatch.setattr("jobgen.train.speed.fused_adamw", lambda params, deepspeed, amp_clipping: not deepspeed)  # "on CUDA"
    module.configure_optimizers()
    assert made[-1]["fused"] is True


def test_fused_adamw_never_meets_lightnings_clipping_refusal(monkeypatch) -> None:
    """Seen on an H200 (gpu_suite gpt124m-bf16, llama7b-qlora-ddp): under ``bf16-mixed`` with
    ``gradient_clip_val`` Lightning's MixedPrecision plugin refuses any optimizer that unscales
    itself ("does not allow for gradient clipping ... Are you using a 'fused' optimizer?"), loss
    scaling or not. Reproduced on CPU: a real fit, bf16-mixed, clipping on, with the lever's
    device rule widened to CPU tensors (torch's fused AdamW runs on CPU too)."""
    import lightning as L

    from jobgen.train.model import LitGPT

    real = speed.fused_adamw
    monkeypatch.setattr(speed, "fused_adamw", lambda params, **kw: real(
        [SimpleNamespace(device=torch.device("cuda")) for _ in [0]], **kw))  # "every parameter on CUDA"
    made: list[dict] = []
    adamw = torch.optim.AdamW

    def spy(params, **kwargs):  # noqa: ANN001
        made.append(dict(kwargs))
        return adamw(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    module = LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8, max_steps=2)
    data = [torch.randint(0, 256, (2, 9)) for _ in range(2)]
    loader = torch.utils.data.DataLoader([(x[:, :-1][0], x[:, 1:][0]) for x in data], batch_size=1)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", gradient_clip_val=1.0, max_steps=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader)
    assert made and "fused" not in made[-1]  # clipping under mixed precision: the unfused optimizer
    # without clipping the same run takes the fused one
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", max_steps=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8, max_steps=2), train_dataloaders=loader)
    assert made[-1].get("fused") is True


# --- pinned memory ----------------------------------------------------------------------------

def test_loaders_pin_memory_only_on_gpus(tmp_path: Path) -> None:
    import numpy as np

    from jobgen.train.data import ByteTextDataModule, TrainWindows, ValWindows

    assert speed.pin_memory("gpu") is True and speed.pin_memory("cpu") is False
    data = np.arange(1000, dtype=np.uint8)
    for pin in (False, True):
        dm = ByteTextDataModule(None, tmp_path, block_size=8, micro_batch_size=2, gradient_accumulation_steps=1,  # type: ignore[arg-type]
                                world_size=1, max_steps=4, val_fraction=0.1, val_batches=1, seed=0, pin_memory=pin)
        dm.train_set, dm.val_set = TrainWindows(data, 8, 0, 8), ValWindows(data, 8, 2)
        assert dm.train_dataloader().pin_memory is pin and dm.val_dataloader().pin_memory is pin


# --- no host-device synchronisation per step --------------------------------------------------

SYNC_METHODS = ("item", "__float__", "__int__", "__bool__", "tolist")


@pytest.mark.parametrize("tty", [False, True], ids=["job-log-lines", "terminal-bar"])
def test_the_hot_loop_reads_tensors_on_the_host_only_at_log_intervals(tmp_path: Path, monkeypatch, tty: bool) -> None:
    """Every Tensor.item / float() / int() / bool() / tolist() of a training step and every
    torch.cuda.synchronize is counted, with the global step at the time. On a GPU each such read of
    a device tensor waits for the device; allowed only at log steps (every log_every_n_steps, and
    the last). torch's single-tensor AdamW reads its step counter, a host tensor (the fused AdamW
    chosen on CUDA keeps it on the device and reads nothing): calls from torch.optim are not
    counted."""
    from jobgen.jobdir import load_resolved_spec
    from jobgen.train import run
    from jobgen.train.__main__ import check_data
    from jobgen.train.callbacks import Throughput
    from tests.entrypoint.conftest import TINY_SPEC, _merge, resolved_doc

    steps, every = 12, 4
    spec = _merge(TINY_SPEC, {"trainer": {"max_steps": steps, "val_check_interval": 100, "log_every_n_steps": every},
                              "checkpoint": {"every_n_steps": 100}})  # fmt: skip
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(resolved_doc(spec, devices_per_node=1, world_size=1)))
    resolved = load_resolved_spec(path)
    sources, layout = check_data(resolved.spec)

    live: dict[str, object] = {}
    reads: list[tuple[int, str]] = []

    def counted(name: str, original):  # noqa: ANN001, ANN202
        def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN202
            trainer = live.get("trainer")
            if trainer is not None and trainer.training and not trainer.sanity_checking:
                stack = traceback.extract_stack(limit=4)[:-1]
                if not any("/torch/optim/" in frame.filename for frame in stack):
                    reads.append((trainer.global_step, name))
            return original(self, *args, **kwargs)

        return wrapper

    for name in SYNC_METHODS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    synchronize: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: synchronize.append(1))
    on_train_start = Throughput.on_train_start

    def remember(self, trainer, pl_module):  # noqa: ANN001, ANN202
        live["trainer"] = trainer
        return on_train_start(self, trainer, pl_module)

    monkeypatch.setattr(Throughput, "on_train_start", remember)
    monkeypatch.setattr("sys.stdout.isatty", lambda: tty)  # a job log (LineProgress) or a terminal (the bar)
    assert run.train(resolved, path, tmp_path / "run", sources, layout, time.time()) == 0
    from jobgen.train.callbacks import LineProgress, LogIntervalBar

    shown = LogIntervalBar if tty else LineProgress
    assert any(isinstance(cb, shown) for cb in live["trainer"].callbacks)  # type: ignore[attr-defined]

    log_steps = {s for s in range(1, steps + 1) if s % every == 0} | {steps}
    off_interval = sorted({step for step, _ in reads if step not in log_steps})
    assert not off_interval, f"host reads at steps {off_interval} (log steps {sorted(log_steps)}): {reads}"
    assert {step for step, _ in reads} >= {every}, reads  # the spy sees the log-interval reads
    assert not synchronize
