"""Golden JSON Schemas: what ``jobgen schema spec|profile|project`` prints (editors read it).

The schemas carry every field's description, type, default and bounds, so a change to any of
them shows here as a diff to review. ``UPDATE_GOLDEN=1 pytest tests/golden`` is the only writer.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

SCHEMAS = Path(__file__).parent / "schema"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("kind", ["spec", "profile", "project"])
def test_schema_golden(run_cli, kind):
    result = run_cli("schema", kind)
    assert result.code == 0, result.stderr
    golden = SCHEMAS / f"{kind}.json"
    if UPDATE:
        golden.write_text(result.stdout)
    assert golden.is_file(), f"missing golden {golden}; run UPDATE_GOLDEN=1 pytest tests/golden and review the diff"
    expected = golden.read_text()
    if result.stdout != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), result.stdout.splitlines(True), f"golden/{kind}.json", f"jobgen schema {kind}"))
        pytest.fail(f"jobgen schema {kind} differs from its golden:\n{diff}")
