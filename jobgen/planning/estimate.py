"""Per-rank memory estimates for training the bundled GPT, and a strategy recommender.

Pure arithmetic on the spec's model shape, trainer settings and the world size: no torch,
lightning or deepspeed import (``jobgen render`` calls :func:`fit_warning`, and the render
path must stay fast). Every number is in **bytes per rank** (per GPU, or per CPU process on
CPU-only profiles) unless a name says otherwise (``*_gib``: GiB = 2**30 bytes).

Sources of the formulas
-----------------------
* Model states: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models" (arXiv:1910.02054), section 3.1 and Figure 1. Mixed-precision Adam holds
  ``2Ψ`` (16-bit parameters) + ``2Ψ`` (16-bit gradients) + ``KΨ`` optimizer states with
  ``K = 12`` (fp32 master parameters, momentum and variance) = ``16Ψ``; ZeRO stage 1 divides the
  ``KΨ`` by the data-parallel degree ``N_d``, stage 2 also the gradients, stage 3 also the
  parameters: ``2Ψ + 2Ψ + KΨ/N_d``, ``2Ψ + (2 + K)Ψ/N_d``, ``(2 + 2 + K)Ψ/N_d``.
* Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models" (arXiv:2205.05198), section 4.1, eq. (1): ``sbh(34 + 5as/h)`` = ``34sbh + 5as²b`` bytes
  per transformer layer with 16-bit activations and 1-byte dropout masks (s: sequence length,
  b: micro batch, h: hidden size, a: attention heads). See :func:`activation_bytes` for how the
  terms map onto this model (fused attention, no dropout, 32-bit activations).
* Hugging Face models (``model.hf_path``): :mod:`jobgen.planning.estimate_hf` reads their ``config.json`` and
  applies :func:`estimate` to the parameters that train (LoRA adapters, or the whole model), adding
  the frozen (optionally 4-bit) base and the Llama block's activations.
* Implementation terms the papers do not have, each named where it is added: PyTorch DDP's
  gradient bucket copy, FSDP's gathered units, torch AdamW's ``foreach`` temporaries, DeepSpeed's
  fp32 gradient partition, communication buckets and ZeRO-3's gathered working set, the
  residual stream's width under autocast (:func:`residual_bytes`).

The estimate is the peak of one training step: the model states alive throughout, plus the
larger of the activations' peak and what is allocated only after it (gradients produced while
backward frees activations, the optimizer step's temporaries; :func:`with_activations`), plus
the overhead term for what PyTorch's allocator does not report (CUDA context, NCCL, the
allocator's reserve). Calibration: the one-GPU peaks of the GPU suite (one H100,
``torch.cuda.max_memory_allocated``), kept with their sources in
tests/unit/test_estimate_measured.py ``MEASURED``, are within 15% of the plan (measured /
planned 0.86-1.05; before the fixes named in :func:`activation_bytes`,
:func:`residual_bytes` and :func:`deepspeed_bucket_bytes`, ZeRO-2 read 0.59-0.64). It is an
estimate, not a bound: a layout or shape far from those runs can be off by more.

The plan built on these estimates (every candidate layout, the one recommended and why, what
would make a job fit, the warning ``jobgen render`` prints) is :mod:`jobgen.planning.memory_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from jobgen.specs.training import TrainingSpec

GIB = 2**30
VOCAB_SIZE = 256
"""Byte-level vocabulary of the bundled GPT (jobgen.train.model.VOCAB_SIZE)."""

GPU_OVERHEAD_BYTES = int(1.5 * GIB)
"""Assumption: per-GPU memory outside tensors jobgen models: the CUDA context and loaded kernels
(~0.3-0.6 GiB with lazy module loading), cuBLAS/cuDNN workspaces, NCCL communicator buffers, and
the caching allocator's fragmentation. Not measured: the GPU peaks the estimate is checked
against (``torch.cuda.max_memory_allocated``, tests/unit/test_estimate_measured.py) leave all of
this out, so there the plan reads this much above an exact count of the tensors."""

CPU_OVERHEAD_BYTES = int(0.5 * GIB)
"""Assumption: per-process host memory of the Python + torch + Lightning runtime itself on CPU
profiles (imports alone are a few hundred MB of RSS)."""

DEEPSPEED_BUCKET_ELEMENTS = 200_000_000
"""``reduce_bucket_size`` / ``allgather_bucket_size`` in elements, as jobgen.planning.deepspeed renders them
(``BUCKET_ELEMENTS``; read from there when importable, this copy keeps the module standalone)."""

DEEPSPEED_STAGE3_PREFETCH_ELEMENTS = DEEPSPEED_BUCKET_ELEMENTS // 4
"""``stage3_prefetch_bucket_size`` as jobgen.planning.deepspeed renders it."""

DEEPSPEED_STAGE3_PERSISTENCE_THRESHOLD = 1_000_000
"""``stage3_param_persistence_threshold``: tensors with fewer elements stay gathered on every rank."""

_16BIT = ("bf16-mixed", "16-mixed", "bf16-true", "transformer-engine")


@dataclass(frozen=True)
class Layout:
    """One way to train: a strategy with its sharding and offload settings (the spec's names)."""

    strategy: str
    """``ddp``, ``fsdp``, ``deepspeed_stage_1`` .. ``deepspeed_stage_3``."""
    fsdp_sharding_strategy: str = "FULL_SHARD"
    """FSDP only: ``FULL_SHARD``, ``SHARD_GRAD_OP``, ``NO_SHARD`` or ``HYBRID_SHARD``."""
    offload_optimizer: str = "none"
    """DeepSpeed: ``none``, ``cpu`` or ``nvme``."""
    offload_params: str = "none"
    """DeepSpeed stage 3 (``cpu``/``nvme``) or FSDP (``cpu``)."""

    @property
    def label(self) -> str:
        """Short stable name, e.g. ``fsdp:FULL_SHARD`` or ``deepspeed_stage_3+opt:cpu+params:cpu``."""
        text = self.strategy + (f":{self.fsdp_sharding_strategy}" if self.strategy == "fsdp" else "")
        if self.offload_optimizer != "none":
            text += f"+opt:{self.offload_optimizer}"
        if self.offload_params != "none":
            text += f"+params:{self.offload_params}"
        return text

    @property
    def overrides(self) -> tuple[str, ...]:
        """The ``--set`` arguments that select this layout."""
        out = [f"trainer.strategy={self.strategy}"]
        if self.strategy == "fsdp":
            out.append(f"trainer.fsdp_sharding_strategy={self.fsdp_sharding_strategy}")
        if self.offload_optimizer != "none":
            out.append(f"trainer.offload_optimizer={self.offload_optimizer}")
        if self.offload_params != "none":
            out.append(f"trainer.offload_params={self.offload_params}")
        return tuple(out)

    @classmethod
    def of(cls, spec: TrainingSpec) -> Layout:
        """The layout a spec asks for."""
        t = spec.trainer
        return cls(t.strategy, t.fsdp_sharding_strategy if t.strategy == "fsdp" else "FULL_SHARD",
                   t.offload_optimizer, t.offload_params)


@dataclass(frozen=True)
class Shape:
    """What the estimate needs to know about the model and one micro batch."""

    n_layer: int
    n_head: int
    d_model: int
    block_size: int
    micro_batch_size: int
    dropout: float = 0.0
    accumulation: int = 1
    """``gradient_accumulation_steps``: above 1, the previous micro batches' gradients are alive
    at the activation peak."""

    @classmethod
    def of(cls, spec: TrainingSpec) -> Shape:
        """Shape of ``spec.model`` at ``spec.trainer.micro_batch_size`` sequences of ``block_size``."""
        m, t = spec.model, spec.trainer
        return cls(m.n_layer, m.n_head, m.d_model, m.block_size, t.micro_batch_size, m.dropout, t.gradient_accumulation_steps)

    @property
    def n_params(self) -> int:
        """Parameters of the bundled GPT (tied embeddings): ``V·h + s·h + L(12h² + 13h) + 2h``
        (same formula as :attr:`jobgen.specs.training.ModelSpec.n_params`)."""
        d = self.d_model
        return VOCAB_SIZE * d + self.block_size * d + self.n_layer * self.block_params + 2 * d

    @property
    def block_params(self) -> int:
        """Parameters of one transformer Block (the unit FSDP wraps): ``12h² + 13h``."""
        return 12 * self.d_model**2 + 13 * self.d_model

    @property
    def root_params(self) -> int:
        """Parameters outside the Blocks (embeddings, final LayerNorm): FSDP's root unit."""
        return self.n_params - self.n_layer * self.block_params

    @property
    def largest_module_params(self) -> int:
        """Largest single module's own parameters (DeepSpeed's ``largest_layer_params``): the MLP's
        first Linear ``4h² + 4h``, or an embedding table when that is bigger."""
        d = self.d_model
        return max(4 * d * d + 4 * d, self.block_size * d, VOCAB_SIZE * d)


@dataclass(frozen=True)
class Estimate:
    """Estimated peak memory of one rank, in bytes, for one :class:`Layout`.

    ``host_bytes_per_node`` is what offload puts in the node's CPU memory (0 without offload).
    """

    layout: Layout
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    overhead_bytes: int
    host_bytes_per_node: int = 0
    notes: tuple[str, ...] = field(default=())
    late_bytes: int = 0
    """Bytes of the parameter/gradient/optimizer columns allocated only after the activation
    peak (the optimizer step's temporaries; gradients without accumulation): the activations
    column holds what the activations need beyond them (:func:`with_activations`)."""

    @property
    def model_states_bytes(self) -> int:
        """Parameters + gradients + optimizer states (ZeRO's "model states")."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        """Model states + activations + overhead."""
        return self.model_states_bytes + self.activations_bytes + self.overhead_bytes


def residual_bytes(precision: str, strategy: str) -> int:
    """Bytes of one element of the residual stream (block inputs, norm inputs, the tensors
    activation checkpointing keeps) under ``precision`` and ``strategy``.

    4 under ``32-true``, and under mixed precision with DDP: Lightning's autocast computes the
    Linears in 16-bit but the weights stay fp32, so the embedding output and every residual add
    are fp32 (torch autocast leaves ``add`` and ``embedding`` in their input dtype). 2 otherwise:
    FSDP's MixedPrecision gathers 16-bit parameters (``param_dtype`` bf16/fp16, Lightning's
    FSDPPrecision), DeepSpeed casts every floating-point parameter to 16-bit
    (``DeepSpeedEngine._cast_module_mixed_precision``, deepspeed 0.19.8) and Lightning's
    DeepSpeedPrecision adds no autocast, ``bf16-true`` stores 16-bit weights.

    Evidence: Llama-2-7B QLoRA on one H100 (GPU suite rows ``llama7b-qlora-ddp`` and
    ``llama7b-qlora-ds2`` of tests/unit/test_estimate_measured.py): the DDP peak (15.6 GiB) is
    4.5 GiB above ZeRO-2's (11.1 GiB) although ZeRO-2 holds more model state; fp32 checkpointed
    block inputs (32 x 2048 x 4 x 4096 x 4 bytes = 4 GiB instead of 2) are the largest part of
    the difference. With a 16-bit residual the DDP plan would read 1.21 (measured / planned).
    """
    if precision not in _16BIT:
        return 4
    return 4 if precision in ("bf16-mixed", "16-mixed") and strategy == "ddp" else 2


def activation_bytes(shape: Shape, precision: str, *, checkpointing: bool = False, fused_attention: bool = True,
                     residual: int | None = None, reuse: bool = True) -> int:
    """Peak bytes of activations on one rank for one micro batch (saved tensors + the largest
    working set that coexists with them).

    Korthikanti et al. 2022 (arXiv:2205.05198) eq. (1) counts per layer, in 16-bit,
    ``34sbh + 5as²b`` bytes: attention ``11sbh + 5as²b`` (QKV input 2sbh, Q and K 4sbh, softmax
    2as²b + its dropout mask as²b, softmax output and V 2as²b + 2sbh, projection input 2sbh,
    dropout mask sbh), MLP ``19sbh`` (input 2sbh, fc1 output 8sbh, GELU output 8sbh, mask sbh),
    two LayerNorm inputs ``4sbh``. In elements of ``t = s·b·h``: the two LayerNorm inputs at the
    residual width ``r`` (:func:`residual_bytes`), 14t at the activation width ``e`` (2 bytes in
    16-bit, 4 under ``32-true``), 2t one-byte dropout masks. For the bundled GPT:

    * dropout masks only when ``model.dropout > 0``;
    * attention goes through ``scaled_dot_product_attention`` with fused (flash / memory
      efficient) kernels, which keep the output (t) and the fp32 log-sum-exp (``4·a·s·b`` bytes)
      instead of the ``5as²b`` score matrices (``fused_attention=False`` restores them);
    * beyond the layers (the "head"): the embedding output and the final LayerNorm input (2t at
      ``r``), the head input (t at ``e``), the logits ``s·b·V`` at ``e`` plus their fp32 copy and
      fp32 log-softmax in the loss (``8·s·b·V``).
    * backward working set: the layer being differentiated holds its gradient buffers, at most
      the MLP's (fc1 and GELU outputs, 4t each) plus the residual stream's (2t), ``10t`` at ``e``.
      Korthikanti et al. count saved activations only; without this term the estimate ran ~21%
      under the measured peak of an activation-heavy CPU run (benchmarks/memory.py).

    With activation checkpointing only each block's input (t at ``r`` per layer) is kept, and one
    layer's full activations exist at a time, during its recomputation in backward.

    The peak is ``saved + max(head, transient)``: the head's tensors (logits, loss) live at the
    end of forward and the start of backward, before any layer is recomputed or differentiated;
    the transient is the backward working set, plus one recomputed layer under checkpointing.
    Summing the two instead (an earlier jobgen) over-counts the checkpointed Llama-2-7B QLoRA
    runs of the GPU suite (rows ``llama7b-qlora-*`` of tests/unit/test_estimate_measured.py) by
    2.3 GiB: head 2.57 GiB, recomputed layer + working set 2.28 GiB.

    Args:
        shape: model shape and micro batch (``s`` = block_size, ``b`` = micro_batch_size).
        precision: the spec's precision (``32-true``, ``bf16-mixed``, ``16-mixed``, ``bf16-true``).
        checkpointing: keep only block inputs (recompute the rest in backward).
        fused_attention: SDPA uses a fused kernel (no ``s x s`` score matrices stored).
        residual: bytes of a residual-stream element (``r``, see :func:`residual_bytes`); default
            ``e`` (pure 16-bit compute as under DeepSpeed; fp32 under ``32-true``).
        reuse: the transient reuses the head's freed memory (``max``); ``False`` sums them, for CPU
            ranks, whose budget is RSS (see :func:`model_states`).

    Returns:
        bytes.
    """
    e = 2 if precision in _16BIT else 4
    r = e if residual is None else residual
    s, b, h, a = shape.block_size, shape.micro_batch_size, shape.d_model, shape.n_head
    t = s * b * h
    per_layer = 2 * t * r + 14 * t * e + (2 * t if shape.dropout > 0 else 0)
    if fused_attention:
        per_layer += t * e + 4 * a * s * b
    else:
        per_layer += 4 * a * s * s * b * e // 2 + (a * s * s * b if shape.dropout > 0 else 0)  # 2as²b(e/2)x2 + mask
    head = 2 * t * r + t * e + s * b * VOCAB_SIZE * (e + 8)
    backward = 10 * t * e  # one layer's gradient buffers during backward (see above)
    peak = max if reuse else (lambda x, y: x + y)
    if checkpointing:
        return shape.n_layer * t * r + peak(head, per_layer + backward)
    return shape.n_layer * per_layer + peak(head, backward)


def estimate(
    shape: Shape,
    precision: str,
    layout: Layout,
    *,
    num_nodes: int,
    devices_per_node: int,
    accelerator: str = "gpu",
    checkpointing: bool = False,
    overhead_bytes: int | None = None,
) -> Estimate:
    """Peak memory of one rank training ``shape`` with ``layout`` on ``num_nodes x devices_per_node``:
    :func:`model_states` plus :func:`activation_bytes` (at :func:`residual_bytes` of the layout),
    joined by :func:`with_activations`.

    Args:
        shape: model shape, micro batch and gradient accumulation.
        precision: the spec's precision.
        layout: strategy, FSDP sharding, offload.
        num_nodes, devices_per_node: the world (ranks = data-parallel degree N_d).
        accelerator: ``gpu`` or ``cpu`` (which implementation details apply, and the overhead).
        checkpointing: activation checkpointing (see :func:`activation_bytes`).
        overhead_bytes: fixed per-rank overhead; default :data:`GPU_OVERHEAD_BYTES` or
            :data:`CPU_OVERHEAD_BYTES`.

    Returns:
        the :class:`Estimate` (bytes per rank).
    """
    states = model_states(shape, precision, layout, num_nodes=num_nodes, devices_per_node=devices_per_node,
                          accelerator=accelerator, overhead_bytes=overhead_bytes)
    acts = activation_bytes(shape, precision, checkpointing=checkpointing, residual=residual_bytes(precision, layout.strategy),
                            reuse=accelerator == "gpu")
    return with_activations(states, acts)


def model_states(
    shape: Any,
    precision: str,
    layout: Layout,
    *,
    num_nodes: int,
    devices_per_node: int,
    accelerator: str = "gpu",
    overhead_bytes: int | None = None,
) -> Estimate:
    """Parameters, gradients, optimizer states and overhead of one rank (activations 0; see
    :func:`estimate`), with :attr:`Estimate.late_bytes` set.

    Bytes per parameter Ψ (16-bit = ``bf16-mixed``/``16-mixed``/``bf16-true``):

    * ``ddp`` (PyTorch DDP under Lightning; mixed precision is torch autocast over fp32 weights):
      parameters 4Ψ (+2Ψ autocast's 16-bit weight copies, alive until backward), gradients 4Ψ
      (+4Ψ for DDP's bucket copy when world size > 1: ``gradient_as_bucket_view=False``, PyTorch's
      and Lightning's default), AdamW moments 8Ψ. That is ZeRO's 16Ψ baseline with the fp32
      master living in the parameters instead of the optimizer. ``bf16-true``: 2Ψ + 2Ψ + 4Ψ
      (torch AdamW keeps its moments in the parameter dtype).
    * ``fsdp`` (torch FSDP, one unit per Block, fp32 flat parameters, Lightning's MixedPrecision
      in 16-bit): per shard group of size S (world; devices per node for HYBRID_SHARD; 1 for
      NO_SHARD) parameters 4Ψ/S, gradients 4Ψ/S, moments 8Ψ/S — ZeRO-3's ``16Ψ/N_d`` — plus the
      gathered 16-bit units: FULL_SHARD/HYBRID_SHARD two Blocks (current + prefetched) and the
      root unit (embeddings), SHARD_GRAD_OP every unit (kept from forward to backward: ZeRO-2-like),
      and one unsharded Block gradient before its reduce-scatter. ``offload_params: cpu`` moves
      the shards (parameters, gradients, optimizer: FSDP steps the optimizer on CPU) to the host.
    * ``deepspeed_stage_N`` (ZeRO as in the paper, K = 12 including DeepSpeed's fp32 master copy,
      which it keeps under any precision): stage 1 ``pΨ + pΨ + 12Ψ/N``, stage 2 ``pΨ + (p + 12)Ψ/N``,
      stage 3 ``(p + p + 12)Ψ/N`` with p = 2 (16-bit) or 4 (``32-true``), plus DeepSpeed's
      fp32 gradient partition ``4Ψ/N`` (stage_1_and_2.py / stage3.py build it for the step; its
      own estimator counts it: "4_grads_32bit"), communication buckets
      (:func:`deepspeed_bucket_bytes`) and, stage 3,
      the gathered working set (largest module + prefetch bucket + persistent small tensors).
      ``offload_optimizer`` moves the optimizer states and the fp32 gradient partition to the
      host (or NVMe), ``offload_params`` (stage 3) the 16-bit parameter partition.
    * torch AdamW on CUDA uses the ``foreach`` implementation, whose step materialises one fp32
      temporary per local parameter (``sqrt(v)``): +4Ψ_local in the optimizer column (ddp, fsdp
      on GPU; the CPU implementation loops per tensor: + the largest tensor).

    Which of these are alive at the activation peak (:attr:`Estimate.late_bytes` are not): the
    AdamW step temporaries and DeepSpeed's fp32 gradient partition exist only in the optimizer
    step, after the activations are freed; gradients (``.grad`` with Lightning's
    ``zero_grad(set_to_none=True)``, ZeRO-1/2's 16-bit partition, FSDP's sharded gradients) are
    produced while backward frees the activations, so they coexist with the peak only when
    ``shape.accumulation > 1`` keeps the previous micro batches' gradients. Moments and master
    weights exist from the first step on; DDP's bucket copy, DeepSpeed's buckets and ZeRO-3's
    gradient partition buffer from initialisation. On CPU ranks nothing is counted as reused
    (the RSS high-water mark keeps freed memory; see the code).

    Args: as :func:`estimate` (``shape``: also :class:`jobgen.planning.estimate_hf.HFShape` or
    ``AdapterShape``).
    """
    gpu = accelerator == "gpu"
    if overhead_bytes is None:
        overhead_bytes = GPU_OVERHEAD_BYTES if gpu else CPU_OVERHEAD_BYTES
    s = layout.strategy
    if s == "ddp":
        cols = _ddp_states(shape, precision, num_nodes * devices_per_node, gpu)
    elif s == "fsdp":
        cols = _fsdp_states(shape, precision, layout, num_nodes * devices_per_node, devices_per_node, gpu)
    elif s.startswith("deepspeed_stage_"):
        cols = _deepspeed_states(shape, precision, layout, num_nodes * devices_per_node, devices_per_node)
    else:  # pragma: no cover - the spec's Literal rules this out
        raise ValueError(f"unknown strategy {s!r}")
    late = cols.late
    if not gpu:
        # A CPU rank's budget is its RSS, and glibc's malloc keeps most of the freed activation
        # memory mapped (its mmap threshold rises to the freed tensors' size), so the gradients and
        # step temporaries do not reliably reuse it: counting the reuse moved the estimate from
        # -1% / -10% to -22% / -19% of the RSS peaks of tests/entrypoint/test_estimate_memory.py
        # (activation_bytes(reuse=False) likewise sums the head and the transient on CPU).
        late = 0
    return Estimate(layout, int(cols.params), int(cols.grads), int(cols.optim), 0, int(overhead_bytes), int(cols.host),
                    tuple(cols.notes), late_bytes=int(late))


class _States(NamedTuple):
    """One rank's model-state columns under one strategy (bytes), before the CPU rule of
    :func:`model_states`: ``late`` is what they allocate only after the activation peak."""

    params: int
    grads: int
    optim: int
    host: int
    late: int
    notes: list[str]


def _accumulating(shape: Any) -> bool:
    return getattr(shape, "accumulation", 1) > 1


def _ddp_states(shape: Any, precision: str, n: int, gpu: bool) -> _States:
    """DDP's columns on a world of ``n`` ranks (:func:`model_states`, ``ddp``)."""
    psi = shape.n_params
    w = 2 if precision == "bf16-true" else 4  # bytes of a weight / gradient element
    params = w * psi + (2 * psi if precision in ("bf16-mixed", "16-mixed") else 0)
    grads = w * psi * (2 if n > 1 else 1)
    optim = (2 * w) * psi + _adam_temp(psi, shape, w, gpu)
    late = _adam_temp(psi, shape, w, gpu) + (0 if _accumulating(shape) else w * psi)
    notes = ["gradients include DDP's bucket copy (gradient_as_bucket_view=False)"] if n > 1 else []
    return _States(params, grads, optim, 0, late, notes)


def _fsdp_states(shape: Any, precision: str, layout: Layout, n: int, devices_per_node: int, gpu: bool) -> _States:
    """FSDP's columns on a world of ``n`` ranks (:func:`model_states`, ``fsdp``)."""
    psi = shape.n_params
    shard = {"FULL_SHARD": n, "SHARD_GRAD_OP": n, "HYBRID_SHARD": devices_per_node, "NO_SHARD": 1}[layout.fsdp_sharding_strategy]
    w = 2 if precision == "bf16-true" else 4
    c = 2 if precision in _16BIT else 4  # compute (gathered) dtype
    sharded_p, sharded_g, sharded_o = w * psi // shard, w * psi // shard, 2 * w * psi // shard
    if layout.fsdp_sharding_strategy == "NO_SHARD":
        gathered = c * psi if precision in ("bf16-mixed", "16-mixed") else 0
        unit_grad = 0
    elif layout.fsdp_sharding_strategy == "SHARD_GRAD_OP":
        gathered = c * psi
        unit_grad = c * shape.block_params
    else:
        gathered = c * (min(2, shape.n_layer) * shape.block_params + shape.root_params)
        unit_grad = c * shape.block_params
    if layout.offload_params == "cpu":
        host = (sharded_p + sharded_g + sharded_o) * devices_per_node
        return _States(gathered, unit_grad, 0, host, 0,
                       ["FSDP CPU offload: parameter, gradient and optimizer shards in host memory; optimizer steps on CPU"])
    late = _adam_temp(psi // shard, shape, w, gpu) + (0 if _accumulating(shape) else sharded_g)
    return _States(sharded_p + gathered, sharded_g + unit_grad, sharded_o + _adam_temp(psi // shard, shape, w, gpu), 0, late, [])


def _deepspeed_states(shape: Any, precision: str, layout: Layout, n: int, devices_per_node: int) -> _States:
    """ZeRO's columns on a world of ``n`` ranks (:func:`model_states`, ``deepspeed_stage_N``)."""
    psi = shape.n_params
    stage = int(layout.strategy[-1])
    p = 2 if precision in _16BIT else 4
    notes: list[str] = []
    host = 0
    p16, g16, fp32_grad, opt = p * psi, p * psi, 4 * psi // n, 12 * psi // n
    if stage >= 2:
        g16 //= n
    if stage >= 3:
        p16 //= n
    buckets = deepspeed_bucket_bytes(stage, p, psi)
    if stage in (1, 2):
        working = 0
    else:
        persistent = getattr(shape, "persistent_params", None)  # a model built to be sized counts them
        if persistent is None:  # the GPT's biases + LayerNorms: below the persistence threshold
            persistent = shape.n_layer * 13 * shape.d_model + 2 * shape.d_model
        working = p * min(psi, shape.largest_module_params + DEEPSPEED_STAGE3_PREFETCH_ELEMENTS + persistent)
    if layout.offload_optimizer != "none":
        host += (opt + fp32_grad) * devices_per_node
        opt, fp32_grad = 0, 0
        if stage >= 2:
            host += g16 * devices_per_node
            g16 = 0  # the reduced gradient partitions live in the offload device's buffer (stage3.py: device=self.device)
        notes.append(f"optimizer states and fp32 gradient partition on {layout.offload_optimizer}")
    if layout.offload_params != "none":
        host += p16 * devices_per_node
        p16 = 0
        notes.append(f"16-bit parameter partition on {layout.offload_params}")
    if layout.offload_optimizer == "nvme" or layout.offload_params == "nvme":
        host = host // 4  # NVMe holds the states; the host keeps pinned staging buffers only (assumption)
    # the fp32 gradient partition exists for the step only; ZeRO-1/2's 16-bit gradients are
    # allocated at the first reduce in backward and freed after the step (stage 3 keeps its
    # gradient partition buffer from initialisation)
    late = fp32_grad + (g16 if stage <= 2 and not _accumulating(shape) else 0)
    return _States(p16 + working, g16 + fp32_grad + buckets, opt, host, late, notes)


def with_activations(est: Estimate, acts: int) -> Estimate:
    """``est`` with ``acts`` bytes of peak activations (:func:`activation_bytes`) placed in its
    activations column, less what the model-state columns allocate only after the activation peak
    (:attr:`Estimate.late_bytes`: the optimizer step's temporaries, and gradients when
    ``gradient_accumulation_steps`` is 1). The rank's peak is then ``states + max(activations,
    late)`` = the column sum: the column holds ``max(0, acts - late)``, and a note gives the
    activations' own peak."""
    reuse = min(acts, est.late_bytes)
    notes = est.notes
    if reuse:
        notes += (f"activations peak at {acts / GIB:.2f} GiB; {reuse / GIB:.2f} GiB of it is memory the gradients "
                  "or the optimizer step take only after the peak (counted in their columns)",)
    return replace(est, activations_bytes=int(acts - reuse), notes=notes)


def deepspeed_bucket_bytes(stage: int, p: int, psi: int) -> int:
    """Bytes of DeepSpeed's gradient communication buffers for ZeRO ``stage`` with ``p``-byte
    gradients and ``psi`` trainable parameters, as jobgen.planning.deepspeed configures them
    (``reduce_bucket_size`` = :data:`DEEPSPEED_BUCKET_ELEMENTS`, ``contiguous_gradients`` and
    ``overlap_comm`` on).

    Stages 1/2: ``setup_buckets`` in deepspeed/runtime/zero/stage_1_and_2.py (0.19.8) allocates
    one ``reduce_bucket_size``-element buffer in the gradient dtype, and a second one with
    ``overlap_comm`` (double buffering), whatever the model's size: ``2 x reduce_bucket_size x p``.
    The all-gather of updated parameters writes into the flat 16-bit parameter buffer in place
    (``allgather_bucket_size`` chunks it; no extra allocation). NCCL's own buffers are allocated
    outside PyTorch's caching allocator and belong to the overhead term. jobgen's estimate before
    the QLoRA runs took Hugging Face's "4.5x the bucket sizes" rule (``4.5 x 2 x bucket x p``, 2.7-3.4 GiB
    here instead of 0.75): with it the plan over-reserved the measured one-GPU ZeRO-2 peaks of
    the GPU suite by 36-41% (GPT-350M 0.64, Llama-2-7B QLoRA 0.59 measured / planned).
    Stage 3: the reduce bucket, at most the model (unchanged; not measured here).
    """
    if stage in (1, 2):
        return 2 * DEEPSPEED_BUCKET_ELEMENTS * p
    return min(DEEPSPEED_BUCKET_ELEMENTS, psi) * p


def _adam_temp(local_params: int, shape: Shape, w: int, gpu: bool) -> int:
    """torch AdamW step temporaries: foreach on CUDA (one tensor per local parameter), per-tensor
    loop on CPU (the largest tensor)."""
    if gpu:
        return w * local_params
    return w * shape.largest_module_params
