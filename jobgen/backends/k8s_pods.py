"""The pods of a Kubernetes job, as the operator (PyTorchJob) or JobSet (TrainJob) labels
them, and what they used: the device-hours ``jobgen status`` reports for a ``k8s://`` handle
(:func:`pod_usage`). Submit, status, logs and cancel are in :mod:`jobgen.backends.kubernetes`.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from jobgen.backends.base import recorded_launch
from jobgen.backends.k8s_api import Cluster
from jobgen.backends.k8s_manifest import TRAINJOB, TRAINJOB_NODE, K8sKind, core_path
from jobgen.backends.k8s_validate import _kubernetes_parse_quantity
from jobgen.jobdir.submission import JobHandle
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


def pod_usage(cluster: Cluster, kind: K8sKind, namespace: str, name: str, handle: JobHandle) -> Usage | None:
    """GPU-hours (CPU-hours) of the job: for each pod, its training container's run time (the
    current or last run: ``startedAt`` to ``finishedAt``, or to now while it runs) x the GPUs
    (``nvidia.com/gpu`` limit) or CPUs (request) it asked for, summed over the pods; ``None``
    before any container has started. A container restarted in place counts its current run only
    (the API keeps the start of the last one)."""
    pods, container = job_pods(cluster, kind, namespace, name)
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
    launch = recorded_launch(handle)
    end = None if running else last
    return Usage(device_kind, devices, span_seconds(first, end, now), f"pods' container times x requested {device_kind.upper()}s",
                 first, end, launch.gpu_hour_price if launch is not None else None, device_seconds=device_seconds)
