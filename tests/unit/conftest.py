"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from tests.fakes.slurm.fakeslurm import FakeSlurm


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurm:
    """The fake SLURM client commands first on PATH, and a state index of this test's own."""
    fake = FakeSlurm(tmp_path)
    for key, value in fake.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    return fake
