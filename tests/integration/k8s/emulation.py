"""What the tests of the lab's emulated controllers share (test_operator_emulation.py for the
training-operator, test_trainer_emulation.py for the Trainer v2 stack): waiting on the API
server, and jobgen's CLI against the API-server lab."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

#: The namespace the lab's shipped profiles name.
NS = "training"


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """``predicate()``'s first truthy value, polled every 0.1 s; the test fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def cli(lab, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m jobgen.cli ARGS`` against the lab (its kubeconfig, a private state dir)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(lab.kubeconfig), "JOBGEN_STATE_DIR": str(cwd / "state")}
    for key in ("JOBGEN_K8S_CONTEXT", "JOBGEN_K8S_NAMESPACE", "JOBGEN_DEBUG"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def jobgen_state(lab, cwd: Path, name: str) -> dict[str, Any]:
    """``jobgen status -o json`` of job ``name`` in :data:`NS`."""
    out = cli(lab, cwd, "status", "-o", "json", f"k8s://jobgen-lab/{NS}/{name}")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)
