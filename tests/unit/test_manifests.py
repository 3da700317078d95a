"""The rendered files committed under manifests/ are what jobgen renders today (no drift)."""

from __future__ import annotations

import pytest

from jobgen.load import load_profile, load_spec
from jobgen.plan import plan
from tests.conftest import EXAMPLES, PROFILES, REPO, TEMPLATES

JOB_DIRS = sorted(d for d in (REPO / "manifests").glob("*/*") if d.is_dir())


def test_manifests_are_committed():
    assert JOB_DIRS, "manifests/ holds the rendered examples shown in the README"


@pytest.mark.parametrize("job_dir", JOB_DIRS, ids=[f"{d.parent.name}-{d.name}" for d in JOB_DIRS])
def test_committed_manifest_matches_a_fresh_render(job_dir):
    job_plan = plan(load_spec(EXAMPLES / f"{job_dir.name}.yaml"), load_profile(job_dir.parent.name, PROFILES), TEMPLATES)
    on_disk = {p.name: p.read_text() for p in job_dir.iterdir()}
    assert on_disk == dict(job_plan.files), f"re-render: jobgen render examples/{job_dir.name}.yaml --profile {job_dir.parent.name}"
