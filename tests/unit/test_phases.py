"""tests/phases.py: the phase records .ci/run, the Kubernetes lab's build and the test session
write, and the table .ci/run prints from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import phases
from tests.conftest import REPO

SCRIPT = REPO / "tests" / "phases.py"


@pytest.fixture
def phases_file(tmp_path, monkeypatch):
    path = tmp_path / "phases.jsonl"
    monkeypatch.setenv(phases.ENV, str(path))
    return path


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(phases.ENV, raising=False)
    with phases.phase("build: x"):
        pass
    phases.record("y", 1.0, 2.0)
    assert list(tmp_path.iterdir()) == []


def test_phases_are_reported_in_minutes_from_the_first_start(phases_file):
    phases.record("install: pip", 1000.0, 1120.0)
    phases.record("build: kube-apiserver", 1010.0, 1610.0, "in the background")
    phases.record("tests: lab: SLURM", 1130.0, 1430.0)
    out = phases.report(phases.read(phases_file))
    lines = out.splitlines()
    assert lines[1].split() == ["phase", "start", "min", "end", "min", "length"]
    assert lines[2].split() == ["install:", "pip", "0.0", "2.0", "2.0", "min", "(120", "s)"]
    assert "build: kube-apiserver [in the background]" in lines[3] and "10.0 min (600 s)" in lines[3]
    assert "tests: lab: SLURM" in lines[4] and "5.0 min (300 s)" in lines[4]
    assert lines[-1] == "first start to last end: 10.2 min (610 s)"


def test_a_failing_block_is_still_a_phase_and_says_so(phases_file):
    with pytest.raises(RuntimeError), phases.phase("build: nodes"):
        raise RuntimeError("compile failed")
    [entry] = phases.read(phases_file)
    assert entry["phase"] == "build: nodes" and entry["note"].strip() == "(failed)"


def test_hostile_records_never_break_the_table(phases_file):
    phases_file.write_text("\n".join([
        "not json", json.dumps([1, 2]), json.dumps({"phase": 3, "start": 1, "end": 2}),
        '{"phase": "nan start", "start": NaN, "end": 5}', json.dumps({"phase": "no end", "start": 1}),
        json.dumps({"phase": "ok", "start": 10, "end": 70}),
    ]) + "\n\xff\n")
    phases.record("line\nbreak \x1b[31m" + "x" * 300, 20.0, 30.0, "note\nwith newline")
    entries = phases.read(phases_file)
    assert [e["phase"][:10] for e in entries] == ["ok", "line\nbreak"]
    out = phases.report(entries)
    assert len(out.splitlines()) == 5  # the title, the header, two rows, the total
    assert all(len(line) < 300 for line in out.splitlines())
    assert "\n".join(out.splitlines()[3:4]).count("x") <= phases.NAME_WIDTH


def test_the_command_line_records_until_another_phase_starts(phases_file):
    env = {**os.environ, phases.ENV: str(phases_file)}
    phases.record("tests: pytest session", 500.0, 900.0)
    run = lambda *a: subprocess.run([sys.executable, str(SCRIPT), *a], env=env, capture_output=True, text=True, timeout=60)  # noqa: E731
    assert run("record", "install: pip", "380", "--until-start-of", "tests: pytest session").returncode == 0
    missing = run("record", "install: other", "380", "--until-start-of", "no such phase")
    assert missing.returncode == 0 and "left out" in missing.stderr
    assert run("record", "bad", "abc", "5").returncode == 2
    assert run("record", "no end", "5").returncode == 2
    entries = {e["phase"]: e for e in phases.read(phases_file)}
    assert entries["install: pip"]["start"] == 380 and entries["install: pip"]["end"] == 500
    assert "install: other" not in entries
    report = run("report")
    assert report.returncode == 0 and "install: pip" in report.stdout and "2.0 min (120 s)" in report.stdout
    unreadable = subprocess.run([sys.executable, str(SCRIPT), "report", str(phases_file.parent / "missing.jsonl")],
                                capture_output=True, text=True, timeout=60)
    assert unreadable.returncode == 2 and "cannot read" in unreadable.stderr and "Traceback" not in unreadable.stderr


def test_a_short_wait_is_not_a_phase_and_a_long_one_names_the_worker(phases_file, monkeypatch):
    clock = iter([100.0, 100.5, 200.0, 230.0, 230.0])
    monkeypatch.setattr(phases.time, "time", lambda: next(clock))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    with phases.waited("wait: cached"):
        pass
    with phases.waited("wait: kube-apiserver binaries"):
        pass
    [entry] = phases.read(phases_file)
    assert entry == {"phase": "wait: kube-apiserver binaries", "start": 200.0, "end": 230.0, "note": "worker gw0"}


def test_the_slowest_tests_and_each_tiers_sum_end_the_report(phases_file):
    """One record per test beside the phases; the report lists the slowest first (ties in node ID
    order), cuts the list at ``shown``, and sums every test of each tier, listed ones or not."""
    phases.record("tests: pytest session", 100.0, 400.0)
    tests = [
        {"test": "tests/unit/test_a.py::test_quick", "tier": "quick", "seconds": 0.25, "worker": "gw0"},
        {"test": "tests/entrypoint/test_b.py::test_trains", "tier": "slow", "seconds": 95.04, "worker": "gw1"},
        {"test": "tests/integration/slurm/test_c.py::test_job", "tier": "lab: SLURM", "seconds": 40.0, "worker": "gw0"},
        {"test": "tests/entrypoint/test_b.py::test_also", "tier": "slow", "seconds": 40.0, "worker": "gw1"},
        {"test": "tests/unit/test_a.py::test_other", "tier": "quick", "seconds": 1.5, "worker": "gw0"},
    ]
    phases.record_tests(tests)
    assert [e["phase"] for e in phases.read(phases_file)] == ["tests: pytest session"]  # test records are not phases
    read = phases.read_tests(phases_file)
    assert read == tests
    out = phases.tests_report(read, shown=3)
    assert out == phases.tests_report(list(reversed(read)), shown=3)  # the records' order does not matter
    lines = out.splitlines()
    assert lines[0].startswith("The 3 slowest tests")
    assert lines[1].split() == ["seconds", "tier", "worker", "test"]
    assert lines[2].split() == ["95.0", "slow", "gw1", "tests/entrypoint/test_b.py::test_trains"]
    # 40.0 s twice: node ID order.
    assert lines[3].split() == ["40.0", "slow", "gw1", "tests/entrypoint/test_b.py::test_also"]
    assert lines[4].split() == ["40.0", "lab:", "SLURM", "gw0", "tests/integration/slurm/test_c.py::test_job"]
    assert lines[5] == "Test time per tier:"
    assert [line.split() for line in lines[6:]] == [
        ["slow", "2", "tests", "135", "s"], ["lab:", "SLURM", "1", "tests", "40", "s"], ["quick", "2", "tests", "2", "s"],
        ["all", "5", "tests", "177", "s"]]
    report = phases.report(phases.read(phases_file)) + out
    assert subprocess.run([sys.executable, str(SCRIPT), "report", str(phases_file)], capture_output=True, text=True,
                          timeout=60).stdout == report.replace(out, phases.tests_report(read))
    assert phases.tests_report([]) == ""


def test_hostile_test_records_are_skipped_or_shown_on_one_line(phases_file):
    phases_file.write_text("\n".join([
        json.dumps({"test": "no seconds", "tier": "quick", "worker": "gw0"}),
        json.dumps({"test": "bool seconds", "tier": "quick", "seconds": True, "worker": "gw0"}),
        json.dumps({"test": "negative", "tier": "quick", "seconds": -1, "worker": "gw0"}),
        '{"test": "nan", "tier": "quick", "seconds": NaN, "worker": "gw0"}',
        json.dumps({"test": 5, "tier": "quick", "seconds": 1, "worker": "gw0"}),
        json.dumps({"phase": "p", "start": 1, "end": 2}),
    ]) + "\n\xff\n")
    phases.record_tests([{"test": "t.py::test[new\nline \x1b[31m" + "x" * 300 + "]", "tier": "slow\tx", "seconds": 2, "worker": "gw\r1"}])
    [entry] = phases.read_tests(phases_file)
    assert entry["test"].startswith("t.py::test[new\nline")
    lines = phases.tests_report([entry]).splitlines()
    assert len(lines) == 6  # the title, the header, one test, the tiers' title, one tier, all
    assert "\x1b" not in lines[2] and "\r" not in lines[2] and "\t" not in lines[2]
    assert len(lines[2]) < 200 and lines[2].count("x") <= phases.TEST_WIDTH


def test_the_session_sums_each_tests_phases_and_names_its_worker(monkeypatch):
    """tests/conftest.py's report hook: setup, call and teardown of one test add up, under the
    worker xdist names in the report (``main`` without xdist); a report without a tier is left out."""
    import tests.conftest as conftest

    monkeypatch.setattr(conftest, "_TESTS", {})
    monkeypatch.setattr(conftest, "_TIERS", {})
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def report(nodeid, when, duration, tier="slow", **extra):
        rep = pytest.TestReport(nodeid, ("f.py", 1, nodeid), {}, "passed", None, when, duration=duration, start=1000.0,
                                stop=1000.0 + duration, user_properties=[(conftest.TIER_PROPERTY, tier)] if tier else [], **extra)
        conftest.pytest_runtest_logreport(rep)

    for when, duration in (("setup", 30.0), ("call", 2.5), ("teardown", 0.5)):
        report("f.py::test_a", when, duration, worker_id="gw1")
    report("f.py::test_b", "call", 1.0, tier="quick")
    report("f.py::test_untiered", "call", 9.0, tier=None)
    assert conftest._TESTS == {
        "f.py::test_a": {"test": "f.py::test_a", "tier": "slow", "seconds": 33.0, "worker": "gw1"},
        "f.py::test_b": {"test": "f.py::test_b", "tier": "quick", "seconds": 1.0, "worker": "main"},
    }
