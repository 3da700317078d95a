"""Planning one spec with its overrides and sweep grid, for one or more profiles, into the
desired state of an output tree (:class:`Render`) without writing anything.

A sweep (``--sweep``, ``sweep:`` in ``jobgen.yaml``) is one job per grid point, or one SLURM job
array where the profile says ``slurm.sweep_as_array``. The grids and their job names are
:mod:`jobgen.specs.sweeps`'; the project file's jobs are :mod:`jobgen.planning.project`; writing
and comparing a Render is GitOps' (:mod:`jobgen.gitops.sync`).

The planner sits below the backends: the caller hands in what it needs of them as one value
(:class:`Planners`; :data:`jobgen.api.PLANNERS` is the backends' own), so this module imports no
backend. Bad input raises a :class:`~jobgen.errors.JobgenError` before a single file is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from jobgen.errors import ConfigError, JobgenError
from jobgen.planning.plan import JobPlan
from jobgen.specs.load import apply_overrides, load_profile, read_yaml, search_dirs, validate
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.sweeps import SweepAxis, parse_sweep, sweep_job_names, sweep_points
from jobgen.specs.training import TrainingSpec

#: A sweep point: ``((key, value), ...)`` in axis order; empty for a job without a sweep.
Point = tuple[tuple[str, str], ...]
#: ``(spec, source) -> spec``: what planning applies to each planned spec (``jobgen submit --smoke``).
SpecTransform = Callable[[TrainingSpec, str], TrainingSpec]


# --------------------------------------------------------------------------- desired state


@dataclass(frozen=True)
class RenderedJob:
    """One planned job: its plan plus where it came from (for the index, messages and commits).

    ``entry``: what listed it (``jobs[i]`` of the project file, or ``command line``); ``spec``:
    the spec path as given; ``overrides``: its ``set``/``--set`` overrides; ``sweep``: its grid
    point ``((key, value), ...)`` (empty without a sweep, and for a job array); ``array``: a SLURM
    job array's grid ``((key, (value, ...)), ...)`` (one task per point; empty otherwise);
    ``sweep_name``: the sweep's base name (the spec's name after its overrides: a job array's
    name), None without a sweep.
    """

    entry: str
    spec: str
    overrides: tuple[str, ...]
    sweep: Point
    plan: JobPlan
    array: tuple[tuple[str, tuple[str, ...]], ...] = ()
    sweep_name: str | None = None

    @property
    def subdir(self) -> str:
        """``<profile>/<job name>`` (POSIX): the job's directory under the output root."""
        return f"{self.plan.profile}/{self.plan.job_name}"


@dataclass(frozen=True)
class Render:
    """The desired state of an output tree, computed without writing anything.

    Attributes:
        out: the output root (absolute).
        files: POSIX path relative to ``out`` -> file text (LF line endings).
        jobs: every planned job, sorted by directory.
        whole_tree: True for a project render (``--all``): job directories under ``out`` that
            the project no longer lists, and stale index/kustomization files, are in scope.
        source: what was rendered, for messages (``jobgen.yaml`` or the spec path).
    """

    out: Path
    files: dict[str, str]
    jobs: tuple[RenderedJob, ...]
    whole_tree: bool
    source: str

    @property
    def job_dirs(self) -> set[str]:
        """Directories (relative to ``out``) of the planned jobs."""
        return {job.subdir for job in self.jobs}


# --------------------------------------------------------------------------- what the backends give


class JobPlanner(Protocol):
    """Plans one job of ``spec`` on ``profile``: :func:`jobgen.backends.plan`."""

    def __call__(self, spec: TrainingSpec, profile: ClusterProfile, templates_dir: Path, *, spec_source: str = ...,
                 profile_source: str = ..., spec_file: str | None = ...) -> JobPlan:
        """The JobPlan (pure).

        Raises:
            ConfigError, PlanError: as :func:`jobgen.planning.plan.plan`.
        """
        ...


class ArrayPlanner(Protocol):
    """Plans a whole sweep as one job array (SLURM's, :data:`jobgen.api.PLANNERS`). ``members``: one
    per grid point, in grid order, each made by :attr:`Planners.array_member`."""

    def __call__(self, base_name: str, members: Sequence[object], profile: ClusterProfile, templates_dir: Path, *,
                 spec_source: str = ..., profile_source: str = ..., spec_file: str | None = ...) -> JobPlan:
        """The job array's JobPlan (pure).

        Raises:
            PlanError: a point does not fit, or the points cannot share one job array.
            ConfigError: a template is missing or broken.
        """
        ...


@dataclass(frozen=True)
class Planners:
    """What planning a spec needs of the backends, handed in by the caller (the backends sit above
    the planner, which imports none of them).

    Attributes:
        job: plans one job (:func:`jobgen.backends.plan`).
        wants_array: whether a sweep on a profile is one job array (a SLURM profile's
            ``slurm.sweep_as_array``).
        array: plans a sweep as one job array.
        array_member: ``(job name, point, spec) -> member``: one grid point as ``array`` takes it.
    """

    job: JobPlanner
    wants_array: Callable[[ClusterProfile], bool]
    array: ArrayPlanner
    array_member: Callable[[str, Point, TrainingSpec], object]


# --------------------------------------------------------------------------- one spec


@dataclass(frozen=True)
class SpecEntry:
    """One spec to plan: ``entry`` what listed it (``jobs[i]``, ``command line``), ``path`` the file
    read, ``label`` the path as given (for messages and the index), its ``overrides`` and sweep
    ``axes``. ``transform`` (``jobgen submit --smoke``) turns each point's spec, and the base spec
    that names a job array, into the one planned; ``spec_file`` is carried to submit
    (:attr:`~jobgen.planning.plan.JobPlan.spec_file`)."""

    entry: str
    path: Path
    label: str
    overrides: tuple[str, ...] = ()
    axes: tuple[SweepAxis, ...] = ()
    transform: SpecTransform | None = None
    spec_file: str | None = None

    def point_specs(self) -> tuple[TrainingSpec, list[tuple[Point, TrainingSpec]]]:
        """``(base spec, [(point, spec), ...])``: the spec after its overrides (transformed), and
        each grid point's spec named after its point (only the base's ``((), spec)`` without a sweep).

        Raises:
            ConfigError: the spec or a point's spec is invalid (located at its point).
        """
        base_doc = apply_overrides(read_yaml(self.path), self.overrides)
        base = validate(TrainingSpec, base_doc, self.label)
        points = sweep_points(self.axes) if self.axes else []
        specs: list[tuple[Point, TrainingSpec]] = []
        for point, name in zip(points, sweep_job_names(base.name, points), strict=True):
            doc = apply_overrides(base_doc, [f"{k}={v}" for k, v in point], source="--sweep")
            doc["name"] = name
            label = f"{self.label} (sweep point {', '.join(f'{k}={v}' for k, v in point)})"
            spec = validate(TrainingSpec, doc, label)
            specs.append((point, self.transform(spec, label) if self.transform else spec))
        top = self.transform(base, self.label) if self.transform else base
        return top, specs or [((), top)]


@dataclass
class SpecPlanner:
    """Plans specs for profiles with the backends' ``planners`` and the templates under
    ``templates``; profiles are looked up in ``profiles_dir`` (:func:`jobgen.specs.load.load_profile`)
    once each, kept in ``profiles`` (name -> profile; one given there is used as it is)."""

    planners: Planners
    templates: Path
    profiles_dir: str | None = None
    profiles: dict[str, ClusterProfile] = field(default_factory=dict)

    def profile(self, name: str, where: str) -> ClusterProfile:
        """The profile ``name``; an error is located at ``where`` (the field that named it).

        Raises:
            ConfigError: as :func:`jobgen.specs.load.load_profile`.
        """
        if name not in self.profiles:
            try:
                self.profiles[name] = load_profile(name, self.profiles_dir)
            except JobgenError as exc:
                exc.location = where + (f" > {exc.location}" if exc.location else "")
                raise
        return self.profiles[name]

    def plan(self, entry: SpecEntry, profiles: Sequence[str], profile_label: Callable[[int], str]) -> list[RenderedJob]:
        """Plan ``entry`` (with its overrides and sweep grid) for each of ``profiles``
        (``profile_label(i)``: where the i-th is named, for messages): one job per point, or one
        job array where the profile wants one.

        Raises:
            ConfigError, PlanError: a spec, profile or point is invalid or does not fit.
        """
        top, specs = entry.point_specs()
        sweep_name = top.name if entry.axes else None
        jobs = []
        for i, profile_name in enumerate(profiles):
            profile = self.profile(profile_name, profile_label(i))
            if entry.axes and self.planners.wants_array(profile):  # the whole grid as one SLURM job array
                members = [self.planners.array_member(spec.name, point, spec) for point, spec in specs]
                job_plan = self.planners.array(top.name, members, profile, self.templates, spec_source=entry.label,
                                               profile_source=profile_name, spec_file=entry.spec_file)
                grid = tuple((a.key, a.values) for a in entry.axes)
                jobs.append(RenderedJob(entry.entry, entry.label, entry.overrides, (), job_plan, grid, sweep_name))
                continue
            for point, spec in specs:
                job_plan = self.planners.job(spec, profile, self.templates, spec_source=entry.label, profile_source=profile_name,
                                             spec_file=entry.spec_file)
                jobs.append(RenderedJob(entry.entry, entry.label, entry.overrides, point, job_plan, sweep_name=sweep_name))
        return jobs


def find_templates(override: str | os.PathLike[str] | None) -> Path:
    """The templates directory through the lookup order (:func:`jobgen.specs.load.search_dirs`:
    flag > $JOBGEN_HOME > ./templates > packaged).

    Raises:
        ConfigError: none exists.
    """
    dirs = search_dirs("templates", override)
    if not dirs:
        raise ConfigError("no templates directory found", hint="pass --templates-dir or set JOBGEN_HOME")
    return dirs[0]


def job_files(jobs: Iterable[RenderedJob]) -> dict[str, str]:
    """Every job's files as ``{"<profile>/<job>/<file>": text}``."""
    return {f"{job.subdir}/{name}": text for job in jobs for name, text in job.plan.files}


def check_unique_dirs(jobs: Sequence[RenderedJob], where: str) -> None:
    """Refuse two jobs that render the same ``<profile>/<job>/`` directory.

    Raises:
        ConfigError: naming both jobs' entries and specs, located at ``where``.
    """
    seen: dict[str, RenderedJob] = {}
    for job in jobs:
        other = seen.setdefault(job.subdir, job)
        if other is not job:
            raise ConfigError(
                f"{other.entry} ({other.spec}) and {job.entry} ({job.spec}) both render {job.subdir}/",
                location=where,
                hint="give one of them another name, e.g. set: [name=<other name>] (or --set name=...)",
            )


@dataclass(frozen=True)
class SpecOptions:
    """How to plan one spec given on the command line (``jobgen render SPEC``, ``jobgen submit SPEC --sweep``).

    Attributes:
        overrides: ``--set key.path=value`` overrides, in order.
        sweeps: ``--sweep key.path=v1,v2`` axes (the Cartesian grid).
        out: the output root the render is for.
        profiles_dir, templates_dir: the ``--profiles-dir`` and ``--templates-dir`` overrides.
        loaded_profile: the profile already loaded (``jobgen submit``'s, with its ``--preflight``).
        transform: applied to each planned spec (``--smoke``: see :class:`SpecEntry`).
        spec_file: the spec file carried to submit (:attr:`~jobgen.planning.plan.JobPlan.spec_file`).
    """

    overrides: Sequence[str] = ()
    sweeps: Sequence[str] = ()
    out: str | os.PathLike[str] = "manifests"
    profiles_dir: str | None = None
    templates_dir: str | None = None
    loaded_profile: ClusterProfile | None = None
    transform: SpecTransform | None = None
    spec_file: str | None = None


def plan_single(spec: str, profile: str, planners: Planners, options: SpecOptions | None = None) -> Render:
    """Plan one spec for one profile (a sweep: one job per grid point, or one SLURM job array
    where the profile says ``slurm.sweep_as_array``) into ``options.out``, with the backends'
    ``planners``. ``jobgen submit --sweep`` (:mod:`jobgen.api.sweep`) passes the profile it
    loaded, ``--smoke``'s transform and the spec file in ``options``.

    Raises:
        ConfigError, PlanError: as :func:`jobgen.specs.load.load_spec` and :func:`jobgen.backends.plan`;
            a malformed ``--sweep``.
    """
    options = options or SpecOptions()
    entry = SpecEntry("command line", Path(spec), spec, tuple(options.overrides), tuple(parse_sweep(s) for s in options.sweeps),
                      options.transform, options.spec_file)
    loaded = {profile: options.loaded_profile} if options.loaded_profile is not None else {}
    planner = SpecPlanner(planners, find_templates(options.templates_dir), options.profiles_dir, loaded)
    jobs = planner.plan(entry, [profile], lambda i: "--profile")
    check_unique_dirs(jobs, "--sweep")
    jobs.sort(key=lambda j: j.subdir)
    return Render(Path(options.out).resolve(), job_files(jobs), tuple(jobs), whole_tree=False, source=spec)
