"""What the entrypoint measures besides tokens/s: model FLOPs per token, MFU, peak memory, curves.

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022, section 4.1 and appendix B) is the
model FLOP/s a run achieves divided by the hardware's peak FLOP/s. "Model FLOPs" are the FLOPs
the model needs per token (forward + backward), independent of how it is run: activation
recomputation is not counted (that would be hardware FLOPs utilisation, HFU).

Peak FLOP/s exist only for GPUs (:data:`jobgen.planning.flops.PEAK_FLOPS`, keyed by the profile's ``gpu_type``); on
CPU MFU is reported as ``None`` ("n/a"): a CPU's peak depends on its vector units, clock and
core count, and no figure is invented here.

Nothing here imports matplotlib unless :func:`plot_curves` runs.
"""

from __future__ import annotations

import csv
import math
import re
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from jobgen.planning.flops import _PRECISION_DTYPE, PEAK_FLOPS, transformer_flops_per_token
from jobgen.specs.training import TrainingSpec


def compute_dtype(precision: str, float32_matmul_precision: str | None = None) -> str:
    """The dtype matrix multiplies run in for a Lightning precision: ``bf16``, ``fp16``, ``tf32``
    or ``fp32``.

    ``32-true`` runs fp32 matmuls on tf32 tensor cores when torch's float32 matmul precision is
    ``"high"`` or ``"medium"`` (``torch.set_float32_matmul_precision``), fp32 when ``"highest"``
    (torch's default); ``None`` reads the current setting.
    """
    if precision in _PRECISION_DTYPE:
        return _PRECISION_DTYPE[precision]
    if float32_matmul_precision is None:
        float32_matmul_precision = torch.get_float32_matmul_precision()
    return "fp32" if float32_matmul_precision == "highest" else "tf32"


def peak_flops_per_s(gpu_type: str | None, precision: str, float32_matmul_precision: str | None = None) -> float | None:
    """Dense peak FLOP/s of ONE GPU of ``gpu_type`` at ``precision`` (see :data:`PEAK_FLOPS`).

    Returns:
        FLOP/s, or ``None`` for an unknown GPU type, ``None`` (CPU), or a dtype the GPU has no
        units for (bf16 on V100/T4).
    """
    table = PEAK_FLOPS.get(gpu_type or "")
    if table is None:
        return None
    return table.get(compute_dtype(precision, float32_matmul_precision))


def gpt_matmul_params(spec: TrainingSpec) -> int:
    """N for the built-in GPT: all parameters except the position embedding.

    The token embedding stays in N although its lookup costs nothing: it is tied to the output
    projection, a ``d_model x 256`` matmul per token (nanoGPT's ``estimate_mfu`` counts the same
    way). The position embedding is a lookup only. Biases and LayerNorms are counted (a rounding
    error of the same order as the elementwise work they stand for).
    """
    m = spec.model
    return m.n_params - m.block_size * m.d_model


def gpt_flops_per_token(spec: TrainingSpec) -> int:
    """Training FLOPs per token of the built-in GPT of ``spec.model`` (every parameter trains):
    :func:`transformer_flops_per_token` with N = :func:`gpt_matmul_params`."""
    m = spec.model
    return transformer_flops_per_token(m.n_layer, m.d_model, m.block_size, gpt_matmul_params(spec))


def logical_numel(p: torch.Tensor) -> int:
    """Elements of ``p`` in the model's logical shape, whatever its storage: the count FLOPs go by.

    A bitsandbytes 4-bit weight (``Params4bit``, QLoRA) is stored packed, two 4-bit values per
    byte, in its ``quant_storage`` dtype: uint8 under ddp and ZeRO-1/2 (``numel()`` = half the
    weight's elements), bf16 under fsdp and ZeRO-3 (:func:`jobgen.train.hf.qlora_load`; a
    quarter). Its logical shape is ``p.quant_state.shape`` (bitsandbytes' ``QuantState``, set
    when the weight is quantised), e.g. ``(out_features, in_features)``; without a quant state
    the packing gives it: ``numel() x 2 x element_size()`` (peft's
    ``get_nb_trainable_parameters`` counts the same way). Any other tensor: ``numel()``.

    Returns:
        the element count of the unquantised weight (the same in every layout).
    """
    if type(p).__name__ == "Params4bit":
        shape = getattr(getattr(p, "quant_state", None), "shape", None)
        if shape is not None:
            return math.prod(int(n) for n in shape)
        return p.numel() * 2 * p.element_size()
    return p.numel()


def hf_flops_per_token(model: torch.nn.Module, block_size: int) -> int | None:
    """Training FLOPs per token of a Hugging Face causal LM (optionally a peft LoRA model).

    N counts every parameter except embedding tables (lookups), but keeps an input embedding that
    is tied to the output projection (a matmul); trainable and frozen parameters are counted
    apart (:func:`transformer_flops_per_token`: LoRA's frozen base costs ~4 FLOPs per parameter
    per token, its adapters 6). Each parameter counts by its logical shape
    (:func:`logical_numel`: a QLoRA 4-bit weight as the unquantised weight it stands for), so the
    figure is the same in every layout of one model (uint8 or bf16 quant storage). ``n_layer``
    and ``d_model`` are the config's ``num_hidden_layers`` and ``hidden_size``. Call it before
    the strategy shards the model (the entrypoint does): it counts the parameters it is given.

    Returns:
        FLOPs per token, or ``None`` when the config lacks those sizes.
    """
    config = getattr(model, "config", None)
    n_layer = getattr(config, "num_hidden_layers", None)
    d_model = getattr(config, "hidden_size", None)
    if not isinstance(n_layer, int) or not isinstance(d_model, int):
        return None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = {id(output.weight)} if output is not None else set()
    lookups = {
        id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding) and id(m.weight) not in tied
    }
    trainable = frozen = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen or id(p) in lookups:
            continue
        seen.add(id(p))
        if p.requires_grad:
            trainable += logical_numel(p)
        else:
            frozen += logical_numel(p)
    return transformer_flops_per_token(n_layer, d_model, block_size, trainable, frozen)


def flops_per_token(spec: TrainingSpec, module: torch.nn.Module) -> int | None:
    """Training FLOPs per token for ``spec.model``: :func:`gpt_flops_per_token` for the built-in
    GPT, :func:`hf_flops_per_token` (of ``module.model``) for a Hugging Face model; ``None`` for a
    ``class_path`` model (its FLOPs are not known from the spec: no MFU is invented)."""
    if spec.user_code:
        return None
    if not spec.model.is_hf:
        return gpt_flops_per_token(spec)
    return hf_flops_per_token(module.model, spec.model.block_size)


def mfu(tokens_per_s: float | None, flops_per_token: int | None, peak_flops_per_s: float | None) -> float | None:
    """Model FLOPs utilisation: ``tokens_per_s x flops_per_token / peak_flops_per_s`` (a fraction).

    Args:
        tokens_per_s: tokens/s over all ranks.
        flops_per_token: training FLOPs per token.
        peak_flops_per_s: peak FLOP/s of all ranks together (one GPU's peak x world size);
            ``None`` on CPU.

    Returns:
        the fraction (0.4 = 40%), or ``None`` when any input is unknown.
    """
    if tokens_per_s is None or flops_per_token is None or not peak_flops_per_s:
        return None
    return tokens_per_s * flops_per_token / peak_flops_per_s


MEMORY_KINDS = {
    "cuda_max_memory_allocated": "torch.cuda.max_memory_allocated() of the rank's GPU (tensors only)",
    "cpu_max_rss": "the process's resident set size high-water mark (getrusage ru_maxrss)",
}
"""What ``peak_memory_bytes`` measures, by ``peak_memory_kind``."""


def peak_memory(device: torch.device) -> tuple[int, str]:
    """This process's peak memory in bytes and its kind (a key of :data:`MEMORY_KINDS`).

    GPU: ``torch.cuda.max_memory_allocated(device)`` (PyTorch tensors; the caching allocator's
    reserve and the CUDA context are not included). CPU: the process's RSS high-water mark
    (``ru_maxrss``; everything the process touched, interpreter and libraries included).
    """
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "cpu_max_rss"  # Linux: KiB


def _read_metrics(logs_dir: Path) -> dict[str, dict[int, float]]:
    """Metric -> {step: value} from every ``version_<n>/metrics.csv``, later versions winning
    (a resumed run repeats the steps after its checkpoint)."""
    def version(path: Path) -> int:
        match = re.fullmatch(r"version_([0-9]+)", path.parent.name)
        return int(match.group(1)) if match else -1

    series: dict[str, dict[int, float]] = {}
    for path in sorted(logs_dir.glob("version_*/metrics.csv"), key=version):
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                try:
                    step = int(float(row.get("step") or ""))
                except ValueError:
                    continue
                for key, value in row.items():
                    if key in ("step", "epoch") or value in ("", None):
                        continue
                    try:
                        series.setdefault(key, {})[step] = float(value)
                    except ValueError:
                        pass
    return series


def plot_curves(run_dir: Path, out: Path | None = None, loss_unit: str | None = "token") -> Path:
    """Write ``<run_dir>/curves.png``: train loss (line) and val loss (points) over optimizer
    steps, and tokens/s over steps, from the CSV metrics of every version in ``<run_dir>/logs``.

    Each row is drawn at the optimizer steps taken when it was logged: metrics.csv's ``step``,
    which the entrypoint's CSV logger writes as the optimizer step (the row of the 50th step says
    50; :mod:`jobgen.train.metrics_csv`), as the trackers do. A series
    of one point (a short smoke run logs one row) is drawn as a marker. ``loss_unit``: the loss
    axis' unit, ``nats/<loss_unit>`` (``byte`` for text data, as the summary line says; ``None``: a
    module's own loss, no unit).

    matplotlib (Agg canvas, no pyplot state) is imported here only. The figure holds no
    timestamps or paths, so the same metrics give the same picture.

    Returns:
        the PNG path.

    Raises:
        FileNotFoundError: no ``metrics.csv`` under ``<run_dir>/logs``.
        ImportError: matplotlib is not installed.
    """
    logs = Path(run_dir) / "logs"
    if not any(logs.glob("version_*/metrics.csv")):
        raise FileNotFoundError(f"no metrics.csv under {logs}")
    series = _read_metrics(logs)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6), dpi=100)
    FigureCanvasAgg(fig)
    loss_ax, rate_ax = fig.subplots(2, 1, sharex=True)

    def plot(ax: Any, key: str, **style: Any) -> None:
        points = sorted(series.get(key, {}).items())
        if len(points) == 1 and "marker" not in style:
            style = {**style, "marker": "o"}  # a line through one point shows nothing
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], label=key, **style)

    plot(loss_ax, "train_loss", linewidth=1)
    plot(loss_ax, "val_loss", marker="o", linestyle="none")
    loss_ax.set_ylabel("loss" if loss_unit is None else f"loss (nats/{loss_unit})")
    loss_ax.grid(alpha=0.3)
    if loss_ax.lines:
        loss_ax.legend()
    plot(rate_ax, "tokens_per_s", linewidth=1, color="tab:green")
    rate_ax.set_ylabel("tokens/s (all ranks)")
    rate_ax.set_xlabel("optimizer step")
    rate_ax.grid(alpha=0.3)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    out = out or Path(run_dir) / "curves.png"
    tmp = out.with_name(f".{out.name}.tmp")
    fig.savefig(tmp, format="png", metadata={"Software": None})
    tmp.replace(out)
    return out
