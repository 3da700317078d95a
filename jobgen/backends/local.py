"""Local backend (the embedded default): the bundled entrypoint under torchrun on this machine.

``torchrun --standalone --nproc-per-node N -m jobgen.train`` in the foreground, gloo on CPU
(or NCCL when the profile has GPUs), OMP threads set per rank (measured: without it two ranks
each take every core and throughput drops 3-4x). Ctrl-C stops every rank: torchrun runs in
its own process group, gets SIGINT forwarded, and the whole group is killed after a grace period.

Output: torchrun labels every rank's lines (``--tee 3``); all of it goes to the run directory's
:data:`OUTPUT_LOG`, the terminal gets the ranks' lines but no failure (:class:`jobgen.reports.triage.LiveFilter`), and
a failed run ends with the first failing rank's error (:func:`jobgen.reports.triage.triage`, as
``jobgen logs --first-error`` prints it) and the log's path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import jobgen
from jobgen.backends.base import (
    Backend,
    Echo,
    JobStatus,
    LogOptions,
    PendingSubmit,
    SubmitOptions,
    SubmitResult,
    SubmittedJob,
    common_files,
    job_env,
    not_supported,
    plan_spec_file,
    secrets_location,
)
from jobgen.errors import EXIT_BAD_INPUT, ConfigError, InterruptedRun, JobgenError, SubmitError
from jobgen.events.notifier import RESTART_COUNT_ENV, Notifier
from jobgen.jobdir.files import (
    DS_CONFIG_FILE,
    HANG_VERDICT_FILE,
    LOCAL_RUN_FILE,
    SPEC_FILE,
    SUMMARY_FILE,
    write_atomic,
)
from jobgen.jobdir.runs import LocalRun, check_run_dir, read_local_run, write_local_run
from jobgen.jobdir.spec import ResolvedSpec, read_resolved_spec
from jobgen.jobdir.submission import JobHandle, Submission
from jobgen.jobdir.summary import read_summary
from jobgen.planning.command import DEEPSPEED_CONFIG_ENV, RUN_DIR_ENV, target_argv
from jobgen.planning.environment import check_present
from jobgen.planning.plan import JOB_DIR_PLACEHOLDER, SUBMIT_DIR_PLACEHOLDER, Command, JobPlan, PlanContext
from jobgen.reports.attempts import attempt_triage, restart_entry, root_cause_exit_code, torchrun_evidence, with_restarts
from jobgen.reports.attempts import restart_details as budget_details
from jobgen.reports.failure_class import HANG_VERDICT, Classification, Evidence, classify, unclassified
from jobgen.reports.straggler import straggler_details
from jobgen.reports.triage import LiveFilter, Triage, format_triage, torchrun_line
from jobgen.reports.usage import Usage, run_usage

#: Seconds torchrun gets to stop its ranks after Ctrl-C before the process group is killed.
INTERRUPT_GRACE_S = 15.0
#: The run's whole output (every rank's lines, labelled, and torchrun's own), in the run
#: directory; each start appends, after a line starting with :data:`OUTPUT_START`.
OUTPUT_LOG = "output.log"
#: The first line a start writes into :data:`OUTPUT_LOG` (then the time and the command).
OUTPUT_START = "==== jobgen submit"


def omp_threads(ctx: PlanContext) -> int:
    """OMP_NUM_THREADS per rank: the profile's setting, else CPU cores / ranks (>= 1)."""
    return ctx.profile.local.omp_threads_per_process or ctx.world.cpus_per_rank


def launch_command(ctx: PlanContext) -> Command:
    """The torchrun command line and its environment; ``python`` (no ``local.python`` in the
    profile) means the interpreter running jobgen. ``--tee 3`` labels every line a rank writes
    (``[default<rank>]:``), which is how :meth:`LocalBackend.submit` tells the ranks apart.

    Command mode (``entrypoint``): torchrun runs the user's module/script (:func:`jobgen.planning.command.target_argv`)
    in the directory ``jobgen submit`` runs in (:data:`~jobgen.planning.plan.SUBMIT_DIR_PLACEHOLDER`);
    torchrun gives each rank MASTER_ADDR/PORT, WORLD_SIZE, RANK, LOCAL_RANK. A DeepSpeed spec
    adds ``PL_DEEPSPEED_CONFIG_PATH=<job dir>/ds_config.json`` (absolute once submit fills it in).
    """
    launcher = (ctx.profile.local.python or "python", "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(ctx.world.devices_per_node), "--tee", "3")
    env = job_env(ctx) | {"OMP_NUM_THREADS": str(omp_threads(ctx))}
    if ctx.spec.entrypoint is None:
        argv = (*launcher, "-m", "jobgen.train", "--spec", SPEC_FILE, "--run-dir", ".")
        return Command(argv, tuple(sorted(env.items())), ctx.spec.secrets)
    if ctx.spec.trainer.deepspeed_stage is not None:
        env[DEEPSPEED_CONFIG_ENV] = f"{JOB_DIR_PLACEHOLDER}/{DS_CONFIG_FILE}"
    env[RUN_DIR_ENV] = JOB_DIR_PLACEHOLDER
    argv = (*launcher, *target_argv(ctx.spec, ctx.world))
    return Command(argv, tuple(sorted(env.items())), ctx.spec.secrets, cwd=SUBMIT_DIR_PLACEHOLDER)


#: CPU flags (Linux /proc/cpuinfo) of native bf16 matmuls: AVX512-BF16 and AMX-BF16.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this machine's CPU has native bf16 matmuls (:data:`NATIVE_BF16_FLAGS`); None
    when it cannot be told (no /proc/cpuinfo, e.g. macOS)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags = {flag for line in text.splitlines() if line.startswith("flags") for flag in line.partition(":")[2].split()}
    return bool(flags & NATIVE_BF16_FLAGS) if flags else None


def bf16_emulation_warning(precision: str, accelerator: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The warning for a bf16 run on CPU ranks of a machine without native bf16, else None.

    Measured (AMD EPYC with AVX2 only, torch 2.13): a 512x512 bf16 matmul took 206 ms
    vs 7.8 ms in fp32 (~25x); the quickstart ran at 1.1-1.7k tokens/s in bf16-mixed vs ~14k in 32-true.
    """
    if accelerator != "cpu" or not precision.startswith("bf16") or native_bf16(cpuinfo) is not False:
        return None
    return (f"precision {precision} on a CPU without native bf16 (no avx512_bf16/amx_bf16 flag): PyTorch emulates it, "
            "measured ~25x slower than fp32 for matmuls; use --set trainer.precision=auto (32-true on CPU)")


class LocalBackend(Backend):
    """The embedded default: the job runs in the foreground on this machine; its job directory
    is its run directory (``<runs dir>/<job name>``)."""

    name = "local"
    submit_options = frozenset({"allow_dirty"})

    def plan(self, ctx: PlanContext) -> JobPlan:
        """Plan a local run: ``spec.json`` (+ ``ds_config.json``) and the torchrun command."""
        files, resolved = common_files(ctx)
        return JobPlan(
            scheduler="local",
            profile=ctx.profile.name,
            job_name=ctx.spec.name,
            files=tuple(files),
            resolved=resolved,
            submit_steps=(launch_command(ctx),),
            world=ctx.world,
            inputs_sha256=ctx.inputs_sha256,
        )

    def job_dir(self, plan: JobPlan, out: Path | None, options: SubmitOptions) -> Path:
        """A local job is written into its run directory, ``<runs dir>/<job name>``."""
        return options.runs_dir / plan.job_name

    def __init__(self, runner: Runner | None = None):
        """``runner`` (tests) replaces starting the process: it gets ``(argv, cwd, env)`` and
        returns the exit code; None: torchrun runs in the foreground (:func:`_run_foreground`)."""
        self.runner = runner

    def begin_submit(self, job_dir: Path, options: SubmitOptions, out: Echo, plan: JobPlan | None) -> LocalSubmit:
        """What running the job in ``job_dir`` in the foreground needs (:meth:`~jobgen.backends.base.Backend.submit`
        runs the steps; :meth:`launch` starts it and waits), checked before anything is written.

        ``plan``: the plan just written there (``jobgen submit SPEC``); without it (a job
        directory) the command is planned again from the directory's spec.json and the profile
        it names, and refused when the inputs differ. torchrun inherits this process's
        environment, which carries the spec's ``secrets`` (checked here). The job directory is
        the run directory: the code is snapshotted into ``<run dir>/code/<id>/``, which goes first
        on PYTHONPATH (``$JOBGEN_CODE_DIR`` names it) and into the submission record.

        Raises:
            ConfigError: ``job_dir`` is not a local job directory, holds a run of another profile
                or shape (:func:`~jobgen.jobdir.check_run_dir`), or a secret of the spec is not
                set in this environment; nothing is started.
        """
        # the plan just written there hands its resolved spec down; a job directory is read
        resolved = plan.resolved if plan is not None and plan.resolved is not None else read_resolved_spec(job_dir)
        if resolved.launch.scheduler != "local":
            raise ConfigError(f"{job_dir} was rendered for {resolved.launch.scheduler}, not for a local run",
                              hint="submit it with its own profile, or render the spec with --profile local")
        check_run_dir(job_dir, resolved)  # another profile's or shape's run is not resumed here
        slow = bf16_emulation_warning(resolved.spec.trainer.precision, resolved.launch.accelerator)
        if slow:
            out(f"jobgen: warning: {slow}")
        job_plan = plan or _replan(job_dir, resolved)
        command = job_plan.submit_steps[0]
        assert isinstance(command, Command)
        command = command.filled({JOB_DIR_PLACEHOLDER: str(job_dir), SUBMIT_DIR_PLACEHOLDER: str(Path.cwd())})
        job = LocalSubmit(job_dir, options, out, plan, resolved, spec_file=plan_spec_file(job_plan), run_dir=job_dir,
                          runs=((resolved, job_dir),), run_dirs=(job_dir,), command=command)
        # the spec's secrets reach torchrun (and every rank) through this inherited environment only
        check_present(resolved.spec.secrets, job.environ, location=secrets_location(job_dir, job.spec_file))
        job.environ.update(command.env)
        package_parent = str(Path(jobgen.__file__).resolve().parent.parent)
        # The ranks run in the run directory: entries relative to where jobgen runs are made absolute,
        # so `PYTHONPATH=examples/usercode jobgen submit ...` imports the same code the import check did.
        user_path = [str(Path(p).resolve()) for p in job.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        job.environ["PYTHONPATH"] = os.pathsep.join([package_parent, *user_path])
        return job

    def launch(self, job: PendingSubmit) -> SubmitResult:
        """Record the submission, start torchrun in the foreground and wait; a failure classed as
        retried starts it again within ``restart.max_restarts`` (action ``completed``).

        How this start goes is recorded in the run directory (:class:`~jobgen.jobdir.LocalRun`,
        read by :meth:`status`): RUNNING, then COMPLETED, FAILED or CANCELLED.

        Raises:
            ConfigError: the entrypoint refused its input (its ranks exited 2).
            SubmitError: torchrun or a rank exited non-zero.
            InterruptedRun: the run was interrupted (Ctrl-C; exit 130).
        """
        assert isinstance(job, LocalSubmit) and job.command is not None
        job_dir, resolved, code, out = job.job_dir, job.resolved, job.code, job.out
        command, env = job.command, job.environ
        cwd = Path(command.cwd) if command.cwd is not None else job_dir
        if code is not None and command.cwd is not None:  # command mode: run the committed script, not the working tree's
            cwd = code.workdir(cwd)
        handle = JobHandle("local", str(job_dir))
        argv = list(command.argv)
        if argv[0] == "python":
            argv[0] = sys.executable
        env.setdefault("PYTHONUNBUFFERED", "1")
        log = job_dir / OUTPUT_LOG
        record = Submission.now(handle=str(handle), job_dir=str(job_dir), run_dir=str(job_dir), argv=tuple(argv), log_file=str(log),
                                inputs_sha256=resolved.inputs_sha256, code_dir=str(code.dir) if code else None,
                                code=code.record if code else None)
        record.save()
        job.launched = True  # recorded: status and ls read how this start goes from the run directory
        out(f"jobgen: {resolved.launch.world_size} rank(s) on this machine, run directory {job_dir}")
        out("jobgen: $ " + (f"cd {cwd} && " if cwd != job_dir else "") + " ".join(argv))
        started = time.time()
        run = LocalRun(state="RUNNING", pid=os.getpid(), started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       max_restarts=resolved.spec.restart.max_restarts)
        write_local_run(job_dir, run)
        exit_code, evidence, decided, run = self._attempts(job, argv, cwd, handle, run)
        budget = resolved.spec.restart.max_restarts
        if exit_code != 0:
            raise _failed(job, argv, cwd, handle, run, exit_code, evidence, decided)
        if resolved.spec.entrypoint is not None:
            _write_command_summary(job_dir, resolved, cwd, time.time() - started, record)
        if budget:
            _record_restarts(job_dir, budget, list(run.restarts))
        write_local_run(job_dir, run.ended("COMPLETED", 0))
        if (job_dir / SUMMARY_FILE).is_file():  # name what the run left (a --smoke run writes no checkpoints)
            left = [f"summary: {SUMMARY_FILE}", *(f"{d}/" for d in ("checkpoints", "logs") if any((job_dir / d).glob("*")))]
            out(f"jobgen: run directory {job_dir} ({', '.join(left)})")
        return SubmitResult("completed", handle, record)

    def _attempts(self, job: LocalSubmit, argv: list[str], cwd: Path, handle: JobHandle,
                  run: LocalRun) -> tuple[int, list[Evidence], Classification, LocalRun]:
        """Start the job, then again after each failure classed as retried while the restart
        budget lasts. Returns the last attempt's exit code, its evidence and class (meaningful
        when it failed), and the run record with its restarts.

        Raises:
            InterruptedRun: Ctrl-C (the run is recorded CANCELLED).
            JobgenError: torchrun could not be started (the run is recorded FAILED).
        """
        job_dir, resolved, env, out = job.job_dir, job.resolved, job.environ, job.out
        budget = resolved.spec.restart.max_restarts
        restarts: list[dict[str, Any]] = []
        notifier = _restart_notifier(resolved, job_dir, str(handle), env)
        runner = self.runner or partial(_run_foreground, log=job_dir / OUTPUT_LOG, echo=out)
        evidence: list[Evidence] = []
        decided = unclassified("not run")
        while True:  # one attempt per pass: the first start, then a restart per retried failure within the budget
            attempt_started = time.time()
            env[RESTART_COUNT_ENV] = str(len(restarts))  # the entrypoint's notifications say which start this is
            try:
                code = runner(argv, cwd, env)
            except KeyboardInterrupt as exc:
                write_local_run(job_dir, run.ended("CANCELLED", getattr(exc, "exit_code", None)))
                raise InterruptedRun("run interrupted (Ctrl-C); every rank was stopped", hint=_resume_hint(resolved)) from None
            except JobgenError as exc:  # torchrun could not be started
                write_local_run(job_dir, run.ended("FAILED", None, exc.message))
                raise
            if code == 0:
                return code, evidence, decided, run
            evidence = attempt_evidence(job_dir / OUTPUT_LOG, job_dir, code, since=attempt_started)
            decided = classify(evidence) or unclassified(f"torchrun: exit code {code}")
            if not decided.retried or len(restarts) >= budget:
                return code, evidence, decided, run
            restarts.append(restart_entry(len(restarts) + 1, decided, code))
            run = run.model_copy(update={"restarts": tuple(restarts)})
            write_local_run(job_dir, run)
            out(f"jobgen: restart {len(restarts)} of {budget} (restart.max_restarts) after a failure classed "
                f"{decided.describe()}" + ("; resuming from the newest checkpoint" if resolved.spec.entrypoint is None else ""))
            if notifier is not None:
                notifier.send_restart(restarts[-1], budget)

    def status(self, job: SubmittedJob) -> JobStatus:
        """How the run's last start went, as ``jobgen submit`` recorded it (:class:`~jobgen.jobdir.LocalRun`):
        RUNNING while the jobgen process holding it runs, then COMPLETED, FAILED or CANCELLED
        (Ctrl-C) with torchrun's exit code (``details``: ``exit_code``; a failure's ``first_error``);
        UNKNOWN when the jobgen that held it is gone without recording an end. A run directory
        without that record (an older jobgen): COMPLETED when it holds ``summary.json``, else UNKNOWN."""
        handle = job.handle
        run_dir = Path(handle.path)
        details = {"run_dir": str(run_dir)}
        run = read_local_run(run_dir)
        if run is None:
            if (run_dir / SUMMARY_FILE).is_file():
                return JobStatus(handle, "COMPLETED", SUMMARY_FILE, details, _summary_usage(run_dir))
            reason = f"no summary.json and no {LOCAL_RUN_FILE}: the run was started by an older jobgen, or never started"
            return JobStatus(handle, "UNKNOWN", "none", details | {"reason": reason})
        details["started_at"] = run.started_at
        if run.state == "RUNNING":
            if _alive(run.pid):
                return JobStatus(handle, "RUNNING", LOCAL_RUN_FILE, details | {"pid": str(run.pid)} | restart_details(run),
                                 _usage(run, run_dir))
            reason = (f"the jobgen process that ran it (pid {run.pid}) no longer runs and recorded no end "
                      "(killed, or the machine restarted); see its output.log")
            return JobStatus(handle, "UNKNOWN", "none", details | {"reason": reason})
        details |= {"ended_at": run.ended_at or "", "exit_code": "" if run.exit_code is None else str(run.exit_code)}
        if run.first_error:
            details["first_error"] = run.first_error
        details |= restart_details(run)
        if run.state == "COMPLETED":
            details |= _summary_straggler(run_dir)
        usage = _summary_usage(run_dir) if run.state == "COMPLETED" else None
        return JobStatus(handle, run.state, LOCAL_RUN_FILE, details, usage or _usage(run, run_dir), evidence=stored_evidence(run))

    def logs(self, job: SubmittedJob, options: LogOptions, out: Echo = print) -> None:
        """Print the run's :data:`OUTPUT_LOG` (every start, each rank's lines labelled
        ``[default<rank>]:``); ``follow``: keep printing what is appended while the jobgen holding
        the run (:class:`~jobgen.jobdir.LocalRun`) is running it. ``rank`` / ``replica`` are not
        offered: torchrun's labels name the ranks in the one file.

        Raises:
            ConfigError: --rank or --replica given; the run directory has no output.log.
        """
        handle = job.handle
        if options.rank is not None or options.replica is not None:
            raise ConfigError("--rank and --replica do not apply to a local run: its output.log labels every rank's lines",
                              hint="drop them (grep the log for [default<rank>]:)")
        log = Path(handle.path) / OUTPUT_LOG
        if not log.is_file():
            raise ConfigError(f"{log} does not exist: the run was started by an older jobgen (it printed to its terminal "
                              "only) or never started", location=str(log),
                              hint=f"its metrics are in {handle.path}/logs/ (CSV) and summary.json")
        with log.open("rb") as fh:
            while True:
                chunk = fh.read()
                if chunk:
                    for line in chunk.decode("utf-8", errors="replace").splitlines():
                        out(line)
                if not options.follow:
                    return
                run = read_local_run(Path(handle.path))
                if run is None or run.state != "RUNNING" or not _alive(run.pid):
                    rest = fh.read()
                    for line in rest.decode("utf-8", errors="replace").splitlines():
                        out(line)
                    return
                time.sleep(1.0)

    def first_error(self, job: SubmittedJob) -> Triage:
        """Every rank's first failure in the last start's part of the run's :data:`OUTPUT_LOG`.

        Raises:
            NotSupportedError: the run directory has no output.log (a run started before jobgen kept one).
        """
        handle = job.handle
        log = Path(handle.path) / OUTPUT_LOG
        if not log.is_file():
            raise not_supported("local", "jobgen logs --first-error", f"{log} does not exist: the run printed to its terminal only")
        return _log_triage(log)

    def cancel(self, job: SubmittedJob, *, wait_s: float = 120.0, out: Echo = print) -> JobStatus:
        """Not offered: Ctrl-C in the terminal stops every rank of a local run."""
        raise not_supported("local", "cancel", "press Ctrl-C in the terminal running it; every rank stops")


@dataclass
class LocalSubmit(PendingSubmit):
    """A local run on its way: the torchrun command its plan lists, placeholders filled."""

    command: Command | None = None


def _resume_hint(resolved: ResolvedSpec) -> str:
    """What to do after a failed or interrupted local run."""
    return ("run the same command again to resume from the last checkpoint" if resolved.spec.entrypoint is None else
            "fix what the error says and run the same command again (what a new start resumes is your script's choice)")


def _failed(job: LocalSubmit, argv: list[str], cwd: Path, handle: JobHandle, run: LocalRun, code: int,
            evidence: list[Evidence], decided: Classification) -> JobgenError:
    """Record a failed run (FAILED, with its first error and evidence), print the first failing
    rank's error, its class and the restarts used, and return the error submit raises: a
    ConfigError when the bundled entrypoint refused its input (exit 2, as it did), else a SubmitError."""
    job_dir, resolved, out = job.job_dir, job.resolved, job.out
    log = job_dir / OUTPUT_LOG
    budget = resolved.spec.restart.max_restarts
    hint = _resume_hint(resolved)
    # the entrypoint's input error (jobgen.errors.EXIT_BAD_INPUT): torchrun exits 1 whatever its
    # ranks exited, and names their exit code in its report only
    ranks_code = code if code == EXIT_BAD_INPUT else ranks_exit_code(log)
    input_error = ranks_code == EXIT_BAD_INPUT and resolved.spec.entrypoint is None
    if input_error:
        hint = "the entrypoint refused its input: fix what its error names (the same command unchanged fails the same way)"
    found = _log_triage(log) if log.is_file() else None
    first = found.first if found is not None else None
    write_local_run(job_dir, run.ended("FAILED", code, None if first is None else f"{first.source}: {first.headline}",
                                       tuple(dataclasses.asdict(e) for e in evidence)))
    if found is not None:
        out("")
        for line in format_triage(found, str(handle)):
            out(line)
        out(f"jobgen: every rank's output and torchrun's report: {log}")
        hint = f"the first failing rank's error is above (all of it: {log}); " + hint
    out(f"jobgen: failure: {decided.cls} ({'retried' if decided.retried else 'not retried'}): {decided.reason}")
    if budget:
        out(f"jobgen: restarts used: {len(run.restarts)} of {budget} (restart.max_restarts)"
            + ("" if decided.retried else "; a user failure is not restarted"))
    if input_error:  # bad input: exit 2, as the entrypoint did
        return ConfigError(f"the entrypoint refused its input: its ranks exited {EXIT_BAD_INPUT}, training exited with "
                           f"code {code} (argv: {' '.join(argv)}, cwd: {cwd})", hint=hint)
    return SubmitError(f"training exited with code {code} (argv: {' '.join(argv)}, cwd: {cwd})", hint=hint)


def attempt_evidence(log: Path, run_dir: Path, code: int, since: float) -> list[Evidence]:
    """How one attempt of a local run ended, for :func:`~jobgen.reports.failure_class.classify`:
    each rank's first failure in the attempt's part of ``log`` (:func:`_log_triage`), the exit
    code of the first rank that failed (torchrun's report), the watchdog's verdict when
    ``<run dir>/hang/verdict.json`` was written since ``since`` (``time.time()``), and torchrun's
    own exit ``code`` (a negative one: killed by that signal). What cannot be read is left out."""
    found: list[Evidence] = []
    if log.is_file():
        found += torchrun_evidence(_last_start(log))
    verdict = run_dir / HANG_VERDICT_FILE
    try:
        if verdict.stat().st_mtime >= since - 1:
            doc = json.loads(verdict.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and doc.get("verdict") == HANG_VERDICT:
                found.append(Evidence("watchdog", verdict=HANG_VERDICT, text=str(doc.get("text", ""))))
    except (OSError, ValueError):
        pass
    found.append(Evidence("torchrun", exit_code=None if code < 0 else code, signal=-code if code < 0 else None))
    return found


def stored_evidence(run: LocalRun) -> tuple[Evidence, ...]:
    """The evidence :meth:`LocalBackend.submit` recorded for a failed run (:attr:`LocalRun.evidence`);
    a record it cannot read as :class:`Evidence` is left out."""
    texts = ("source", "state", "reason", "kind", "text", "verdict")
    out = []
    for doc in run.evidence:
        numbers = [doc.get(k) for k in ("exit_code", "signal")]
        if set(doc) - {*texts, "exit_code", "signal"} or not all(isinstance(doc.get(k, ""), str) for k in texts) \
                or not all(n is None or (isinstance(n, int) and not isinstance(n, bool)) for n in numbers):
            continue
        out.append(Evidence(**doc))
    return tuple(out)


def restart_details(run: LocalRun) -> dict[str, str]:
    """``jobgen status`` details of a run's restarts (:func:`jobgen.reports.attempts.restart_details`)."""
    return budget_details(run.max_restarts, run.restarts)


def _restart_notifier(resolved: ResolvedSpec, run_dir: Path, handle: str, env: dict[str, str]) -> Notifier | None:
    """What sends ``restart`` when this process restarts the run (the spec's ``notify``; the
    entrypoint's ranks send the other events): None without ``notify``. ``env``: the run's
    environment, where the webhook's token and URL variables are read."""
    if resolved.spec.notify is None:
        return None
    return Notifier(resolved.spec.notify, resolved, run_dir, env, handle=handle, prog="jobgen")


def _record_restarts(run_dir: Path, budget: int, restarts: list[dict[str, Any]]) -> None:
    """Add ``restarts`` (``max_restarts``, ``used``, ``history``: one entry per restart, as
    :attr:`LocalRun.restarts`) to the ``summary.json`` the last attempt wrote; nothing when it
    wrote none or it cannot be read."""
    path = run_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(summary, dict):
        write_atomic(path, json.dumps(with_restarts(summary, budget, restarts), indent=2) + "\n")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return False
    return True


def _usage(run: LocalRun, run_dir: Path) -> Usage | None:
    """The device time of the start ``run`` records: its ranks (spec.json) x its start to its end
    (to now while it runs); ``None`` when spec.json or the times cannot be read."""
    try:
        launch = read_resolved_spec(run_dir).launch
        start = datetime.fromisoformat(run.started_at)
        end = datetime.fromisoformat(run.ended_at) if run.ended_at else None
    except (ValueError, JobgenError):
        return None
    elapsed = ((end or datetime.now(timezone.utc)) - start).total_seconds()
    return Usage(launch.accelerator, launch.world_size, max(elapsed, 0.0), f"{LOCAL_RUN_FILE} start to end x ranks",
                 start=start, end=end, gpu_hour_price=launch.gpu_hour_price)


def _summary_straggler(run_dir: Path) -> dict[str, str]:
    """``jobgen status``'s ``straggler`` detail from the run's summary.json
    (:func:`~jobgen.reports.straggler.straggler_details`); ``{}`` when it cannot be read."""
    return straggler_details(read_summary(run_dir / SUMMARY_FILE))


def _summary_usage(run_dir: Path) -> Usage | None:
    """A finished local run's device time: its ranks (spec.json) x the wall time summary.json
    records (of the last start; ``None`` when either file is unreadable)."""
    summary = read_summary(run_dir / SUMMARY_FILE)
    if summary is None or summary.wall_time_s is None:
        return None
    try:
        launch = read_resolved_spec(run_dir).launch
    except JobgenError:
        return None
    wall = summary.wall_time_s
    return Usage(launch.accelerator, launch.world_size, wall, f"{SUMMARY_FILE} wall_time_s x ranks", gpu_hour_price=launch.gpu_hour_price)


def _write_command_summary(run_dir: Path, resolved: ResolvedSpec, cwd: Path, wall_s: float, record: Submission) -> None:
    """Command mode: the user's script writes no summary.json, so the local backend writes it when
    torchrun exits 0 (``status``/``ls`` then say COMPLETED with the device time; a script that
    writes its own summary.json keeps it). Keys shared with the entrypoint's summary: ``name``,
    ``wall_time_s`` (seconds), ``usage`` (:func:`jobgen.reports.usage.run_usage`), ``world_size``,
    ``strategy``, ``precision``, ``jobgen_version``, ``inputs_sha256``, ``profile``, ``code`` (the
    snapshot record plus ``dir``, or null); command mode adds ``entrypoint``, ``cwd`` and ``exit_code``."""
    path = run_dir / SUMMARY_FILE
    if path.exists():
        return
    spec, launch = resolved.spec, resolved.launch
    assert spec.entrypoint is not None
    code = None if record.code is None else {**record.code.model_dump(mode="json"), "dir": record.code_dir}
    summary = {
        "name": spec.name,
        "entrypoint": spec.entrypoint.model_dump(mode="json", exclude_defaults=True),
        "cwd": str(cwd),
        "exit_code": 0,
        "wall_time_s": round(wall_s, 3),
        "usage": run_usage(launch.accelerator, launch.world_size, wall_s, launch.gpu_hour_price).to_json(),
        "world_size": launch.world_size,
        "strategy": spec.trainer.strategy,
        "precision": spec.trainer.precision,
        "jobgen_version": resolved.jobgen_version,
        "inputs_sha256": resolved.inputs_sha256,
        "profile": resolved.profile,
        "code": code,
    }
    write_atomic(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")


Runner = Callable[[list[str], Path, dict[str, str]], int]


def _replan(job_dir: Path, resolved: ResolvedSpec) -> JobPlan:
    """The plan of a written local job directory, made again from its spec.json and the profile
    it names (through the lookup order).

    Raises:
        ConfigError: the profile is not found, or the plan's inputs differ from the directory's.
    """
    from jobgen.backends import plan
    from jobgen.specs.load import load_profile, search_dirs

    preflight = ["preflight=true", f"preflight_timeout_s={resolved.launch.preflight_timeout_s}"] if resolved.launch.preflight else []
    job_plan = plan(resolved.spec, load_profile(resolved.profile, overrides=preflight), search_dirs("templates")[0])
    if job_plan.inputs_sha256 != resolved.inputs_sha256:
        raise ConfigError(f"{job_dir} was rendered from other inputs than profile {resolved.profile!r} gives now",
                          hint="run the spec instead: jobgen submit SPEC --profile local")
    return job_plan


def ranks_exit_code(log: Path) -> int | None:
    """The exit code of the first rank that failed in the last start in ``log``
    (:func:`jobgen.reports.attempts.root_cause_exit_code`). None: no report (torchrun did not get
    that far, or the log is gone)."""
    try:
        texts = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return root_cause_exit_code(texts[max(texts.rfind(OUTPUT_START), 0):])


def _last_start(log: Path) -> list[str]:
    """The last start's lines in ``log`` (:data:`OUTPUT_LOG`), from its :data:`OUTPUT_START` line on."""
    texts = log.read_text(encoding="utf-8", errors="replace").splitlines()
    starts = [i for i, text in enumerate(texts) if text.startswith(OUTPUT_START)]
    return texts[starts[-1] if starts else 0:]


def _log_triage(log: Path) -> Triage:
    """:func:`~jobgen.reports.triage.triage` of the last start's lines in ``log`` (:data:`OUTPUT_LOG`)."""
    return attempt_triage(_last_start(log))


def _run_foreground(argv: list[str], cwd: Path, env: dict[str, str], *, log: Path, echo: Echo = print) -> int:
    """Start ``argv`` in its own process group and wait; Ctrl-C stops the whole group.

    Its output (stdout and stderr) is appended to ``log`` line by line, after a start line
    (:data:`OUTPUT_START`, the UTC time, the command); ``echo`` gets the lines
    :class:`~jobgen.reports.triage.LiveFilter` shows (the ranks' and torchrun's, without failures).
    """
    sink = log.open("ab")
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    sink.write(f"{OUTPUT_START} {when} $ {' '.join(argv)}\n".encode())
    sink.flush()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    except OSError as exc:
        sink.close()
        raise SubmitError(f"cannot start {argv[0]}: {exc}", hint="install jobgen[train] (torch, lightning)") from None
    live = LiveFilter()
    try:
        assert proc.stdout is not None
        for position, raw in enumerate(proc.stdout):
            sink.write(raw)
            sink.flush()
            shown = live.show(torchrun_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"), position))
            if shown is not None:
                echo(shown)
        return proc.wait()
    except KeyboardInterrupt:
        print("\njobgen: interrupted; stopping every rank ...", file=sys.stderr, flush=True)
        _stop_group(proc)
        raise _Stopped(proc.returncode) from None
    finally:
        if proc.poll() is None:
            _stop_group(proc)
        sink.close()


class _Stopped(KeyboardInterrupt):
    """Ctrl-C stopped a foreground run; ``exit_code``: torchrun's, once its group was stopped."""

    def __init__(self, exit_code: int | None):
        super().__init__()
        self.exit_code = exit_code


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT torchrun's process group, wait, then SIGKILL whatever is left (no orphans)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
