"""Job-array tasks in SLURM's job-completion log, for clusters without accounting (no slurmdbd).

With ``JobCompType=jobcomp/filetxt`` slurmctld appends one line per ended job to ``JobCompLoc``:
space-separated ``Key=Value`` pairs starting with ``JobId=<id>``; a task of a job array adds
`` ArrayJobId=<array> ArrayTaskId=<task>`` (``src/plugins/jobcomp/filetxt/jobcomp_filetxt.c``,
the same from SLURM 22.05 through 25.05). ``sacct -c`` reads that file but not those two keys (it
warns "Unknown type ArrayJobId" and lists each task under its own job id only;
``filetxt_jobcomp_process.c``), so it cannot answer "the tasks of array N". This module reads
the map task -> job id from the file; the SLURM backend then reads each job's row with
``sacct -c --jobs <ids>``, exactly as for a single job.

Each task SLURM started has its own job id: a new one, except the last task to start, which
keeps the array's. Tasks that never started (the array cancelled while they waited) stay in the
array's own record, which is logged once without ``ArrayJobId`` / ``ArrayTaskId``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: The job-completion plugin whose log this module reads.
FILETXT = "jobcomp/filetxt"


@dataclass(frozen=True)
class ArrayInLog:
    """What the job-completion log says of one job array.

    Attributes:
        tasks: task id -> the job id of its latest line (a requeued task is logged once per run).
        own_record: the array's own record (the tasks that never started) was logged.
    """

    tasks: dict[int, int]
    own_record: bool


def completion_log(show_config: str) -> tuple[str, str]:
    """``(JobCompType, JobCompLoc)`` from ``scontrol show config`` (``Key = value`` lines);
    ``""`` for a key it does not print."""
    found = dict.fromkeys(("JobCompType", "JobCompLoc"), "")
    for line in show_config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in found:
            found[key.strip()] = value.strip()
    return found["JobCompType"], found["JobCompLoc"]


def array_in_log(lines: Iterable[str], array_id: int) -> ArrayInLog:
    """The lines of array ``array_id`` among ``lines`` of a jobcomp/filetxt log (later lines win)."""
    task_re = re.compile(rf"^JobId=(\d+) .* ArrayJobId={array_id} ArrayTaskId=(\d+) ")
    own_prefix = f"JobId={array_id} "
    tasks: dict[int, int] = {}
    own = False
    for line in lines:
        match = task_re.match(line)
        if match is not None:
            tasks[int(match.group(2))] = int(match.group(1))
        elif line.startswith(own_prefix) and " ArrayTaskId=" not in line:
            own = True
    return ArrayInLog(tasks, own)


def read_array(path: Path, array_id: int) -> ArrayInLog:
    """:func:`array_in_log` over the file ``path``, read line by line (a site's log grows large).

    Raises:
        OSError: the file cannot be read here (missing, permissions, on another host).
    """
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        return array_in_log(fh, array_id)
