"""`jobgen ls` on the real lab: a local run and a 2-node SLURM job submitted from one
machine (one state index) are listed with the states `jobgen status` gives, and the finished lab
job's CPU-hours are its allocated CPUs x its elapsed time."""

from __future__ import annotations

import json

import pytest

from tests.integration.slurm.test_jobgen_on_lab import job_id, jobgen  # noqa: F401 - jobgen: the fixture

pytestmark = pytest.mark.slurm_lab

LOCAL_SPEC = """\
name: ls-local
model: {preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}
data: {max_bytes: 200000}
trainer: {precision: 32-true, micro_batch_size: 4, max_steps: 4, warmup_steps: 1, val_check_interval: 4,
          limit_val_batches: 1, log_every_n_steps: 2}
resources: {devices_per_node: 1}
"""


def test_ls_lists_local_and_slurm_submissions_with_their_states_and_cpu_hours(jobgen):  # noqa: F811
    jobgen.profile()
    (jobgen.root / "local.yaml").write_text(LOCAL_SPEC)
    local = jobgen("submit", "local.yaml", "--profile", "local", "--runs-dir", str(jobgen.root / "local-runs"), timeout=300)
    assert "jobgen: run directory" in local.stdout, local.stdout
    handle = jobgen.submit(jobgen.spec("ls-lab", max_steps=20, every=10))
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    assert final == "COMPLETED", seen

    rows = {row["handle"]: row for row in json.loads(jobgen("ls", "-o", "json").stdout)}
    local_handle = f"local://{(jobgen.root / 'local-runs' / 'ls-local').resolve()}"
    assert set(rows) == {handle, local_handle}, rows
    for listed in rows.values():  # the same answer as `jobgen status`, never a guess
        status = jobgen.status(listed["handle"])
        assert (listed["state"], listed["source"]) == (status["state"], status["source"]), (listed, status)
        assert listed["stale"] is None
    lab_row, local_row = rows[handle], rows[local_handle]
    assert (lab_row["cluster"], lab_row["name"], lab_row["num_nodes"], lab_row["devices_per_node"]) == ("jobgenlab", "ls-lab", 2, 1)
    usage = lab_row["usage"]
    assert usage["device_kind"] == "cpu" and usage["devices"] >= 2 and usage["elapsed_s"] > 0, usage
    assert usage["cpu_hours"] == round(usage["devices"] * usage["elapsed_s"] / 3600, 6), usage
    assert (local_row["state"], local_row["cluster"], local_row["usage"]["devices"]) == ("COMPLETED", "local", 1), local_row
    only_lab = json.loads(jobgen("ls", "--cluster", "jobgenlab", "-o", "json").stdout)
    assert [row["handle"] for row in only_lab] == [handle]
    table = jobgen("ls").stdout
    assert f"slurm://jobgenlab/{job_id(handle)}" in table and "CPU-h" in table, table
    print(f"\njobgen ls:\n{table}")
