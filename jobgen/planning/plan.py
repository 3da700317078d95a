"""Planning: TrainingSpec + ClusterProfile -> JobPlan (pure: no subprocess, network, clock
or randomness; the same inputs give byte-identical files).

Holds the boundary objects :class:`JobPlan` (files + the exact steps submit takes) and
:class:`PlanContext` (a backend's inputs), and :func:`plan`, which resolves the world and runs
the rules of :mod:`jobgen.planning.rules` before the backend renders. Backends come from the lazy table
in :mod:`jobgen.backends`, so rendering a SLURM script never imports kubernetes or torch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pydantic_core

from jobgen import __version__
from jobgen.errors import PlanError
from jobgen.jobdir.files import write_job_files
from jobgen.jobdir.spec import LaunchSpec, ResolvedSpec
from jobgen.jobdir.world import World
from jobgen.planning.command import check_trainer_args
from jobgen.planning.environment import check_job_env
from jobgen.planning.render import template_sha256
from jobgen.planning.rules import check_fit, layout_warnings, resolve_elastic_batch, resolve_precision, resolve_world
from jobgen.planning.tracking import check_tracking, resolve_tracking
from jobgen.specs.capabilities import capabilities
from jobgen.specs.profile import ClusterProfile, Placeholder, SshSettings, example_values
from jobgen.specs.training import TrainingSpec

__all__ = ["JOB_DIR_PLACEHOLDER", "SUBMIT_DIR_PLACEHOLDER", "ApiRequest", "ClusterObject", "Command", "JobPlan", "PlanContext",
           "SubmitStep", "World", "check_fit", "fit_warnings", "plan", "plan_context", "resolve_world"]


#: Placeholder in a planned command for the directory ``jobgen submit`` runs in (command mode:
#: where the user's script runs); submit fills it in.
SUBMIT_DIR_PLACEHOLDER = "<submit dir>"
#: Placeholder in a planned local command for the job (= run) directory, made absolute at submit.
JOB_DIR_PLACEHOLDER = "<job dir>"


@dataclass(frozen=True)
class Command:
    """A command submit runs: ``argv`` (never through a shell) with ``env`` added to the
    environment, in ``cwd`` (``None``: the job directory). Placeholders in ``<angle brackets>``
    are filled in at submit time (e.g. ``<runs dir>``: ``jobgen submit --runs-dir``;
    :data:`SUBMIT_DIR_PLACEHOLDER`). ``inherits``: variables the command takes from the
    submitting environment (the spec's ``secrets``; checked before it runs, never written into a
    file). ``stdin``: what submit feeds the command on its standard input, in words (empty:
    nothing)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    inherits: tuple[str, ...] = ()
    cwd: str | None = None
    stdin: str = ""

    def __str__(self) -> str:
        text = f"cd {shlex.quote(self.cwd)} && " if self.cwd is not None else ""
        text += "".join(f"{key}={shlex.quote(value)} " for key, value in self.env) + shlex.join(self.argv)
        notes = ([f"stdin: {self.stdin}"] if self.stdin else []) + ([f"from your environment: {', '.join(self.inherits)}"]
                                                                     if self.inherits else [])
        return text + (f"   # {'; '.join(notes)}" if notes else "")

    def filled(self, placeholders: dict[str, str]) -> Command:
        """This command with each placeholder (key) replaced by its value in argv, env and cwd."""

        def fill(text: str) -> str:
            for key, value in placeholders.items():
                text = text.replace(key, value)
            return text

        return Command(tuple(fill(a) for a in self.argv), tuple((k, fill(v)) for k, v in self.env), self.inherits,
                       None if self.cwd is None else fill(self.cwd), self.stdin)


@dataclass(frozen=True)
class ApiRequest:
    """An API request submit makes: ``method path?query`` with ``body`` naming the object
    sent, and ``when`` the condition under which it is made (empty: always)."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: str = ""
    when: str = ""

    def __str__(self) -> str:
        query = "?" + "&".join(f"{k}={v}" for k, v in self.query) if self.query else ""
        text = f"{self.method} {self.path}{query}"
        notes = [note for note in (self.body, self.when) if note]
        return text + (f"   # {'; '.join(notes)}" if notes else "")


SubmitStep = Command | ApiRequest


@dataclass(frozen=True)
class ClusterObject:
    """The object a job creates in its cluster (Kubernetes: the PyTorchJob or TrainJob), for
    GitOps: jobs applied together (one aggregating kustomization) must not share :attr:`key`.
    ``context`` and ``kubeconfig``: where the profile says to submit it (its
    ``kubernetes.context`` / ``kubernetes.kubeconfig``; None: the defaults), so submitting a
    plan needs no second load of the profile. ``objects``: the manifest's objects as parsed
    and checked when planning, in file order (what submit sends, so it need not read the
    written manifest back; not compared); empty where unknown."""

    kind: str
    namespace: str
    name: str
    context: str | None = None
    kubeconfig: str | None = None
    objects: tuple[dict[str, Any], ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace, name)``: what must be unique among jobs applied together (the objects
        that come with a job are named after it, so two kinds of one name collide too)."""
        return (self.namespace, self.name)


@dataclass(frozen=True)
class JobPlan:
    """Everything submit will write and do, computed without side effects.

    Attributes:
        scheduler: ``slurm``, ``kubernetes``, ``local`` or ``ssh``.
        profile: profile name (first directory level under the output root).
        job_name: the spec's name (second directory level).
        files: ``(relative file name, text)`` pairs, sorted by name.
        submit_steps: what ``jobgen submit`` does with the written directory, in order: the
            commands it runs or the API requests it makes (``str(plan)`` shows them).
        world: nodes x devices per node and the numbers derived from them.
        inputs_sha256: hash of the resolved spec + profile + templates (named in every file header).
        warnings: non-fatal findings to show the user.
        apply_files: the files (names in ``files``) an aggregating kustomization lists for this
            job (GitOps' per-profile and top-level ``kustomization.yaml``); empty for jobs that
            are not applied to a cluster (SLURM, local).
        cluster_object: what the job creates in its cluster, when it is applied (see
            ``apply_files``); None otherwise.
        spec_file: the spec file the plan was made from, as given (:func:`jobgen.api.plan_job`);
            ``jobgen submit`` snapshots the git repository holding it (``code.repo`` is relative
            to it, :mod:`jobgen.usercode.snapshot`). None when unknown (a spec built in Python). Not a file
            and not an input of the hash: where a spec lies does not change what is rendered.
        resolved: the :class:`~jobgen.jobdir.ResolvedSpec` the plan writes as ``spec.json``, as
            the object it was dumped from, so that submitting the plan does not read back the
            file it has just written; None for a job array (one per point) or where unknown.
            Not compared: ``files`` holds its text.
        placeholders: the profile's example values still in force
            (:func:`jobgen.specs.profile.example_values`): a real submit refuses the plan
            (:func:`jobgen.api.submit`); dry runs and renders take it. Not compared, not rendered.
        cluster_profile: the profile the plan was made on, for what submit computes from it
            (the prediction, :mod:`jobgen.planning.prediction`); None where unknown. Not compared, not rendered.
    """

    scheduler: str
    profile: str
    job_name: str
    files: tuple[tuple[str, str], ...]
    submit_steps: tuple[SubmitStep, ...]
    world: World
    inputs_sha256: str
    warnings: tuple[str, ...] = ()
    apply_files: tuple[str, ...] = ()
    cluster_object: ClusterObject | None = None
    spec_file: str | None = None
    resolved: ResolvedSpec | None = dataclasses.field(default=None, compare=False, repr=False)
    placeholders: tuple[tuple[str, str, Placeholder], ...] = dataclasses.field(default=(), compare=False, repr=False)
    cluster_profile: ClusterProfile | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def job_subdir(self) -> Path:
        """``<profile>/<job name>``: where the files go under the output root."""
        return Path(self.profile) / self.job_name

    def file(self, name: str) -> str:
        """Text of one planned file.

        Raises:
            KeyError: the plan has no such file.
        """
        return dict(self.files)[name]

    def __str__(self) -> str:
        parts = [f"# plan: {self.job_subdir} ({self.scheduler}, {self.world.describe()})"]
        for name, text in self.files:
            parts.append(f"# ---- {name} ----\n{text.rstrip()}")
        parts.append("# ---- submit (in the job directory) ----")
        parts += [str(step) for step in self.submit_steps]
        return "\n".join(parts) + "\n"

    def write(self, job_dir: Path) -> list[Path]:
        """Write the files into ``job_dir`` (see :func:`jobgen.jobdir.write_job_files`: atomic,
        stale owned files removed). Returns the written paths."""
        return write_job_files(job_dir, self.files)


@dataclass(frozen=True)
class PlanContext:
    """Inputs of a backend's ``plan()``: validated models plus where they came from.

    ``templates``: ``(template name, sha256 of it and what it includes)`` for every template
    the backend renders (see :func:`jobgen.planning.render.template_sha256`); empty for backends that
    render none.
    """

    spec: TrainingSpec
    profile: ClusterProfile
    world: World
    templates_dir: Path
    spec_source: str = "<spec>"
    profile_source: str = "<profile>"
    templates: tuple[tuple[str, str], ...] = ()
    array: tuple[tuple[str, TrainingSpec], ...] = ()

    @functools.cached_property
    def inputs_sha256(self) -> str:
        """sha256 of everything the files are made from: the resolved spec, the resolved profile
        (its whole ``extends:`` chain merged) and the templates used (compact JSON,
        field-definition order). Paths, the clock and the environment are not inputs.

        One point of a SLURM job array (``array``: every point's ``(job name, resolved spec)``):
        the hash of the whole array instead of the one spec, so every file of the array's job
        directory names the same hash."""
        if self.array:
            doc: dict[str, object] = {"array": [{"name": name, "spec": spec} for name, spec in self.array],
                                      "profile": self.profile, "templates": dict(self.templates)}
        else:
            doc = {"spec": self.spec, "profile": self.profile, "templates": dict(self.templates)}
        return hashlib.sha256(pydantic_core.to_json(doc)).hexdigest()

    def resolved_spec(self, *, deepspeed_config: str | None = None, requeue_signal: str | None = None,
                      cluster: str | None = None, ssh: SshSettings | None = None) -> ResolvedSpec:
        """The :class:`~jobgen.jobdir.ResolvedSpec` this plan writes as ``spec.json`` (``ssh``: the
        hosts an ssh job runs on, :attr:`~jobgen.jobdir.LaunchSpec.ssh`)."""
        w = self.world
        launch = LaunchSpec(scheduler=self.profile.scheduler, accelerator=w.accelerator, num_nodes=w.num_nodes,
                            devices_per_node=w.devices_per_node, world_size=w.world_size, deepspeed_config=deepspeed_config,
                            requeue_signal=requeue_signal, gpu_type=self.profile.gpu_type, cluster=cluster,
                            gpu_hour_price=self.profile.gpu_hour_price, min_nodes=w.min_nodes,
                            preflight=self.profile.preflight, preflight_timeout_s=self.profile.preflight_timeout_s, ssh=ssh)
        return ResolvedSpec(jobgen_version=__version__, inputs_sha256=self.inputs_sha256, profile=self.profile.name,
                            spec=self.spec, launch=launch)


class Planner(Protocol):
    """What the planner needs of a backend (:class:`jobgen.backends.base.Backend` is one): the
    templates it renders for a world and its pure ``plan``. Declared here so that the planner
    depends on no backend module; the caller hands the backend in."""

    def templates_for(self, world: World) -> tuple[str, ...]:
        """Template names (relative to the templates directory) the plan renders for ``world``."""
        ...

    def plan(self, ctx: PlanContext) -> JobPlan:
        """The files and submit steps of ``ctx`` (pure)."""
        ...


def plan_context(
    spec: TrainingSpec,
    profile: ClusterProfile,
    templates_dir: Path,
    *,
    spec_source: str = "<spec>",
    profile_source: str = "<profile>",
    backend: Planner | None = None,
    template_names: tuple[str, ...] | None = None,
) -> PlanContext:
    """Resolve ``precision: auto``, ``micro_batch_size: auto``, the trackers' options (the
    profile's ``tracking`` defaults, :func:`jobgen.planning.tracking.resolve_tracking`), the world of
    ``spec`` on ``profile`` and an elastic job's global batch
    (:func:`jobgen.planning.rules.resolve_elastic_batch`), and run the rules
    (:mod:`jobgen.planning.rules`, :func:`jobgen.planning.environment.check_job_env`,
    :func:`jobgen.planning.tracking.check_tracking`): the
    backend's inputs.
    ``template_names``: the templates the plan renders; when not given, the ``backend``'s
    :meth:`Planner.templates_for` the world (one of the two is needed).

    Raises:
        PlanError: spec and profile do not fit together (message in Lightning's style).
        ConfigError: a template is missing or broken.
        TypeError: neither ``backend`` nor ``template_names`` given (a programming error).
    """
    if backend is None and template_names is None:
        raise TypeError("plan_context() needs the backend or the template names")
    spec = resolve_precision(spec, profile)
    check_tracking(spec, profile, spec_source=spec_source, profile_source=profile_source)
    spec = resolve_tracking(spec, profile)
    if spec.trainer.micro_batch_size == "auto":  # the memory plan is imported only when it decides something
        from jobgen.planning.micro_batch import resolve_micro_batch

        spec = resolve_micro_batch(spec, profile, spec_source)
    world = resolve_world(spec, profile, spec_source)
    check_fit(spec, profile, world, spec_source)
    spec, world = resolve_elastic_batch(spec, world)  # elastic: spec.json records the global batch every world keeps
    check_trainer_args(spec, world, spec_source)
    names = backend.templates_for(world) if template_names is None else template_names  # type: ignore[union-attr]
    templates = tuple((name, template_sha256(str(templates_dir), name)) for name in sorted(names))
    ctx = PlanContext(spec, profile, world, Path(templates_dir), spec_source, profile_source, templates)
    check_job_env(spec, profile, world, spec_source=spec_source, profile_source=profile_source)
    check_code(spec, profile, spec_source)
    return ctx


def fit_warnings(ctx: PlanContext) -> tuple[str, ...]:
    """The memory-fit warning of the built-in model on GPUs (:func:`jobgen.planning.memory_plan.fit_warning`), if any."""
    if not ctx.profile.gpus_per_node or ctx.spec.entrypoint is not None:  # the estimate is of the built-in model on GPUs
        return ()
    from jobgen.planning.memory_plan import fit_warning

    # elastic: the smallest world, where FSDP/ZeRO shards (and so each GPU's share) are largest
    text = fit_warning(ctx.spec, ctx.profile, ctx.world.fewest_nodes, ctx.world.devices_per_node)
    return (text,) if text else ()


def plan(
    spec: TrainingSpec,
    profile: ClusterProfile,
    templates_dir: Path,
    backend: Planner,
    *,
    spec_source: str = "<spec>",
    profile_source: str = "<profile>",
    spec_file: str | None = None,
) -> JobPlan:
    """Plan ``spec`` on ``profile`` with ``backend`` (the profile's scheduler's; the caller picks
    it, e.g. :func:`jobgen.backends.plan` from the registry: the planner does not know the
    registry): resolve ``precision: auto`` and the world, run the rules (:mod:`jobgen.planning.rules`,
    :func:`jobgen.planning.environment.check_job_env`), render the files.

    Pure: the same inputs give an equal JobPlan with byte-identical files. ``spec_file`` (the
    spec's path, when it came from one) is only carried to submit (:attr:`JobPlan.spec_file`).

    Raises:
        PlanError: spec and profile do not fit together (message in Lightning's style).
        ConfigError: a template is missing/broken or a value cannot be quoted safely.
    """
    ctx = plan_context(spec, profile, templates_dir, spec_source=spec_source, profile_source=profile_source, backend=backend)
    job_plan = backend.plan(ctx)
    warnings = (*fit_warnings(ctx), *layout_warnings(ctx.spec, ctx.world.accelerator))
    if warnings:
        job_plan = dataclasses.replace(job_plan, warnings=(*job_plan.warnings, *warnings))
    if profile.placeholders:
        job_plan = dataclasses.replace(job_plan, placeholders=example_values(profile))
    job_plan = dataclasses.replace(job_plan, cluster_profile=profile)
    return dataclasses.replace(job_plan, spec_file=spec_file) if spec_file is not None else job_plan


def check_code(spec: TrainingSpec, profile: ClusterProfile, spec_source: str) -> None:
    """Plan-time rule for ``code``: ``code.git`` (an init container's checkout) is a Kubernetes
    option; SLURM and local runs snapshot the local repository at submit.

    Raises:
        PlanError: ``code.git`` on a profile whose backend lacks ``code_from_git`` (SLURM, local, ssh:
            :data:`jobgen.specs.capabilities.CAPABILITIES`), with the table's reason.
    """
    code = spec.code
    caps = capabilities(profile.scheduler)
    if code is not None and code.git is not None and not caps.code_from_git:
        refusal = caps.refusal("code_from_git")
        raise PlanError(f"You set `code.git`, but profile {profile.name!r} {refusal.reason}.", location=f"{spec_source}: code.git",
                        hint=refusal.hint())

