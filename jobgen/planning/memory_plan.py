"""The memory plan: every candidate layout estimated for a spec on a profile (:mod:`jobgen.planning.estimate`
sizes each), the one recommended by the project's strategy guide and why, what would make a job
fit when nothing does, and the one-line warning ``jobgen render`` prints (:func:`fit_warning`).

Pure arithmetic, no torch import (the render path stays fast). A Hugging Face model
(:mod:`jobgen.planning.estimate_hf`) and a ``model.class_path`` model (:mod:`jobgen.usercode.memory`)
are planned by :func:`plan_memory` with their own shape and size function; it does not know them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from jobgen.errors import NotSupportedError
from jobgen.planning.estimate import CPU_OVERHEAD_BYTES, GIB, GPU_OVERHEAD_BYTES, Estimate, Layout, Shape, estimate
from jobgen.specs.training import TrainingSpec

SMALL_MODEL_PARAMS = 500_000_000
"""Below this many parameters plain DDP is preferred when it fits (the project's strategy guide)."""
LARGE_MODEL_PARAMS = 10_000_000_000
"""Above this many parameters DeepSpeed ZeRO-3 (with offload if needed) is preferred."""



#: Memory per GPU in GiB when a profile does not give ``gpu_mem_gib``: the smallest variant of
#: each type (NVIDIA data sheets), so an unknown variant is never assumed bigger than it is.
GPU_MEM_GIB_DEFAULT: dict[str, float] = {
    "V100": 16, "T4": 16, "A10G": 24, "A100": 40, "L4": 24, "L40S": 48, "H100": 80, "H200": 141, "B200": 180,
}


@dataclass(frozen=True)
class Row:
    """One line of the plan: an estimate and whether it fits the rank's memory (and the host's)."""

    estimate: Estimate
    fits: bool
    is_spec: bool


@dataclass(frozen=True)
class MemoryPlan:
    """Estimates for every candidate layout on one profile, the recommendation and why.

    Attributes:
        n_params: model parameters.
        world: ``(num_nodes, devices_per_node)``.
        accelerator: ``gpu`` or ``cpu``.
        budget_bytes: memory of one rank: the GPU's, or host memory / ranks per node on CPU.
        host_bytes_per_node: host memory of a node (for offload).
        rows: candidate layouts in a fixed order (the spec's own layout included).
        chosen: the recommended layout, or ``None`` when nothing fits.
        reasons: lines explaining the choice, with numbers.
        suggestions: what would make the job fit (when the spec's layout or nothing fits).
        assumptions: the assumptions behind the numbers.
        hf: Hugging Face models only: the config read and the parameter split (``None`` otherwise).
        seed: the matching seed-table row next to the estimate (:func:`jobgen.planning.estimate_hf.seed_comparison`),
            or ``None``.
        user: ``model.class_path`` models only (``jobgen plan --import``): what building the model
            told (:func:`jobgen.usercode.memory.plan_memory`); ``None`` otherwise.
    """

    n_params: int
    precision: str
    world: tuple[int, int]
    accelerator: str
    budget_bytes: int
    host_bytes_per_node: int
    rows: tuple[Row, ...]
    chosen: Layout | None
    reasons: tuple[str, ...]
    suggestions: tuple[str, ...]
    assumptions: tuple[str, ...]
    hf: dict[str, Any] | None = None
    seed: dict[str, Any] | None = None
    user: dict[str, Any] | None = None

    @property
    def spec_row(self) -> Row:
        """The row of the spec's own layout."""
        return next(r for r in self.rows if r.is_spec)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with stable keys (documented in docs/large-models.md, "Memory plan"); ``hf`` and ``seed``
        only for Hugging Face models (``seed``: null when no seed row matches), ``user`` only for a
        ``model.class_path`` model sized by building it."""
        extra = ({} if self.hf is None else {"hf": self.hf, "seed": self.seed}) | ({} if self.user is None else {"user": self.user})
        return extra | {
            "n_params": self.n_params,
            "precision": self.precision,
            "num_nodes": self.world[0],
            "devices_per_node": self.world[1],
            "accelerator": self.accelerator,
            "budget_bytes": self.budget_bytes,
            "host_bytes_per_node": self.host_bytes_per_node,
            "chosen": self.chosen.label if self.chosen else None,
            "chosen_overrides": list(self.chosen.overrides) if self.chosen else [],
            "spec_layout": self.spec_row.estimate.layout.label,
            "spec_fits": self.spec_row.fits,
            "rows": [
                {
                    "layout": r.estimate.layout.label,
                    "overrides": list(r.estimate.layout.overrides),
                    "params_bytes": r.estimate.params_bytes,
                    "grads_bytes": r.estimate.grads_bytes,
                    "optimizer_bytes": r.estimate.optimizer_bytes,
                    "activations_bytes": r.estimate.activations_bytes,
                    "overhead_bytes": r.estimate.overhead_bytes,
                    "total_bytes": r.estimate.total_bytes,
                    "host_bytes_per_node": r.estimate.host_bytes_per_node,
                    "fits": r.fits,
                    "is_spec": r.is_spec,
                    "chosen": self.chosen is not None and r.estimate.layout == self.chosen,
                    "notes": list(r.estimate.notes),
                }
                for r in self.rows
            ],
            "reasons": list(self.reasons),
            "suggestions": list(self.suggestions),
            "assumptions": list(self.assumptions),
        }


def _gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


def candidate_layouts(accelerator: str, num_nodes: int) -> tuple[Layout, ...]:
    """Layouts compared by ``jobgen plan``, in table order (DeepSpeed and HYBRID_SHARD only on
    GPUs, HYBRID_SHARD only across nodes, FSDP CPU offload only on GPUs: jobgen's CPU FSDP has
    nothing to offload to)."""
    rows = [Layout("ddp"), Layout("fsdp", "FULL_SHARD"), Layout("fsdp", "SHARD_GRAD_OP")]
    if accelerator != "gpu":
        return tuple(rows)
    if num_nodes > 1:
        rows.append(Layout("fsdp", "HYBRID_SHARD"))
    rows += [
        Layout("fsdp", "FULL_SHARD", offload_params="cpu"),
        Layout("deepspeed_stage_1"),
        Layout("deepspeed_stage_2"),
        Layout("deepspeed_stage_2", offload_optimizer="cpu"),
        Layout("deepspeed_stage_3"),
        Layout("deepspeed_stage_3", offload_optimizer="cpu"),
        Layout("deepspeed_stage_3", offload_optimizer="cpu", offload_params="cpu"),
    ]
    return tuple(rows)


def _ladder(n_params: int, accelerator: str) -> tuple[Layout, ...]:
    """Preference order from the strategy guide: DDP below ~500M parameters, FSDP for 500M-10B,
    DeepSpeed ZeRO-3 beyond, then ZeRO-3 with optimizer and then parameter offload when nothing
    else fits."""
    z3 = (Layout("deepspeed_stage_3"), Layout("deepspeed_stage_3", offload_optimizer="cpu"),
          Layout("deepspeed_stage_3", offload_optimizer="cpu", offload_params="cpu"))
    fsdp = (Layout("fsdp", "FULL_SHARD"),)
    if accelerator != "gpu":
        return ((Layout("ddp"),) if n_params < SMALL_MODEL_PARAMS else ()) + fsdp
    if n_params < SMALL_MODEL_PARAMS:
        return (Layout("ddp"),) + fsdp + z3
    if n_params <= LARGE_MODEL_PARAMS:
        return fsdp + z3
    return z3


def budget_bytes(spec: TrainingSpec, profile: Any, devices_per_node: int) -> tuple[int, int, str | None]:
    """``(per-rank budget, host memory per node, note)`` in bytes for ``profile``.

    GPU profiles: ``gpu_mem_gib`` (or :data:`GPU_MEM_GIB_DEFAULT` for the type, with a note);
    CPU profiles: ``mem_gib_per_node / devices_per_node``.
    """
    host = int(profile.mem_gib_per_node * GIB)
    if profile.gpus_per_node:
        if profile.gpu_mem_gib is not None:
            return int(profile.gpu_mem_gib * GIB), host, None
        mem = GPU_MEM_GIB_DEFAULT[profile.gpu_type]
        return int(mem * GIB), host, (f"profile {profile.name!r} has no gpu_mem_gib: assuming {mem:g} GiB, the smallest "
                                      f"{profile.gpu_type}; set gpu_mem_gib in the profile")
    return host // devices_per_node, host, None


@dataclass(frozen=True)
class SizedModel:
    """A model sized outside this module, for :func:`plan_memory`.

    Fields:
        shape: ``n_params``, ``micro_batch_size``, ``block_size`` (and what ``size`` reads).
        size: ``size(shape, precision, layout, *, num_nodes, devices_per_node, accelerator,
            checkpointing) -> Estimate``.
        checkpointing: the model always checkpoints activations (QLoRA: peft turns it on).
        assumptions: the assumption lines that replace those about the GPT's optimizer and
            activations (``None``: keep them).
    """

    shape: Any
    size: Any
    checkpointing: bool = False
    assumptions: tuple[str, ...] | None = None


def plan_memory(spec: TrainingSpec, profile: Any, num_nodes: int, devices_per_node: int, *,
                model: SizedModel | None = None, spec_source: str = "spec") -> MemoryPlan:
    """Estimate every candidate layout for ``spec`` on ``profile``, pick one and say why.

    The pick is the first layout of the strategy guide's ladder (:func:`_ladder`) whose estimate
    fits the rank's memory (and, with offload, the node's host memory). When nothing fits,
    ``chosen`` is ``None`` and ``suggestions`` say what would: more nodes, a smaller micro batch,
    activation checkpointing, offload. ``precision: auto`` is resolved for the profile first
    (:func:`jobgen.planning.rules.resolve_precision`).

    The built-in GPT is sized here (:meth:`Shape.of`, :func:`~jobgen.planning.estimate.estimate`). A model sized
    elsewhere passes ``model`` (:class:`SizedModel`: its shape, size function, checkpointing and
    assumption lines): a Hugging Face model is planned by
    :func:`jobgen.planning.estimate_hf.plan_memory`, a ``model.class_path`` model (built to be
    counted) by :func:`jobgen.usercode.memory.plan_memory`: both sit on top of this function (this
    module does not know them). ``spec_source`` (the user's spec file) is named in errors.

    Raises:
        NotSupportedError: ``model.class_path`` without ``model`` (a user module's size is
            unknown before it is built); a Hugging Face model without ``model`` (use
            :func:`jobgen.planning.estimate_hf.plan_memory`).
    """
    from jobgen.planning.rules import resolve_precision

    spec = resolve_precision(spec, profile)
    if spec.user_code and model is None:
        raise NotSupportedError(
            "a model.class_path module's size is known only once it is built, and planning imports no user code "
            "unless asked",
            location=f"{spec_source}: model.class_path",
            hint="size it by building it: add --import (imports your classes as `jobgen validate --import` does and "
                 "counts the parameters on PyTorch's meta device; activations are not estimated), or plan a GPT of "
                 "similar shape (--set model='{preset: gpt2-124m}' ...), or measure: the summary.json of a --smoke run "
                 "has peak_memory_bytes",
        )
    accel = "gpu" if profile.gpus_per_node else "cpu"
    precision = spec.trainer.precision
    budget, host_mem, note = budget_bytes(spec, profile, devices_per_node)
    spec_ckpt = spec.trainer.activation_checkpointing or (model is not None and model.checkpointing)
    if model is None and not spec.user_code and spec.model.hf_path is not None:
        raise NotSupportedError("internal: a Hugging Face model is planned by jobgen.planning.estimate_hf.plan_memory",
                                location="spec: model.hf_path")
    shape = Shape.of(spec) if model is None else model.shape
    size = estimate if model is None else model.size

    def run(layout: Layout, sh: Any = shape, nodes: int = num_nodes, ckpt: bool = spec_ckpt) -> Row:
        est = size(sh, precision, layout, num_nodes=nodes, devices_per_node=devices_per_node,
                   accelerator=accel, checkpointing=ckpt)
        return Row(est, est.total_bytes <= budget and est.host_bytes_per_node <= host_mem, False)

    own = Layout.of(spec)
    layouts = list(candidate_layouts(accel, num_nodes))
    if own not in layouts:
        layouts.append(own)
    rows = tuple(replace(run(lay), is_spec=lay == own) for lay in layouts)
    by_layout = {r.estimate.layout: r for r in rows}
    psi = shape.n_params
    ladder = _ladder(psi, accel)
    chosen = next((lay for lay in ladder if by_layout[lay].fits), None)
    band = ("below 500M parameters: DDP when it fits" if psi < SMALL_MODEL_PARAMS
            else "500M-10B parameters: FSDP" if psi <= LARGE_MODEL_PARAMS else "above 10B parameters: DeepSpeed ZeRO-3")
    per_rank = "per GPU" if accel == "gpu" else "per CPU rank"
    reasons = [f"model {psi / 1e6:,.1f}M parameters ({band}); budget {_gib(budget)} {per_rank}, "
               f"world {num_nodes} node(s) x {devices_per_node}",
               *_ladder_reasons(ladder, chosen, by_layout, own, budget, host_mem)]
    suggestions: list[str] = []
    if chosen is None or not by_layout[own].fits:
        suggestions = _suggestions(spec, profile, shape, chosen, ladder, run, num_nodes, budget)
    assumptions = _assumptions(spec, shape, accel, spec_ckpt, None if model is None else model.assumptions)
    if note:
        assumptions.append(note)
    return MemoryPlan(psi, precision, (num_nodes, devices_per_node), accel, budget, host_mem, rows, chosen,
                      tuple(reasons), tuple(suggestions), tuple(assumptions))


def _ladder_reasons(ladder: tuple[Layout, ...], chosen: Layout | None, by_layout: dict[Layout, Row], own: Layout,
                    budget: int, host_mem: int) -> list[str]:
    """The reason lines of :func:`plan_memory` after the model line: each rung of ``ladder`` up
    to the ``chosen`` one (fits or why not), then DDP and the spec's layout ``own`` when the
    ladder did not explain them."""
    reasons: list[str] = []
    for lay in ladder:
        r = by_layout[lay]
        if lay == chosen:
            reasons.append(f"{lay.label}: {_gib(r.estimate.total_bytes)} <= {_gib(budget)}: fits -> recommended")
            break
        why = (f"{_gib(r.estimate.total_bytes)} > {_gib(budget)}" if r.estimate.total_bytes > budget
               else f"host memory {_gib(r.estimate.host_bytes_per_node)} > {_gib(host_mem)} per node")
        reasons.append(f"{lay.label}: {why}: does not fit")
    explained = set(ladder[: ladder.index(chosen) + 1] if chosen in ladder else ladder)
    for lay, what in ((Layout("ddp"), "ddp"), (own, "the spec's layout")):
        if lay in explained:
            continue  # already explained above
        explained.add(lay)
        r = by_layout[lay]
        reasons.append(f"{what} ({lay.label}): {_gib(r.estimate.total_bytes)} per rank: {'fits' if r.fits else 'does not fit'}")
    return reasons


def _assumptions(spec: TrainingSpec, shape: Any, accel: str, checkpointing: bool,
                 model_assumptions: tuple[str, ...] | None) -> list[str]:
    """The assumption lines of :func:`plan_memory`: the overhead, then ``model_assumptions`` or
    the GPT's optimizer and activation lines."""
    overhead = (f"overhead {_gib(GPU_OVERHEAD_BYTES if accel == 'gpu' else CPU_OVERHEAD_BYTES)} per rank "
                + ("(CUDA context, cuBLAS/NCCL buffers, allocator fragmentation)" if accel == "gpu" else "(Python/torch runtime)"))
    if model_assumptions is not None:
        return [overhead, *model_assumptions]
    return [
        overhead,
        "AdamW; parameters + gradients + optimizer states + activations at their peak (the optimizer step's "
        "temporaries, and gradients without accumulation, reuse the activations' memory): an estimate of the "
        "peak, not a bound (within 15% of the one-GPU peaks measured in docs/large-models.md, \"Memory plan\")",
        f"activations: micro batch {shape.micro_batch_size} x {shape.block_size} tokens, fused SDPA attention, "
        + ("activation checkpointing (peft's prepare_model_for_kbit_training turns it on for QLoRA)"
           if checkpointing and not spec.trainer.activation_checkpointing else
           "activation checkpointing on transformer blocks (trainer.activation_checkpointing)" if checkpointing
         else "no activation checkpointing") + " (Korthikanti et al. 2022)",
    ]


def _suggestions(spec: TrainingSpec, profile: Any, shape: Shape, chosen: Layout | None, ladder: tuple[Layout, ...],
                 run: Any, num_nodes: int, budget: int) -> list[str]:
    out: list[str] = []
    if chosen is not None:
        out.append("use the recommended layout: " + " ".join(f"--set {o}" for o in chosen.overrides))
        return out
    out.append(f"nothing fits {_gib(budget)} per rank with micro batch {shape.micro_batch_size} on {num_nodes} node(s)")
    for nodes in range(num_nodes + 1, profile.max_nodes + 1):
        hit = next((lay for lay in ladder if run(lay, nodes=nodes).fits), None)
        if hit is not None:
            out.append(f"more nodes: {hit.label} fits on {nodes} node(s) "
                       f"({_gib(run(hit, nodes=nodes).estimate.total_bytes)}): --set resources.nodes={nodes}")
            break
    else:
        if profile.max_nodes > num_nodes:
            out.append(f"more nodes alone do not help (up to max_nodes={profile.max_nodes})")
    for mb in sorted({shape.micro_batch_size // 2, 1} - {0, shape.micro_batch_size}, reverse=True):
        small = replace(shape, micro_batch_size=mb)
        hit = next((lay for lay in ladder if run(lay, sh=small).fits), None)
        if hit is not None:
            out.append(f"smaller micro batch: {hit.label} fits with micro_batch_size={mb} "
                       f"({_gib(run(hit, sh=small).estimate.total_bytes)}): --set trainer.micro_batch_size={mb} "
                       "(raise gradient_accumulation_steps to keep the global batch)")
            break
    hit = None if spec.trainer.activation_checkpointing else next(
        (lay for lay in ladder if lay.strategy == "fsdp" and run(lay, ckpt=True).fits), None)
    if hit is not None:
        out.append(f"activation checkpointing: {hit.label} would fit ({_gib(run(hit, ckpt=True).estimate.total_bytes)}): "
                   f"{' '.join('--set ' + o for o in hit.overrides)} --set trainer.activation_checkpointing=true")
    last = ladder[-1]
    out.append(f"most offload ({last.label}): {_gib(run(last).estimate.total_bytes)} per rank, "
               f"host {_gib(run(last).estimate.host_bytes_per_node)} per node")
    return out


def fit_warning(spec: TrainingSpec, profile: Any, num_nodes: int, devices_per_node: int) -> str | None:
    """A one-line warning when the spec's own layout is estimated not to fit a GPU profile's
    memory; ``None`` on CPU profiles, for Hugging Face models (their size is in their
    ``config.json``, which only ``jobgen plan`` reads: rendering does no I/O), or when it fits."""
    if not profile.gpus_per_node or spec.user_code or spec.model.hf_path is not None:
        return None
    mp = plan_memory(spec, profile, num_nodes, devices_per_node)
    row = mp.spec_row
    if row.fits:
        return None
    est = row.estimate
    text = (f"estimated {_gib(est.total_bytes)} per GPU for {est.layout.label} exceeds {_gib(mp.budget_bytes)}"
            if est.total_bytes > mp.budget_bytes else
            f"estimated host memory {_gib(est.host_bytes_per_node)} per node for {est.layout.label} exceeds {_gib(mp.host_bytes_per_node)}")
    hint = f"; {mp.chosen.label} fits" if mp.chosen else "; nothing fits as is"
    return f"{text} (see `jobgen plan`){hint}"
