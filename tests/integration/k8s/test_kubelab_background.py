"""The collection hook's background build stays out of the way of a build already under way
(`.ci/run` starts one before pytest): it starts no second build process and says why. Needs no
lab: the cache is a temporary directory, and no build runs (Popen is recorded, not called)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubelab  # noqa: E402


@pytest.mark.parametrize("lock", [".lock", ".lock-crd-server"])
def test_a_held_build_lock_means_a_build_is_running(tmp_path, lock):
    assert not kubelab.build_running(tmp_path)  # no lock file yet
    with kubelab._locked(tmp_path / lock):
        assert kubelab.build_running(tmp_path)
    assert not kubelab.build_running(tmp_path)  # released (the file stays)


def test_no_second_background_build_while_one_holds_the_lock(tmp_path, monkeypatch):
    started: list[list[str]] = []
    monkeypatch.setattr(kubelab.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    log = tmp_path / "logs" / "background.log"
    with kubelab._locked(tmp_path / ".lock"):
        assert kubelab.build_in_background(crd_server=True, log=log, cache=tmp_path) is None
    assert started == []
    kubelab.build_in_background(crd_server=True, log=log, cache=tmp_path)  # nothing built, no build running
    assert started == [kubelab.background_build_argv(crd_server=True)]
