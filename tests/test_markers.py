"""The test tiers (README "Test tiers"): every name in tests/conftest.py's SLOW_TESTS is a test
function of its module (a renamed or deleted test must leave the list), and the markers reach
the tests pytest collects."""

from __future__ import annotations

import ast
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
