"""One run directory, one run (issue 30, finding 6): the entrypoint refuses to resume (or to call
"nothing to do") a run directory that holds a run of another profile or shape, whoever started
it (``jobgen submit``, or ``sbatch job.sbatch`` by hand in a committed job directory)."""

from __future__ import annotations

import json
from pathlib import Path

from jobgen.jobdir import RUN_IDENTITY_FILE


def test_the_entrypoint_refuses_another_profiles_run_directory(tmp_path: Path, write_spec, run_entrypoint) -> None:
    run_dir = tmp_path / "runs" / "tiny"
    local = write_spec({"trainer": {"max_steps": 4, "val_check_interval": 4}, "checkpoint": {"every_n_steps": 4}},
                       filename="local.json", devices_per_node=1, world_size=1)
    first = run_entrypoint("--spec", str(local), "--run-dir", str(run_dir), timeout=300)
    assert first.code == 0, first.output
    assert json.loads((run_dir / RUN_IDENTITY_FILE).read_text())["profile"] == "local"

    doc = json.loads(local.read_text())
    other = tmp_path / "a100.json"
    other.write_text(json.dumps(doc | {"profile": "slurm-a100"}))
    refused = run_entrypoint("--spec", str(other), "--run-dir", str(run_dir), timeout=300)
    assert refused.code == 2, refused.output
    assert "run already complete" not in refused.stdout, refused.output
    assert "'local'" in refused.stderr and "'slurm-a100'" in refused.stderr and "--set name=" in refused.stderr, refused.output

    longer = local.with_name("longer.json")  # the same profile and shape, more steps: the same run, resumed
    longer.write_text(json.dumps(doc | {"spec": doc["spec"] | {"trainer": doc["spec"]["trainer"] | {"max_steps": 6}}}))
    resumed = run_entrypoint("--spec", str(longer), "--run-dir", str(run_dir), timeout=300)
    assert resumed.code == 0 and "resume: auto - resuming from" in resumed.stdout, resumed.output
