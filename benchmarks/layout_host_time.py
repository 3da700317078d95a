"""Host time per optimizer step of each world-size-1 layout, beside the plain loop.

Usage:
  python benchmarks/layout_host_time.py [--steps 80] [--out /tmp/layout_host_time]

On one GPU a layout is host-bound when the Python run per step (the framework's hooks, the
strategy's per-unit or per-parameter work, the logging) takes longer than the GPU's kernels.
This script measures that host time on the CPU, where it can be seen without a GPU: a GPT
whose compute is negligible (24 blocks of d_model 64 on 32-token windows, one sequence per step:
``gpt-24x64`` in benchmarks/gpu_suite.py), so the wall time per step is the host's work. Each
row is a real ``jobgen submit --profile <local CPU profile> --smoke STEPS`` (benchmarks/gpu_suite.py's
``run_row``), one rank, fp32, clipping at 1.0, and reads the entrypoint's own steady-state
figure (summary.json ``tokens_per_s_steady``: the later half of the timed steps):

* ``ddp`` (Lightning's single-device path at world size 1);
* ``fsdp`` and ``deepspeed_stage_2`` as jobgen runs them now (the single-device path,
  :meth:`jobgen.specs.trainer.TrainerSpec.single_device_reason`), and with
  ``JOBGEN_LEVERS_OFF=single_device`` (FSDP / DeepSpeed's engine at world size 1, as before);
* the plain PyTorch loop (benchmarks/plain_loop.py) on the ddp row's run: the floor.

Rows run in ``--rounds`` interleaved rounds; the table gives each row's median ms per step,
and its ratio to ddp's and to the plain loop's medians. Target: fsdp and ZeRO-2 at
world size 1 within 10% of ddp's host time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_suite  # noqa: E402

LAYOUTS = (
    ("ddp", "ddp", ""),
    ("fsdp", "fsdp", ""),
    ("fsdp (sharded path)", "fsdp", "single_device"),
    ("deepspeed_stage_2", "deepspeed_stage_2", ""),
    ("deepspeed_stage_2 (engine)", "deepspeed_stage_2", "single_device"),
)
"""(label, trainer.strategy, JOBGEN_LEVERS_OFF)."""


def ms_per_step(result: dict) -> float | None:
    """Steady-state milliseconds per optimizer step of a finished row (one sequence per step)."""
    tps, tokens = result.get("tokens_per_s"), result.get("tokens_per_step")
    return 1000 * tokens / tps if tps and tokens else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run (default 80)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every row (default 2)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/layout_host_time"), help="results directory")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cpu = gpu_suite.cpu_info()
    profile = gpu_suite.write_profile(out, None)
    print(f"layout_host_time: CPU {cpu['model']}, {cpu['cores']} cores, torch capability {cpu['torch_capability']}; "
          f"load average before {[round(x, 2) for x in os.getloadavg()]}", flush=True)
    times: dict[str, list[float]] = {label: [] for label, _, _ in LAYOUTS}
    times["plain loop"] = []
    extra = ("trainer.gradient_clip_val=1.0",)
    for round_ in range(1, args.rounds + 1):
        for label, strategy, off in LAYOUTS:
            needs = ("deepspeed",) if strategy.startswith("deepspeed") else ()
            row = gpu_suite.Row(f"host-{strategy}", "cpu", "gpt-24x64", "32-true", strategy=strategy, needs=needs)
            if gpu_suite.skip_reason(row, None, cpu, True):
                continue
            res = gpu_suite.run_row(row, out, profile, None, args.steps, 900, extra, levers_off=off,
                                    suffix="-engine" if off else "")
            ms = ms_per_step(res)
            print(f"round {round_}: {label:<28} {res['status']:<6} "
                  f"{'-' if ms is None else f'{ms:.1f} ms/step'} (layout {res.get('layout')})", flush=True)
            if ms is not None:
                times[label].append(ms)
            if strategy == "ddp" and res.get("status") == "ok":
                plain = gpu_suite.run_plain(row, res, out, cpu, 900)
                tps = plain.get("plain_tokens_per_s")
                if tps:
                    times["plain loop"].append(1000 * res["tokens_per_step"] / tps)
                    print(f"round {round_}: {'plain loop':<28} ok     {times['plain loop'][-1]:.1f} ms/step", flush=True)
    medians = {k: statistics.median(v) for k, v in times.items() if v}
    ddp, plain = medians.get("ddp"), medians.get("plain loop")
    print(f"\nload average after {[round(x, 2) for x in os.getloadavg()]}")
    print(f"{'layout (world size 1)':<28} {'ms/step':>8} {'runs':>5} {'/ ddp':>7} {'/ plain':>8}")
    for label, value in medians.items():
        print(f"{label:<28} {value:>8.1f} {len(times[label]):>5} "
              f"{'-' if not ddp else f'{value / ddp:.2f}':>7} {'-' if not plain else f'{value / plain:.2f}':>8}")
    (out / "layout_host_time.json").write_text(json.dumps({"cpu": cpu, "steps": args.steps, "ms_per_step": times,
                                                           "medians": medians}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
