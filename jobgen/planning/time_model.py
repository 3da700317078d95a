"""The time model: step time, tokens/s, wall time, GPU-hours and cost of each layout of a plan.

Pure arithmetic, no torch import (``jobgen plan`` stays light).

Per optimizer step::

    compute = FLOPs per step / (devices x peak FLOP/s x MFU)
    step    = compute + exposed collectives + offload traffic

* FLOPs per step = FLOPs per token x tokens per step (micro batch x block size x gradient
  accumulation x world size). FLOPs per token: ``6N + 12·L·d·s`` (Narayanan et al. 2021,
  "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 5.1;
  PaLM, Chowdhery et al. 2022, appendix B), counted as the entrypoint counts them
  (:func:`jobgen.planning.flops.shape_flops_per_token`).
* Peak FLOP/s: NVIDIA datasheets' dense figures per GPU type and compute dtype
  (:data:`jobgen.planning.flops.PEAK_FLOPS`). CPU ranks have no datasheet peak here: the
  calibration's achieved FLOP/s per core x cores stands for ``peak x MFU``, and without a CPU
  calibration row there is no prediction.
* MFU: the calibration row of (accelerator, dtype, layout family, size class)
  (:mod:`jobgen.planning.calibration`), its band the runs' smallest and largest.
* Collectives, with NCCL's bus-bandwidth definitions (nccl-tests, doc/PERFORMANCE.md): an
  all-reduce of S bytes over n ranks takes ``2(n-1)/n x S / busbw``, an all-gather or a
  reduce-scatter of S bytes (the whole, gathered size) ``(n-1)/n x S / busbw``. Volumes per step,
  Ψ = trainable parameters, c = bytes of the communicated dtype (:func:`collectives`):

  - DDP: all-reduce of the gradients, S = 4Ψ (fp32 gradients under autocast; 2Ψ under
    ``bf16-true``), PyTorch DDP's buckets;
  - FSDP FULL_SHARD / HYBRID_SHARD (within the node): all-gather of the parameters in forward and
    again in backward, reduce-scatter of the gradients, S = cΨ each (ZeRO-3's 3Ψ, Rajbhandari et
    al. 2020, section 7); HYBRID_SHARD adds an all-reduce of the gradient shards across nodes;
    SHARD_GRAD_OP: one all-gather and one reduce-scatter; NO_SHARD: as DDP;
  - ZeRO-1/2: reduce-scatter of the gradients and all-gather of the updated parameters,
    S = cΨ each (2Ψ, the paper's section 7.2.1); ZeRO-3: as FULL_SHARD;
  - offload over PCIe (host link per GPU): optimizer offload sends the fp32 gradient partition to
    the host and the updated 16-bit partition back (4Ψ/n + cΨ/n); parameter offload (ZeRO-3,
    FSDP) fetches the parameter partition in forward and backward (2 x cΨ/n, FSDP 2 x 4Ψ/n) and
    FSDP also moves the gradient shard (cΨ/n). The host's optimizer step itself is not modeled:
    offload rows are a lower bound (said in the plan).

* Overlap, stated: gradient reductions (DDP all-reduce, FSDP/ZeRO reduce-scatter, HYBRID_SHARD's
  inter-node all-reduce) overlap backward (2/3 of compute); FSDP's and ZeRO-3's parameter
  all-gathers overlap forward and backward (prefetch): the exposed time is what exceeds that
  window. ZeRO-1/2's all-gather after the optimizer step and offload traffic do not overlap.
* Bandwidth (busbw): within a node the GPU type's NVLink (per direction) or PCIe figure
  (:data:`INTRA_NODE_GB_PER_S`), across nodes the fabric's (:data:`INTER_NODE_GB_PER_S`); a
  collective over nodes runs at the smaller. The profile's ``bandwidth`` overrides each. The
  band's high end takes the collectives at half the bandwidth (NCCL reaches 50-90% of a link's
  datasheet figure in nccl-tests results; assumption).
* Wall time to ``max_steps``: steps x step time; start-up, data preparation, validation and
  checkpoint writes are not included.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from jobgen.planning.calibration import Lookup, family_of, lookup, size_class
from jobgen.planning.estimate import Layout
from jobgen.planning.flops import PEAK_FLOPS, planned_compute_dtype

GB = 1e9

#: Intra-node bus bandwidth per GPU, GB/s per direction. NVLink: NVIDIA datasheets give the
#: bidirectional total per GPU; half of it is one direction (what a ring collective's busbw is
#: bounded by). V100 SXM2 300 GB/s (NVLink 2), A100 SXM 600 GB/s (NVLink 3), H100/H200 SXM 900 GB/s
#: (NVLink 4), B200 1.8 TB/s (NVLink 5). PCIe-only cards go through the host: T4 PCIe Gen3 x16
#: (~16 GB/s), A10G/L4/L40S Gen4 x16 (~32 GB/s).
INTRA_NODE_GB_PER_S: dict[str, float] = {
    "V100": 150, "T4": 16, "A10G": 32, "A100": 300, "L4": 32, "L40S": 32, "H100": 450, "H200": 450, "B200": 900,
}

#: Host link (PCIe) per GPU, GB/s per direction, for offload: PCIe Gen3 x16 ~16 (V100, T4), Gen4
#: x16 ~32 (A10G, A100, L4, L40S), Gen5 x16 ~64 (H100, H200, B200); NVIDIA datasheets.
PCIE_GB_PER_S: dict[str, float] = {
    "V100": 16, "T4": 16, "A10G": 32, "A100": 32, "L4": 32, "L40S": 32, "H100": 64, "H200": 64, "B200": 64,
}

#: Inter-node bus bandwidth per node, GB/s, per ``network_fabric`` (assumptions: a typical node of
#: each kind; set the profile's ``bandwidth.inter_node_gb_per_s`` to yours). infiniband: 8 x NDR
#: 400 Gb/s (NVIDIA DGX H100 reference) = 400; roce: 8 x 200 Gb/s = 200; efa: AWS p5, 3,200 Gb/s
#: = 400; tcp: one 100 GbE port = 12.5.
INTER_NODE_GB_PER_S: dict[str, float] = {"infiniband": 400, "roce": 200, "efa": 400, "tcp": 12.5}

CPU_INTRA_NODE_GB_PER_S = 1.0
"""gloo between CPU ranks of one node (assumption: loopback TCP; the preflight measures it,
docs/performance.md). Set ``bandwidth.intra_node_gb_per_s`` to what the preflight prints."""

BACKWARD_SHARE = 2 / 3
"""Backward's share of a step's compute: 4 of the 6 FLOPs per parameter per token."""


@dataclass(frozen=True)
class Link:
    """Bus bandwidths (GB/s) a layout's collectives run at, and where each figure comes from."""

    intra_gb_per_s: float
    inter_gb_per_s: float | None
    pcie_gb_per_s: float | None
    num_nodes: int
    sources: tuple[str, ...]

    @property
    def collective_gb_per_s(self) -> float:
        """The bandwidth of a collective over the whole world: the intra-node figure on one node,
        the smaller of the two across nodes."""
        if self.num_nodes > 1 and self.inter_gb_per_s is not None:
            return min(self.intra_gb_per_s, self.inter_gb_per_s)
        return self.intra_gb_per_s


def link_for(profile: Any, accelerator: str, num_nodes: int) -> Link:
    """The :class:`Link` of ``profile``: its ``bandwidth`` overrides, else the GPU type's
    datasheet figures and the fabric's (:data:`INTRA_NODE_GB_PER_S`, :data:`PCIE_GB_PER_S`,
    :data:`INTER_NODE_GB_PER_S`); CPU ranks: :data:`CPU_INTRA_NODE_GB_PER_S`."""
    bw = getattr(profile, "bandwidth", None)
    fabric = getattr(profile, "network_fabric", "tcp")
    sources = []
    if accelerator == "cpu":
        intra, pcie = CPU_INTRA_NODE_GB_PER_S, None
        sources.append(f"intra-node {intra:g} GB/s (gloo, assumed)")
    else:
        intra, pcie = INTRA_NODE_GB_PER_S[accelerator], PCIE_GB_PER_S[accelerator]
        sources.append(f"intra-node {intra:g} GB/s ({accelerator} datasheet)")
    inter = INTER_NODE_GB_PER_S.get(fabric, INTER_NODE_GB_PER_S["tcp"])
    if bw is not None:
        if bw.intra_node_gb_per_s is not None:
            intra = bw.intra_node_gb_per_s
            sources[0] = f"intra-node {intra:g} GB/s (profile)"
        if bw.pcie_gb_per_s is not None:
            pcie = bw.pcie_gb_per_s
        if bw.inter_node_gb_per_s is not None:
            inter = bw.inter_node_gb_per_s
    if num_nodes > 1:
        src = "profile" if bw is not None and bw.inter_node_gb_per_s is not None else f"{fabric}, assumed"
        sources.append(f"inter-node {inter:g} GB/s ({src})")
    return Link(float(intra), float(inter), None if pcie is None else float(pcie), num_nodes, tuple(sources))


@dataclass(frozen=True)
class Collective:
    """One collective (or host transfer) of a step: its kind, the bytes S it moves (the whole,
    gathered size), the link and the compute it may overlap."""

    name: str
    kind: str
    """``all_reduce``, ``all_gather``, ``reduce_scatter`` or ``pcie`` (a host transfer of S bytes)."""
    size_bytes: float
    over: str
    """``world`` (the whole world's busbw), ``intra`` (within a node), ``inter`` (across nodes), ``pcie``."""
    ranks: int
    overlap: str
    """``backward``, ``compute`` (forward and backward) or ``none``."""

    def bus_bytes(self) -> float:
        """Bytes each rank puts on its link: ``S x 2(n-1)/n`` (all-reduce), ``S x (n-1)/n``
        (all-gather, reduce-scatter), S (PCIe) (nccl-tests' busbw definitions)."""
        n = self.ranks
        if self.kind == "pcie":
            return self.size_bytes
        if n <= 1:
            return 0.0
        factor = 2 * (n - 1) / n if self.kind == "all_reduce" else (n - 1) / n
        return self.size_bytes * factor


def collectives(layout: Layout, trainable: int, precision: str, num_nodes: int, devices_per_node: int,
                accelerator: str = "gpu") -> tuple[Collective, ...]:
    """The collectives and host transfers of one optimizer step of ``layout`` (module docstring).

    Args:
        layout: strategy, sharding, offload.
        trainable: trainable parameters Ψ (what gradients and optimizer states cover).
        precision: the spec's precision (c = 2 bytes in 16-bit, 4 otherwise).
        num_nodes, devices_per_node: the world.
        accelerator: ``gpu`` or ``cpu`` (CPU ranks never take the offload paths).

    Returns:
        the collectives; empty at world size 1 without offload (the single-device path).
    """
    n = num_nodes * devices_per_node
    sixteen = precision in ("bf16-mixed", "16-mixed", "bf16-true", "transformer-engine")
    c = 2 if sixteen else 4
    w = 2 if precision == "bf16-true" else 4
    psi = float(trainable)
    out: list[Collective] = []
    s = layout.strategy
    if s == "ddp" or (s == "fsdp" and layout.fsdp_sharding_strategy == "NO_SHARD"):
        out.append(Collective("gradient all-reduce", "all_reduce", w * psi, "world", n, "backward"))
    elif s == "fsdp":
        strat = layout.fsdp_sharding_strategy
        group, over = (devices_per_node, "intra") if strat == "HYBRID_SHARD" else (n, "world")
        gathers = 1 if strat == "SHARD_GRAD_OP" else 2
        for i in range(gathers):
            out.append(Collective(f"parameter all-gather ({'forward' if i == 0 else 'backward'})", "all_gather", c * psi, over,
                                  group, "compute"))
        out.append(Collective("gradient reduce-scatter", "reduce_scatter", c * psi, over, group, "backward"))
        if strat == "HYBRID_SHARD" and num_nodes > 1:
            out.append(Collective("gradient all-reduce across nodes", "all_reduce", c * psi / devices_per_node, "inter",
                                  num_nodes, "backward"))
        if layout.offload_params == "cpu" and accelerator == "gpu":
            out.append(Collective("parameter shard host->GPU (forward, backward)", "pcie", 2 * w * psi / group, "pcie", 1, "none"))
            out.append(Collective("gradient shard GPU->host", "pcie", c * psi / group, "pcie", 1, "none"))
    elif s.startswith("deepspeed_stage_"):
        stage = int(s[-1])
        if stage <= 2:
            out.append(Collective("gradient reduce-scatter", "reduce_scatter", c * psi, "world", n, "backward"))
            out.append(Collective("parameter all-gather after the step", "all_gather", c * psi, "world", n, "none"))
        else:
            out.append(Collective("parameter all-gather (forward)", "all_gather", c * psi, "world", n, "compute"))
            out.append(Collective("parameter all-gather (backward)", "all_gather", c * psi, "world", n, "compute"))
            out.append(Collective("gradient reduce-scatter", "reduce_scatter", c * psi, "world", n, "backward"))
        if layout.offload_optimizer != "none" and accelerator == "gpu":
            out.append(Collective("fp32 gradient partition GPU->host", "pcie", 4 * psi / n, "pcie", 1, "none"))
            out.append(Collective("updated parameter partition host->GPU", "pcie", c * psi / n, "pcie", 1, "none"))
        if layout.offload_params != "none" and accelerator == "gpu":
            out.append(Collective("parameter partition host->GPU (forward, backward)", "pcie", 2 * c * psi / n, "pcie", 1, "none"))
    return tuple(c_ for c_ in out if c_.bus_bytes() > 0)


def comm_seconds(coll: Collective, link: Link, slow: float = 1.0) -> float:
    """Seconds of one collective at the link's bandwidth / ``slow``."""
    gbps = {"world": link.collective_gb_per_s, "intra": link.intra_gb_per_s,
            "inter": link.inter_gb_per_s or link.intra_gb_per_s, "pcie": link.pcie_gb_per_s or link.intra_gb_per_s}[coll.over]
    return coll.bus_bytes() * slow / (gbps * GB)


def exposed_comm_s(colls: tuple[Collective, ...], link: Link, compute_s: float, slow: float = 1.0) -> float:
    """Seconds of the collectives ``colls`` (:func:`collectives`) a step waits for beyond the
    compute they overlap (module docstring, "Overlap"): backward-overlapping ones beyond
    ``BACKWARD_SHARE x compute_s``, all of them beyond ``compute_s``, the rest in full; each at the
    link's bandwidth / ``slow``."""
    back = sum(comm_seconds(c, link, slow) for c in colls if c.overlap == "backward")
    comp = sum(comm_seconds(c, link, slow) for c in colls if c.overlap == "compute")
    serial = sum(comm_seconds(c, link, slow) for c in colls if c.overlap == "none")
    exposed_back = max(0.0, back - BACKWARD_SHARE * compute_s)
    exposed_all = max(0.0, back + comp - compute_s)
    return max(exposed_back, exposed_all) + serial


@dataclass(frozen=True)
class Band:
    """A predicted figure and its band: ``value`` from the row's mean, ``low``/``high`` the ends."""

    value: float
    low: float
    high: float

    def to_json(self, ndigits: int = 6) -> dict[str, float]:
        """``{value, low, high}``, rounded to ``ndigits`` significant digits (deterministic output)."""
        return {k: float(f"{v:.{ndigits}g}") for k, v in (("value", self.value), ("low", self.low), ("high", self.high))}


@dataclass(frozen=True)
class RowPrediction:
    """The time model's figures for one layout."""

    layout: Layout
    compute_s: Band
    comm_s: Band
    step_s: Band
    tokens_per_s: Band
    wall_s: Band | None
    device_hours: Band | None
    cost: Band | None
    lookup: Lookup
    collectives: tuple[Collective, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready figures (seconds, tokens/s, hours, the profile's currency)."""
        return {
            "layout": self.layout.label,
            "step_s": self.step_s.to_json(), "compute_s": self.compute_s.to_json(), "comm_s": self.comm_s.to_json(),
            "tokens_per_s": self.tokens_per_s.to_json(),
            "wall_s": None if self.wall_s is None else self.wall_s.to_json(),
            "device_hours": None if self.device_hours is None else self.device_hours.to_json(),
            "cost": None if self.cost is None else self.cost.to_json(),
            "calibration": self.lookup.to_json(),
            "collectives": [{"name": c.name, "kind": c.kind, "bytes": int(c.size_bytes), "ranks": c.ranks, "over": c.over,
                             "overlap": c.overlap} for c in self.collectives],
        }


@dataclass(frozen=True)
class TimePlan:
    """Predictions for the rows of a plan, or why there are none."""

    rows: dict[str, RowPrediction]
    """By layout label; empty when there is no prediction."""
    flops_per_token: int | None
    tokens_per_step: int
    max_steps: int | None
    devices: int
    device_kind: str
    """``GPU`` or ``CPU``: what device-hours count (CPU: ranks x wall time, as summary.json's usage)."""
    price: float | None
    calibration_path: str
    calibration_named: bool
    calibration_found: bool
    link: Link | None
    message: str
    """One line on what the prediction rests on, or why there is none."""

    def to_json(self) -> dict[str, Any]:
        """The plan's ``prediction`` object (docs/predict.md)."""
        return {
            "available": bool(self.rows),
            "message": self.message,
            "flops_per_token": self.flops_per_token,
            "tokens_per_step": self.tokens_per_step,
            "max_steps": self.max_steps,
            "devices": self.devices,
            "device_kind": self.device_kind.lower(),
            "price_per_device_hour": self.price,
            "calibration_file": self.calibration_path,
            "calibration_file_found": self.calibration_found,
            "calibration_file_from_profile": self.calibration_named,
            "bandwidth": None if self.link is None else {
                "intra_node_gb_per_s": self.link.intra_gb_per_s, "inter_node_gb_per_s": self.link.inter_gb_per_s,
                "pcie_gb_per_s": self.link.pcie_gb_per_s, "sources": list(self.link.sources)},
            "rows": [self.rows[k].to_json() for k in self.rows],
        }


@dataclass(frozen=True)
class Workload:
    """What the time model predicts every layout of a plan for: the model, the world, the
    bandwidths and the calibration.

    Fields:
        flops_per_token: model FLOPs per token (:func:`jobgen.planning.flops.shape_flops_per_token`).
        tokens_per_step: tokens of one optimizer step over the whole world.
        trainable, n_params: trainable and total parameters (collectives; size class).
        precision: the spec's precision.
        accelerator: the profile's GPU type, or ``cpu``.
        num_nodes, devices_per_node: the world.
        link: bandwidths (:func:`link_for`).
        cal: the calibration file (:class:`jobgen.planning.calibration.CalibrationFile`) or ``None``.
        max_steps: for the wall time, device-hours and cost (``None``: not given).
        price: the profile's ``gpu_hour_price`` (``None``: no cost).
        cores_per_rank, cpus_per_node: CPU ranks: cores each rank uses, cores of a node.
        seeds: seed rows (default :func:`jobgen.planning.calibration.seed_rows`).
    """

    flops_per_token: int
    tokens_per_step: int
    trainable: int
    n_params: int
    precision: str
    accelerator: str
    num_nodes: int
    devices_per_node: int
    link: Link
    cal: Any
    max_steps: int | None = None
    price: float | None = None
    cores_per_rank: int = 1
    cpus_per_node: int | None = None
    seeds: Any = None

    @property
    def world_size(self) -> int:
        """Ranks over all nodes."""
        return self.num_nodes * self.devices_per_node

    @property
    def gpu(self) -> bool:
        """Whether the ranks are GPUs."""
        return self.accelerator != "cpu"

    def rate(self, dtype: str) -> float | None:
        """FLOP/s the MFU scales: the world's datasheet peak in ``dtype`` (``None``: the GPU type
        has none), or, on CPU ranks, the cores used (the calibration row is FLOP/s per core)."""
        if self.gpu:
            peak = PEAK_FLOPS[self.accelerator].get(dtype)
            return None if peak is None else self.world_size * peak
        if self.cpus_per_node is None:
            return float(self.world_size * self.cores_per_rank)
        return float(self.num_nodes * min(self.cpus_per_node, self.devices_per_node * self.cores_per_rank))


def predict(layout: Layout, work: Workload) -> RowPrediction | None:
    """The prediction for one layout of ``work``; ``None`` when no calibration row applies (a CPU
    without a CPU row, a GPU dtype no row covers)."""
    n = work.world_size
    dtype = planned_compute_dtype(work.precision, work.accelerator if work.gpu else None)
    single = n == 1 and layout.offload_optimizer == "none" and layout.offload_params == "none" and layout.strategy != "deepspeed_stage_3"
    family = family_of(layout.strategy, single_device=single)
    found = lookup(work.cal, work.accelerator, dtype, family, size_class(work.n_params), seeds=work.seeds)
    if found is None:
        return None
    lo_v, hi_v = found.row.band
    flops_step = float(work.flops_per_token) * work.tokens_per_step
    rate = work.rate(dtype)
    if rate is None:
        return None
    compute = Band(flops_step / (rate * found.row.value), flops_step / (rate * hi_v), flops_step / (rate * lo_v))
    colls = collectives(layout, work.trainable, work.precision, work.num_nodes, work.devices_per_node,
                        "gpu" if work.gpu else "cpu")
    comm = Band(exposed_comm_s(colls, work.link, compute.value), exposed_comm_s(colls, work.link, compute.low),
                exposed_comm_s(colls, work.link, compute.high, 2.0))
    step = Band(compute.value + comm.value, compute.low + comm.low, compute.high + comm.high)
    tps = Band(work.tokens_per_step / step.value, work.tokens_per_step / step.high, work.tokens_per_step / step.low)
    wall = hours = cost = None
    if work.max_steps:
        wall = Band(step.value * work.max_steps, step.low * work.max_steps, step.high * work.max_steps)
        hours = Band(*(v * n / 3600 for v in (wall.value, wall.low, wall.high)))
        if work.price is not None and work.gpu:
            cost = Band(*(v * work.price for v in (hours.value, hours.low, hours.high)))
    return RowPrediction(layout, compute, comm, step, tps, wall, hours, cost, found, colls)


def rank(mp: Any, tp: TimePlan, ladder_pick: Layout | None) -> tuple[Layout | None, list[str]]:
    """The recommendation by predicted time: the fastest layout that fits when it is faster than
    the strategy guide's pick beyond both bands (its high end below the pick's low end); else the
    guide's pick stays (the bands overlap: the prediction cannot tell them apart). Returns
    ``(layout, reason lines)``; no predictions: the pick unchanged, no lines."""
    fitting = [r.estimate.layout for r in mp.rows if r.fits and r.estimate.layout.label in tp.rows]
    if not fitting:
        return ladder_pick, []
    order = sorted(fitting, key=lambda lay: (tp.rows[lay.label].step_s.value, lay.label))
    fastest = tp.rows[order[0].label]
    lines = ["predicted step time of the layouts that fit, fastest first: "
             + ", ".join(f"{lay.label} {_fmt_s(tp.rows[lay.label].step_s.value)}" for lay in order[:5])
             + (" ..." if len(order) > 5 else "")]
    if ladder_pick is None or ladder_pick.label not in tp.rows:
        return order[0], lines + [f"{order[0].label}: fastest predicted -> recommended"]
    pick = tp.rows[ladder_pick.label]
    if order[0] != ladder_pick and fastest.step_s.high < pick.step_s.low:
        return order[0], lines + [f"{order[0].label} ({_fmt_s(fastest.step_s.low)}-{_fmt_s(fastest.step_s.high)} per step) is "
                                  f"faster than the guide's pick {ladder_pick.label} ({_fmt_s(pick.step_s.low)}-"
                                  f"{_fmt_s(pick.step_s.high)}) beyond both bands -> recommended"]
    if order[0] != ladder_pick:
        lines.append(f"{order[0].label} is predicted faster, but within the band of the guide's pick {ladder_pick.label}: "
                     "the guide's pick stays")
    return ladder_pick, lines


def _fmt_s(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.1f} h"


def fmt_count(x: float) -> str:
    """``950``, ``15.7k``, ``1.23M``, ``4.5G`` (3 significant digits)."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_duration(seconds: float) -> str:
    """``850 ms``, ``12.3 s``, ``45 min``, ``3.2 h``, ``4.1 d``."""
    if seconds >= 172800:
        return f"{seconds / 86400:.1f} d"
    return _fmt_s(seconds)


def with_ranking(mp: Any, tp: TimePlan) -> Any:
    """``mp`` with its recommendation re-ranked by :func:`rank` (its reasons extended)."""
    chosen, lines = rank(mp, tp, mp.chosen)
    if not lines:
        return mp
    suggestions = mp.suggestions
    if chosen != mp.chosen and chosen is not None:
        use = "use the recommended layout: " + " ".join(f"--set {o}" for o in chosen.overrides)
        suggestions = tuple(use if s.startswith("use the recommended layout:") else s for s in suggestions)
    reasons = mp.reasons
    if chosen != mp.chosen:
        reasons = tuple(r.replace("fits -> recommended", "fits -> the strategy guide's pick") for r in reasons)
    return replace(mp, chosen=chosen, reasons=(*reasons, *lines), suggestions=suggestions)


def plan_time(spec: Any, profile: Any, mp: Any, *, hf_config: str | None = None, spec_source: str = "spec") -> TimePlan:
    """Predict every row of the memory plan ``mp`` of ``spec`` on ``profile``.

    No prediction (``rows`` empty, ``message`` says why): a ``model.class_path`` model (its FLOPs
    are not known from the spec), a CPU profile without a CPU row in the calibration file, a GPU
    type without a peak for the spec's dtype.

    Raises:
        ConfigError: a calibration file that does not validate, or one the profile names that holds
            rows for other accelerators only (:func:`jobgen.planning.calibration.load_for`).
    """
    from jobgen.planning.calibration import cores_per_rank, load_for
    from jobgen.planning.estimate import Shape
    from jobgen.planning.flops import shape_flops_per_token

    n_nodes, per_node = mp.world
    n = n_nodes * per_node
    gpu = mp.accelerator == "gpu"
    accel = profile.gpu_type if gpu else "cpu"
    t = spec.trainer
    max_steps = t.max_steps
    price = getattr(profile, "gpu_hour_price", None) if gpu else None
    cal, path, named = load_for(profile, accel or "cpu")
    base = dict(flops_per_token=None, tokens_per_step=0, max_steps=max_steps, devices=n, device_kind="GPU" if gpu else "CPU",
                price=price, calibration_path=str(path), calibration_named=named, calibration_found=cal is not None, link=None)
    if mp.user is not None or spec.user_code:
        return TimePlan(rows={}, **base, message="no prediction: a model.class_path model's FLOPs per token are not known "
                                                 "from the spec")
    if gpu and accel is None:
        return TimePlan(rows={}, **base, message="no prediction: the profile has no gpu_type (the peak FLOP/s is per GPU type)")
    trainable = mp.n_params
    if mp.hf is not None:
        from jobgen.planning.estimate_hf import hf_shape_of

        shape = hf_shape_of(spec, hf_config, spec_source)
        trainable = int(mp.hf["trainable_params"])
        fpt = shape_flops_per_token(shape, trainable)
        block = shape.block_size
    else:
        shape = Shape.of(spec)
        fpt = shape_flops_per_token(shape)
        block = shape.block_size
    tokens = t.micro_batch_size * block * t.gradient_accumulation_steps * n
    link = link_for(profile, accel, n_nodes)
    base |= {"flops_per_token": fpt, "tokens_per_step": tokens, "link": link}
    rows: dict[str, RowPrediction] = {}
    work = Workload(flops_per_token=fpt, tokens_per_step=tokens, trainable=trainable, n_params=mp.n_params,
                    precision=mp.precision, accelerator=accel, num_nodes=n_nodes, devices_per_node=per_node, link=link, cal=cal,
                    max_steps=max_steps, price=price, cores_per_rank=cores_per_rank(profile, per_node),
                    cpus_per_node=None if gpu else profile.cpus_per_node)
    for r in mp.rows:
        p = predict(r.estimate.layout, work)
        if p is not None:
            rows[r.estimate.layout.label] = p
    from jobgen.errors import printable

    where = f"the profile's calibration file {printable(str(path))}" if named else f"the calibration file {printable(str(path))}"
    how = "jobgen calibrate RUN_DIR on a finished run of this profile"
    missing = f"{where} does not exist yet" if named else "no calibration file"
    if not rows:
        if not gpu:
            msg = ("no prediction: " + (missing if cal is None else f"{where} has no CPU row")
                   + f"; a CPU's FLOP/s are known only from a run on it: {how}")
        else:
            msg = f"no prediction: no calibration row for {accel} {planned_compute_dtype(mp.precision, accel)}"
        return TimePlan(rows={}, **base, message=msg)
    msg = (f"prediction from the seeded table only ({missing}; {how} writes one)" if cal is None
           else f"prediction from {where} and the seeded table")
    return TimePlan(rows=rows, **base, message=msg)
