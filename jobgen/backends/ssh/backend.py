"""ssh backend: a job on machines without a scheduler, started, watched and stopped over OpenSSH.

``submit`` first asks every host (in parallel) whether it can be reached and has what the launch
needs (:func:`~jobgen.backends.ssh.launch.probe_command`): one that cannot is named in the error
and nothing is copied or started. Then it snapshots the code (:mod:`jobgen.usercode.snapshot`, as SLURM
and local submits do), packs the job directory and the snapshot into one tar archive, extracts it
into ``<workdir>/<job name>/`` on every host (``ssh host 'cd <run dir> && tar -x ...'`` with the archive on stdin:
only tar is needed there, and the bytes arrive as they are here), starts ``bash job/launch.sh
<node rank>`` on every host in a session of its own and waits until every launch has written its
PID. The submission (:class:`~jobgen.jobdir.Submission`, handle ``ssh://<first host><run dir>``)
is recorded before anything starts; a start that fails, or a launch that ends without writing its
PID, stops the job on every host, takes the record back and fails the submit. ``status`` asks each host for the launch's PID, its exit code
and how many of the job's processes are alive (:func:`~jobgen.backends.ssh.launch.job_state`;
a completed job's straggler from node 0's summary.json);
``logs`` prints one node's ``node-<rank>.log``; ``cancel`` marks the run cancelled, sends TERM to
each launch script (which passes it to torchrun, which stops its workers) and, after a grace
period, SIGKILL to whatever of the job is left, then checks that nothing is.

Every ssh call is an argv list (:func:`~jobgen.backends.ssh.launch.ssh_argv`, BatchMode); the
command lines are planned in :mod:`jobgen.backends.ssh.launch`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

from jobgen.backends.base import (
    Backend,
    Echo,
    JobStatus,
    LogOptions,
    PendingSubmit,
    SubmitOptions,
    SubmitResult,
    SubmittedJob,
    not_supported,
    plan_spec_file,
    secrets_location,
)
from jobgen.backends.ssh.launch import (
    DONE,
    MISSING,
    MODULE,
    NO_LOG_EXIT,
    RESTARTING,
    RESTARTS_FILE,
    TEMPLATE,
    WATCH_LOG,
    NodeReport,
    handle_for,
    job_state,
    kill_command,
    log_command,
    parse_report,
    plan,
    probe_command,
    read_command,
    read_record,
    run_dir,
    snapshot_dir,
    ssh_argv,
    status_command,
    stop_command,
    stored_evidence,
    submit_commands,
    watcher_alive,
)
from jobgen.errors import ConfigError, SubmitError
from jobgen.jobdir.files import CODE_SUBDIR, SPEC_SOURCE_ENV, SUBMISSION_FILE, SUMMARY_FILE, write_atomic
from jobgen.jobdir.spec import read_resolved_spec
from jobgen.jobdir.submission import JobHandle, Submission
from jobgen.jobdir.summary import parse_summary
from jobgen.planning.environment import check_present
from jobgen.planning.plan import Command, JobPlan, PlanContext
from jobgen.reports.attempts import restart_details
from jobgen.reports.straggler import straggler_details
from jobgen.reports.triage import Triage
from jobgen.specs.profile import SshSettings

if TYPE_CHECKING:  # submit takes the snapshot with a lazy import: off the render path
    from jobgen.usercode.snapshot import TakenSnapshot

#: Seconds ``submit`` waits for every launch to write its PID after starting it.
START_WAIT_S = 30.0
#: Seconds ``cancel`` gives the job after TERM (torchrun stops its workers) before SIGKILL.
CANCEL_GRACE_S = 30.0
#: Seconds between two looks at the hosts while waiting.
POLL_S = 1.0
#: Seconds a copy may take (the job directory and the code snapshot).
COPY_TIMEOUT_S = 900.0
#: Hosts asked at once.
MAX_PARALLEL = 16

T = TypeVar("T")


def run_ssh(argv: Sequence[str], *, stdin: IO[bytes] | None = None, data: bytes | None = None,
            timeout_s: float = 60.0) -> subprocess.CompletedProcess[bytes]:
    """Run one ssh argv (never a shell here) with ``stdin`` (a file) or ``data`` on its standard
    input (else /dev/null); a timeout comes back as exit 255 with the reason on stderr, like any
    failure to reach the host.

    Raises:
        SubmitError: ssh is not installed.
    """
    feed: dict[str, object] = {"input": data} if data is not None else {"stdin": stdin if stdin is not None else subprocess.DEVNULL}
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout_s, **feed)  # type: ignore[call-overload]
    except FileNotFoundError:
        raise SubmitError(f"{argv[0]} not found: cannot reach the hosts",
                          hint="install the OpenSSH client (Debian/Ubuntu: apt-get install openssh-client)") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 255, b"", f"no answer within {timeout_s:.0f} s".encode())


def _each(hosts: Sequence[str], work: Callable[[int, str], T]) -> list[T]:
    """``work(rank, host)`` for every host at once (threads: each waits on an ssh process)."""
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(hosts)))) as pool:
        return list(pool.map(lambda pair: work(*pair), list(enumerate(hosts))))


def _why(proc: subprocess.CompletedProcess[bytes]) -> str:
    """ssh's own message (its last stderr line), or the exit code."""
    lines = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit {proc.returncode}"


def _timeout(settings: SshSettings, extra: float) -> float:
    return settings.connect_timeout_s + extra


def probe(settings: SshSettings) -> None:
    """Every host answers over ssh and has :data:`~jobgen.backends.ssh.launch.HOST_TOOLS` and
    the profile's python (asked in parallel).

    Raises:
        SubmitError: naming every host that could not be reached (with ssh's message) or lacks a tool.
    """
    def ask(rank: int, host: str) -> str | None:
        proc = run_ssh(ssh_argv(settings, host, probe_command(settings)), timeout_s=_timeout(settings, 30))
        if proc.returncode == 255:
            return f"{host} (node {rank}): cannot be reached: {_why(proc)}"
        missing = [ln.split(MISSING, 1)[1].strip() for ln in proc.stdout.decode(errors="replace").splitlines() if ln.startswith(MISSING)]
        if proc.returncode != 0 or missing:
            return f"{host} (node {rank}): " + (f"lacks {', '.join(missing)}" if missing else f"the check failed: {_why(proc)}")
        return None

    problems = [p for p in _each(settings.hosts, ask) if p is not None]
    if problems:
        unreachable = any("cannot be reached" in p for p in problems)
        raise SubmitError(
            f"{len(problems)} of {len(settings.hosts)} host(s) not ready; nothing was copied or started:\n  " + "\n  ".join(problems),
            hint=("check that `ssh` reaches each host without a prompt (keys: ssh-copy-id; host keys: ssh once by hand or "
                  "set ssh.known_hosts), or change ssh.hosts in the profile" if unreachable else
                  "install the missing tools on those hosts (bash, util-linux's setsid, tar, and the profile's ssh.python "
                  "with jobgen[train])"),
        )


def pack(job_dir: Path, code: TakenSnapshot | None, into: IO[bytes]) -> None:
    """Write a tar archive of the job directory (as ``job/``, without its submission record) and
    of the code snapshot (as ``code/<id>/``) into ``into``; owners are not recorded (the hosts'
    user owns what is extracted)."""
    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if Path(info.name).name in (SUBMISSION_FILE, RESTARTS_FILE, WATCH_LOG):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=into, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(str(job_dir), arcname="job", filter=anonymous)
        if code is not None:
            tar.add(str(code.dir), arcname=f"{CODE_SUBDIR}/{code.id}", filter=anonymous)


def _secret_lines(names: tuple[str, ...], location: str) -> bytes | None:
    """``NAME=VALUE`` lines of the spec's secrets from this environment (checked set before).

    Raises:
        ConfigError: a value holds a newline (one line per secret is what the hosts read).
    """
    if not names:
        return None
    for name in names:
        if "\n" in os.environ[name] or "\0" in os.environ[name]:
            raise ConfigError(f"secret {name} holds a newline or NUL, which the hosts cannot read as one NAME=VALUE line",
                              location=location, hint=f"store {name} without line breaks (e.g. base64) and decode it in your code")
    return "".join(f"{name}={os.environ[name]}\n" for name in names).encode()


def _settings(job: SubmittedJob) -> tuple[SshSettings, str]:
    """The hosts and the run directory of a recorded ssh job, from its record.

    Raises:
        ConfigError: not an ssh handle, or no submission record of it on this machine.
    """
    handle = job.handle
    if handle.scheme != "ssh":
        raise ConfigError(f"{handle} is not an ssh job handle", hint="ssh handles look like ssh://<first host>/<run dir>")
    record = job.record
    if record is None or record.ssh is None:
        raise ConfigError(f"no submission of {handle} is recorded on this machine, so jobgen does not know its hosts",
                          hint="run jobgen where the job was submitted: its state directory ($JOBGEN_STATE_DIR, else "
                               "~/.local/state/jobgen) holds the record naming the hosts")
    return record.ssh, record.run_dir


def reports(settings: SshSettings, run: str, handle: JobHandle) -> list[NodeReport]:
    """Every host's :class:`~jobgen.backends.ssh.launch.NodeReport` (asked in parallel)."""
    def ask(rank: int, host: str) -> NodeReport:
        proc = run_ssh(ssh_argv(settings, host, status_command(run, rank, handle)), timeout_s=_timeout(settings, 60))
        if proc.returncode != 0:
            return NodeReport(host, rank, reached=False, error=_why(proc))
        return parse_report(host, rank, proc.stdout.decode(errors="replace"))

    return _each(settings.hosts, ask)


def _wait(settings: SshSettings, run: str, handle: JobHandle, until: Callable[[list[NodeReport]], bool],
          seconds: float) -> list[NodeReport]:
    """Ask the hosts of ``handle`` (its run directory ``run``) every :data:`POLL_S` until
    ``until(reports)`` or ``seconds`` have passed; the last reports."""
    deadline = time.monotonic() + seconds
    while True:
        nodes = reports(settings, run, handle)
        if until(nodes) or time.monotonic() >= deadline:
            return nodes
        time.sleep(POLL_S)


def start_watcher(job_dir: Path, handle: str, spec_source: str | None) -> int:
    """Start the restart watcher (:mod:`jobgen.backends.ssh.restart`) of ``handle`` in a session of
    its own (it outlives ``jobgen submit``), its output appended to ``<job dir>/``:data:`WATCH_LOG`;
    it inherits this environment (the spec's secrets, which a restart hands to the hosts again).
    Returns its PID.

    Raises:
        OSError: the interpreter could not be started.
    """
    argv = [sys.executable, "-m", MODULE, "--job-dir", str(job_dir), "--handle", handle]
    if spec_source is not None:
        argv += ["--spec-source", spec_source]
    with open(job_dir / WATCH_LOG, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)
    return proc.pid


def _start_hosts(settings: SshSettings, handle: JobHandle, run: str, starts: Sequence[Command],
                 secret_data: bytes | None) -> tuple[bool, list[str]]:
    """Run each host's start command and wait until every launch wrote its PID; returns whether
    every start command ran, and the problems (empty: every launch confirmed). The caller stops
    what started when there are problems."""
    def start(rank: int, host: str) -> str | None:
        proc = run_ssh(starts[rank].argv, data=secret_data, timeout_s=_timeout(settings, 30))
        return None if proc.returncode == 0 else f"{host} (node {rank}): {_why(proc)}"

    failed = [f for f in _each(settings.hosts, start) if f]
    if failed:
        return False, failed
    nodes = _wait(settings, run, handle, lambda nodes: all(_launched(n) or _ended_unlaunched(n) for n in nodes), START_WAIT_S)
    return True, [f"{n.host} (node {n.rank}): " + _not_launched(settings, run, n) for n in nodes if not _launched(n)]


def restart_hosts(handle: JobHandle, *, spec_source: str | None, restart: int) -> list[str]:
    """Start the recorded job ``handle`` again on every host, as ``jobgen submit`` started it (its
    run directory, code snapshot and secrets from this environment), as restart number ``restart``
    (1 for the first: each launch gets it as ``JOBGEN_RESTART_COUNT``,
    :func:`~jobgen.backends.ssh.launch.start_command`); whatever started is killed again when a
    launch is not confirmed. Returns the problems (empty: every launch confirmed).

    Raises:
        ConfigError: no record of the job here, its job directory is unreadable, or a secret is not set.
    """
    job = SubmittedJob(handle)
    settings, run = _settings(job)
    record = job.record
    assert record is not None  # _settings found it
    resolved = read_resolved_spec(Path(record.job_dir))
    secrets = resolved.spec.secrets
    location = secrets_location(Path(record.job_dir), None)
    check_present(secrets, dict(os.environ), location=location)
    snapshot = Path(record.code_dir).name if record.code_dir else None
    commands = submit_commands(settings, resolved.spec.name, snapshot_id=snapshot, secrets=secrets, spec_source=spec_source,
                               restart=restart)
    _, problems = _start_hosts(settings, handle, run, commands.start, _secret_lines(secrets, location))
    if problems:
        _each(settings.hosts, lambda rank, host: run_ssh(ssh_argv(settings, host, kill_command(handle, rank)),
                                                         timeout_s=_timeout(settings, 30)))
    return problems


def _launched(node: NodeReport) -> bool:
    """The launch script ran on the node: it wrote its PID (or already its exit code)."""
    return node.pid is not None or node.exit_code is not None


def _ended_unlaunched(node: NodeReport) -> bool:
    """Nothing of the job is left on the node, and its launch never wrote its PID (bash could not
    read launch.sh, or the run directory is not writable): it will never start."""
    return node.reached and node.procs == 0 and not _launched(node)


def _not_launched(settings: SshSettings, run: str, node: NodeReport) -> str:
    """Why ``node``'s launch is not confirmed, with the last lines of its output when it ended."""
    if not node.reached:
        return f"not reached while waiting for the launch: {node.error}"
    if not _ended_unlaunched(node):
        return f"no launch PID after {START_WAIT_S:.0f} s"
    proc = run_ssh(ssh_argv(settings, node.host, log_command(run, node.rank, 0)), timeout_s=_timeout(settings, 30))
    lines = [ln for ln in proc.stdout.decode(errors="replace").splitlines() if ln.strip()] if proc.returncode == 0 else []
    return "the launch ended before it wrote its PID" + (": " + " / ".join(lines[-3:]) if lines else " (no output)")


def _undo(settings: SshSettings, handle: JobHandle, record: Submission) -> None:
    """Stop whatever of the job started on any host (SIGKILL) and take its record back."""
    _each(settings.hosts, lambda rank, host: run_ssh(ssh_argv(settings, host, kill_command(handle, rank)),
                                                     timeout_s=_timeout(settings, 30)))
    record.discard()


_REPLICA_RE = re.compile(r"^node-(\d+)$")


def _stop_watcher(job: SubmittedJob) -> None:
    """End the job's restart watcher (:mod:`jobgen.backends.ssh.restart`) when it runs here, and
    mark its record done (``CANCELLED``)."""
    import signal

    submission = job.record
    job_dir = Path(submission.job_dir) if submission is not None else None
    watched = read_record(job_dir) if job_dir is not None else None
    if job_dir is None or watched is None or watched["state"] == DONE:
        return
    if watcher_alive(watched):
        try:
            os.kill(watched["pid"], signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while watcher_alive(watched) and time.monotonic() < deadline:
            time.sleep(0.1)
    write_atomic(job_dir / RESTARTS_FILE, json.dumps({**watched, "state": DONE, "outcome": "CANCELLED",
                                                     "reason": "jobgen cancel stopped it"}, indent=2) + "\n")


@dataclass
class SshSubmit(PendingSubmit):
    """An ssh submission on its way: the profile's hosts and the secrets' lines each host's start reads."""

    settings: SshSettings | None = None
    secret_data: bytes | None = None


class SshBackend(Backend):
    """Hosts without a scheduler, over OpenSSH (``scheduler: ssh``)."""

    name = "ssh"
    templates = (TEMPLATE,)
    submit_options = frozenset({"allow_dirty"})
    log_options = frozenset({"replica"})

    def plan(self, ctx: PlanContext) -> JobPlan:
        """See :func:`jobgen.backends.ssh.launch.plan`."""
        return plan(ctx)

    def begin_submit(self, job_dir: Path, options: SubmitOptions, out: Echo, plan: JobPlan | None) -> SshSubmit:
        """What copying the job directory ``job_dir`` (and the code snapshot) to every host and
        starting it there needs, checked before anything is copied or started (see the module
        docstring for the order of things; :meth:`~jobgen.backends.base.Backend.submit` runs the
        steps). The code snapshot is taken into ``<options.runs_dir>/<job name>`` on this machine,
        then copied with the job directory.

        Raises:
            ConfigError: ``job_dir`` is not an ssh job directory; a secret of the spec is not set.
            SubmitError: a host cannot be reached or lacks a tool; the job of this run directory is
                still running.
        """
        resolved = plan.resolved if plan is not None and plan.resolved is not None else read_resolved_spec(job_dir)
        settings = resolved.launch.ssh
        if resolved.launch.scheduler != "ssh" or settings is None:
            raise ConfigError(f"{job_dir} was rendered for {resolved.launch.scheduler}, not for hosts over ssh",
                              hint="submit it with its own profile, or render the spec with an ssh profile")
        local_run = options.runs_dir.resolve() / resolved.spec.name
        job = SshSubmit(job_dir, options, out, plan, resolved, spec_file=plan_spec_file(plan), run_dir=local_run,
                        run_dirs=(local_run,), settings=settings)
        location = secrets_location(job_dir, job.spec_file)
        check_present(resolved.spec.secrets, job.environ, location=location)
        job.secret_data = _secret_lines(resolved.spec.secrets, location)
        handle = handle_for(settings, resolved.spec.name)
        probe(settings)  # every host, before anything is copied or started
        earlier = SubmittedJob(handle)
        if earlier.record is not None:
            before = self.status(earlier)
            if before.state in ("RUNNING", "PENDING"):
                raise SubmitError(f"{handle} is still {before.state} on its hosts; nothing was copied or started",
                                  hint=f"follow it with `jobgen logs -f {handle}`, or stop it first with `jobgen cancel {handle}`")
        return job

    def prepare_run_dirs(self, job: PendingSubmit) -> None:
        """Nothing: the run directory is on the hosts; the snapshot makes the local one it needs."""

    def launch(self, job: PendingSubmit) -> SubmitResult:
        """Copy the job directory and the snapshot to every host, record the submission, start
        the launch on every host and wait until each has written its PID (action ``submitted``);
        with a restart budget, start the restart watcher on this machine.

        Raises:
            SubmitError: a copy or a start failed (whatever started is stopped again, the record
                taken back).
        """
        assert isinstance(job, SshSubmit) and job.settings is not None
        job_dir, resolved, code, settings, out = job.job_dir, job.resolved, job.code, job.settings, job.out
        name, secrets = resolved.spec.name, resolved.spec.secrets
        handle, run = handle_for(settings, name), run_dir(settings, name)
        # the bundled entrypoint's input errors name the user's spec file (as local and SLURM runs do)
        spec_source = job.environ.get(SPEC_SOURCE_ENV)
        commands = submit_commands(settings, name, snapshot_id=code.id if code else None, secrets=secrets, spec_source=spec_source)
        with tempfile.TemporaryDirectory(prefix="jobgen-ssh-") as tmp:
            archive = Path(tmp) / "job.tar"
            with archive.open("wb") as sink:
                pack(job_dir, code, sink)
            size = archive.stat().st_size

            def copy(rank: int, host: str) -> str | None:
                with archive.open("rb") as stream:  # each host reads the archive from its start
                    proc = run_ssh(commands.copy[rank].argv, stdin=stream, timeout_s=COPY_TIMEOUT_S)
                return None if proc.returncode == 0 else f"{host} (node {rank}): {_why(proc)}"

            out(f"jobgen: copying {size / 1e6:.1f} MB (the job directory" + (f" and code snapshot {code.id}" if code else "")
                + f") to {run} on {len(settings.hosts)} host(s)")
            failed = [f for f in _each(settings.hosts, copy) if f is not None]
        if failed:
            raise SubmitError("the copy to the hosts failed; nothing was started:\n  " + "\n  ".join(failed),
                              hint=f"check that the user can write {settings.workdir} on every host (ssh.workdir) and that tar is GNU tar or bsdtar")

        # Recorded before anything starts: a job running on the hosts always has its record here
        # (status, logs and cancel find its hosts); an undone start takes the record back.
        record = Submission.now(handle=str(handle), job_dir=str(job_dir), run_dir=run, inputs_sha256=resolved.inputs_sha256,
                                code_dir=snapshot_dir(run, code.id) if code else None, code=code.record if code else None,
                                ssh=settings)
        record.save()
        (job_dir / RESTARTS_FILE).unlink(missing_ok=True)  # an earlier submission's watcher record

        started, problems = _start_hosts(settings, handle, run, commands.start, job.secret_data)
        if problems:
            _undo(settings, handle, record)
            if not started:
                raise SubmitError("the launch could not be started on every host; what started was stopped again:\n  "
                                  + "\n  ".join(problems), hint="the hosts' messages are above")
            raise SubmitError("the launch did not start on every host; what started was stopped again and nothing is recorded:\n  "
                              + "\n  ".join(problems),
                              hint=f"each node's output is in {run}/node-<rank>.log on its host; fix what it says and submit again")
        job.launched = True  # running on every host: nothing is undone from here on
        master = settings.rendezvous_host
        out(f"jobgen: {resolved.launch.world_size} rank(s) on {len(settings.hosts)} host(s): "
            + ", ".join(f"{h} (node {i})" for i, h in enumerate(settings.hosts)) + f"; rendezvous {master}:{settings.master_port}")
        budget = resolved.spec.restart.max_restarts
        if budget:
            pid = start_watcher(job_dir, str(handle), spec_source)
            out(f"jobgen: restart budget {budget} (restart.max_restarts): this machine watches the job (pid {pid}, log "
                f"{job_dir / WATCH_LOG}) and starts it again after a retried failure; keep it running")
        return SubmitResult("submitted", handle, record)


    def status(self, job: SubmittedJob) -> JobStatus:
        """The job's state from its hosts (:func:`~jobgen.backends.ssh.launch.job_state`); details:
        each node's host, live processes and exit code, and the run directory. With a restart
        watcher (:mod:`jobgen.backends.ssh.restart`) alive and its record not done: ``RESTARTING``
        for an ended, failed job (it decides) and ``RUNNING`` for one whose nodes all exited 0 (it
        adds ``restarts`` to node 0's ``summary.json``), so the state is final only once its record is.

        Raises:
            ConfigError: not an ssh handle, or no record of it here.
            SubmitError: no host could be reached (the message names each and why).
        """
        handle = job.handle
        settings, run = _settings(job)
        nodes = reports(settings, run, handle)
        if not any(n.reached for n in nodes):
            raise SubmitError(f"none of the hosts of {handle} answered: " + "; ".join(f"{n.host}: {n.error}" for n in nodes),
                              hint="check the network and that ssh reaches them without a prompt")
        state, details = job_state(nodes)
        details["run_dir"] = run
        if state == "COMPLETED":  # node 0's summary.json (global rank 0 writes it) may name a straggler
            proc = run_ssh(ssh_argv(settings, settings.hosts[0], read_command(run, SUMMARY_FILE)), timeout_s=_timeout(settings, 60))
            details |= straggler_details(parse_summary(proc.stdout)) if proc.returncode == 0 else {}
        submission = job.record
        watched = read_record(Path(submission.job_dir)) if submission is not None else None
        if watched is None:
            return JobStatus(handle, state, "ssh", details)
        details |= restart_details(watched["max_restarts"], watched["restarts"])
        ended = state == "FAILED" or (state == "UNKNOWN" and "without an exit code" in details.get("reason", ""))
        if (ended or state == "COMPLETED") and watched["state"] != DONE and watcher_alive(watched):
            if ended:
                state, doing = "RESTARTING", "starting the job again" if watched["state"] == RESTARTING else "classing the failure"
            else:  # the watcher marks its record done only after it wrote `restarts` into node 0's summary.json
                state, doing = "RUNNING", "recording the restarts in node 0's summary.json"
            details["reason"] = f"jobgen's restart watcher (pid {watched['pid']}) is {doing}"
        # the watcher's evidence is of the attempt it decided last: this one's only once it is done
        return JobStatus(handle, state, "ssh", details, evidence=stored_evidence(watched) if ended and watched["state"] == DONE else ())

    def logs(self, job: SubmittedJob, options: LogOptions, out: Echo = print) -> None:
        """Print node ``options.replica``'s output (``node-<rank>``, default ``node-0``: global rank zero
        runs there) from its host; with ``options.follow``, keep printing until the job has ended (Ctrl-C stops).

        Raises:
            ConfigError: ``replica`` is not ``node-<rank>`` of this job; no record of the job here.
            SubmitError: the host cannot be reached.
        """
        self.check_options(options)
        replica, follow = options.replica, options.follow
        handle = job.handle
        settings, run = _settings(job)
        match = _REPLICA_RE.match(replica or "node-0")
        if match is None or int(match.group(1)) >= len(settings.hosts):
            raise ConfigError(f"--replica {replica!r} is not a node of {handle}",
                              hint="one of: " + ", ".join(f"node-{i} ({h})" for i, h in enumerate(settings.hosts)))
        rank = int(match.group(1))
        host = settings.hosts[rank]
        offset, pending, finished, checks = 0, b"", not follow, 0
        while True:
            proc = run_ssh(ssh_argv(settings, host, log_command(run, rank, offset)), timeout_s=_timeout(settings, 120))
            if proc.returncode not in (0, NO_LOG_EXIT):
                raise SubmitError(f"cannot read node {rank}'s output on {host}: {_why(proc)}", hint="check that ssh reaches the host")
            if proc.returncode == 0:
                offset += len(proc.stdout)
                *lines, pending = (pending + proc.stdout).split(b"\n")
                for line in lines:
                    out(line.decode(errors="replace"))
            elif not follow:
                out(f"jobgen: node {rank} ({host}) has written no output yet to {run}")
                return
            if finished:
                if pending:
                    out(pending.decode(errors="replace"))
                return
            checks += 1
            if checks % 5 == 0:
                state = self.status(job)
                finished = state.finished or state.state == "UNKNOWN"
                if finished:
                    continue  # one more read drains what the node wrote last
            time.sleep(POLL_S)

    def first_error(self, job: SubmittedJob) -> Triage:
        """Not offered yet: each node's output is on its host."""
        raise not_supported("ssh", "jobgen logs --first-error", f"read each node's output: jobgen logs --replica node-<rank> {job.handle}")

    def cancel(self, job: SubmittedJob, *, wait_s: float = 120.0, out: Echo = print) -> JobStatus:
        """Stop the job on every host: mark it cancelled and TERM each launch script (torchrun stops
        its workers), wait up to :data:`CANCEL_GRACE_S` (or ``wait_s`` if shorter) for the job's
        processes to end, SIGKILL what is left, and check that nothing of the job runs on any host.

        Raises:
            ConfigError: not an ssh handle, or no record of it here.
            SubmitError: a host cannot be reached, or a process of the job is still there after SIGKILL.
        """
        handle = job.handle
        settings, run = _settings(job)
        _stop_watcher(job)  # first: it would start the job again

        def stop(rank: int, host: str) -> str | None:
            proc = run_ssh(ssh_argv(settings, host, stop_command(run, rank, handle)), timeout_s=_timeout(settings, 60))
            return None if proc.returncode == 0 else f"{host} (node {rank}): {_why(proc)}"

        unreached = [f for f in _each(settings.hosts, stop) if f]
        nodes = _wait(settings, run, handle, lambda nodes: not any(n.procs for n in nodes), min(wait_s, CANCEL_GRACE_S))
        if any(n.procs for n in nodes):
            left = ", ".join(f"{n.host} ({n.procs})" for n in nodes if n.procs)
            out(f"jobgen: still running after TERM: {left}; sending SIGKILL")
            _each(settings.hosts, lambda rank, host: run_ssh(ssh_argv(settings, host, kill_command(handle, rank)),
                                                             timeout_s=_timeout(settings, 60)))
            nodes = _wait(settings, run, handle, lambda nodes: not any(n.procs for n in nodes), 10.0)
        unreached += [f"{n.host} (node {n.rank}): {n.error}" for n in nodes if not n.reached and not any(n.host in u for u in unreached)]
        left = [f"{n.host}: {n.procs} process(es)" for n in nodes if n.procs]
        if unreached or left:
            raise SubmitError(f"{handle} may not have stopped everywhere: " + "; ".join([*unreached, *left]),
                              hint=f"run `jobgen cancel {handle}` again once the hosts answer")
        state, details = job_state(nodes)
        return JobStatus(handle, state, "ssh", {**details, "run_dir": run})
