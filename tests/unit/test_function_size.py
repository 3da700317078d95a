"""Function size in jobgen/: no function (method, nested function) longer than
:data:`MAX_LINES` lines or with more than :data:`MAX_PARAMETERS` parameters, except those of
:data:`ALLOWED`, each with its reason. An entry that no longer exceeds either limit, or names no
function, fails too: the list only shrinks.

Lines: from the ``def`` line to the function's last line (``end_lineno - lineno + 1``; decorators
not counted, its docstring and nested functions counted). Parameters: every parameter of the
signature (positional-only, positional, keyword-only, ``*args``, ``**kwargs``) except one named
``self`` or ``cls``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

MAX_LINES = 80
MAX_PARAMETERS = 8

_CLICK = "a click command: one parameter per CLI option, which click passes by name"
_NOT_SPLIT = "not split yet: "
#: ``<path under the repository>:<qualified name>`` -> why it may exceed a limit today.
ALLOWED: dict[str, str] = {
    "jobgen/backends/kubernetes/detect.py:_kubernetes_fields": _NOT_SPLIT + "the profile fields detect derives from the cluster's answers",
    "jobgen/backends/kubernetes/manifest.py:pod_values": _NOT_SPLIT + "the values of one replica's pod template",
    "jobgen/backends/kubernetes/manifest.py:plan": _NOT_SPLIT + "the Kubernetes plan of one job",
    "jobgen/backends/slurm/array.py:plan_array": _NOT_SPLIT + "the plan of a sweep as one job array",
    "jobgen/backends/slurm/detect.py:detect_slurm": _NOT_SPLIT + "a SLURM profile from sinfo and scontrol",
    "jobgen/backends/slurm/submitit_executor.py:_executor_class": _NOT_SPLIT + "submitit's executor subclass, defined on first use "
                                                                      "(submitit imported only then)",
    "jobgen/backends/ssh/detect.py:detect_ssh": _NOT_SPLIT + "an ssh profile from the hosts' answers",
    "jobgen/cli/doctor.py:doctor": _CLICK,
    "jobgen/cli/profiles.py:profiles_detect": _CLICK,
    "jobgen/cli/render.py:render": _CLICK,
    "jobgen/cli/render.py:diff": _CLICK,
    "jobgen/cli/submit.py:submit": _CLICK,
    "jobgen/cli/submit.py:_submit_sweep": _NOT_SPLIT + "submit's options passed on to each point of a sweep",
    "jobgen/train/data.py:ByteTextDataModule.__init__": "a LightningDataModule: save_hyperparameters() records each __init__ argument",
    "jobgen/train/model.py:LitGPT.__init__": "a LightningModule: save_hyperparameters() records each __init__ argument",
}


def functions(tree: ast.Module, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of ``tree`` (methods and nested functions too) with its qualified name
    (``Class.method``, ``outer.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def size(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    """(lines from ``def`` to the end, parameters but ``self``/``cls``): see the module docstring."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a is not None]
    return node.end_lineno - node.lineno + 1, len([name for name in names if name not in ("self", "cls")])


def oversized(root: Path) -> dict[str, tuple[int, int]]:
    """``<path>:<qualified name>`` -> (lines, parameters) of each function under ``root``/jobgen
    over a limit."""
    found = {}
    for path in sorted((root / "jobgen").rglob("*.py")):
        for name, node in functions(ast.parse(path.read_text(), str(path))):
            lines, parameters = size(node)
            if lines > MAX_LINES or parameters > MAX_PARAMETERS:
                found[f"{path.relative_to(root).as_posix()}:{name}"] = (lines, parameters)
    return found


def check(found: dict[str, tuple[int, int]], allowed: dict[str, str]) -> list[str]:
    """The problems: a function over a limit that ``allowed`` lacks, an entry that exceeds no
    limit any more (or names no function), an entry without a reason."""
    problems = [f"{name}: {lines} lines, {parameters} parameters (limits {MAX_LINES}, {MAX_PARAMETERS}): split it"
                for name, (lines, parameters) in sorted(found.items()) if name not in allowed]
    problems += [f"{name} is allowed but no longer exceeds a limit (or is gone): remove it from ALLOWED"
                 for name in sorted(set(allowed) - set(found))]
    problems += [f"{name}: no reason given" for name, reason in sorted(allowed.items()) if not reason.strip()]
    return problems


def test_no_function_in_jobgen_is_over_the_limits_unless_allowed():
    problems = check(oversized(REPO), ALLOWED)
    assert not problems, "\n".join(problems)


def test_size_counts_lines_from_def_and_every_parameter_but_self():
    tree = ast.parse("class A:\n    @staticmethod\n    def m(self, a, /, b, *c, d, **e):\n        x = 1\n        return x\n"
                     "def f(cls):\n    def g(): pass\n    return g\n")
    assert {name: size(node) for name, node in functions(tree)} == {"A.m": (3, 5), "f": (3, 0), "f.g": (1, 0)}


@pytest.mark.parametrize("mutation", ["an entry removed", "an entry that no longer exceeds", "an entry that names no function"])
def test_the_check_catches_a_new_offender_and_a_stale_entry(mutation):
    found = {"jobgen/a.py:big": (81, 1), "jobgen/a.py:wide": (10, 9)}
    allowed = {"jobgen/a.py:big": "reason", "jobgen/a.py:wide": "reason"}
    assert check(found, allowed) == []
    if mutation == "an entry removed":
        del allowed["jobgen/a.py:wide"]
        assert check(found, allowed) == [f"jobgen/a.py:wide: 10 lines, 9 parameters (limits {MAX_LINES}, {MAX_PARAMETERS}): split it"]
    elif mutation == "an entry that no longer exceeds":
        del found["jobgen/a.py:big"]
        assert check(found, allowed) == ["jobgen/a.py:big is allowed but no longer exceeds a limit (or is gone): remove it from ALLOWED"]
    else:
        allowed["jobgen/b.py:gone"] = "reason"
        assert check(found, allowed) == ["jobgen/b.py:gone is allowed but no longer exceeds a limit (or is gone): remove it from ALLOWED"]
