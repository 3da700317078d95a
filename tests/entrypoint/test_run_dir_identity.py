"""One run directory, one run: the entrypoint refuses to resume (or to call
"nothing to do") a run directory that holds a run of another profile or shape, whoever started
it (``jobgen submit``, or ``sbatch job.sbatch`` by hand in a committed job directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.jobdir import RUN_IDENTITY_FILE


@pytest.mark.slow
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


def test_doing_what_the_refusal_says_lets_the_next_start_continue_that_run(tmp_path: Path) -> None:
    """The refusal's way to continue another shape's run on purpose is complete: doing what its
    hint says (and nothing else) lets the next check pass. Before the fix the hint named only
    the identity file; once it was deleted, the check fell back to summary.json and refused again."""
    import re

    import pytest

    from jobgen.errors import ConfigError
    from jobgen.jobdir import SUMMARY_FILE, ResolvedSpec, RunIdentity, check_run_dir
    from tests.entrypoint.conftest import TINY_SPEC, _merge, resolved_doc

    spec = _merge(TINY_SPEC, {"trainer": {"strategy": "fsdp"}})
    one, two = (ResolvedSpec.model_validate(resolved_doc(spec, devices_per_node=n, world_size=n)) for n in (1, 2))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_run_dir(run_dir, one, claim=True)  # the first run's start
    (run_dir / SUMMARY_FILE).write_text(json.dumps({"profile": "local", "world_size": 1, "strategy": "fsdp"}))
    with pytest.raises(ConfigError) as refused:
        check_run_dir(run_dir, two)
    hint = refused.value.hint or ""
    named = re.findall(r"(\S+\.json)\b", hint.split("on purpose", 1)[-1])  # the files to delete or move away
    assert named, hint
    for name in named:
        path = Path(name) if Path(name).is_absolute() else run_dir / name
        assert path.exists(), (hint, path)
        path.rename(path.with_name(path.name + ".moved"))
    check_run_dir(run_dir, two, claim=True)  # no second refusal
    assert RunIdentity.model_validate_json((run_dir / RUN_IDENTITY_FILE).read_text()) == RunIdentity.of(two)
