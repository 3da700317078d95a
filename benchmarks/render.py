"""Render speed, measured side by side in one run (no timed assertions in tests).

Prints:
  1. cold `jobgen render` wall time for a SLURM and a Kubernetes profile (median of N runs,
     fresh interpreter each) beside the floor any Jinja+YAML+click CLI pays
     (`python -c "import jinja2, yaml, click"`), and their ratio. Target: SLURM <= 1.2x floor.
  2. the modules a render imports beyond that floor, and whether any heavy one (torch,
     lightning, deepspeed, kubernetes, numpy) is among them.
  3. in-process time per job for planning 1,000 spec variants. Target: <= 50 us per variant.

Usage: python benchmarks/render.py [--runs 15] [--variants 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
HEAVY = ("torch", "lightning", "deepspeed", "kubernetes", "numpy")


def wall(argv: list[str], runs: int, cwd: Path) -> list[float]:
    """Wall-clock seconds of ``runs`` fresh runs of ``argv`` (one warm-up run discarded)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
        if i:
            times.append(time.perf_counter() - start)
    return times


def imported_modules(code: str) -> set[str]:
    """Top-level module names present in sys.modules after running ``code`` in a fresh interpreter."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def per_variant_us(variants: int, profile_name: str = "slurm-a100") -> tuple[float, float]:
    """Median microseconds per plan() over ``variants`` specs (spec validation + render included;
    for a Kubernetes profile also the offline validators, warm after the first plan)."""
    from jobgen.load import load_profile, validate
    from jobgen.plan import plan
    from jobgen.spec import TrainingSpec

    profile = load_profile(profile_name, REPO / "cluster_profiles")
    base = {"name": "bench", "trainer": {"micro_batch_size": 4}}
    docs = [{**base, "name": f"bench-{i}", "trainer": {"micro_batch_size": 1 + i % 16, "max_steps": 1000 + i}} for i in range(variants)]
    plan(validate(TrainingSpec, docs[0], "b"), profile, REPO / "templates")  # warm the template cache
    rounds = []
    for _ in range(3):
        start = time.perf_counter()
        for doc in docs:
            plan(validate(TrainingSpec, doc, "b"), profile, REPO / "templates")
        rounds.append((time.perf_counter() - start) / variants * 1e6)
    only_render = []
    specs = [validate(TrainingSpec, d, "b") for d in docs]
    for _ in range(3):
        start = time.perf_counter()
        for spec in specs:
            plan(spec, profile, REPO / "templates")
        only_render.append((time.perf_counter() - start) / variants * 1e6)
    return statistics.median(rounds), statistics.median(only_render)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--variants", type=int, default=1000)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        floor = wall([py, "-c", "import jinja2, yaml, click"], args.runs, out)
        bare = wall([py, "-c", "pass"], args.runs, out)
        slurm = wall([py, "-m", "jobgen.cli", "render", str(REPO / "examples/quickstart.yaml"), "-p", "slurm-a100", "-o", str(out)], args.runs, REPO)
        k8s = wall([py, "-m", "jobgen.cli", "render", str(REPO / "examples/quickstart.yaml"), "-p", "k8s-h100", "-o", str(out)], args.runs, REPO)
    f = statistics.median(floor)
    print(f"cold start, median of {args.runs} runs (fresh interpreter each):")
    print(f"  python -c pass                        {statistics.median(bare) * 1e3:7.1f} ms")
    print(f"  floor: import jinja2, yaml, click     {f * 1e3:7.1f} ms   1.00x")
    for label, t in (("jobgen render --profile slurm-a100", slurm), ("jobgen render --profile k8s-h100", k8s)):
        m = statistics.median(t)
        print(f"  {label:37} {m * 1e3:7.1f} ms   {m / f:.2f}x floor")
    print(f"  target: slurm render <= 1.20x floor -> {'met' if statistics.median(slurm) / f <= 1.2 else 'NOT met'}")

    floor_mods = imported_modules("import jinja2, yaml, click")
    render_mods = imported_modules(
        "from jobgen.cli import main\n"
        "try:\n"
        f"    main(['render', {str(REPO / 'examples/quickstart.yaml')!r}, '-p', 'slurm-a100', '--stdout'])\n"
        "except SystemExit:\n    pass"
    )
    extra = sorted(render_mods - floor_mods)
    print(f"\nmodules a SLURM render imports beyond the floor ({len(extra)}): {', '.join(extra)}")
    print(f"heavy modules imported: {sorted(set(HEAVY) & render_mods) or 'none'}")

    full, render_only = per_variant_us(args.variants)
    print(f"\nin-process, {args.variants} variants (median of 3 rounds):")
    print(f"  validate + plan + render  {full:7.1f} us per variant")
    print(f"  plan + render only        {render_only:7.1f} us per variant")
    print(f"  target: <= 50 us per variant -> {'met' if full <= 50 else 'NOT met'}")

    # Kubernetes renders run the offline validators (jobgen.k8s_validate): jsonschema, the CRD and
    # kubernetes-validate's core/v1 schemas are loaded once per process, then each plan validates.
    k8s_mods = imported_modules(
        "import time\nfrom jobgen.cli import main\nt = time.perf_counter()\n"
        "try:\n"
        f"    main(['render', {str(REPO / 'examples/quickstart.yaml')!r}, '-p', 'k8s-h100', '--stdout'])\n"
        "except SystemExit:\n    pass"
    )
    k8s_full, _ = per_variant_us(max(1, args.variants // 10), "k8s-h100")
    print(f"\nKubernetes render: modules beyond a SLURM render: {', '.join(sorted(m for m in k8s_mods - render_mods if not m.startswith('_')))}")
    print(f"  validate + plan + render + offline validation  {k8s_full:7.1f} us per variant ({max(1, args.variants // 10)} variants, warm)")


if __name__ == "__main__":
    main()
