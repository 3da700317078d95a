"""``jobgen submit SPEC --sweep key.path=v1,v2 ...``: render a sweep and submit it in one command.

The sweep is planned exactly as ``jobgen render --sweep`` plans it (:func:`jobgen.planning.sweep.plan_single`:
the same parser, grid, job names and array rule), every point before anything is written, so bad
input (a malformed axis, a point that does not validate or fit) stops it with nothing written or
submitted. Then, in grid order (first axis slowest):

- a SLURM profile with ``slurm.sweep_as_array: true``: ONE job array (one job directory, one
  ``sbatch``; :mod:`jobgen.backends.slurm.array`);
- any other profile (local, Kubernetes, SLURM without arrays): one job per point, each through
  :func:`jobgen.api.submit` (which writes the job directory and puts it back when its backend
  refuses before queueing). A local point runs in the foreground, one after the other.

Every job submitted gets the same :class:`~jobgen.jobdir.SweepTag` (a new id, the base name, the
grid size and its point) in its submission record, so ``jobgen ls`` lists the sweep together. The
first point that fails stops the sweep: when nothing was submitted its error is raised as it is;
otherwise :class:`SweepPartlySubmitted` (exit 1) names the points submitted and those not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import api
from jobgen.backends import get_backend
from jobgen.backends.base import Echo, SubmitOptions, SubmitResult
from jobgen.errors import ConfigError, JobgenError, SubmitError
from jobgen.jobdir.files import SPEC_FILE, SUBMISSION_FILE, point_file
from jobgen.jobdir.spec import ResolvedSpec
from jobgen.jobdir.submission import Submission, SweepTag, new_sweep_id
from jobgen.planning.plan import JobPlan
from jobgen.planning.sweep import SpecOptions, plan_single
from jobgen.specs.sweeps import SweepAxis, parse_sweep, sweep_points
from jobgen.specs.training import TrainingSpec

Point = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class SweepJob:
    """One job of a planned sweep: ``index`` its point in grid order and ``point`` the point's
    ``((key, value), ...)``, or ``index`` None and ``point`` empty for a job array (the whole grid)."""

    index: int | None
    point: Point
    plan: JobPlan

    @property
    def name(self) -> str:
        """The job's name (a point's ``<base>-<key><value>-...``, or the array's base name)."""
        return self.plan.job_name

    def describe(self) -> str:
        """``name (key=value, ...)`` for messages."""
        return f"{self.name} ({', '.join(f'{k}={v}' for k, v in self.point)})" if self.point else self.name


@dataclass(frozen=True)
class SweepPlan:
    """A sweep planned for submission: ``name`` its base name, ``profile`` the profile's name,
    ``axes`` the grid, ``jobs`` what will be submitted in order (one job array, or one job per point)."""

    name: str
    profile: str
    axes: tuple[SweepAxis, ...]
    jobs: tuple[SweepJob, ...]

    @property
    def points(self) -> int:
        """The number of grid points (product of the axes' lengths)."""
        return math.prod(len(a.values) for a in self.axes)

    @property
    def array(self) -> bool:
        """Whether the sweep is one SLURM job array."""
        return len(self.jobs) == 1 and self.jobs[0].index is None

    def point_specs(self) -> list[tuple[str, TrainingSpec]]:
        """``(label, spec)`` of every point as planned (read back from the plans' spec.json files)."""
        out = []
        for job in self.jobs:
            if job.index is not None:
                out.append((job.describe(), ResolvedSpec.model_validate_json(job.plan.file(SPEC_FILE)).spec))
                continue
            for i in range(self.points):
                spec = ResolvedSpec.model_validate_json(job.plan.file(point_file(i, SPEC_FILE))).spec
                out.append((f"{spec.name} (array task {i})", spec))
        return out


def plan_sweep(spec: str, profile: str, sweeps: Sequence[str], *, overrides: Sequence[str] = (), profiles_dir: str | None = None,
               templates_dir: str | None = None, preflight: bool = False, smoke: int | None = None) -> SweepPlan:
    """Plan ``spec`` on ``profile`` for every point of ``sweeps`` (``key.path=v1,v2`` each, the
    ``--sweep`` syntax) as ``jobgen render --sweep`` does; ``preflight``, ``smoke``: as ``jobgen
    submit`` (``--smoke N`` turns each point into its smoke run, ``<point name>-smoke``, and the
    sweep's name into ``<name>-smoke``). Pure apart from reading the spec, profile and templates.

    Raises:
        ConfigError: no sweep, or a malformed one (:func:`jobgen.specs.sweeps.parse_sweep`), or a point
            whose spec is invalid (located at its point).
        PlanError: a point does not fit the profile, or the points cannot share one job array.
    """
    if not sweeps:
        raise ConfigError("a sweep needs at least one --sweep key.path=v1,v2", location="--sweep",
                          hint="e.g. --sweep trainer.learning_rate=1e-4,3e-4")
    axes = tuple(parse_sweep(s) for s in sweeps)
    loaded = api.submit_profile(profile, profiles_dir, preflight=preflight)
    transform = (lambda s, source: api.as_smoke(s, smoke, source)) if smoke is not None else None
    render = plan_single(spec, profile, api.PLANNERS, SpecOptions(overrides=overrides, sweeps=sweeps, profiles_dir=profiles_dir,
                                                                  templates_dir=templates_dir, loaded_profile=loaded,
                                                                  transform=transform, spec_file=spec))
    grid = [tuple(job.sweep) for job in render.jobs]
    order = {tuple(point): i for i, point in enumerate(sweep_points(axes))}
    jobs = sorted((SweepJob(order[p] if p else None, p, job.plan) for p, job in zip(grid, render.jobs, strict=True)),
                  key=lambda j: -1 if j.index is None else j.index)
    name = render.jobs[0].sweep_name or render.jobs[0].plan.job_name
    return SweepPlan(name, loaded.name, axes, tuple(jobs))


@dataclass(frozen=True)
class SweepOutcome:
    """What :func:`submit_sweep` did: ``sweep_id`` the id every record got; ``submitted`` each
    job submitted and its result, in order; ``failed`` the job whose submission failed (None when
    all went through) with ``error`` and ``failed_record`` (the record of a job that started and
    then failed, e.g. a local run whose training exited non-zero; else None); ``not_submitted``
    the jobs after it, never tried."""

    sweep_id: str
    plan: SweepPlan
    submitted: tuple[tuple[SweepJob, SubmitResult], ...]
    failed: SweepJob | None = None
    error: JobgenError | None = None
    failed_record: Submission | None = None
    not_submitted: tuple[SweepJob, ...] = ()

    @property
    def unsubmitted(self) -> tuple[SweepJob, ...]:
        """Every job that was not submitted: the failed one unless it started, and those never tried."""
        failed = (self.failed,) if self.failed is not None and self.failed_record is None else ()
        return failed + self.not_submitted


class SweepPartlySubmitted(SubmitError):
    """A one-job-per-point sweep failed after submitting some of its points (exit 1);
    ``outcome`` says which were submitted, which failed and which were never tried."""

    def __init__(self, outcome: SweepOutcome, error: JobgenError, failed: SweepJob):
        cause = f"{error.location}: {error.message}" if error.location else error.message
        lines = [f"sweep {outcome.sweep_id}: point {failed.index}, {failed.describe()}, failed: {cause}",
                 f"  submitted ({len(outcome.submitted)} of {outcome.plan.points}):",
                 *(f"    {job.describe()}: {result.handle or result.action}" for job, result in outcome.submitted)]
        if outcome.failed_record is not None:
            lines += ["  started, then failed:", f"    {failed.describe()}: {outcome.failed_record.handle}"]
        lines += [f"  not submitted ({len(outcome.unsubmitted)}):", *(f"    {job.describe()}" for job in outcome.unsubmitted)]
        super().__init__("\n".join(lines), hint=(error.hint + "; then " if error.hint else "fix the cause above, then ")
                         + "submit the points not submitted (--sweep with their values, or --set for one point)")
        self.outcome = outcome


def _record_bytes(job_dir: Path) -> bytes | None:
    record = job_dir / SUBMISSION_FILE
    return record.read_bytes() if record.is_file() else None


def _tag(record: Submission, tag: SweepTag) -> Submission:
    tagged = record.model_copy(update={"sweep": tag})
    tagged.save()
    return tagged


def submit_sweep(sweep: SweepPlan, options: SubmitOptions | None = None, *, out: str | Path | None = None, echo: Echo = print,
                 sweep_id: str | None = None) -> SweepOutcome:
    """Submit every job of ``sweep`` in order (see the module doc) and tag each submission record
    with one :class:`~jobgen.jobdir.SweepTag` (``sweep_id``: a new one by default). ``options``,
    ``out``: as :func:`jobgen.api.submit`, for every job. A test-only or dry run
    (``options.test_only`` / ``dry_run``) validates every job and records nothing.

    Raises:
        JobgenError: the first job failed (nothing was submitted): its error, as it is.
        SweepPartlySubmitted: a later job failed; earlier ones stay submitted (exit 1).
    """
    options = options or SubmitOptions()
    sweep_id = sweep_id or new_sweep_id(sweep.name)
    done: list[tuple[SweepJob, SubmitResult]] = []
    for position, job in enumerate(sweep.jobs):
        tag = SweepTag(id=sweep_id, name=sweep.name, points=sweep.points, index=job.index, overrides=dict(job.point))
        backend = get_backend(job.plan.scheduler)
        job_dir = backend.job_dir(job.plan, Path(out) if out is not None else None, options)
        before = _record_bytes(job_dir)
        if len(sweep.jobs) > 1:
            echo(f"jobgen: sweep point {position + 1}/{len(sweep.jobs)}: {job.describe()}")
        try:
            result = api.submit(job.plan, options, out=out, echo=echo)
        except JobgenError as exc:
            started = _record_bytes(job_dir)
            record = _tag(Submission.load(job_dir / SUBMISSION_FILE), tag) if started is not None and started != before else None
            if not done and record is None:
                raise
            outcome = SweepOutcome(sweep_id, sweep, tuple(done), job, exc, record, sweep.jobs[position + 1:])
            raise SweepPartlySubmitted(outcome, exc, job) from exc
        if result.record is not None:
            result = SubmitResult(result.action, result.handle, _tag(result.record, tag), result.lines)
        done.append((job, result))
    return SweepOutcome(sweep_id, sweep, tuple(done))


def outcome_json(outcome: SweepOutcome, job_json: Any) -> dict[str, Any]:
    """``jobgen submit --sweep -o json``: ``{"sweep": {id, name, profile, array, points, axes},
    "jobs": [job_json(result) + {index, name, point}], "not_submitted": [{index, name, point}],
    "failed": {index, name, point, handle} | null}``; ``job_json`` makes one job's document as
    ``jobgen submit -o json`` prints it for a single job."""
    plan = outcome.plan

    def ref(job: SweepJob) -> dict[str, Any]:
        return {"index": job.index, "name": job.name, "point": dict(job.point)}

    failed = None
    if outcome.failed is not None:
        failed = {**ref(outcome.failed), "handle": outcome.failed_record.handle if outcome.failed_record else None}
    return {
        "sweep": {"id": outcome.sweep_id, "name": plan.name, "profile": plan.profile, "array": plan.array, "points": plan.points,
                  "axes": {a.key: list(a.values) for a in plan.axes}},
        "jobs": [{**job_json(result), **ref(job)} for job, result in outcome.submitted],
        "failed": failed,
        "not_submitted": [ref(job) for job in outcome.unsubmitted],
    }
