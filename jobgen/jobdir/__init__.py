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
- ``.jobgen-prediction.json`` — the time model's prediction, written by ``jobgen submit`` beside
  each ``spec.json`` (:data:`PREDICTION_FILE`, :mod:`jobgen.planning.prediction`; runtime state
  like the record); the entrypoint copies it into ``summary.json``.

A SLURM job array (a sweep on a profile with ``slurm.sweep_as_array``) is one job directory named
after the sweep's base name: ``job.sbatch`` (``#SBATCH --array``), ``array.json``
(:class:`ArrayIndex`: every point's index, job name and overrides) and, per point,
``points/<i>/spec.json`` (+ ``points/<i>/ds_config.json``) (:func:`point_file`); there is no
top-level ``spec.json``. Task ``i`` reads ``points/<i>/spec.json`` (``$SLURM_ARRAY_TASK_ID``).

A run directory holds ``summary.json`` (:data:`SUMMARY_FILE`, :class:`RunSummary`) at the end of training and, for
SLURM and local runs whose code was snapshotted at submit, ``code/<snapshot id>/`` (see
:data:`CODE_SUBDIR`): the committed tree of the user's repository plus :data:`CODE_INFO_FILE`
(:class:`CodeSnapshot`), whose path reaches the ranks as ``$JOBGEN_CODE_DIR``
(:data:`CODE_DIR_ENV`).

The contract is one package, one module per concept; every name is importable from
``jobgen.jobdir`` (the modules of jobgen import them from their own module):

- :mod:`jobgen.jobdir.files`: file names, the generated-file mark, the atomic writer, :class:`DirUndo`;
- :mod:`jobgen.jobdir.spec`: ``spec.json`` (:class:`ResolvedSpec`, :class:`LaunchSpec`) and ``array.json`` (:class:`ArrayIndex`);
- :mod:`jobgen.jobdir.runs`: a run directory's records (:class:`CodeSnapshot`, :class:`RunIdentity`,
  :class:`LocalRun`, :class:`TrackingRecord`);
- :mod:`jobgen.jobdir.summary`: ``summary.json`` (:class:`RunSummary`, :func:`read_summary`);
- :mod:`jobgen.jobdir.world`: the job's world (:class:`~jobgen.jobdir.world.World`: nodes x ranks per
  node and the numbers derived from it);
- :mod:`jobgen.jobdir.submission`: the handle (:class:`JobHandle`), the submission record
  (:class:`Submission`) and the state index.
"""

from __future__ import annotations

from jobgen.jobdir.files import (
    ARRAY_INDEX_FILE,
    CODE_DIFF_FILE,
    CODE_DIR_ENV,
    CODE_INFO_FILE,
    CODE_SUBDIR,
    DS_CONFIG_FILE,
    EXECUTABLE_FILES,
    GENERATED_MARK,
    INDEX_FILE,
    JOB_FILES,
    KUSTOMIZATION_FILE,
    LAUNCH_FILE,
    LOCAL_RUN_FILE,
    MLFLOW_DB_FILE,
    OWNED_FILES,
    POINT_FILES,
    POINTS_DIR,
    PREDICTION_FILE,
    PYTORCHJOB_FILE,
    RUN_DIR_GITIGNORE,
    RUN_IDENTITY_FILE,
    SBATCH_FILE,
    SPEC_FILE,
    SPEC_SOURCE_ENV,
    SSH_JOB_ENV,
    SUBMISSION_FILE,
    SUBMIT_JOB_SUBDIR,
    SUMMARY_FILE,
    TRACKING_FILE,
    TRAINJOB_FILE,
    WANDB_SUBDIR,
    DirUndo,
    generated_header,
    ignore_run_dir,
    is_generated,
    is_generated_text,
    is_job_dir,
    is_jobgen_output,
    kustomization_yaml,
    owned_files,
    point_file,
    remove_empty_point_dirs,
    write_atomic,
    write_job_files,
)
from jobgen.jobdir.runs import (
    CodeSnapshot,
    LocalRun,
    LocalRunState,
    RunIdentity,
    TrackingRecord,
    check_run_dir,
    ensure_tracking_record,
    read_code_snapshot,
    read_local_run,
    read_tracking_record,
    write_local_run,
    write_tracking_record,
)
from jobgen.jobdir.spec import (
    ArrayIndex,
    ArrayPoint,
    LaunchSpec,
    ResolvedSpec,
    load_resolved_spec,
    read_array_index,
    read_resolved_spec,
)
from jobgen.jobdir.submission import (
    HANDLE_SCHEMES,
    MAX_RECORD_NAME_BYTES,
    ArrayTask,
    CallableJob,
    JobHandle,
    Submission,
    SweepTag,
    find_submission,
    new_sweep_id,
    recorded_submissions,
    resolve_job,
    state_dir,
    state_record_path,
)
from jobgen.jobdir.summary import RunSummary, SpeedLevers, StragglerRecord, parse_summary, read_summary, write_summary
from jobgen.specs.training import MAX_NAME  # a job's name rule: a spec's, named here with the contract

__all__ = [
    "ARRAY_INDEX_FILE",
    "ArrayIndex",
    "ArrayPoint",
    "ArrayTask",
    "CODE_DIFF_FILE",
    "CODE_DIR_ENV",
    "SPEC_SOURCE_ENV",
    "CODE_INFO_FILE",
    "CODE_SUBDIR",
    "CallableJob",
    "CodeSnapshot",
    "DS_CONFIG_FILE",
    "DirUndo",
    "EXECUTABLE_FILES",
    "GENERATED_MARK",
    "HANDLE_SCHEMES",
    "INDEX_FILE",
    "JOB_FILES",
    "JobHandle",
    "KUSTOMIZATION_FILE",
    "LAUNCH_FILE",
    "LOCAL_RUN_FILE",
    "LaunchSpec",
    "LocalRun",
    "LocalRunState",
    "MAX_NAME",
    "MAX_RECORD_NAME_BYTES",
    "MLFLOW_DB_FILE",
    "OWNED_FILES",
    "POINTS_DIR",
    "POINT_FILES",
    "PREDICTION_FILE",
    "PYTORCHJOB_FILE",
    "RUN_DIR_GITIGNORE",
    "RUN_IDENTITY_FILE",
    "ResolvedSpec",
    "RunIdentity",
    "RunSummary",
    "SBATCH_FILE",
    "SPEC_FILE",
    "SSH_JOB_ENV",
    "SUBMISSION_FILE",
    "SUBMIT_JOB_SUBDIR",
    "SUMMARY_FILE",
    "Submission",
    "SpeedLevers",
    "StragglerRecord",
    "SweepTag",
    "TRACKING_FILE",
    "TRAINJOB_FILE",
    "TrackingRecord",
    "WANDB_SUBDIR",
    "check_run_dir",
    "ensure_tracking_record",
    "find_submission",
    "generated_header",
    "ignore_run_dir",
    "is_generated",
    "is_generated_text",
    "is_job_dir",
    "is_jobgen_output",
    "kustomization_yaml",
    "load_resolved_spec",
    "new_sweep_id",
    "owned_files",
    "parse_summary",
    "point_file",
    "read_array_index",
    "read_code_snapshot",
    "read_local_run",
    "read_resolved_spec",
    "read_summary",
    "read_tracking_record",
    "recorded_submissions",
    "remove_empty_point_dirs",
    "resolve_job",
    "state_dir",
    "state_record_path",
    "write_atomic",
    "write_job_files",
    "write_local_run",
    "write_summary",
    "write_tracking_record",
]
