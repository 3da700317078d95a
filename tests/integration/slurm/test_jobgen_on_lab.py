"""jobgen against the real lab cluster: submit, status, logs, requeue-and-resume, cancel, quoting.

Each job is rendered from ``slurm-lab`` (a profile that extends the shipped ``slurm-cpu`` with
the lab's partition and interpreter) and submitted with the ``jobgen`` CLI, exactly as a user
would; the lab is the ``slurm_lab`` fixture (conftest.py). Wall times are printed (``-s``).

The two requeue tests (``scontrol requeue`` mid-run; the time-limit signal and jobgen's own
requeue) log to every tracker, ``trainer.loggers: [csv, wandb, mlflow]`` (W&B offline, MLflow on a
SQLite file in the test's directory, which both nodes see), and check what the trackers hold at
the end (:func:`check_trackers`), on the same jobs rather than on two more: SLURM's
SIGTERM on a requeue reaches every process of the step, W&B's ``wandb-core`` included, which is
what lost W&B's rows before each requeue.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from lab import PARTITION, release_requeued, run_slurm, wait_for

from jobgen.backends.slurm.script import run_dir_name
from tests.conftest import ADVERSARIAL, REPO, skip_or_fail
from tests.tracker_files import csv_rows, read_wandb_file

pytestmark = pytest.mark.slurm_lab

LAB_PROFILE = """\
# The project's lab cluster (tests/integration/slurm/lab.py): 2 CPU nodes of 1 CPU each (they
# share the machine's cores: one OpenMP thread per rank), partition lab.
extends: slurm-cpu
description: jobgen SLURM lab, 2 CPU nodes
cpus_per_node: 1
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


#: Longest wait between two `jobgen status` (or `jobgen logs`) calls of a polling loop, seconds.
STATUS_EVERY_S = 10.0
#: A fake W&B key: only ever in the environment of a tracked job's submit (its spec lists the name
#: in ``secrets``, so sbatch passes it to the job); no file may hold it.
FAKE_WANDB_KEY = "wk-lab-3e8a1c5f7b9d0246e8ac13579bdf02468ace1357"


class Jobgen:
    """Runs the jobgen CLI against the lab, with its own profiles, runs and state dirs."""

    def __init__(self, lab, root: Path):
        self.lab, self.root = lab, root
        self.env = {**lab.client_env(), "JOBGEN_STATE_DIR": str(root / "state"), "PYTHONPATH": str(REPO)}
        self.env.pop("JOBGEN_DEBUG", None)

    def __call__(self, *args: str, check: bool = True, timeout: float = 120,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``jobgen *args`` in the lab's environment, plus ``env``."""
        proc = subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=self.root, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"jobgen {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def profile(self, name: str = "slurm-lab", *, time_limit_min: int = 10, grace_s: int = 60, python: str = sys.executable) -> str:
        (self.root / "profiles").mkdir(exist_ok=True)
        text = LAB_PROFILE.format(python=json.dumps(python), time_limit_min=time_limit_min, grace_s=grace_s)
        (self.root / "profiles" / f"{name}.yaml").write_text(text)
        return name

    def spec(self, name: str, *, max_steps: int, every: int, trainer: dict[str, Any] | None = None) -> str:
        """Write the job's spec (SPEC), with ``trainer`` (e.g. :meth:`track`'s) merged into its
        trainer fields and, when it names wandb, ``secrets: [WANDB_API_KEY]``."""
        path = self.root / f"{name}.yaml"
        text = SPEC.format(name=name, max_steps=max_steps, every=every)
        if trainer:
            import yaml

            doc = yaml.safe_load(text)
            doc["trainer"].update(trainer)
            if "wandb" in trainer.get("loggers", ()):
                doc["secrets"] = ["WANDB_API_KEY"]
            text = json.dumps(doc)  # JSON is YAML
        path.write_text(text)
        return str(path)

    def track(self, experiment: str) -> dict[str, Any]:
        """Log to every tracker: the trainer fields for W&B offline and MLflow on a
        SQLite file under the test's directory (the lab's nodes share this machine's filesystem),
        MLflow experiment ``experiment``, a row every 5 steps. The submits get the fake key and no
        W&B or MLflow variable of the test's own environment; W&B's config, cache and data
        directories are under the test's directory (sbatch passes all of it to the job)."""
        if find_spec("wandb") is None or find_spec("mlflow") is None:
            skip_or_fail("the lab's requeue tests log to W&B and MLflow: pip install -e '.[tracking]'")
        for name in [k for k in self.env if k.startswith(("WANDB_", "MLFLOW_"))]:
            del self.env[name]
        self.env.update({"WANDB_SILENT": "true", "WANDB_API_KEY": FAKE_WANDB_KEY,
                         **{f"WANDB_{d}_DIR": str(self.root / "wandb-home" / d.lower()) for d in ("CONFIG", "CACHE", "DATA")}})
        return {"loggers": ["csv", "wandb", "mlflow"], "log_every_n_steps": 5,
                "wandb": {"mode": "offline", "project": "jobgen-lab"},
                "mlflow": {"tracking_uri": self.mlflow_uri, "experiment": experiment}}

    @property
    def mlflow_uri(self) -> str:
        """The MLflow tracking URI of :meth:`track` (absolute: ``sqlite:////...``)."""
        return f"sqlite:///{self.root / 'mlflow.db'}"

    def submit(self, spec: str, profile: str = "slurm-lab", *extra: str) -> str:
        out = self("submit", spec, "--profile", profile, "--profiles-dir", str(self.root / "profiles"), *extra).stdout
        return next(line.split()[1] for line in out.splitlines() if line.startswith("submitted "))

    def status(self, handle: str) -> dict:
        return json.loads(self("status", "--json", handle).stdout)

    def queue(self, handle: str) -> str:
        """What ``squeue -t all`` lists for the job (or array) of ``handle`` (a ``slurm://``
        handle): one ``<id> <state>`` line per job or task; a C client, ~10 ms."""
        jid = job_id(handle).split("_", 1)[0]
        return run_slurm(self.lab, "squeue", "-h", "-t", "all", "-j", jid, "-o", "%i %T", check=False, timeout=20).stdout

    def wait_status(self, handle: str, accept: Callable[[dict], Any], timeout: float, seen: list[str]) -> Any:
        """Wait until ``accept(<jobgen status --json>)`` is truthy and return that value, appending
        each new state to ``seen``. `jobgen status` (a Python process, ~0.3 s of CPU, which a
        polling loop would take from the job it waits on) runs when squeue's listing of the job
        changes, and at least every :data:`STATUS_EVERY_S`; squeue (~10 ms) is polled every 0.5 s
        in between. Raises TimeoutError."""
        slurm_handle = handle if handle.startswith("slurm://") else self.status(handle)["handle"]
        last: dict[str, Any] = {"queue": None, "at": 0.0}

        def reached() -> Any:
            queue = self.queue(slurm_handle)
            if queue == last["queue"] and time.monotonic() - last["at"] < STATUS_EVERY_S:
                return None
            last.update(queue=queue, at=time.monotonic())
            status = self.status(handle)
            if not seen or seen[-1] != status["state"]:
                seen.append(status["state"])
            return accept(status)

        return wait_for(reached, timeout, 0.5)

    def wait_state(self, handle: str, states: set[str], timeout: float) -> tuple[str, list[str]]:
        """Wait (:meth:`wait_status`) until `jobgen status` reports a state in ``states``;
        returns it and every state seen."""
        seen: list[str] = []
        try:
            return self.wait_status(handle, lambda st: st["state"] if st["state"] in states else "", timeout, seen), seen
        except TimeoutError:
            raise TimeoutError(f"{handle} not in {sorted(states)} after {timeout:g} s; states seen: {seen}") from None

    def wait_log(self, handle: str, text: str, timeout: float) -> str:
        """Wait until ``text`` is in rank zero's log as `jobgen logs` prints it; returns that log.
        The job's output files (``slurm-<jobid>*.out`` under the test's directory) are watched
        until they hold ``text``; only then, and every :data:`STATUS_EVERY_S`, runs `jobgen logs`."""
        jid = job_id(handle).split("_", 1)[0]
        last = {"at": 0.0}

        def found() -> str:
            in_files = any(text in p.read_text(errors="replace") for p in self.root.rglob(f"slurm-{jid}*.out"))
            if not in_files and time.monotonic() - last["at"] < STATUS_EVERY_S:
                return ""
            last["at"] = time.monotonic()
            log = self("logs", handle).stdout
            return log if text in log else ""

        return wait_for(found, timeout, 0.5, what=f"{text!r} in the log of {handle}")


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


def _requeue_now(lab, jid: str, *updates: str) -> None:
    """A requeued job is held ~120 s (BeginTime); docs/labs.md, pitfall 9: once it is back in the
    queue, release it now (with ``updates``, e.g. ``TimeLimit=30``, in the same ``scontrol update``)."""
    def pending() -> bool:
        return run_slurm(lab, "squeue", "-h", "-j", jid, "-o", "%T", check=False).stdout.strip() == "PENDING"

    wait_for(pending, 60, 0.5, what=f"job {jid} back in the queue")
    release_requeued(lab, jid, *updates, requeued_at=time.time())  # requeued by now


def _wait_for_checkpoint(run: Path, timeout: float) -> Path:
    return wait_for(lambda: sorted((run / "checkpoints").glob("step-*")), timeout, 0.5, what=f"a step checkpoint in {run}")[0]


def _listed(steps: Any) -> str:
    """Steps as short text: each run of steps 5 apart (:meth:`Jobgen.track` logs every 5) as ``a-b``."""
    runs: list[list[int]] = []
    for step in sorted(steps):
        if runs and step - runs[-1][-1] == 5:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


def _compare(what: str, got: list[int], expected: list[int]) -> list[str]:
    """``got`` (steps in a tracker) against ``expected`` (metrics.csv's): what is missing, twice, extra."""
    if got == expected:
        return []
    twice = sorted(step for step, n in Counter(got).items() if n > 1)
    return [f"{what}: missing {_listed(set(expected) - set(got))}; twice {_listed(twice)}; "
            f"not in metrics.csv {_listed(set(got) - set(expected))} (metrics.csv {len(expected)} steps, {what} {len(got)})"]


def check_trackers(jg: Jobgen, run: Path, experiment: str, resumed: int, log: str) -> dict[str, Any]:
    """What the trackers hold after a tracked job (:meth:`Jobgen.track`) that SLURM ran twice,
    the second run resumed from a checkpoint of step ``resumed``. ``log`` is every
    rank's log (``jobgen logs --rank all``). Returns the figures the test prints.

    Asserted, every discrepancy listed in one message: W&B (its offline files, one per start,
    read with wandb's own reader) and MLflow (its client's metric history) hold every step of
    metrics.csv (training or validation row; each step from the newest metrics.csv version that
    has it) exactly once, with metrics.csv's values, the steps up to ``resumed`` (what the first
    run logged) included; one W&B run id (the run key) in every piece, one MLflow run in the
    experiment, FINISHED; ``.jobgen-tracking.json`` records the last step as confirmed by both;
    only global rank zero started trackers; the fake key is in no file of the test's directory.
    """
    from mlflow.tracking import MlflowClient

    record = json.loads((run / ".jobgen-tracking.json").read_text())
    key, run_id = record["run_key"], record["mlflow_run_id"]
    rows = csv_rows(run)
    logged = [step for step, row in rows.items() if {"train_loss", "val_loss"} & set(row)]
    problems: list[str] = []
    if not logged or logged[-1] != max(rows) or not any(step <= resumed for step in logged):
        problems.append(f"metrics.csv: steps {_listed(logged)}, resumed from {resumed}")

    pieces = sorted((run / "wandb").glob("offline-run-*"))
    if [p.name.rsplit("-", 1)[1] for p in pieces] != [key, key]:
        problems.append(f"W&B: pieces {[p.name for p in pieces]}, expected two of run {key}")
    files = [read_wandb_file(p / f"run-{key}.wandb", jg.env) for p in pieces]
    if any(f.run_ids != [key] for f in files):
        problems.append(f"W&B: run ids {[f.run_ids for f in files]}, expected {key} once in each piece")
    history = [row for f in files for row in f.history]
    problems += _compare("W&B", [step for step, _ in history], logged)
    for step, metrics in history:
        for name in ("train_loss", "val_loss"):
            if name in metrics and step in rows and metrics[name] != pytest.approx(rows[step].get(name, math.nan), rel=1e-6):
                problems.append(f"W&B: {name} at step {step} is {metrics[name]}, metrics.csv {rows[step].get(name)}")

    client = MlflowClient(tracking_uri=jg.mlflow_uri)
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    if [(r.info.run_id, r.info.status) for r in found] != [(run_id, "FINISHED")]:
        problems.append(f"MLflow: runs {[(r.info.run_id, r.info.status) for r in found]}, expected {run_id} FINISHED")
    mlflow_steps: dict[str, list[int]] = {}
    for name in ("train_loss", "val_loss"):
        metrics = client.get_metric_history(run_id, name)
        mlflow_steps[name] = sorted(m.step for m in metrics)
        problems += _compare(f"MLflow {name}", mlflow_steps[name], [s for s in logged if name in rows[s]])
        problems += [f"MLflow: {name} at step {m.step} is {m.value}, metrics.csv {rows[m.step].get(name)}"
                     for m in metrics if m.step in rows and m.value != pytest.approx(rows[m.step].get(name, math.nan), rel=1e-6)]

    last = logged[-1] if logged else None
    if record.get("logged_steps") != {"wandb": last, "mlflow": last}:
        problems.append(f".jobgen-tracking.json: logged_steps {record.get('logged_steps')}, expected {last} for both")
    starts = [line for line in log.splitlines() if "tracking: wandb run" in line]
    if len(starts) != 2 or not all(line.lstrip().startswith("0:") for line in starts):
        problems.append(f"the W&B runs were not started once per start, by global rank zero: {starts}")
    files_seen = [p for p in jg.root.rglob("*") if p.is_file()]
    leaked = [str(p) for p in files_seen if FAKE_WANDB_KEY.encode() in p.read_bytes()]
    if leaked:
        problems.append(f"the fake key's value is in {leaked}")

    first = files[0].steps if files else []
    figures = {"metrics.csv": f"{len(logged)} steps ({_listed(logged)})", "resumed": resumed,
               "W&B first piece": f"{_listed(first)} (complete file: {files[0].complete if files else None})",
               "W&B second piece": _listed(files[1].steps) if len(files) > 1 else None,
               "sent again": [line.split("tracking: ", 1)[1] for line in log.splitlines() if "sent again" in line],
               "MLflow train_loss": _listed(mlflow_steps["train_loss"]), "MLflow val_loss": _listed(mlflow_steps["val_loss"]),
               "files without the key": len(files_seen)}
    print(f"\ntrackers: {json.dumps(figures)}")
    assert not problems, "\n".join(problems)
    return figures


def test_two_node_job_trains_requeued_past_a_checkpoint_resumes_and_completes(jobgen, slurm_lab):
    """Acceptance: 2 nodes x 1 rank (gloo), real text; `scontrol requeue` past the first
    checkpoint -> the job runs again, continues its global step and ends COMPLETED, val loss
    falls, checkpoints left, status and logs right (while it runs: its progress, ETA and CPU-hours
    so far). (One job for what two tests checked with a job each: the plain run to COMPLETED and
    the requeue; un-requeued 2-node jobs run to COMPLETED in the gitops, preflight, ls and
    command-mode tests.)

    The requeue comes within a second of the step-25 checkpoint, and the first run would need
    another 275 steps (~9 s at ~30 steps/s, the fastest seen here) to finish on its own, so it is
    the requeued run that completes, resumed from a step checkpoint.

    With W&B (offline) and MLflow: SLURM's SIGTERM reaches W&B's ``wandb-core`` a
    second or two after the checkpoint's rows were sent (seen: W&B's first piece without them);
    at the end both trackers hold every metrics.csv step once, those of the first run included
    (:func:`check_trackers`).
    """
    jobgen.profile()
    started = time.monotonic()
    handle = jobgen.submit(jobgen.spec("lab-requeue", max_steps=300, every=25, trainer=jobgen.track("lab-requeue")))
    assert handle.startswith("slurm://jobgenlab/")
    run = run_dir(jobgen, "lab-requeue")
    _wait_for_checkpoint(run, 600)
    checkpointed = time.monotonic() - started
    running = jobgen.status(handle)
    assert running["state"] == "RUNNING"
    # a running job's progress from metrics.csv (a row every 5 steps): the step of max_steps, tokens/s and the ETA at
    # that rate for 8 x 64 tokens x 2 ranks a step; its CPU-hours so far from squeue (to now; a CPU job has no price)
    progress, usage = running["progress"], running["usage"]
    assert 20 <= progress["step"] < 300 and progress["max_steps"] == 300 and progress["tokens_per_step"] == 8 * 64 * 2, progress
    assert progress["tokens_per_s"] > 0 and progress["source"] == str(run / "logs" / "version_0" / "metrics.csv"), progress
    assert progress["eta_s"] == pytest.approx((300 - progress["step"]) * 8 * 64 * 2 / progress["tokens_per_s"], abs=0.1), progress
    assert (usage["device_kind"], usage["devices"], usage["end"]) == ("cpu", 2, None) and usage["cpu_hours"] > 0, usage
    assert usage["cost"] is None and usage["source"] == "squeue tres_alloc_str", usage
    run_slurm(slurm_lab, "scontrol", "requeue", job_id(handle))
    _requeue_now(slurm_lab, job_id(handle))
    released = time.monotonic() - started
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=900)
    log = jobgen("logs", handle).stdout
    assert final == "COMPLETED", f"{seen}\n{jobgen('logs', '--rank', 'all', handle).stdout[-4000:]}"
    assert "restart 1" in log, log
    # rank zero's progress, without the srun --label prefix; rank 1's lines are filtered out
    assert "jobgen: job " in log and "on 2 node(s)" in log
    assert any(line.startswith("step 300/300") or line.startswith("done: lab-requeue at step 300/300") for line in log.splitlines()), log
    everything = jobgen("logs", "--rank", "all", handle).stdout
    assert "1: " in everything and "0: " in everything
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 300 and summary["world_size"] == 2
    assert summary["resumed_from_step"] and 25 <= summary["resumed_from_step"] < 300, summary
    assert "resuming from" in log
    record_step_rate(summary)
    losses = val_losses(run)  # both runs' metrics files
    assert losses and summary["val_loss"] < losses[0][1] < math.log(256), (losses, summary["val_loss"])
    assert (run / "checkpoints" / "last.ckpt").exists() and list((run / "checkpoints").glob("step-*"))
    # status after the job: sacct (accounting or the job-completion log), not a guess
    final_status = jobgen.status(handle)
    assert final_status["state"] == "COMPLETED" and final_status["source"] in {"squeue", "sacct", "jobcomp"}
    # progress from the run's metrics.csv (the lab's nodes share this machine's filesystem): the resumed version's last row
    progress = final_status["progress"]
    assert (progress["step"], progress["max_steps"], progress["eta_s"]) == (300, 300, 0.0), progress
    assert progress["tokens_per_s"] > 0 and progress["source"].startswith(str(run / "logs" / "version_")), progress
    # the job directory is a handle too
    job_dir = jobgen.root / "runs" / "lab-requeue" / "job"  # submit without --out: the job dir goes with the run
    assert jobgen.status(str(job_dir))["handle"] == handle
    assert summary["tracking"]["run_key"] == summary["tracking"]["wandb"]["id"]
    check_trackers(jobgen, run, "lab-requeue", summary["resumed_from_step"], everything)
    print(f"\nrequeue job: first checkpoint {checkpointed:.0f} s, requeued and released {released:.0f} s, "
          f"COMPLETED {time.monotonic() - started:.0f} s after submit (resumed from step {summary['resumed_from_step']}); "
          f"states {seen}")


#: --signal=B:USR2@GRACE_S; the test cuts the time limit so that 90-150 s remain (see below).
GRACE_S = 150
#: The time-limit job's max_steps where this session has measured no step rate yet: above the
#: steps the first run makes in the ~30 s between the cut and the signal at ~30 steps/s, the
#: fastest this lab has trained (an idle 2-core machine).
TIME_LIMIT_STEPS = 2000
#: Steps per second of 2-node lab jobs in this session (``record_step_rate``): the time-limit job
#: is sized from them.
STEP_RATES: list[float] = []


def record_step_rate(summary: dict) -> None:
    """Keep a finished 2-node lab job's training rate (summary.json: tokens/s over tokens/step)."""
    if summary.get("tokens_per_s_mean") and summary.get("tokens_per_step"):
        STEP_RATES.append(summary["tokens_per_s_mean"] / summary["tokens_per_step"])


def time_limit_steps() -> int:
    """max_steps of the time-limit job: what the first run could make from step 10 through the
    ~30 s until the signal (40 s allowed) at 3x the fastest rate this session's earlier 2-node
    jobs trained at, within [200, :data:`TIME_LIMIT_STEPS`]; :data:`TIME_LIMIT_STEPS` when none
    ran. The second run trains the rest, so the test's length follows the machine's speed (at
    ~8 steps/s, a loaded 2-core CI machine, ~970 steps instead of 2000)."""
    if not STEP_RATES:
        return TIME_LIMIT_STEPS
    return max(200, min(TIME_LIMIT_STEPS, 10 + math.ceil(3 * max(STEP_RATES) * 40)))


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
    stops short of max_steps (:func:`time_limit_steps`: sized from the step rate of the session's
    earlier lab jobs, which it asserts the first run kept under). Once the job is back in the
    queue the test gives the next run a 30-minute limit and releases it from SLURM's ~120 s
    requeue hold (docs/labs.md, pitfall 9).

    With W&B (offline) and MLflow: jobgen ends the trackers' runs after the HPC
    checkpoint and before its ``scontrol requeue``, so the first run's W&B file is whole and holds
    every step before the checkpoint's; that step's own row reaches the trackers from metrics.csv
    at the next start; at the end both trackers hold every metrics.csv step once
    (:func:`check_trackers`).
    """
    jobgen.profile(time_limit_min=10, grace_s=GRACE_S)
    started = time.monotonic()
    max_steps = time_limit_steps()
    trainer = jobgen.track("lab-timelimit")
    handle = jobgen.submit(jobgen.spec("lab-timelimit", max_steps=max_steps, every=max_steps // 2, trainer=trainer))
    run, jid = run_dir(jobgen, "lab-timelimit"), job_id(handle)
    jobgen.wait_log(handle, "step 10/", 600)
    ran = _run_time_s(slurm_lab, jid)
    limit_min = math.ceil((ran + 90) / 60)
    run_slurm(slurm_lab, "scontrol", "update", f"JobId={jid}", f"TimeLimit={limit_min}")
    cut = time.monotonic()
    wait_for(lambda: list((run / "checkpoints").glob("hpc_ckpt_*.ckpt")), 300, 1.0, what="the HPC checkpoint the signal triggers")
    signalled = time.monotonic() - cut

    seen: list[str] = []

    def requeued(st: dict) -> dict | None:
        state = f"{st['state']} (restarts {st['details'].get('restarts')!r})"
        if not seen or seen[-1] != state:
            seen.append(state)
        restarted = st["details"].get("restarts") not in (None, "", "0")
        assert restarted or st["state"] != "COMPLETED", (
            f"the first run reached max_steps {max_steps} before the signal: this machine trains faster than "
            f"3x the rates seen earlier ({STEP_RATES} steps/s); states {seen}")
        return st if restarted else None

    try:
        jobgen.wait_status(handle, requeued, 120, [])
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
    assert summary["global_step"] == max_steps and 0 < summary["resumed_from_step"] < max_steps, summary
    resumed = summary["resumed_from_step"]
    figures = check_trackers(jobgen, run, "lab-timelimit", resumed, jobgen("logs", "--rank", "all", handle).stdout)
    # jobgen ended the trackers' runs after the HPC checkpoint, before its requeue: the first W&B
    # piece is whole and holds every step before the checkpoint's. The checkpoint step's own row
    # comes after (Lightning logs a stopping run's last step after the callbacks): each tracker
    # gets it from metrics.csv at the next start, and nothing else is sent again.
    first = read_wandb_file(sorted((run / "wandb").glob("offline-run-*"))[0] / f"run-{summary['tracking']['run_key']}.wandb", jobgen.env)
    before = [step for step, row in csv_rows(run).items() if step <= resumed and {"train_loss", "val_loss"} & set(row)]
    assert first.complete and first.steps == [step for step in before if step < resumed], (figures, before)
    again = [f"{name}: sent again 1 step(s) {resumed}-{resumed} " for name in ("wandb", "mlflow")] if resumed in before else []
    sent = figures["sent again"]
    assert len(sent) == len(again) and all(line.startswith(start) for line, start in zip(sent, again, strict=True)), sent
    print(f"\ntime-limit job: limit cut to {limit_min} min at run time {ran} s; signal + HPC checkpoint "
          f"{signalled:.0f} s after the cut, released {released:.0f} s after it; {resumes[0]}; "
          f"COMPLETED at step {max_steps} (rates seen {[round(r, 1) for r in STEP_RATES]} steps/s) "
          f"{time.monotonic() - started:.0f} s after submit")


def test_cancel_leaves_no_process_on_any_node(jobgen, slurm_lab):
    jobgen.profile()
    handle = jobgen.submit(jobgen.spec("lab-cancel", max_steps=100000, every=1000))
    jobgen.wait_log(handle, "step 10/", 180)
    assert any(slurm_lab.node_pids()[node] for node in ("node1", "node2"))
    out = jobgen("cancel", handle).stdout
    assert "CANCELLED" in out
    # scancel has returned and squeue says CANCELLED; give PID 1 a moment to reap, then nothing may be left
    wait_for(lambda: not any(slurm_lab.node_pids().values()), 30, 0.5, what=f"no job process on any node ({slurm_lab.node_pids()})")
    # `jobgen status` and `jobgen ls` (--state) say CANCELLED too
    assert jobgen.status(handle)["state"] == "CANCELLED"
    listed = {row["handle"]: row["state"] for row in json.loads(jobgen("ls", "--state", "cancelled", "-o", "json").stdout)}
    assert listed == {handle: "CANCELLED"}, listed


def test_an_input_error_fails_the_job_naming_the_users_spec_file(jobgen):
    """The bundled entrypoint refuses data that matches nothing on both
    nodes: the job is FAILED with a non-zero exit code (srun's: the highest of its tasks', 2, or
    128 + 15 when it stopped the other rank with SIGTERM first, srun(1) "RETURN VALUE"), `ls
    --state FAILED` lists it, and the error names the spec file `jobgen submit` read and the
    field as written there, not spec.json. With a restart budget of 3 the batch script classes it
    a user failure (its task's exit code 2 decides over srun's kill of the other task) and the
    job ends after one run with that code, never requeued."""
    jobgen.profile()
    spec = Path(jobgen.spec("lab-bad-data", max_steps=10, every=5))
    spec.write_text(spec.read_text().replace("data: {max_bytes: 1000000}", "data: {paths: [no-such-dir/*.txt]}"))
    handle = jobgen.submit(str(spec), "slurm-lab", "--set", "restart.max_restarts=3")
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=180)
    log = jobgen("logs", "--rank", "all", handle).stdout
    assert final == "FAILED", (seen, log[-3000:])
    details = jobgen.status(handle)["details"]
    assert details.get("exit_code") == "2:0" and details.get("restarts") in (None, "", "0"), details
    assert "jobgen: no restart after user failure (exit 2 on node" in log and "jobgen: restart " not in log, log[-3000:]
    assert f"python -m jobgen.train: error: {spec.resolve()}: data.paths[0]: 'no-such-dir/*.txt' matches no files" in log, log[-3000:]
    listed = {row["handle"]: row["state"] for row in json.loads(jobgen("ls", "--state", "FAILED", "-o", "json").stdout)}
    assert listed == {handle: "FAILED"}, listed


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
    spec = jobgen.spec("lab-gitops", max_steps=20, every=10)
    jobgen("render", spec, "--profile", "slurm-lab", "--profiles-dir", str(jobgen.root / "profiles"), "--out", "manifests")
    job_dir = jobgen.root / "manifests" / "slurm-lab" / "lab-gitops"
    preflight = jobgen("submit", str(job_dir), "--test-only")
    assert "nothing was queued" in preflight.stdout and "to start at" in preflight.stdout, preflight.stdout
    assert not (job_dir / ".jobgen-submission.json").exists()
    # The lab's partition is down while both submits run: SLURM queues the job but starts nothing
    # (reason PartitionDown), so it is still queued at the second submit however slowly that runs
    # on a loaded machine. (sbatch 22.05 reads no SBATCH_HOLD, and the lab's backfill scheduler can
    # start a job within a second of its submit.)
    run_slurm(jobgen.lab, "scontrol", "update", f"PartitionName={PARTITION}", "State=DOWN")
    try:
        handle = jobgen("submit", str(job_dir)).stdout.split("submitted ", 1)[1].split()[0]
        again = jobgen("submit", str(job_dir), check=False)
        assert again.returncode == 1 and f"already submitted as {handle}" in again.stderr and "--force" in again.stderr
        reason = run_slurm(jobgen.lab, "squeue", "-h", "-j", job_id(handle), "-o", "%i %T %r", timeout=20).stdout.split()
        assert reason == [job_id(handle), "PENDING", "PartitionDown"], reason
    finally:
        run_slurm(jobgen.lab, "scontrol", "update", f"PartitionName={PARTITION}", "State=UP")
    final, seen = jobgen.wait_state(str(job_dir), {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    assert final == "COMPLETED", (seen, jobgen("logs", "--rank", "all", str(job_dir)).stdout[-3000:])
    assert "step 20/20" in jobgen("logs", str(job_dir)).stdout
