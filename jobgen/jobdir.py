"""The job directory contract: what is committed is what runs.

A job directory (``manifests/<profile>/<job name>/`` for GitOps, the run directory for local
runs) holds the files the planner rendered plus, once submitted, a submission record. This
module is the one place that spells their names and formats; the planner writes through it,
and the entrypoint, the backends, the CLI and GitOps read through it. Torch-free and cheap.

Files (``OWNED_FILES``: jobgen removes a stale one when a re-render no longer plans it):

- ``spec.json`` — :class:`ResolvedSpec`: the training spec plus the launch facts
  (:class:`LaunchSpec`), read by ``python -m jobgen.train`` on every node. ``extra="forbid"``:
  a key this version does not know is an error, never silently ignored.
- ``ds_config.json`` — the DeepSpeed config (DeepSpeed strategies only); jobgen's when the spec.json
  beside it names it (:func:`is_generated`).
- ``job.sbatch`` (SLURM), ``pytorchjob.yaml`` / ``trainjob.yaml`` + ``kustomization.yaml``
  (Kubernetes), ``launch.sh`` (ssh) — the scheduler's files, each starting with :data:`GENERATED_MARK`
  (after a ``#!`` line).
- ``.jobgen-submission.json`` — :class:`Submission`, written by ``jobgen submit`` (runtime
  state, not a rendered file: GitOps repos ignore it). A Python callable submitted through
  submitit (``jobgen.api.executor``) has no job directory: its record, marked by
  :class:`CallableJob`, lives in submitit's folder for the job.

A SLURM job array (a sweep on a profile with ``slurm.sweep_as_array``) is one job directory named
after the sweep's base name: ``job.sbatch`` (``#SBATCH --array``), ``array.json``
(:class:`ArrayIndex`: every point's index, job name and overrides) and, per point,
``points/<i>/spec.json`` (+ ``points/<i>/ds_config.json``) (:func:`point_file`); there is no
top-level ``spec.json``. Task ``i`` reads ``points/<i>/spec.json`` (``$SLURM_ARRAY_TASK_ID``).

A run directory holds ``summary.json`` (:data:`SUMMARY_FILE`) at the end of training and, for
SLURM and local runs whose code was snapshotted at submit, ``code/<snapshot id>/`` (see
:data:`CODE_SUBDIR`): the committed tree of the user's repository plus :data:`CODE_INFO_FILE`
(:class:`CodeSnapshot`), whose path reaches the ranks as ``$JOBGEN_CODE_DIR``
(:data:`CODE_DIR_ENV`).

Size: above ~500 lines on purpose: ARCHITECTURE.md makes the job directory's whole contract one
module (names, formats — spec.json, the array index, the code snapshot record, the submission
record —, the handle, the writer), so that no reader spells a file name or a key of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from jobgen.errors import ConfigError, json_path
from jobgen.planning.rules import World
from jobgen.specs.profile import SshSettings
from jobgen.specs.training import TrainingSpec

# --------------------------------------------------------------------------- file names

SPEC_FILE = "spec.json"
DS_CONFIG_FILE = "ds_config.json"
SBATCH_FILE = "job.sbatch"
PYTORCHJOB_FILE = "pytorchjob.yaml"
TRAINJOB_FILE = "trainjob.yaml"
KUSTOMIZATION_FILE = "kustomization.yaml"
#: ssh profiles: the launch script every host runs with its node rank (``bash launch.sh <rank>``).
LAUNCH_FILE = "launch.sh"
#: The submission record (runtime state; GitOps repos ignore ``**/.jobgen-submission.json``).
SUBMISSION_FILE = ".jobgen-submission.json"
#: Written by the entrypoint into the run directory when training ends.
SUMMARY_FILE = "summary.json"
#: The code snapshots of a run: ``<run dir>/code/<commit>[-dirty-<diff sha256, 12 hex>]/``.
CODE_SUBDIR = "code"
#: In a code snapshot's root: :class:`CodeSnapshot` (what the snapshot is; read by the entrypoint).
CODE_INFO_FILE = ".jobgen-code.json"
#: In a code snapshot's root, when taken with ``--allow-dirty``: the ``git diff`` copied over the commit.
CODE_DIFF_FILE = ".jobgen-code.diff"
#: The environment variable naming the snapshot root for every rank (sbatch exports it, the local
#: run and the Kubernetes pods set it); job.sbatch and the entrypoint put it first on PYTHONPATH.
CODE_DIR_ENV = "JOBGEN_CODE_DIR"
#: The user's spec file, as `jobgen submit` read it (absolute), set for the bundled entrypoint's
#: ranks (local, SLURM): their input errors name it and the field, not spec.json's ``spec.`` path.
SPEC_SOURCE_ENV = "JOBGEN_SPEC_SOURCE"
#: ssh jobs: set (to the job's handle) in the environment of every process a job starts on a host,
#: which all of them inherit; status counts them and cancel stops them by it.
SSH_JOB_ENV = "JOBGEN_SSH_JOB"
#: ``jobgen submit SPEC`` without ``--out`` writes the job directory here, inside the run directory.
SUBMIT_JOB_SUBDIR = "job"
#: In every run directory: ``*``, so git ignores the run's outputs (:func:`ignore_run_dir`).
RUN_DIR_GITIGNORE = ".gitignore"
#: In a run directory whose spec names an experiment tracker (``trainer.loggers``: wandb, mlflow):
#: :class:`TrackingRecord`, the run's identity across requeues and resubmissions. Created by
#: ``jobgen submit`` (SLURM: in every array task's run directory) or, where submit cannot reach
#: the run directory (Kubernetes), by the entrypoint's first start.
TRACKING_FILE = ".jobgen-tracking.json"
#: MLflow's database in the run directory when no tracking URI is given (``sqlite:///<run dir>/mlflow.db``).
MLFLOW_DB_FILE = "mlflow.db"
#: Where W&B writes its run directories (``run-*`` / ``offline-run-<time>-<id>/``): ``wandb.init(dir=<run dir>)``
#: puts them under ``<run dir>/wandb/`` (wandb 0.31).
WANDB_SUBDIR = "wandb"
#: At the root of a project render (``jobgen render --all``): every job of the project.
INDEX_FILE = "index.yaml"
#: In every run directory: :class:`RunIdentity`, the profile and shape of the run it holds (written by
#: the first start; a start of another profile or shape is refused there: :func:`check_run_dir`).
RUN_IDENTITY_FILE = ".jobgen-run.json"
#: In a local run directory: :class:`LocalRun`, how the last start of the run went (RUNNING while
#: jobgen holds it in the foreground, then COMPLETED, FAILED or CANCELLED with torchrun's exit code).
LOCAL_RUN_FILE = ".jobgen-local-run.json"

#: A job array's index of points (:class:`ArrayIndex`), beside its ``job.sbatch``.
ARRAY_INDEX_FILE = "array.json"
#: A job array's per-point files go to ``points/<task index>/`` (:func:`point_file`).
POINTS_DIR = "points"
#: Files a job array keeps per point (under ``points/<i>/``).
POINT_FILES = frozenset({SPEC_FILE, DS_CONFIG_FILE})

#: Files the planner writes into a job directory; stale ones from an earlier render are removed.
OWNED_FILES = frozenset({SBATCH_FILE, PYTORCHJOB_FILE, TRAINJOB_FILE, SPEC_FILE, DS_CONFIG_FILE, ARRAY_INDEX_FILE, LAUNCH_FILE})
#: Everything jobgen may write into a job directory when rendering (GitOps compares these).
JOB_FILES = OWNED_FILES | {KUSTOMIZATION_FILE}
#: Rendered files that must be executable (mode 0755; the rest are 0644).
EXECUTABLE_FILES = frozenset({SBATCH_FILE, LAUNCH_FILE})

#: Longest job name (= job directory name) that every backend uses unchanged: Kubernetes names
#: its objects after the job, and the operator's pod and Service names (``<name>-worker-<index>``)
#: must fit a 63-character DNS label. A longer name (or one that is not a DNS-1035 label) gets a
#: derived, hashed object name there (:func:`jobgen.backends.k8s_manifest.k8s_name`, with a
#: warning); generated names stay within it (:func:`jobgen.specs.sweeps.sweep_job_names`).
MAX_NAME = 48

#: First characters of every rendered text file but JSON ones (templates start with it).
GENERATED_MARK = "# Generated by jobgen"
#: How a rendered JSON file (spec.json) is recognised: its first key.
_SPEC_MARK = '"jobgen_version"'
#: Bytes read to recognise a generated file.
_MARK_WINDOW = 400


def point_file(index: int | str, name: str) -> str:
    """The path, relative to an array's job directory, of point ``index``'s file ``name``
    (``points/<index>/<name>``). ``index`` may be shell text (``${SLURM_ARRAY_TASK_ID}``)."""
    return f"{POINTS_DIR}/{index}/{name}"


def owned_files(job_dir: Path) -> list[str]:
    """Paths (relative, POSIX) of the files in ``job_dir`` that jobgen wrote and may replace or
    remove: :data:`JOB_FILES` at the top (``kustomization.yaml`` only with jobgen's mark) and a
    job array's :data:`POINT_FILES` under ``points/<i>/`` (only with jobgen's mark)."""
    if not job_dir.is_dir():
        return []
    names = []
    for entry in sorted(job_dir.iterdir()):
        if entry.is_file() and entry.name in JOB_FILES and (entry.name != KUSTOMIZATION_FILE or is_generated(entry)):
            names.append(entry.name)
    points = job_dir / POINTS_DIR
    if points.is_dir():
        for point in sorted(p for p in points.iterdir() if p.is_dir() and p.name.isdigit()):
            for entry in sorted(point.iterdir()):
                if entry.is_file() and entry.name in POINT_FILES and is_generated(entry):
                    names.append(point_file(point.name, entry.name))
    return names


def remove_empty_point_dirs(job_dir: Path) -> None:
    """Remove ``points/<i>/`` directories (and ``points/``) that are empty after stale point
    files were removed; anything else stays."""
    points = job_dir / POINTS_DIR
    if not points.is_dir():
        return
    for point in sorted(p for p in points.iterdir() if p.is_dir() and p.name.isdigit()):
        with contextlib.suppress(OSError):
            point.rmdir()
    with contextlib.suppress(OSError):
        points.rmdir()


def generated_header(version: str, profile: str, *lines: str) -> str:
    """The header of a generated YAML/shell file: the mark, the version and profile, and
    ``lines`` (each prefixed with ``# ``), ending in a newline."""
    head = [f"{GENERATED_MARK} {version} from profile {profile}; re-render instead of editing."]
    return "\n".join(head + [f"# {line}" for line in lines]) + "\n"


def kustomization_yaml(header: str, resources: list[str]) -> str:
    """A kustomize ``Kustomization`` (:data:`KUSTOMIZATION_FILE`) listing ``resources`` (relative
    file paths, kept in the given order), after ``header`` (comment lines, each starting with ``#``).

    Only ``resources`` with file paths: kubectl 1.20 (Debian 12's kubernetes-client, kustomize
    v2.0.3) rejects directories there, and newer kustomize deprecates ``bases``. Paths are
    JSON-quoted (JSON is YAML), so any job name survives.
    """
    lines = [*header.splitlines(), "apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", "resources:"]
    lines += [f"  - {json.dumps(r, ensure_ascii=False)}" for r in resources]
    return "\n".join(lines) + "\n"


def is_generated_text(name: str, head: str) -> bool:
    """True when ``head`` (the first bytes of file ``name``, decoded) marks a file jobgen
    rendered: for JSON files the ``jobgen_version`` key, for the rest the mark in one of the
    first three lines (after a ``#!`` line, say)."""
    if name.endswith(".json"):
        return _SPEC_MARK in head
    return any(line.startswith(GENERATED_MARK) for line in head.splitlines()[:3])


def is_generated(path: Path) -> bool:
    """True when ``path`` is a file jobgen rendered (see :func:`is_generated_text`). A
    :data:`DS_CONFIG_FILE` is DeepSpeed's format, with no room for a mark: it is jobgen's when the
    :data:`SPEC_FILE` beside it is (a job directory, or a job array's ``points/<i>/``) and names it
    as its DeepSpeed config."""
    if path.name == DS_CONFIG_FILE:
        return path.is_file() and _names_ds_config(path.with_name(SPEC_FILE))
    try:
        with path.open("rb") as fh:
            head = fh.read(_MARK_WINDOW).decode("utf-8", "replace")
    except OSError:
        return False
    return is_generated_text(path.name, head)


def _names_ds_config(spec_file: Path) -> bool:
    """Whether ``spec_file`` is a spec.json jobgen rendered whose launch names :data:`DS_CONFIG_FILE`."""
    if not is_generated(spec_file):
        return False
    try:
        launch = json.loads(spec_file.read_text(encoding="utf-8")).get("launch", {})
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(launch, dict) and launch.get("deepspeed_config") == DS_CONFIG_FILE


def is_jobgen_output(path: Path) -> bool:
    """True when ``path`` is a file jobgen wrote that is not the user's code: a rendered file
    (:func:`is_generated`) or a submission record (:data:`SUBMISSION_FILE`). The code snapshot's
    dirty-tree check skips them (:func:`jobgen.usercode.snapshot.changes`): jobgen's outputs never block jobgen."""
    return path.name == SUBMISSION_FILE or is_generated(path)


def ignore_run_dir(run_dir: Path) -> None:
    """Make git ignore everything in ``run_dir`` (a run's checkpoints, logs, code snapshot):
    :data:`RUN_DIR_GITIGNORE` holding ``*`` (it ignores itself too), written when missing, as
    pytest does for ``.pytest_cache/``. A run directory inside the user's repository then never
    counts as an uncommitted change of the next submit, and ``git status`` stays quiet."""
    path = run_dir / RUN_DIR_GITIGNORE
    if not path.exists():
        write_atomic(path, f"{GENERATED_MARK}: a run directory (outputs and code snapshot); git ignores all of it.\n*\n")


def is_job_dir(directory: Path) -> bool:
    """True when ``directory`` holds a file jobgen rendered under one of :data:`JOB_FILES`."""
    return directory.is_dir() and any(is_generated(directory / name) for name in sorted(JOB_FILES))


# --------------------------------------------------------------------------- writing


def write_atomic(path: Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory + rename), UTF-8
    with ``\\n`` line ends, mode 0755 or 0644; parents are created. A reader (or a pre-empted
    writer) never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_job_files(job_dir: Path, files: Iterable[tuple[str, str]]) -> list[Path]:
    """Write rendered ``(name, text)`` files into ``job_dir`` (each atomically) and remove
    owned files an earlier render left that ``files`` lacks (e.g. ``ds_config.json`` after
    switching to DDP). Returns the written paths in order."""
    written, planned = [], set()
    for name, text in files:
        target = job_dir / name
        write_atomic(target, text, executable=name in EXECUTABLE_FILES)
        written.append(target)
        planned.add(name)
    for stale in owned_files(job_dir):
        if stale not in planned and stale != KUSTOMIZATION_FILE:
            (job_dir / stale).unlink(missing_ok=True)
    remove_empty_point_dirs(job_dir)
    return written


def _new_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, innermost first."""
    missing = []
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


@dataclass(frozen=True)
class DirUndo:
    """What a directory held before a submit wrote into it, to put it back when the submission
    does not go ahead (a refused check, a scheduler that failed before queueing): "Nothing was
    submitted" then also means nothing was written.

    Only what jobgen writes is touched: a directory that did not exist is removed with what is
    in it (and its parents that were created with it, while empty or holding only the run
    directory's :data:`RUN_DIR_GITIGNORE`); in one that existed, the
    rendered files (:func:`owned_files`) are put back as they were and new ones removed (a new
    :data:`TRACKING_FILE` and a new :data:`RUN_IDENTITY_FILE` too). A
    submission record (:data:`SUBMISSION_FILE`) that appeared or changed means the job was
    queued or started: then nothing is undone (:meth:`undo_unless_submitted`).
    """

    path: Path
    created: tuple[Path, ...]
    files: tuple[tuple[str, bytes, int], ...]
    record: bytes | None
    had_tracking: bool = True
    """Whether the directory held a :data:`TRACKING_FILE` (one made by a submit that did not go ahead is removed)."""
    had_identity: bool = True
    """Whether the directory held a :data:`RUN_IDENTITY_FILE` (one claimed by a submit that did not go ahead is removed)."""

    @classmethod
    def capture(cls, path: Path) -> DirUndo:
        """The state of ``path`` now (call it before writing)."""
        files = tuple((name, (path / name).read_bytes(), (path / name).stat().st_mode & 0o777) for name in owned_files(path))
        record = path / SUBMISSION_FILE
        return cls(path, tuple(_new_dirs(path)), files, record.read_bytes() if record.is_file() else None,
                   (path / TRACKING_FILE).exists(), (path / RUN_IDENTITY_FILE).exists())

    def submitted(self) -> bool:
        """Whether a submission record was written since :meth:`capture`."""
        record = self.path / SUBMISSION_FILE
        return record.is_file() and record.read_bytes() != self.record

    def undo(self) -> None:
        """Put the directory back as :meth:`capture` found it (see the class doc)."""
        import shutil

        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in self.created[1:]:
                ignore = parent / RUN_DIR_GITIGNORE  # a run directory made for this job holds only it
                if ignore.is_file() and [p.name for p in parent.iterdir()] == [RUN_DIR_GITIGNORE]:
                    ignore.unlink()
                with contextlib.suppress(OSError):
                    parent.rmdir()  # only while empty: another job may have written there since
            return
        if not self.had_tracking:
            (self.path / TRACKING_FILE).unlink(missing_ok=True)
        if not self.had_identity:
            (self.path / RUN_IDENTITY_FILE).unlink(missing_ok=True)
        before = {name: (data, mode) for name, data, mode in self.files}
        for name in owned_files(self.path):
            if name not in before:
                (self.path / name).unlink(missing_ok=True)
        for name, (data, mode) in before.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
        remove_empty_point_dirs(self.path)

    def undo_unless_submitted(self) -> None:
        """:meth:`undo`, unless the job was queued or started (a submission record was written)."""
        if not self.submitted():
            self.undo()


# --------------------------------------------------------------------------- spec.json


class LaunchSpec(BaseModel):
    """Where and how the job runs, as decided by the planner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduler: Literal["local", "slurm", "kubernetes", "ssh"] = Field(description="Which backend launches the job.")
    accelerator: Literal["cpu", "gpu"] = Field(description="Device type of every rank.")
    num_nodes: int = Field(ge=1, description="Nodes (SLURM nodes, Kubernetes pods, 1 for local).")
    devices_per_node: int = Field(ge=1, description="Processes (GPUs) per node.")
    world_size: int = Field(ge=1, description="Total processes = num_nodes x devices_per_node.")
    deepspeed_config: str | None = Field(
        default=None, description="DeepSpeed JSON config, relative to the spec file's directory (DeepSpeed strategies only).")
    requeue_signal: str | None = Field(
        default=None, description="SLURM: the signal (name without ``SIG``) that asks the job to checkpoint and requeue.")
    gpu_type: str | None = Field(default=None, description="GPU model (decides bf16/fp8 support on the node).")
    cluster: str | None = Field(default=None, description="SLURM cluster name from the profile (used in job handles).")
    gpu_hour_price: float | None = Field(default=None, ge=0, description=(
        "The profile's price of one GPU-hour (cost = GPU-hours x price); left out of the file when unset."))
    min_nodes: int | None = Field(default=None, ge=1, description=(
        "Elastic jobs only: the fewest nodes torchrun may train on (``num_nodes`` is then the most, and\n"
        "``world_size`` the world at that maximum); the entrypoint reads the real count from torchrun."))
    preflight: bool = Field(default=False, description=(
        "Run the all-reduce preflight (jobgen.train.preflight) before training (profile ``preflight``\n"
        "or ``jobgen submit --preflight``)."
    ))
    preflight_timeout_s: int = Field(default=60, ge=1, description="Seconds the preflight waits to join, and for its all-reduces.")
    ssh: SshSettings | None = Field(default=None, description=(
        "ssh profiles: the hosts the job runs on (the profile's first ``num_nodes``, in node-rank order) and how\n"
        "jobgen reaches them; what ``jobgen submit`` of the job directory uses. Left out of the file otherwise."))

    @field_validator("requeue_signal")
    @classmethod
    def _known_signal(cls, value: str | None) -> str | None:
        if value is not None and not isinstance(getattr(signal, "SIG" + value, None), signal.Signals):
            raise ValueError(f"unknown signal {value!r}; give a name without 'SIG', e.g. 'USR1' or 'USR2'")
        return value

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # Left out while unset / at their defaults, so jobs without them keep the spec.json (and
        # hashes) they had: the price (profiles without one), min_nodes (fixed-size jobs), the preflight.
        defaults = {"gpu_hour_price": None, "min_nodes": None, "preflight": False, "preflight_timeout_s": 60, "ssh": None}
        return {k: v for k, v in handler(self).items() if not (k in defaults and v == defaults[k])}

    @model_validator(mode="after")
    def _world_size_is_product(self) -> LaunchSpec:
        if self.min_nodes is not None and self.min_nodes > self.num_nodes:
            raise ValueError(f"min_nodes={self.min_nodes} is above num_nodes={self.num_nodes} (the elastic maximum)")
        if self.world_size != self.num_nodes * self.devices_per_node:
            raise ValueError(
                f"world_size={self.world_size} but num_nodes x devices_per_node = "
                f"{self.num_nodes} x {self.devices_per_node} = {self.num_nodes * self.devices_per_node}"
            )
        return self


class ResolvedSpec(BaseModel):
    """The whole ``spec.json``: the training spec plus launch facts. The planner builds and
    writes it (:meth:`dumps`); every reader loads it with :func:`load_resolved_spec`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobgen_version: str = Field(description="Version of jobgen that planned the job (also the file's generated mark).")
    inputs_sha256: str = Field(description="Hash of the planner's inputs (resolved spec, profile, templates).")
    profile: str = Field(description="Cluster profile name.")
    spec: TrainingSpec = Field(description="What to train.")
    launch: LaunchSpec = Field(description="Where it runs.")

    @model_validator(mode="after")
    def _precision_resolved(self) -> ResolvedSpec:
        if self.spec.trainer.precision == "auto":
            raise ValueError("spec.trainer.precision is 'auto': the planner resolves it from the profile before writing spec.json")
        return self

    def dumps(self) -> str:
        """The file's text: deterministic JSON (field order, 2-space indent, final newline)."""
        from jobgen.planning.render import pretty_json

        return pretty_json(self)

    @property
    def world(self) -> World:
        """The launch's :class:`World` with the spec's batch arithmetic (world size, global
        batch). CPUs per rank and the time limit are not recorded in spec.json (the scheduler
        enforces them), so those two keep World's defaults here."""
        t = self.spec.trainer
        return World(num_nodes=self.launch.num_nodes, devices_per_node=self.launch.devices_per_node,
                     accelerator=self.launch.accelerator, micro_batch_size=t.micro_batch_size,
                     gradient_accumulation_steps=t.gradient_accumulation_steps, min_nodes=self.launch.min_nodes)


def load_resolved_spec(path: Path) -> ResolvedSpec:
    """Read and validate a ``spec.json``.

    Raises:
        ConfigError: missing/unreadable file, invalid JSON, a key this jobgen does not know
            (a file from another version, or hand-edited), or a field that fails validation;
            the location names the file and the JSON path.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the resolved spec: {exc.strerror or exc}",
            location=str(path),
            hint=f"pass the {SPEC_FILE} that `jobgen render` wrote into the job directory",
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", location=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a JSON object with 'spec' and 'launch', got {type(raw).__name__}", location=str(path))
    try:
        return ResolvedSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more error(s))" if exc.error_count() > 1 else ""
        version = raw.get("jobgen_version")
        from jobgen import __version__

        other = f" (written by jobgen {version}; this is {__version__})" if version != __version__ else ""
        raise ConfigError(
            f"{first['msg']}{more}{other}",
            location=f"{path}: {json_path(first['loc'])}",
            hint="re-render the job directory with this jobgen (`jobgen render SPEC --profile P`)",
        ) from None


# --------------------------------------------------------------------------- job arrays


class ArrayPoint(BaseModel):
    """One task of a job array: its index (``$SLURM_ARRAY_TASK_ID``), its job name (the sweep
    point's name, also its run directory's name) and the overrides that make its spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="The array task id that trains this point.")
    name: str = Field(description="The point's job name (``<base>-<key><value>-...``); its run directory is ``<runs dir>/<name>``.")
    overrides: dict[str, str] = Field(description="The sweep point: key path -> value (as given to --sweep), in axis order.")


class ArrayIndex(BaseModel):
    """``array.json``: the index of a job array's points, written by the planner; read by
    ``jobgen submit`` (task names and run directories), status, logs and ``ls``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobgen_version: str = Field(description="Version of jobgen that planned the array (also the file's generated mark).")
    inputs_sha256: str = Field(description="Hash of the planner's inputs (every point's spec, the profile, the template).")
    profile: str = Field(description="Cluster profile name.")
    name: str = Field(description="The sweep's base name: the job directory's and the SLURM job's name.")
    parallelism: int | None = Field(default=None, description="At most this many tasks at once (``%P``); None: no limit.")
    points: tuple[ArrayPoint, ...] = Field(min_length=1, description="Every task, by index 0..N-1.")

    @model_validator(mode="after")
    def _indexed(self) -> ArrayIndex:
        if [p.index for p in self.points] != list(range(len(self.points))):
            raise ValueError("points must be indexed 0..N-1 in order")
        return self

    def dumps(self) -> str:
        """The file's text: deterministic JSON (field order, 2-space indent, final newline)."""
        from jobgen.planning.render import pretty_json

        return pretty_json(self)

    def point(self, index: int) -> ArrayPoint:
        """Point ``index``.

        Raises:
            ConfigError: the array has no such task.
        """
        if not 0 <= index < len(self.points):
            raise ConfigError(f"array {self.name!r} has tasks 0-{len(self.points) - 1}, not {index}",
                              hint=f"pick a task index between 0 and {len(self.points) - 1}")
        return self.points[index]


def read_array_index(job_dir: Path) -> ArrayIndex | None:
    """The :class:`ArrayIndex` of a job array's directory, or None when ``job_dir`` is not an array.

    Raises:
        ConfigError: ``array.json`` exists but is unreadable or invalid.
    """
    path = job_dir / ARRAY_INDEX_FILE
    if not path.is_file():
        return None
    try:
        return ArrayIndex.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a jobgen array index ({exc})",
                          hint="re-render the job directory with this jobgen (`jobgen render SPEC --profile P --sweep ...`)") from None


def read_resolved_spec(job_dir: Path) -> ResolvedSpec:
    """The :class:`ResolvedSpec` of a rendered job directory. For a job array, point 0's: the
    planner checks that every point has the same launch facts (scheduler, cluster, world,
    secrets), which is what callers of this function read.

    Raises:
        ConfigError: ``job_dir`` has no ``spec.json``, or it is invalid (see :func:`load_resolved_spec`).
    """
    path = job_dir / SPEC_FILE
    if not path.is_file() and (job_dir / ARRAY_INDEX_FILE).is_file():
        path = job_dir / point_file(0, SPEC_FILE)
    if not path.is_file():
        raise ConfigError(
            f"{job_dir} is not a jobgen job directory: it has no {SPEC_FILE}",
            hint="render one first: jobgen render SPEC --profile P (files go to manifests/<profile>/<job name>/)",
        )
    return load_resolved_spec(path)


# --------------------------------------------------------------------------- code snapshots


class CodeSnapshot(BaseModel):
    """What a code snapshot holds (:data:`CODE_INFO_FILE` in its root; also in the submission
    record and ``summary.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    commit: str = Field(description="The commit the snapshot was taken from (full id).")
    dirty: bool = Field(default=False, description="True when uncommitted changes were copied over it (``--allow-dirty``).")
    diff_sha256: str | None = Field(default=None, description=(
        "sha256 of the ``git diff`` (binary, against the commit) of those changes, kept as "
        f"``{CODE_DIFF_FILE}`` in the snapshot; None when clean."))
    repo: str = Field(description="Where the code came from: the work tree's absolute path (SLURM, local) or the git URL (Kubernetes).")
    python_path: str = Field(default="", description="Sub-directory of the snapshot put first on PYTHONPATH (empty: its root).")

    def dumps(self) -> str:
        """The info file's text: sorted-key JSON, final newline."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def import_dir(self, root: Path) -> Path:
        """The directory of snapshot ``root`` that goes first on PYTHONPATH."""
        return root / self.python_path if self.python_path else root


def read_code_snapshot(root: Path) -> CodeSnapshot:
    """The :class:`CodeSnapshot` of the snapshot directory ``root`` (``$JOBGEN_CODE_DIR``).

    Raises:
        ConfigError: ``root`` holds no readable, valid :data:`CODE_INFO_FILE`.
    """
    path = root / CODE_INFO_FILE
    try:
        return CodeSnapshot.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"${CODE_DIR_ENV}={root} is not a code snapshot: it has no {CODE_INFO_FILE}",
            location=f"environment: {CODE_DIR_ENV}",
            hint="the run directory must be on a filesystem every node shares (SLURM: --runs-dir); submit again with jobgen submit",
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a jobgen code snapshot record ({exc})", location=f"environment: {CODE_DIR_ENV}",
                          hint="submit again with jobgen submit (it takes a fresh snapshot)") from None


# --------------------------------------------------------------------------- whose run a run directory holds


class RunIdentity(BaseModel):
    """The profile and shape of the run a run directory holds (:data:`RUN_IDENTITY_FILE`). A run
    directory is named after the job only (``<runs dir>/<job name>``): the same spec submitted with
    another profile would find the other run's checkpoints and resume them (or stop: "nothing to
    do"). Other inputs of the same profile and shape (``--set trainer.max_steps=1200``: train
    longer) are the same run."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    profile: str = Field(description="The cluster profile's name.")
    scheduler: str = Field(description="local, slurm, kubernetes or ssh.")
    accelerator: str = Field(description="cpu or gpu.")
    num_nodes: int | None = Field(description="Nodes; None for an elastic job (its count changes between restarts).")
    devices_per_node: int = Field(description="Ranks per node.")
    strategy: str = Field(description="The trainer's strategy (how the checkpoints are laid out).")

    @classmethod
    def of(cls, resolved: ResolvedSpec) -> RunIdentity:
        """The identity of a run of ``resolved``."""
        launch = resolved.launch
        nodes = None if launch.min_nodes is not None else launch.num_nodes
        return cls(profile=resolved.profile, scheduler=launch.scheduler, accelerator=launch.accelerator, num_nodes=nodes,
                   devices_per_node=launch.devices_per_node, strategy=resolved.spec.trainer.strategy)

    def describe(self) -> str:
        nodes = "elastic" if self.num_nodes is None else self.num_nodes
        return (f"profile {self.profile!r} ({nodes} node(s) x {self.devices_per_node} {self.accelerator} rank(s), "
                f"{self.strategy})")


def check_run_dir(run_dir: Path, resolved: ResolvedSpec, *, claim: bool = False) -> None:
    """Refuse to start a run of ``resolved`` in ``run_dir`` when it holds a run of another profile or
    shape: its :data:`RUN_IDENTITY_FILE`, else (a run directory of an older jobgen) its
    summary.json's ``profile``, ``world_size`` and ``strategy``. ``claim``: write this run's identity
    when the directory has none (``jobgen submit`` of a local run, rank zero of the entrypoint).

    Raises:
        ConfigError: another run's directory (exit 2), naming both and the way out.
    """
    mine = RunIdentity.of(resolved)
    path = run_dir / RUN_IDENTITY_FILE
    try:
        theirs: RunIdentity | None = RunIdentity.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        theirs = None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a jobgen run identity ({exc})", location=str(path),
                          hint="delete it: the next start records the identity of its own run") from None
    if theirs is not None:
        if theirs != mine:
            _refuse_run_dir(run_dir, theirs.describe(), mine, path, path)
        return
    summary_path = run_dir / SUMMARY_FILE
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict) and summary.get("profile") is not None:
        recorded = (summary.get("profile"), summary.get("world_size"), summary.get("strategy"))
        world = recorded[1] if mine.num_nodes is None else resolved.launch.world_size  # elastic: any world of its range
        if recorded != (mine.profile, world, mine.strategy):
            _refuse_run_dir(run_dir, f"profile {recorded[0]!r} (world size {recorded[1]}, {recorded[2]})", mine, summary_path, None)
    if claim:
        write_atomic(path, mine.model_dump_json(indent=2) + "\n")


def _refuse_run_dir(run_dir: Path, theirs: str, mine: RunIdentity, location: Path, record: Path | None) -> None:
    on_purpose = (f"; to continue that run's checkpoints with this profile on purpose, delete {record}" if record is not None else
                  f"; to continue it on purpose, move its {SUMMARY_FILE} away")
    raise ConfigError(
        f"run directory {run_dir} holds a run of {theirs}; this job is {mine.describe()}: it would resume that run's "
        "checkpoints (or stop at its max_steps) instead of starting its own",
        location=str(location),
        hint=f"give this job its own run directory: --set name=<another name> (e.g. the profile in it) or another --runs-dir{on_purpose}",
    )


# --------------------------------------------------------------------------- a local run's last start

#: The states a :class:`LocalRun` records.
LocalRunState = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED"]


class LocalRun(BaseModel):
    """How the last start of a local run went (:data:`LOCAL_RUN_FILE`), written by ``jobgen submit``
    when it starts torchrun (RUNNING, with jobgen's own process id) and when torchrun ends:
    COMPLETED (exit 0), FAILED (another exit code; ``first_error``: the first failing rank's
    error, as the triage found it) or CANCELLED (Ctrl-C). A local run has no scheduler to ask:
    this record is what ``jobgen status`` / ``ls`` read."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    state: LocalRunState = Field(description="RUNNING while jobgen holds the run, then how it ended.")
    pid: int = Field(description="The jobgen process that holds (held) the run in its foreground.")
    started_at: str = Field(description="When this start began (UTC, ISO 8601).")
    ended_at: str | None = Field(default=None, description="When it ended (UTC, ISO 8601); None while RUNNING.")
    exit_code: int | None = Field(default=None, description="torchrun's exit code; None while RUNNING or when it never ended on its own.")
    first_error: str | None = Field(default=None, description="FAILED: ``<rank>: <headline>`` of the first failure in output.log.")

    def ended(self, state: LocalRunState, exit_code: int | None, first_error: str | None = None) -> LocalRun:
        """This start, ended now in ``state``."""
        return self.model_copy(update={"state": state, "exit_code": exit_code, "first_error": first_error,
                                       "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})


def write_local_run(run_dir: Path, record: LocalRun) -> None:
    """Write ``record`` into ``run_dir`` (atomically)."""
    write_atomic(run_dir / LOCAL_RUN_FILE, record.model_dump_json(indent=2) + "\n")


def read_local_run(run_dir: Path) -> LocalRun | None:
    """The :class:`LocalRun` of ``run_dir``; None when it has none (a run of a jobgen that kept
    none) or it cannot be read (a cache of what submit saw: status then says UNKNOWN, never a guess)."""
    try:
        return LocalRun.model_validate_json((run_dir / LOCAL_RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- the trackers' run identity


class TrackingRecord(BaseModel):
    """:data:`TRACKING_FILE`: one experiment-tracker run per job, across requeues, resubmissions
    and array tasks (each task has its own run directory, so its own record).

    ``run_key`` is made at the first submit (random, 16 hex digits) and is the W&B run id (every
    start passes it with ``resume="allow"``; offline, every piece carries it) and the MLflow tag
    ``jobgen.run_key``. MLflow makes its own run ids, so the first start records it here; a start
    that finds none looks the run up by that tag (a start killed between creating the run and
    recording it). Written by ``jobgen submit`` and global rank zero only.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_key: str = Field(pattern=r"^[0-9a-f]{16}$", description="The job's tracker run key: the W&B run id, MLflow tag jobgen.run_key.")
    created_at: str = Field(description="When the key was made (UTC, ISO 8601).")
    mlflow_run_id: str | None = Field(default=None, description="The MLflow run, once the first start created it.")
    logged_step: int | None = Field(default=None, description=(
        "The highest optimizer step up to which every tracker has confirmed the metrics (MLflow: the call returned; "
        "W&B offline: in the run's .wandb file; None: none yet)."))
    logged_steps: dict[str, int] = Field(default_factory=dict, description=(
        "Per tracker (wandb, mlflow), the highest optimizer step it has confirmed. A later start sends each tracker "
        "nothing at or below what the tracker itself holds (read back from it where it can tell, else this), and "
        "sends again from metrics.csv the steps up to its checkpoint that the tracker lacks."))

    @classmethod
    def new(cls) -> TrackingRecord:
        """A fresh record: a new random key, made now."""
        import secrets

        return cls(run_key=secrets.token_hex(8), created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def dumps(self) -> str:
        """The file's text: sorted-key JSON, final newline (unset fields left out)."""
        doc = self.model_dump(mode="json", exclude_none=True)
        if not doc.get("logged_steps"):
            doc.pop("logged_steps", None)
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def read_tracking_record(run_dir: Path) -> TrackingRecord | None:
    """The :class:`TrackingRecord` of ``run_dir``, or None when it has none.

    Raises:
        ConfigError: the file exists but is not a record.
    """
    path = run_dir / TRACKING_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", location=str(path)) from None
    try:
        return TrackingRecord.model_validate_json(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not a jobgen tracking record ({exc})", location=str(path),
                          hint="delete it: the next start makes a new one (and so a new tracker run)") from None


def write_tracking_record(run_dir: Path, record: TrackingRecord) -> None:
    """Write ``record`` into ``run_dir`` (atomically)."""
    write_atomic(run_dir / TRACKING_FILE, record.dumps())


def ensure_tracking_record(run_dir: Path) -> TrackingRecord:
    """The record of ``run_dir``, made (and written) when it has none: what ``jobgen submit``
    calls for a spec with trackers, so that a requeued or resubmitted job finds the same run.

    Raises:
        ConfigError: an existing file is not a record (see :func:`read_tracking_record`).
    """
    record = read_tracking_record(run_dir)
    if record is None:
        record = TrackingRecord.new()
        write_tracking_record(run_dir, record)
    return record


# --------------------------------------------------------------------------- handles

#: Handle scheme -> the scheduler (backend table key) it belongs to.
HANDLE_SCHEMES = {"slurm": "slurm", "k8s": "kubernetes", "local": "local", "ssh": "ssh"}
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
        if self.scheme != "slurm":
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
