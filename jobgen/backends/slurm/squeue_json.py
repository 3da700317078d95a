"""``squeue --json`` of SLURM 22.05 through 25.05, decoded into one typed record per job.

SLURM changed this JSON under the same command, release after release. Which shape a document
has is read from the document itself (its ``meta``), and that shape's decoder is the only one
tried; a field that does not have the shape's type makes that job UNKNOWN with the field's path,
and a document of a shape jobgen does not know makes every job UNKNOWN with the reason — never
a guess from whatever happens to parse.

==========  ==========================  ================  ==============================  ===============  =================
release     ``meta`` names              ``job_state``     ``exit_code``                   times            ``job_resources``
==========  ==========================  ================  ==============================  ===============  =================
22.05       ``plugin.type``             one word          wait(2) status (exit 1: 256)    int              ``allocated_*``
            ``openapi/v0.0.38``
23.02.0-3   ``plugins.data_parser``     one word          wait(2) status                  int              ``allocated_*``
            ``data_parser/v0.0.39``
23.02.4+    (the same)                  one word          ``{set, infinite, number}`` of  int              ``allocated_*``
                                                          the wait(2) status
23.11       ``plugin.data_parser``      base state +      ``{status, return_code,         ``{set, ...}``   ``allocated_*``
            ``data_parser/v0.0.40``     flags (a list)    signal: {id, name}}``
24.05       ``data_parser/v0.0.41``     list              object                          ``{set, ...}``   ``nodes.allocation[]``,
                                                                                                           ``cpus``
24.11       ``data_parser/v0.0.42``     list              object                          ``{set, ...}``   (as 24.05)
25.05       ``data_parser/v0.0.43``     list              object                          ``{set, ...}``   (as 24.05)
==========  ==========================  ================  ==============================  ===============  =================

Counts and array ids are plain numbers in 22.05 and ``{set, infinite, number}`` from 23.02 on;
a job without resources (pending) has no ``job_resources`` key in 22.05, ``{}`` in 23.02 -
24.05.4, and ``null`` from 24.05.5. ``nodes``, ``tres_alloc_str``, ``name``, ``state_reason``,
``array_task_string`` and ``restart_cnt`` keep one shape throughout.

Sources (SchedMD's slurm tree, by release tag): 22.05 ``src/plugins/openapi/v0.0.38/jobs.c`` and
``api.c`` (meta); 23.02 - 25.05 ``src/plugins/data_parser/v0.0.39``-``v0.0.43/parsers.c``
(``JOB_INFO``, ``JOB_RES``, ``PROCESS_EXIT_CODE``, ``OPENAPI_META``) and
``src/interfaces/data_parser.c`` (the CLI's meta: ``plugins`` + ``Slurm`` in 23.02, ``plugin`` +
``slurm`` from 23.11); ``doc/html/openapi_release_notes/slurm-23.02.html`` (exit codes tagged
NO_VAL, https://github.com/SchedMD/slurm/commit/413792c5c0, first in 23.02.4); NEWS of 24.05.5 (``null`` instead of ``{}``).

Pure: no I/O; the SLURM backend runs squeue and hands the text in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

#: State flags that squeue's one-word state shows instead of the base state, in the order
#: SLURM's job_state_string() checks them (src/common/slurm_protocol_defs.c).
SHOWN_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
               "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")

#: SLURM's NO_VAL / INFINITE for 32-bit fields (slurm.h): a bare number this large is "unset".
_NO_VAL32 = 0xFFFFFFFE


class ShapeError(ValueError):
    """A field that does not have the type its shape gives it: ``path`` (``jobs[0].exit_code``)
    and what was expected."""

    def __init__(self, path: str, expected: str, got: Any):
        shown = json.dumps(got)
        super().__init__(f"{path}: expected {expected}, got {shown if len(shown) <= 80 else shown[:77] + '...'}")


@dataclass(frozen=True)
class ExitCode:
    """How a job's batch script ended: ``return_code`` (its exit status) or ``signal`` (the
    signal that killed it), as sacct's ``ExitCode`` column shows them: ``<code>:<signal>``."""

    return_code: int
    signal: int

    def __str__(self) -> str:
        return f"{self.return_code}:{self.signal}"

    @classmethod
    def from_wait_status(cls, status: int) -> ExitCode:
        """A wait(2) status: the exit status in bits 8-15, the terminating signal in bits 0-6."""
        return cls((status >> 8) & 0xFF, status & 0x7F)


@dataclass(frozen=True)
class SqueueJob:
    """One record of ``squeue --json``, decoded (a job, a task of an array, or an array's own
    record of its tasks still pending).

    Attributes:
        job_id: SLURM's job id of this record.
        state: the one word squeue shows: the base state, or the flag that replaces it
            (:data:`SHOWN_FLAGS`: COMPLETING, REQUEUED, ...); ``UNKNOWN`` when ``problem`` is set.
        flags: the base state and its flags as SLURM lists them (23.11+), else ``(state,)``.
        name: the job name.
        reason: ``state_reason`` (``None`` when there is none, as SLURM spells it).
        nodes: the allocated nodes as a SLURM host list (``node[1-2]``); empty while pending.
        node_count: nodes asked for (pending) or allocated.
        restarts: how often the job was requeued.
        exit_code: how the batch script ended (meaningful once the job has ended), or None
            when SLURM has none yet.
        start: when the job started, or is expected to start (UTC); None when unset.
        end: when it ended, or its time limit runs out (UTC); None when unset.
        tres_alloc: ``tres_alloc_str``: what was allocated (``cpu=8,mem=16000M,node=2,gres/gpu=8``);
            empty before the job has resources.
        allocated_cpus: CPUs in ``job_resources``; None while the job has no resources.
        allocated_nodes: node names of ``job_resources`` in allocation order; empty while pending.
        array_job_id: the array's job id for a task (or the array's own record), else None.
        array_task_id: the task id of a task record; None for the array's own record.
        array_task_string: the array's own record: the task ids it still holds (``2-3%2``).
        problem: why this record could not be decoded (then ``state`` is ``UNKNOWN``).
    """

    job_id: int | None
    state: str
    flags: tuple[str, ...] = ()
    name: str = ""
    reason: str = ""
    nodes: str = ""
    node_count: int | None = None
    restarts: int | None = None
    exit_code: ExitCode | None = None
    start: datetime | None = None
    end: datetime | None = None
    tres_alloc: str = ""
    allocated_cpus: int | None = None
    allocated_nodes: tuple[str, ...] = ()
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_string: str = ""
    problem: str | None = None


@dataclass(frozen=True)
class SqueueReply:
    """A decoded ``squeue --json`` document.

    Attributes:
        shape: the shape it was decoded as (``data_parser/v0.0.41 (SLURM 24.05.8)``), or None.
        jobs: its records, in SLURM's order.
        problem: why the document as a whole could not be decoded (then ``jobs`` is empty).
    """

    shape: str | None
    jobs: tuple[SqueueJob, ...]
    problem: str | None = None


# --------------------------------------------------------------------------- field decoders


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ShapeError(path, "an object", value)
    return value


def _text(value: Any, path: str) -> str:
    """A string; SLURM writes an unset one as ``""`` or, in some places, ``null``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ShapeError(path, "a string", value)
    return value


def _plain(value: Any, path: str) -> int | None:
    """A bare number (22.05 everywhere; 23.02's times): null, or NO_VAL/INFINITE, is unset."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShapeError(path, "a number", value)
    return None if value >= _NO_VAL32 else value


def _no_val(value: Any, path: str) -> int | None:
    """``{"set": bool, "infinite": bool, "number": int}`` (data_parser's ``*_NO_VAL`` types, 23.02+)."""
    if not (isinstance(value, dict) and isinstance(value.get("set"), bool) and isinstance(value.get("number"), int)
            and not isinstance(value.get("number"), bool)):
        raise ShapeError(path, 'an object {"set", "infinite", "number"}', value)
    return value["number"] if value["set"] and not value.get("infinite") else None


def _epoch(number: int | None, path: str) -> datetime | None:
    """Seconds since the epoch as a UTC time (0 or unset: ``None``); a number no calendar date has
    (Python's datetime spans years 1 to 9999) is a :class:`ShapeError` at ``path``."""
    try:
        return datetime.fromtimestamp(number, tz=timezone.utc) if number else None
    except (OverflowError, ValueError, OSError):
        raise ShapeError(path, "seconds since the epoch (a date in years 1 to 9999)", number) from None


def _state_word(value: Any, path: str) -> tuple[str, tuple[str, ...]]:
    """22.05 / 23.02: the one word job_state_string() prints (a flag replaces the base state)."""
    if not isinstance(value, str) or not value:
        raise ShapeError(path, "a state word", value)
    return value, (value,)


def _state_flags(value: Any, path: str) -> tuple[str, tuple[str, ...]]:
    """23.11+: the base state, then its flags, e.g. ``["CANCELLED", "COMPLETING"]``, shown by
    squeue as the first flag of :data:`SHOWN_FLAGS` present (COMPLETING), else the base state."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ShapeError(path, "a list of state flags", value)
    shown = [flag for flag in SHOWN_FLAGS if flag in value]
    return (shown[0] if shown else value[0]), tuple(value)


def _exit_wait_status(value: Any, path: str) -> ExitCode | None:
    """22.05 / 23.02.0-3: the raw wait(2) status (exit 1 reads 256); NO_VAL while unset."""
    status = _plain(value, path)
    return None if status is None else ExitCode.from_wait_status(status)


def _exit_wait_status_no_val(value: Any, path: str) -> ExitCode | None:
    """23.02.4+: the wait(2) status wrapped as ``{set, infinite, number}``."""
    status = _no_val(value, path)
    return None if status is None else ExitCode.from_wait_status(status)


def _exit_object(value: Any, path: str) -> ExitCode | None:
    """23.11+: ``{"status": [SUCCESS|ERROR|SIGNALED|CORE_DUMPED|PENDING|INVALID], "return_code":
    {set, ...}, "signal": {"id": {set, ...}, "name": str}}`` (data_parser PROCESS_EXIT_CODE)."""
    obj = _object(value, path)
    status = obj.get("status")
    if not isinstance(status, list) or not all(isinstance(s, str) for s in status):
        raise ShapeError(f"{path}.status", "a list of words", status)
    code = _no_val(obj.get("return_code"), f"{path}.return_code")
    signal = _no_val(_object(obj.get("signal"), f"{path}.signal").get("id"), f"{path}.signal.id")
    if "PENDING" in status or "INVALID" in status or (code is None and signal is None):
        return None
    return ExitCode(code or 0, signal or 0)


def _resources_old(value: Any, path: str) -> tuple[int | None, tuple[str, ...]]:
    """22.05 - 23.11: ``{"nodes": "node[1-2]", "allocated_cores" | "allocated_cpus": N,
    "allocated_hosts": N, "allocated_nodes": [{"nodename", ...}]}`` (the counter the select
    plugin does not use reads 0 from 23.02); absent, ``{}`` or null without resources."""
    if value is None or value == {}:
        return None, ()
    obj = _object(value, path)
    _text(obj.get("nodes"), f"{path}.nodes")
    counts = [_plain(obj[key], f"{path}.{key}") for key in ("allocated_cores", "allocated_cpus") if key in obj]
    nodes = obj.get("allocated_nodes", [])
    if not isinstance(nodes, list):
        raise ShapeError(f"{path}.allocated_nodes", "a list", nodes)
    names = tuple(_text(_object(n, f"{path}.allocated_nodes[{i}]").get("nodename"), f"{path}.allocated_nodes[{i}].nodename")
                  for i, n in enumerate(nodes))
    return (max((c for c in counts if c), default=None)), names


def _resources_new(value: Any, path: str) -> tuple[int | None, tuple[str, ...]]:
    """24.05+: ``{"select_type", "nodes": {"count", "list", "whole", "allocation": [{"index",
    "name", "cpus": {"count", "used"}, "memory", "sockets"}]}, "cpus": N, "threads_per_core"}``;
    ``null`` (``{}`` before 24.05.5) without resources."""
    if value is None or value == {}:
        return None, ()
    obj = _object(value, path)
    nodes = _object(obj.get("nodes"), f"{path}.nodes")
    allocation = nodes.get("allocation", [])
    if not isinstance(allocation, list):
        raise ShapeError(f"{path}.nodes.allocation", "a list", allocation)
    names = tuple(_text(_object(n, f"{path}.nodes.allocation[{i}]").get("name"), f"{path}.nodes.allocation[{i}].name")
                  for i, n in enumerate(allocation))
    return _plain(obj.get("cpus"), f"{path}.cpus"), names


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """One shape of squeue's JSON: the decoder of each field whose spelling changed."""

    name: str
    state: Callable[[Any, str], tuple[str, tuple[str, ...]]]
    exit_code: Callable[[Any, str], ExitCode | None]
    time: Callable[[Any, str], int | None]
    count: Callable[[Any, str], int | None]
    resources: Callable[[Any, str], tuple[int | None, tuple[str, ...]]]


V0_0_38 = Shape("openapi/v0.0.38", _state_word, _exit_wait_status, _plain, _plain, _resources_old)
V0_0_39_BEFORE_23_02_4 = Shape("data_parser/v0.0.39", _state_word, _exit_wait_status, _plain, _no_val, _resources_old)
V0_0_39 = Shape("data_parser/v0.0.39", _state_word, _exit_wait_status_no_val, _plain, _no_val, _resources_old)
V0_0_40 = Shape("data_parser/v0.0.40", _state_flags, _exit_object, _no_val, _no_val, _resources_old)
#: data_parser version -> shape, from 23.11 on (24.05 rewrote job_resources; 24.11 and 25.05 kept it).
_LATER = {
    "v0.0.40": V0_0_40,
    "v0.0.41": Shape("data_parser/v0.0.41", _state_flags, _exit_object, _no_val, _no_val, _resources_new),
    "v0.0.42": Shape("data_parser/v0.0.42", _state_flags, _exit_object, _no_val, _no_val, _resources_new),
    "v0.0.43": Shape("data_parser/v0.0.43", _state_flags, _exit_object, _no_val, _no_val, _resources_new),
}
#: What jobgen reads, for messages.
KNOWN = "openapi/v0.0.38 (SLURM 22.05) and data_parser/v0.0.39 - v0.0.43 (SLURM 23.02 - 25.05)"


def _version(release: Any) -> tuple[int, ...] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)\S*", release) if isinstance(release, str) else None
    return tuple(int(g) for g in match.groups()) if match else None


class UnknownShape(ValueError):
    """A document whose ``meta`` names no shape jobgen reads (or has no ``meta``)."""


def choose_shape(meta: Any) -> tuple[Shape, str]:
    """The shape a document's ``meta`` names, and how it is shown (``data_parser/v0.0.41 (SLURM 24.05.8)``).

    Raises:
        UnknownShape: no ``meta``, or one that names no shape jobgen knows (:data:`KNOWN`).
    """
    if not isinstance(meta, dict):
        raise UnknownShape(f"it has no meta object, which names the shape (jobgen reads {KNOWN})")
    plugin = meta.get("plugin") if isinstance(meta.get("plugin"), dict) else {}
    plugins = meta.get("plugins") if isinstance(meta.get("plugins"), dict) else {}
    slurm = meta.get("slurm") or meta.get("Slurm")
    release = slurm.get("release") if isinstance(slurm, dict) else None
    shown_release = f" (SLURM {release})" if isinstance(release, str) else ""
    parser = plugin.get("data_parser") or plugins.get("data_parser")
    if parser is None and plugin.get("type") == "openapi/v0.0.38":  # 22.05: squeue's own openapi plugin
        return V0_0_38, f"openapi/v0.0.38{shown_release}"
    if not isinstance(parser, str):
        named = plugin.get("type") or "none"
        raise UnknownShape(f"its meta names no data_parser (openapi plugin: {named}){shown_release}; jobgen reads {KNOWN}")
    key = parser.removeprefix("data_parser/")
    if key == "v0.0.39":  # 23.02: the exit code is wrapped from 23.02.4 on; the release says which
        version = _version(release)
        if version is None:
            raise UnknownShape(f"its meta names {parser} without a release like 23.02.4 (23.02.4 changed the exit code's shape)")
        return (V0_0_39 if version >= (23, 2, 4) else V0_0_39_BEFORE_23_02_4), f"{parser}{shown_release}"
    if key in _LATER:
        return _LATER[key], f"{parser}{shown_release}"
    raise UnknownShape(f"its meta names {parser}{shown_release}, a shape this jobgen does not read (it reads {KNOWN})")


def _loose_number(value: Any) -> int | None:
    """A number in either spelling, only to place a record that did not decode (never for its state)."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set") else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _NO_VAL32 else None


def decode_job(shape: Shape, job: Any, path: str) -> SqueueJob:
    """One job record in ``shape``.

    Raises:
        ShapeError: a field jobgen reads does not have the type ``shape`` gives it.
    """
    job = _object(job, path)
    state, flags = shape.state(job.get("job_state"), f"{path}.job_state")
    cpus, allocated = shape.resources(job.get("job_resources"), f"{path}.job_resources")
    job_id = job.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise ShapeError(f"{path}.job_id", "a number", job_id)
    return SqueueJob(
        job_id=job_id,
        state=state,
        flags=flags,
        name=_text(job.get("name"), f"{path}.name"),
        reason=_text(job.get("state_reason"), f"{path}.state_reason"),
        nodes=_text(job.get("nodes"), f"{path}.nodes"),
        node_count=shape.count(job.get("node_count"), f"{path}.node_count"),
        restarts=_plain(job.get("restart_cnt"), f"{path}.restart_cnt"),
        exit_code=shape.exit_code(job.get("exit_code"), f"{path}.exit_code"),
        start=_epoch(shape.time(job.get("start_time"), f"{path}.start_time"), f"{path}.start_time"),
        end=_epoch(shape.time(job.get("end_time"), f"{path}.end_time"), f"{path}.end_time"),
        tres_alloc=_text(job.get("tres_alloc_str"), f"{path}.tres_alloc_str"),
        allocated_cpus=cpus,
        allocated_nodes=allocated,
        array_job_id=shape.count(job.get("array_job_id"), f"{path}.array_job_id") or None,
        array_task_id=shape.count(job.get("array_task_id"), f"{path}.array_task_id"),
        array_task_string=_text(job.get("array_task_string"), f"{path}.array_task_string"),
    )


def decode_squeue(text: str) -> SqueueReply:
    """``squeue --json`` output -> its jobs, decoded by the one shape its ``meta`` names.

    Never raises on what squeue printed: text that is not a JSON object, or a ``meta`` of a
    shape jobgen does not know, gives a reply with ``problem`` set and no jobs; a record whose
    fields do not have the shape's types gives a job with state ``UNKNOWN`` and its ``problem``
    (the field's path), next to the records that decoded.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return SqueueReply(None, (), f"squeue --json printed text that is not JSON ({exc}): {text[:80]!r}")
    if not isinstance(doc, dict):
        return SqueueReply(None, (), f"squeue --json printed {type(doc).__name__} JSON, not a JSON object")
    try:
        shape, shown = choose_shape(doc.get("meta"))
    except UnknownShape as exc:
        return SqueueReply(None, (), f"squeue --json printed JSON jobgen cannot read: {exc}")
    jobs = doc.get("jobs", [])
    if not isinstance(jobs, list):
        return SqueueReply(shown, (), f"squeue --json ({shown}): {ShapeError('jobs', 'a list', jobs)}")
    decoded = []
    for i, job in enumerate(jobs):
        try:
            decoded.append(decode_job(shape, job, f"jobs[{i}]"))
        except ShapeError as exc:
            raw = job if isinstance(job, dict) else {}
            decoded.append(SqueueJob(job_id=_loose_number(raw.get("job_id")), state="UNKNOWN",
                                     array_job_id=_loose_number(raw.get("array_job_id")) or None,
                                     array_task_id=_loose_number(raw.get("array_task_id")),
                                     array_task_string=raw.get("array_task_string") if isinstance(raw.get("array_task_string"), str) else "",
                                     problem=f"squeue --json ({shown}) does not have this release's shape: {exc}"))
    return SqueueReply(shown, tuple(decoded))
