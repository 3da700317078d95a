"""The test tiers (README "Test tiers"): every name in tests/conftest.py's SLOW_TESTS is a test
function of its module (a renamed or deleted test must leave the list), and the markers reach
the tests pytest collects."""

from __future__ import annotations

import ast
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


def test_quick_tier_leaves_out_the_labs_and_the_slow_tests():
    """Collected with -m "not lab and not slow": no lab test and no listed slow test is left."""
    def collect(*args: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return {line for line in out.stdout.splitlines() if "::" in line}

    paths = ["tests/integration/slurm/test_ls_on_lab.py", "tests/integration/k8s/test_rank_semantics.py",
             "tests/integration/k8s/test_kubelab_ports.py", "tests/entrypoint/test_preflight.py"]
    everything = collect(*paths)
    quick = collect(*paths, "-m", "not lab and not slow")
    left_out = everything - quick
    assert any("test_ls_on_lab.py" in t for t in left_out) and not any("test_ls_on_lab.py" in t for t in quick)
    assert not any("test_rank_semantics.py" in t for t in quick), quick
    assert any("test_kubelab_ports.py" in t for t in quick), quick
    preflight = {t.split("::")[1].split("[")[0] for t in everything if "test_preflight.py" in t}
    kept = {t.split("::")[1].split("[")[0] for t in quick if "test_preflight.py" in t}
    assert kept == {n for n in preflight if not is_slow("tests/entrypoint/test_preflight.py", n)} and kept != preflight
