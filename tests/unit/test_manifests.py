"""The files committed under manifests/ are exactly what `jobgen render --all` renders from the
repository's jobgen.yaml (no drift, nothing hand-made, nothing stale)."""

from __future__ import annotations

import pytest

from jobgen.api import PLANNERS
from jobgen.gitops.sync import compare, unified_diff
from jobgen.planning.project import plan_project
from jobgen.specs.project import load_project
from tests.conftest import PROFILES, REPO, TEMPLATES

MANIFESTS = REPO / "manifests"


@pytest.fixture(scope="module")
def render():
    return plan_project(load_project(REPO / "jobgen.yaml"), PLANNERS, profiles_dir=str(PROFILES), templates_dir=str(TEMPLATES))


def test_project_renders_the_readme_examples(render):
    assert {"slurm-a100/quickstart", "k8s-h100/quickstart", "slurm-h100/gpt2-350m-zero3"} <= render.job_dirs
    assert render.out == MANIFESTS.resolve()


def test_committed_manifests_match_a_fresh_render(render):
    comparison = compare(render)
    assert comparison.in_sync, "manifests/ is out of date; run: jobgen render --all --prune\n" + unified_diff(comparison, "manifests")


def test_every_committed_file_is_rendered(render):
    on_disk = sorted(p.relative_to(MANIFESTS).as_posix() for p in MANIFESTS.rglob("*") if p.is_file())
    assert on_disk == sorted(render.files), "files under manifests/ that jobgen.yaml does not render"


def test_sbatch_scripts_are_executable(render):
    for rel in render.files:
        path = MANIFESTS / rel
        assert bool(path.stat().st_mode & 0o100) == rel.endswith(".sbatch"), rel


def test_the_shipped_project_renders_without_warnings(render):
    # every `render --all` of the shipped jobgen.yaml once warned 5 times (the
    # example image tag is not pinned by digest); a warning nobody acts on hides the ones that matter
    warnings = [f"{job.entry} {job.plan.profile}: {w}" for job in render.jobs for w in job.plan.warnings]
    assert warnings == []
