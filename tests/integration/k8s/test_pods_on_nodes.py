"""Pods that really run: the k8s lab with two kubelet nodes (kubenodes.py).

One lab (the ``k8s_nodes`` fixture; ``JOBGEN_SKIP_K8S_NODES=1`` skips it) proves, in order:

- a server pod pinned to node 1 (``nodeName``) and a client pod placed on node 2 by the
  scheduler (``nodeSelector``) both run: the server Running, the client Succeeded;
- the client reaches the server's TCP port across the nodes by its headless Service's DNS name
  (``echo.<namespace>.svc.cluster.local``: the endpoint controller, the DNS watcher, dnsmasq,
  the routes between the nodes' pod CIDRs);
- the containers' output comes back through the API server (the kubernetes client's
  ``read_namespaced_pod_log``: kube-apiserver -> kubelet on port 10250 with its client certificate);
- deleting the pods leaves no container in either node's containerd (``ctr -n k8s.io containers ls``).

That ``down`` leaves no network namespace, link, mount, cgroup or process of the lab is checked
where the session's node lab goes down, after every test that uses it: the ``k8s_nodes``
fixture's teardown (:func:`kubenodes.down_and_check`; a failure there is an error of the session's
last test). A test here that took the shared lab down ran before the TrainJob pod tests, which
then found no API server (seen in the full suite, 2026-11-27).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # one kubelab module, as conftest.py imports it
import kubenodes  # noqa: E402
from kubelab import K8sLab, wait_for  # noqa: E402

pytestmark = pytest.mark.k8s_lab

NAMESPACE = "jk-pods"
IMAGE = "jobgen.local/busybox:1.35"


def _pod(name: str, command: str, *, labels: dict[str, str] | None = None, node_name: str | None = None,
         node_selector: dict[str, str] | None = None, restart: str = "Always") -> dict:
    spec: dict = {"restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                  "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", command]}]}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}}, "spec": spec}


def _create(lab: K8sLab, path: str, obj: dict) -> None:
    status, answer = lab.request("POST", path, obj)
    assert status in (200, 201), (status, answer)


def _phase(lab: K8sLab, name: str) -> tuple[str, str, str]:
    """(phase, node, pod IP) of pod ``name``."""
    status, pod = lab.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    assert status == 200, pod
    return pod["status"].get("phase", ""), pod["spec"].get("nodeName", ""), pod["status"].get("podIP", "")


def _core_api(lab: K8sLab):
    pytest.importorskip("kubernetes", reason="the kubernetes client (jobgen[k8s]) reads the logs")
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(str(lab.kubeconfig)))


def test_pods_run_on_both_nodes_talk_by_dns_and_log_through_the_apiserver(k8s_nodes):
    lab, nodes = k8s_nodes
    _create(lab, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    _create(lab, f"/api/v1/namespaces/{NAMESPACE}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": NAMESPACE},
        "spec": {"clusterIP": "None", "selector": {"app": "echo"}, "ports": [{"name": "http", "port": 8080}]}})
    node1, node2 = kubenodes.NODES
    started = time.monotonic()
    _create(lab, f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(
        "server", "echo hello-from-$(hostname) > /www/index.html && echo serving on $(hostname) && exec httpd -f -v -p 8080 -h /www",
        labels={"app": "echo"}, node_name=node1.name))
    url = f"http://echo.{NAMESPACE}.svc.cluster.local:8080/index.html"
    _create(lab, f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(
        "client", f"for i in $(seq 90); do if wget -q -O- {url}; then exit 0; fi; sleep 1; done; echo never reached {url}; exit 1",
        node_selector={"jobgen.io/lab-node": node2.name}, restart="Never"))

    try:
        wait_for(lambda: _phase(lab, "server")[0] == "Running", 120, 0.5, what="the server pod Running")
        wait_for(lambda: _phase(lab, "client")[0] in ("Succeeded", "Failed"), 150, 0.5, what="the client pod finished")
    except TimeoutError:
        print(nodes.log_tails(40))
        raise
    print(f"server Running and client finished {time.monotonic() - started:.1f} s after creation")
    phase, server_node, server_ip = _phase(lab, "server")
    assert (phase, server_node) == ("Running", node1.name)
    phase, client_node, client_ip = _phase(lab, "client")
    assert client_node == node2.name  # placed by kube-scheduler (nodeSelector), not by us
    api = _core_api(lab)
    client_log = api.read_namespaced_pod_log("client", NAMESPACE)
    assert phase == "Succeeded", client_log
    assert "hello-from-server" in client_log, client_log
    server_log = api.read_namespaced_pod_log("server", NAMESPACE)
    assert "serving on server" in server_log, server_log
    assert client_ip in server_log, server_log  # httpd -v logs the peer: the request came from node 2's pod
    assert server_ip.startswith("10.213.17.") and client_ip.startswith("10.213.18."), (server_ip, client_ip)

    # Deleted pods leave no container behind on either node (kubelet's container GC removes the
    # exited ones of deleted pods within about a minute).
    deleting = time.monotonic()
    for name in ("server", "client"):
        status, answer = lab.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        assert status == 200, answer
    wait_for(lambda: all(lab.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{n}")[0] == 404 for n in ("server", "client")),
             120, 0.5, what="the pods deleted")
    print(f"pods gone from the API server {time.monotonic() - deleting:.1f} s after the delete")
    deleted = time.monotonic()
    wait_for(lambda: not any(nodes.containers(node) for node in kubenodes.NODES), 150, 1.0,
             what="no container left in either node's containerd")
    print(f"containers gone {time.monotonic() - deleted:.1f} s after the pods were deleted")
