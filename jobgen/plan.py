"""Planning: TrainingSpec + ClusterProfile -> JobPlan (pure: no subprocess, network, clock
or randomness; the same inputs give byte-identical files).

Holds the boundary objects (:class:`World`, :class:`JobPlan`), the checks that tie a spec to
a profile (devices, nodes, batch arithmetic, precision vs GPU), and the lazy name -> module
table of backends, so rendering a SLURM script never imports kubernetes or torch.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic_core

from jobgen import __version__
from jobgen.errors import PlanError
from jobgen.profiles import GPU_COMPUTE_CAPABILITY, ClusterProfile
from jobgen.render import pretty_json, template_sha256
from jobgen.spec import TrainingSpec

#: scheduler -> backend module, imported only when used (TorchX-style lazy table).
BACKENDS: dict[str, str] = {
    "slurm": "jobgen.backends.slurm",
    "kubernetes": "jobgen.backends.kubernetes",
    "local": "jobgen.backends.local",
}

#: Files jobgen writes into a job directory; stale ones from an earlier render are removed.
OWNED_FILES = frozenset({"job.sbatch", "pytorchjob.yaml", "trainjob.yaml", "spec.json", "ds_config.json"})


@dataclass(frozen=True)
class World:
    """The process layout of a job: ``num_nodes`` x ``devices_per_node`` ranks.

    ``accelerator`` is ``"gpu"`` (one rank per GPU, NCCL) or ``"cpu"`` (gloo).
    """

    num_nodes: int
    devices_per_node: int
    accelerator: str

    @property
    def world_size(self) -> int:
        """Total number of ranks (data-parallel processes)."""
        return self.num_nodes * self.devices_per_node


@dataclass(frozen=True)
class JobPlan:
    """Everything submit will write and run, computed without side effects.

    Attributes:
        scheduler: ``slurm``, ``kubernetes`` or ``local``.
        profile: profile name (first directory level under the output root).
        job_name: the spec's name (second directory level).
        files: ``(relative file name, text)`` pairs, sorted by name.
        submit_argv: the command submit runs, with the job directory as working directory.
        world: nodes x devices per node.
        inputs_sha256: hash of the resolved spec + profile + templates (named in every file header).
        warnings: non-fatal findings to show the user.
        env: environment submit sets for the command (local runs; the schedulers' files carry
            their own), sorted by name.
    """

    scheduler: str
    profile: str
    job_name: str
    files: tuple[tuple[str, str], ...]
    submit_argv: tuple[str, ...]
    world: World
    inputs_sha256: str
    warnings: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

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
        parts = [f"# plan: {self.job_subdir} ({self.scheduler}, {self.world.num_nodes} node(s) x "
                 f"{self.world.devices_per_node} {self.world.accelerator} rank(s) = world size {self.world.world_size})"]
        for name, text in self.files:
            parts.append(f"# ---- {name} ----\n{text.rstrip()}")
        env = "".join(f"{key}={shlex.quote(value)} " for key, value in self.env)
        parts.append("# ---- submit (in the job directory) ----\n" + env + shlex.join(self.submit_argv))
        return "\n".join(parts) + "\n"

    def write(self, job_dir: Path) -> list[Path]:
        """Write the files into ``job_dir`` (created if needed), each atomically (temp + rename).

        Files jobgen owns that an earlier render left but this plan lacks (e.g. a
        ``ds_config.json`` after switching to DDP) are removed. Returns the written paths.
        """
        job_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files:
            target = job_dir / name
            fd, tmp = tempfile.mkstemp(dir=job_dir, prefix=f".{name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                    fh.write(text)
                if name.endswith(".sbatch"):
                    os.chmod(tmp, 0o755)
                else:
                    os.chmod(tmp, 0o644)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            written.append(target)
        planned = {name for name, _ in self.files}
        for stale in sorted(OWNED_FILES - planned):
            (job_dir / stale).unlink(missing_ok=True)
        return written


@dataclass(frozen=True)
class PlanContext:
    """Inputs of a backend's ``plan()``: validated models plus where they came from.

    ``templates``: ``(template name, sha256 of it and what it includes)`` for every template
    the backend renders (see :func:`jobgen.render.template_sha256`); empty for backends that
    render none.
    """

    spec: TrainingSpec
    profile: ClusterProfile
    world: World
    templates_dir: Path
    spec_source: str = "<spec>"
    profile_source: str = "<profile>"
    templates: tuple[tuple[str, str], ...] = ()

    @functools.cached_property
    def inputs_sha256(self) -> str:
        """sha256 of everything the files are made from: the resolved spec, the resolved profile
        (its whole ``extends:`` chain merged) and the templates used (compact JSON,
        field-definition order). Paths, the clock and the environment are not inputs."""
        doc = {"spec": self.spec, "profile": self.profile, "templates": dict(self.templates)}
        return hashlib.sha256(pydantic_core.to_json(doc)).hexdigest()


def resolve_world(spec: TrainingSpec, profile: ClusterProfile, spec_source: str = "<spec>") -> World:
    """Nodes x devices for ``spec`` on ``profile``, checked the way Lightning checks at runtime.

    Lightning's SLURMEnvironment raises when ``devices`` != ``--ntasks-per-node`` or
    ``num_nodes`` != ``SLURM_NNODES`` (lightning/fabric/plugins/environments/slurm.py); jobgen
    derives both from one place and refuses impossible requests up front.

    Raises:
        PlanError: more devices per node than the node has, or more nodes than the profile allows.
    """
    nodes = spec.resources.nodes or profile.default_nodes
    devices = spec.resources.devices_per_node or profile.devices_per_node
    what = "GPUs" if profile.gpus_per_node else "CPU processes"
    key = "gpus_per_node" if profile.gpus_per_node else "cpu_processes_per_node"
    if devices > profile.devices_per_node:
        raise PlanError(
            f"You set `resources.devices_per_node={devices}`, but nodes of profile {profile.name!r} have "
            f"{profile.devices_per_node} {what} (`{key}: {profile.devices_per_node}`).",
            location=f"{spec_source}: resources.devices_per_node",
            hint=f"Set `resources.devices_per_node` to at most {profile.devices_per_node}, or pick a profile with bigger nodes.",
        )
    if nodes > profile.max_nodes:
        raise PlanError(
            f"You set `resources.nodes={nodes}`, but profile {profile.name!r} allows at most "
            f"{profile.max_nodes} node(s) (`max_nodes: {profile.max_nodes}`).",
            location=f"{spec_source}: resources.nodes",
            hint=f"Set `resources.nodes` to at most {profile.max_nodes}, or use a profile for a bigger cluster.",
        )
    return World(num_nodes=nodes, devices_per_node=devices, accelerator="gpu" if profile.gpus_per_node else "cpu")


def check_fit(spec: TrainingSpec, profile: ClusterProfile, world: World, spec_source: str = "<spec>") -> None:
    """Plan-time checks tying the spec to the profile: batch arithmetic, precision, strategy.

    Raises:
        PlanError: global batch != micro x accumulation x world size; a precision the GPU
            type cannot run (bf16 needs compute capability >= 8.0, Ampere; fp16 needs a GPU);
            FSDP HYBRID_SHARD, a full FSDP state dict, fp8 or QLoRA (``model.load_in_4bit``) on a
            CPU-only profile; fp8 (``transformer-engine``) on GPUs older than Hopper.
    """
    t = spec.trainer
    product = t.micro_batch_size * t.gradient_accumulation_steps * world.world_size
    if t.global_batch_size is not None and t.global_batch_size != product:
        per_step = t.micro_batch_size * world.world_size
        hint = (
            f"Set `trainer.gradient_accumulation_steps={t.global_batch_size // per_step}`"
            if t.global_batch_size % per_step == 0
            else f"Make global_batch_size a multiple of micro_batch_size x world size = {per_step}"
        )
        raise PlanError(
            f"You set `trainer.global_batch_size={t.global_batch_size}`, but micro_batch_size "
            f"({t.micro_batch_size}) x gradient_accumulation_steps ({t.gradient_accumulation_steps}) x world size "
            f"({world.world_size} = {world.num_nodes} node(s) x {world.devices_per_node}) = {product}.",
            location=f"{spec_source}: trainer.global_batch_size",
            hint=f"{hint}, or remove global_batch_size to accept {product}.",
        )
    if world.accelerator == "gpu":
        capability = GPU_COMPUTE_CAPABILITY[profile.gpu_type or ""]
        if t.precision.startswith("bf16") and capability < (8, 0):
            raise PlanError(
                f"You set `trainer.precision={t.precision!r}`, but profile {profile.name!r} has {profile.gpu_type} GPUs "
                f"(compute capability {capability[0]}.{capability[1]}); bf16 needs Ampere (8.0) or newer.",
                location=f"{spec_source}: trainer.precision",
                hint="Use `trainer.precision: 16-mixed` (fp16 with loss scaling) or `32-true` on this GPU.",
            )
        if t.precision == "transformer-engine" and capability < (9, 0):
            raise PlanError(
                f"You set `trainer.precision='transformer-engine'` (fp8), but profile {profile.name!r} has "
                f"{profile.gpu_type} GPUs (compute capability {capability[0]}.{capability[1]}); jobgen runs fp8 "
                "on Hopper (9.0) or newer.",
                location=f"{spec_source}: trainer.precision",
                hint="Use `trainer.precision: bf16-mixed` on this GPU, or render for an H100/H200/B200 profile.",
            )
    else:
        if spec.model.load_in_4bit:
            raise PlanError(
                f"You set `model.load_in_4bit=true` (QLoRA), but profile {profile.name!r} has no GPUs; 4-bit "
                "quantisation (bitsandbytes) runs on CUDA GPUs only.",
                location=f"{spec_source}: model.load_in_4bit",
                hint="Remove `model.load_in_4bit` (plain LoRA trains on CPU), or render for a GPU profile "
                "(and install jobgen[qlora] there).",
            )
        if t.precision == "transformer-engine":
            raise PlanError(
                f"You set `trainer.precision='transformer-engine'` (fp8), but profile {profile.name!r} has no GPUs; "
                "Transformer Engine's fp8 matmuls need Hopper GPUs.",
                location=f"{spec_source}: trainer.precision",
                hint="Use `bf16-mixed` or `32-true` on CPU (the same spec with fp8 renders for an H100 profile).",
            )
        if t.strategy == "fsdp" and t.fsdp_state_dict_type == "full":
            raise PlanError(
                f"You set `trainer.fsdp_state_dict_type='full'`, but profile {profile.name!r} has no GPUs; gathering "
                "a full FSDP state dict segfaults on CPU ranks (torch 2.13, LAB-NOTES).",
                location=f"{spec_source}: trainer.fsdp_state_dict_type",
                hint="Use `sharded` (the default) for CPU runs.",
            )
        if t.precision == "16-mixed":
            raise PlanError(
                f"You set `trainer.precision='16-mixed'`, but profile {profile.name!r} has no GPUs; fp16 needs a CUDA "
                "GPU (on CPU, PyTorch silently runs bf16 instead).",
                location=f"{spec_source}: trainer.precision",
                hint="Use `bf16-mixed` or `32-true` on CPU.",
            )
        if t.strategy == "fsdp" and t.fsdp_sharding_strategy == "HYBRID_SHARD":
            raise PlanError(
                f"You set `trainer.strategy='fsdp'` with `fsdp_sharding_strategy='HYBRID_SHARD'`, but profile "
                f"{profile.name!r} has no GPUs; hybrid sharding needs one GPU per rank (ddp, fsdp FULL_SHARD / "
                "SHARD_GRAD_OP / NO_SHARD and DeepSpeed ZeRO 1-3 rehearse on CPU).",
                location=f"{spec_source}: trainer.fsdp_sharding_strategy",
                hint="Use `--set trainer.fsdp_sharding_strategy=FULL_SHARD` for a CPU run, or render for a GPU profile.",
            )


def resolved_spec_doc(ctx: PlanContext, *, deepspeed_config: str | None, requeue_signal: str | None,
                      cluster: str | None = None) -> str:
    """The ``spec.json`` the entrypoint reads: resolved spec + launch layout (+ the SLURM
    cluster name that ``jobgen submit <job dir>`` puts in the handle)."""
    doc = {
        "jobgen_version": __version__,
        "inputs_sha256": ctx.inputs_sha256,
        "profile": ctx.profile.name,
        "spec": ctx.spec,
        "launch": {
            "scheduler": ctx.profile.scheduler,
            "accelerator": ctx.world.accelerator,
            "num_nodes": ctx.world.num_nodes,
            "devices_per_node": ctx.world.devices_per_node,
            "world_size": ctx.world.world_size,
            "deepspeed_config": deepspeed_config,
            "requeue_signal": requeue_signal,
            "gpu_type": ctx.profile.gpu_type,
            "cluster": cluster,
        },
    }
    return pretty_json(doc)


def backend_module(scheduler: str) -> Any:
    """Import the backend module for ``scheduler`` (lazily)."""
    return importlib.import_module(BACKENDS[scheduler])


def plan(
    spec: TrainingSpec,
    profile: ClusterProfile,
    templates_dir: Path,
    *,
    spec_source: str = "<spec>",
    profile_source: str = "<profile>",
) -> JobPlan:
    """Plan ``spec`` on ``profile``: resolve the world, run the checks, render the files.

    Pure: the same inputs give an equal JobPlan with byte-identical files.

    Raises:
        PlanError: spec and profile do not fit together (message in Lightning's style).
        ConfigError: a template is missing/broken or a value cannot be quoted safely.
    """
    world = resolve_world(spec, profile, spec_source)
    check_fit(spec, profile, world, spec_source)
    backend = backend_module(profile.scheduler)
    names = getattr(backend, "TEMPLATES", None) or ((backend.TEMPLATE,) if hasattr(backend, "TEMPLATE") else ())
    templates = tuple((name, template_sha256(str(templates_dir), name)) for name in sorted(names))
    ctx = PlanContext(spec, profile, world, Path(templates_dir), spec_source, profile_source, templates)
    return backend.plan(ctx)
