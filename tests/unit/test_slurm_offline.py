"""`jobgen submit/status/logs/cancel` against fake SLURM client commands, without a cluster.

The fakes (tests/fakes/slurm/fakeslurm.py) sit first on PATH, answer with documents in the
shapes real SLURM prints (``squeue --json`` of 22.05 and of 23.02+, ``sacct --parsable2``
rows of accounting and of the job-completion log) and record every argv they receive; each
test asserts that list exactly, so a changed command line fails here before it fails on a
cluster. Everything goes through the CLI in a subprocess and is checked through what a user
sees: exit codes, output, the submission record and the log file it names. The real-cluster
counterpart is tests/integration/slurm/test_jobgen_on_lab.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jobgen.specs.load import load_profile, load_spec
from tests.conftest import EXAMPLES, PROFILES
from tests.fakes.slurm.fakeslurm import (
    NOT_CONFIGURED_RC,
    SACCT_NO_ACCOUNTING,
    SQUEUE_INVALID_JOB,
    file_reply,
    json_reply,
    reply,
    sacct_rows,
    squeue_22_05,
    squeue_24_05,
    squeue_empty,
)

SPEC = EXAMPLES / "quickstart.yaml"
PROFILE = "slurm-cpu"
JOB_NAME = load_spec(SPEC).name
CLUSTER = load_profile(PROFILE, PROFILES).slurm_settings.cluster
HANDLE = f"slurm://{CLUSTER}/123"
SQUEUE_123 = ["squeue", "--json", "--states=all", "--jobs", "123"]
SACCT_FORMAT = "--format=JobID,State,ExitCode,NodeList,Elapsed,ElapsedRaw,Start,End,AllocTRES,NCPUS,JobName"
SACCT_123 = ["sacct", "--jobs", "123", "--noheader", "--parsable2", SACCT_FORMAT]
JOBCOMP_123 = ["sacct", "-c", "--jobs", "123", "--noheader", "--parsable2", SACCT_FORMAT]

#: The same job state in both squeue --json shapes (22.05: a string; 23.02+: base state + flags).
SHAPES = ["22.05", "24.05"]


def squeue_doc(shape: str, state: str, flags: tuple[str, ...] = (), **fields) -> dict:
    """One job in ``shape``; ``flags`` are the 23.02+ state flags, which 22.05 folds into the
    one word squeue prints (job_state_string(): COMPLETING before CONFIGURING, REQUEUED, ...)."""
    if shape == "22.05":
        return squeue_22_05(123, flags[0] if flags else state, **fields)
    return squeue_24_05(123, [state, *flags], **fields)


@pytest.fixture
def submit(run_cli, tmp_path):
    """``jobgen submit examples/quickstart.yaml --profile slurm-cpu`` into tmp_path (a copy of the
    spec outside any git work tree: no code snapshot here, tests/unit/test_code_snapshot.py has them)."""
    spec = tmp_path / SPEC.name
    spec.write_text(SPEC.read_text())

    def _submit(*extra: str):
        return run_cli("submit", str(spec), "--profile", PROFILE, "--profiles-dir", str(PROFILES), "--out", str(tmp_path / "manifests"),
                       "--runs-dir", str(tmp_path / "runs"), *extra, cwd=tmp_path)

    return _submit


def job_dir(tmp_path: Path) -> Path:
    return (tmp_path / "manifests" / PROFILE / JOB_NAME).resolve()


def run_dir(tmp_path: Path) -> Path:
    return (tmp_path / "runs" / JOB_NAME).resolve()


def sbatch_argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["sbatch", "--parsable", *extra, f"--chdir={run_dir(tmp_path)}", "job.sbatch"]


# --------------------------------------------------------------------------- submit


@pytest.mark.parametrize("parsable", ["123\n", f"123;{CLUSTER}\n"], ids=["jobid", "jobid;cluster"])
def test_submit_runs_sbatch_parsable_in_the_job_dir_and_records_the_submission(slurm, submit, tmp_path, parsable):
    slurm.respond("sbatch", reply(parsable))
    result = submit()
    assert result.code == 0, result.stderr
    assert f"submitted {HANDLE}\n" in result.stdout
    assert slurm.argvs() == [sbatch_argv(tmp_path)]  # no squeue: nothing was submitted from here before
    call = slurm.calls("sbatch")[0]
    assert call["cwd"] == str(job_dir(tmp_path)) and call["script_exists"]
    assert call["chdir_exists"], "the run directory (sbatch --chdir) must exist before the job starts"
    assert call["env"] == {"JOBGEN_RUN_DIR": str((tmp_path / "runs").resolve())}
    log = run_dir(tmp_path) / "slurm-123.out"
    assert f"  log:     {log}\n" in result.stdout
    record = json.loads((job_dir(tmp_path) / ".jobgen-submission.json").read_text())
    assert record["handle"] == HANDLE
    assert (record["job_dir"], record["run_dir"], record["log_file"]) == (str(job_dir(tmp_path)), str(run_dir(tmp_path)), str(log))
    assert record["argv"] == sbatch_argv(tmp_path)
    assert record["inputs_sha256"] == json.loads((job_dir(tmp_path) / "spec.json").read_text())["inputs_sha256"]
    # the user's state index holds the same record, so a bare handle finds the log later
    assert json.loads((tmp_path / "state" / "slurm" / f"{CLUSTER}__123.json").read_text()) == record


def test_submit_a_rendered_job_directory_as_is(slurm, submit, run_cli, tmp_path):
    slurm.respond("sbatch", reply("123\n"))
    assert submit().code == 0
    slurm.respond("squeue", json_reply(squeue_22_05(123, "COMPLETED")))
    slurm.respond("sbatch", reply("124\n"))
    slurm.forget_calls()
    result = run_cli("submit", str(job_dir(tmp_path)), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert f"submitted slurm://{CLUSTER}/124\n" in result.stdout
    assert slurm.argvs() == [SQUEUE_123, sbatch_argv(tmp_path)]
    assert slurm.calls("sbatch")[0]["cwd"] == str(job_dir(tmp_path))


def test_test_only_asks_slurm_and_records_nothing(slurm, submit, tmp_path):
    answer = "sbatch: Job 124 to start at 2025-01-01T10:00:00 using 2 processors on nodes node[1-2] in partition lab"
    slurm.respond("sbatch", reply(stderr=answer + "\n"))
    result = submit("--test-only")
    assert result.code == 0, result.stderr
    assert answer + "\n" in result.stdout and "nothing was queued" in result.stdout
    assert slurm.argvs() == [sbatch_argv(tmp_path, "--test-only")]
    assert not (job_dir(tmp_path) / ".jobgen-submission.json").exists()
    assert not (tmp_path / "state").exists()


def test_sbatch_refusal_exits_1_with_slurms_message_and_records_nothing(slurm, submit, tmp_path):
    slurm.respond("sbatch", reply(stderr="sbatch: error: Batch job submission failed: Invalid partition name specified\n", rc=1))
    result = submit()
    assert result.code == 1
    assert "sbatch failed (exit 1)" in result.stderr and "Invalid partition name specified" in result.stderr and "hint:" in result.stderr
    assert not (job_dir(tmp_path) / ".jobgen-submission.json").exists()


def test_the_job_is_told_the_users_spec_file_for_its_errors(slurm, submit, tmp_path, monkeypatch):
    """sbatch exports $JOBGEN_SPEC_SOURCE (the spec file submit read) to the
    ranks, whose input errors then name it and the field instead of spec.json; one left in the
    shell is replaced, not passed on."""
    monkeypatch.setenv("FAKE_SLURM_RECORD_ENV", "JOBGEN_SPEC_SOURCE")
    monkeypatch.setenv("JOBGEN_SPEC_SOURCE", "/elsewhere/stale.yaml")
    slurm.respond("sbatch", reply("123\n"))
    assert submit().code == 0
    assert slurm.calls("sbatch")[0]["env"]["JOBGEN_SPEC_SOURCE"] == str((tmp_path / SPEC.name).resolve())


def test_a_run_directory_of_another_profile_is_refused_before_sbatch(slurm, submit, tmp_path):
    """The README's SLURM example after the quick start once ran in runs/quickstart,
    where the local run's checkpoints were; SLURM submit refuses it (exit 2) before sbatch, as local
    submit and the entrypoint do, instead of the job finding out on a node after queueing."""
    from jobgen.jobdir import RUN_IDENTITY_FILE, RunIdentity

    run_dir(tmp_path).mkdir(parents=True)
    theirs = RunIdentity(profile="local", scheduler="local", accelerator="cpu", num_nodes=1, devices_per_node=2, strategy="ddp")
    (run_dir(tmp_path) / RUN_IDENTITY_FILE).write_text(theirs.model_dump_json())
    slurm.respond("sbatch", reply("123\n"))
    result = submit()
    assert result.code == 2, result.stdout + result.stderr
    assert f"run directory {run_dir(tmp_path)} holds a run of profile 'local'" in result.stderr, result.stderr
    assert "--set name=" in result.stderr and "--runs-dir" in result.stderr, result.stderr
    assert slurm.argvs() == []  # nothing queued
    assert not (job_dir(tmp_path) / ".jobgen-submission.json").exists()


def test_a_run_directory_is_claimed_at_submit_so_another_shape_is_refused_before_sbatch(slurm, submit, tmp_path):
    slurm.respond("sbatch", reply("123\n"))
    assert submit().code == 0
    slurm.respond("squeue", json_reply(squeue_22_05(123, "COMPLETED")))
    slurm.forget_calls()
    other = submit("--set", "resources.nodes=1")
    assert other.code == 2 and "holds a run of profile 'slurm-cpu' (2 node(s)" in other.stderr, other.stdout + other.stderr
    assert not slurm.calls("sbatch")
    again = submit("--set", "trainer.max_steps=700")  # other inputs, same profile and shape: the same run, resumed
    assert again.code == 0, again.stderr


def test_sbatch_output_that_is_not_a_job_id_is_an_error_not_a_handle(slurm, submit, tmp_path):
    slurm.respond("sbatch", reply("Submitted batch job 123\n"))  # a site wrapper that drops --parsable
    result = submit()
    assert result.code == 1 and "not a job id" in result.stderr, result.stderr
    assert not (job_dir(tmp_path) / ".jobgen-submission.json").exists()


ACTIVE = [
    ("22.05", "PENDING", ()),
    ("22.05", "RUNNING", ()),
    ("24.05", "PENDING", ()),
    ("24.05", "RUNNING", ()),
    # a job whose ranks are still stopping: squeue prints COMPLETING in every version
    ("22.05", "COMPLETED", ("COMPLETING",)),
    ("24.05", "COMPLETED", ("COMPLETING",)),
]


@pytest.mark.parametrize(("shape", "state", "flags"), ACTIVE, ids=[f"{s}-{'+'.join((b, *f))}" for s, b, f in ACTIVE])
def test_resubmitting_while_the_job_is_queued_or_running_is_refused_unless_forced(slurm, submit, tmp_path, shape, state, flags):
    slurm.respond("sbatch", reply("123\n"), reply("124\n"))
    assert submit().code == 0
    slurm.respond("squeue", json_reply(squeue_doc(shape, state, flags)))
    refused = submit()
    shown = flags[0] if flags else state
    assert refused.code == 1
    assert f"was already submitted as {HANDLE}, which is {shown}" in refused.stderr, refused.stderr
    assert "--force" in refused.stderr
    assert slurm.argvs() == [sbatch_argv(tmp_path), SQUEUE_123]
    forced = submit("--force")
    assert forced.code == 0, forced.stderr
    assert f"submitted slurm://{CLUSTER}/124\n" in forced.stdout
    assert slurm.argvs() == [sbatch_argv(tmp_path), SQUEUE_123, sbatch_argv(tmp_path)]  # --force asks nobody
    assert json.loads((job_dir(tmp_path) / ".jobgen-submission.json").read_text())["handle"] == f"slurm://{CLUSTER}/124"


def test_resubmitting_after_the_job_ended_needs_no_force(slurm, submit, tmp_path):
    slurm.respond("sbatch", reply("123\n"), reply("124\n"))
    assert submit().code == 0
    slurm.respond("squeue", SQUEUE_INVALID_JOB)  # past MinJobAge: only accounting remembers it
    slurm.respond("sacct", sacct_rows(row("123", "COMPLETED", "0:0", "node[1-2]", "00:10:01", JOB_NAME)))
    again = submit()
    assert again.code == 0, again.stderr
    assert f"submitted slurm://{CLUSTER}/124\n" in again.stdout
    assert slurm.argvs() == [sbatch_argv(tmp_path), SQUEUE_123, SACCT_123, sbatch_argv(tmp_path)]


def test_a_cluster_in_sbatchs_answer_names_the_handle_and_goes_to_every_later_command(slurm, submit, run_cli, tmp_path):
    """A multi-cluster site (sbatch -M, or $SBATCH_CLUSTERS): ``sbatch --parsable`` prints
    ``<jobid>;<cluster>``. The handle names that cluster, and squeue, sacct, scontrol and scancel
    get ``--clusters=<it>`` for it, or they would ask the default cluster about another job 123."""
    slurm.respond("sbatch", reply("123;gpu-b\n"))
    result = submit()
    assert result.code == 0, result.stderr
    handle = "slurm://gpu-b/123"
    assert f"submitted {handle}\n" in result.stdout
    record = json.loads((job_dir(tmp_path) / ".jobgen-submission.json").read_text())
    assert (record["handle"], record["slurm_cluster"]) == (handle, "gpu-b")
    on_b = "--clusters=gpu-b"
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    slurm.respond("sacct -c", sacct_rows(row("123", "COMPLETED", "0:0", "node1", "00:00:05", JOB_NAME)))
    slurm.respond("scancel", reply())
    slurm.forget_calls()
    assert status_json(run_cli, handle)["state"] == "COMPLETED"
    assert run_cli("cancel", handle).code == 0
    squeue = ["squeue", on_b, *SQUEUE_123[1:]]
    sacct, jobcomp = ["sacct", on_b, *SACCT_123[1:]], ["sacct", on_b, *JOBCOMP_123[1:]]
    assert slurm.argvs() == [squeue, sacct, jobcomp, ["scancel", on_b, "123"], squeue, sacct, jobcomp]
    # the same job submitted again: the still-queued check asks the job's own cluster
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["RUNNING"])))
    slurm.forget_calls()
    refused = submit()
    assert refused.code == 1 and f"already submitted as {handle}, which is RUNNING" in refused.stderr, refused.stderr
    assert slurm.argvs() == [squeue]


def test_scontrol_asks_the_cluster_sbatch_named(slurm, submit, run_cli, tmp_path):
    slurm.respond("sbatch", reply("123;gpu-b\n"))
    assert submit().code == 0
    path = tmp_path / "state" / "slurm" / "gpu-b__123.json"
    record = json.loads(path.read_text())
    del record["log_file"]  # a record of an older jobgen: the log file comes from scontrol
    path.write_text(json.dumps(record))
    log = tmp_path / "slurm-123.out"
    log.write_text(" 0: hello\n")
    slurm.respond("scontrol", reply(f"JobId=123\n   StdOut={log}\n"))
    slurm.forget_calls()
    result = run_cli("logs", "slurm://gpu-b/123")
    assert (result.code, result.stdout) == (0, "hello\n"), result.stderr
    assert slurm.argvs() == [["scontrol", "--clusters=gpu-b", "show", "job", "123"]]


# --------------------------------------------------------------------------- status


def row(jid: str, state: str, exit_code: str, nodes: str, elapsed: str, name: str, *, raw: str = "", start: str = "",
        end: str = "", tres: str = "", ncpus: str = "") -> tuple[str, ...]:
    """One sacct row in SACCT_FORMAT's column order (JobName last)."""
    return (jid, state, exit_code, nodes, elapsed, raw, start, end, tres, ncpus, name)


def status_json(run_cli, job: str = HANDLE) -> dict:
    result = run_cli("status", "--json", job)
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("state", "reason"), [("PENDING", "Resources"), ("RUNNING", "None")])
def test_status_from_squeue_in_both_json_shapes(slurm, run_cli, shape, state, reason):
    slurm.respond("squeue", json_reply(squeue_doc(shape, state, reason=reason, restarts=1)))  # nothing allocated yet: no usage
    details = {"name": JOB_NAME, "nodes": "node[1-2]", "reason": reason, "restarts": "1"}
    # a pending job's start_time is SLURM's estimate of its start (squeue --start): shown as expected_start
    expected = {"expected_start": "2023-11-14T22:13:20+00:00"} if state == "PENDING" else {}
    assert status_json(run_cli) == {"handle": HANDLE, "state": state, "source": "squeue", "details": details | expected,
                                    "usage": None, "failure": None, "progress": None}
    plain = run_cli("status", HANDLE)
    assert plain.code == 0
    shown = ("expected_start 2023-11-14T22:13:20+00:00, " if expected else "") + f"name {JOB_NAME}, nodes node[1-2], " + (
        "" if reason == "None" else f"reason {reason}, ") + "restarts 1"  # "None": no reason
    assert plain.stdout == f"{HANDLE}  {state}  (squeue; {shown})\n"
    assert slurm.argvs() == [SQUEUE_123, SQUEUE_123]


@pytest.mark.parametrize("shape", SHAPES)
def test_status_of_a_job_whose_ranks_are_still_stopping_is_completing(slurm, run_cli, shape):
    """squeue prints COMPLETING while the ranks of a cancelled job stop; 23.02+ JSON lists it as
    a flag after the base state (["CANCELLED", "COMPLETING"]), 22.05 as the state itself."""
    slurm.respond("squeue", json_reply(squeue_doc(shape, "CANCELLED", ("COMPLETING",))))
    assert status_json(run_cli)["state"] == "COMPLETING"


def test_status_of_a_finished_job_still_in_squeue_22_05_decodes_the_wait_status(slurm, run_cli):
    slurm.respond("squeue", json_reply(squeue_22_05(123, "FAILED", reason="NonZeroExitCode", exit_status=1 << 8)))
    got = status_json(run_cli)
    assert (got["state"], got["source"], got["details"]["exit_code"]) == ("FAILED", "squeue", "1:0")


def test_status_of_a_finished_job_still_in_squeue_24_05(slurm, run_cli):
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["FAILED"], reason="NonZeroExitCode", return_code=1)))
    got = status_json(run_cli)
    assert (got["state"], got["source"], got["details"]["reason"]) == ("FAILED", "squeue", "NonZeroExitCode")


#: SLURM 22.05's ``sacct --json`` record (with slurmdbd) of job 123, which ran ``exit 3``: state
#: FAILED, yet exit code SUCCESS / 0 (the record's other fields left out).
SACCT_JSON_22_05_EXIT_3 = {
    "meta": {"Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}},
    "errors": [],
    "jobs": [{"job_id": 123, "name": JOB_NAME, "nodes": "node1", "state": {"current": "FAILED", "reason": "None"},
              "exit_code": {"status": "SUCCESS", "return_code": 0}}],
}


def test_status_from_accounting_reads_the_exit_code_from_parsable_sacct_not_sacct_json(slurm, run_cli):
    """A job that exited 3, forgotten by squeue, on a cluster with accounting (slurmdbd): ``jobgen
    status`` takes state and exit code from ``sacct --parsable2`` (FAILED, ExitCode ``3:0``) and
    never asks ``sacct --json``, whose 22.05 record says exit code SUCCESS / 0 for that job (what
    the SLURM lab with slurmdbd printed; jobgen.backends.slurm.backend ``_sacct_rows`` states the rule).

    Emulated: the fake's ``sacct`` answers as 22.05 with slurmdbd does, in both forms. The SLURM
    lab of a test session runs without slurmdbd (its tests cover the job-completion-log route,
    tests/integration/slurm/test_array_without_accounting_on_lab.py), and one session has one lab."""
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", sacct_rows(row("123", "FAILED", "3:0", "node1", "00:00:01", JOB_NAME)))
    slurm.respond("sacct --json", json_reply(SACCT_JSON_22_05_EXIT_3))
    got = status_json(run_cli)
    assert (got["state"], got["source"], got["details"]["exit_code"], got["details"]["nodes"]) == ("FAILED", "sacct", "3:0", "node1"), got
    assert (got["failure"]["class"], got["failure"]["rule"]) == ("unknown", "exit-code"), got["failure"]
    assert slurm.argvs() == [SQUEUE_123, SACCT_123]  # no `sacct --json`, no job-completion log


@pytest.mark.parametrize(("state", "exit_code", "cls", "rule"), [
    ("NODE_FAIL", "0:0", "infrastructure", "node-fail"), ("OUT_OF_MEMORY", "0:125", "infrastructure", "host-oom"),
    ("PREEMPTED", "0:15", "infrastructure", "preempted"), ("TIMEOUT", "0:15", "user", "time-limit"),
    ("FAILED", "2:0", "user", "entrypoint-error"), ("FAILED", "0:9", "infrastructure", "killed"),
    ("FAILED", "1:0", "unknown", "exit-code"), ("FAILED", "", "unknown", "no-evidence"),
    ("COMPLETED", "0:0", None, None), ("CANCELLED by 1000", "0:15", None, None)])
def test_status_of_an_ended_job_names_its_failure_class(slurm, run_cli, state, exit_code, cls, rule):
    """sacct's state and ExitCode (``<code>:<signal>``) classify a failed job; other end states have none."""
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", sacct_rows(row("123", state, exit_code, "node[1-2]", "00:00:05", JOB_NAME)))
    got = status_json(run_cli)["failure"]
    assert (None if got is None else (got["class"], got["rule"], got["retried"])) == (
        None if cls is None else (cls, rule, cls != "user"))
    plain = run_cli("status", HANDLE).stdout.splitlines()
    failure_lines = [line for line in plain if line.startswith("  failure: ")]
    assert failure_lines == ([] if cls is None else [f"  failure: {cls} ({'not retried' if cls == 'user' else 'retried'}): "
                                                      f"{got['reason']} [{got['evidence']}]"])


@pytest.mark.parametrize(("extra", "budget"), [((), 0), (("--set", "restart.max_restarts=3"), 3)])
def test_status_of_a_failed_job_shows_the_restart_budget_its_spec_json_records(slurm, submit, run_cli, tmp_path, extra, budget):
    slurm.respond("sbatch", reply("123\n"))
    assert submit(*extra).code == 0
    recorded = json.loads((job_dir(tmp_path) / "spec.json").read_text())["spec"]
    assert recorded.get("restart") == (None if budget == 0 else {"max_restarts": budget, "exclude_failed_nodes": True})  # the default is left out
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", sacct_rows(row("123", "NODE_FAIL", "0:0", "node[1-2]", "00:00:05", JOB_NAME)))
    got = status_json(run_cli)["failure"]
    assert (got["class"], got["max_restarts"]) == ("infrastructure", budget)
    lines = run_cli("status", HANDLE).stdout.splitlines()
    assert lines[-1] == f"  restart budget: max_restarts {budget} (spec.json)"
    slurm.respond("sacct", sacct_rows(row("123", "COMPLETED", "0:0", "node[1-2]", "00:00:05", JOB_NAME)))
    assert "restart budget" not in run_cli("status", HANDLE).stdout  # shown with a failure or a restart only
    # a job that restarted: the restarts used (squeue's restart_cnt) beside the budget, failed or not
    for state, restarts in (("RUNNING", 1), ("FAILED", 2)):
        slurm.respond("squeue", json_reply(squeue_doc("24.05", state, reason="None", restarts=restarts)))
        lines = run_cli("status", HANDLE).stdout.splitlines()
        assert lines[0].endswith(f"restarts {restarts})") and lines[-1] == f"  restart budget: max_restarts {budget}, {restarts} used (spec.json)"
    slurm.respond("squeue", json_reply(squeue_doc("24.05", "RUNNING", reason="None", restarts=0)))
    assert "restart budget" not in run_cli("status", HANDLE).stdout


@pytest.mark.parametrize("reason", ["NodeDown\n" + "x" * 300, "\x1b[2J\nhint: rm -rf ~", "NodeDown'; $(reboot)"], ids=range(3))
def test_status_shows_a_hostile_squeue_reason_escaped(slurm, run_cli, reason):
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["FAILED"], reason=reason, return_code=1)))
    got = status_json(run_cli)["failure"]
    assert got["class"] == "unknown"  # only the exact word NodeDown is a node failure
    assert got["evidence"].isprintable() and len(got["evidence"]) < 300
    plain = run_cli("status", HANDLE)
    assert plain.code == 0
    failure = [line for line in plain.stdout.splitlines() if line.startswith("  failure: ")]
    assert len(failure) == 1 and failure[0].isprintable()
    # every line, the details' reason included, is one printable line: the reason cannot end it or drive the terminal
    assert len(plain.stdout.splitlines()) == 2 and all(line.isprintable() for line in plain.stdout.splitlines())


def _gpu_job_dir(tmp_path: Path, price: float | None) -> Path:
    """A job directory rendered for a 2-node x 4-GPU SLURM profile (with ``price`` per
    GPU-hour), recorded as submitted under HANDLE."""
    from jobgen import api
    from jobgen.jobdir import Submission

    profiles = tmp_path / "gpu-profiles"
    profiles.mkdir()
    price_line = "" if price is None else f"gpu_hour_price: {price}\n"
    (profiles / "gpus.yaml").write_text(f"extends: slurm-a100\ngpus_per_node: 4\n{price_line}slurm: {{cluster: {CLUSTER}}}\n")
    job_plan = api.plan_job(SPEC, "gpus", overrides=["resources.nodes=2"], profiles_dir=profiles)
    directory = api.render(job_plan, tmp_path / "gpu-manifests")[0].parent
    Submission(handle=HANDLE, job_dir=str(directory), run_dir=str(tmp_path / "runs" / JOB_NAME)).save()
    return directory


def test_gpu_hours_and_cost_of_a_finished_job_from_squeue(slurm, run_cli, tmp_path):
    _gpu_job_dir(tmp_path, price=2.5)
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["COMPLETED"], tres_alloc="cpu=64,mem=512G,node=2,billing=64,gres/gpu=8,gres/gpu:a100=8",
                                                    start=1700000000, end=1700005400)))
    usage = status_json(run_cli)["usage"]
    assert (usage["device_kind"], usage["devices"], usage["elapsed_s"]) == ("gpu", 8, 5400.0)
    assert usage["gpu_hours"] == 12.0 and usage["cost"] == 30.0  # 8 GPUs x 1.5 h x 2.5
    assert usage["start"] == "2023-11-14T22:13:20+00:00" and usage["end"] == "2023-11-14T23:43:20+00:00"
    plain = run_cli("status", HANDLE).stdout.splitlines()
    assert plain[1] == "  usage: 8 GPUs x 1.5 h = 12.000 GPU-hours, cost 30.00 (squeue tres_alloc_str)"


def test_a_running_job_counts_to_now_not_to_its_time_limit(slurm, run_cli):
    import time

    started = int(time.time()) - 600
    slurm.respond("squeue", json_reply(squeue_22_05(123, "RUNNING", tres_alloc="cpu=2,node=2,billing=2", start=started, end=started + 1800)))
    usage = status_json(run_cli)["usage"]
    assert usage["end"] is None and 600 <= usage["elapsed_s"] < 900, usage
    assert usage["cost"] is None  # CPU-hours carry no price


def test_a_running_gpu_job_shows_its_progress_and_its_cost_so_far(slurm, run_cli, tmp_path):
    """A RUNNING 8-GPU job of a priced profile, 30 minutes in: the progress from its run
    directory's metrics.csv (the login node shares it) and the cost so far, GPU-hours to now x
    the price."""
    import time

    _gpu_job_dir(tmp_path, price=2.5)
    metrics = tmp_path / "runs" / JOB_NAME / "logs" / "version_0" / "metrics.csv"
    metrics.parent.mkdir(parents=True)
    metrics.write_text("epoch,lr,step,tokens_per_s,train_loss\n0,0.003,100,40960.0,3.1\n0,0.003,120,32768.0,2.9\n")
    started = int(time.time()) - 1800
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["RUNNING"], tres_alloc="cpu=64,node=2,gres/gpu=8", start=started,
                                                    end=started + 7200)))
    got = status_json(run_cli)
    progress, usage = got["progress"], got["usage"]
    # quickstart: micro batch 16 x block 256 x 8 ranks a step; 480 steps left at 32,768 tokens/s
    assert (progress["step"], progress["max_steps"], progress["tokens_per_step"], progress["eta_s"]) == (120, 600, 32768, 480.0), progress
    assert (usage["device_kind"], usage["devices"], usage["end"]) == ("gpu", 8, None) and 1800 <= usage["elapsed_s"] < 1900, usage
    assert usage["cost"] == pytest.approx(8 * usage["elapsed_s"] / 3600 * 2.5, abs=1e-5) and usage["cost"] >= 10.0, usage
    plain = run_cli("status", HANDLE).stdout.splitlines()
    assert re.fullmatch(r"  usage: 8 GPUs x 0\.5[0-9]* h = 4\.[0-9]{3} GPU-hours, cost 1[01]\.[0-9]{2} \(squeue tres_alloc_str\)", plain[1]), plain
    assert plain[2].startswith("  progress: step 120/600, 32,768 tokens/s (last log interval), ETA 0:08:00 (metrics.csv written "), plain


def test_gpu_jobs_in_the_job_completion_log_count_the_gpus_their_job_directory_asked_for(slurm, run_cli, tmp_path):
    _gpu_job_dir(tmp_path, price=None)
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    slurm.respond("sacct -c", sacct_rows(row("123", "COMPLETED", "0:0", "node[1-2]", "01:00:00", JOB_NAME, raw="3600", ncpus="64")))
    usage = status_json(run_cli)["usage"]
    assert (usage["device_kind"], usage["devices"], usage["gpu_hours"]) == ("gpu", 8, 8.0)
    assert "the 8 GPUs the job directory requested" in usage["source"]


#: How a controller says it does not know the job: squeue's error exit, or an empty list.
GONE = [SQUEUE_INVALID_JOB, json_reply(squeue_empty())]


@pytest.mark.parametrize("gone", GONE, ids=["invalid-job-id", "no-jobs"])
def test_status_after_squeue_forgot_the_job_comes_from_accounting(slurm, run_cli, gone):
    slurm.respond("squeue", gone)
    slurm.respond("sacct", sacct_rows(
        row("123", "CANCELLED by 1000", "0:15", "node[1-2]", "00:00:42", JOB_NAME, raw="42", start="2026-11-23T06:00:00",
            end="2026-11-23T06:00:42", tres="billing=4,cpu=4,mem=16000M,node=2", ncpus="4"),
        row("123.batch", "CANCELLED", "0:15", "node1", "00:00:43", "batch", raw="43", tres="cpu=2,mem=8000M,node=1", ncpus="2"),
        row("123.0", "CANCELLED", "0:15", "node[1-2]", "00:00:41", "python", raw="41", tres="cpu=4,mem=16000M,node=2", ncpus="4"),
    ))
    details = {"exit_code": "0:15", "nodes": "node[1-2]", "elapsed": "00:00:42", "name": JOB_NAME}
    got = status_json(run_cli)
    assert {k: got[k] for k in ("handle", "state", "source", "details")} == {
        "handle": HANDLE, "state": "CANCELLED", "source": "sacct", "details": details}
    usage = got["usage"]
    assert (usage["device_kind"], usage["devices"], usage["elapsed_s"], usage["source"]) == ("cpu", 4, 42.0, "sacct AllocTRES x ElapsedRaw")
    assert usage["cpu_hours"] == round(4 * 42 / 3600, 6) and usage["cost"] is None
    assert slurm.argvs() == [SQUEUE_123, SACCT_123]


@pytest.mark.parametrize("accounting", [SACCT_NO_ACCOUNTING, reply("")], ids=["accounting-disabled", "accounting-forgot"])
def test_status_falls_back_to_the_job_completion_log(slurm, run_cli, accounting):
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", accounting)
    # what the lab's 22.05 job-completion log answers: no TRES, NCPUS and ElapsedRaw only
    slurm.respond("sacct -c", sacct_rows(row("123", "TIMEOUT", "0:0", "node[1-2]", "00:30:02", JOB_NAME, raw="1802",
                                             start="2026-11-23T06:00:00", end="2026-11-23T06:30:02", ncpus="2")))
    details = {"exit_code": "0:0", "nodes": "node[1-2]", "elapsed": "00:30:02", "name": JOB_NAME}
    got = status_json(run_cli)
    assert {k: got[k] for k in ("handle", "state", "source", "details")} == {
        "handle": HANDLE, "state": "TIMEOUT", "source": "jobcomp", "details": details}
    assert (got["usage"]["devices"], got["usage"]["elapsed_s"], got["usage"]["source"]) == (2, 1802.0, "jobcomp NCPUS x ElapsedRaw")
    assert slurm.argvs() == [SQUEUE_123, SACCT_123, JOBCOMP_123]


@pytest.mark.parametrize("jobcomp", [reply(""), reply(stderr="sacct: error: no job completion log\n", rc=1),
                                     sacct_rows(row("123", "job name with", "spaces", "", "", ""))],
                         ids=["empty", "no-log", "garbled-row"])
def test_status_is_unknown_when_no_source_knows_the_job(slurm, run_cli, jobcomp):
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    slurm.respond("sacct -c", jobcomp)
    got = status_json(run_cli)
    assert (got["handle"], got["state"], got["source"]) == (HANDLE, "UNKNOWN", "none"), got
    assert slurm.argvs() == [SQUEUE_123, SACCT_123, JOBCOMP_123]


def test_status_when_the_controller_does_not_answer_is_an_error_not_unknown(slurm, run_cli):
    slurm.respond("squeue", reply(stderr="slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", rc=1))
    result = run_cli("status", HANDLE)
    assert result.code == 1 and "Unable to contact slurm controller" in result.stderr
    assert slurm.argvs() == [SQUEUE_123]


def test_status_of_a_job_directory_uses_its_submission_record(slurm, submit, run_cli, tmp_path):
    slurm.respond("sbatch", reply("123\n"))
    assert submit().code == 0
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["RUNNING"])))
    assert status_json(run_cli, str(job_dir(tmp_path)))["handle"] == HANDLE
    assert slurm.argvs()[-1] == SQUEUE_123


# --------------------------------------------------------------------------- logs

#: srun --label output of a 12-rank job: labels are right-aligned to the widest rank.
LOG = """\
jobgen: job 123 on 12 node(s), restart 0, master node1:29500
 0: step 10/600 loss 5.10
 1: step 10/600 loss 5.11
11: step 10/600 loss 5.12
 0: step 20/600 loss 4.90
11: Traceback (most recent call last):
srun: error: node12: task 11: Exited with exit code 1
 0: last words without a newline"""


@pytest.fixture
def submitted(slurm, submit, tmp_path) -> Path:
    """A submitted job whose log file (named by the record) holds LOG; the fakes' calls reset."""
    slurm.respond("sbatch", reply("123\n"))
    assert submit().code == 0
    slurm.forget_calls()
    log = run_dir(tmp_path) / "slurm-123.out"
    log.write_text(LOG)
    return log


@pytest.mark.parametrize(("rank", "expected"), [
    (None, ["jobgen: job 123 on 12 node(s), restart 0, master node1:29500", "step 10/600 loss 5.10", "step 20/600 loss 4.90",
            "srun: error: node12: task 11: Exited with exit code 1", "last words without a newline"]),
    ("1", ["jobgen: job 123 on 12 node(s), restart 0, master node1:29500", "step 10/600 loss 5.11",
           "srun: error: node12: task 11: Exited with exit code 1"]),
    ("11", ["jobgen: job 123 on 12 node(s), restart 0, master node1:29500", "step 10/600 loss 5.12", "Traceback (most recent call last):",
            "srun: error: node12: task 11: Exited with exit code 1"]),
    ("all", LOG.splitlines()),
], ids=["default-rank-0", "rank-1", "rank-11", "all"])
def test_logs_filters_the_label_prefixes_of_one_rank(slurm, run_cli, submitted, tmp_path, rank, expected):
    for job in (HANDLE, str(job_dir(tmp_path))):
        result = run_cli("logs", *(["--rank", rank] if rank else []), job)
        assert result.code == 0, result.stderr
        assert result.stdout.splitlines() == expected
    assert slurm.argvs() == []  # the record names the file: SLURM is not asked


def test_logs_follow_of_an_ended_job_prints_everything_and_returns(slurm, run_cli, submitted):
    slurm.respond("squeue", json_reply(squeue_22_05(123, "COMPLETED")))
    result = run_cli("logs", "-f", "--rank", "all", HANDLE, timeout=30)
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines() == LOG.splitlines()
    assert slurm.argvs() == [SQUEUE_123]


def test_logs_before_the_job_started_says_so(slurm, run_cli, submitted):
    submitted.unlink()
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["PENDING"], reason="Priority")))
    result = run_cli("logs", HANDLE)
    assert result.code == 0, result.stderr
    assert result.stdout == f"jobgen: {HANDLE} is PENDING; no output yet in {submitted} (jobgen logs -f waits for it)\n"
    assert slurm.argvs() == [SQUEUE_123]


def test_logs_of_an_ended_job_without_its_file_is_an_error(slurm, run_cli, submitted):
    submitted.unlink()
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["FAILED"], return_code=1)))
    result = run_cli("logs", HANDLE)
    assert result.code == 2 and f"is FAILED but its output file {submitted} does not exist" in result.stderr, result.stderr


def test_logs_without_a_record_asks_scontrol_for_the_file(slurm, run_cli, tmp_path):
    log = tmp_path / "elsewhere" / "slurm-123.out"
    log.parent.mkdir()
    log.write_text(" 0: hello\n 1: other rank\n")
    slurm.respond("scontrol", reply(f"JobId=123 JobName={JOB_NAME}\n   WorkDir={log.parent}\n   StdErr={log}\n   StdIn=/dev/null\n   StdOut={log}\n"))
    result = run_cli("logs", HANDLE)
    assert result.code == 0, result.stderr
    assert result.stdout == "hello\n"
    assert slurm.argvs() == [["scontrol", "show", "job", "123"]]


def test_logs_when_the_controller_does_not_answer_is_the_schedulers_failure_as_in_status(slurm, run_cli):
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
    slurm.respond("scontrol", reply(stderr=down, rc=1))
    slurm.respond("squeue", reply(stderr=down, rc=1))
    logs, status = run_cli("logs", HANDLE), run_cli("status", HANDLE)
    assert (logs.code, status.code) == (1, 1), (logs.stderr, status.stderr)
    assert "Unable to contact slurm controller" in logs.stderr and "no longer knows" not in logs.stderr


def test_logs_of_a_job_slurm_does_not_know_is_bad_input(slurm, run_cli):
    slurm.respond("scontrol", reply(stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1))
    result = run_cli("logs", HANDLE)
    assert result.code == 2 and "SLURM no longer knows it" in result.stderr, result.stderr


#: A 2-rank job in which rank 1 raised and rank 0 failed after it (srun --label, arrival order).
FAILED_LOG = """\
jobgen: job 123 on 2 node(s), restart 0, master node1:29500
 0: step 10/600 loss 5.10
 1: step 10/600 loss 5.11
 1: Traceback (most recent call last):
 1:   File "/home/u/model.py", line 40, in training_step
 1: ValueError: NaN labels in batch 17
 0: Traceback (most recent call last):
 0:   File "/torch/distributed/c10d.py", line 9, in all_reduce
 0: RuntimeError: Connection closed by peer
srun: error: node2: task 1: Exited with exit code 1
srun: error: node1: task 0: Exited with exit code 1
"""


def test_logs_first_error_names_the_rank_that_failed_first_and_its_node(slurm, run_cli, submitted, tmp_path):
    submitted.write_text(FAILED_LOG)
    result = run_cli("logs", "--first-error", str(job_dir(tmp_path)))
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "first failure: rank 1 on node2 (traceback; first in the job's output of 2 failed source(s))"
    assert lines[1] == "  ValueError: NaN labels in batch 17"
    assert "  | Traceback (most recent call last):" in lines
    assert "  rank 0 on node1: RuntimeError: Connection closed by peer" in lines
    doc = json.loads(run_cli("logs", "--first-error", "-o", "json", HANDLE).stdout)
    assert doc["handle"] == HANDLE and doc["ordered_by"] == "position"
    assert (doc["first"]["rank"], doc["first"]["node"], doc["first"]["kind"]) == (1, "node2", "traceback")
    assert [f["rank"] for f in doc["failures"]] == [1, 0]
    assert doc["failure"] == {"class": "user", "retried": False, "rule": "exception", "reason": doc["failure"]["reason"],
                              "evidence": "rank 1: kind traceback, ValueError: NaN labels in batch 17"}
    assert lines[-1] == f"failure: user (not retried): {doc['failure']['reason']} [{doc['failure']['evidence']}]"
    assert slurm.argvs() == []  # the submission record names the file


def test_logs_first_error_a_rank_killed_by_the_oom_killer_after_a_user_exception(slurm, run_cli, submitted):
    """Rank 1 raised; then srun reports rank 0 killed by the OOM killer: the exception decides."""
    submitted.write_text(FAILED_LOG.replace("srun: error: node1: task 0: Exited with exit code 1", "srun: error: node1: task 0: Out Of Memory"))
    doc = json.loads(run_cli("logs", "--first-error", "-o", "json", HANDLE).stdout)
    assert (doc["failure"]["class"], doc["failure"]["rule"]) == ("user", "exception")
    submitted.write_text("jobgen: job 123\n 0: step 1\nsrun: error: node1: task 0: Out Of Memory\n")
    doc = json.loads(run_cli("logs", "--first-error", "-o", "json", HANDLE).stdout)
    assert (doc["failure"]["class"], doc["failure"]["rule"], doc["failure"]["retried"]) == ("infrastructure", "host-oom", True)


def test_logs_first_error_refuses_options_that_pick_one_rank(slurm, run_cli, submitted):
    for extra in (["--rank", "1"], ["-f"]):
        result = run_cli("logs", "--first-error", *extra, HANDLE)
        assert result.code == 2 and "does not combine with --follow, --rank or --replica" in result.stderr, result.stderr
    result = run_cli("logs", "-o", "json", HANDLE)  # -o json: the error is the JSON document on stdout
    assert result.code == 2 and "applies to --first-error only" in json.loads(result.stdout)["error"]


# --------------------------------------------------------------------------- cancel


@pytest.mark.parametrize("shape", SHAPES)
def test_cancel_runs_scancel_then_waits_while_the_ranks_stop(slurm, run_cli, shape):
    slurm.respond("scancel", reply())
    slurm.respond("squeue", json_reply(squeue_doc(shape, "CANCELLED", ("COMPLETING",))), json_reply(squeue_doc(shape, "CANCELLED")))
    result = run_cli("cancel", HANDLE)
    assert result.code == 0, result.stderr
    assert result.stdout == f"jobgen: {HANDLE} is COMPLETING; waiting for its processes to stop ...\n{HANDLE}  CANCELLED\n"
    assert slurm.argvs() == [["scancel", "123"], SQUEUE_123, SQUEUE_123]


def test_cancel_of_a_job_that_left_squeue_ends_with_accounting(slurm, run_cli):
    slurm.respond("scancel", reply())
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", sacct_rows(row("123", "CANCELLED by 1000", "0:15", "node1", "00:00:05", JOB_NAME)))
    result = run_cli("cancel", HANDLE)
    assert result.code == 0, result.stderr
    assert result.stdout == f"{HANDLE}  CANCELLED\n"
    assert slurm.argvs() == [["scancel", "123"], SQUEUE_123, SACCT_123]


def test_cancel_fails_when_scancel_does(slurm, run_cli):
    slurm.respond("scancel", reply(stderr="scancel: error: Kill job error on job id 123: Access/permission denied\n", rc=1))
    result = run_cli("cancel", HANDLE)
    assert result.code == 1 and "Access/permission denied" in result.stderr
    assert slurm.argvs() == [["scancel", "123"]]


def test_cancel_gives_up_after_wait_s(slurm, run_cli):
    slurm.respond("scancel", reply())
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["RUNNING"])))
    result = run_cli("cancel", "--wait-s", "0", HANDLE)
    assert result.code == 1 and f"{HANDLE} is still RUNNING 0 s after scancel" in result.stderr, result.stderr
    assert slurm.argvs() == [["scancel", "123"], SQUEUE_123]


def test_an_unexpected_slurm_command_fails_the_fake_loudly(slurm, run_cli):
    """The fakes answer only what a test queued: jobgen asking something else shows up as an error."""
    result = run_cli("status", HANDLE)
    assert result.code == 1 and f"exit {NOT_CONFIGURED_RC}" in result.stderr and "no response queued for 'squeue'" in result.stderr


def test_status_reads_squeue_output_that_is_not_utf8(slurm, run_cli, tmp_path):
    """SLURM passes job names, node names and reasons through as the bytes it was given: a
    Latin-1 byte in squeue's JSON is shown escaped, never a UnicodeDecodeError."""
    doc = json.dumps(squeue_24_05(123, ["FAILED"], name="caf\udce9", reason="NodeDown", return_code=1), ensure_ascii=False)
    raw = tmp_path / "squeue.json"
    raw.write_bytes(doc.encode("utf-8", "surrogateescape"))  # name: b"caf\xe9"
    slurm.respond("squeue", file_reply(raw))
    plain = run_cli("status", HANDLE)
    assert plain.code == 0, plain.stderr
    assert "Traceback" not in plain.stderr and "UnicodeDecodeError" not in plain.stderr
    assert all(line.isprintable() for line in plain.stdout.splitlines()), plain.stdout
    assert "caf\ufffd" in plain.stdout
    assert status_json(run_cli)["state"] == "FAILED"
