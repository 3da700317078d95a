"""Machines without a scheduler, over OpenSSH: planning (pure) and the exact command lines.

Launch contract (docs/own-code.md, "Launch contracts"): one launch script per job, ``launch.sh``, that every
host runs with its node rank; it starts the same torchrun line everywhere (``--nnodes N
--node-rank i --nproc-per-node D --master-addr <first host> --master-port P``, torchrun's static
rendezvous, as the seeds' manual multi-node guides do by hand with MASTER_ADDR/NODE_RANK) with
the bundled entrypoint ``python -m jobgen.train --spec spec.json``. Lightning's
TorchElasticEnvironment takes the ranks from torchrun.

Every command jobgen runs on a host is one ``ssh`` argv (no local shell) whose last element is
the remote command: ssh hands it to the login shell of the remote user (``$SHELL -c``), so it is
built from :func:`shlex.quote`-d words and needs a POSIX shell there (bash, dash, zsh, ksh;
not csh or fish). Values with newlines never get this far (the profile refuses them). ssh runs
with ``BatchMode=yes`` (a password or passphrase prompt fails instead of waiting), a
``ConnectTimeout``, and ``StrictHostKeyChecking=accept-new`` (first contact records the host's
key in your known_hosts, a changed key is refused) or, with ``ssh.known_hosts``, ``yes`` against
that file (ssh_config(5), OpenSSH 9.2).

On each host, in the run directory ``<workdir>/<job name>/``: ``job/`` (the copied job
directory), ``code/<id>/`` (the code snapshot), ``node-<rank>.log`` (the launch's output),
``node-<rank>.pid`` and ``node-<rank>.exit`` (written by launch.sh), and ``cancelled`` (written
by ``jobgen cancel``). Every process a job starts on a host carries ``JOBGEN_SSH_JOB=<handle>#node-<rank>``
in its environment (:func:`job_tag`; torchrun's workers run in sessions of their own, so the
launch's process group does not hold them all); status counts those processes, cancel stops them.

Submitting, status, logs and cancel live in :mod:`jobgen.backends.ssh.backend`.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen.backends.base import common_files, job_env, render_job_template
from jobgen.errors import PlanError, printable
from jobgen.events.notifier import RESTART_COUNT_ENV
from jobgen.jobdir.files import CODE_DIR_ENV, CODE_SUBDIR, LAUNCH_FILE, NODE_TAG, SPEC_FILE, SPEC_SOURCE_ENV, SSH_JOB_ENV
from jobgen.jobdir.submission import JobHandle
from jobgen.jobdir.world import World
from jobgen.planning.plan import Command, JobPlan, PlanContext
from jobgen.planning.render import ShellText, sh_argv
from jobgen.reports.failure_class import Evidence
from jobgen.specs.profile import SshSettings

TEMPLATE = "ssh/launch.sh.j2"
#: The job directory's copy on every host, inside the run directory.
JOB_SUBDIR = "job"
#: Written by ``jobgen cancel`` into the run directory of every host: status then says CANCELLED.
CANCELLED_FILE = "cancelled"
#: Placeholder for the code snapshot's id in planned start commands (known once submit has taken it).
SNAPSHOT_ID_PLACEHOLDER = "<snapshot id>"
#: What a host must have (besides sshd and a POSIX login shell); the probe names what is missing.
HOST_TOOLS = ("bash", "setsid", "tar")
#: The probe's word for a missing tool (one line per tool).
MISSING = "jobgen-missing:"


#: The restart watcher's record (:mod:`jobgen.backends.ssh.restart`) in the job directory on the submitting machine.
RESTARTS_FILE = "ssh-restarts.json"
#: The watcher's own output (what it decided, and why), in the job directory.
WATCH_LOG = "ssh-restarts.log"
#: The watcher's states in :data:`RESTARTS_FILE`: watching the job, starting it again, done.
WATCHING, RESTARTING, DONE = "watching", "restarting", "done"
#: The module the watcher runs as (``python -m``); ``jobgen cancel`` checks a PID's command line for it.
MODULE = "jobgen.backends.ssh.restart"


def node_file(rank: int, kind: str) -> str:
    """The name, in the run directory, of node ``rank``'s ``log``, ``pid`` or ``exit`` file."""
    return f"node-{rank}.{kind}"


def run_dir(settings: SshSettings, job_name: str) -> str:
    """The run directory on every host: ``<workdir>/<job name>`` (absolute, or ``~/...``: in the
    login's home directory on each host, see :func:`remote_path`)."""
    return posixpath.join(settings.workdir, job_name)


def remote_path(path: str) -> str:
    """``path`` as one word of the remote POSIX shell: quoted, a leading ``~`` as ``"$HOME"``
    (the login's home directory on that host; quoted, so a home with blanks stays one word)."""
    if path == "~" or path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"' + (f"/{shlex.quote(rest)}" if rest else "")
    return shlex.quote(path)


def snapshot_dir(run: str, snapshot_id: str) -> str:
    """The code snapshot's directory on every host: ``<run dir>/code/<id>`` (``$JOBGEN_CODE_DIR``)."""
    return posixpath.join(run, CODE_SUBDIR, snapshot_id)


def handle_for(settings: SshSettings, job_name: str) -> JobHandle:
    """``ssh://<first host><run dir>`` (an absolute run dir), ``ssh://<first host>/~/<...>`` (one in
    the login's home)."""
    run = run_dir(settings, job_name)
    return JobHandle("ssh", settings.hosts[0] + (run if run.startswith("/") else f"/{run}"))


# --------------------------------------------------------------------------- planning


def check_ssh(ctx: PlanContext) -> SshSettings:
    """The profile's ssh settings for this job: its hosts cut to the job's nodes.

    Raises:
        PlanError: command mode (``entrypoint``), which the ssh backend does not run yet.
    """
    settings = ctx.profile.ssh
    assert settings is not None  # the profile model requires it for scheduler: ssh
    if ctx.spec.entrypoint is not None:
        raise PlanError(
            f"You set `entrypoint` (command mode), but profile {ctx.profile.name!r} runs on hosts over ssh, which runs the "
            "bundled entrypoint (python -m jobgen.train) only.",
            location=f"{ctx.spec_source}: entrypoint",
            hint="Use a local or SLURM profile for your own script, or name your LightningModule/DataModule with model/data "
                 "class_path instead.",
        )
    return settings.model_copy(update={"hosts": settings.hosts[:ctx.world.num_nodes]})


def torchrun_argv(settings: SshSettings, world: World, node_rank: str | int) -> list[str]:
    """The torchrun line of one node (``node_rank``: a number, or shell text such as
    ``"${NODE_RANK}"``): ``python -m torch.distributed.run`` (torchrun, through the profile's
    interpreter, which need not have torchrun on PATH) with the static rendezvous on the first
    host, ``--tee 3`` (every line labelled with its local rank), then the entrypoint."""
    return [settings.python, "-m", "torch.distributed.run", "--nnodes", str(world.num_nodes), "--node-rank",
            ShellText('"${NODE_RANK}"') if isinstance(node_rank, str) else str(node_rank),
            "--nproc-per-node", str(world.devices_per_node), "--master-addr", settings.rendezvous_host,
            "--master-port", str(settings.master_port), "--tee", "3",
            "-m", "jobgen.train", "--spec", ShellText('"${JOB_DIR}"/' + SPEC_FILE), "--run-dir", ShellText('"${RUN_DIR}"')]


def launch_script(ctx: PlanContext, settings: SshSettings) -> str:
    """``launch.sh``: the per-host launch, its header listing each host's exact command."""
    code = ctx.spec.code
    python_path = f"/{code.python_path}" if code is not None and code.python_path else ""
    state = '"${RUN_DIR}"/node-"${NODE_RANK}"'
    return render_job_template(
        ctx,
        TEMPLATE,
        num_nodes=ctx.world.num_nodes,
        host_lines=[(host, sh_argv(torchrun_argv(settings, ctx.world, rank))) for rank, host in enumerate(settings.hosts)],
        env=job_env(ctx),
        omp_threads=ctx.world.cpus_per_rank,
        python_path=python_path,
        master_addr=settings.rendezvous_host,
        master_port=settings.master_port,
        pid_file=ShellText(state + ".pid"),
        exit_file=ShellText(state + ".exit"),
        launch=torchrun_argv(settings, ctx.world, "${NODE_RANK}"),
    )


def plan(ctx: PlanContext) -> JobPlan:
    """Plan a job on hosts over ssh: ``launch.sh`` + ``spec.json`` (+ ``ds_config.json``); the
    submit steps are the ssh commands of :func:`submit_commands` (probe, copy, start per host)."""
    settings = check_ssh(ctx)
    files, resolved = common_files(ctx, ssh=settings)
    files.append((LAUNCH_FILE, launch_script(ctx, settings)))
    code = ctx.spec.code
    snapshot = code.snapshot if code is not None else ctx.spec.runs_user_code
    steps = submit_commands(settings, ctx.spec.name, snapshot_id=SNAPSHOT_ID_PLACEHOLDER if snapshot else None,
                            secrets=ctx.spec.secrets)
    return JobPlan(scheduler="ssh", profile=ctx.profile.name, job_name=ctx.spec.name, files=tuple(sorted(files)),
                   submit_steps=steps.all, world=ctx.world, inputs_sha256=ctx.inputs_sha256, resolved=resolved)


# --------------------------------------------------------------------------- command lines


def ssh_argv(settings: SshSettings, host: str, remote: str) -> tuple[str, ...]:
    """``ssh`` to ``host`` running ``remote`` (one string: the remote login shell reads it).

    Options (ssh_config(5), OpenSSH 9.2): ``BatchMode=yes`` (never a password prompt),
    ``ConnectTimeout``, the host-key policy (``StrictHostKeyChecking=yes`` +
    ``UserKnownHostsFile`` with ``ssh.known_hosts``, else ``accept-new``), ``-i`` +
    ``IdentitiesOnly=yes`` with ``ssh.identity_file``, the profile's ``options``, ``-p``, ``-l``;
    ``--`` ends the options before the host.
    """
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={settings.connect_timeout_s}"]
    if settings.known_hosts is not None:
        argv += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={settings.known_hosts}"]
    else:
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    if settings.identity_file is not None:
        argv += ["-i", settings.identity_file, "-o", "IdentitiesOnly=yes"]
    for option in settings.options:
        argv += ["-o", option]
    argv += ["-p", str(settings.port)]
    if settings.user is not None:
        argv += ["-l", settings.user]
    return (*argv, "--", host, remote)


def probe_command(settings: SshSettings) -> str:
    """Remote: print ``jobgen-missing: <tool>`` for each of :data:`HOST_TOOLS` and the interpreter
    that the host lacks; nothing when all are there (ssh's exit 255: the host was not reached)."""
    tools = " ".join(shlex.quote(t) for t in (*HOST_TOOLS, settings.python))
    return f'for tool in {tools}; do command -v "$tool" >/dev/null 2>&1 || echo "{MISSING} $tool"; done'


def copy_command(run: str) -> str:
    """Remote: replace ``<run>/job`` by the tar archive on stdin (the job directory and the code
    snapshot, :func:`jobgen.backends.ssh.backend.pack`), extracted into the run directory.

    The run directory reaches the shell only (``cd``), never tar: GNU tar un-escapes backslash
    sequences in a ``-C`` directory (``..\\057..`` is ``../..``), which took a name such as
    ``..\\057..\\057escaped`` out of the run directory. tar extracts into its working directory
    the members jobgen packed (``job/...``, ``code/<id>/...``)."""
    q = remote_path(run)
    return f"rm -rf -- {remote_path(posixpath.join(run, JOB_SUBDIR))} && mkdir -p -- {q} && cd -- {q} && tar -x --no-same-owner -f -"


def start_command(run: str, rank: int, handle: JobHandle, *, code_dir: str | None, secrets: tuple[str, ...] = (),
                  spec_source: str | None = None, restart: int = 0) -> str:
    """Remote: start ``bash job/launch.sh <rank>`` detached (its own session, ``setsid -f``),
    output appended to ``node-<rank>.log``, with :data:`~jobgen.jobdir.SSH_JOB_ENV` (:func:`job_tag`),
    ``JOBGEN_CODE_DIR`` (``code_dir``), ``JOBGEN_SPEC_SOURCE`` (``spec_source``: the spec file
    `jobgen submit` read, named by the entrypoint's input errors; non-printable characters
    escaped, :func:`~jobgen.errors.printable`) and, for a restart (``restart`` > 0: the restarts
    used before this start), ``JOBGEN_RESTART_COUNT`` (:data:`jobgen.events.notifier.RESTART_COUNT_ENV`,
    the ``restart`` of the entrypoint's notifications) in its environment; the first start sets no
    count (the entrypoint reads 0). The files of an earlier start (pid, exit code, cancel mark)
    are removed first. ``secrets``: the spec's secret names; their values come on stdin, one
    ``NAME=VALUE`` line each, and are exported, never written to a file or put on a command line."""
    words = [f"cd {remote_path(run)}", f"rm -f {node_file(rank, 'pid')} {node_file(rank, 'exit')} {CANCELLED_FILE}"]
    if secrets:
        words.append("while IFS= read -r jobgen_secret; do export \"$jobgen_secret\"; done")
    env = [f"{SSH_JOB_ENV}={shlex.quote(job_tag(handle, rank))}"]
    if code_dir is not None:
        env.append(f"{CODE_DIR_ENV}={remote_path(code_dir)}")
    if spec_source is not None:
        env.append(f"{SPEC_SOURCE_ENV}={shlex.quote(printable(spec_source))}")
    if restart > 0:
        env.append(f"{RESTART_COUNT_ENV}={shlex.quote(str(int(restart)))}")
    words.append(f"{' '.join(env)} setsid -f bash {JOB_SUBDIR}/{LAUNCH_FILE} {rank} </dev/null >>{node_file(rank, 'log')} 2>&1")
    return " && ".join(words)


def job_tag(handle: JobHandle, rank: int) -> str:
    """The value of :data:`~jobgen.jobdir.SSH_JOB_ENV` in every process of node ``rank`` of the
    job: ``<handle>#node-<rank>`` (per node: two nodes may share a machine, e.g. two aliases of it)."""
    return f"{handle}{NODE_TAG}{rank}"


def _job_pids(handle: JobHandle, rank: int) -> str:
    """Remote shell text: the PIDs of node ``rank``'s processes (their environment holds
    :func:`job_tag`; GNU grep reads each /proc/<pid>/environ as NUL-separated lines), one per line."""
    tag = shlex.quote(f"{SSH_JOB_ENV}={job_tag(handle, rank)}")
    return f"grep -lzxF -e {tag} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3"


def status_command(run: str, rank: int, handle: JobHandle) -> str:
    """Remote: ``key=value`` lines (:func:`parse_report`): ``dir=missing`` when there is no run
    directory, else ``pid`` and ``exit`` (empty when not written), ``cancelled`` (0/1) and
    ``procs``, the number of the job's processes alive on the host. The processes are counted
    first: launch.sh writes its exit code before it ends, so a launch counted as gone has its exit
    code read (the other order misses one that ends between the two reads)."""
    return (f"cd {remote_path(run)} 2>/dev/null || {{ echo dir=missing; exit 0; }}; "
            f"procs=$({_job_pids(handle, rank)} | wc -l); "
            f"echo \"pid=$(cat {node_file(rank, 'pid')} 2>/dev/null)\"; echo \"exit=$(cat {node_file(rank, 'exit')} 2>/dev/null)\"; "
            f"if [ -e {CANCELLED_FILE} ]; then echo cancelled=1; else echo cancelled=0; fi; "
            f"echo \"procs=$procs\"")


def stop_command(run: str, rank: int, handle: JobHandle) -> str:
    """Remote: mark the run cancelled and send TERM to the launch script (when its PID is still
    one of the job's processes); launch.sh passes it to torchrun, which stops its workers."""
    return (f"cd {remote_path(run)} 2>/dev/null || exit 0; touch {CANCELLED_FILE}; "
            f"pid=$(cat {node_file(rank, 'pid')} 2>/dev/null) || exit 0; "
            f"if {_job_pids(handle, rank)} | grep -qx -e \"$pid\"; then kill -TERM \"$pid\" 2>/dev/null; fi; exit 0")


def kill_command(handle: JobHandle, rank: int) -> str:
    """Remote: SIGKILL every process of node ``rank`` of the job (the launch's process group and
    torchrun's workers, in sessions of their own: all carry :func:`job_tag`)."""
    return f"pids=$({_job_pids(handle, rank)}); if [ -n \"$pids\" ]; then kill -KILL $pids 2>/dev/null; fi; exit 0"


#: The exit code of :func:`log_command` when the node has no output file yet.
NO_LOG_EXIT = 3


def log_command(run: str, rank: int, offset: int) -> str:
    """Remote: node ``rank``'s output from byte ``offset`` on; exit :data:`NO_LOG_EXIT` when
    there is none yet."""
    path = remote_path(posixpath.join(run, node_file(rank, "log")))
    return f"if [ -f {path} ]; then tail -c +{offset + 1} {path}; else exit {NO_LOG_EXIT}; fi"


#: The first words of the line launch.sh writes at each start into ``node-<rank>.log``
#: (``jobgen: node <rank> of <nodes> on <host>, ...``): where an attempt's output begins.
LAUNCH_LINE = "jobgen: node {rank} of "
#: The most bytes of a node's output read to class how an attempt ended (its end holds the failure).
EVIDENCE_TAIL_BYTES = 4_000_000


def tail_command(run: str, rank: int, max_bytes: int = EVIDENCE_TAIL_BYTES) -> str:
    """Remote: the last ``max_bytes`` of node ``rank``'s output; exit :data:`NO_LOG_EXIT` when
    there is none."""
    path = remote_path(posixpath.join(run, node_file(rank, "log")))
    return f"if [ -f {path} ]; then tail -c {int(max_bytes)} {path}; else exit {NO_LOG_EXIT}; fi"


def read_command(run: str, name: str) -> str:
    """Remote: the run directory's file ``name`` on stdout; exit :data:`NO_LOG_EXIT` when it is missing."""
    path = remote_path(posixpath.join(run, name))
    return f"if [ -f {path} ]; then cat {path}; else exit {NO_LOG_EXIT}; fi"


def write_command(run: str, name: str) -> str:
    """Remote: replace the run directory's file ``name`` by stdin (a temporary file, then ``mv``)."""
    path = remote_path(posixpath.join(run, name))
    tmp = remote_path(posixpath.join(run, f".{name}.tmp"))
    return f"cat > {tmp} && mv -f {tmp} {path}"


def sees_command(run: str, rank: int) -> str:
    """Remote: exit 0 when node ``rank``'s output file is in this host's run directory (node
    ``rank`` runs elsewhere: the run directory is shared), else 1."""
    return f"test -e {remote_path(posixpath.join(run, node_file(rank, 'log')))}"


def pack_checkpoints_command(run: str) -> str:
    """Remote: a tar archive of the run directory's ``checkpoints/`` on stdout (an empty one when
    there is none)."""
    return f"cd {remote_path(run)} && if [ -d checkpoints ]; then tar -c -f - checkpoints; else tar -c -f - -T /dev/null; fi"


def unpack_command(run: str) -> str:
    """Remote: extract the tar archive on stdin into the run directory (files it holds replace
    this host's; others stay)."""
    return f"mkdir -p -- {remote_path(run)} && cd -- {remote_path(run)} && tar -x --no-same-owner -f -"


@dataclass(frozen=True)
class SubmitCommands:
    """What ``jobgen submit`` runs, per host in node-rank order: ``probe`` (reachable, tools
    there: all hosts, before anything else), ``copy`` (stdin: the tar of the job directory and
    snapshot), ``start``."""

    probe: tuple[Command, ...]
    copy: tuple[Command, ...]
    start: tuple[Command, ...]

    @property
    def all(self) -> tuple[Command, ...]:
        """Every command, in the order submit runs them."""
        return (*self.probe, *self.copy, *self.start)


def submit_commands(settings: SshSettings, job_name: str, *, snapshot_id: str | None,
                    secrets: tuple[str, ...] = (), spec_source: str | None = None, restart: int = 0) -> SubmitCommands:
    """The commands of :class:`SubmitCommands` for a job on ``settings.hosts``; ``snapshot_id``:
    the code snapshot's directory name under ``code/`` (None: no snapshot); ``spec_source`` and
    ``restart`` (the restarts used before this start; 0: the first start): see :func:`start_command`.
    The plan shows them with :data:`SNAPSHOT_ID_PLACEHOLDER` and no spec source; submit builds
    them again with the snapshot it took and the spec file it read, the restart watcher with the
    restart it decided."""
    run = run_dir(settings, job_name)
    handle = handle_for(settings, job_name)
    code_dir = None if snapshot_id is None else snapshot_dir(run, snapshot_id)
    packed = f"a tar of the job directory as {JOB_SUBDIR}/" + (f" and the code snapshot as {CODE_SUBDIR}/{snapshot_id}/" if code_dir else "")
    secret_note = f"the values of {', '.join(secrets)} as NAME=VALUE lines" if secrets else ""
    return SubmitCommands(
        probe=tuple(Command(ssh_argv(settings, h, probe_command(settings))) for h in settings.hosts),
        copy=tuple(Command(ssh_argv(settings, h, copy_command(run)), stdin=packed) for h in settings.hosts),
        start=tuple(Command(ssh_argv(settings, h, start_command(run, rank, handle, code_dir=code_dir, secrets=secrets,
                                                                       spec_source=spec_source, restart=restart)),
                            inherits=secrets, stdin=secret_note) for rank, h in enumerate(settings.hosts)),
    )


# --------------------------------------------------------------------------- reading the hosts


@dataclass(frozen=True)
class NodeReport:
    """What :func:`status_command` found on one host: ``reached`` False when ssh failed
    (``error`` says why); ``run_dir`` False when the run directory is missing; the launch's
    ``pid`` and ``exit_code`` (None until written), ``cancelled``, and ``procs`` (the job's live
    processes there)."""

    host: str
    rank: int
    reached: bool = True
    error: str = ""
    run_dir: bool = True
    pid: int | None = None
    exit_code: int | None = None
    cancelled: bool = False
    procs: int = 0


def parse_report(host: str, rank: int, text: str) -> NodeReport:
    """A :class:`NodeReport` from :func:`status_command`'s output (unknown lines are ignored;
    a value that is not a number reads as not written)."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if values.get("dir") == "missing":
        return NodeReport(host, rank, run_dir=False)

    def number(key: str) -> int | None:
        raw = values.get(key, "").strip()
        return int(raw) if raw.lstrip("-").isdigit() else None

    return NodeReport(host, rank, pid=number("pid"), exit_code=number("exit"), cancelled=values.get("cancelled") == "1",
                      procs=number("procs") or 0)


def job_state(nodes: list[NodeReport]) -> tuple[str, dict[str, str]]:
    """The job's state from every host's report, and the details (per node: what it said).

    - RUNNING while any host still has a process of the job (others may have ended: their exit
      codes are in the details);
    - then CANCELLED when ``jobgen cancel`` marked any host;
    - COMPLETED when every node wrote exit code 0, FAILED when every node wrote one and one is
      not 0 (``exit_code``: the first such, by node rank);
    - PENDING while a node has no PID yet (submit just started it);
    - UNKNOWN otherwise, with the reason: a host not reached, a run directory missing, or a
      launch gone without an exit code (killed with SIGKILL, the host rebooted) — never a guess.
    """
    details = {f"node {n.rank}": _describe(n) for n in nodes}
    unreached = [n for n in nodes if not n.reached]
    if any(n.procs for n in nodes):
        return "RUNNING", details
    if unreached:
        return "UNKNOWN", {**details, "reason": "not reached: " + ", ".join(n.host for n in unreached)}
    if any(n.cancelled for n in nodes):
        return "CANCELLED", details
    missing = [n for n in nodes if not n.run_dir]
    if missing:
        return "UNKNOWN", {**details, "reason": "no run directory on " + ", ".join(n.host for n in missing)}
    if all(n.exit_code is not None for n in nodes):
        failed = [n for n in nodes if n.exit_code != 0]
        if failed:
            return "FAILED", {**details, "exit_code": str(failed[0].exit_code)}
        return "COMPLETED", {**details, "exit_code": "0"}
    if any(n.pid is None and n.exit_code is None for n in nodes):
        return "PENDING", details
    gone = [n.host for n in nodes if n.exit_code is None]
    return "UNKNOWN", {**details, "reason": "the launch ended without an exit code on " + ", ".join(gone)}


def _describe(node: NodeReport) -> str:
    if not node.reached:
        return f"{node.host}: not reached ({node.error})"
    if not node.run_dir:
        return f"{node.host}: no run directory"
    parts = [node.host, f"{node.procs} process(es)"]
    if node.exit_code is not None:
        parts.append(f"exit {node.exit_code}")
    elif node.pid is None:
        parts.append("not started")
    return ": ".join(parts[:1]) + ": " + ", ".join(parts[1:])


# --------------------------------------------------------------------------- the restart watcher's record


def read_record(job_dir: Path) -> dict[str, Any] | None:
    """The watcher's record in ``job_dir`` (:data:`RESTARTS_FILE`), or ``None`` when it has none
    or it is not of the watcher's shape (``max_restarts``: int, ``restarts``: a list of dicts,
    ``state``: str, ``pid``: int, ``evidence``: a list of dicts)."""
    try:
        doc = json.loads((job_dir / RESTARTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ints = ("max_restarts", "pid")
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), int) and not isinstance(doc.get(k), bool) for k in ints) \
            or not isinstance(doc.get("state"), str) or not isinstance(doc.get("restarts"), list) \
            or not all(isinstance(r, dict) for r in doc["restarts"]) or not isinstance(doc.get("evidence", []), list):
        return None
    return doc


def stored_evidence(record: dict[str, Any]) -> tuple[Evidence, ...]:
    """The last attempt's evidence the watcher recorded; an entry not of :class:`Evidence`'s
    fields and types is left out."""
    texts = ("source", "state", "reason", "kind", "text", "verdict")
    out = []
    for doc in record.get("evidence", []):
        if not isinstance(doc, dict) or set(doc) - {*texts, "exit_code", "signal"} \
                or not all(isinstance(doc.get(k, ""), str) for k in texts) \
                or not all(doc.get(k) is None or (isinstance(doc.get(k), int) and not isinstance(doc.get(k), bool))
                           for k in ("exit_code", "signal")):
            continue
        out.append(Evidence(**doc))
    return tuple(out)


def watcher_alive(record: dict[str, Any]) -> bool:
    """Whether the watcher process the record names runs on this machine (its command line names :data:`MODULE`)."""
    try:
        return MODULE.encode() in Path(f"/proc/{int(record['pid'])}/cmdline").read_bytes()
    except (OSError, KeyError, ValueError, TypeError):
        return False
