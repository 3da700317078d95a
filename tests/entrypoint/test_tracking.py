"""Experiment trackers that survive a stop: real ``wandb`` (offline) and real MLflow
(a SQLite store), no network, no W&B login. A fake ``WANDB_API_KEY`` lives only in the test's
environment (the spec lists its name in ``secrets``).

- A local 2-rank job (``jobgen submit --profile local``) with ``trainer.loggers: [wandb, mlflow]``
  is stopped with Ctrl-C after a checkpoint and submitted again: one W&B run id (both offline
  pieces carry it), one MLflow run (KILLED after the stop, FINISHED at the end), each metric's
  steps strictly increasing, without a gap or a repeat, across the checkpoint step; rank 1 starts
  no tracker; no file under the run directory (which is the local job directory) or anywhere in
  the test's directory holds the key.
- A SLURM requeue (the srun-style launch of test_entrypoint_requeue.py, 1 rank) marks the MLflow
  run KILLED, with no metric past the requeue checkpoint; an exception marks it FAILED.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ctrl_c_reaches_it
from tests.entrypoint.conftest import REPO, TINY_SPEC, child_env, resolved_doc
from tests.tracker_files import csv_steps

pytest.importorskip("wandb", reason="wandb not installed (pip install -e .[tracking])")
pytest.importorskip("mlflow", reason="mlflow not installed (pip install -e .[tracking])")

# Imported here, at collection, not in the first poll of a running job: importing Lightning beside
# two training ranks took longer than the whole 60-step run twice in full suites (the Ctrl-C then
# came after the run had completed).
from jobgen.train.checkpoints import newest_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

TIMEOUT_S = 300
KEY = "wk-5f1c0a9e7d3b2468ace0fdb97531eca86420fdb9"  # fake; only ever in the test's environment


def tracker_env(tmp_path: Path) -> dict[str, str]:
    """The subprocess environment: W&B quiet, offline-capable, writing nothing outside tmp_path."""
    env = child_env()
    # no WANDB_DIR: the offline pieces go to <run_dir>/wandb (WANDB_DIR, set, would take them)
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                 "WANDB_API_KEY"):
        env.pop(name, None)
    env.update({"WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
                "JOBGEN_STATE_DIR": str(tmp_path / "state"), "WANDB_API_KEY": KEY})
    return env


def wandb_steps(path: Path) -> list[int]:
    """The history steps in an offline W&B run file (``run-<id>.wandb``), in file order."""
    return [step for step, _ in wandb_history(path)]


def wandb_history(path: Path) -> list[tuple[int, dict[str, float]]]:
    """The history rows (step, the row's own metrics: W&B's ``_step``, ``_runtime``, ... left out) in
    an offline W&B run file (``run-<id>.wandb``), in file order: W&B's datastore format,
    LevelDB's log format after a 7-byte ``:W&B`` header (32 KiB blocks; each record a 7-byte header
    (crc32c, length, type: full 1, first 2, middle 3, last 4) and data), each record a
    ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:8]
    pos, pending = 7, b""
    steps: list[tuple[int, dict[str, float]]] = []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                steps.append((record.history.step.num, {k: v for k, v in items.items() if not k.startswith("_")}))
    return steps


def mlflow_client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def metric_steps(client: Any, run_id: str) -> dict[str, list[int]]:
    """Every metric of the run: its logged steps, in the order MLflow returns them (logging order)."""
    run = client.get_run(run_id)
    return {key: [m.step for m in client.get_metric_history(run_id, key)] for key in sorted(run.data.metrics)}


def _newest_step(run_dir: Path) -> int | None:
    found = newest_checkpoint(run_dir / "checkpoints")
    return None if found is None else found.global_step


def test_local_job_stopped_and_resubmitted_keeps_one_run_per_tracker(tmp_path: Path) -> None:
    db = tmp_path / "mlflow" / "mlflow.db"
    db.parent.mkdir()
    uri = f"sqlite:///{db}"
    trainer = {**TINY_SPEC["trainer"], "max_steps": 60, "log_every_n_steps": 2, "val_check_interval": 25,
               "limit_val_batches": 2, "loggers": ["wandb", "mlflow"],
               "wandb": {"mode": "offline", "project": "jobgen-test", "tags": ["issue-19"]},
               "mlflow": {"tracking_uri": uri, "experiment": "jobgen-test"}}
    spec = {**TINY_SPEC, "name": "tracked", "trainer": trainer, "checkpoint": {"every_n_steps": 10, "keep_last_k": 2},
            "secrets": ["WANDB_API_KEY"], "resources": {"devices_per_node": 2}}
    spec_file = tmp_path / "tracked.yaml"
    spec_file.write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "jobgen.cli", "submit", str(spec_file), "--profile", "local", "--runs-dir", str(tmp_path / "runs")]
    env = tracker_env(tmp_path)
    run_dir = (tmp_path / "runs" / "tracked").resolve()

    # First submit, stopped with Ctrl-C (SIGINT to jobgen, which stops torchrun's process group) after a checkpoint.
    with open(tmp_path / "first.txt", "w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=ctrl_c_reaches_it)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while (_newest_step(run_dir) or 0) < 10:
            assert proc.poll() is None, (tmp_path / "first.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    first_log = (run_dir / "output.log").read_text()
    assert proc.returncode != 0 and not (run_dir / "summary.json").exists(), first_log[-3000:]
    stopped_at = _newest_step(run_dir)
    assert stopped_at is not None and 10 <= stopped_at < 60, stopped_at
    record = json.loads((run_dir / ".jobgen-tracking.json").read_text())
    key, run_id = record["run_key"], record["mlflow_run_id"]
    client = mlflow_client(uri)
    assert client.get_run(run_id).info.status == "KILLED", first_log[-3000:]
    before = metric_steps(client, run_id)
    assert before["train_loss"] == list(range(2, stopped_at + 1, 2)), (before, stopped_at)  # nothing past the checkpoint

    # Submitted again: resumes from that checkpoint into the same runs.
    again = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    log = (run_dir / "output.log").read_text()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] == stopped_at and summary["global_step"] == 60
    assert json.loads((run_dir / ".jobgen-tracking.json").read_text())["run_key"] == key

    # W&B: one run id, one offline piece per start, steps continuing across the pieces.
    pieces = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert [p.name.rsplit("-", 1)[1] for p in pieces] == [key, key], pieces
    first, second = (wandb_steps(p / f"run-{key}.wandb") for p in pieces)
    assert first and max(first) <= stopped_at < min(second), (first, second)
    assert first + second == sorted({*range(2, 61, 2), 25, 50})  # training and validation rows
    assert summary["tracking"]["wandb"] == {
        "id": key, "mode": "offline", "project": "jobgen-test", "entity": None, "url": None, "dir": str(pieces[1]),
        "sync": f"wandb sync {run_dir}/wandb/offline-run-*-{key}"}

    # MLflow: one run, finished, every metric's steps strictly increasing with none missing or repeated.
    runs = client.search_runs([client.get_experiment_by_name("jobgen-test").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    steps = metric_steps(client, run_id)
    for name, series in steps.items():
        assert series == sorted(set(series)), (name, series)
    assert steps["train_loss"] == steps["tokens_per_s"] == list(range(2, 61, 2))
    assert steps["val_loss"] == [25, 50, 60]  # 60: the final validation
    tags, params = runs[0].data.tags, runs[0].data.params
    assert tags["jobgen.run_key"] == key and tags["jobgen.job"] == "tracked" and tags["jobgen.handle"] == f"local://{run_dir}"
    assert tags["jobgen.resumed_from_step"] == str(stopped_at) and tags["jobgen.nodes"]
    assert params["spec.trainer.max_steps"] == "60" and params["spec.secrets"] == '["WANDB_API_KEY"]'
    assert summary["tracking"]["mlflow"] == {"run_id": run_id, "experiment_id": runs[0].info.experiment_id,
                                             "tracking_uri": uri, "url": None}

    # Only global rank zero tracked: its lines say so, rank 1's never; two starts, two pieces, one run.
    assert log.count("[default0]:tracking: wandb run") == 2 and "[default1]:tracking:" not in log, log[-3000:]
    # The key: in the environment only, in no file of the run (= job) directory or the test's directory.
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaked, f"the key's value was written into {leaked}"
    assert "WANDB_API_KEY" in (run_dir / "spec.json").read_text()  # the name, by reference


def _srun_start(tmp_path: Path, spec: Path, run_dir: Path, scontrol: str | None = None) -> subprocess.Popen[bytes]:
    from tests.entrypoint.test_entrypoint_requeue import _srun_env
    from tests.ports import next_port

    env = _srun_env(tmp_path, 0, 1, next_port(), 0) | {k: v for k, v in tracker_env(tmp_path).items() if k.startswith("WANDB_")}
    if scontrol is not None:
        (tmp_path / "bin" / "scontrol").write_text(scontrol)
    with open(tmp_path / "out-0.txt", "w") as out:
        return subprocess.Popen([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(run_dir)],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _mlflow_only_spec(tmp_path: Path, uri: str, **launch: Any) -> Path:
    return _tracked_spec(tmp_path, {"loggers": ["mlflow"], "mlflow": {"tracking_uri": uri}}, **launch)


def _tracked_spec(tmp_path: Path, trackers: dict[str, Any], **launch: Any) -> Path:
    spec = {**TINY_SPEC, "trainer": {**TINY_SPEC["trainer"], "max_steps": 400, "val_check_interval": 1000, **trackers}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(resolved_doc(spec, **({"num_nodes": 1, "devices_per_node": 1, "world_size": 1} | launch))))
    return path


#: ``scontrol requeue`` as SLURM carries it out: accepted, then slurmstepd sends SIGTERM to every
#: process of the step at once: the rank and the ``wandb-core`` it started (its child, in a session
#: of its own, which a Ctrl-C never reaches).
SLURMSTEPD_SCONTROL = """#!/bin/sh
echo "$@" >> "$FAKE_SCONTROL_LOG"
for pid in $(pgrep -P "$PPID"); do
    if [ "$(cat /proc/$pid/comm 2>/dev/null)" = wandb-core ]; then kill -TERM "$pid"; echo "TERM wandb-core" >> "$FAKE_SCONTROL_LOG"; fi
done
kill -TERM "$PPID"
exit 0
"""


def test_a_slurm_requeue_keeps_every_step_once_in_wandb_and_mlflow_though_wandb_core_is_sigtermed(tmp_path: Path) -> None:
    """jobgen's own requeue (USR2, the time-limit path) with slurmstepd's SIGTERM to wandb-core:
    the trackers end their runs before ``scontrol requeue``; the resumed start sends
    from metrics.csv what they lack (the requeue step's row, logged after the requeue); every step
    of metrics.csv once in each tracker, one W&B id, one MLflow run."""
    from tests.entrypoint.test_entrypoint_requeue import _kill, _wait, _wait_for_step

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = _tracked_spec(tmp_path, {"max_steps": 60, "loggers": ["wandb", "mlflow"], "mlflow": {"tracking_uri": uri},
                                    "wandb": {"mode": "offline", "project": "jobgen-test"}},
                         scheduler="slurm", requeue_signal="USR2", cluster="lab")
    run_dir = tmp_path / "run"
    proc = _srun_start(tmp_path, spec, run_dir, scontrol=SLURMSTEPD_SCONTROL)
    procs = [(proc, tmp_path / "out-0.txt")]
    try:
        _wait_for_step(procs[0][1], 20, procs)
        os.kill(proc.pid, signal.SIGUSR2)
        _wait(procs, TIMEOUT_S)
    finally:
        _kill(procs)
    first = procs[0][1].read_text()
    assert "requeue: scontrol requeue 4242 done" in first, first[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\nTERM wandb-core\n", first[-3000:]
    step = _newest_step(run_dir)
    assert step is not None and 20 <= step < 60 and not (run_dir / "summary.json").exists(), (step, first[-3000:])
    record = json.loads((run_dir / ".jobgen-tracking.json").read_text())
    key, client = record["run_key"], mlflow_client(uri)
    assert client.get_run(record["mlflow_run_id"]).info.status == "KILLED"
    (piece,) = (run_dir / "wandb").glob(f"offline-run-*-{key}")
    kept = wandb_steps(piece / f"run-{key}.wandb")
    # ended before the requeue: W&B wrote all it got, and the record says so
    assert record["logged_steps"]["wandb"] == max(kept) and kept == csv_steps(run_dir, "train_loss")[:len(kept)], (record, kept)

    again = _srun_start(tmp_path, spec, run_dir)  # SLURM starts the job again
    procs = [(again, tmp_path / "out-0.txt")]
    try:
        assert _wait(procs, TIMEOUT_S) == [0], procs[0][1].read_text()[-3000:]
    finally:
        _kill(procs)
    trained = csv_steps(run_dir, "train_loss")
    assert trained[-1] == 60 and step in trained, trained
    pieces = sorted((run_dir / "wandb").glob(f"offline-run-*-{key}"))
    assert len(pieces) == 2, pieces
    rows = [row for p in pieces for row in wandb_history(p / f"run-{key}.wandb")]
    assert [s for s, _ in rows] == sorted({*trained, *csv_steps(run_dir, "val_loss")}), rows  # once each, in order
    assert [s for s, m in rows if "train_loss" in m] == trained
    runs = client.search_runs([client.get_run(record["mlflow_run_id"]).info.experiment_id])
    assert [r.info.run_id for r in runs] == [record["mlflow_run_id"]] and runs[0].info.status == "FINISHED"
    steps = metric_steps(client, record["mlflow_run_id"])
    assert steps["train_loss"] == trained and steps["val_loss"] == csv_steps(run_dir, "val_loss"), steps


def test_metrics_csv_steps_are_the_trackers_steps(tmp_path: Path) -> None:
    """metrics.csv's step column is the optimizer step, as the trackers', checkpoints' and
    progress lines' (it was once one below, Lightning's count of steps before the row)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = _tracked_spec(tmp_path, {"max_steps": 20, "val_check_interval": 10, "loggers": ["mlflow"],
                                    "mlflow": {"tracking_uri": uri}})
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(run_dir)], cwd=tmp_path,
                          env=tracker_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((run_dir / ".jobgen-tracking.json").read_text())
    steps = metric_steps(mlflow_client(uri), record["mlflow_run_id"])
    assert steps["train_loss"] == csv_steps(run_dir, "train_loss") == [5, 10, 15, 20], steps
    assert steps["val_loss"] == csv_steps(run_dir, "val_loss") == [10, 20], steps
    assert "step 20/20" in proc.stdout and _newest_step(run_dir) == 20


def test_an_exception_marks_the_mlflow_run_failed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = _mlflow_only_spec(tmp_path, uri)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a directory\n")  # the step-10 checkpoint save raises
    proc = subprocess.run([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(run_dir)], cwd=tmp_path,
                          env=tracker_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((run_dir / ".jobgen-tracking.json").read_text())
    client = mlflow_client(uri)
    assert client.get_run(record["mlflow_run_id"]).info.status == "FAILED"
    # a failed run sends what it held back (its last metrics are what one looks at): step 5; the
    # step-10 row never reached a logger (the save before it raised)
    assert metric_steps(client, record["mlflow_run_id"])["train_loss"] == [5], proc.stdout[-2000:]


def test_the_trackers_start_on_global_rank_zero_only_and_rank_one_imports_neither() -> None:
    code = (
        "import sys, json\n"
        "from types import SimpleNamespace\n"
        "from jobgen.jobdir import ResolvedSpec\n"
        "from jobgen.train.tracking import TrackerLogger, TrackingCallback\n"
        f"doc = json.loads({json.dumps(json.dumps(resolved_doc({**TINY_SPEC, 'trainer': {**TINY_SPEC['trainer'], 'loggers': ['wandb', 'mlflow']}})))})\n"
        "logger = TrackerLogger(ResolvedSpec.model_validate(doc), __import__('pathlib').Path('/nonexistent'), None)\n"
        "TrackingCallback(logger).on_train_start(SimpleNamespace(is_global_zero=False), None)\n"
        "assert not logger.trackers\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'mlflow')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
