"""jobgen against the real lab cluster: submit, status, logs, requeue-and-resume, cancel, quoting.

Each job is rendered from ``slurm-lab`` (a profile that extends the shipped ``slurm-cpu`` with
the lab's partition and interpreter) and submitted with the ``jobgen`` CLI, exactly as a user
would; the lab is the ``slurm_lab`` fixture (conftest.py). Wall times are printed (``-s``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import run_slurm, wait_for

from jobgen.backends.slurm_script import run_dir_name
from tests.conftest import ADVERSARIAL, REPO

pytestmark = pytest.mark.slurm_lab

LAB_PROFILE = """\
# The project's lab cluster (tests/integration/slurm/lab.py): 2 CPU nodes, partition lab.
extends: slurm-cpu
description: jobgen SLURM lab, 2 CPU nodes
slurm:
  cluster: jobgenlab
  partition: lab
  python: {python}
  time_limit_min: {time_limit_min}
  signal_grace_s: {grace_s}
"""

SPEC = """\
name: {name}
model: {{preset: null, n_layer: 2, n_head: 2, d_model: 64, block_size: 64}}
data: {{max_bytes: 1000000}}
trainer: {{precision: 32-true, micro_batch_size: 8, learning_rate: 0.003, max_steps: {max_steps}, warmup_steps: 5,
          val_check_interval: {every}, limit_val_batches: 4, log_every_n_steps: 10}}
checkpoint: {{every_n_steps: {every}}}
resources: {{nodes: 2}}
"""


class Jobgen:
    """Runs the jobgen CLI against the lab, with its own profiles, runs and state dirs."""

    def __init__(self, lab, root: Path):
        self.lab, self.root = lab, root
        self.env = {**lab.client_env(), "JOBGEN_STATE_DIR": str(root / "state"), "PYTHONPATH": str(REPO)}
        self.env.pop("JOBGEN_DEBUG", None)

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"jobgen {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def profile(self, name: str = "slurm-lab", *, time_limit_min: int = 10, grace_s: int = 60, python: str = sys.executable) -> str:
        (self.root / "profiles").mkdir(exist_ok=True)
        text = LAB_PROFILE.format(python=json.dumps(python), time_limit_min=time_limit_min, grace_s=grace_s)
        (self.root / "profiles" / f"{name}.yaml").write_text(text)
        return name

    def spec(self, name: str, *, max_steps: int, every: int) -> str:
        path = self.root / f"{name}.yaml"
        path.write_text(SPEC.format(name=name, max_steps=max_steps, every=every))
        return str(path)

    def submit(self, spec: str, profile: str = "slurm-lab", *extra: str) -> str:
        out = self("submit", spec, "--profile", profile, "--profiles-dir", str(self.root / "profiles"), *extra).stdout
        return next(line.split()[1] for line in out.splitlines() if line.startswith("submitted "))

    def status(self, handle: str) -> dict:
        return json.loads(self("status", "--json", handle).stdout)

    def wait_state(self, handle: str, states: set[str], timeout: float) -> tuple[str, list[str]]:
        """Poll `jobgen status` until the state is in ``states``; returns it and every state seen."""
        seen: list[str] = []

        def reached() -> str:
            state = self.status(handle)["state"]
            if not seen or seen[-1] != state:
                seen.append(state)
            return state if state in states else ""

        try:
            return wait_for(reached, timeout, 1.0), seen
        except TimeoutError:
            raise TimeoutError(f"{handle} not in {sorted(states)} after {timeout:g} s; states seen: {seen}") from None


@pytest.fixture
def jobgen(slurm_lab, tmp_path) -> Iterator[Jobgen]:
    yield Jobgen(slurm_lab, tmp_path)
    # A failed test must not leave a job holding the lab's nodes for the next one.
    jobs = run_slurm(slurm_lab, "squeue", "-h", "-o", "%i").stdout.split()
    if jobs:
        run_slurm(slurm_lab, "scancel", *jobs)
        wait_for(lambda: not run_slurm(slurm_lab, "squeue", "-h", "-o", "%i").stdout.split(), 60, 0.5, what="the queue to drain")


def job_id(handle: str) -> str:
    return handle.rsplit("/", 1)[1]


def run_dir(jg: Jobgen, name: str) -> Path:
    return jg.root / "runs" / name


def val_losses(run: Path) -> list[tuple[int, float]]:
    rows = []
    for path in sorted(run.glob("logs/version_*/metrics.csv")):
        with path.open() as fh:
            rows += [(int(r["step"]), float(r["val_loss"])) for r in csv.DictReader(fh) if r.get("val_loss")]
    return sorted(rows)


def test_two_node_job_trains_to_completion_with_status_and_logs(jobgen):
    """Acceptance: 2 nodes x 1 rank (gloo), real text, COMPLETED, val loss falls, checkpoints left."""
    jobgen.profile()
    started = time.monotonic()
    handle = jobgen.submit(jobgen.spec("lab-train", max_steps=60, every=20))
    submitted = time.monotonic()
    assert handle.startswith("slurm://jobgenlab/")
    running, seen = jobgen.wait_state(handle, {"RUNNING", "COMPLETED", "FAILED"}, timeout=60)
    to_running = time.monotonic() - submitted
    assert running == "RUNNING", seen
    final, seen_after = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=400)
    total = time.monotonic() - started
    log = jobgen("logs", handle).stdout
    assert final == "COMPLETED", f"{seen + seen_after}\n{jobgen('logs', '--rank', 'all', handle).stdout[-4000:]}"
    print(f"\nlab job: submit -> RUNNING {to_running:.1f} s, submit -> COMPLETED {total:.1f} s; states {seen + seen_after}")
    # rank zero's progress, without the srun --label prefix; rank 1's lines are filtered out
    assert "jobgen: job " in log and "on 2 node(s)" in log
    assert any(line.startswith("step 60/60") or line.startswith("done: lab-train at step 60/60") for line in log.splitlines()), log
    everything = jobgen("logs", "--rank", "all", handle).stdout
    assert "1: " in everything and "0: " in everything
    run = run_dir(jobgen, "lab-train")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 60 and summary["world_size"] == 2
    losses = val_losses(run)
    assert losses and summary["val_loss"] < losses[0][1] < math.log(256), (losses, summary["val_loss"])
    assert (run / "checkpoints" / "last.ckpt").exists() and list((run / "checkpoints").glob("step-*"))
    # status after the job: sacct (accounting or the job-completion log), not a guess
    final_status = jobgen.status(handle)
    assert final_status["state"] == "COMPLETED" and final_status["source"] in {"squeue", "sacct", "jobcomp"}
    # the job directory is a handle too
    job_dir = jobgen.root / "runs" / "lab-train" / "job"  # submit without --out: the job dir goes with the run
    assert jobgen.status(str(job_dir))["handle"] == handle


def _requeue_now(lab, jid: str, *updates: str) -> None:
    """A requeued job is held ~120 s (BeginTime); LAB-NOTES pitfall 9: once it is back in the
    queue, release it now (with ``updates``, e.g. ``TimeLimit=30``, in the same ``scontrol update``)."""
    def pending() -> bool:
        return run_slurm(lab, "squeue", "-h", "-j", jid, "-o", "%T", check=False).stdout.strip() == "PENDING"

    wait_for(pending, 60, 0.5, what=f"job {jid} back in the queue")
    run_slurm(lab, "scontrol", "update", f"JobId={jid}", "StartTime=now", *updates)


def _wait_for_checkpoint(run: Path, timeout: float) -> Path:
    return wait_for(lambda: sorted((run / "checkpoints").glob("step-*")), timeout, 0.5, what=f"a step checkpoint in {run}")[0]


def test_scontrol_requeue_resumes_from_the_checkpoint(jobgen, slurm_lab):
    """Acceptance: requeue past the first checkpoint -> the job runs again and continues its global step.

    The requeue comes within a second of the step-50 checkpoint, and the first run would need
    another 250 steps (~8 s at ~30 steps/s) to finish on its own, so it is the requeued run that
    completes, resumed from a step checkpoint.
    """
    jobgen.profile()
    started = time.monotonic()
    handle = jobgen.submit(jobgen.spec("lab-requeue", max_steps=300, every=50))
    run = run_dir(jobgen, "lab-requeue")
    _wait_for_checkpoint(run, 600)
    checkpointed = time.monotonic() - started
    run_slurm(slurm_lab, "scontrol", "requeue", job_id(handle))
    _requeue_now(slurm_lab, job_id(handle))
    released = time.monotonic() - started
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=900)
    log = jobgen("logs", handle).stdout
    assert final == "COMPLETED", f"{seen}\n{log[-3000:]}"
    assert "restart 1" in log, log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 300
    assert summary["resumed_from_step"] and 50 <= summary["resumed_from_step"] < 300, summary
    assert "resuming from" in log
    print(f"\nrequeue job: first checkpoint {checkpointed:.0f} s, requeued and released {released:.0f} s, "
          f"COMPLETED {time.monotonic() - started:.0f} s after submit (resumed from step {summary['resumed_from_step']})")


#: --signal=B:USR2@GRACE_S; the test cuts the time limit so that 90-150 s remain (see below).
GRACE_S = 150
#: Above the steps the first run makes in the ~30 s between the cut and the signal (~30 steps/s).
TIME_LIMIT_STEPS = 2000


def _run_time_s(lab, jid: str) -> int:
    """The job's run time so far as SLURM counts it: ``squeue -o %M``, [days-][hours:]minutes:seconds."""
    text = run_slurm(lab, "squeue", "-h", "-j", jid, "-o", "%M").stdout.strip()
    days, _, clock = text.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def test_time_limit_signal_checkpoints_requeues_and_resumes(jobgen, slurm_lab):
    """Acceptance: SLURM's --signal=B:USR2@150 before the time limit -> every rank saves an HPC
    checkpoint and the job requeues itself; the next run resumes from it and the job ends
    COMPLETED at max_steps.

    The job is submitted with a 10-minute limit. Once it trains (its signal handler is installed
    before the first step), the test cuts the limit with ``scontrol update TimeLimit`` (whole
    minutes) to the run time plus 90-150 s: within the grace, so slurmctld sends the signal at its
    next time-limit check, which it makes every 30 s and which sends a warning signal up to that
    much early (sbatch(1), --signal: "may be sent up to 60 seconds earlier than specified"). The
    signal thus comes within ~30 s of the cut and at least 60 s before the limit, and the first run
    stops short of max_steps (:data:`TIME_LIMIT_STEPS`). Once the job is back in the
    queue the test gives the next run a 30-minute limit and releases it from SLURM's ~120 s
    requeue hold (LAB-NOTES pitfall 9).
    """
    jobgen.profile(time_limit_min=10, grace_s=GRACE_S)
    started = time.monotonic()
    handle = jobgen.submit(jobgen.spec("lab-timelimit", max_steps=TIME_LIMIT_STEPS, every=1000))
    run, jid = run_dir(jobgen, "lab-timelimit"), job_id(handle)
    wait_for(lambda: "step 10/" in jobgen("logs", handle).stdout, 600, 1.0, what="training progress")
    ran = _run_time_s(slurm_lab, jid)
    limit_min = math.ceil((ran + 90) / 60)
    run_slurm(slurm_lab, "scontrol", "update", f"JobId={jid}", f"TimeLimit={limit_min}")
    cut = time.monotonic()
    wait_for(lambda: list((run / "checkpoints").glob("hpc_ckpt_*.ckpt")), 300, 1.0, what="the HPC checkpoint the signal triggers")
    signalled = time.monotonic() - cut

    seen: list[str] = []

    def requeued() -> dict | None:
        st = jobgen.status(handle)
        state = f"{st['state']} (restarts {st['details'].get('restarts')!r})"
        if not seen or seen[-1] != state:
            seen.append(state)
        return st if st["details"].get("restarts") not in (None, "", "0") else None

    try:
        wait_for(requeued, 120, 1.0, what=f"{handle} requeued")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; states seen: {seen}\n{jobgen('logs', handle).stdout[-4000:]}") from None
    # The restart count goes up before the job is back in the queue; the next run gets a long limit.
    _requeue_now(slurm_lab, jid, "TimeLimit=30")
    released = time.monotonic() - cut
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=900)
    log = jobgen("logs", handle).stdout
    assert final == "COMPLETED", (seen, log[-4000:])
    assert "requeue: SIGUSR2 received" in log and "restart 1" in log, log[-4000:]
    resumes = [line for line in log.splitlines() if line.startswith("resume: auto - resuming from")]
    assert resumes and "hpc_ckpt_1.ckpt" in resumes[0], resumes
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == TIME_LIMIT_STEPS and 0 < summary["resumed_from_step"] < TIME_LIMIT_STEPS, summary
    print(f"\ntime-limit job: limit cut to {limit_min} min at run time {ran} s; signal + HPC checkpoint "
          f"{signalled:.0f} s after the cut, released {released:.0f} s after it; {resumes[0]}; "
          f"COMPLETED at step {TIME_LIMIT_STEPS} {time.monotonic() - started:.0f} s after submit")


def test_cancel_leaves_no_process_on_any_node(jobgen, slurm_lab):
    jobgen.profile()
    handle = jobgen.submit(jobgen.spec("lab-cancel", max_steps=100000, every=1000))
    wait_for(lambda: "step 10/" in jobgen("logs", handle).stdout, 180, 1.0, what="training progress")
    assert any(slurm_lab.node_pids()[node] for node in ("node1", "node2"))
    out = jobgen("cancel", handle).stdout
    assert "CANCELLED" in out
    # scancel has returned and squeue says CANCELLED; give PID 1 a moment to reap, then nothing may be left
    wait_for(lambda: not any(slurm_lab.node_pids().values()), 30, 0.5, what=f"no job process on any node ({slurm_lab.node_pids()})")


ECHO = """#!{python}
# Stands in for the interpreter: records what the rendered job handed it, then exits 0.
import json, os, sys
out = os.environ["JOBGEN_ECHO_DIR"]
with open(os.path.join(out, "rank-%s.json" % os.environ["SLURM_PROCID"]), "w") as fh:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}, fh)
"""


def test_adversarial_values_reach_the_job_intact_and_nothing_runs(jobgen, slurm_lab):
    """Acceptance: quotes, $(...), backticks, '; echo x', backslashes, globs in the job name, the
    paths, env values and an srun argument are submitted to the real cluster and arrive intact."""
    nasty = "it's \"q\" $(touch PWNED) `touch PWNED` '; touch PWNED; echo ' back\\slash * ${HOME}"
    echo_dir = jobgen.root / "echo"
    echo_dir.mkdir()
    wrapper = jobgen.root / "echo-python"
    wrapper.write_text(ECHO.format(python=sys.executable))
    wrapper.chmod(0o755)
    jobgen.profile(python=str(wrapper))
    profile = jobgen.root / "profiles" / "slurm-lab.yaml"
    profile.write_text(profile.read_text() + f"  extra_srun_args: [{json.dumps('--job-name=' + nasty)}]\n")
    env = {f"ODD_{i}": value for i, value in enumerate(ADVERSARIAL)} | {"JOBGEN_ECHO_DIR": str(echo_dir)}
    name = "job " + nasty
    spec = jobgen.root / "nasty.yaml"
    spec.write_text(json.dumps({"name": name, "env": env, "resources": {"nodes": 2}}))
    out_root = jobgen.root / f"out {nasty}"  # the job directory: backslashes and all
    # SLURM's output paths cannot carry a backslash (filename patterns): such a run dir is refused
    refused = jobgen("submit", str(spec), "--profile", "slurm-lab", "--profiles-dir", str(jobgen.root / "profiles"),
                     "--runs-dir", str(jobgen.root / "runs \\ x"), "--out", str(out_root), check=False)
    assert refused.returncode == 2 and "contains '\\\\'" in refused.stderr and "hint:" in refused.stderr, refused.stderr
    runs = jobgen.root / ("runs " + nasty.replace("\\", ""))  # the job name keeps its backslash
    run_name = run_dir_name(name)
    assert "\\" not in run_name and run_name != name
    handle = jobgen.submit(str(spec), "slurm-lab", "--runs-dir", str(runs), "--out", str(out_root))
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    assert final == "COMPLETED", (seen, jobgen("logs", "--rank", "all", handle).stdout)
    job_dir = out_root / "slurm-lab" / name
    for rank in (0, 1):
        got = json.loads((echo_dir / f"rank-{rank}.json").read_text())
        assert got["argv"] == ["-m", "jobgen.train", "--spec", f"{job_dir}/spec.json", "--run-dir", f"{runs}/{run_name}"]
        assert {k: got["env"][k] for k in env} == env
        assert got["env"]["SLURM_JOB_NAME"] == nasty, "the srun argument arrived changed"
    assert jobgen.status(handle)["details"]["name"] == name, "sbatch read the #SBATCH --job-name line differently"
    assert not list(jobgen.root.rglob("PWNED")) and not list(Path.cwd().glob("PWNED")), "a value was executed"
    assert not os.path.exists(os.path.join(os.path.expanduser("~"), "PWNED"))


def test_gitops_path_submits_a_rendered_directory_once(jobgen):
    """`jobgen render` then `jobgen submit <dir>` (what is committed is what runs): --test-only
    queues nothing; a second submit while the first is queued or running is refused."""
    jobgen.profile()
    # still starting or training when the second submit comes a few seconds later (start-up alone takes longer)
    spec = jobgen.spec("lab-gitops", max_steps=100, every=50)
    jobgen("render", spec, "--profile", "slurm-lab", "--profiles-dir", str(jobgen.root / "profiles"), "--out", "manifests")
    job_dir = jobgen.root / "manifests" / "slurm-lab" / "lab-gitops"
    preflight = jobgen("submit", str(job_dir), "--test-only")
    assert "nothing was queued" in preflight.stdout and "to start at" in preflight.stdout, preflight.stdout
    assert not (job_dir / ".jobgen-submission.json").exists()
    handle = jobgen("submit", str(job_dir)).stdout.split("submitted ", 1)[1].split()[0]
    again = jobgen("submit", str(job_dir), check=False)
    assert again.returncode == 1 and f"already submitted as {handle}" in again.stderr and "--force" in again.stderr
    final, seen = jobgen.wait_state(str(job_dir), {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert final == "COMPLETED", (seen, jobgen("logs", "--rank", "all", str(job_dir)).stdout[-3000:])
    assert "step 100/100" in jobgen("logs", str(job_dir)).stdout
