"""The prediction a job is submitted with, and how a finished run compares with it.

``jobgen submit`` runs the time model (:mod:`jobgen.planning.time_model`) on the spec's own layout
and writes the figures beside each ``spec.json`` of the job directory as
:data:`~jobgen.jobdir.files.PREDICTION_FILE` (:func:`write_predictions`). The file is submit-time
state, as the submission record is: a render never writes it (rendered files depend on the spec,
the profile and the templates only; the prediction also rests on the calibration file as it is at
submit). The entrypoint reads it at the end of training (:func:`summary_block`) and puts the
prediction, what the run measured and ``measured / predicted`` into ``summary.json``'s
``prediction``; ``jobgen ls`` shows the step-time ratio (:func:`ratio_of_summary`).

The file (``version`` 1), all figures as ``{value, low, high}`` or null::

    {"version": 1, "inputs_sha256": ..., "profile": ..., "made_at": RFC 3339 UTC,
     "available": bool, "message": str, "layout": str | null,
     "step_s", "tokens_per_s", "wall_s", "device_hours", "cost": band | null,
     "device_kind": "gpu" | "cpu", "devices": int, "max_steps": int | null,
     "price_per_device_hour": float | null, "tokens_per_step": int, "flops_per_token": int | null,
     "calibration": the calibration row used (CalibrationRow + origin, exact, note) | null,
     "calibration_file": str}

Measured figures (``summary.json``): the step time is the steady one (the later half of the
timed steps, clock to clock: :attr:`jobgen.train.callbacks.Throughput.steady_seconds_per_step`),
tokens/s the steady tokens/s; the wall time, device-hours and cost are the start's own
(``wall_time_s``, ``usage``), so they include start-up, data preparation and validation, which
the model leaves out, and a resumed start did only part of the steps: their ratios are null then.

Pure (no torch); the time model is imported only to make a prediction.
"""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

from jobgen.errors import ConfigError, JobgenError, printable
from jobgen.jobdir.files import ARRAY_INDEX_FILE, POINTS_DIR, PREDICTION_FILE, SPEC_FILE, pretty_json, write_atomic

VERSION = 1
#: The figures a prediction holds as bands, and their units.
FIGURES = ("step_s", "tokens_per_s", "wall_s", "device_hours", "cost")
#: Bytes of a prediction file read at most (a real one is under 2 KiB).
MAX_FILE_BYTES = 64 * 1024
#: Longest text field a prediction file may hold (message, layout, profile, paths, calibration note).
MAX_TEXT_CHARS = 1000


def predict_spec(resolved: Any, profile: Any, *, spec_source: str = "spec") -> dict[str, Any]:
    """The prediction document (module docstring) of a resolved spec on ``profile``: the time
    model's row of the spec's own layout. No prediction (``available`` false, ``message`` says
    why) for a spec the model cannot size (``model.class_path``, command mode), a profile without
    a calibration row that applies, or a memory plan that fails (a Hugging Face config this
    machine cannot read).

    Args:
        resolved: the :class:`~jobgen.jobdir.spec.ResolvedSpec` written as spec.json.
        profile: the :class:`~jobgen.specs.profile.ClusterProfile` it was planned on.
        spec_source: where the spec came from (named in error messages).
    """
    spec, launch = resolved.spec, resolved.launch
    doc = _base(resolved)
    if spec.entrypoint is not None or spec.user_code:
        doc["message"] = "no prediction: the time model knows the FLOPs of the built-in and Hugging Face models only"
        return doc
    from jobgen.planning.estimate_hf import plan_memory
    from jobgen.planning.time_model import plan_time

    try:
        mp = plan_memory(spec, profile, launch.num_nodes, launch.devices_per_node, spec_source=spec_source)
        tp = plan_time(spec, profile, mp, spec_source=spec_source)
    except JobgenError as exc:  # kept short: read_prediction refuses a message over MAX_TEXT_CHARS
        doc["message"] = f"no prediction: {exc}"[:MAX_TEXT_CHARS]  # the location (file: field) first, as the CLI prints it
        return doc
    label = mp.spec_row.estimate.layout.label
    row = tp.rows.get(label)
    doc |= {"message": tp.message[:MAX_TEXT_CHARS], "tokens_per_step": tp.tokens_per_step, "flops_per_token": tp.flops_per_token,
            "calibration_file": tp.calibration_path, "layout": label}
    if row is None:
        if tp.rows:
            doc["message"] = f"no prediction for the spec's layout {label}: no calibration row applies"
        return doc
    figures = row.to_json()
    doc |= {"available": True, **{name: figures[name] for name in FIGURES}, "calibration": figures["calibration"]}
    return doc


def prediction_files(job_dir: Path) -> list[Path]:
    """The spec.json files of a job directory a prediction goes beside: the one at the top, or
    a job array's ``points/<i>/spec.json``."""
    top = job_dir / SPEC_FILE
    if top.is_file():
        return [top]
    if (job_dir / ARRAY_INDEX_FILE).is_file() and (job_dir / POINTS_DIR).is_dir():
        points = [p for p in (job_dir / POINTS_DIR).iterdir() if p.name.isdigit() and (p / SPEC_FILE).is_file()]
        return [p / SPEC_FILE for p in sorted(points, key=lambda p: int(p.name))]
    return []


def write_predictions(job_dir: Path, profile: Any | None, *, spec_source: str = "spec",
                      resolved_specs: dict[str, Any] | None = None) -> list[Path]:
    """Write :data:`PREDICTION_FILE` beside every spec.json of ``job_dir`` (:func:`prediction_files`),
    from ``profile``, or, when None, the profile spec.json names loaded by name (a profile that
    cannot be loaded gives a file that says so). ``resolved_specs``: the
    :class:`~jobgen.jobdir.spec.ResolvedSpec` of each spec.json by its path relative to ``job_dir``
    (``spec.json``, ``points/<i>/spec.json``), when the caller holds them (a plan just written):
    those files are not read back. Returns the paths written.

    Raises:
        ConfigError: a spec.json that does not validate (:func:`jobgen.jobdir.spec.load_resolved_spec`).
    """
    from jobgen.jobdir.spec import load_resolved_spec

    written = []
    for spec_file in prediction_files(job_dir):
        known = (resolved_specs or {}).get(spec_file.relative_to(job_dir).as_posix())
        resolved = known if known is not None else load_resolved_spec(spec_file)
        prof, why = profile, ""
        if prof is None:
            from jobgen.specs.load import load_profile

            try:
                prof = load_profile(resolved.profile)
            except JobgenError as exc:
                why = f"no prediction: profile {resolved.profile!r} cannot be loaded here ({exc.message})"
        doc = predict_spec(resolved, prof, spec_source=spec_source) if prof is not None else _base(resolved) | {"message": why[:MAX_TEXT_CHARS]}
        target = spec_file.with_name(PREDICTION_FILE)
        write_atomic(target, pretty_json(doc))
        written.append(target)
    return written


def _base(resolved: Any) -> dict[str, Any]:
    """A prediction document without figures (``available`` false, ``message`` empty)."""
    spec, launch = resolved.spec, resolved.launch
    gpu = launch.accelerator == "gpu"
    return {
        "version": VERSION, "inputs_sha256": resolved.inputs_sha256, "profile": resolved.profile,
        "made_at": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "available": False, "message": "", "layout": None, **dict.fromkeys(FIGURES),
        "device_kind": "gpu" if gpu else "cpu", "devices": launch.world_size, "max_steps": spec.trainer.max_steps,
        "price_per_device_hour": launch.gpu_hour_price if gpu else None, "tokens_per_step": None, "flops_per_token": None,
        "calibration": None, "calibration_file": None,
    }


# --------------------------------------------------------------------------- reading


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _band(value: Any, where: str) -> dict[str, float] | None:
    """A ``{value, low, high}`` of finite positive numbers with low <= value <= high, or None.

    Raises:
        ValueError: anything else (``where`` names the field).
    """
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"value", "low", "high"}:
        raise ValueError(f"{where}: expected {{value, low, high}}")
    if not all(_positive(value[k]) for k in ("value", "low", "high")):
        raise ValueError(f"{where}: every figure must be a finite number above 0")
    if not value["low"] <= value["value"] <= value["high"]:
        raise ValueError(f"{where}: low <= value <= high does not hold")
    return {k: float(value[k]) for k in ("value", "low", "high")}


def _text(value: Any, where: str, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected text")
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"{where}: longer than {MAX_TEXT_CHARS} characters")
    return value


def read_prediction(path: Path) -> dict[str, Any]:
    """Read and check a prediction file: the figures are bands of finite positive numbers, the
    text fields short, the calibration row an object. Returns the checked document.

    Raises:
        ConfigError: the file is missing, unreadable, larger than :data:`MAX_FILE_BYTES`, not
            JSON, of another version, or a field fails the checks (the location names the file
            and the field).
    """
    hint = "submit the job again (`jobgen submit` writes the prediction), or delete the file"
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the prediction: {exc.strerror or exc}", location=printable(str(path)), hint=hint) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES} bytes: not a prediction file", location=printable(str(path)), hint=hint)
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
        raise ConfigError(f"not a prediction file: {printable(str(exc))[:MAX_TEXT_CHARS]}", location=printable(str(path)),
                          hint=hint) from None
    try:
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        if doc.get("version") != VERSION:
            raise ValueError(f"version: expected {VERSION}")
        out: dict[str, Any] = {"version": VERSION}
        for key in ("inputs_sha256", "profile", "made_at", "layout", "calibration_file"):
            out[key] = _text(doc.get(key), key)
        out["message"] = _text(doc.get("message", ""), "message", optional=False)
        if not isinstance(doc.get("available"), bool):
            raise ValueError("available: expected true or false")
        out["available"] = doc["available"]
        for name in FIGURES:
            out[name] = _band(doc.get(name), name)
        if out["available"] and (out["step_s"] is None or out["tokens_per_s"] is None):
            raise ValueError("available is true but step_s or tokens_per_s is missing")
        for key in ("devices", "max_steps", "tokens_per_step", "flops_per_token"):
            value = doc.get(key)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"{key}: expected a whole number above 0")
            out[key] = value
        price = doc.get("price_per_device_hour")
        if price is not None and not (_positive(price) or price == 0):
            raise ValueError("price_per_device_hour: expected a finite number >= 0")
        out["price_per_device_hour"] = price
        kind = doc.get("device_kind")
        if kind not in ("gpu", "cpu"):
            raise ValueError("device_kind: expected gpu or cpu")
        out["device_kind"] = kind
        cal = doc.get("calibration")
        if cal is not None:
            if not isinstance(cal, dict) or len(json.dumps(cal)) > 2048:
                raise ValueError("calibration: expected the calibration row used (an object)")
            cal = {k: v for k, v in cal.items() if isinstance(k, str)}
            for key, value in cal.items():
                if isinstance(value, str):
                    _text(value, f"calibration.{key}")
                elif isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"calibration.{key}: not a finite number")
        out["calibration"] = cal
    except ValueError as exc:
        raise ConfigError(f"not a valid prediction: {printable(str(exc))}", location=printable(str(path)), hint=hint) from None
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def describe(path: Path) -> str:
    """One line on the prediction file ``path``: the layout, step time, tokens/s, wall time to
    ``max_steps``, device-hours and cost (each its value), and the file; or why there is none."""
    from jobgen.planning.time_model import fmt_count, fmt_duration

    try:
        pred = read_prediction(path)
    except ConfigError as exc:
        return f"n/a ({exc.location}: {exc.message})"
    if not pred["available"]:
        return f"{printable(pred['message'] or 'no prediction')} ({printable(str(path))})"
    unit = pred["device_kind"].upper()
    parts = [f"{printable(str(pred['layout']))}: step {fmt_duration(pred['step_s']['value'])}", f"{fmt_count(pred['tokens_per_s']['value'])} tokens/s"]
    if pred["wall_s"] is not None:
        parts.append(f"wall {fmt_duration(pred['wall_s']['value'])} to step {pred['max_steps']:,}")
    if pred["device_hours"] is not None:
        parts.append(f"{pred['device_hours']['value']:,.3f} {unit}-hours")
    if pred["cost"] is not None:
        parts.append(f"cost {pred['cost']['value']:,.2f}")
    return ", ".join(parts) + f" ({printable(str(path))})"


# --------------------------------------------------------------------------- comparing


def measured_figures(summary: dict[str, Any]) -> dict[str, float | None]:
    """What a run measured, in the prediction's figures (module docstring), from the fields of
    its ``summary.json``: ``step_s`` (tokens per step / steady tokens/s), ``tokens_per_s``,
    ``wall_s``, ``device_hours``, ``cost``; None where not measured."""
    def num(value: Any) -> float | None:
        return float(value) if _positive(value) else None

    tps = num(summary.get("tokens_per_s_steady"))
    tokens = num(summary.get("tokens_per_step"))
    usage = summary.get("usage") if isinstance(summary.get("usage"), dict) else {}
    hours = num(usage.get("gpu_hours")) or num(usage.get("cpu_hours"))
    return {"step_s": tokens / tps if tps and tokens else None, "tokens_per_s": tps, "wall_s": num(summary.get("wall_time_s")),
            "device_hours": hours, "cost": num(usage.get("cost"))}


def compare(prediction: dict[str, Any], measured: dict[str, float | None], *, whole_run: bool) -> dict[str, float | None]:
    """``measured / predicted`` per figure (4 significant digits), None where either is missing;
    the wall time, device-hours and cost only when ``whole_run`` (the start trained from step 0)."""
    out: dict[str, float | None] = {}
    for name in FIGURES:
        band, value = prediction.get(name), measured.get(name)
        if band is None or value is None or (name not in ("step_s", "tokens_per_s") and not whole_run):
            out[name] = None
        else:
            out[name] = float(f"{value / band['value']:.4g}")
    return out


def summary_block(spec_path: Path, summary: dict[str, Any], inputs_sha256: str) -> dict[str, Any] | None:
    """``summary.json``'s ``prediction``: ``{file, made_at, available, message, layout, calibration,
    calibration_file, predicted: {figure: band}, measured: {figure: value}, measured_over_predicted:
    {figure: ratio}}``; ``{file, error}`` when the file beside ``spec_path`` is unreadable, invalid
    or was made for other inputs (a job directory rendered again after the submit); None when there
    is none (a Kubernetes pod, a job started without ``jobgen submit``). Never raises: the run
    has finished, a bad prediction file only loses the comparison."""
    path = spec_path.with_name(PREDICTION_FILE)
    if not path.exists():
        return None
    try:
        pred = read_prediction(path)
    except ConfigError as exc:
        return {"file": str(path), "error": f"{exc.location}: {exc.message}"}
    if pred["inputs_sha256"] != inputs_sha256:
        return {"file": str(path), "error": f"{printable(str(path))}: made for other inputs (inputs_sha256 "
                                            f"{printable(str(pred['inputs_sha256']))[:16]}, spec.json's {inputs_sha256[:16]})"}
    measured = measured_figures(summary)
    whole = summary.get("resumed_from") is None
    return {"file": str(path), "made_at": pred["made_at"], "available": pred["available"], "message": pred["message"],
            "layout": pred["layout"], "calibration": pred["calibration"], "calibration_file": pred["calibration_file"],
            "predicted": {name: pred[name] for name in FIGURES},
            "measured": {name: None if v is None else round(v, 6) for name, v in measured.items()},
            "measured_over_predicted": compare(pred, measured, whole_run=whole) if pred["available"] else dict.fromkeys(FIGURES)}


def ratio_of_summary(summary_path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(summary.json's prediction block, None)`` of a finished run, or ``(None, why)`` when there
    is none to show: no summary.json (not finished, or not readable from here), no prediction in
    it, or a file or block that does not hold valid figures (``why`` names the file). Values
    are checked as :func:`read_prediction` checks them: a ratio must be a finite number above 0."""
    try:
        with summary_path.open("rb") as fh:
            raw = fh.read(4 * 2**20 + 1)
    except OSError:
        return None, None
    where = printable(str(summary_path))
    try:
        doc = json.loads(raw.decode("utf-8")) if len(raw) <= 4 * 2**20 else None  # NaN allowed: a diverged run's val_loss
    except (UnicodeDecodeError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return None, f"{where}: not a summary (JSON object)"
    block = doc.get("prediction")
    if block is None:
        return None, None
    if not isinstance(block, dict):
        return None, f"{where}: prediction is not an object"
    if "error" in block:
        return None, f"{where}: prediction: {printable(str(block['error']))[:200]}"
    ratios = block.get("measured_over_predicted")
    if not isinstance(ratios, dict):
        return None, f"{where}: prediction.measured_over_predicted is not an object"
    checked: dict[str, float | None] = {}
    for name in FIGURES:
        value = ratios.get(name)
        if value is not None and not _positive(value):
            return None, f"{where}: prediction.measured_over_predicted.{name} is not a finite number above 0"
        checked[name] = value
    return {"measured_over_predicted": checked, "available": block.get("available") is True}, None
