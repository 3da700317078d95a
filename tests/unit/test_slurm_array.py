"""Sweeps as one SLURM job array (profile ``slurm.sweep_as_array``): rendering, and submit /
status / logs / cancel / ls through the fake SLURM commands (tests/fakes/slurm), both
``squeue --json`` shapes. The batch script under bash: tests/script/test_sbatch_script.py; the
real cluster: tests/integration/slurm/test_array_on_lab.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.api import PLANNERS
from jobgen.backends.base import SubmittedJob
from jobgen.backends.slurm import backend as slurm_backend
from jobgen.backends.slurm.backend import array_state, expand_task_ids
from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir import ArrayTask, JobHandle, Submission
from jobgen.planning.sweep import SpecOptions, plan_single
from jobgen.specs.load import load_profile
from tests.conftest import EXAMPLES, PROFILES
from tests.fakes.slurm.fakeslurm import (
    SACCT_NO_ACCOUNTING,
    SQUEUE_INVALID_JOB,
    json_reply,
    reply,
    sacct_rows,
    squeue_22_05,
    squeue_24_05,
    squeue_merged,
)

SPEC = EXAMPLES / "quickstart.yaml"
SWEEPS = ("--sweep", "trainer.learning_rate=1e-4,3e-4", "--sweep", "trainer.micro_batch_size=4,8")
NAMES = ["quickstart-lr1e-4-mbs4", "quickstart-lr1e-4-mbs8", "quickstart-lr3e-4-mbs4", "quickstart-lr3e-4-mbs8"]
CLUSTER = "cpu"
HANDLE = f"slurm://{CLUSTER}/123"
SACCT_FORMAT = "--format=JobID,State,ExitCode,NodeList,Elapsed,ElapsedRaw,Start,End,AllocTRES,NCPUS,JobName"


def profile_dir(tmp_path: Path, parallelism: int | None = 2, **slurm: object) -> Path:
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    lines = ["extends: slurm-cpu", "slurm:", "  sweep_as_array: true"]
    lines += [f"  array_parallelism: {parallelism}"] if parallelism is not None else []
    lines += [f"  {k}: {json.dumps(v)}" for k, v in slurm.items()]
    (directory / "slurm-cpu-array.yaml").write_text("\n".join(lines) + "\n")
    return directory


def render_files(tmp_path: Path, *sweeps: str, parallelism: int | None = 2, **slurm: object) -> dict[str, str]:
    render = plan_single(str(SPEC), "slurm-cpu-array", PLANNERS,
                         SpecOptions(sweeps=sweeps or SWEEPS[1::2], out=str(tmp_path / "m"),
                                     profiles_dir=str(profile_dir(tmp_path, parallelism, **slurm))))
    assert len(render.jobs) == 1
    return dict(render.jobs[0].plan.files)


# --------------------------------------------------------------------------- rendering


def test_a_sweep_renders_one_job_directory_with_one_array_script_and_a_spec_per_point(tmp_path):
    files = render_files(tmp_path)
    assert sorted(files) == ["array.json", "job.sbatch", *(f"points/{i}/spec.json" for i in range(4))]
    script = files["job.sbatch"]
    assert "#SBATCH --job-name=quickstart\n#SBATCH --array=0-3%2\n" in script
    assert "#SBATCH --output=slurm-%A_%a.out\n" in script and "slurm-%j.out" not in script
    assert '--spec "${JOB_DIR}"/points/"${TASK}"/spec.json --run-dir "${RUN_DIR}"' in script
    assert f"RUN_NAMES=({' '.join(NAMES)})" in script
    index = json.loads(files["array.json"])
    assert index["name"] == "quickstart" and index["parallelism"] == 2
    assert [(p["index"], p["name"]) for p in index["points"]] == list(enumerate(NAMES))
    assert index["points"][2]["overrides"] == {"trainer.learning_rate": "3e-4", "trainer.micro_batch_size": "4"}
    for i, name in enumerate(NAMES):
        spec = json.loads(files[f"points/{i}/spec.json"])
        assert spec["spec"]["name"] == name
        assert spec["spec"]["trainer"]["learning_rate"] == [1e-4, 1e-4, 3e-4, 3e-4][i]
        assert spec["spec"]["trainer"]["micro_batch_size"] == [4, 8, 4, 8][i]
        assert spec["inputs_sha256"] == index["inputs_sha256"], "one hash names every file of the array"
    assert f"# inputs sha256: {index['inputs_sha256']}\n" in script


def test_without_a_parallelism_limit_the_array_has_no_percent(tmp_path):
    assert "#SBATCH --array=0-3\n" in render_files(tmp_path, parallelism=None)["job.sbatch"]


def test_render_twice_gives_byte_identical_files_and_check_is_in_sync(tmp_path, run_cli):
    profiles = profile_dir(tmp_path)
    args = ["render", str(SPEC), "-p", "slurm-cpu-array", "--profiles-dir", str(profiles), "--out", str(tmp_path / "m"), *SWEEPS]
    assert run_cli(*args, cwd=tmp_path).code == 0
    first = {p: p.read_bytes() for p in sorted((tmp_path / "m").rglob("*")) if p.is_file()}
    again = run_cli(*args, cwd=tmp_path)
    assert again.code == 0 and "0 file(s) written" in again.stdout, again.stdout
    assert {p: p.read_bytes() for p in sorted((tmp_path / "m").rglob("*")) if p.is_file()} == first
    assert run_cli(*args, "--check", cwd=tmp_path).code == 0
    assert (tmp_path / "m" / "slurm-cpu-array" / "quickstart" / "job.sbatch").stat().st_mode & 0o100


def test_a_smaller_grid_removes_the_stale_points(tmp_path, run_cli):
    profiles = profile_dir(tmp_path)
    args = ["render", str(SPEC), "-p", "slurm-cpu-array", "--profiles-dir", str(profiles), "--out", str(tmp_path / "m")]
    assert run_cli(*args, *SWEEPS, cwd=tmp_path).code == 0
    result = run_cli(*args, "--sweep", "trainer.learning_rate=1e-4,3e-4", cwd=tmp_path)
    assert result.code == 0 and "removed" in result.stdout
    job = tmp_path / "m" / "slurm-cpu-array" / "quickstart"
    assert sorted(p.name for p in (job / "points").iterdir()) == ["0", "1"]


def test_without_sweep_as_array_a_sweep_is_one_job_per_point_as_before(tmp_path):
    render = plan_single(str(SPEC), "slurm-cpu", PLANNERS,
                         SpecOptions(sweeps=SWEEPS[1::2], out=str(tmp_path / "m"), profiles_dir=str(PROFILES)))
    assert sorted(j.plan.job_name for j in render.jobs) == NAMES
    assert all("--array" not in j.plan.file("job.sbatch") for j in render.jobs)


def test_the_new_fields_stay_out_of_the_profile_hash_at_their_defaults():
    dumped = load_profile("slurm-cpu", PROFILES).model_dump()["slurm"]
    assert "sweep_as_array" not in dumped and "array_parallelism" not in dumped


def test_array_parallelism_needs_sweep_as_array(tmp_path):
    (tmp_path / "p.yaml").write_text("extends: slurm-cpu\nslurm: {array_parallelism: 2}\n")
    with pytest.raises(ConfigError, match="needs `sweep_as_array: true`"):
        load_profile(str(tmp_path / "p.yaml"), PROFILES)


def test_points_that_need_different_sbatch_options_are_refused(tmp_path):
    with pytest.raises(PlanError, match=r"differ in their #SBATCH options \(\('nodes', '1'\) vs \('nodes', '2'\)\)"):
        render_files(tmp_path, "resources.nodes=1,2")


def test_a_command_mode_spec_cannot_be_an_array(tmp_path):
    spec = tmp_path / "cmd.yaml"
    spec.write_text("name: cmd\nentrypoint: {script: train.py}\n")
    with pytest.raises(PlanError, match="runs a command"):
        plan_single(str(spec), "slurm-cpu-array", PLANNERS,
                    SpecOptions(sweeps=["trainer.micro_batch_size=4,8"], out=str(tmp_path / "m"), profiles_dir=str(profile_dir(tmp_path))))


@pytest.mark.parametrize(("text", "ids"), [("0-3", [0, 1, 2, 3]), ("2-3%2", [2, 3]), ("[1,4-5]", [1, 4, 5]), ("0-6:3", [0, 3, 6]),
                                          ("", [])])
def test_array_task_expressions(text, ids):
    assert expand_task_ids(text) == ids


@pytest.mark.parametrize(("states", "overall"), [
    ([], "UNKNOWN"),
    (["PENDING", "PENDING"], "PENDING"),
    (["COMPLETED", "PENDING"], "PENDING"),
    (["RUNNING", "PENDING", "COMPLETED"], "RUNNING"),
    (["FAILED", "RUNNING"], "RUNNING"),  # not finished while a task may still run
    (["COMPLETED", "COMPLETED"], "COMPLETED"),
    (["COMPLETED", "FAILED", "CANCELLED"], "FAILED"),
    (["COMPLETED", "TIMEOUT"], "FAILED"),
    (["COMPLETED", "CANCELLED"], "CANCELLED"),
])
def test_array_state_rule(states, overall):
    assert array_state(states) == overall


def test_task_handles_parse_to_their_array():
    task = JobHandle.parse("slurm://cpu/123_2")
    assert (str(task.array_parent), task.array_task, task.cluster) == ("slurm://cpu/123", 2, "cpu")
    assert JobHandle.parse("slurm://cpu/123").array_parent is None


# --------------------------------------------------------------------------- through the fakes


@pytest.fixture
def submitted(slurm, run_cli, tmp_path):
    """The 2x2 sweep rendered as an array and submitted as job 123."""
    profiles = profile_dir(tmp_path)
    rendered = run_cli("render", str(SPEC), "-p", "slurm-cpu-array", "--profiles-dir", str(profiles), "--out", str(tmp_path / "m"),
                       *SWEEPS, cwd=tmp_path)
    assert rendered.code == 0, rendered.stderr
    slurm.respond("sbatch", reply("123\n"))
    result = run_cli("submit", str(tmp_path / "m" / "slurm-cpu-array" / "quickstart"), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 0, result.stderr
    slurm.forget_calls()
    return result


def test_submit_is_one_sbatch_call_and_one_record_naming_every_task(slurm, run_cli, tmp_path):
    profiles = profile_dir(tmp_path)
    assert run_cli("render", str(SPEC), "-p", "slurm-cpu-array", "--profiles-dir", str(profiles), "--out", str(tmp_path / "m"),
                   *SWEEPS, cwd=tmp_path).code == 0
    slurm.respond("sbatch", reply("123\n"))
    job_dir = (tmp_path / "m" / "slurm-cpu-array" / "quickstart").resolve()
    result = run_cli("submit", str(job_dir), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 0, result.stderr
    runs = (tmp_path / "runs").resolve()
    assert slurm.argvs() == [["sbatch", "--parsable", f"--chdir={runs}/quickstart", "job.sbatch"]]
    assert f"submitted {HANDLE}\n" in result.stdout and f"{HANDLE}_3  {NAMES[3]}" in result.stdout
    record = Submission.load(job_dir / ".jobgen-submission.json")
    assert record.handle == HANDLE and record.run_dir == str(runs / "quickstart") and record.log_file is None
    assert [(t.index, t.name, t.run_dir, t.log_file) for t in record.array] == [
        (i, name, str(runs / name), str(runs / "quickstart" / f"slurm-123_{i}.out")) for i, name in enumerate(NAMES)]
    assert record.array[1].overrides == {"trainer.learning_rate": "1e-4", "trainer.micro_batch_size": "8"}
    assert all((runs / name).is_dir() for name in NAMES)
    assert json.loads((tmp_path / "state" / "slurm" / f"{CLUSTER}__123.json").read_text())["array"][0]["name"] == NAMES[0]
    for i in range(len(NAMES)):  # each task's prediction beside its spec.json, made from that point's spec
        point = json.loads((job_dir / "points" / str(i) / "spec.json").read_text())
        prediction = json.loads((job_dir / "points" / str(i) / ".jobgen-prediction.json").read_text())
        t = point["spec"]["trainer"]
        assert prediction["inputs_sha256"] == point["inputs_sha256"] and prediction["tokens_per_step"] == \
            t["micro_batch_size"] * point["spec"]["model"]["block_size"] * t["gradient_accumulation_steps"] * point["launch"]["world_size"]


def array_doc(shape: str) -> dict:
    """Array 123: task 0 completed (job 124), task 1 running (job 125), tasks 2-3 pending in the array's record."""
    if shape == "22.05":
        return squeue_merged(
            squeue_22_05(124, "COMPLETED", name="quickstart", array_job_id=123, array_task_id=0),
            squeue_22_05(125, "RUNNING", name="quickstart", array_job_id=123, array_task_id=1),
            squeue_22_05(123, "PENDING", name="quickstart", array_job_id=123, array_task_string="2-3%2", start=0, end=0))
    return squeue_merged(
        squeue_24_05(124, ["COMPLETED"], name="quickstart", array_job_id=123, array_task_id=0),
        squeue_24_05(125, ["RUNNING"], name="quickstart", array_job_id=123, array_task_id=1),
        squeue_24_05(123, ["PENDING"], name="quickstart", array_job_id=123, array_task_string="2-3%2", start=0, end=0))


@pytest.mark.parametrize("shape", ["22.05", "24.05"])
def test_status_of_the_array_lists_every_task_and_the_overall_state(slurm, submitted, run_cli, shape):
    slurm.respond("squeue", json_reply(array_doc(shape)))
    result = run_cli("status", "-o", "json", HANDLE)
    assert result.code == 0, result.stderr
    got = json.loads(result.stdout)
    assert (got["state"], got["source"]) == ("RUNNING", "squeue")
    assert got["details"]["tasks"] == "4 (COMPLETED 1, PENDING 2, RUNNING 1)"
    assert [(t["handle"], t["state"], t["details"]["name"]) for t in got["tasks"]] == [
        (f"{HANDLE}_{i}", state, NAMES[i]) for i, state in enumerate(["COMPLETED", "RUNNING", "PENDING", "PENDING"])]
    assert slurm.argvs() == [["squeue", "--json", "--states=all", "--jobs", "123"]]
    text = run_cli("status", HANDLE).stdout
    assert f"{HANDLE}  RUNNING" in text and f"  {HANDLE}_2  PENDING  {NAMES[2]}" in text


@pytest.mark.parametrize("shape", ["22.05", "24.05"])
@pytest.mark.parametrize(("task", "state"), [(1, "RUNNING"), (3, "PENDING")])
def test_status_of_one_task(slurm, submitted, run_cli, shape, task, state):
    slurm.respond("squeue", json_reply(array_doc(shape)))
    got = json.loads(run_cli("status", "-o", "json", f"{HANDLE}_{task}").stdout)
    assert (got["handle"], got["state"], got["source"]) == (f"{HANDLE}_{task}", state, "squeue")
    assert "tasks" not in got
    assert slurm.argvs() == [["squeue", "--json", "--states=all", "--jobs", f"123_{task}"]]


@pytest.mark.parametrize("shape", ["22.05", "24.05"])
def test_all_tasks_completed_is_completed_and_one_failure_is_failed(slurm, submitted, run_cli, shape):
    def doc(states):
        if shape == "22.05":
            return squeue_merged(*(squeue_22_05(124 + i, s, array_job_id=123, array_task_id=i) for i, s in enumerate(states)))
        return squeue_merged(*(squeue_24_05(124 + i, [s], array_job_id=123, array_task_id=i) for i, s in enumerate(states)))

    slurm.respond("squeue", json_reply(doc(["COMPLETED"] * 4)))
    assert json.loads(run_cli("status", "-o", "json", HANDLE).stdout)["state"] == "COMPLETED"
    slurm.respond("squeue", json_reply(doc(["COMPLETED", "FAILED", "COMPLETED", "COMPLETED"])))
    assert json.loads(run_cli("status", "-o", "json", HANDLE).stdout)["state"] == "FAILED"


def test_after_squeue_forgot_the_array_accounting_rows_name_the_tasks(slurm, submitted, run_cli):
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    rows = [(f"123_{i}", "COMPLETED", "0:0", "node1", "00:01:00", "60", "", "", "", "2", "quickstart") for i in range(3)]
    rows.append(("123_3", "TIMEOUT", "0:0", "node2", "00:30:00", "1800", "", "", "", "2", "quickstart"))
    slurm.respond("sacct", sacct_rows(*rows))
    got = json.loads(run_cli("status", "-o", "json", HANDLE).stdout)
    assert (got["state"], got["source"]) == ("FAILED", "sacct")
    assert [t["state"] for t in got["tasks"]] == ["COMPLETED"] * 3 + ["TIMEOUT"]
    assert slurm.argvs()[-1] == ["sacct", "--jobs", "123", "--noheader", "--parsable2", SACCT_FORMAT]


# Without accounting: the job-completion log (JobCompType=jobcomp/filetxt) has a line per task with
# the task's own job id and "ArrayJobId=<array> ArrayTaskId=<task>", which `sacct -c` does not
# read (it prints "<jobid>" rows and warns "Unknown type ArrayJobId"): jobgen maps tasks to job
# ids from the log, then reads their rows with `sacct -c` as for any job. Lines as SLURM 22.05 writes them.
JOBCOMP_LINE = ("JobId={jid} UserId=u(1000) GroupId=u(1000) Name=quickstart JobState={state} Partition=lab TimeLimit=30 "
                "StartTime=2026-11-23T06:00:00 EndTime=2026-11-23T06:01:00 NodeList=node1 NodeCnt=1 ProcCnt=2 WorkDir=/w "
                "ReservationName= Tres=cpu=2,node=1,billing=2 Account= QOS= WcKey= Cluster=unknown "
                "SubmitTime=2026-11-23T05:59:00 EligibleTime=2026-11-23T05:59:00{array} DerivedExitCode=0:0 ExitCode={exit} \n")


def jobcomp_log(tmp_path: Path, *lines: tuple[int, str, str, int | None, int | None]) -> Path:
    """The job-completion log: (job id, state, exit code, array job id, task id) per line."""
    path = tmp_path / "jobcomp.txt"
    path.write_text("".join(JOBCOMP_LINE.format(jid=jid, state=state, exit=code, array="" if task is None else
                                                f" ArrayJobId={array} ArrayTaskId={task}")
                            for jid, state, code, array, task in lines))
    return path


def show_config(log: Path, kind: str = "jobcomp/filetxt") -> dict:
    return reply(f"Configuration data as of 2026-11-23T06:02:00\nJobCompHost             = localhost\n"
                 f"JobCompLoc              = {log}\nJobCompType             = {kind}\nMinJobAge               = 300 sec\n")


def jobcomp_row(jid: int, state: str, code: str) -> tuple[str, ...]:
    """What `sacct -c` prints for one job (no TRES in the job-completion log: NCPUS)."""
    return (str(jid), state, code, "node1", "00:01:00", "60", "2026-11-23T06:00:00", "2026-11-23T06:01:00", "", "2", "quickstart")


SCONTROL_CONFIG = ["scontrol", "show", "config"]


@pytest.fixture
def recorded(slurm, tmp_path) -> None:
    """The record `jobgen submit` leaves for the 2x2 sweep submitted as array 123 (written directly: quicker than `submitted`)."""
    runs = tmp_path / "runs"
    tasks = tuple(ArrayTask(index=i, name=name, run_dir=str(runs / name), log_file=str(runs / "quickstart" / f"slurm-123_{i}.out"))
                  for i, name in enumerate(NAMES))
    job_dir = tmp_path / "m" / "quickstart"
    job_dir.mkdir(parents=True)
    Submission(handle=HANDLE, job_dir=str(job_dir), run_dir=str(runs / "quickstart"), array=tasks).save()


def status_json(job: str = HANDLE) -> dict:
    """`jobgen status -o json JOB`, in this process (the CLI's own path is tested above)."""
    return slurm_backend.SlurmBackend().status(SubmittedJob(JobHandle.parse(job))).to_json()


def jobcomp_argv(ids: str) -> list[str]:
    return ["sacct", "-c", "--jobs", ids, "--noheader", "--parsable2", SACCT_FORMAT]


def test_without_accounting_the_job_completion_log_names_each_tasks_job(slurm, recorded, tmp_path):
    log = jobcomp_log(tmp_path, (124, "COMPLETED", "0:0", 123, 0), (99, "COMPLETED", "0:0", None, None),
                      (125, "FAILED", "1:0", 123, 1), (1240, "FAILED", "1:0", 1230, 1), (126, "COMPLETED", "0:0", 123, 2),
                      (123, "CANCELLED", "0:15", 123, 3))
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    slurm.respond("scontrol", show_config(log))
    slurm.respond("sacct -c", sacct_rows(jobcomp_row(124, "COMPLETED", "0:0"), jobcomp_row(125, "FAILED", "1:0"),
                                         jobcomp_row(126, "COMPLETED", "0:0"), jobcomp_row(123, "CANCELLED", "0:15")))
    got = status_json()
    assert (got["state"], got["source"]) == ("FAILED", "jobcomp"), got
    assert [(t["handle"], t["state"], t["details"]["exit_code"], t["details"]["name"]) for t in got["tasks"]] == [
        (f"{HANDLE}_{i}", state, code, NAMES[i])
        for i, (state, code) in enumerate([("COMPLETED", "0:0"), ("FAILED", "1:0"), ("COMPLETED", "0:0"), ("CANCELLED", "0:15")])]
    assert got["tasks"][1]["usage"]["cpu_hours"] == round(2 * 60 / 3600, 6)
    assert slurm.argvs()[-2:] == [SCONTROL_CONFIG, jobcomp_argv("124,125,126,123")]
    one = status_json(f"{HANDLE}_1")
    assert (one["handle"], one["state"], one["source"], one["details"]["exit_code"]) == (f"{HANDLE}_1", "FAILED", "jobcomp", "1:0")
    assert slurm.argvs()[-1] == jobcomp_argv("125")


def test_tasks_squeue_has_purged_while_the_array_runs_come_from_the_job_completion_log(slurm, recorded, tmp_path):
    """slurmctld purges each ended task's record MinJobAge after it ended, while the array's own
    record stays until every task has ended (job_mgr.c _list_find_job_old, SLURM 22.05)."""
    log = jobcomp_log(tmp_path, (124, "COMPLETED", "0:0", 123, 0), (125, "FAILED", "1:0", 123, 1))
    slurm.respond("squeue", json_reply(squeue_merged(
        squeue_22_05(126, "RUNNING", array_job_id=123, array_task_id=2),
        squeue_22_05(123, "PENDING", array_job_id=123, array_task_string="3", start=0, end=0))))
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    slurm.respond("scontrol", show_config(log))
    slurm.respond("sacct -c", sacct_rows(jobcomp_row(124, "COMPLETED", "0:0"), jobcomp_row(125, "FAILED", "1:0")))
    got = status_json()
    assert (got["state"], got["source"]) == ("RUNNING", "jobcomp+squeue"), got
    assert [(t["state"], t["source"]) for t in got["tasks"]] == [
        ("COMPLETED", "jobcomp"), ("FAILED", "jobcomp"), ("RUNNING", "squeue"), ("PENDING", "squeue")]
    assert slurm.argvs()[-1] == jobcomp_argv("124,125")


def test_tasks_that_never_started_share_the_arrays_own_record_in_the_log(slurm, recorded, tmp_path):
    """scancel of an array with tasks still pending: task 0 ran (its own line); the array's own
    record, which held tasks 1-3, is logged once, without ArrayJobId/ArrayTaskId."""
    log = jobcomp_log(tmp_path, (123, "CANCELLED", "0:0", None, None), (124, "CANCELLED", "0:15", 123, 0))
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    slurm.respond("scontrol", show_config(log))
    slurm.respond("sacct -c", sacct_rows(jobcomp_row(124, "CANCELLED", "0:15"), jobcomp_row(123, "CANCELLED", "0:0")))
    got = status_json()
    assert (got["state"], [t["state"] for t in got["tasks"]]) == ("CANCELLED", ["CANCELLED"] * 4), got
    assert [t["usage"] is None for t in got["tasks"]] == [False, True, True, True]
    assert slurm.argvs()[-1] == jobcomp_argv("124,123")


@pytest.mark.parametrize(("config", "words"), [
    ("jobcomp/none", "JobCompType=jobcomp/none"),
    ("unreadable", "cannot be read"),
])
def test_without_a_readable_job_completion_log_the_tasks_are_unknown_with_the_reason(slurm, recorded, tmp_path, config, words):
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    missing = tmp_path / "no-such-dir" / "jobcomp.txt"
    slurm.respond("scontrol", show_config(missing, "jobcomp/none" if config == "jobcomp/none" else "jobcomp/filetxt"))
    got = status_json()
    assert got["state"] == "UNKNOWN" and [t["state"] for t in got["tasks"]] == ["UNKNOWN"] * 4, got
    assert all(words in t["details"]["reason"] for t in got["tasks"]), got["tasks"][0]
    assert "sacct -c" not in [" ".join(a[:2]) for a in slurm.argvs()]


def test_logs_of_one_task_read_its_own_output_file(slurm, submitted, run_cli, tmp_path):
    log = (tmp_path / "runs" / "quickstart" / "slurm-123_2.out")
    log.write_text("jobgen: job 123_2 (quickstart-lr3e-4-mbs4) on 2 node(s)\n0: step 1/5\n1: step 1/5 rank one\n")
    (tmp_path / "runs" / "quickstart" / "slurm-123_1.out").write_text("0: the other task\n")
    result = run_cli("logs", f"{HANDLE}_2")
    assert result.code == 0, result.stderr
    assert result.stdout == "jobgen: job 123_2 (quickstart-lr3e-4-mbs4) on 2 node(s)\nstep 1/5\n"
    assert slurm.argvs() == []


def test_logs_of_the_whole_array_names_its_tasks(slurm, submitted, run_cli, tmp_path):
    result = run_cli("logs", HANDLE)
    assert result.code == 2
    assert "job array of 4 task(s)" in result.stderr and f"{HANDLE}_0 ({NAMES[0]})" in result.stderr


@pytest.mark.parametrize("shape", ["22.05", "24.05"])
def test_cancel_of_one_task_scancels_that_task_only(slurm, submitted, run_cli, shape):
    slurm.respond("scancel", reply(""))
    cancelled = squeue_22_05(126, "CANCELLED", array_job_id=123, array_task_id=2) if shape == "22.05" else \
        squeue_24_05(126, ["CANCELLED"], array_job_id=123, array_task_id=2)
    slurm.respond("squeue", json_reply(cancelled))
    result = run_cli("cancel", f"{HANDLE}_2")
    assert result.code == 0, result.stderr
    assert f"{HANDLE}_2  CANCELLED" in result.stdout
    assert slurm.argvs() == [["scancel", "123_2"], ["squeue", "--json", "--states=all", "--jobs", "123_2"]]


def test_ls_shows_the_array_as_one_row_with_its_tasks(slurm, submitted, run_cli):
    slurm.respond("squeue", json_reply(array_doc("24.05")))
    rows = json.loads(run_cli("ls", "-o", "json").stdout)
    assert len(rows) == 1 and (rows[0]["handle"], rows[0]["name"], rows[0]["state"]) == (HANDLE, "quickstart", "RUNNING")
    assert [(t["handle"], t["name"], t["state"]) for t in rows[0]["tasks"]] == [
        (f"{HANDLE}_{i}", NAMES[i], s) for i, s in enumerate(["COMPLETED", "RUNNING", "PENDING", "PENDING"])]
    text = run_cli("ls").stdout
    assert "quickstart (array of 4)" in text and "RUNNING" in text
