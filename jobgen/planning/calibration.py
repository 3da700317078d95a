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

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobgen.errors import ConfigError, printable

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
#: token / the H100's bf16 dense peak (the page gives no MFU for it). Left out: the Llama-7B QLoRA
#: fsdp row (the page calls its FLOPs count under FSDP suspect) and the traced rows.
SEED_MEASUREMENTS: tuple[SeedMeasurement, ...] = (
    SeedMeasurement("gpt350m-bf16", "H200", "bf16", "ddp", 354_871_296, 151_105, 0.323, "2026-11-27", _H200_1127),
    SeedMeasurement("gpt350m-bf16-compile", "H200", "bf16", "ddp", 354_871_296, 173_000, 0.370, "2026-11-27", _H200_1127),
    SeedMeasurement("gpt350m-ds2-bf16 (single-device path)", "H200", "bf16", "ddp", 354_871_296, 154_071, 0.330,
                    "2026-11-27", _H200_1127),
    SeedMeasurement("gpt350m-bf16 (30 steps)", "H200", "bf16", "ddp", 354_871_296, 130_068, 0.278, "2026-11-26", _H200_1126),
    SeedMeasurement("gpt124m-bf16", "H200", "bf16", "ddp", 124_475_904, 380_043, 0.240, "2026-11-26", _H200_1126),
    SeedMeasurement("gpt124m-bf16-compile", "H200", "bf16", "ddp", 124_475_904, 489_375, 0.309, "2026-11-26", _H200_1126),
    SeedMeasurement("gpt124m-fp16 (30 steps)", "H200", "fp16", "ddp", 124_475_904, 402_130, 0.254, "2026-11-26", _H200_1126),
    SeedMeasurement("llama7b-qlora-ddp", "H200", "bf16", "ddp", 6_738_415_616, 6_540, 0.202, "2026-11-26", _LLAMA_1126),
    SeedMeasurement("gpt350m-bf16", "H100", "bf16", "ddp", 354_871_296, 107_262, 0.23, "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-bf16-compile", "H100", "bf16", "ddp", 354_871_296, 128_093, 0.275, "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-bf16-compile (micro batch 16)", "H100", "bf16", "ddp", 354_871_296, 167_790, 0.359,
                    "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-fsdp-bf16", "H100", "bf16", "fsdp", 354_871_296, 53_078, 0.1136, "2026-11-23", _H100_1123),
    SeedMeasurement("gpt350m-ds2-bf16", "H100", "bf16", "deepspeed", 354_871_296, 52_662, 0.113, "2026-11-23", _H100_1123),
)

SEED_SOURCE = "jobgen's GPU suite (docs/evidence.md)"


def seed_rows(leave_out: str | None = None) -> tuple[CalibrationRow, ...]:
    """:data:`SEED_MEASUREMENTS` grouped by key: mean MFU, smallest and largest, count, newest date.
    ``leave_out``: a measurement's ``row`` name left out (for a leave-one-out check)."""
    groups: dict[tuple[str, ...], list[SeedMeasurement]] = {}
    for m in SEED_MEASUREMENTS:
        if m.row == leave_out:
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
    4. GPUs only: the same dtype, family and size measured on another GPU type (MFU is a fraction
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
        return Lookup(hit[1], hit[0], False, f"no {size} row: the nearest size class")
    for fam in ("ddp", "fsdp", "deepspeed"):
        hit = nearest([(o, r) for o, r in flat if r.accelerator == accelerator and r.dtype == dtype and r.layout == fam])
        if hit:
            return Lookup(hit[1], hit[0], False, f"no {layout} row: the {fam} row (layout family differs)")
    if accelerator == "cpu":
        return None
    others = [(o, r) for o, r in flat if r.accelerator != "cpu" and r.dtype == dtype]
    hit = nearest([(o, r) for o, r in others if r.layout == layout]) or nearest(others)
    if hit:
        return Lookup(hit[1], hit[0], False, f"no {accelerator} row: measured on {hit[1].accelerator} "
                                             "(assumes the same fraction of the datasheet peak)")
    return None


# --------------------------------------------------------------------------- jobgen calibrate


@dataclass(frozen=True)
class RunMeasurement:
    """What one finished run measured, reduced to a calibration key and value."""

    run_dir: str
    key: tuple[str, str, str, str]
    value: float
    tokens_per_s: float
    flops_per_token: int
    devices: int
    cores_per_rank: int | None
    comm_s: float
    step_s: float
    date: str
    versions: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"run_dir": self.run_dir, "accelerator": self.key[0], "dtype": self.key[1], "layout": self.key[2],
                "size": self.key[3], "value": self.value, "tokens_per_s": self.tokens_per_s,
                "flops_per_token": self.flops_per_token, "devices": self.devices, "cores_per_rank": self.cores_per_rank,
                "step_s": self.step_s, "comm_s": self.comm_s, "date": self.date, "versions": self.versions}


def _num(doc: dict[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (positive and value <= 0):
        raise ConfigError(f"{key} is {printable(repr(value))[:60]}, not a positive finite number", location=f"{where}: {key}",
                          hint="calibrate from a run that finished training (its summary.json has tokens/s and FLOPs per token)")
    return float(value)


def _read_json(path: Path) -> dict[str, Any]:
    where = printable(str(path))
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("no such file: the run has not finished (summary.json is written at the end of training)",
                          location=where, hint="calibrate from a finished run's directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror}", location=where) from None
    try:
        doc = json.loads(raw[:MAX_FILE_BYTES * 10].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError("not a JSON document in UTF-8", location=where) from None
    if not isinstance(doc, dict):
        raise ConfigError("not a JSON object", location=where)
    return doc


def measure_run(run_dir: Path, profile: Any | None) -> RunMeasurement:
    """Reduce a finished run directory (``summary.json``, ``spec.json``) to a calibration
    measurement: the key (accelerator from the launch, compute dtype of its precision, layout
    family of what trained, size class of its parameters) and the value, from the steady-state
    tokens/s (``tokens_per_s_steady``, else ``tokens_per_s_mean``) and ``flops_per_token``.

    GPU runs: MFU of the compute part = flops/s / (GPUs x peak) with the step time less the
    collectives the time model charges for the layout (:func:`jobgen.planning.time_model.exposed_comm_s`).
    CPU runs: model FLOP/s of that compute part per core, the cores of a rank being the profile's
    ``local.omp_threads_per_process`` or ``cpus_per_node`` / ranks per node (each backend's
    ``OMP_NUM_THREADS``); ``profile`` None: the run's profile is loaded by the name it records.

    Raises:
        ConfigError: no summary.json / spec.json, a field missing or not a positive finite
            number, an unknown GPU type, a profile that cannot be loaded.
    """
    from jobgen.planning.estimate import Layout
    from jobgen.planning.flops import PEAK_FLOPS, planned_compute_dtype
    from jobgen.planning.time_model import exposed_comm_s, link_for

    summary_path, spec_path = run_dir / "summary.json", run_dir / "spec.json"
    summary, spec = _read_json(summary_path), _read_json(spec_path)
    where = printable(str(summary_path))
    launch = spec.get("launch") if isinstance(spec.get("launch"), dict) else {}
    accel = launch.get("gpu_type") if launch.get("accelerator") == "gpu" else "cpu"
    if accel not in PEAK_FLOPS and accel != "cpu":
        raise ConfigError(f"launch.gpu_type is {printable(repr(accel))[:60]}, not a known GPU type",
                          location=f"{printable(str(spec_path))}: launch.gpu_type")
    tokens_per_s = summary.get("tokens_per_s_steady") or summary.get("tokens_per_s_mean")
    tokens_per_s = _num({"tokens_per_s_steady": tokens_per_s}, "tokens_per_s_steady", where)
    fpt = int(_num(summary, "flops_per_token", where))
    world = int(_num(summary, "world_size", where))
    n_params = int(_num(summary, "n_params", where))
    trainable = summary.get("trainable_params") if isinstance(summary.get("trainable_params"), int) else n_params
    tokens_per_step = summary.get("tokens_per_step")
    precision = summary.get("precision")
    strategy = summary.get("layout") or summary.get("strategy")
    if not isinstance(precision, str) or not isinstance(strategy, str) or len(precision) > 40 or len(strategy) > 40:
        raise ConfigError("precision or layout is missing or not a short string", location=f"{where}: precision")
    dtype = planned_compute_dtype(precision, None if accel == "cpu" else accel)
    if accel != "cpu" and summary.get("levers", {}).get("matmul_precision") is None and precision == "32-true":
        dtype = "fp32"
    family = family_of(strategy)
    num_nodes = int(launch.get("num_nodes") or 1)
    per_node = max(1, world // max(1, num_nodes))
    # the collectives of this run's layout at this world (offload is not told apart here: the
    # spec's offload fields are read when spec.json has them)
    t = (spec.get("spec") or {}).get("trainer") or {} if isinstance(spec.get("spec"), dict) else {}
    layout = Layout(strategy if strategy != "single_device" else "ddp",
                    t.get("fsdp_sharding_strategy", "FULL_SHARD") if strategy == "fsdp" else "FULL_SHARD",
                    t.get("offload_optimizer", "none") if strategy.startswith("deepspeed") else "none",
                    t.get("offload_params", "none") if strategy in ("fsdp", "deepspeed_stage_3") else "none")
    if profile is None and world > 1:
        from jobgen.specs.load import load_profile

        name = summary.get("profile")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ConfigError("the run records no profile name", location=f"{where}: profile",
                              hint="give the run's profile: jobgen calibrate RUN_DIR --profile P")
        profile = load_profile(name, None)
    step_tokens = tokens_per_step if isinstance(tokens_per_step, int) and tokens_per_step > 0 else None
    step_s = (step_tokens / tokens_per_s) if step_tokens else 0.0
    comm = 0.0
    if world > 1 and step_s > 0:
        link = link_for(profile, accel, num_nodes)
        compute_guess = step_s
        comm = exposed_comm_s(layout, trainable, precision, num_nodes, per_node, link, compute_guess)
        comm = min(comm, 0.5 * step_s)  # the model is not trusted to explain more than half of a measured step
    compute_s = step_s - comm if step_s > 0 else 0.0
    flops_per_s = tokens_per_s * fpt * (step_s / compute_s if compute_s > 0 else 1.0)
    cores = None
    if accel == "cpu":
        if profile is None:
            from jobgen.specs.load import load_profile

            profile = load_profile(str(summary.get("profile")), None) if isinstance(summary.get("profile"), str) else None
        cores = cores_per_rank(profile, per_node)
        value = flops_per_s / (world * cores)
    else:
        value = flops_per_s / (world * PEAK_FLOPS[accel][dtype]) if dtype in PEAK_FLOPS[accel] else 0.0
        if not 0 < value <= 1:
            raise ConfigError(f"the run's MFU comes out at {value:.3g}, outside (0, 1]", location=f"{where}: tokens_per_s_steady",
                              hint=f"check launch.gpu_type ({accel}) and the precision ({precision}) of the run")
    import datetime as _dt

    date = _dt.datetime.fromtimestamp(summary_path.stat().st_mtime, tz=_dt.timezone.utc).strftime("%Y-%m-%d")
    version = summary.get("jobgen_version")
    versions = f"jobgen {version}" if isinstance(version, str) and version.isprintable() and len(version) < 40 else ""
    return RunMeasurement(printable(str(run_dir)), (accel, dtype, family, size_class(n_params)), value, tokens_per_s, fpt,
                          world, cores, comm, step_s, date, versions)


def cores_per_rank(profile: Any, ranks_per_node: int) -> int:
    """CPU cores one rank uses: ``local.omp_threads_per_process`` when a local profile sets it,
    else ``cpus_per_node`` / ranks per node, at least 1 (every backend's ``OMP_NUM_THREADS``
    default, jobgen.planning.rules)."""
    if profile is None:
        return 1
    local = getattr(profile, "local", None)
    threads = getattr(local, "omp_threads_per_process", None) if getattr(profile, "scheduler", "") == "local" else None
    return int(threads or max(1, profile.cpus_per_node // max(1, ranks_per_node)))


def update(cal: CalibrationFile | None, runs: list[RunMeasurement], device: str = "") -> CalibrationFile:
    """``cal`` with ``runs`` folded in: per key, the mean over every run (the old mean weighted by
    its count), the smallest and largest value, the count, the newest date and versions."""
    rows = {r.key: r for r in (cal.rows if cal is not None else ())}
    for m in runs:
        old = rows.get(m.key)
        n0 = old.runs if old else 0
        mean = ((old.value * n0 if old else 0.0) + m.value) / (n0 + 1)
        lo = min(old.low or old.value, m.value) if old else m.value
        hi = max(old.high or old.value, m.value) if old else m.value
        unit = "flops_per_s_per_core" if m.key[0] == "cpu" else "mfu"
        rows[m.key] = CalibrationRow(**dict(zip(("accelerator", "dtype", "layout", "size"), m.key, strict=True)),
                                     **{unit: mean}, low=lo, high=hi, runs=n0 + 1,
                                     date=max(m.date, old.date if old else ""), versions=m.versions or (old.versions if old else ""),
                                     device=device or (old.device if old else m.key[0]), source="jobgen calibrate")
    return CalibrationFile(rows=tuple(sorted(rows.values(), key=lambda r: r.key)))
