"""Overhead of the user-module path (``class_path``) over the built-in GPT path, same model and data.

Both runs go through the shipped entrypoint (``python -m jobgen.train --spec spec.json``, the
Trainer, checkpoint/throughput/progress callbacks and CSV metrics jobgen adds) and train the
same network (jobgen.train.model.GPT, :data:`train_overhead.MODEL`: 4 layers, d_model 128,
block 128), fp32 on CPU, 1 rank by default (OMP_NUM_THREADS=1 per process), micro batch 8:

(a) built-in: ``model: {preset: null, n_layer, ...}`` + ``data: {format: text}`` (LitGPT and
    ByteTextDataModule, built by jobgen.train.build from the spec);
(b) user module: ``model: {class_path: user_gpt.UserGPT, init_args}`` + ``data: {class_path:
    user_gpt.UserByteData, init_args}`` (benchmarks/user_gpt.py: the same GPT, init, loss,
    AdamW groups, warmup + cosine schedule and byte windows, written as a user's classes; the
    learning rate, weight decay and schedule lengths move from ``trainer`` into
    ``model.init_args``, as jobgen requires for a class_path model).

What differs between the paths (everything else is the same code):

- construction: (b) imports the classes and binds/instantiates ``init_args`` with jsonargparse
  (jobgen.usercode.classes), (a) calls LitGPT.from_spec / ByteTextDataModule.from_spec. Both happen
  before training starts, so neither is in the tokens/s figure (they are in ``wall_time_s``);
- throughput accounting (jobgen.train.callbacks.Throughput): (a) knows tokens per optimizer
  step from the spec; (b) counts the samples of every micro batch with Lightning's
  ``extract_batch_size`` and multiplies by the ``tokens_per_sample`` the data module declares
  (UserByteData sets it to ``block_size``; without it jobgen reports tokens/s as ``n/a``). This
  per-batch count is inside the timed steps;
- Trainer options: (b) gets ``reload_dataloaders_every_n_epochs=0`` (a user's loaders are
  built once) where (a) gets 1; one epoch covers the whole run here, so no reload happens in
  either. MFU is computed for (a) only (``n/a`` on CPU for both);
- the module itself: UserGPT reuses LitGPT's loss, groups and schedule but is a different class
  (its own training_step/configure_optimizers, the same two self.log calls per step).

Timing: tokens/s is the entrypoint's own ``tokens_per_s_mean`` (summary.json), with the
Throughput callback's mean starting after --warmup optimizer steps instead of 1 (the subclass
train_overhead.py patches in); validation and the checkpoint come after the last timed step.
The same subclass sums the process's CPU time (``time.process_time``) over the same steps, so
each run also gives tokens per CPU second. The pair (a), (b) runs --repeats times, interleaved,
the order alternating (a b, b a, a b, ...) so that a drift in machine load hits both paths
alike. The ratio (b)/(a) is taken per pair, for both figures; the script prints each pair, then
the median ratio with its min and max, and the CPU share (CPU seconds / wall seconds) of each
run.

What the ratios mean: 1.00 means the user-module path costs nothing per step over the built-in
path; 0.95 means it trains 5% fewer tokens per second on this model. On a machine shared with
other jobs, wall-clock tok/s also measures how much of a core the scheduler gave each process
(the CPU share), which differs from run to run; tokens per CPU second measures the work each
step costs, and is what a per-step overhead of the path would move. At this size (0.8M
parameters, ~0.1 s of CPU per step) a fixed per-step cost weighs far more than on a real model,
so the ratio bounds from below what a larger model would see. The last train loss of each run
is printed: equal losses show both paths trained the same model on the same data.

Usage: python benchmarks/user_module_overhead.py [--steps 300] [--warmup 20] [--repeats 3]
       [--micro-batch 8] [--procs 1]
(the default takes about 5 minutes on 2 busy cores; e.g. --steps 1000 --repeats 7 for a
tighter spread.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

# benchmarks/ is sys.path[0]; importing train_overhead puts the repository on sys.path too
from render import cpu_model
from train_overhead import MODEL, launch, make_spec, read_summary

USER_MODEL = "user_gpt.UserGPT"
USER_DATA = "user_gpt.UserByteData"
"""The classes of benchmarks/user_gpt.py, importable because the worker (train_overhead.py)
runs with benchmarks/ as sys.path[0], as a user's PYTHONPATH would put their package."""


def user_spec(builtin: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """The resolved spec document ``builtin`` (from :func:`train_overhead.make_spec`) with its
    model and data replaced by :data:`USER_MODEL` / :data:`USER_DATA` on the same values: the GPT
    shape and jobgen's optimiser settings become ``model.init_args``, the data settings
    ``data.init_args`` (bins under ``data_dir``; ``batch_size`` is left to jobgen)."""
    from jobgen.specs.training import BUILTIN_OPTIMIZER_FIELDS, TrainingSpec

    s = builtin["spec"]
    m, t, d = s["model"], s["trainer"], s["data"]
    doc = {
        **s,
        "model": {"class_path": USER_MODEL, "init_args": {
            **{k: m[k] for k in ("n_layer", "n_head", "d_model", "block_size", "dropout")},
            "lr": t["learning_rate"], "weight_decay": t["weight_decay"], "warmup_steps": t["warmup_steps"],
            "max_steps": t["max_steps"],
        }},
        "data": {"class_path": USER_DATA, "init_args": {
            "data_dir": str(data_dir), "block_size": m["block_size"], "paths": list(d["paths"]),
            "max_bytes": d["max_bytes"], "val_fraction": d["val_fraction"], "val_batches": t["limit_val_batches"],
            "max_steps": t["max_steps"], "seed": t["seed"], "world_size": builtin["launch"]["world_size"],
        }},
        "trainer": {k: v for k, v in t.items() if k not in BUILTIN_OPTIMIZER_FIELDS},
    }  # fmt: skip
    return {**builtin, "spec": TrainingSpec.model_validate(doc).model_dump(mode="json")}


def run_once(path: str, work: Path, spec: dict[str, Any], nproc: int, steps: int, warmup: int) -> dict[str, Any]:
    """Train ``spec`` through the entrypoint in ``work/<path>``; its summary (+ last train loss)."""
    work.mkdir(parents=True)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    launch(nproc, ["--worker", "entrypoint", "--spec", str(spec_path), "--run-dir", str(work / "run"),
                   "--warmup", str(warmup), "--steps", str(steps)], work)  # fmt: skip
    summary = read_summary(work / "run")
    if summary["tokens_per_s_mean"] is None or summary["cpu"] is None:
        sys.exit(f"{path}: the entrypoint reported no tokens/s or CPU time (summary: {work / 'run' / 'summary.json'})")
    return summary


def per_cpu_second(run: dict[str, Any]) -> float:
    """Tokens per CPU second of rank 0's process over the timed steps (its tok/s x wall / CPU time)."""
    c = run["cpu"]
    return run["tokens_per_s_mean"] * c["seconds_timed"] / c["cpu_seconds_timed"]


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed optimizer steps per run (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed optimizer steps first (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved (a, b) pairs (default 3)")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per rank per step (default 8)")
    parser.add_argument("--procs", type=int, default=1, help="ranks per run (default 1; >1: DDP over gloo)")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.repeats < 1 or args.procs < 1:
        parser.error("--steps, --warmup, --repeats and --procs must be at least 1")

    import torch

    load_before = os.getloadavg()
    builtin = make_spec(args.steps, args.warmup, args.micro_batch, args.procs)
    pairs: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            order = ("builtin", "user") if i % 2 == 0 else ("user", "builtin")
            pair = {}
            for path in order:
                work = Path(tmp) / f"r{i}" / path
                spec = builtin if path == "builtin" else user_spec(builtin, work / "data")
                pair[path] = run_once(path, work, spec, args.procs, args.steps, args.warmup)
                print(f"  pair {i + 1}/{args.repeats} {path}: {pair[path]['tokens_per_s_mean']:,.0f} tok/s",
                      file=sys.stderr, flush=True)
            pairs.append(pair)
    load_after = os.getloadavg()

    tokens = MODEL["block_size"] * args.micro_batch
    print(f"GPT {MODEL['n_layer']} layers, d_model {MODEL['d_model']}, block {MODEL['block_size']}, fp32, micro "
          f"batch {args.micro_batch} ({tokens} tokens/rank/step), {args.procs} rank(s); {args.steps} timed steps "
          f"after {args.warmup} warm-up steps per run; {args.repeats} interleaved pairs (order alternating)")
    print(f"CPU {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} capability "
          f"{torch.backends.cpu.get_cpu_capability()}, OMP_NUM_THREADS=1 per process; load average (1/5/15 min) "
          f"before {' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in load_after)}")
    print(f"{'pair':>4}  {'(a) built-in tok/s':>18}  {'(b) user module tok/s':>21}  {'(b)/(a)':>7}  "
          f"{'(a) tok/CPU-s':>13}  {'(b) tok/CPU-s':>13}  {'(b)/(a)':>7}  {'CPU share (a)/(b)':>17}  "
          f"{'last train loss (a) / (b)':>25}")
    wall, cpu = [], []
    for i, pair in enumerate(pairs, 1):
        a, b = pair["builtin"], pair["user"]
        wall.append(b["tokens_per_s_mean"] / a["tokens_per_s_mean"])
        cpu.append(per_cpu_second(b) / per_cpu_second(a))
        share = "/".join(f"{r['cpu']['cpu_seconds_timed'] / r['cpu']['seconds_timed']:.2f}" for r in (a, b))
        print(f"{i:>4}  {a['tokens_per_s_mean']:>18,.0f}  {b['tokens_per_s_mean']:>21,.0f}  {wall[-1]:>7.3f}  "
              f"{per_cpu_second(a):>13,.0f}  {per_cpu_second(b):>13,.0f}  {cpu[-1]:>7.3f}  {share:>17}  "
              f"{_loss(a['last_train_loss']):>12} / {_loss(b['last_train_loss']):<10}")
    for what, rate, ratios in (("tok/s (wall clock)", lambda r: r["tokens_per_s_mean"], wall),
                               ("tokens per CPU second", per_cpu_second, cpu)):
        med_a = statistics.median(rate(p["builtin"]) for p in pairs)
        med_b = statistics.median(rate(p["user"]) for p in pairs)
        print(f"{what}: median (a) built-in {med_a:,.0f}, (b) user module {med_b:,.0f}; (b)/(a) per pair: median "
              f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f} (n={len(ratios)})")
    same = all(p["builtin"]["last_train_loss"] == p["user"]["last_train_loss"] for p in pairs)
    print("last train loss: " + ("identical in every pair (same model, init, data and schedule)" if same else
                                 "DIFFERS between the paths: they did not train the same thing"))


if __name__ == "__main__":
    main()
