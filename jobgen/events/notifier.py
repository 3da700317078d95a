"""Sending one notification (the spec's ``notify:``): the JSON body and its delivery to the
webhook and/or the command. Standard library only (no torch, no Lightning), so that jobgen itself
sends the events it decides on the machine that runs it: ``restart`` from a local run
(:mod:`jobgen.backends.local`) and from the ssh restart watcher (:mod:`jobgen.backends.ssh.restart`).
Where the restart is decided with no notifier at hand (the SLURM batch script, training-operator
on Kubernetes), the decider leaves a record (:data:`RESTART_RECORD_ENV`) and the restarted run's
rank zero sends ``restart`` at its start (:func:`restart_of_this_start`).
The entrypoint's events and the body's fields: :mod:`jobgen.train.notify`.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen import __version__
from jobgen.jobdir.files import NODE_TAG, SSH_JOB_ENV
from jobgen.reports.usage import run_usage
from jobgen.specs.capabilities import capabilities
from jobgen.specs.notify import NotifySpec

if TYPE_CHECKING:
    from jobgen.jobdir.spec import ResolvedSpec

#: Seconds between the first attempt and the retry.
RETRY_DELAY_S = 1.0
#: Set when the module is imported; the fallback for the process start time (see :func:`process_start_time`).
_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """When this process started (epoch seconds): from /proc on Linux, else when this module was imported."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22: starttime, in clock ticks after boot
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


def global_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's global rank from the launcher's environment (torchrun ``RANK``, srun
    ``SLURM_PROCID``), 0 for a single process. Used before (or without) Lightning."""
    for key in ("RANK", "SLURM_PROCID"):
        value = environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


#: A job's tag on hosts over ssh (:data:`jobgen.jobdir.files.SSH_JOB_ENV`, written by
#: :func:`jobgen.backends.ssh.launch.job_tag`): ``ssh://<first host><run dir>#node-<rank>``. The
#: host holds no blank (the profile refuses one); the run directory starts with ``/`` and holds no
#: line break or NUL (:func:`jobgen.specs.base.check_shell_safe`), nor a lone surrogate (what
#: ``os.environ`` makes of bytes that are not UTF-8: no profile writes those).
_HOST_TAG_RE = r"({scheme}://[^/\s\ud800-\udfff]+/[^\n\r\x00\ud800-\udfff]*)" + re.escape(NODE_TAG) + "[0-9]+"


def job_handle(resolved: ResolvedSpec, run_dir: Path, environ: Mapping[str, str] = os.environ) -> str | None:
    """The job's handle as ``jobgen submit`` printed it, when the node can tell (see the module
    doc); ``None`` where it cannot: on Kubernetes, and on hosts over ssh when the job's tag
    (:data:`~jobgen.jobdir.files.SSH_JOB_ENV`) is missing or not of :data:`_HOST_TAG_RE`'s shape."""
    launch = resolved.launch
    caps = capabilities(launch.scheduler)
    if caps.fixed_hosts:  # hosts of the profile's list: the launcher tags every process of the job
        tag = re.fullmatch(_HOST_TAG_RE.format(scheme=re.escape(caps.handle_scheme)), environ.get(SSH_JOB_ENV, ""))
        return tag.group(1) if tag else None
    if caps.slurm_allocation and environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        # one task of a job array: the task's own handle (its SLURM_JOB_ID is not what submit printed)
        return f"{caps.handle_scheme}://{launch.cluster or 'default'}/{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    if caps.slurm_allocation and environ.get("SLURM_JOB_ID"):
        return f"{caps.handle_scheme}://{launch.cluster or 'default'}/{environ['SLURM_JOB_ID']}"
    if caps.job_dir_is_run_dir:
        return f"{caps.handle_scheme}://{run_dir}"
    return None


#: The restarts before this start, where jobgen counts them: a local run's (:mod:`jobgen.backends.local`
#: sets it for every start), a Kubernetes pod's (:mod:`jobgen.train.launch`, from its ledger) and
#: hosts over ssh restarted by the watcher (:func:`jobgen.backends.ssh.launch.start_command`, set on a
#: restart only); read ahead of the scheduler's count for the body's ``restart``.
RESTART_COUNT_ENV = "JOBGEN_RESTART_COUNT"
#: The most characters of a restart's reason a ``restart`` body carries (the rest is cut, ``...`` added).
REASON_CHARS = 1000


def restart_count(environ: Mapping[str, str]) -> int:
    """The restarts before this start: :data:`RESTART_COUNT_ENV`, else SLURM's
    ``SLURM_RESTART_COUNT`` (every requeue of the job), else torchrun's
    ``TORCHELASTIC_RESTART_COUNT`` (its restarts of the worker group); 0 when none is a count."""
    for key in (RESTART_COUNT_ENV, "SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        value = environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


#: A run's restart records where jobgen's own process does not decide its restarts: the path of a
#: JSON-lines file, one object per restart (``restart``, ``class``, ``reason``, ``exit_code``, ``at``),
#: oldest first, that the decider appends to before the job starts again (the SLURM batch script,
#: templates/slurm/job.sbatch.j2; on Kubernetes, :func:`jobgen.train.launch.record_restart`). Set for every start.
RESTART_RECORD_ENV = "JOBGEN_RESTART_RECORD"
#: The most bytes of a restart record file read (the records of 100 restarts take a few KiB).
RECORD_BYTES = 1 << 20


def read_restart_records(path: str | Path) -> list[dict[str, Any]]:
    """The restart records in ``path`` (:data:`RESTART_RECORD_ENV`), oldest first: each line a JSON
    object with a whole ``restart`` from 1 (its number), ``class`` and ``reason`` strings; a line
    that is not one (cut off, another format, non-UTF-8 bytes) is left out, and a file that cannot
    be read gives none. At most :data:`RECORD_BYTES` are read. Never raises."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(RECORD_BYTES)
    except (OSError, ValueError):
        return []
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        number = doc.get("restart") if isinstance(doc, dict) else None
        if isinstance(number, int) and not isinstance(number, bool) and number >= 1 \
                and isinstance(doc.get("class"), str) and isinstance(doc.get("reason"), str):
            records.append(doc)
    return records


def restart_of_this_start(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The restart record of this start, where the restart was decided outside jobgen's own
    process: the last record in :data:`RESTART_RECORD_ENV`'s file when its number is this start's
    :func:`restart_count` (> 0). None on a first start, without the variable, or when the count
    moved on without a record (SLURM counts a requeue after its time-limit signal too)."""
    path = environ.get(RESTART_RECORD_ENV, "")
    count = restart_count(environ)
    if not path or count < 1:
        return None
    records = read_restart_records(path)
    return records[-1] if records and records[-1]["restart"] == count else None


def warn(text: str, prog: str = "jobgen.train") -> None:
    """One warning line on stderr, ``<prog>: warning: <text>``."""
    print(f"{prog}: warning: {text}", file=sys.stderr, flush=True)


def restart_fields(entry: Mapping[str, Any], max_restarts: int) -> dict[str, Any]:
    """The keys a ``restart`` body adds to the others, from one restart's record
    (:func:`jobgen.reports.attempts.restart_entry`: ``restart``, ``class``, ``reason``):
    ``class``, ``reason`` (one string, at most :data:`REASON_CHARS` characters), ``restarts_used``
    (this restart's number) and ``max_restarts`` (the budget). A value of the wrong type becomes
    ``None`` (a record read from a file is not trusted)."""
    number = entry.get("restart")
    cls = entry.get("class")
    reason = entry.get("reason")
    if isinstance(reason, str) and len(reason) > REASON_CHARS:
        reason = reason[:REASON_CHARS - 3] + "..."
    return {"class": cls if isinstance(cls, str) else None, "reason": reason if isinstance(reason, str) else None,
            "restarts_used": number if isinstance(number, int) and not isinstance(number, bool) else None,
            "max_restarts": max_restarts}


class Notifier:
    """Builds the JSON body and delivers it to the spec's webhook and/or command.

    Args:
        spec: the spec's ``notify`` section.
        resolved: the resolved spec (job name, profile, scheduler, world size, accelerator).
        run_dir: the run directory (absolute).
        environ: where the token (``token_env``), the URL (``url_env``) and the SLURM job id
            are read from, at send time.
        started: process start (epoch seconds), for ``gpu_hours``.
        handle: the body's ``handle`` when the sender knows it (the ssh watcher); None: found from
            the environment (:func:`job_handle`).
        prog: the name its warnings start with.
    """

    def __init__(self, spec: NotifySpec, resolved: ResolvedSpec, run_dir: Path | str,
                 environ: Mapping[str, str] = os.environ, started: float | None = None, *, handle: str | None = None,
                 prog: str = "jobgen.train"):
        self.spec = spec
        self.handle = handle
        self.prog = prog
        self.resolved = resolved
        self.run_dir = run_dir
        self.environ = environ
        self.started = process_start_time() if started is None else started
        self._threads: list[threading.Thread] = []

    def body(self, event: str, *, step: int | None = None, train_loss: float | None = None,
             val_loss: float | None = None, error: str | None = None, restart: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON object sent for ``event`` (keys in a fixed order; see :mod:`jobgen.train.notify`).
        ``restart``: a ``restart`` event's added keys (:func:`restart_fields`); its number is the body's ``restart``."""
        launch = self.resolved.launch
        now = time.time()
        used = run_usage(launch.accelerator, launch.world_size, now - self.started)
        gpu_hours = round(used.device_hours or 0.0, 6) if used.device_kind == "gpu" else None
        doc = {
            "event": event,
            "job": self.resolved.spec.name,
            "handle": self.handle if self.handle is not None else job_handle(self.resolved, Path(self.run_dir), self.environ),
            "step": step,
            "max_steps": self.resolved.spec.trainer.max_steps,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "gpu_hours": gpu_hours,
            "time": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "host": socket.gethostname(),
            "run_dir": str(self.run_dir),
            "profile": self.resolved.profile,
            "restart": restart_count(self.environ),
            "error": error,
        }
        if restart is not None:
            if isinstance(restart.get("restarts_used"), int):
                doc["restart"] = restart["restarts_used"]
            doc |= {k: restart.get(k) for k in ("class", "reason", "restarts_used", "max_restarts")}
        return doc

    def wants(self, event: str) -> bool:
        """Whether ``notify.events`` lists ``event``."""
        return event in self.spec.events

    def send(self, event: str, **fields: Any) -> bool:
        """Deliver ``event`` now (webhook, then command); True when every target took it. Never raises."""
        if not self.wants(event):
            return True
        try:
            payload = json.dumps(self.body(event, **fields)).encode()
        except Exception as exc:  # noqa: BLE001 - a notification never fails training
            warn(f"notification {event!r} not sent: {type(exc).__name__}: {exc}", self.prog)
            return False
        ok = True
        if self.spec.webhook is not None:
            ok &= self._deliver(event, "webhook", lambda: self._post(payload))
        if self.spec.command is not None:
            ok &= self._deliver(event, f"command {self.spec.command[0]}", lambda: self._run(payload))
        return ok

    def send_restart(self, entry: Mapping[str, Any], max_restarts: int, *, step: int | None = None) -> bool:
        """Send ``restart`` for one restart's record (:func:`restart_fields`) now; never raises."""
        try:
            fields = restart_fields(entry, max_restarts)
        except Exception as exc:  # noqa: BLE001 - a notification never fails the run
            warn(f"notification 'restart' not sent: {type(exc).__name__}: {exc}", self.prog)
            return False
        return self.send("restart", step=step, restart=fields)

    def send_in_background(self, event: str, **fields: Any) -> None:
        """:meth:`send` in a daemon thread (the training loop goes on); :meth:`wait` joins it."""
        if not self.wants(event):
            return
        thread = threading.Thread(target=self.send, args=(event,), kwargs=fields, name=f"jobgen-notify-{event}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def send_in_order_in_background(self, *events: tuple[str, dict[str, Any]]) -> None:
        """``(event, fields)`` pairs sent one after the other (:meth:`send`) in one daemon thread."""
        wanted = [(event, fields) for event, fields in events if self.wants(event)]
        if not wanted:
            return
        thread = threading.Thread(target=lambda: [self.send(event, **fields) for event, fields in wanted],
                                  name="jobgen-notify-" + "-".join(e for e, _ in wanted), daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self) -> None:
        """Wait (bounded: two attempts each) for notifications still being sent in the background."""
        limit = 2 * self.spec.timeout_s + RETRY_DELAY_S + 1.0
        for thread in self._threads:
            thread.join(limit)
        self._threads = [t for t in self._threads if t.is_alive()]

    def _deliver(self, event: str, target: str, attempt: Any) -> bool:
        problem = ""
        for number in (1, 2):
            try:
                problem = attempt()
            except Exception as exc:  # noqa: BLE001 - a notification never fails training
                problem = f"{type(exc).__name__}: {exc}"
            if not problem:
                return True
            if number == 1:
                time.sleep(RETRY_DELAY_S)
        warn(f"notification {event!r} to the {target} failed twice ({' '.join(problem.split())}); training is not affected", self.prog)
        return False

    def _post(self, payload: bytes) -> str:
        """One POST; returns "" on a 2xx answer, else what went wrong (never the token or a secret URL)."""
        hook = self.spec.webhook
        assert hook is not None
        url = hook.url if hook.url is not None else self.environ.get(hook.url_env or "", "")
        if not url:
            return f"${hook.url_env} (url_env) is not set on this node"
        headers = {"Content-Type": "application/json", "User-Agent": f"jobgen/{__version__}"}
        if hook.token_env is not None:
            token = self.environ.get(hook.token_env, "")
            if not token:
                return f"${hook.token_env} (token_env) is not set on this node"
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.spec.timeout_s) as response:  # noqa: S310 - http(s) checked by the spec
                response.read(65536)
                return "" if 200 <= response.status < 300 else f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code} {exc.reason}"
        except urllib.error.URLError as exc:
            return f"cannot reach the URL ({exc.reason})"
        except (TimeoutError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def _run(self, payload: bytes) -> str:
        argv = list(self.spec.command or ())
        try:
            result = subprocess.run(argv, input=payload, capture_output=True, timeout=self.spec.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return f"{argv[0]} did not finish within {self.spec.timeout_s:g} s"
        except OSError as exc:
            return f"cannot run {argv[0]}: {exc.strerror or exc}"
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).decode(errors="replace").strip()[-300:]
            return f"{argv[0]} exited {result.returncode}" + (f": {detail}" if detail else "")
        return ""
