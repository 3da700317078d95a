"""The rules that tie a training spec to a world: one module, used by the planner at render time
and re-checked by the entrypoint on every node, with the same words and one error class.

- :func:`resolve_world` turns a spec + profile into a :class:`World`: nodes x devices, and the
  numbers derived from them (world size, global batch, CPUs per rank, time limit), computed
  once here and read everywhere else.
- :func:`check_support` refuses a spec the world's accelerator cannot run (precision vs GPU
  generation, CPU-only refusals). The planner calls it with the profile's GPU type; the
  entrypoint calls it again with the resolved spec's launch facts, so a job directory edited
  after rendering is refused before any rank starts.
- :func:`check_batch` is the batch arithmetic (DeepSpeed's ``train_batch_size`` rule).
- :func:`check_elastic` refuses what an elastic world (``resources.nodes: "min:max"``) cannot
  run, among it a global batch that some node count of the range cannot keep;
  :func:`resolve_elastic_batch` writes that global batch into the spec; :func:`elastic_nodes`
  is the node count torchrun formed and :func:`elastic_world` the world there (the same global
  batch, the accumulation recomputed), both read by the entrypoint.

Everything raises :class:`jobgen.errors.PlanError` (exit 2) with the file + field path and a
hint. Torch-free and cheap to import.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from jobgen.errors import PlanError
from jobgen.jobdir.world import Accelerator, World
from jobgen.specs.capabilities import capabilities
from jobgen.specs.profile import GPU_COMPUTE_CAPABILITY

if TYPE_CHECKING:
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.training import TrainingSpec

def scheduler_time_limit_min(profile: ClusterProfile) -> int | None:
    """The profile's default time limit in minutes for its scheduler (``slurm.time_limit_min``,
    ``kubernetes.time_limit_min``); ``None`` for local runs or when the profile sets none."""
    caps = capabilities(profile.scheduler)
    settings = getattr(profile, caps.settings_attr)
    return settings.time_limit_min if caps.time_limit and settings is not None else None


def resolve_precision(spec: TrainingSpec, profile: ClusterProfile) -> TrainingSpec:
    """``spec`` with ``trainer.precision: auto`` replaced by what the profile's hardware runs
    best: GPUs of compute capability >= 8.0 (Ampere) -> ``bf16-mixed``; older GPUs ->
    ``16-mixed`` (fp16 with loss scaling); CPU -> ``32-true`` (CPUs without native bf16, e.g.
    AVX2-only, emulate it ~25x slower than fp32: a 512x512 matmul 206 ms vs 7.8 ms).
    Any other precision is returned unchanged."""
    t = spec.trainer
    if t.precision != "auto":
        return spec
    if profile.gpus_per_node:
        capability = GPU_COMPUTE_CAPABILITY.get(profile.gpu_type or "", (0, 0))
        precision = "bf16-mixed" if capability >= (8, 0) else "16-mixed"
    else:
        precision = "32-true"
    return spec.model_copy(update={"trainer": t.model_copy(update={"precision": precision})})


def resolve_world(spec: TrainingSpec, profile: ClusterProfile, spec_source: str = "<spec>") -> World:
    """Nodes x devices for ``spec`` on ``profile``, checked the way Lightning checks at runtime.

    Lightning's SLURMEnvironment raises when ``devices`` != ``--ntasks-per-node`` or
    ``num_nodes`` != ``SLURM_NNODES`` (lightning/fabric/plugins/environments/slurm.py); jobgen
    derives both from one place and refuses impossible requests up front.

    Raises:
        PlanError: more devices per node than the node has, more nodes than the profile allows,
            or more ranks per node than CPU cores (every rank needs one).
    """
    given = spec.resources.nodes
    node_range = spec.resources.node_range  # (min, max) of an elastic range; nodes is then max
    min_nodes, nodes = node_range if node_range else (None, given if isinstance(given, int) else profile.default_nodes)
    if min_nodes is not None:
        check_elastic_scheduler(profile, min_nodes, nodes, spec_source)
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
        shown = f'"{given}"' if node_range else str(nodes)
        raise PlanError(
            f"You set `resources.nodes={shown}`, but profile {profile.name!r} allows at most "
            f"{profile.max_nodes} node(s) (`max_nodes: {profile.max_nodes}`).",
            location=f"{spec_source}: resources.nodes",
            hint=f"Set `resources.nodes` to at most {profile.max_nodes}, or use a profile for a bigger cluster.",
        )
    if profile.cpus_per_node < devices:
        raise PlanError(
            f"{devices} ranks per node but nodes of profile {profile.name!r} have {profile.cpus_per_node} CPUs.",
            location=f"{spec_source}: resources.devices_per_node",
            hint="Give each rank at least one CPU: lower devices_per_node or raise cpus_per_node in the profile.",
        )
    t = spec.trainer
    return World(
        num_nodes=nodes,
        devices_per_node=devices,
        accelerator="gpu" if profile.gpus_per_node else "cpu",
        micro_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        cpus_per_rank=profile.cpus_per_node // devices,
        time_limit_min=spec.resources.time_limit_min or scheduler_time_limit_min(profile),
        min_nodes=min_nodes,
    )


def check_batch(spec: TrainingSpec, world: World, spec_source: str = "<spec>") -> None:
    """``trainer.global_batch_size``, when given, must equal micro x accumulation x world size
    (with an accumulation schedule the global batch changes by epoch: no single value fits).

    Raises:
        PlanError: it does not; the hint gives the accumulation that fits, if one does.
    """
    t = spec.trainer
    product = world.global_batch_size
    if t.global_batch_size is not None and t.gradient_accumulation_schedule is not None:
        per_epoch = ", ".join(f"epoch {e}+: {t.micro_batch_size * f * world.world_size}"
                              for e, f in t.gradient_accumulation_schedule.items())
        raise PlanError(
            f"You set `trainer.global_batch_size={t.global_batch_size}` and `trainer.gradient_accumulation_schedule`, "
            f"whose global batch changes by epoch ({per_epoch} = micro_batch_size {t.micro_batch_size} x accumulation "
            f"x world size {world.world_size}).",
            location=f"{spec_source}: trainer.global_batch_size",
            hint="Remove `trainer.global_batch_size` (the schedule decides the batch), or drop the schedule.",
        )
    if world.elastic:
        check_elastic(spec, world, spec_source)
        return
    if t.global_batch_size is None or t.global_batch_size == product:
        return
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


def accumulation_keeping(global_batch_size: int, micro_batch_size: int, world_size: int) -> int | None:
    """The gradient accumulation that keeps ``global_batch_size`` sequences per optimizer step at
    ``world_size`` ranks of ``micro_batch_size`` (global = micro x accumulation x world size), or
    ``None`` when no whole number does (the global batch is not a multiple of micro x world size)."""
    steps, rest = divmod(global_batch_size, micro_batch_size * world_size)
    return steps if steps >= 1 and rest == 0 else None


def elastic_global_batch(spec: TrainingSpec, world: World) -> int:
    """The global batch (sequences per optimizer step) an elastic job keeps at every node count:
    ``trainer.global_batch_size`` when given, else micro x accumulation x the world size at the
    range's maximum (``world`` as planned: ``world.num_nodes`` is the maximum)."""
    t = spec.trainer
    return t.global_batch_size if t.global_batch_size is not None else world.global_batch_size


def check_elastic(spec: TrainingSpec, world: World, spec_source: str = "<spec>") -> None:
    """What an elastic world (``resources.nodes: "min:max"``) cannot train, whatever the
    scheduler; the planner and the entrypoint check it in the same words.

    A restart at another node count keeps the global batch (:func:`elastic_global_batch`) and
    recomputes the accumulation for the world torchrun formed (:func:`elastic_world`), so that
    the learning-rate schedule and ``max_steps`` (counted in optimizer steps) and the data
    position (samples = steps x global batch) mean the same at every world size. Refused:
    - a global batch that some node count of the range cannot keep: it must be a multiple of
      micro_batch_size x world size at every node count (the hint gives the smallest global
      batch that is);
    - ``trainer.global_batch_size`` beside a ``gradient_accumulation_steps`` other than 1 that
      disagrees with it at the maximum node count (the accumulation is derived from it);
    - ``trainer.gradient_accumulation_schedule``: it fixes the accumulation per epoch for one
      world size;
    - DeepSpeed strategies: ``ds_config.json`` fixes ``train_batch_size`` *and* the accumulation
      for one world size (DeepSpeed checks train_batch_size == micro x accumulation x world size
      at start-up and stops every rank otherwise), and a ZeRO checkpoint is partitioned for the
      data-parallel degree that wrote it (resuming on another needs DeepSpeed's universal
      checkpoint conversion, which jobgen does not run).

    The first two are skipped in command mode (``entrypoint:``): the script owns its batch.

    Raises:
        PlanError: located at ``spec_source: <field>`` with a hint.
    """
    if not world.elastic:
        return
    t = spec.trainer
    low, high = world.fewest_nodes, world.num_nodes
    given = f"`resources.nodes: \"{low}:{high}\"`"
    if t.deepspeed_stage is not None:
        raise PlanError(
            f"You set `trainer.strategy={t.strategy!r}` with the elastic range {given}, but DeepSpeed fixes "
            "train_batch_size = micro x accumulation x world size in ds_config.json for one world size (it stops every "
            "rank when the world differs) and partitions ZeRO checkpoints for the world that wrote them.",
            location=f"{spec_source}: trainer.strategy",
            hint="Use `trainer.strategy: fsdp` (its sharded checkpoints load on another world size) or `ddp` for an "
                 f"elastic job, or a fixed node count (e.g. resources.nodes: {high}) for DeepSpeed.",
        )
    if t.gradient_accumulation_schedule is not None:
        raise PlanError(
            f"You set `trainer.gradient_accumulation_schedule` with the elastic range {given}, but the schedule fixes "
            "the accumulation per epoch for one world size, and an elastic job recomputes it at every world size to "
            "keep the global batch.",
            location=f"{spec_source}: trainer.gradient_accumulation_schedule",
            hint=f"Remove the schedule (give trainer.global_batch_size), or a fixed node count (e.g. resources.nodes: {high}).",
        )
    if spec.entrypoint is not None:
        return  # command mode: the user's script owns its batch (jobgen passes it only to DeepSpeed, refused above)
    micro, per_node = t.micro_batch_size, world.devices_per_node
    batch = elastic_global_batch(spec, world)
    at_max = accumulation_keeping(batch, micro, high * per_node)
    if t.global_batch_size is not None and at_max is not None and t.gradient_accumulation_steps not in (1, at_max):
        raise PlanError(
            f"You set `trainer.global_batch_size={batch}` and `trainer.gradient_accumulation_steps="
            f"{t.gradient_accumulation_steps}` with the elastic range {given}, but jobgen derives the accumulation from "
            f"the global batch at every world size: {at_max} at {high} node(s) (micro_batch_size {micro} x {at_max} x "
            f"world size {high * per_node} = {batch}).",
            location=f"{spec_source}: trainer.gradient_accumulation_steps",
            hint=f"Remove trainer.gradient_accumulation_steps (or set it to {at_max}).",
        )
    counts = range(low, high + 1)
    bad = [n for n in counts if accumulation_keeping(batch, micro, n * per_node) is None]
    if bad:
        raise PlanError(
            f"You set the elastic range {given} with a global batch of {batch} sequences ({_batch_origin(spec, world)}). "
            "jobgen keeps the global batch at every node count, recomputing the gradient accumulation, so that a restart "
            "at another world size keeps the learning-rate schedule and the data position; but "
            f"{elastic_batch_problem(batch, micro, per_node, bad)}.",
            location=f"{spec_source}: trainer.global_batch_size" if t.global_batch_size is not None else f"{spec_source}: resources.nodes",
            hint=elastic_batch_hint(batch, micro, per_node, low, high),
        )


def elastic_batch_problem(batch: int, micro: int, per_node: int, nodes: list[int]) -> str:
    """``"256 is not a multiple of micro_batch_size 8 x world size at 3 node(s) (8 x 24 = 192)"``:
    the words :func:`check_elastic` and :func:`elastic_world` share."""
    at = ", ".join(f"{n} node(s) ({micro} x {n * per_node} = {micro * n * per_node})" for n in nodes)
    return f"{batch} is not a multiple of micro_batch_size {micro} x world size at {at}"


def elastic_batch_hint(batch: int, micro: int, per_node: int, low: int, high: int) -> str:
    """The fix for :func:`elastic_batch_problem`: the smallest global batch (at least ``batch``)
    that every node count of ``low..high`` keeps, and the node counts that keep ``batch``."""
    step = math.lcm(*(micro * n * per_node for n in range(low, high + 1)))
    fits = -(-batch // step) * step
    keeps = [n for n in range(low, high + 1) if accumulation_keeping(batch, micro, n * per_node) is not None]
    tail = (f"; of {low}..{high} node(s), {', '.join(map(str, keeps))} keep {batch} (a range cannot leave a node count out)"
            if keeps else "")
    return (f"Set trainer.global_batch_size to a multiple of {step} (every node count of {low}..{high} keeps it), e.g. "
            f"{fits}, or narrow resources.nodes{tail}.")


def _batch_origin(spec: TrainingSpec, world: World) -> str:
    t = spec.trainer
    if t.global_batch_size is not None:
        return "trainer.global_batch_size"
    return (f"micro_batch_size {t.micro_batch_size} x gradient_accumulation_steps {t.gradient_accumulation_steps} x "
            f"world size {world.world_size} at {world.num_nodes} node(s)")


def resolve_elastic_batch(spec: TrainingSpec, world: World) -> tuple[TrainingSpec, World]:
    """An elastic job's spec and world with the global batch it keeps written down: the spec's
    ``trainer.global_batch_size`` set to :func:`elastic_global_batch` and its
    ``gradient_accumulation_steps`` to the accumulation at the range's maximum, so spec.json
    records the one number every world size keeps. A fixed world, and a command-mode job (its
    script owns the batch), are returned unchanged.

    Call after :func:`check_elastic` (through :func:`check_fit`), which proves the maximum
    world keeps the batch.
    """
    if not world.elastic or spec.entrypoint is not None:
        return spec, world
    batch = elastic_global_batch(spec, world)
    steps = accumulation_keeping(batch, world.micro_batch_size, world.world_size)
    assert steps is not None, "check_elastic() refuses a global batch the largest world cannot keep"
    t = spec.trainer.model_copy(update={"global_batch_size": batch, "gradient_accumulation_steps": steps})
    return spec.model_copy(update={"trainer": t}), dataclasses.replace(world, gradient_accumulation_steps=steps)


def elastic_world(world: World, nodes: int) -> World:
    """The world of an elastic job at the ``nodes`` torchrun formed (:func:`elastic_nodes`): the
    planned ``world``'s global batch kept, the accumulation recomputed for the new world size
    (global = micro x accumulation x world size). ``min_nodes`` stays set; ``num_nodes`` is then
    the count torchrun formed, not the range's maximum.

    Raises:
        PlanError: the global batch is not a multiple of micro x world size there (a spec.json
            written by hand or by an older jobgen; the planner refuses such a range).
    """
    batch = world.global_batch_size
    steps = accumulation_keeping(batch, world.micro_batch_size, nodes * world.devices_per_node)
    if steps is None:
        raise PlanError(
            f"torchrun formed a world of {nodes} node(s) x {world.devices_per_node} process(es), but the job's global "
            f"batch {elastic_batch_problem(batch, world.micro_batch_size, world.devices_per_node, [nodes])}: it cannot "
            "keep its global batch (and with it the learning-rate schedule and the data position) there.",
            location="spec.trainer.global_batch_size",
            hint=elastic_batch_hint(batch, world.micro_batch_size, world.devices_per_node, world.fewest_nodes, world.num_nodes)
                 + " Render the job again with jobgen (it refuses a range that cannot keep the batch).",
        )
    return dataclasses.replace(world, num_nodes=nodes, gradient_accumulation_steps=steps)


def check_elastic_scheduler(profile: ClusterProfile, min_nodes: int, max_nodes: int, spec_source: str = "<spec>") -> None:
    """An elastic range needs a launcher that admits nodes while the job runs: the
    training-operator's PyTorchJob ``elasticPolicy`` (kubeflow.org/v1). Refused, at plan time (the
    ``elastic`` refusals of :data:`jobgen.specs.capabilities.CAPABILITIES` and Trainer v2):
    - SLURM: an allocation has a fixed node count (``--nodes``; Lightning's SLURMEnvironment
      checks ``SLURM_NNODES == num_nodes`` on every rank).
    - local: one machine.
    - ssh: torchrun's static rendezvous (``--nnodes N --node-rank i``) on a fixed list of hosts.
    - Kubernetes ``job_api: trainjob``: Trainer v2.3.0's TrainJob and runtime CRDs have no
      elastic policy (``spec.trainer.numNodes`` is one integer).

    :func:`resolve_world` calls it for every range, before the range is checked against the
    profile's ``max_nodes``.

    Raises:
        PlanError: located at ``spec_source: resources.nodes`` with the fix.
    """
    given = f"`resources.nodes: \"{min_nodes}:{max_nodes}\"`"
    where = f"{spec_source}: resources.nodes"
    caps = capabilities(profile.scheduler)
    if not caps.elastic:
        refusal = caps.refusal("elastic")
        raise PlanError(
            f"You set the elastic range {given}, but profile {profile.name!r} {refusal.reason}.",
            location=where,
            hint=refusal.hint(min_nodes=min_nodes, max_nodes=max_nodes),
        )
    k = profile.kubernetes
    if k is not None and k.job_api == "trainjob":
        raise PlanError(
            f"You set the elastic range {given}, but profile {profile.name!r} renders a Trainer v2 TrainJob "
            "(`kubernetes.job_api: trainjob`), which has no elastic policy: the Trainer v2.3.0 CRDs take one fixed "
            "spec.trainer.numNodes.",
            location=where,
            hint=f"Give a fixed count (e.g. --set resources.nodes={max_nodes}), or use a profile with "
                 "`kubernetes.job_api: pytorchjob` (its elasticPolicy runs the range).",
        )


def elastic_nodes(world: World, environ: Mapping[str, str]) -> int:
    """The node count torchrun's rendezvous formed for an elastic world: its WORLD_SIZE
    (every process gets it) over the processes per node. Lightning's TorchElasticEnvironment
    stops every rank unless Trainer(devices x num_nodes) equals WORLD_SIZE, so the entrypoint
    passes this, not the planned maximum.

    Raises:
        PlanError: WORLD_SIZE is missing (not started by torchrun), not a multiple of the
            processes per node, or outside the planned range.
    """
    raw = environ.get("WORLD_SIZE", "")
    span = f"{world.fewest_nodes}..{world.num_nodes}"
    if not raw.isdigit():
        raise PlanError(
            f"the job is elastic (resources.nodes {world.fewest_nodes}:{world.num_nodes}) but WORLD_SIZE is {raw or 'unset'}: "
            "the entrypoint was not started by torchrun.",
            location="launch.min_nodes",
            hint="Launch it with torchrun --nnodes=MIN:MAX (the rendered PyTorchJob's command does).",
        )
    size = int(raw)
    nodes, rest = divmod(size, world.devices_per_node)
    if rest or not world.fewest_nodes <= nodes <= world.num_nodes:
        raise PlanError(
            f"torchrun formed a world of {size} process(es), but the job was planned for {span} node(s) x "
            f"{world.devices_per_node} process(es).",
            location="launch.devices_per_node",
            hint=f"Run torchrun with --nnodes={world.fewest_nodes}:{world.num_nodes} --nproc-per-node={world.devices_per_node}, "
                 "as the rendered command does.",
        )
    return nodes


BNB_CPU_MIN_VERSION = "0.48.1"
"""The first bitsandbytes whose installation guide lists the CPU among the officially supported
platforms (https://huggingface.co/docs/bitsandbytes/v0.48.1/installation: "official support for
NVIDIA GPUs, CPUs, Intel XPUs, and Intel Gaudi"; the v0.46.0 guide still calls CPU support work
in progress). jobgen's CPU QLoRA rehearsal ran with 0.50.2 (tests/entrypoint/test_hf_qlora.py)."""


def bitsandbytes_cpu_problem() -> str | None:
    """Why this machine's bitsandbytes cannot run 4-bit layers on the CPU, or ``None`` when it can.

    Reads the installed distribution's version (``importlib.metadata``; bitsandbytes itself, and
    so torch, is not imported) and compares it with :data:`BNB_CPU_MIN_VERSION`.

    Returns:
        ``"bitsandbytes is not installed"``, ``"bitsandbytes X is older than ..."``, or ``None``.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("bitsandbytes")
    except PackageNotFoundError:
        return "bitsandbytes is not installed"

    def release(text: str) -> tuple[int, ...]:  # "0.50.2.dev0+cpu" -> (0, 50, 2)
        return tuple(int(re.match(r"\d*", part).group() or 0) for part in text.split("+")[0].split(".")[:3])

    if release(found) < release(BNB_CPU_MIN_VERSION):
        return f"bitsandbytes {found} is older than {BNB_CPU_MIN_VERSION}, the first to run 4-bit layers on the CPU"
    return None


def check_support(spec: TrainingSpec, accelerator: Accelerator, gpu_type: str | None, *, where: str,
                  on_node: bool = False) -> None:
    """Refuse what the accelerator cannot run, in one wording for plan time and run time.

    ``where`` names the place (``"cluster profile 'local'"`` or ``"this node"``); with
    ``on_node`` (the entrypoint) the check also looks for packages the node needs.

    Rules and their sources:
    - bf16 needs compute capability >= 8.0 (Ampere); fp8 (``transformer-engine``) >= 9.0
      (Hopper) and the ``transformer_engine`` package on the node.
    - CPU (measured with torch 2.13): no fp16 (PyTorch silently runs bf16), no fp8,
      no full FSDP state dict (segfaults), no
      HYBRID_SHARD (runs but silently diverges: val_loss 3.3004 vs 3.2415 for every other
      strategy on the 2-rank matrix job; torch derives the intra-node shard group from the
      accelerator's device count). QLoRA (``model.load_in_4bit``) runs on CPU with bitsandbytes
      >= :data:`BNB_CPU_MIN_VERSION`; ``on_node`` checks the node's bitsandbytes
      (:func:`bitsandbytes_cpu_problem`), as the render machine's proves nothing.

    Raises:
        PlanError: the first rule broken, located at ``spec.<field>`` (callers prefix the file).
    """
    t = spec.trainer
    if accelerator == "gpu":
        capability = GPU_COMPUTE_CAPABILITY.get(gpu_type or "")
        cc = f"{capability[0]}.{capability[1]}" if capability else "unknown"
        if capability is not None and t.precision.startswith("bf16") and capability < (8, 0):
            raise PlanError(
                f"You set `trainer.precision={t.precision!r}`, but {where} has {gpu_type} GPUs "
                f"(compute capability {cc}); bf16 needs Ampere (8.0) or newer.",
                location="trainer.precision",
                hint="Use `trainer.precision: 16-mixed` (fp16 with loss scaling), `32-true` or `auto` on this GPU.",
            )
        if t.precision == "transformer-engine":
            if capability is not None and capability < (9, 0):
                raise PlanError(
                    f"You set `trainer.precision='transformer-engine'` (fp8), but {where} has {gpu_type} GPUs "
                    f"(compute capability {cc}); jobgen runs fp8 on Hopper (9.0) or newer.",
                    location="trainer.precision",
                    hint="Use `trainer.precision: bf16-mixed` on this GPU, or render for an H100/H200/B200 profile.",
                )
            if on_node and importlib.util.find_spec("transformer_engine") is None:
                raise PlanError(
                    "You set `trainer.precision='transformer-engine'` (fp8), but NVIDIA Transformer Engine is not "
                    f"installed on {where}.",
                    location="trainer.precision",
                    hint="Install it on the nodes (pip install 'transformer-engine[pytorch]'), or use bf16-mixed.",
                )
        return
    if on_node and getattr(spec.model, "load_in_4bit", False):
        problem = bitsandbytes_cpu_problem()
        if problem is not None:
            raise PlanError(
                f"You set `model.load_in_4bit=true` (QLoRA), but {where} has no GPUs and {problem}; 4-bit layers run "
                f"on the CPU from bitsandbytes {BNB_CPU_MIN_VERSION} on.",
                location="model.load_in_4bit",
                hint=f"pip install 'bitsandbytes>={BNB_CPU_MIN_VERSION}' (jobgen[qlora]) on this node, or remove "
                "`model.load_in_4bit` (plain LoRA).",
            )
    refusals = (
        (t.precision == "transformer-engine", "trainer.precision",
         "You set `trainer.precision='transformer-engine'` (fp8), but {where} has no GPUs; Transformer Engine's fp8 "
         "matmuls need Hopper GPUs.",
         "Use `bf16-mixed`, `32-true` or `auto` on CPU (the same spec with fp8 renders for an H100 profile)."),
        (t.strategy == "fsdp" and t.fsdp_state_dict_type == "full", "trainer.fsdp_state_dict_type",
         "You set `trainer.fsdp_state_dict_type='full'`, but {where} has no GPUs; gathering a full FSDP state dict "
         "segfaults on CPU ranks (torch 2.13).",
         "Use `sharded` (the default) for CPU runs."),
        (t.precision == "16-mixed", "trainer.precision",
         "You set `trainer.precision='16-mixed'`, but {where} has no GPUs; fp16 needs a CUDA GPU (on CPU, PyTorch "
         "silently runs bf16 instead).",
         "Use `auto`, `bf16-mixed` or `32-true` on CPU."),
        (t.strategy == "fsdp" and t.fsdp_sharding_strategy == "HYBRID_SHARD", "trainer.fsdp_sharding_strategy",
         "You set `trainer.strategy='fsdp'` with `fsdp_sharding_strategy='HYBRID_SHARD'`, but {where} has no GPUs; "
         "hybrid sharding needs one GPU per rank (ddp, fsdp FULL_SHARD / SHARD_GRAD_OP / NO_SHARD and DeepSpeed "
         "ZeRO 1-3 rehearse on CPU).",
         "Use `--set trainer.fsdp_sharding_strategy=FULL_SHARD` for a CPU run, or render for a GPU profile."),
    )
    for broken, field, message, hint in refusals:
        if broken:
            raise PlanError(message.format(where=where), location=field, hint=hint)


def layout_warnings(spec: TrainingSpec, accelerator: Accelerator) -> tuple[str, ...]:
    """Non-fatal warnings about a layout whose memory plan a GPU run has contradicted.

    QLoRA under ``deepspeed_stage_3`` on a GPU: the first GPU run of the seed recipe (one
    H100, Llama-2-7B QLoRA r 64, sequence 2048, micro batch 4) peaked at 67.8 GiB against a
    plan of 17.64 GiB, while ddp (15.6 GiB, 0.95x of its plan) and deepspeed_stage_2 (11.1 GiB,
    0.59x) fitted. jobgen then ran the sharded QLoRA recipe without the gradient checkpointing
    the plan counts (now on, :func:`jobgen.train.hf.load_causal_lm`; jobgen's own activation
    formula gives 77.0 GiB unchecked vs 7.5 GiB checked for that recipe); until a GPU run
    confirms the plan, the planner says so.

    Returns:
        the warning lines (empty for every other layout and on CPU).
    """
    if accelerator == "gpu" and getattr(spec.model, "load_in_4bit", False) and spec.trainer.strategy == "deepspeed_stage_3":
        return ("QLoRA under deepspeed_stage_3 peaked at 3.8x its memory plan on an H100 (67.8 vs 17.64 GiB) "
                "before jobgen turned gradient checkpointing on for it; no GPU run has confirmed the plan since. "
                "deepspeed_stage_2 (0.59x of its plan) and ddp (0.95x) trained the same recipe within theirs.",)
    return ()


def check_fit(spec: TrainingSpec, profile: ClusterProfile, world: World, spec_source: str = "<spec>") -> None:
    """Plan-time checks tying the spec to the profile: :func:`check_batch` (with
    :func:`check_elastic`) and :func:`check_support` for the profile's accelerator and GPU type.

    Raises:
        PlanError: see those functions; the location names ``spec_source``.
    """
    check_batch(spec, world, spec_source)
    try:
        check_support(spec, world.accelerator, profile.gpu_type, where=f"profile {profile.name!r}")
    except PlanError as exc:
        exc.location = f"{spec_source}: {exc.location}"
        raise
