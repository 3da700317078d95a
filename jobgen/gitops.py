"""GitOps: the rendered files under ``manifests/`` are the source of truth that users commit.

What lives here (the CLI's ``render --all/--check/--prune/--commit/--sweep`` and ``diff`` call
into it):

- the project file ``jobgen.yaml`` (:class:`Project`): which specs render for which profiles,
  with ``--set``-style overrides and sweeps;
- sweeps (:func:`parse_sweep`, :func:`sweep_points`, :func:`sweep_job_names`): a Cartesian
  grid of override values, one job per point, with readable, DNS-1035-safe, collision-proof
  names, each point applied through the same override path as ``--set``;
- a :class:`Render`: the complete desired state of an output tree (every job's files plus, for
  the whole project, ``index.yaml`` and the kustomizations that make it ``kubectl apply -k``
  ready) computed without writing anything;
- :func:`compare`: desired state vs disk (new, changed, stale files; exec bits), from which
  come the unified diff (:func:`unified_diff`), the writes (:func:`apply`) and the commit
  (:func:`commit`, the git CLI through argv lists).

Everything before :func:`apply` is pure: bad input raises a :class:`JobgenError` before a
single file is written. Files jobgen did not write are never modified or deleted.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobgen import __version__
from jobgen.errors import EXIT_RUNTIME, ConfigError, JobgenError
from jobgen.jobdir import (
    EXECUTABLE_FILES,
    GENERATED_MARK,
    JOB_FILES,
    KUSTOMIZATION_FILE,
    MAX_NAME,
    is_generated,
    is_job_dir,
    kustomization_yaml,
    write_atomic,
)
from jobgen.load import apply_overrides, load_profile, read_yaml, search_dirs, validate
from jobgen.plan import JobPlan, plan
from jobgen.profiles import ClusterProfile
from jobgen.spec import TrainingSpec

PROJECT_FILE = "jobgen.yaml"
INDEX_FILE = "index.yaml"
#: Every file jobgen generates with a header says so in its first lines (spec.json: a key).
#: Files jobgen may write into a job directory (kustomization.yaml only when it carries the mark).

#: Short names of common spec fields in sweep job names (``quickstart-lr1e-4-mbs4``); other
#: fields use their last path segment without underscores.
SWEEP_ABBREVIATIONS: dict[str, str] = {
    "learning_rate": "lr",
    "micro_batch_size": "mbs",
    "gradient_accumulation_steps": "gas",
    "global_batch_size": "gbs",
    "max_steps": "steps",
    "warmup_steps": "warmup",
    "weight_decay": "wd",
    "gradient_clip_val": "clip",
    "devices_per_node": "dpn",
    "time_limit_min": "time",
    "fsdp_sharding_strategy": "shard",
    "offload_optimizer": "offopt",
    "offload_params": "offparam",
    "val_fraction": "valfrac",
    "max_bytes": "bytes",
    "block_size": "ctx",
    "d_model": "dmodel",
    "n_layer": "layers",
    "n_head": "heads",
    "every_n_steps": "ckpt",
}


# --------------------------------------------------------------------------- sweeps


@dataclass(frozen=True)
class SweepAxis:
    """One sweep axis: a spec field path and its values, as text (parsed as YAML when applied,
    exactly like ``--set key.path=value``)."""

    key: str
    values: tuple[str, ...]


def _split_values(raw: str) -> list[str]:
    """Split ``v1,v2,...`` on commas outside brackets, braces and quotes (``[a,b],c`` -> 2 values)."""
    values, depth, quote, current = [], 0, "", []
    for char in raw:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    values.append("".join(current).strip())
    return values


def _check_axis(key: str, values: Sequence[str]) -> SweepAxis:
    """Validate one axis; raises ValueError (pydantic turns it into a located error)."""
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"sweep key {key!r} is not a key.path (e.g. trainer.learning_rate)")
    if key == "name":
        raise ValueError("'name' cannot be swept: sweep jobs are named <name>-<values>; set the base name with set/--set name=...")
    if not values or any(v == "" for v in values):
        raise ValueError(f"sweep {key!r} needs one or more non-empty values (e.g. {key}=1,2)")
    dupes = sorted({v for v in values if list(values).count(v) > 1})
    if dupes:
        raise ValueError(f"sweep {key!r} lists {', '.join(dupes)} more than once")
    return SweepAxis(key, tuple(values))


def parse_sweep(text: str, source: str = "--sweep") -> SweepAxis:
    """Parse ``key.path=v1,v2,...`` (commas inside ``[...]``, ``{...}`` or quotes do not split).

    Raises:
        ConfigError: no ``=``, an empty key segment, ``name`` as key, an empty or repeated value.
    """
    key, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError(f"sweep {text!r} is not key.path=v1,v2,...", location=source, hint="e.g. --sweep trainer.learning_rate=1e-4,3e-4")
    try:
        return _check_axis(key.strip(), _split_values(raw))
    except ValueError as exc:
        raise ConfigError(str(exc), location=source, hint="e.g. --sweep trainer.learning_rate=1e-4,3e-4") from None


def sweep_points(axes: Sequence[SweepAxis]) -> list[tuple[tuple[str, str], ...]]:
    """The Cartesian grid of ``axes`` in a fixed order (first axis slowest): one
    ``((key, value), ...)`` tuple per job. No axes: one empty point.

    Raises:
        ConfigError: the same key in two axes.
    """
    keys = [a.key for a in axes]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ConfigError(f"sweep key {repeated[0]!r} is given twice", hint="give all its values in one sweep: key=v1,v2,...")
    return [tuple(zip(keys, combo, strict=True)) for combo in itertools.product(*(a.values for a in axes))]


def _abbreviation(key: str) -> str:
    last = key.rsplit(".", 1)[-1]
    return SWEEP_ABBREVIATIONS.get(last) or re.sub(r"[^a-z0-9]+", "", last.lower()) or "x"


_EXACT_TOKEN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_DECIMAL = re.compile(r"^[0-9]*\.[0-9]+(e-?[0-9]+)?$")


def _value_token(text: str) -> tuple[str, bool]:
    """``(token, faithful)``: a name-safe token for a sweep value. Faithful: the text itself when
    it is ``[a-z0-9-]`` (``1e-4``, ``bf16-mixed``), or a decimal number with ``.`` written as
    ``p`` (``0.0003`` -> ``0p0003``). Anything else is lowercased with other runs as ``-`` and is
    not faithful (``FULL_SHARD``, ``-1``, ``[a, b]``): the name then carries a hash."""
    if _EXACT_TOKEN.match(text):
        return text, True
    if _DECIMAL.match(text):
        return text.replace(".", "p"), True
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x", False


def _point_hash(base: str, point: Sequence[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps([base, [list(kv) for kv in point]]).encode()).hexdigest()[:8]


def sweep_job_names(base: str, points: Sequence[Sequence[tuple[str, str]]]) -> list[str]:
    """Job names for the sweep ``points`` of a spec named ``base``, in the same order.

    ``<base>-<abbr><value>-...`` (``quickstart-lr1e-4-mbs4``): each key's short name (see
    :data:`SWEEP_ABBREVIATIONS`) followed by the value's token (``0.0003`` -> ``0p0003``). A
    name is suffixed with ``-`` and 8 hex digits of sha256(base, point) when a token does not
    spell its value faithfully (``FULL_SHARD`` -> ``full-shard``, ``-1`` -> ``1``: never a
    silently mangled name), when another value of the same key gives the same token (``0.5``
    and ``0p5``), when two points would otherwise get the same name, or when the name is longer
    than :data:`~jobgen.jobdir.MAX_NAME` (48) characters (the readable part is truncated). A base that is a DNS-1035 label thus gives DNS-1035 names.
    A name depends on its point, and on the other values of the grid only when two values of
    one key share a token.

    Raises:
        ConfigError: two points still share a name (only possible through a hash collision).
    """
    if not points or not points[0]:
        return [base for _ in points]
    keys = [k for k, _ in points[0]]
    short = [_abbreviation(k) for k in keys]
    # Two keys with the same short name (model.dropout, x.dropout): spell their paths out.
    abbrs = [re.sub(r"[^a-z0-9]+", "-", k.lower()).strip("-") if short.count(a) > 1 else a for k, a in zip(keys, short, strict=True)]
    needs_hash: set[tuple[int, str]] = set()
    for i in range(len(keys)):
        values = sorted({dict(p)[keys[i]] for p in points})
        tokens = [_value_token(v) for v in values]
        needs_hash |= {(i, v) for v, (t, faithful) in zip(values, tokens, strict=True)
                       if not faithful or [u for u, _ in tokens].count(t) > 1}
    names = []
    for point in points:
        readable = "-".join([base, *(a + _value_token(v)[0] for a, (_, v) in zip(abbrs, point, strict=True))])
        hashed = any((i, v) in needs_hash for i, (_, v) in enumerate(point)) or len(readable) > MAX_NAME
        names.append((readable, hashed, point))
    counts = {r: sum(1 for o, _, _ in names if o == r) for r, _, _ in names}
    out = []
    for readable, hashed, point in names:
        if hashed or counts[readable] > 1:
            readable = f"{readable[: MAX_NAME - 9].rstrip('-')}-{_point_hash(base, point)}"
        out.append(readable)
    if len(set(out)) != len(out):
        raise ConfigError(f"sweep of {base!r} gives two jobs the same name", hint="spell the sweep values differently")
    return out


# --------------------------------------------------------------------------- project file


class _ProjectModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _scalar_text(value: str | bool | int | float) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


class ProjectJob(_ProjectModel):
    """One entry of ``jobs:``: a spec rendered for one or more profiles."""

    spec: str = Field(min_length=1)
    """Training spec file, relative to the directory of ``jobgen.yaml``."""
    profiles: tuple[str, ...] = Field(min_length=1)
    """Cluster profiles to render the spec for (names as in ``jobgen profiles list``)."""
    overrides: tuple[str, ...] = Field(default=(), alias="set")
    """Spec overrides, exactly like ``--set key.path=value`` (value parsed as YAML)."""
    sweep: tuple[str, ...] | dict[str, tuple[str | bool | int | float, ...]] = ()
    """Sweep axes, like ``--sweep``: ``key.path=v1,v2`` strings or a mapping of key path to a list of values; one job per point of the grid."""

    @field_validator("profiles")
    @classmethod
    def _profiles_unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({p for p in value if value.count(p) > 1})
        if repeated:
            raise ValueError(f"profile {repeated[0]!r} is listed twice")
        return value

    @field_validator("overrides")
    @classmethod
    def _overrides_are_assignments(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if "=" not in item or item.startswith("="):
                raise ValueError(f"override {item!r} is not key.path=value (e.g. trainer.max_steps=200)")
        return value

    @field_validator("sweep")
    @classmethod
    def _sweep_parses(cls, value: Any) -> Any:
        cls.parse_axes(value)
        return value

    @staticmethod
    def parse_axes(sweep: tuple[str, ...] | Mapping[str, Sequence[Any]]) -> tuple[SweepAxis, ...]:
        """The sweep as axes, in the order written.

        Raises:
            ValueError: an axis is malformed (see :func:`parse_sweep`) or a key repeats.
        """
        if isinstance(sweep, Mapping):
            axes = [_check_axis(k, [_scalar_text(v) for v in values]) for k, values in sweep.items()]
        else:
            axes = []
            for text in sweep:
                key, sep, raw = text.partition("=")
                if not sep:
                    raise ValueError(f"sweep {text!r} is not key.path=v1,v2,...")
                axes.append(_check_axis(key.strip(), _split_values(raw)))
        keys = [a.key for a in axes]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"sweep key {repeated[0]!r} is given twice")
        return tuple(axes)

    @property
    def axes(self) -> tuple[SweepAxis, ...]:
        """The sweep axes (validated at load)."""
        return self.parse_axes(self.sweep)


class Project(_ProjectModel):
    """``jobgen.yaml``: which specs render for which profiles (``jobgen render --all``)."""

    jobgen_schema_kind: ClassVar[str] = "project"

    out: str = "manifests"
    """Output root, relative to ``jobgen.yaml``: jobs go to ``<out>/<profile>/<job>/``."""
    profiles_dir: str | None = None
    """Directory searched first for profiles, relative to ``jobgen.yaml``; ``null``: ``$JOBGEN_HOME``,
    then ``cluster_profiles/`` next to ``jobgen.yaml``, then the packaged ones."""
    templates_dir: str | None = None
    """Directory of the templates, relative to ``jobgen.yaml``; ``null``: ``$JOBGEN_HOME``, then
    ``templates/`` next to ``jobgen.yaml``, then the packaged ones."""
    top_level_kustomization: bool = True
    """Write ``<out>/kustomization.yaml`` over every Kubernetes profile (needs object names unique across them); per-profile ones are always written."""
    jobs: tuple[ProjectJob, ...]
    """The specs to render, each for its profiles."""

    @field_validator("jobs")
    @classmethod
    def _some_jobs(cls, value: tuple[ProjectJob, ...]) -> tuple[ProjectJob, ...]:
        if not value:
            raise ValueError("list at least one job (spec + profiles)")
        return value

    @field_validator("out")
    @classmethod
    def _out_is_a_subdirectory(cls, value: str) -> str:
        path = PurePosixPath(value.replace("\\", "/"))
        if path.is_absolute() or ".." in path.parts or str(path) in ("", "."):
            raise ValueError("out must be a subdirectory of the project, like 'manifests'")
        return str(path)


@dataclass(frozen=True)
class LoadedProject:
    """A validated project file and the directory its paths are relative to."""

    path: Path
    root: Path
    project: Project


def find_project(start: Path | None = None) -> Path:
    """``jobgen.yaml`` in ``start`` (default: the working directory) or the nearest parent.

    Raises:
        ConfigError: none found.
    """
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / PROJECT_FILE
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"no {PROJECT_FILE} in {here} or its parent directories",
        hint=f"create {PROJECT_FILE} (see README, 'GitOps') or pass --project PATH",
    )


def load_project(path: str | os.PathLike[str] | None = None) -> LoadedProject:
    """Read and validate a project file (``None``: :func:`find_project`).

    Raises:
        ConfigError: missing/unreadable file, bad YAML, unknown keys (did-you-mean), bad values;
            the message names the file and the field path (``jobs[1].sweep``).
    """
    file = Path(path) if path is not None else find_project()
    doc = read_yaml(file)
    project = validate(Project, doc, str(file))
    return LoadedProject(file, file.resolve().parent, project)


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class RenderedJob:
    """One planned job: its plan plus where it came from (for the index, messages and commits)."""

    entry: str
    spec: str
    overrides: tuple[str, ...]
    sweep: tuple[tuple[str, str], ...]
    plan: JobPlan

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
) -> list[RenderedJob]:
    """Plan one spec (with its overrides and sweep grid) for each profile."""
    base_doc = apply_overrides(read_yaml(spec_path), overrides)
    base = validate(TrainingSpec, base_doc, spec_label)
    points = sweep_points(axes)
    specs: list[tuple[tuple[tuple[str, str], ...], TrainingSpec]] = []
    if axes:
        for point, name in zip(points, sweep_job_names(base.name, points), strict=True):
            doc = apply_overrides(base_doc, [f"{k}={v}" for k, v in point], source="--sweep")
            doc["name"] = name
            shown = ", ".join(f"{k}={v}" for k, v in point)
            specs.append((point, validate(TrainingSpec, doc, f"{spec_label} (sweep point {shown})")))
    else:
        specs.append(((), base))
    jobs = []
    for i, profile_name in enumerate(profiles):
        if profile_name not in profile_cache:
            try:
                profile_cache[profile_name] = load_profile(profile_name, profiles_dir)
            except JobgenError as exc:
                exc.location = f"{profile_label(i)}" + (f" > {exc.location}" if exc.location else "")
                raise
        profile = profile_cache[profile_name]
        for point, spec in specs:
            job_plan = plan(spec, profile, templates, spec_source=spec_label, profile_source=profile_name)
            jobs.append(RenderedJob(entry, spec_label, tuple(overrides), point, job_plan))
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
) -> Render:
    """Plan one spec for one profile (a sweep: one job per grid point) into ``out``.

    Raises:
        ConfigError, PlanError: as :func:`jobgen.load.load_spec` and :func:`jobgen.plan.plan`;
            a malformed ``--sweep``.
    """
    axes = [parse_sweep(s) for s in sweeps]
    jobs = _plan_spec(
        entry="command line", spec_path=Path(spec), spec_label=spec, profiles=[profile], overrides=overrides, axes=axes,
        profiles_dir=profiles_dir, templates=_templates_dir(templates_dir), profile_cache={}, profile_label=lambda i: "--profile",
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
    seen: dict[tuple[str, str], RenderedJob] = {}
    for job in jobs:
        obj = job.plan.cluster_object
        if obj is None:
            continue
        other = seen.setdefault(obj.key, job)
        if other is not job:
            raise ConfigError(
                f"{other.subdir} and {job.subdir} both define {obj.kind} {obj.name!r} in namespace {obj.namespace!r}; "
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
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class Change:
    """One file that differs between the desired state and disk.

    ``old``: bytes on disk (None: the file is new); ``new``: desired text (None: to be removed);
    ``old_exec``/``new_exec``: the owner-execute bit; ``stale_dir``: the removal belongs to a
    job directory the project no longer lists (carried out only with ``--prune``).
    """

    path: str
    old: bytes | None
    new: str | None
    old_exec: bool = False
    new_exec: bool = False
    stale_dir: str | None = None

    @property
    def kind(self) -> str:
        """``add``, ``delete``, ``modify`` or ``mode``."""
        if self.old is None:
            return "add"
        if self.new is None:
            return "delete"
        return "modify" if self.old != self.new.encode() else "mode"


@dataclass
class Comparison:
    """Desired state vs disk: the changes, stale job directories and what was left alone."""

    render: Render
    changes: list[Change] = field(default_factory=list)
    stale_dirs: list[str] = field(default_factory=list)
    foreign: dict[str, list[str]] = field(default_factory=dict)
    unchanged: int = 0

    @property
    def in_sync(self) -> bool:
        """No file would change (stale job directories count as changes)."""
        return not self.changes


def is_exec(name: str) -> bool:
    """Whether jobgen writes ``name`` executable (0755; the rest 0644), as the job directory contract says."""
    return PurePosixPath(name).name in EXECUTABLE_FILES


def _read(path: Path) -> bytes | None:
    """Bytes of ``path``; None when it does not exist.

    Raises:
        ConfigError: a directory stands where jobgen writes a file (or a file where it needs a
            directory), or the file cannot be read.
    """
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except (IsADirectoryError, NotADirectoryError):
        raise ConfigError(f"cannot write {path}: a directory stands where jobgen writes a file, or a file where it needs a directory",
                          hint="move the file or directory that is in the way") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def _owned_in_job_dir(directory: Path) -> list[str]:
    """Names of the files in ``directory`` that jobgen wrote (and may replace or remove)."""
    if not directory.is_dir():
        return []
    names = []
    for entry in sorted(directory.iterdir()):
        if entry.is_file() and entry.name in JOB_FILES and (entry.name != KUSTOMIZATION_FILE or is_generated(entry)):
            names.append(entry.name)
    return names


def compare(render: Render) -> Comparison:
    """Compare ``render`` with the files on disk (reads only).

    In scope: every desired file; files jobgen owns in the planned job directories; and for a
    project render, jobgen-owned job directories under ``out`` the project no longer lists
    (``stale_dirs``; files there that jobgen did not write are listed in ``foreign`` and never
    touched) and stale ``index.yaml``/``kustomization.yaml`` files that carry jobgen's header.
    """
    result = Comparison(render)
    out = render.out
    for rel, text in sorted(render.files.items()):
        path = out / rel
        old = _read(path)
        new_exec = is_exec(rel)
        old_exec = old is not None and bool(path.stat().st_mode & 0o100)
        if old is not None and old == text.encode() and old_exec == new_exec:
            result.unchanged += 1
            continue
        result.changes.append(Change(rel, old, text, old_exec, new_exec))
    for job_dir in sorted(render.job_dirs):
        for name in _owned_in_job_dir(out / job_dir):
            rel = f"{job_dir}/{name}"
            if rel not in render.files:
                result.changes.append(_removal(out, rel))
    if render.whole_tree and out.is_dir():
        for profile_dir in sorted(p for p in out.iterdir() if p.is_dir()):
            for job_dir in sorted(p for p in profile_dir.iterdir() if p.is_dir()):
                rel_dir = f"{profile_dir.name}/{job_dir.name}"
                if rel_dir in render.job_dirs or not is_job_dir(job_dir):
                    continue
                result.stale_dirs.append(rel_dir)
                owned = _owned_in_job_dir(job_dir)
                for name in owned:
                    result.changes.append(_removal(out, f"{rel_dir}/{name}", stale_dir=rel_dir))
                foreign = sorted(p.name for p in job_dir.iterdir() if p.name not in owned)
                if foreign:
                    result.foreign[rel_dir] = foreign
            aggregate = f"{profile_dir.name}/{KUSTOMIZATION_FILE}"
            if aggregate not in render.files and is_generated(out / aggregate):
                result.changes.append(_removal(out, aggregate))
        for aggregate in (INDEX_FILE, KUSTOMIZATION_FILE):
            if aggregate not in render.files and is_generated(out / aggregate):
                result.changes.append(_removal(out, aggregate))
    result.changes.sort(key=lambda c: c.path)
    return result


def _removal(out: Path, rel: str, stale_dir: str | None = None) -> Change:
    path = out / rel
    return Change(rel, path.read_bytes(), None, bool(path.stat().st_mode & 0o100), False, stale_dir)


# --------------------------------------------------------------------------- diff


def _lines(text: str) -> list[str]:
    lines = re.findall(r"[^\n]*\n|[^\n]+$", text)  # split on LF only, as git does
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def unified_diff(comparison: Comparison, display: str) -> str:
    """A unified diff (``a/`` = disk, ``b/`` = fresh render) of every change, paths shown as
    ``<display>/<path>``; new files come from ``/dev/null``, removed ones go to it, and an
    exec-bit change is shown as git does (``old mode``/``new mode``)."""
    parts = []
    for change in comparison.changes:
        shown = f"{display}/{change.path}" if display not in ("", ".") else change.path
        old_name = "/dev/null" if change.old is None else f"a/{shown}"
        new_name = "/dev/null" if change.new is None else f"b/{shown}"
        header = f"--- {old_name}\n+++ {new_name}\n"
        if change.kind == "mode":
            parts.append(f"{header}old mode {'100755' if change.old_exec else '100644'}\nnew mode {'100755' if change.new_exec else '100644'}\n")
            continue
        try:
            old_text = "" if change.old is None else change.old.decode("utf-8")
        except UnicodeDecodeError:
            parts.append(f"{header}(the file on disk is not UTF-8 text; jobgen would {'remove' if change.new is None else 'rewrite'} it)\n")
            continue
        new_text = change.new or ""
        if change.old is not None and change.new is not None and old_text.replace("\r\n", "\n") == new_text:
            parts.append(f"{header}(line endings: the file on disk has CRLF, jobgen writes LF; see .gitattributes in README 'GitOps')\n")
            continue
        body = "".join(difflib.unified_diff(_lines(old_text), _lines(new_text), old_name, new_name, n=3))
        if change.kind != "modify" or change.old_exec == change.new_exec:
            parts.append(body)
        else:
            mode = f"old mode {'100755' if change.old_exec else '100644'}\nnew mode {'100755' if change.new_exec else '100644'}\n"
            parts.append(header + mode + body.split("\n", 2)[2])
    return "".join(parts)


# --------------------------------------------------------------------------- write


def apply(comparison: Comparison, *, prune: bool) -> tuple[list[str], list[str]]:
    """Carry out the changes: write new/changed files, fix exec bits, remove owned files jobgen
    no longer renders; stale job directories only with ``prune`` (then empty job and profile
    directories are removed too). Returns ``(written, removed)`` paths relative to ``out``."""
    out = comparison.render.out
    written, removed = [], []
    for change in comparison.changes:
        path = out / change.path
        if change.new is not None:
            if change.kind == "mode":
                os.chmod(path, 0o755 if change.new_exec else 0o644)
            else:
                write_atomic(path, change.new, executable=change.new_exec)
            written.append(change.path)
        elif change.stale_dir is None or prune:
            path.unlink(missing_ok=True)
            removed.append(change.path)
    if prune:
        for rel_dir in comparison.stale_dirs:
            for directory in (out / rel_dir, (out / rel_dir).parent):
                try:
                    directory.rmdir()  # only when empty: files jobgen did not write stay
                except OSError:
                    break
    return written, removed


def pending(comparison: Comparison, *, prune: bool) -> list[Change]:
    """The changes :func:`apply` carries out with this ``prune`` setting."""
    return [c for c in comparison.changes if c.new is not None or c.stale_dir is None or prune]


# --------------------------------------------------------------------------- git


class GitError(JobgenError):
    """A git command failed, or the repository is not in a state to commit (exit 1).

    ``argv``, ``returncode`` and ``stderr`` say what ran and how it failed.
    """

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None, stderr: str = "", hint: str | None = None):
        detail = f"\n    $ {shlex.join(argv)}  (exit {returncode})" if argv else ""
        detail += "".join(f"\n    {line}" for line in stderr.strip().splitlines())
        super().__init__(message + detail, hint=hint)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr


def git(args: Sequence[str], cwd: Path, *, stdin: str | None = None, ok: Iterable[int] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run ``git ARGS`` in ``cwd`` (argv list, no shell) and return the finished process.

    Raises:
        GitError: git is missing, or it exits with a code not in ``ok`` (argv, code, stderr given).
    """
    argv = ["git", *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=120)
    except FileNotFoundError:
        raise GitError("git is not installed (or not on PATH)", argv=argv, hint="install git, or commit the rendered files yourself") from None
    except subprocess.TimeoutExpired:
        raise GitError("git did not finish within 120 s", argv=argv) from None
    if proc.returncode not in tuple(ok):
        raise GitError(f"git {args[0] if args else ''} failed", argv=argv, returncode=proc.returncode, stderr=proc.stderr)
    return proc


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path if path.is_dir() else path.parent


def commit_message(comparison: Comparison, paths: Sequence[str], command: str) -> str:
    """Commit message naming the specs and profiles of the jobs whose files are committed.

    ``paths``: committed paths relative to the output root. Subject: ``jobgen: render <specs>
    for <profiles>`` (a count when that is longer than 72 characters); body: one line per job
    directory, removed stale directory and other file (index, kustomizations).
    """
    render = comparison.render
    by_dir = {job.subdir: job for job in render.jobs}
    touched: dict[str, RenderedJob] = {}
    removed_dirs: set[str] = set()
    other: set[str] = set()
    for path in paths:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent in by_dir:
            touched[parent] = by_dir[parent]
        elif parent in comparison.stale_dirs:
            removed_dirs.add(parent)
        else:
            other.add(path)
    specs = sorted({j.spec for j in touched.values()})
    profiles = sorted({j.plan.profile for j in touched.values()})
    if specs:
        subject = f"jobgen: render {', '.join(specs)} for {', '.join(profiles)}"
        if len(subject) > 72:
            subject = f"jobgen: render {len(touched)} job(s) from {len(specs)} spec(s) for {len(profiles)} profile(s)"
    elif removed_dirs:
        subject = f"jobgen: prune {len(removed_dirs)} stale job(s)"
    else:
        subject = "jobgen: update " + ", ".join(sorted(other))
    shown = render.out.name
    body = [f"{shown}/{d}: {j.spec} on {j.plan.profile}" + (f" ({', '.join(f'{k}={v}' for k, v in j.sweep)})" if j.sweep else "")
            for d, j in sorted(touched.items())]
    body += [f"{shown}/{d}: removed (no longer rendered)" for d in sorted(removed_dirs)]
    body += [f"{shown}/{p}" for p in sorted(other)]
    return f"{subject}\n\n" + "\n".join(body) + f"\n\nRendered by jobgen {__version__}: {command}\n"


def commit(comparison: Comparison, *, prune: bool, command: str) -> tuple[list[str], list[str], str | None]:
    """Write the render and commit exactly its files with git.

    Before anything is written: refuses when the index holds staged changes to other paths.
    Then writes (as :func:`apply`), stages every rendered file and every removal, and commits
    with :func:`commit_message`. Nothing changed -> nothing is committed.

    Returns:
        ``(written, removed, commit id or None)``.

    Raises:
        GitError: not inside a git work tree, unrelated staged changes, or a git command failed
            (e.g. a commit hook refused: the rendered files are then written and staged).
    """
    out = comparison.render.out
    here = _existing_ancestor(out)
    top_text = git(["rev-parse", "--show-toplevel"], here).stdout.strip()
    if not top_text:
        raise GitError(f"{out} is not inside a git work tree", hint="run `git init`, or render without --commit")
    top = Path(top_text).resolve()
    changes = pending(comparison, prune=prune)

    def rel(path: str) -> str:
        return (out / path).relative_to(top).as_posix()

    try:
        ours = {rel(p) for p in comparison.render.files} | {rel(c.path) for c in changes}
    except ValueError:
        raise GitError(f"{out} is outside the git work tree {top}", hint="render into a directory of the repository") from None
    staged = [p for p in git(["diff", "--cached", "--name-only", "--no-renames", "-z"], top).stdout.split("\0") if p]
    unrelated = sorted(set(staged) - ours)
    if unrelated:
        shown = ", ".join(unrelated[:5]) + (f" and {len(unrelated) - 5} more" if len(unrelated) > 5 else "")
        raise GitError(
            f"refusing to commit: changes to files jobgen did not render are already staged ({shown}); nothing was written or committed",
            hint="commit or unstage them first (git restore --staged <path>), or render without --commit and commit yourself",
        )
    written, removed = apply(comparison, prune=prune)
    present = sorted(rel(p) for p in comparison.render.files)
    if present:
        git(["--literal-pathspecs", "add", "--pathspec-from-file=-", "--pathspec-file-nul"], top, stdin="\0".join(present) + "\0")
    gone = sorted(rel(p) for p in removed)
    if gone:
        git(["--literal-pathspecs", "rm", "--cached", "--quiet", "--ignore-unmatch", "--pathspec-from-file=-", "--pathspec-file-nul"],
            top, stdin="\0".join(gone) + "\0")
    if git(["diff", "--cached", "--quiet"], top, ok=(0, 1)).returncode == 0:
        return written, removed, None
    staged_now = [p for p in git(["diff", "--cached", "--name-only", "--no-renames", "-z"], top).stdout.split("\0") if p]
    out_rel = out.relative_to(top)
    committed = [Path(p).relative_to(out_rel).as_posix() for p in staged_now]
    git(["commit", "--quiet", "-m", commit_message(comparison, committed, command)], top)
    return written, removed, git(["rev-parse", "--short", "HEAD"], top).stdout.strip()


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
    sweep = "".join(f" --sweep {k}=..." for k, _ in jobs[0].sweep) if jobs and jobs[0].sweep else ""
    return f"jobgen render {render.source} --profile {jobs[0].plan.profile if jobs else '?'}{sweep}" + (" --commit" if commit_flag else "")


def render_command(render: Render, *, check: bool, prune: bool, commit_flag: bool, echo: Callable[..., Any]) -> int:
    """``jobgen render`` with ``--all``, ``--check``, ``--prune``, ``--commit`` or ``--sweep``.

    Returns the exit code: 0 written/committed/in sync; 1 ``--check`` found files that differ
    from a fresh render (the unified diff is printed on stdout).

    Raises:
        GitError: ``--commit`` refused or git failed.
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
