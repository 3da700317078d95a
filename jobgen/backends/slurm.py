"""SLURM backend: plans an sbatch script (launch contract in ARCHITECTURE.md).

Launch contract: ``--ntasks-per-node`` = devices per node and ``srun python -m jobgen.train``
so that Lightning's SLURMEnvironment sees ``SLURM_NTASKS_PER_NODE == devices`` and
``SLURM_NNODES == num_nodes`` (it raises otherwise); ``#SBATCH --signal=<SIG>@<grace_s>`` +
``--requeue`` for pre-emption; an explicit MASTER_PORT.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from jobgen.backends.base import (
    FINISHED_STATES,
    Backend,
    Echo,
    JobStatus,
    LogOptions,
    SubmitOptions,
    SubmitResult,
    common_files,
    job_env,
    render_job_template,
    run_command,
)
from jobgen.environment import check_present, export_problem, unexported
from jobgen.errors import ConfigError, PlanError, SubmitError
from jobgen.jobdir import SBATCH_FILE, SPEC_FILE, SUBMISSION_FILE, JobHandle, ResolvedSpec, Submission, find_submission, read_resolved_spec
from jobgen.plan import Command, JobPlan, PlanContext
from jobgen.render import ShellText
from jobgen.rules import World

TEMPLATE = "slurm/job.sbatch.j2"
#: Placeholder in the planned sbatch command for ``jobgen submit --runs-dir`` (made absolute).
RUNS_DIR_PLACEHOLDER = "<runs dir>"


def run_dir_name(job_name: str) -> str:
    """The run directory's name for ``job_name``: the name itself, unless it holds ``%`` or a
    backslash, which SLURM's output filename patterns cannot carry (sbatch(1): ``%`` expands,
    ``\\`` is dropped and disables expansion); then those become ``_`` plus a short hash of the
    name, so two such names never share a run directory."""
    if "%" not in job_name and "\\" not in job_name:
        return job_name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    return job_name.replace("%", "_").replace("\\", "_") + "-" + digest


def format_time_limit(minutes: int) -> str:
    """Minutes -> SLURM ``--time`` value ``[D-]HH:MM:00`` (sbatch(1), "-t, --time")."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


#: Options jobgen derives from the world and the profile; ``extra_sbatch_args`` may not set them.
DERIVED_SBATCH_OPTIONS = frozenset({
    "job-name", "nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "mem", "time", "gres", "gpus",
    "gpus-per-node", "gpus-per-task", "signal", "requeue", "no-requeue", "open-mode", "output",
})
#: srun options that change the task layout Lightning checks (``-N``, ``-n`` are their short forms).
LAYOUT_SRUN_OPTIONS = {"--nodes": "num_nodes", "-N": "num_nodes", "--ntasks-per-node": "devices", "--ntasks": "devices", "-n": "devices"}


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def check_site(ctx: PlanContext) -> None:
    """Plan-time checks of the profile's SLURM site settings against the job's world.

    Rules and their sources:
    - Lightning's SLURMEnvironment raises at startup unless ``--ntasks-per-node`` == ``devices``
      and ``--nodes`` == ``num_nodes`` (lightning/fabric/plugins/environments/slurm.py): jobgen
      derives both; extra srun/sbatch arguments may not change them.
    - ``--gpus-per-node`` / ``--gpus-per-task`` exist from SLURM 19.05 (select/cons_tres);
      ``--gpus-per-task`` is refused without an explicit ``--ntasks`` ("--gpus-per-task or
      --tres-per-task used without either --gpus or -n/--ntasks is not allowed", SLURM 23.11),
      so jobgen always adds ``--ntasks`` with it.
    - The requeue signal must come before the time limit: ``signal_grace_s`` < ``--time``.
    - An ``--export`` in the extra sbatch/srun arguments must pass the spec's ``secrets`` on
      (``ALL`` or naming them) and carry no credential value (:func:`jobgen.environment.export_problem`).

    Raises:
        PlanError: with the field to change, in Lightning's "You set X, but Y" style.
    """
    s, w = ctx.profile.slurm_settings, ctx.world
    where = f"{ctx.profile_source}: slurm"
    if w.accelerator == "gpu" and s.gpu_request_style != "gres" and s.version and _version(s.version) < (19, 5):
        raise PlanError(
            f"You set `slurm.gpu_request_style: {s.gpu_request_style}`, but the site runs SLURM {s.version}; "
            f"--{s.gpu_request_style} needs SLURM 19.05 or newer (select/cons_tres).",
            location=f"{where}.gpu_request_style",
            hint="Use `gpu_request_style: gres` (--gres=gpu:<type>:<n> works on every SLURM version).",
        )
    for arg in s.extra_sbatch_args:
        option = arg[2:].split("=", 1)[0]
        if option in DERIVED_SBATCH_OPTIONS:
            raise PlanError(
                _layout_message(option, arg.partition("=")[2], w, "extra_sbatch_args")
                or f"You set `slurm.extra_sbatch_args: {arg}`, but jobgen derives --{option} from the spec and profile.",
                location=f"{where}.extra_sbatch_args",
                hint=f"Remove {arg}; set the spec's resources / the profile's fields instead (jobgen writes --{option} itself).",
            )
    for i, arg in enumerate(s.extra_srun_args):
        name, _, value = arg.partition("=")
        if name in LAYOUT_SRUN_OPTIONS or (name in {"-N", "-n"} and not value):
            if not value and i + 1 < len(s.extra_srun_args):
                value = s.extra_srun_args[i + 1]
            raise PlanError(
                _layout_message(name.lstrip("-"), value, w, "extra_srun_args")
                or f"You set `slurm.extra_srun_args: {arg}`, but srun takes the task layout from the allocation jobgen "
                "writes; setting it again can only break Lightning's devices/num_nodes check.",
                location=f"{where}.extra_srun_args",
                hint=f"Remove {arg}: jobgen runs srun with the batch allocation ({w.num_nodes} node(s) x "
                f"{w.devices_per_node} task(s)); change `resources.nodes` / `resources.devices_per_node` instead.",
            )
    for field, args in (("extra_sbatch_args", s.extra_sbatch_args), ("extra_srun_args", s.extra_srun_args)):
        for i, arg in enumerate(args):
            value = arg.removeprefix("--export=") if arg.startswith("--export=") else \
                args[i + 1] if arg == "--export" and i + 1 < len(args) else None
            if value is not None:
                problem = export_problem(value, ctx.spec.secrets)
                if problem:
                    raise PlanError(problem[0], location=f"{where}.{field}", hint=problem[1])
    minutes = ctx.spec.resources.time_limit_min or s.time_limit_min
    if s.requeue and s.signal_grace_s >= minutes * 60:
        raise PlanError(
            f"You set `slurm.signal_grace_s: {s.signal_grace_s}`, but the time limit is {minutes} min "
            f"({minutes * 60} s): SIG{s.requeue_signal} would arrive before training starts.",
            location=f"{where}.signal_grace_s",
            hint=f"Raise the time limit above {s.signal_grace_s // 60 + 1} min or lower signal_grace_s.",
        )


def _layout_message(option: str, value: str, w: World, field: str) -> str | None:
    """Lightning's own wording for a task layout that disagrees with the Trainer's."""
    if option in {"ntasks-per-node"} and value and value != str(w.devices_per_node):
        return (f"You set `slurm.{field}: --ntasks-per-node={value}`, but the job runs Trainer(devices="
                f"{w.devices_per_node}); Lightning's SLURMEnvironment requires --ntasks-per-node == devices "
                "and stops every rank at startup otherwise.")
    if option in {"nodes", "N"} and value and value != str(w.num_nodes):
        return (f"You set `slurm.{field}: --nodes={value}`, but the job runs Trainer(num_nodes={w.num_nodes}); "
                "Lightning's SLURMEnvironment requires --nodes == num_nodes and stops every rank at startup otherwise.")
    if option in {"ntasks", "n"} and value and value != str(w.world_size):
        return (f"You set `slurm.{field}: --ntasks={value}`, but the world size is {w.world_size} "
                f"({w.num_nodes} node(s) x {w.devices_per_node}); SLURM would start {value} rank(s).")
    return None


def check_directives(directives: list[tuple[str, str | None]], world: World, version: str | None) -> None:
    """Check a finished ``#SBATCH`` option list for combinations SLURM rejects at submit time.

    Raises:
        PlanError: ``--gpus-per-task`` without ``--ntasks`` (refused by SLURM >= 21.08 and,
            without ``--gpus``, by 23.11: see :func:`check_site`), or ``--ntasks-per-node`` /
            ``--nodes`` that disagree with ``world`` (Lightning's SLURMEnvironment check).
    """
    opts = dict(directives)
    if "gpus-per-task" in opts and "ntasks" not in opts:
        raise PlanError(
            f"The job requests --gpus-per-task={opts['gpus-per-task']} without --ntasks"
            + (f" on SLURM {version}" if version else "")
            + "; sbatch refuses it ('--gpus-per-task or --tres-per-task used without either --gpus or -n/--ntasks is not allowed').",
            location="slurm.gpu_request_style",
            hint=f"Add --ntasks={world.world_size}, or use `gpu_request_style: gres`.",
        )
    if opts.get("ntasks-per-node") != str(world.devices_per_node):
        raise PlanError(f"--ntasks-per-node={opts.get('ntasks-per-node')} but Trainer(devices={world.devices_per_node})",
                        hint="jobgen must write --ntasks-per-node == devices (Lightning's SLURMEnvironment check)")
    if opts.get("nodes") != str(world.num_nodes):
        raise PlanError(f"--nodes={opts.get('nodes')} but Trainer(num_nodes={world.num_nodes})",
                        hint="jobgen must write --nodes == num_nodes (Lightning's SLURMEnvironment check)")


def sbatch_directives(ctx: PlanContext) -> list[tuple[str, str | None]]:
    """``(option, value)`` pairs for ``#SBATCH`` lines, in a stable order; value None: a flag.

    Raises:
        PlanError: the time limit exceeds the partition's MaxTime, the CPU/memory split
            leaves a rank with no core, or a site setting breaks the launch contract
            (:func:`check_site`, :func:`check_directives`).
    """
    p, s, w = ctx.profile, ctx.profile.slurm_settings, ctx.world
    minutes = ctx.world.time_limit_min or s.time_limit_min
    if s.max_time_limit_min is not None and minutes > s.max_time_limit_min:
        raise PlanError(
            f"You set a time limit of {minutes} min, but partition {s.partition or '(default)'} of profile "
            f"{p.name!r} allows {s.max_time_limit_min} min (`slurm.max_time_limit_min`).",
            location=f"{ctx.spec_source}: resources.time_limit_min",
            hint=f"Set `resources.time_limit_min` to at most {s.max_time_limit_min}; the job resumes after a requeue.",
        )
    check_site(ctx)
    out: list[tuple[str, str | None]] = [
        ("job-name", ctx.spec.name),
        ("nodes", str(w.num_nodes)),
        ("ntasks-per-node", str(w.devices_per_node)),
        ("cpus-per-task", str(w.cpus_per_rank)),
        ("mem", f"{int(p.mem_gib_per_node * 1024)}M"),
        ("time", format_time_limit(minutes)),
    ]
    if w.accelerator == "gpu":
        if s.gpu_request_style == "gres":
            typed = f"{s.gres_gpu_type}:" if s.gres_gpu_type else ""
            out.append(("gres", f"gpu:{typed}{w.devices_per_node}"))
        elif s.gpu_request_style == "gpus-per-node":
            out.append(("gpus-per-node", f"{s.gres_gpu_type}:{w.devices_per_node}" if s.gres_gpu_type else str(w.devices_per_node)))
        else:
            out.append(("ntasks", str(w.world_size)))
            out.append(("gpus-per-task", f"{s.gres_gpu_type}:1" if s.gres_gpu_type else "1"))
    for option, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("constraint", s.constraint)):
        if value:
            out.append((option, value))
    if s.exclusive:
        out.append(("exclusive", None))
    if s.requeue:
        out.append(("requeue", None))
        target = "B:" if s.signal_target == "batch" else ""
        out.append(("signal", f"{target}{s.requeue_signal}@{s.signal_grace_s}"))
    out.append(("open-mode", "append"))
    out.append(("output", "slurm-%j.out"))
    for arg in s.extra_sbatch_args:
        option, eq, value = arg[2:].partition("=")
        out.append((option, value if eq else None))
    check_directives(out, w, s.version)
    return out


def launch_argv(ctx: PlanContext) -> list[str]:
    """The per-task command after ``srun``: container wrapper (if any) + the entrypoint."""
    s = ctx.profile.slurm_settings
    entry = [s.python, "-m", "jobgen.train", "--spec", ShellText('"${JOB_DIR}"/' + SPEC_FILE), "--run-dir", ShellText('"${RUN_DIR}"')]
    if s.container.runtime == "apptainer":
        bind = ["--bind", ",".join(s.container.mounts)] if s.container.mounts else []
        return ["apptainer", "exec", "--nv", *bind, s.container.image or "", *entry]
    return entry


def srun_options(ctx: PlanContext) -> list[str]:
    """Options for ``srun`` itself (pyxis container flags, the profile's extra arguments)."""
    s = ctx.profile.slurm_settings
    # --label prefixes every line with the task's global rank ("0: ..."): `jobgen logs --rank N` filters on it.
    opts = ["--kill-on-bad-exit=1", "--label"]
    if s.container.runtime == "pyxis":
        opts.append(f"--container-image={s.container.image}")
        if s.container.mounts:
            opts.append(f"--container-mounts={','.join(s.container.mounts)}")
    return opts + list(s.extra_srun_args)


def plan(ctx: PlanContext) -> JobPlan:
    """Plan an sbatch job: ``job.sbatch`` + ``spec.json`` (+ ``ds_config.json``)."""
    s = ctx.profile.slurm_settings
    files = common_files(ctx, requeue_signal=s.requeue_signal if s.requeue else None, cluster=s.cluster)
    script = render_job_template(
        ctx,
        TEMPLATE,
        directives=sbatch_directives(ctx),
        modules=list(s.modules),
        env=job_env(ctx),
        secrets=list(ctx.spec.secrets),
        omp_threads=ctx.world.cpus_per_rank,
        master_port=s.master_port,
        run_name=run_dir_name(ctx.spec.name),
        srun_options=srun_options(ctx),
        launch=launch_argv(ctx),
        forward_signal=s.requeue_signal if s.requeue and s.signal_target == "batch" else None,
    )
    files.append((SBATCH_FILE, script))
    return JobPlan(
        scheduler="slurm",
        profile=ctx.profile.name,
        job_name=ctx.spec.name,
        files=tuple(sorted(files)),
        submit_steps=(sbatch_command(RUNS_DIR_PLACEHOLDER, run_dir_name(ctx.spec.name), secrets=ctx.spec.secrets),),
        world=ctx.world,
        inputs_sha256=ctx.inputs_sha256,
    )


def sbatch_command(runs_dir: str, run_name: str, *, test_only: bool = False, secrets: tuple[str, ...] = ()) -> Command:
    """The command ``jobgen submit`` runs in the job directory: ``sbatch --parsable`` with the
    run directory ``<runs_dir>/<run_name>`` as the job's working directory (``--chdir``, so
    ``#SBATCH --output=slurm-%j.out`` lands there and a committed job directory stays clean)
    and ``JOBGEN_RUN_DIR=<runs_dir>`` for the script. The plan shows it with
    :data:`RUNS_DIR_PLACEHOLDER`; submit fills in the real directory. sbatch exports the
    submitting environment to the job, which carries the spec's ``secrets``."""
    argv = ["sbatch", "--parsable"] + (["--test-only"] if test_only else []) + [f"--chdir={runs_dir}/{run_name}", SBATCH_FILE]
    return Command(tuple(argv), (("JOBGEN_RUN_DIR", runs_dir),), secrets)


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


def check_secrets(job_dir: Path, secrets: tuple[str, ...], environ: dict[str, str]) -> None:
    """Before sbatch: every secret of the spec is set in ``environ`` (the environment sbatch
    gets, which it exports to the job) and ``$SBATCH_EXPORT``, which overrides the script's
    ``#SBATCH --export`` (sbatch(1): environment variables beat script directives), passes
    them on.

    Raises:
        ConfigError: a secret is unset or empty, or ``$SBATCH_EXPORT`` drops one.
    """
    check_present(secrets, environ, location=f"{job_dir / SPEC_FILE}: spec.secrets")
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


def submit_dir(job_dir: Path, *, runs_dir: Path, test_only: bool = False, force: bool = False,
               env: dict[str, str] | None = None, out: Callable[[str], None] = print) -> JobHandle | None:
    """``sbatch --parsable`` the rendered ``job.sbatch`` in ``job_dir`` and record the submission.

    The run directory is ``<runs_dir>/<job name>`` (exported as ``JOBGEN_RUN_DIR=<runs_dir>``,
    created first) and the job's working directory (``--chdir``), so SLURM's output goes to
    ``<run dir>/slurm-<jobid>.out`` and a committed job directory stays clean. ``env`` adds
    variables for sbatch (which exports the submitting environment to the job, the spec's
    ``secrets`` included: checked first, :func:`check_secrets`). ``test_only``
    runs ``sbatch --test-only`` (SLURM checks the request and estimates a start; nothing is
    queued), passes SLURM's answer to ``out`` and returns ``None``.

    Raises:
        ConfigError: ``job_dir`` is not a rendered SLURM job; a secret of the spec is not set
            (nothing is submitted); the run dir path contains ``%`` or a backslash (SLURM's output
            filename patterns cannot carry them).
        SubmitError: the same job directory has a job still pending or running (without
            ``force``), or sbatch failed (argv, exit code and SLURM's message are shown).
    """
    job_dir = job_dir.resolve()
    resolved = read_job_dir(job_dir)
    environ = {**os.environ, **(env or {})}
    check_secrets(job_dir, resolved.spec.secrets, environ)
    run_dir = runs_dir.resolve() / run_dir_name(resolved.spec.name)
    for char, why in (("%", "expands %-patterns"), ("\\", "drops backslashes and stops expanding %j")):
        if char in str(run_dir):
            raise ConfigError(
                f"run directory {run_dir} contains {char!r}: SLURM {why} in output file paths "
                "(sbatch(1), filename pattern), so the job could not open its log there",
                hint="pick another --runs-dir (the job directory and the job name may contain it)",
            )
    previous = job_dir / SUBMISSION_FILE
    if previous.is_file() and not force and not test_only:
        record = Submission.load(previous)
        old = status(JobHandle.parse(record.handle))
        if old.state in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}:
            raise SubmitError(
                f"{job_dir} was already submitted as {record.handle}, which is {old.state}",
                hint=f"follow it with `jobgen logs -f {record.handle}`, stop it with `jobgen cancel {record.handle}`, "
                "or submit a second copy with --force",
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    command = sbatch_command(str(runs_dir.resolve()), run_dir.name, test_only=test_only, secrets=resolved.spec.secrets)
    argv = list(command.argv)
    proc = run_command(argv, cwd=job_dir, env={**environ, **dict(command.env)}, what="sbatch")
    if test_only:
        out((proc.stderr or proc.stdout).strip())
        return None
    jid = proc.stdout.strip().split(";")[0]  # --parsable: "<jobid>[;<cluster>]"
    if not jid.isdigit():
        raise SubmitError(f"sbatch printed {proc.stdout.strip()!r}, not a job id: {' '.join(argv)}", hint="check the site's sbatch wrapper")
    handle = JobHandle("slurm", f"{resolved.launch.cluster or 'default'}/{jid}")
    Submission(
        handle=str(handle), job_dir=str(job_dir), run_dir=str(run_dir), log_file=str(run_dir / f"slurm-{jid}.out"),
        argv=tuple(argv), inputs_sha256=resolved.inputs_sha256,
    ).save()
    return handle


def job_id(handle: JobHandle) -> str:
    """The numeric SLURM job id of ``slurm://<cluster>/<jobid>``.

    Raises:
        ConfigError: not a SLURM handle, or the id is not a number.
    """
    cluster, _, jid = handle.path.rpartition("/")
    if handle.scheme != "slurm" or not cluster or not jid.isdigit():
        raise ConfigError(f"{handle} is not a SLURM job handle", hint="SLURM handles look like slurm://<cluster>/<jobid>")
    return jid


def _squeue(jid: str) -> dict[str, Any] | None:
    """The job's record from ``squeue --json`` (states: all), or None when the controller has
    forgotten it (after MinJobAge)."""
    try:
        proc = run_command(["squeue", "--json", "--states=all", "--jobs", jid], what="squeue", timeout_s=30)
    except SubmitError as exc:
        if "Invalid job id" in exc.message:
            return None
        raise
    jobs = [j for j in json.loads(proc.stdout).get("jobs", []) if str(j.get("job_id")) == jid]
    return jobs[0] if jobs else None


#: State flags that squeue's one-word state shows instead of the base state, in the order
#: SLURM's job_state_string() checks them (src/common/slurm_protocol_defs.c).
_SHOWN_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


def _flag(value: Any) -> str:
    """squeue/sacct JSON state fields are a string (22.05) or a list of flags (23.02+): the base
    state plus flags, e.g. ``["CANCELLED", "COMPLETING"]`` while the ranks stop, which squeue
    (and 22.05's JSON) shows as COMPLETING; so a flag from that list wins over the base state."""
    if isinstance(value, list):
        shown = [flag for flag in _SHOWN_FLAGS if flag in value]
        return shown[0] if shown else value[0] if value else "UNKNOWN"
    return str(value)


#: sacct columns jobgen reads; JobName last, so a name containing "|" survives the split.
_SACCT_FORMAT = "JobID,State,ExitCode,NodeList,Elapsed,JobName"


def _sacct(jid: str) -> tuple[str, str, dict[str, str]] | None:
    """``(state, source, details)`` from accounting (``sacct``, needs slurmdbd), else from the
    job-completion log (``sacct -c``, JobCompType=jobcomp/filetxt), else None.

    Parsable text, not ``--json``: on SLURM 22.05 ``sacct --json`` reports exit code 0 for
    jobs that exited non-zero, while ``ExitCode`` in the text output is right.
    """
    for source, extra in (("sacct", []), ("jobcomp", ["-c"])):
        argv = ["sacct", *extra, "--jobs", jid, "--noheader", "--parsable2", f"--format={_SACCT_FORMAT}"]
        try:
            proc = run_command(argv, what="sacct -c" if extra else "sacct", timeout_s=30)
        except SubmitError:
            continue  # no slurmdbd: "accounting storage is disabled"; try the completion log
        rows = [line.split("|") for line in proc.stdout.splitlines() if line.split("|")[0] == jid]
        row = rows[-1] + [""] * 6 if rows else []
        # jobcomp/filetxt records are space-separated key=value pairs: a job name with spaces
        # garbles sacct -c's parse; an unreadable state means "this source does not know".
        if row and re.fullmatch(r"[A-Z_]+", (row[1].split() or [""])[0]):
            details = {"exit_code": row[2], "nodes": row[3], "elapsed": row[4], "name": "|".join(rows[-1][5:])}
            return row[1].split()[0], source, details
    return None


def status(handle: JobHandle) -> JobStatus:
    """The job's state: ``squeue`` while the controller knows it (queued, running, and for
    MinJobAge after it ends), then accounting, then the job-completion log, else ``UNKNOWN``
    (never a guess).

    Raises:
        ConfigError: not a SLURM handle.
        SubmitError: squeue is missing or the controller does not answer.
    """
    jid = job_id(handle)
    job = _squeue(jid)
    if job is not None:
        details = {
            "name": str(job.get("name", "")),
            "nodes": str(job.get("nodes", "")),
            "reason": str(job.get("state_reason", "")),
            "restarts": str(job.get("restart_cnt", "")),
        }
        raw_exit = job.get("exit_code")
        state = _flag(job.get("job_state"))
        if state in FINISHED_STATES and isinstance(raw_exit, int):
            details["exit_code"] = f"{raw_exit >> 8}:{raw_exit & 0x7F}"  # a wait(2) status on 22.05
        return JobStatus(handle, state, "squeue", details)
    found = _sacct(jid)
    if found is not None:
        return JobStatus(handle, *found)
    return JobStatus(handle, "UNKNOWN", "none", {"reason": "neither squeue nor sacct (accounting or job-completion log) knows this job"})


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


def log_file(handle: JobHandle) -> Path:
    """The job's SLURM output file: from the submission record, else from ``scontrol show job``.

    Raises:
        ConfigError: no record and the controller does not know the job any more.
    """
    record = find_submission(handle)
    if record is not None and record.log_file:
        return Path(record.log_file)
    jid = job_id(handle)
    try:
        proc = run_command(["scontrol", "show", "job", jid], what="scontrol show job", timeout_s=30)
    except SubmitError:
        proc = None
    match = re.search(r"\bStdOut=(\S+)", proc.stdout) if proc else None
    if match is None:
        raise ConfigError(
            f"no log known for {handle}: it was not submitted from this account's jobgen and SLURM no longer knows it",
            hint="pass the job directory instead of the handle, or look in the run directory for slurm-<jobid>.out",
        )
    return Path(match.group(1))


def logs(handle: JobHandle, *, rank: int | None = 0, follow: bool = False, poll_s: float = 1.0,
         out: Callable[[str], None] = print) -> None:
    """Print the job's output (rank ``rank``'s lines, or all with ``None``); with ``follow``,
    keep printing until the job has finished and the file is drained (Ctrl-C stops).

    Raises:
        ConfigError: no log file is known for the job (see :func:`log_file`), or the job has
            ended without one.
    """
    path = log_file(handle)
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
            state = status(handle)
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
        if now - last_check >= 5 * poll_s:
            last_check = now
            state = status(handle)
            if not path.is_file() and not announced:
                out(f"jobgen: {handle} is {state.state}; waiting for output in {path} (Ctrl-C stops)")
                announced = True
            finished = state.finished or state.state == "UNKNOWN"
            if finished:
                continue  # one more read drains what the job wrote last
        time.sleep(poll_s)


def cancel(handle: JobHandle, *, wait_s: float = 120.0, out: Callable[[str], None] = print) -> JobStatus:
    """``scancel`` the job and wait (up to ``wait_s``) until SLURM reports it ended.

    Returns the last status seen.

    Raises:
        SubmitError: scancel failed, or the job is still not finished after ``wait_s``.
    """
    jid = job_id(handle)
    run_command(["scancel", jid], what="scancel", timeout_s=30)
    deadline = time.monotonic() + wait_s
    state = status(handle)
    while not (state.finished or state.state == "UNKNOWN"):
        if time.monotonic() > deadline:
            raise SubmitError(f"{handle} is still {state.state} {wait_s:.0f} s after scancel", hint="SLURM's KillWait may be long; check `jobgen status`")
        out(f"jobgen: {handle} is {state.state}; waiting for its processes to stop ...")
        time.sleep(2.0)
        state = status(handle)
    return state


class SlurmBackend(Backend):
    """SLURM through its client commands (sbatch, squeue, sacct, scancel, scontrol)."""

    name = "slurm"
    scheme = "slurm"
    templates = (TEMPLATE,)
    submit_options = frozenset({"test_only", "force"})
    log_options = frozenset({"rank"})

    def plan(self, ctx: PlanContext) -> JobPlan:
        """See :func:`plan`."""
        return plan(ctx)

    def submit(self, job_dir: Path, options: SubmitOptions, out: Echo = print, *, plan: JobPlan | None = None) -> SubmitResult:
        """``sbatch`` the directory (see :func:`submit_dir`); ``test_only``: nothing is queued."""
        self.check_options(options)
        handle = submit_dir(job_dir, runs_dir=options.runs_dir, test_only=options.test_only, force=options.force, out=out)
        if handle is None:
            return SubmitResult("validated", None)
        return SubmitResult("submitted", handle, Submission.load(job_dir / SUBMISSION_FILE))

    def status(self, handle: JobHandle) -> JobStatus:
        """See :func:`status`."""
        return status(handle)

    def logs(self, handle: JobHandle, options: LogOptions, out: Echo = print) -> None:
        """Rank ``options.rank``'s lines (default 0; ``all``: the whole file); see :func:`logs`.

        Raises:
            ConfigError: the rank is neither a number nor ``all``.
        """
        self.check_options(options)
        rank = options.rank or "0"
        if rank != "all" and not rank.isdigit():
            raise ConfigError(f"--rank {rank!r} is not a rank number or 'all'", hint="e.g. --rank 0, --rank 3, --rank all")
        logs(handle, rank=None if rank == "all" else int(rank), follow=options.follow, out=out)

    def cancel(self, handle: JobHandle, *, wait_s: float = 120.0, out: Echo = print) -> JobStatus:
        """See :func:`cancel`."""
        return cancel(handle, wait_s=wait_s, out=out)
