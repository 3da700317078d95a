"""A Kubernetes run's progress from its rank-zero pod's log (jobgen/backends/kubernetes/progress.py):
the line format the entrypoint prints (jobgen.train.callbacks.LineProgress), hostile log text,
and `jobgen status` of a running PyTorchJob through the in-memory fake API server of
tests/unit/test_k8s_submit.py (emulation: the real API server runs in tests/integration/k8s;
its pod log is the kubelet's, which this fake answers with recorded text)."""

from __future__ import annotations

import datetime
import json
import re

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from jobgen.backends.base import SubmitOptions, SubmittedJob
from jobgen.backends.kubernetes import backend as k8s
from jobgen.backends.kubernetes.progress import LIMIT_BYTES, TAIL_LINES, last_progress, parse_line, pod_progress
from jobgen.cli import cli
from tests.unit.test_k8s_submit import FakeCluster, job_dir  # noqa: F401 - the fixture is used by name

NOW = datetime.datetime(2026, 11, 29, 12, 0, 0, tzinfo=datetime.timezone.utc).timestamp()
LINE = "step 120/1000 | train_loss 2.4512 | lr 2.91e-03 | 23.4k tok/s | mfu 41.2% | peak mem 1.23 GB gpu | eta 0:03:12"


def stamped(seconds_before: float, text: str) -> str:
    when = datetime.datetime.fromtimestamp(NOW - seconds_before, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.123456789Z") + " " + text


def test_a_progress_line_gives_step_rate_and_eta():
    assert parse_line(LINE) == (120, 1000, 23400.0, 192.0)
    assert parse_line("step 40/60 | train_loss 2.5653 | lr 2.44e-03 | 10.8k tok/s | peak mem 0.69 GB rss | eta 0:00:14") == \
        (40, 60, 10800.0, 14.0)
    assert parse_line("step 5/9000000 | 1.0k tok/s | eta 2 days, 3:04:05") == (5, 9000000, 1000.0, 2 * 86400 + 3 * 3600 + 4 * 60 + 5)
    assert parse_line("step 3/10 | 12.5 samples/s") == (3, 10, None, None)  # a class_path module without tokens
    # a field in no known form is not read: neither a rate nor an ETA
    assert parse_line("step 1/10 | 99999999999999999.9k tok/s | eta 0:00:1") == (1, 10, None, None)


@pytest.mark.parametrize("text", [
    "validation at step 100: val_loss 2.5012",
    "step 20 (epoch 1) | train_loss 3.3",  # a run without max_steps: no ETA to give
    "step 11/10 | eta 0:00:01",  # past max_steps
    "step 0/10 | eta 0:00:01",
    "step 1/0",
    "step 99999999999999/99999999999999 | eta 0:00:01",  # more digits than a step has
    "step 1/10 | 9999999999999.9k tok/s",  # above 10^12 tokens/s
    "xx step 1/10 | eta 0:00:01",  # not at the start of the line
    "step 1/10 | eta 0:00:01" + " " * 1000,  # longer than a progress line
    "step 1/10\x1b[2J | eta 0:00:01",
    "step １/１０ | eta 0:00:01",  # fullwidth digits are not ASCII digits
    "",
])
def test_lines_that_are_not_progress_lines_are_skipped(text):
    assert parse_line(text) is None


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=120) | st.builds(lambda a, b: f"step {a}/{b} | {b}k tok/s | eta {a}", st.text(max_size=8),
                                               st.text(max_size=8)))
def test_any_log_text_parses_to_a_bounded_progress_or_nothing(text):
    parsed = parse_line(text)
    assert parsed is None or (0 < parsed[0] <= parsed[1] and (parsed[2] is None or 0 <= parsed[2] <= 10**12))
    p = last_progress([f"2026-11-29T11:59:00Z {text}", text], "pod p log", now=NOW)
    assert p is None or (p.eta_s is None or p.eta_s >= 0)


def test_the_last_progress_line_wins_and_the_eta_counts_from_when_it_was_written():
    lines = [stamped(90, "step 100/1000 | 20.0k tok/s | eta 0:04:00"), stamped(60, LINE),
             stamped(30, "validation at step 120: val_loss 2.5"), stamped(20, "x" * 300 + "\n\x00\ufffd"),
             "not-a-time " + "step 999/1000 | eta 0:00:01", stamped(10, "step 130/100 | eta 0:00:01")]
    p = last_progress(lines, "pod quickstart-master-0 log", now=NOW)
    assert (p.step, p.max_steps, p.tokens_per_s, p.tokens_per_step) == (120, 1000, 23400.0, None)
    assert p.updated_s_ago == pytest.approx(59.877, abs=0.001)  # the line's time has nanoseconds .123456789
    assert p.eta_s == pytest.approx(192 - 59.877, abs=0.001) and p.source == "pod quickstart-master-0 log"
    done = last_progress([stamped(5, "step 60/60 | 11.2k tok/s | eta 0:00:00")], "pod p log", now=NOW)
    assert done.eta_s == 0.0
    late = last_progress([stamped(500, LINE)], "pod p log", now=NOW)
    assert late.eta_s == 0.0  # the line's ETA has passed: not negative
    assert last_progress([stamped(1, "no step here")], "pod p log", now=NOW) is None


def running_pod(name: str, labels: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": name, "uid": name, "labels": {"training.kubeflow.org/job-name": "quickstart", **(labels or {})}},
            "status": {"phase": "Running", "containerStatuses": [{"name": "pytorch", "state": {"running": {}}, "restartCount": 0}]}}


@pytest.fixture
def fake(monkeypatch):
    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    return cluster


PODS = "/api/v1/namespaces/training/pods"


def test_status_of_a_running_pytorchjob_shows_the_rank_zero_pods_progress(job_dir, fake, monkeypatch):  # noqa: F811
    handle = k8s.KubernetesBackend().submit(job_dir("resources.nodes=2"), SubmitOptions(), lambda _: None).handle
    fake.objects[f"{PODS}/quickstart-master-0"] = running_pod("quickstart-master-0")
    fake.objects[f"{PODS}/quickstart-worker-0"] = running_pod("quickstart-worker-0")
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = (now - datetime.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S.000000000Z")
    fake.logs = {f"{PODS}/quickstart-master-0/log": [f"{stamp} jobgen.train: quickstart\n{stamp} {LINE}\n".encode(), b"\xff\xfe half"]}
    # the worker pod's log is never asked for: rank zero runs on the Master
    result = CliRunner().invoke(cli, ["status", str(handle)], prog_name="jobgen")
    assert result.exit_code == 0, result.output
    progress = next(line for line in result.output.splitlines() if "progress:" in line)
    # the line's ETA of 3:12, less the 30 s since the kubelet stamped it (and the seconds this test took)
    assert re.fullmatch(r"  progress: step 120/1000, 23,400 tokens/s \(last log interval\), ETA 0:02:[2-4][0-9] "
                        r"\(pod quickstart-master-0 log line written 0:00:[3-5][0-9] ago\)", progress), progress
    log_calls = [c for c in fake.calls if c[1].endswith("/log")]
    assert [c[1] for c in log_calls] == [f"{PODS}/quickstart-master-0/log"]
    query = dict(log_calls[0][2])
    assert query == {"container": "pytorch", "timestamps": "true", "tailLines": str(TAIL_LINES), "limitBytes": str(LIMIT_BYTES)}
    doc = json.loads(CliRunner().invoke(cli, ["status", str(handle), "-o", "json"], prog_name="jobgen").output)
    assert doc["progress"]["step"] == 120 and doc["progress"]["source"] == "pod quickstart-master-0 log"
    assert 140 <= doc["progress"]["eta_s"] <= 163


def test_an_elastic_job_reads_every_pod_and_takes_the_one_rank_zero_prints_on(job_dir, fake):  # noqa: F811
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    for name in ("quickstart-worker-0", "quickstart-worker-1"):
        fake.objects[f"{PODS}/{name}"] = running_pod(name)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    fake.logs = {f"{PODS}/quickstart-worker-0/log": [f"{stamp} elastic: global rank 0 runs on quickstart-worker-1\n".encode()],
                 f"{PODS}/quickstart-worker-1/log": [f"{stamp} step 7/60 | 1.5k tok/s | eta 0:01:00\n".encode()]}
    p = pod_progress(SubmittedJob(handle))
    assert (p.step, p.max_steps, p.tokens_per_s, p.source) == (7, 60, 1500.0, "pod quickstart-worker-1 log")


def test_no_progress_before_the_pods_start_or_when_a_log_is_gone_or_hostile(job_dir, fake):  # noqa: F811
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    assert pod_progress(SubmittedJob(handle)) is None  # no pods yet
    pending = running_pod("quickstart-master-0")
    pending["status"] = {"phase": "Pending"}
    fake.objects[f"{PODS}/quickstart-master-0"] = pending
    assert pod_progress(SubmittedJob(handle)) is None and not [c for c in fake.calls if c[1].endswith("/log")]
    fake.objects[f"{PODS}/quickstart-master-0"] = running_pod("quickstart-master-0")
    fake.logs = {}  # the kubelet has no log of it (400): no progress, no error
    assert pod_progress(SubmittedJob(handle)) is None
    hostile = b"2026-11-29T11:59:00Z step 5/10 | eta 0:00:0\x00\n" + b"\xff" * 300 + b"\n2026-13-45T99:99:99Z step 5/10\n"
    fake.logs = {f"{PODS}/quickstart-master-0/log": [hostile]}
    assert pod_progress(SubmittedJob(handle)) is None
    result = CliRunner().invoke(cli, ["status", str(handle)], prog_name="jobgen")
    assert result.exit_code == 0 and "progress:" not in result.output and "Traceback" not in result.output
