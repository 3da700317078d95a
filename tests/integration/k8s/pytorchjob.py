"""The PyTorchJob objects the emulated training-operator (training_operator.py) derives, as
kubeflow/training-operator v1.9 does: the defaults it applies, replica names and ports, the
environment and init containers it injects, the desired pods and services, and the job's status
conditions. Pure functions of the job; training_operator.py re-exports the names tests use.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

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
