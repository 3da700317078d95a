"""`jobgen submit SPEC --sweep ...`: render and submit a sweep in one command.

SLURM answers through the fake client commands (tests/fakes/slurm): one job per point on
``slurm-cpu``, ONE job array on ``slurm-cpu-array`` (``slurm.sweep_as_array``). Bad input is
refused as `render --sweep` refuses it, before anything is written or submitted; a failure after
some points were submitted names them and the rest (exit 1). `jobgen ls` keeps a sweep together.
A real 2-point local sweep trains at the end (slow); the real array: tests/integration/slurm.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from jobgen.api import PLANNERS
from jobgen.jobdir import SUBMISSION_FILE, Submission, SweepTag, recorded_submissions
from jobgen.planning.sweep import SpecOptions, plan_single
from tests.conftest import EXAMPLES, site_profile, write
from tests.fakes.slurm.fakeslurm import reply

SPEC = str(EXAMPLES / "quickstart.yaml")
SWEEPS = ("--sweep", "trainer.learning_rate=1e-4,3e-4", "--sweep", "trainer.micro_batch_size=4,8")


def point_names(profile: str = "slurm-cpu", sweeps: tuple[str, ...] = SWEEPS) -> list[str]:
    """The job names `jobgen render --sweep` gives the points, in grid order."""
    render = plan_single(SPEC, profile, PLANNERS, SpecOptions(sweeps=sweeps[1::2]))
    order = {tuple(job.sweep): job.plan.job_name for job in render.jobs}
    from jobgen.specs.sweeps import parse_sweep, sweep_points

    return [order[tuple(p)] for p in sweep_points([parse_sweep(s) for s in sweeps[1::2]])]


def records() -> list[Submission]:
    """The state index (the ``slurm`` fixture's own), as `jobgen ls` reads it."""
    return recorded_submissions()


def test_one_job_per_point_each_handle_printed_and_recorded_as_one_sweep(slurm, run_cli, tmp_path):
    slurm.respond("sbatch", *(reply(f"{100 + i}\n") for i in range(4)))
    result = run_cli("submit", SPEC, "-p", "slurm-cpu", *SWEEPS, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 0, result.stderr
    names = point_names()
    runs = (tmp_path / "runs").resolve()
    assert slurm.argvs() == [["sbatch", "--parsable", f"--chdir={runs / name}", "job.sbatch"] for name in names]
    for i, name in enumerate(names):
        assert f"submitted slurm://cpu/{100 + i}  {name} (" in result.stdout, result.stdout
    tags = {r.handle: r.sweep for r in records()}
    assert set(tags) == {f"slurm://cpu/{100 + i}" for i in range(4)}
    assert len({t.id for t in tags.values()}) == 1 and f"sweep {next(iter(tags.values())).id}: 4 job(s)" in result.stdout
    assert [(t.index, t.overrides) for t in sorted(tags.values(), key=lambda t: t.index)] == [
        (0, {"trainer.learning_rate": "1e-4", "trainer.micro_batch_size": "4"}),
        (1, {"trainer.learning_rate": "1e-4", "trainer.micro_batch_size": "8"}),
        (2, {"trainer.learning_rate": "3e-4", "trainer.micro_batch_size": "4"}),
        (3, {"trainer.learning_rate": "3e-4", "trainer.micro_batch_size": "8"})]
    assert all(t.name == "quickstart" and t.points == 4 for t in tags.values())
    # each point's job directory is the one `render --sweep` writes
    for name in names:
        rendered = plan_single(SPEC, "slurm-cpu", PLANNERS, SpecOptions(sweeps=SWEEPS[1::2])).files
        for file in ("job.sbatch", "spec.json"):
            assert (runs / name / "job" / file).read_text() == rendered[f"slurm-cpu/{name}/{file}"]


def test_a_profile_that_prefers_arrays_gets_one_array_and_json_like_a_single_submit(slurm, run_cli, tmp_path):
    slurm.respond("sbatch", reply("123\n"))
    result = run_cli("submit", SPEC, "-p", "slurm-cpu-array", *SWEEPS, "--runs-dir", str(tmp_path / "runs"), "-o", "json", cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert len(slurm.argvs("sbatch")) == 1
    doc = json.loads(result.stdout)
    assert (doc["sweep"]["array"], doc["sweep"]["points"], doc["sweep"]["name"], doc["sweep"]["profile"]) == (True, 4, "quickstart", "slurm-cpu-array")
    assert doc["sweep"]["axes"] == {"trainer.learning_rate": ["1e-4", "3e-4"], "trainer.micro_batch_size": ["4", "8"]}
    (job,) = doc["jobs"]
    assert (job["handle"], job["index"], job["point"], doc["failed"], doc["not_submitted"]) == ("slurm://cpu/123", None, {}, None, [])
    assert [(t["handle"], t["name"]) for t in job["tasks"]] == [(f"slurm://cpu/123_{i}", n) for i, n in enumerate(point_names())]
    # the same document as `jobgen submit DIR -o json` of the array rendered by `render --sweep`
    rendered = run_cli("render", SPEC, "-p", "slurm-cpu-array", *SWEEPS, "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert rendered.code == 0, rendered.stderr
    slurm.respond("sbatch", reply("124\n"))
    single = json.loads(run_cli("submit", str(tmp_path / "m" / "slurm-cpu-array" / "quickstart"), "--runs-dir", str(tmp_path / "runs2"),
                                "-o", "json", cwd=tmp_path).stdout)
    assert set(job) - {"index", "name", "point"} == set(single)
    assert [set(t) for t in job["tasks"]] == [set(t) for t in single["tasks"]]
    array = next(r for r in records() if r.handle == "slurm://cpu/123")
    assert array.sweep.id == doc["sweep"]["id"] and array.sweep.index is None and len(array.array) == 4


@pytest.mark.parametrize(("sweep", "message"), [
    ("trainer.learning_rate", "is not key.path=v1,v2"),
    ("trainer.learning_rate=", "needs one or more non-empty values"),
    ("trainer.learning_rate=1e-4,,3e-4", "needs one or more non-empty values"),
    ("name=a,b", "'name' cannot be swept"),
    ("trainer.micro_batch_size=4,many", "sweep point trainer.micro_batch_size=many"),
    ("trainer.lerning_rate=1e-4,3e-4", "lerning_rate"),
])
def test_bad_sweeps_are_refused_as_render_refuses_them_with_nothing_written_or_submitted(slurm, run_cli, tmp_path, sweep, message):
    submitted = run_cli("submit", SPEC, "-p", "slurm-cpu", "--sweep", sweep, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    rendered = run_cli("render", SPEC, "-p", "slurm-cpu", "--sweep", sweep, "--out", str(tmp_path / "m"), cwd=tmp_path)
    assert submitted.code == 2 and message in submitted.stderr and "hint:" in submitted.stderr, submitted.stderr
    assert submitted.stderr == rendered.stderr and rendered.code == 2
    assert "Traceback" not in submitted.stderr
    assert slurm.calls() == [] and not (tmp_path / "runs").exists() and not (tmp_path / "state").exists()


def test_a_repeated_key_and_a_job_directory_are_refused(slurm, run_cli, tmp_path):
    repeated = run_cli("submit", SPEC, "-p", "slurm-cpu", "--sweep", "trainer.seed=1,2", "--sweep", "trainer.seed=3", "-o", "json", cwd=tmp_path)
    doc = json.loads(repeated.stdout)
    assert repeated.code == 2 and doc["exit_code"] == 2 and "'trainer.seed' is given twice" in doc["error"] and doc["hint"]
    job_dir = write(tmp_path / "jobdir" / "x", "").parent
    directory = run_cli("submit", str(job_dir), "--sweep", "trainer.seed=1,2", cwd=tmp_path)
    assert directory.code == 2 and "--sweep apply to spec files" in directory.stderr and "hint:" in directory.stderr
    assert slurm.calls() == [] and not (tmp_path / "runs").exists()


def test_a_failure_after_some_points_names_what_was_submitted_and_what_not(slurm, run_cli, tmp_path):
    slurm.respond("sbatch", reply("101\n"), reply(stderr="sbatch: error: QOSMaxSubmitJobPerUserLimit\n", rc=1))
    names = point_names()
    result = run_cli("submit", SPEC, "-p", "slurm-cpu", *SWEEPS, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 1, result.stderr
    err = result.stderr
    assert "QOSMaxSubmitJobPerUserLimit" in err and "hint:" in err and "Traceback" not in err
    submitted, not_submitted = err.split("not submitted (3):")
    assert f"submitted (1 of 4):\n    {names[0]} (" in submitted and "slurm://cpu/101" in submitted
    assert [n for n in names[1:] if f"    {n} (" in not_submitted] == names[1:]
    assert [r.handle for r in records()] == ["slurm://cpu/101"]
    runs = (tmp_path / "runs").resolve()
    assert sorted(p.name for p in runs.iterdir()) == [names[0]], "the failed point's directories are put back"
    assert len(slurm.argvs("sbatch")) == 2, "the sweep stops at the first failure"

    # -o json: the error document, plus what was submitted and what not
    slurm.respond("sbatch", reply("201\n"), reply(stderr="sbatch: error: down\n", rc=1))
    doc = json.loads(run_cli("submit", SPEC, "-p", "slurm-cpu", *SWEEPS, "--runs-dir", str(tmp_path / "runs-json"), "-o", "json",
                             cwd=tmp_path).stdout)
    assert doc["exit_code"] == 1 and "sbatch: error: down" in doc["error"] and doc["hint"]
    assert [(j["handle"], j["name"]) for j in doc["jobs"]] == [("slurm://cpu/201", names[0])]
    assert doc["failed"] == {"index": 1, "name": names[1], "point": dict(zip(["trainer.learning_rate", "trainer.micro_batch_size"],
                                                                            ["1e-4", "8"], strict=True)), "handle": None}
    assert [j["name"] for j in doc["not_submitted"]] == names[1:]


def test_when_the_first_point_fails_its_own_error_is_shown_and_nothing_is_left(slurm, run_cli, tmp_path):
    slurm.respond("sbatch", reply(stderr="sbatch: error: invalid partition\n", rc=1))
    result = run_cli("submit", SPEC, "-p", "slurm-cpu", *SWEEPS, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 1 and "invalid partition" in result.stderr and "not submitted" not in result.stderr, result.stderr
    assert records() == [] and not (tmp_path / "runs").exists()


def test_test_only_validates_every_point_and_records_nothing(slurm, run_cli, tmp_path):
    slurm.respond("sbatch", reply(stderr="sbatch: Job 5 to start at 2026-11-23T06:00:00 using 2 processors on nodes n[1-2] in partition cpu\n"))
    result = run_cli("submit", SPEC, "-p", "slurm-cpu", "--sweep", "trainer.learning_rate=1e-4,3e-4", "--test-only",
                     "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert [a[2] for a in slurm.argvs("sbatch")] == ["--test-only", "--test-only"]
    assert result.stdout.count("validated (nothing queued)") == 2 and records() == []


def test_every_point_is_import_checked_before_anything_is_submitted(monkeypatch, tmp_path):
    import jobgen.api
    import jobgen.usercode.classes
    from jobgen.cli import cli

    checked: list[tuple[str, int]] = []
    monkeypatch.setattr(jobgen.usercode.classes, "check_user_code",
                        lambda spec, source: checked.append((source, spec.model.init_args["d_model"])) or ["a note"])
    submitted: list[str] = []
    monkeypatch.setattr(jobgen.api, "submit", lambda plan, options, **kw: submitted.append(plan.job_name)
                        or SimpleNamespace(action="completed", handle=None, record=None, lines=()))
    result = CliRunner().invoke(cli, ["submit", str(EXAMPLES / "usercode.yaml"), "-p", "local", "--sweep", "model.init_args.d_model=32,64",
                                      "--runs-dir", str(tmp_path / "runs")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [d for _, d in checked] == [32, 64] and all("usercode-dmodel" in source for source, _ in checked)
    assert submitted == ["usercode-dmodel32", "usercode-dmodel64"]
    assert result.output.count("note: a note") == 1


def test_kubernetes_gets_one_job_per_point(monkeypatch, tmp_path):
    """Through the in-memory API server of test_k8s_submit: one PyTorchJob per point, each handle printed."""
    from jobgen.backends.kubernetes import backend as k8s
    from jobgen.cli import cli
    from tests.unit.test_k8s_submit import FakeCluster

    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    profile = str(site_profile(tmp_path / "site", "k8s-h100"))  # the shipped one's example values are refused
    result = CliRunner().invoke(cli, ["submit", SPEC, "-p", profile, "--sweep", "trainer.learning_rate=1e-4,3e-4",
                                      "--runs-dir", str(tmp_path / "runs"), "-o", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    names = point_names("k8s-h100", ("--sweep", "trainer.learning_rate=1e-4,3e-4"))
    assert [(j["action"], j["handle"]) for j in doc["jobs"]] == [("created", f"k8s://fake/training/{n}") for n in names]
    assert sorted(path.rsplit("/", 1)[1] for path in cluster.objects if "/pytorchjobs/" in path) == sorted(names)
    assert {r.sweep.id for r in records()} == {doc["sweep"]["id"]}


def test_a_local_point_that_starts_and_fails_is_named_with_its_handle(monkeypatch, tmp_path):
    """A local point's record is written when its ranks start: a training failure after that is
    'started, then failed' (tagged with the sweep), not 'not submitted'."""
    import jobgen.api
    from jobgen.backends import get_backend
    from jobgen.backends.base import SubmitResult
    from jobgen.cli import cli
    from jobgen.errors import SubmitError

    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))

    def fake_submit(plan, options, **kw):
        job_dir = get_backend("local").job_dir(plan, None, options).resolve()
        plan.write(job_dir)
        record = Submission.now(handle=f"local://{job_dir}", job_dir=str(job_dir), run_dir=str(job_dir))
        record.save()
        if plan.job_name.endswith("lr3e-3"):
            raise SubmitError("training exited with code 1", hint="the first failing rank's error is above")
        return SubmitResult("completed", jobgen.api.JobHandle.parse(record.handle), record)

    monkeypatch.setattr(jobgen.api, "submit", fake_submit)
    spec = write(tmp_path / "tiny.yaml", "name: tiny\nmodel: {preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}\n")
    result = CliRunner().invoke(cli, ["submit", str(spec), "-p", "local", "--sweep", "trainer.learning_rate=1e-3,3e-3,1e-2",
                                      "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 1, result.output
    runs = (tmp_path / "runs").resolve()
    assert f"submitted (1 of 3):\n    tiny-lr1e-3 (trainer.learning_rate=1e-3): local://{runs / 'tiny-lr1e-3'}" in result.output
    assert f"started, then failed:\n    tiny-lr3e-3 (trainer.learning_rate=3e-3): local://{runs / 'tiny-lr3e-3'}" in result.output
    assert "not submitted (1):\n    tiny-lr1e-2 (trainer.learning_rate=1e-2)" in result.output
    assert "hint: the first failing rank's error is above; then submit the points not submitted" in result.output
    assert [(r.handle.rsplit("/", 1)[1], r.sweep.index) for r in records()] == [("tiny-lr1e-3", 0), ("tiny-lr3e-3", 1)]


def test_ls_keeps_a_sweep_together_in_point_order_with_its_id(slurm, run_cli, tmp_path):
    slurm.respond("squeue", reply(stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1))
    slurm.respond("sacct -c", reply(""))
    job_dir = str(tmp_path / "gone")
    tag = SweepTag(id="s-1", name="s", points=2, index=0, overrides={"trainer.seed": "1"})
    for handle, at, sweep in [("slurm://cpu/1", "2026-11-23T06:00:00+00:00", tag),
                              ("slurm://cpu/3", "2026-11-23T06:00:02+00:00", None),
                              ("slurm://cpu/2", "2026-11-23T06:00:01+00:00", tag.model_copy(update={"index": 1})),
                              ("slurm://cpu/4", "2026-11-23T05:00:00+00:00", None)]:
        Submission(handle=handle, job_dir=job_dir, run_dir=job_dir, submitted_at=at, sweep=sweep).save()
    assert [r.handle for r in records()] == ["slurm://cpu/3", "slurm://cpu/1", "slurm://cpu/2", "slurm://cpu/4"]
    rows = json.loads(run_cli("ls", "-o", "json", cwd=tmp_path).stdout)
    assert [(r["handle"], (r["sweep"] or {}).get("id"), (r["sweep"] or {}).get("index")) for r in rows] == [
        ("slurm://cpu/3", None, None), ("slurm://cpu/1", "s-1", 0), ("slurm://cpu/2", "s-1", 1), ("slurm://cpu/4", None, None)]
    table = run_cli("ls", cwd=tmp_path).stdout.splitlines()
    assert table[0].split()[-1] == "SWEEP"
    assert [line.split()[-1] for line in table[1:5]] == ["-", "s-1", "s-1", "-"]


@pytest.mark.slow
def test_a_two_point_local_sweep_trains_both_points_and_prints_two_handles(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    spec = write(tmp_path / "tiny.yaml", (
        "name: tiny\nmodel: {preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}\n"
        "data: {max_bytes: 200000}\n"
        "trainer: {precision: 32-true, micro_batch_size: 2, max_steps: 6, warmup_steps: 1, val_check_interval: 2,"
        " limit_val_batches: 1, log_every_n_steps: 2}\n"
        "resources: {devices_per_node: 1}\n"
    ))
    result = run_cli("submit", str(spec), "-p", "local", "--sweep", "trainer.learning_rate=1e-3,3e-3", "--smoke", "2",
                     "--runs-dir", str(tmp_path / "runs"), "-o", "json", cwd=tmp_path, timeout=300)
    assert result.code == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    runs = (tmp_path / "runs").resolve()
    names = ["tiny-lr1e-3-smoke", "tiny-lr3e-3-smoke"]
    assert [(j["action"], j["handle"], j["name"]) for j in doc["jobs"]] == [("completed", f"local://{runs / n}", n) for n in names]
    for name, lr in zip(names, ["1e-3", "3e-3"], strict=True):
        summary = json.loads((runs / name / "summary.json").read_text())
        assert summary["name"] == name and summary["global_step"] == 2, summary
        assert f"learning_rate: {float(lr)}" in (runs / name / "logs" / "version_0" / "hparams.yaml").read_text()
        assert json.loads((runs / name / SUBMISSION_FILE).read_text())["sweep"]["id"] == doc["sweep"]["id"]
    listed = json.loads(run_cli("ls", "-o", "json", cwd=tmp_path).stdout)
    assert [(r["handle"], r["state"], r["sweep"]["index"]) for r in listed] == [(f"local://{runs / n}", "COMPLETED", i)
                                                                              for i, n in enumerate(names)]
