"""Predicted against measured tokens/s on this machine's CPU: `jobgen calibrate` on one quick-start
run, then `jobgen plan` predicts three runs of other sizes, which then run.

Usage:
  python benchmarks/predict_cpu.py [--steps 60] [--out /tmp/predict_cpu]

Every run is a real ``jobgen submit examples/quickstart.yaml --profile local`` (short:
``trainer.max_steps`` = ``--steps``, one validation and one checkpoint at the end), and tokens/s is
the entrypoint's own steady-state figure (summary.json ``tokens_per_s_steady``). The calibration
file is the output directory's own (``$JOBGEN_CALIBRATION``), so nothing of the user's changes.

1. the quick start as shipped (d_model 128, micro batch 16, 2 ranks), then
   ``jobgen calibrate`` on its run directory;
2. for each variant, ``jobgen plan -o json`` with the variant's ``--set`` (the ddp row's
   ``tokens_per_s``: value and band), then the run itself:

   * width: ``model.d_model=192`` (2.2x the parameters, 2x the FLOPs per token);
   * micro batch: ``trainer.micro_batch_size=8``;
   * ranks: ``resources.devices_per_node=1`` (one rank of 2 threads instead of 2 ranks of 1).

It prints the CPU model (``lscpu``), the load average before and after, and per run the
predicted tokens/s with its band, the measured tokens/s and measured / predicted. Target: within
20% (0.8-1.2). On a machine other jobs share the figures move with their load: read the load
average with them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = "examples/quickstart.yaml"
VARIANTS = (
    ("quick start (calibrated)", ()),
    ("width: d_model 192", ("model.d_model=192",)),
    ("micro batch 8", ("trainer.micro_batch_size=8",)),
    ("1 rank x 2 threads", ("resources.devices_per_node=1",)),
)


def cpu_model() -> str:
    """``lscpu``'s model name (or ``unknown``)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "unknown")


def jobgen(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=REPO, env=env, capture_output=True, text=True)


def run(name: str, sets: tuple[str, ...], steps: int, out: Path, env: dict[str, str]) -> Path:
    """Train one variant; its run directory."""
    base = (f"name={name}", f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=2",
            f"checkpoint.every_n_steps={steps}", "trainer.log_every_n_steps=10", "checkpoint.resume=never",
            f"trainer.warmup_steps={min(30, steps // 2)}")
    args = ["submit", SPEC, "-p", "local", "--runs-dir", str(out / "runs"), "--allow-dirty"]
    for s in (*base, *sets):
        args += ["--set", s]
    result = jobgen(*args, env=env)
    run_dir = out / "runs" / name
    if result.returncode != 0 or not (run_dir / "summary.json").is_file():
        sys.exit(f"predict_cpu: {name} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return run_dir


def predicted(sets: tuple[str, ...], env: dict[str, str]) -> dict:
    """The ddp row's predicted tokens/s ({value, low, high}) of the quick start with ``sets``."""
    args = ["plan", SPEC, "-p", "local", "-o", "json"]
    for s in sets:
        args += ["--set", s]
    result = jobgen(*args, env=env)
    if result.returncode != 0:
        sys.exit(f"predict_cpu: plan failed:\n{result.stderr}")
    pred = json.loads(result.stdout)["prediction"]
    if not pred["available"]:
        sys.exit(f"predict_cpu: no prediction: {pred['message']}")
    return next(r for r in pred["rows"] if r["layout"] == "ddp")["tokens_per_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default 60)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/predict_cpu"), help="results directory")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cal = out / "calibration.yaml"
    cal.unlink(missing_ok=True)
    env = {**os.environ, "JOBGEN_CALIBRATION": str(cal), "PYTHONPATH": str(REPO)}
    load_before = [round(x, 2) for x in os.getloadavg()]
    print(f"predict_cpu: CPU {cpu_model()}, {os.cpu_count()} cores; load average before {load_before}", flush=True)
    rows = []
    for i, (label, sets) in enumerate(VARIANTS):
        name = f"predict-cpu-{i}"
        if i == 0:
            run_dir = run(name, sets, args.steps, out, env)
            stored = jobgen("calibrate", str(run_dir), env=env)
            if stored.returncode != 0:
                sys.exit(f"predict_cpu: calibrate failed:\n{stored.stderr}")
            print(stored.stdout.strip(), flush=True)
            pred = predicted(sets, env)
        else:
            pred = predicted(sets, env)
            run_dir = run(name, sets, args.steps, out, env)
        measured = json.loads((run_dir / "summary.json").read_text())["tokens_per_s_steady"]
        rows.append({"run": label, "set": list(sets), "predicted": pred, "measured": measured, "ratio": measured / pred["value"]})
        print(f"{label}: predicted {pred['value']:,.0f} ({pred['low']:,.0f}-{pred['high']:,.0f}) tokens/s, "
              f"measured {measured:,.0f}, measured / predicted {measured / pred['value']:.2f}  "
              f"(load {[round(x, 2) for x in os.getloadavg()]})", flush=True)
    load_after = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average after {load_after}")
    print(f"{'run':<26} {'predicted tok/s':>16} {'band':>17} {'measured tok/s':>15} {'measured/predicted':>19}")
    for r in rows:
        p = r["predicted"]
        band = f"{p['low']:,.0f}-{p['high']:,.0f}"
        print(f"{r['run']:<26} {p['value']:>16,.0f} {band:>17} {r['measured']:>15,.0f} {r['ratio']:>19.2f}")
    within = [0.8 <= r["ratio"] <= 1.2 for r in rows[1:]]
    print(f"within 20%: {sum(within)} of {len(within)} predicted runs")
    (out / "predict_cpu.json").write_text(json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "steps": args.steps,
                                                      "load_before": load_before, "load_after": load_after, "rows": rows},
                                                     indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
