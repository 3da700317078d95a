"""User code on the real 2-node lab cluster: the user's own LightningModule / LightningDataModule
(``model``/``data`` by ``class_path`` + ``init_args``) trained through ``jobgen submit``, from an
immutable code snapshot that survives an edit of the working tree and a requeue.

The example package ``examples/usercode/tinychar`` (not jobgen's) and a spec naming its classes
are committed to a temporary git repository, so the snapshot does not depend on the jobgen
checkout's state. The lab nodes share the host's filesystem, so the run directory and the
snapshot under it are where the nodes read them.
"""

from __future__ import annotations

import json
import re

import pytest
from lab import run_slurm

from tests.conftest import REPO
from tests.integration.slurm.test_jobgen_on_lab import (  # noqa: F401 - jobgen: the fixture
    _requeue_now,
    _wait_for_checkpoint,
    job_id,
    jobgen,
    run_dir,
)
from tests.integration.usercode_repo import git, user_repo

pytestmark = pytest.mark.slurm_lab

def test_user_module_trains_across_two_nodes_from_its_snapshot_through_an_edit_and_a_requeue(jobgen, slurm_lab):  # noqa: F811
    """Acceptance: a class_path model + data module trains on 2 nodes to COMPLETED;
    after submit the working tree's package is broken (it raises on import) and the job is
    requeued mid-run: it resumes at its checkpoint's global step with the same snapshot, and
    summary.json's code.commit is the repository's HEAD at submit."""
    repo, spec, head = user_repo(jobgen.root, "lab-usercode", max_steps=120, every=20)
    # The user's shell has the package on PYTHONPATH (README: export PYTHONPATH=.../usercode), for
    # submit's import check - and the job inherits it: the snapshot must still come first.
    jobgen.env["PYTHONPATH"] = f"{REPO}:{repo / 'usercode'}"
    jobgen.profile()
    handle = jobgen.submit(str(spec))
    jid, run = job_id(handle), run_dir(jobgen, "lab-usercode")
    record = json.loads((run / "code" / head / ".jobgen-code.json").read_text())
    assert record["commit"] == head and record["dirty"] is False, record

    first = _wait_for_checkpoint(run, 300)
    broken = "raise RuntimeError('the edited working tree was imported')\n"
    model_py = repo / "usercode" / "tinychar" / "model.py"
    model_py.write_text(broken + model_py.read_text())
    run_slurm(slurm_lab, "scontrol", "requeue", jid)
    _requeue_now(slurm_lab, jid)
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    everything = jobgen("logs", "--rank", "all", handle).stdout
    assert final == "COMPLETED", f"{seen}\n{everything[-4000:]}"
    assert "the edited working tree was imported" not in everything
    log = jobgen("logs", handle).stdout
    assert "restart 1" in log, log[-3000:]
    # the newest checkpoint (step-N.ckpt or last.ckpt): a checkpoint step, at or after the first one
    resumed = re.search(r"^resume: auto - resuming from \S+\.ckpt \(step (\d+)\)$", log, re.M)
    assert resumed, log[-3000:]
    step = int(resumed.group(1))
    assert step >= int(first.stem.split("-")[1]) and step % 20 == 0 and step < 120, log[-3000:]

    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 120 and summary["world_size"] == 2, summary
    assert summary["model"] == "tinychar.CharModel" and summary["data"] == "tinychar.CharDataModule"
    assert summary["resumed_from_step"] == step, summary
    assert summary["code"]["commit"] == head and summary["code"]["dirty"] is False, summary["code"]
    assert summary["code"]["dir"] == str(run / "code" / head), summary["code"]
    assert git(repo, "status", "--porcelain") == "M usercode/tinychar/model.py"  # the edit stayed in the working tree
    print(f"\nusercode job: checkpoint {first.name} before the requeue, resumed at step {step}, "
          f"COMPLETED at 120 with code {head[:12]}; states {seen}")
