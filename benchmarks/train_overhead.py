"""Overhead of the bundled entrypoint over a plain PyTorch loop, measured side by side in one run.

Both train the same built-in GPT (jobgen.train.model.GPT) on the same byte windows (the
entrypoint's data/train.bin, TrainWindows at the same seed, ranks sharded by the same
DistributedSampler), with the same micro batch, steps, AdamW groups, warmup + cosine schedule
and gradient clipping, in fp32 on CPU, with 1 process and with 2 processes (DDP over gloo,
both under torchrun, OMP_NUM_THREADS=1 each). Start-up is excluded: tokens/s is timed on
global rank zero from the end of optimizer step --warmup to the end of step --warmup + --steps.

The entrypoint runs as shipped (`python -m jobgen.train`: Lightning Trainer, checkpoint and
throughput callbacks, CSV metrics every 10 steps, the progress line), except that its
Throughput callback leaves --warmup steps out of its mean instead of 1 (a subclass patched in
for jobgen.train.run.Throughput in this process, which also sums the process's CPU time over the
same steps for benchmarks/user_module_overhead.py); mid-run validation and step checkpoints are
placed after the last timed step, so neither is in the figure.

Prints tokens/s of each and the ratio entrypoint / plain per process count.

Usage: python benchmarks/train_overhead.py [--steps 100] [--warmup 10] [--procs 1 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = {"preset": None, "n_layer": 4, "n_head": 4, "d_model": 128, "block_size": 128}
"""A tiny GPT: ~0.8M parameters, byte-level."""


def make_spec(steps: int, warmup: int, micro_batch: int, world_size: int) -> dict[str, Any]:
    """A resolved spec document (as the planner writes it) for ``warmup + steps`` steps."""
    from jobgen.specs.training import TrainingSpec

    total = warmup + steps
    spec = TrainingSpec.model_validate({
        "name": "overhead",
        "model": MODEL,
        "data": {"max_bytes": 2_000_000},
        "trainer": {
            "precision": "32-true", "micro_batch_size": micro_batch, "max_steps": total,
            "warmup_steps": min(10, total - 1), "val_check_interval": total, "limit_val_batches": 2,
            "log_every_n_steps": 10,
        },
        "checkpoint": {"every_n_steps": total, "resume": "never"},
    })  # fmt: skip
    return {
        "jobgen_version": "bench", "inputs_sha256": "0" * 64, "profile": "local",
        "spec": spec.model_dump(mode="json"),
        "launch": {"scheduler": "local", "accelerator": "cpu", "num_nodes": 1, "devices_per_node": world_size,
                   "world_size": world_size},
    }  # fmt: skip


CPU_FILE = "bench_cpu.json"
"""Written by :func:`entrypoint_worker` into the run directory (global rank zero): the timed steps,
their wall seconds and the CPU seconds this process used in them."""


def entrypoint_worker(warmup: int, argv: list[str], run_dir: Path) -> int:
    """``python -m jobgen.train ARGV`` with the Throughput mean starting after ``warmup`` steps.

    The Throughput callback also sums this process's CPU time (``time.process_time``) over the
    steps its mean times, written to ``run_dir/CPU_FILE``: on a shared machine wall-clock tokens/s
    also measures how much CPU the scheduler gave the process, CPU time per step the work done.
    """
    import jobgen.train.run as run
    from jobgen.train.__main__ import main

    class CPUTimedThroughput(run.Throughput):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "warmup_steps": warmup})
            self.cpu_seconds_timed, self._last_cpu, self._val_cpu = 0.0, 0.0, None
            made.append(self)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            super().on_train_start(trainer, pl_module)
            self._last_cpu = time.process_time()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            now, last_step, timed = time.process_time(), self._last_step, self.steps_timed
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            if self._last_step != last_step:  # an optimizer step ended: the same interval as the wall clock
                if self.steps_timed != timed:
                    self.cpu_seconds_timed += now - self._last_cpu
                self._last_cpu = now

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            super().on_validation_start(trainer, pl_module)
            self._val_cpu = time.process_time()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if self._val_cpu is not None and trainer.state.fn == "fit":  # as Throughput pauses its clock
                self._last_cpu += time.process_time() - self._val_cpu
            super().on_validation_end(trainer, pl_module)
            self._val_cpu = None

    made: list[CPUTimedThroughput] = []
    run.Throughput = CPUTimedThroughput
    code = main(argv)
    if made and int(os.environ.get("RANK", "0")) == 0:
        t = made[0]
        (run_dir / CPU_FILE).write_text(json.dumps({"steps_timed": t.steps_timed, "seconds_timed": t.seconds_timed,
                                                    "cpu_seconds_timed": t.cpu_seconds_timed}))
    return code


def plain_worker(spec_path: Path, run_dir: Path, warmup: int, out: Path) -> None:
    """The plain loop: same model, data, batch, optimizer, schedule and clipping; writes tok/s."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from jobgen.jobdir import load_resolved_spec
    from jobgen.train.data import ByteTextDataModule
    from jobgen.train.model import LitGPT, lr_factor
    from jobgen.train.sources import discover_sources

    resolved = load_resolved_spec(spec_path)
    spec, t = resolved.spec, resolved.spec.trainer
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(t.seed)
    dm = ByteTextDataModule.from_spec(spec, discover_sources(spec.data.paths, spec.data.max_bytes), run_dir, world)
    dm.setup("fit")  # memory-maps the bins the entrypoint run built
    sampler = DistributedSampler(dm.train_set, num_replicas=world, rank=rank, shuffle=False, drop_last=True) if world > 1 else None
    loader = DataLoader(dm.train_set, batch_size=t.micro_batch_size, sampler=sampler, drop_last=True)
    lit = LitGPT.from_spec(spec)
    model = torch.nn.parallel.DistributedDataParallel(lit.model) if world > 1 else lit.model
    optimizer = torch.optim.AdamW(lit.parameter_groups(), lr=t.learning_rate, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, t.warmup_steps, t.max_steps))
    model.train()
    step, started = 0, 0.0
    for x, y in loader:
        loss = LitGPT.loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.gradient_clip_val)
        optimizer.step()
        schedule.step()
        step += 1
        if step == warmup:
            started = time.perf_counter()
        if step == t.max_steps:
            break
    elapsed = time.perf_counter() - started
    if rank == 0:
        timed = t.max_steps - warmup
        out.write_text(json.dumps({"tokens_per_s": timed * dm.tokens_per_step / elapsed, "final_loss": float(loss)}))
    if world > 1:
        dist.destroy_process_group()


def read_summary(run_dir: Path) -> dict[str, Any]:
    """An entrypoint run's ``summary.json`` plus ``last_train_loss`` (rank 0's micro batch at the
    last logged step, from its metrics.csv; ``None`` when no step was logged) and ``cpu`` (rank
    0's :data:`CPU_FILE`, ``None`` when absent)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(summary["metrics_csv"], newline="") as f:
        losses = {int(r["step"]): float(r["train_loss"]) for r in csv.DictReader(f) if r.get("train_loss")}
    summary["last_train_loss"] = losses[max(losses)] if losses else None
    cpu = run_dir / CPU_FILE
    summary["cpu"] = json.loads(cpu.read_text()) if cpu.is_file() else None
    return summary


def launch(nproc: int, args: list[str], cwd: Path) -> None:
    """Run this script with ``args`` in ``nproc`` processes (torchrun for more than one)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    me = str(Path(__file__).resolve())
    if nproc == 1:
        argv = [sys.executable, me, *args]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), me, *args]
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed optimizer steps (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed optimizer steps first (default 10)")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per rank per step (default 8)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts (default 1 2)")
    parser.add_argument("--worker", choices=["entrypoint", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--steps and --warmup must be at least 1")
    if args.worker == "entrypoint":
        from jobgen.train.__main__ import exit_process

        exit_process(entrypoint_worker(args.warmup, ["--spec", str(args.spec), "--run-dir", str(args.run_dir)], args.run_dir))
    if args.worker == "plain":
        plain_worker(args.spec, args.run_dir, args.warmup, args.out)
        return

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in args.procs:
            work = Path(tmp) / f"p{nproc}"
            work.mkdir()
            spec_path = work / "spec.json"
            spec_path.write_text(json.dumps(make_spec(args.steps, args.warmup, args.micro_batch, nproc)))
            common = ["--spec", str(spec_path), "--run-dir", str(work / "run"), "--warmup", str(args.warmup),
                      "--steps", str(args.steps)]  # fmt: skip
            launch(nproc, ["--worker", "entrypoint", *common], work)
            summary = read_summary(work / "run")
            launch(nproc, ["--worker", "plain", *common, "--out", str(work / "plain.json")], work)
            plain = json.loads((work / "plain.json").read_text())
            rows.append((nproc, summary, plain))

    tokens = make_spec(1, 1, args.micro_batch, 1)["spec"]["model"]["block_size"] * args.micro_batch
    print(f"GPT {MODEL['n_layer']} layers, d_model {MODEL['d_model']}, block {MODEL['block_size']}, fp32, micro "
          f"batch {args.micro_batch} ({tokens} tokens/rank/step); {args.steps} timed steps after {args.warmup} "
          f"warm-up steps; CPU, OMP_NUM_THREADS=1 per process, {os.cpu_count()} cores")
    print(f"{'processes':>9}  {'entrypoint tok/s':>16}  {'plain loop tok/s':>16}  {'entrypoint/plain':>16}  "
          f"{'peak RSS (entrypoint)':>21}")
    for nproc, summary, plain in rows:
        ours, base = summary["tokens_per_s_mean"], plain["tokens_per_s"]
        print(f"{nproc:>9}  {ours:>16,.0f}  {base:>16,.0f}  {ours / base:>16.3f}  "
              f"{summary['peak_memory_bytes'] / 1e6:>18,.0f} MB")
    print("train loss at the last step (rank 0's micro batch), entrypoint vs plain: "
          + "; ".join(f"{n} proc {s['last_train_loss']:.4f} vs {p['final_loss']:.4f}" for n, s, p in rows))


if __name__ == "__main__":
    main()
