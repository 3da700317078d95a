"""jobgen against a real kube-apiserver (1.20, etcd, garbage collector; no kubelet): the shipped
profiles' manifests pass offline validation AND the server's dry run (job, ConfigMap, a Pod per
replica template); submit / re-submit / replace / status / logs / cancel through the CLI. With
the optional 1.36 CRD server (Debian sid's apiextensions-apiserver): PyTorchJobs and TrainJobs
under strict field validation and CEL."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobgen.backends import plan
from jobgen.backends.base import SubmitOptions
from jobgen.backends.kubernetes import api as k8s_api
from jobgen.backends.kubernetes import backend as k8s
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.backends.kubernetes.validate import validate_manifest
from jobgen.errors import PlanError, SubmitError
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import EXAMPLES, PROFILES, REPO, TEMPLATES, site_profile

pytestmark = pytest.mark.k8s_lab
K8S_PROFILES = sorted(p.stem for p in PROFILES.glob("k8s-*.yaml"))
CASES = [(profile, example) for profile in K8S_PROFILES for example in sorted(EXAMPLES.glob("*.yaml"))]


def cli(lab, cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m jobgen.cli ARGS`` against the lab (its kubeconfig, a private state dir)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(lab.kubeconfig), "JOBGEN_STATE_DIR": str(cwd / "state")}
    for key in ("JOBGEN_K8S_CONTEXT", "JOBGEN_K8S_NAMESPACE", "JOBGEN_DEBUG"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def lab_profile(tmp_path: Path, base: str) -> str:
    """The shipped profile ``base`` as the lab's site profile: it extends ``base`` and sets its
    example values to the names the lab has (the PriorityClass the k8s conftest creates; the
    rest the API server takes as they are), so a real submit takes it. Named ``base``."""
    return str(site_profile(tmp_path / "lab-profiles", base))


def get(lab, path: str) -> tuple[int, Any]:
    return lab.request("GET", path)


def test_lab_serves_kubernetes_1_20_with_the_pytorchjob_crd(k8s_lab):
    status, version = get(k8s_lab, "/version")
    assert status == 200 and version["gitVersion"] == "v1.20.2", version
    assert "pytorchjobs.kubeflow.org" in k8s_lab.installed_crds
    # 1.20 cannot take the Trainer v2 CRDs (their schemas carry `default: null`).
    assert "trainer-v2.3.0/trainer.kubeflow.org_trainjobs.yaml" in k8s_lab.crd_rejections
    print(f"\n1.20 rejected the TrainJob CRD: {k8s_lab.crd_rejections['trainer-v2.3.0/trainer.kubeflow.org_trainjobs.yaml'][:300]}")
    assert set(k8s_lab.daemon_pids()) >= {"etcd", "kube-apiserver", "kube-controller-manager"}


@pytest.mark.parametrize(("profile", "example"), CASES, ids=[f"{p}-{e.stem}" for p, e in CASES])
def test_shipped_profile_x_example_passes_offline_and_server_dry_run(k8s_lab, profile, example, tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    job_plan = plan(load_spec(example), load_profile(profile, PROFILES), TEMPLATES)  # offline validators run inside
    assert not [w for w in job_plan.warnings if "offline validation skipped" in w], job_plan.warnings
    job_plan.write(tmp_path / "job")
    lines: list[str] = []
    options = SubmitOptions(context="jobgen-lab", kubeconfig=str(k8s_lab.kubeconfig), dry_run=True)
    result = k8s.KubernetesBackend().submit(tmp_path / "job", options, lines.append)
    assert result.action == "validated" and result.handle is None
    checked = [line for line in result.lines if line.endswith("valid (no pruned fields)")]
    roles = ["master"] + (["worker"] if job_plan.world.num_nodes > 1 else [])
    expected = 2 + len(roles)  # ConfigMap, PyTorchJob, one Pod per replica type
    assert len(checked) == expected, result.lines
    for role in roles:
        assert any(f"-{role}-0 (from the PyTorchJob's pod template)" in line for line in checked)
    name = k8s_manifest.k8s_name(job_plan.job_name)[0]
    assert get(k8s_lab, f"/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/{name}")[0] == 404  # dry run persisted nothing


def test_cli_dry_run_server(k8s_lab, tmp_path):
    out = cli(k8s_lab, tmp_path, "submit", str(EXAMPLES / "gpt2-124m-fsdp.yaml"), "-p", "k8s-a100", "--dry-run=server")
    assert out.returncode == 0, out.stderr
    assert "Pod gpt2-124m-fsdp-worker-0 (from the PyTorchJob's pod template): valid" in out.stdout
    assert "nothing was queued or created" in out.stdout


def _mutations() -> list[tuple[str, Any, bool]]:
    """(name, mutate(job), does the 1.20 server reject it?)"""
    def container(job: dict[str, Any], role: str = "Worker") -> dict[str, Any]:
        return job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]

    return [
        ("memory request above its limit", lambda j: container(j)["resources"]["requests"].__setitem__("memory", "4000000Mi"), True),
        ("half a GPU", lambda j: (container(j)["resources"]["requests"].__setitem__("nvidia.com/gpu", "0.5"),
                                  container(j)["resources"]["limits"].__setitem__("nvidia.com/gpu", "0.5")), True),
        ("volumeMount without a volume", lambda j: container(j)["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"}), True),
        ("bad env var name", lambda j: container(j)["env"].append({"name": "MY VAR", "value": "1"}), True),
        ("port name over 15 chars", lambda j: container(j)["ports"][0].__setitem__("name", "pytorchjob-port-long"), True),
        ("misspelt container field", lambda j: container(j).__setitem__("imagePullPolicyy", "Always"), True),
        ("misspelt job field", lambda j: j["spec"].__setitem__("nprocsPerNode", "8"), True),
        # The operator's webhook rules: the bare API server has no webhook, so it accepts these.
        ("Master replicas 2", lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].__setitem__("replicas", 2), False),
        ("no container named pytorch", lambda j: container(j, "Master").__setitem__("name", "main"), False),
    ]


def test_offline_validation_rejects_everything_the_server_rejects(k8s_lab, tmp_path, monkeypatch):
    """Each bad manifest is refused offline; the server refuses the ones it can see (pod rules at
    the Pod dry run, unknown fields by the pruning check) — none that offline validation let through."""
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    job_plan = plan(load_spec(EXAMPLES / "gpt2-124m-fsdp.yaml"), load_profile("k8s-h100", PROFILES), TEMPLATES)
    docs = k8s_manifest.parse_manifest(job_plan.file("pytorchjob.yaml"), "pytorchjob.yaml")
    cluster = k8s_api.connect("jobgen-lab", str(k8s_lab.kubeconfig))
    table = []
    for name, mutate, server_rejects in _mutations():
        bad = copy.deepcopy(docs)
        mutate(bad[1])
        with pytest.raises(PlanError):
            validate_manifest(bad, source=name)
        try:
            k8s.server_dry_run(cluster, k8s_manifest.PYTORCHJOB, tuple(bad), out=lambda _: None)
            verdict = "accepted"
        except SubmitError as exc:
            verdict = "rejected: " + exc.message.splitlines()[0][:160]
        table.append(f"{name:32} offline: rejected | server 1.20: {verdict}")
        assert verdict.startswith("rejected") == server_rejects, (name, verdict)
    print("\n" + "\n".join(table))


def _job(lab, name: str, namespace: str = "training") -> tuple[int, Any]:
    return get(lab, f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}")


def test_submit_resubmit_replace_status_logs_cancel(k8s_lab, tmp_path):
    spec = str(EXAMPLES / "quickstart.yaml")
    first = cli(k8s_lab, tmp_path, "submit", spec, "-p", lab_profile(tmp_path, "k8s-h100"), "--set", "resources.nodes=2")
    assert first.returncode == 0, first.stderr
    handle = "k8s://jobgen-lab/training/quickstart"
    assert f"created {handle}" in first.stdout
    status, job = _job(k8s_lab, "quickstart")
    assert status == 200
    job_dir = tmp_path / "runs" / "quickstart" / "job"
    spec_json = json.loads((job_dir / "spec.json").read_text())
    assert job["metadata"]["annotations"][k8s_manifest.INPUTS_ANNOTATION] == spec_json["inputs_sha256"]
    assert job["spec"]["nprocPerNode"] == "8"
    replicas = {role: r["replicas"] for role, r in job["spec"]["pytorchReplicaSpecs"].items()}
    assert replicas == {"Master": 1, "Worker": 1}
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["containers"][0]["name"] == "pytorch"
    assert "--master-addr=$(MASTER_ADDR)" in master["containers"][0]["command"]
    assert master["priorityClassName"] == "training-high"
    cm_status, config_map = get(k8s_lab, "/api/v1/namespaces/training/configmaps/quickstart-config")
    assert cm_status == 200 and config_map["data"]["spec.json"] == (job_dir / "spec.json").read_text()
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    record = json.loads((job_dir / ".jobgen-submission.json").read_text())
    assert record["handle"] == handle

    again = cli(k8s_lab, tmp_path, "submit", spec, "-p", lab_profile(tmp_path, "k8s-h100"), "--set", "resources.nodes=2")
    assert again.returncode == 0 and "unchanged" in again.stdout and "nothing was submitted" in again.stdout, again.stdout + again.stderr
    assert _job(k8s_lab, "quickstart")[1]["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"]

    changed = cli(k8s_lab, tmp_path, "submit", spec, "-p", lab_profile(tmp_path, "k8s-h100"), "--set", "resources.nodes=2", "--set", "trainer.max_steps=700")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "already exists with other inputs" in changed.stderr and "--replace" in changed.stderr
    assert _job(k8s_lab, "quickstart")[1]["metadata"]["uid"] == job["metadata"]["uid"]

    replaced = cli(k8s_lab, tmp_path, "submit", spec, "-p", lab_profile(tmp_path, "k8s-h100"), "--set", "resources.nodes=2", "--set", "trainer.max_steps=700",
                   "--replace")
    assert replaced.returncode == 0 and f"replaced {handle}" in replaced.stdout, replaced.stdout + replaced.stderr
    new_job = _job(k8s_lab, "quickstart")[1]
    assert new_job["metadata"]["uid"] != job["metadata"]["uid"]
    assert new_job["metadata"]["annotations"][k8s_manifest.INPUTS_ANNOTATION] == json.loads((job_dir / "spec.json").read_text())["inputs_sha256"]

    st = cli(k8s_lab, tmp_path, "status", handle, "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["state"] == "SUBMITTED", st.stdout + st.stderr
    # What the training-operator writes once pods run: the status subresource of the real object.
    new_job["status"] = {"conditions": [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "created", "lastUpdateTime": "2026-01-01T00:00:00Z",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "PyTorchJob training/quickstart is running.",
         "lastUpdateTime": "2026-01-01T00:00:05Z", "lastTransitionTime": "2026-01-01T00:00:05Z"}],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}}, "startTime": "2026-01-01T00:00:00Z"}
    put_status, answer = k8s_lab.request("PUT", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/quickstart/status", new_job)
    assert put_status == 200, answer
    st = cli(k8s_lab, tmp_path, "status", str(job_dir))
    assert st.returncode == 0, st.stderr
    assert "RUNNING" in st.stdout and "master active 1 succeeded 0 failed 0" in st.stdout and "worker active 1" in st.stdout

    logs = cli(k8s_lab, tmp_path, "logs", handle)
    assert logs.returncode == 0 and "no pod for master-0 yet" in logs.stdout, logs.stdout + logs.stderr
    bad_replica = cli(k8s_lab, tmp_path, "logs", handle, "--replica", "chief-0")
    assert bad_replica.returncode == 2 and "master-0, worker-0" in bad_replica.stderr

    gone = cli(k8s_lab, tmp_path, "cancel", handle, "--wait-s", "60")
    assert gone.returncode == 0 and f"{handle}  DELETED" in gone.stdout, gone.stdout + gone.stderr
    assert _job(k8s_lab, "quickstart")[0] == 404
    assert get(k8s_lab, "/api/v1/namespaces/training/configmaps/quickstart-config")[0] == 404
    after = cli(k8s_lab, tmp_path, "status", handle, "--json")
    assert after.returncode == 0 and json.loads(after.stdout)["state"] == "CANCELLED"


def test_gitops_directory_submits_as_committed(k8s_lab, tmp_path):
    rendered = cli(k8s_lab, tmp_path, "render", str(EXAMPLES / "gpt2-350m-zero3.yaml"), "-p", "k8s-h100", "--set", "name=zero3-dir")
    assert rendered.returncode == 0, rendered.stderr
    job_dir = tmp_path / "manifests" / "k8s-h100" / "zero3-dir"
    sub = cli(k8s_lab, tmp_path, "submit", str(job_dir))
    assert sub.returncode == 0 and "created k8s://jobgen-lab/training/zero3-dir" in sub.stdout, sub.stdout + sub.stderr
    assert _job(k8s_lab, "zero3-dir")[0] == 200
    gone = cli(k8s_lab, tmp_path, "cancel", str(job_dir), "--wait-s", "60")
    assert gone.returncode == 0 and "DELETED" in gone.stdout, gone.stdout + gone.stderr


def test_missing_namespace_says_how_to_create_it(k8s_lab, tmp_path):
    out = cli(k8s_lab, tmp_path, "submit", str(EXAMPLES / "quickstart.yaml"), "-p", lab_profile(tmp_path, "k8s-a100"), "--namespace", "nowhere")
    assert out.returncode == 1
    assert "kubectl create namespace nowhere" in out.stderr, out.stderr


def test_unknown_context_is_bad_input_listing_the_known_ones(k8s_lab, tmp_path):
    out = cli(k8s_lab, tmp_path, "submit", str(EXAMPLES / "quickstart.yaml"), "-p", lab_profile(tmp_path, "k8s-a100"), "--context", "prod")
    assert out.returncode == 2
    assert "no context 'prod'" in out.stderr and "jobgen-lab" in out.stderr
    assert "Traceback" not in out.stderr


# --------------------------------------------------------------------------- the optional 1.36 CRD level


def _strict_dry_run(cluster: k8s_api.Cluster, kind: k8s_manifest.K8sKind, job: dict[str, Any]) -> dict[str, Any]:
    query = [("dryRun", "All"), ("fieldValidation", "Strict")]
    return cluster.request("POST", f"/apis/{kind.group}/{kind.version}/namespaces/training/{kind.plural}", query=query, body=job)


def _trainjob_profile(tmp_path: Path, base: str) -> Path:
    """The shipped profile ``base`` rendering TrainJobs (without a priority class: a TrainJob's
    runtime patch cannot set one, jobgen refuses it)."""
    path = tmp_path / f"{base}-trainjob.yaml"
    path.write_text(f"extends: {PROFILES / (base + '.yaml')}\nkubernetes:\n  job_api: trainjob\n  priority_class: null\n")
    return path


def test_crd_server_accepts_every_shipped_job_with_strict_fields_and_cel(k8s_lab, k8s_crd_server, tmp_path):
    """PyTorchJob and TrainJob of every shipped k8s profile x example, against the 1.36 CRD
    server with fieldValidation=Strict (unknown fields are errors there, CEL rules run)."""
    assert k8s_lab.crd_server_crds.get("trainjobs.trainer.kubeflow.org") == "installed", k8s_lab.crd_server_crds
    cluster = k8s_api.connect(k8s_crd_server, str(k8s_lab.kubeconfig))
    assert cluster.server_version is not None and cluster.server_version >= (1, 36) and cluster.field_validation
    for profile in K8S_PROFILES:
        for example in sorted(EXAMPLES.glob("*.yaml")):
            for profile_ref, kind in ((profile, k8s_manifest.PYTORCHJOB), (str(_trainjob_profile(tmp_path, profile)), k8s_manifest.TRAINJOB)):
                job_plan = plan(load_spec(example), load_profile(profile_ref, PROFILES), TEMPLATES)
                assert not [w for w in job_plan.warnings if "skipped" in w], job_plan.warnings
                job = k8s_manifest.parse_manifest(job_plan.file(kind.manifest), kind.manifest)[1]
                returned = _strict_dry_run(cluster, kind, job)
                assert k8s.pruned_paths(job, returned) == [], (profile, example.name, kind.kind)


def test_crd_server_and_offline_validation_agree_on_bad_trainjobs(k8s_lab, k8s_crd_server, tmp_path):
    job_plan = plan(load_spec(EXAMPLES / "gpt2-124m-fsdp.yaml"), load_profile(str(_trainjob_profile(tmp_path, "k8s-h100")), PROFILES),
                    TEMPLATES)
    docs = k8s_manifest.parse_manifest(job_plan.file("trainjob.yaml"), "trainjob.yaml")
    cluster = k8s_api.connect(k8s_crd_server, str(k8s_lab.kubeconfig))
    cases = [  # (name, mutate, what the server says, does offline validation reject it?)
        ("misspelt trainer field", lambda j: j["spec"]["trainer"].__setitem__("numProcPerNod", 2), 'unknown field "spec.trainer.numProcPerNod"', True),
        ("name over 63 chars", lambda j: j["metadata"].__setitem__("name", "t" * 64), "metadata.name must be no more than 63 characters", True),
        ("name not DNS-1035", lambda j: j["metadata"].__setitem__("name", "9lives"), "metadata.name must match RFC 1035 DNS label format", True),
        # A CEL rule on a field jobgen never writes: offline validation does not evaluate CEL in general.
        ("managedBy outside the CEL list", lambda j: j["spec"].__setitem__("managedBy", "me"), "ManagedBy must be", False),
    ]
    table = []
    for name, mutate, server_says, offline_rejects in cases:
        bad = copy.deepcopy(docs)
        mutate(bad[1])
        with pytest.raises(SubmitError) as info:
            _strict_dry_run(cluster, k8s_manifest.TRAINJOB, bad[1])
        assert server_says in info.value.message, info.value.message
        try:
            validate_manifest(bad, source=name)
            offline = "accepted"
        except PlanError:
            offline = "rejected"
        assert (offline == "rejected") == offline_rejects, name
        table.append(f"{name:32} server 1.36: rejected | offline: {offline}")
    print("\n" + "\n".join(table))


#: A spec whose code is one commit of a git repository, checked out in every pod (code.git).
CODE_GIT_SPEC = """\
name: code-git
model: {class_path: tinychar.CharModel, init_args: {d_model: 32, n_layer: 1}}
data: {class_path: tinychar.CharDataModule, init_args: {block_size: 32}}
code: {python_path: examples/usercode, git: {url: "https://git.example.com/team/models.git", ref: "0123456789abcdef0123456789abcdef01234567"}}
resources: {nodes: 2}
"""


def test_code_git_checkout_passes_offline_and_both_servers(k8s_lab, k8s_crd_server, tmp_path):
    """Code shipped as a pinned commit renders a PyTorchJob the 1.20 server accepts in a
    dry run (job, ConfigMap, a Pod per replica), and PyTorchJob and TrainJob the 1.36 CRD server
    accepts with strict field validation (nothing pruned)."""
    spec = tmp_path / "code-git.yaml"
    spec.write_text(CODE_GIT_SPEC)
    # the classes live in the repository the pods check out, not here: no local import check
    out = cli(k8s_lab, tmp_path, "submit", str(spec), "-p", "k8s-a100", "--dry-run=server", "--no-import-check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Pod code-git-worker-0 (from the PyTorchJob's pod template): valid" in out.stdout
    cluster = k8s_api.connect(k8s_crd_server, str(k8s_lab.kubeconfig))
    for profile_ref, kind in (("k8s-a100", k8s_manifest.PYTORCHJOB), (str(_trainjob_profile(tmp_path, "k8s-a100")), k8s_manifest.TRAINJOB)):
        job_plan = plan(load_spec(spec), load_profile(profile_ref, PROFILES), TEMPLATES)
        job = k8s_manifest.parse_manifest(job_plan.file(kind.manifest), kind.manifest)[1]
        assert "jobgen-code" in json.dumps(job), kind.kind  # the checkout runs before torchrun
        assert k8s.pruned_paths(job, _strict_dry_run(cluster, kind, job)) == [], kind.kind


def test_ls_lists_a_kubernetes_job_as_status_reports_it(k8s_lab, tmp_path):
    """`jobgen ls` refreshes a Kubernetes submission from the API server; the lab has no
    kubelet, so no pod starts and no usage is shown (never a guess)."""
    created = cli(k8s_lab, tmp_path, "submit", str(EXAMPLES / "quickstart.yaml"), "-p", lab_profile(tmp_path, "k8s-h100"), "--set", "name=ls-k8s")
    assert created.returncode == 0, created.stderr
    handle = "k8s://jobgen-lab/training/ls-k8s"
    try:
        rows = json.loads(cli(k8s_lab, tmp_path, "ls", "-o", "json").stdout)
        status = json.loads(cli(k8s_lab, tmp_path, "status", "-o", "json", handle).stdout)
        assert [(r["handle"], r["cluster"], r["scheduler"]) for r in rows] == [(handle, "jobgen-lab", "kubernetes")]
        assert (rows[0]["state"], rows[0]["source"]) == (status["state"], status["source"]) and rows[0]["usage"] is None
        assert rows[0]["stale"] is None and rows[0]["name"] == "ls-k8s"
    finally:
        cli(k8s_lab, tmp_path, "cancel", handle)


def _operator_writes(lab, name: str, end: str | None) -> None:
    """Emulate the training-operator (the lab has no kubelet and no operator: no pod ever runs):
    write through the real API server's status subresource the conditions training-operator
    1.9's PyTorchJob controller sets: Created, then Running, then for ``end`` ("Succeeded" or
    "Failed") Running turned False and the end condition True, with its reason and the replica counts."""
    status, job = _job(lab, name)
    assert status == 200, job

    def cond(ctype: str, value: str, reason: str, message: str, at: str) -> dict[str, str]:
        return {"type": ctype, "status": value, "reason": reason, "message": message, "lastUpdateTime": at, "lastTransitionTime": at}

    conditions = [cond("Created", "True", "PyTorchJobCreated", f"PyTorchJob training/{name} is created.", "2026-01-01T00:00:00Z")]
    replicas = {"Master": {"active": 1}}
    if end is None:
        conditions.append(cond("Running", "True", "PyTorchJobRunning", f"PyTorchJob training/{name} is running.", "2026-01-01T00:00:05Z"))
    else:
        conditions.append(cond("Running", "False", "PyTorchJobRunning", f"PyTorchJob training/{name} is running.", "2026-01-01T00:00:05Z"))
        message = f"PyTorchJob training/{name} successfully completed." if end == "Succeeded" else \
            f"PyTorchJob training/{name} has failed because 1 Master replica(s) failed."
        conditions.append(cond(end, "True", f"PyTorchJob{end}", message, "2026-01-01T00:10:00Z"))
        replicas = {"Master": {"succeeded": 1} if end == "Succeeded" else {"failed": 1}}
    job["status"] = {"conditions": conditions, "replicaStatuses": replicas, "startTime": "2026-01-01T00:00:00Z",
                     **({"completionTime": "2026-01-01T00:10:00Z"} if end else {})}
    put_status, answer = lab.request("PUT", f"/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/{name}/status", job)
    assert put_status == 200, answer


def test_status_and_ls_report_completed_failed_and_cancelled(k8s_lab, tmp_path):
    """A PyTorchJob that ends Succeeded is COMPLETED, one that ends Failed is FAILED, one
    that `jobgen cancel` deleted is CANCELLED, in `jobgen status` and in `jobgen ls` (and found
    by `ls --state`). The operator is emulated (:func:`_operator_writes`): the lab has a real API
    server but no kubelet and no training-operator, so the end conditions are written through the
    real server's status subresource, as the operator writes them."""
    handles = {}
    for name in ("k8s-ok", "k8s-fail", "k8s-cancel"):
        created = cli(k8s_lab, tmp_path, "submit", str(EXAMPLES / "quickstart.yaml"), "-p", lab_profile(tmp_path, "k8s-h100"), "--set", f"name={name}")
        assert created.returncode == 0, created.stderr
        handles[name] = f"k8s://jobgen-lab/training/{name}"
    try:
        _operator_writes(k8s_lab, "k8s-ok", "Succeeded")
        _operator_writes(k8s_lab, "k8s-fail", "Failed")
        _operator_writes(k8s_lab, "k8s-cancel", None)
        assert json.loads(cli(k8s_lab, tmp_path, "status", "-o", "json", handles["k8s-cancel"]).stdout)["state"] == "RUNNING"
        gone = cli(k8s_lab, tmp_path, "cancel", handles["k8s-cancel"], "--wait-s", "60")
        assert gone.returncode == 0, gone.stdout + gone.stderr
        expected = {"k8s-ok": "COMPLETED", "k8s-fail": "FAILED", "k8s-cancel": "CANCELLED"}
        got = {name: json.loads(cli(k8s_lab, tmp_path, "status", "-o", "json", handle).stdout) for name, handle in handles.items()}
        assert {name: st["state"] for name, st in got.items()} == expected, got
        assert "failed because 1 Master replica(s) failed" in got["k8s-fail"]["details"]["message"], got["k8s-fail"]
        rows = {row["name"]: row["state"] for row in json.loads(cli(k8s_lab, tmp_path, "ls", "-o", "json").stdout)}
        assert rows == expected, rows
        only = json.loads(cli(k8s_lab, tmp_path, "ls", "--state", "failed", "--state", "CANCELLED", "-o", "json").stdout)
        assert sorted(row["handle"] for row in only) == [handles["k8s-cancel"], handles["k8s-fail"]], only
    finally:
        for name in ("k8s-ok", "k8s-fail"):
            cli(k8s_lab, tmp_path, "cancel", handles[name])
