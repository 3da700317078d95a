"""The entrypoint's GPU speed levers (jobgen.train.speed), tested on CPU: each lever is
chosen by the function the GPU path calls, with the device query faked, and the CPU path stays
as it was (no lever on). Plus the hot loop's host-device synchronisation, counted by a spy."""

from __future__ import annotations

import itertools
import json
import re
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from jobgen.errors import ConfigError
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
                               launch=SimpleNamespace(accelerator="gpu", world_size=1))  # fmt: skip
    monkeypatch.delenv("JOBGEN_LEVERS_OFF", raising=False)
    monkeypatch.setattr(speed, "cuda_capability", lambda: (9, 0))
    levers = run._speed_levers(resolved).to_json()
    on = {"single_device": False, "host_logging": True, "fused_clip": True, "off": []}
    assert levers == {"compile": True, "matmul_precision": "high", "pin_memory": True} | on
    monkeypatch.setattr(speed, "cuda_capability", lambda: (7, 0))
    assert run._speed_levers(resolved).matmul_precision is None
    monkeypatch.setenv("JOBGEN_LEVERS_OFF", "tf32,pin_memory,compile_auto")  # the before/after switches
    monkeypatch.setattr(speed, "cuda_capability", lambda: pytest.fail("tf32 off queried the GPU"))
    assert run._speed_levers(resolved).to_json() == {"compile": False, "matmul_precision": None, "pin_memory": False} | on | {
        "off": ["compile_auto", "pin_memory", "tf32"]}
    monkeypatch.setenv("JOBGEN_LEVERS_OFF", "tf23")
    with pytest.raises(ConfigError, match="unknown lever.*'tf23'"):
        run._speed_levers(resolved)
    monkeypatch.delenv("JOBGEN_LEVERS_OFF")
    resolved.launch.accelerator = "cpu"
    monkeypatch.setattr(speed, "cuda_capability", lambda: pytest.fail("a CPU launch queried the GPU"))
    assert run._speed_levers(resolved).to_json() == {"compile": False, "matmul_precision": None, "pin_memory": False} | on


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


def _fused_on_cpu(monkeypatch) -> list[dict]:
    """Widen the fused-AdamW lever's device rule to CPU tensors (torch's fused AdamW runs on CPU
    too) and record every ``torch.optim.AdamW`` call's keyword arguments."""
    real = speed.fused_adamw
    monkeypatch.setattr(speed, "fused_adamw", lambda params, **kw: real(
        [SimpleNamespace(device=torch.device("cuda")) for _ in [0]], **kw))  # "every parameter on CUDA"
    made: list[dict] = []
    adamw = torch.optim.AdamW

    def spy(params, **kwargs):  # noqa: ANN001
        made.append(dict(kwargs))
        return adamw(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    return made


def _byte_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 256, (9,), generator=gen) for _ in range(n)]
    return [(x[:-1], x[1:]) for x in data]


def _fit(module, precision: str, clip: float | None, steps: int, batches) -> None:  # noqa: ANN001
    """A real fit on CPU. ``16-mixed`` is Lightning's plugin with a GradScaler given explicitly
    (the Trainer maps ``precision="16-mixed"`` to bf16 on CPU)."""
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    loader = torch.utils.data.DataLoader(batches, batch_size=2)
    precision_args: dict = ({"plugins": [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]}
                            if precision == "16-mixed" else {"precision": precision})
    trainer = L.Trainer(accelerator="cpu", devices=1, gradient_clip_val=clip, max_steps=steps, **precision_args,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader)


def test_fused_adamw_clips_under_bf16_mixed_exactly_as_a_plain_fused_loop(monkeypatch) -> None:
    """Lightning's MixedPrecision plugin refuses to clip for any optimizer that unscales itself
    ("does not allow for gradient clipping ... Are you using a 'fused' optimizer?"; seen on an
    H200 under bf16-mixed), although bf16 has no loss scaler
    (Lightning-AI/pytorch-lightning#21435). The module clips itself there: a real fit under bf16-mixed with clipping now takes
    fused AdamW (the lever's device rule widened to CPU tensors) and ends with exactly the
    parameters of a plain loop: autocast forward, backward, ``clip_grad_norm_``, fused AdamW
    step, the same schedule. A clip bound of 0.05 clips every step."""
    from jobgen.train.model import LitGPT

    made = _fused_on_cpu(monkeypatch)
    steps, batches = 4, _byte_batches(8)
    torch.manual_seed(0)
    module = LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8, max_steps=steps, warmup_steps=2)
    plain = LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8, max_steps=steps, warmup_steps=2)
    plain.load_state_dict(module.state_dict())
    _fit(module, "bf16-mixed", 0.05, steps, batches)
    assert made[-1].get("fused") is True

    groups = plain.parameter_groups()
    optimizer = torch.optim.AdamW(groups, lr=plain.hparams.learning_rate, betas=(0.9, 0.95), fused=True)
    from jobgen.train.model import lr_factor

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, 2, steps))
    loader = torch.utils.data.DataLoader(batches, batch_size=2)
    norms = []
    for x, y in itertools.islice(loader, steps):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            loss = plain.loss(plain(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 0.05)))
        optimizer.step()
        schedule.step()
    assert min(norms) > 0.05  # every step was clipped
    for (name, ours), theirs in zip(module.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name


def test_16_mixed_keeps_lightnings_rule_and_the_lever_switch_restores_the_old_choice(monkeypatch) -> None:
    """Under 16-mixed the GradScaler scales the gradients, which a fused optimizer unscales only
    inside its step: clipping there keeps the unfused optimizer (Lightning's rule). With
    ``JOBGEN_LEVERS_OFF=fused_clip`` bf16-mixed with clipping takes the unfused optimizer again,
    as before the lever; without clipping both precisions take the fused one."""
    from jobgen.train.model import LitGPT

    made = _fused_on_cpu(monkeypatch)
    batches = _byte_batches(4)
    _fit(LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8, max_steps=2), "16-mixed", 1.0, 2, batches)
    assert "fused" not in made[-1]
    _fit(LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8, max_steps=2), "16-mixed", None, 2, batches)
    assert made[-1].get("fused") is True
    monkeypatch.setenv("JOBGEN_LEVERS_OFF", "fused_clip")
    _fit(LitGPT(n_layer=1, n_head=2, d_model=16, block_size=8, max_steps=2), "bf16-mixed", 1.0, 2, batches)
    assert "fused" not in made[-1]


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


def _one_run(tmp_path: Path, monkeypatch, spec: dict, **launch):  # noqa: ANN001, ANN202
    """A spec.json of ``spec`` in ``tmp_path`` (one CPU rank unless ``launch`` says), read back as
    the entrypoint reads it: ``(resolved, path, sources, layout)`` for ``run.train``. Launcher
    variables of an outer run are cleared, so Lightning sees one process."""
    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.__main__ import check_data
    from tests.entrypoint.conftest import resolved_doc

    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(resolved_doc(spec, **({"devices_per_node": 1, "world_size": 1} | launch))))
    resolved = load_resolved_spec(path)
    return (resolved, path, *check_data(resolved.spec))


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
    from jobgen.train import run
    from jobgen.train.callbacks import Throughput
    from tests.entrypoint.conftest import TINY_SPEC, _merge

    steps, every = 12, 4
    spec = _merge(TINY_SPEC, {"trainer": {"max_steps": steps, "val_check_interval": 100, "log_every_n_steps": every},
                              "checkpoint": {"every_n_steps": 100}})  # fmt: skip
    resolved, path, sources, layout = _one_run(tmp_path, monkeypatch, spec)

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


# --- host <-> device traffic per step, both directions, every layout ------------------------

#: Where a sharding engine itself moves host values or reads the device every step (its own code,
#: not jobgen's or Lightning's): allowed in the layouts that run the engine (``JOBGEN_LEVERS_OFF=
#: single_device`` at world size 1 here; every multi-rank run of that strategy).
ENGINE_FILES = ("/deepspeed/", "/torch/distributed/fsdp/")


def _caller_files(limit: int = 12) -> list[str]:
    return [frame.filename for frame in traceback.extract_stack(limit=limit)[:-2]]


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "levers_off"), [
    ("ddp", ""),
    ("fsdp", ""),                                  # world size 1: the single-device path
    ("deepspeed_stage_2", ""),
    ("fsdp", "single_device"),                     # FSDP itself at world size 1
    ("deepspeed_stage_2", "single_device"),        # DeepSpeed's engine itself
    ("ddp", "host_logging"),                       # the lever off: Lightning's per-step copies are back
])  # fmt: skip
def test_no_host_device_traffic_per_step_in_either_direction(tmp_path: Path, monkeypatch, request, strategy: str,
                                                             levers_off: str) -> None:
    """Counts, per global step of training (sanity check and validation excluded), each way a
    step can wait for the device on a GPU, on this CPU run of the same code:

    - device to host: ``Tensor.item`` / ``float`` / ``int`` / ``bool`` / ``tolist``;
    - host to device: ``torch.tensor(value, device=...)`` / ``torch.as_tensor(..., device=...)``
      of host values: Lightning's ``self.log`` of a Python number does this with the module's
      device, on a GPU a copy from pageable memory that waits for the queued work;
    - synchronisation: ``torch.cuda.synchronize`` and DeepSpeed's ``get_accelerator().synchronize``
      (its throughput timer synchronises at every step unless ``ds_config.json`` turns it off).

    Allowed only at log steps (every ``log_every_n_steps`` and the last), except inside the
    sharding engines' own code (:data:`ENGINE_FILES`) where they run. torch.optim's own host
    step counter (the single-tensor AdamW of a CPU run) is left out (a GPU run's fused AdamW
    keeps it on the device), and so are a data sampler's index lists (host tensors only).
    """
    from jobgen.jobdir.world import World
    from jobgen.planning.deepspeed import deepspeed_config
    from jobgen.specs.training import TrainingSpec
    from jobgen.train import run
    from jobgen.train.callbacks import Throughput
    from tests.entrypoint.conftest import TINY_SPEC, _merge

    monkeypatch.setenv("JOBGEN_LEVERS_OFF", levers_off)
    steps, every = 8, 4
    spec = _merge(TINY_SPEC, {"trainer": {"max_steps": steps, "val_check_interval": 100, "log_every_n_steps": every,
                                          "strategy": strategy, "gradient_clip_val": 1.0},
                              "checkpoint": {"every_n_steps": 100}})  # fmt: skip
    launch: dict[str, object] = {}
    if strategy.startswith("deepspeed"):
        request.getfixturevalue("deepspeed_cpu_ops")
        config = deepspeed_config(TrainingSpec.model_validate(spec), World(1, 1, "cpu", micro_batch_size=4))
        (tmp_path / "ds_config.json").write_text(json.dumps(config))
        launch["deepspeed_config"] = "ds_config.json"
    resolved, path, sources, layout = _one_run(tmp_path, monkeypatch, spec, **launch)

    live: dict[str, object] = {}
    events: list[tuple[int, str, str]] = []  # (global step, what, where)

    def training_step() -> int | None:
        trainer = live.get("trainer")
        if trainer is not None and trainer.training and not trainer.sanity_checking:  # type: ignore[attr-defined]
            return trainer.global_step  # type: ignore[attr-defined]
        return None

    def record(kind: str, files: list[str]) -> None:
        step = training_step()
        if step is not None:
            where = next((f for f in reversed(files) if "/site-packages/" in f or "/jobgen/" in f), files[-1])
            events.append((step, kind, where))

    def reads(name: str, original):  # noqa: ANN001, ANN202
        def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN202
            if training_step() is not None:
                files = _caller_files(6)
                if not any(("/torch/optim/" in f or "/torch/utils/data/" in f) for f in files):
                    record(f"d2h Tensor.{name}", files)
            return original(self, *args, **kwargs)

        return wrapper

    for name in SYNC_METHODS:
        monkeypatch.setattr(torch.Tensor, name, reads(name, getattr(torch.Tensor, name)))

    def creates(name: str, original):  # noqa: ANN001, ANN202
        def wrapper(data, *args, **kwargs):  # noqa: ANN001, ANN202
            if kwargs.get("device") is not None and not isinstance(data, torch.Tensor) and training_step() is not None:
                files = _caller_files(6)
                if not any("/torch/optim/" in f for f in files):
                    record(f"h2d torch.{name}(device=...)", files)
            return original(data, *args, **kwargs)

        return wrapper

    for name in ("tensor", "as_tensor"):
        monkeypatch.setattr(torch, name, creates(name, getattr(torch, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: record("sync torch.cuda.synchronize", _caller_files()))
    if strategy.startswith("deepspeed"):
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        original_sync = accelerator.synchronize

        def ds_sync(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            record("sync deepspeed get_accelerator().synchronize", _caller_files())
            return original_sync(*args, **kwargs)

        monkeypatch.setattr(accelerator, "synchronize", ds_sync)

    on_train_start = Throughput.on_train_start

    def remember(self, trainer, pl_module):  # noqa: ANN001, ANN202
        live["trainer"] = trainer
        return on_train_start(self, trainer, pl_module)

    monkeypatch.setattr(Throughput, "on_train_start", remember)
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert run.train(resolved, path, tmp_path / "run", sources, layout, time.time()) == 0
    single = strategy != "ddp" and "single_device" not in levers_off
    log_steps = {s for s in range(1, steps + 1) if s % every == 0} | {steps}
    engine = not single and strategy != "ddp"
    off_interval = [e for e in events if e[0] not in log_steps and not (engine and any(x in e[2] for x in ENGINE_FILES))]
    if levers_off == "host_logging":  # the spies see what the lever removes: Lightning's copy of each logged number
        assert any("h2d torch.tensor" in kind and "lightning/pytorch/core/module.py" in where
                   for step, kind, where in off_interval), events
        return
    assert not off_interval, f"host<->device traffic at non-log steps (log steps {sorted(log_steps)}): {off_interval}"
    assert {e[0] for e in events} >= {every}, events  # the spies see the log-interval reads
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["layout"] == ("single_device" if single else strategy)


def _train_loss_rows(run_dir: Path) -> list[tuple[int, float]]:
    from jobgen.train.metrics_csv import read_metrics_rows

    return [(step, row["train_loss"]) for step, row in read_metrics_rows(run_dir, 10**9) if "train_loss" in row]


def test_a_log_steps_train_loss_is_copied_after_the_forward_and_read_once_the_backward_is_queued(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """LogStepLoss (lever ``loss_read``): at log steps only, ``training_step`` hands the loss to
    ``keep`` (where a GPU run starts its copy to the host), and ``on_before_optimizer_step`` logs
    what ``read`` returns, after the step's backward and before its optimizer update, so a GPU run
    waits for the forward's copy only, not for the queued backward and optimizer step; the
    loggers then get the value at that step. Between log steps nothing reads the loss. The
    job-log lines show the step's own loss, and metrics.csv's train_loss rows (steps and values)
    are those of the same run with the lever off."""
    from lightning.pytorch import LightningModule
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

    from jobgen.train import run
    from tests.entrypoint.conftest import TINY_SPEC, _merge

    steps, every = 8, 3
    spec = _merge(TINY_SPEC, {"trainer": {"max_steps": steps, "val_check_interval": 100, "log_every_n_steps": every},
                              "checkpoint": {"every_n_steps": 100}})  # fmt: skip
    order: list[tuple[str, object]] = []

    def spy(owner: type, name: str, event, after: bool = False):  # noqa: ANN001, ANN202
        original = getattr(owner, name)

        def wrapper(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if not after:
                order.append(event(self, *args, **kwargs))
            result = original(self, *args, **kwargs)
            if after:
                order.append(event(self, *args, **kwargs))
            return result

        monkeypatch.setattr(owner, name, wrapper)

    spy(speed.LogStepLoss, "keep", lambda self, loss, *, log_step: ("keep", log_step))
    spy(speed.LogStepLoss, "read", lambda self: ("read", None))
    spy(LightningModule, "backward", lambda self, *a, **k: ("backward", None))
    # AdamW.step runs Lightning's closure (training_step, backward, on_before_optimizer_step) first
    spy(torch.optim.AdamW, "step", lambda self, *a, **k: ("update", None), after=True)
    spy(_LoggerConnector, "log_metrics", lambda self, metrics, step=None: (
        ("loggers", self.trainer.global_step) if "train_loss" in metrics else ("other", None)))
    runs, printed = {}, {}
    for off in ("", "loss_read"):
        monkeypatch.setenv("JOBGEN_LEVERS_OFF", off)
        order.clear()
        where = tmp_path / (off or "on")
        where.mkdir()
        resolved, path, sources, layout = _one_run(where, monkeypatch, spec)
        monkeypatch.setattr("sys.stdout.isatty", lambda: False)  # job-log lines (LineProgress)
        capsys.readouterr()
        assert run.train(resolved, path, where / "run", sources, layout, time.time()) == 0
        runs[off] = _train_loss_rows(where / "run")
        printed[off] = [(int(m.group(1)), float(m.group(2))) for m in
                        re.finditer(r"^step (\d+)/\d+ \| train_loss ([0-9.]+)", capsys.readouterr().out, re.M)]
        if not off:
            on_order = [e for e in order if e[0] != "other"]
    log_steps = [s for s in range(1, steps + 1) if s % every == 0] + [steps]
    assert [step for step, _ in runs[""]] == log_steps, runs
    assert runs[""] == runs["loss_read"]  # same steps, same values (the same seed)
    for off in ("", "loss_read"):  # the job log's line of each log step shows that step's loss
        assert printed[off] == [(step, round(value, 4)) for step, value in runs[off]], (off, printed, runs)
    per_step, current = [], []
    for event in on_order:
        current.append(event)
        if event[0] == "loggers" or (event[0] == "update" and current[0] == ("keep", False)):
            per_step.append(current)
            current = []
    assert not current, on_order
    assert [s for s in per_step if s[0] == ("keep", True)] == [
        [("keep", True), ("backward", None), ("read", None), ("update", None), ("loggers", step)] for step in log_steps
    ], on_order
    assert [s for s in per_step if s[0] == ("keep", False)] == [
        [("keep", False), ("backward", None), ("update", None)]] * (steps - len(log_steps)), on_order


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_evidence.sh runs it)")
def test_log_step_loss_on_a_gpu_waits_for_its_copy_not_for_the_work_queued_after_it() -> None:
    """On CUDA, :meth:`LogStepLoss.read` returns the loss on the host while the work queued after
    :meth:`keep` (standing in for the backward and the optimizer step: 40 large matmuls) is still
    running: the read did not empty the queue. Lightning's ``.item()`` of the device loss would."""
    x = torch.randn(8192, 8192, device="cuda")
    loss = (x @ x).float().mean()  # the "forward"
    expected = loss.clone()
    reader = speed.LogStepLoss()
    reader.keep(loss, log_step=True)
    for _ in range(40):
        x = (x @ x) / 8192  # "backward, optimizer step": queued behind the copy
    queued = torch.cuda.Event()
    queued.record()
    host = reader.read()
    assert not queued.query(), "the read waited for the work queued after the copy"
    assert host.device.type == "cpu"
    torch.cuda.synchronize()
    assert float(host) == float(expected)
    reader.keep(loss, log_step=False)  # not a log step: the device tensor itself, nothing copied
    assert reader.read().device.type == "cuda"


def test_the_rendered_deepspeed_config_turns_the_synchronising_throughput_timer_off() -> None:
    """DeepSpeed's ThroughputTimer synchronises the device at every micro batch while enabled
    (its default); the config jobgen renders turns it off, read back by DeepSpeed's own parser."""
    require("deepspeed", "deepspeed not installed")
    from deepspeed.utils.config import get_timers_config

    from jobgen.jobdir.world import World
    from jobgen.planning.deepspeed import deepspeed_config
    from jobgen.specs.training import TrainingSpec
    from tests.entrypoint.conftest import TINY_SPEC, _merge

    assert get_timers_config({}).enabled and get_timers_config({}).synchronized  # DeepSpeed's default
    spec = TrainingSpec.model_validate(_merge(TINY_SPEC, {"trainer": {"strategy": "deepspeed_stage_2"}}))
    config = deepspeed_config(spec, World(1, 2, "gpu", micro_batch_size=4))
    assert get_timers_config(config).enabled is False


# --- a trace of a few steps -------------------------------------------------------------------

@pytest.mark.slow
def test_jobgen_trace_steps_writes_a_chrome_trace_of_those_steps_only(tmp_path: Path, monkeypatch) -> None:
    """``JOBGEN_TRACE_STEPS=3-4`` traces optimizer steps 3 and 4 of a real run into
    ``<run>/traces/steps-3-4-rank0.json.gz``: a gzip Chrome trace whose optimizer steps are the
    two asked for (Lightning's ``optimizer_step`` record once per step); a bad value is refused."""
    import gzip

    from jobgen.train import run
    from jobgen.train.callbacks import trace_steps
    from tests.entrypoint.conftest import TINY_SPEC, _merge

    spec = _merge(TINY_SPEC, {"trainer": {"max_steps": 6, "val_check_interval": 100}, "checkpoint": {"every_n_steps": 100}})
    resolved, path, sources, layout = _one_run(tmp_path, monkeypatch, spec)
    monkeypatch.setenv("JOBGEN_TRACE_STEPS", "3-4")
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert run.train(resolved, path, tmp_path / "run", sources, layout, time.time()) == 0
    trace = tmp_path / "run" / "traces" / "steps-3-4-rank0.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("Optimizer.step#") and e.get("ph") == "X"]
    assert len(steps) == 2, sorted({e.get("name") for e in events if "ptim" in str(e.get("name"))})
    assert trace_steps(None) is None and trace_steps("61-63") == (61, 63)
    for bad in ("3", "4-3", "0-2", "a-b", "1-2-3"):
        with pytest.raises(ConfigError, match="JOBGEN_TRACE_STEPS"):
            trace_steps(bad)
