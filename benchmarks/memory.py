"""Measured vs estimated peak memory of fp32 AdamW training on CPU (checks jobgen.planning.estimate).

Builds the bundled GPT (jobgen.train.model.GPT) at a size where model state dominates
(tens of millions of parameters, a short context), runs a few AdamW steps in ONE process
(no DDP: world size 1, precision 32-true), and measures the peak memory attributable to
training as the RSS high-water mark (``getrusage(RUSAGE_SELF).ru_maxrss``) at the end minus
the resident set size just before the model is built (after importing torch, so the Python and
torch runtime is not counted — the estimate does not model it either). Compares with
``jobgen.planning.estimate.estimate(..., "32-true", Layout("ddp"), world size 1, accelerator "cpu",
overhead 0)``: 4Ψ parameters + 4Ψ gradients + 8Ψ Adam moments + step temporaries + activations.

Prints one JSON object. Usage:
  python benchmarks/memory.py [--n-layer 6 --n-head 12 --d-model 768 --block-size 128 --batch 4 --steps 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc/self/statm), bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(n_layer: int, n_head: int, d_model: int, block_size: int, batch: int, steps: int) -> dict:
    """Train ``steps`` AdamW steps in this process; return measured and estimated bytes."""
    import torch
    import torch.nn.functional as F

    from jobgen.planning.estimate import Layout, Shape, estimate
    from jobgen.train.model import GPT

    torch.manual_seed(0)
    x = torch.randint(0, 256, (batch, block_size))
    y = torch.randint(0, 256, (batch, block_size))
    gc.collect()
    before = rss_bytes()
    model = GPT(n_layer, n_head, d_model, block_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    losses = []
    for _ in range(steps):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    n_params = sum(dict((p.data_ptr(), p.numel()) for p in model.parameters()).values())
    shape = Shape(n_layer, n_head, d_model, block_size, batch)
    est = estimate(shape, "32-true", Layout("ddp"), num_nodes=1, devices_per_node=1, accelerator="cpu", overhead_bytes=0)
    measured = peak - before
    return {
        "n_params": n_params,
        "n_params_estimated": shape.n_params,
        "shape": {"n_layer": n_layer, "n_head": n_head, "d_model": d_model, "block_size": block_size, "batch": batch},
        "steps": steps,
        "losses": losses,
        "rss_before_bytes": before,
        "rss_peak_bytes": peak,
        "measured_bytes": measured,
        "estimated_bytes": est.total_bytes,
        "estimated_breakdown": {"params": est.params_bytes, "grads": est.grads_bytes, "optimizer": est.optimizer_bytes,
                                "activations": est.activations_bytes},
        "relative_error": (est.total_bytes - measured) / measured,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    a = parser.parse_args()
    print(json.dumps(measure(a.n_layer, a.n_head, a.d_model, a.block_size, a.batch, a.steps), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
