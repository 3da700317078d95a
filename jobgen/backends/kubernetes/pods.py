"""The pods of a Kubernetes job, as the operator (PyTorchJob) or JobSet (TrainJob) labels
them: what each is doing (:func:`pod_summary`, ``details["pods"]`` of ``jobgen status``) and what
they used (:func:`pod_usage`, the device-hours it reports for a ``k8s://`` handle). Submit,
status, logs and cancel are in :mod:`jobgen.backends.kubernetes.backend`.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from jobgen.backends.base import SubmittedJob
from jobgen.backends.kubernetes.api import Cluster
from jobgen.backends.kubernetes.manifest import TRAINJOB, TRAINJOB_NODE, K8sKind, core_path
from jobgen.backends.kubernetes.validate import _kubernetes_parse_quantity
from jobgen.errors import printable
from jobgen.reports.failure_class import Evidence
from jobgen.reports.usage import Usage, from_iso, span_seconds


def job_pods(cluster: Cluster, kind: K8sKind, namespace: str, name: str) -> tuple[list[dict[str, Any]], str]:
    """Every pod of the job (the operator's or JobSet's labels) and the training container's name."""
    selector = f"jobset.sigs.k8s.io/jobset-name={name}" if kind is TRAINJOB else f"training.kubeflow.org/job-name={name}"
    pods = cluster.request("GET", core_path(namespace, "pods"), query=[("labelSelector", selector)]).get("items") or []
    return sorted(pods, key=lambda p: p["metadata"]["name"]), TRAINJOB_NODE if kind is TRAINJOB else "pytorch"


def _pod_devices(pod: dict[str, Any], container: str) -> tuple[str, int] | None:
    """``("gpu", N)`` from the container's ``nvidia.com/gpu`` limit, else ``("cpu", N)`` from its
    CPU request (rounded up to whole CPUs), else None."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") != container:
            continue
        resources = c.get("resources") or {}
        gpus = (resources.get("limits") or {}).get("nvidia.com/gpu") or (resources.get("requests") or {}).get("nvidia.com/gpu")
        if gpus is not None and str(gpus).isdigit() and int(gpus) > 0:
            return "gpu", int(gpus)
        cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu")
        parse = _kubernetes_parse_quantity()
        if cpu is not None and parse is not None:
            return "cpu", max(1, math.ceil(parse(cpu)))
    return None


#: The longest message of a pod's summary (a scheduler's or webhook's text can run to kilobytes).
MESSAGE_CHARS = 160


def _reason(reason: Any, message: Any) -> str:
    """``reason: message`` (either may be missing), printable and cut to :data:`MESSAGE_CHARS`."""
    text = printable(str(message or "").strip())
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS - 3] + "..."
    return ": ".join(part for part in (printable(str(reason or "")), text) if part)


def _exit(terminated: dict[str, Any]) -> str:
    """``exit N`` plus the kubelet's reason when it says more than the code (OOMKilled, ...)."""
    reason = terminated.get("reason")
    return f"exit {terminated.get('exitCode')}" + (f" {printable(str(reason))}" if reason and reason not in ("Completed", "Error") else "")


def pod_summary(pods: list[dict[str, Any]], name: str, container: str) -> str:
    """What each pod of job ``name`` is doing, one ``"; "``-joined line in the pods' order:
    ``<replica> <phase> (<notes>)`` where replica is the pod name without ``<name>-``
    (``master-0``, ``worker-1``, JobSet's ``node-0-1-x7k2p``) and phase the kubelet's (``Pending``
    before any report), and the notes say: the node (``on NODE``), ``terminating`` while a delete
    runs, why the pod is not running (the scheduler's ``Unschedulable: ...``, the training
    container's waiting reason such as ``ContainerCreating``, ``ImagePullBackOff``,
    ``CreateContainerConfigError: ...``, the pod's own reason such as ``Evicted``), the training
    container's ``exit N`` once it ended, and ``restarts N, last exit M`` after in-place restarts.
    Source: the v1 Pod status fields (``phase``, ``conditions``, ``containerStatuses``, ``reason``,
    ``message``), as ``kubectl get pods``/``describe`` read them. Every text from the cluster is
    made printable and cut (:func:`_reason`): the line stays one line."""
    parts = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        pod_name = str(meta.get("name") or "")
        replica = pod_name[len(name) + 1:] if pod_name.startswith(f"{name}-") else pod_name
        notes = [f"on {printable(str(spec['nodeName']))}"] if spec.get("nodeName") else []
        if meta.get("deletionTimestamp"):
            notes.append("terminating")
        if status.get("reason") or status.get("message"):
            notes.append(_reason(status.get("reason"), status.get("message")))
        unscheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
        if unscheduled is not None:
            notes.append(_reason(unscheduled.get("reason"), unscheduled.get("message")))
        trainer = next((c for c in status.get("containerStatuses") or [] if c.get("name") == container), None) or {}
        state = trainer.get("state") or {}
        if state.get("waiting"):
            notes.append(_reason(state["waiting"].get("reason"), state["waiting"].get("message")))
        if state.get("terminated"):
            notes.append(_exit(state["terminated"]))
        if trainer.get("restartCount"):
            last = (trainer.get("lastState") or {}).get("terminated")
            notes.append(f"restarts {trainer['restartCount']}" + (f", last {_exit(last)}" if last else ""))
        phase = printable(str(status.get("phase") or "Pending"))
        parts.append(f"{printable(replica)} {phase}" + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(parts)


def _code(value: Any) -> int | None:
    """An exit code as the API gives it (an integer), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pod_evidence(pods: list[dict[str, Any]], name: str, container: str) -> tuple[Evidence, ...]:
    """How each pod of job ``name`` and its training container ``container`` ended, for
    :mod:`jobgen.reports.failure_class`: the pod's reason (``Evicted``, ``Terminated`` at a node
    shutdown, ``UnexpectedAdmissionError``), its ``DisruptionTarget`` condition's reason
    (``PreemptionByScheduler``, ``DeletionByTaintManager``, ...), and the container's end, the
    current one or, after an in-place restart, the last one (``OOMKilled``, exit code 137).
    Source: the v1 Pod status fields; reasons are kept as given (:class:`Evidence` makes them
    printable when shown)."""
    found = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        pod_name = str(meta.get("name") or "")
        source = "pod " + (pod_name[len(name) + 1:] if pod_name.startswith(f"{name}-") else pod_name)
        if status.get("reason"):
            found.append(Evidence(source, reason=str(status["reason"])))
        disruption = next((c for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"
                           and str(c.get("status")) == "True"), None)
        if disruption is not None and disruption.get("reason"):
            found.append(Evidence(source, reason=str(disruption["reason"])))
        trainer = next((c for c in status.get("containerStatuses") or [] if c.get("name") == container), None) or {}
        for ended in ((trainer.get("state") or {}).get("terminated"), (trainer.get("lastState") or {}).get("terminated")):
            if isinstance(ended, dict):
                reason = str(ended.get("reason") or "")
                found.append(Evidence(source, reason="" if reason in ("Completed", "Error") else reason, exit_code=_code(ended.get("exitCode")),
                                      signal=_code(ended.get("signal")) or None))
    return tuple(found)


def pod_usage(pods: list[dict[str, Any]], container: str, submitted: SubmittedJob) -> Usage | None:
    """GPU-hours (CPU-hours) of the job's ``pods`` (:func:`job_pods`): for each, its training
    container's (``container``) run time (the
    current or last run: ``startedAt`` to ``finishedAt``, or to now while it runs) x the GPUs
    (``nvidia.com/gpu`` limit) or CPUs (request) it asked for, summed over the pods; ``None``
    before any container has started. A container restarted in place counts its current run only
    (the API keeps the start of the last one). The GPU-hour price is that of ``submitted``'s spec.json."""
    now = datetime.now(timezone.utc)
    device_kind, devices, device_seconds = None, 0, 0.0
    first: datetime | None = None
    last: datetime | None = None
    running = False
    for pod in pods:
        found = _pod_devices(pod, container)
        status = next((cs for cs in (pod.get("status") or {}).get("containerStatuses") or [] if cs.get("name") == container), None)
        if found is None or status is None:
            continue
        state = status.get("state") or {}
        run = state.get("running") or state.get("terminated") or (status.get("lastState") or {}).get("terminated")
        start = from_iso((run or {}).get("startedAt"))
        if start is None:
            continue
        end = from_iso((state.get("terminated") or {}).get("finishedAt")) if "running" not in state else None
        running = running or end is None
        kind_here, count = found
        device_kind = "gpu" if "gpu" in (device_kind, kind_here) else kind_here
        devices += count
        device_seconds += count * (span_seconds(start, end, now) or 0.0)
        first = start if first is None or start < first else first
        last = end if end is not None and (last is None or end > last) else last
    if device_kind is None or first is None:
        return None
    launch = submitted.launch
    end = None if running else last
    return Usage(device_kind, devices, span_seconds(first, end, now), f"pods' container times x requested {device_kind.upper()}s",
                 first, end, launch.gpu_hour_price if launch is not None else None, device_seconds=device_seconds)


def container_started(pod: dict[str, Any], container: str) -> bool:
    """Whether the pod's ``container`` has started (running or terminated now, or restarted
    before): only then does the pod have a log to read."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            state = cs.get("state") or {}
            return "running" in state or "terminated" in state or bool(cs.get("restartCount"))
    return False
