"""``jobgen doctor``'s report (:mod:`jobgen.doctor`): one line per check, exit 0 only when no
check failed, ``-o json`` with every check, and a scheduler whose checks raise a JobgenError
still printing a report. The local scheduler's checks run for real (this machine's Python)."""

from __future__ import annotations

import json
import sys
import types

import pytest
from click.testing import CliRunner

from jobgen.cli import cli
from jobgen.doctor import Check, DoctorContext, passed, run_checks
from jobgen.errors import SubmitError
from jobgen.specs.load import load_profile
from tests.conftest import EXAMPLES, PROFILES, write


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="jobgen")


def test_local_profile_passes_on_this_machine():
    result = invoke("doctor", "--profile", "local", "--profiles-dir", str(PROFILES))
    assert result.exit_code == 0, result.output
    assert "ok    local.entrypoint" in result.stdout
    assert result.stdout.rstrip().endswith("2 passed, 0 failed, 0 skipped")


def test_a_gpu_the_machine_lacks_fails_its_line_with_the_fix(tmp_path):
    profile = write(tmp_path / "gpu4.yaml", "extends: local\nlocal: {detect_gpus: false}\ngpus_per_node: 4\n"
                    "gpu_type: A100\ngpu_mem_gib: 80\n")
    result = invoke("doctor", "--profile", str(profile), "--profiles-dir", str(PROFILES), "-o", "json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["passed"] is False
    gpus = {check["name"]: check for check in doc["checks"]}["local.gpus"]
    assert gpus["status"] == "fail" and "gpus_per_node: 0" in gpus["fix"], gpus


def test_with_a_spec_the_plan_is_given_to_the_checks(monkeypatch):
    seen = {}
    fake = types.ModuleType("jobgen.doctor.local")

    def checks(ctx: DoctorContext):
        seen["plan"] = ctx.plan
        yield Check("local.plan", "pass", "planned")

    fake.checks = checks
    monkeypatch.setitem(sys.modules, "jobgen.doctor.local", fake)
    result = invoke("doctor", "-p", "local", "--profiles-dir", str(PROFILES), str(EXAMPLES / "quickstart.yaml"))
    assert result.exit_code == 0, result.output
    assert seen["plan"] is not None and seen["plan"].job_name == "quickstart"


def test_an_error_inside_the_checks_is_a_failed_line_not_a_traceback(monkeypatch):
    fake = types.ModuleType("jobgen.doctor.local")

    def checks(ctx: DoctorContext):
        yield Check("local.first", "pass", "fine")
        raise SubmitError("sinfo not found: cannot run \x1b[31mthe check", hint="run on a login node")

    fake.checks = checks
    monkeypatch.setitem(sys.modules, "jobgen.doctor.local", fake)
    found = run_checks(DoctorContext(profile=load_profile("local", PROFILES), profile_source="local"))
    assert [c.name for c in found] == ["local.first", "local.doctor"]
    assert found[1].status == "fail" and found[1].fix == "run on a login node"
    assert not passed(found)
    result = invoke("doctor", "-p", "local", "--profiles-dir", str(PROFILES))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "fix: run on a login node" in result.stdout


@pytest.mark.parametrize("status,ok", [("pass", True), ("skip", True), ("fail", False)])
def test_only_a_failure_fails_the_report(status, ok):
    assert passed([Check("x.a", "pass", ""), Check("x.b", status, "")]) is ok
