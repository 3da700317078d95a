"""``squeue --json`` of SLURM 22.05 through 25.05, read by ``jobgen status`` (the SLURM backend)
through the fake squeue (tests/fakes/slurm).

The fixtures under tests/unit/fixtures/slurm_json/<release>/ were written for these tests from
each release's shape as SchedMD's source dumps it (22.05: openapi/v0.0.38 ``jobs.c``; 23.02 -
25.05: ``data_parser/v0.0.39`` - ``v0.0.43`` ``parsers.c``, the CLI ``meta`` from
``interfaces/data_parser.c``), cross-checked against the slurmrestd test assets of
rackslab/Slurm-web (24.05 - 25.05) and the lab's real 22.05. Every release holds the SAME jobs
(running, pending, completed, failed with exit 1, cancelled, a job array), so one table of
expectations checks every shape: what differs between releases is only how SLURM spells it.

Two variants within a release: ``23.02/failed-23.02.3.json`` (exit code a bare wait(2) status,
before 23.02.4 wrapped it in ``{set, infinite, number}``) and ``24.05/pending-24.05.3.json``
(``job_resources: {}`` for a pending job, before 24.05.5 made it ``null``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobgen.backends.base import SubmittedJob
from jobgen.backends.slurm import backend as slurm_backend
from jobgen.backends.slurm.squeue_json import decode_squeue
from jobgen.jobdir import JobHandle
from tests.fakes.slurm.fakeslurm import json_reply, reply

FIXTURES = Path(__file__).parent / "fixtures" / "slurm_json"
RELEASES = ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05"]
SUBMIT = 1764000000
START = SUBMIT + 60

#: case -> (job id, state, details, usage (kind, devices, elapsed s) or None); the same for every release.
EXPECTED: dict[str, tuple[int, str, dict[str, str], tuple[str, int, float | None] | None]] = {
    "running": (1001, "RUNNING", {"name": "gpt-small", "nodes": "node[1-2]", "reason": "None", "restarts": "0", "cpus": "8"},
                ("gpu", 8, None)),
    "pending": (1002, "PENDING", {"name": "gpt-small", "nodes": "", "reason": "Resources", "restarts": "0"}, None),
    "completed": (1003, "COMPLETED", {"name": "gpt-small", "nodes": "node1", "reason": "None", "restarts": "0", "cpus": "4",
                                      "exit_code": "0:0"}, ("gpu", 4, 1800.0)),
    "failed": (1004, "FAILED", {"name": "gpt-small", "nodes": "node[1-2]", "reason": "NonZeroExitCode", "restarts": "1",
                                "cpus": "8", "exit_code": "1:0"}, ("gpu", 8, 95.0)),
    "cancelled": (1005, "CANCELLED", {"name": "gpt-small", "nodes": "node2", "reason": "None", "restarts": "0", "cpus": "4",
                                      "exit_code": "0:15"}, ("gpu", 4, 42.0)),
}


def fixture(release: str, case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / release / f"{case}.json").read_text())


def status_of(fake, doc: dict[str, Any] | None, job: str, *, raw: str | None = None) -> dict[str, Any]:
    fake.respond("squeue", json_reply(doc) if raw is None else reply(raw))
    return slurm_backend.SlurmBackend().status(SubmittedJob(JobHandle.parse(f"slurm://gpucluster/{job}"))).to_json()


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_release_reads_the_same_job_alike(slurm, release, case):
    job, state, details, usage = EXPECTED[case]
    if case == "pending" and release not in ("22.05", "23.02"):  # those fixtures' start_time is 0: no estimate
        details = details | {"expected_start": "2025-11-24T18:00:00+00:00"}  # SLURM's estimate, start_time 1764007200
    got = status_of(slurm, fixture(release, case), str(job))
    assert (got["state"], got["source"], got["details"]) == (state, "squeue", details), (release, got)
    if usage is None:
        assert got["usage"] is None
        return
    kind, devices, elapsed = usage
    assert (got["usage"]["device_kind"], got["usage"]["devices"]) == (kind, devices)
    assert got["usage"]["start"] == "2025-11-24T16:01:00+00:00"
    if elapsed is None:  # still running: counted to now, never to its time limit
        assert got["usage"]["end"] is None and got["usage"]["elapsed_s"] > 3600
    else:
        assert got["usage"]["elapsed_s"] == elapsed


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_reads_the_array_and_its_tasks(slurm, release):
    got = status_of(slurm, fixture(release, "array"), "1010")
    assert (got["state"], got["source"]) == ("RUNNING", "squeue")
    assert [(t["handle"], t["state"], t["details"].get("exit_code")) for t in got["tasks"]] == [
        ("slurm://gpucluster/1010_0", "COMPLETED", "0:0"), ("slurm://gpucluster/1010_1", "RUNNING", None),
        ("slurm://gpucluster/1010_2", "PENDING", None), ("slurm://gpucluster/1010_3", "PENDING", None)]
    task = status_of(slurm, fixture(release, "array"), "1010_3")
    assert (task["state"], task["details"]["reason"]) == ("PENDING", "JobArrayTaskLimit")


#: The shape each release's document is decoded as (chosen from its own meta).
SHAPES = {"22.05": "openapi/v0.0.38 (SLURM 22.05.8)", "23.02": "data_parser/v0.0.39 (SLURM 23.02.7)",
          "23.11": "data_parser/v0.0.40 (SLURM 23.11.10)", "24.05": "data_parser/v0.0.41 (SLURM 24.05.8)",
          "24.11": "data_parser/v0.0.42 (SLURM 24.11.6)", "25.05": "data_parser/v0.0.43 (SLURM 25.05.3)"}


@pytest.mark.parametrize("release", RELEASES)
def test_the_shape_comes_from_meta_and_job_resources_give_the_allocation(release):
    running = decode_squeue((FIXTURES / release / "running.json").read_text())
    assert running.shape == SHAPES[release] and running.problem is None
    job = running.jobs[0]
    assert (job.node_count, job.allocated_cpus, job.allocated_nodes, job.flags) == (2, 8, ("node1", "node2"), ("RUNNING",))
    pending = decode_squeue((FIXTURES / release / "pending.json").read_text()).jobs[0]
    assert (pending.state, pending.allocated_cpus, pending.allocated_nodes) == ("PENDING", None, ())


def test_before_23_02_4_the_exit_code_is_a_bare_wait_status(slurm):
    got = status_of(slurm, fixture("23.02", "failed-23.02.3"), "1004")
    assert (got["state"], got["details"]["exit_code"]) == ("FAILED", "1:0")


def test_a_pending_job_of_24_05_before_24_05_5_has_empty_job_resources(slurm):
    got = status_of(slurm, fixture("24.05", "pending-24.05.3"), "1002")
    assert (got["state"], got["usage"]) == ("PENDING", None) and "cpus" not in got["details"]


# --------------------------------------------------------------------------- shapes jobgen does not know


def _future(doc: dict[str, Any]) -> dict[str, Any]:
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.44"
    doc["meta"]["slurm"]["release"] = "25.11.0"
    return doc


@pytest.mark.parametrize(("doc", "raw", "words"), [
    (_future(fixture("25.05", "failed")), None, "data_parser/v0.0.44"),
    ({"jobs": fixture("25.05", "failed")["jobs"]}, None, "no meta"),
    (None, "squeue: error: something else\n", "not JSON"),
    (None, "[1, 2]\n", "not a JSON object"),
], ids=["newer-data-parser", "no-meta", "not-json", "not-an-object"])
def test_a_shape_jobgen_does_not_know_is_unknown_with_the_reason(slurm, doc, raw, words):
    got = status_of(slurm, doc, "1004", raw=raw)
    assert (got["state"], got["source"]) == ("UNKNOWN", "squeue"), got
    assert words in got["details"]["reason"] and "squeue --json" in got["details"]["reason"], got


@pytest.mark.parametrize(("release", "field", "value", "words"), [
    ("22.05", "exit_code", {"set": True, "infinite": False, "number": 256}, "jobs[0].exit_code"),
    ("23.11", "exit_code", 256, "jobs[0].exit_code"),
    ("24.05", "job_state", "FAILED", "jobs[0].job_state"),
    ("24.05", "job_resources", {"nodes": "node[1-2]", "allocated_cores": 8}, "jobs[0].job_resources.nodes"),
    ("23.02", "start_time", {"set": True, "infinite": False, "number": 1}, "jobs[0].start_time"),
], ids=["22.05-wrapped-exit", "23.11-bare-exit", "24.05-state-string", "24.05-old-job-resources", "23.02-wrapped-time"])
def test_a_field_in_another_releases_shape_is_unknown_naming_the_field(slurm, release, field, value, words):
    doc = fixture(release, "failed")
    doc["jobs"][0][field] = value
    got = status_of(slurm, doc, "1004")
    assert (got["state"], got["source"]) == ("UNKNOWN", "squeue"), got
    assert words in got["details"]["reason"], got


#: How each release spells "no estimate" in a pending job's ``start_time``: 22.05 and 23.02 a bare
#: number (0, or NO_VAL), 23.11+ ``{set, infinite, number}`` unset, infinite or 0.
NO_ESTIMATE = [("22.05", 0), ("22.05", 0xFFFFFFFE), ("23.02", 0xFFFFFFFF),
               ("23.11", {"set": False, "infinite": False, "number": 1764007200}),
               ("24.05", {"set": True, "infinite": False, "number": 0}), ("25.05", {"set": True, "infinite": True, "number": 0})]


@pytest.mark.parametrize(("release", "start_time"), NO_ESTIMATE)
def test_a_pending_job_without_an_estimate_has_no_expected_start(slurm, release, start_time):
    doc = fixture(release, "pending")
    doc["jobs"][0]["start_time"] = start_time
    got = status_of(slurm, doc, "1002")
    assert (got["state"], got["usage"]) == ("PENDING", None) and "expected_start" not in got["details"], got


@pytest.mark.parametrize(("release", "case", "number"), [
    ("23.11", "pending", 10**15), ("24.05", "pending", -(2**62)), ("25.05", "running", 2**62)])
def test_a_time_beyond_the_calendar_is_unknown_naming_the_field(slurm, release, case, number):
    """A 64-bit ``start_time`` no calendar date has (after year 9999, or before year 1) makes the
    job UNKNOWN naming the field, as any field that does not decode does: never a traceback."""
    job, _, _, _ = EXPECTED[case]
    doc = fixture(release, case)
    doc["jobs"][0]["start_time"] = {"set": True, "infinite": False, "number": number}
    got = status_of(slurm, doc, str(job))
    assert (got["state"], got["source"]) == ("UNKNOWN", "squeue"), got
    assert "jobs[0].start_time" in got["details"]["reason"] and str(number) in got["details"]["reason"], got
