"""The ceiling beside a jobgen run: the same GPT, batch, data and precision in a plain PyTorch loop.

Usage (benchmarks/gpu_suite.py runs it beside each GPT row; standalone on any finished run):
  python benchmarks/plain_loop.py RUN_DIR [--json OUT.json]

RUN_DIR is a finished jobgen run of the built-in GPT on ``text`` data (its ``spec.json``, which
the local backend writes into the run directory, and its ``data/train.bin``). The loop trains
``jobgen.train.model.GPT`` from the same seed on the same windows (``TrainWindows`` of the
run's bins at the spec's seed) with the same micro batch, AdamW groups (``LitGPT.parameter_groups``),
betas, warmup + cosine schedule and gradient clipping, for the spec's ``max_steps``; no Lightning.
Only the hot loop's own choices differ, each the fastest plain PyTorch offers on the device:

* precision: ``torch.autocast`` (bf16 for ``bf16-mixed``; fp16 with a ``GradScaler`` for
  ``16-mixed``); fp32 for ``32-true`` (the CPU rows);
* ``torch.compile`` of the network where the jobgen run compiled it (its summary.json
  ``levers.compile``; else ``jobgen.train.speed.compile_on`` of the spec);
* AdamW ``fused=True`` on CUDA (not with ``16-mixed``, as in the entrypoint); pinned host batches and ``non_blocking`` copies on CUDA;
* no host-device synchronisation inside the timed steps (the loss is read once, at the end).

Timing matches the entrypoint's ``Throughput`` mean: from the end of optimizer step 1 (the first
step, with allocation and compilation, is left out) to the end of the last step, with a device
synchronisation at both ends on CUDA. One process (the single-device ceiling; multi-rank runs
have no plain figure here). CPU: as many threads as the jobgen rank had (``OMP_NUM_THREADS``).

``tokens_per_s_steady``: the later half of those steps alone (one more device synchronisation
at its start), as the entrypoint's ``tokens_per_s_steady``.

Prints one line and, with --json, writes ``{"tokens_per_s", "tokens_per_s_steady", "final_loss", "steps", "device",
"precision", "compile", "fused_adamw", "peak_memory_bytes"}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WARMUP_STEPS = 1
"""Optimizer steps left out of the timing (the entrypoint's Throughput default)."""


def plain_loop(run_dir: Path, *, device: str | None = None, compile_net: bool | None = None) -> dict[str, Any]:
    """Train the run's GPT for its ``max_steps`` in a plain loop; its tokens/s and final loss.

    Args:
        run_dir: a finished jobgen run directory (``spec.json``, ``data/train.bin``).
        device: ``cuda`` or ``cpu`` (default: the run's accelerator).
        compile_net: compile the network (default: as the jobgen run did, see the module docstring).

    Raises:
        ValueError: the run is not of the built-in GPT on text data.
    """
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.data import TrainWindows
    from jobgen.train.model import LitGPT, lr_factor
    from jobgen.train.speed import compile_on

    resolved = load_resolved_spec(run_dir / "spec.json")
    spec, t = resolved.spec, resolved.spec.trainer
    if spec.user_code or spec.model.is_hf or spec.data.format != "text":
        raise ValueError(f"{run_dir}: the plain loop trains the built-in GPT on text data only")
    device = device or ("cuda" if resolved.launch.accelerator == "gpu" else "cpu")
    cuda = device == "cuda"
    if compile_net is None:
        summary = run_dir / "summary.json"
        levers = json.loads(summary.read_text()).get("levers") if summary.is_file() else None
        compile_net = levers["compile"] if levers else compile_on(t, resolved.launch.accelerator, hf_model=False, user_code=False)
    if cuda and torch.cuda.get_device_capability() >= (8, 0):
        torch.set_float32_matmul_precision("high")
    torch.manual_seed(t.seed)

    train = np.memmap(run_dir / "data" / "train.bin", dtype=np.uint8, mode="r")
    steps, batch = t.max_steps, t.micro_batch_size * t.gradient_accumulation_steps
    windows = TrainWindows(train, spec.model.block_size, t.seed, steps * batch)
    loader = DataLoader(windows, batch_size=t.micro_batch_size, drop_last=True, pin_memory=cuda)
    lit = LitGPT.from_spec(spec)
    model = lit.model.to(device)
    groups = lit.parameter_groups()
    fused = cuda and t.precision != "16-mixed"  # as the entrypoint chooses (jobgen.train.speed.fused_adamw)
    optimizer = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(0.9, 0.95), **({"fused": True} if fused else {}))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, t.warmup_steps, t.max_steps, t.min_lr_ratio, t.lr_schedule))
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(t.precision)
    scaler = torch.amp.GradScaler(device) if t.precision == "16-mixed" else None
    if compile_net:
        model.compile()
    model.train()

    def autocast() -> Any:
        return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    accumulated, step, started, loss = 0, 0, 0.0, None
    middle, middle_time = WARMUP_STEPS + 1 + (steps - WARMUP_STEPS) // 2, 0.0
    for x, y in loader:
        x, y = x.to(device, non_blocking=cuda), y.to(device, non_blocking=cuda)
        with autocast():
            loss = LitGPT.loss(model(x), y)
        scaled = loss / t.gradient_accumulation_steps
        (scaler.scale(scaled) if scaler else scaled).backward()
        accumulated += 1
        if accumulated < t.gradient_accumulation_steps:
            continue
        accumulated = 0
        if scaler:
            scaler.unscale_(optimizer)
        if t.gradient_clip_val is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.gradient_clip_val)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        step += 1
        if step == WARMUP_STEPS:
            sync()
            started = time.perf_counter()
        if step == middle:  # the later half's start, as the entrypoint's Throughput.steady_seconds_per_step
            sync()
            middle_time = time.perf_counter()
        if step == steps:
            break
    sync()
    ended = time.perf_counter()
    elapsed = ended - started
    timed = steps - WARMUP_STEPS
    tokens_per_step = batch * spec.model.block_size
    steady = (steps - middle) * tokens_per_step / (ended - middle_time) if steps > middle and ended > middle_time else None
    return {
        "tokens_per_s": timed * tokens_per_step / elapsed if timed > 0 and elapsed > 0 else None,
        "tokens_per_s_steady": steady,
        "final_loss": None if loss is None else float(loss),
        "steps": steps,
        "device": device,
        "precision": t.precision,
        "compile": bool(compile_net),
        "fused_adamw": fused,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a finished jobgen run of the built-in GPT")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: the run's accelerator")
    args = parser.parse_args(argv)
    result = plain_loop(args.run_dir.resolve(), device=args.device)
    print(f"plain loop: {result['tokens_per_s']:,.0f} tokens/s over {result['steps'] - WARMUP_STEPS} steps on "
          f"{result['device']} ({result['precision']}{', compiled' if result['compile'] else ''}), "
          f"final loss {result['final_loss']:.4f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
