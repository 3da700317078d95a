"""``jobgen calibrate``: reduce finished run directories to calibration measurements and fold
them into a calibration file (:mod:`jobgen.planning.calibration` holds the file's schema, the
seeded rows and the lookup; :mod:`jobgen.planning.time_model` the collectives subtracted).

Pure: no torch import.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from jobgen.errors import ConfigError, printable
from jobgen.planning.calibration import (
    MAX_FILE_BYTES,
    CalibrationFile,
    CalibrationRow,
    cores_per_rank,
    family_of,
    size_class,
)
from jobgen.specs.trainer import Precision, Strategy

#: Precisions and layouts a summary.json may record: the spec's (``auto`` is resolved before a run), and
#: ``single_device``, the path one-rank FSDP and ZeRO-1/2 take (jobgen.train.speed).
PRECISIONS = tuple(p for p in get_args(Precision) if p != "auto")
STRATEGIES = (*get_args(Strategy), "single_device")


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


def _read_json(path: Path, missing: str) -> dict[str, Any]:
    where = printable(str(path))
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no such file: {missing}", location=where, hint="calibrate from a finished run's directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror}", location=where) from None
    try:
        doc = json.loads(raw[:MAX_FILE_BYTES * 10].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError("not a JSON document in UTF-8", location=where) from None
    if not isinstance(doc, dict):
        raise ConfigError("not a JSON object", location=where)
    return doc


def _layout_of(spec: dict[str, Any], strategy: str) -> Any:
    """The :class:`jobgen.planning.estimate.Layout` of a run whose ``spec.json`` is ``spec`` and
    whose summary names ``strategy``: the sharding and offload fields of the spec's trainer where
    the strategy has them (offload is told apart only when spec.json has those fields)."""
    from jobgen.planning.estimate import Layout

    t = spec.get("spec", {}).get("trainer") if isinstance(spec.get("spec"), dict) else None
    t = t if isinstance(t, dict) else {}
    return Layout(strategy if strategy != "single_device" else "ddp",
                  t.get("fsdp_sharding_strategy", "FULL_SHARD") if strategy == "fsdp" else "FULL_SHARD",
                  t.get("offload_optimizer", "none") if strategy.startswith("deepspeed") else "none",
                  t.get("offload_params", "none") if strategy in ("fsdp", "deepspeed_stage_3") else "none")


def _exposed_comm_of_step(colls: tuple[Any, ...], link: Any, step_s: float) -> float:
    """Seconds of a measured step of ``step_s`` seconds that the collectives ``colls`` leave
    exposed: step = compute + exposed(compute), solved by a few fixed-point rounds, and never more
    than half of the step (the model is not trusted to explain more of a measured step)."""
    from jobgen.planning.time_model import exposed_comm_s

    comm = 0.0
    for _ in range(4):
        comm = min(exposed_comm_s(colls, link, step_s - comm), 0.5 * step_s)
    return comm


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
    from jobgen.planning.flops import PEAK_FLOPS, planned_compute_dtype
    from jobgen.planning.time_model import collectives, link_for

    summary_path, spec_path = run_dir / "summary.json", run_dir / "spec.json"
    summary = _read_json(summary_path, "the run has not finished (summary.json is written at the end of training)")
    spec = _read_json(spec_path, "not a run directory of jobgen (spec.json is written when the job is rendered)")
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
    if precision not in PRECISIONS:
        raise ConfigError(f"precision is {printable(repr(precision))[:60]}, not one of {', '.join(PRECISIONS)}",
                          location=f"{where}: precision")
    if strategy not in STRATEGIES:
        raise ConfigError(f"layout is {printable(repr(strategy))[:60]}, not one of {', '.join(STRATEGIES)}",
                          location=f"{where}: layout")
    dtype = planned_compute_dtype(precision, None if accel == "cpu" else accel)
    levers = summary.get("levers") if isinstance(summary.get("levers"), dict) else {}
    if accel != "cpu" and levers.get("matmul_precision") is None and precision == "32-true":
        dtype = "fp32"
    family = family_of(strategy)
    nodes = launch.get("num_nodes")
    num_nodes = nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and 1 <= nodes <= world else 1
    per_node = max(1, world // max(1, num_nodes))
    if profile is None and (world > 1 or accel == "cpu"):
        profile = _profile_of(summary, where)
    step_tokens = tokens_per_step if isinstance(tokens_per_step, int) and tokens_per_step > 0 else None
    step_s = (step_tokens / tokens_per_s) if step_tokens else 0.0
    comm = 0.0
    if world > 1 and step_s > 0:
        colls = collectives(_layout_of(spec, strategy), trainable, precision, num_nodes, per_node,
                            "cpu" if accel == "cpu" else "gpu")
        comm = _exposed_comm_of_step(colls, link_for(profile, accel, num_nodes), step_s)
    compute_s = step_s - comm if step_s > 0 else 0.0
    flops_per_s = tokens_per_s * fpt * (step_s / compute_s if compute_s > 0 else 1.0)
    cores = None
    if accel == "cpu":
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


def _profile_of(summary: dict[str, Any], where: str) -> Any:
    """The profile a run's summary.json names, loaded by name (its cores per rank and bandwidths).

    Raises:
        ConfigError: no usable name, or a profile that cannot be loaded.
    """
    from jobgen.specs.load import load_profile

    name = summary.get("profile")
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise ConfigError(f"profile is {printable(repr(name))[:60]}, not a profile name", location=f"{where}: profile",
                          hint="give the run's profile: jobgen calibrate RUN_DIR --profile P")
    return load_profile(name, None)
