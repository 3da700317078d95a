"""What a run directory holds besides the run's outputs: the code snapshot's record
(:class:`CodeSnapshot`), whose run it is (:class:`RunIdentity`, :func:`check_run_dir`), how a
local run's last start went (:class:`LocalRun`) and the experiment trackers' run identity
(:class:`TrackingRecord`). Part of the job directory's contract (:mod:`jobgen.jobdir`)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobgen.errors import ConfigError
from jobgen.jobdir.files import (
    CODE_DIFF_FILE,
    CODE_DIR_ENV,
    CODE_INFO_FILE,
    LOCAL_RUN_FILE,
    RUN_IDENTITY_FILE,
    SUMMARY_FILE,
    TRACKING_FILE,
    write_atomic,
)
from jobgen.jobdir.spec import ResolvedSpec
from jobgen.jobdir.summary import read_summary

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
    summary = read_summary(summary_path)
    if summary is not None and summary.profile is not None:
        recorded = (summary.profile, summary.world_size, summary.strategy)
        world = recorded[1] if mine.num_nodes is None else resolved.launch.world_size  # elastic: any world of its range
        if recorded != (mine.profile, world, mine.strategy):
            _refuse_run_dir(run_dir, f"profile {recorded[0]!r} (world size {recorded[1]}, {recorded[2]})", mine, summary_path, None)
    if claim:
        write_atomic(path, mine.model_dump_json(indent=2) + "\n")


def _refuse_run_dir(run_dir: Path, theirs: str, mine: RunIdentity, location: Path, record: Path | None) -> None:
    # both records stand for the run (summary.json where an older jobgen left no identity), so
    # continuing on purpose takes both out of the way: the identity alone left a second refusal
    steps = [f"delete {record}"] if record is not None else []
    if (run_dir / SUMMARY_FILE).exists():
        steps.append(f"move {run_dir / SUMMARY_FILE} away")
    on_purpose = f"; to continue that run's checkpoints with this job on purpose, {' and '.join(steps)}" if steps else ""
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
    evidence: tuple[dict[str, Any], ...] = Field(default=(), description=(
        "FAILED: how the last attempt ended, as :class:`jobgen.reports.failure_class.Evidence` fields (the "
        "ranks' exit code from torchrun's report, each rank's first failure, the watchdog's verdict); "
        "``jobgen status`` classifies the failure from it."))
    max_restarts: int = Field(default=0, description="The spec's ``restart.max_restarts`` this run was started with.")
    restarts: tuple[dict[str, Any], ...] = Field(default=(), description=(
        "The restarts jobgen made within the budget, oldest first: ``restart`` (1, 2, ...), ``class``, "
        "``reason``, ``rule``, ``evidence``, ``exit_code`` (torchrun's), ``at`` (UTC, ISO 8601)."))

    def ended(self, state: LocalRunState, exit_code: int | None, first_error: str | None = None,
              evidence: tuple[dict[str, Any], ...] = ()) -> LocalRun:
        """This start, ended now in ``state``."""
        return self.model_copy(update={"state": state, "exit_code": exit_code, "first_error": first_error, "evidence": evidence,
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
