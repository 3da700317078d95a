"""Cost of the SLURM requeue-signal check (RequeueOnSignal) in the entrypoint's training loop.

Runs the same tiny 2-rank job (gloo on CPU, one rank per "node", launched with the variables
srun gives each task) with and without ``launch.requeue_signal``, alternating, and prints
tokens/s (``tokens_per_s_mean`` from summary.json) side by side with the ratio. No signal is
sent: this measures what every step pays for being pre-emptible (an asynchronous all-reduce of
one flag in a gloo group per optimizer step).

Usage::

    python benchmarks/requeue_overhead.py [--steps 300] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jobgen.specs.training import TrainingSpec  # noqa: E402

SPEC = {
    "name": "requeue-overhead",
    "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
    "data": {"max_bytes": 1_000_000},
    "trainer": {"precision": "32-true", "micro_batch_size": 4, "warmup_steps": 2, "learning_rate": 3e-3,
                "val_check_interval": 1_000_000, "limit_val_batches": 1, "log_every_n_steps": 50},
    "checkpoint": {"every_n_steps": 1_000_000},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(root: Path, steps: int, requeue_signal: str | None) -> float:
    """Train ``steps`` optimizer steps on 2 srun-style ranks; return tokens/s over both ranks."""
    spec = TrainingSpec.model_validate({**SPEC, "trainer": {**SPEC["trainer"], "max_steps": steps}})
    doc = {
        "jobgen_version": "bench", "inputs_sha256": "0" * 64, "profile": "bench",
        "spec": spec.model_dump(mode="json"),
        "launch": {"scheduler": "slurm", "accelerator": "cpu", "num_nodes": 2, "devices_per_node": 1,
                   "world_size": 2, "deepspeed_config": None, "requeue_signal": requeue_signal},
    }  # fmt: skip
    root.mkdir(parents=True)
    (root / "spec.json").write_text(json.dumps(doc))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_"))}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "SLURM_JOB_ID": "1", "SLURM_JOB_NAME": "bench", "SLURM_NODELIST": "localhost",
                "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "2", "SLURM_LOCALID": "0"})  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jobgen.train", "--spec", str(root / "spec.json"), "--run-dir", str(root / "run")],
            env={**env, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(rank)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for rank in range(2)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    if codes != [0, 0]:
        raise SystemExit(f"training failed with exit codes {codes} in {root}")
    return json.loads((root / "run" / "summary.json").read_text())["tokens_per_s_mean"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternating (default 2)")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory(prefix="jobgen-requeue-bench-") as tmp:
        for i in range(args.repeats):
            for name, requeue_signal in (("without", None), ("with", "USR2")):
                rate = run_job(Path(tmp) / f"{name}-{i}", args.steps, requeue_signal)
                results[name].append(rate)
                print(f"run {i + 1} {name:>7} requeue check: {rate:9,.0f} tok/s", flush=True)
    without, with_ = statistics.median(results["without"]), statistics.median(results["with"])
    print(f"median over {args.repeats} run(s) of {args.steps} steps, 2 CPU ranks: without {without:,.0f} tok/s, "
          f"with {with_:,.0f} tok/s, with/without {with_ / without:.3f}")


if __name__ == "__main__":
    main()
