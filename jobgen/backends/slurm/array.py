"""A sweep as ONE SLURM job array (profile ``slurm.sweep_as_array: true``), planned purely.

One job directory, named after the sweep's base name (the spec's ``name``), holds:

- ``job.sbatch`` (``templates/slurm/array.sbatch.j2``, which extends the single job's
  ``job.sbatch.j2`` and overrides its blocks): ``#SBATCH --array=0-<N-1>[%P]`` and
  ``--output=slurm-%A_%a.out`` (one log per task); task ``$SLURM_ARRAY_TASK_ID`` trains
  ``points/<task>/spec.json`` with the run directory ``<runs dir>/<its point's job name>``
  and ``MASTER_PORT`` = the profile's port + task;
- ``array.json`` (:class:`~jobgen.jobdir.ArrayIndex`): every task's index, job name and overrides;
- ``points/<i>/spec.json`` (+ ``ds_config.json``): point ``i``'s resolved spec.

Every file names one hash over all the points' specs, the profile and the template. One array
has one set of ``#SBATCH`` options, so every point must ask for the same resources, environment
and launch line: a sweep over ``resources.nodes`` (say) is refused with the difference named.
The planning rules are the single job's (:func:`jobgen.planning.plan.plan_context`), run for each point.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import __version__
from jobgen.backends.base import common_files, job_env, render_job_template
from jobgen.backends.slurm.script import (
    RUNS_DIR_PLACEHOLDER,
    launch_argv,
    master_port_window,
    restart_values,
    run_dir_name,
    sbatch_command,
    sbatch_directives,
    srun_options,
)
from jobgen.errors import PlanError
from jobgen.jobdir.files import ARRAY_INDEX_FILE, SBATCH_FILE, SPEC_FILE, point_file
from jobgen.jobdir.spec import ArrayIndex, ArrayPoint
from jobgen.planning.plan import JobPlan, PlanContext, fit_warnings, plan_context
from jobgen.planning.render import ShellText
from jobgen.specs.profile import ClusterProfile, example_values
from jobgen.specs.training import TrainingSpec

ARRAY_TEMPLATE = "slurm/array.sbatch.j2"
#: The array's SLURM output file pattern (sbatch(1): %A the array's job id, %a the task id).
ARRAY_OUTPUT = "slurm-%A_%a.out"
#: Highest task index SLURM accepts by default (MaxArraySize = 1001).
MAX_ARRAY_TASKS = 1001


@dataclass(frozen=True)
class ArrayMember:
    """One point of the sweep: its job name, its overrides ``((key, value), ...)`` and its spec."""

    name: str
    overrides: tuple[tuple[str, str], ...]
    spec: TrainingSpec


def wants_array(profile: ClusterProfile) -> bool:
    """True when a sweep on ``profile`` renders as one SLURM job array."""
    return profile.scheduler == "slurm" and profile.slurm_settings.sweep_as_array


def array_range(tasks: int, parallelism: int | None) -> str:
    """The ``--array`` value: ``0-<tasks-1>``, plus ``%<parallelism>`` when set."""
    return f"0-{tasks - 1}" + (f"%{parallelism}" if parallelism is not None else "")


def task_log_name(job_id: str, task: int) -> str:
    """The output file task ``task`` of array ``job_id`` writes (:data:`ARRAY_OUTPUT` expanded)."""
    return ARRAY_OUTPUT.replace("%A", job_id).replace("%a", str(task))


def _array_directives(ctx: PlanContext, base_name: str, tasks: int) -> list[tuple[str, str | None]]:
    """The single job's ``#SBATCH`` options with the array's name, ``--array`` after it, and one log per task."""
    parallelism = ctx.profile.slurm_settings.array_parallelism
    out: list[tuple[str, str | None]] = []
    for option, value in sbatch_directives(ctx):
        if option == "job-name":
            out += [("job-name", base_name), ("array", array_range(tasks, parallelism))]
        elif option == "output":
            out.append(("output", ARRAY_OUTPUT))
        else:
            out.append((option, value))
    return out


def _template_values(ctx: PlanContext, base_name: str, tasks: int) -> dict[str, Any]:
    """What the array template gets from one point (identical for every point, or the plan is refused)."""
    s = ctx.profile.slurm_settings
    spec_path = ShellText('"${JOB_DIR}"/' + point_file('"${TASK}"', SPEC_FILE))
    return {
        "directives": _array_directives(ctx, base_name, tasks),
        "modules": list(s.modules),
        "env": job_env(ctx),
        "secrets": list(ctx.spec.secrets),
        "omp_threads": ctx.world.cpus_per_rank,
        "master_port": s.master_port,
        "shared_nodes": not s.exclusive,
        "port_window": master_port_window(s.master_port),
        "srun_options": srun_options(ctx),
        "launch": launch_argv(ctx, spec_path),
        "forward_signal": s.requeue_signal if s.requeue and s.signal_target == "batch" else None,
        "restart": restart_values(ctx.spec),
    }


_WHAT = {"directives": "#SBATCH options", "modules": "modules", "env": "environment", "secrets": "secrets",
         "omp_threads": "CPUs per rank", "master_port": "master port", "shared_nodes": "exclusive nodes",
         "port_window": "master port", "srun_options": "srun options",
         "launch": "launch line", "forward_signal": "requeue signal", "restart": "restart budget (restart)"}


def _first_difference(a: Any, b: Any) -> str:
    if isinstance(a, list) and isinstance(b, list):
        for x, y in zip(a, b, strict=False):
            if x != y:
                return f"{x!r} vs {y!r}"
        return f"{len(a)} vs {len(b)} entries"
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return f"{key}={a.get(key)!r} vs {key}={b.get(key)!r}"
    return f"{a!r} vs {b!r}"


def plan_array(
    base_name: str,
    members: Sequence[ArrayMember],
    profile: ClusterProfile,
    templates_dir: Path,
    *,
    spec_source: str = "<spec>",
    profile_source: str = "<profile>",
    spec_file: str | None = None,
) -> JobPlan:
    """Plan the sweep ``members`` of the spec named ``base_name`` as one job array (see the module doc).

    Pure: the same inputs give byte-identical files.

    Raises:
        PlanError: a point does not fit the profile (the single job's rules), the points differ
            in what one array shares (resources, environment, launch line: named), a
            command-mode spec (its command does not read a point's spec.json), more tasks than
            SLURM's default MaxArraySize, or master ports beyond 65535.
        ConfigError: a template is missing/broken or a value cannot be quoted safely.
    """
    if not members:
        raise PlanError("a job array needs at least one sweep point", location=f"{spec_source}: --sweep")
    where = f"{profile_source}: slurm.sweep_as_array"
    if any(m.spec.entrypoint is not None for m in members):
        raise PlanError(
            "You set `slurm.sweep_as_array: true`, but the spec runs a command (entrypoint:), which does not read its "
            "sweep point's spec.json: every task of the array would run the same command.",
            location=where, hint="Render this sweep as one job per point: set `sweep_as_array: false` in the profile.")
    if len(members) > MAX_ARRAY_TASKS:
        raise PlanError(f"The sweep has {len(members)} points, but SLURM's default MaxArraySize allows {MAX_ARRAY_TASKS} tasks.",
                        location=where, hint="Split the sweep, or render one job per point (`sweep_as_array: false`).")
    s = profile.slurm_settings
    if s.exclusive and s.master_port + len(members) - 1 > 65535:
        raise PlanError(f"Task i of the array rendezvouses on port {s.master_port} + i, and {len(members)} tasks "
                        "go past 65535.", location=f"{profile_source}: slurm.master_port",
                        hint=f"Lower `slurm.master_port` to at most {65536 - len(members)}.")
    contexts = []
    for m in members:
        shown = ", ".join(f"{k}={v}" for k, v in m.overrides)
        contexts.append(plan_context(m.spec, profile, templates_dir, spec_source=f"{spec_source} (sweep point {shown})",
                                     profile_source=profile_source, template_names=(ARRAY_TEMPLATE,)))
    array = tuple((m.name, ctx.spec) for m, ctx in zip(members, contexts, strict=True))
    contexts = [dataclasses.replace(ctx, array=array) for ctx in contexts]
    first = _template_values(contexts[0], base_name, len(members))
    requeue_signal = s.requeue_signal if s.requeue else None
    launch0 = contexts[0].resolved_spec(requeue_signal=requeue_signal, cluster=s.cluster).launch
    for m, ctx in zip(members[1:], contexts[1:], strict=True):
        values = _template_values(ctx, base_name, len(members))
        for key, value in values.items():
            if value != first[key]:
                raise PlanError(
                    f"You set `slurm.sweep_as_array: true`, but sweep points {members[0].name!r} and {m.name!r} differ in their "
                    f"{_WHAT[key]} ({_first_difference(first[key], value)}); one job array has one set of #SBATCH options, "
                    "environment and launch line for every task.",
                    location=where,
                    hint="Sweep only what the tasks may differ in (trainer, model, data, ...), or render one job per point "
                         "(`sweep_as_array: false`).")
        launch = ctx.resolved_spec(requeue_signal=requeue_signal, cluster=s.cluster).launch
        if launch.model_copy(update={"deepspeed_config": None}) != launch0.model_copy(update={"deepspeed_config": None}):
            raise PlanError(f"You set `slurm.sweep_as_array: true`, but sweep points {members[0].name!r} and {m.name!r} "
                            "launch differently (world or precision support); one array runs every task alike.",
                            location=where, hint="Render one job per point (`sweep_as_array: false`).")
    files: list[tuple[str, str]] = []
    for i, ctx in enumerate(contexts):
        files += [(point_file(i, name), text) for name, text in common_files(ctx, requeue_signal=requeue_signal, cluster=s.cluster)[0]]
    ctx0 = contexts[0]
    index = ArrayIndex(jobgen_version=__version__, inputs_sha256=ctx0.inputs_sha256, profile=profile.name, name=base_name,
                       parallelism=s.array_parallelism,
                       points=tuple(ArrayPoint(index=i, name=m.name, overrides=dict(m.overrides)) for i, m in enumerate(members)))
    files.append((ARRAY_INDEX_FILE, index.dumps()))
    run_names = [run_dir_name(m.name) for m in members]
    files.append((SBATCH_FILE, render_job_template(ctx0, ARRAY_TEMPLATE, run_names=run_names, **first)))
    warnings = tuple(dict.fromkeys(w for ctx in contexts for w in fit_warnings(ctx)))
    return JobPlan(
        scheduler="slurm",
        profile=profile.name,
        job_name=base_name,
        files=tuple(sorted(files)),
        submit_steps=(sbatch_command(RUNS_DIR_PLACEHOLDER, run_dir_name(base_name), secrets=ctx0.spec.secrets),),
        world=ctx0.world,
        inputs_sha256=ctx0.inputs_sha256,
        warnings=warnings,
        spec_file=spec_file,
        placeholders=example_values(profile),
    )
