"""jobgen's Python API: what the ``jobgen`` command line wraps, with typed results.

    from jobgen import api

    job_plan = api.plan_job("examples/quickstart.yaml", "slurm-a100", overrides=["resources.nodes=2"])
    print(job_plan)                                   # every file and the exact submit steps
    api.render(job_plan, "manifests")                 # manifests/slurm-a100/quickstart/
    result = api.submit("manifests/slurm-a100/quickstart", api.SubmitOptions(runs_dir=Path("/shared/runs")))
    api.status(str(result.handle)).state             # PENDING, RUNNING, COMPLETED, ... or UNKNOWN
    api.logs(str(result.handle), api.LogOptions(follow=True))
    api.cancel(str(result.handle))

Every operation goes through the backend the profile (or the job directory's spec.json, or the
handle's scheme) names, via one interface (:class:`jobgen.backends.base.Backend`); nothing
here branches on the scheduler. Errors are :class:`jobgen.errors.JobgenError` subclasses with a
location and a hint. Planning and rendering never import torch or the Kubernetes client.

A sweep submitted in one call (``jobgen submit SPEC --sweep ...``: every point planned first, then
one job array or one job per point through :func:`submit`) is :mod:`jobgen.api.sweep`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen.backends import get_backend, plan
from jobgen.backends.base import Echo, JobStatus, LogOptions, SubmitOptions, SubmitResult, SubmittedJob
from jobgen.backends.slurm.array import ArrayMember, plan_array, wants_array
from jobgen.errors import ConfigError, JobgenError
from jobgen.jobdir.files import DirUndo, ignore_run_dir
from jobgen.jobdir.spec import read_array_index, read_resolved_spec
from jobgen.jobdir.submission import JobHandle, Submission, recorded_submissions, resolve_job
from jobgen.planning.plan import JobPlan
from jobgen.planning.sweep import Planners, find_templates
from jobgen.specs.capabilities import capabilities
from jobgen.specs.load import load_profile, load_spec
from jobgen.specs.profile import placeholder_error

if TYPE_CHECKING:
    from jobgen.reports.progress import Progress
    from jobgen.reports.triage import Triage
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.training import TrainingSpec

__all__ = ["JobHandle", "JobPlan", "JobStatus", "LogOptions", "SubmitOptions", "SubmitResult", "SubmittedJob", "cancel", "executor",
           "load", "logs", "plan_job", "render", "resolve", "status", "submit", "submit_profile", "templates_dir"]

PathLike = str | os.PathLike[str]

#: The backends' planners that planning a spec's sweep or the project file takes
#: (:func:`jobgen.planning.sweep.plan_single`, :func:`jobgen.planning.project.plan_project`): one
#: job through the backend of its profile's scheduler, a sweep as one SLURM job array where the
#: profile asks for one.
PLANNERS = Planners(job=plan, wants_array=wants_array, array=plan_array, array_member=ArrayMember)


def templates_dir(override: PathLike | None = None) -> Path:
    """The templates directory through the lookup order (flag > $JOBGEN_HOME > ./templates > packaged;
    :func:`jobgen.planning.sweep.find_templates`).

    Raises:
        ConfigError: none exists.
    """
    return find_templates(override)


def load(spec_path: PathLike, profile: str, *, overrides: tuple[str, ...] | list[str] = (),
         profiles_dir: PathLike | None = None, preflight: bool = False,
         smoke: int | None = None) -> tuple[TrainingSpec, ClusterProfile]:
    """Load and validate a spec file (with ``--set``-style overrides) and a profile (name or path);
    ``preflight``: turn the profile's ``preflight`` on (``jobgen submit --preflight``); with
    ``smoke``, the spec as a smoke run of that many steps (:meth:`TrainingSpec.as_smoke`).

    Raises:
        ConfigError: with the file and JSON path of the first problem.
    """
    spec = load_spec(spec_path, overrides)
    if smoke is not None:
        spec = as_smoke(spec, smoke, str(spec_path))
    return spec, submit_profile(profile, profiles_dir, preflight=preflight)


def submit_profile(profile: str, profiles_dir: PathLike | None = None, *, preflight: bool = False) -> ClusterProfile:
    """Load the profile ``profile`` (name or path) as ``jobgen submit`` plans with it: ``preflight``
    turns its ``preflight`` on (``--preflight``).

    Raises:
        ConfigError: with the file and JSON path of the first problem.
    """
    return load_profile(profile, profiles_dir, ["preflight=true"] if preflight else [])


def as_smoke(spec: TrainingSpec, steps: int, source: str) -> TrainingSpec:
    """``spec`` as a smoke run of ``steps`` optimizer steps (``--smoke N``), validated.

    Raises:
        ConfigError: the smoke spec breaks a rule (e.g. ``<name>-smoke`` is too long).
    """
    from jobgen.specs.load import validate
    from jobgen.specs.training import TrainingSpec

    if steps < 1:
        raise ConfigError(f"--smoke {steps}: give at least 1 step", location=source, hint="e.g. --smoke 5")
    return validate(TrainingSpec, spec.smoke_doc(steps), f"{source} (--smoke {steps})")


def plan_job(spec_path: PathLike, profile: str, *, overrides: tuple[str, ...] | list[str] = (),
             profiles_dir: PathLike | None = None, templates: PathLike | None = None, preflight: bool = False,
             smoke: int | None = None) -> JobPlan:
    """Plan ``spec_path`` on ``profile``: the files and the submit steps (pure); ``preflight``:
    as if the profile said ``preflight: true``; ``smoke``: plan a smoke run of that many
    optimizer steps instead (``jobgen submit --smoke N``).

    Raises:
        ConfigError, PlanError: bad input, or a spec that does not fit the profile.
    """
    spec, prof = load(spec_path, profile, overrides=overrides, profiles_dir=profiles_dir, preflight=preflight)
    return plan_loaded(spec, prof, spec_path, profile_source=profile, templates=templates, smoke=smoke)


def plan_loaded(spec: TrainingSpec, prof: ClusterProfile, spec_path: PathLike, *, profile_source: str,
                templates: PathLike | None = None, smoke: int | None = None) -> JobPlan:
    """:func:`plan_job` for a spec and profile already loaded (:func:`load`, without ``smoke``),
    so that a caller that needs the spec too (``jobgen submit``'s import check) reads the file
    once; ``smoke``: plan the smoke variant of ``spec`` (:func:`as_smoke`).

    Raises:
        ConfigError, PlanError: a smoke variant that breaks a rule, or a spec that does not fit the profile.
    """
    if smoke is not None:
        spec = as_smoke(spec, smoke, str(spec_path))
    return plan(spec, prof, templates_dir(templates), spec_source=str(spec_path), profile_source=profile_source,
                spec_file=str(spec_path))


def render(job_plan: JobPlan, out: PathLike = "manifests") -> list[Path]:
    """Write the plan's files under ``<out>/<profile>/<job name>/``; returns the paths written.
    (``jobgen render`` also compares, diffs and commits: :mod:`jobgen.gitops.manifests`.)"""
    return job_plan.write(Path(out) / job_plan.job_subdir)


def submit(target: PathLike | JobPlan, options: SubmitOptions | None = None, *, out: PathLike | None = None,
           echo: Echo = print) -> SubmitResult:
    """Submit a plan (written first: local runs into ``<runs dir>/<job name>``, clusters into
    ``<out>/<profile>/<job name>`` when ``out`` is given, else ``<runs dir>/<job name>/job``) or
    an already rendered job directory, as its backend does.
    When the backend refuses or fails before the job is queued or started, the plan's
    directory is put back as it was (:class:`~jobgen.jobdir.DirUndo`).
    SLURM, ssh and local: the code is snapshotted first (:mod:`jobgen.usercode.snapshot`; the repository
    holding the plan's spec file, or for a job directory the one holding the directory).

    A plan whose profile still holds example values (:attr:`JobPlan.placeholders`, the shipped
    profiles' ``placeholders:``) is refused before anything is written, unless the run only
    validates (``options.dry_run`` or ``options.test_only``).

    Raises:
        ConfigError: an option the backend does not take; a directory that is not a job
            directory; a real submit of a plan whose profile holds example values.
        SubmitError: the scheduler refused or failed.
    """
    options = options or SubmitOptions()
    if isinstance(target, JobPlan):
        backend = get_backend(target.scheduler)
        backend.check_options(options)
        if target.placeholders and not (options.dry_run or options.test_only):
            raise placeholder_error(target.profile, target.placeholders)
        job_dir = backend.job_dir(target, Path(out) if out is not None else None, options)
        before = DirUndo.capture(job_dir)
        target.write(job_dir)
        if out is None and not capabilities(target.scheduler).job_dir_is_run_dir:  # <runs dir>/<job>/job: the run directory ignores itself in git
            ignore_run_dir(job_dir.parent)
        try:
            _write_predictions(job_dir, target.cluster_profile, target.spec_file, echo, _planned_specs(target))
            return backend.submit(job_dir, options, echo, plan=target)
        except BaseException:
            before.undo_unless_submitted()  # refused before queueing: leave no job directory behind
            raise
    job_dir = Path(target)
    backend = get_backend(read_resolved_spec(job_dir).launch.scheduler)
    before = DirUndo.capture(job_dir)
    try:
        _write_predictions(job_dir, None, None, echo, None)
        return backend.submit(job_dir, options, echo)
    except BaseException:
        if not before.submitted():  # the prediction as it was: nothing else of a rendered directory is written here
            before.restore_prediction()
        raise


def _planned_specs(job_plan: JobPlan) -> dict[str, Any]:
    """The resolved specs a plan writes, by file (``spec.json``; a job array's ``points/<i>/spec.json``
    parsed from the plan's own text), so that the prediction does not read back what submit wrote."""
    from jobgen.jobdir.files import SPEC_FILE
    from jobgen.jobdir.spec import ResolvedSpec

    if job_plan.resolved is not None:
        return {SPEC_FILE: job_plan.resolved}
    return {name: ResolvedSpec.model_validate_json(text) for name, text in job_plan.files if name.endswith(f"/{SPEC_FILE}")}


def _write_predictions(job_dir: Path, profile: ClusterProfile | None, spec_file: str | None, echo: Echo,
                       resolved: dict[str, Any] | None) -> None:
    """The time model's prediction beside each spec.json of ``job_dir``
    (:func:`jobgen.planning.prediction.write_predictions`), said through ``echo``: the step time,
    the wall time to max_steps and the cost, or why there is none."""
    from jobgen.planning.prediction import describe, write_predictions

    for path in write_predictions(job_dir, profile, spec_source=spec_file or "spec", resolved_specs=resolved):
        echo(f"prediction: {describe(path)}")


def resolve(job: str | SubmittedJob) -> SubmittedJob:
    """``job`` (a handle URI or a submitted job directory) resolved once into the value
    :func:`status`, :func:`progress`, :func:`restart_budget`, :func:`logs`, :func:`first_error`
    and :func:`cancel` take: its handle, and its submission record, job directory and spec, each
    read on first use and kept (:class:`~jobgen.backends.base.SubmittedJob`). One that is resolved
    already is returned as it is.

    Raises:
        ConfigError: neither a handle nor a directory with a submission record.
    """
    return job if isinstance(job, SubmittedJob) else SubmittedJob(resolve_job(job))


def status(job: str | SubmittedJob) -> JobStatus:
    """The state of ``job``: a handle URI, a submitted job directory, or a job already resolved (:func:`resolve`)."""
    submitted = resolve(job)
    return get_backend(submitted.handle.scheduler).status(submitted)


def progress(job: str | SubmittedJob) -> Progress | None:
    """Where ``job``'s run is (:func:`jobgen.reports.progress.read_progress`): its run directory from
    the handle (local) or the submission record, its ``max_steps`` and tokens per step from
    spec.json; a Kubernetes run's (its directory is in its pods) from the last progress line of its
    rank-zero pod's log (:func:`jobgen.backends.kubernetes.progress.pod_progress`). ``None`` when this
    machine cannot read the run directory, no step is logged yet, or the pod's log cannot be read.
    ``job``: a handle URI, a submitted job directory, or a job already resolved (:func:`resolve`).

    Raises:
        SubmitError: the Kubernetes API server cannot be reached.
    """
    from jobgen.jobdir.files import SPEC_FILE
    from jobgen.reports.progress import read_progress

    submitted = resolve(job)  # the record read once, for the run directory and the spec
    handle = submitted.handle
    if not capabilities(handle.scheduler).run_dir_on_filesystem:  # Kubernetes: the run directory is in its pods
        from jobgen.backends.kubernetes.progress import pod_progress

        return pod_progress(submitted)
    try:
        record = submitted.record
    except (JobgenError, OSError, ValueError):  # a record status could read is not this function's to refuse
        record = None
    caps = capabilities(handle.scheduler)
    run_dir = Path(record.run_dir) if record is not None else Path(handle.path) if caps.job_dir_is_run_dir else None
    if run_dir is None or not caps.run_dir_on_filesystem or not run_dir.is_dir():
        return None
    resolved = submitted.resolved
    if resolved is None and (run_dir / SPEC_FILE).is_file():
        try:
            resolved = read_resolved_spec(run_dir)
        except JobgenError:
            resolved = None
    if resolved is None:
        return read_progress(run_dir, None, None)
    spec, launch = resolved.spec, resolved.launch
    t = spec.trainer
    block = None if spec.user_code else spec.model.block_size
    tokens = None if block is None else t.micro_batch_size * block * t.gradient_accumulation_steps * launch.world_size
    return read_progress(run_dir, t.max_steps, tokens)


def restart_budget(job: str | SubmittedJob) -> int | None:
    """The restart budget (``restart.max_restarts``) in the spec.json of the job directory
    ``job`` was submitted from; ``None`` when no submission record or readable job directory
    says. jobgen's launcher spends it on a local run (:mod:`jobgen.backends.local`), its watcher on
    hosts over ssh (:mod:`jobgen.backends.ssh.restart`) and the SLURM batch script on a SLURM job
    (docs/failures.md); on Kubernetes training-operator's ExitCode policy and ``jobgen.train.launch``
    do (a spec with 0 there takes the profile's ``kubernetes.backoff_limit``, which this does not read).
    ``job``: a handle URI, a submitted job directory, or a job already resolved (:func:`resolve`)."""
    resolved = resolve(job).resolved
    return None if resolved is None else resolved.spec.restart.max_restarts


def logs(job: str | SubmittedJob, options: LogOptions | None = None, echo: Echo = print) -> None:
    """Print ``job``'s output through ``echo`` (rank zero's by default); ``job`` as for :func:`status`."""
    submitted = resolve(job)
    get_backend(submitted.handle.scheduler).logs(submitted, options or LogOptions(), echo)


@dataclass(frozen=True)
class ListedJob:
    """One row of ``jobgen ls``: a recorded submission and its state refreshed from its backend.
    A SLURM job array is one row (its state by :func:`jobgen.backends.slurm.backend.array_state`, its
    tasks in :meth:`tasks`).

    Attributes:
        record: what submit recorded (handle, job dir, run dir, time).
        status: the backend's answer; ``None`` when it could not be asked (``stale`` says why).
        name: the job name (from the job directory's spec.json), if it is still readable.
        num_nodes, devices_per_node, accelerator: the world the job directory asked for, if readable.
        stale: why the state shown is only the record's (the cluster could not be reached, or
            the job directory is gone), else ``None``.
        progress: a running job's progress (:func:`progress`: step, ETA), else ``None``.
        prediction: a finished run's ``summary.json`` prediction (``measured_over_predicted``
            per figure, ``available``: :func:`jobgen.planning.prediction.ratio_of_summary`), else ``None``.
        prediction_note: why a summary's prediction cannot be shown (names the file), else ``None``.
        max_restarts: the spec's restart budget (``restart.max_restarts`` in the job directory's
            spec.json), if readable.
    """

    record: Submission
    status: JobStatus | None
    name: str | None
    num_nodes: int | None
    devices_per_node: int | None
    accelerator: str | None
    stale: str | None
    progress: Progress | None = None
    prediction: dict[str, Any] | None = None
    prediction_note: str | None = None
    max_restarts: int | None = None

    @property
    def state(self) -> str:
        """The backend's state, or ``UNREACHABLE`` when it could not be asked (never a guess)."""
        return self.status.state if self.status is not None else "UNREACHABLE"

    @property
    def restarts_used(self) -> int | None:
        """The restarts the job's records count (:func:`restarts_used`), ``None`` where none does."""
        return None if self.status is None else restarts_used(self.status.details)

    @property
    def restart_budget(self) -> int | None:
        """The budget the job's status states (``restarts_used``: ``"<n> of <budget>"``, the budget the
        backend enforces, e.g. a PyTorchJob's ``backoffLimit``), else :attr:`max_restarts`."""
        words = str(self.status.details.get("restarts_used", "")).split(" ") if self.status is not None else []
        if len(words) == 3 and words[1] == "of" and _count(words[0]) is not None and _count(words[2]) is not None:
            return _count(words[2])
        return self.max_restarts

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict with stable keys (``jobgen ls -o json``); ``restarts``: ``{"used", "max_restarts"}``
        (each ``None`` where unknown)."""
        handle = JobHandle.parse(self.record.handle)
        return {
            "handle": self.record.handle, "cluster": handle.cluster, "scheduler": handle.scheduler, "name": self.name,
            "state": self.state, "source": None if self.status is None else self.status.source,
            "num_nodes": self.num_nodes, "devices_per_node": self.devices_per_node, "accelerator": self.accelerator,
            "submitted_at": self.record.submitted_at, "job_dir": self.record.job_dir, "run_dir": self.record.run_dir,
            "usage": None if self.status is None or self.status.usage is None else self.status.usage.to_json(),
            "stale": self.stale, "restarts": {"used": self.restarts_used, "max_restarts": self.restart_budget},
            "sweep": None if self.record.sweep is None else self.record.sweep.model_dump(mode="json"),
            "progress": None if self.progress is None else self.progress.to_json(),
            "measured_over_predicted": None if self.prediction is None else self.prediction["measured_over_predicted"],
            "prediction_note": self.prediction_note,
            **({"tasks": self.tasks()} if self.record.array else {}),
        }

    def tasks(self) -> list[dict[str, Any]]:
        """A job array's tasks: handle, index, name, state (from the refreshed status; the
        record's tasks when the scheduler could not be asked: state UNREACHABLE), run dir."""
        states = {t.handle.array_task: t.state for t in self.status.tasks} if self.status is not None else {}
        return [{"handle": f"{self.record.handle}_{t.index}", "index": t.index, "name": t.name, "run_dir": t.run_dir,
                 "state": states.get(t.index, "UNREACHABLE" if self.status is None else "UNKNOWN")}
                for t in self.record.array or ()]


def restarts_used(details: Mapping[str, str]) -> int | None:
    """The restarts a job's status details count: ``restarts_used`` (exactly ``"<n> of <budget>"``: the
    restarts jobgen made in a local run or through the ssh watcher, and on Kubernetes the launch
    wrapper's ledger or the pods' restart counts), else ``restarts`` (SLURM's ``restart_cnt``: the
    job's requeues, whatever their cause); ``None`` when neither holds a count."""
    words = str(details.get("restarts_used", "")).split(" ")
    if len(words) == 3 and words[1] == "of" and _count(words[0]) is not None and _count(words[2]) is not None:
        return _count(words[0])
    return _count(str(details.get("restarts", "")))


def _count(text: str) -> int | None:
    """``text`` as a count of restarts: 1 to 6 ASCII digits (what SLURM's ``restart_cnt`` and jobgen
    write), else None."""
    return int(text) if 1 <= len(text) <= 6 and text.isascii() and text.isdigit() else None


def list_jobs(*, cluster: str | None = None, states: tuple[str, ...] = (),
              progress: Callable[[int, int, str], None] | None = None) -> list[ListedJob]:
    """Every job submitted from this machine (the state index, newest first, a sweep's jobs
    together: :func:`~jobgen.jobdir.recorded_submissions`), each refreshed from its backend
    (``status``). A backend that cannot be reached does not stop the listing:
    that job's row says UNREACHABLE and why (``stale``), never a guessed state.

    Args:
        cluster: only jobs of this SLURM cluster / Kubernetes context (``local`` for local runs).
        states: only jobs in one of these states (after the refresh; case-insensitive).
        progress: called as ``(index, total, handle)`` before each refresh.
    """
    records = [r for r in recorded_submissions() if cluster is None or JobHandle.parse(r.handle).cluster == cluster]
    wanted = {s.upper() for s in states}
    rows = []
    for index, record in enumerate(records):
        handle = JobHandle.parse(record.handle)
        if progress is not None:
            progress(index, len(records), record.handle)
        world: tuple[int | None, int | None, str | None] = (None, None, None)
        budget: int | None = None
        if record.callable is not None:  # a Python callable (submitit): no spec.json, the record has its world
            call = record.callable
            name, gone = call.name, None
            world = (call.num_nodes, call.gpus_per_node or call.tasks_per_node, "gpu" if call.gpus_per_node else "cpu")
        else:
            try:
                resolved = read_resolved_spec(Path(record.job_dir))
                name, gone = resolved.spec.name, None
                world = (resolved.launch.num_nodes, resolved.launch.devices_per_node, resolved.launch.accelerator)
                budget = resolved.spec.restart.max_restarts
                if record.array:  # a job array is one row, named after the sweep (its tasks are in status.tasks)
                    index = read_array_index(Path(record.job_dir))
                    name = index.name if index is not None else name
            except JobgenError as exc:
                name, gone = None, f"job directory unreadable: {exc.message}"
        job = SubmittedJob(handle, record)  # the record ls read, for the status and the progress
        try:
            status, stale = get_backend(handle.scheduler).status(job), gone
        except JobgenError as exc:
            status, stale = None, f"{handle.scheduler} not reachable: {exc.message}"
        row = ListedJob(record, status, name, *world, stale, *_timing(job, status), max_restarts=budget)
        if not wanted or row.state.upper() in wanted:
            rows.append(row)
    return rows


def _timing(job: SubmittedJob, status: JobStatus | None) -> tuple[Progress | None, dict[str, Any] | None, str | None]:
    """``jobgen ls``'s timing of one recorded job: a running job's progress (its ETA), or a finished run's
    measured / predicted from its ``summary.json`` (where this machine can read it) and why it
    cannot be shown; nothing for a job array (its tasks have run directories of their own)."""
    from jobgen.jobdir.files import SUMMARY_FILE
    from jobgen.planning.prediction import ratio_of_summary

    record = job.record
    if status is None or record is None or record.array or record.callable is not None:
        return None, None, None
    if status.state == "RUNNING":
        try:
            return progress(job), None, None
        except JobgenError:  # the progress is extra: a source that cannot be read leaves the row as it is
            return None, None, None
    if status.state != "COMPLETED" or not capabilities(job.handle.scheduler).run_dir_on_filesystem:
        return None, None, None
    block, note = ratio_of_summary(Path(record.run_dir) / SUMMARY_FILE)
    return None, block, note


def executor(profile: str, *, folder: PathLike | None = None, profiles_dir: PathLike | None = None, **overrides: Any) -> Any:
    """A submitit executor for Python callables, configured from the SLURM ``profile`` (partition,
    account, QoS, GPU request in the profile's style, time limit, requeue signal and grace,
    NCCL/fabric environment, modules, container): a ``submitit.SlurmExecutor`` whose jobs are
    recorded for ``jobgen ls`` / ``status`` / ``logs`` / ``cancel`` and watched through jobgen's
    SLURM status. See :mod:`jobgen.backends.slurm.submitit_executor`. On shared nodes (``exclusive=False``)
    a job asks for the CPUs and memory of the GPUs it asks for, not the whole node's
    (:func:`jobgen.backends.slurm.submitit_executor.node_share`).

        ex = api.executor("mycluster-gpu", gpus_per_node=1, time_limit_min=30)
        job = ex.submit(evaluate, "ckpt-1000")      # a submitit Job
        job.result()                                 # the function's return value

    Args:
        profile: a SLURM profile's name or path (``--profile``).
        folder: where submitit keeps each job's pickles and logs (``%j``: the job id); default
            ``runs/submitit/%j`` under the working directory; the nodes must see it.
        profiles_dir: as ``--profiles-dir``.
        overrides: :class:`jobgen.backends.slurm.submitit_executor.ExecutorOptions` (``nodes``,
            ``tasks_per_node``, ``gpus_per_node``, ``cpus_per_task``, ``mem_gib``,
            ``time_limit_min``, ``partition``, ``account``, ``qos``, ``constraint``,
            ``exclusive``, ``signal_target``, ``name``, ``max_num_timeout``, ``python``).

    Raises:
        ConfigError: a bad profile or override (unknown keys with did-you-mean), a non-SLURM
            profile, submitit not installed (``pip install 'jobgen[submitit]'``).
        SubmitError: no SLURM client tools here; later, from ``submit``: sbatch refused.

    Later, ``submit`` raises ConfigError, before sbatch, while the profile holds example
    values (``placeholders:``) that no override replaced, as ``jobgen submit`` does.
    """
    from jobgen.backends.slurm.submitit_executor import make_executor  # submitit is an optional extra: only here

    return make_executor(load_profile(profile, profiles_dir), overrides, profile_source=profile,
                         folder=Path(folder) if folder is not None else None)


def first_error(job: str | SubmittedJob) -> Triage:
    """Every rank's (or pod's) first failure in ``job``'s output, earliest first
    (:mod:`jobgen.reports.triage`); ``.first`` is the one that explains the failure. ``job`` as for :func:`status`."""
    submitted = resolve(job)
    return get_backend(submitted.handle.scheduler).first_error(submitted)


def cancel(job: str | SubmittedJob, *, wait_s: float = 120.0, echo: Echo = print) -> JobStatus:
    """Cancel ``job`` (as for :func:`status`) and wait up to ``wait_s`` seconds until every rank has stopped."""
    submitted = resolve(job)
    return get_backend(submitted.handle.scheduler).cancel(submitted, wait_s=wait_s, out=echo)
