"""The GPUs of this machine, for the ``local`` profile (``local.detect_gpus: true``).

:func:`detect_gpus` answers how many NVIDIA GPUs the ranks of a local run would see, which
model and how much memory each has; :func:`apply_local_gpus` turns that into the profile's
``gpus_per_node`` (one rank per GPU), ``gpu_type`` (which decides ``precision: auto``:
``bf16-mixed`` on Ampere or newer), ``gpu_mem_gib`` (the plan's memory budget), and the
machine's CPU cores and host memory.

Cost (why it is lazy): nothing here runs unless a profile with ``local.detect_gpus: true`` is
loaded (``plan``/``render``/``validate``/``submit`` with ``--profile local``, ``profiles``).
A machine with no NVIDIA driver (no ``/dev/nvidia<N>`` and no ``/proc/driver/nvidia/gpus``) is
told by two file-system checks, without importing anything: CPU machines keep today's profile
and cost. With a driver, NVML answers through ``pynvml`` where it is installed (tens of ms, no
torch), else ``torch.cuda`` (importing torch: about 1-3 s, once per command).
``CUDA_VISIBLE_DEVICES`` is honoured: empty means no GPUs; a list is asked of ``torch.cuda``,
which applies it (NVML does not).

The answer depends on the machine, so a render with ``--profile local`` differs between a GPU
and a CPU machine (the profile's description and README say so).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen.specs.profile import GPU_COMPUTE_CAPABILITY

GIB = 1024**3


@dataclass(frozen=True)
class LocalGpus:
    """What :func:`detect_gpus` found.

    Attributes:
        count: GPUs the ranks see (>= 1).
        name: the model as the driver names it, e.g. ``NVIDIA H100 80GB HBM3``.
        mem_gib: total memory of the smallest of them, in GiB (2**30 bytes).
        capability: CUDA compute capability ``(major, minor)`` of the first.
        source: ``nvml`` or ``torch.cuda``.
    """

    count: int
    name: str
    mem_gib: float
    capability: tuple[int, int]
    source: str


def _driver_present(root: Path = Path("/")) -> bool:
    """Whether the NVIDIA kernel driver shows a GPU (cheap: two file-system checks)."""
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    return any((root / "dev").glob("nvidia[0-9]*")) or (gpus.is_dir() and any(gpus.iterdir()))


def _from_nvml() -> LocalGpus | None:
    import pynvml  # type: ignore[import-not-found]

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        name = pynvml.nvmlDeviceGetName(handles[0])
        name = name.decode() if isinstance(name, bytes) else str(name)
        total = min(pynvml.nvmlDeviceGetMemoryInfo(h).total for h in handles)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handles[0])
        return LocalGpus(count, name, total / GIB, (int(major), int(minor)), "nvml")
    finally:
        pynvml.nvmlShutdown()


def _from_torch() -> LocalGpus | None:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    count = torch.cuda.device_count()
    props = [torch.cuda.get_device_properties(i) for i in range(count)]
    total = min(p.total_memory for p in props)
    return LocalGpus(count, props[0].name, total / GIB, (props[0].major, props[0].minor), "torch.cuda")


def detect_gpus() -> LocalGpus | None:
    """This machine's GPUs as a local run's ranks would see them, or ``None`` (no GPU, no
    driver, ``CUDA_VISIBLE_DEVICES`` empty, or the query failed). See the module docstring for
    the order of the sources and their cost. Never raises."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if (visible is not None and not visible.strip()) or not _driver_present():
        return None
    try:
        if visible is None:
            try:
                return _from_nvml()
            except ImportError:
                pass
        return _from_torch()
    except Exception:  # noqa: BLE001 - a broken driver/NVML means "no usable GPU", as torch.cuda says
        return None


def gpu_type_of(gpus: LocalGpus) -> str:
    """The profile's ``gpu_type`` for ``gpus``: the model jobgen knows in the driver's name
    (``NVIDIA A100-SXM4-80GB`` -> ``A100``), else the known model of the highest compute
    capability not above the GPU's (its precision rules are the GPU's; MFU's peak is that model's)."""
    upper = gpus.name.upper()
    for known in sorted(GPU_COMPUTE_CAPABILITY, key=len, reverse=True):
        if re.search(rf"(?<![A-Z0-9]){known}(?![0-9])", upper):
            return known
    below = [k for k, cap in GPU_COMPUTE_CAPABILITY.items() if cap <= gpus.capability]
    if below:
        return max(below, key=GPU_COMPUTE_CAPABILITY.__getitem__)
    return min(GPU_COMPUTE_CAPABILITY, key=GPU_COMPUTE_CAPABILITY.__getitem__)  # older than every known model


def _host_mem_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return math.floor(int(line.split()[1]) * 1024 / GIB * 10) / 10
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def apply_local_gpus(doc: dict[str, Any], gpus: LocalGpus | None) -> dict[str, Any]:
    """The profile document ``doc`` for this machine: unchanged when ``gpus`` is ``None``; else
    one rank per GPU (``gpus_per_node``), ``gpu_type`` (:func:`gpu_type_of`), ``gpu_mem_gib``
    (floored to 0.1 GiB), this machine's CPU cores and host memory, and a description naming
    what was found."""
    if gpus is None:
        return doc
    mem = math.floor(gpus.mem_gib * 10) / 10
    out = {**doc, "gpus_per_node": gpus.count, "gpu_type": gpu_type_of(gpus), "gpu_mem_gib": mem,
           "cpus_per_node": max(_cpu_cores(), gpus.count)}
    host = _host_mem_gib()
    if host:
        out["mem_gib_per_node"] = host
    out["description"] = (f"this machine: {gpus.count}x {gpus.name} ({mem} GiB, found by {gpus.source}), one rank per GPU "
                          "(NCCL) under torchrun; found at load, so renders differ from a CPU machine's")
    return out
