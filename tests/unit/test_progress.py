"""A run's progress in `jobgen status` (jobgen/reports/progress.py): the step of max_steps,
tokens/s of the last log interval and the ETA, from the run's own metrics.csv.

The running job is a real `jobgen submit` of a built-in GPT spec on a local profile whose
interpreter is a stand-in for torchrun (as tests/unit/test_local_run_end.py does): it writes
metrics.csv rows in the columns rank zero writes (jobgen.train) and waits; training itself runs
in tests/entrypoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from jobgen.planning.calibration import CalibrationFile, CalibrationRow, dumps
from jobgen.reports.progress import read_progress
from tests.conftest import REPO, ctrl_c_reaches_it, write

HEADER = "epoch,lr,peak_memory_mb,samples_per_s,step,tokens_per_s,train_loss,val_loss\n"

FAKE_TORCHRUN = f"""#!{sys.executable}
import os, signal, sys, time
os.makedirs("logs/version_0", exist_ok=True)
with open("logs/version_0/metrics.csv", "w") as f:
    f.write({HEADER!r})
    f.write("0,0.002,680.5,70.0,100,4000.0,3.30,\\n")
    f.write("0,0.002,680.5,70.0,200,8192.0,2.90,\\n")
    f.write("0,,,,200,,,2.80\\n")
signal.signal(signal.SIGINT, lambda s, f: sys.exit(1))
print("[default0]:started", flush=True)
while True:
    time.sleep(0.1)
"""


def test_read_progress_takes_the_newest_version_and_skips_rows_that_are_not_numbers(tmp_path):
    write(tmp_path / "logs" / "version_0" / "metrics.csv", HEADER + "0,0.1,1,1,50,100.0,3.0,\n")
    write(tmp_path / "logs" / "version_2" / "metrics.csv",
          HEADER + "0,0.1,1,1,120,2000.0,3.0,\n" + "0,0.1,1,1,nan,inf,3.0,\n" + "x,\"a,b\",,,-5,1e999,,\n"
          + "0,0.1,1,1,140,\x00\xff,3.0,\n" + "0,0.1,1,1,14")  # a row cut while being written
    write(tmp_path / "logs" / "version_10x" / "metrics.csv", HEADER + "0,0.1,1,1,999,1.0,3.0,\n")  # not a version
    p = read_progress(tmp_path, 600, 4096, now=time.time())
    assert (p.step, p.tokens_per_s, p.max_steps) == (140, 2000.0, 600)
    assert p.eta_s == (600 - 140) * 4096 / 2000.0 and p.source.endswith("version_2/metrics.csv")
    assert read_progress(tmp_path, 100, 4096).eta_s == 0.0  # max_steps reached
    assert read_progress(tmp_path, None, 4096).eta_s is None  # ends by epochs
    assert read_progress(tmp_path / "nothing", 600, 4096) is None


def test_status_of_a_running_local_job_shows_step_rate_and_eta(tmp_path):
    fake = write(tmp_path / "fake-torchrun", FAKE_TORCHRUN)
    fake.chmod(0o755)
    spec = write(tmp_path / "gpt.yaml", "name: gpt\nmodel: {preset: tiny}\ndata: {max_bytes: 200000}\n"
                 "trainer: {micro_batch_size: 16, max_steps: 600, warmup_steps: 10}\n")
    profile = write(tmp_path / "profiles" / "fakelocal.yaml",
                    "description: local with a stand-in torchrun\nscheduler: local\nmax_nodes: 1\ndefault_nodes: 1\n"
                    "gpus_per_node: 0\ncpu_processes_per_node: 2\ncpus_per_node: 2\nmem_gib_per_node: 8\n"
                    f"local: {{python: {fake}}}\n")
    calibration = write(tmp_path / "cal.yaml", dumps(CalibrationFile(rows=(CalibrationRow(
        accelerator="cpu", dtype="fp32", layout="ddp", size="<10M", flops_per_s_per_core=5e10, runs=1),))))
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOBGEN_STATE_DIR": str(tmp_path / "state"), "JOBGEN_CALIBRATION": str(calibration)}
    env.pop("JOBGEN_DEBUG", None)
    run_dir = (tmp_path / "runs" / "gpt").resolve()
    job = subprocess.Popen([sys.executable, "-m", "jobgen.cli", "submit", str(spec), "--profile", str(profile),
                            "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    try:
        deadline = time.time() + 60
        while not (run_dir / "logs" / "version_0" / "metrics.csv").is_file():
            assert job.poll() is None and time.time() < deadline, job.stdout.read() if job.poll() is not None else "timeout"
            time.sleep(0.2)
        status = subprocess.run([sys.executable, "-m", "jobgen.cli", "status", f"local://{run_dir}", "-o", "json"],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        doc = json.loads(status.stdout)
        assert doc["state"] == "RUNNING", doc
        prog = doc["progress"]
        # tokens per step: micro batch 16 x block 256 (the tiny preset) x 2 ranks; 400 steps left at 8,192 tokens/s
        assert (prog["step"], prog["max_steps"], prog["tokens_per_s"], prog["tokens_per_step"]) == (200, 600, 8192.0, 8192)
        assert prog["eta_s"] == 400.0
        # the device time so far: 2 ranks from the start submit recorded to now; CPU-hours carry no price
        usage = doc["usage"]
        assert (usage["device_kind"], usage["devices"], usage["end"], usage["cost"]) == ("cpu", 2, None, None), usage
        assert usage["cpu_hours"] == pytest.approx(2 * usage["elapsed_s"] / 3600, abs=1e-6) and usage["elapsed_s"] > 0, usage
        text = subprocess.run([sys.executable, "-m", "jobgen.cli", "status", f"local://{run_dir}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60).stdout
        assert "progress: step 200/600, 8,192 tokens/s (last log interval), ETA 0:06:40" in text, text
        assert re.search(r"\n  usage: 2 CPUs x [0-9.]+ h = [0-9]+\.[0-9]{3} CPU-hours \(\.jobgen-local-run\.json start to end x ranks\)\n", text), text
        # jobgen ls: the running job's ETA, the same as status gives
        listed = subprocess.run([sys.executable, "-m", "jobgen.cli", "ls", "-o", "json"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)
        [row] = json.loads(listed.stdout)
        assert row["state"] == "RUNNING" and row["progress"]["eta_s"] == 400.0 and row["measured_over_predicted"] is None
        table = subprocess.run([sys.executable, "-m", "jobgen.cli", "ls"], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=60).stdout
        assert "ETA / VS PREDICTED" in table.splitlines()[0] and "ETA 0:06:40" in table.splitlines()[1], table
        # submit wrote the time model's prediction beside spec.json: 2 ranks x 1 core x 50 GFLOP/s
        prediction = json.loads((run_dir / ".jobgen-prediction.json").read_text())
        assert prediction["available"] and prediction["layout"] == "ddp" and prediction["max_steps"] == 600
        assert abs(prediction["tokens_per_s"]["value"] - 2 * 5e10 / 6_529_536) < 1
    finally:
        os.killpg(job.pid, signal.SIGINT)
        try:
            job.wait(timeout=120)  # two training ranks wind down after Ctrl-C; a loaded machine takes its time
        finally:
            if job.poll() is None:  # the test fails on the timeout; nothing of the job outlives it
                os.killpg(job.pid, signal.SIGKILL)
