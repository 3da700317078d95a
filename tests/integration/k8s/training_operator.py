"""The emulated Kubeflow training-operator: what training-operator v1.9's PyTorchJob controller
does to a cluster, for the Kubernetes labs (the real one is a Go program that cannot be built
here: no Go module proxy). It is the one emulated part of the pod lab; everything it talks to is
real (kube-apiserver, etcd, the garbage collector, and in the pod lab the kubelets).

Run it as a process::

    python tests/integration/k8s/training_operator.py --kubeconfig KUBECONFIG --context CONTEXT

or import it (:class:`Operator`, :func:`operator_env`, :func:`desired_pod`, ...). It needs the
standard library and the official ``kubernetes`` client only; nothing from jobgen.

Read from kubeflow/training-operator at tag v1.9.0 (commit 6f74c7f6b; pkg/ is the same on the
release-1.9 branch, and jobgen ships the v1.9.3/v1.9.4 CRDs, whose schema is unchanged). The
sources, all under pkg/:

* controller.v1/pytorch/envvar.go (``setPodEnv``), master.go, elastic.go: the variables appended
  to every container (see :func:`injected_env`);
* controller.v1/pytorch/initcontainer.go, config/config.go: the ``init-pytorch`` container
  (alpine:3.10, ``nslookup`` of the Master's Service, 100 tries) added to Worker pods when the
  job has a Master;
* apis/kubeflow.org/v1/pytorch_defaults.go, defaulting_utils.go: defaults (replicas 1,
  restartPolicy OnFailure, port ``pytorchjob-port`` 23456, cleanPodPolicy None, nprocPerNode
  "auto", elastic min/max);
* controller.v1/common/job.go (``ReconcileJobs``), pod.go (``ReconcilePods``, ``createNewPod``),
  service.go (``ReconcileServices``, ``CreateNewService``), job_controller.go (labels, owner
  reference), core/job.go (``PastBackoffLimit``), core/pod.go (``SetRestartPolicy``),
  core/status.go (replica counts), util/status.go (``setCondition``), util/train/train_util.go
  (``IsRetryableExitCode``: exit codes >= 128 are retryable);
* controller.v1/pytorch/pytorchjob_controller.go: ``UpdateJobStatus`` (the success policy: the
  job succeeds when the Master succeeds, or without a Master when every Worker did, or, elastic,
  when one did), ``onOwnerCreateFunc`` (the Created condition), status written with
  ``Status().Update`` (PUT on the /status subresource).

Emulated as v1.9 does it: pods ``<job>-<replica type lowercased>-<index>`` from the replica's
template with the operator's labels, a controller owner reference (blockOwnerDeletion) and the
injected environment; one headless Service per pod (same name, all of the ``pytorch``
container's ports); restart policies Always, OnFailure, Never and ExitCode (the pod gets
restartPolicy Never; a retryable exit deletes it and the next pass recreates it); backoffLimit as
v1.9 counts it (container restartCounts of Running pods, plus "a new failure and backoffLimit 0",
because its work queue never counts requeues); activeDeadlineSeconds; cleanPodPolicy and
ttlSecondsAfterFinished; suspend/resume; conditions with v1.9's reasons, messages and transition
rules; replicaStatuses with their selector; startTime, completionTime.

Not emulated: the admission webhooks (validation; the defaults are applied in memory, as the
reconciler's ``Scheme.Default`` does, never written back), Events, metrics, gang scheduling
(PodGroups), the HPA of elasticPolicy.metrics, adoption (and release) of orphaned pods, leader
election, the informer cache and its expectations (each pass reads the API server instead, one
pass at a time), the other job kinds (TFJob, MPIJob, ...).
Replica types are visited Master then Worker (Go's map order is random: when the Master succeeds
the pass ends before the Worker's failure check, as it may in v1.9). Faithful quirks of v1.9 that
show here: a retryable ExitCode failure never exhausts a backoffLimit above 0, and a permanent
ExitCode failure sets Failed without a completionTime.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # imported from this directory or run as a script: the repository's tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.processes import process_running  # noqa: E402

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
CONTROLLER_NAME = "pytorchjob-controller"
#: The value of runPolicy.managedBy that leaves a job to this operator (v1.9 KubeflowJobsController).
MANAGED_BY = "kubeflow.org/training-operator"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
CONTAINER_NAME, PORT_NAME, DEFAULT_PORT = "pytorch", "pytorchjob-port", 23456
MASTER, WORKER = "Master", "Worker"
#: pkg/config/config.go defaults (flags --pytorch-init-container-image, --pytorch-init-container-max-tries).
INIT_CONTAINER_IMAGE, INIT_CONTAINER_MAX_TRIES = "alpine:3.10", 100

log = logging.getLogger("jobgen-lab-operator")


def now() -> str:
    """metav1.Now() as the API server stores it (RFC 3339, seconds, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


# --------------------------------------------------------------------------- defaults, names, env


def defaulted(job: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``job`` with v1.9's defaults (pytorch_defaults.go ``SetDefaults_PyTorchJob``)."""
    job = copy.deepcopy(job)
    spec = job.setdefault("spec", {})
    run_policy = spec.setdefault("runPolicy", {})
    run_policy.setdefault("cleanPodPolicy", "None")
    replicas = spec.setdefault("pytorchReplicaSpecs", {})
    for canonical in (MASTER, WORKER):  # setTypeNameToCamelCase
        for key in list(replicas):
            if key.lower() == canonical.lower() and key != canonical:
                replicas[canonical] = replicas.pop(key)
                break
    for replica in replicas.values():
        replica.setdefault("replicas", 1)
        if not replica.get("restartPolicy"):
            replica["restartPolicy"] = "OnFailure"
        containers = replica.setdefault("template", {}).setdefault("spec", {}).setdefault("containers", [])
        # getDefaultContainerIndex: the container named pytorch, else the first one
        container = next((c for c in containers if c.get("name") == CONTAINER_NAME), containers[0] if containers else None)
        if container is not None and not any(p.get("name") == PORT_NAME for p in container.get("ports") or []):
            container.setdefault("ports", []).append({"name": PORT_NAME, "containerPort": DEFAULT_PORT})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if elastic.get("maxReplicas") is not None and elastic.get("minReplicas") is None:
            elastic["minReplicas"] = elastic["maxReplicas"]
        elif elastic.get("minReplicas") is not None and elastic.get("maxReplicas") is None:
            elastic["maxReplicas"] = elastic["minReplicas"]
        elif elastic.get("minReplicas") is None and elastic.get("maxReplicas") is None and WORKER in replicas:
            elastic["minReplicas"] = elastic["maxReplicas"] = replicas[WORKER]["replicas"]
    if (elastic is None or elastic.get("nProcPerNode") is None) and spec.get("nprocPerNode") is None:
        spec["nprocPerNode"] = "auto"
    return job


def replica_name(job_name: str, rtype: str, index: int | str) -> str:
    """``<job>-<replica type lowercased>-<index>``: the pod's and its Service's name (common/util.go ``GenGeneralName``)."""
    return f"{job_name}-{rtype.lower()}-{index}".replace("/", "-")


def replica_port(job: dict[str, Any], rtype: str) -> int:
    """The ``pytorchjob-port`` of replica ``rtype``'s ``pytorch`` container (envvar.go ``getPortFromPyTorchJob``)."""
    for container in job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]:
        if container.get("name") == CONTAINER_NAME:
            for port in container.get("ports") or []:
                if port.get("name") == PORT_NAME:
                    return int(port["containerPort"])
    raise ValueError("port not found")


def _total_replicas(job: dict[str, Any]) -> int:
    return sum(int(r.get("replicas", 1)) for r in job["spec"]["pytorchReplicaSpecs"].values())


def _nproc_int(job: dict[str, Any]) -> int:
    try:
        return int(job["spec"].get("nprocPerNode"))
    except (TypeError, ValueError):  # "auto", "cpu", "gpu", unset: 1 (envvar.go getNprocPerNodeInt)
        return 1


def injected_env(job: dict[str, Any], rtype: str, index: int) -> list[dict[str, str]]:
    """The variables v1.9 appends, in its order, to every container of pod ``rtype``-``index``
    of the *defaulted* job (envvar.go ``setPodEnv``, master.go, elastic.go):

    PYTHONUNBUFFERED=1; with a Master: MASTER_PORT, PET_MASTER_PORT (the Master's
    ``pytorchjob-port``), MASTER_ADDR, PET_MASTER_ADDR (``<job>-master-0``), WORLD_SIZE (= pods x
    nprocPerNode, "auto" counting 1), RANK and PET_NODE_RANK (the pod's index, +1 on Workers: a
    pod rank); PET_NPROC_PER_NODE (spec.nprocPerNode) when set; then either PET_NNODES (= pods) or,
    with an elasticPolicy: PET_RDZV_ENDPOINT (rdzvHost or ``<job>-worker-0``, rdzvPort or the
    Worker's ``pytorchjob-port``), PET_RDZV_BACKEND (default c10d), PET_NNODES (``min:max``, or
    the Worker replicas when neither is set), PET_MAX_RESTARTS, PET_NPROC_PER_NODE (the policy's
    nProcPerNode: a second entry), PET_RDZV_ID, PET_RDZV_CONF (``k=v,k=v``), PET_STANDALONE ("")
    when set."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    name = job["metadata"]["name"]
    env = [("PYTHONUNBUFFERED", "1")]
    if MASTER in replicas:
        port, addr = str(replica_port(job, MASTER)), replica_name(name, MASTER, 0)
        env += [("MASTER_PORT", port), ("PET_MASTER_PORT", port), ("MASTER_ADDR", addr), ("PET_MASTER_ADDR", addr)]
        rank = index + (1 if rtype.lower() == "worker" else 0)
        env += [("WORLD_SIZE", str(_total_replicas(job) * _nproc_int(job))), ("RANK", str(rank)), ("PET_NODE_RANK", str(rank))]
    if spec.get("nprocPerNode") is not None:
        env.append(("PET_NPROC_PER_NODE", str(spec["nprocPerNode"])))
    elastic = spec.get("elasticPolicy")
    if elastic is None:
        env.append(("PET_NNODES", str(_total_replicas(job))))
    else:
        host = elastic.get("rdzvHost") or f"{name}-worker-0"
        port = elastic.get("rdzvPort") if elastic.get("rdzvPort") is not None else replica_port(job, WORKER)
        env.append(("PET_RDZV_ENDPOINT", f"{host}:{port}"))
        env.append(("PET_RDZV_BACKEND", elastic.get("rdzvBackend") or "c10d"))
        if elastic.get("minReplicas") is None and elastic.get("maxReplicas") is None:
            if WORKER not in replicas:
                raise ValueError("cannot find the worker spec")
            env.append(("PET_NNODES", str(replicas[WORKER]["replicas"])))
        else:
            env.append(("PET_NNODES", f"{elastic.get('minReplicas')}:{elastic.get('maxReplicas')}"))
        for field, var in (("maxRestarts", "PET_MAX_RESTARTS"), ("nProcPerNode", "PET_NPROC_PER_NODE"), ("rdzvId", "PET_RDZV_ID")):
            if elastic.get(field) is not None:
                env.append((var, str(elastic[field])))
        if elastic.get("rdzvConf"):
            env.append(("PET_RDZV_CONF", ",".join(f"{c.get('key', '')}={c.get('value', '')}" for c in elastic["rdzvConf"])))
        if elastic.get("standalone"):
            env.append(("PET_STANDALONE", ""))
    return [{"name": key, "value": value} for key, value in env]


def operator_env(job: dict[str, Any], rtype: str, index: int) -> dict[str, str]:
    """What a process in pod ``rtype``-``index`` sees of :func:`injected_env` (``job`` as
    submitted: the defaults are applied here). A name that appears twice keeps its last value,
    as the kubelet resolves duplicates."""
    return {e["name"]: e["value"] for e in injected_env(defaulted(job), rtype, index)}


def init_containers(job: dict[str, Any], rtype: str, *, image: str = INIT_CONTAINER_IMAGE,
                    max_tries: int = INIT_CONTAINER_MAX_TRIES, template: str | None = None) -> list[dict[str, Any]]:
    """The ``init-pytorch`` container v1.9 appends to Worker pods of a job with a Master: it
    waits until the Master's Service resolves (initcontainer.go ``setInitContainer``, default
    template). ``template``: the text of a --pytorch-init-container-template-file (a YAML list of
    containers with ``{{.MasterAddr}}``, ``{{.InitContainerImage}}``, ``{{.MaxTries}}``), as
    v1.9 takes it; ``[]`` adds none."""
    if MASTER not in job["spec"]["pytorchReplicaSpecs"] or rtype.lower() != "worker":
        return []
    master = replica_name(job["metadata"]["name"], MASTER, 0)
    if template is not None:
        import yaml  # PyYAML: a dependency of the kubernetes client

        text = template.replace("{{.MasterAddr}}", master).replace("{{.InitContainerImage}}", image)
        return yaml.safe_load(text.replace("{{.MaxTries}}", str(max_tries))) or []
    script = (f"err=1;for i in $(seq {max_tries}); do if nslookup {master}; then err=0 && break; fi;"
              "echo waiting for master; sleep 2; done; exit $err")
    return [{"name": "init-pytorch", "image": image, "imagePullPolicy": "IfNotPresent",
             "resources": {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}},
             "command": ["sh", "-c", script]}]


def job_labels(job_name: str) -> dict[str, str]:
    """job_controller.go ``GenLabels``."""
    return {OPERATOR_NAME_LABEL: CONTROLLER_NAME, JOB_NAME_LABEL: job_name.replace("/", "-")}


def replica_labels(job_name: str, rtype: str, index: int) -> dict[str, str]:
    return {**job_labels(job_name), REPLICA_TYPE_LABEL: rtype.lower(), REPLICA_INDEX_LABEL: str(index)}


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """job_controller.go ``GenOwnerReference``."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def is_master_role(job: dict[str, Any], rtype: str, index: int) -> bool:
    """pytorchjob_controller.go ``IsMasterRole``: the Master, else Worker 0."""
    if MASTER in job["spec"]["pytorchReplicaSpecs"]:
        return rtype == MASTER
    return rtype == WORKER and index == 0


def desired_pod(job: dict[str, Any], rtype: str, index: int, *, init_image: str = INIT_CONTAINER_IMAGE,
                init_max_tries: int = INIT_CONTAINER_MAX_TRIES, init_template: str | None = None) -> dict[str, Any]:
    """The Pod v1.9 creates for replica ``rtype`` index ``index`` of the defaulted ``job`` (pod.go
    ``createNewPod``, control/pod_control.go ``GetPodFromTemplate``): the template's labels,
    annotations and finalizers plus the operator's labels, its spec with the injected environment,
    the init container and the replica's restart policy (ExitCode -> Never)."""
    replica = job["spec"]["pytorchReplicaSpecs"][rtype]
    template = copy.deepcopy(replica["template"])
    meta = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), **replica_labels(job["metadata"]["name"], rtype, index)}
    if is_master_role(job, rtype, index):
        labels[JOB_ROLE_LABEL] = "master"
    pod_spec = template["spec"]
    for container in pod_spec.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *injected_env(job, rtype, index)]
    extra_init = init_containers(job, rtype, image=init_image, max_tries=init_max_tries, template=init_template)
    if extra_init:
        pod_spec["initContainers"] = [*(pod_spec.get("initContainers") or []), *extra_init]
    policy = replica["restartPolicy"]
    pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
    metadata: dict[str, Any] = {"name": replica_name(job["metadata"]["name"], rtype, index), "namespace": job["metadata"]["namespace"],
                                "labels": labels, "ownerReferences": [owner_reference(job)]}
    for key in ("annotations", "finalizers"):
        if meta.get(key):
            metadata[key] = copy.deepcopy(meta[key])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def desired_service(job: dict[str, Any], rtype: str, index: int) -> dict[str, Any]:
    """The headless Service v1.9 creates next to each pod (service.go ``CreateNewService``): the
    pod's name, a selector on the replica's labels, every port of the ``pytorch`` container."""
    containers = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]
    container = next((c for c in containers if c.get("name") == CONTAINER_NAME), None)
    if container is None:
        raise ValueError("failed to find the port")
    labels = replica_labels(job["metadata"]["name"], rtype, index)
    ports = [{"name": p.get("name"), "port": p["containerPort"]} for p in container.get("ports") or []]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": replica_name(job["metadata"]["name"], rtype, index), "namespace": job["metadata"]["namespace"],
                         "labels": labels, "ownerReferences": [owner_reference(job)]},
            "spec": {"clusterIP": "None", "selector": labels, **({"ports": ports} if ports else {})}}


# --------------------------------------------------------------------------- status


def _condition_true(status: dict[str, Any], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or [])


def is_finished(status: dict[str, Any]) -> bool:
    return _condition_true(status, "Succeeded") or _condition_true(status, "Failed")


def set_condition(status: dict[str, Any], ctype: str, value: str, reason: str, message: str) -> None:
    """util/status.go ``UpdateJobConditions``: nothing changes once Failed is True; the same
    type/status/reason is left alone; the same status keeps its lastTransitionTime; Running and
    Restarting replace each other; Succeeded and Failed turn Running False."""
    conditions = status.get("conditions") or []
    if _condition_true(status, "Failed"):
        return
    at = now()
    new = {"type": ctype, "status": value, "reason": reason, "message": message, "lastUpdateTime": at, "lastTransitionTime": at}
    current = next((c for c in conditions if c.get("type") == ctype), None)
    if current is not None and current.get("status") == value:
        if current.get("reason") == reason:
            return
        new["lastTransitionTime"] = current.get("lastTransitionTime", at)
    kept = []
    for cond in conditions:
        if cond.get("type") == ctype or {ctype, cond.get("type")} == {"Running", "Restarting"}:
            continue
        if ctype in ("Failed", "Succeeded") and cond.get("type") == "Running":
            cond = {**cond, "status": "False"}
        kept.append(cond)
    status["conditions"] = [*kept, new]


def _reason(word: str) -> str:
    return f"{KIND}{word}"


def _pod_phase(pod: dict[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or ""


def _is_active(pod: dict[str, Any]) -> bool:
    return _pod_phase(pod) not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def _exit_code(pod: dict[str, Any]) -> int:
    code = 0xBEEF  # pod.go's "magic number": no terminated pytorch container
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == CONTAINER_NAME and terminated:
            code = int(terminated.get("exitCode", 0))
    return code


# --------------------------------------------------------------------------- the controller


class Operator:
    """The PyTorchJob controller. :meth:`reconcile` runs one pass for one job (importable, for
    tests); :meth:`run` watches PyTorchJobs, and the pods and Services the operator labels, in
    all namespaces, and reconciles the jobs they belong to until ``stop`` is set."""

    def __init__(self, api_client: Any, *, init_image: str = INIT_CONTAINER_IMAGE, init_max_tries: int = INIT_CONTAINER_MAX_TRIES,
                 init_template: str | None = None, resync_s: float = 30.0):
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.init_image, self.init_max_tries, self.init_template, self.resync_s = init_image, init_max_tries, init_template, resync_s
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    # ----- API helpers (plain dicts, camelCase as on the wire)

    def _raw(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        response = call(*args, _preload_content=False, **kwargs)
        return json.loads(response.data or b"{}")

    def _get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._raw(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _owned(self, kind: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        selector = ",".join(f"{k}={v}" for k, v in job_labels(name).items())
        call = self.core.list_namespaced_pod if kind == "pod" else self.core.list_namespaced_service
        items = self._raw(call, namespace, label_selector=selector).get("items") or []
        if kind == "service":  # GetServicesForJob: by label only
            return items
        uid = job["metadata"]["uid"]  # ClaimPods: pods this job controls (orphans are not adopted here)
        return [p for p in items if any(r.get("controller") and r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

    def _ignore(self, status: int, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            call(*args, _preload_content=False, **kwargs)  # the answer is not needed (nor always the type the client expects)
        except ApiException as exc:
            if exc.status != status:
                raise

    def _delete_pod(self, pod: dict[str, Any]) -> None:
        if pod["metadata"].get("deletionTimestamp"):  # pod_control.go: terminating, skip
            return
        log.info("deleting pod %s/%s", pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._ignore(404, self.core.delete_namespaced_pod, pod["metadata"]["name"], pod["metadata"]["namespace"])

    def _delete_service(self, namespace: str, name: str) -> None:
        self._ignore(404, self.core.delete_namespaced_service, name, namespace)

    def _write_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        """UpdateJobStatusInApiServer: PUT the object with the new status on /status (a conflict
        raises: the caller requeues)."""
        body = {**job, "status": status}
        self.custom.replace_namespaced_custom_object_status(GROUP, VERSION, job["metadata"]["namespace"], PLURAL,
                                                            job["metadata"]["name"], body, _preload_content=False)

    # ----- one reconcile pass (common/job.go ReconcileJobs)

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One pass over job ``namespace``/``name``; returns seconds until it needs another pass
        regardless of events (activeDeadlineSeconds, ttlSecondsAfterFinished), or None."""
        stored = self._get_job(namespace, name)
        if stored is None or stored["metadata"].get("deletionTimestamp"):
            return None
        managed_by = ((stored.get("spec") or {}).get("runPolicy") or {}).get("managedBy")
        if managed_by and managed_by != MANAGED_BY:
            return None
        job = defaulted(stored)
        status = copy.deepcopy(stored.get("status") or {})
        set_condition(status, "Created", "True", _reason("Created"), f"{KIND} {name} is created.")  # onOwnerCreateFunc
        old = copy.deepcopy(status)
        run_policy = job["spec"]["runPolicy"]
        replicas = job["spec"]["pytorchReplicaSpecs"]
        rtypes = sorted(replicas)
        pods = self._owned("pod", job)
        services = self._owned("service", job)

        if is_finished(status):
            requeue = self._clean_up(job, run_policy, status, pods)
            if _condition_true(status, "Succeeded"):
                for counts in (status.get("replicaStatuses") or {}).values():
                    if counts.get("active"):
                        counts["succeeded"] = counts.get("succeeded", 0) + counts.pop("active")
            if status != old:
                self._write_status(stored, status)
            return requeue

        if run_policy.get("suspend"):
            self._clean_up(job, run_policy, status, pods)
            for counts in (status.get("replicaStatuses") or {}).values():
                counts.pop("active", None)
            message = f"{KIND} {name} is suspended."
            if _condition_true(status, "Running"):
                set_condition(status, "Running", "False", _reason("Suspended"), message)
            if not _condition_true(status, "Suspended"):
                set_condition(status, "Suspended", "True", _reason("Suspended"), message)
            if status != old:
                self._write_status(stored, status)
            return None
        if _condition_true(status, "Suspended"):
            set_condition(status, "Suspended", "False", _reason("Resumed"), f"{KIND} {name} is resumed.")
            status["startTime"] = now()

        active = sum(1 for p in pods if _is_active(p))
        failed = sum(1 for p in pods if _pod_phase(p) == "Failed")
        total = sum(int(r["replicas"]) for r in replicas.values())
        previously_failed = sum(int(c.get("failed", 0)) for c in (status.get("replicaStatuses") or {}).values())
        failure = None
        limit = run_policy.get("backoffLimit")
        if limit is not None:
            # previousRetry is 0: v1.9 runs this reconciler with a FakeWorkQueue (NumRequeues 0)
            exceeds = failed > previously_failed and active != total and 0 + 1 > int(limit)
            if exceeds or self._past_backoff_limit(job, pods, int(limit)):
                failure = f"Job {name} has failed because it has reached the specified backoff limit"
        if failure is None and self._past_active_deadline(run_policy, status):
            failure = f"Job {name} has failed because it was active longer than specified deadline"
        if failure is not None:
            status.setdefault("completionTime", now())
            self._delete_pods_and_services(run_policy, status, pods)
            requeue = self._cleanup_job(job, run_policy, status)
            set_condition(status, "Failed", "True", _reason("Failed"), failure)
            self._write_status(stored, status)
            return requeue

        for rtype in rtypes:
            self._reconcile_pods(job, status, pods, rtype)
            self._reconcile_services(job, services, rtype)
        self._update_job_status(job, status)
        if status != old:
            self._write_status(stored, status)
        deadline = run_policy.get("activeDeadlineSeconds")
        if deadline is not None and status.get("startTime"):
            return max(0.0, _parse_time(status["startTime"]) + int(deadline) - time.time())
        return None

    def _past_backoff_limit(self, job: dict[str, Any], pods: list[dict[str, Any]], limit: int) -> bool:
        """core/job.go ``PastBackoffLimit``: restartCounts of the Running pods of replicas whose
        policy is OnFailure, Always or ExitCode."""
        restarts = 0
        for rtype, replica in job["spec"]["pytorchReplicaSpecs"].items():
            if replica["restartPolicy"] not in ("OnFailure", "Always", "ExitCode"):
                continue
            for pod in pods:
                if pod["metadata"].get("labels", {}).get(REPLICA_TYPE_LABEL) != rtype.lower() or _pod_phase(pod) != "Running":
                    continue
                pod_status = pod.get("status") or {}
                for cs in (pod_status.get("initContainerStatuses") or []) + (pod_status.get("containerStatuses") or []):
                    restarts += int(cs.get("restartCount", 0))
        return restarts > 0 if limit == 0 else restarts >= limit

    @staticmethod
    def _past_active_deadline(run_policy: dict[str, Any], status: dict[str, Any]) -> bool:
        deadline = run_policy.get("activeDeadlineSeconds")
        if deadline is None or not status.get("startTime"):
            return False
        return time.time() - _parse_time(status["startTime"]) >= int(deadline)

    def _delete_pods_and_services(self, run_policy: dict[str, Any], status: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """common/job.go ``DeletePodsAndServices`` (cleanPodPolicy applies to finished jobs only)."""
        if not pods:
            return
        finished = is_finished(status)
        if finished and run_policy["cleanPodPolicy"] == "None":
            return
        for pod in pods:
            if finished and run_policy["cleanPodPolicy"] == "Running" and _pod_phase(pod) not in ("Running", "Pending"):
                continue
            self._delete_pod(pod)
            self._delete_service(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _cleanup_job(self, job: dict[str, Any], run_policy: dict[str, Any], status: dict[str, Any]) -> float | None:
        """common/job.go ``CleanupJob``: ttlSecondsAfterFinished deletes the job; returns the seconds left."""
        ttl = run_policy.get("ttlSecondsAfterFinished")
        if ttl is None or run_policy.get("suspend"):
            return None
        if not status.get("completionTime"):
            log.warning("job %s: completion time is nil, cannot cleanup", job["metadata"]["name"])
            return None
        remaining = _parse_time(status["completionTime"]) + int(ttl) - time.time()
        if remaining < 0:
            log.info("deleting job %s/%s (ttlSecondsAfterFinished)", job["metadata"]["namespace"], job["metadata"]["name"])
            self._ignore(404, self.custom.delete_namespaced_custom_object, GROUP, VERSION, job["metadata"]["namespace"], PLURAL,
                         job["metadata"]["name"])
            return None
        return remaining

    def _clean_up(self, job: dict[str, Any], run_policy: dict[str, Any], status: dict[str, Any], pods: list[dict[str, Any]]) -> float | None:
        self._delete_pods_and_services(run_policy, status, pods)
        return self._cleanup_job(job, run_policy, status)

    def _reconcile_pods(self, job: dict[str, Any], status: dict[str, Any], pods: list[dict[str, Any]], rtype: str) -> None:
        """common/pod.go ``ReconcilePods``."""
        replica = job["spec"]["pytorchReplicaSpecs"][rtype]
        count = int(replica["replicas"])
        name = job["metadata"]["name"]
        counts: dict[str, int] = {}
        status.setdefault("replicaStatuses", {})[rtype] = counts  # initializeReplicaStatuses
        slices: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            if labels.get(REPLICA_TYPE_LABEL) != rtype.lower():
                continue
            try:
                slices.setdefault(int(labels[REPLICA_INDEX_LABEL]), []).append(pod)
            except (KeyError, ValueError):
                log.warning("pod %s has no replica index", pod["metadata"]["name"])
        for index in range(max([count, *(i + 1 for i in slices)])):
            found = slices.get(index, [])
            if len(found) > 1:
                log.warning("too many pods for %s %d", rtype.lower(), index)
                continue
            if not found:
                if index < count:
                    self._create(job, rtype, index)
                continue
            pod = found[0]
            if index >= count:
                self._delete_pod(pod)
            if _pod_phase(pod) == "Failed":
                code, policy = _exit_code(pod), replica["restartPolicy"]
                if (policy == "ExitCode" and code >= 128) or policy in ("OnFailure", "Always"):
                    self._delete_pod(pod)
                    set_condition(status, "Restarting", "True", _reason("Restarting"),
                                  f"job {name} is restarting because {rtype} replica(s) failed.")
                elif policy == "ExitCode":
                    set_condition(status, "Failed", "True", _reason("Failed"), f'job "{name}" is failing because "{rtype}" replica(s) failed.')
            phase = _pod_phase(pod)  # core/status.go UpdateJobReplicaStatuses
            key = {"Running": "failed" if pod["metadata"].get("deletionTimestamp") else "active", "Succeeded": "succeeded",
                   "Failed": "failed"}.get(phase)
            if key:
                counts[key] = counts.get(key, 0) + 1

    def _create(self, job: dict[str, Any], rtype: str, index: int) -> None:
        from kubernetes.client.exceptions import ApiException

        pod = desired_pod(job, rtype, index, init_image=self.init_image, init_max_tries=self.init_max_tries, init_template=self.init_template)
        log.info("creating pod %s/%s", pod["metadata"]["namespace"], pod["metadata"]["name"])
        try:
            self.core.create_namespaced_pod(pod["metadata"]["namespace"], pod, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:  # already exists: the previous pod is still being deleted; the next pass sees it
                raise

    def _reconcile_services(self, job: dict[str, Any], services: list[dict[str, Any]], rtype: str) -> None:
        """common/service.go ``ReconcileServices``."""
        count = int(job["spec"]["pytorchReplicaSpecs"][rtype]["replicas"])
        slices: dict[int, list[dict[str, Any]]] = {}
        for svc in services:
            labels = svc["metadata"].get("labels") or {}
            if labels.get(REPLICA_TYPE_LABEL) == rtype.lower() and (labels.get(REPLICA_INDEX_LABEL) or "").isdigit():
                slices.setdefault(int(labels[REPLICA_INDEX_LABEL]), []).append(svc)
        for index in range(max([count, *(i + 1 for i in slices)])):
            found = slices.get(index, [])
            if len(found) > 1:
                log.warning("too many services for %s %d", rtype, index)
            elif not found and index < count:
                self._ignore(409, self.core.create_namespaced_service, job["metadata"]["namespace"], desired_service(job, rtype, index))
            elif found and index >= count:
                self._delete_service(job["metadata"]["namespace"], found[0]["metadata"]["name"])

    def _update_job_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        """pytorchjob_controller.go ``UpdateJobStatus``."""
        name = job["metadata"]["name"]
        replicas = job["spec"]["pytorchReplicaSpecs"]
        status.setdefault("startTime", now())
        for rtype in sorted(replicas):
            counts = status["replicaStatuses"].setdefault(rtype, {})
            labels = {**job_labels(name), REPLICA_TYPE_LABEL: rtype.lower()}
            counts["selector"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))  # metav1.FormatLabelSelector
            succeeded, running, failed = counts.get("succeeded", 0), counts.get("active", 0), counts.get("failed", 0)
            wanted = int(replicas[rtype]["replicas"])
            expected = wanted - succeeded
            if MASTER in replicas:
                if rtype == MASTER:
                    if running > 0:
                        set_condition(status, "Running", "True", _reason("Running"), f"{KIND} {name} is running.")
                    if expected == 0:
                        status.setdefault("completionTime", now())
                        set_condition(status, "Succeeded", "True", _reason("Succeeded"), f"{KIND} {name} is successfully completed.")
                        return
            elif rtype == WORKER:
                namespace = job["metadata"]["namespace"]
                if expected == 0 or (job["spec"].get("elasticPolicy") is not None and succeeded > 0):
                    status.setdefault("completionTime", now())
                    set_condition(status, "Succeeded", "True", _reason("Succeeded"), f"{KIND} {namespace}/{name} successfully completed.")
                elif running > 0:
                    set_condition(status, "Running", "True", _reason("Running"), f"{KIND} {namespace}/{name} is running.")
            if failed > 0 and wanted > succeeded + running:
                if replicas[rtype]["restartPolicy"] != "Never":
                    set_condition(status, "Restarting", "True", _reason("Restarting"),
                                  f"{KIND} {name} is restarting because {failed} {rtype} replica(s) failed.")
                else:
                    status.setdefault("completionTime", now())
                    set_condition(status, "Failed", "True", _reason("Failed"), f"{KIND} {name} is failed because {failed} {rtype} replica(s) failed.")

    # ----- the event loop

    def enqueue(self, namespace: str, name: str, after: float = 0.0) -> None:
        if after > 0:
            timer = threading.Timer(after, self.enqueue, (namespace, name))
            timer.daemon = True
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
            timer.start()
            return
        with self._lock:
            if (namespace, name) in self._queued:
                return
            self._queued.add((namespace, name))
        self._queue.put((namespace, name))

    def _watch(self, what: str, stop: threading.Event) -> None:
        """Watch ``what`` (jobs, pods, services) in all namespaces and enqueue the job each event
        belongs to; every watch starts with the current objects (a resync)."""
        from kubernetes import watch

        selector = f"{OPERATOR_NAME_LABEL}={CONTROLLER_NAME}"
        calls = {
            "jobs": (self.custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL), {}),
            "pods": (self.core.list_pod_for_all_namespaces, (), {"label_selector": selector}),
            "services": (self.core.list_service_for_all_namespaces, (), {"label_selector": selector}),
        }
        call, args, kwargs = calls[what]
        while not stop.is_set():
            watcher = watch.Watch(return_type="object")  # plain dicts: no client model to outgrow
            try:
                for event in watcher.stream(call, *args, timeout_seconds=max(1, int(self.resync_s)), **kwargs):
                    if event["type"] == "ERROR":  # e.g. 410 Gone: the watch ends, the next one lists again
                        log.info("watch %s: %s", what, event["raw_object"].get("message"))
                        break
                    meta = event["raw_object"]["metadata"]
                    if what == "jobs":
                        self.enqueue(meta["namespace"], meta["name"])
                    else:
                        owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller") and r.get("kind") == KIND), None)
                        if owner is not None:
                            self.enqueue(meta["namespace"], owner["name"])
                    if stop.is_set():
                        break
            except Exception as exc:  # the server went away, a watch expired: start again
                if not stop.is_set():
                    log.warning("watch %s: %s", what, exc)
                    stop.wait(1.0)
            finally:
                watcher.stop()

    def run(self, stop: threading.Event) -> None:
        """Watch and reconcile until ``stop`` is set."""
        from kubernetes.client.exceptions import ApiException

        threads = [threading.Thread(target=self._watch, args=(what, stop), name=f"watch-{what}", daemon=True)
                   for what in ("jobs", "pods", "services")]
        for thread in threads:
            thread.start()
        log.info("watching %s.%s/%s, pods and services in all namespaces", PLURAL, GROUP, VERSION)
        while not stop.is_set():
            try:
                key = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            with self._lock:
                self._queued.discard(key)
            try:
                after = self.reconcile(*key)
            except ApiException as exc:
                log.info("reconcile %s/%s: %s %s; again", *key, exc.status, exc.reason)
                self.enqueue(*key, after=0.2)
                continue
            except Exception:
                log.exception("reconcile %s/%s failed; again in 1 s", *key)
                self.enqueue(*key, after=1.0)
                continue
            if after is not None:
                self.enqueue(*key, after=after + 0.05)
        for timer in self._timers:
            timer.cancel()
        for thread in threads:  # daemon threads: a watch still waiting on the server ends with the process
            thread.join(timeout=0.5)


@contextlib.contextmanager
def operator_process(kubeconfig: Path | str, log_path: Path, *args: str, context: str = "jobgen-lab") -> Iterator[subprocess.Popen[bytes]]:
    """This module run as a process (``--kubeconfig KUBECONFIG --context CONTEXT --resync-s 10
    ARGS``) for the ``with`` block, its output in ``log_path``; stopped (TERM, then KILL after
    15 s) on the way out. Raises AssertionError when it exits at start or when its log shows a
    traceback (a controller pass that failed) once it has stopped."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--kubeconfig", str(kubeconfig), "--context", context, "--resync-s", "10", *args]
    with process_running(argv, log_path, "operator") as proc:
        yield proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The emulated training-operator v1.9 PyTorchJob controller (jobgen's k8s labs).")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--context", default=None)
    parser.add_argument("--pytorch-init-container-image", default=INIT_CONTAINER_IMAGE)
    parser.add_argument("--pytorch-init-container-max-tries", type=int, default=INIT_CONTAINER_MAX_TRIES)
    parser.add_argument("--pytorch-init-container-template-file", default=None,
                        help="a YAML list of init containers for Worker pods (v1.9's flag; unreadable: the default template)")
    parser.add_argument("--resync-s", type=float, default=30.0, help="how long one watch lasts before it starts again (a resync)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)
    template = None
    if args.pytorch_init_container_template_file:
        try:
            with open(args.pytorch_init_container_template_file) as fh:
                template = fh.read()
        except OSError as exc:  # v1.9 falls back to its default template too
            log.warning("init container template: %s; the default one is used", exc)
    operator = Operator(api_client, init_image=args.pytorch_init_container_image, init_max_tries=args.pytorch_init_container_max_tries,
                        init_template=template, resync_s=args.resync_s)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    operator.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
