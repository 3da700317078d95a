"""SLURM backend: submit a rendered job directory with ``sbatch --parsable``, then status
(squeue, accounting, the job-completion log), logs (``srun --label`` prefixes) and cancel by
handle (``slurm://<cluster>/<jobid>``), first-failure triage and GPU-hours from the same
sources: :class:`SlurmBackend`. The batch script is planned in :mod:`jobgen.backends.slurm.script`;
squeue's JSON of each SLURM release is decoded in :mod:`jobgen.backends.slurm.squeue_json`; array
tasks in the job-completion log are found by :mod:`jobgen.backends.slurm.jobcomp`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jobgen.backends.base import (
    FINISHED_STATES,
    Backend,
    Echo,
    JobStatus,
    LogOptions,
    PendingSubmit,
    SubmitOptions,
    SubmitResult,
    SubmittedJob,
    plan_spec_file,
    run_command,
    secrets_location,
)
from jobgen.backends.slurm.array import task_log_name
from jobgen.backends.slurm.jobcomp import FILETXT, completion_log, read_array
from jobgen.backends.slurm.script import TEMPLATE, plan, run_dir_name, sbatch_command
from jobgen.backends.slurm.squeue_json import SqueueJob, SqueueReply, decode_squeue
from jobgen.errors import ConfigError, SubmitError
from jobgen.jobdir.files import CODE_DIR_ENV, SBATCH_FILE, SPEC_FILE, SUBMISSION_FILE, point_file
from jobgen.jobdir.runs import check_run_dir
from jobgen.jobdir.spec import ArrayIndex, ResolvedSpec, load_resolved_spec, read_array_index, read_resolved_spec
from jobgen.jobdir.submission import ArrayTask, JobHandle, Submission
from jobgen.planning.environment import check_present, unexported
from jobgen.planning.plan import JobPlan, PlanContext
from jobgen.reports.triage import LogLine, Triage, triage
from jobgen.reports.usage import Usage, from_iso, parse_tres, span_seconds


def read_job_dir(job_dir: Path) -> ResolvedSpec:
    """The resolved spec of a rendered SLURM job directory (what ``submit`` needs: the job
    name, the cluster for the handle, the inputs hash, the secret names).

    Raises:
        ConfigError: the directory holds no ``job.sbatch`` / valid ``spec.json`` written by jobgen.
    """
    if not (job_dir / SBATCH_FILE).is_file():
        raise ConfigError(
            f"{job_dir} is not a rendered SLURM job directory (needs {SBATCH_FILE} and {SPEC_FILE})",
            hint="render it first: jobgen render SPEC --profile <slurm profile>",
        )
    return read_resolved_spec(job_dir)


def check_secrets(job_dir: Path, secrets: tuple[str, ...], environ: dict[str, str], spec_file: Path | None = None) -> None:
    """Before sbatch: every secret of the spec is set in ``environ`` (the environment sbatch
    gets, which it exports to the job) and ``$SBATCH_EXPORT``, which overrides the script's
    ``#SBATCH --export`` (sbatch(1): environment variables beat script directives), passes
    them on. ``spec_file``: the user's spec file the job was rendered from (named in the error),
    None for a job directory submitted as is.

    Raises:
        ConfigError: a secret is unset or empty, or ``$SBATCH_EXPORT`` drops one.
    """
    check_present(secrets, environ, location=secrets_location(job_dir, spec_file))
    export = environ.get("SBATCH_EXPORT")
    dropped = unexported(export, secrets) if export is not None else []
    if dropped:
        raise ConfigError(
            f"SBATCH_EXPORT={export} is set in this environment, so sbatch would not pass the spec's secrets "
            f"{', '.join(dropped)} to the job (it exports only what SBATCH_EXPORT names, and it overrides job.sbatch's "
            "directives). Nothing was submitted.",
            location="environment: SBATCH_EXPORT",
            hint=f"unset SBATCH_EXPORT (sbatch then exports everything), or set SBATCH_EXPORT=ALL, or add the names: "
            f"SBATCH_EXPORT={','.join([*(e for e in export.split(',') if e and e not in ('NONE', 'NIL')), *dropped])}",
        )


def _trained_runs(job_dir: Path, resolved: ResolvedSpec, array: Any, run_dir: Path,
                  task_dirs: list[Path]) -> list[tuple[ResolvedSpec, Path]]:
    """Each run the job trains and its run directory: the job's own, or every array task's (its
    point's spec.json); an array's own directory is its working directory, not a run's."""
    if array is None:
        return [(resolved, run_dir)]
    return [(load_resolved_spec(job_dir / point_file(p.index, SPEC_FILE)), d) for p, d in zip(array.points, task_dirs, strict=True)]


def check_code_export(environ: dict[str, str], names: tuple[str, ...]) -> None:
    """Before the snapshot: ``$SBATCH_EXPORT`` (which overrides job.sbatch's directives) passes
    ``names``, the variables that carry the snapshot (``JOBGEN_CODE_DIR``, ``PYTHONPATH``), to the job.

    Raises:
        ConfigError: ``$SBATCH_EXPORT`` drops one (the job would import whatever code it finds).
    """
    export = environ.get("SBATCH_EXPORT")
    dropped = unexported(export, names) if export is not None else []
    if dropped:
        raise ConfigError(
            f"SBATCH_EXPORT={export} is set in this environment, so sbatch would not pass {', '.join(dropped)} (the code "
            "snapshot) to the job. Nothing was submitted.",
            location="environment: SBATCH_EXPORT",
            hint="unset SBATCH_EXPORT (sbatch then exports everything), set SBATCH_EXPORT=ALL, or add the names: "
            f"SBATCH_EXPORT={','.join([*(e for e in export.split(',') if e and e not in ('NONE', 'NIL')), *dropped])}",
        )


def job_id(handle: JobHandle) -> str:
    """The SLURM job id of ``slurm://<cluster>/<jobid>``, or ``<jobid>_<task>`` for one task of a
    job array (the form squeue, sacct, scancel and scontrol take).

    Raises:
        ConfigError: not a SLURM handle, or the id is neither a number nor ``<number>_<number>``.
    """
    cluster, _, jid = handle.path.rpartition("/")
    if handle.scheme != "slurm" or not cluster or not re.fullmatch(r"[0-9]+(_[0-9]+)?", jid):
        raise ConfigError(f"{handle} is not a SLURM job handle",
                          hint="SLURM handles look like slurm://<cluster>/<jobid> (one task of a job array: slurm://<cluster>/<jobid>_<task>)")
    return jid


def cluster_options(submitted: SubmittedJob) -> list[str]:
    """``["--clusters=<cluster>"]`` for a job sbatch submitted to a named cluster (its answer
    ``<jobid>;<cluster>``, kept as the record's ``slurm_cluster``), else ``[]``: squeue, sacct,
    scontrol and scancel ask the default cluster, as on a single-cluster site. A job without
    a record gets ``[]`` too: its cluster may be only the profile's ``slurm.cluster`` label."""
    record = submitted.record
    return [f"--clusters={record.slurm_cluster}"] if record is not None and record.slurm_cluster else []


def _squeue_jobs(jid: str, submitted: SubmittedJob) -> SqueueReply | None:
    """Every record ``squeue --json`` (states: all) prints for ``jid`` (a job, an array and its
    tasks, or one task), decoded by the shape its ``meta`` names (:mod:`jobgen.backends.slurm.squeue_json`),
    or None when the controller has forgotten it (after MinJobAge)."""
    try:
        proc = run_command(["squeue", *cluster_options(submitted), "--json", "--states=all", "--jobs", jid], what="squeue", timeout_s=30)
    except SubmitError as exc:
        if "Invalid job id" in exc.message:
            return None
        raise
    return decode_squeue(proc.stdout)


def expand_task_ids(text: str) -> list[int]:
    """Task ids of a SLURM array expression: ``0-3``, ``1,4-5``, ``[2-3]``, ``0-9:2``, with an
    optional ``%<max running>`` (squeue's ``array_task_string``, sacct's ``<jobid>_[2-3]``)."""
    ids: list[int] = []
    for part in text.strip("[]").split("%", 1)[0].split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if match is None:
            continue
        first, last, step = int(match.group(1)), int(match.group(2) or match.group(1)), int(match.group(3) or 1)
        ids += range(first, last + 1, max(step, 1))
    return ids


def _array_records(jobs: tuple[SqueueJob, ...], array_id: str) -> dict[int, SqueueJob]:
    """squeue records of array ``array_id`` by task id: each task SLURM has started (or split
    off) has its own record (``array_task_id``); the tasks still pending in the array's own
    record (``array_task_id`` unset) are listed in its ``array_task_string`` and share it."""
    tasks: dict[int, SqueueJob] = {}
    for job in jobs:
        if str(job.array_job_id) != array_id:
            continue
        if job.array_task_id is not None:
            tasks[job.array_task_id] = job
        else:
            for pending in expand_task_ids(job.array_task_string):
                tasks.setdefault(pending, job)
    return dict(sorted(tasks.items()))


#: sacct columns jobgen reads; JobName last, so a name containing "|" survives the split.
_SACCT_FORMAT = "JobID,State,ExitCode,NodeList,Elapsed,ElapsedRaw,Start,End,AllocTRES,NCPUS,JobName"
_SACCT_COLUMNS = _SACCT_FORMAT.count(",") + 1


def _sacct_rows(jids: str, submitted: SubmittedJob, *, jobcomp: bool) -> list[list[str]] | None:
    """The rows (cells of :data:`_SACCT_FORMAT`) ``sacct`` (accounting; needs slurmdbd) or, with
    ``jobcomp``, ``sacct -c`` (the job-completion log, JobCompType=jobcomp/filetxt) prints for
    ``jids`` (comma-separated) of ``submitted`` (its record names the cluster,
    :func:`cluster_options`); None when that source fails ("accounting storage is disabled").

    Parsable text, not ``--json``: on SLURM 22.05 ``sacct --json`` reports exit code 0 for
    jobs that exited non-zero, while ``ExitCode`` in the text output is right.
    """
    extra = ["-c"] if jobcomp else []
    argv = ["sacct", *cluster_options(submitted), *extra, "--jobs", jids, "--noheader", "--parsable2", f"--format={_SACCT_FORMAT}"]
    try:
        proc = run_command(argv, what="sacct -c" if jobcomp else "sacct", timeout_s=30)
    except SubmitError:
        return None
    return [line.split("|") for line in proc.stdout.splitlines()]


def _row_status(cells: list[str], source: str, submitted: SubmittedJob, *,
                usage: bool = True) -> tuple[str, dict[str, str], Usage | None] | None:
    """``(state, details, usage)`` of one sacct row of ``submitted`` (a job, or a task of the job
    array ``submitted``), or None when its state is unreadable: jobcomp/filetxt records are
    space-separated key=value pairs, and a job name with spaces garbles sacct -c's parse; an
    unreadable state means "this source does not know"."""
    row = cells + [""] * _SACCT_COLUMNS
    state = (row[1].split() or [""])[0]
    if not re.fullmatch(r"[A-Z_]+", state):
        return None
    details = {"exit_code": row[2], "nodes": row[3], "elapsed": row[4], "name": "|".join(cells[_SACCT_COLUMNS - 1:])}
    return state, details, _sacct_usage(row, source, submitted) if usage else None


def _sacct(jid: str, submitted: SubmittedJob) -> tuple[str, str, dict[str, str], Usage | None] | None:
    """``(state, source, details, usage)`` from accounting (``sacct``), else from the
    job-completion log (``sacct -c``), else None (see :func:`_sacct_rows`)."""
    for source in ("sacct", "jobcomp"):
        rows = [cells for cells in _sacct_rows(jid, submitted, jobcomp=source == "jobcomp") or [] if cells[0] == jid]
        found = _row_status(rows[-1], source, submitted) if rows else None
        if found is not None:
            return found[0], source, found[1], found[2]
    return None


def _sacct_usage(row: list[str], source: str, submitted: SubmittedJob) -> Usage | None:
    """Usage from one sacct row (:data:`_SACCT_FORMAT`): AllocTRES' GPUs, else its CPUs, else
    NCPUS, x ElapsedRaw. The job-completion log keeps no GRES: when it shows none and the job
    directory asked for GPUs (``submitted``'s spec.json launch facts, which also give the
    GPU-hour price), those are counted, and the source says so."""
    elapsed = row[5]
    if not elapsed.isdigit():
        return None
    tres = parse_tres(row[8])
    start, end = from_iso(row[6], local=True), from_iso(row[7], local=True)
    launch = submitted.launch
    price = launch.gpu_hour_price if launch is not None else None
    if "gpu" in tres:
        return Usage("gpu", tres["gpu"], float(elapsed), f"{source} AllocTRES x ElapsedRaw", start, end, price)
    if launch is not None and launch.accelerator == "gpu":
        gpus = launch.num_nodes * launch.devices_per_node
        return Usage("gpu", gpus, float(elapsed), f"{source} ElapsedRaw x the {gpus} GPUs the job directory requested "
                     "(the job-completion log keeps no GRES)" if source == "jobcomp" else f"{source} ElapsedRaw x requested GPUs",
                     start, end, price)
    cpus = tres.get("cpu") or (int(row[9]) if row[9].isdigit() else None)
    if cpus is None:
        return None
    return Usage("cpu", cpus, float(elapsed), f"{source} {'AllocTRES' if 'cpu' in tres else 'NCPUS'} x ElapsedRaw", start, end)


def _squeue_usage(job: SqueueJob, submitted: SubmittedJob) -> Usage | None:
    """Usage from a ``squeue --json`` job: ``tres_alloc_str`` (set once resources are
    allocated) x (end or now - start), at the GPU-hour price of ``submitted``'s spec.json."""
    tres = parse_tres(job.tres_alloc)
    if not tres or job.start is None:
        return None
    # end_time of a job that still runs is its time limit, not an end
    end = job.end if job.state in FINISHED_STATES else None
    elapsed = span_seconds(job.start, end, datetime.now(timezone.utc))
    launch = submitted.launch
    price = launch.gpu_hour_price if launch is not None else None
    if "gpu" in tres:
        return Usage("gpu", tres["gpu"], elapsed, "squeue tres_alloc_str", job.start, end, price)
    if "cpu" in tres:
        return Usage("cpu", tres["cpu"], elapsed, "squeue tres_alloc_str", job.start, end)
    return None


def _squeue_status(submitted: SubmittedJob, job: SqueueJob, handle: JobHandle | None = None) -> JobStatus:
    """One decoded squeue record of ``submitted`` as a status of ``handle`` (one task of the job
    array ``submitted``; default: ``submitted``'s own handle); a record that did not decode is
    UNKNOWN with the reason."""
    handle = submitted.handle if handle is None else handle
    if job.problem is not None:
        return JobStatus(handle, "UNKNOWN", "squeue", {"reason": job.problem})
    details = {
        "name": job.name,
        "nodes": job.nodes,
        "reason": job.reason,
        "restarts": "" if job.restarts is None else str(job.restarts),
    }
    if job.allocated_cpus is not None:
        details["cpus"] = str(job.allocated_cpus)
    if job.state in FINISHED_STATES and job.exit_code is not None:
        details["exit_code"] = str(job.exit_code)
    if job.state == "PENDING" and job.start is not None:
        # the scheduler's estimate (squeue's start_time, what `squeue --start` prints); unset when it has none
        details["expected_start"] = job.start.isoformat()
    return JobStatus(handle, job.state, "squeue", details, _squeue_usage(job, submitted))


#: States of a task that has not ended and is not running yet.
_WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"})


def array_state(states: Iterable[str]) -> str:
    """The state of a whole job array from its tasks' states (the rule ``jobgen status`` states):

    - ``UNKNOWN`` when no task is known;
    - while any task has not ended: ``PENDING`` when every such task waits (PENDING, REQUEUED,
      held, suspended), else ``RUNNING`` (the array is not finished while one task may still run);
    - when every task has ended: ``COMPLETED`` if all completed; ``FAILED`` if any ended in
      failure (FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, BOOT_FAIL, DEADLINE, PREEMPTED);
      otherwise ``CANCELLED`` (some were cancelled, the rest completed).
    """
    states = list(states)
    if not states or all(state == "UNKNOWN" for state in states):
        return "UNKNOWN"
    active = [state for state in states if state not in FINISHED_STATES and state != "UNKNOWN"]
    if active:
        return "PENDING" if all(state in _WAITING for state in active) else "RUNNING"
    ended = [state for state in states if state != "UNKNOWN"]
    if all(state == "COMPLETED" for state in ended) and len(ended) == len(states):
        return "COMPLETED"
    if any(state not in {"COMPLETED", "CANCELLED"} for state in ended):
        return "FAILED"
    return "CANCELLED" if "CANCELLED" in ended else "UNKNOWN"


def _array_usage(tasks: list[JobStatus]) -> Usage | None:
    """The array's device time: the sum of its tasks' (devices x elapsed), spanning the first start to the last end."""
    used = [t.usage for t in tasks if t.usage is not None and t.usage.device_hours is not None]
    if not used:
        return None
    starts = [u.start for u in used if u.start is not None]
    ends = [u.end for u in used if u.end is not None]
    running = any(t.state not in FINISHED_STATES for t in tasks)
    start = min(starts) if starts else None
    end = None if running or not ends else max(ends)
    elapsed = span_seconds(start, end, datetime.now(timezone.utc)) if start is not None else None
    seconds = sum((u.device_hours or 0.0) * 3600 for u in used)
    kind = "gpu" if any(u.device_kind == "gpu" for u in used) else "cpu"
    return Usage(kind, max(u.devices for u in used), elapsed, f"sum over {len(used)} array task(s) ({used[0].source})", start, end,
                 used[0].gpu_hour_price, device_seconds=seconds)


def _task_handle(handle: JobHandle, array_id: str, task: int) -> JobHandle:
    return JobHandle(handle.scheme, f"{handle.cluster}/{array_id}_{task}")


def _array_status(submitted: SubmittedJob, array_id: str, tasks: list[JobStatus],
                  unknown_reason: str = "no source knows this task") -> JobStatus:
    """The whole array's status: :func:`array_state` over ``tasks`` (one per task; tasks of
    ``submitted``'s record that no source knows count as UNKNOWN, with ``unknown_reason``), with
    the counts in ``details``."""
    handle, record = submitted.handle, submitted.record
    known = {t.handle.array_task: t for t in tasks}
    names = {t.index: t.name for t in record.array or ()} if record is not None and record.array else {}
    for index in sorted(set(names) - set(known)):
        known[index] = JobStatus(_task_handle(handle, array_id, index), "UNKNOWN", "none", {"reason": unknown_reason})
    ordered = [known[i] for i in sorted(k for k in known if k is not None)]
    for i, task in enumerate(ordered):
        if task.handle.array_task in names:
            ordered[i] = JobStatus(task.handle, task.state, task.source, {**task.details, "name": names[task.handle.array_task]}, task.usage)
    counts: dict[str, int] = {}
    for task in ordered:
        counts[task.state] = counts.get(task.state, 0) + 1
    sources = sorted({t.source for t in ordered if t.source != "none"})
    details = {"tasks": f"{len(ordered)} (" + ", ".join(f"{state} {n}" for state, n in sorted(counts.items())) + ")"}
    return JobStatus(handle, array_state(t.state for t in ordered), "+".join(sources) or "none", details, _array_usage(ordered),
                     tuple(ordered))


def _accounting_tasks(jid: str, array_id: str, submitted: SubmittedJob) -> dict[int, JobStatus]:
    """The tasks of array ``array_id`` as accounting lists them for ``jid`` (the array, or one
    task, ``submitted``): ``<jobid>_<task>`` rows, and ``<jobid>_[2-3]`` for tasks that never started."""
    tasks: dict[int, JobStatus] = {}
    for cells in _sacct_rows(jid, submitted, jobcomp=False) or []:
        one = re.fullmatch(rf"{array_id}_(\d+)", cells[0])
        many = re.fullmatch(rf"{array_id}_\[(.+)\]", cells[0])
        if not (one or many):
            continue
        for task in [int(one.group(1))] if one else expand_task_ids(many.group(1)):
            task_handle = _task_handle(submitted.handle, array_id, task)
            found = _row_status(cells, "sacct", submitted, usage=one is not None)
            if found is not None:
                tasks[task] = JobStatus(task_handle, found[0], "sacct", found[1], found[2])
    return tasks


def _jobcomp_tasks(array_id: str, submitted: SubmittedJob, wanted: list[int]) -> tuple[dict[int, JobStatus], str]:
    """Tasks ``wanted`` of array ``array_id`` (``submitted``: the array, or one task) from the job-completion log: each task's job id
    from the log file (:mod:`jobgen.backends.slurm.jobcomp`; ``scontrol show config`` names
    it), then their rows from ``sacct -c``, as for a single job. Tasks that never started take
    the array's own record. Returns the tasks found and why the others are unknown."""
    try:
        config = run_command(["scontrol", *cluster_options(submitted), "show", "config"], what="scontrol show config", timeout_s=30)
    except SubmitError as exc:
        return {}, f"no accounting (slurmdbd), and `scontrol show config` failed, which names the job-completion log: {exc.message}"
    kind, location = completion_log(config.stdout)
    if kind != FILETXT or not location:
        return {}, (f"no accounting (slurmdbd), and the controller keeps no job-completion log file "
                    f"(JobCompType={kind or 'none'}; {FILETXT} has one)")
    try:
        logged = read_array(Path(location), int(array_id))
    except OSError as exc:
        return {}, f"no accounting (slurmdbd), and the job-completion log {location} cannot be read here ({exc.strerror or exc})"
    jobs = {task: str(logged.tasks[task]) for task in wanted if task in logged.tasks}
    never_started = [task for task in wanted if task not in jobs] if logged.own_record else []
    ids = list(dict.fromkeys([*jobs.values(), *([array_id] if never_started else [])]))
    why = f"no accounting (slurmdbd), and the job-completion log {location} has no line for this task (yet)"
    if not ids:
        return {}, why
    rows: dict[str, list[str]] = {}
    for cells in _sacct_rows(",".join(ids), submitted, jobcomp=True) or []:
        rows[cells[0]] = cells  # a requeued job has a row per run: the last one is the latest
    found: dict[int, JobStatus] = {}
    for task in wanted:
        jid = jobs.get(task, array_id if task in never_started else None)
        task_handle = _task_handle(submitted.handle, array_id, task)
        one = _row_status(rows[jid], "jobcomp", submitted, usage=task in jobs) if jid in rows else None
        if one is not None:
            found[task] = JobStatus(task_handle, one[0], "jobcomp", one[1], one[2])
    return found, why


def _ended_tasks(jid: str, array_id: str, submitted: SubmittedJob, wanted: list[int]) -> tuple[dict[int, JobStatus], str]:
    """Tasks ``wanted`` of array ``array_id`` (``submitted``: the array, or one task) that squeue no longer lists, by the route single
    jobs take after squeue: accounting, then the job-completion log. Returns the tasks found
    and why the others are unknown."""
    tasks = {task: st for task, st in _accounting_tasks(jid, array_id, submitted).items() if task in wanted}
    if tasks:
        return tasks, "accounting does not list this task"
    return _jobcomp_tasks(array_id, submitted, wanted)


#: Seconds between two reads of a followed log (``jobgen logs -f``).
LOG_POLL_S = 1.0

_LABEL_RE = re.compile(r"^\s*(\d+): ?(.*)$", re.S)


def filter_rank(lines: Iterable[str], rank: int | None) -> Iterator[str]:
    """Lines of an ``srun --label`` log for one global rank (prefix stripped), plus the batch
    shell's own unlabelled lines; ``rank=None`` passes everything through."""
    for line in lines:
        if rank is None:
            yield line
            continue
        match = _LABEL_RE.match(line)
        if match is None:
            yield line
        elif int(match.group(1)) == rank:
            yield match.group(2)


def log_file(job: SubmittedJob) -> Path:
    """The job's SLURM output file: from the submission record, else from ``scontrol show job``.
    A job array has one per task (``slurm-<jobid>_<task>.out``): name the task.

    Raises:
        ConfigError: no record and the controller does not know the job any more; the handle of
            a whole recorded job array (the hint names its tasks' handles).
        SubmitError: no record and ``scontrol`` failed otherwise (missing, controller down).
    """
    handle = job.handle
    jid = job_id(handle)
    record = job.record
    if record is not None and record.array:
        if handle.array_task is None:
            tasks = ", ".join(f"{handle}_{t.index} ({t.name})" for t in record.array[:4]) + (", ..." if len(record.array) > 4 else "")
            raise ConfigError(f"{handle} is a job array of {len(record.array)} task(s); each task writes its own log",
                              hint=f"name one task: {tasks} (`jobgen status {handle}` lists them)")
        return Path(record.task(handle.array_task).log_file)
    if record is not None and record.log_file and handle.array_task is None:
        return Path(record.log_file)
    try:
        proc = run_command(["scontrol", *cluster_options(job), "show", "job", jid], what="scontrol show job", timeout_s=30)
    except SubmitError as exc:
        if "Invalid job id" not in exc.message:
            raise  # the controller did not answer: SLURM's failure (exit 1), not an unknown job
        proc = None
    match = re.search(r"\bStdOut=(\S+)", proc.stdout) if proc else None
    if match is None:
        raise ConfigError(
            f"no log known for {handle}: it was not submitted from this account's jobgen and SLURM no longer knows it",
            hint="pass the job directory instead of the handle, or look in the run directory for slurm-<jobid>.out",
        )
    return Path(match.group(1))


@dataclass
class SlurmSubmit(PendingSubmit):
    """A SLURM submission on its way: a job array's index (None for a single job) and its
    tasks' run directories, in the order of its points."""

    array: ArrayIndex | None = None
    task_dirs: tuple[Path, ...] = ()


class SlurmBackend(Backend):
    """SLURM through its client commands (sbatch, squeue, sacct, scancel, scontrol)."""

    name = "slurm"
    templates = (TEMPLATE,)
    submit_options = frozenset({"test_only", "force", "allow_dirty"})
    log_options = frozenset({"rank"})

    def plan(self, ctx: PlanContext) -> JobPlan:
        """See :func:`jobgen.backends.slurm.script.plan`."""
        return plan(ctx)

    def begin_submit(self, job_dir: Path, options: SubmitOptions, out: Echo, plan: JobPlan | None) -> SlurmSubmit:
        """What ``sbatch --parsable`` of the rendered ``job.sbatch`` in ``job_dir`` needs, checked before
        anything is written (:meth:`~jobgen.backends.base.Backend.submit` runs the steps; :meth:`launch`
        is sbatch's). ``options.test_only``: ``sbatch --test-only``, nothing is queued (action
        ``validated``; the code's work tree is only checked).

        ``plan``: the plan of a single job just written into ``job_dir`` (``jobgen submit SPEC``);
        without it (a rendered directory submitted as is, a job array) spec.json is read.

        The run directory is ``<options.runs_dir>/<job name>`` (exported as ``JOBGEN_RUN_DIR=<runs dir>``,
        created first) and the job's working directory (``--chdir``), so SLURM's output goes to
        ``<run dir>/slurm-<jobid>.out`` and a committed job directory stays clean; a job array's is its
        working directory (the tasks' logs, the code snapshot), and each task trains in
        ``<runs dir>/<its point's name>``. sbatch exports the submitting environment to the job, the
        spec's ``secrets`` included (checked here, :func:`check_secrets`).

        Raises:
            ConfigError: ``job_dir`` is not a rendered SLURM job; a secret of the spec is not set;
                the run directory (an array task's) holds a run of another profile or shape
                (:func:`~jobgen.jobdir.check_run_dir`, exit 2); the run dir path contains ``%`` or a
                backslash (SLURM's output filename patterns cannot carry them).
            SubmitError: the same job directory has a job still pending or running (without
                ``options.force``).
        """
        resolved = plan.resolved if plan is not None else None
        array = None
        if resolved is None:
            resolved = read_job_dir(job_dir)
            array = read_array_index(job_dir)
        job = SlurmSubmit(job_dir, options, out, plan, resolved, spec_file=plan_spec_file(plan), array=array)
        check_secrets(job_dir, resolved.spec.secrets, job.environ, job.spec_file)
        runs_dir = options.runs_dir.resolve()
        job.run_dir = runs_dir / run_dir_name(array.name if array is not None else resolved.spec.name)
        job.task_dirs = tuple(runs_dir / run_dir_name(p.name) for p in array.points) if array is not None else ()
        for char, why in (("%", "expands %-patterns"), ("\\", "drops backslashes and stops expanding %j")):
            if char in str(job.run_dir):
                raise ConfigError(
                    f"run directory {job.run_dir} contains {char!r}: SLURM {why} in output file paths "
                    "(sbatch(1), filename pattern), so the job could not open its log there",
                    hint="pick another --runs-dir (the job directory and the job name may contain it)",
                )
        job.run_dirs = (job.run_dir, *job.task_dirs)
        job.runs = tuple(_trained_runs(job_dir, resolved, array, job.run_dir, list(job.task_dirs)))
        # a run directory holds one run: another profile's or shape's is refused here, before anything
        # is queued, not on a node once the job starts (jobgen.jobdir.check_run_dir; prepare_run_dirs claims it)
        for spec_of, directory in job.runs:
            check_run_dir(directory, spec_of)
        if not options.force and not options.test_only:
            self._check_not_running(job_dir)
        return job

    def _check_not_running(self, job_dir: Path) -> None:
        """Refuse a second submit of ``job_dir`` while the job it recorded is pending or running.

        Raises:
            SubmitError: naming the job and its state.
        """
        previous = job_dir / SUBMISSION_FILE
        if not previous.is_file():
            return
        record = Submission.load(previous)
        old = self.status(SubmittedJob(JobHandle.parse(record.handle)))
        if old.state in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}:
            raise SubmitError(
                f"{job_dir} was already submitted as {record.handle}, which is {old.state}",
                hint=f"follow it with `jobgen logs -f {record.handle}`, stop it with `jobgen cancel {record.handle}`, "
                "or submit a second copy with --force",
            )

    def environment(self, job: PendingSubmit) -> dict[str, str]:
        """sbatch's environment, which it exports to the job: the snapshot's variables too
        (``JOBGEN_CODE_DIR`` and PYTHONPATH with the snapshot first). A requeued job keeps the
        environment it was submitted with, so it runs the same snapshot; job.sbatch (for a spec
        with ``code``) and the entrypoint put it first on PYTHONPATH again.

        Raises:
            ConfigError: ``$SBATCH_EXPORT`` would drop the snapshot's variables (:func:`check_code_export`).
        """
        if job.code is not None:
            check_code_export(job.environ, (CODE_DIR_ENV, "PYTHONPATH"))
        return super().environment(job)

    def launch(self, job: PendingSubmit) -> SubmitResult:
        """``sbatch --parsable`` (``--test-only``: SLURM checks the request and estimates a start;
        its answer goes to ``out``), then the submission record (action ``submitted``).

        Raises:
            SubmitError: sbatch failed (argv, exit code and SLURM's message are shown) or printed no job id.
        """
        assert isinstance(job, SlurmSubmit) and job.run_dir is not None
        resolved, code, array, run_dir = job.resolved, job.code, job.array, job.run_dir
        workdir = None
        if resolved.spec.entrypoint is not None:  # command mode: the ranks run here (in the snapshot's copy of it)
            workdir = str(code.workdir(Path.cwd()) if code is not None else Path.cwd())
        command = sbatch_command(str(job.options.runs_dir.resolve()), run_dir.name, test_only=job.options.test_only,
                                 secrets=resolved.spec.secrets, workdir=workdir)
        argv = list(command.argv)
        proc = run_command(argv, cwd=job.job_dir, env={**job.environ, **dict(command.env)}, what="sbatch")
        if job.options.test_only:
            job.out((proc.stderr or proc.stdout).strip())
            return SubmitResult("validated", None)
        # --parsable: "<jobid>[;<cluster>]", the cluster only when sbatch submitted with -M/--clusters
        jid, _, slurm_cluster = proc.stdout.strip().partition(";")
        job.launched = True  # SLURM has queued it: nothing is undone from here on
        if not jid.isdigit() or (slurm_cluster and not re.fullmatch(r"[A-Za-z0-9_.-]+", slurm_cluster)):
            raise SubmitError(f"sbatch printed {proc.stdout.strip()!r}, not a job id: {' '.join(argv)}", hint="check the site's sbatch wrapper")
        handle = JobHandle("slurm", f"{slurm_cluster or resolved.launch.cluster or 'default'}/{jid}")
        tasks = None
        if array is not None:
            tasks = tuple(ArrayTask(index=p.index, name=p.name, run_dir=str(task_dir), log_file=str(run_dir / task_log_name(jid, p.index)),
                                    overrides=p.overrides) for p, task_dir in zip(array.points, job.task_dirs, strict=True))
        record = Submission.now(
            handle=str(handle), job_dir=str(job.job_dir), run_dir=str(run_dir),
            log_file=None if array is not None else str(run_dir / f"slurm-{jid}.out"),
            argv=tuple(argv), inputs_sha256=array.inputs_sha256 if array is not None else resolved.inputs_sha256,
            slurm_cluster=slurm_cluster or None,
            code_dir=str(code.dir) if code else None, code=code.record if code else None, array=tasks,
        )
        record.save()
        return SubmitResult("submitted", handle, record)

    def status(self, job: SubmittedJob) -> JobStatus:
        """The job's state (``job``: the job resolved once; its record names the cluster, a job
        array's tasks and the launch facts the usage is priced by): ``squeue`` while the controller knows it (queued, running, and for
        MinJobAge after it ends), then accounting, then the job-completion log, else ``UNKNOWN``
        (never a guess). squeue's JSON is decoded by the shape its own ``meta`` names
        (:mod:`jobgen.backends.slurm.squeue_json`); a shape jobgen does not read is ``UNKNOWN``, with the reason.

        A job array (``slurm://<cluster>/<jobid>`` of an array): every task's status in ``tasks``
        and the array's state by :func:`array_state`; one task (``<jobid>_<task>``): that task's.
        A task squeue no longer lists (slurmctld purges each ended task MinJobAge after it ended)
        takes the same route as a single job: accounting, then the job-completion log, whose
        ``ArrayJobId``/``ArrayTaskId`` keys give each task's job id (:mod:`jobgen.backends.slurm.jobcomp`).

        Raises:
            ConfigError: not a SLURM handle.
            SubmitError: squeue is missing or the controller does not answer.
        """
        submitted, handle = job, job.handle
        jid = job_id(handle)
        array_id, _, task = jid.partition("_")
        record = submitted.record
        reply = _squeue_jobs(jid, submitted)
        if reply is not None and reply.problem is not None:
            return JobStatus(handle, "UNKNOWN", "squeue", {"reason": reply.problem})
        jobs = reply.jobs if reply is not None else ()
        members = _array_records(jobs, array_id)
        if task:
            if int(task) in members:
                return _squeue_status(submitted, members[int(task)])
            ended, why = _ended_tasks(jid, array_id, submitted, [int(task)])
            if int(task) in ended:
                return ended[int(task)]
            return JobStatus(handle, "UNKNOWN", "none", {"reason": f"squeue no longer lists this task; {why}"})
        recorded = [t.index for t in record.array] if record is not None and record.array else []
        if members or recorded:
            tasks = [_squeue_status(submitted, one, _task_handle(handle, array_id, i)) for i, one in members.items()]
            missing = [i for i in recorded if i not in members]
            ended, why = _ended_tasks(jid, array_id, submitted, missing) if missing else ({}, "")
            return _array_status(submitted, array_id, [*tasks, *ended.values()], f"squeue no longer lists this task; {why}")
        plain = [j for j in jobs if str(j.job_id) == jid]
        if plain:
            return _squeue_status(submitted, plain[0])
        found = _sacct(jid, submitted)
        if found is not None:
            return JobStatus(handle, *found)
        return JobStatus(handle, "UNKNOWN", "none", {"reason": "neither squeue nor sacct (accounting or job-completion log) knows this job"})

    def logs(self, job: SubmittedJob, options: LogOptions, out: Echo = print) -> None:
        """Print the job's output: rank ``options.rank``'s lines (default 0; ``all``: the whole file);
        with ``options.follow``, keep printing until the job has finished and the file is drained
        (Ctrl-C stops).

        Raises:
            ConfigError: the rank is neither a number nor ``all``; no log file is known for the job
                (see :func:`log_file`), or the job has ended without one.
            SubmitError: SLURM's commands failed (the controller does not answer).
        """
        self.check_options(options)
        given = options.rank or "0"
        if given != "all" and not given.isdigit():
            raise ConfigError(f"--rank {given!r} is not a rank number or 'all'", hint="e.g. --rank 0, --rank 3, --rank all")
        rank, follow = None if given == "all" else int(given), options.follow
        handle = job.handle
        path = log_file(job)
        offset, pending = 0, ""
        last_check, finished, announced = 0.0, not follow, False
        while True:
            if path.is_file():
                with path.open("r", encoding="utf-8", errors="replace") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                    offset = fh.tell()
                *lines, pending = (pending + chunk).split("\n")
                for line in filter_rank(lines, rank):
                    out(line)
            elif not follow:
                state = self.status(job)
                if state.finished or state.state == "UNKNOWN":
                    raise ConfigError(f"{handle} is {state.state} but its output file {path} does not exist",
                                      hint="SLURM could not open it (is the run directory on a filesystem the nodes share?)")
                out(f"jobgen: {handle} is {state.state}; no output yet in {path} (jobgen logs -f waits for it)")
                return
            if finished:
                for line in filter_rank([pending] if pending else [], rank):
                    out(line)
                return
            now = time.monotonic()
            if now - last_check >= 5 * LOG_POLL_S:
                last_check = now
                state = self.status(job)
                if not path.is_file() and not announced:
                    out(f"jobgen: {handle} is {state.state}; waiting for output in {path} (Ctrl-C stops)")
                    announced = True
                finished = state.finished or state.state == "UNKNOWN"
                if finished:
                    continue  # one more read drains what the job wrote last
            time.sleep(LOG_POLL_S)

    def first_error(self, job: SubmittedJob) -> Triage:
        """Each rank's first failure in the job's output file, earliest first.

        The file is one stream: srun writes the ranks' lines in the order they arrive, each with its
        ``--label`` task number (= global rank), so the order in the file is the order of failure;
        ``srun: error: <node>: task N: ...`` lines name each failed task's node.

        Raises:
            ConfigError: no log file is known for the job, or it does not exist (yet).
        """
        path = log_file(job)
        if not path.is_file():
            raise ConfigError(f"{job.handle}: its output file {path} does not exist (yet)",
                              hint="check `jobgen status`: a PENDING job has written nothing")
        lines = []
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            for position, raw in enumerate(fh):
                text = raw.rstrip("\n")
                match = _LABEL_RE.match(text)
                if match is None:
                    lines.append(LogLine("batch script", None, None, position, None, text))
                else:
                    rank = int(match.group(1))
                    lines.append(LogLine(f"rank {rank}", rank, None, position, None, match.group(2)))
        return triage(lines)

    def cancel(self, job: SubmittedJob, *, wait_s: float = 120.0, out: Echo = print) -> JobStatus:
        """``scancel`` the job and wait (up to ``wait_s``) until SLURM reports it ended.

        Returns the last status seen.

        Raises:
            SubmitError: scancel failed, or the job is still not finished after ``wait_s``.
        """
        handle = job.handle
        jid = job_id(handle)  # one task of an array: scancel <jobid>_<task> stops that task only
        run_command(["scancel", *cluster_options(job), jid], what="scancel", timeout_s=30)
        deadline = time.monotonic() + wait_s
        state = self.status(job)
        while not (state.finished or state.state == "UNKNOWN"):
            if time.monotonic() > deadline:
                raise SubmitError(f"{handle} is still {state.state} {wait_s:.0f} s after scancel", hint="SLURM's KillWait may be long; check `jobgen status`")
            out(f"jobgen: {handle} is {state.state}; waiting for its processes to stop ...")
            time.sleep(2.0)
            state = self.status(job)
        return state
