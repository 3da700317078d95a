"""The restarts a Kubernetes job with a restart budget has used, for ``jobgen status``: from the
launch wrapper's line at the head of each pod's log, else the pods' ``restartCount``. Status,
logs and cancel are in :mod:`jobgen.backends.kubernetes.backend`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jobgen.backends.kubernetes.api import ApiError, Cluster
from jobgen.backends.kubernetes.manifest import core_path
from jobgen.backends.kubernetes.pods import container_started
from jobgen.errors import SubmitError

#: Bytes read from the head of each pod's log for the launcher's restart line.
RESTART_LINE_BYTES = 65536


def restarts_used(cluster: Cluster, namespace: str, job: dict[str, Any], pods: list[dict[str, Any]], container: str) -> dict[str, str]:
    """``restarts_used`` (``"<n> of <budget>"``) and ``restarts_source`` of a job with a restart budget
    (``runPolicy.backoffLimit`` > 0, the spec's ``restart.max_restarts``); nothing without one.

    The count, best source first:

    - the launch wrapper's ledger (:mod:`jobgen.train.launch` counts each pod's starts in the run
      directory, on the pods' volume, which this machine cannot read): a restarted pod's log
      starts with the wrapper's ``restart N of B`` line (:func:`jobgen.reports.attempts.logged_restarts`);
      the first :data:`RESTART_LINE_BYTES` of each pod's current log are read, and the largest N
      is shown (the wrapper spends the budget per pod);
    - else the pods' ``restartCount`` (containers restarted in place), the largest over the pods.
      A pod the operator deleted and created again under ``restartPolicy: ExitCode`` starts at 0,
      so this count can be low: ``restarts_source`` says which source was used.

    A log that cannot be read, or holds no such line, counts as no restart of that pod.
    """
    from jobgen.reports.attempts import logged_restarts

    budget = ((job.get("spec") or {}).get("runPolicy") or {}).get("backoffLimit")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        return {}
    logged: list[int] = []
    counts: list[int] = []
    for pod in pods:
        pod_name = str((pod.get("metadata") or {}).get("name") or "")
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            count = cs.get("restartCount") if cs.get("name") == container else None
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                counts.append(count)
        if not pod_name or not container_started(pod, container):
            continue
        query = [("container", container), ("limitBytes", str(RESTART_LINE_BYTES))]
        try:
            response = cluster.request("GET", f"{core_path(namespace, 'pods')}/{pod_name}/log", query=query, timeout=30.0,
                                       stream=True)  # type: ignore[arg-type]
        except (ApiError, SubmitError):
            continue
        try:
            head = b"".join(_head(response.stream(16 * 1024), RESTART_LINE_BYTES))
        except Exception:  # noqa: BLE001 - a log cut off mid-read counts as no line
            head = b""
        finally:
            response.release_conn()
        found = logged_restarts(head.decode("utf-8", errors="replace"))
        if found is not None:
            logged.append(found[0])
    if logged:
        return {"restarts_used": f"{max(logged)} of {budget}",
                "restarts_source": "the launch wrapper's restart line at the head of each pod's log (its ledger's count)"}
    return {"restarts_used": f"{max(counts, default=0)} of {budget}",
            "restarts_source": "the pods' restartCount (a pod created again starts at 0)"}


def _head(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """The chunks until ``limit`` bytes were given."""
    given = 0
    for chunk in chunks:
        yield chunk[:limit - given]
        given += len(chunk)
        if given >= limit:
            return
