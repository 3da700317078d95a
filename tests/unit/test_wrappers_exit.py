"""Scripts that wrap the entrypoint's ``main`` (tests, benchmarks, examples) end the way ``python -m jobgen.train`` does.

A wrapper that ends with ``sys.exit`` lets interpreter teardown run after torch.distributed,
which can abort a finished rank (SIGABRT) and fail a multi-rank run that wrote everything
(:func:`jobgen.train.__main__.exit_process`)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _wrappers() -> list[Path]:
    found = []
    for path in sorted([*REPO.glob("tests/**/*.py"), *REPO.glob("examples/**/*.py"), *REPO.glob("benchmarks/**/*.py")]):
        if ".venv" in path.parts or path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        if "from jobgen.train.__main__ import main" in text and 'if __name__ == "__main__":' in text:
            found.append(path)
    return found


def test_there_are_wrappers_to_check() -> None:
    assert {p.name for p in _wrappers()} >= {"record_batches.py", "train_overhead.py"}


def test_every_wrapper_of_the_entrypoint_ends_with_exit_process() -> None:
    bad = []
    for path in _wrappers():
        calls = {node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Call)}
        if "exit_process" not in calls:
            bad.append(str(path.relative_to(REPO)))
    assert not bad, f"these scripts wrap jobgen.train's main but do not end with exit_process: {bad}"
