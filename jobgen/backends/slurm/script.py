"""The SLURM batch script: planning an sbatch job, purely (launch contract in docs/own-code.md).

Launch contract: ``--ntasks-per-node`` = devices per node and ``srun python -m jobgen.train``
so that Lightning's SLURMEnvironment sees ``SLURM_NTASKS_PER_NODE == devices`` and
``SLURM_NNODES == num_nodes`` (it raises otherwise); ``#SBATCH --signal=<SIG>@<grace_s>`` +
``--requeue`` for pre-emption; an explicit MASTER_PORT. Submitting, status, logs and cancel
live in :mod:`jobgen.backends.slurm.backend`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from jobgen.backends.base import common_files, job_env, render_job_template
from jobgen.errors import PlanError
from jobgen.jobdir.files import CODE_DIR_ENV, DS_CONFIG_FILE, HANG_NODES_FILE, SBATCH_FILE, SPEC_FILE
from jobgen.jobdir.world import World
from jobgen.planning.command import DEEPSPEED_CONFIG_ENV, WORKDIR_ENV, target_argv
from jobgen.planning.environment import export_problem
from jobgen.planning.plan import SUBMIT_DIR_PLACEHOLDER, Command, JobPlan, PlanContext
from jobgen.planning.render import ShellText, sh_quote
from jobgen.reports.failure_class import CLASSES, EXIT_HUNG, SRUN_WORD_CODES, task_exit_classes
from jobgen.specs.profile import SlurmSettings
from jobgen.specs.training import TrainingSpec

TEMPLATE = "slurm/job.sbatch.j2"
#: Placeholder in the planned sbatch command for ``jobgen submit --runs-dir`` (made absolute).
RUNS_DIR_PLACEHOLDER = "<runs dir>"
#: Command mode: the directory the ranks run in, as one double-quoted shell word expanded in the
#: job: ``JOBGEN_WORKDIR`` (the directory ``jobgen submit`` ran in), by hand the submit directory.
WORKDIR_WORD = f'"${{{WORKDIR_ENV}:-${{SLURM_SUBMIT_DIR}}}}"'


def run_dir_name(job_name: str) -> str:
    """The run directory's name for ``job_name``: the name itself, unless it holds ``%`` or a
    backslash, which SLURM's output filename patterns cannot carry (sbatch(1): ``%`` expands,
    ``\\`` is dropped and disables expansion); then those become ``_`` plus a short hash of the
    name, so two such names never share a run directory."""
    if "%" not in job_name and "\\" not in job_name:
        return job_name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    return job_name.replace("%", "_").replace("\\", "_") + "-" + digest


#: Ports a job on shared nodes (``exclusive: false``) takes its rendezvous port from:
#: ``master_port + SLURM_JOB_ID % MASTER_PORT_WINDOW`` (fewer near 65535, see :func:`master_port_window`).
MASTER_PORT_WINDOW = 1000


def master_port_window(master_port: int) -> int:
    """How many ports from ``master_port`` on a job on shared nodes may take its rendezvous port
    from (:data:`MASTER_PORT_WINDOW`, fewer where that would pass 65535)."""
    return min(MASTER_PORT_WINDOW, 65536 - master_port)


def format_time_limit(minutes: int) -> str:
    """Minutes -> SLURM ``--time`` value ``[D-]HH:MM:00`` (sbatch(1), "-t, --time")."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


#: Options jobgen derives from the world and the profile; ``extra_sbatch_args`` may not set them.
DERIVED_SBATCH_OPTIONS = frozenset({
    "job-name", "nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "mem", "time", "gres", "gpus",
    "gpus-per-node", "gpus-per-task", "signal", "requeue", "no-requeue", "open-mode", "output", "array",
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
      (``ALL`` or naming them) and carry no credential value (:func:`jobgen.planning.environment.export_problem`).
    - Under pyxis, the extra srun arguments may not repeat a ``--container-*`` flag jobgen writes
      (:func:`pyxis_flags_written`).

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
    written = pyxis_flags_written(ctx)
    for arg in s.extra_srun_args:
        name = arg.partition("=")[0]
        if name in written:
            raise PlanError(
                f"You set `slurm.extra_srun_args: {arg}`, but jobgen writes {name} itself for this job under pyxis "
                "(one flag each: a second would replace or add to jobgen's).",
                location=f"{where}.extra_srun_args",
                hint=f"Remove {arg}; set `slurm.container.image` / `slurm.container.mounts` instead"
                + (" (command mode mounts and starts in the working directory itself)" if ctx.spec.entrypoint is not None else ""),
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


def format_mem(gib: float) -> str:
    """GiB -> the ``--mem`` value jobgen writes: whole MiB with SLURM's ``M`` suffix (sbatch(1), "--mem")."""
    return f"{int(gib * 1024)}M"


def gpu_directives(s: SlurmSettings, *, gpus_per_node: int, tasks_per_node: int, nodes: int) -> list[tuple[str, str | None]]:
    """The GPU request of ``gpus_per_node`` GPUs on each of ``nodes`` nodes, ``tasks_per_node``
    tasks each, in the profile's ``gpu_request_style`` (the one place that decides it: the batch
    script and the submitit executor, :mod:`jobgen.backends.slurm.submitit_executor`, both ask here).

    - ``gres``: ``--gres=gpu[:<type>]:<gpus_per_node>`` (every SLURM version);
    - ``gpus-per-node``: ``--gpus-per-node=[<type>:]<gpus_per_node>`` (SLURM >= 19.05);
    - ``gpus-per-task``: ``--ntasks=<nodes x tasks_per_node>`` and
      ``--gpus-per-task=[<type>:]<gpus_per_node / tasks_per_node>``; SLURM refuses
      ``--gpus-per-task`` without ``--ntasks`` (see :func:`check_site`). A rendered job has one
      task per GPU, so 1 GPU per task.

    Returns ``[]`` for ``gpus_per_node == 0``.

    Raises:
        PlanError: ``gpus-per-task`` with a GPU count that the tasks of a node cannot share evenly.
    """
    if gpus_per_node == 0:
        return []
    typed = f"{s.gres_gpu_type}:" if s.gres_gpu_type else ""
    if s.gpu_request_style == "gres":
        return [("gres", f"gpu:{typed}{gpus_per_node}")]
    if s.gpu_request_style == "gpus-per-node":
        return [("gpus-per-node", f"{typed}{gpus_per_node}")]
    per_task, rest = divmod(gpus_per_node, tasks_per_node)
    if rest or not per_task:
        raise PlanError(
            f"{gpus_per_node} GPU(s) per node cannot be shared by {tasks_per_node} task(s) per node with "
            "`gpu_request_style: gpus-per-task` (SLURM gives every task the same number of GPUs).",
            location="slurm.gpu_request_style",
            hint=f"Ask for a multiple of {tasks_per_node} GPUs per node, or change the tasks per node.",
        )
    return [("ntasks", str(nodes * tasks_per_node)), ("gpus-per-task", f"{typed}{per_task}")]


def site_directives(s: SlurmSettings) -> list[tuple[str, str | None]]:
    """The profile's site settings as ``#SBATCH`` options, in this order: ``--partition``,
    ``--account``, ``--qos``, ``--constraint`` (those set), ``--exclusive``, and with
    ``requeue``: ``--requeue`` plus ``--signal=[B:]<SIG>@<signal_grace_s>`` (``B:`` for
    ``signal_target: batch``; sbatch(1), "--signal"). Shared by the batch script and the submitit
    executor (:mod:`jobgen.backends.slurm.submitit_executor`)."""
    out: list[tuple[str, str | None]] = []
    for option, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("constraint", s.constraint)):
        if value:
            out.append((option, value))
    if s.exclusive:
        out.append(("exclusive", None))
    if s.requeue:
        out.append(("requeue", None))
        target = "B:" if s.signal_target == "batch" else ""
        out.append(("signal", f"{target}{s.requeue_signal}@{s.signal_grace_s}"))
    return out


def restart_values(spec: TrainingSpec) -> dict[str, Any] | None:
    """What the batch script needs to restart the job after a retried failure (the template's
    ``restart``), or None when ``restart.max_restarts`` is 0 (the script then ends with srun's
    status, as without a budget): the budget, ``exclude_failed_nodes``, the class of each task
    exit code (:func:`~jobgen.reports.failure_class.task_exit_classes`), srun's words for a
    task's end with their codes (:data:`~jobgen.reports.failure_class.SRUN_WORD_CODES`), the
    classes in precedence order, and the hang's exit code with the file where the watchdog names
    the nodes whose heartbeat stopped first (:data:`~jobgen.jobdir.files.HANG_NODES_FILE`, relative
    to the run directory)."""
    r = spec.restart
    if r.max_restarts == 0:
        return None
    return {"max_restarts": r.max_restarts, "exclude_failed_nodes": r.exclude_failed_nodes,
            "code_classes": task_exit_classes(), "word_codes": SRUN_WORD_CODES, "classes": CLASSES,
            "exit_hung": EXIT_HUNG, "hang_nodes_file": HANG_NODES_FILE}


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
        ("mem", format_mem(p.mem_gib_per_node)),
        ("time", format_time_limit(minutes)),
    ]
    if w.accelerator == "gpu":
        out += gpu_directives(s, gpus_per_node=w.devices_per_node, tasks_per_node=w.devices_per_node, nodes=w.num_nodes)
    out += site_directives(s)
    if ctx.spec.restart.max_restarts and not s.requeue:  # the batch script's own requeue needs it (scontrol requeue)
        out.append(("requeue", None))
    out.append(("open-mode", "append"))
    out.append(("output", "slurm-%j.out"))
    for arg in s.extra_sbatch_args:
        option, eq, value = arg[2:].partition("=")
        out.append((option, value if eq else None))
    check_directives(out, w, s.version)
    return out


def task_setup(deepspeed: bool) -> str:
    """Command mode: the shell code each srun task runs before ``exec``-ing the user's command.

    srun starts one task per device but sets only SLURM_* variables; a plain torch script's
    ``init_process_group("env://")`` needs RANK and WORLD_SIZE (and MASTER_ADDR/PORT, which
    job.sbatch exports). So each task exports RANK=SLURM_PROCID, WORLD_SIZE=SLURM_NTASKS,
    LOCAL_RANK=SLURM_LOCALID and NODE_RANK=SLURM_NODEID: always from SLURM, which launched the
    task (a RANK inherited from the submitting shell would be the same in every task). It then
    changes to the directory ``jobgen submit`` ran in (``JOBGEN_WORKDIR``; by hand: the submit
    directory) and, for DeepSpeed, points ``PL_DEEPSPEED_CONFIG_PATH`` at the job's ds_config.json.
    ``set -eu``: a missing SLURM variable stops the task instead of exporting an empty rank.
    """
    lines = [
        "set -eu",
        f"cd {WORKDIR_WORD}",
        'export RANK="${SLURM_PROCID}" WORLD_SIZE="${SLURM_NTASKS}" LOCAL_RANK="${SLURM_LOCALID}" NODE_RANK="${SLURM_NODEID}"',
    ]
    if deepspeed:
        lines.append(f'export {DEEPSPEED_CONFIG_ENV}="${{JOB_DIR}}/{DS_CONFIG_FILE}"')
    lines.append('exec "$@"')
    return "; ".join(lines)


def _double_quoted(text: str) -> ShellText:
    """``text`` as one double-quoted shell word with ``\\ " $ ` `` escaped (the same word
    single quotes would give; shellcheck reads ``$`` inside single quotes as a mistake, SC2016)."""
    for char in ("\\", '"', "$", "`"):
        text = text.replace(char, "\\" + char)
    return ShellText(f'"{text}"')


def code_env_prefix(ctx: PlanContext) -> list[str]:
    """For a spec with a ``code`` section that is snapshotted: ``env PYTHONPATH=...`` ahead of the
    entrypoint, putting ``$JOBGEN_CODE_DIR`` (the snapshot ``jobgen submit`` exported to the job;
    a requeued job keeps it) plus ``code.python_path`` first on every rank's PYTHONPATH, and
    leaving PYTHONPATH as it is when the variable is unset (``sbatch job.sbatch`` by hand).
    ``[]`` otherwise, so the scripts of specs without ``code`` stay as they were (their ranks
    still get the snapshot first: submit exports PYTHONPATH, and the entrypoint re-checks).

    The word is trusted shell text in double quotes: the variables expand without splitting, and
    ``python_path`` holds only ``[A-Za-z0-9._/-]`` (checked by the spec)."""
    code = ctx.spec.code
    if code is None or not code.snapshot:
        return []
    suffix = f"/{code.python_path}" if code.python_path else ""
    return ["env", ShellText(f'"PYTHONPATH=${{{CODE_DIR_ENV}:+${{{CODE_DIR_ENV}}}{suffix}${{PYTHONPATH:+:}}}}${{PYTHONPATH:-}}"')]


def launch_argv(ctx: PlanContext, spec_path: ShellText | None = None) -> list[str]:
    """The per-task command after ``srun``: container wrapper (if any) + the entrypoint, which
    reads ``spec_path`` (shell text; default ``"${JOB_DIR}"/spec.json``; a job array's task reads
    its point's, :mod:`jobgen.backends.slurm.array`).

    Command mode (``entrypoint``): ``bash -c <task_setup> jobgen-task`` first (see
    :func:`task_setup`), then the interpreter and :func:`jobgen.planning.command.target_argv`.
    """
    s = ctx.profile.slurm_settings
    if ctx.spec.entrypoint is None:
        spec = spec_path if spec_path is not None else ShellText('"${JOB_DIR}"/' + SPEC_FILE)
        entry = [s.python, "-m", "jobgen.train", "--spec", spec, "--run-dir", ShellText('"${RUN_DIR}"')]
    else:
        entry = [s.python, *target_argv(ctx.spec, ctx.world)]
    entry = container_wrap(s, code_env_prefix(ctx) + entry)
    if ctx.spec.entrypoint is not None:
        setup = _double_quoted(task_setup(ctx.spec.trainer.deepspeed_stage is not None))
        entry = ["bash", "-c", setup, "jobgen-task", *entry]
    return entry


def pyxis_flags_written(ctx: PlanContext) -> frozenset[str]:
    """The ``--container-*`` flags :func:`container_srun_options` writes for this job (none without pyxis)."""
    s = ctx.profile.slurm_settings
    return frozenset(str(opt).partition("=")[0] for opt in container_srun_options(s, command_mode=ctx.spec.entrypoint is not None))


def srun_options(ctx: PlanContext) -> list[str]:
    """Options for ``srun`` itself (pyxis container flags, the profile's extra arguments)."""
    s = ctx.profile.slurm_settings
    # --label prefixes every line with the task's global rank ("0: ..."): `jobgen logs --rank N` filters on it.
    return ["--kill-on-bad-exit=1", "--label", *container_srun_options(s, command_mode=ctx.spec.entrypoint is not None),
            *s.extra_srun_args]


def container_srun_options(s: SlurmSettings, *, command_mode: bool = False) -> list[str]:
    """The pyxis flags of ``srun`` (NVIDIA enroot's SPANK plugin; pyxis README, "Usage":
    ``--container-image``, ``--container-mounts=SRC:DST[:FLAGS][,...]``, ``--container-workdir``),
    each once; ``[]`` for other runtimes. Used by the batch script and the submitit executor.

    A task sees only what is mounted into its container. Command mode (``command_mode``) runs the
    user's command in :data:`WORKDIR_WORD` (see :func:`task_setup`), so that directory is mounted
    at the same path, first in the one ``--container-mounts`` flag (the profile's
    ``container.mounts`` follow, quoted), and is the container's working directory. The directory
    is known only in the job (shell-expanded there); a path holding ``,`` or ``:`` cannot be a
    pyxis mount."""
    if s.container.runtime != "pyxis":
        return []
    opts = [f"--container-image={s.container.image}"]
    profile_mounts = ",".join(s.container.mounts)
    if command_mode:
        rest = "," + sh_quote(profile_mounts) if profile_mounts else ""
        opts.append(ShellText(f"--container-mounts={WORKDIR_WORD}:{WORKDIR_WORD}{rest}"))
        opts.append(ShellText(f"--container-workdir={WORKDIR_WORD}"))
    elif profile_mounts:
        opts.append(f"--container-mounts={profile_mounts}")
    return opts


def container_wrap(s: SlurmSettings, argv: list[str]) -> list[str]:
    """``argv`` as each task runs it: inside ``apptainer exec --nv [--bind <mounts>] <image>``
    for the apptainer runtime, unchanged otherwise (pyxis works through srun's options,
    :func:`container_srun_options`)."""
    if s.container.runtime != "apptainer":
        return argv
    bind = ["--bind", ",".join(s.container.mounts)] if s.container.mounts else []
    return ["apptainer", "exec", "--nv", *bind, s.container.image or "", *argv]


def plan(ctx: PlanContext) -> JobPlan:
    """Plan an sbatch job: ``job.sbatch`` + ``spec.json`` (+ ``ds_config.json``)."""
    s = ctx.profile.slurm_settings
    files, resolved = common_files(ctx, requeue_signal=s.requeue_signal if s.requeue else None, cluster=s.cluster)
    script = render_job_template(
        ctx,
        TEMPLATE,
        directives=sbatch_directives(ctx),
        modules=list(s.modules),
        env=job_env(ctx),
        secrets=list(ctx.spec.secrets),
        omp_threads=ctx.world.cpus_per_rank,
        master_port=s.master_port,
        shared_nodes=not s.exclusive,
        port_window=master_port_window(s.master_port),
        run_name=run_dir_name(ctx.spec.name),
        srun_options=srun_options(ctx),
        launch=launch_argv(ctx),
        forward_signal=s.requeue_signal if s.requeue and s.signal_target == "batch" else None,
        restart=restart_values(ctx.spec),
    )
    files.append((SBATCH_FILE, script))
    return JobPlan(
        scheduler="slurm",
        profile=ctx.profile.name,
        job_name=ctx.spec.name,
        files=tuple(sorted(files)),
        submit_steps=(sbatch_command(RUNS_DIR_PLACEHOLDER, run_dir_name(ctx.spec.name), secrets=ctx.spec.secrets,
                                     workdir=SUBMIT_DIR_PLACEHOLDER if ctx.spec.entrypoint is not None else None),),
        world=ctx.world,
        inputs_sha256=ctx.inputs_sha256,
        resolved=resolved,
    )


def sbatch_command(runs_dir: str, run_name: str, *, test_only: bool = False, secrets: tuple[str, ...] = (),
                   workdir: str | None = None) -> Command:
    """The command ``jobgen submit`` runs in the job directory: ``sbatch --parsable`` with the
    run directory ``<runs_dir>/<run_name>`` as the job's working directory (``--chdir``, so
    ``#SBATCH --output=slurm-%j.out`` lands there and a committed job directory stays clean)
    and ``JOBGEN_RUN_DIR=<runs_dir>`` for the script. The plan shows it with
    :data:`RUNS_DIR_PLACEHOLDER`; submit fills in the real directory. sbatch exports the
    submitting environment to the job, which carries the spec's ``secrets``. Command mode:
    ``workdir`` (the directory submit runs in) goes to the tasks as ``JOBGEN_WORKDIR``."""
    argv = ["sbatch", "--parsable"] + (["--test-only"] if test_only else []) + [f"--chdir={runs_dir}/{run_name}", SBATCH_FILE]
    env = (("JOBGEN_RUN_DIR", runs_dir),) + (((WORKDIR_ENV, workdir),) if workdir is not None else ())
    return Command(tuple(argv), env, secrets)
