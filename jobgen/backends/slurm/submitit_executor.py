"""Python callables on a SLURM profile through submitit (``jobgen.api.executor``).

A rendered job is a reviewed ``job.sbatch`` that launches jobgen's entrypoint; a function from a
notebook or an evaluation sweep is not. For those, submitit (facebookincubator/submitit, tested
with 1.5.4) pickles the call, writes its own sbatch script and brings the result back
(``job.result()``). This module configures submitit's ``SlurmExecutor`` from a resolved
:class:`~jobgen.specs.profile.ClusterProfile`, so the callable runs under the same site rules as a
rendered job, each taken from where the batch script takes it:

- GPU request in the profile's style: :func:`jobgen.backends.slurm.script.gpu_directives`;
  partition, account, QoS, constraint, ``--exclusive``, ``--requeue`` and the signal:
  :func:`~jobgen.backends.slurm.script.site_directives`; ``--mem``:
  :func:`~jobgen.backends.slurm.script.format_mem`; the profile's ``extra_sbatch_args`` (a
  ``--clusters`` among them too);
- environment: the fabric's NCCL preset and the profile's ``env``
  (:func:`jobgen.backends.base.profile_env`), ``module load`` of the profile's modules,
  ``OMP_NUM_THREADS`` = CPUs per task;
- container: pyxis flags on submitit's ``srun``
  (:func:`~jobgen.backends.slurm.script.container_srun_options`), or the interpreter inside
  ``apptainer exec`` (:func:`~jobgen.backends.slurm.script.container_wrap`).

**The requeue signal.** submitit catches ``SIG$SUBMITIT_PREEMPT_SIGNAL`` (default USR2) in the
task that runs the callable: task 0 checkpoints a ``submitit.helpers.Checkpointable`` callable,
runs ``scontrol requeue`` and exits; the requeued job calls the checkpointed object again
(submitit/core/job_environment.py, ``SignalHandler``). It reads that variable when submitit is
imported, in the job as well as in the notebook, so jobgen writes ``--signal=<SIG>@<grace>``
itself from the profile (``requeue_signal``, ``signal_grace_s``) and exports
``SUBMITIT_PREEMPT_SIGNAL=<SIG>`` in the script before ``srun`` starts the task. The signal
must reach the task: ``signal_target: batch`` (``B:``, only the batch shell) is refused,
because submitit's script runs ``srun`` in the foreground and cannot pass it on.

**Status.** submitit's own watcher asks only ``sacct``, which says nothing on clusters without
slurmdbd; the jobs this executor returns are watched through
:meth:`jobgen.backends.slurm.backend.SlurmBackend.status` instead (squeue, accounting, the job-completion log), so
``job.done()`` / ``job.state`` see a job that ended without a result. Every submission is
recorded like a rendered job's (:class:`jobgen.jobdir.Submission`, marked by
:class:`~jobgen.jobdir.CallableJob`), so ``jobgen ls``, ``status``, ``logs`` and ``cancel``
know it.

submitit is an optional extra (``pip install 'jobgen[submitit]'``) and is imported only when an
executor is made (:func:`make_executor`): never on the render path. :func:`plan_executor` is
pure and needs no submitit.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from jobgen.backends.base import SubmittedJob, profile_env
from jobgen.backends.slurm.backend import SlurmBackend
from jobgen.backends.slurm.script import container_srun_options, container_wrap, format_mem, gpu_directives, site_directives
from jobgen.errors import ConfigError, JobgenError, NotSupportedError, SubmitError, did_you_mean, json_path
from jobgen.jobdir.files import new_dirs
from jobgen.jobdir.submission import ArrayTask, CallableJob, JobHandle, Submission
from jobgen.specs.base import check_shell_safe
from jobgen.specs.profile import ClusterProfile, Placeholder, SlurmSettings, example_values, placeholder_error

#: submitit's variable naming the signal its handler catches (submitit/core/job_environment.py).
PREEMPT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"
#: Where submitit's files go when ``folder`` is not given: one folder per job under the runs
#: directory (relative to the working directory; it must be shared with the compute nodes).
DEFAULT_FOLDER = Path("runs") / "submitit" / "%j"
#: The overrides that change a profile field (``slurm.<key>``); validated by :class:`SlurmSettings`.
SITE_KEYS = ("partition", "account", "qos", "constraint", "exclusive", "signal_target")


class ExecutorOptions(BaseModel):
    """What ``jobgen.api.executor(profile, **overrides)`` takes as ``overrides`` (all optional;
    unset: from the profile). Units are in the names, as in profiles and specs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="submitit", min_length=1, description="Job name (``--job-name``).")
    nodes: int = Field(default=1, ge=1, description="Nodes (``--nodes``); at most the profile's ``max_nodes``.")
    tasks_per_node: int = Field(default=1, ge=1, description="Tasks per node (``--ntasks-per-node``): the callable runs once in each.")
    gpus_per_node: int | None = Field(default=None, ge=0, description="GPUs per node; ``None``: the profile's ``gpus_per_node``.")
    cpus_per_task: int | None = Field(default=None, ge=1, description=(
        "CPUs per task; ``None``: the profile's ``cpus_per_node`` / tasks per node (on shared nodes, the GPUs' share: :func:`node_share`)."))
    mem_gib: float | None = Field(default=None, gt=0, description=(
        "Memory per node in GiB; ``None``: the profile's ``mem_gib_per_node`` (on shared nodes, the GPUs' share: :func:`node_share`)."))
    time_limit_min: int | None = Field(default=None, ge=1, description="Wall-clock limit in minutes; ``None``: the profile's ``slurm.time_limit_min``.")
    partition: str | None = Field(default=None, description="``slurm.partition`` for this executor.")
    account: str | None = Field(default=None, description="``slurm.account`` for this executor.")
    qos: str | None = Field(default=None, description="``slurm.qos`` for this executor.")
    constraint: str | None = Field(default=None, description="``slurm.constraint`` for this executor.")
    exclusive: bool | None = Field(default=None, description="``slurm.exclusive`` for this executor.")
    signal_target: Literal["tasks", "batch"] | None = Field(default=None, description=(
        "``slurm.signal_target`` for this executor; submitit needs ``tasks``."))
    max_num_timeout: int = Field(default=3, ge=0, description=(
        "How many times submitit requeues a Checkpointable callable that reached its time limit."))
    python: str | None = Field(default=None, description=(
        "Interpreter on the nodes; ``None``: this one (``sys.executable``), or the profile's ``slurm.python`` in a container."))

    @field_validator("name", "python")
    @classmethod
    def _safe(cls, value: str | None) -> str | None:
        return None if value is None else check_shell_safe(value)


@dataclass(frozen=True)
class ExecutorPlan:
    """A submitit ``SlurmExecutor``'s configuration, planned from a profile (pure).

    Attributes:
        profile: the profile's name.
        cluster: the cluster part of the job handles (``slurm.cluster``).
        parameters: ``SlurmExecutor.update_parameters`` keyword arguments (submitit's names).
        directives: the ``#SBATCH`` options jobgen derived, ``(option, value)``, value None for a
            flag; passed as submitit's ``additional_parameters`` (the GPU request, ``--mem``, site
            options, signal, the profile's extra sbatch arguments).
        python: the shell text submitit runs the callable with.
        max_num_timeout: submitit's requeue budget for time-outs.
        nodes, tasks_per_node, gpus_per_node: the world asked for.
        clusters: the one cluster the profile's ``extra_sbatch_args`` name with ``--clusters``
            (sbatch's answer names it too; job arrays are recorded with this one), else None.
        placeholders: the profile's example values that no override replaced
            (:func:`jobgen.specs.profile.example_values`): submitting refuses them, as
            ``jobgen submit`` does; making the executor takes them.
    """

    profile: str
    cluster: str
    parameters: Mapping[str, Any]
    directives: tuple[tuple[str, str | None], ...]
    python: str
    max_num_timeout: int
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    clusters: str | None = None
    placeholders: tuple[tuple[str, str, Placeholder], ...] = ()


#: The executor's overrides that replace a profile field (and so that field's example value).
_OVERRIDDEN_FIELDS = {"partition": "slurm.partition", "account": "slurm.account", "qos": "slurm.qos",
                      "constraint": "slurm.constraint", "python": "slurm.python"}


def check_options(overrides: Mapping[str, Any]) -> ExecutorOptions:
    """``overrides`` validated as :class:`ExecutorOptions`.

    Raises:
        ConfigError: an unknown key (with did-you-mean and the valid keys) or a bad value.
    """
    try:
        return ExecutorOptions.model_validate(dict(overrides))
    except ValidationError as exc:
        valid = sorted(ExecutorOptions.model_fields)
        lines, hint = [], f"valid overrides: {', '.join(valid)}"
        for err in exc.errors(include_url=False):
            key = json_path(tuple(err["loc"]))
            if err["type"] == "extra_forbidden":
                suggestion = did_you_mean(key, valid)
                lines.append(f"{key}: unknown executor override" + (f" ({suggestion})" if suggestion else ""))
            else:
                lines.append(f"{key}={err.get('input')!r}: {err['msg']}")
        raise ConfigError("; ".join(lines), location="jobgen.api.executor(**overrides)", hint=hint) from None


def _settings(s: SlurmSettings, options: ExecutorOptions, where: str) -> SlurmSettings:
    """The profile's SLURM settings with the site overrides applied, validated as the profile's are."""
    update = {key: getattr(options, key) for key in SITE_KEYS if getattr(options, key) is not None}
    if not update:
        return s
    try:
        return SlurmSettings.model_validate({**s.model_dump(), **update})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise ConfigError(f"{json_path(tuple(err['loc']))}: {err['msg']}", location=where,
                          hint="the override must be valid as the profile's `slurm.` field of that name") from None


def _extra_sbatch(args: Sequence[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for arg in args:
        option, eq, value = arg[2:].partition("=")
        out.append((option, value if eq else None))
    return out


def plan_executor(profile: ClusterProfile, overrides: Mapping[str, Any], *, profile_source: str) -> ExecutorPlan:
    """Plan a submitit ``SlurmExecutor`` for ``profile`` with ``overrides`` (:class:`ExecutorOptions`):
    no I/O, no submitit import.

    Defaults: 1 node, 1 task per node (a callable runs once per task), the profile's GPUs,
    CPUs and memory per node, its time limit. On shared nodes (``slurm.exclusive: false``, or
    the ``exclusive=False`` override) a job of fewer GPUs than a node has asks for the CPUs and
    memory of those GPUs only (:func:`node_share`). Rules (those of a rendered job where they apply,
    :func:`jobgen.backends.slurm.script.check_site`): nodes <= ``max_nodes``; GPUs per node <=
    the profile's; the time limit <= ``max_time_limit_min`` and longer than ``signal_grace_s``
    (SLURM would signal before the callable starts); the signal goes to the tasks (submitit's
    handler runs there).

    Raises:
        ConfigError: not a SLURM profile; a bad override; a value beyond the profile's limits;
            ``signal_target: batch``.
        PlanError: a GPU count the tasks cannot share (``gpu_request_style: gpus-per-task``).
    """
    where = "jobgen.api.executor(**overrides)"
    if profile.scheduler != "slurm":
        raise ConfigError(f"profile {profile.name!r} schedules with {profile.scheduler}; a submitit executor runs on SLURM",
                          location=f"{profile_source}: scheduler", hint="pick a SLURM profile (`jobgen profiles list`)")
    options = check_options(overrides)
    s = _settings(profile.slurm_settings, options, where)
    if options.nodes > profile.max_nodes:
        raise ConfigError(f"nodes={options.nodes}, but profile {profile.name!r} allows at most {profile.max_nodes} (max_nodes)",
                          location=where, hint=f"ask for at most {profile.max_nodes} nodes")
    gpus = profile.gpus_per_node if options.gpus_per_node is None else options.gpus_per_node
    if gpus > profile.gpus_per_node:
        raise ConfigError(f"gpus_per_node={gpus}, but a node of profile {profile.name!r} has {profile.gpus_per_node} GPU(s)",
                          location=where, hint=f"ask for at most {profile.gpus_per_node}")
    node_cpus, node_mem_gib = node_share(profile, gpus, exclusive=s.exclusive)
    cpus = options.cpus_per_task or max(1, node_cpus // options.tasks_per_node)
    if cpus * options.tasks_per_node > profile.cpus_per_node:
        raise ConfigError(f"{options.tasks_per_node} task(s) x {cpus} CPU(s) per node, but a node of profile {profile.name!r} "
                          f"has {profile.cpus_per_node} CPU(s)", location=where, hint="lower cpus_per_task or tasks_per_node")
    minutes = options.time_limit_min or s.time_limit_min
    if s.max_time_limit_min is not None and minutes > s.max_time_limit_min:
        raise ConfigError(f"time_limit_min={minutes}, but partition {s.partition or '(default)'} of profile {profile.name!r} "
                          f"allows {s.max_time_limit_min} min (`slurm.max_time_limit_min`)", location=where,
                          hint=f"ask for at most {s.max_time_limit_min} min; a Checkpointable callable is requeued and resumes")
    if s.signal_grace_s >= minutes * 60:
        raise ConfigError(f"time_limit_min={minutes} ({minutes * 60} s), but the profile's `slurm.signal_grace_s` is "
                          f"{s.signal_grace_s}: SIG{s.requeue_signal} would arrive before the callable starts",
                          location=where, hint=f"ask for more than {s.signal_grace_s // 60 + 1} min")
    if s.signal_target == "batch":
        raise ConfigError(
            f"profile {profile.name!r} sends the requeue signal to the batch shell only (`slurm.signal_target: batch`, "
            f"--signal=B:{s.requeue_signal}@{s.signal_grace_s}); submitit catches it in the task that runs the callable, and "
            "its batch script runs srun in the foreground, so it cannot pass the signal on",
            location=f"{profile_source}: slurm.signal_target",
            hint="pass signal_target='tasks' where SLURM's signals reach job steps (--signal=SIG@T)")
    directives = [*gpu_directives(s, gpus_per_node=gpus, tasks_per_node=options.tasks_per_node, nodes=options.nodes),
                  ("mem", format_mem(options.mem_gib or node_mem_gib)), *site_directives(s)]
    if not s.requeue:  # submitit writes a signal of its own otherwise (USR2@90)
        directives.append(("signal", f"{s.requeue_signal}@{s.signal_grace_s}"))
    directives += _extra_sbatch(s.extra_sbatch_args)
    setup = []
    if s.modules:
        setup += ["module purge", *(f"module load {shlex.quote(m)}" for m in s.modules)]
    env = {**profile_env(profile, uses_nccl=gpus > 0), "OMP_NUM_THREADS": str(cpus), PREEMPT_SIGNAL_ENV: s.requeue_signal}
    setup += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    python = options.python or (s.python if s.container.runtime != "none" else sys.executable)
    parameters = {
        "job_name": options.name, "nodes": options.nodes, "ntasks_per_node": options.tasks_per_node, "cpus_per_task": cpus,
        "time": minutes, "signal_delay_s": s.signal_grace_s, "setup": setup, "srun_args": [*container_srun_options(s), *s.extra_srun_args],
        "additional_parameters": {option: True if value is None else value for option, value in directives},
    }
    clusters = dict(directives).get("clusters")
    replaced = {path for option, path in _OVERRIDDEN_FIELDS.items() if getattr(options, option) is not None}
    return ExecutorPlan(profile.name, s.cluster, parameters, tuple(directives), shlex.join(container_wrap(s, [python])),
                        options.max_num_timeout, options.nodes, options.tasks_per_node, gpus,
                        clusters if clusters and "," not in clusters else None,
                        tuple(item for item in example_values(profile) if item[0] not in replaced))


def node_share(profile: ClusterProfile, gpus: int, *, exclusive: bool) -> tuple[int, float]:
    """``(CPUs, GiB of memory)`` per node a job of ``gpus`` GPUs per node asks for by default.

    An exclusive node (``slurm.exclusive: true``), a CPU profile, or a job of every GPU of the
    node: the whole node (``cpus_per_node``, ``mem_gib_per_node``). On a shared GPU node, the
    share of the GPUs asked for: ``cpus_per_node x g / gpus_per_node`` CPUs (rounded down, at
    least 1) and ``mem_gib_per_node x g / gpus_per_node`` GiB (``--mem`` rounds it down to whole
    MiB, :func:`~jobgen.backends.slurm.script.format_mem`), where ``g`` is ``gpus``, or 1 for a
    job of no GPU (one GPU's share). On ``slurm-a100`` (8 GPUs, 128 CPUs, 960 GiB) one GPU gets
    16 CPUs and 120 GiB. This is the rule SLURM's own per-GPU defaults express, ``DefCpuPerGPU``
    and ``DefMemPerGPU`` (slurm.conf(5)), which sites set to a node's CPUs and memory over its
    GPUs so that the GPUs of a shared node can all be handed out; a job asking for the whole
    node's CPUs and memory for one GPU would keep its other GPUs idle.
    """
    if exclusive or profile.gpus_per_node == 0 or gpus >= profile.gpus_per_node:
        return profile.cpus_per_node, profile.mem_gib_per_node
    share = max(gpus, 1)
    return max(1, profile.cpus_per_node * share // profile.gpus_per_node), profile.mem_gib_per_node * share / profile.gpus_per_node


#: The files submitit writes into its folder before sbatch answers (``<uuid>.pkl``: the pickled
#: call; ``.submission_file_<uuid>.sh``: the script); it moves them into the job's folder once
#: sbatch gave a job id (submitit/core/core.py ``_internal_process_submissions``, ``_submit_command``).
_PENDING_FILE = re.compile(r"(?:[0-9a-f]{32}\.pkl|\.submission_file_[0-9a-f]{32}\.sh)")


def _pending_files(folder: Path) -> set[Path]:
    """submitit's files in ``folder`` not yet moved to a job's folder (:data:`_PENDING_FILE`)."""
    try:
        return {p for p in folder.iterdir() if _PENDING_FILE.fullmatch(p.name)}
    except OSError:
        return set()


def _discard_pending(folder: Path, before: set[Path], created: list[Path]) -> None:
    """Remove what a refused submission left: the pending files that were not in ``folder``
    ``before`` it, and the directories it ``created`` (deepest first) once empty."""
    for path in sorted(_pending_files(folder) - before):
        path.unlink(missing_ok=True)
    for path in created:
        with contextlib.suppress(OSError):  # not empty (another submission's files): kept
            path.rmdir()


def callable_name(fn: Any) -> str:
    """``<module>.<qualname>`` of a submitted callable: a function's own, a ``functools.partial``'s
    function's, a callable object's class's (a ``submitit.helpers.Checkpointable`` instance)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', None) or '?'}.{target.__qualname__}"


def submission_records(plan: ExecutorPlan, folder: Path, job_ids: Sequence[str], function: str, *,
                       slurm_cluster: str | None) -> Submission:
    """The submission record of one sbatch call: one job (``job_ids == [N]``) or a job array
    (``[N_0, N_1, ...]``, submitit's ``map_array``), in submitit's ``folder`` (``%j`` expanded per
    job). The record's ``job_dir`` is the folder of ``N`` (where submitit keeps the sbatch script;
    an array's tasks each have their own folder, ``N_<i>``). Nothing is written."""
    from submitit.core.utils import JobPaths

    array_id, _, task = job_ids[0].partition("_")
    own = JobPaths(folder, job_id=array_id, task_id=0)
    handle = JobHandle("slurm", f"{slurm_cluster or plan.cluster}/{array_id}")
    tasks = None
    if task:
        short = function.rpartition(".")[2]
        paths = [(int(jid.partition("_")[2]), JobPaths(folder, job_id=jid, task_id=0)) for jid in job_ids]
        tasks = tuple(ArrayTask(index=i, name=f"{short}_{i}", run_dir=str(p.folder), log_file=str(p.stdout)) for i, p in paths)
    marker = CallableJob(function=function, profile=plan.profile, num_nodes=plan.nodes, tasks_per_node=plan.tasks_per_node,
                         gpus_per_node=plan.gpus_per_node)
    return Submission.now(handle=str(handle), job_dir=str(own.folder), run_dir=str(own.folder),
                          log_file=None if tasks else str(own.stdout), argv=("sbatch", str(own.submission_file)),
                          slurm_cluster=slurm_cluster, array=tasks, callable=marker)


def task_handles(record: Submission) -> dict[str, JobHandle]:
    """submitit job id -> jobgen handle for every job of ``record`` (the array's tasks one by one)."""
    handle = JobHandle.parse(record.handle)
    if not record.array:
        return {handle.path.rpartition("/")[2]: handle}
    return {f"{handle.path.rpartition('/')[2]}_{t.index}": JobHandle("slurm", f"{handle.path}_{t.index}") for t in record.array}


@functools.cache
def _executor_class() -> type:
    """submitit's ``SlurmExecutor`` with jobgen's record and watcher (built on first use: submitit
    is imported here, never at module import)."""
    from submitit.core import logger as submitit_logger
    from submitit.core import utils as submitit_utils
    from submitit.slurm import slurm as submitit_slurm

    class JobgenWatcher(submitit_slurm.SlurmInfoWatcher):
        """submitit's watcher with jobgen's SLURM status (squeue, accounting, job-completion log)
        instead of ``sacct`` alone."""

        def __init__(self, delay_s: int) -> None:
            super().__init__(delay_s=delay_s)
            self.submitted: dict[str, SubmittedJob] = {}

        def update(self) -> None:
            pending = sorted(self._registered - self._finished)
            if not pending:
                return
            self._num_calls += 1
            for jid in pending:
                job = self.submitted.get(jid) or SubmittedJob(JobHandle("slurm", f"default/{jid}"))
                try:
                    state = SlurmBackend().status(job).state
                except JobgenError as exc:  # as submitit does with a failed sacct: the state stays what it was
                    submitit_logger.get_logger().warning(f"jobgen status {job.handle}: {exc.message}")
                    continue
                self._info_dict[jid] = {"JobID": jid, "State": state}
            self._last_status_check = time.time()
            for jid in pending:
                if self.is_done(jid, mode="cache"):
                    self._finished.add(jid)

    class JobgenSlurmJob(submitit_slurm.SlurmJob):
        """A submitit SLURM job watched through jobgen's status."""

        watcher = JobgenWatcher(delay_s=60)

    class JobgenSlurmExecutor(submitit_slurm.SlurmExecutor):
        """submitit's ``SlurmExecutor`` configured from a jobgen profile; every submission is
        recorded for ``jobgen ls`` / ``status`` / ``logs`` / ``cancel``."""

        job_class = JobgenSlurmJob

        def __init__(self, folder: Path, plan: ExecutorPlan) -> None:
            try:
                super().__init__(folder, max_num_timeout=plan.max_num_timeout, python=plan.python)
            except RuntimeError as exc:  # 'Could not detect "srun", are you indeed on a slurm cluster?'
                raise SubmitError(f"submitit cannot submit from here: {exc}",
                                  hint="make the executor where SLURM's client tools are installed (a login node), or add srun to PATH") from None
            self.jobgen_plan = plan
            self._submitted_to: str | None = None
            try:
                self.update_parameters(**plan.parameters)
            except ValueError as exc:
                raise ConfigError(f"submitit refused the parameters planned from profile {plan.profile!r}: {exc}",
                                  hint="check the profile's slurm section (extra_sbatch_args) against `jobgen profiles show`") from None

        def _get_job_id_from_submission_command(self, string: bytes | str) -> str:  # type: ignore[override]
            text = string.decode() if isinstance(string, bytes) else string
            found = re.search(r"\bon cluster ([A-Za-z0-9_.-]+)", text)  # sbatch -M/--clusters: "... job N on cluster X"
            self._submitted_to = found.group(1) if found else None
            return super()._get_job_id_from_submission_command(text)

        def _internal_process_submissions(self, delayed_submissions: list[Any]) -> list[Any]:
            if self.jobgen_plan.placeholders:
                raise placeholder_error(self.jobgen_plan.profile, self.jobgen_plan.placeholders)
            if len(delayed_submissions) > 1 and self.python != shlex.quote(sys.executable):
                # submitit's job arrays run with a fresh SlurmExecutor and the default interpreter
                raise NotSupportedError(
                    f"a job array (map_array, batch) of profile {self.jobgen_plan.profile!r} would not run with {self.python}: "
                    "submitit starts arrays with this Python interpreter",
                    hint="submit the calls one at a time (executor.submit), or drop the python= override")
            self._submitted_to = None
            folder = submitit_utils.JobPaths.get_first_id_independent_folder(self.folder)
            before, created = _pending_files(folder), new_dirs(folder)
            # submitit prints sbatch's stderr when sbatch fails, then raises with the same text: the
            # SubmitError below carries it, so it is held here and shown only when sbatch succeeded
            held = io.StringIO()
            try:
                with contextlib.redirect_stderr(held):
                    jobs = super()._internal_process_submissions(delayed_submissions)
            except (submitit_utils.FailedJobError, submitit_utils.FailedSubmissionError) as exc:
                _discard_pending(folder, before, created)
                raise SubmitError(f"sbatch did not take the callable's job: {str(exc).strip()}",
                                  hint="the parameters come from the profile and the executor's overrides: check them against "
                                       "the message (`jobgen profiles show <profile>`)") from None
            except BaseException:
                _discard_pending(folder, before, created)
                sys.stderr.write(held.getvalue())
                raise
            sys.stderr.write(held.getvalue())
            if len(delayed_submissions) > 1:  # arrays come back as plain SlurmJobs: watch them through jobgen too
                jobs = [JobgenSlurmJob(folder=self.folder, job_id=j.job_id, tasks=j._tasks) for j in jobs]
            record = submission_records(self.jobgen_plan, self.folder, [j.job_id for j in jobs],
                                        callable_name(delayed_submissions[0].function),
                                        slurm_cluster=self._submitted_to or self.jobgen_plan.clusters)
            record.save()
            JobgenSlurmJob.watcher.submitted.update({jid: SubmittedJob(handle, record) for jid, handle in task_handles(record).items()})
            return jobs

    return JobgenSlurmExecutor


def make_executor(profile: ClusterProfile, overrides: Mapping[str, Any], *, profile_source: str, folder: Path | None = None) -> Any:
    """A submitit ``SlurmExecutor`` (a subclass: records and watches through jobgen) configured by
    :func:`plan_executor`; its files go to ``folder`` (``%j``: the job id; default
    :data:`DEFAULT_FOLDER`; it must be on a filesystem the nodes share).

    Raises:
        ConfigError: submitit is not installed; see also :func:`plan_executor`.
        SubmitError: no ``srun`` here (submitit's check). Submitting later raises SubmitError when
            sbatch refuses, NotSupportedError for a job array with another interpreter.
    """
    plan = plan_executor(profile, overrides, profile_source=profile_source)
    try:
        cls = _executor_class()
    except ImportError:
        raise ConfigError("jobgen.api.executor needs submitit, which is not installed",
                          hint="pip install 'jobgen[submitit]'") from None
    return cls(Path(folder) if folder is not None else DEFAULT_FOLDER, plan)
