"""``jobgen status`` on Kubernetes says what each pod of the job is doing (``details["pods"]``):
the phase the kubelet reports, the node, why a pod waits (the scheduler's Unschedulable, the
container's waiting reason), exit codes and restarts. The pods here are the objects the API
server returns (v1 Pod status fields as kubelet 1.20+ writes them); the same function runs on the
lab's real pods in tests/integration/k8s (test_operator_emulation.py, test_jobgen_on_pods.py)."""

from __future__ import annotations

from typing import Any

from jobgen.backends.kubernetes.pods import pod_evidence, pod_summary


def pod(name: str, phase: str | None = None, *, node: str | None = None, container: dict[str, Any] | None = None,
        **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": {"containers": [{"name": "pytorch"}]}, "status": dict(status)}
    if phase is not None:
        body["status"]["phase"] = phase
    if node is not None:
        body["spec"]["nodeName"] = node
    if container is not None:
        body["status"]["containerStatuses"] = [{"name": "init-pytorch", "restartCount": 9, "state": {"running": {}}},
                                               {"name": "pytorch", **container}]
    return body


def test_phases_nodes_exit_codes_and_restarts_in_replica_order() -> None:
    pods = [
        pod("qs-master-0", "Succeeded", node="n1", container={"restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}),
        pod("qs-worker-0", "Running", node="n2", container={"restartCount": 2, "state": {"running": {"startedAt": "t"}},
                                                            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}),
        pod("qs-worker-1", "Failed", node="n2", container={"restartCount": 0, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}),
    ]
    assert pod_summary(pods, "qs", "pytorch") == (
        "master-0 Succeeded (on n1, exit 0); worker-0 Running (on n2, restarts 2, last exit 137 OOMKilled); worker-1 Failed (on n2, exit 1)")


def test_why_a_pod_waits_unschedulable_and_container_waiting_reasons() -> None:
    unschedulable = pod("qs-master-0", "Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available: 2 Insufficient cpu."}])
    creating = pod("qs-worker-0", "Pending", node="n1", container={"restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}})
    config = pod("qs-worker-1", "Pending", node="n2", container={"restartCount": 0, "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "lab-token" not found'}}})
    assert pod_summary([unschedulable, creating, config], "qs", "pytorch") == (
        "master-0 Pending (Unschedulable: 0/2 nodes are available: 2 Insufficient cpu.); worker-0 Pending (on n1, ContainerCreating); "
        "worker-1 Pending (on n2, CreateContainerConfigError: secret \"lab-token\" not found)")


def test_evicted_terminating_and_unreported_pods() -> None:
    evicted = pod("qs-worker-0", "Failed", node="n1", reason="Evicted", message="The node was low on resource: memory.")
    terminating = pod("qs-worker-1", "Running", node="n2", container={"restartCount": 0, "state": {"running": {}}})
    terminating["metadata"]["deletionTimestamp"] = "2026-11-27T12:00:00Z"
    assert pod_summary([evicted, terminating, pod("qs-master-0")], "qs", "pytorch") == (
        "worker-0 Failed (on n1, Evicted: The node was low on resource: memory.); worker-1 Running (on n2, terminating); master-0 Pending")


def test_jobset_pod_names_keep_their_index_and_foreign_names_stay_whole() -> None:
    pods = [pod("qs-node-0-1-x7k2p", "Running"), pod("other-pod", "Running")]
    assert pod_summary(pods, "qs", "node") == "node-0-1-x7k2p Running; other-pod Running"
    assert pod_summary([], "qs", "pytorch") == ""


def test_hostile_messages_stay_on_one_printable_line_and_are_cut() -> None:
    """A message is the cluster's text (an admission webhook's, a CSI driver's): control
    characters must not break `jobgen status`'s one line or drive the terminal, and a 300-byte
    message is cut to a readable length."""
    hostile = "bad\nline\x1b[31mred\x00" + "x" * 300
    out = pod_summary([pod("qs-master-0", "Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable\r", "message": hostile}])], "qs", "pytorch")
    assert "\n" not in out and "\x1b" not in out and "\x00" not in out and "\r" not in out
    assert out.startswith("master-0 Pending (Unschedulable\\r: bad\\nline\\x1b[31mred\\x00xxx")
    assert out.endswith("...)") and len(out) < 260, out


# ----------------------------------------------------------------- evidence for the failure class


def _failure(pods: list[dict[str, Any]], state: str = "FAILED") -> dict[str, Any] | None:
    from jobgen.backends.base import JobStatus
    from jobgen.jobdir.submission import JobHandle

    status = JobStatus(JobHandle.parse("k8s://ctx/ns/qs"), state, "kube-apiserver", {"condition": "Failed", "reason": "PyTorchJobFailed"},
                       evidence=pod_evidence(pods, "qs", "pytorch"))
    return status.to_json()["failure"]


def test_pod_evidence_oom_killed_evicted_preempted_and_the_last_exit_of_a_restarted_container() -> None:
    oom = pod("qs-worker-0", "Running", container={"restartCount": 1, "state": {"running": {}},
                                                   "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}})
    evicted = pod("qs-worker-1", "Failed", reason="Evicted", message="The node was low on resource: memory.")
    preempted = pod("qs-worker-2", "Failed", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
                    container={"state": {"terminated": {"exitCode": 143, "reason": "Error"}}})
    found = pod_evidence([oom, evicted, preempted], "qs", "pytorch")
    assert [(e.source, e.reason, e.exit_code) for e in found] == [
        ("pod worker-0", "OOMKilled", 137), ("pod worker-1", "Evicted", None), ("pod worker-2", "PreemptionByScheduler", None),
        ("pod worker-2", "", 143)]
    assert _failure([oom])["rule"] == "host-oom"
    assert _failure([evicted])["rule"] == "evicted"
    assert _failure([preempted])["rule"] == "preempted"
    assert _failure([oom], "RESTARTING")["class"] == "infrastructure"
    assert _failure([oom], "RUNNING") is None


def test_pod_evidence_a_user_exit_and_a_succeeded_pod() -> None:
    done = pod("qs-master-0", "Succeeded", container={"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}})
    bad_input = pod("qs-worker-0", "Failed", container={"state": {"terminated": {"exitCode": 2, "reason": "Error"}}})
    assert _failure([done, bad_input])["class"] == "user"
    assert _failure([done]) == {"class": "unknown", "retried": True, "rule": "no-evidence",
                                "reason": _failure([done])["reason"], "evidence": "kube-apiserver: state FAILED"}


def test_pod_evidence_hostile_values() -> None:
    """Exit codes that are not integers are dropped; reasons are kept as given and shown printable and cut."""
    weird = pod("qs-worker-0", "Failed", reason="Evicted\x1b[2J\n" + "x" * 300,
                container={"state": {"terminated": {"exitCode": "137", "reason": "OOMKilled\nmore", "signal": True}}})
    found = pod_evidence([weird, {"metadata": None, "status": None}], "qs", "pytorch")
    assert [(e.exit_code, e.signal) for e in found] == [(None, None), (None, None)]
    failure = _failure([weird])
    assert failure["class"] == "unknown" and failure["evidence"] == "kube-apiserver: state FAILED"
    shown = found[0].describe()
    assert shown.isprintable() and "\\x1b[2J\\n" in shown and len(shown) < 250
