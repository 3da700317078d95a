"""Callables for tests/integration/slurm/test_submitit_on_lab.py, in a module of their own: submitit
pickles them by reference, so the lab's nodes import this module (``PYTHONPATH`` = the repository,
exported by sbatch), which imports nothing but the standard library and submitit."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from submitit.helpers import Checkpointable


def where_am_i(a: int, b: int) -> dict:
    """``a * b`` plus where it ran: the node, the SLURM job id, the environment jobgen set; prints
    one line (the job's stdout, what ``jobgen logs`` shows)."""
    print(f"where_am_i: {a} x {b} on {socket.gethostname()}", flush=True)
    return {"product": a * b, "host": socket.gethostname(), "job_id": os.environ.get("SLURM_JOB_ID"),
            "preempt_signal": os.environ.get("SUBMITIT_PREEMPT_SIGNAL"), "omp_threads": os.environ.get("OMP_NUM_THREADS")}


class Countdown(Checkpointable):
    """Counts to ``steps``. The first run stops half-way and writes ``ready``, then waits for the
    test's signal: submitit's handler checkpoints this object (``done`` included), requeues the job
    and exits; the requeued run continues from the checkpointed ``done``."""

    def __init__(self, steps: int, ready: str):
        self.steps, self.ready, self.done = steps, ready, 0

    def __call__(self) -> dict:
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        resumed_at = self.done
        while self.done < self.steps:
            self.done += 1
            if restart == 0 and self.done == self.steps // 2:
                Path(self.ready).write_text(str(os.getpid()))
                time.sleep(120)  # the signal ends this run inside the sleep
        return {"resumed_at": resumed_at, "done": self.done, "restart": restart}
