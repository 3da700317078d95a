"""jobgen.planning.estimate vs measured peak memory of fp32 AdamW training on CPU (benchmarks/memory.py).

Acceptance: within 25% of the RSS high-water mark attributable to training, for a model where
model state dominates (~43M parameters) and for one where activations are a large share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, require

pytestmark = pytest.mark.slow

require("torch", "torch not installed (pip install torch==2.13.0, README)")

TOLERANCE = 0.25


@pytest.mark.parametrize("args", [
    ("--n-layer", "6", "--n-head", "12", "--d-model", "768", "--block-size", "128", "--batch", "4"),
    ("--n-layer", "4", "--n-head", "8", "--d-model", "256", "--block-size", "512", "--batch", "8"),
], ids=["model-states", "activations"])
def test_estimate_within_25_percent_of_measured_cpu_peak(args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Two steps reach the steady peak: the second backward runs with AdamW's state allocated (the
    # first runs before the optimizer has any); a third step repeats the second's peak.
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memory.py"), *args, "--steps", "2"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    print(f"\n{r['n_params'] / 1e6:.1f}M params {r['shape']}: measured {r['measured_bytes'] / 2**20:.0f} MiB, "
          f"estimated {r['estimated_bytes'] / 2**20:.0f} MiB ({r['relative_error']:+.1%}); "
          f"breakdown MiB {{{', '.join(f'{k}: {v / 2**20:.0f}' for k, v in r['estimated_breakdown'].items())}}}")
    assert r["n_params"] == r["n_params_estimated"]
    assert abs(r["relative_error"]) <= TOLERANCE
