"""No module of jobgen/ or tests/ is over 800 lines: one that grows past it is split along its
seams, by concept (as cli/, jobdir/, planning/estimate.py + memory_plan.py and
train/tracking.py + trackers.py were; in tests/, the labs' kubelab.py + kubecore.py + kubebuild.py),
not trimmed to fit. Lines are counted as ``wc -l`` does."""

from __future__ import annotations

from pathlib import Path

import jobgen

PACKAGE = Path(jobgen.__file__).parent
TESTS = Path(__file__).resolve().parents[1]

#: The most lines a module of jobgen/ or tests/ may have.
MAX_LINES = 800


def modules_over(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """``{path relative to root's parent: lines}`` of every ``.py`` file under ``root`` longer than ``limit``."""
    counts = {str(path.relative_to(root.parent)): len(path.read_bytes().splitlines()) for path in sorted(root.rglob("*.py"))}
    return {path: lines for path, lines in counts.items() if lines > limit}


def test_no_module_of_jobgen_is_over_800_lines():
    over = modules_over(PACKAGE)
    assert not over, f"modules of jobgen/ over {MAX_LINES} lines (split each along its seams, by concept):\n" + "\n".join(
        f"  {path}: {lines} lines" for path, lines in sorted(over.items(), key=lambda item: -item[1]))


def test_no_module_of_tests_is_over_800_lines():
    """The test suite's modules too: the labs (tests/integration/*/), fixtures, helpers."""
    over = modules_over(TESTS)
    assert not over, f"modules of tests/ over {MAX_LINES} lines (split each along its seams, by concept):\n" + "\n".join(
        f"  {path}: {lines} lines" for path, lines in sorted(over.items(), key=lambda item: -item[1]))


def test_the_count_names_the_file_and_its_lines(tmp_path):
    """The check itself, on a made-up package (so a walker that sees nothing cannot pass)."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "small.py").write_text("x = 1\n" * MAX_LINES)
    (root / "sub" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (root / "notes.txt").write_text("x\n" * 5000)
    assert modules_over(root) == {"pkg/sub/big.py": MAX_LINES + 1}
