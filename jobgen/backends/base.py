"""What every backend shares: the Backend protocol, job handles, and the common files."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jobgen import __version__, deepspeed
from jobgen.errors import ConfigError, SubmitError
from jobgen.nccl import nccl_env
from jobgen.plan import JobPlan, PlanContext, resolved_spec_doc
from jobgen.render import render_template

SPEC_FILE = "spec.json"
DS_CONFIG_FILE = "ds_config.json"


#: The submission record written into a job directory (runtime state, not a rendered file:
#: GitOps repos ignore it, e.g. ``manifests/**/.jobgen-submission.json`` in .gitignore).
SUBMISSION_FILE = ".jobgen-submission.json"


class Backend(Protocol):
    """A scheduler backend module (slurm, kubernetes, local)."""

    def plan(self, ctx: PlanContext) -> JobPlan:
        """Turn validated inputs into a JobPlan. Pure: no subprocess, network, clock."""
        ...

    def submit(self, plan: JobPlan, job_dir: Path) -> JobHandle:
        """Submit a written plan from ``job_dir``; never mutates ``plan``."""
        ...


_HANDLE_RE = re.compile(r"^(slurm|k8s|local)://(.+)$")


@dataclass(frozen=True)
class JobHandle:
    """A submitted job as a URI: ``slurm://<cluster>/<jobid>``, ``k8s://<context>/<ns>/<name>``,
    ``local://<run dir>``."""

    scheme: str
    path: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.path}"

    @classmethod
    def parse(cls, text: str) -> JobHandle:
        """Parse a handle URI.

        Raises:
            ConfigError: not of the form ``slurm://...``, ``k8s://...`` or ``local://...``.
        """
        match = _HANDLE_RE.match(text)
        if not match:
            raise ConfigError(
                f"{text!r} is not a job handle",
                hint="handles look like slurm://<cluster>/<jobid>, k8s://<context>/<ns>/<name> or local://<run dir>",
            )
        return cls(match.group(1), match.group(2))


@dataclass(frozen=True)
class JobStatus:
    """A job's state as the scheduler reports it.

    Attributes:
        handle: the job.
        state: the scheduler's word (SLURM: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED,
            TIMEOUT, PREEMPTED, NODE_FAIL, REQUEUED, ...; Kubernetes: SUBMITTED, CREATED, RUNNING,
            RESTARTING, SUSPENDED, SUCCEEDED, FAILED, TERMINATING), or ``UNKNOWN`` when no
            source knows the job (never a guess).
        source: where the state came from: ``squeue``, ``sacct`` (accounting), ``jobcomp``
            (the job-completion log), ``kube-apiserver``, or ``none``.
        details: further facts (nodes, reason, exit code, restarts, elapsed), all strings.
    """

    handle: JobHandle
    state: str
    source: str
    details: dict[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """True for end states (the job will not run again unless requeued by hand)."""
        return self.state in FINISHED_STATES


#: SLURM end states (squeue(1) "JOB STATE CODES" minus the ones that run again), plus the
#: Kubernetes backend's SUCCEEDED (job condition Succeeded/Complete) and DELETED (after cancel).
FINISHED_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
     "SUCCEEDED", "DELETED"}
)


@dataclass(frozen=True)
class Submission:
    """What ``jobgen submit`` recorded: enough for status/logs/cancel from a handle or a job dir.

    Attributes:
        handle: the job handle (URI string).
        job_dir: absolute path of the rendered job directory.
        run_dir: absolute path of the run directory (checkpoints, metrics, summary.json).
        log_file: absolute path of the scheduler's output file (``%j`` expanded), or ``None``.
        argv: the submit command that ran (in ``job_dir``).
        inputs_sha256: the rendered files' input hash (from their header).
    """

    handle: str
    job_dir: str
    run_dir: str
    log_file: str | None
    argv: tuple[str, ...]
    inputs_sha256: str | None = None

    def save(self) -> Path:
        """Write the record into the job dir and the user's state index; returns the job dir's file."""
        text = json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"
        targets = [Path(self.job_dir) / SUBMISSION_FILE, state_record_path(JobHandle.parse(self.handle))]
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, target)
        return targets[0]

    @classmethod
    def load(cls, path: Path) -> Submission:
        """Read a record written by :meth:`save`.

        Raises:
            ConfigError: the file is missing or not a submission record.
        """
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            data["argv"] = tuple(data["argv"])
            return cls(**data)
        except FileNotFoundError:
            raise ConfigError(f"no submission recorded at {path}", hint="submit the job first: jobgen submit <job dir>") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{path} is not a jobgen submission record ({exc})", hint="re-submit the job, or delete the file") from None


def state_dir() -> Path:
    """Where jobgen keeps submission records: ``$JOBGEN_STATE_DIR``, else
    ``$XDG_STATE_HOME/jobgen``, else ``~/.local/state/jobgen`` (XDG Base Directory spec)."""
    if os.environ.get("JOBGEN_STATE_DIR"):
        return Path(os.environ["JOBGEN_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "jobgen"


def state_record_path(handle: JobHandle) -> Path:
    """The state-index file for ``handle`` (``<state dir>/<scheme>/<path, '/' -> '__'>.json``)."""
    return state_dir() / handle.scheme / (handle.path.replace("/", "__") + ".json")


def find_submission(handle: JobHandle) -> Submission | None:
    """The recorded submission of ``handle`` from the state index, or ``None``."""
    path = state_record_path(handle)
    return Submission.load(path) if path.is_file() else None


def run_command(argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                timeout_s: float = 60.0, what: str = "command") -> subprocess.CompletedProcess[str]:
    """Run a scheduler command (argv list, never a shell) and return it when it exits 0.

    Raises:
        SubmitError: the program is missing, timed out, or exited non-zero; the message names
            argv, the return code and stderr.
    """
    try:
        proc = subprocess.run(list(argv), cwd=cwd, env=None if env is None else dict(env),
                              capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise SubmitError(
            f"{argv[0]} not found: cannot run {what}",
            hint=f"run jobgen where the scheduler's client tools are installed (e.g. a login node), or add {argv[0]} to PATH",
        ) from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{what} timed out after {timeout_s:.0f} s: {' '.join(argv)}", hint="is the scheduler's controller reachable?") from None
    if proc.returncode != 0:
        raise SubmitError(
            f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip() or proc.stdout.strip()}",
            hint="the scheduler's message is above",
        )
    return proc


def common_files(ctx: PlanContext, *, requeue_signal: str | None = None, cluster: str | None = None) -> list[tuple[str, str]]:
    """``spec.json`` (the resolved spec the entrypoint reads) and, for DeepSpeed, ``ds_config.json``."""
    files = []
    ds_name = None
    if ctx.spec.trainer.deepspeed_stage is not None:
        ds_name = DS_CONFIG_FILE
        files.append((DS_CONFIG_FILE, deepspeed.dumps(deepspeed.deepspeed_config(ctx.spec, ctx.world.world_size))))
    files.append((SPEC_FILE, resolved_spec_doc(ctx, deepspeed_config=ds_name, requeue_signal=requeue_signal, cluster=cluster)))
    return sorted(files)


def render_job_template(ctx: PlanContext, template: str, **context: Any) -> str:
    """Render ``template`` with the header fields every generated file names (jobgen version,
    profile, inputs sha256) plus ``context``."""
    return render_template(
        ctx.templates_dir, template, version=__version__, profile=ctx.profile.name, inputs_sha256=ctx.inputs_sha256, **context
    )


def job_env(ctx: PlanContext) -> dict[str, str]:
    """Environment for every rank: NCCL preset < profile env < spec env, sorted by name."""
    env = {
        **nccl_env(ctx.profile.network_fabric, uses_nccl=ctx.world.accelerator == "gpu"),
        **ctx.profile.env,
        **ctx.spec.env,
    }
    return dict(sorted(env.items()))
