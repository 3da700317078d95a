"""``summary.json``: what a finished run measured (:class:`RunSummary`), written by global rank
zero of the entrypoint at the end of training and read by ``jobgen status`` / ``ls`` /
``calibrate``, the usage and straggler reports and the prediction's comparison. Part of the job
directory's contract (:mod:`jobgen.jobdir`).

The file is JSON with two-space indentation and a final newline; the keys come in the order of
:class:`RunSummary`'s fields, and a field the entrypoint does not write for a run is absent (not
``null``): ``data`` and ``epoch`` (a ``class_path`` run only), ``smoke`` (a ``--smoke`` run
only), ``tracking`` (a run with experiment trackers only), ``restarts`` (added by jobgen's
restart loop after the run). Readers take any file: a command-mode run's summary (written by the
local backend, or by the user's own script), one of an older jobgen, one edited by hand.
:func:`read_summary` and :func:`parse_summary` never raise; a field that does not hold its type
reads as absent (``None``), and keys this version does not know are kept
(:meth:`RunSummary.extras`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobgen.jobdir.files import write_atomic

#: The largest summary.json read (bytes); a larger file is not a summary.
MAX_SUMMARY_BYTES = 4 * 2**20

#: Fields written only when they apply (absent otherwise): see the module docstring.
_ONLY_WHEN_SET = frozenset({"data", "epoch", "smoke", "tracking", "restarts"})


class SpeedLevers(BaseModel):
    """The speed levers a run used (:mod:`jobgen.train.speed`): ``summary.json``'s ``levers``.
    Fields a summary does not record (one of a jobgen that did not have that lever) read as ``None``."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    compile: bool | None = Field(default=None, description="torch.compile of the network (``trainer.compile``, auto on a GPU).")
    matmul_precision: str | None = Field(default=None, description=(
        "``torch.set_float32_matmul_precision``'s argument (``\"high\"``: TF32 matmuls, compute capability >= 8.0); "
        "None: left at torch's default."))
    pin_memory: bool | None = Field(default=None, description="Pinned host memory in the data loaders (GPU runs).")
    single_device: bool | None = Field(default=None, description=(
        "Trained on Lightning's single-device path: the spec's strategy has nothing to shard at world size 1."))
    host_logging: bool | None = Field(default=None, description="Logged values kept as host tensors (no device sync per step).")
    fused_clip: bool | None = Field(default=None, description="Fused AdamW may clip gradients under ``bf16-mixed``.")
    off: list[str] | None = Field(default=None, description="The levers ``JOBGEN_LEVERS_OFF`` turned off, sorted.")
    fused_adamw: bool | None = Field(default=None, description=(
        "The first optimizer is torch's fused AdamW (known after fit built it; absent before)."))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, in field order; ``fused_adamw`` left out while unknown (before fit)."""
        doc = self.model_dump(mode="json")
        if self.fused_adamw is None:
            doc.pop("fused_adamw")
        return doc


class StragglerRecord(BaseModel):
    """A rank slower than the others (:func:`jobgen.train.watchdog.find_straggler`): ``summary.json``'s ``straggler``."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    rank: int = Field(description="The slow rank's global rank.")
    node: str = Field(description="Its node's host name, as the node reported it (show it with jobgen.errors.printable).")
    ratio: float = Field(allow_inf_nan=False, description="Its step time over the median of the other ranks'.")
    step_time_s: float = Field(allow_inf_nan=False, description="Its compute time per step, seconds.")
    median_step_time_s: float = Field(allow_inf_nan=False, description="The median of the other ranks' compute time per step, seconds.")


class RunSummary(BaseModel):
    """``summary.json`` (:data:`~jobgen.jobdir.files.SUMMARY_FILE`) of a run directory.

    Every field is optional when read (a command-mode summary holds only some of them); the
    entrypoint writes every field but those the module docstring names. Throughputs are over all
    ranks; MFU is a fraction (not a percentage); times are seconds; memory is bytes.
    """

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    name: str | None = Field(default=None, description="The job's name (``spec.name``).")
    global_step: int | None = Field(default=None, description="The optimizer step training ended at.")
    max_steps: int | None = Field(default=None, description="``trainer.max_steps``; None when the run is bounded by epochs.")
    val_loss: float | None = Field(default=None, description=(
        "The validation loss at the final step (nats per byte or token of the built-in loss, the user module's own "
        "units for a class_path model; NaN for a diverged run); None without a validation."))
    newest_step_checkpoint: str | None = Field(default=None, description=(
        "The newest step checkpoint kept (retention is by step, newest first; no loss decides it); None: none kept."))
    last_checkpoint: str | None = Field(default=None, description="``last.ckpt``'s path; None: none written (a smoke run).")
    wall_time_s: float | None = Field(default=None, description="Seconds from the process start to the end of training (of this start).")
    usage: dict[str, Any] | None = Field(default=None, description=(
        "Device time of this start (:meth:`jobgen.reports.usage.Usage.to_json`): ``device_kind``, ``devices``, "
        "``elapsed_s``, ``<kind>_hours``, ``cost``, ``start``, ``end``, ``source``."))
    tokens_per_s_mean: float | None = Field(default=None, description="Mean tokens/s over the timed steps; None when unknown.")
    tokens_per_s_steady: float | None = Field(default=None, description=(
        "Tokens/s over the later half of the timed steps, clock to clock (one-off costs left out); None when unknown."))
    mfu_steady: float | None = Field(default=None, description="MFU at the steady tokens/s; None without a GPU peak.")
    samples_per_s_mean: float | None = Field(default=None, description="Mean samples (sequences)/s over the timed steps.")
    tokens_per_step: int | None = Field(default=None, description="Tokens per optimizer step over all ranks (built-in data only).")
    flops_per_token: int | None = Field(default=None, description="Model training FLOPs per token (:mod:`jobgen.train.measure`).")
    peak_flops_per_s: float | None = Field(default=None, description="Dense peak FLOP/s of all the run's GPUs; None on CPU.")
    mfu_mean: float | None = Field(default=None, description="MFU at the mean tokens/s; None without a GPU peak.")
    peak_memory_bytes: int | None = Field(default=None, description="The largest peak memory over the ranks, bytes.")
    peak_memory_kind: str | None = Field(default=None, description="What that peak measures (a key of jobgen.train.measure.MEMORY_KINDS).")
    world_size: int | None = Field(default=None, description="Ranks (processes) that trained.")
    n_params: int | None = Field(default=None, description="Parameters of the model before sharding (as ``total_params``).")
    trainable_params: int | None = Field(default=None, description="Trainable parameters before sharding.")
    total_params: int | None = Field(default=None, description="All parameters before sharding.")
    model: str | None = Field(default=None, description="``gpt``, the Hugging Face path, or the user module's class path.")
    data_format: str | None = Field(default=None, description="``spec.data.format``, or ``class_path`` for a user data module.")
    data: str | None = Field(default=None, description="The user data module's class path (class_path runs only).")
    epoch: int | None = Field(default=None, description="The epoch training ended in (class_path runs only).")
    smoke: bool | None = Field(default=None, description="True for a ``--smoke`` run (absent otherwise).")
    straggler: StragglerRecord | None = Field(default=None, description="A rank slower than the others, or None.")
    resumed_from: str | None = Field(default=None, description="The checkpoint this start resumed from; None: it started at step 0.")
    resumed_from_step: int | None = Field(default=None, description="That checkpoint's step (None: unknown or a fresh start).")
    metrics_csv: str | None = Field(default=None, description="This start's CSV metrics file.")
    strategy: str | None = Field(default=None, description="The spec's ``trainer.strategy``.")
    layout: str | None = Field(default=None, description="The strategy that trained: ``single_device`` or the spec's.")
    precision: str | None = Field(default=None, description="``trainer.precision``.")
    levers: SpeedLevers | None = Field(default=None, description="The speed levers this run used.")
    jobgen_version: str | None = Field(default=None, description="The jobgen version that rendered spec.json.")
    inputs_sha256: str | None = Field(default=None, description="spec.json's ``inputs_sha256`` (what the run was made from).")
    profile: str | None = Field(default=None, description="The cluster profile's name.")
    code: dict[str, Any] | None = Field(default=None, description=(
        "The code snapshot (:class:`~jobgen.jobdir.runs.CodeSnapshot` fields plus ``dir``), or None."))
    tracking: dict[str, Any] | None = Field(default=None, description=(
        "W&B / MLflow runs: ``run_key`` and one entry per tracker (ids, URLs or paths); trackers only."))
    prediction: dict[str, Any] | None = Field(default=None, description=(
        "The time model's prediction beside what was measured (:func:`jobgen.planning.prediction.summary_block`), or None."))
    restarts: dict[str, Any] | None = Field(default=None, description=(
        "jobgen's restarts of the job: ``max_restarts``, ``used``, ``history`` (:func:`jobgen.reports.attempts.with_restarts`)."))

    def to_json(self) -> dict[str, Any]:
        """The file's object: every field in order, those of :data:`_ONLY_WHEN_SET` only when set
        (not None), then the keys this version does not know."""
        doc = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None and name in _ONLY_WHEN_SET:
                continue
            doc[name] = value.to_json() if isinstance(value, SpeedLevers) else (
                value.model_dump(mode="json") if isinstance(value, BaseModel) else value)
        return doc | self.extras()

    def dumps(self) -> str:
        """The file's text: :meth:`to_json`, two-space indented, final newline."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    def extras(self) -> dict[str, Any]:
        """The keys this version does not know (a command-mode run's ``entrypoint``, ``cwd``, ``exit_code``...)."""
        return dict(self.__pydantic_extra__ or {})


def write_summary(path: Path, summary: RunSummary) -> None:
    """Write ``summary`` to ``path`` (atomically): :meth:`RunSummary.dumps`."""
    write_atomic(path, summary.dumps())


def parse_summary(raw: bytes | str | None) -> RunSummary | None:
    """``raw`` (a summary.json's bytes or text) as a :class:`RunSummary`; None when it is not a
    JSON object in UTF-8 of at most :data:`MAX_SUMMARY_BYTES`. A field that does not hold its
    type (a string for a step, a bool for a count, a straggler of another shape, an infinite
    straggler ratio) reads as None; the rest of the file is kept. Never raises."""
    if raw is None:
        return None
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    if len(data) > MAX_SUMMARY_BYTES:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))  # NaN allowed: a diverged run's val_loss
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    for _ in range(len(RunSummary.model_fields) + 1):
        try:
            return RunSummary.model_validate(doc)
        except ValidationError as exc:
            bad = {e["loc"][0] for e in exc.errors() if e["loc"] and e["loc"][0] in RunSummary.model_fields}
            if not bad:
                return None
            doc = {k: v for k, v in doc.items() if k not in bad}
        except RecursionError:
            return None
    return None


def read_summary(path: Path) -> RunSummary | None:
    """The :class:`RunSummary` at ``path`` (a run directory's summary.json); None when there is
    none, it cannot be read, or it is not a summary (:func:`parse_summary`). Never raises."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_SUMMARY_BYTES + 1)
    except (OSError, ValueError):
        return None
    return parse_summary(raw)

