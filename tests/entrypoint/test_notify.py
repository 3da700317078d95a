"""Notifications (spec ``notify:``): real runs of the entrypoint POST to a local HTTP server
(``http.server`` in a thread on port 0: the OS picks the port and the server keeps it) or feed a
command on stdin, for each transition: started / finished (``jobgen submit --profile local``),
failed (a checkpoint directory that is a file: the save at step 10 raises), requeued (the
srun-style requeue path of test_entrypoint_requeue.py, with an ``scontrol`` that SIGTERMs the
rank as SLURM does; with one rank Lightning's SIGTERM handler only sets a flag, so this test
does not tell whether RequeueOnSignal held the signal back)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.entrypoint.conftest import REPO, child_env, resolved_doc
from tests.entrypoint.test_entrypoint_requeue import _kill, _srun_env, _wait, _wait_for_step

TOKEN = "tok-3f9a1c77e2"  # the value only ever lives in the test's environment
TOKEN_ENV = "JOBGEN_TEST_HOOK_TOKEN"
TIMEOUT_S = 240


class Hook:
    """A local webhook: records (path, headers, JSON body) of each POST; answers ``status``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []  # answers to give, in order (then 200)
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = hook.statuses.pop(0) if hook.statuses else 200
                hook.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body), "status": status})
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?channel=ml"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if r["status"] == 200]

    def events(self) -> list[str]:
        return [b["event"] for b in self.bodies()]


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    h.thread.start()
    yield h
    h.server.shutdown()
    h.server.server_close()


TINY_YAML = {
    "name": "tiny-notify",
    "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
    "data": {"max_bytes": 1_000_000},
    "trainer": {"precision": "32-true", "micro_batch_size": 4, "max_steps": 20, "warmup_steps": 2, "val_check_interval": 10,
                "limit_val_batches": 4, "log_every_n_steps": 5},
    "checkpoint": {"every_n_steps": 10},
    "resources": {"devices_per_node": 1},
}


def _check_common(body: dict[str, Any], event: str, job: str) -> None:
    assert body["event"] == event and body["job"] == job
    assert body["time"].endswith("Z") and body["time"][:4].isdigit() and "T" in body["time"]
    assert body["gpu_hours"] is None  # CPU run: no GPU-hours
    assert body["max_steps"] == 20 and body["host"]
    assert set(body) == {"event", "job", "handle", "step", "max_steps", "train_loss", "val_loss", "gpu_hours", "time", "host",
                         "run_dir", "profile", "restart", "error"}


@pytest.mark.slow
def test_local_run_sends_started_and_finished_with_a_bearer_token_no_file_holds(hook: Hook, tmp_path: Path) -> None:
    spec = {**TINY_YAML, "secrets": [TOKEN_ENV], "notify": {"webhook": {"url": hook.url, "token_env": TOKEN_ENV}}}
    spec_file = tmp_path / "notify.yaml"
    spec_file.write_text(json.dumps(spec))
    env = child_env() | {TOKEN_ENV: TOKEN, "JOBGEN_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run([sys.executable, "-m", "jobgen.cli", "submit", str(spec_file), "--profile", "local", "--runs-dir",
                           str(tmp_path / "runs")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = (tmp_path / "runs" / "tiny-notify").resolve()
    assert hook.events() == ["started", "finished"], hook.requests
    started, finished = hook.bodies()
    for body, event in ((started, "started"), (finished, "finished")):
        _check_common(body, event, "tiny-notify")
        assert body["handle"] == f"local://{run_dir}" and body["run_dir"] == str(run_dir)
        assert body["profile"] == "local" and body["restart"] == 0 and body["error"] is None
    assert started["step"] == 0 and started["train_loss"] is None and started["val_loss"] is None
    summary = json.loads((run_dir / "summary.json").read_text())
    assert finished["step"] == 20 and finished["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-6)
    assert isinstance(finished["train_loss"], float)
    for request in hook.requests:
        assert request["path"] == "/hook?channel=ml"
        assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"
        assert request["headers"]["Content-Type"] == "application/json"

    # Rendered for every scheduler that takes the token from the environment: the name, never the value.
    for profile in ("slurm-cpu", "local"):
        out = subprocess.run([sys.executable, "-m", "jobgen.cli", "render", str(spec_file), "--profile", profile, "--out",
                              str(tmp_path / "manifests")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    rendered = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "job.sbatch" for p in rendered) and any(p.name == "spec.json" for p in rendered)
    assert any(TOKEN_ENV in p.read_text(errors="replace") for p in rendered if p.name == "spec.json")
    leaked = [str(p) for p in rendered if TOKEN.encode() in p.read_bytes()]
    assert not leaked, f"the token's value was written into {leaked}"


def _write_resolved(tmp_path: Path, notify: dict[str, Any], **launch: Any) -> Path:
    spec = {k: v for k, v in TINY_YAML.items() if k != "resources"} | {"name": "tiny", "notify": notify}
    if "webhook" in notify and notify["webhook"].get("token_env"):
        spec["secrets"] = [notify["webhook"]["token_env"]]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(resolved_doc(spec, **({"num_nodes": 1, "devices_per_node": 1, "world_size": 1} | launch))))
    return path


RECORDER = """\
import sys
with open(sys.argv[1], "a") as fh:
    fh.write(sys.stdin.read().replace("\\n", " ") + "\\n")
"""


@pytest.mark.slow
def test_a_run_that_raises_after_start_sends_failed_through_the_command(tmp_path: Path) -> None:
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORDER)
    received = tmp_path / "received.jsonl"
    spec = _write_resolved(tmp_path, {"command": [sys.executable, str(recorder), str(received)]})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a directory\n")  # the step-10 checkpoint save raises
    proc = subprocess.run([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(run_dir)], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    bodies = [json.loads(line) for line in received.read_text().splitlines()]
    assert [b["event"] for b in bodies] == ["started", "failed"], bodies
    failed = bodies[1]
    _check_common(failed, "failed", "tiny")
    assert failed["step"] == 10 and isinstance(failed["train_loss"], float), failed
    assert failed["error"] and "Error" in failed["error"] and "\n" not in failed["error"]
    assert failed["handle"] == f"local://{run_dir}"


@pytest.mark.slow
def test_bad_input_before_training_sends_failed_without_a_step(hook: Hook, tmp_path: Path) -> None:
    spec = _write_resolved(tmp_path, {"webhook": {"url": hook.url}, "events": ["failed"]})
    doc = json.loads(spec.read_text())
    doc["spec"]["data"]["paths"] = [str(tmp_path / "no-such-file.txt")]
    spec.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(tmp_path / "run")],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert hook.events() == ["failed"]
    body = hook.bodies()[0]
    assert body["step"] is None and body["train_loss"] is None and "no-such-file.txt" in body["error"]
    assert "Authorization" not in hook.requests[0]["headers"]


SIGTERMING_SCONTROL = """#!/bin/sh
# scontrol requeue as SLURM does it: accepted, then every task gets SIGTERM at once.
echo "$@" >> "$FAKE_SCONTROL_LOG"
kill -TERM "$PPID"
exit 0
"""


@pytest.mark.slow
def test_requeue_sends_requeued_before_slurms_sigterm_and_no_failed(hook: Hook, tmp_path: Path) -> None:
    from tests.ports import next_port

    spec = _write_resolved(tmp_path, {"webhook": {"url": hook.url}},
                           scheduler="slurm", requeue_signal="USR2", cluster="lab", num_nodes=1, devices_per_node=1, world_size=1)
    doc = json.loads(spec.read_text())
    doc["spec"]["trainer"]["max_steps"] = 400
    doc["spec"]["trainer"]["val_check_interval"] = 1000
    spec.write_text(json.dumps(doc))
    env = _srun_env(tmp_path, 0, 1, next_port(), 0)
    (tmp_path / "bin" / "scontrol").write_text(SIGTERMING_SCONTROL)
    out = tmp_path / "out-0.txt"
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(tmp_path / "run")],
                                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    procs = [(proc, out)]
    try:
        _wait_for_step(out, 20, procs)
        os.kill(proc.pid, signal.SIGUSR2)
        _wait(procs, TIMEOUT_S)
    finally:
        _kill(procs)
    text = out.read_text()
    assert "requeue: scontrol requeue 4242 done" in text, text[-3000:]
    deadline = time.monotonic() + 5
    while "requeued" not in hook.events() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hook.events() == ["started", "requeued"], (hook.requests, text[-3000:])
    requeued = hook.bodies()[1]
    assert requeued["event"] == "requeued" and requeued["job"] == "tiny" and requeued["max_steps"] == 400
    assert requeued["handle"] == "slurm://lab/4242" and requeued["profile"] == "local"
    assert 20 <= requeued["step"] < 400 and requeued["error"] is None
    assert not (tmp_path / "run" / "summary.json").exists()


def _notifier(notify: dict[str, Any], environ: dict[str, str] | None = None):
    from jobgen.jobdir import ResolvedSpec
    from jobgen.train.notify import Notifier

    resolved = ResolvedSpec.model_validate(resolved_doc({**TINY_YAML, "name": "unit", "notify": notify}
                                                        | ({"secrets": [TOKEN_ENV]} if environ else {})))
    return Notifier(resolved.spec.notify, resolved, Path("/runs/unit"), environ or {})


def test_a_failed_attempt_is_retried_once(hook: Hook) -> None:
    hook.statuses = [500]
    notifier = _notifier({"webhook": {"url": hook.url, "token_env": TOKEN_ENV}}, {TOKEN_ENV: TOKEN})
    assert notifier.send("started", step=0) is True
    assert [r["status"] for r in hook.requests] == [500, 200]
    assert all(r["headers"]["Authorization"] == f"Bearer {TOKEN}" for r in hook.requests)


def test_unreachable_webhook_and_failing_command_warn_and_never_raise(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:  # a port that refuses connections: bound, never listening
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
        notifier = _notifier({"webhook": {"url": url}, "command": [sys.executable, "-c", "import sys; sys.exit(3)"],
                              "timeout_s": 2})
        began = time.monotonic()
        assert notifier.send("finished", step=20) is False
    assert time.monotonic() - began < 15
    err = capsys.readouterr().err
    assert "notification 'finished' to the webhook failed twice (cannot reach the URL" in err
    assert "exited 3" in err and "training is not affected" in err


def test_missing_token_is_reported_without_sending(hook: Hook, capsys: pytest.CaptureFixture[str]) -> None:
    notifier = _notifier({"webhook": {"url": hook.url, "token_env": TOKEN_ENV}}, {"OTHER": "x"})
    assert notifier.send("started") is False
    assert not hook.requests and f"${TOKEN_ENV} (token_env) is not set on this node" in capsys.readouterr().err


HOSTILE_REASON = 'rank 1 said "no"\nand\tthen \x1b[2J' + "é" * 40 + "\udcff" + "x" * 300  # quotes, newline, control, non-UTF-8 (surrogate), > 300 bytes


def test_restart_carries_class_reason_restarts_used_and_budget_and_takes_a_hostile_reason(hook: Hook) -> None:
    """``restart``: the other events' keys plus class, reason, restarts_used and max_restarts; the
    body's ``restart`` is the restart's number. A reason with quotes, newlines, control characters,
    a lone surrogate and 300+ bytes arrives as the same text; one over 1000 characters is cut."""
    from jobgen.events.notifier import REASON_CHARS

    notifier = _notifier({"webhook": {"url": hook.url}})
    entry = {"restart": 2, "class": "infrastructure", "reason": HOSTILE_REASON, "rule": "hang", "evidence": "x", "exit_code": 201}
    assert notifier.send_restart(entry, 3, step=40) is True
    assert notifier.send_restart({**entry, "reason": "y" * 5000}, 3) is True
    first, second = hook.bodies()
    assert set(first) == {"event", "job", "handle", "step", "max_steps", "train_loss", "val_loss", "gpu_hours", "time", "host",
                          "run_dir", "profile", "restart", "error", "class", "reason", "restarts_used", "max_restarts"}
    assert (first["event"], first["job"], first["step"], first["restart"]) == ("restart", "unit", 40, 2)
    assert (first["class"], first["restarts_used"], first["max_restarts"]) == ("infrastructure", 2, 3)
    assert first["reason"] == HOSTILE_REASON  # JSON escapes every character of it, the lone surrogate too
    assert len(second["reason"]) == REASON_CHARS and second["reason"].endswith("...")


def test_a_malformed_restart_record_is_sent_with_nulls_and_a_filtered_event_is_not_sent(hook: Hook) -> None:
    notifier = _notifier({"webhook": {"url": hook.url}})
    assert notifier.send_restart({"restart": "1; rm -rf /", "class": ["x"], "reason": 7}, 2) is True
    body = hook.bodies()[0]
    assert (body["class"], body["reason"], body["restarts_used"], body["max_restarts"], body["restart"]) == (None, None, None, 2, 0)
    quiet = _notifier({"webhook": {"url": hook.url}, "events": ["failed"]})
    assert quiet.send_restart({"restart": 1, "class": "unknown", "reason": "r"}, 1) is True
    assert len(hook.requests) == 1  # "restart" not in notify.events: nothing sent


def test_a_spec_lists_restart_among_its_events_and_a_local_restart_count_is_the_bodys_restart() -> None:
    from jobgen.events.notifier import RESTART_COUNT_ENV
    from jobgen.specs.notify import NOTIFY_EVENTS

    assert "restart" in NOTIFY_EVENTS
    notifier = _notifier({"command": ["true"]}, {RESTART_COUNT_ENV: "2", "TORCHELASTIC_RESTART_COUNT": "0"})
    assert notifier.body("started", step=0)["restart"] == 2
    assert _notifier({"command": ["true"]}, {RESTART_COUNT_ENV: "x\n", "SLURM_RESTART_COUNT": "4"}).body("started")["restart"] == 4


def test_a_restart_the_batch_script_recorded_is_sent_before_started_and_added_to_summary(hook: Hook, tmp_path: Path) -> None:
    """SLURM: the batch script appended the record (tests/script/test_sbatch_restart.py checks the
    line); at the requeued job's start (SLURM_RESTART_COUNT 1) rank zero sends ``restart`` with it,
    then ``started``; summary.json gets the records. A time-limit requeue later (count 2, no record
    2) sends no ``restart``; a malformed record file is no record and no traceback."""
    from jobgen.train.notify import NotifyCallback
    from jobgen.train.run import recorded_restarts

    records = tmp_path / "slurm-42.jsonl"
    records.write_text('{"restart": 1, "class": "infrastructure", "reason": "exit 137 on node2", "exit_code": 137, "at": "x"}\n')
    env = {"JOBGEN_RESTART_RECORD": str(records), "SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "42"}
    spec = {"webhook": {"url": hook.url}}
    callback = NotifyCallback(_notifier(spec, env))
    callback.on_train_start(None, None)
    callback.notifier.wait()
    assert hook.events() == ["restart", "started"]
    body = hook.bodies()[0]
    assert (body["class"], body["reason"], body["restarts_used"], body["restart"]) == ("infrastructure", "exit 137 on node2", 1, 1)
    summary = recorded_restarts({"global_step": 20}, 3, env)
    assert summary["restarts"]["used"] == 1 and summary["restarts"]["history"][0]["reason"] == "exit 137 on node2"
    assert recorded_restarts({"global_step": 20}, 0, env) == {"global_step": 20}  # no budget: nothing added

    hook.requests.clear()
    later = NotifyCallback(_notifier(spec, env | {"SLURM_RESTART_COUNT": "2"}))
    later.on_train_start(None, None)
    later.notifier.wait()
    assert hook.events() == ["started"]
    records.write_bytes(b"\xff\xfe{not json\n" + b"[1, 2]\n" + b'"' * 300 + b"\n")
    hook.requests.clear()
    garbled = NotifyCallback(_notifier(spec, env))
    garbled.on_train_start(None, None)
    garbled.notifier.wait()
    assert hook.events() == ["started"]
    assert recorded_restarts({}, 3, env)["restarts"] == {"max_restarts": 3, "used": 0, "history": []}
