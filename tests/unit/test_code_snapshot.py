"""Code shipped as an immutable snapshot (jobgen/usercode/snapshot.py).

A temporary git repository holds a package and the spec. Submitting (local through
LocalBackend's ``runner``, SLURM through the fake client commands of tests/fakes/slurm) must
leave ``<run dir>/code/<commit>/`` holding the committed content — not an edit made after
submit — first on every rank's PYTHONPATH, recorded in the submission record; a dirty work
tree is refused (exit 2, hint) unless ``--allow-dirty``, which records the diff's sha256.
job.sbatch is run under bash with stubs; the Kubernetes checkout renders, validates offline,
and its script is run for real against a ``file://`` repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobgen import api, jobdir
from jobgen.backends import get_backend, plan
from jobgen.backends.base import SubmitOptions, SubmittedJob
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.backends.local import LocalBackend
from jobgen.errors import ConfigError, PlanError, SubmitError
from jobgen.jobdir import CODE_DIFF_FILE, CODE_INFO_FILE, SUBMISSION_FILE, CodeSnapshot, Submission, read_code_snapshot
from jobgen.specs.load import load_profile, load_spec, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, TEMPLATES, lint_bash, write
from tests.fakes.slurm.fakeslurm import FakeSlurm, reply

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("JOBGEN_CODE_DIR", raising=False)
    monkeypatch.delenv("SBATCH_EXPORT", raising=False)


@pytest.fixture
def repo(tmp_path) -> Path:
    """``proj/``: a git repository with ``src/mypkg`` (VALUE = 1) and ``jobs/train.yaml``
    (``code: {python_path: src}``), all committed."""
    root = tmp_path / "proj"
    write(root / "src" / "mypkg" / "__init__.py", "VALUE = 1\n")
    write(root / "jobs" / "train.yaml", "name: snap\ncode: {python_path: src}\n")
    write(root / ".gitignore", "runs/\n")
    git(root.parent, "init", "-q", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "code")
    return root


def local_submit(spec: Path, tmp_path: Path, *, allow_dirty: bool = False, runner=None):
    """``jobgen submit SPEC --profile local`` through the API with a fake runner; returns
    ``(result, job_dir, calls)``."""
    calls: list[tuple[list[str], Path, dict[str, str]]] = []

    def record(argv, cwd, env):
        calls.append((argv, cwd, env))
        return runner(argv, cwd, env) if runner else 0

    job_plan = api.plan_job(spec, "local")
    options = SubmitOptions(runs_dir=tmp_path / "runs", allow_dirty=allow_dirty)
    backend = get_backend("local")
    job_dir = backend.job_dir(job_plan, tmp_path, options)
    job_plan.write(job_dir)
    result = LocalBackend(runner=record).submit(job_dir, options, lambda _: None, plan=job_plan)
    return result, job_dir.resolve(), calls


# --------------------------------------------------------------------------- local


def test_local_snapshot_holds_the_commit_and_comes_first_on_pythonpath(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(repo / "src"))  # the working tree is importable too: the snapshot must win
    head = git(repo, "rev-parse", "HEAD")

    def edit_then_import(argv, cwd, env):
        (repo / "src" / "mypkg" / "__init__.py").write_text("VALUE = 2\n")  # an edit after submit
        proc = subprocess.run([sys.executable, "-c", "import mypkg; print(mypkg.VALUE, mypkg.__file__)"], env=env,
                              capture_output=True, text=True, check=True)
        (tmp_path / "imported").write_text(proc.stdout)
        return 0

    result, job_dir, calls = local_submit(repo / "jobs" / "train.yaml", tmp_path, runner=edit_then_import)
    snapshot = job_dir / "code" / head
    assert (snapshot / "src" / "mypkg" / "__init__.py").read_text() == "VALUE = 1\n"
    value, path = (tmp_path / "imported").read_text().split()
    assert value == "1" and Path(path).is_relative_to(snapshot), "the rank imported the working tree, not the snapshot"
    env = calls[0][2]
    assert env["JOBGEN_CODE_DIR"] == str(snapshot)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(snapshot / "src")
    info = read_code_snapshot(snapshot)
    assert info == CodeSnapshot(commit=head, dirty=False, diff_sha256=None, repo=str(repo.resolve()), python_path="src")
    record = Submission.load(job_dir / SUBMISSION_FILE)
    assert record == result.record and record.code == info and record.code_dir == str(snapshot)
    # A second submit of the same commit reuses the (immutable) snapshot.
    git(repo, "checkout", "-q", "--", ".")
    again, _, calls = local_submit(repo / "jobs" / "train.yaml", tmp_path)
    assert again.record.code_dir == str(snapshot) and calls[0][2]["JOBGEN_CODE_DIR"] == str(snapshot)


@pytest.mark.parametrize("change", ["modified", "untracked", "deleted"])
def test_local_refuses_a_dirty_tree_and_nothing_runs(repo, tmp_path, run_cli, change):
    if change == "modified":
        (repo / "src" / "mypkg" / "__init__.py").write_text("VALUE = 3\n")
    elif change == "untracked":
        write(repo / "src" / "mypkg" / "new.py", "X = 1\n")
    else:
        (repo / "src" / "mypkg" / "__init__.py").unlink()
    with pytest.raises(ConfigError, match="uncommitted change") as info:
        local_submit(repo / "jobs" / "train.yaml", tmp_path)
    assert info.value.exit_code == 2 and "--allow-dirty" in (info.value.hint or "")
    assert not (tmp_path / "runs" / "snap" / "code").exists() and not (tmp_path / "runs" / "snap" / SUBMISSION_FILE).exists()
    result = run_cli("submit", str(repo / "jobs" / "train.yaml"), "--profile", "local", "--runs-dir", str(tmp_path / "cli-runs"))
    assert result.code == 2 and "uncommitted change" in result.stderr and "hint:" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "cli-runs").exists()  # "Nothing was submitted": no run directory, no spec.json either


def test_edits_to_the_spec_file_and_the_rendered_files_are_not_code(repo, tmp_path):
    (repo / "jobs" / "train.yaml").write_text("name: snap\ncode: {python_path: src}\ntrainer: {max_steps: 70}\n")
    # a run directory inside the repository (not ignored) is not code either
    result, job_dir, _ = local_submit(repo / "jobs" / "train.yaml", repo / "out")
    assert result.record.code is not None and not result.record.code.dirty


def test_allow_dirty_copies_the_changes_and_records_the_diff(repo, tmp_path):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "src" / "mypkg" / "__init__.py").write_text("VALUE = 4\n")
    write(repo / "src" / "mypkg" / "extra.py", "EXTRA = True\n")
    result, job_dir, calls = local_submit(repo / "jobs" / "train.yaml", tmp_path, allow_dirty=True)
    info = result.record.code
    assert info.dirty and info.commit == head
    snapshot = Path(result.record.code_dir)
    assert snapshot == job_dir / "code" / f"{head}-dirty-{info.diff_sha256[:12]}"
    assert (snapshot / "src" / "mypkg" / "__init__.py").read_text() == "VALUE = 4\n"
    assert (snapshot / "src" / "mypkg" / "extra.py").read_text() == "EXTRA = True\n"
    patch = (snapshot / CODE_DIFF_FILE).read_bytes()
    assert hashlib.sha256(patch).hexdigest() == info.diff_sha256
    assert b"+VALUE = 4" in patch and b"+EXTRA = True" in patch
    assert read_code_snapshot(snapshot) == info == Submission.load(job_dir / SUBMISSION_FILE).code
    assert git(repo, "status", "--porcelain") != "" and "extra.py" not in git(repo, "diff", "--cached", "--name-only")  # index untouched


def test_a_spec_of_user_code_outside_git_takes_no_snapshot_and_says_so_once(tmp_path):
    spec = write(tmp_path / "loose" / "train.yaml", "name: loose\nentrypoint: {module: mypkg.train}\n")
    said: list[str] = []
    job_plan = api.plan_job(spec, "local")
    options = SubmitOptions(runs_dir=tmp_path / "runs")
    backend = get_backend("local")
    job_dir = backend.job_dir(job_plan, tmp_path, options)
    job_plan.write(job_dir)
    calls = []
    result = LocalBackend(runner=lambda a, c, e: calls.append(e) or 0).submit(job_dir, options, said.append, plan=job_plan)
    assert result.record.code is None and "JOBGEN_CODE_DIR" not in calls[0]
    assert len([line for line in said if "no code snapshot" in line]) == 1


def test_a_spec_of_the_builtin_model_takes_no_snapshot_even_in_a_dirty_repository(repo, tmp_path):
    """The quick start from a jobgen checkout with local edits: jobgen's installed code runs,
    there is no user code to snapshot, and nothing is refused or said."""
    spec = write(repo / "jobs" / "builtin.yaml", "name: builtin\n")
    write(repo / "src" / "mypkg" / "__init__.py", "VALUE = 99\n")  # uncommitted
    result, _, calls = local_submit(spec, tmp_path)
    assert result.record.code is None and "JOBGEN_CODE_DIR" not in calls[0][2]
    assert not (tmp_path / "runs" / "builtin" / "code").exists()


def test_code_that_names_no_repository_is_an_error(tmp_path):
    spec = write(tmp_path / "loose" / "train.yaml", "name: loose\ncode: {python_path: src}\n")
    with pytest.raises(ConfigError, match="not in a git work tree"):
        local_submit(spec, tmp_path)


def test_snapshot_false_takes_none(repo, tmp_path):
    (repo / "jobs" / "train.yaml").write_text("name: snap\ncode: {snapshot: false}\n")
    (repo / "src" / "mypkg" / "__init__.py").write_text("VALUE = 5\n")  # dirty, but nothing is snapshotted
    result, _, calls = local_submit(repo / "jobs" / "train.yaml", tmp_path)
    assert result.record.code is None and "JOBGEN_CODE_DIR" not in calls[0][2]


# --------------------------------------------------------------------------- SLURM (offline fakes)


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurm:
    fake = FakeSlurm(tmp_path)
    for key, value in fake.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FAKE_SLURM_RECORD_ENV", "JOBGEN_CODE_DIR,PYTHONPATH")
    return fake


def slurm_submit(run_cli, spec: Path, tmp_path: Path, *extra: str):
    return run_cli("submit", str(spec), "--profile", "slurm-cpu", "--profiles-dir", str(PROFILES), "--out", str(tmp_path / "manifests"),
                   "--runs-dir", str(tmp_path / "runs"), *extra, cwd=tmp_path)


def test_slurm_submit_exports_the_snapshot_to_sbatch_and_records_it(repo, tmp_path, run_cli, slurm):
    head = git(repo, "rev-parse", "HEAD")
    slurm.respond("sbatch", reply("123\n"))
    result = slurm_submit(run_cli, repo / "jobs" / "train.yaml", tmp_path)
    assert result.code == 0, result.stderr
    snapshot = (tmp_path / "runs" / "snap" / "code" / head).resolve()
    assert f"snapshot {snapshot}" in result.stdout
    (repo / "src" / "mypkg" / "__init__.py").write_text("VALUE = 9\n")  # edited while the job is queued
    assert (snapshot / "src" / "mypkg" / "__init__.py").read_text() == "VALUE = 1\n"
    env = slurm.calls("sbatch")[0]["env"]
    assert env["JOBGEN_CODE_DIR"] == str(snapshot)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(snapshot / "src")  # first, ahead of the submitting shell's
    record = json.loads((tmp_path / "manifests" / "slurm-cpu" / "snap" / SUBMISSION_FILE).read_text())
    assert record["code_dir"] == str(snapshot)
    assert record["code"] == {"commit": head, "dirty": False, "python_path": "src", "repo": str(repo.resolve())}
    assert Submission.model_validate(record).code == read_code_snapshot(snapshot)


def test_slurm_dirty_tree_is_refused_before_sbatch_unless_allow_dirty(repo, tmp_path, run_cli, slurm):
    (repo / "src" / "mypkg" / "__init__.py").write_text("VALUE = 8\n")
    slurm.respond("sbatch", reply("124\n"))
    refused = slurm_submit(run_cli, repo / "jobs" / "train.yaml", tmp_path)
    assert refused.code == 2 and "uncommitted change" in refused.stderr and "M src/mypkg/__init__.py" in refused.stderr
    assert "hint:" in refused.stderr and "--allow-dirty" in refused.stderr
    assert slurm.calls("sbatch") == []
    assert not (tmp_path / "manifests").exists() and not (tmp_path / "runs").exists()  # nothing written either
    accepted = slurm_submit(run_cli, repo / "jobs" / "train.yaml", tmp_path, "--allow-dirty")
    assert accepted.code == 0, accepted.stderr
    record = json.loads((tmp_path / "manifests" / "slurm-cpu" / "snap" / SUBMISSION_FILE).read_text())
    snapshot = Path(record["code_dir"])
    assert record["code"]["dirty"] is True
    assert record["code"]["diff_sha256"] == hashlib.sha256((snapshot / CODE_DIFF_FILE).read_bytes()).hexdigest()
    assert (snapshot / "src" / "mypkg" / "__init__.py").read_text() == "VALUE = 8\n"
    assert slurm.calls("sbatch")[0]["env"]["JOBGEN_CODE_DIR"] == str(snapshot)


def test_sbatch_export_that_drops_the_snapshot_is_refused(repo, tmp_path, run_cli, slurm, monkeypatch):
    monkeypatch.setenv("SBATCH_EXPORT", "NONE")
    result = slurm_submit(run_cli, repo / "jobs" / "train.yaml", tmp_path)
    assert result.code == 2 and "JOBGEN_CODE_DIR" in result.stderr and slurm.calls("sbatch") == []


def test_allow_dirty_is_refused_on_kubernetes():
    with pytest.raises(ConfigError, match="--allow-dirty does not apply to kubernetes"):
        get_backend("kubernetes").check_options(SubmitOptions(allow_dirty=True))


# --------------------------------------------------------------------------- job.sbatch under bash


def _sbatch(spec: dict) -> str:
    training = validate(TrainingSpec, {"name": "j", **spec}, "<test>")
    return plan(training, load_profile("slurm-cpu", PROFILES), TEMPLATES).file("job.sbatch")


@pytest.mark.parametrize(("extra", "expected"), [
    ({"JOBGEN_CODE_DIR": "/runs/a b/code/c0ffee", "PYTHONPATH": "/site/lib"}, "PYTHONPATH=/runs/a b/code/c0ffee/src:/site/lib"),
    ({"JOBGEN_CODE_DIR": "/runs/a b/code/c0ffee"}, "PYTHONPATH=/runs/a b/code/c0ffee/src"),
    ({"PYTHONPATH": "/site/lib"}, "PYTHONPATH=/site/lib"),  # `sbatch job.sbatch` by hand: no snapshot
], ids=["snapshot-first", "snapshot-only", "unset"])
def test_job_sbatch_puts_the_snapshot_first_on_every_ranks_pythonpath(tmp_path, extra, expected):
    from tests.script.test_sbatch_script import run_sbatch

    script = _sbatch({"code": {"python_path": "src"}})
    path = write(tmp_path / "job.sbatch", script)
    lint_bash(path)
    argv, _, _ = run_sbatch(script, tmp_path, extra)
    start = argv.index("env")
    assert argv[start + 1] == expected and argv[start + 2:start + 4] == ["python", "-m"]


def test_job_sbatch_of_a_spec_without_code_is_unchanged():
    assert _sbatch({}).count("JOBGEN_CODE_DIR") == 0
    assert "PYTHONPATH=${JOBGEN_CODE_DIR:+${JOBGEN_CODE_DIR}${PYTHONPATH:+:}}" in _sbatch({"code": {}})


# --------------------------------------------------------------------------- Kubernetes

REF = "0123456789abcdef0123456789abcdef01234567"
GIT_CODE = {"code": {"python_path": "src", "git": {"url": "https://git.example.com/team/proj.git", "ref": REF}}}


def k8s_render(tmp_path: Path, job_api: str, spec: dict, image: str | None = None):
    doc = {"extends": str(PROFILES / "k8s-a100.yaml"), "kubernetes": {"job_api": job_api, **({"image": image} if image else {})}}
    if job_api == "trainjob":
        doc["kubernetes"]["trainer_runtime"] = "torch-distributed"
    profile = load_profile(str(write(tmp_path / f"{job_api}.yaml", yaml.safe_dump(doc))))
    job_plan = plan(validate(TrainingSpec, {"name": "job", **spec}, "<spec>"), profile, TEMPLATES, spec_source="spec.yaml")
    manifest = jobdir.TRAINJOB_FILE if job_api == "trainjob" else jobdir.PYTORCHJOB_FILE
    return job_plan, k8s_manifest.parse_manifest(job_plan.file(manifest), manifest)


@pytest.mark.parametrize("job_api", ["pytorchjob", "trainjob"])
def test_code_git_checks_out_the_commit_in_every_pod(tmp_path, job_api):
    job_plan, (_, job) = k8s_render(tmp_path, job_api, GIT_CODE)
    assert not [w for w in job_plan.warnings if "skipped" in w or "not pinned" in w], job_plan.warnings
    if job_api == "pytorchjob":
        pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        c = pod["containers"][0]
        command, env, mounts, volumes = c["command"], c["env"], c["volumeMounts"], pod["volumes"]
    else:
        trainer = job["spec"]["trainer"]
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = patch["template"]["spec"]["template"]["spec"]
        command, env, mounts, volumes = trainer["command"], trainer["env"], pod["containers"][0]["volumeMounts"], pod["volumes"]
    assert command[:4] == ["sh", "-c", k8s_manifest.CHECKOUT_SCRIPT, "jobgen-code"]
    assert command[4:7] == ["python", "-m", "jobgen.train.launch"] and "jobgen.train" in command
    values = {e["name"]: e.get("value") for e in env}
    root = f"/jobgen-code/{REF}"
    assert values["JOBGEN_CODE_DIR"] == root and values["PYTHONPATH"] == f"{root}/src"
    assert values["JOBGEN_CODE_REF"] == REF and values["JOBGEN_CODE_URL"] == GIT_CODE["code"]["git"]["url"]
    assert CodeSnapshot.model_validate_json(values["JOBGEN_CODE_INFO"]).commit == REF
    assert {"mountPath": "/jobgen-code", "name": "jobgen-code"} in mounts and {"emptyDir": {}, "name": "jobgen-code"} in volumes


def test_a_branch_ref_is_refused_with_the_fix(tmp_path):
    spec = write(tmp_path / "s.yaml", "name: job\ncode: {git: {url: 'https://git.example.com/p.git', ref: main}}\n")
    with pytest.raises(ConfigError, match="not a full commit id") as info:
        load_spec(spec)
    assert "code.git.ref" in str(info.value) and "git rev-parse" in str(info.value)


def test_code_git_is_refused_on_slurm():
    with pytest.raises(PlanError, match="Kubernetes option"):
        _sbatch(GIT_CODE)


def test_the_image_is_the_code_unless_pinned_by_digest(tmp_path):
    job_plan, _ = k8s_render(tmp_path, "pytorchjob", {}, image="ghcr.io/example/train:0.1.0")
    assert any("not pinned by digest" in w for w in job_plan.warnings)
    pinned, _ = k8s_render(tmp_path, "pytorchjob", {}, image="ghcr.io/example/train@sha256:" + "a" * 64)
    assert not any("not pinned" in w for w in pinned.warnings)


def test_the_checkout_script_fetches_exactly_the_commit(repo, tmp_path):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "src" / "mypkg" / "__init__.py").write_text("VALUE = 7\n")
    git(repo, "commit", "-q", "-am", "later")  # the branch moves on; the job keeps its commit
    info = CodeSnapshot(commit=head, repo=f"file://{repo}", python_path="src")
    dest = tmp_path / "mount" / head
    dest.parent.mkdir()
    env = {**os.environ, "JOBGEN_CODE_DIR": str(dest), "JOBGEN_CODE_URL": f"file://{repo}", "JOBGEN_CODE_REF": head,
           "JOBGEN_CODE_INFO": json.dumps(info.model_dump(mode="json"))}
    argv = ["sh", "-c", k8s_manifest.CHECKOUT_SCRIPT, "jobgen-code", "cat", str(dest / "src" / "mypkg" / "__init__.py")]
    for _ in range(2):  # a restarted container reuses the checkout
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.endswith("VALUE = 1\n")
    assert read_code_snapshot(dest) == info and not (dest / ".git").exists()


# --------------------------------------------------------------------------- entrypoint, records, spec


def test_the_entrypoint_puts_the_snapshot_first_and_returns_its_record(tmp_path):
    from jobgen.train.__main__ import use_code_snapshot

    root = tmp_path / "code" / ("c" * 40)
    root.mkdir(parents=True)
    info = CodeSnapshot(commit="c" * 40, repo="/r", python_path="src")
    (root / CODE_INFO_FILE).write_text(info.dumps())
    environ, path = {"JOBGEN_CODE_DIR": str(root), "PYTHONPATH": "/x"}, ["/first"]
    record = use_code_snapshot(environ, path)
    assert path[0] == str(root / "src") and environ["PYTHONPATH"] == f"{root / 'src'}{os.pathsep}/x"
    assert record == {**info.model_dump(mode="json"), "dir": str(root)}
    assert use_code_snapshot({}, []) is None
    with pytest.raises(ConfigError, match="not a code snapshot"):
        use_code_snapshot({"JOBGEN_CODE_DIR": str(tmp_path)}, [])


def test_the_submission_record_round_trips_with_its_code(tmp_path):
    info = CodeSnapshot(commit="d" * 40, dirty=True, diff_sha256="e" * 64, repo="/r", python_path="")
    record = Submission(handle="local:///run", job_dir=str(tmp_path / "job"), run_dir=str(tmp_path / "job"),
                        code_dir=str(tmp_path / "job" / "code" / "x"), code=info)
    assert Submission.load(record.save()) == record


@pytest.mark.parametrize("bad", ["../up", "/abs", "a b", "src/../..", "x;y"])
def test_python_path_is_a_plain_subdirectory(bad):
    with pytest.raises(ConfigError, match="python_path"):
        validate(TrainingSpec, {"name": "j", "code": {"python_path": bad}}, "<test>")


# --------------------------------------------------------------------------- jobgen's outputs never block jobgen


def test_two_local_submits_in_a_row_from_one_repository(repo, tmp_path):
    """The first submit writes its run directory into the work tree (``--runs-dir`` inside the
    repository, no .gitignore for it): the second submit of the same spec is not refused."""
    (repo / ".gitignore").unlink()
    git(repo, "commit", "-q", "-am", "no .gitignore")
    first, job_dir, _ = local_submit(repo / "jobs" / "train.yaml", repo / "out")  # runs dir out/runs: not ignored
    assert job_dir.is_relative_to(repo) and first.record.code is not None
    write(job_dir / "logs" / "version_0" / "metrics.csv", "step\n")  # what the run writes there
    write(job_dir / "summary.json", "{}\n")
    other = write(repo / "jobs" / "other.yaml", "name: other\ncode: {python_path: src}\n")
    git(repo, "add", "jobs/other.yaml")
    git(repo, "commit", "-q", "-m", "another job")
    again, _, _ = local_submit(repo / "jobs" / "train.yaml", repo / "out")  # the same job again
    assert again.record.code is not None and not again.record.code.dirty
    third, _, _ = local_submit(other, repo / "out")  # another job of the same repository
    assert third.record.code is not None and not third.record.code.dirty
    assert git(repo, "status", "--porcelain") == "", "jobgen's run directories must be ignored by git"


def test_rendered_job_dirs_in_the_work_tree_do_not_block_a_submit(repo, tmp_path, run_cli, slurm):
    """A ``jobgen render`` (or a SLURM submit) wrote job directories under the repository's
    manifests/: files with jobgen's generated mark and submission records are jobgen's output,
    not code. A user's own untracked file next to them still counts."""
    head = git(repo, "rev-parse", "HEAD")
    slurm.respond("sbatch", reply("321\n"))
    render = run_cli("render", str(repo / "jobs" / "train.yaml"), "--profile", "slurm-cpu", "--profiles-dir", str(PROFILES),
                     "--out", str(repo / "manifests"), cwd=repo)
    assert render.code == 0, render.stderr
    first = run_cli("submit", str(repo / "jobs" / "train.yaml"), "--profile", "slurm-cpu", "--profiles-dir", str(PROFILES),
                    "--out", str(repo / "manifests"), "--runs-dir", str(repo / "runs"), cwd=repo)
    assert first.code == 0, first.stderr
    other = write(repo / "jobs" / "other.yaml", "name: other\ncode: {python_path: src}\n")
    git(repo, "add", "jobs/other.yaml")
    git(repo, "commit", "-q", "-m", "another job")
    second = run_cli("submit", str(other), "--profile", "slurm-cpu", "--profiles-dir", str(PROFILES),
                     "--out", str(repo / "manifests"), "--runs-dir", str(repo / "runs"), cwd=repo)
    assert second.code == 0, second.stderr
    assert head != git(repo, "rev-parse", "HEAD")
    write(repo / "manifests" / "notes.txt", "mine\n")  # not jobgen's: refused
    third = run_cli("submit", str(other), "--profile", "slurm-cpu", "--profiles-dir", str(PROFILES),
                    "--out", str(repo / "manifests"), "--runs-dir", str(repo / "runs"), "--force", cwd=repo)
    assert third.code == 2 and "manifests/notes.txt" in third.stderr


# --------------------------------------------------------------------------- python_path defaults to the repository root


def _user_repo(tmp_path: Path, code: str) -> tuple[Path, Path]:
    """A committed repository with ``mymodels.py`` at its root and ``jobs/train.yaml`` naming
    ``mymodels.Regressor`` (``code`` is the spec's code line, or empty)."""
    root = tmp_path / "userrepo"
    write(root / "mymodels.py", "class Regressor:\n    pass\n")
    write(root / "jobs" / "train.yaml", f"name: byo\n{code}model: {{class_path: mymodels.Regressor}}\n"
                                         "data: {class_path: mymodels.Data}\n")
    git(root.parent, "init", "-q", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "code")
    return root, root / "jobs" / "train.yaml"


@pytest.mark.parametrize("code", ["", "code: {}\n", "code: {python_path: .}\n", "code: {python_path: ./}\n"],
                         ids=["no-code-section", "empty-code", "dot", "dot-slash"])
def test_local_import_dir_defaults_to_the_repository_root(tmp_path, code):
    from jobgen.usercode.snapshot import local_import_dir

    root, spec_file = _user_repo(tmp_path, code)
    spec = load_spec(spec_file)
    assert local_import_dir(spec, spec_file) == root.resolve()


def test_local_import_dir_of_a_python_path_and_of_no_repository(tmp_path):
    from jobgen.usercode.snapshot import local_import_dir

    root, spec_file = _user_repo(tmp_path, "code: {python_path: src}\n")
    assert local_import_dir(load_spec(spec_file), spec_file) == root.resolve() / "src"
    loose = write(tmp_path / "loose" / "train.yaml", "name: loose\nmodel: {class_path: mymodels.Regressor}\n"
                                                     "data: {class_path: mymodels.Data}\n")
    assert local_import_dir(load_spec(loose), loose) is None  # no repository: nothing to put first
    builtin = write(root / "jobs" / "builtin.yaml", "name: builtin\n")
    assert local_import_dir(load_spec(builtin), builtin) is None  # jobgen's own model: no user code


# --------------------------------------------------------------------------- command mode, local


def test_a_local_command_run_runs_in_the_snapshot_and_ends_completed(repo, tmp_path, monkeypatch):
    """Command mode: the ranks run in the snapshot's copy of the directory ``jobgen submit`` ran
    in (what the README says: a relative script and config paths resolve to the committed
    files, as after a requeue); when the command exits 0 the run directory gets summary.json,
    so ``status``/``ls`` say COMPLETED with the device time instead of UNKNOWN forever."""
    write(repo / "train.py", "print('hi')\n")
    spec = write(repo / "jobs" / "cmd.yaml", "name: cmd\nentrypoint: {script: train.py, args: [--config, jobs/c.yaml]}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "script")
    head = git(repo, "rev-parse", "HEAD")
    monkeypatch.chdir(repo)
    result, job_dir, calls = local_submit(spec, tmp_path)
    argv, cwd, _ = calls[0]
    assert cwd == job_dir / "code" / head and (cwd / "train.py").is_file() and argv[-3:] == ["train.py", "--config", "jobs/c.yaml"]
    status = get_backend("local").status(SubmittedJob(result.handle, result.record))
    assert status.state == "COMPLETED", status.details
    assert status.usage is not None and status.usage.devices == 2 and status.usage.device_kind == "cpu"
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["name"] == "cmd" and summary["exit_code"] == 0 and summary["world_size"] == 2
    assert summary["entrypoint"] == {"script": "train.py", "args": ["--config", "jobs/c.yaml"]}
    assert summary["cwd"] == str(cwd) and summary["code"]["commit"] == head and summary["code"]["dir"] == str(cwd)
    assert summary["wall_time_s"] >= 0 and summary["usage"]["devices"] == 2


def test_a_failed_local_command_run_writes_no_summary_and_is_failed(repo, tmp_path, monkeypatch):
    write(repo / "train.py", "raise SystemExit(3)\n")
    spec = write(repo / "jobs" / "cmd.yaml", "name: cmd\nentrypoint: {script: train.py}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "script")
    monkeypatch.chdir(repo)
    with pytest.raises(SubmitError, match="exited with code 3"):
        local_submit(spec, tmp_path, runner=lambda argv, cwd, env: 3)
    assert not (tmp_path / "runs" / "cmd" / "summary.json").exists()
    status = get_backend("local").status(SubmittedJob(jobdir.JobHandle("local", str((tmp_path / "runs" / "cmd").resolve()))))
    assert (status.state, status.details["exit_code"]) == ("FAILED", "3"), status  # not UNKNOWN for good


def test_a_rendered_deepspeed_job_does_not_block_a_submit(repo, tmp_path, run_cli):
    """``ds_config.json`` carries no mark of its own (it is DeepSpeed's format): it is
    jobgen's output when the spec.json jobgen rendered beside it names it, in a job directory and
    in a job array's ``points/<i>/``. A ds_config.json of the user's elsewhere is still a change."""
    from jobgen.usercode.snapshot import changes

    spec = write(repo / "jobs" / "zero.yaml", "name: zero\ntrainer: {strategy: deepspeed_stage_2}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a DeepSpeed spec")
    for profile, sweep in (("slurm-cpu", ()), ("slurm-cpu-array", ("--sweep", "trainer.learning_rate=1e-4,3e-4"))):
        render = run_cli("render", str(spec), "--profile", profile, "--profiles-dir", str(PROFILES),
                         "--out", str(repo / "manifests"), *sweep, cwd=repo)
        assert render.code == 0, render.stderr
    written = sorted(p.relative_to(repo).as_posix() for p in (repo / "manifests").rglob("ds_config.json"))
    assert "manifests/slurm-cpu/zero/ds_config.json" in written and any("/points/1/" in p for p in written), written
    assert changes(repo) == ()
    write(repo / "configs" / "ds_config.json", "{}\n")  # the user's own: not beside a spec.json of jobgen's
    assert [c.path for c in changes(repo)] == ["configs/ds_config.json"]


def test_a_taken_snapshot_gives_the_ranks_environment_and_command_modes_workdir(tmp_path):
    """The one place every backend takes the snapshot's variables and working directory from:
    the import directory first on PYTHONPATH (a path with spaces and quotes kept whole), the
    caller's PYTHONPATH after it, and a directory of the work tree mapped into the snapshot."""
    from jobgen.usercode.snapshot import TakenSnapshot

    work_tree = tmp_path / "my 'proj'"
    snap = tmp_path / "runs" / "r 1" / "code" / ("a" * 40)
    record = CodeSnapshot(commit="a" * 40, dirty=False, diff_sha256=None, repo=str(work_tree), python_path="src")
    taken = TakenSnapshot(snap, record)
    env = taken.environment("/opt/site:/x y")
    assert env == {"JOBGEN_CODE_DIR": str(snap), "PYTHONPATH": f"{snap / 'src'}:/opt/site:/x y"}
    assert taken.environment(None)["PYTHONPATH"] == str(snap / "src")
    assert taken.id == "a" * 40
    assert taken.workdir(work_tree / "jobs") == snap / "jobs"
    assert taken.workdir(tmp_path / "elsewhere") == tmp_path / "elsewhere"
