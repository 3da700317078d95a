"""The batch script's restart budget (restart.max_restarts) run under real bash with srun and
scontrol stubbed: which failures requeue the job, which node it excludes, what it logs, and how
scheduler values it cannot trust are refused.

The stubs stand in for SLURM, which a unit test cannot run: srun writes the lines srun writes
when a task ends badly (``srun: error: <node>: task <N>: <how>``) and exits; scontrol records
each call and answers ``show hostnames`` and ``show job -o`` (its ExcNodeList). The SLURM lab
(tests/integration/slurm/test_restart_on_lab.py) runs the same script under real SLURM.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jobgen.backends import plan
from jobgen.reports import failure_class as fc
from jobgen.specs.load import load_profile, validate
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, REPO, TEMPLATES, lint_bash

#: srun stand-in: writes $SRUN_STDERR (a file of srun's lines) to stderr and exits $SRUN_EXIT;
#: with $HANG_NODE, first writes it where the watchdog names the node whose heartbeat stopped first.
FAILING_SRUN = """#!/bin/bash
echo "rank output on stdout"
[ -z "${HANG_NODE:-}" ] || { mkdir -p "$RUN_DIR/hang"; printf '%s\\n' "$HANG_NODE" > "$RUN_DIR/hang/stopped-nodes"; }
cat "$SRUN_STDERR" >&2
exit "${SRUN_EXIT:-0}"
"""

#: scontrol stand-in: appends each call's arguments (NUL-separated, one call per line) to
#: $STUB_OUT/scontrol.calls; answers `show hostnames` and `show job -o` (ExcNodeList from
#: $EXC_NODE_LIST, "(null)" when unset); fails `requeue` when $REQUEUE_FAILS is set.
RECORDING_SCONTROL = """#!/bin/bash
{ printf '%s\\0' "$@"; printf '\\n'; } >> "$STUB_OUT/scontrol.calls"
case "$1 $2" in
    "show hostnames") echo node1; echo node2 ;;
    "show job") printf 'JobId=%s JobName=r ExcNodeList=%s NodeList=node2\\n' "$4" "${EXC_NODE_LIST:-(null)}" ;;
    "requeue "*) [ -z "${REQUEUE_FAILS:-}" ] || { echo "scontrol: error: Requested operation is presently disabled" >&2; exit 1; } ;;
esac
"""


def restart_script(max_restarts: int = 1, profile: str = "slurm-cpu", **restart: object) -> str:
    spec = validate(TrainingSpec, {"name": "r", "restart": {"max_restarts": max_restarts, **restart}}, "<t>")
    return plan(spec, load_profile(profile, PROFILES), TEMPLATES).file("job.sbatch")


def run_failing_job(tmp_path: Path, script: str, srun_lines: list[bytes], srun_exit: int,
                    env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[bytes], list[list[str]]]:
    """Run ``script`` with srun writing ``srun_lines`` to stderr and exiting ``srun_exit``;
    returns the batch shell's result and scontrol's calls (each its argument list)."""
    work = tmp_path / "submit dir"
    work.mkdir()
    (work / "job.sbatch").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAILING_SRUN), ("scontrol", RECORDING_SCONTROL), ("module", "#!/bin/bash\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "srun.stderr").write_bytes(b"".join(line + b"\n" for line in srun_lines))
    (tmp_path / "tmp").mkdir()
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "SLURM_SUBMIT_DIR": str(work),
                "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "HOME": str(tmp_path),
                "SRUN_STDERR": str(tmp_path / "srun.stderr"), "SRUN_EXIT": str(srun_exit), "TMPDIR": str(tmp_path / "tmp"),
                **(env or {})}
    proc = subprocess.run(["bash", str(work / "job.sbatch")], cwd=work, env=full_env, capture_output=True, timeout=30)
    calls_file = out / "scontrol.calls"
    calls = [line.split(b"\0")[:-1] for line in calls_file.read_bytes().split(b"\n")[:-1]] if calls_file.exists() else []
    assert not list((tmp_path / "tmp").iterdir()), "the script leaves no file of srun's lines behind"
    return proc, [[part.decode(errors="backslashreplace") for part in call] for call in calls if call[:2] != [b"show", b"hostnames"]]


def restart_records(run_dir: Path, job_id: str = "42") -> list[dict]:
    """The restart records the script appended (JOBGEN_RESTART_RECORD), as the entrypoint reads them;
    every line must be one (a line the reader leaves out fails here)."""
    import json

    from jobgen.events.notifier import read_restart_records

    path = run_dir / "restarts" / f"slurm-{job_id}.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == read_restart_records(path), lines
    return [{k: v for k, v in doc.items() if k != "at"} for doc in read_restart_records(path)]


def decisions(proc: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [line for line in proc.stderr.decode(errors="backslashreplace").splitlines() if line.startswith("jobgen: ")]


KILLED = [b"srun: error: node2: task 1: Killed", b"srun: Force Terminated StepId=42.0"]


def test_an_infrastructure_failure_excludes_the_node_and_requeues_within_the_budget(tmp_path):
    """Budget 1, a task SIGKILLed on node2: the job's ExcNodeList (node0) gains node2 and the job is
    requeued; the update comes after the requeue (slurmctld takes ExcNodeList from a pending job only)."""
    proc, calls = run_failing_job(tmp_path, restart_script(1), KILLED, 137, {"EXC_NODE_LIST": "node0"})
    assert proc.returncode == 0, proc.stderr
    assert calls == [["show", "job", "-o", "42"], ["requeue", "42"], ["update", "JobId=42", "ExcNodeList=node0,node2"]]
    assert decisions(proc) == ["jobgen: restart 1/1 after infrastructure failure (exit 137 on node2); excluding node2"]
    # the record the restarted run's rank zero notifies and adds to summary.json
    assert restart_records(tmp_path / "submit dir" / "runs" / "r") == [
        {"restart": 1, "class": "infrastructure", "reason": "exit 137 on node2", "exit_code": 137}]
    # srun's stderr still reaches the job's output, its stdout untouched
    assert "srun: error: node2: task 1: Killed" in proc.stderr.decode() and proc.stdout.decode().count("rank output on stdout") == 1


@pytest.mark.parametrize(("lines", "srun_exit", "used", "budget", "expected"), [
    # the entrypoint's codes: 200 (NCCL, lost peer, GPU error), 201 (hang), 202 (unknown)
    ([b"srun: error: gpu-a.7: task 3: Exited with exit code 200"], 200, "0", 3,
     "jobgen: restart 1/3 after infrastructure failure (exit 200 on gpu-a.7); excluding gpu-a.7"),
    ([b"srun: error: node1: tasks 0-1: Exited with exit code 201"], 201, "1", 3,
     "jobgen: restart 2/3 after infrastructure failure (exit 201 on node1); excluding node1"),
    ([b"srun: error: node1: task 0: Segmentation fault (core dumped)"], 139, "2", 3,
     "jobgen: restart 3/3 after unknown failure (exit 139 on node1); excluding node1"),
    ([b"srun: error: node2: task 1: Out Of Memory"], 137, "0", 1,
     "jobgen: restart 1/1 after infrastructure failure (exit 137 on node2); excluding node2"),
    # the first infrastructure task decides; the others' kill by srun comes after it
    ([b"srun: error: node2: task 1: Exited with exit code 200", b"srun: error: node1: task 0: Killed"], 200, "0", 1,
     "jobgen: restart 1/1 after infrastructure failure (exit 200 on node2); excluding node2"),
], ids=["nccl-200", "hang-201", "segfault", "oom", "first-task"])
def test_a_retried_failure_is_requeued_naming_its_class_and_node(tmp_path, lines, srun_exit, used, budget, expected):
    proc, calls = run_failing_job(tmp_path, restart_script(budget), lines, srun_exit, {"SLURM_RESTART_COUNT": used})
    assert proc.returncode == 0, proc.stderr
    assert decisions(proc) == [expected]
    (record,) = restart_records(tmp_path / "submit dir" / "runs" / "r")
    assert (record["restart"], record["class"]) == (int(used) + 1, expected.split(" after ")[1].split()[0]), record
    node = expected.rsplit(" ", 1)[1]
    assert calls[1:] == [["requeue", "42"], ["update", "JobId=42", f"ExcNodeList={node}"]]


@pytest.mark.parametrize(("lines", "srun_exit", "code", "where"), [
    ([b"srun: error: node1: task 0: Exited with exit code 1"], 1, 1, "exit 1 on node1"),
    ([b"srun: error: node1: task 0: Exited with exit code 2"], 2, 2, "exit 2 on node1"),
    # a user failure decides over the kills that follow it (failure_class: user before infrastructure)
    ([b"srun: error: node2: task 1: Killed", b"srun: error: node1: task 0: Exited with exit code 1"], 137, 1, "exit 1 on node1"),
    ([b"srun: error: Unable to create step for job 42: Invalid generic resource (gres) specification"], 1, 1, "exit 1"),
], ids=["exception", "input-error", "user-over-kill", "srun-own-error"])
def test_a_user_failure_is_never_requeued_and_ends_with_its_code(tmp_path, lines, srun_exit, code, where):
    proc, calls = run_failing_job(tmp_path, restart_script(3), lines, srun_exit)
    assert proc.returncode == code
    assert calls == []
    assert decisions(proc) == [f"jobgen: no restart after user failure ({where}): a restart would fail the same way"]


def test_an_exhausted_budget_ends_the_job_with_the_failures_code(tmp_path):
    proc, calls = run_failing_job(tmp_path, restart_script(1), KILLED, 137, {"SLURM_RESTART_COUNT": "1"})
    assert proc.returncode == 137 and calls == []
    assert decisions(proc) == ["jobgen: no restart after infrastructure failure (exit 137 on node2): the restart budget "
                               "is used up (1/1, restart.max_restarts)"]


def test_a_failed_requeue_ends_the_job_with_the_failures_code(tmp_path):
    proc, calls = run_failing_job(tmp_path, restart_script(2), KILLED, 137, {"REQUEUE_FAILS": "1"})
    assert proc.returncode == 137 and restart_records(tmp_path / "submit dir" / "runs" / "r") == []  # no restart: no record
    assert calls == [["show", "job", "-o", "42"], ["requeue", "42"]]
    assert decisions(proc)[-1].startswith("jobgen: scontrol requeue 42 failed (requeue disabled?")


def test_exclude_failed_nodes_false_requeues_without_an_update(tmp_path):
    proc, calls = run_failing_job(tmp_path, restart_script(1, exclude_failed_nodes=False), KILLED, 137)
    assert proc.returncode == 0 and calls == [["requeue", "42"]]
    assert decisions(proc) == ["jobgen: restart 1/1 after infrastructure failure (exit 137 on node2); the failed node is "
                               "not excluded (restart.exclude_failed_nodes: false)"]


HOSTILE_NODES = [b"no$(touch PWNED)de", b"node`touch PWNED`", b"a'b", b"n" * 300, b"node\xff\xfe", b"node\x1b[2J", b"-rf"]


@pytest.mark.parametrize("node", HOSTILE_NODES, ids=range(len(HOSTILE_NODES)))
def test_a_node_name_that_is_not_a_slurm_name_is_not_excluded_and_nothing_runs(tmp_path, node):
    proc, calls = run_failing_job(tmp_path, restart_script(1), [b"srun: error: " + node + b": task 0: Killed"], 137)
    assert proc.returncode == 0, proc.stderr
    assert [call[0] for call in calls] == ["requeue"], "requeued without an update"
    (line,) = decisions(proc)
    assert line.startswith("jobgen: restart 1/1 after infrastructure failure (exit 137")
    # a name with a space is no task line of srun's at all (srun's task line has none)
    assert line.endswith("is not a SLURM node name" if b" " not in node else "srun named no failed task's node"), line
    assert "\x1b" not in line and not list(tmp_path.rglob("PWNED"))
    # the record names no node it could not check (its JSON stays one valid line)
    assert restart_records(tmp_path / "submit dir" / "runs" / "r") == [
        {"restart": 1, "class": "infrastructure", "reason": "exit 137", "exit_code": 137}]


@pytest.mark.parametrize("exc_list", ["$(touch PWNED)", "node1 InjectedKey=1", "a" * 5000, "node\x1b[2J"])
def test_an_excluded_node_list_jobgen_cannot_read_is_left_alone(tmp_path, exc_list):
    """The job's current ExcNodeList (scheduler output) must be kept when the update replaces it;
    one that is not a host list is not extended (the update would drop it), and the job is requeued."""
    proc, calls = run_failing_job(tmp_path, restart_script(1), KILLED, 137, {"EXC_NODE_LIST": exc_list})
    assert proc.returncode == 0, proc.stderr
    if exc_list == "node1 InjectedKey=1":  # scontrol's next field after a space: the list is node1
        assert calls[-1] == ["update", "JobId=42", "ExcNodeList=node1,node2"]
    else:
        assert [call[0] for call in calls] == ["show", "requeue"]
        assert "is not a SLURM host list" in decisions(proc)[0] and "\x1b" not in decisions(proc)[0]
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("count", ["x", "-1", "1 2", "9" * 20, "$(touch PWNED)"])
def test_a_restart_count_that_is_not_a_count_ends_the_job(tmp_path, count):
    proc, calls = run_failing_job(tmp_path, restart_script(3), KILLED, 137, {"SLURM_RESTART_COUNT": count})
    assert proc.returncode == 137 and calls == []
    assert "SLURM_RESTART_COUNT is " in decisions(proc)[0] and not list(tmp_path.rglob("PWNED"))


def test_a_successful_run_makes_no_decision(tmp_path):
    proc, calls = run_failing_job(tmp_path, restart_script(3), [b"some warning on stderr"], 0)
    assert proc.returncode == 0 and calls == [] and decisions(proc) == []
    assert b"some warning on stderr" in proc.stderr


def test_without_a_budget_the_script_has_no_restart_logic_and_ends_with_sruns_status(tmp_path):
    script = restart_script(0)
    assert "jobgen_after_failure" not in script and "SRUN_ERRORS" not in script
    proc, calls = run_failing_job(tmp_path, script, KILLED, 137)
    assert proc.returncode == 137 and calls == []


def test_the_script_requeues_even_when_the_profile_does_not(tmp_path):
    """scontrol requeue needs the job to be requeueable: a budget adds --requeue to a profile
    with requeue: false (without the time-limit signal that goes with the profile's requeue)."""
    base = load_profile("slurm-cpu", PROFILES).model_dump()
    base["slurm"]["requeue"] = False
    profile = validate(ClusterProfile, base, "<t>")
    with_budget = plan(validate(TrainingSpec, {"name": "r", "restart": {"max_restarts": 1}}, "<t>"), profile, TEMPLATES)
    without = plan(validate(TrainingSpec, {"name": "r"}, "<t>"), profile, TEMPLATES)
    assert "#SBATCH --requeue\n" in with_budget.file("job.sbatch") and "--signal" not in with_budget.file("job.sbatch")
    assert "--requeue" not in without.file("job.sbatch")


def test_the_rendered_classes_are_the_failure_class_tables():
    """One fact, one place: the exit code ranges and srun's words agree with classify()."""
    ranges = fc.task_exit_classes()
    assert ranges[0][0] == 1 and ranges[-1][1] == 255
    assert all(a[1] + 1 == b[0] and a[2] != b[2] for a, b in zip(ranges, ranges[1:], strict=False))
    by_code = {code: cls for low, high, cls in ranges for code in range(low, high + 1)}
    assert (by_code[1], by_code[2], by_code[137], by_code[143], by_code[200], by_code[201], by_code[202]) == (
        "user", "user", "infrastructure", "infrastructure", "infrastructure", "infrastructure", "unknown")
    for word, code in fc.SRUN_WORD_CODES:
        evidence = fc.srun_evidence(f"node1: task 0: {word}")
        decided = fc.classify([evidence])
        assert decided is not None and decided.cls == by_code[code], word
    script = restart_script(1)
    for low, high, cls in ranges:
        assert f'if [ "$1" -ge {low} ] && [ "$1" -le {high} ]; then echo {cls}; return; fi' in script


@pytest.mark.parametrize("signal_target", ["tasks", "batch"])
def test_the_restart_script_passes_bash_n_and_shellcheck(tmp_path, signal_target):
    base = load_profile("slurm-a100", PROFILES).model_dump()
    base["slurm"]["signal_target"] = signal_target
    spec = validate(TrainingSpec, {"name": "r", "restart": {"max_restarts": 2}}, "<t>")
    path = tmp_path / "job.sbatch"
    path.write_text(plan(spec, validate(ClusterProfile, base, "<t>"), TEMPLATES).file("job.sbatch"))
    lint_bash(path)


def test_the_batch_signal_form_decides_after_srun_too(tmp_path):
    """signal_target: batch runs srun in the background: its failure is decided the same way."""
    base = load_profile("slurm-cpu", PROFILES).model_dump()
    base["slurm"]["signal_target"] = "batch"
    spec = validate(TrainingSpec, {"name": "r", "restart": {"max_restarts": 1}}, "<t>")
    script = plan(spec, validate(ClusterProfile, base, "<t>"), TEMPLATES).file("job.sbatch")
    assert "trap forward_signal USR2" in script
    proc, calls = run_failing_job(tmp_path, script, KILLED, 137)
    assert proc.returncode == 0 and calls[1:] == [["requeue", "42"], ["update", "JobId=42", "ExcNodeList=node2"]]


def test_an_array_task_requeues_itself_not_the_array(tmp_path):
    from jobgen.api import PLANNERS
    from jobgen.planning.sweep import SpecOptions, plan_single

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "slurm-cpu-array.yaml").write_text("extends: slurm-cpu\nslurm: {sweep_as_array: true}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text((PROFILES.parent / "examples" / "quickstart.yaml").read_text() + "\nrestart:\n  max_restarts: 2\n")
    render = plan_single(str(spec), "slurm-cpu-array", PLANNERS,
                         SpecOptions(sweeps=["trainer.learning_rate=1e-4,3e-4"], out=str(tmp_path / "m"),
                                     profiles_dir=str(profiles), templates_dir=str(TEMPLATES)))
    script = render.jobs[0].plan.file("job.sbatch")
    env = {"SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "72", "JOBGEN_RUN_DIR": str(tmp_path / "runs")}
    proc, calls = run_failing_job(tmp_path, script, KILLED, 137, env)
    assert proc.returncode == 0, proc.stderr
    assert calls == [["show", "job", "-o", "70_1"], ["requeue", "70_1"], ["update", "JobId=70_1", "ExcNodeList=node2"]]
    (record,) = [r for d in (tmp_path / "runs").iterdir() for r in restart_records(d, "70_1")]  # the task's own record
    assert (record["restart"], record["class"]) == (1, "infrastructure")
    path = tmp_path / "array.sbatch"
    path.write_text(script)
    lint_bash(path)


def test_the_decision_lines_docs_failures_md_shows_are_the_scripts(tmp_path):
    """docs/failures.md shows three decisions: each is what the script prints for its case."""
    page = (REPO / "docs" / "failures.md").read_text()
    block = page.split("```text\njobgen: restart 1/3", 1)[1].split("```", 1)[0]
    shown = ("jobgen: restart 1/3" + block).strip().splitlines()
    cases = [([b"srun: error: node2: task 1: Killed"], 137, "0"), ([b"srun: error: node1: task 0: Exited with exit code 1"], 1, "0"),
             ([b"srun: error: node2: task 1: Exited with exit code 200"], 200, "3")]
    printed = []
    for i, (lines, code, used) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        proc, _ = run_failing_job(tmp_path / str(i), restart_script(3), lines, code, {"SLURM_RESTART_COUNT": used})
        printed += decisions(proc)
    assert printed == shown


@pytest.mark.parametrize(("stopped", "reason"), [
    ("node2", "exit 201 on node1; the heartbeat stopped first on node2"),
    ('no"de$(touch PWNED)', "exit 201 on node1"),  # not a SLURM node name: left out of the record
])
def test_after_a_hang_the_restart_record_names_the_node_whose_heartbeat_stopped_first(tmp_path, stopped, reason):
    proc, _ = run_failing_job(tmp_path, restart_script(1), [b"srun: error: node1: tasks 0-1: Exited with exit code 201"], 201,
                              {"HANG_NODE": stopped})
    assert proc.returncode == 0, proc.stderr
    (record,) = restart_records(tmp_path / "submit dir" / "runs" / "r")
    assert (record["class"], record["reason"], record["exit_code"]) == ("infrastructure", reason, 201), record
    assert not list(tmp_path.rglob("PWNED"))
