"""Render speed, measured side by side in one run (no timed assertions in tests).

Prints:
  1. cold-process wall time (median and min of N runs, fresh interpreter each) of
       - ``python -c pass`` (interpreter start-up, for context),
       - the floor any Jinja+YAML+click CLI pays: ``python -c "import jinja2, yaml, click"``,
       - ``jobgen render examples/quickstart.yaml -p slurm-a100 --stdout``,
       - ``jobgen render examples/quickstart.yaml -p k8s-h100 --stdout`` (offline validation runs:
         the benchmark stops if any check is skipped, e.g. for want of the CRDs),
       - the SLURM render with ``PYDANTIC_DISABLE_PLUGINS=__all__`` (pydantic skips its plugin
         discovery through importlib.metadata: what a user who sets it gains; jobgen does not set
         it itself, see docs/development.md, "Render speed"),
       - the Kubernetes render with jobgen's cache off (``JOBGEN_CACHE_DIR=off``: the CRDs parsed from
         YAML and the templates compiled in every run),
       - two lower bounds no render can beat while its inputs are pydantic models: the floor plus
         ``import jobgen.specs.training, jobgen.specs.profile`` (pydantic and the spec/profile models, no render),
         and that plus ``import jsonschema`` (the Kubernetes render's schema validator),
       - when TorchX is importable (``pip install -e .[bench]``): TorchX's dry runs of the same
         shape of job, ``torchx run --scheduler slurm --dryrun dist.ddp -j 2x8 --script train.py``
         and the same with ``--scheduler kubernetes -cfg queue=default`` (both ``--workspace ""``:
         no image build, no docker),
     run interleaved (A B C D A B C D ...) so machine load hits all of them alike. Targets: the
     SLURM render <= TorchX's SLURM dry run, the Kubernetes render (with validation) <
     TorchX's Kubernetes dry run, compared on the median wall time and on the median CPU time; the
     floor rows are context (the old floor ratios were retired: importing pydantic and building
     the models costs more than them). Beside the wall time, the children's CPU time (user +
     system), which other processes on a busy machine disturb less. With ``--baseline PATH`` the
     two renders of that checkout run in the same rounds, so a change is measured against its
     parent side by side.
  2. ``python -X importtime``: the 10 modules with the largest cumulative import time for each
     command (median over a few runs).
  3. the modules a SLURM render imports beyond the floor, and which heavy ones (torch, lightning,
     deepspeed, kubernetes, jsonschema, ...) each render imports.
  4. ``jobgen render --all --check`` of a generated project of ``--project-jobs`` (100) specs,
     alternately on slurm-a100 and k8s-h100 (rendered once first, so the check finds them in
     sync): wall and CPU median of ``--project-runs`` runs (with ``--baseline``, that checkout
     checks its own copy of the project in the same rounds). Target: < 3 s.
  5. in-process time per job for planning 1,000 spec variants. Target: <= 50 us per variant.

Bytecode and jobgen's cache: every child runs with ``PYTHONPYCACHEPREFIX`` and
``JOBGEN_CACHE_DIR`` set to fresh temporary directories and without ``PYTHONDONTWRITEBYTECODE``,
so the discarded warm-up round compiles every module once and fills jobgen's cache of derived
data (jobgen/planning/cache.py: parsed CRD schemas, compiled templates), and the timed rounds read them,
as an installed jobgen does from the second render on. Each timed render renders a different
spec (``--set trainer.seed=<round>``), so nothing a render produces can come from a cache.

Usage: python benchmarks/render.py [--runs 15] [--variants 1000] [--project-jobs 100] [--project-runs 5]
                                  [--repo PATH] [--baseline PATH] [--crds-dir DIR]
(``--repo`` times another checkout of jobgen with this same harness; ``--baseline`` adds one.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
#: Modules a render must not need; a SLURM render imports none of them.
HEAVY = ("torch", "lightning", "deepspeed", "numpy", "kubernetes", "kubernetes_validate", "jsonschema", "referencing")
FLOOR = "import jinja2, yaml, click"
#: The floor plus jobgen's validated input models (pydantic): what any render imports and builds.
MODELS_BOUND = FLOOR + ", jobgen.specs.training, jobgen.specs.profile"
#: jobgen's render -> (the TorchX dry run it is compared with, how): its median must be at most
#: ("<=") or below ("<") TorchX's, in wall time and in CPU time.
TARGETS = {"slurm": ("torchx-slurm", "<="), "k8s": ("torchx-k8s", "<")}
#: ``render --all --check`` of the generated project, wall median, below this many seconds.
PROJECT_TARGET_S = 3.0
#: The job TorchX dry-runs: its builtin DDP component, 2 nodes x 8 processes, the script below.
TORCHX_JOB = ["dist.ddp", "-j", "2x8", "--script", "train.py"]


def torchx_argv(scheduler: str) -> list[str]:
    """``torchx run --dryrun`` of :data:`TORCHX_JOB` on ``scheduler`` (no workspace: no image build)."""
    cfg = ["-cfg", "queue=default"] if scheduler == "kubernetes" else []
    return [sys.executable, "-m", "torchx.cli.main", "run", "--workspace", "", "--scheduler", scheduler, "--dryrun", *cfg, *TORCHX_JOB]


def write_project(root: Path, repo: Path, jobs: int) -> Path:
    """A jobgen.yaml of ``jobs`` generated specs (the quickstart, each with its own name, seed and
    learning rate), alternately on slurm-a100 and k8s-h100, under ``root``; returns the file."""
    import yaml

    base = yaml.safe_load((repo / "examples" / "quickstart.yaml").read_text())
    (root / "specs").mkdir(parents=True)
    entries = []
    for i in range(jobs):
        name = f"gen-{i:03d}"
        doc = {**base, "name": name, "trainer": {**base["trainer"], "seed": i, "learning_rate": 1e-4 * (1 + i % 7)}}
        (root / "specs" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        entries.append({"spec": f"specs/{name}.yaml", "profiles": ["slurm-a100" if i % 2 == 0 else "k8s-h100"]})
    project = root / "jobgen.yaml"
    project.write_text(yaml.safe_dump({"out": "manifests", "jobs": entries}, sort_keys=False))
    return project


def project_argv(repo: Path, project: Path, *extra: str) -> list[str]:
    """``jobgen render --all`` of ``project`` with ``repo``'s profiles and templates."""
    return [sys.executable, "-m", "jobgen.cli", "render", "--all", "--project", str(project), "--profiles-dir",
            str(repo / "cluster_profiles"), "--templates-dir", str(repo / "templates"), *extra]


@dataclass
class Command:
    """One timed command line with the environment it runs in, and its timings (seconds)."""

    label: str
    argv: list[str]
    env: dict[str, str]
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    #: A render: each round renders a different spec (``--set trainer.seed=<round>``).
    vary: bool = False
    #: The directory it runs in (None: the one :func:`time_interleaved` is given).
    cwd: Path | None = None


def child_env(repo: Path, pycache: Path, crds: Path | None) -> dict[str, str]:
    """Environment of every timed child: ``repo`` first on the path, cached bytecode, the CRDs."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "JOBGEN_DEBUG")}
    env.update(PYTHONPATH=str(repo), PYTHONPYCACHEPREFIX=str(pycache), JOBGEN_CACHE_DIR=str(pycache.parent / "jobgen-cache"))
    if crds is not None:
        env["JOBGEN_CRDS_DIR"] = str(crds)
    return env


def render_argv(repo: Path, profile: str) -> list[str]:
    """``jobgen render examples/quickstart.yaml -p PROFILE --stdout`` as run from ``repo``."""
    return [sys.executable, "-m", "jobgen.cli", "render", str(repo / "examples" / "quickstart.yaml"), "-p", profile, "--stdout"]


def check(cmd: Command, cwd: Path) -> None:
    """Run ``cmd`` once (this also fills the bytecode cache); stop on a failure or on a skipped
    offline check, which would leave the validation out of the timing."""
    out = subprocess.run(cmd.argv, env=cmd.env, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{cmd.label}: exit {out.returncode}\n{out.stderr}")
    if "offline validation skipped" in out.stderr + out.stdout:
        sys.exit(f"{cmd.label}: offline validation skipped, the timing would not include it; pass --crds-dir\n{out.stderr}")


def time_interleaved(cmds: dict[str, Command], runs: int, cwd: Path) -> None:
    """Record wall and CPU seconds of ``runs`` fresh runs of each command, interleaved round by
    round (A B C A B C ...; one warm-up round discarded)."""
    for i in range(runs + 1):
        for cmd in cmds.values():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            argv = [*cmd.argv, "--set", f"trainer.seed={1000 + i}"] if cmd.vary else cmd.argv
            subprocess.run(argv, cwd=cmd.cwd or cwd, env=cmd.env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if i:
                cmd.wall.append(wall)
                cmd.cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


def importtime_top(cmd: Command, cwd: Path, runs: int, top: int = 10) -> list[tuple[str, float, float]]:
    """(module, cumulative ms, self ms) of the ``top`` modules by cumulative import time, medians of ``runs``."""
    cumulative: dict[str, list[int]] = {}
    own: dict[str, list[int]] = {}
    for _ in range(runs):
        out = subprocess.run([cmd.argv[0], "-X", "importtime", *cmd.argv[1:]], cwd=cwd, env=cmd.env, capture_output=True, text=True, check=True)
        for line in out.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, cum_us, name = line[len("import time:"):].split("|")
            cumulative.setdefault(name.rstrip(), []).append(int(cum_us))
            own.setdefault(name.rstrip(), []).append(int(self_us))
    ranked = sorted(cumulative, key=lambda n: -statistics.median(cumulative[n]))[:top]
    return [(name, statistics.median(cumulative[name]) / 1e3, statistics.median(own[name]) / 1e3) for name in ranked]


def imported_modules(code: str, env: dict[str, str], cwd: Path) -> set[str]:
    """Top-level module names present in sys.modules after running ``code`` in a fresh interpreter."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def render_probe(repo: Path, profile: str) -> str:
    """Python code that renders the quickstart for ``profile`` through ``jobgen.cli.main``."""
    return ("from jobgen.cli import main\ntry:\n"
            f"    main(['render', {str(repo / 'examples' / 'quickstart.yaml')!r}, '-p', {profile!r}, '--stdout'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code")


def per_variant_us(repo: Path, variants: int, profile_name: str = "slurm-a100") -> tuple[float, float]:
    """Median microseconds per plan() over ``variants`` specs (spec validation + render included;
    for a Kubernetes profile also the offline validators, warm after the first plan)."""
    from jobgen.backends import plan
    from jobgen.specs.load import load_profile, validate
    from jobgen.specs.training import TrainingSpec

    profile = load_profile(profile_name, repo / "cluster_profiles")
    base = {"name": "bench", "trainer": {"micro_batch_size": 4}}
    docs = [{**base, "name": f"bench-{i}", "trainer": {"micro_batch_size": 1 + i % 16, "max_steps": 1000 + i}} for i in range(variants)]
    plan(validate(TrainingSpec, docs[0], "b"), profile, repo / "templates")  # warm the template cache
    rounds = []
    for _ in range(3):
        start = time.perf_counter()
        for doc in docs:
            plan(validate(TrainingSpec, doc, "b"), profile, repo / "templates")
        rounds.append((time.perf_counter() - start) / variants * 1e6)
    only_render = []
    specs = [validate(TrainingSpec, d, "b") for d in docs]
    for _ in range(3):
        start = time.perf_counter()
        for spec in specs:
            plan(spec, profile, repo / "templates")
        only_render.append((time.perf_counter() - start) / variants * 1e6)
    return statistics.median(rounds), statistics.median(only_render)


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def default_crds(repo: Path) -> Path | None:
    """``$JOBGEN_CRDS_DIR``, else ``None``: the CRDs packaged with the checkout under test."""
    del repo
    return Path(os.environ["JOBGEN_CRDS_DIR"]) if os.environ.get("JOBGEN_CRDS_DIR") else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each command (default 15)")
    parser.add_argument("--importtime-runs", type=int, default=3, help="-X importtime runs per command (default 3; 0: skip)")
    parser.add_argument("--variants", type=int, default=1000, help="spec variants for the in-process timing (default 1000; 0: skip)")
    parser.add_argument("--project-jobs", type=int, default=100, help="specs of the generated project for render --all --check (default 100; 0: skip)")
    parser.add_argument("--project-runs", type=int, default=5, help="timed render --all --check runs (default 5)")
    parser.add_argument("--repo", type=Path, default=HERE, help="checkout of jobgen to time (default: this one)")
    parser.add_argument("--baseline", type=Path, default=None, help="a second checkout whose renders run in the same rounds")
    parser.add_argument("--crds-dir", type=Path, default=None,
                        help="CRDs for the Kubernetes render's offline validation (default: $JOBGEN_CRDS_DIR, else the checkout's packaged copies)")
    args = parser.parse_args()
    repo = args.repo.resolve()
    crds = args.crds_dir or default_crds(repo)

    with tempfile.TemporaryDirectory() as tmp:
        # Children run in an empty directory: a checkout as the working directory would come first
        # on sys.path (before PYTHONPATH) and shadow the other checkout's jobgen.
        cwd = Path(tmp) / "cwd"
        cwd.mkdir()
        env = child_env(repo, Path(tmp) / "pycache", crds)
        cmds = {
            "bare": Command("python -c pass", [sys.executable, "-c", "pass"], env),
            "floor": Command(f'floor: python -c "{FLOOR}"', [sys.executable, "-c", FLOOR], env),
            "slurm": Command("jobgen render quickstart -p slurm-a100 --stdout", render_argv(repo, "slurm-a100"), env, vary=True),
            "k8s": Command("jobgen render quickstart -p k8s-h100 --stdout", render_argv(repo, "k8s-h100"), env, vary=True),
            "k8s-nocache": Command("  the same, JOBGEN_CACHE_DIR=off", render_argv(repo, "k8s-h100"),
                                   {**env, "JOBGEN_CACHE_DIR": "off"}, vary=True),
            "slurm-noplugins": Command("  the same, PYDANTIC_DISABLE_PLUGINS=__all__", render_argv(repo, "slurm-a100"),
                                       {**env, "PYDANTIC_DISABLE_PLUGINS": "__all__"}, vary=True),
            "models": Command("bound: floor + jobgen.specs.training, jobgen.specs.profile", [sys.executable, "-c", MODELS_BOUND], env),
            "models+jsonschema": Command("bound: the same + jsonschema", [sys.executable, "-c", MODELS_BOUND + ", jsonschema"], env),
        }
        has_torchx = importlib.util.find_spec("torchx") is not None
        if has_torchx:
            (cwd / "train.py").write_text("print('train')\n")  # TorchX's --script; never run by a dry run
            cmds["torchx-slurm"] = Command("torchx run --scheduler slurm --dryrun dist.ddp -j 2x8", torchx_argv("slurm"), env)
            cmds["torchx-k8s"] = Command("torchx run --scheduler kubernetes --dryrun dist.ddp -j 2x8", torchx_argv("kubernetes"), env)
        if args.baseline is not None:
            baseline = args.baseline.resolve()
            benv = child_env(baseline, Path(tmp) / "pycache", crds)
            cmds["slurm@baseline"] = Command("  the same, --baseline checkout", render_argv(baseline, "slurm-a100"), benv, vary=True)
            cmds["k8s@baseline"] = Command("  the same, --baseline checkout", render_argv(baseline, "k8s-h100"), benv, vary=True)
        for cmd in cmds.values():
            check(cmd, cwd)
        where = {key: subprocess.run([sys.executable, "-c", "import jobgen; print(jobgen.__file__)"], env=cmds[key].env, cwd=cwd,
                                     capture_output=True, text=True, check=True).stdout.strip() for key in cmds if key.startswith(("slurm", "k8s"))}
        load_before = os.getloadavg()
        time_interleaved(cmds, args.runs, cwd)
        project_cmd = None
        project_cmds: dict[str, Command] = {}
        if args.project_jobs:
            # With --baseline, that checkout checks its own copy of the project in the same rounds.
            for key, checkout, cenv in [("project", repo, env)] + ([("project@baseline", baseline, benv)] if args.baseline else []):
                project = write_project(Path(tmp) / key, checkout, args.project_jobs)
                subprocess.run(project_argv(checkout, project), cwd=project.parent, env=cenv, check=True, capture_output=True)
                label = f"jobgen render --all --check ({args.project_jobs} jobs)" if key == "project" else "  the same, --baseline checkout"
                project_cmds[key] = Command(label, project_argv(checkout, project, "--check"), cenv, cwd=project.parent)
                check(project_cmds[key], project.parent)
            project_cmd = project_cmds["project"]
            time_interleaved(project_cmds, args.project_runs, cwd)
        load_after = os.getloadavg()
        tops = {key: importtime_top(cmd, cwd, args.importtime_runs) for key, cmd in cmds.items()
                if key in ("floor", "slurm", "k8s")} if args.importtime_runs else {}
        floor_mods = imported_modules(FLOOR, env, cwd)
        slurm_mods = imported_modules(render_probe(repo, "slurm-a100"), env, cwd)
        k8s_mods = imported_modules(render_probe(repo, "k8s-h100"), env, cwd)

    print(f"jobgen: {where['slurm']}" + (f"; --baseline: {where['slurm@baseline']}" if "slurm@baseline" in where else ""))
    print(f"python {sys.version.split()[0]} ({sys.executable}); CPU {cpu_model()}, {os.cpu_count()} logical cores; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; CRDs {crds or 'packaged'}")
    print(f"\ncold start: {args.runs} runs of each, interleaved, fresh interpreter each, bytecode cached "
          "(the Kubernetes render validates offline)")
    print(f"  {'command':56} {'wall median':>11} {'min':>8} {'max':>9} {'vs floor':>8}   {'CPU median':>10} {'vs floor':>8}")
    floor_wall = statistics.median(cmds["floor"].wall)
    floor_cpu = statistics.median(cmds["floor"].cpu)
    verdicts = []
    for key, cmd in cmds.items():
        wall, cpu = statistics.median(cmd.wall), statistics.median(cmd.cpu)
        line = (f"  {cmd.label:56} {wall * 1e3:9.1f}ms {min(cmd.wall) * 1e3:6.1f}ms {max(cmd.wall) * 1e3:7.1f}ms "
                f"{wall / floor_wall:7.2f}x   {cpu * 1e3:8.1f}ms {cpu / floor_cpu:7.2f}x")
        other, how = TARGETS.get(key.split("@")[0], (None, ""))
        if other in cmds:
            ow, oc = statistics.median(cmds[other].wall), statistics.median(cmds[other].cpu)
            ok = (wall <= ow and cpu <= oc) if how == "<=" else (wall < ow and cpu < oc)
            line += f"   vs TorchX: wall {wall / ow:.2f}x, CPU {cpu / oc:.2f}x (target {how} 1) {'PASS' if ok else 'FAIL'}"
            if "@" not in key:
                verdicts.append(ok)
        print(line)
    if not has_torchx:
        print("  (TorchX not importable: no TorchX rows; pip install -e '.[bench]' to compare)")
    if project_cmd is not None:
        print(f"\n{project_cmd.label}, {args.project_runs} runs (jobs alternately slurm-a100 / k8s-h100, all in sync):")
        for key, cmd in project_cmds.items():
            wall, cpu = statistics.median(cmd.wall), statistics.median(cmd.cpu)
            line = f"  {cmd.label.strip() if key != 'project' else 'this checkout'}: wall median {wall:.2f} s (min {min(cmd.wall):.2f}, " \
                   f"max {max(cmd.wall):.2f}); CPU median {cpu:.2f} s"
            if key == "project":
                ok = wall < PROJECT_TARGET_S
                verdicts.append(ok)
                line += f"; target < {PROJECT_TARGET_S:.0f} s wall: {'PASS' if ok else 'FAIL'}"
            print(line)

    for key, top in tops.items():
        print(f"\n-X importtime, top 10 by cumulative time: {cmds[key].label.strip()} ({key}; median of {args.importtime_runs}):")
        for name, cum, own in top:
            print(f"  {cum:7.1f} ms cumulative {own:6.1f} ms self  {name}")

    extra = sorted(m for m in slurm_mods - floor_mods if not m.startswith("_"))
    print(f"\nmodules a SLURM render imports beyond the floor ({len(extra)}): {', '.join(extra)}")
    print(f"heavy modules imported by a SLURM render: {sorted(set(HEAVY) & slurm_mods) or 'none'}; "
          f"by a Kubernetes render: {sorted(set(HEAVY) & k8s_mods) or 'none'}")

    if args.variants:
        sys.path.insert(0, str(repo))
        if crds is not None:
            os.environ["JOBGEN_CRDS_DIR"] = str(crds)
        full, render_only = per_variant_us(repo, args.variants)
        print(f"\nin-process, {args.variants} variants (median of 3 rounds):")
        print(f"  validate + plan + render  {full:7.1f} us per variant")
        print(f"  plan + render only        {render_only:7.1f} us per variant")
        print(f"  target: <= 50 us per variant -> {'met' if full <= 50 else 'NOT met'}")
        # Kubernetes renders run the offline validators (jobgen.backends.kubernetes.validate): jsonschema, the CRD and
        # kubernetes-validate's core/v1 schemas are loaded once per process, then each plan validates.
        k8s_full, _ = per_variant_us(repo, max(1, args.variants // 10), "k8s-h100")
        print(f"  Kubernetes: validate + plan + render + offline validation  {k8s_full:7.1f} us per variant "
              f"({max(1, args.variants // 10)} variants, warm)")
    print(f"\ntargets (TorchX comparisons where TorchX is installed, render --all --check): {'all met' if all(verdicts) else 'NOT all met'}")


if __name__ == "__main__":
    main()
