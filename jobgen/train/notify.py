"""Notifications from the entrypoint: ``started``, ``requeued``, ``finished``, ``failed``.

The spec's ``notify:`` (:class:`jobgen.specs.training.NotifySpec`) names a webhook (a JSON body POSTed
with :mod:`urllib.request`, stdlib only) and/or a command (argv, the JSON body on stdin). Only
global rank zero sends. Every attempt is bounded by ``notify.timeout_s`` and retried once; a
failed notification prints one warning on stderr and never fails or stops training.

When each event is sent:

- ``started``: at the start of training (``on_train_start``), on every (re)start; in a
  background thread, so the training loop does not wait for it.
- ``requeued``: after SLURM accepted ``scontrol requeue`` (:class:`RequeueOnSignal` calls
  :meth:`NotifyCallback.requeued`; SLURM's SIGTERM is held back until the notification went out).
- ``finished``: after ``summary.json`` is written (max_steps reached).
- ``failed``: the entrypoint raised, or training stopped before max_steps
  (:func:`notify_failure`, called by ``jobgen.train.__main__``). Not sent when the job requeued
  itself, and not on SIGTERM (``scancel``, pre-emption, time limit): SLURM may requeue the job
  then, and its next start sends ``started`` with ``restart`` > 0.

The body (:meth:`Notifier.body`), one JSON object::

    {"event": "finished", "job": "quickstart", "handle": "slurm://a100/4242", "step": 1000,
     "max_steps": 1000, "train_loss": 1.71, "val_loss": 1.76, "gpu_hours": 2.13,
     "time": "2025-01-31T12:00:00Z", "host": "gpu-017", "run_dir": "/shared/runs/quickstart",
     "profile": "slurm-a100", "restart": 0, "error": null}

``handle``: ``slurm://<cluster>/<SLURM_JOB_ID>`` on SLURM (an array task:
``<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>``), ``local://<run dir>`` for a local run,
``null`` on Kubernetes (a pod does not know the kubeconfig context of its handle). ``gpu_hours``:
GPUs (world size) x the wall time of this process so far, on GPU jobs; ``null`` on CPU. Losses
are the latest logged values (``null`` before the first). ``error``: one line, ``failed`` only.

The entrypoint imports this module (and so Lightning) only for specs with ``notify``.
"""

from __future__ import annotations

import datetime
import json
import os
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

from lightning.pytorch import Callback

from jobgen import __version__
from jobgen.reports.usage import run_usage
from jobgen.specs.capabilities import capabilities
from jobgen.specs.training import NotifySpec

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


def job_handle(resolved: ResolvedSpec, run_dir: Path, environ: Mapping[str, str] = os.environ) -> str | None:
    """The job's handle as ``jobgen submit`` printed it, when the node can tell (see the module doc)."""
    launch = resolved.launch
    caps = capabilities(launch.scheduler)
    if caps.slurm_allocation and environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        # one task of a job array: the task's own handle (its SLURM_JOB_ID is not what submit printed)
        return f"{caps.handle_scheme}://{launch.cluster or 'default'}/{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    if caps.slurm_allocation and environ.get("SLURM_JOB_ID"):
        return f"{caps.handle_scheme}://{launch.cluster or 'default'}/{environ['SLURM_JOB_ID']}"
    if caps.job_dir_is_run_dir:
        return f"{caps.handle_scheme}://{run_dir}"
    return None


def _restart_count(environ: Mapping[str, str]) -> int:
    for key in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        value = environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def _warn(text: str) -> None:
    print(f"jobgen.train: warning: {text}", file=sys.stderr, flush=True)


class Notifier:
    """Builds the JSON body and delivers it to the spec's webhook and/or command.

    Args:
        spec: the spec's ``notify`` section.
        resolved: the resolved spec (job name, profile, scheduler, world size, accelerator).
        run_dir: the run directory (absolute).
        environ: where the token (``token_env``), the URL (``url_env``) and the SLURM job id
            are read from, at send time.
        started: process start (epoch seconds), for ``gpu_hours``.
    """

    def __init__(self, spec: NotifySpec, resolved: ResolvedSpec, run_dir: Path,
                 environ: Mapping[str, str] = os.environ, started: float | None = None):
        self.spec = spec
        self.resolved = resolved
        self.run_dir = run_dir
        self.environ = environ
        self.started = process_start_time() if started is None else started
        self._threads: list[threading.Thread] = []

    def body(self, event: str, *, step: int | None = None, train_loss: float | None = None,
             val_loss: float | None = None, error: str | None = None) -> dict[str, Any]:
        """The JSON object sent for ``event`` (keys in a fixed order; see the module doc)."""
        launch = self.resolved.launch
        now = time.time()
        used = run_usage(launch.accelerator, launch.world_size, now - self.started)
        gpu_hours = round(used.device_hours or 0.0, 6) if used.device_kind == "gpu" else None
        return {
            "event": event,
            "job": self.resolved.spec.name,
            "handle": job_handle(self.resolved, self.run_dir, self.environ),
            "step": step,
            "max_steps": self.resolved.spec.trainer.max_steps,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "gpu_hours": gpu_hours,
            "time": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "host": socket.gethostname(),
            "run_dir": str(self.run_dir),
            "profile": self.resolved.profile,
            "restart": _restart_count(self.environ),
            "error": error,
        }

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
            _warn(f"notification {event!r} not sent: {type(exc).__name__}: {exc}")
            return False
        ok = True
        if self.spec.webhook is not None:
            ok &= self._deliver(event, "webhook", lambda: self._post(payload))
        if self.spec.command is not None:
            ok &= self._deliver(event, f"command {self.spec.command[0]}", lambda: self._run(payload))
        return ok

    def send_in_background(self, event: str, **fields: Any) -> None:
        """:meth:`send` in a daemon thread (the training loop goes on); :meth:`wait` joins it."""
        if not self.wants(event):
            return
        thread = threading.Thread(target=self.send, args=(event,), kwargs=fields, name=f"jobgen-notify-{event}", daemon=True)
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
        _warn(f"notification {event!r} to the {target} failed twice ({' '.join(problem.split())}); training is not affected")
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


def _metric(metrics: Mapping[str, Any], name: str) -> float | None:
    value = metrics.get(name)
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def make_notifier(resolved: ResolvedSpec, run_dir: Path, environ: Mapping[str, str] = os.environ) -> Notifier | None:
    """The :class:`Notifier` of this process: global rank zero of a spec with ``notify``; else None."""
    if resolved.spec.notify is None or global_rank(environ) != 0:
        return None
    return Notifier(resolved.spec.notify, resolved, run_dir, environ)


class NotifyCallback(Callback):
    """Sends ``started`` when training starts; :meth:`requeued`, :meth:`finished` for the other
    events (called by RequeueOnSignal and the entrypoint). Keeps the trainer, so that a failure
    notification carries the step and losses reached (:func:`notify_failure`).

    Args:
        notifier: rank zero's notifier (every other rank keeps none and sends nothing).
    """

    #: The callback of the running trainer in this process, for :func:`notify_failure`.
    active: NotifyCallback | None = None

    def __init__(self, notifier: Notifier):
        self.notifier = notifier
        self.trainer: Any = None
        self.sent_requeued = False

    def state(self) -> dict[str, Any]:
        """Step and latest losses of the trainer (nothing before training started)."""
        trainer = self.trainer
        if trainer is None:
            return {}
        metrics = trainer.callback_metrics
        return {"step": trainer.global_step, "train_loss": _metric(metrics, "train_loss"), "val_loss": _metric(metrics, "val_loss")}

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Remember the trainer (for the step and losses of later events)."""
        self.trainer = trainer
        NotifyCallback.active = self

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """``started``, in the background (the first step does not wait for the webhook)."""
        self.notifier.send_in_background("started", **self.state())

    def requeued(self, step: int) -> None:
        """``requeued`` at ``step`` (rank zero, after ``scontrol requeue`` succeeded)."""
        self.notifier.wait()
        self.sent_requeued = True
        self.notifier.send("requeued", **{**self.state(), "step": step})

    def finished(self) -> None:
        """``finished``, with the final step and validation loss."""
        self.notifier.wait()
        self.notifier.send("finished", **self.state())


def notify_failure(resolved: ResolvedSpec | None, run_dir: Path | None, error: str) -> None:
    """Send ``failed`` from global rank zero (the entrypoint's error path); never raises.

    Uses the running trainer's step and losses when training had started. Nothing is sent
    without a spec (it could not be read), without ``notify``, on other ranks, or when the job
    had requeued itself.
    """
    try:
        callback = NotifyCallback.active
        if callback is not None:
            if callback.sent_requeued:
                return
            callback.notifier.wait()
            callback.notifier.send("failed", **callback.state(), error=error)
            return
        if resolved is None or run_dir is None:
            return
        notifier = make_notifier(resolved, run_dir)
        if notifier is not None:
            notifier.send("failed", error=error)
    except Exception as exc:  # noqa: BLE001 - a notification never fails (or masks) the real error
        _warn(f"notification 'failed' not sent: {type(exc).__name__}: {exc}")


def notify_callback(resolved: ResolvedSpec, run_dir: Path) -> NotifyCallback | None:
    """The callback for ``build_trainer``: on global rank zero of a spec with ``notify``; else None."""
    notifier = make_notifier(resolved, run_dir)
    return None if notifier is None else NotifyCallback(notifier)


def notify_finished(trainer: Any) -> None:
    """Send ``finished`` through the trainer's :class:`NotifyCallback`, if it has one (rank zero)."""
    for callback in trainer.callbacks:
        if isinstance(callback, NotifyCallback):
            callback.finished()
