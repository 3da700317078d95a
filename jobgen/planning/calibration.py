"""Calibration of the time model: the efficiency runs achieved, per (accelerator, compute dtype,
layout family, model size class), seeded from GPU runs this project measured and updated from
finished runs by ``jobgen calibrate``.

A row holds, for GPUs, the MFU of the compute part of a step (model FLOP/s / (GPUs x the
datasheet's dense peak), :mod:`jobgen.planning.flops`), and for CPU ranks the model FLOP/s
achieved per CPU core (no CPU peak is assumed: a CPU's throughput is known only from a run on
it). "The compute part": a multi-rank run's step time less the collectives the time model
charges for its layout (:func:`jobgen.planning.time_model.exposed_comm_s`), so that the
prediction does not count them twice; a one-rank run has none.

The file (YAML or JSON, :class:`CalibrationFile`) lives where the profile's ``calibration`` field
says, else at ``$JOBGEN_CALIBRATION``, else ``<state dir>/calibration.yaml``
(:func:`jobgen.jobdir.submission.state_dir`: ``$XDG_STATE_HOME/jobgen`` or ``~/.local/state/jobgen``).
A row of the file wins over the seed row of the same key (:data:`SEED_MEASUREMENTS`).

Pure: pydantic and PyYAML only, no torch import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobgen.errors import ConfigError, printable
from jobgen.specs.capabilities import CAPABILITIES

Accelerator = Literal["cpu", "V100", "T4", "A10G", "A100", "L4", "L40S", "H100", "H200", "B200"]
"""A GPU type (:data:`jobgen.specs.profile.GpuType`) or ``cpu``."""
Dtype = Literal["bf16", "fp16", "tf32", "fp32"]
Family = Literal["ddp", "fsdp", "deepspeed"]
SizeClass = Literal["<10M", "10M-100M", "100M-1B", "1B-10B", ">=10B"]

SIZE_CLASSES: tuple[tuple[str, int], ...] = (
    ("<10M", 10_000_000), ("10M-100M", 100_000_000), ("100M-1B", 1_000_000_000), ("1B-10B", 10_000_000_000),
    (">=10B", 2**63),
)
"""Size classes by total parameters (upper bounds, exclusive): step efficiency changes with the
matmul sizes, and within a decade of parameters it changes little on the runs measured here."""

FILE_NAME = "calibration.yaml"
ENV_VAR = "JOBGEN_CALIBRATION"
MAX_FILE_BYTES = 1_000_000
"""A calibration file is a few rows; anything larger is refused before parsing."""

ONE_RUN_BAND = 0.2
"""Band of a row resting on one run (or runs that agree exactly): +-20% of its value (assumption;
the run-to-run spread of the CPU rows in docs/evidence.md reached 12-22%)."""


def size_class(n_params: int) -> str:
    """The size class of a model of ``n_params`` parameters (:data:`SIZE_CLASSES`)."""
    return next(name for name, bound in SIZE_CLASSES if n_params < bound)


def family_of(strategy: str, single_device: bool = False) -> str:
    """The layout family of a ``trainer.strategy`` (``single_device``, the path one-rank FSDP and
    ZeRO-1/2 take, trains as ``ddp`` does)."""
    if single_device or strategy in ("ddp", "single_device"):
        return "ddp"
    return "fsdp" if strategy == "fsdp" else "deepspeed"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CalibrationRow(_Model):
    """One key and what runs of it achieved."""

    accelerator: Accelerator = Field(description="GPU type, or ``cpu``.")
    dtype: Dtype = Field(description="Compute dtype of the matmuls (jobgen.planning.flops.planned_compute_dtype).")
    layout: Family = Field(description="Layout family: ``ddp`` (and the single-device path), ``fsdp``, ``deepspeed``.")
    size: SizeClass = Field(description="Model size class by total parameters.")
    mfu: float | None = Field(default=None, gt=0, le=1, description="GPU rows: MFU of the compute part of a step (mean of the runs).")
    flops_per_s_per_core: float | None = Field(default=None, gt=0, lt=1e15,
                                               description="CPU rows: model FLOP/s per CPU core (mean of the runs).")
    low: float | None = Field(default=None, gt=0, description="Smallest value of the runs (same unit).")
    high: float | None = Field(default=None, gt=0, description="Largest value of the runs (same unit).")
    runs: int = Field(ge=1, le=1_000_000, description="How many runs the mean rests on.")
    date: str = Field(default="", max_length=40, pattern=r"^[0-9T:.Z+-]*$", description="Date of the newest run (ISO 8601).")
    device: str = Field(default="", max_length=120, description="The device the runs were on.")
    versions: str = Field(default="", max_length=200, description="Software versions of the newest run.")
    source: str = Field(default="", max_length=200, description="Where the figures come from.")

    @model_validator(mode="after")
    def _one_value(self) -> CalibrationRow:
        if self.accelerator == "cpu":
            if self.flops_per_s_per_core is None or self.mfu is not None:
                raise ValueError("a cpu row gives flops_per_s_per_core (and no mfu: a CPU has no datasheet peak here)")
        elif self.mfu is None or self.flops_per_s_per_core is not None:
            raise ValueError(f"a {self.accelerator} row gives mfu (and no flops_per_s_per_core)")
        for text in (self.device, self.versions, self.source):
            if not text.isprintable():
                raise ValueError("device, versions and source are one line of printable text")
        v = self.value
        if self.low is not None and self.low > v or self.high is not None and self.high < v:
            raise ValueError(f"low <= value <= high does not hold ({self.low}, {v}, {self.high})")
        return self

    @property
    def key(self) -> tuple[str, str, str, str]:
        """``(accelerator, dtype, layout, size)``."""
        return (self.accelerator, self.dtype, self.layout, self.size)

    @property
    def value(self) -> float:
        """:attr:`mfu` (GPU) or :attr:`flops_per_s_per_core` (CPU)."""
        return float(self.mfu if self.mfu is not None else self.flops_per_s_per_core)  # type: ignore[arg-type]

    @property
    def band(self) -> tuple[float, float]:
        """``(low, high)`` of the value: the runs' smallest and largest, or +-:data:`ONE_RUN_BAND`
        when they do not differ."""
        lo, hi = self.low or self.value, self.high or self.value
        if hi - lo < 1e-9 * self.value:
            return self.value * (1 - ONE_RUN_BAND), self.value * (1 + ONE_RUN_BAND)
        return lo, hi

    def describe(self) -> str:
        """One line: the key, the value, how many runs, where from."""
        what = (f"MFU {self.value:.1%}" if self.mfu is not None else f"{self.value / 1e9:,.2f} GFLOP/s per core")
        return (f"{self.accelerator} {self.dtype} {self.layout} {self.size}: {what} "
                f"({self.runs} run{'s' if self.runs != 1 else ''}{', ' + self.date if self.date else ''})")


class CalibrationFile(_Model):
    """A calibration file: ``version: 1`` and its rows (one per key)."""

    jobgen_schema_kind: ClassVar[str] = "calibration"
    version: Literal[1] = Field(default=1, description="Schema version.")
    rows: tuple[CalibrationRow, ...] = Field(default=(), max_length=10_000, description="One row per key.")

    @model_validator(mode="after")
    def _unique(self) -> CalibrationFile:
        seen: set[tuple[str, ...]] = set()
        for i, row in enumerate(self.rows):
            if row.key in seen:
                raise ValueError(f"rows[{i}]: a second row for {' '.join(row.key)} (one row per key)")
            seen.add(row.key)
        return self


@dataclass(frozen=True)
class SeedMeasurement:
    """One GPU run this project measured (docs/evidence.md holds the same rows; a test checks
    that they agree)."""

    row: str
    """The GPU suite's row name (benchmarks/gpu_suite.py)."""
    accelerator: str
    dtype: str
    layout: str
    n_params: int
    tokens_per_s: int
    mfu: float
    date: str
    versions: str


_H200_1127 = "torch 2.11.0+cu130, Lightning 2.6.6, DeepSpeed 0.19.8"
_H200_1126 = "torch 2.11.0+cu130, Lightning 2.6.6"
_H100_1123 = "torch 2.11.0+cu130, Lightning 2.6.6, DeepSpeed 0.19.8 (before the speed levers)"
_LLAMA_1126 = "torch 2.11.0+cu130, Lightning 2.6.6, transformers 5.17.0, peft 0.21.0, bitsandbytes 0.50.2"

#: One-GPU runs of the GPU suite (benchmarks/gpu_suite.py), docs/evidence.md "GPU evidence":
#: tokens/s (steady state) and MFU as the run's summary.json gave them; one GPU, so no collective
#: time is in them. The H100 fsdp row's MFU is its tokens/s x the gpt350m's 2,117,431,296 FLOPs per
#: token / the H100's bf16 dense peak (the page gives no MFU for it). The Llama-7B QLoRA fsdp row's MFU
#: is taken from its tokens/s against the ddp row's (same model, chip and day: 5,991 / 6,540 x 20.2%),
#: not from its summary.json's 10.7%, whose FLOPs count under FSDP the page calls suspect. Left out:
#: the traced rows.
SEED_MEASUREMENTS: tuple[SeedMeasurement, ...] = (
    SeedMeasurement("gpt350m-bf16", "H200", "bf16", "ddp", 303_622_144, 151_105, 0.323, "2026-11-27", _H200_1127),
    SeedMeasurement("gpt350m-bf16-compile", "H200", "bf16", "ddp", 303_622_144, 173_000, 0.370, "2026-11-27", _H200_1127),
    SeedMeasurement("gpt350m-ds2-bf16 (single-device path)", "H200", "bf16", "ddp", 303_622_144, 154_071, 0.330,
                    "2026-11-27", _H200_1127),
    SeedMeasurement("gpt350m-bf16 (30 steps)", "H200", "bf16", "ddp", 303_622_144, 130_068, 0.278, "2026-11-26", _H200_1126),
    SeedMeasurement("gpt124m-bf16", "H200", "bf16", "ddp", 86_039_040, 380_043, 0.240, "2026-11-26", _H200_1126),
    SeedMeasurement("gpt124m-bf16-compile", "H200", "bf16", "ddp", 86_039_040, 489_375, 0.309, "2026-11-26", _H200_1126),
    SeedMeasurement("gpt124m-fp16 (30 steps)", "H200", "fp16", "ddp", 86_039_040, 402_130, 0.254, "2026-11-26", _H200_1126),
    SeedMeasurement("llama7b-qlora-ddp", "H200", "bf16", "ddp", 6_738_415_616, 6_540, 0.202, "2026-11-26", _LLAMA_1126),
    SeedMeasurement("llama7b-qlora-fsdp", "H200", "bf16", "fsdp", 6_738_415_616, 5_991, round(0.202 * 5_991 / 6_540, 4),
                    "2026-11-26", _LLAMA_1126),
    SeedMeasurement("gpt350m-bf16", "H100", "bf16", "ddp", 303_622_144, 107_262, 0.23, "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-bf16-compile", "H100", "bf16", "ddp", 303_622_144, 128_093, 0.275, "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-bf16-compile (micro batch 16)", "H100", "bf16", "ddp", 303_622_144, 167_790, 0.359,
                    "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-fsdp-bf16", "H100", "bf16", "fsdp", 303_622_144, 53_078, 0.1136, "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-ds2-bf16", "H100", "bf16", "deepspeed", 303_622_144, 52_662, 0.113, "2026-11-23", _H100_1123),
)

SEED_SOURCE = "jobgen's GPU suite (docs/evidence.md)"


def seed_rows(leave_out: SeedMeasurement | None = None) -> tuple[CalibrationRow, ...]:
    """:data:`SEED_MEASUREMENTS` grouped by key: mean MFU, smallest and largest, count, newest date.
    ``leave_out``: a measurement left out (for a leave-one-out check, :func:`leave_one_out`)."""
    groups: dict[tuple[str, ...], list[SeedMeasurement]] = {}
    for m in SEED_MEASUREMENTS:
        if m is leave_out:
            continue
        groups.setdefault((m.accelerator, m.dtype, m.layout, size_class(m.n_params)), []).append(m)
    out = []
    for (acc, dtype, layout, size), ms in groups.items():
        newest = max(ms, key=lambda m: m.date)
        values = [m.mfu for m in ms]
        out.append(CalibrationRow(accelerator=acc, dtype=dtype, layout=layout, size=size, mfu=sum(values) / len(values),  # type: ignore[arg-type]
                                  low=min(values), high=max(values), runs=len(ms), date=newest.date,
                                  device=f"NVIDIA {acc}", versions=newest.versions, source=SEED_SOURCE))
    return tuple(out)


def leave_one_out() -> list[dict[str, Any]]:
    """Each seeded run predicted from the others: the MFU of the row :func:`lookup` finds with that
    run left out, against the run's own. One GPU per run, so the predicted tokens/s over the
    measured is the MFU ratio (same FLOPs per token, same peak). ``predicted`` None: no row left."""
    out = []
    for m in SEED_MEASUREMENTS:
        hit = lookup(None, m.accelerator, m.dtype, m.layout, size_class(m.n_params), seeds=seed_rows(leave_out=m))
        mfu = hit.row.value if hit else None
        out.append({"row": m.row, "accelerator": m.accelerator, "layout": m.layout, "measured_tokens_per_s": m.tokens_per_s,
                    "predicted_tokens_per_s": None if mfu is None else round(m.tokens_per_s * mfu / m.mfu),
                    "predicted_over_measured": None if mfu is None else round(mfu / m.mfu, 2),
                    "from": "" if hit is None else hit.row.describe() + (f" ({hit.note})" if hit.note else "")})
    return out


def default_path() -> Path:
    """``$JOBGEN_CALIBRATION``, else ``<state dir>/calibration.yaml``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    from jobgen.jobdir.submission import state_dir

    return state_dir() / FILE_NAME


def calibration_path(profile: Any) -> tuple[Path, bool]:
    """``(path, named)``: the profile's ``calibration`` file (``named`` True), else
    :func:`default_path` (``named`` False)."""
    named = getattr(profile, "calibration", None)
    if named:
        return Path(named).expanduser(), True
    return default_path(), False


def load_file(path: Path) -> CalibrationFile | None:
    """Read and validate a calibration file; ``None`` when it does not exist.

    Raises:
        ConfigError: not a file, over :data:`MAX_FILE_BYTES`, not UTF-8, not YAML/JSON, or a
            field that does not validate (NaN, negative, an unknown GPU type, a 300-byte device
            name, ...), naming the file and the field.
    """
    where = printable(str(path))
    if not path.exists():
        return None
    if not path.is_file():
        raise ConfigError("the calibration file is not a regular file", location=where,
                          hint="point the profile's calibration field (or $JOBGEN_CALIBRATION) at a file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the calibration file: {exc.strerror}", location=where) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"the calibration file is {len(raw):,} bytes (at most {MAX_FILE_BYTES:,})", location=where,
                          hint="a calibration file holds one row per key; rebuild it with jobgen calibrate")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the calibration file is not UTF-8 (byte {exc.start})", location=where,
                          hint="write it with jobgen calibrate, or re-save it as UTF-8") from None
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"the calibration file is not valid YAML/JSON{at}", location=where) from None
    if not isinstance(doc, dict):
        raise ConfigError("the calibration file is not a mapping with version and rows", location=where,
                          hint="see docs/predict.md for the schema")
    from jobgen.specs.load import validate

    try:
        return validate(CalibrationFile, doc, where)
    except ConfigError as exc:
        raise ConfigError(exc.message, location=where, hint="see docs/predict.md, \"The calibration file\", for every field") from None


def load_for(profile: Any, accelerator: str) -> tuple[CalibrationFile | None, Path, bool]:
    """The calibration file of ``profile``: ``(file or None, path, named by the profile)``.

    Raises:
        ConfigError: as :func:`load_file`; and a file the profile names holding rows, none of
            them for ``accelerator`` (a file from another GPU type: the profile's cluster has no
            rows in it), naming the file and the first row's accelerator.
    """
    path, named = calibration_path(profile)
    cal = load_file(path)
    if cal is not None and named and cal.rows and not any(r.accelerator == accelerator for r in cal.rows):
        raise ConfigError(
            f"the profile's calibration file holds rows for {sorted({r.accelerator for r in cal.rows})} only, "
            f"none for this profile's {accelerator}",
            location=f"{printable(str(path))}: rows[0].accelerator",
            hint=f"name a file calibrated on {accelerator} in the profile's calibration field, or run "
                 "jobgen calibrate on a finished run of this profile",
        )
    return cal, path, named


def dumps(cal: CalibrationFile) -> str:
    """The file's text: YAML, rows sorted by key (deterministic)."""
    rows = [r.model_dump(exclude_none=True) for r in sorted(cal.rows, key=lambda r: r.key)]
    return yaml.safe_dump({"version": cal.version, "rows": rows}, sort_keys=True, allow_unicode=False)


@dataclass(frozen=True)
class Lookup:
    """The row a prediction uses and how it was found."""

    row: CalibrationRow
    origin: str
    """``file`` (the calibration file) or ``seed`` (:data:`SEED_MEASUREMENTS`)."""
    exact: bool
    """The row's key is the one asked for; else the nearest (see :func:`lookup`)."""
    note: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: key, value, band, runs, origin, exact, note."""
        lo, hi = self.row.band
        return {"accelerator": self.row.accelerator, "dtype": self.row.dtype, "layout": self.row.layout,
                "size": self.row.size, "value": self.row.value, "unit": "mfu" if self.row.mfu is not None else "flops_per_s_per_core",
                "low": lo, "high": hi, "runs": self.row.runs, "date": self.row.date, "origin": self.origin,
                "exact": self.exact, "note": self.note}


def lookup(cal: CalibrationFile | None, accelerator: str, dtype: str, layout: str, size: str, *,
           seeds: tuple[CalibrationRow, ...] | None = None) -> Lookup | None:
    """The calibration row for a key, nearest first:

    1. the key itself: the file's row, else the seed row;
    2. same accelerator, dtype and layout family, the nearest size class;
    3. same accelerator and dtype, another layout family (``ddp`` first), nearest size;
    4. GPUs only: bf16 for fp16 and the reverse (the same datasheet peak), same accelerator and family;
    5. GPUs only: the same dtype, family and size measured on another GPU type (MFU is a fraction
       of each GPU's own peak; how well it carries over between types is an assumption, said so).

    CPU rows come from the file only (no CPU is seeded). ``None`` when nothing matches.
    """
    seeds = seed_rows() if seeds is None else seeds
    pools = [("file", cal.rows if cal is not None else ()), ("seed", seeds)]
    order = [name for name, _ in SIZE_CLASSES]
    want = order.index(size)

    def nearest(rows: list[tuple[str, CalibrationRow]]) -> tuple[str, CalibrationRow] | None:
        if not rows:
            return None
        return min(rows, key=lambda item: (abs(order.index(item[1].size) - want), item[0] != "file",
                                           order.index(item[1].size)))

    flat = [(origin, r) for origin, rows in pools for r in rows]
    for origin, r in flat:
        if r.key == (accelerator, dtype, layout, size):
            return Lookup(r, origin, True, "")
    same = [(o, r) for o, r in flat if r.accelerator == accelerator and r.dtype == dtype and r.layout == layout]
    hit = nearest(same)
    if hit:
        smaller = order.index(hit[1].size) > want
        return Lookup(hit[1], hit[0], False, f"no {size} row: the nearest size class"
                      + ("; a smaller model than any measured: its host time per step, not modeled, can bound it, so "
                         "tokens/s is an upper limit" if smaller else ""))
    for fam in ("ddp", "fsdp", "deepspeed"):
        hit = nearest([(o, r) for o, r in flat if r.accelerator == accelerator and r.dtype == dtype and r.layout == fam])
        if hit:
            return Lookup(hit[1], hit[0], False, f"no {layout} row: the {fam} row (layout family differs)")
    if accelerator == "cpu":
        return None
    twin = {"bf16": "fp16", "fp16": "bf16"}.get(dtype)  # the same peak on every GPU type that has both
    hit = nearest([(o, r) for o, r in flat if r.accelerator == accelerator and r.dtype == twin and r.layout == layout])
    if hit:
        return Lookup(hit[1], hit[0], False, f"no {dtype} row: the {twin} row (same peak)")
    others = [(o, r) for o, r in flat if r.accelerator != "cpu" and r.dtype == dtype]
    hit = nearest([(o, r) for o, r in others if r.layout == layout]) or nearest(others)
    if hit:
        return Lookup(hit[1], hit[0], False, f"no {accelerator} row: measured on {hit[1].accelerator} "
                                             "(assumes the same fraction of the datasheet peak)")
    return None


def cores_per_rank(profile: Any, ranks_per_node: int) -> int:
    """CPU cores one rank uses: ``local.omp_threads_per_process`` when a local profile sets it,
    else ``cpus_per_node`` / ranks per node, at least 1 (every backend's ``OMP_NUM_THREADS``
    default, jobgen.planning.rules)."""
    if profile is None:
        return 1
    caps = CAPABILITIES.get(getattr(profile, "scheduler", ""))
    own = getattr(profile, caps.settings_attr, None) if caps is not None else None  # only the scheduler's own section applies
    threads = getattr(own, "omp_threads_per_process", None)
    return int(threads or max(1, profile.cpus_per_node // max(1, ranks_per_node)))
