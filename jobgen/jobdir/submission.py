"""A submitted job: its handle (:class:`JobHandle`, a URI), the submission record
(:class:`Submission`, in the job directory and the user's state index) and how a job named on
the command line (a handle or a job directory) is found. Part of the job directory's contract
(:mod:`jobgen.jobdir`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobgen.errors import ConfigError
from jobgen.jobdir.files import CODE_DIR_ENV, CODE_SUBDIR, SUBMISSION_FILE, write_atomic
from jobgen.jobdir.runs import CodeSnapshot
from jobgen.specs.capabilities import CAPABILITIES
from jobgen.specs.profile import SshSettings

# --------------------------------------------------------------------------- handles

#: Handle scheme -> the scheduler (backend table key) it belongs to.
HANDLE_SCHEMES = {caps.handle_scheme: name for name, caps in CAPABILITIES.items()}
_HANDLE_RE = re.compile(r"^(slurm|k8s|local|ssh)://(.+)$")


@dataclass(frozen=True)
class JobHandle:
    """A submitted job as a URI: ``slurm://<cluster>/<jobid>`` (one task of a job array:
    ``slurm://<cluster>/<jobid>_<task>``), ``k8s://<context>/<ns>/<name>``, ``local://<run dir>``,
    ``ssh://<first host><run dir on the hosts>`` (the run dir is absolute)."""

    scheme: str
    path: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.path}"

    @property
    def scheduler(self) -> str:
        """The backend this handle belongs to (``slurm``, ``kubernetes``, ``local``, ``ssh``)."""
        return HANDLE_SCHEMES[self.scheme]

    @property
    def cluster(self) -> str:
        """Where the job runs: the SLURM cluster, the Kubernetes context (which may contain
        ``/``), ``local``, or the first host of an ssh job."""
        if self.scheme == "local":
            return "local"
        if self.scheme == "ssh":
            return self.path.split("/", 1)[0]
        return self.path.rsplit("/", 2 if self.scheme == "k8s" else 1)[0]

    @property
    def array_parent(self) -> JobHandle | None:
        """For one task of a SLURM job array (``slurm://<cluster>/<jobid>_<task>``): the whole
        array's handle (``slurm://<cluster>/<jobid>``); None for any other handle."""
        if not CAPABILITIES[self.scheduler].job_arrays:
            return None
        cluster, _, jid = self.path.rpartition("/")
        match = re.fullmatch(r"([0-9]+)_([0-9]+)", jid)
        return JobHandle(self.scheme, f"{cluster}/{match.group(1)}") if match and cluster else None

    @property
    def array_task(self) -> int | None:
        """The task index of a SLURM array task handle (see :attr:`array_parent`), else None."""
        return int(self.path.rpartition("_")[2]) if self.array_parent is not None else None

    @classmethod
    def parse(cls, text: str) -> JobHandle:
        """Parse a handle URI.

        Raises:
            ConfigError: not of the form ``slurm://...``, ``k8s://...``, ``local://...`` or ``ssh://...``.
        """
        match = _HANDLE_RE.match(text)
        if not match:
            raise ConfigError(
                f"{text!r} is not a job handle",
                hint="handles look like slurm://<cluster>/<jobid>, k8s://<context>/<ns>/<name>, local://<run dir> or "
                "ssh://<first host>/<run dir>",
            )
        return cls(match.group(1), match.group(2))


# --------------------------------------------------------------------------- the submission record


class ArrayTask(BaseModel):
    """One task of a submitted job array, as ``jobgen submit`` recorded it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    index: int = Field(description="The array task id.")
    name: str = Field(description="The point's job name.")
    run_dir: str = Field(description="The task's run directory (``<runs dir>/<name>``).")
    log_file: str = Field(description="The task's SLURM output file (``slurm-<jobid>_<task>.out``).")
    overrides: dict[str, str] = Field(default={}, description="The sweep point (key path -> value).")


class CallableJob(BaseModel):
    """A Python callable submitted through submitit (:func:`jobgen.api.executor`): the marker that a
    submission record belongs to no rendered job directory (its ``job_dir`` is submitit's folder
    for the job: the pickled call, its result and logs), and the world it asked for."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    function: str = Field(description="The callable's qualified name, ``<module>.<qualname>`` (a callable object: its class's).")
    profile: str = Field(description="The profile the executor was configured from.")
    num_nodes: int = Field(ge=1, description="Nodes the job asked for (``--nodes``).")
    tasks_per_node: int = Field(ge=1, description="Tasks per node (``--ntasks-per-node``): the callable runs once in each.")
    gpus_per_node: int = Field(ge=0, description="GPUs per node the job asked for; 0 on CPU.")

    @property
    def name(self) -> str:
        """The callable's short name (the last part of :attr:`function`), shown by ``jobgen ls``."""
        return self.function.rpartition(".")[2]


class SweepTag(BaseModel):
    """The sweep a submission belongs to: every job that one ``jobgen submit SPEC --sweep ...``
    submitted (one per point, or the one job array) carries a tag with the same :attr:`id`, so
    ``jobgen ls`` lists them together."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(description="The sweep's id, new for each `jobgen submit --sweep` (:func:`new_sweep_id`).")
    name: str = Field(description="The sweep's base name: the spec's name after --set (and --smoke); a job array's name.")
    points: int = Field(ge=1, description="How many points the whole sweep has.")
    index: int | None = Field(default=None, description=(
        "This job's point, in grid order (first axis slowest, as --sweep lists them); None for a job array, whose tasks are the points."))
    overrides: dict[str, str] = Field(default={}, description="This job's point: key path -> value, as given to --sweep (empty for a job array).")


def new_sweep_id(name: str) -> str:
    """A new sweep id: ``<name>-<UTC time as YYYYmmdd-HHMMSS>-<4 random hex digits>`` (two sweeps of
    one spec started in the same second differ in the last part)."""
    import secrets

    return f"{name}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class Submission(BaseModel):
    """What ``jobgen submit`` recorded: enough for status/logs/cancel from a handle or a job dir.

    Written into the job directory (:data:`SUBMISSION_FILE`) and the user's state index
    (:func:`state_record_path`). Keys from older jobgen versions that this one no longer
    writes are dropped on load.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    handle: str = Field(description="The job handle (URI).")
    job_dir: str = Field(description="Absolute path of the rendered job directory.")
    run_dir: str = Field(description=(
        "Where checkpoints, metrics and summary.json go (a path in the pods on Kubernetes; on every host for ssh)."))
    log_file: str | None = Field(default=None, description="The job's output file (SLURM, %j expanded; local: output.log); None when logs come from an API.")
    inputs_sha256: str | None = Field(default=None, description="The rendered files' inputs hash.")
    argv: tuple[str, ...] | None = Field(
        default=None, description="The command submit ran, in job_dir (SLURM: sbatch ...); None when submit used an API.")
    kind: str | None = Field(default=None, description="Kubernetes: the job's resource (plural.group/version).")
    kubeconfig: str | None = Field(default=None, description="Kubernetes: the kubeconfig file used, when not the default.")
    slurm_cluster: str | None = Field(default=None, description=(
        "SLURM: the cluster sbatch named in its answer (``--parsable`` prints ``<jobid>;<cluster>`` when it submitted "
        "with -M/--clusters, a multi-cluster site); squeue, sacct, scontrol and scancel then get ``--clusters=<it>``. "
        "None: sbatch named none, they ask the default cluster."))
    code_dir: str | None = Field(default=None, description=(
        f"SLURM, local, ssh: the code snapshot the job runs (``<run dir>/{CODE_SUBDIR}/<id>``, ${CODE_DIR_ENV}; ssh: on every "
        "host); None: no snapshot."))
    code: CodeSnapshot | None = Field(default=None, description="SLURM, local, ssh: what that snapshot is (commit, dirty, diff sha256).")
    submitted_at: str | None = Field(default=None, description=(
        "When submit recorded the job (UTC, ISO 8601; :meth:`now`). None in records of older versions."))
    ssh: SshSettings | None = Field(default=None, description=(
        "ssh: the hosts the job was started on (node-rank order) and how jobgen reaches them; status, logs and "
        "cancel ask them. None for other schedulers."))
    array: tuple[ArrayTask, ...] | None = Field(default=None, description=(
        "SLURM job arrays: every task (its run dir and log); the record's ``run_dir`` is then the array's "
        "directory under the runs dir (its working directory: the code snapshot and the tasks' logs). None: not an array."))
    callable: CallableJob | None = Field(default=None, description=(
        "A Python callable submitted through submitit (``jobgen.api.executor``): what it was and the world it asked for; "
        "``job_dir`` and ``run_dir`` are then submitit's folder for the job (no spec.json). None: a rendered job."))
    sweep: SweepTag | None = Field(default=None, description=(
        "``jobgen submit --sweep``: the sweep this job belongs to (its id, base name, size and this job's point). "
        "None: submitted on its own."))
    cancelled_at: str | None = Field(default=None, description=(
        "Kubernetes: when `jobgen cancel` deleted the job (UTC, ISO 8601); status then says CANCELLED once the object "
        "is gone. None: jobgen did not cancel it."))

    def task(self, index: int) -> ArrayTask:
        """Task ``index`` of an array submission.

        Raises:
            ConfigError: not an array, or no such task.
        """
        tasks = self.array or ()
        if not 0 <= index < len(tasks):
            raise ConfigError(f"{self.handle} has no array task {index}" + (f" (tasks 0-{len(tasks) - 1})" if tasks else " (not an array)"),
                              hint=f"use {self.handle} for the whole job" if not tasks else f"pick a task index between 0 and {len(tasks) - 1}")
        return tasks[index]

    @classmethod
    def now(cls, **fields: Any) -> Submission:
        """A record of a submission made now (``submitted_at``: the current UTC time)."""
        return cls(**fields, submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def save(self) -> Path:
        """Write the record into the job dir and the state index; returns the job dir's file."""
        text = json.dumps(self.model_dump(mode="json", exclude_none=True), indent=2, sort_keys=True) + "\n"
        target = Path(self.job_dir) / SUBMISSION_FILE
        write_atomic(target, text)
        write_atomic(state_record_path(JobHandle.parse(self.handle)), text)
        return target

    def discard(self) -> None:
        """Remove what :meth:`save` wrote (a submission that was undone: nothing of it runs)."""
        (Path(self.job_dir) / SUBMISSION_FILE).unlink(missing_ok=True)
        state_record_path(JobHandle.parse(self.handle)).unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> Submission:
        """Read a record written by :meth:`save`.

        Raises:
            ConfigError: the file is missing or not a submission record.
        """
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no submission recorded at {path}", hint="submit the job first: jobgen submit <job dir>") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is not a jobgen submission record ({exc})", hint="re-submit the job, or delete the file") from None


def state_dir() -> Path:
    """Where jobgen keeps submission records: ``$JOBGEN_STATE_DIR``, else
    ``$XDG_STATE_HOME/jobgen``, else ``~/.local/state/jobgen`` (XDG Base Directory spec)."""
    if os.environ.get("JOBGEN_STATE_DIR"):
        return Path(os.environ["JOBGEN_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "jobgen"


#: Longest state-record file name, in bytes: file systems allow 255, and :func:`write_atomic`'s
#: temporary file adds 14 to it.
MAX_RECORD_NAME_BYTES = 200


def state_record_path(handle: JobHandle) -> Path:
    """The state-index file for ``handle``: ``<state dir>/<scheme>/<path, '/' -> '__'>.json``
    while that name fits :data:`MAX_RECORD_NAME_BYTES` (as earlier versions named every record);
    a longer one (a long workdir, a host of many multi-byte characters) is cut and ends in 16 hex
    digits of the path's sha256, so that it stays a legal, distinct file name."""
    stem = handle.path.replace("/", "__")
    if len((stem + ".json").encode("utf-8", "surrogatepass")) <= MAX_RECORD_NAME_BYTES:
        return state_dir() / handle.scheme / (stem + ".json")
    digest = hashlib.sha256(handle.path.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    room = MAX_RECORD_NAME_BYTES - len(f"-{digest}.json")
    cut = stem.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
    return state_dir() / handle.scheme / f"{cut}-{digest}.json"


def recorded_submissions() -> list[Submission]:
    """Every submission record in the state index (:func:`state_dir`), newest first (records
    without a time last, by handle), the jobs of one sweep (:class:`SweepTag`) together, in point
    order, where the newest of them stands. Unreadable files are skipped: the index is a cache of
    what submit did, and ``jobgen ls`` must list the rest."""
    records = []
    for path in sorted(state_dir().glob("*/*.json")):
        try:
            records.append(Submission.load(path))
        except ConfigError:
            continue
    records.sort(key=lambda r: (r.submitted_at is not None, r.submitted_at or "", r.handle), reverse=True)
    place: dict[str, int] = {}
    for position, record in enumerate(records):
        place.setdefault(_group(record), position)
    return sorted(records, key=lambda r: (place[_group(r)], r.sweep.index or 0 if r.sweep is not None else 0))


def _group(record: Submission) -> str:
    """What :func:`recorded_submissions` keeps together: a sweep's id, else the job's own handle."""
    return f"sweep:{record.sweep.id}" if record.sweep is not None else record.handle


def find_submission(handle: JobHandle) -> Submission | None:
    """The recorded submission of ``handle`` from the state index, or ``None``."""
    path = state_record_path(handle)
    if not path.is_file() and handle.array_parent is not None:
        path = state_record_path(handle.array_parent)  # one task of a recorded array
    return Submission.load(path) if path.is_file() else None


def resolve_job(job: str) -> JobHandle:
    """A handle URI, or a submitted job directory (its submission record names the handle).

    Raises:
        ConfigError: neither a handle nor a directory with a submission record.
    """
    if "://" in job:
        return JobHandle.parse(job)
    if Path(job).is_dir():
        return JobHandle.parse(Submission.load(Path(job) / SUBMISSION_FILE).handle)
    raise ConfigError(
        f"{job!r} is neither a job handle nor a job directory",
        hint="pass the handle `jobgen submit` printed (slurm://<cluster>/<jobid>, k8s://<context>/<ns>/<name>, "
        "local://<run dir>, ssh://<first host>/<run dir>) or the submitted job directory",
    )
