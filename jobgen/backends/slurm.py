"""SLURM backend: plans an sbatch script (launch contract in ARCHITECTURE.md).

Launch contract: ``--ntasks-per-node`` = devices per node and ``srun python -m jobgen.train``
so that Lightning's SLURMEnvironment sees ``SLURM_NTASKS_PER_NODE == devices`` and
``SLURM_NNODES == num_nodes`` (it raises otherwise); ``#SBATCH --signal=<SIG>@<grace_s>`` +
``--requeue`` for pre-emption; an explicit MASTER_PORT.
"""

from __future__ import annotations

from pathlib import Path

from jobgen.backends.base import SPEC_FILE, JobHandle, common_files, job_env, render_job_template
from jobgen.errors import NotSupportedError, PlanError
from jobgen.plan import JobPlan, PlanContext
from jobgen.render import ShellText

TEMPLATE = "slurm/job.sbatch.j2"
SBATCH_FILE = "job.sbatch"


def format_time_limit(minutes: int) -> str:
    """Minutes -> SLURM ``--time`` value ``[D-]HH:MM:00`` (sbatch(1), "-t, --time")."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def sbatch_directives(ctx: PlanContext) -> list[tuple[str, str | None]]:
    """``(option, value)`` pairs for ``#SBATCH`` lines, in a stable order; value None: a flag.

    Raises:
        PlanError: the time limit exceeds the partition's MaxTime, or the CPU/memory split
            leaves a rank with no core.
    """
    p, s, w = ctx.profile, ctx.profile.slurm_settings, ctx.world
    minutes = ctx.spec.resources.time_limit_min or s.time_limit_min
    if s.max_time_limit_min is not None and minutes > s.max_time_limit_min:
        raise PlanError(
            f"You set a time limit of {minutes} min, but partition {s.partition or '(default)'} of profile "
            f"{p.name!r} allows {s.max_time_limit_min} min (`slurm.max_time_limit_min`).",
            location=f"{ctx.spec_source}: resources.time_limit_min",
            hint=f"Set `resources.time_limit_min` to at most {s.max_time_limit_min}; the job resumes after a requeue.",
        )
    cpus_per_task = p.cpus_per_node // w.devices_per_node
    if cpus_per_task < 1:
        raise PlanError(
            f"{w.devices_per_node} ranks per node but nodes of profile {p.name!r} have {p.cpus_per_node} CPUs.",
            location=f"{ctx.profile_source}: cpus_per_node",
            hint="Give each rank at least one CPU: lower devices_per_node or raise cpus_per_node.",
        )
    out: list[tuple[str, str | None]] = [
        ("job-name", ctx.spec.name),
        ("nodes", str(w.num_nodes)),
        ("ntasks-per-node", str(w.devices_per_node)),
        ("cpus-per-task", str(cpus_per_task)),
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
            out.append(("gpus-per-task", "1"))
    for option, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("constraint", s.constraint)):
        if value:
            out.append((option, value))
    if s.exclusive:
        out.append(("exclusive", None))
    if s.requeue:
        out.append(("requeue", None))
        out.append(("signal", f"{s.requeue_signal}@{s.signal_grace_s}"))
    out.append(("open-mode", "append"))
    out.append(("output", "slurm-%j.out"))
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
    opts = ["--kill-on-bad-exit=1"]
    if s.container.runtime == "pyxis":
        opts.append(f"--container-image={s.container.image}")
        if s.container.mounts:
            opts.append(f"--container-mounts={','.join(s.container.mounts)}")
    return opts + list(s.extra_srun_args)


def plan(ctx: PlanContext) -> JobPlan:
    """Plan an sbatch job: ``job.sbatch`` + ``spec.json`` (+ ``ds_config.json``)."""
    s = ctx.profile.slurm_settings
    files = common_files(ctx, requeue_signal=s.requeue_signal if s.requeue else None)
    script = render_job_template(
        ctx,
        TEMPLATE,
        directives=sbatch_directives(ctx),
        modules=list(s.modules),
        env=job_env(ctx),
        omp_threads=max(1, ctx.profile.cpus_per_node // ctx.world.devices_per_node),
        master_port=s.master_port,
        job_name=ctx.spec.name,
        srun_options=srun_options(ctx),
        launch=launch_argv(ctx),
    )
    files.append((SBATCH_FILE, script))
    return JobPlan(
        scheduler="slurm",
        profile=ctx.profile.name,
        job_name=ctx.spec.name,
        files=tuple(sorted(files)),
        submit_argv=("sbatch", "--parsable", SBATCH_FILE),
        world=ctx.world,
        inputs_sha256=ctx.inputs_sha256,
    )


def submit(plan: JobPlan, job_dir: Path) -> JobHandle:
    """Submitting to SLURM arrives with the SLURM issue; rendering works today."""
    raise NotSupportedError(
        "submitting to SLURM is not supported yet",
        hint=f"the job is rendered in {job_dir}: run `cd {job_dir} && sbatch job.sbatch` on the cluster's login node",
    )
