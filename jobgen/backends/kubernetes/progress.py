"""A Kubernetes run's progress from its rank-zero pod's log: the run directory is inside the pods
(a volume claim this machine cannot read), but the log of global rank zero can be read through
the API server (``GET /api/v1/namespaces/<ns>/pods/<pod>/log``). The entrypoint prints one line per
log interval there (:class:`jobgen.train.callbacks.LineProgress`)::

    step 120/1000 | train_loss 2.4512 | lr 2.91e-03 | 23.4k tok/s | peak mem 1.23 GB rss | eta 0:03:12

Only the tail of the log is asked for (``tailLines``, ``limitBytes``), with the kubelet's
timestamps (``timestamps=true``: an RFC 3339 time before each line). The last such line gives the
step, ``max_steps``, tokens/s and the ETA, less the time since the line was written. Log text is
the pods' output: a line that does not match the format exactly, or holds numbers out of range,
is skipped, never shown.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from jobgen.reports.progress import Progress

if TYPE_CHECKING:
    from jobgen.backends.base import SubmittedJob

#: Lines of each pod's log read (the newest); a log interval prints one progress line plus
#: validation and checkpoint lines, so the last progress line is within them.
TAIL_LINES = 200
#: Bytes of each pod's log read at most (the kubelet's ``limitBytes``).
LIMIT_BYTES = 256 * 1024
#: A longer line is not a progress line (jobgen's are under 200 characters).
MAX_LINE_CHARS = 1000
#: Steps and token rates above this are not believed (a hostile or corrupted line).
MAX_NUMBER = 10**12

_STEP = re.compile(r"step ([0-9]{1,13})/([0-9]{1,13})")
_TOKENS = re.compile(r"([0-9]{1,13}(?:\.[0-9]{1,6})?)k tok/s")
# datetime.timedelta's str(): "0:03:12", "1 day, 2:03:04", "12 days, 0:00:09"
_ETA = re.compile(r"eta (?:([0-9]{1,7}) days?, )?([0-9]{1,2}):([0-5][0-9]):([0-5][0-9])")


def parse_line(text: str) -> tuple[int, int, float | None, float | None] | None:
    """``(step, max_steps, tokens_per_s, eta_s)`` of one progress line (module docstring), or
    None for any other line: one with a character that is not printable, longer than
    :data:`MAX_LINE_CHARS`, not starting with ``step N/M``, a step above ``max_steps`` or 0, or a
    rate above :data:`MAX_NUMBER`. Fields are matched whole; a field that is not the rate or the
    ETA (the loss, the learning rate) is not read."""
    if len(text) > MAX_LINE_CHARS or not text.isprintable():
        return None
    fields = [f.strip() for f in text.strip().split(" | ")]
    step_match = _STEP.fullmatch(fields[0]) if fields else None
    if step_match is None:
        return None
    step, max_steps = int(step_match.group(1)), int(step_match.group(2))
    if not 0 < max_steps <= MAX_NUMBER or not 0 < step <= max_steps:
        return None
    tokens = eta = None
    for field in fields[1:]:
        if (m := _TOKENS.fullmatch(field)) is not None:
            tokens = float(m.group(1)) * 1000
            if tokens > MAX_NUMBER:
                return None
        elif (m := _ETA.fullmatch(field)) is not None:
            days = int(m.group(1) or 0)
            eta = float(days * 86400 + int(m.group(2)) * 3600 + int(m.group(3)) * 60 + int(m.group(4)))
    return step, max_steps, tokens, eta


def _stamp(text: str) -> datetime.datetime | None:
    """The kubelet's RFC 3339 timestamp (nanoseconds allowed), or None."""
    m = re.fullmatch(r"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?(Z|[+-][0-9]{2}:[0-9]{2})", text)
    if m is None:
        return None
    fraction = "." + (m.group(2) or "0")[:6].ljust(6, "0")  # microseconds: Python's datetime has no nanoseconds
    try:
        return datetime.datetime.fromisoformat(m.group(1) + fraction + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    except ValueError:
        return None


def last_progress(lines: Iterable[str], source: str, now: float | None = None) -> Progress | None:
    """The :class:`~jobgen.reports.progress.Progress` of the last progress line among ``lines``
    (each ``<RFC 3339 time> <text>``, as ``timestamps=true`` gives them), or None when there is none.
    ``eta_s`` is the line's ETA less the seconds since it was written (0 at most), and
    ``updated_s_ago`` those seconds; ``tokens_per_step`` is not in the line (None)."""
    found: tuple[tuple[int, int, float | None, float | None], datetime.datetime] | None = None
    for line in lines:
        stamp_text, _, text = line.partition(" ")
        when = _stamp(stamp_text)
        parsed = parse_line(text) if when is not None else None
        if parsed is not None and when is not None:
            found = (parsed, when)
    if found is None:
        return None
    (step, max_steps, tokens, eta), when = found
    ago = max(0.0, (now if now is not None else time.time()) - when.timestamp())
    left = 0.0 if step >= max_steps else None if eta is None else max(0.0, eta - ago)
    return Progress(step, max_steps, tokens, None, left, ago, source)


def _rank_zero_candidates(pods: list[dict[str, Any]], kind_is_trainjob: bool) -> list[dict[str, Any]]:
    """The pods global rank zero may run on: a PyTorchJob's Master, a TrainJob's node 0, else
    (an elastic PyTorchJob: rank zero is wherever the rendezvous put it) every pod."""
    if kind_is_trainjob:
        zero = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get("batch.kubernetes.io/job-completion-index") == "0"]
    else:
        zero = [p for p in pods if str((p.get("metadata") or {}).get("name", "")).endswith("-master-0")]
    return zero or pods


def pod_progress(job: SubmittedJob, *, kubeconfig: str | None = None, now: float | None = None) -> Progress | None:
    """The progress of the Kubernetes job ``job`` (resolved once: its record names the kind and
    kubeconfig) from its rank-zero pod's log (module docstring), or None when the job, its pods
    or a progress line are not there (yet).

    Raises:
        SubmitError: the API server cannot be reached or refuses the request (a pod's log that is
            gone is not an error: that pod is skipped).
    """
    from jobgen.backends.kubernetes import backend as k8s
    from jobgen.backends.kubernetes.api import ApiError
    from jobgen.backends.kubernetes.manifest import core_path
    from jobgen.backends.kubernetes.pods import container_started, job_pods

    cluster, kind, namespace, name, found = k8s._find(job, kubeconfig)
    if found is None:
        return None
    pods, container = job_pods(cluster, kind, namespace, name)
    best: Progress | None = None
    for pod in _rank_zero_candidates(pods, kind is k8s.TRAINJOB):
        pod_name = str((pod.get("metadata") or {}).get("name", ""))
        if not pod_name or not container_started(pod, container):
            continue
        query = [("container", container), ("timestamps", "true"), ("tailLines", str(TAIL_LINES)), ("limitBytes", str(LIMIT_BYTES))]
        try:
            response = cluster.request("GET", f"{core_path(namespace, 'pods')}/{pod_name}/log", query=query, timeout=30.0,
                                       stream=True)  # type: ignore[arg-type]
        except ApiError:
            continue
        try:
            lines = list(k8s.iter_lines(_limited(response.stream(64 * 1024), LIMIT_BYTES)))
        finally:
            response.release_conn()
        found = last_progress(lines, f"pod {pod_name} log", now)
        if found is not None and (best is None or found.updated_s_ago < best.updated_s_ago):
            best = found
    return best


def _limited(chunks: Iterable[bytes], limit: int) -> Iterable[bytes]:
    """``chunks`` up to ``limit`` bytes in all (a server that ignores ``limitBytes`` is cut)."""
    left = limit
    for chunk in chunks:
        if left <= 0:
            return
        yield chunk[:left]
        left -= len(chunk)
