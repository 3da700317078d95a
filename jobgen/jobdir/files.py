"""The job directory's files: their names (the one place that spells them), jobgen's generated-file
mark and how a rendered file is recognised, the atomic writer, and :class:`DirUndo` (a directory
put back as it was when a submit does not go ahead). Part of the job directory's contract
(:mod:`jobgen.jobdir`)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic_core

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
#: Beside each spec.json of a submitted job directory: the time model's prediction made at submit
#: (:mod:`jobgen.planning.prediction`; submit-time state like the record: GitOps repos ignore
#: ``**/.jobgen-prediction.json``); the entrypoint copies it into summary.json.
PREDICTION_FILE = ".jobgen-prediction.json"
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
#: ranks (local, SLURM, ssh): their input errors name it and the field, not spec.json's ``spec.``
#: path. Kubernetes pods run what the committed manifest says, which names no spec file: theirs
#: name spec.json.
SPEC_SOURCE_ENV = "JOBGEN_SPEC_SOURCE"
#: ssh jobs: set (to ``<handle>#node-<rank>``, :data:`NODE_TAG`) in the environment of every process
#: a job starts on a host, which all of them inherit; status counts them and cancel stops them by it,
#: and the entrypoint's notifications take the handle from it.
SSH_JOB_ENV = "JOBGEN_SSH_JOB"
#: What follows the job's handle in :data:`SSH_JOB_ENV`, before the node's rank.
NODE_TAG = "#node-"
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
#: In a run directory: the progress watchdog's verdict of a hung job, beside every live rank's
#: Python stacks (``stacks-rank<N>.txt``), in :data:`HANG_DIR` (jobgen.train.watchdog).
HANG_DIR = "hang"
HANG_VERDICT_FILE = f"{HANG_DIR}/verdict.json"
#: Written with the verdict: the node names of the ranks whose heartbeat stopped first, one per
#: line (plain text, for the SLURM batch script, which excludes the first on a restart).
HANG_NODES_FILE = f"{HANG_DIR}/stopped-nodes"

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
    (:func:`is_generated`), a submission record (:data:`SUBMISSION_FILE`) or a prediction
    (:data:`PREDICTION_FILE`). The code snapshot's dirty-tree check skips them
    (:func:`jobgen.usercode.snapshot.changes`): jobgen's outputs never block jobgen."""
    return path.name in (SUBMISSION_FILE, PREDICTION_FILE) or is_generated(path)


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


def new_dirs(path: Path) -> list[Path]:
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
    rendered files (:func:`owned_files`) and the :data:`PREDICTION_FILE` are put back as they were and new ones removed (a new
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
    prediction: bytes | None = None
    """The directory's :data:`PREDICTION_FILE` before (put back; a new one is removed)."""

    @classmethod
    def capture(cls, path: Path) -> DirUndo:
        """The state of ``path`` now (call it before writing)."""
        files = tuple((name, (path / name).read_bytes(), (path / name).stat().st_mode & 0o777) for name in owned_files(path))
        record = path / SUBMISSION_FILE
        prediction = path / PREDICTION_FILE
        return cls(path, tuple(new_dirs(path)), files, record.read_bytes() if record.is_file() else None,
                   (path / TRACKING_FILE).exists(), (path / RUN_IDENTITY_FILE).exists(),
                   prediction.read_bytes() if prediction.is_file() else None)

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
        self.restore_prediction()
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

    def restore_prediction(self) -> None:
        """Put the :data:`PREDICTION_FILE` back as :meth:`capture` found it (removed when there was none)."""
        if self.prediction is None:
            (self.path / PREDICTION_FILE).unlink(missing_ok=True)
        else:
            (self.path / PREDICTION_FILE).write_bytes(self.prediction)

    def undo_unless_submitted(self) -> None:
        """:meth:`undo`, unless the job was queued or started (a submission record was written)."""
        if not self.submitted():
            self.undo()


def pretty_json(value: Any) -> str:
    """Deterministic, human-diffable JSON: 2-space indent, UTF-8, final newline.

    Keys keep their order: callers build dicts in a fixed order and pydantic models serialise
    in field-definition order (mappings from user input are sorted by their validators).
    Serialised by pydantic-core (Rust): the stdlib encoder falls back to pure Python whenever
    ``indent`` is set, which made it the largest cost of a render.
    """
    return pydantic_core.to_json(value, indent=2).decode() + "\n"
