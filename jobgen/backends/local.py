"""Local backend (the embedded default): the bundled entrypoint under torchrun on this machine.

``torchrun --standalone --nproc-per-node N -m jobgen.train`` in the foreground, gloo on CPU
(or NCCL when the profile has GPUs), OMP threads set per rank (LAB-NOTES: without it two ranks
each take every core and throughput drops 3-4x). Ctrl-C stops every rank: torchrun runs in
its own process group, gets SIGINT forwarded, and the whole group is killed after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import jobgen
from jobgen.backends.base import SPEC_FILE, JobHandle, common_files, job_env
from jobgen.errors import SubmitError
from jobgen.plan import JobPlan, PlanContext

SUMMARY_FILE = "summary.json"
#: Seconds torchrun gets to stop its ranks after Ctrl-C before the process group is killed.
INTERRUPT_GRACE_S = 15.0


def omp_threads(ctx: PlanContext) -> int:
    """OMP_NUM_THREADS per rank: the profile's setting, else CPU cores / ranks (>= 1)."""
    return ctx.profile.local.omp_threads_per_process or max(1, ctx.profile.cpus_per_node // ctx.world.devices_per_node)


def plan(ctx: PlanContext) -> JobPlan:
    """Plan a local run: ``spec.json`` (+ ``ds_config.json``) and the torchrun command line.

    The command runs in the job directory (the run directory for ``jobgen submit``); a bare
    ``python`` (no ``local.python`` in the profile) means the interpreter running jobgen.
    """
    argv = (
        ctx.profile.local.python or "python", "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(ctx.world.devices_per_node),
        "-m", "jobgen.train", "--spec", SPEC_FILE, "--run-dir", ".",
    )
    env = job_env(ctx) | {"OMP_NUM_THREADS": str(omp_threads(ctx))}
    return JobPlan(
        scheduler="local",
        profile=ctx.profile.name,
        job_name=ctx.spec.name,
        files=tuple(common_files(ctx)),
        submit_argv=argv,
        world=ctx.world,
        inputs_sha256=ctx.inputs_sha256,
        env=tuple(sorted(env.items())),
    )


def submit(plan: JobPlan, job_dir: Path) -> JobHandle:
    """Run the written plan in ``job_dir`` in the foreground and wait for it.

    Raises:
        SubmitError: torchrun or a rank exited non-zero, or the run was interrupted.
    """
    argv = list(plan.submit_argv)
    if argv[0] == "python":
        argv[0] = sys.executable
    env = os.environ.copy()
    env.update(plan.env)
    package_parent = str(Path(jobgen.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    print(f"jobgen: {plan.world.world_size} rank(s) on this machine, run directory {job_dir}", flush=True)
    print("jobgen: $ " + " ".join(argv), flush=True)
    try:
        proc = subprocess.Popen(argv, cwd=job_dir, env=env, start_new_session=True)
    except OSError as exc:
        raise SubmitError(f"cannot start {argv[0]}: {exc}", hint="install jobgen[train] (torch, lightning)") from None
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        print("\njobgen: interrupted; stopping every rank ...", file=sys.stderr, flush=True)
        _stop_group(proc)
        raise SubmitError("run interrupted (Ctrl-C); every rank was stopped", hint="run the same command again to resume from the last checkpoint") from None
    finally:
        if proc.poll() is None:
            _stop_group(proc)
    if code != 0:
        raise SubmitError(
            f"training exited with code {code} (argv: {' '.join(argv)}, cwd: {job_dir})",
            hint="the rank-zero error is printed above; rerun with the same command to resume from the last checkpoint",
        )
    summary = job_dir / SUMMARY_FILE
    if summary.is_file():
        print(f"jobgen: run directory {job_dir} (summary: {summary.name}, checkpoints/, logs/)")
    return JobHandle("local", str(job_dir))


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT torchrun's process group, wait, then SIGKILL whatever is left (no orphans)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
