"""``jobgen status`` on Kubernetes says what each pod of the job is doing (``details["pods"]``):
the phase the kubelet reports, the node, why a pod waits (the scheduler's Unschedulable, the
container's waiting reason), exit codes and restarts. The pods here are the objects the API
server returns (v1 Pod status fields as kubelet 1.20+ writes them); the same function runs on the
lab's real pods in tests/integration/k8s (test_operator_emulation.py, test_jobgen_on_pods.py)."""

from __future__ import annotations

from typing import Any

from jobgen.backends.k8s_pods import pod_summary


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
