"""What every backend shares: the :class:`Backend` interface, options and results, job
status, the scheduler-command runner, and the files every job directory gets."""

from __future__ import annotations

import os
import re
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen import __version__
from jobgen.errors import ConfigError, JobgenError, NotSupportedError, SubmitError
from jobgen.jobdir.files import CODE_DIR_ENV, DS_CONFIG_FILE, SPEC_FILE, SPEC_SOURCE_ENV, SUBMIT_JOB_SUBDIR, DirUndo, ignore_run_dir
from jobgen.jobdir.runs import check_run_dir, ensure_tracking_record
from jobgen.jobdir.spec import LaunchSpec, ResolvedSpec, read_resolved_spec
from jobgen.jobdir.submission import JobHandle, Submission, find_submission
from jobgen.planning.environment import check_present
from jobgen.planning.nccl import nccl_env
from jobgen.planning.plan import JobPlan, PlanContext
from jobgen.planning.render import render_template
from jobgen.reports.failure_class import Classification, Evidence, classify, unclassified
from jobgen.reports.usage import Usage

if TYPE_CHECKING:
    from jobgen.jobdir.world import World
    from jobgen.reports.triage import Triage
    from jobgen.specs.profile import ClusterProfile, SshSettings
    from jobgen.usercode.snapshot import TakenSnapshot

Echo = Callable[[str], None]


@dataclass(frozen=True)
class SubmitOptions:
    """How to submit. Each backend names the options it takes in ``Backend.submit_options``;
    a set option the backend does not take is refused (:meth:`Backend.check_options`).

    Attributes:
        runs_dir: where run directories go (``<runs_dir>/<job name>``; SLURM: must be shared
            by the nodes). Local and SLURM.
        test_only: SLURM: ``sbatch --test-only`` (validate, estimate a start, queue nothing).
        force: SLURM: submit although the same job directory has a job pending or running.
        dry_run: Kubernetes: server-side dry run of every object; nothing is created.
        replace: Kubernetes: delete a job of the same name with other inputs and create this one.
        context: Kubernetes: kubeconfig context.
        namespace: Kubernetes: namespace (default: the manifest's).
        kubeconfig: Kubernetes: kubeconfig file.
        allow_dirty: SLURM and local: snapshot the code although its git work tree has
            uncommitted changes; the changed files are copied over the committed tree and their
            ``git diff`` and its sha256 recorded (:mod:`jobgen.usercode.snapshot`).
    """

    runs_dir: Path = Path("runs")
    test_only: bool = False
    force: bool = False
    dry_run: bool = False
    replace: bool = False
    context: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    allow_dirty: bool = False


#: option attribute -> how the CLI spells it (for errors).
OPTION_FLAGS = {"test_only": "--test-only", "force": "--force", "dry_run": "--dry-run", "replace": "--replace",
                "context": "--context", "namespace": "--namespace", "kubeconfig": "--kubeconfig",
                "rank": "--rank", "replica": "--replica", "allow_dirty": "--allow-dirty"}


#: option -> what the other scheduler calls the same idea (validate only; overwrite; pick a process).
OPTION_COUNTERPARTS = {"test_only": "--dry-run=server", "dry_run": "--test-only", "force": "--replace", "replace": "--force",
                       "rank": "--replica", "replica": "--rank"}


@dataclass(frozen=True)
class LogOptions:
    """Which output to show: ``follow`` until the job ends; SLURM: ``rank`` (a global rank
    number or ``all``); Kubernetes: ``replica`` (``master-0``, ``worker-N``, ``node-N``)."""

    follow: bool = False
    rank: str | None = None
    replica: str | None = None


@dataclass(frozen=True)
class SubmitResult:
    """What :meth:`Backend.submit` did.

    Attributes:
        action: ``submitted`` (queued), ``created`` / ``replaced`` / ``unchanged``
            (Kubernetes), ``validated`` (a test-only or dry run: nothing queued) or
            ``completed`` (a local run that finished).
        handle: the job (None when nothing was queued).
        record: the submission record written (None when nothing was queued).
        lines: what the scheduler said (test-only / dry-run answers).
    """

    action: str
    handle: JobHandle | None
    record: Submission | None = None
    lines: tuple[str, ...] = ()


@dataclass
class PendingSubmit:
    """One submission on its way through :meth:`Backend.submit`: what its steps hand each other.
    A backend that needs more for its launch subclasses it.

    Attributes:
        job_dir: the rendered job directory (absolute).
        options: how to submit.
        out: where progress lines go.
        plan: the plan just written into ``job_dir`` (``jobgen submit SPEC``), or None (a rendered
            directory submitted as is).
        resolved: the job's resolved spec (the plan's, else the directory's spec.json).
        spec_file: the user's spec file the job was planned from (named in errors; the code
            snapshot's repository holds it), or None.
        environ: the environment the launch runs in: this process's, plus what the backend adds;
            :meth:`Backend.environment` then adds the snapshot's.
        run_dir: where the code snapshot is taken (``<run dir>/code/<id>/``); None: no snapshot.
        runs: each run the job trains on this machine's filesystem and its run directory, claimed
            before the launch (:func:`~jobgen.jobdir.check_run_dir`); a SLURM job array has one per task.
        run_dirs: every local directory the submit writes into: each is put back as it was when the
            submit fails before the launch queued or started the job (:class:`~jobgen.jobdir.files.DirUndo`).
        code: the snapshot, once taken.
        launched: set by :meth:`Backend.launch` once the job is queued or started; from then on a
            failure undoes nothing.
    """

    job_dir: Path
    options: SubmitOptions
    out: Echo
    plan: JobPlan | None
    resolved: ResolvedSpec
    spec_file: Path | None = None
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    run_dir: Path | None = None
    runs: tuple[tuple[ResolvedSpec, Path], ...] = ()
    run_dirs: tuple[Path, ...] = ()
    code: TakenSnapshot | None = None
    launched: bool = False


def plan_spec_file(plan: JobPlan | None) -> Path | None:
    """The spec file ``plan`` was planned from, or None (no plan, or a spec not read from a file)."""
    return Path(plan.spec_file) if plan is not None and plan.spec_file else None


class Backend(ABC):
    """A scheduler backend: the same five operations for local, SLURM, Kubernetes and ssh.

    ``plan`` is pure; ``submit`` consumes a written job directory (what is committed is what
    runs) and never changes it beyond the submission record; ``status``/``logs``/``cancel``/``first_error``
    take the job ``submit`` returned, resolved once (:class:`SubmittedJob`).
    """

    #: Scheduler name (the profile's ``scheduler``; key of :data:`jobgen.backends.BACKENDS`).
    name: str = ""
    #: Templates the plan renders (their hashes are planning inputs).
    templates: tuple[str, ...] = ()
    #: :class:`SubmitOptions` fields this backend takes besides ``runs_dir``.
    submit_options: frozenset[str] = frozenset()
    #: :class:`LogOptions` fields this backend takes besides ``follow``.
    log_options: frozenset[str] = frozenset()

    def templates_for(self, world: World) -> tuple[str, ...]:
        """The templates a plan for ``world`` may render (their hashes are planning inputs):
        :attr:`templates`, unless a backend renders some only for some worlds."""
        return self.templates

    @abstractmethod
    def plan(self, ctx: PlanContext) -> JobPlan:
        """Turn validated inputs into a JobPlan. Pure: no subprocess, network, clock."""

    def job_dir(self, plan: JobPlan, out: Path | None, options: SubmitOptions) -> Path:
        """Where ``jobgen submit SPEC`` writes the plan before submitting: ``<out>/<profile>/<job name>``
        when the user names an output root (``--out manifests`` for GitOps), else with the run,
        ``<runs dir>/<job name>/``:data:`~jobgen.jobdir.SUBMIT_JOB_SUBDIR` (a user's manifests/ is
        touched only when asked; the run directory ignores itself in git)."""
        if out is not None:
            return out / plan.job_subdir
        return options.runs_dir / plan.job_name / SUBMIT_JOB_SUBDIR

    def submit(self, job_dir: Path, options: SubmitOptions, out: Echo = print, *, plan: JobPlan | None = None) -> SubmitResult:
        """Submit the rendered job directory ``job_dir`` with the steps its plan lists.

        ``options``: how (:class:`SubmitOptions`; one this backend does not take is refused,
        :meth:`check_options`). ``plan``: the plan just written into ``job_dir`` (``jobgen submit
        SPEC``): its resolved spec and spec file are used as they are, nothing is read back from
        the directory; None for a rendered directory submitted as is (its spec.json is read).
        ``out`` gets the progress lines.

        Every backend submits through the same steps, in this order: :meth:`begin_submit` reads
        the job and checks what can be checked before anything is written (the spec's secrets,
        the run directories, a job of the same directory still running); :meth:`prepare_run_dirs`
        creates and claims the run directories; the code is snapshotted into the run directory
        (:func:`jobgen.usercode.snapshot.snapshot_for`; ``options.test_only``: its work tree is only
        checked); :meth:`environment` is what the launch runs in; :meth:`launch` queues or
        starts the job and records the submission. A failure before the launch queued or started
        the job puts each of the run directories back as it was (:class:`~jobgen.jobdir.files.DirUndo`):
        nothing was submitted, and nothing was written.

        Raises:
            ConfigError: ``job_dir`` is not a job directory for this backend; a check refused it
                (nothing is submitted).
            SubmitError: the scheduler refused or failed (its message is shown).
        """
        self.check_options(options)
        job = self.begin_submit(job_dir.resolve(), options, out, plan)
        undo = [DirUndo.capture(directory) for directory in job.run_dirs]
        try:
            self.prepare_run_dirs(job)
            if job.run_dir is not None:
                from jobgen.usercode.snapshot import snapshot_for  # submit only: off the render path

                job.code = snapshot_for(job.resolved.spec, spec_file=job.spec_file, job_dir=job.job_dir, run_dir=job.run_dir,
                                        allow_dirty=options.allow_dirty, out=out, check_only=options.test_only)
            job.environ = self.environment(job)
            return self.launch(job)
        except BaseException:
            if not job.launched:  # nothing was queued or started: the run directories go back to what they were
                for state in undo:
                    state.undo()
            raise

    def begin_submit(self, job_dir: Path, options: SubmitOptions, out: Echo, plan: JobPlan | None) -> PendingSubmit:
        """:meth:`submit`'s first step: read the job in ``job_dir`` and check what can be checked
        before anything is written. Here: the plan's resolved spec (else spec.json), and each of
        the spec's ``secrets`` set in this environment; a backend adds its own checks and sets
        the run directories.

        Raises:
            ConfigError: ``job_dir`` holds no valid spec.json; a secret is not set.
        """
        resolved = plan.resolved if plan is not None and plan.resolved is not None else read_resolved_spec(job_dir)
        job = PendingSubmit(job_dir, options, out, plan, resolved, spec_file=plan_spec_file(plan))
        check_present(resolved.spec.secrets, job.environ, location=secrets_location(job_dir, job.spec_file))
        return job

    def prepare_run_dirs(self, job: PendingSubmit) -> None:
        """:meth:`submit`'s second step: create each of ``job.run_dirs`` (git ignores what a run
        writes there, :func:`~jobgen.jobdir.files.ignore_run_dir`) and, unless ``test_only``, claim
        each run's directory for it (:func:`~jobgen.jobdir.check_run_dir`) and make its tracker
        run's key (:func:`~jobgen.jobdir.ensure_tracking_record`: one tracker run per run directory,
        made at the first submit).

        Raises:
            ConfigError: a run directory holds another profile's or shape's run.
        """
        for directory in job.run_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            ignore_run_dir(directory)
        if job.options.test_only:
            return
        for resolved, directory in job.runs:
            check_run_dir(directory, resolved, claim=True)  # the directory is this run's from now on
            if resolved.spec.trainer.trackers:
                ensure_tracking_record(directory)

    def environment(self, job: PendingSubmit) -> dict[str, str]:
        """:meth:`submit`'s fourth step: the environment the launch runs in, ``job.environ``
        without a ``JOBGEN_CODE_DIR`` or spec source left in the shell; with the user's spec file
        as the spec source for the bundled entrypoint (its input errors name that file); and with
        the snapshot first on PYTHONPATH (:meth:`~jobgen.usercode.snapshot.TakenSnapshot.environment`)."""
        environ = dict(job.environ)
        environ.pop(CODE_DIR_ENV, None)  # a variable left in the shell must not pass for a snapshot
        environ.pop(SPEC_SOURCE_ENV, None)  # nor name another spec file
        if job.spec_file is not None and job.resolved.spec.entrypoint is None:
            environ[SPEC_SOURCE_ENV] = str(job.spec_file.resolve())
        if job.code is not None:
            environ.update(job.code.environment(environ.get("PYTHONPATH")))
        return environ

    @abstractmethod
    def launch(self, job: PendingSubmit) -> SubmitResult:
        """:meth:`submit`'s last step: queue or start the job, set ``job.launched`` as soon as it
        is (a failure after that undoes nothing), and record the submission.

        Raises:
            SubmitError: the scheduler refused or failed (its message is shown).
        """

    @abstractmethod
    def status(self, job: SubmittedJob) -> JobStatus:
        """The job's state as the scheduler reports it (``UNKNOWN`` when nobody knows it).
        ``job``: the job resolved once (:class:`SubmittedJob`); what is read about it (its
        record, job directory, spec) is read from there, not looked up again."""

    @abstractmethod
    def logs(self, job: SubmittedJob, options: LogOptions, out: Echo = print) -> None:
        """Print the output of ``job`` (resolved once, :class:`SubmittedJob`): rank zero's by default."""

    @abstractmethod
    def cancel(self, job: SubmittedJob, *, wait_s: float = 120.0, out: Echo = print) -> JobStatus:
        """Stop ``job`` (resolved once, :class:`SubmittedJob`) and wait up to ``wait_s`` seconds
        until every rank has stopped."""

    def first_error(self, job: SubmittedJob) -> Triage:
        """Every rank's first failure in the output of ``job`` (resolved once, :class:`SubmittedJob`),
        earliest first (:mod:`jobgen.reports.triage`).

        Raises:
            NotSupportedError: this backend keeps no output jobgen can read.
        """
        raise not_supported(self.name, "jobgen logs --first-error",
                            "read the output where it was written (a local run prints to the terminal that started it)")

    def check_options(self, options: SubmitOptions | LogOptions) -> None:
        """Refuse options this backend does not take (set to a non-default value).

        Raises:
            ConfigError: naming the option, the backend, and what to use instead.
        """
        allowed = self.submit_options if isinstance(options, SubmitOptions) else self.log_options
        default = type(options)()
        for name, flag in OPTION_FLAGS.items():
            if hasattr(options, name) and getattr(options, name) != getattr(default, name) and name not in allowed:
                takes = ", ".join(OPTION_FLAGS[o] for o in sorted(allowed)) or "none"
                instead = OPTION_COUNTERPARTS.get(name)
                hint = f"for {self.name} use {instead}" if instead and instead.split("=")[0] in takes else f"drop {flag}"
                raise ConfigError(f"{flag} does not apply to {self.name} jobs", hint=f"{hint} ({self.name} takes: {takes})")


class SubmittedJob:
    """A submitted job, resolved once: its handle and, read on first use and kept, its
    submission record, the job directory that record names, and that directory's resolved
    spec. Built once by the caller of :meth:`Backend.status`, :meth:`Backend.logs`,
    :meth:`Backend.cancel` and :meth:`Backend.first_error` (which take nothing else), and passed
    down to what those call, so no step looks the handle up again. A task of a job array
    (``<jobid>_<task>``) has the array's record, job directory and spec.

    Attributes:
        handle: the job.
    """

    def __init__(self, handle: JobHandle, record: Submission | None = None) -> None:
        """``record``: the submission record when the caller has read it already (else it is
        read from the state index on first use, :func:`~jobgen.jobdir.submission.find_submission`)."""
        self.handle = handle
        self._record = record
        self._record_read = record is not None
        self._resolved: ResolvedSpec | None = None
        self._resolved_read = False

    def __repr__(self) -> str:
        return f"SubmittedJob({str(self.handle)!r})"

    @property
    def record(self) -> Submission | None:
        """The recorded submission (a task of a job array: the array's), or ``None``."""
        if not self._record_read:
            self._record, self._record_read = find_submission(self.handle), True
        return self._record

    @property
    def job_dir(self) -> Path | None:
        """The job directory the job was submitted from, per :attr:`record`; ``None`` without one."""
        return None if self.record is None else Path(self.record.job_dir)

    @property
    def resolved(self) -> ResolvedSpec | None:
        """The spec.json of :attr:`job_dir`; ``None`` when there is no record or the directory
        is gone or unreadable."""
        if not self._resolved_read:
            try:
                self._resolved = None if self.job_dir is None else read_resolved_spec(self.job_dir)
            except JobgenError:
                self._resolved = None
            self._resolved_read = True
        return self._resolved

    @property
    def launch(self) -> LaunchSpec | None:
        """The launch facts (spec.json ``launch``: devices, GPU-hour price) of :attr:`resolved`."""
        return None if self.resolved is None else self.resolved.launch


def not_supported(backend: str, what: str, hint: str) -> NotSupportedError:
    """The error for an operation a backend does not offer."""
    return NotSupportedError(f"{what} is not supported for {backend} jobs", hint=hint)


@dataclass(frozen=True)
class JobStatus:
    """A job's state as the scheduler reports it.

    Attributes:
        handle: the job.
        state: the scheduler's word (SLURM: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED,
            TIMEOUT, PREEMPTED, NODE_FAIL, REQUEUED, ...; Kubernetes: SUBMITTED, CREATED, RUNNING,
            RESTARTING, SUSPENDED, COMPLETED, FAILED, TERMINATING, CANCELLED after `jobgen cancel`), or ``UNKNOWN`` when no
            source knows the job (never a guess).
        source: where the state came from: ``squeue``, ``sacct`` (accounting), ``jobcomp``
            (the job-completion log), ``kube-apiserver``, or ``none``.
        details: further facts (nodes, reason, exit code, restarts, elapsed), all strings.
        usage: the GPU-hours (CPU-hours on CPU clusters) the job used so far, from the same
            source as the state (:mod:`jobgen.reports.usage`); ``None`` when that source does not say.
        tasks: a SLURM job array: each task's status (handle ``slurm://<cluster>/<jobid>_<task>``),
            by task id; ``state`` is then the array's (:func:`jobgen.backends.slurm.backend.array_state`).
            Empty for any other job.
        evidence: what the scheduler reported about how the job's processes ended, for
            :attr:`failure`, beyond the state and ``details`` (Kubernetes: each pod's reasons and
            exit codes, :func:`jobgen.backends.kubernetes.pods.pod_evidence`).
    """

    handle: JobHandle
    state: str
    source: str
    details: dict[str, str] = field(default_factory=dict)
    usage: Usage | None = None
    tasks: tuple[JobStatus, ...] = ()
    evidence: tuple[Evidence, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict with stable keys (``jobgen status -o json``, ``jobgen ls -o json``);
        a job array adds ``tasks``: one such dict per task. ``failure``: :attr:`failure`'s
        :meth:`~jobgen.reports.failure_class.Classification.to_json`, or null."""
        failure = self.failure
        doc = {"handle": str(self.handle), "state": self.state, "source": self.source, "details": self.details,
               "usage": None if self.usage is None else self.usage.to_json(),
               "failure": None if failure is None else failure.to_json()}
        if self.tasks:
            doc["tasks"] = [task.to_json() for task in self.tasks]
        return doc

    @property
    def failure(self) -> Classification | None:
        """Why the job failed (:mod:`jobgen.reports.failure_class`) when its state is one of
        :data:`FAILURE_STATES`, else ``None``: from :attr:`evidence` and what the state and
        ``details`` say (:func:`status_evidence`); a job array's, from its failed tasks'. A
        failure nothing explains is ``unknown``."""
        if self.state not in FAILURE_STATES:
            return None
        pieces = [*self.evidence, status_evidence(self)]
        for task in self.tasks:
            if task.state in FAILURE_STATES:
                pieces += [*task.evidence, status_evidence(task)]
        return classify(pieces) or unclassified(f"{self.source}: state {self.state}")

    @property
    def finished(self) -> bool:
        """True for end states (the job will not run again unless requeued by hand)."""
        return self.state in FINISHED_STATES


#: SLURM end states (squeue(1) "JOB STATE CODES" minus the ones that run again), plus the
#: Kubernetes backend's DELETED (what `jobgen cancel` answers; its status says CANCELLED after).
FINISHED_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
     "DELETED"}
)

#: States of a job that failed (or, RESTARTING, whose pods failed and are started again):
#: :attr:`JobStatus.failure` says why.
FAILURE_STATES = frozenset({"BOOT_FAIL", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "RESTARTING"})

#: ``<return code>:<signal>`` (sacct's and squeue's ExitCode) or a bare exit code (a local run's).
_EXIT_CODE_RE = re.compile(r"^(-?\d+)(?::(\d+))?$")


def status_evidence(status: JobStatus) -> Evidence:
    """What a status's state and ``details`` say about how the job ended: the state, the
    scheduler's ``reason`` (squeue's ``None`` is none) and the ``exit_code`` (``<code>:<signal>`` as SLURM writes it, or a
    bare code; a negative one is torchrun's ``-N`` for signal N)."""
    details = status.details
    code, signal = None, None
    found = _EXIT_CODE_RE.match(details.get("exit_code", "").strip())
    if found is not None:
        code = int(found.group(1))
        signal = int(found.group(2)) if found.group(2) else None
        if code < 0:
            code, signal = None, -code
        signal = signal or None
    reason = details.get("reason", "")
    return Evidence(status.source, state=status.state, reason="" if reason == "None" else reason, exit_code=code, signal=signal)


#: Every state a :class:`JobStatus` (or a ``jobgen ls`` row) can say, for ``ls --state``: SLURM's
#: job state codes (squeue(1) "JOB STATE CODES"), the Kubernetes backend's (its job conditions,
#: :func:`jobgen.backends.kubernetes.backend.job_state`, and DELETED after cancel), ``UNKNOWN`` (no source
#: knows the job) and ``UNREACHABLE`` (``ls``: the scheduler could not be asked).
JOB_STATES = tuple(sorted(
    FINISHED_STATES
    | {"COMPLETING", "CONFIGURING", "PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "RESV_DEL_HOLD",
       "REVOKED", "RUNNING", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED"}
    | {"SUBMITTED", "CREATED", "RESTARTING", "TERMINATING"}
    | {"UNKNOWN", "UNREACHABLE"}
))


def run_command(argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                timeout_s: float = 60.0, what: str = "command", undecodable: str = "replace") -> subprocess.CompletedProcess[str]:
    """Run a scheduler command (argv list, never a shell) and return it when it exits 0.

    Its output is read as UTF-8. A scheduler passes names and reasons through as the bytes it
    was given, and bytes that are not UTF-8 must not end the command: by default each becomes
    U+FFFD (JSON output stays JSON, and the text can be printed and written anywhere);
    ``undecodable="surrogateescape"`` keeps them as lone surrogates (U+DC80-U+DCFF), for
    callers that check the values they read and name the bad bytes.

    Raises:
        SubmitError: the program is missing, timed out, or exited non-zero; the message names
            argv, the return code and stderr.
    """
    try:
        proc = subprocess.run(list(argv), cwd=cwd, env=None if env is None else dict(env), capture_output=True, text=True,
                              timeout=timeout_s, encoding="utf-8", errors=undecodable)
    except FileNotFoundError:
        raise SubmitError(
            f"{argv[0]} not found: cannot run {what}",
            hint=f"run jobgen where the scheduler's client tools are installed (e.g. a login node), or add {argv[0]} to PATH",
        ) from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{what} timed out after {timeout_s:.0f} s: {' '.join(argv)}", hint="is the scheduler's controller reachable?") from None
    if proc.returncode != 0:
        raise SubmitError(
            f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n"
            + (proc.stderr.strip() or proc.stdout.strip()).encode("utf-8", "backslashreplace").decode("utf-8"),
            hint="the scheduler's message is above",
        )
    return proc


def secrets_location(job_dir: Path, spec_file: Path | None) -> str:
    """Where a submit-time secrets error points: the user's spec file and its ``secrets`` field,
    or, for a rendered job directory submitted as is, the directory's ``spec.json``."""
    return f"{spec_file}: secrets" if spec_file is not None else f"{job_dir / SPEC_FILE}: spec.secrets"


def common_files(ctx: PlanContext, *, requeue_signal: str | None = None, cluster: str | None = None,
                 ssh: SshSettings | None = None) -> tuple[list[tuple[str, str]], ResolvedSpec]:
    """``spec.json`` (the resolved spec the entrypoint reads) and, for DeepSpeed, ``ds_config.json``,
    as ``(name, text)`` pairs sorted by name, and the :class:`~jobgen.jobdir.ResolvedSpec` written
    as spec.json (for :attr:`JobPlan.resolved <jobgen.planning.plan.JobPlan.resolved>`); the keywords
    are launch facts for spec.json (:meth:`jobgen.planning.plan.PlanContext.resolved_spec`)."""
    files = []
    ds_name = None
    if ctx.spec.trainer.deepspeed_stage is not None:
        ds_name = DS_CONFIG_FILE
        from jobgen.planning import deepspeed  # DeepSpeed specs only: off the render path of the others

        files.append((DS_CONFIG_FILE, deepspeed.dumps(deepspeed.deepspeed_config(ctx.spec, ctx.world))))
    resolved = ctx.resolved_spec(deepspeed_config=ds_name, requeue_signal=requeue_signal, cluster=cluster, ssh=ssh)
    files.append((SPEC_FILE, resolved.dumps()))
    return sorted(files), resolved


def render_job_template(ctx: PlanContext, template: str, **context: Any) -> str:
    """Render ``template`` with the header fields every generated file names (jobgen version,
    profile, inputs sha256) plus ``context``."""
    return render_template(
        ctx.templates_dir, template, version=__version__, profile=ctx.profile.name, inputs_sha256=ctx.inputs_sha256, **context
    )


def profile_env(profile: ClusterProfile, *, uses_nccl: bool) -> dict[str, str]:
    """The profile's environment for every rank: the network fabric's NCCL preset
    (:func:`jobgen.planning.nccl.nccl_env`, only when the job uses NCCL) < the profile's ``env``, sorted by name."""
    return dict(sorted({**nccl_env(profile.network_fabric, uses_nccl=uses_nccl), **profile.env}.items()))


def job_env(ctx: PlanContext) -> dict[str, str]:
    """Environment for every rank: NCCL preset < profile env < spec env, sorted by name."""
    env = {**profile_env(ctx.profile, uses_nccl=ctx.world.accelerator == "gpu"), **ctx.spec.env}
    return dict(sorted(env.items()))
