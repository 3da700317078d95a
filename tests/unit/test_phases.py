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
