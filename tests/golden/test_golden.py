"""Golden files for every shipped profile x example spec, rendered through production code.

``UPDATE_GOLDEN=1 pytest tests/golden`` is the only writer; a missing golden fails. It refuses
to write when ``CI`` is set: a CI run that rewrote the goldens would compare the output with
itself and pass whatever changed. Goldens prove stability, not correctness, so every sbatch
and ssh launch.sh golden also passes ``bash -n`` and shellcheck, and tests/unit/test_sbatch_directives.py checks
each ``#SBATCH`` value against the profile and spec it comes from.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobgen.backends import plan
from jobgen.errors import JobgenError
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import EXAMPLES, PROFILES, REPO, TEMPLATES, lint_bash

GOLDEN = Path(__file__).parent / "data"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def update_refused(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Why ``UPDATE_GOLDEN=1`` may not rewrite goldens here (``CI`` set, to anything but
    empty), else None."""
    if environ.get("UPDATE_GOLDEN") == "1" and environ.get("CI", ""):
        return (f"UPDATE_GOLDEN=1 refuses to rewrite golden files when CI is set (CI={environ['CI']!r}): in CI the goldens "
                "are what the output is checked against. Update them locally (unset CI), review the diff and commit it.")
    return None
#: Golden-only specs (not shipped examples, so the example-wide tests do not run them): every
#: profile renders or refuses each, like an example.
SPECS = Path(__file__).parent / "specs"
CASES = [(p.stem, e) for p in sorted(PROFILES.glob("*.yaml"))
         for e in sorted([*EXAMPLES.glob("*.yaml"), *SPECS.glob("*.yaml")])]


def render_case(profile: str, example: Path) -> dict[str, str]:
    """Files of the plan, or ``{"error.txt": message}`` when jobgen refuses the combination."""
    try:
        job_plan = plan(load_spec(example), load_profile(profile, PROFILES), TEMPLATES,
                        spec_source=f"{example.parent.relative_to(REPO)}/{example.name}")
    except JobgenError as exc:
        return {"error.txt": str(exc) + "\n"}
    return dict(job_plan.files)


@pytest.mark.parametrize(("profile", "example"), CASES, ids=[f"{p}-{e.stem}" for p, e in CASES])
def test_golden(profile, example):
    got = render_case(profile, example)
    case_dir = GOLDEN / profile / example.stem
    if UPDATE:
        refused = update_refused(os.environ)
        if refused:
            pytest.fail(refused)
        shutil.rmtree(case_dir, ignore_errors=True)
        case_dir.mkdir(parents=True)
        for name, text in got.items():
            (case_dir / name).write_text(text)
    assert case_dir.is_dir(), f"missing golden {case_dir}; run UPDATE_GOLDEN=1 pytest tests/golden and review the diff"
    expected = {p.name: p.read_text() for p in case_dir.iterdir()}
    assert sorted(got) == sorted(expected), "different set of files"
    for name in got:
        if got[name] != expected[name]:
            diff = "".join(difflib.unified_diff(expected[name].splitlines(True), got[name].splitlines(True), f"golden/{name}", f"rendered/{name}"))
            pytest.fail(f"{profile}/{example.stem}/{name} differs from golden:\n{diff}")


#: Sweeps rendered as one SLURM job array (golden-only profiles in profiles/): (profile, spec, sweeps).
ARRAY_PROFILES = Path(__file__).parent / "profiles"
ARRAY_CASES = [("slurm-cpu-array", "quickstart", ("trainer.learning_rate=1e-4,3e-4", "trainer.micro_batch_size=4,8"))]


def render_array_case(profile: str, example: str, sweeps: tuple[str, ...]) -> dict[str, str]:
    """Files of the array job directory (relative paths, points/<i>/ included), through GitOps' planner."""
    from jobgen.api import PLANNERS
    from jobgen.planning.sweep import SpecOptions, plan_single

    render = plan_single(str(EXAMPLES / f"{example}.yaml"), profile, PLANNERS,
                         SpecOptions(sweeps=sweeps, out="/nonexistent-out", profiles_dir=str(ARRAY_PROFILES), templates_dir=str(TEMPLATES)))
    assert len(render.jobs) == 1, "a sweep on an array profile is one job"
    return dict(render.jobs[0].plan.files)


@pytest.mark.parametrize(("profile", "example", "sweeps"), ARRAY_CASES, ids=[f"{p}-{e}" for p, e, _ in ARRAY_CASES])
def test_array_golden(profile, example, sweeps):
    got = render_array_case(profile, example, sweeps)
    case_dir = GOLDEN / profile / f"{example}-sweep"
    if UPDATE:
        refused = update_refused(os.environ)
        if refused:
            pytest.fail(refused)
        shutil.rmtree(case_dir, ignore_errors=True)
        for name, text in got.items():
            (case_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (case_dir / name).write_text(text)
    assert case_dir.is_dir(), f"missing golden {case_dir}; run UPDATE_GOLDEN=1 pytest tests/golden and review the diff"
    expected = {p.relative_to(case_dir).as_posix(): p.read_text() for p in case_dir.rglob("*") if p.is_file()}
    assert sorted(got) == sorted(expected), "different set of files"
    for name in got:
        if got[name] != expected[name]:
            diff = "".join(difflib.unified_diff(expected[name].splitlines(True), got[name].splitlines(True), f"golden/{name}", f"rendered/{name}"))
            pytest.fail(f"{profile}/{example}-sweep/{name} differs from golden:\n{diff}")
    assert render_array_case(profile, example, sweeps) == got, "not deterministic"


def test_render_is_deterministic():
    for profile, example in CASES:
        assert render_case(profile, example) == render_case(profile, example)


def test_no_golden_without_a_case():
    known = {(p, e.stem) for p, e in CASES} | {(p, f"{e}-sweep") for p, e, _ in ARRAY_CASES}
    on_disk = {(d.parent.name, d.name) for d in GOLDEN.glob("*/*") if d.is_dir()}
    assert on_disk <= known, f"stale goldens: {sorted(on_disk - known)}"


SBATCH_GOLDENS = sorted(GOLDEN.glob("*/*/job.sbatch"))


@pytest.mark.parametrize("script", SBATCH_GOLDENS, ids=[f"{s.parent.parent.name}-{s.parent.name}" for s in SBATCH_GOLDENS])
def test_sbatch_golden_passes_bash_n_and_shellcheck(script):
    lint_bash(script)


def test_there_are_sbatch_goldens():
    assert len(SBATCH_GOLDENS) >= 4


LAUNCH_GOLDENS = sorted(GOLDEN.glob("*/*/launch.sh"))


@pytest.mark.parametrize("script", LAUNCH_GOLDENS, ids=[f"{s.parent.parent.name}-{s.parent.name}" for s in LAUNCH_GOLDENS])
def test_ssh_launch_golden_passes_bash_n_and_shellcheck(script):
    lint_bash(script)


def test_there_are_ssh_launch_goldens():
    assert len(LAUNCH_GOLDENS) >= 4


@pytest.mark.parametrize(("environ", "refused"), [
    ({"UPDATE_GOLDEN": "1", "CI": "true"}, True),
    ({"UPDATE_GOLDEN": "1", "CI": "1"}, True),
    ({"UPDATE_GOLDEN": "1", "CI": ""}, False),
    ({"UPDATE_GOLDEN": "1"}, False),
    ({"CI": "true"}, False),
])
def test_update_golden_is_refused_in_ci(environ, refused):
    assert (update_refused(environ) is not None) == refused


def test_update_golden_in_ci_fails_and_leaves_the_goldens_alone(tmp_path):
    """The whole path: pytest with UPDATE_GOLDEN=1 and CI=true fails with the reason, and the
    golden directory is the same one (an update deletes and rewrites it)."""
    profile, example = CASES[0]
    case_dir = GOLDEN / profile / example.stem
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in case_dir.iterdir()}
    env = {**os.environ, "UPDATE_GOLDEN": "1", "CI": "true", "PYTHONPATH": str(REPO)}
    test_id = f"{Path(__file__)}::test_golden[{profile}-{example.stem}]"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test_id], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "UPDATE_GOLDEN=1 refuses to rewrite golden files when CI is set" in proc.stdout, proc.stdout
    assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in case_dir.iterdir()} == before
