"""The test tiers (README "Test tiers"): every name in tests/conftest.py's SLOW_TESTS is a test
function of its module (a renamed or deleted test must leave the list), and the markers reach
the tests pytest collects."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys

from tests.conftest import ALL, REPO, SLOW_TESTS, is_slow


def _test_functions(module: str) -> set[str]:
    tree = ast.parse((REPO / module).read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def test_every_slow_test_named_exists():
    for module, names in SLOW_TESTS.items():
        assert (REPO / module).is_file(), f"SLOW_TESTS names {module}, which does not exist"
        functions = _test_functions(module)
        if names == ALL:
            assert functions, f"{module} has no tests"
        else:
            assert names <= functions, f"SLOW_TESTS names {sorted(names - functions)}, not tests of {module}"


def test_is_slow():
    module, names = next((m, n) for m, n in SLOW_TESTS.items() if n != ALL)
    assert is_slow(module, next(iter(names)))
    assert not is_slow(module, "test_not_listed")
    assert not is_slow("tests/unit/test_render.py", "test_anything")
    whole = next(m for m, n in SLOW_TESTS.items() if n == ALL)
    assert is_slow(whole, "test_anything")


#: A pytest plugin for the collection below: it prints each test that ``-m`` leaves out.
DESELECTED_PLUGIN = """\
def pytest_deselected(items):
    for item in items:
        print("DESELECTED " + item.nodeid)
"""


def test_quick_tier_leaves_out_the_labs_and_the_slow_tests(tmp_path):
    """Collected with -m "not lab and not slow": no lab test and no listed slow test is left. One
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
    assert kept == {n for n in names if not is_slow(partly, n)} and kept and kept != names


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
