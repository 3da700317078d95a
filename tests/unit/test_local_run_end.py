"""How a local run ends, as ``jobgen status`` / ``ls`` and the exit code say it.

The run is real as far as jobgen goes (``jobgen submit SPEC --profile P`` in a subprocess: the
foreground run, output.log, the triage, the state record) but torchrun is a stand-in: the
profile's ``local.python`` names a script that prints what ``torchrun --tee 3`` prints (each
rank's lines labelled ``[default<rank>]:``, then torchrun's own ChildFailedError report) and
exits as torchrun does, so the test needs no torch and runs in a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, ctrl_c_reaches_it, write

#: What ``torchrun --tee 3`` printed for a command-mode script whose rank 0 ends with
#: ``raise SystemExit("boom: ...")`` (the message on stderr, no traceback), torch 2.13.
BOOM = """\
[default1]:step 1 on rank 1
[default0]:step 1 on rank 0
[default0]:boom: the config names no dataset
W1201 10:00:00.000000 4242 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 4244 closing signal SIGTERM
E1201 10:00:00.100000 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 (pid: 4243) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_10:00:00
  host      : here
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4243)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

#: What torch 2.13's torchrun printed after its rank 0 exited 2 (the entrypoint's input error),
#: then it exited 1: the ranks' exit code is only in its report ("Root Cause ... exitcode").
TORCHRUN_EXIT_2 = """\
E1127 04:44:09.507000 22468 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 22472) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
jobgen.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_04:44:09
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 22473)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 22473
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_04:44:09
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 22472)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

#: torchrun's report after the watchdog ended rank 0 with 201 and torchrun SIGKILLed the stopped
#: rank 1 (the form of torch 2.13's report, as TORCHRUN_EXIT_2), after rank 0's verdict line.
HUNG = "".join(line + "\n" for line in (
    '[default0]:step 12/60 | train_loss 3.3737',
    '[default0]:python -m jobgen.train: error: hang: no rank advanced its optimizer step for 3.0 s (limit 3 s = max'
    '(hang_timeout_s 3, 10 x median step 0.02 s)); heartbeat stopped first: rank 1 on node here (pid 4244) at step '
    '12, silent 3.0 s; the stacks of every live rank are in /runs/cmd/hang (exit 201)',
    'W1127 04:44:09.507000 22468 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 4244 closing'
    ' signal SIGTERM',
    'W1127 04:44:39.507000 22468 torch/distributed/elastic/multiprocessing/api.py:1048] Unable to shutdown process '
    '4244 via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL',
    'E1127 04:44:09.507000 22468 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 201) loca'
    'l_rank: 0 (pid: 4243) of binary: /usr/bin/python3',
    'Traceback (most recent call last):',
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    'torch.distributed.elastic.multiprocessing.errors.ChildFailedError:',
    '============================================================',
    'jobgen.train FAILED',
    '------------------------------------------------------------',
    'Failures:',
    '[1]:',
    '  time      : 2026-11-27_04:44:39',
    '  host      : localhost',
    '  rank      : 1 (local_rank: 1)',
    '  exitcode  : -9 (pid: 4244)  (SIGKILL)',
    '  error_file: <N/A>',
    '  traceback : Signal 9 (SIGKILL) received by PID 4244',
    '------------------------------------------------------------',
    'Root Cause (first observed failure):',
    '[0]:',
    '  time      : 2026-11-27_04:44:09',
    '  host      : localhost',
    '  rank      : 0 (local_rank: 0)',
    '  exitcode  : 201 (pid: 4243)',
    '  error_file: <N/A>',
    '  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html',
    '============================================================',
))

#: A rank's exception in the user's code (then torchrun's report of exit 1, as in BOOM).
RAISED = """\
[default0]:Traceback (most recent call last):
[default0]:  File "/work/train.py", line 3, in training_step
[default0]:RuntimeError: user code failed at step 3
""" + BOOM[BOOM.index("W1201"):]

FAKE_TORCHRUN = f"""#!{sys.executable}
import os, signal, sys, time
mode = os.environ["FAKE_TORCHRUN"]
if "FAKE_ATTEMPTS" in os.environ:  # count the starts
    with open(os.environ["FAKE_ATTEMPTS"], "a") as f:
        f.write("start" + os.environ.get("JOBGEN_RESTART_COUNT", "-") + "\\n")  # and which start jobgen says it is
    starts = len(open(os.environ["FAKE_ATTEMPTS"]).read().split())
    if mode == "hung-then-ok":
        mode = "hung" if starts == 1 else "ok"
if mode == "hung":
    sys.stdout.write({HUNG!r})
    sys.exit(1)
if mode == "raise":
    sys.stdout.write({RAISED!r})
    sys.exit(1)
if mode == "boom":
    sys.stdout.write({BOOM!r})
    sys.exit(1)
if mode == "bad-input":  # the entrypoint's one-line error on an input it refuses (exit 2)
    print("[default0]:python -m jobgen.train: error: spec.json: data.paths: no file matches notes/*.txt")
    sys.exit(2)
if mode == "bad-input-torchrun":  # as real torchrun ends when its ranks exit 2: exit 1, the ranks' 2 in its report
    source = os.environ.get("JOBGEN_SPEC_SOURCE", "spec.json")
    sys.stdout.write("[default0]:python -m jobgen.train: error: " + source + ": data.paths[0]: 'notes/*.txt' matches no files\\n")
    sys.stdout.write({TORCHRUN_EXIT_2!r})
    sys.exit(1)
if mode == "ok":
    print("[default0]:done")
    sys.exit(0)
# "hang": run until SIGINT, then end as torchrun does when its agent is interrupted
def stop(signum, frame):
    print("[default0]:stopping", flush=True)
    sys.exit(1)
signal.signal(signal.SIGINT, stop)
print("[default0]:started", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    """A command-mode spec (no git repository: no snapshot), a local profile whose torchrun is
    :data:`FAKE_TORCHRUN`, the runs and state directories."""
    fake = write(tmp_path / "fake-torchrun", FAKE_TORCHRUN)
    fake.chmod(0o755)
    write(tmp_path / "train.py", "raise SystemExit('boom')\n")
    spec = write(tmp_path / "job.yaml", "name: cmd\nentrypoint: {script: train.py}\n")
    profile = write(tmp_path / "profiles" / "fakelocal.yaml",
                    "description: local with a stand-in torchrun\nscheduler: local\nmax_nodes: 1\ndefault_nodes: 1\n"
                    "gpus_per_node: 0\ncpu_processes_per_node: 2\ncpus_per_node: 2\nmem_gib_per_node: 8\n"
                    f"local: {{python: {fake}}}\n")
    return {"root": tmp_path, "spec": spec, "profile": profile, "runs": tmp_path / "runs", "state": tmp_path / "state"}


def _env(setup: dict[str, Path], mode: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOBGEN_STATE_DIR": str(setup["state"]), "FAKE_TORCHRUN": mode,
           "FAKE_ATTEMPTS": str(setup["root"] / "attempts")}
    env.pop("JOBGEN_DEBUG", None)
    return env


def _jobgen(setup: dict[str, Path], mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=setup["root"], env=_env(setup, mode),
                          capture_output=True, text=True, timeout=60)


def _submit(setup: dict[str, Path], mode: str, *more: str) -> subprocess.CompletedProcess[str]:
    return _jobgen(setup, mode, "submit", str(setup["spec"]), "--profile", str(setup["profile"]),
                   "--runs-dir", str(setup["runs"]), *more)


def _status(setup: dict[str, Path]) -> dict:
    run_dir = (setup["runs"] / "cmd").resolve()
    proc = _jobgen(setup, "ok", "status", f"local://{run_dir}", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _ls_states(setup: dict[str, Path], *states: str) -> list[str]:
    proc = _jobgen(setup, "ok", "ls", *(a for s in states for a in ("--state", s)), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return [row["state"] for row in json.loads(proc.stdout)]


def test_a_failed_local_run_is_failed_with_its_exit_code_and_first_error(setup):
    proc = _submit(setup, "boom")
    terminal = proc.stdout + proc.stderr
    assert proc.returncode == 1, terminal
    # the triage names the rank's last words (SystemExit's message, written to stderr), not "no traceback"
    assert "no rank's output shows" not in terminal, terminal
    assert "first failure: rank 0" in terminal and "  boom: the config names no dataset" in terminal, terminal
    status = _status(setup)
    assert status["state"] == "FAILED", status
    assert status["details"]["exit_code"] == "1", status
    assert "boom: the config names no dataset" in status["details"]["first_error"], status
    assert _ls_states(setup, "FAILED") == ["FAILED"]
    assert _ls_states(setup, "COMPLETED") == []


def test_ctrl_c_exits_130_and_the_run_is_cancelled(setup):
    # SIGINT as a terminal leaves it (default): a test session started in the background of a
    # shell without job control inherits it ignored, and Python then keeps it ignored.
    proc = subprocess.Popen([sys.executable, "-m", "jobgen.cli", "submit", str(setup["spec"]), "--profile", str(setup["profile"]),
                             "--runs-dir", str(setup["runs"])], cwd=setup["root"], env=_env(setup, "hang"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    log = setup["runs"] / "cmd" / "output.log"
    deadline = time.monotonic() + 30
    while not (log.is_file() and "[default0]:started" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    running = _status(setup)  # jobgen still holds it in the foreground
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to jobgen (torchrun runs in its own session)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr  # Unix: 128 + SIGINT, as the README says
    assert running["state"] == "RUNNING" and running["details"]["pid"] == str(proc.pid), running
    assert "interrupted" in stderr and "Traceback" not in stderr, stderr
    status = _status(setup)
    assert status["state"] == "CANCELLED", status
    assert _ls_states(setup, "CANCELLED") == ["CANCELLED"]


def test_the_last_start_decides_an_old_summary_does_not_outlive_a_failed_restart(setup):
    """A completed run started again (``--set trainer.max_steps=...``, the README's "train longer")
    and then failing or interrupted is not COMPLETED any more: the state is the last start's."""
    assert _submit(setup, "ok").returncode == 0
    status = _status(setup)
    assert status["state"] == "COMPLETED" and status["details"]["exit_code"] == "0", status
    assert (setup["runs"] / "cmd" / "summary.json").is_file()
    assert _submit(setup, "boom").returncode == 1
    assert _status(setup)["state"] == "FAILED"
    assert _submit(setup, "ok").returncode == 0
    assert _status(setup)["state"] == "COMPLETED"


def test_a_run_whose_jobgen_is_gone_without_an_end_is_unknown_not_running(setup):
    """jobgen killed outright (SIGKILL, the machine rebooted) records no end: never a guessed state."""
    assert _submit(setup, "ok").returncode == 0
    from jobgen.jobdir import LOCAL_RUN_FILE, LocalRun

    run_dir = setup["runs"] / "cmd"
    record = LocalRun.model_validate_json((run_dir / LOCAL_RUN_FILE).read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (run_dir / LOCAL_RUN_FILE).write_text(record.model_copy(update={"state": "RUNNING", "exit_code": None, "pid": int(dead)}).model_dump_json())
    status = _status(setup)
    assert status["state"] == "UNKNOWN" and "no longer runs" in status["details"]["reason"], status


# --------------------------------------------------------------------------- one run directory, one run


def _other_profile(setup: dict[str, Path], name: str, ranks: int) -> Path:
    fake = setup["root"] / "fake-torchrun"
    return write(setup["root"] / "profiles" / f"{name}.yaml",
                 f"description: another machine\nscheduler: local\nmax_nodes: 1\ndefault_nodes: 1\ngpus_per_node: 0\n"
                 f"cpu_processes_per_node: {ranks}\ncpus_per_node: 4\nmem_gib_per_node: 8\nlocal: {{python: {fake}}}\n")


def test_a_run_directory_of_another_profile_or_shape_is_refused_before_anything_runs(setup):
    """The README's SLURM example after the quick start once ran in runs/quickstart, found the
    local run's checkpoint and stopped with "nothing to do". A run directory belongs to the profile
    and shape of its first run; another one is refused (exit 2, nothing started), the same one
    (a longer run, --set trainer.max_steps) resumes there."""
    assert _submit(setup, "ok").returncode == 0
    run_dir = setup["runs"] / "cmd"
    log_before = (run_dir / "output.log").read_text()
    other = _other_profile(setup, "bigger", 4)
    refused = _jobgen(setup, "ok", "submit", str(setup["spec"]), "--profile", str(other), "--runs-dir", str(setup["runs"]))
    assert refused.returncode == 2, refused.stderr
    assert str(run_dir.resolve()) in refused.stderr and "'fakelocal'" in refused.stderr and "'bigger'" in refused.stderr, refused.stderr
    assert "--set name=" in refused.stderr and "--runs-dir" in refused.stderr, refused.stderr
    assert (run_dir / "output.log").read_text() == log_before  # nothing was started
    assert _status(setup)["state"] == "COMPLETED"  # the first run's state stands
    longer = _submit(setup, "ok", "--set", "env.STEPS='2'")  # other inputs, same profile and shape: the same run
    assert longer.returncode == 0, longer.stderr


def test_a_run_directory_of_an_older_jobgen_is_known_by_its_summary(setup):
    """No identity record (a run directory an older jobgen wrote): summary.json's profile and world size say whose it is."""
    from jobgen.jobdir import RUN_IDENTITY_FILE, check_run_dir, read_resolved_spec

    assert _submit(setup, "ok").returncode == 0
    run_dir = setup["runs"] / "cmd"
    (run_dir / RUN_IDENTITY_FILE).unlink()
    summary = json.loads((run_dir / "summary.json").read_text())
    resolved = read_resolved_spec(run_dir)
    check_run_dir(run_dir, resolved)  # its own: fine
    (run_dir / "summary.json").write_text(json.dumps(summary | {"profile": "slurm-a100", "world_size": 16}))
    with pytest.raises(Exception, match="'slurm-a100'") as info:
        check_run_dir(run_dir, resolved)
    assert getattr(info.value, "exit_code", None) == 2 and info.value.hint


def test_logs_of_a_local_run_print_its_output_log(setup):
    """`jobgen logs local://...` once refused; it prints the run's output.log."""
    assert _submit(setup, "boom").returncode == 1
    run_dir = (setup["runs"] / "cmd").resolve()
    proc = _jobgen(setup, "ok", "logs", f"local://{run_dir}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (run_dir / "output.log").read_text(), proc.stdout
    assert "[default0]:boom: the config names no dataset" in proc.stdout


def test_a_failed_command_mode_run_is_not_told_to_rerun_to_resume(setup):
    """jobgen keeps no checkpoints of a command-mode script: "rerun to resume
    from the last checkpoint" is not jobgen's to promise there."""
    proc = _submit(setup, "boom")
    assert proc.returncode == 1
    assert "resume from the last checkpoint" not in proc.stderr, proc.stderr
    assert "fix" in proc.stderr.split("hint:", 1)[1], proc.stderr


def test_an_input_error_under_real_torchrun_exits_2_names_the_users_spec_and_shows_its_headline_once(setup):
    """torchrun exits 1 when a rank exits 2 (the entrypoint's input error); its
    report's root cause says 2. jobgen submit exits 2 (bad input) with the fix-the-input hint, not
    "resume from the last checkpoint"; the ranks were told the user's spec file (their error names
    it and the field, not spec.json); the triage shows the one-line error once."""
    builtin = write(setup["root"] / "builtin.yaml", "name: builtin\n")
    proc = _jobgen(setup, "bad-input-torchrun", "submit", str(builtin), "--profile", str(setup["profile"]), "--runs-dir", str(setup["runs"]))
    terminal = proc.stdout + proc.stderr
    assert proc.returncode == 2, terminal
    hint = proc.stderr.split("hint:", 1)[1]
    assert "resume from the last checkpoint" not in hint and "fix what its error names" in hint, terminal
    assert f"{builtin.resolve()}: data.paths[0]: 'notes/*.txt' matches no files" in proc.stdout, terminal
    assert proc.stdout.count("matches no files") == 1, proc.stdout  # the headline, not again as its own excerpt
    assert "ranks exited 2" in proc.stderr or "exit code 2" in proc.stderr, proc.stderr


def test_an_entrypoint_input_error_is_not_told_to_rerun_to_resume(setup):
    """The entrypoint refused its input (exit 2): the same command unchanged fails the same way;
    jobgen submit exits 2 too (bad input)."""
    builtin = write(setup["root"] / "builtin.yaml", "name: builtin\n")
    proc = _jobgen(setup, "bad-input", "submit", str(builtin), "--profile", str(setup["profile"]), "--runs-dir", str(setup["runs"]))
    assert proc.returncode == 2, proc.stderr
    hint = proc.stderr.split("hint:", 1)[1]
    assert "resume from the last checkpoint" not in hint and "fix what its error names" in hint, proc.stderr
    assert "data.paths: no file matches" in proc.stdout + proc.stderr  # the triage shows it


def _attempts(setup: dict[str, Path]) -> int:
    path = setup["root"] / "attempts"
    return len(path.read_text().split()) if path.is_file() else 0


def _status_text(setup: dict[str, Path]) -> str:
    proc = _jobgen(setup, "ok", "status", f"local://{(setup['runs'] / 'cmd').resolve()}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_hang_is_restarted_within_the_budget_and_the_restart_is_recorded(setup):
    """The restart is recorded in status, ls (RESTARTS used/budget; -o json ``restarts``),
    summary.json, and sent as a ``restart`` notification (the spec's notify command) before the
    second start, whose environment says it is restart 1."""
    received = setup["root"] / "notified.jsonl"
    recorder = write(setup["root"] / "recorder.py", "import sys\nwith open(sys.argv[1], 'a') as f:\n"
                     "    f.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n")
    write(setup["spec"], f"name: cmd\nentrypoint: {{script: train.py}}\nnotify: {{command: [{sys.executable}, {recorder}, {received}]}}\n")
    proc = _submit(setup, "hung-then-ok", "--set", "restart.max_restarts=1")
    terminal = proc.stdout + proc.stderr
    assert proc.returncode == 0, terminal
    assert (setup["root"] / "attempts").read_text().split() == ["start0", "start1"]
    (body,) = [json.loads(line) for line in received.read_text().splitlines()]  # command mode: jobgen's restart event only
    assert (body["event"], body["class"], body["restarts_used"], body["max_restarts"], body["restart"]) == \
           ("restart", "infrastructure", 1, 1, 1), body
    assert body["reason"].startswith("no rank made progress") and body["handle"] == f"local://{(setup['runs'] / 'cmd').resolve()}"
    listed = json.loads(_jobgen(setup, "ok", "ls", "-o", "json").stdout)
    assert [row["restarts"] for row in listed] == [{"used": 1, "max_restarts": 1}], listed
    table = _jobgen(setup, "ok", "ls").stdout.splitlines()
    assert table[0].split()[-1] == "RESTARTS" and table[1].split()[-1] == "1/1", table
    assert "jobgen: restart 1 of 1 (restart.max_restarts) after a failure classed infrastructure (retried): no rank made " \
           "progress" in terminal, terminal
    status = _status(setup)
    assert status["state"] == "COMPLETED" and status["details"]["restarts_used"] == "1 of 1", status
    assert status["details"]["restart_1"].startswith("infrastructure (hang): no rank made progress"), status
    summary = json.loads((setup["runs"] / "cmd" / "summary.json").read_text())
    history = summary["restarts"]["history"]
    assert (summary["restarts"]["max_restarts"], summary["restarts"]["used"]) == (1, 1)
    assert [(h["restart"], h["class"], h["rule"], h["exit_code"]) for h in history] == [(1, "infrastructure", "hang", 1)]
    assert "hang" in history[0]["evidence"]
    log = (setup["runs"] / "cmd" / "output.log").read_text()
    assert log.count("==== jobgen submit") == 2  # each attempt's output after its own start line


def test_without_a_budget_a_hang_ends_failed_as_infrastructure_hang(setup):
    proc = _submit(setup, "hung")
    terminal = proc.stdout + proc.stderr
    assert proc.returncode == 1 and _attempts(setup) == 1, terminal
    assert "jobgen: failure: infrastructure (retried): no rank made progress" in terminal and "restarts used" not in terminal
    status = _status(setup)
    assert status["state"] == "FAILED" and "restarts_used" not in status["details"], status
    failure = status["failure"]
    assert (failure["class"], failure["rule"], failure["max_restarts"]) == ("infrastructure", "hang", 0), failure
    assert "restart budget: max_restarts 0 (spec.json)" in _status_text(setup)


def test_a_budget_is_spent_then_the_run_fails_with_every_restart_recorded(setup):
    proc = _submit(setup, "hung", "--set", "restart.max_restarts=2")
    terminal = proc.stdout + proc.stderr
    assert proc.returncode == 1 and _attempts(setup) == 3, terminal
    assert "jobgen: restarts used: 2 of 2 (restart.max_restarts)" in terminal, terminal
    status = _status(setup)
    assert status["state"] == "FAILED" and status["details"]["restarts_used"] == "2 of 2", status
    assert {k for k in status["details"] if k.startswith("restart_")} == {"restart_1", "restart_2"}
    assert status["failure"]["rule"] == "hang" and status["failure"]["max_restarts"] == 2
    assert "restart budget: max_restarts 2, 2 of 2 used (jobgen restarts a local run itself)" in _status_text(setup)


def test_an_exception_in_user_code_is_not_restarted_whatever_the_budget(setup):
    proc = _submit(setup, "raise", "--set", "restart.max_restarts=3")
    terminal = proc.stdout + proc.stderr
    assert proc.returncode == 1 and _attempts(setup) == 1, terminal
    assert "jobgen: failure: user (not retried): an exception in the job's code" in terminal, terminal
    assert "jobgen: restarts used: 0 of 3 (restart.max_restarts); a user failure is not restarted" in terminal
    status = _status(setup)
    assert status["state"] == "FAILED" and status["details"]["restarts_used"] == "0 of 3", status
    assert (status["failure"]["class"], status["failure"]["rule"]) == ("user", "exception"), status


def test_an_input_error_is_not_restarted(setup):
    proc = _submit(setup, "bad-input-torchrun", "--set", "restart.max_restarts=3")
    assert proc.returncode == 1 and _attempts(setup) == 1, proc.stdout + proc.stderr  # command mode: exit 2 is the builtin's
    assert (_status(setup)["failure"]["class"], _status(setup)["failure"]["rule"]) == ("user", "entrypoint-error")


def test_a_hostile_verdict_file_or_evidence_record_is_left_out(tmp_path):
    """What the run directory holds is read, never trusted: a verdict.json that is not the
    watchdog's, or evidence records of the wrong shape, are left out (no traceback)."""
    import dataclasses

    from jobgen.backends.local import attempt_evidence, stored_evidence
    from jobgen.jobdir.runs import LocalRun
    from jobgen.reports.failure_class import Evidence, classify

    (tmp_path / "hang").mkdir()
    for raw in (b"\xff\xfe not json", b"[1, 2]", b'{"verdict": "hung"}', b'{"verdict": ["hang"]}'):
        (tmp_path / "hang" / "verdict.json").write_bytes(raw)
        assert [e.source for e in attempt_evidence(tmp_path / "output.log", tmp_path, -9, since=0)] == ["torchrun"]
    (tmp_path / "hang" / "verdict.json").write_text('{"verdict": "hang", "text": "x\\u001b[2J\\n' + "y" * 300 + '"}')
    found = attempt_evidence(tmp_path / "output.log", tmp_path, 1, since=0)
    assert [(e.source, e.verdict) for e in found] == [("watchdog", "hang"), ("torchrun", "")]
    decided = classify(found)
    assert decided.rule == "hang" and "\x1b" not in decided.evidence and "\n" not in decided.evidence
    assert decided.evidence.endswith("...") and len(decided.evidence) <= len("watchdog: verdict hang, ") + 200  # cut
    assert attempt_evidence(tmp_path / "output.log", tmp_path, 1, since=10**12)[0].source == "torchrun"  # an older verdict
    good = dataclasses.asdict(Evidence("rank 0", kind="traceback", text="ValueError: x"))
    run = LocalRun(state="FAILED", pid=1, started_at="2026-01-01T00:00:00+00:00", evidence=(
        good, {"source": 3}, {"source": "r", "exit_code": "201"}, {"source": "r", "exit_code": True}, {"source": "r", "x": 1}))
    assert stored_evidence(run) == (Evidence("rank 0", kind="traceback", text="ValueError: x"),)


def test_status_of_a_completed_run_shows_the_straggler_its_summary_records(tmp_path):
    from jobgen.backends.base import SubmittedJob
    from jobgen.backends.local import LocalBackend
    from jobgen.jobdir.runs import LocalRun, write_local_run
    from jobgen.jobdir.submission import JobHandle

    run = LocalRun(state="RUNNING", pid=os.getpid(), started_at="2026-01-01T00:00:00+00:00")
    write_local_run(tmp_path, run.ended("COMPLETED", 0))
    straggler = {"rank": 3, "node": "node2", "ratio": 2.1, "step_time_s": 0.42, "median_step_time_s": 0.2}
    (tmp_path / "summary.json").write_text(json.dumps({"wall_time_s": 1.0, "straggler": straggler}))
    details = LocalBackend().status(SubmittedJob(JobHandle("local", str(tmp_path)))).details
    assert details["straggler"] == "rank 3 on node2: 2.1x the median step time (0.42 s vs 0.20 s)", details
    (tmp_path / "summary.json").write_text(json.dumps({"wall_time_s": 1.0, "straggler": None}))
    assert "straggler" not in LocalBackend().status(SubmittedJob(JobHandle("local", str(tmp_path)))).details
    (tmp_path / "summary.json").write_bytes(b"\xff{")
    assert "straggler" not in LocalBackend().status(SubmittedJob(JobHandle("local", str(tmp_path)))).details
