"""Device time a job used: GPU-hours (CPU-hours on CPU clusters) and their cost.

The numbers come from the scheduler, never from a guess:

- SLURM: the allocation's TRES (``gres/gpu=N``, else ``cpu=N``) x the elapsed time, from
  ``squeue`` while the controller knows the job, then accounting (``sacct``: AllocTRES,
  ElapsedRaw), then the job-completion log (``sacct -c``: NCPUS and ElapsedRaw; that log keeps no
  GRES, so a GPU job's count there is the one its job directory asked for, and the source says so);
- Kubernetes: each pod's container start/end times x the GPUs (``nvidia.com/gpu`` limit) or CPUs
  (request) its container asked for, summed over the pods;
- local: the run's wall time (summary.json) x its ranks.

Pure: the backends read the scheduler and pass values in. Time is in seconds, rates per hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

DeviceKind = Literal["gpu", "cpu"]


@dataclass(frozen=True)
class Usage:
    """Device time of one job.

    Attributes:
        device_kind: ``gpu``, or ``cpu`` for a job that holds no GPU.
        devices: GPUs (or CPUs) the job held, over all its nodes.
        elapsed_s: wall seconds it held them (to now while it runs); ``None`` before it started.
        source: where ``devices`` and ``elapsed_s`` came from (e.g. ``squeue tres_alloc_str``).
        start: when it started (UTC), if known.
        end: when it ended (UTC); ``None`` while it runs.
        gpu_hour_price: the profile's price per GPU-hour, if it has one.
        device_seconds: device-seconds when they are not devices x elapsed (pods that ran for
            different times); ``None``: ``devices * elapsed_s``.
    """

    device_kind: DeviceKind
    devices: int
    elapsed_s: float | None
    source: str
    start: datetime | None = None
    end: datetime | None = None
    gpu_hour_price: float | None = None
    device_seconds: float | None = None

    @property
    def unit(self) -> str:
        """The unit of :attr:`device_hours`, named after what the job held: ``GPU-hours`` for a
        job with GPUs, ``CPU-hours`` (CPUs x hours) for one without; every command prints this."""
        return f"{self.device_kind.upper()}-hours"

    @property
    def device_hours(self) -> float | None:
        """GPU-hours (CPU-hours for a CPU job); ``None`` before the job started."""
        if self.device_seconds is not None:
            return self.device_seconds / 3600
        return None if self.elapsed_s is None else self.devices * self.elapsed_s / 3600

    @property
    def cost(self) -> float | None:
        """GPU-hours x the profile's price; ``None`` without a price or for a CPU job."""
        hours = self.device_hours
        if hours is None or self.gpu_hour_price is None or self.device_kind != "gpu":
            return None
        return hours * self.gpu_hour_price

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict with stable keys (hours rounded to 6 decimals, times ISO 8601)."""
        hours = self.device_hours
        cost = self.cost
        return {
            "device_kind": self.device_kind, "devices": self.devices,
            "elapsed_s": None if self.elapsed_s is None else round(self.elapsed_s, 3),
            f"{self.device_kind}_hours": None if hours is None else round(hours, 6),
            "cost": None if cost is None else round(cost, 6),
            "start": None if self.start is None else self.start.isoformat(),
            "end": None if self.end is None else self.end.isoformat(),
            "source": self.source,
        }

    def describe(self) -> str:
        """One line, e.g. ``8 GPUs x 1.5 h = 12.000 GPU-hours, cost 30.00 (sacct AllocTRES)``.

        The hours are printed to 3 decimals and the elapsed time to 3 more than the device
        count has digits (trailing zeros dropped), so devices x the printed time gives the
        printed hours to their last digit (``2 CPUs x 0.006 h = 0.012 CPU-hours``, not
        ``x 0.01 h``)."""
        label = self.device_kind.upper()
        hours = self.device_hours
        if hours is None:
            return f"{self.devices} {label}s, not started ({self.source})"
        span = ""
        if self.elapsed_s is not None and self.device_seconds is None:
            elapsed = f"{self.elapsed_s / 3600:.{3 + len(str(self.devices))}f}".rstrip("0").rstrip(".")
            span = f" x {elapsed} h"
        cost = f", cost {self.cost:.2f}" if self.cost is not None else ""
        return f"{self.devices} {label}s{span} = {hours:.3f} {self.unit}{cost} ({self.source})"


#: What the entrypoint can measure of its own device time (summary.json, notifications).
ENTRYPOINT_SOURCE = ("entrypoint: this run's wall time x ranks (a requeued job's earlier runs are not included; "
                     "`jobgen status` has the scheduler's figure)")


def run_usage(accelerator: str, ranks: int, wall_s: float, gpu_hour_price: float | None = None) -> Usage:
    """The device time of one run of the entrypoint, as it measures it: ``ranks`` devices (GPUs,
    or CPU ranks) for ``wall_s`` seconds (see :data:`ENTRYPOINT_SOURCE`)."""
    kind: DeviceKind = "gpu" if accelerator == "gpu" else "cpu"
    return Usage(kind, ranks, wall_s, ENTRYPOINT_SOURCE, gpu_hour_price=gpu_hour_price)


def parse_tres(text: str) -> dict[str, int]:
    """SLURM's TRES string (``cpu=4,mem=8000M,node=2,billing=4,gres/gpu=8``) as counts of the
    countable resources: ``cpu``, ``node``, ``gpu``. Typed GPU entries (``gres/gpu:a100=8``) are
    used only when the untyped total (``gres/gpu=8``) is missing; memory and billing are skipped.
    """
    counts: dict[str, int] = {}
    typed_gpus = 0
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if key in ("cpu", "node"):
            counts[key] = int(value)
        elif key == "gres/gpu":
            counts["gpu"] = int(value)
        elif key.startswith("gres/gpu:"):
            typed_gpus += int(value)
    if "gpu" not in counts and typed_gpus:
        counts["gpu"] = typed_gpus
    return counts


def from_iso(text: str | None, *, local: bool = False) -> datetime | None:
    """``2026-11-23T06:47:43`` (sacct, the controller's local time when ``local``) or
    ``2026-11-23T06:47:43Z`` (Kubernetes) as an aware datetime; ``None`` for ``Unknown``/empty."""
    if not text or text in ("Unknown", "None"):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.astimezone() if local else when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def span_seconds(start: datetime | None, end: datetime | None, now: datetime) -> float | None:
    """Seconds from ``start`` to ``end`` (to ``now`` while running); ``None`` before the start."""
    if start is None:
        return None
    return max(0.0, ((end or now) - start).total_seconds())
