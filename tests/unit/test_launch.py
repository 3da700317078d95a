"""jobgen.train.launch: torchrun in-process, exiting with the class of torchrun's first failure
(jobgen.reports.failure_class.launcher_exit_code). The runs are real torchrun runs on CPU (one
worker each, a few seconds); the pinned torch API is checked by name and signature."""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jobgen.reports.failure_class import (
    EXIT_INFRASTRUCTURE,
    EXIT_UNKNOWN,
    INFRASTRUCTURE,
    RETRYABLE_FROM,
    UNKNOWN,
    USER,
    Evidence,
    classify,
    launcher_exit_code,
    launcher_exits_table,
)

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent("""\
    import os, signal, sys, time
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "input-error":
        sys.exit(2)
    if mode == "raise":
        raise ValueError("a bad batch")
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "class-code":
        sys.exit(200)
    if mode == "term":
        def stopped(number, frame):
            open(out, "w").write(str(number))
            os._exit(0)
        signal.signal(signal.SIGTERM, stopped)
        open(out + ".ready", "w").write("ready")
        time.sleep(120)
    """)


def launch(tmp_path: Path, mode: str, *torchrun: str) -> subprocess.Popen[str]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "jobgen.train.launch", *(torchrun or ("--standalone", "--nproc-per-node=1")),
            str(worker), mode, str(tmp_path / "signal")]
    return subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=120)
    return process.returncode, output


def test_torchs_launch_api_is_what_the_launcher_calls():
    """The launcher relies on torch API that is not documented as public: fail loudly if it changes."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.run import parse_args, run

    assert list(inspect.signature(parse_args).parameters) == ["args"]
    assert list(inspect.signature(run).parameters) == ["args"]
    assert list(inspect.signature(ChildFailedError.__init__).parameters) == ["self", "name", "failures"]
    assert "exitcode" in {f.name for f in dataclasses.fields(ProcessFailure)}
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=-9, error_file="")
    error = ChildFailedError("w", {3: failure})
    assert error.failures == {3: failure} and error.get_first_failure() == (3, failure)
    assert SignalException("x", signal.SIGTERM).sigval == signal.SIGTERM
    args = parse_args(["--standalone", "--nproc-per-node=2", "train.py", "--x"])
    assert (args.nproc_per_node, args.training_script, args.training_script_args) == ("2", "train.py", ["--x"])


@pytest.mark.parametrize(("worker_exit", "expected"), [
    (1, 1), (2, 2), (127, 127), (200, 200), (201, 201), (202, 202), (-9, 137), (-15, 143), (-11, 139), (-2, 130), (0, EXIT_UNKNOWN),
    (256, EXIT_UNKNOWN),
])
def test_a_workers_code_is_kept_and_a_signal_becomes_128_plus_n(worker_exit, expected):
    assert launcher_exit_code(worker_exit) == expected


def test_torchruns_own_failures_and_its_signal():
    assert launcher_exit_code(rendezvous_error=True) == EXIT_INFRASTRUCTURE
    assert launcher_exit_code() == EXIT_UNKNOWN
    assert launcher_exit_code(signal=signal.SIGTERM) == 143


@pytest.mark.parametrize(("worker_exit", "kind", "cls"), [
    (1, "traceback", USER), (2, "", USER), (-9, "", INFRASTRUCTURE), (-15, "", INFRASTRUCTURE), (-11, "", UNKNOWN),
    (200, "", INFRASTRUCTURE), (201, "", INFRASTRUCTURE), (202, "", UNKNOWN),
])
def test_the_pods_exit_code_is_retryable_exactly_when_its_class_is_retried(worker_exit, kind, cls):
    """What the pod exits with classes back to the worker's class, and training-operator's ExitCode
    policy restarts it exactly when the class is retried (128-255 retryable). Exit 1 is the
    entrypoint's exception, whose traceback is in the pod's output (alone, exit 1 is ``unknown``)."""
    code = launcher_exit_code(worker_exit)
    decided = classify([Evidence("pod master-0", exit_code=code, kind=kind, text="ValueError: x" if kind else "")])
    assert decided is not None and decided.cls == cls
    assert (code >= RETRYABLE_FROM) == decided.retried


def test_the_table_has_a_row_per_case():
    table = launcher_exits_table()
    assert table.count("\n") == 7 and "| 128 + N (137 for SIGKILL) |" in table and f"| {EXIT_INFRASTRUCTURE} | infrastructure |" in table


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "code"), [("input-error", 2), ("raise", 1), ("sigkill", 137), ("class-code", 200)])
def test_a_real_torchrun_run_exits_with_its_workers_class(tmp_path, mode, code):
    started = time.monotonic()
    returncode, output = finished(launch(tmp_path, mode))
    assert returncode == code, output
    assert "jobgen.train.launch: worker (local rank 0) failed with exit code " in output
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_a_failed_rendezvous_exits_200(tmp_path):
    """No peer ever joins a 2-node rendezvous: torchrun's own RendezvousTimeoutError."""
    returncode, output = finished(launch(tmp_path, "raise", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                                         "--rdzv-endpoint=127.0.0.1:0", "--rdzv-conf=join_timeout=2,timeout=2"))
    assert returncode == EXIT_INFRASTRUCTURE, output
    assert "jobgen.train.launch: rendezvous failed: " in output


@pytest.mark.slow
def test_sigterm_to_the_launcher_reaches_the_worker_and_exits_143(tmp_path):
    """The kubelet's SIGTERM: torchrun's agent handlers run in the launcher's process and pass it on."""
    process = launch(tmp_path, "term")
    deadline = time.monotonic() + 60
    while not (tmp_path / "signal.ready").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    returncode, output = finished(process)
    assert returncode == 143, output
    assert (tmp_path / "signal").read_text() == str(int(signal.SIGTERM))
    assert "jobgen.train.launch: got signal 15" in output


@pytest.mark.parametrize(("argv", "expected"), [
    (["--standalone", "x.py"], (None, None, ["--standalone", "x.py"])),
    (["--restart-budget=2", "--restart-ledger=/runs/a b/restarts", "--standalone", "x.py", "--restart-budget=9"],
     (2, Path("/runs/a b/restarts"), ["--standalone", "x.py", "--restart-budget=9"])),  # torchrun's and the script's are left alone
])
def test_the_launchers_own_options_come_first(argv, expected):
    from jobgen.train.launch import own_options

    assert own_options(argv) == expected


@pytest.mark.parametrize("argv", [["--restart-budget=two", "--restart-ledger=/x"], ["--restart-budget=-1", "--restart-ledger=/x"],
                                  ["--restart-budget=1"], ["--restart-ledger=/x"], ["--restart-budget=\x1b[2J\n", "--restart-ledger=/x"]])
def test_a_bad_budget_or_half_the_options_is_refused(argv):
    from jobgen.train.launch import own_options

    with pytest.raises(SystemExit) as exc:
        own_options(argv)
    message = str(exc.value.code)
    assert message.startswith("jobgen.train.launch: error: ") and "\x1b" not in message and "\n" not in message


@pytest.mark.parametrize(("hostname", "expected"), [
    ("job-master-0", "job-master-0"), ("", "pod"), ("../../etc/passwd", "_.._etc_passwd"), ("a b\n\x00", "a_b__"),
    ("\udcff" * 3, "___"), ("x" * 300, "x" * 253), ("..", "pod"),
])
def test_the_pod_name_is_a_safe_file_name(hostname, expected):
    from jobgen.train.launch import pod_name

    assert pod_name({"HOSTNAME": hostname}) == expected


def test_starts_are_counted_per_pod(tmp_path):
    from jobgen.train.launch import record_start

    ledger = tmp_path / "restarts" / "0123abcd"
    assert [record_start(ledger, "job-master-0") for _ in range(3)] == [0, 1, 2]
    assert record_start(ledger, "job-worker-0") == 0


def test_a_start_beyond_the_budget_exits_1_before_torchrun(tmp_path, monkeypatch, capsys):
    """A pod killed from outside (the launcher could not answer) and recreated once more than the budget allows."""
    from jobgen.train.launch import main

    monkeypatch.setenv("HOSTNAME", "job-master-0")
    (tmp_path / "job-master-0").write_text("1\n2\n")  # the first start and one restart: budget 1 spent
    assert main(["--restart-budget=1", f"--restart-ledger={tmp_path}", "--standalone", "no-such-script.py"]) == 1
    assert "this start is restart 2, beyond the budget of 1: exit 1" in capsys.readouterr().err
    assert (tmp_path / "job-master-0").read_text().count("\n") == 3


def test_an_unwritable_ledger_fails_the_pod_permanently(tmp_path, monkeypatch, capsys):
    from jobgen.train.launch import main

    (tmp_path / "file").write_text("")
    assert main(["--restart-budget=1", f"--restart-ledger={tmp_path / 'file'}", "--standalone", "x.py"]) == 1
    assert "cannot count this pod's starts in " in capsys.readouterr().err


@pytest.mark.slow
def test_a_retryable_failure_with_the_budget_spent_exits_1(tmp_path):
    """A real torchrun run: the worker is SIGKILLed (137, retryable) on the pod's last allowed start."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (ledger / "job-master-0").write_text("1\n")  # one start before: this is restart 1 of 1
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "HOSTNAME": "job-master-0"}
    argv = [sys.executable, "-m", "jobgen.train.launch", "--restart-budget=1", f"--restart-ledger={ledger}", "--standalone",
            "--nproc-per-node=1", str(worker), "sigkill", str(tmp_path / "signal")]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "jobgen.train.launch: restart 1 of 1 (restart.max_restarts)" in done.stderr
    (ledger / "job-master-0").write_text("")
    first = subprocess.run([*argv[:-2], "input-error", argv[-1]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert first.returncode == 2 and "jobgen.train.launch: restart" not in first.stderr, first.stderr  # a first start says nothing
    assert "restart budget spent (1 of 1): exit 1 instead of 137, so the job fails" in done.stderr


def test_the_workers_are_told_which_restart_of_the_pod_this_is_and_what_it_restarted_from(tmp_path, monkeypatch):
    """torchrun's workers inherit JOBGEN_RESTART_COUNT (the ledger's count) and JOBGEN_RESTART_RECORD:
    a retryable exit within the budget is recorded (class, reason), and at the pod's next start
    rank zero finds that record as this start's restart (its ``restart`` notification); a first
    start, a user exit and a garbled line in the records find none."""
    from jobgen.events.notifier import RESTART_COUNT_ENV, RESTART_RECORD_ENV, restart_of_this_start
    from jobgen.train import launch

    seen: list[tuple[str | None, dict | None]] = []
    codes = iter([137, 0, 1])

    def fake_torchrun(argv):
        seen.append((os.environ.get(RESTART_COUNT_ENV), restart_of_this_start(os.environ)))
        return next(codes)

    monkeypatch.setattr(launch, "_torchrun", fake_torchrun)
    monkeypatch.setenv("HOSTNAME", "job-master-0")
    monkeypatch.delenv(RESTART_COUNT_ENV, raising=False)
    monkeypatch.delenv(RESTART_RECORD_ENV, raising=False)
    argv = ["--restart-budget=2", f"--restart-ledger={tmp_path}", "--standalone", "x.py"]
    assert launch.main(argv) == 137  # the operator starts the pod again
    records = tmp_path / f"job-master-0{launch.RECORDS_SUFFIX}"
    with records.open("ab") as f:
        f.write(b'{"restart": "1", "class": 7}\n\xff\xfe not json\n')  # garbled lines are left out
    assert launch.main(argv) == 0
    assert launch.main(argv) == 1  # a user exit: no record
    assert [count for count, _ in seen] == ["0", "1", "2"]
    assert seen[0][1] is None and seen[2][1] is None  # a first start; a count the records do not reach
    record = seen[1][1]
    assert (record["restart"], record["class"], record["reason"], record["exit_code"]) == (1, "infrastructure", "pod job-master-0: exit 137", 137)
    assert os.environ[RESTART_RECORD_ENV] == str(records)
