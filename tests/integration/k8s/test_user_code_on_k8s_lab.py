"""User code on the real kube-apiserver lab: the user-module spec of the SLURM lab test (tinychar's
``class_path`` model and data module, from a committed repository) renders a PyTorchJob that
passes jobgen's offline validation and the server's dry run (``jobgen submit DIR
--dry-run=server``: ConfigMap, PyTorchJob, a Pod from each replica template), with the image as
the code and with the code fetched from one git commit in every pod (``code.git``)."""

from __future__ import annotations

import json

import pytest

from tests.integration.k8s.test_jobgen_on_k8s_lab import cli
from tests.integration.usercode_repo import user_repo

pytestmark = pytest.mark.k8s_lab


@pytest.mark.parametrize("code", ["image", "git"])
def test_user_module_spec_passes_offline_and_server_dry_run(k8s_lab, tmp_path, code):
    _, spec, head = user_repo(tmp_path, "usercode-k8s", max_steps=120, every=20)
    git_code = "{url: 'https://git.example.com/lab/userrepo.git', ref: " + head + "}"
    sets = ["--set", f"code.git={git_code}"] if code == "git" else []
    rendered = cli(k8s_lab, tmp_path, "render", str(spec), "-p", "k8s-h100", *sets)  # offline validation runs here
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert "validation skipped" not in rendered.stdout + rendered.stderr
    job_dir = tmp_path / "manifests" / "k8s-h100" / "usercode-k8s"
    resolved = json.loads((job_dir / "spec.json").read_text())
    assert resolved["spec"]["model"]["class_path"] == "tinychar.CharModel", resolved["spec"]["model"]
    assert resolved["spec"]["data"]["class_path"] == "tinychar.CharDataModule", resolved["spec"]["data"]
    manifest = (job_dir / "pytorchjob.yaml").read_text()
    assert (f"/jobgen-code/{head}" in manifest) == (code == "git"), manifest

    out = cli(k8s_lab, tmp_path, "submit", str(job_dir), "--dry-run=server")
    assert out.returncode == 0, out.stdout + out.stderr
    valid = [line for line in out.stdout.splitlines() if line.endswith("valid (no pruned fields)")]
    assert len(valid) == 4, out.stdout  # ConfigMap, PyTorchJob, Pod master-0, Pod worker-0 (resources.nodes: 2)
    for role in ("master", "worker"):
        assert any(f"Pod usercode-k8s-{role}-0 (from the PyTorchJob's pod template)" in line for line in valid), out.stdout
    assert "nothing was queued or created" in out.stdout
    assert k8s_lab.request("GET", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/usercode-k8s")[0] == 404
