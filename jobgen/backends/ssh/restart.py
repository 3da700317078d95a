"""The restart budget of a job on hosts over ssh: a watcher on the machine that submitted it.

The hosts have no scheduler and need not reach each other over ssh, so the one place that sees
every node and can start them again is the machine ``jobgen submit`` ran on. When the spec has
a budget (``restart.max_restarts`` > 0), ``jobgen submit`` starts this watcher
(``python -m jobgen.backends.ssh.restart``) in a session of its own after the launch; it asks the
hosts every :data:`POLL_S` seconds how the job goes (:func:`jobgen.backends.ssh.backend.reports`).

When every node has ended and one failed (or a launch ended without an exit code), it reads the
end of each node's output of that attempt (from launch.sh's start line on), classes the failure
(:func:`jobgen.reports.failure_class.classify` over each rank's first failure, torchrun's report
and each node's exit code, :func:`node_evidence`) and, for a retried class (infrastructure or
unknown) while restarts used < the budget, starts the job again on every host: whatever of it
is left is killed, and the launch is started as ``jobgen submit`` started it (same run
directory, so ``checkpoint.resume: auto`` resumes from the newest checkpoint), with
``JOBGEN_RESTART_COUNT`` set to the restart's number (the ``restart`` of the entrypoint's
notifications, as on a local run). A user failure is never restarted.

Resume across hosts: each rank reads checkpoints from its own host's run directory. When the
run directory is not shared (node 0's output file is not seen from the other hosts), the watcher
copies node 0's ``checkpoints/`` to every other host before a restart (through this machine), so
every rank resumes from the step global rank 0 saved. A sharded checkpoint (each host writes its
ranks' shards) needs a shared run directory.

What it decided goes to :data:`RESTARTS_FILE` in the job directory (``jobgen status`` reads it:
``restarts_used``, ``restart_<n>``, the last attempt's evidence) and, once the job completes, to
node 0's ``summary.json`` (``restarts``), as a local run records them. The record says done only
after that write, and while this watcher runs ``jobgen status`` reports the job ended only once
the record says done. Each restart also goes to the spec's ``notify`` targets as a ``restart``
event, sent from this machine (with its environment's token and URL variables) before the hosts
start again. The watcher ends when the job completes, fails for good, or is cancelled
(``jobgen cancel`` stops it first). If this machine stops, the job runs on without restarts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jobgen.backends.ssh.launch import DONE, MODULE, RESTARTING, RESTARTS_FILE, WATCHING
from jobgen.errors import JobgenError, printable
from jobgen.jobdir.files import SUMMARY_FILE, write_atomic
from jobgen.reports.attempts import restart_entry, torchrun_evidence, with_restarts
from jobgen.reports.failure_class import Classification, Evidence, classify, unclassified

#: Seconds between two looks at the hosts.
POLL_S = 2.0
#: Seconds the hosts may stay unreached (all of them, or the job's state unknown) before the watcher gives up.
UNREACHED_LIMIT_S = 600.0


def node_evidence(rank: int, host: str, output: str, exit_code: int | None, launch_line: str) -> list[Evidence]:
    """How node ``rank``'s last attempt ended: its output from the last line starting with
    ``launch_line`` (launch.sh's start line) on, as :func:`~jobgen.reports.attempts.torchrun_evidence`
    finds it (each source named ``node <rank> (<host>): ...``), then the node's exit code (its
    torchrun's; ``None``: not written, the launch was killed)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(launch_line)]
    attempt = lines[starts[-1] if starts else 0:]
    where = f"node {rank} ({printable(host)})"
    found = [dataclasses.replace(e, source=f"{where}: {e.source}") for e in torchrun_evidence(attempt)]
    if exit_code is not None and exit_code != 0:
        found.append(Evidence(f"{where}: torchrun", exit_code=exit_code))
    return found


def decide(evidence: Sequence[Evidence], used: int, budget: int, what: str) -> tuple[bool, Classification]:
    """Whether a failed attempt is restarted, and its class: restarted when the class is retried
    (:data:`~jobgen.reports.failure_class.RETRIED`) and ``used`` < ``budget``. ``what``: the
    job's state, for a failure nothing explains (``unknown``)."""
    decided = classify(evidence) or unclassified(what)
    return decided.retried and used < budget, decided


class Hosts:
    """What the watcher does on the hosts (ssh, :mod:`jobgen.backends.ssh.backend`); a test passes a fake.

    Methods: ``state()`` -> (state, node reports) as :func:`jobgen.backends.ssh.launch.job_state`;
    ``output(rank)`` -> the end of node ``rank``'s output (``""`` when unread); ``shared()`` ->
    whether the other hosts see node 0's files; ``copy_checkpoints()``; ``kill()``;
    ``start(restart)`` -> problems (empty: every launch confirmed), ``restart``: this start's
    number (1: the first restart); ``read_summary()`` -> node 0's summary.json text or ``None``;
    ``write_summary(text)``.
    """

    def __init__(self, handle: str, spec_source: str | None):
        from jobgen.backends.base import SubmittedJob
        from jobgen.backends.ssh import backend as ssh
        from jobgen.backends.ssh import launch
        from jobgen.jobdir.submission import JobHandle

        self.ssh, self.launch = ssh, launch
        self.handle = JobHandle.parse(handle)
        self.settings, self.run = ssh._settings(SubmittedJob(self.handle))
        self.spec_source = spec_source

    def _call(self, host: str, remote: str, *, data: bytes | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[bytes]:
        return self.ssh.run_ssh(self.launch.ssh_argv(self.settings, host, remote), data=data,
                                timeout_s=self.settings.connect_timeout_s + timeout_s)

    def state(self) -> tuple[str, list[Any]]:
        nodes = self.ssh.reports(self.settings, self.run, self.handle)
        return self.launch.job_state(nodes)[0], nodes

    def output(self, rank: int) -> str:
        proc = self._call(self.settings.hosts[rank], self.launch.tail_command(self.run, rank))
        return proc.stdout.decode(errors="replace") if proc.returncode == 0 else ""

    def shared(self) -> bool:
        return all(self._call(host, self.launch.sees_command(self.run, 0)).returncode == 0 for host in self.settings.hosts[1:])

    def copy_checkpoints(self) -> None:
        """Node 0's ``checkpoints/`` as a tar archive into a temporary file here (checkpoints can be
        gigabytes: never held in memory), then extracted on every other host."""
        timeout_s = self.settings.connect_timeout_s + self.ssh.COPY_TIMEOUT_S
        with tempfile.TemporaryFile(prefix="jobgen-checkpoints-") as archive:
            try:
                packed = subprocess.run(list(self.launch.ssh_argv(self.settings, self.settings.hosts[0],
                                                                  self.launch.pack_checkpoints_command(self.run))),
                                        stdin=subprocess.DEVNULL, stdout=archive, stderr=subprocess.PIPE, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"node 0's checkpoints were not read within {timeout_s:.0f} s") from None
            if packed.returncode != 0:
                raise RuntimeError(f"node 0's checkpoints could not be read: {self.ssh._why(packed)}")
            for rank, host in enumerate(self.settings.hosts[1:], start=1):
                archive.seek(0)
                proc = self.ssh.run_ssh(self.launch.ssh_argv(self.settings, host, self.launch.unpack_command(self.run)),
                                        stdin=archive, timeout_s=timeout_s)
                if proc.returncode != 0:
                    raise RuntimeError(f"node 0's checkpoints could not be copied to {printable(host)} (node {rank}): "
                                       f"{self.ssh._why(proc)}")

    def kill(self) -> None:
        for rank, host in enumerate(self.settings.hosts):
            self._call(host, self.launch.kill_command(self.handle, rank))

    def start(self, restart: int) -> list[str]:
        return self.ssh.restart_hosts(self.handle, spec_source=self.spec_source, restart=restart)

    def read_summary(self) -> str | None:
        proc = self._call(self.settings.hosts[0], self.launch.read_command(self.run, SUMMARY_FILE))
        return proc.stdout.decode(errors="replace") if proc.returncode == 0 else None

    def write_summary(self, text: str) -> None:
        self._call(self.settings.hosts[0], self.launch.write_command(self.run, SUMMARY_FILE), data=text.encode())


@dataclasses.dataclass(frozen=True)
class Pace:
    """How the watch waits: ``poll_s`` seconds between two looks at the hosts, with ``sleep``;
    ``clock`` (monotonic seconds) times how long the hosts stay unreached. Tests pass their own."""

    poll_s: float = POLL_S
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def watch(hosts: Any, job_dir: Path, budget: int, launch_line: Callable[[int], str], *, out: Callable[[str], None] = print,
          pace: Pace = Pace(), notify: Callable[[dict[str, Any], int], Any] | None = None) -> str:
    """Watch the job until it ends for good; returns how: ``COMPLETED``, ``FAILED``, ``CANCELLED``
    or ``UNKNOWN`` (the hosts stayed unreached for :data:`UNREACHED_LIMIT_S`). Records each
    decision in ``job_dir`` (:data:`RESTARTS_FILE`) as it is made. ``launch_line(rank)``: the
    start of launch.sh's line on node ``rank`` (:data:`jobgen.backends.ssh.launch.LAUNCH_LINE`).
    ``notify(entry, budget)``: called with each restart's record once it is decided, before the
    hosts are started again (:meth:`jobgen.events.notifier.Notifier.send_restart`: the ``restart`` event)."""
    record: dict[str, Any] = {"max_restarts": budget, "restarts": [], "state": WATCHING, "pid": os.getpid(), "evidence": [],
                              "started_at": _now()}
    _write(job_dir, record)
    lost_since: float | None = None
    while True:
        try:
            state, nodes = hosts.state()
        except JobgenError as exc:  # no host answered
            state, nodes = "UNKNOWN", []
            out(f"jobgen: the hosts did not answer: {exc.message}")
        reached = [n for n in nodes if n.reached]
        gone = state == "UNKNOWN" and reached and len(reached) == len(nodes) and all(n.run_dir for n in nodes)
        if state in ("RUNNING", "PENDING") or (state == "UNKNOWN" and not gone):
            if state == "UNKNOWN":
                lost_since = lost_since if lost_since is not None else pace.clock()
                if pace.clock() - lost_since >= UNREACHED_LIMIT_S:
                    return _done(job_dir, record, "UNKNOWN", out, f"the hosts stayed unreached for {UNREACHED_LIMIT_S:.0f} s")
            else:
                lost_since = None
            pace.sleep(pace.poll_s)
            continue
        lost_since = None
        if state == "COMPLETED":
            _add_to_summary(hosts, record, out)
            return _done(job_dir, record, "COMPLETED", out, "every node exited 0")
        if state == "CANCELLED":
            return _done(job_dir, record, "CANCELLED", out, "jobgen cancel stopped it")
        # FAILED, or every launch gone without an exit code (killed, the host restarted)
        evidence: list[Evidence] = []
        for node in nodes:
            evidence += node_evidence(node.rank, node.host, hosts.output(node.rank), node.exit_code, launch_line(node.rank))
        used = len(record["restarts"])
        again, decided = decide(evidence, used, budget, f"ssh: state {state}")
        record["evidence"] = [dataclasses.asdict(e) for e in evidence]
        record["failure"] = decided.to_json()
        if not again:
            why = "a user failure is not restarted" if not decided.retried else f"the budget is spent ({used} of {budget})"
            return _done(job_dir, record, "FAILED", out, f"failure: {decided.describe()}; {why}")
        exit_code = next((n.exit_code for n in nodes if n.exit_code not in (None, 0)), None)
        record["restarts"].append(restart_entry(used + 1, decided, exit_code))
        record["state"] = RESTARTING
        _write(job_dir, record)
        out(f"jobgen: restart {used + 1} of {budget} (restart.max_restarts) after a failure classed {decided.describe()}")
        if notify is not None:
            notify(record["restarts"][-1], budget)
        try:
            hosts.kill()
            if len(nodes) > 1 and not hosts.shared():
                out("jobgen: the run directory is not shared: copying node 0's checkpoints to the other hosts")
                hosts.copy_checkpoints()
            problems = hosts.start(used + 1)  # the launches' JOBGEN_RESTART_COUNT: the restarts used, this one counted
        except (JobgenError, RuntimeError) as exc:
            problems = [getattr(exc, "message", str(exc))]
        if problems:
            return _done(job_dir, record, "FAILED", out, "the restart could not start every host: " + "; ".join(problems))
        record["state"] = WATCHING
        _write(job_dir, record)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write(job_dir: Path, record: dict[str, Any]) -> None:
    write_atomic(job_dir / RESTARTS_FILE, json.dumps(record, indent=2) + "\n")


def _done(job_dir: Path, record: dict[str, Any], outcome: str, out: Callable[[str], None], why: str) -> str:
    record.update(state=DONE, outcome=outcome, reason=why, ended_at=_now())
    _write(job_dir, record)
    out(f"jobgen: {outcome}: {why}; restarts used: {len(record['restarts'])} of {record['max_restarts']}")
    return outcome


def _add_to_summary(hosts: Any, record: dict[str, Any], out: Callable[[str], None]) -> None:
    """Node 0's summary.json with ``restarts`` added (:func:`~jobgen.reports.attempts.with_restarts`);
    nothing when it cannot be read as a JSON object."""
    text = hosts.read_summary()
    try:
        summary = json.loads(text) if text is not None else None
    except ValueError:
        summary = None
    if not isinstance(summary, dict):
        out("jobgen: node 0 has no readable summary.json; the restarts are in " + RESTARTS_FILE)
        return
    hosts.write_summary(json.dumps(with_restarts(summary, record["max_restarts"], record["restarts"]), indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobgen.backends.ssh.restart --job-dir DIR --handle H [--spec-source FILE]``:
    watch the job (:func:`watch`) with the budget of the job directory's spec.json."""
    from jobgen.backends.ssh.launch import LAUNCH_LINE
    from jobgen.events.notifier import Notifier
    from jobgen.jobdir.spec import read_resolved_spec

    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--handle", required=True)
    parser.add_argument("--spec-source")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(f"{_now()} {line}", flush=True)

    try:
        resolved = read_resolved_spec(args.job_dir)
        budget = resolved.spec.restart.max_restarts
        hosts = Hosts(args.handle, args.spec_source)
        notifier = None if resolved.spec.notify is None else Notifier(resolved.spec.notify, resolved, hosts.run, handle=args.handle,
                                                                       prog="jobgen")
        outcome = watch(hosts, args.job_dir, budget, lambda rank: LAUNCH_LINE.format(rank=rank), out=say,
                        notify=None if notifier is None else notifier.send_restart)
    except JobgenError as exc:
        say(f"jobgen: the watcher stopped: {exc.message}")
        return 1
    return 0 if outcome == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
