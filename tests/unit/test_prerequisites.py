"""A missing prerequisite skips on a developer's machine and fails under CI (tests/conftest.py's
``require`` / ``skip_or_fail``): a CI image that lost a package or tool must not pass green."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, require, skip_or_fail, under_ci

MISSING = "jobgen_tests_no_such_module"


@pytest.mark.parametrize(("value", "expected"), [
    (None, False), ("", False), ("0", False), ("false", False), ("False", False), ("no", False),
    ("true", True), ("1", True), ("yes", True),
])
def test_under_ci_reads_the_ci_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert under_ci() is expected


def test_require_returns_the_module_when_it_imports(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require("json") is json
    assert require("os.path") is os.path


def test_outside_ci_a_missing_prerequisite_skips_with_the_reason(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=rf"no such thing \(ModuleNotFoundError: No module named '{MISSING}'\)"):
        require(MISSING, "no such thing")
    with pytest.raises(pytest.skip.Exception, match=rf"^{MISSING} is not installed"):
        require(MISSING)
    with pytest.raises(pytest.skip.Exception, match="^the lab needs root$"):
        skip_or_fail("the lab needs root")


def test_under_ci_a_missing_prerequisite_fails_with_the_reason(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no such thing \(ModuleNotFoundError.*\) \[CI is set: a missing prerequisite fails"):
        require(MISSING, "no such thing")
    with pytest.raises(pytest.fail.Exception, match=r"^the lab needs root \[CI is set"):
        skip_or_fail("the lab needs root")


@pytest.mark.parametrize("ci", [None, "true"])
def test_module_level_require_in_a_real_session(tmp_path, ci):
    """What pytest reports for a test module whose import-time ``require`` fails: outside CI the
    module is skipped and the rest runs; under CI the session fails (a collection error naming
    the reason, which stops pytest before any test runs)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_needs_it.py").write_text(
        f"from tests.conftest import require\nrequire({MISSING!r}, 'needs the thing')\n\ndef test_it():\n    pass\n")
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci:
        env["CI"] = ci
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    if ci:
        assert proc.returncode != 0 and "needs the thing" in out and "CI is set" in out, out
        assert "1 error" in out and "passed" not in out, out
    else:
        assert proc.returncode == 0 and "1 passed, 1 skipped" in out and "needs the thing" in out, out
