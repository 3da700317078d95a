"""`jobgen submit SPEC` reads and validates the spec once and hands the loaded object down (the
plan, the --smoke variant made from it, the class_path import check), instead of reading the
file again for each; below the API the backend takes the plan's own
objects (the resolved spec, the manifest's objects, the submission record it saved) instead of
reading back what submit has just written. `jobgen validate -p` plans the spec it loaded."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import jobgen.api
import jobgen.specs.load
import jobgen.usercode.classes
from jobgen.cli import cli
from jobgen.specs.load import load_profile
from jobgen.specs.training import TrainingSpec
from tests.conftest import EXAMPLES, PROFILES, TEMPLATES, site_profile

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


# --------------------------------------------------------------------------- down the layers, once


#: Files a backend would read back although `jobgen submit SPEC` has just made them from objects
#: it hands down: the resolved spec, the submission record, the Kubernetes manifest.
WRITTEN_HERE = {"spec.json", ".jobgen-submission.json", "pytorchjob.yaml", "trainjob.yaml", "array.json"}


@pytest.mark.parametrize("profile", ["local", "slurm-cpu", "k8s-h100"])
def test_submit_hands_the_plan_down_instead_of_reading_back_what_it_wrote(profile, slurm, tmp_path, monkeypatch):
    """From cli.submit through api.submit to the backend: the spec and each profile file are
    read once, the spec planned once, and nothing the submit wrote (spec.json, the manifest,
    the submission record) is read back: the backend takes the plan's objects."""
    import jobgen.backends.kubernetes.backend as k8s
    import jobgen.backends.local as local
    import jobgen.planning.plan
    from tests.fakes.slurm.fakeslurm import reply
    from tests.unit.test_k8s_submit import FakeCluster

    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "quickstart.yaml"  # outside a git work tree: no snapshot
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text())
    # a site's profile in place of a shipped one with example values (a real submit refuses those)
    profiles = PROFILES
    if load_profile(str(PROFILES / f"{profile}.yaml")).placeholders:
        profiles = site_profile(tmp_path / "profiles", profile).parent
    yaml_reads: list[Path] = []
    read_back: list[str] = []
    planned: list[str] = []
    read_yaml, read_text, plan_context = jobgen.specs.load.read_yaml, Path.read_text, jobgen.planning.plan.plan_context

    def counting_read_text(self, *args, **kwargs):
        if self.name in WRITTEN_HERE:
            read_back.append(str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(jobgen.specs.load, "read_yaml", lambda path: yaml_reads.append(Path(path).resolve()) or read_yaml(path))
    monkeypatch.setattr(Path, "read_text", counting_read_text)
    monkeypatch.setattr(jobgen.planning.plan, "plan_context", lambda spec, *a, **kw: planned.append(spec.name) or plan_context(spec, *a, **kw))
    monkeypatch.setattr(local, "_run_foreground", lambda argv, cwd, env, log, echo: 0)
    slurm.respond("sbatch", reply("123\n"))
    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)

    result = CliRunner().invoke(cli, ["submit", str(spec), "-p", profile, "--profiles-dir", str(profiles),
                                      "--templates-dir", str(TEMPLATES)], catch_exceptions=False)

    assert result.exit_code == 0, result.output
    assert any(line.startswith(("completed ", "submitted ", "created ")) for line in result.output.splitlines()), result.output
    assert read_back == [], f"read back what submit had just written: {read_back}"
    assert planned == ["quickstart"], f"planned {len(planned)} times"
    assert yaml_reads and all(yaml_reads.count(path) == 1 for path in yaml_reads), yaml_reads


def test_validate_with_a_profile_reads_the_spec_once(monkeypatch):
    reads: list[Path] = []
    read_yaml = jobgen.specs.load.read_yaml
    monkeypatch.setattr(jobgen.specs.load, "read_yaml", lambda path: reads.append(Path(path).resolve()) or read_yaml(path))
    result = CliRunner().invoke(cli, ["validate", str(EXAMPLES / "quickstart.yaml"), "-p", "slurm-a100", "--profiles-dir", str(PROFILES),
                                      "--templates-dir", str(TEMPLATES)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert reads.count((EXAMPLES / "quickstart.yaml").resolve()) == 1 and "fits profile 'slurm-a100'" in result.output


# --------------------------------------------------------------------------- a submitted job, resolved once


def test_status_resolves_the_job_once(monkeypatch, tmp_path):
    """`jobgen status JOB` on a failed local run shows the state, the failure with the restart
    budget, and the progress, and reads the job's submission record from the state index once
    for all three (one :class:`jobgen.backends.base.SubmittedJob`), not once for each."""
    import sys

    import jobgen.backends.local as local
    import jobgen.jobdir.submission

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    spec = tmp_path / "quickstart.yaml"  # outside a git work tree: no snapshot
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text())
    monkeypatch.setattr(local, "_run_foreground", lambda argv, cwd, env, log, echo: 1)
    submitted = CliRunner().invoke(cli, ["submit", str(spec), "-p", "local", "--profiles-dir", str(PROFILES), "--templates-dir",
                                         str(TEMPLATES), "--set", "restart.max_restarts=0"])
    assert submitted.exit_code == 1, submitted.output
    [run_dir] = [p.parent for p in (tmp_path / "runs").glob("*/spec.json")]
    (run_dir / "logs" / "version_0").mkdir(parents=True)
    (run_dir / "logs" / "version_0" / "metrics.csv").write_text("step,tokens_per_s\n10,100.0\n")

    calls: dict[str, list[str]] = {"find_submission": [], "resolve_job": []}
    for name in calls:
        original = getattr(jobgen.jobdir.submission, name)

        def counting(arg, _name=name, _original=original):
            calls[_name].append(str(arg))
            return _original(arg)

        jobgen_modules = [m for key, m in list(sys.modules.items()) if key == "jobgen" or key.startswith("jobgen.")]
        for module in jobgen_modules:  # every module that imported the function by name
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting)
    shown = CliRunner().invoke(cli, ["status", str(run_dir), "-o", "json"], catch_exceptions=False)

    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert doc["state"] == "FAILED" and doc["failure"]["max_restarts"] == 0, doc
    assert doc["progress"]["step"] == 10, doc
    assert calls["resolve_job"] == [str(run_dir)], f"the job was resolved {len(calls['resolve_job'])} times"
    assert calls["find_submission"] == [f"local://{run_dir}"], f"the record was looked up {len(calls['find_submission'])} times"
