"""The test tiers (README "Test tiers"): the ``slow`` marker sits on the tests themselves
(``@pytest.mark.slow`` or a module's ``pytestmark``) and only where pytest reads it, a misspelt
marker is refused (``--strict-markers``), and ``-m`` selects the tiers from those markers."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SLOW


def _is_slow_mark(node: ast.AST) -> bool:
    """``<anything>.mark.slow`` (``pytest.mark.slow``), called or not."""
    node = node.func if isinstance(node, ast.Call) else node
    return isinstance(node, ast.Attribute) and node.attr == SLOW and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"


def _marks_in(node: ast.AST) -> list[ast.AST]:
    return [sub for sub in ast.walk(node) if _is_slow_mark(sub)]


def _is_pytestmark(node: ast.AST) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets)


def slow_marks(tree: ast.Module) -> tuple[bool, set[str], list[int]]:
    """Where a module's source puts the ``slow`` marker: (the module's ``pytestmark`` holds it,
    the test functions and ``Test*`` classes decorated with it, the lines of any other
    ``pytest.mark.slow``: on a fixture or helper, a class's or a misspelt module variable,
    where pytest never reads it)."""
    read: set[int] = set()
    whole = False
    for node in tree.body:
        if _is_pytestmark(node) and _marks_in(node.value):
            whole = True
            read |= {id(mark) for mark in _marks_in(node.value)}
    decorated: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            named = node.name.startswith("test_") if not isinstance(node, ast.ClassDef) else node.name.startswith("Test")
            for decorator in node.decorator_list:
                if _is_slow_mark(decorator) and named:
                    decorated.add(node.name)
                    read.add(id(decorator if not isinstance(decorator, ast.Call) else decorator.func))
                    read.add(id(decorator))
    stray = [mark.lineno for mark in _marks_in(tree) if id(mark) not in read]
    return whole, decorated, sorted(set(stray))


def _test_modules() -> list[Path]:
    return sorted(path for path in (REPO / "tests").rglob("*.py") if path.name.startswith("test_"))


def test_every_slow_mark_sits_where_pytest_reads_it():
    """A ``pytest.mark.slow`` on a fixture, a helper or a misspelt ``pytestmark`` would silently
    leave a slow test in the quick tier: each must decorate a test function or ``Test*`` class,
    or be the module's ``pytestmark`` (or in its list)."""
    stray = {}
    whole_modules = 0
    for path in _test_modules():
        whole, decorated, lines = slow_marks(ast.parse(path.read_text()))
        whole_modules += whole
        if lines:
            stray[path.relative_to(REPO).as_posix()] = lines
    assert not stray, f"pytest.mark.slow where pytest does not read it (file: lines): {stray}"
    assert whole_modules, "no module marks all its tests slow: the search above found nothing"


def test_the_checks_above_catch_a_stray_or_misplaced_mark():
    """:func:`slow_marks` on sources that place the marker right and wrong."""
    right = ast.parse("import pytest\npytestmark = [pytest.mark.usefixtures('x'), pytest.mark.slow]\n"
                      "@pytest.mark.slow\n@pytest.mark.parametrize('a', [1])\ndef test_a(a): pass\n"
                      "@pytest.mark.slow\nclass TestB:\n    def test_c(self): pass\n")
    assert slow_marks(right) == (True, {"test_a", "TestB"}, [])
    wrong = ast.parse("import pytest\npytest_mark = pytest.mark.slow\n"
                      "@pytest.fixture\n@pytest.mark.slow\ndef trained(): pass\n"
                      "def test_d():\n    pytest.mark.slow\n")
    assert slow_marks(wrong) == (False, set(), [2, 4, 7])


def test_an_unknown_marker_is_refused(pytestconfig: pytest.Config):
    """``--strict-markers`` (setup.cfg's addopts): a misspelt marker (``@pytest.mark.slwo``) is a
    collection error, not a marker that selects nothing."""
    assert "--strict-markers" in pytestconfig.getini("addopts"), pytestconfig.getini("addopts")
    assert any(line.startswith(f"{SLOW}:") for line in pytestconfig.getini("markers"))


#: A pytest plugin for the collection below: it prints each test that ``-m`` leaves out.
DESELECTED_PLUGIN = """\
def pytest_deselected(items):
    for item in items:
        print("DESELECTED " + item.nodeid)
"""


def test_quick_tier_leaves_out_the_labs_and_the_slow_tests(tmp_path):
    """Collected with -m "not lab and not slow": no lab test and no test marked slow is left. One
    collection (a pytest run imports torch and more: seconds) gives both sets: the tests it keeps
    and, through the plugin above, those ``-m`` deselected."""
    (tmp_path / "jobgen_deselected.py").write_text(DESELECTED_PLUGIN)
    # A lab module, a slow one, a quick one, and one whose tests are partly slow; none of them
    # imports torch or Lightning to be collected, and hypothesis' plugin is left out (seconds).
    partly = "tests/unit/test_validate_import.py"
    paths = ["tests/integration/slurm/test_ls_on_lab.py", "tests/integration/k8s/test_rank_semantics.py",
             "tests/integration/k8s/test_kubelab_ports.py", partly]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                          "-p", "jobgen_deselected", *paths, "-m", "not lab and not slow"],
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    left_out = {line.split(" ", 1)[1] for line in lines if line.startswith("DESELECTED ")}
    quick = {line for line in lines if "::" in line and not line.startswith("DESELECTED ")}
    everything = quick | left_out
    assert any("test_ls_on_lab.py" in t for t in left_out) and not any("test_ls_on_lab.py" in t for t in quick)
    assert not any("test_rank_semantics.py" in t for t in quick), quick
    assert any("test_kubelab_ports.py" in t for t in quick), quick
    names = {t.split("::")[1].split("[")[0] for t in everything if partly in t}
    kept = {t.split("::")[1].split("[")[0] for t in quick if partly in t}
    _, slow, _ = slow_marks(ast.parse((REPO / partly).read_text()))
    assert kept == names - slow and kept and kept != names


def test_the_xdist_units_keep_each_lab_on_one_worker_and_a_training_module_together():
    """tests/conftest.py's scheduler: one unit for the SLURM and ssh labs, one for the Kubernetes
    lab, one per training module, one per other test (what lets `-n 2` start each lab once and
    each module-scoped training once)."""
    from tests.conftest import K8S_TESTS_DIR, LAB_TESTS_DIR, xdist_unit

    labs = {xdist_unit(n) for n in ("tests/integration/slurm/test_lab.py::test_a", "tests/integration/ssh/test_jobgen_on_ssh_lab.py::test_c")}
    assert labs == {LAB_TESTS_DIR}
    k8s = {xdist_unit(n) for n in ("tests/integration/k8s/test_x.py::test_b[1]", "tests/integration/k8s/test_pods_on_nodes.py::test_d")}
    assert k8s == {K8S_TESTS_DIR}
    matrix = {xdist_unit(f"tests/entrypoint/test_strategy_matrix.py::test_strategy_trains_to_the_same_loss_as_ddp[{c}]") for c in ("ddp", "zero2")}
    assert matrix == {"tests/entrypoint/test_strategy_matrix.py"}
    units = {xdist_unit("tests/unit/test_rules.py::test_a"), xdist_unit("tests/unit/test_rules.py::test_b")}
    assert len(units) == 2 and LAB_TESTS_DIR not in units


def test_the_lab_units_go_out_first_one_to_each_worker():
    """Whatever their sizes, the Kubernetes unit goes to the first worker and the SLURM + ssh unit
    to the second (xdist hands a worker one unit while it has more than two tests pending), then
    the rest largest first, as xdist sorted them."""
    from collections import OrderedDict

    from tests.conftest import K8S_TESTS_DIR, LAB_TESTS_DIR, first_units_first

    queue = OrderedDict((u, {}) for u in ("tests/entrypoint/test_speed_levers.py", K8S_TESTS_DIR, "tests/entrypoint/test_a.py",
                                          LAB_TESTS_DIR, "tests/unit/test_b.py::test_c"))
    first_units_first(queue)
    assert list(queue) == [K8S_TESTS_DIR, LAB_TESTS_DIR, "tests/entrypoint/test_speed_levers.py", "tests/entrypoint/test_a.py",
                           "tests/unit/test_b.py::test_c"]
    only_k8s = OrderedDict((u, {}) for u in ("a", K8S_TESTS_DIR))
    first_units_first(only_k8s)
    assert list(only_k8s) == [K8S_TESTS_DIR, "a"]


def test_xdists_private_scope_hook_is_still_there():
    """The scheduler overrides LoadScopeScheduling._split_scope (private; pytest-xdist pinned to
    3.x in setup.cfg): an xdist that renamed it would silently spread the labs over both workers."""
    from xdist.scheduler import LoadScopeScheduling

    assert callable(vars(LoadScopeScheduling).get("_split_scope"))
    assert callable(vars(LoadScopeScheduling).get("_assign_work_unit"))
    assert "OrderedDict()" in inspect.getsource(LoadScopeScheduling.__init__)  # first_units_first's move_to_end
