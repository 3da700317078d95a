"""Shared fixtures: repository paths, a CLI runner that goes through ``jobgen.cli.main``."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobgen.k8s_validate import PACKAGED_CRDS_DIR

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "templates"
PROFILES = REPO / "cluster_profiles"
EXAMPLES = REPO / "examples"
#: The Kubeflow CRDs packaged with jobgen (what offline validation reads by default).
CRDS = PACKAGED_CRDS_DIR

#: Values that break naive quoting (submitit's adversarial fixture, extended): spaces,
#: quotes, command substitution, `'; echo x`, backslashes, globs, a leading dash.
ADVERSARIAL = [
    "with space",
    "it's",
    'double "quoted"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; echo '",
    "back\\slash\\",
    "glob * ? [a]",
    "${HOME}",
    "-dash",
    "semi;colon&amp|pipe",
]


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli():
    """Run ``python -m jobgen.cli ARGS`` in a subprocess (real exit codes, real stderr)."""

    def _run(*args: str, cwd: Path | None = None, timeout: float = 60) -> CliResult:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("JOBGEN_DEBUG", None)
        proc = subprocess.run(
            [sys.executable, "-m", "jobgen.cli", *args],
            cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=timeout,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return _run


def write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (parents created) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
