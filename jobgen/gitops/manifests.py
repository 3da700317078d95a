"""GitOps: the rendered files under ``manifests/`` are the source of truth that users commit.

Planning the desired state of an output tree (a :class:`~jobgen.gitops.sync.Render`) without writing
anything: one spec for one profile, with a sweep grid (:func:`plan_single`), or every job of the
project file (:func:`plan_project`: plus ``index.yaml`` and the kustomizations that make the
tree ``kubectl apply -k`` ready, built from what each plan says it applies); and the drivers of
``jobgen render`` (``--all/--check/--prune/--commit/--sweep``) and ``jobgen diff``.

The pieces: :mod:`jobgen.specs.project` (``jobgen.yaml``), :mod:`jobgen.specs.sweeps` (grids and their job
names), :mod:`jobgen.gitops.sync` (desired state vs disk: compare, diff, apply), :mod:`jobgen.gitops.git`
(``--commit``). Bad input raises a :class:`JobgenError` before a single file is written.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen import __version__
from jobgen.backends import plan
from jobgen.backends.slurm.array import ArrayMember, plan_array, wants_array
from jobgen.errors import ConfigError, JobgenError
from jobgen.gitops.sync import Render, RenderedJob, apply, compare, unified_diff
from jobgen.jobdir.files import GENERATED_MARK, INDEX_FILE, KUSTOMIZATION_FILE, kustomization_yaml
from jobgen.planning.plan import ClusterObject
from jobgen.specs.load import apply_overrides, load_profile, read_yaml, search_dirs, validate
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.sweeps import SweepAxis, parse_sweep, sweep_job_names, sweep_points
from jobgen.specs.training import TrainingSpec

if TYPE_CHECKING:  # jobgen.specs.project (a pydantic model) and jobgen.gitops.git load only for --all / --commit
    from jobgen.specs.project import LoadedProject, Project

#: ``(spec, source) -> spec``: what :func:`plan_single` applies to each planned spec (``--smoke``).
SpecTransform = Callable[[TrainingSpec, str], TrainingSpec]

# --------------------------------------------------------------------------- planning


def _lookup_dir(kind: str, flag: str | None, configured: str | None, root: Path) -> str | None:
    """Directory override for the profile/template search in project mode: the CLI flag, then
    jobgen.yaml's setting, then ``<project root>/<kind>`` unless $JOBGEN_HOME provides one
    (so a run from a subdirectory finds what a run from the root finds)."""
    if flag:
        return flag
    if configured:
        return str(root / configured)
    home = os.environ.get("JOBGEN_HOME")
    if home and (Path(home) / kind).is_dir():
        return None
    return str(root / kind) if (root / kind).is_dir() else None


def _templates_dir(templates_dir: str | None) -> Path:
    dirs = search_dirs("templates", templates_dir)
    if not dirs:
        raise ConfigError("no templates directory found", hint="pass --templates-dir or set JOBGEN_HOME")
    return dirs[0]


def _plan_spec(
    *,
    entry: str,
    spec_path: Path,
    spec_label: str,
    profiles: Sequence[str],
    overrides: Sequence[str],
    axes: Sequence[SweepAxis],
    profiles_dir: str | None,
    templates: Path,
    profile_cache: dict[str, ClusterProfile],
    profile_label: Callable[[int], str],
    transform: SpecTransform | None = None,
    spec_file: str | None = None,
) -> list[RenderedJob]:
    """Plan one spec (with its overrides and sweep grid) for each profile. ``transform`` (``jobgen
    submit --smoke``) turns each point's spec, and the base spec that names a job array, into the
    one planned; ``spec_file`` is carried to submit (:attr:`~jobgen.planning.plan.JobPlan.spec_file`)."""
    base_doc = apply_overrides(read_yaml(spec_path), overrides)
    base = validate(TrainingSpec, base_doc, spec_label)
    points = sweep_points(axes)
    specs: list[tuple[tuple[tuple[str, str], ...], TrainingSpec]] = []
    if axes:
        for point, name in zip(points, sweep_job_names(base.name, points), strict=True):
            doc = apply_overrides(base_doc, [f"{k}={v}" for k, v in point], source="--sweep")
            doc["name"] = name
            label = f"{spec_label} (sweep point {', '.join(f'{k}={v}' for k, v in point)})"
            spec = validate(TrainingSpec, doc, label)
            specs.append((point, transform(spec, label) if transform else spec))
    top = transform(base, spec_label) if transform else base
    if not axes:
        specs.append(((), top))
    jobs = []
    for i, profile_name in enumerate(profiles):
        if profile_name not in profile_cache:
            try:
                profile_cache[profile_name] = load_profile(profile_name, profiles_dir)
            except JobgenError as exc:
                exc.location = f"{profile_label(i)}" + (f" > {exc.location}" if exc.location else "")
                raise
        profile = profile_cache[profile_name]
        sweep_name = top.name if axes else None
        if axes and wants_array(profile):  # the whole grid as one SLURM job array
            members = [ArrayMember(spec.name, point, spec) for point, spec in specs]
            job_plan = plan_array(top.name, members, profile, templates, spec_source=spec_label, profile_source=profile_name,
                                  spec_file=spec_file)
            grid = tuple((a.key, a.values) for a in axes)
            jobs.append(RenderedJob(entry, spec_label, tuple(overrides), (), job_plan, grid, sweep_name))
            continue
        for point, spec in specs:
            job_plan = plan(spec, profile, templates, spec_source=spec_label, profile_source=profile_name, spec_file=spec_file)
            jobs.append(RenderedJob(entry, spec_label, tuple(overrides), point, job_plan, sweep_name=sweep_name))
    return jobs


def _job_files(jobs: Iterable[RenderedJob]) -> dict[str, str]:
    return {f"{job.subdir}/{name}": text for job in jobs for name, text in job.plan.files}


def _check_unique_dirs(jobs: Sequence[RenderedJob], where: str) -> None:
    seen: dict[str, RenderedJob] = {}
    for job in jobs:
        other = seen.setdefault(job.subdir, job)
        if other is not job:
            raise ConfigError(
                f"{other.entry} ({other.spec}) and {job.entry} ({job.spec}) both render {job.subdir}/",
                location=where,
                hint="give one of them another name, e.g. set: [name=<other name>] (or --set name=...)",
            )


def plan_single(
    spec: str,
    profile: str,
    *,
    overrides: Sequence[str] = (),
    sweeps: Sequence[str] = (),
    out: str | os.PathLike[str] = "manifests",
    profiles_dir: str | None = None,
    templates_dir: str | None = None,
    loaded_profile: ClusterProfile | None = None,
    transform: SpecTransform | None = None,
    spec_file: str | None = None,
) -> Render:
    """Plan one spec for one profile (a sweep: one job per grid point, or one SLURM job array
    where the profile says ``slurm.sweep_as_array``) into ``out``. ``jobgen submit --sweep``
    (:mod:`jobgen.api.sweep`) passes ``loaded_profile`` (``profile`` loaded with its
    ``--preflight``), ``transform`` (``--smoke``: see :func:`_plan_spec`) and ``spec_file``.

    Raises:
        ConfigError, PlanError: as :func:`jobgen.specs.load.load_spec` and :func:`jobgen.backends.plan`;
            a malformed ``--sweep``.
    """
    axes = [parse_sweep(s) for s in sweeps]
    jobs = _plan_spec(
        entry="command line", spec_path=Path(spec), spec_label=spec, profiles=[profile], overrides=overrides, axes=axes,
        profiles_dir=profiles_dir, templates=_templates_dir(templates_dir),
        profile_cache={profile: loaded_profile} if loaded_profile is not None else {}, profile_label=lambda i: "--profile",
        transform=transform, spec_file=spec_file,
    )
    _check_unique_dirs(jobs, "--sweep")
    jobs.sort(key=lambda j: j.subdir)
    return Render(Path(out).resolve(), _job_files(jobs), tuple(jobs), whole_tree=False, source=spec)


def plan_project(loaded: LoadedProject, *, profiles_dir: str | None = None, templates_dir: str | None = None) -> Render:
    """Plan every job of the project plus ``index.yaml`` and the kustomizations.

    Every entry is planned before anything is written; all failing entries are reported
    together.

    Raises:
        ConfigError: an entry fails to load or plan (each listed with its ``jobs[i]`` path and
            the original message), two entries render the same directory, or two Kubernetes
            jobs under one kustomization share a namespace/name.
    """
    project, root = loaded.project, loaded.root
    profiles_dir = _lookup_dir("cluster_profiles", profiles_dir, project.profiles_dir, root)
    templates = _templates_dir(_lookup_dir("templates", templates_dir, project.templates_dir, root))
    cache: dict[str, ClusterProfile] = {}
    jobs: list[RenderedJob] = []
    failures: list[str] = []
    for i, entry in enumerate(project.jobs):
        label = f"jobs[{i}]"
        try:
            jobs += _plan_spec(
                entry=label, spec_path=root / entry.spec, spec_label=entry.spec, profiles=entry.profiles,
                overrides=entry.overrides, axes=entry.axes, profiles_dir=profiles_dir, templates=templates,
                profile_cache=cache, profile_label=lambda j, label=label: f"{loaded.path}: {label}.profiles[{j}]",
            )
        except JobgenError as exc:
            failures.append(f"  {label} ({entry.spec} for {', '.join(entry.profiles)}):\n" + _indent(str(exc), "      "))
    if failures:
        raise ConfigError(
            f"{len(failures)} of {len(project.jobs)} job entries cannot be rendered; nothing was written:\n" + "\n".join(failures),
            location=str(loaded.path),
            hint="fix the entries above and run the command again",
        )
    _check_unique_dirs(jobs, str(loaded.path))
    jobs.sort(key=lambda j: j.subdir)
    files = _job_files(jobs)
    files.update(_aggregates(jobs, project, str(loaded.path)))
    return Render((root / project.out).resolve(), files, tuple(jobs), whole_tree=True, source=loaded.path.name)


def _indent(text: str, pad: str) -> str:
    return "\n".join(pad + line if line else line for line in text.splitlines())


def _aggregates(jobs: Sequence[RenderedJob], project: Project, where: str) -> dict[str, str]:
    """``index.yaml``, ``<profile>/kustomization.yaml`` per profile of applied jobs (those whose
    plan lists ``apply_files``: Kubernetes) and (optionally) the top-level ``kustomization.yaml``."""
    from jobgen.specs.project import PROJECT_FILE

    files = {INDEX_FILE: index_yaml(jobs)}
    applied = [j for j in jobs if j.plan.apply_files]
    by_profile: dict[str, list[RenderedJob]] = {}
    for job in applied:
        by_profile.setdefault(job.plan.profile, []).append(job)
    for profile, members in sorted(by_profile.items()):
        _check_unique_objects(members, where, f"{profile}/{KUSTOMIZATION_FILE}")
        header = (f"{GENERATED_MARK} {__version__} from {PROJECT_FILE} (profile {profile}); re-render with `jobgen render --all`.\n"
                  f"# apply: kubectl apply -k <this directory>")
        files[f"{profile}/{KUSTOMIZATION_FILE}"] = kustomization_yaml(header, [f"{j.plan.job_name}/{f}" for j in members for f in j.plan.apply_files])
    if applied and project.top_level_kustomization:
        _check_unique_objects(applied, where, KUSTOMIZATION_FILE, top_level=True)
        header = (f"{GENERATED_MARK} {__version__} from {PROJECT_FILE} (every Kubernetes profile); re-render with `jobgen render --all`.\n"
                  f"# apply: kubectl apply -k <this directory>")
        files[KUSTOMIZATION_FILE] = kustomization_yaml(header, [f"{j.subdir}/{f}" for j in applied for f in j.plan.apply_files])
    return files


def _check_unique_objects(jobs: Sequence[RenderedJob], where: str, kustomization: str, top_level: bool = False) -> None:
    """Refuse two jobs under one kustomization whose cluster objects share a key (see
    :class:`~jobgen.planning.plan.ClusterObject`).

    Raises:
        ConfigError: naming both job directories, the object and how to separate them.
    """
    seen: dict[tuple[str, str], tuple[RenderedJob, ClusterObject]] = {}
    for job in jobs:
        obj = job.plan.cluster_object
        if obj is None:
            continue
        other, other_obj = seen.setdefault(obj.key, (job, obj))
        if other is not job:
            what = f"{obj.kind} {obj.name!r}" if other_obj.kind == obj.kind else f"objects named {obj.name!r} ({other_obj.kind}, {obj.kind})"
            raise ConfigError(
                f"{other.subdir} and {job.subdir} both define {what} in namespace {obj.namespace!r}; "
                f"{kustomization} would not build (kustomize refuses duplicate objects)",
                location=where,
                hint=("give one job another name (set: [name=...]) or its profile another kubernetes.namespace, "
                      "or set `top_level_kustomization: false` if the profiles are separate clusters")
                if top_level else "give one job another name (set: [name=...])",
            )


def index_yaml(jobs: Sequence[RenderedJob]) -> str:
    """``index.yaml``: every rendered job with its profile, scheduler, spec, overrides and sweep
    point, sorted by directory. Made only from the project file and job names (no content
    hashes), so editing one spec changes that job's files and nothing else."""
    from jobgen.specs.project import PROJECT_FILE

    lines = [
        f"{GENERATED_MARK} {__version__} from {PROJECT_FILE}; re-render with `jobgen render --all` instead of editing.",
        "# Every job of the project: <profile>/<job>/ under this directory.",
        "jobs:" if jobs else "jobs: []",
    ]
    for job in jobs:
        lines += [
            f"  - dir: {json.dumps(job.subdir, ensure_ascii=False)}",
            f"    profile: {json.dumps(job.plan.profile, ensure_ascii=False)}",
            f"    job: {json.dumps(job.plan.job_name, ensure_ascii=False)}",
            f"    scheduler: {json.dumps(job.plan.scheduler)}",
            f"    spec: {json.dumps(job.spec, ensure_ascii=False)}",
            f"    set: {json.dumps(list(job.overrides), ensure_ascii=False)}",
            f"    sweep: {json.dumps(dict(job.sweep), ensure_ascii=False)}",
        ]
        if job.array:  # a SLURM job array: the grid it runs, one task per point (array.json names them)
            lines[-1] = f"    sweep: {json.dumps({k: list(v) for k, v in job.array}, ensure_ascii=False)}"
            lines.append(f"    array: {math.prod(len(values) for _, values in job.array)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI drivers


def _display(out: Path) -> str:
    """``out`` as shown in messages and diffs: relative to the working directory when inside it."""
    try:
        return out.relative_to(Path.cwd().resolve()).as_posix() or "."
    except ValueError:
        return out.as_posix()


def build_render(
    *,
    spec: str | None,
    profile: str | None,
    all_jobs: bool,
    project: str | None,
    overrides: Sequence[str],
    sweeps: Sequence[str],
    out: str,
    out_given: bool,
    profiles_dir: str | None,
    templates_dir: str | None,
) -> Render:
    """Plan what ``render``/``diff`` act on: the whole project (``--all``) or one spec.

    Raises:
        ConfigError: contradictory options (SPEC with --all, --set/--sweep/--out/--profile with
            --all, no SPEC and no --all, SPEC without --profile), or what planning raises.
    """
    if all_jobs or spec is None:
        from jobgen.specs.project import PROJECT_FILE, load_project
    if all_jobs:
        given = [flag for flag, on in (("SPEC", spec), ("--profile", profile), ("--set", overrides), ("--sweep", sweeps), ("--out", out_given)) if on]
        if given:
            raise ConfigError(
                f"{', '.join(given)} cannot be combined with --all",
                hint=f"--all renders what {PROJECT_FILE} lists: put overrides and sweeps there (set:, sweep:, out:)",
            )
        return plan_project(load_project(project), profiles_dir=profiles_dir, templates_dir=templates_dir)
    if spec is None:
        raise ConfigError("give a SPEC file (with --profile) or --all", hint=f"e.g. jobgen render --all  (renders every job in {PROJECT_FILE})")
    if profile is None:
        raise ConfigError("rendering a spec needs --profile", hint=f"e.g. jobgen render {spec} --profile slurm-a100")
    if project is not None:
        raise ConfigError("--project only goes with --all", hint="drop --project, or use --all")
    return plan_single(spec, profile, overrides=overrides, sweeps=sweeps, out=out, profiles_dir=profiles_dir, templates_dir=templates_dir)


def _warn(render: Render, echo: Callable[..., Any]) -> None:
    for job in render.jobs:
        for warning in job.plan.warnings:
            echo(f"warning: {job.subdir}: {warning}", err=True)


def _command(render: Render, commit_flag: bool, prune: bool) -> str:
    if render.whole_tree:
        return "jobgen render --all" + (" --prune" if prune else "") + (" --commit" if commit_flag else "")
    jobs = render.jobs
    sweep = "".join(f" --sweep {k}=..." for k, _ in (jobs[0].sweep or jobs[0].array)) if jobs else ""
    return f"jobgen render {render.source} --profile {jobs[0].plan.profile if jobs else '?'}{sweep}" + (" --commit" if commit_flag else "")


def render_command(render: Render, *, check: bool, prune: bool, commit_flag: bool, echo: Callable[..., Any]) -> int:
    """``jobgen render`` with ``--all``, ``--check``, ``--prune``, ``--commit`` or ``--sweep``.

    Returns the exit code: 0 written/committed/in sync; 1 ``--check`` found files that differ
    from a fresh render (the unified diff is printed on stdout).

    Raises:
        ConfigError: ``--commit`` refused (not a work tree, unrelated staged changes).
        GitError: git failed.
    """
    _warn(render, echo)
    comparison = compare(render)
    display = _display(render.out)
    n_files, n_jobs = len(render.files), len(render.jobs)
    if check:
        if comparison.in_sync:
            echo(f"in sync: {n_files} file(s) of {n_jobs} job(s) under {display}/ match a fresh render")
            return 0
        echo(unified_diff(comparison, display), nl=False)
        stale = f", {len(comparison.stale_dirs)} stale job dir(s)" if comparison.stale_dirs else ""
        fix = "jobgen render --all" + (" --prune" if comparison.stale_dirs else "") if render.whole_tree else "the same command without --check"
        echo(f"out of date: {len(comparison.changes)} file(s) under {display}/ differ from a fresh render{stale}; run: {fix}", err=True)
        return 1
    if commit_flag:
        from jobgen.gitops.git import commit

        written, removed, commit_id = commit(comparison, prune=prune, command=_command(render, True, prune))
    else:
        written, removed = apply(comparison, prune=prune)
        commit_id = None
    for path in written:
        echo(f"wrote {display}/{path}")
    for path in removed:
        echo(f"removed {display}/{path}")
    for rel_dir in comparison.stale_dirs:
        if not prune:
            echo(f"stale: {display}/{rel_dir}/ was written by jobgen but {render.source} does not list it; "
                 f"`{_command(render, False, True)}` removes it", err=True)
        elif rel_dir in comparison.foreign:
            echo(f"kept {display}/{rel_dir}/: it holds files jobgen did not write ({', '.join(comparison.foreign[rel_dir])})", err=True)
    echo(f"{n_jobs} job(s) under {display}/: {len(written)} file(s) written, {len(removed)} removed, {comparison.unchanged} unchanged")
    if commit_flag:
        echo(f"committed {commit_id}" if commit_id else "nothing to commit: the rendered files are already committed")
    return 0


def diff_command(render: Render, *, echo: Callable[..., Any]) -> int:
    """``jobgen diff``: print the unified diff between disk and a fresh render; writes nothing.

    Returns 0 whether or not there are differences (``render --check`` is the failing form).
    """
    _warn(render, echo)
    comparison = compare(render)
    display = _display(render.out)
    if comparison.in_sync:
        echo(f"no differences: {len(render.files)} file(s) under {display}/ match a fresh render", err=True)
        return 0
    echo(unified_diff(comparison, display), nl=False)
    echo(f"{len(comparison.changes)} file(s) under {display}/ would change", err=True)
    return 0
