"""The preflight's GPU health check: one ``nvidia-smi`` query per node before training.

A GPU that lost memory to uncorrectable ECC errors, that waits for a reset to retire pages or
remap rows, or that is missing from the node makes the job fail later, often as an NCCL error
or a hang on another rank. The check fails first, naming the node and the GPU, with the exit
code of an infrastructure failure (:data:`jobgen.reports.failure_class.EXIT_INFRASTRUCTURE`,
200): on SLURM the restart budget then requeues the job and excludes the node.

The query (nvidia-smi(1), ``--query-gpu``; field names as ``nvidia-smi --help-query-gpu`` lists
them)::

    nvidia-smi --query-gpu=index,name,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending \
        --format=csv,noheader,nounits

A GPU fails when its uncorrectable ECC count since the driver loaded is above 0, or when a page
retirement or a row remapping is pending (``Yes``: the GPU needs a reset for it to take effect;
NVIDIA's "Dynamic Page Retirement" and "A100 GPU Memory Error Management" guides). A field the
GPU does not report (``[N/A]``, ``[Not Supported]``) is not a failure. A driver that does not
know the newer fields (``is not a valid field to query``) is asked again without the pending
ones. The node fails when it shows fewer GPUs than the profile gives it
(``launch.devices_per_node``), when nvidia-smi fails or hangs, or when its output cannot be
read. nvidia-smi not installed is no failure: the check says it was skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from jobgen.errors import JobgenError, printable
from jobgen.reports.failure_class import EXIT_INFRASTRUCTURE

#: The fields queried, in order (nvidia-smi --help-query-gpu).
FIELDS = ("index", "name", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "remapped_rows.pending")
#: The fields an older driver may not know; asked for only when it does.
PENDING_FIELDS = FIELDS[3:]
#: What nvidia-smi prints for a value the GPU does not report.
NOT_REPORTED = frozenset({"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""})
#: How long nvidia-smi may take (seconds); longer is a sick driver.
TIMEOUT_S = 60.0
#: The longest output text shown in an error.
SHOWN_CHARS = 200


class GPUHealthError(JobgenError):
    """A GPU of this node failed the preflight's check (or the node's GPUs could not be read):
    an infrastructure failure, exit 200 (the restart budget retries it elsewhere)."""

    exit_code = EXIT_INFRASTRUCTURE


@dataclass(frozen=True)
class GPU:
    """One row of the query: ``index`` and ``name`` as printed; ``ecc`` the uncorrectable
    volatile count (None: not reported); ``retired_pending`` / ``remap_pending`` (None: not
    reported or not asked)."""

    index: str
    name: str
    ecc: int | None
    retired_pending: bool | None
    remap_pending: bool | None

    def problems(self) -> list[str]:
        """What is wrong with this GPU, one phrase each (empty: healthy)."""
        out = []
        if self.ecc:
            out.append(f"{self.ecc} uncorrectable ECC error(s) since the driver loaded")
        if self.retired_pending:
            out.append("a page retirement is pending (the GPU needs a reset)")
        if self.remap_pending:
            out.append("a row remapping is pending (the GPU needs a reset)")
        return out


def _shown(text: str) -> str:
    shown = printable(text.strip())
    return shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS - 3] + "..."


def _yes_no(value: str, field: str, line: str) -> bool | None:
    if value in NOT_REPORTED:
        return None
    if value in ("Yes", "No"):
        return value == "Yes"
    raise ValueError(f"{field} is {_shown(value)!r}, not Yes or No, in {_shown(line)!r}")


def parse_gpus(text: str, fields: tuple[str, ...] = FIELDS) -> list[GPU]:
    """The GPUs in nvidia-smi's CSV output (``--format=csv,noheader,nounits``) of ``fields``.

    Raises:
        ValueError: a line with another number of values, an index or count that is not a
            whole number, a Yes/No field with another word (the message shows the line, printable).
    """
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [value.strip() for value in line.split(",")]
        if len(values) != len(fields):
            raise ValueError(f"{len(values)} values where {len(fields)} were asked for in {_shown(line)!r}")
        row = dict(zip(fields, values, strict=True))
        if not row["index"].isdigit():
            raise ValueError(f"index {_shown(row['index'])!r} is not a number in {_shown(line)!r}")
        ecc_text = row["ecc.errors.uncorrected.volatile.total"]
        if ecc_text not in NOT_REPORTED and not (ecc_text.isascii() and ecc_text.isdigit()):
            raise ValueError(f"the ECC count {_shown(ecc_text)!r} is not a number in {_shown(line)!r}")
        gpus.append(GPU(row["index"], row["name"], None if ecc_text in NOT_REPORTED else int(ecc_text),
                        _yes_no(row["retired_pages.pending"], "retired_pages.pending", line) if "retired_pages.pending" in row else None,
                        _yes_no(row["remapped_rows.pending"], "remapped_rows.pending", line) if "remapped_rows.pending" in row else None))
    return gpus


Runner = Callable[[list[str]], "subprocess.CompletedProcess[bytes]"]


def _run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, check=False)


def check_gpus(expected: int, host: str, environ: Mapping[str, str] = os.environ, run: Runner = _run) -> str:
    """Check this node's GPUs; returns the line to print (``preflight: GPUs on <host>: 8 x
    NVIDIA H100 ok``, or why the check was skipped).

    Args:
        expected: GPUs the profile gives each node (``launch.devices_per_node``).
        host: this node's name, for the messages.
        environ: where ``PATH`` (to find nvidia-smi) comes from.
        run: runs nvidia-smi (tests pass their own).

    Raises:
        GPUHealthError: a GPU failed (named by node, index and name), the node shows fewer
            GPUs than ``expected``, or nvidia-smi failed, hung or printed what cannot be read.
    """
    where = f"node {printable(host)}"
    binary = shutil.which("nvidia-smi", path=environ.get("PATH", os.defpath))
    if binary is None:
        return f"preflight: GPU check on {where} skipped: nvidia-smi is not on PATH"
    fields = FIELDS
    for attempt in range(2):
        argv = [binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        try:
            proc = run(argv)
        except subprocess.TimeoutExpired:
            raise GPUHealthError(f"preflight: nvidia-smi on {where} did not answer within {TIMEOUT_S:g} s (a hung GPU driver?)",
                                 hint="check the node's GPUs (nvidia-smi, dmesg Xid lines); the job avoids the node on a restart") from None
        except OSError as exc:
            raise GPUHealthError(f"preflight: nvidia-smi on {where} could not run: {_shown(str(exc))}",
                                 hint="check the node's NVIDIA driver installation") from None
        text = proc.stdout.decode("utf-8", errors="replace")
        said = _shown((proc.stdout + proc.stderr).decode("utf-8", errors="replace"))
        if proc.returncode != 0 and attempt == 0 and "is not a valid field to query" in said:
            fields = FIELDS[:3]  # a driver older than the pending fields
            continue
        if proc.returncode != 0:
            raise GPUHealthError(f"preflight: nvidia-smi on {where} exited {proc.returncode}: {said or '(no output)'}",
                                 hint="the node's GPUs or driver are not usable (nvidia-smi, dmesg Xid lines)")
        break
    try:
        if "\ufffd" in text:
            raise ValueError(f"the output is not UTF-8: {_shown(text)!r}")
        gpus = parse_gpus(text, fields)
    except ValueError as exc:
        raise GPUHealthError(f"preflight: nvidia-smi's output on {where} cannot be read: {exc}",
                             hint="run the query by hand on the node (docs/failures.md, GPU check)") from None
    failed = [f"GPU {printable(gpu.index)} ({_shown(gpu.name)}): {'; '.join(gpu.problems())}" for gpu in gpus if gpu.problems()]
    if failed:
        raise GPUHealthError(f"preflight: {where}: " + ", ".join(failed),
                             hint="the GPU needs a reset or a repair; the job avoids the node on a restart")
    if len(gpus) < expected:
        raise GPUHealthError(f"preflight: {where} shows {len(gpus)} GPU(s), the profile gives each node {expected}",
                             hint="a GPU is missing (fallen off the bus?) or hidden from the job; check nvidia-smi on the node")
    names = sorted({_shown(gpu.name) for gpu in gpus})
    skipped = "" if fields == FIELDS else " (this driver reports no pending retirements or remappings)"
    return f"preflight: GPUs on {where}: {len(gpus)} x {', '.join(names)} ok{skipped}"
