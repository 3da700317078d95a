"""``jobgen ls``'s RESTARTS column and ``-o json`` ``restarts`` from each job's status details
(:func:`jobgen.api.restarts_used`, :attr:`jobgen.api.ListedJob.restart_budget`). The rows are
built here (the backends' status is covered by their own tests: test_local_run_end.py for a
real local run, test_k8s_submit.py for Kubernetes); values read from a scheduler are not trusted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from jobgen import api
from jobgen.backends.base import JobStatus
from jobgen.cli.jobs import ls
from jobgen.jobdir.submission import JobHandle, Submission


def _row(handle: str, details: dict[str, str], budget: int | None) -> api.ListedJob:
    record = Submission.now(handle=handle, job_dir="/jobs/x", run_dir="/runs/x")
    status = JobStatus(JobHandle.parse(handle), "RUNNING", "test", details)
    return api.ListedJob(record, status, "x", 1, 2, "cpu", None, max_restarts=budget)


HOSTILE = ["1 of 2\nFAKE 9 of 9", "\u0663 of 2", "-1 of 2", "1 of \udcff", "\x1b[2J of 3", "9" * 300 + " of 2", "1 of"]


def test_used_and_budget_come_from_the_status_and_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row("local:///runs/a", {"restarts_used": "1 of 3"}, 3),  # jobgen's count and the budget it enforces
            _row("slurm://lab/42", {"restarts": "2"}, 3),  # SLURM's requeue count, the spec's budget
            _row("k8s://ctx/ns/job", {"restarts_used": "0 of 4"}, 0),  # Kubernetes: the job's backoffLimit (profile)
            _row("slurm://lab/43", {}, 0)]
    monkeypatch.setattr(api, "list_jobs", lambda **_: rows)
    doc = json.loads(CliRunner().invoke(ls, ["-o", "json"]).output)
    assert [row["restarts"] for row in doc] == [{"used": 1, "max_restarts": 3}, {"used": 2, "max_restarts": 3},
                                                {"used": 0, "max_restarts": 4}, {"used": None, "max_restarts": 0}]
    table = CliRunner().invoke(ls, []).output.splitlines()
    column = table[0].index("RESTARTS")
    assert [line[column:].split()[0] for line in table[1:5]] == ["1/3", "2/3", "0/4", "-/0"], table


def test_no_budget_and_no_restart_keeps_the_table_without_the_column(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "list_jobs", lambda **_: [_row("slurm://lab/42", {"restarts": "0"}, 0)])
    assert "RESTARTS" not in CliRunner().invoke(ls, []).output


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_count_that_is_not_one_is_unknown_and_never_a_traceback(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    row = _row("ssh://host/runs/x", {"restarts_used": value, "restarts": value}, 2)
    monkeypatch.setattr(api, "list_jobs", lambda **_: [row])
    result = CliRunner().invoke(ls, ["-o", "json"])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert json.loads(result.output)[0]["restarts"] == {"used": None, "max_restarts": 2}  # unknown; the spec's budget
    text = CliRunner().invoke(ls, [])
    assert text.exit_code == 0 and "\x1b" not in text.output and "FAKE" not in text.output
