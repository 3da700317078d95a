"""Planning every job of the project file (``jobgen.yaml``) into the desired state of its output
tree (:func:`plan_project`): each entry's spec, overrides and sweep for its profiles
(:mod:`jobgen.planning.sweep`), plus ``index.yaml`` and the kustomizations that make the tree
``kubectl apply -k`` ready, built from what each plan says it applies; and choosing between the
project and one spec for ``jobgen render``/``jobgen diff`` (:func:`build_render`).

Nothing is written: comparing, writing, pruning and committing the tree are GitOps'
(:mod:`jobgen.gitops`). The backends' planners are handed in (:class:`~jobgen.planning.sweep.Planners`).
Bad input raises a :class:`~jobgen.errors.JobgenError` before a single file is written.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from jobgen import __version__
from jobgen.errors import ConfigError, JobgenError
from jobgen.jobdir.files import GENERATED_MARK, INDEX_FILE, KUSTOMIZATION_FILE, kustomization_yaml
from jobgen.planning.plan import ClusterObject
from jobgen.planning.sweep import (
    Planners,
    Render,
    RenderedJob,
    SpecEntry,
    SpecOptions,
    SpecPlanner,
    check_unique_dirs,
    find_templates,
    job_files,
    plan_single,
)

if TYPE_CHECKING:  # jobgen.specs.project (a pydantic model) loads only for --all
    from jobgen.specs.project import LoadedProject, Project


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


def plan_project(loaded: LoadedProject, planners: Planners, *, profiles_dir: str | None = None,
                 templates_dir: str | None = None) -> Render:
    """Plan every job of the project plus ``index.yaml`` and the kustomizations, with the
    backends' ``planners``; ``profiles_dir``, ``templates_dir``: the command line's overrides of
    the project file's settings.

    Every entry is planned before anything is written; all failing entries are reported
    together.

    Raises:
        ConfigError: an entry fails to load or plan (each listed with its ``jobs[i]`` path and
            the original message), two entries render the same directory, or two Kubernetes
            jobs under one kustomization share a namespace/name.
    """
    project, root = loaded.project, loaded.root
    templates = find_templates(_lookup_dir("templates", templates_dir, project.templates_dir, root))
    planner = SpecPlanner(planners, templates, _lookup_dir("cluster_profiles", profiles_dir, project.profiles_dir, root))
    jobs: list[RenderedJob] = []
    failures: list[str] = []
    for i, entry in enumerate(project.jobs):
        label = f"jobs[{i}]"
        try:
            spec = SpecEntry(label, root / entry.spec, entry.spec, tuple(entry.overrides), tuple(entry.axes))
            jobs += planner.plan(spec, entry.profiles, lambda j, label=label: f"{loaded.path}: {label}.profiles[{j}]")
        except JobgenError as exc:
            failures.append(f"  {label} ({entry.spec} for {', '.join(entry.profiles)}):\n" + _indent(str(exc), "      "))
    if failures:
        raise ConfigError(
            f"{len(failures)} of {len(project.jobs)} job entries cannot be rendered; nothing was written:\n" + "\n".join(failures),
            location=str(loaded.path),
            hint="fix the entries above and run the command again",
        )
    check_unique_dirs(jobs, str(loaded.path))
    jobs.sort(key=lambda j: j.subdir)
    files = job_files(jobs)
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


def build_render(spec: str | None, profile: str | None, planners: Planners, options: SpecOptions, *, all_jobs: bool,
                 project: str | None, out_given: bool) -> Render:
    """Plan what ``render``/``diff`` act on, with the backends' ``planners``: the whole project
    (``--all``; ``project`` the ``--project`` file) or ``spec`` for ``profile`` with ``options``
    (``--set``, ``--sweep``, ``--out``; ``--profiles-dir``, ``--templates-dir`` in either case).
    ``out_given``: whether ``--out`` was given rather than defaulted.

    Raises:
        ConfigError: contradictory options (SPEC with --all, --set/--sweep/--out/--profile with
            --all, no SPEC and no --all, SPEC without --profile), or what planning raises.
    """
    if all_jobs or spec is None:
        from jobgen.specs.project import PROJECT_FILE, load_project
    if all_jobs:
        given = [flag for flag, on in (("SPEC", spec), ("--profile", profile), ("--set", options.overrides), ("--sweep", options.sweeps),
                                       ("--out", out_given)) if on]
        if given:
            raise ConfigError(
                f"{', '.join(given)} cannot be combined with --all",
                hint=f"--all renders what {PROJECT_FILE} lists: put overrides and sweeps there (set:, sweep:, out:)",
            )
        return plan_project(load_project(project), planners, profiles_dir=options.profiles_dir, templates_dir=options.templates_dir)
    if spec is None:
        raise ConfigError("give a SPEC file (with --profile) or --all", hint=f"e.g. jobgen render --all  (renders every job in {PROJECT_FILE})")
    if profile is None:
        raise ConfigError("rendering a spec needs --profile", hint=f"e.g. jobgen render {spec} --profile slurm-a100")
    if project is not None:
        raise ConfigError("--project only goes with --all", hint="drop --project, or use --all")
    return plan_single(spec, profile, planners, options)
