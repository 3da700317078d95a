"""Kubernetes submission logic with an in-memory fake API server (the real one runs in
tests/integration/k8s): handles, idempotent re-submit, --replace, pruning detection, status
from conditions, logs streaming across a container restart, cancel."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from jobgen.backends import plan
from jobgen.backends.base import LogOptions, SubmitOptions, SubmittedJob
from jobgen.backends.kubernetes import api as k8s_api
from jobgen.backends.kubernetes import backend as k8s
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.backends.kubernetes.restarts import RESTART_LINE_BYTES
from jobgen.errors import ConfigError, SubmitError
from jobgen.jobdir import JobHandle
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import EXAMPLES, PROFILES, TEMPLATES, site_profile


class FakeStream:
    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks
        self.released = False

    def stream(self, _size: int):
        yield from self.chunks

    def release_conn(self) -> None:
        self.released = True


#: Query values the real API server accepts (anything else is 400 BadRequest): dryRun
#: (apimachinery DryRun: only "All"), fieldValidation (Strict/Warn/Ignore, 1.25+).
_QUERY_VALUES = {"dryRun": {"All"}, "fieldValidation": {"Strict", "Warn", "Ignore"}}
_PROPAGATION = {"Foreground", "Background", "Orphan"}


def _bad_request(message: str) -> k8s_api.ApiError:
    return k8s_api.ApiError(message, status=400, reason="BadRequest")


class FakeCluster(k8s_api.Cluster):
    """Objects by path in a dict; POST/GET/PUT/DELETE like the API server, refusing what the
    real one refuses and our submit relies on: unknown dryRun/fieldValidation values, a
    DeleteOptions body that is not one (wrong kind, unknown propagationPolicy), an object
    whose namespace differs from the request path's, and a PUT with a stale resourceVersion
    (409 Conflict). ``deletes`` records each DELETE's propagation policy."""

    def __init__(self, *, prune: str | None = None, version: tuple[int, int] = (1, 30)):
        super().__init__(api=None, context="fake")
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
        self.prune = prune
        self._version = version
        #: Log chunks: a list answers the log requests in turn; a dict answers by log path.
        self.logs: list[list[bytes]] | dict[str, list[bytes]] = []
        self.uid = 0
        self.deletes: list[str | None] = []

    def _check(self, method: str, path: str, query: tuple[tuple[str, str], ...], body: Any) -> None:
        for key, value in query:
            if key in _QUERY_VALUES and value not in _QUERY_VALUES[key]:
                raise _bad_request(f"invalid {key} value {value!r}")
        if method in ("POST", "PUT") and isinstance(body, dict):
            namespace = (body.get("metadata") or {}).get("namespace")
            if "/namespaces/" in path and namespace is not None and path.split("/namespaces/")[1].split("/")[0] != namespace:
                raise _bad_request("the namespace of the provided object does not match the namespace sent on the request")
        if method == "DELETE" and body is not None:
            if body.get("kind") != "DeleteOptions" or body.get("propagationPolicy", "Background") not in _PROPAGATION:
                raise _bad_request(f"invalid DeleteOptions: {body!r}")
        if method == "PUT" and path in self.objects:
            sent = (body.get("metadata") or {}).get("resourceVersion")
            current = self.objects[path].get("metadata", {}).get("resourceVersion")
            if sent is not None and sent != current:
                raise k8s_api.ApiError("the object has been modified", status=409, reason="Conflict")

    def request(self, method, path, *, query=None, body=None, timeout=30.0, stream=False):
        query = tuple(query or ())
        self.calls.append((method, path, query))
        self._check(method, path, query, body)
        if path.endswith("/log"):
            if isinstance(self.logs, list):
                return FakeStream(self.logs.pop(0))
            key = path + ("?previous" if ("previous", "true") in query else "")
            if key not in self.logs:  # the kubelet's answer for a container (run) it has no log of
                raise k8s_api.ApiError(f"previous terminated container not found ({key})", status=400, reason="BadRequest")
            return FakeStream(self.logs[key])
        if method == "POST":
            obj = copy.deepcopy(body)
            if self.prune and obj.get("kind") == "PyTorchJob":
                obj["spec"].pop(self.prune, None)
            key = f"{path}/{obj['metadata']['name']}"
            if key in self.objects:
                raise k8s_api.ApiError("exists", status=409, reason="AlreadyExists")
            if ("dryRun", "All") not in query:
                self.uid += 1
                obj["metadata"]["uid"] = f"uid-{self.uid}"
                obj["metadata"]["resourceVersion"] = str(self.uid)
                self.objects[key] = obj
            return obj
        if method == "GET":
            if path in self.objects:
                return copy.deepcopy(self.objects[path])
            selector = dict(query).get("labelSelector")
            if selector is not None:  # a list: the objects below ``path`` whose labels all match
                wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
                items = [copy.deepcopy(obj) for key, obj in sorted(self.objects.items())
                         if key.rsplit("/", 1)[0] == path
                         and all((obj.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in wanted.items())]
                return {"kind": "List", "items": items}
            raise k8s_api.ApiError("not found", status=404, reason="NotFound")
        if method == "PUT":
            obj = copy.deepcopy(body)
            self.uid += 1
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.uid)
            self.objects[path] = obj
            return copy.deepcopy(obj)
        if method == "DELETE":
            self.deletes.append((body or {}).get("propagationPolicy"))
            if path not in self.objects:
                raise k8s_api.ApiError("not found", status=404, reason="NotFound")
            del self.objects[path]
            return {}
        raise AssertionError(method)


JOB = "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/quickstart"
CM = "/api/v1/namespaces/training/configmaps/quickstart-config"


@pytest.fixture
def job_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))

    def _render(*overrides: str) -> Path:
        job_plan = plan(load_spec(EXAMPLES / "quickstart.yaml", overrides), load_profile("k8s-h100", PROFILES), TEMPLATES)
        directory = tmp_path / "manifests" / "quickstart"
        job_plan.write(directory)
        return directory

    return _render


@pytest.fixture
def fake(monkeypatch):
    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    return cluster


def test_handles():
    handle = k8s.make_handle("arn:aws:eks:eu-west-1:123:cluster/prod", "training", "job-1")
    assert str(handle) == "k8s://arn:aws:eks:eu-west-1:123:cluster/prod/training/job-1"
    assert k8s.parse_handle(JobHandle.parse(str(handle))) == ("arn:aws:eks:eu-west-1:123:cluster/prod", "training", "job-1")
    for bad in ("k8s://ctx/job", "k8s://ctx/Training/job", "slurm://c/1"):
        with pytest.raises(ConfigError, match="not a Kubernetes job handle"):
            k8s.parse_handle(JobHandle.parse(bad))


def test_create_then_identical_resubmit_is_a_no_op(job_dir, fake):
    directory = job_dir()
    first = k8s.KubernetesBackend().submit(directory, SubmitOptions(), lambda _: None)
    assert first.action == "created" and str(first.handle) == "k8s://fake/training/quickstart"
    assert fake.objects[CM]["metadata"]["ownerReferences"][0]["uid"] == fake.objects[JOB]["metadata"]["uid"]
    writes = [c for c in fake.calls if c[0] in ("POST", "PUT", "DELETE") and ("dryRun", "All") not in c[2]]
    assert [c[0] for c in writes] == ["POST", "POST", "PUT"]  # ConfigMap, job, ownerReference
    assert all(("fieldValidation", "Strict") in c[2] for c in fake.calls if c[0] == "POST")  # server 1.30
    fake.calls.clear()
    again = k8s.KubernetesBackend().submit(directory, SubmitOptions(), lambda _: None)
    assert again.action == "unchanged" and [c[0] for c in fake.calls] == ["GET"]
    record = json.loads((directory / ".jobgen-submission.json").read_text())
    assert record["handle"] == str(first.handle) and record["kind"] == "pytorchjobs.kubeflow.org/v1" and "argv" not in record


def test_changed_inputs_are_refused_unless_replace(job_dir, fake):
    k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None)
    old_uid = fake.objects[JOB]["metadata"]["uid"]
    changed = job_dir("trainer.max_steps=700")
    with pytest.raises(SubmitError, match="already exists with other inputs") as info:
        k8s.KubernetesBackend().submit(changed, SubmitOptions(), lambda _: None)
    assert "--replace" in info.value.hint and fake.objects[JOB]["metadata"]["uid"] == old_uid
    result = k8s.KubernetesBackend().submit(changed, SubmitOptions(replace=True), lambda _: None)
    assert result.action == "replaced" and fake.objects[JOB]["metadata"]["uid"] != old_uid
    deletes = [c for c in fake.calls if c[0] == "DELETE"]
    assert deletes and deletes[0][1] == JOB


def test_dry_run_persists_nothing_and_checks_a_pod_per_replica(job_dir, fake):
    result = k8s.KubernetesBackend().submit(job_dir("resources.nodes=3"), SubmitOptions(dry_run=True), lambda _: None)
    assert result.action == "validated" and not fake.objects
    posted = [c[1] for c in fake.calls if c[0] == "POST"]
    assert posted == ["/api/v1/namespaces/training/configmaps", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs",
                      "/api/v1/namespaces/training/pods", "/api/v1/namespaces/training/pods"]


def test_old_servers_get_a_client_side_pruning_check(job_dir, monkeypatch):
    cluster = FakeCluster(prune="nprocPerNode", version=(1, 20))
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    with pytest.raises(SubmitError, match=r"dropped field\(s\) it does not know: spec.nprocPerNode"):
        k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None)
    assert not cluster.objects  # the preflight stopped before anything was created
    assert not any(("fieldValidation", "Strict") in c[2] for c in cluster.calls)


def test_pruned_paths():
    sent = {"a": 1, "b": {"c": 2, "d": [{"e": 1}, {"f": 2}]}}
    assert k8s.pruned_paths(sent, {"a": 1, "b": {"c": 2, "d": [{"e": 1}, {}]}, "extra": 1}) == ["b.d[1].f"]
    assert k8s.pruned_paths(sent, copy.deepcopy(sent)) == []


@pytest.mark.parametrize(("conditions", "state"), [
    ([], "SUBMITTED"),
    ([("Created", "True")], "CREATED"),
    ([("Created", "True"), ("Running", "True")], "RUNNING"),
    ([("Created", "True"), ("Running", "False"), ("Restarting", "True")], "RESTARTING"),
    ([("Created", "True"), ("Running", "False"), ("Succeeded", "True")], "COMPLETED"),
    ([("Created", "True"), ("Running", "True"), ("Failed", "True")], "FAILED"),
    ([("Complete", "True")], "COMPLETED"),
])
def test_state_from_conditions(conditions, state):
    job = {"status": {"conditions": [{"type": t, "status": s, "reason": f"{t}Reason"} for t, s in conditions],
                      "replicaStatuses": {"Master": {"active": 1}, "Worker": {"failed": 2}}}}
    got, details = k8s.job_state(job)
    assert got == state
    assert details["master"] == "active 1 succeeded 0 failed 0" and details["worker"] == "active 0 succeeded 0 failed 2"


@pytest.mark.parametrize(("conditions", "jobs", "state"), [
    ([], [], "SUBMITTED"),
    ([], [{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}], "RUNNING"),
    ([("Suspended", "False")], [{"name": "node", "active": 1, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}], "RUNNING"),
    ([("Suspended", "True")], [{"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 1}], "SUSPENDED"),
    ([("Complete", "True")], [{"name": "node", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0}], "COMPLETED"),
])
def test_trainjob_state_while_it_runs(conditions, jobs, state):
    """Trainer v2.3.0 sets no condition while a TrainJob runs (only Suspended, Complete, Failed;
    pkg/controller/trainjob_controller.go): its JobSet's ``jobsStatus`` says it is running."""
    job = {"kind": "TrainJob", "status": {"conditions": [{"type": t, "status": s, "reason": f"{t}Reason"} for t, s in conditions],
                                          "jobsStatus": jobs}}
    got, details = k8s.job_state(job)
    assert got == state, details
    for entry in jobs:
        counts = " ".join(f"{key} {entry[key]}" for key in ("active", "ready", "succeeded", "failed", "suspended"))
        assert details[entry["name"]] == f"jobs {counts}", details
    if state == "RUNNING":
        assert "not picked the job up" not in details.get("reason", ""), details


def test_status_and_cancel(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    assert k8s.KubernetesBackend().status(SubmittedJob(handle)).state == "SUBMITTED"
    done = k8s.KubernetesBackend().cancel(SubmittedJob(handle), out=lambda _: None)
    assert done.state == "DELETED" and done.finished and JOB not in fake.objects and CM not in fake.objects
    delete = next(c for c in fake.calls if c[0] == "DELETE" and c[1] == JOB)
    assert delete
    after = k8s.KubernetesBackend().status(SubmittedJob(handle))  # what jobgen cancelled is CANCELLED, not UNKNOWN
    assert (after.state, after.source) == ("CANCELLED", "jobgen cancel") and after.finished, after
    assert k8s.KubernetesBackend().cancel(SubmittedJob(handle), out=lambda _: None).state == "UNKNOWN"


def test_a_job_deleted_by_someone_else_stays_unknown(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    del fake.objects[JOB]
    assert k8s.KubernetesBackend().status(SubmittedJob(handle)).state == "UNKNOWN"


def test_logs_follow_reattaches_after_a_restart_and_stops_when_the_job_ends(job_dir, fake, monkeypatch):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    pod = {"metadata": {"name": "quickstart-master-0", "uid": "u1"},
           "status": {"phase": "Running", "containerStatuses": [{"name": "pytorch", "state": {"running": {}}, "restartCount": 0}]}}
    fake.objects["/api/v1/namespaces/training/pods/quickstart-master-0"] = pod
    fake.logs = [[b"step 1\nstep ", b"2\n"], [b"resumed\xff\n", b"done"]]
    ends = iter([{"status": {"conditions": [{"type": "Running", "status": "True"}]}},
                 {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}])
    original = k8s._get_job

    def get_job(cluster, kind, namespace, name):
        job = original(cluster, kind, namespace, name)
        calls = [c for c in fake.calls if c[1].endswith("/log")]
        if job is not None and calls:
            pod["status"]["containerStatuses"][0]["restartCount"] = 1  # the kubelet restarted the container
            job.update(next(ends, {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}))
        return job

    monkeypatch.setattr(k8s, "_get_job", get_job)
    monkeypatch.setattr(k8s.time, "sleep", lambda _: None)
    lines: list[str] = []
    k8s.KubernetesBackend().logs(SubmittedJob(handle), LogOptions(follow=True), lines.append)
    assert lines == ["step 1", "step 2", "jobgen: quickstart-master-0 restarted; attaching again", "resumed\ufffd", "done"]
    log_calls = [c for c in fake.calls if c[1].endswith("/log")]
    assert ("container", "pytorch") in log_calls[0][2] and ("follow", "true") in log_calls[0][2]


def test_logs_follow_of_a_replica_that_ended_while_the_job_runs_stops_without_a_restart(job_dir, fake, monkeypatch):
    """Seen on real pods: `logs -f --replica worker-0` of a worker that exited 0 while
    the Master still ran printed "restarted; attaching again" (and attached again, for ever while
    the job ran): an ended stream of a running job was taken for a restart. A restart is a new
    container (restartCount up) or a new pod (another uid); a pod that is Succeeded or Failed is
    over, and says so."""
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    pod = {"metadata": {"name": "quickstart-worker-0", "uid": "u1"},
           "status": {"phase": "Running", "containerStatuses": [{"name": "pytorch", "state": {"running": {}}, "restartCount": 0}]}}
    fake.objects["/api/v1/namespaces/training/pods/quickstart-worker-0"] = pod
    fake.logs = [[b"step 24\n", b"done\n"], [b"never read\n"]]
    running = {"status": {"conditions": [{"type": "Running", "status": "True"}]}}
    original = k8s._get_job
    polls = []

    def get_job(cluster, kind, namespace, name):
        job = original(cluster, kind, namespace, name)
        if job is not None and any(c[1].endswith("/log") for c in fake.calls):
            pod["status"] = {"phase": "Succeeded", "containerStatuses": [
                {"name": "pytorch", "state": {"terminated": {"exitCode": 0}}, "restartCount": 0}]}
            polls.append(1)
            assert len(polls) < 50, "still following a replica that ended"
            job.update(running)  # the Master still trains
        return job

    monkeypatch.setattr(k8s, "_get_job", get_job)
    monkeypatch.setattr(k8s.time, "sleep", lambda _: None)
    lines: list[str] = []
    k8s.KubernetesBackend().logs(SubmittedJob(handle), LogOptions(replica="worker-0", follow=True), lines.append)
    assert lines == ["step 24", "done", f"jobgen: quickstart-worker-0 ended (exit code 0, pod Succeeded); {handle} is RUNNING"]
    assert len([c for c in fake.calls if c[1].endswith("/log")]) == 1


def test_logs_before_the_pod_exists(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    lines: list[str] = []
    k8s.KubernetesBackend().logs(SubmittedJob(handle), LogOptions(replica="worker-0"), lines.append)
    assert lines == [f"jobgen: {handle} is SUBMITTED; no pod for worker-0 yet (jobgen logs -f waits for it)"]


def test_logs_of_a_trainjob_default_to_node_0(fake):
    """A TrainJob has no Master: ``jobgen logs`` without --replica reads node-0 (completion index
    0, where torchrun's static rendezvous puts global rank 0: PET_NODE_RANK 0)."""
    fake.objects[f"/apis/{k8s_manifest.TRAINJOB.group}/{k8s_manifest.TRAINJOB.version}/namespaces/training/trainjobs/tj"] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj", "namespace": "training"},
        "spec": {"trainer": {"numNodes": 2}}}
    handle = k8s.make_handle("ctx", "training", "tj")
    lines: list[str] = []
    k8s.KubernetesBackend().logs(SubmittedJob(handle), LogOptions(), lines.append)
    assert lines == [f"jobgen: {handle} is SUBMITTED; no pod for node-0 yet (jobgen logs -f waits for it)"]


@pytest.mark.parametrize(("kind", "replica", "expected"), [
    (k8s_manifest.PYTORCHJOB, "master-0", ("job-master-0", None, "pytorch")),
    (k8s_manifest.PYTORCHJOB, "worker-12", ("job-worker-12", None, "pytorch")),
    (k8s_manifest.TRAINJOB, "node-1", (None, "jobset.sigs.k8s.io/jobset-name=job,jobset.sigs.k8s.io/replicatedjob-name=node,"
                                    "batch.kubernetes.io/job-completion-index=1", "node")),
])
def test_replica_selector(kind, replica, expected):
    assert k8s.replica_selector(kind, "job", replica) == expected


@pytest.mark.parametrize(("kind", "replica"), [(k8s_manifest.PYTORCHJOB, "node-0"), (k8s_manifest.TRAINJOB, "master-0"), (k8s_manifest.PYTORCHJOB, "worker")])
def test_replica_selector_rejects(kind, replica):
    with pytest.raises(ConfigError, match="is not a replica"):
        k8s.replica_selector(kind, "job", replica)


def test_cli_refuses_mixed_scheduler_options(run_cli, tmp_path):
    out = run_cli("submit", str(EXAMPLES / "quickstart.yaml"), "-p", "k8s-a100", "--test-only", "--out", str(tmp_path))
    assert out.code == 2 and "--dry-run=server" in out.stderr
    rank = run_cli("logs", "k8s://ctx/training/job", "--rank", "1")
    assert rank.code == 2 and "--replica" in rank.stderr


def test_cli_unknown_kubeconfig_is_bad_input(run_cli, tmp_path):
    out = run_cli("submit", str(EXAMPLES / "quickstart.yaml"), "-p", str(site_profile(tmp_path / "site", "k8s-a100")),
                  "--out", str(tmp_path), "--kubeconfig", str(tmp_path / "nope"))
    assert out.code == 2 and f"kubeconfig {tmp_path / 'nope'} does not exist" in out.stderr and "Traceback" not in out.stderr


def test_the_fake_refuses_what_the_api_server_refuses():
    """The fake is only useful if it fails like the server where submit relies on the server."""
    cluster = FakeCluster()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "training"}}
    with pytest.raises(k8s_api.ApiError, match="invalid dryRun"):
        cluster.request("POST", "/api/v1/namespaces/training/configmaps", query=[("dryRun", "true")], body=cm)
    with pytest.raises(k8s_api.ApiError, match="invalid fieldValidation"):
        cluster.request("POST", "/api/v1/namespaces/training/configmaps", query=[("fieldValidation", "strict")], body=cm)
    with pytest.raises(k8s_api.ApiError, match="namespace of the provided object"):
        cluster.request("POST", "/api/v1/namespaces/other/configmaps", body=cm)
    created = cluster.request("POST", "/api/v1/namespaces/training/configmaps", body=cm)
    stale = {**created, "metadata": {**created["metadata"], "resourceVersion": "stale"}}
    with pytest.raises(k8s_api.ApiError, match="modified") as info:
        cluster.request("PUT", "/api/v1/namespaces/training/configmaps/c", body=stale)
    assert info.value.status == 409
    with pytest.raises(k8s_api.ApiError, match="invalid DeleteOptions"):
        cluster.request("DELETE", "/api/v1/namespaces/training/configmaps/c", body={"propagationPolicy": "Foreground"})


def test_replace_deletes_in_the_foreground_and_owner_update_is_not_stale(job_dir, fake):
    """--replace deletes the old job with propagationPolicy Foreground (its pods go first), and
    the ConfigMap owner update sends the resourceVersion it just read (a stale one is 409)."""
    k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None)
    fake.objects[JOB]["spec"]["runPolicy"] = {"changed": True}
    fake.objects[JOB]["metadata"]["annotations"][k8s_manifest.INPUTS_ANNOTATION] = "0" * 64
    result = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(replace=True), lambda _: None)
    assert result.action == "replaced" and fake.deletes == ["Foreground"]
    assert fake.objects[CM]["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"


def _failed_pod(name: str, node: str) -> dict:
    return {"metadata": {"name": name, "labels": {"training.kubeflow.org/job-name": "quickstart"}},
            "spec": {"nodeName": node},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "pytorch", "state": {"terminated": {"exitCode": 1}}}]}}


def test_first_error_reads_every_pod_with_timestamps_and_orders_by_time(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    pods = "/api/v1/namespaces/training/pods"
    fake.objects[f"{pods}/quickstart-master-0"] = _failed_pod("quickstart-master-0", "gpu-a")
    fake.objects[f"{pods}/quickstart-worker-0"] = _failed_pod("quickstart-worker-0", "gpu-b")
    fake.objects[f"{pods}/other-master-0"] = {**_failed_pod("other-master-0", "gpu-c"),
                                              "metadata": {"name": "other-master-0", "labels": {"training.kubeflow.org/job-name": "other"}}}
    fake.logs = {
        f"{pods}/quickstart-master-0/log": [b"2026-11-23T07:00:01.000000001Z step 10\n",
                                             b"2026-11-23T07:00:09.1Z Traceback (most recent call last):\n"
                                             b"2026-11-23T07:00:09.2Z RuntimeError: Connection closed by peer\n"],
        f"{pods}/quickstart-worker-0/log": [b"2026-11-23T07:00:08.5Z Traceback (most recent call last):\n"
                                             b"2026-11-23T07:00:08.5Z   File \"model.py\", line 3\n"
                                             b"2026-11-23T07:00:08.6Z ZeroDivisionError: division by zero\n"],
    }
    result = k8s.KubernetesBackend().first_error(SubmittedJob(handle))
    assert result.ordered_by == "timestamp"
    assert [(f.source, f.node) for f in result.failures] == [("pod quickstart-worker-0", "gpu-b"), ("pod quickstart-master-0", "gpu-a")]
    assert result.first.headline == "ZeroDivisionError: division by zero"
    log_calls = [c for c in fake.calls if c[1].endswith("/log")]
    assert len(log_calls) == 2 and all(("timestamps", "true") in c[2] and ("container", "pytorch") in c[2] for c in log_calls)


def test_first_error_reads_the_previous_run_of_a_container_restarted_in_place(job_dir, fake):
    """Found on the lab's real pods: a container that failed and was restarted in place
    (OnFailure) runs again and has not printed its error yet; the failure is in its previous run's
    log, which the kubelet keeps (``previous=true``). Both runs are read, the previous first; a
    previous log the kubelet no longer has is skipped (the current run still counts)."""
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    pods = "/api/v1/namespaces/training/pods"
    for name, node in (("quickstart-master-0", "n1"), ("quickstart-worker-0", "n2")):
        fake.objects[f"{pods}/{name}"] = {
            "metadata": {"name": name, "labels": {"training.kubeflow.org/job-name": "quickstart"}}, "spec": {"nodeName": node},
            "status": {"phase": "Running", "containerStatuses": [{"name": "pytorch", "restartCount": 1, "state": {"running": {}},
                                                                 "lastState": {"terminated": {"exitCode": 1}}}]}}
    fake.logs = {
        f"{pods}/quickstart-master-0/log?previous": [b"2026-11-27T11:00:01Z python -m jobgen.train: error: /etc/jobgen/spec.json: "
                                                      b"spec.data.paths[0]: 'x/*.txt' matches no files\n"],
        f"{pods}/quickstart-master-0/log": [b"2026-11-27T11:00:20Z resume: auto - no checkpoint\n"],
        f"{pods}/quickstart-worker-0/log": [b"2026-11-27T11:00:21Z starting\n"],  # its previous log is gone: 400
    }
    result = k8s.KubernetesBackend().first_error(SubmittedJob(handle))
    assert [(f.source, f.node) for f in result.failures] == [("pod quickstart-master-0", "n1")], result
    assert "spec.data.paths[0]: 'x/*.txt' matches no files" in result.first.headline
    log_calls = [(c[1].rsplit("/", 2)[1], ("previous", "true") in c[2]) for c in fake.calls if c[1].endswith("/log")]
    assert log_calls == [("quickstart-master-0", True), ("quickstart-master-0", False), ("quickstart-worker-0", True),
                         ("quickstart-worker-0", False)]


def test_status_counts_gpu_hours_from_each_pods_container_times(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    pods = "/api/v1/namespaces/training/pods"
    for name, started, finished in (("quickstart-master-0", "2026-11-23T06:00:00Z", "2026-11-23T07:30:00Z"),
                                    ("quickstart-worker-0", "2026-11-23T06:00:30Z", "2026-11-23T07:00:30Z")):
        fake.objects[f"{pods}/{name}"] = {
            "metadata": {"name": name, "labels": {"training.kubeflow.org/job-name": "quickstart"}},
            "spec": {"containers": [{"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "90"}}}]},
            "status": {"containerStatuses": [{"name": "pytorch", "state": {"terminated": {"startedAt": started, "finishedAt": finished}}}]},
        }
    usage = k8s.KubernetesBackend().status(SubmittedJob(handle)).usage
    assert (usage.device_kind, usage.devices) == ("gpu", 16)
    assert usage.device_hours == 8 * 1.5 + 8 * 1.0  # each pod's own run time x its GPUs
    assert usage.elapsed_s == 90 * 60 and usage.end is not None
    assert usage.to_json()["gpu_hours"] == 20.0


def test_status_of_running_pods_of_a_priced_profile_shows_the_cost_so_far(tmp_path, fake, monkeypatch):
    """Two running pods of 8 GPUs each, started 30 minutes ago, of a profile priced at 3.0 per
    GPU-hour: the usage counts to now (no end) and the cost so far is GPU-hours x the price."""
    from datetime import datetime, timedelta, timezone

    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    profile = load_profile("k8s-h100", PROFILES).model_copy(update={"gpu_hour_price": 3.0})
    directory = tmp_path / "manifests" / "quickstart"
    plan(load_spec(EXAMPLES / "quickstart.yaml"), profile, TEMPLATES).write(directory)
    handle = k8s.KubernetesBackend().submit(directory, SubmitOptions(), lambda _: None).handle
    started = (datetime.now(timezone.utc) - timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name in ("quickstart-master-0", "quickstart-worker-0"):
        fake.objects[f"/api/v1/namespaces/training/pods/{name}"] = {
            "metadata": {"name": name, "labels": {"training.kubeflow.org/job-name": "quickstart"}},
            "spec": {"containers": [{"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            "status": {"containerStatuses": [{"name": "pytorch", "state": {"running": {"startedAt": started}}}]},
        }
    usage = k8s.KubernetesBackend().status(SubmittedJob(handle)).usage.to_json()
    assert (usage["device_kind"], usage["devices"], usage["end"]) == ("gpu", 16, None), usage
    assert 8.0 <= usage["gpu_hours"] < 8.5 and usage["cost"] == pytest.approx(3.0 * usage["gpu_hours"], abs=1e-5), usage


def test_status_of_a_job_whose_pods_have_not_started_has_no_usage(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    assert k8s.KubernetesBackend().status(SubmittedJob(handle)).usage is None


def test_submitting_a_plan_takes_context_and_kubeconfig_from_the_profile_it_was_planned_with(tmp_path, monkeypatch):
    """``jobgen submit SPEC --profile P --profiles-dir D``: the backend uses the profile the plan
    was made from (loaded once), not a second lookup of P by name, which misses D."""
    from jobgen import api
    from jobgen.specs import load
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    site_profile(profiles, "k8s-h100")  # the shipped one's example values set: a real submit takes it
    kubeconfig = tmp_path / "kubeconfig-b"
    (profiles / "site-b.yaml").write_text(f"extends: k8s-h100\nkubernetes:\n  context: ctx-b\n  kubeconfig: {kubeconfig}\n")
    job_plan = api.plan_job(EXAMPLES / "quickstart.yaml", "site-b", profiles_dir=profiles, templates=TEMPLATES)
    cluster, connected, loads, said = FakeCluster(), [], [], []
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: connected.append((context, kubeconfig)) or cluster)
    real_load = load.load_profile
    monkeypatch.setattr(load, "load_profile", lambda *a, **kw: loads.append(a) or real_load(*a, **kw))
    result = api.submit(job_plan, api.SubmitOptions(), out=tmp_path / "manifests", echo=said.append)
    assert result.handle is not None and str(result.handle).startswith("k8s://fake/")
    assert connected == [("ctx-b", str(kubeconfig))]
    assert loads == [] and not [line for line in said if "not found" in line], said


@pytest.mark.parametrize("context", ["kind-lab", "arn:aws:eks:eu-west-1:1:cluster/my team"])
def test_an_unreachable_api_server_hint_names_the_context_to_check(context) -> None:
    # the hint once said `kubectl --context <context> get --raw /readyz` literally
    class Down:
        def param_serialize(self, **kwargs: Any) -> tuple:
            return ()

        def call_api(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionRefusedError("[Errno 111] Connection refused")

    with pytest.raises(SubmitError) as err:
        k8s_api.Cluster(Down(), context).request("GET", "/version")
    import shlex

    assert "<context>" not in err.value.hint
    assert f"kubectl --context {shlex.quote(context)} get --raw /readyz" in err.value.hint


def _restart_pods(fake: FakeCluster, counts: dict[str, int]) -> str:
    pods = "/api/v1/namespaces/training/pods"
    for name, count in counts.items():
        fake.objects[f"{pods}/{name}"] = {
            "metadata": {"name": name, "labels": {"training.kubeflow.org/job-name": "quickstart"}},
            "status": {"phase": "Running", "containerStatuses": [{"name": "pytorch", "state": {"running": {}}, "restartCount": count}]}}
    return pods


def test_status_counts_restarts_from_the_launch_wrappers_line_at_the_head_of_each_pods_log(job_dir, fake):
    """The run directory (the wrapper's ledger) is on the pods' volume: the count comes from the
    line the wrapper prints at each restarted start; the largest over the pods (a per-pod budget)."""
    from jobgen.reports.attempts import RESTART_LINE

    handle = k8s.KubernetesBackend().submit(job_dir("restart.max_restarts=3"), SubmitOptions(), lambda _: None).handle
    pods = _restart_pods(fake, {"quickstart-master-0": 0, "quickstart-worker-0": 0})
    fake.logs = {f"{pods}/quickstart-master-0/log": [RESTART_LINE.format(restarts=2, budget=3).encode() + b"\n", b"step 10\n"],
                 f"{pods}/quickstart-worker-0/log": [b"W1129 warning\n" + RESTART_LINE.format(restarts=1, budget=3).encode() + b"\n"]}
    st = k8s.KubernetesBackend().status(SubmittedJob(handle))
    assert st.details["restarts_used"] == "2 of 3" and "launch wrapper" in st.details["restarts_source"], st.details
    assert all(("limitBytes", str(RESTART_LINE_BYTES)) in c[2] for c in fake.calls if c[1].endswith("/log"))


def test_status_falls_back_to_the_pods_restart_count_and_a_hostile_log_is_no_line(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir("restart.max_restarts=2"), SubmitOptions(), lambda _: None).handle
    pods = _restart_pods(fake, {"quickstart-master-0": 1, "quickstart-worker-0": 0})
    hostile = (b"\xff\xfe jobgen.train.launch: restart x of 3 (restart.max_restarts)\n"
               b"jobgen.train.launch: restart 9999999 of 2 (restart.max_restarts)\n" + b"\"'\x1b[2J" * 100 + b"\n")
    fake.logs = {f"{pods}/quickstart-master-0/log": [hostile]}  # the worker's log cannot be read (400)
    st = k8s.KubernetesBackend().status(SubmittedJob(handle))
    assert st.details["restarts_used"] == "1 of 2" and "restartCount" in st.details["restarts_source"], st.details
    from jobgen import api
    assert api.restarts_used(st.details) == 1 and api.restarts_used({"restarts_used": "x of 2", "restarts": "3"}) == 3
    assert api.restarts_used({"restarts_used": "\u0663 of 2"}) is None  # a non-ASCII digit is no count


def test_status_without_a_budget_reads_no_log(job_dir, fake):
    handle = k8s.KubernetesBackend().submit(job_dir(), SubmitOptions(), lambda _: None).handle
    _restart_pods(fake, {"quickstart-master-0": 4})
    st = k8s.KubernetesBackend().status(SubmittedJob(handle))
    assert "restarts_used" not in st.details and not [c for c in fake.calls if c[1].endswith("/log")]
