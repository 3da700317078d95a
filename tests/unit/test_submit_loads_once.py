"""`jobgen submit SPEC` reads and validates the spec once and hands the loaded object down (the
plan, the --smoke variant made from it, the class_path import check), instead of reading the
file again for each (issue 23, "Structure")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import jobgen.api
import jobgen.specs.load
import jobgen.usercode.classes
from jobgen.cli import cli
from jobgen.specs.training import TrainingSpec
from tests.conftest import EXAMPLES, PROFILES, TEMPLATES

SPEC = EXAMPLES / "usercode.yaml"


@pytest.mark.parametrize("smoke", [None, 3])
def test_submit_reads_and_validates_the_spec_once(monkeypatch, tmp_path, smoke):
    reads: list[Path] = []
    validated: list[str] = []
    read_yaml, validate = jobgen.specs.load.read_yaml, jobgen.specs.load.validate

    def counting_read(path):
        reads.append(Path(path).resolve())
        return read_yaml(path)

    def counting_validate(model, doc, source):
        if model is TrainingSpec:
            validated.append(source)
        return validate(model, doc, source)

    checked: list[TrainingSpec] = []
    submitted = []
    monkeypatch.setattr(jobgen.specs.load, "read_yaml", counting_read)
    monkeypatch.setattr(jobgen.specs.load, "validate", counting_validate)
    monkeypatch.setattr(jobgen.usercode.classes, "check_user_code", lambda spec, source: checked.append(spec) or [])
    monkeypatch.setattr(jobgen.api, "submit", lambda plan, options, **kw: submitted.append(plan) or SimpleNamespace(handle=None))

    args = ["submit", str(SPEC), "-p", "local", "--profiles-dir", str(PROFILES), "--templates-dir", str(TEMPLATES),
            "--runs-dir", str(tmp_path / "runs"), *(["--smoke", str(smoke)] if smoke else [])]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)

    assert result.exit_code == 0, result.output
    assert reads.count(SPEC.resolve()) == 1, f"the spec file was read {reads.count(SPEC.resolve())} times"
    # the file's spec once; with --smoke also the smoke variant made from it (a new spec: <name>-smoke)
    assert validated == [str(SPEC)] + ([f"{SPEC} (--smoke {smoke})"] if smoke else [])
    assert len(checked) == 1 and checked[0].model.class_path == "tinychar.CharModel"  # the import check got the loaded spec
    assert len(submitted) == 1 and submitted[0].job_name == ("usercode-smoke" if smoke else "usercode")
