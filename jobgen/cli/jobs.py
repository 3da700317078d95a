"""The commands on submitted jobs: ``jobgen ls``, ``status``, ``logs`` (``--first-error``) and
``cancel``, each through :mod:`jobgen.api` (the job's backend, found from its handle)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from jobgen import api
from jobgen.backends.base import JOB_STATES, LogOptions
from jobgen.cli.options import job_argument
from jobgen.cli.output import StateChoice, echo_doc, echo_progress, output_option, remember_output
from jobgen.errors import ConfigError, printable
from jobgen.reports.failure_class import classify, triage_evidence
from jobgen.reports.triage import format_triage
from jobgen.specs.capabilities import capabilities


@click.command(name="ls")
@click.option("--cluster", default=None, metavar="NAME",
              help="Only jobs of this SLURM cluster or Kubernetes context (`local` for local runs; the first host for ssh jobs).")
@click.option("--state", "states", multiple=True, type=StateChoice(JOB_STATES),
              help="Only jobs in this state after the refresh (repeatable, any case), e.g. --state RUNNING --state PENDING.")
@output_option()
def ls(cluster: str | None, states: tuple[str, ...], output: str) -> None:
    """List every job submitted from this machine (newest first), each refreshed from its
    scheduler: state, nodes x devices, start, elapsed and GPU-hours (CPU-hours on CPU
    clusters; cost when the profile has gpu_hour_price). ETA / VS PREDICTED: a running job's
    ETA (as `jobgen status` shows it), a finished run's measured step time over the one
    predicted at submit (its summary.json, where this machine can read it; docs/predict.md).
    RESTARTS (used/budget) once a job has a restart budget: jobgen's own restarts of a local or
    ssh run, the launch wrapper's or the pods' count on Kubernetes, SLURM's requeue count (every
    requeue, whatever its cause).

    \b
    The list comes from jobgen's state index (~/.local/state/jobgen, $JOBGEN_STATE_DIR).
    A scheduler that cannot be reached shows UNREACHABLE with the reason, and a job its
    scheduler no longer knows shows UNKNOWN: a state is never guessed.

    \b
    Example:
      jobgen ls
      jobgen ls --cluster jobgenlab --state RUNNING -o json
    """
    def progress(index: int, total: int, handle: str) -> None:
        if total > 3 and sys.stderr.isatty():
            click.echo(f"\rrefreshing {index + 1}/{total} {handle[:60]:60}", err=True, nl=False)

    rows = api.list_jobs(cluster=cluster, states=states, progress=progress)
    if sys.stderr.isatty() and len(rows) > 3:
        click.echo("\r" + " " * 80 + "\r", err=True, nl=False)
    if output == "json":
        click.echo(json.dumps([row.to_json() for row in rows], indent=2, sort_keys=True))
        return
    if not rows:
        click.echo("no jobs" + (" matching the filters" if cluster or states else " submitted from this machine yet"))
        return
    sweeps = any(row.record.sweep is not None for row in rows)  # a SWEEP column only when some job has one
    # a RESTARTS column ("<used>/<budget>") only when some job has a budget or was restarted
    restarts = any(row.restart_budget or row.restarts_used for row in rows)
    table = [("HANDLE", "NAME", "STATE", "NODES x DEV", "STARTED (UTC)", "ELAPSED", "DEVICE TIME", "COST", "ETA / VS PREDICTED")
             + (("RESTARTS",) if restarts else ()) + (("SWEEP",) if sweeps else ())]
    for row in rows:
        world = f"{row.num_nodes} x {row.devices_per_node} {row.accelerator}" if row.num_nodes else "-"
        name = (row.name or "-") + (f" (array of {len(row.record.array)})" if row.record.array else "")
        sweep = ((row.record.sweep.id if row.record.sweep is not None else "-"),) if sweeps else ()
        used = ((f"{_or_dash(row.restarts_used)}/{_or_dash(row.restart_budget)}",) if restarts else ())
        table.append((row.record.handle, name, row.state, world, *_usage_cells(row.status.usage if row.status else None),
                      _timing_cell(row), *used, *sweep))
        task_usage = {t.handle.array_task: t.usage for t in row.status.tasks} if row.status is not None else {}
        for task in row.tasks() if row.record.array else ():  # a job array's tasks, under it
            table.append((f"  {task['handle']}", f"  {task['name']}", task["state"], world, *_usage_cells(task_usage.get(task["index"])),
                          "-", *(("",) if restarts else ()), *sweep))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    for row in rows:
        if row.stale:
            click.echo(f"note: {row.record.handle}: {row.stale}")
        if row.prediction_note:
            click.echo(f"note: {row.record.handle}: prediction n/a: {row.prediction_note}")


def _timing_cell(row: api.ListedJob) -> str:
    """``jobgen ls``'s ETA / VS PREDICTED cell: a running job's ETA (or its step), a finished run's
    measured / predicted step time (``1.18x step time``: 18% slower than predicted), ``no prediction``, ``n/a``
    (a summary whose prediction cannot be shown: a note says why) or ``-``."""
    prog = row.progress
    if prog is not None:
        if prog.eta_s is not None:
            return f"ETA {_duration(prog.eta_s)}"
        return f"step {prog.step}/{prog.max_steps if prog.max_steps is not None else '?'}"
    if row.prediction_note:
        return "n/a"
    if row.prediction is not None:
        ratio = row.prediction["measured_over_predicted"].get("step_s")
        if ratio is not None:
            return f"{ratio:.2f}x step time"
        return "no prediction" if not row.prediction["available"] else "-"
    return "-"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _usage_cells(usage: Any) -> tuple[str, str, str, str]:
    """``jobgen ls``'s STARTED, ELAPSED, DEVICE TIME and COST cells of a :class:`~jobgen.reports.usage.Usage` (or None)."""
    if usage is None:
        return ("-", "-", "-", "-")
    started = usage.start.strftime("%Y-%m-%d %H:%M") if usage.start else "-"
    elapsed = _duration(usage.elapsed_s) if usage.elapsed_s is not None else "-"
    hours = usage.device_hours
    return (started, elapsed, f"{hours:.3f} {usage.unit}" if hours is not None else "-", f"{usage.cost:.2f}" if usage.cost is not None else "-")


def _duration(seconds: float) -> str:
    """``H:MM:SS`` (days as ``Nd H:MM:SS``)."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


@click.command()
@job_argument
@output_option()
@click.option("--json", "as_json", is_flag=True, hidden=True, is_eager=True, help="Same as -o json (kept for scripts).",
              callback=lambda ctx, param, value: remember_output(ctx, param, "json") if value else value)
def status(job: str, output: str, as_json: bool) -> None:
    """Show the state of JOB (a handle like slurm://<cluster>/<jobid>, k8s://<context>/<ns>/<name>
    or local://<run dir>, or a submitted job directory).

    \b
    SLURM: squeue while the job is queued or running; afterwards sacct when the
    cluster keeps accounting, else the job-completion log (sacct -c); UNKNOWN when
    no source knows the job (never a guess).
    Kubernetes: the job's conditions (CREATED, RUNNING, RESTARTING, COMPLETED,
    FAILED, ...) and replica counts; CANCELLED once `jobgen cancel` deleted it,
    UNKNOWN when the object does not exist otherwise.
    local: how the last start went: RUNNING, COMPLETED, FAILED (exit code, first
    error) or CANCELLED (Ctrl-C).
    A failed job's failure class (user: not retried; infrastructure, unknown:
    retried) and its reason, from what the scheduler reports, and the spec's restart
    budget (restart.max_restarts) from its job directory's spec.json, beside the restarts
    used: those jobgen made in a local run or through the ssh watcher (restarts_used,
    restart_<n>: class, reason), on Kubernetes the launch wrapper's count from the head of each
    pod's log, else the pods' restartCount (restarts_source says which), or SLURM's count of
    its requeues (docs/failures.md).
    Progress: the step of max_steps, tokens/s of the last log interval and the ETA at that rate,
    from the run's metrics.csv where this machine can read the run directory (local; SLURM and
    ssh on a shared filesystem), or on Kubernetes from the last progress line of the rank-zero
    pod's log (docs/predict.md).
    -o json: {"handle", "state", "source", "details", "usage", "failure", "progress"} (failure adds
    "max_restarts"; a job array adds "tasks"; progress null where not readable); a scheduler that
    cannot be asked is an error (exit 1), as JSON too.
    """
    submitted = api.resolve(job)  # one lookup for the state, the restart budget and the progress
    st = api.status(submitted)
    used = st.details.get("restarts", "")  # SLURM: squeue's restart_cnt (the job's requeues so far)
    local_used = st.details.get("restarts_used", "")  # a local or ssh run: "<n> of <budget>", jobgen's own restarts
    restarted = used not in ("", "0") or (local_used != "" and not local_used.startswith("0 "))
    budget = api.restart_budget(submitted) if st.failure is not None or restarted else None
    prog = api.progress(submitted)
    if output == "json" or as_json:
        doc = st.to_json() | {"progress": None if prog is None else prog.to_json()}
        if doc["failure"] is not None:
            doc["failure"]["max_restarts"] = budget
        click.echo(json.dumps(doc, sort_keys=True))
        return
    # the scheduler's words (a reason, a pod's message) are shown printable: they cannot end the line or drive the terminal
    details = ", ".join(f"{printable(k)} {printable(v)}" for k, v in sorted(st.details.items()) if v not in ("", "None"))
    click.echo(f"{st.handle}  {st.state}  ({st.source}{'; ' + details if details else ''})")
    if st.failure is not None:
        click.echo(f"  failure: {st.failure.describe()}")
    # who counted the restarts used: jobgen (local, ssh), or on Kubernetes its launch wrapper or the pods
    caps = capabilities(st.handle.scheduler)
    itself = caps.restarts_by_jobgen or (f"{caps.label}: {printable(st.details['restarts_source'])}" if "restarts_source" in st.details else None)
    if budget is not None and "restarts_used" in st.details and itself:
        click.echo(f"  restart budget: max_restarts {budget}, {printable(st.details['restarts_used'])} used ({itself})")
    elif budget is not None:
        shown_used = f", {printable(used)} used" if used else ""
        click.echo(f"  restart budget: max_restarts {budget}{shown_used} (spec.json)")
    if st.usage is not None:
        click.echo(f"  usage: {st.usage.describe()}")
    if prog is not None:
        rate = f", {prog.tokens_per_s:,.0f} tokens/s (last log interval)" if prog.tokens_per_s is not None else ""
        eta = ("" if prog.eta_s is None else ", max_steps reached" if prog.eta_s == 0 else f", ETA {_duration(prog.eta_s)}")
        where = f"{printable(prog.source)} line" if prog.source.startswith("pod ") else "metrics.csv"  # Kubernetes: rank zero's log
        click.echo(f"  progress: step {prog.step}/{prog.max_steps if prog.max_steps is not None else '?'}{rate}{eta} "
                   f"({where} written {_duration(prog.updated_s_ago)} ago)")
    for task in st.tasks:  # a SLURM job array: one line per task
        shown = ", ".join(f"{printable(k)} {printable(v)}" for k, v in sorted(task.details.items()) if v not in ("", "None") and k != "name")
        click.echo(f"  {task.handle}  {task.state}  {printable(task.details.get('name', ''))}  ({task.source}{'; ' + shown if shown else ''})")


@click.command()
@job_argument
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job ends (Ctrl-C stops following).")
@click.option("--rank", default=None, metavar="N|all",
              help="SLURM: global rank whose lines to show (srun --label prefixes), or `all` for the whole file [default: 0].")
@click.option("--replica", default=None, metavar="TYPE-INDEX",
              help="Kubernetes: the pod to read, e.g. master-0 (default; rank zero runs there), worker-1 (an elastic job's "
                   "default: worker-0; its rank zero runs on the pod its log names); TrainJob: node-0 (default) .. node-<N-1>. "
                   "ssh: the node whose output to show, node-0 (default) .. node-<N-1>.")
@click.option("--first-error", is_flag=True,
              help="Read every rank's (SLURM; local: the run's output.log) or pod's (Kubernetes) output and show the first failure: its rank or pod, "
                   "node, traceback or NCCL error, then the others in order, and the failure's class (user, infrastructure, unknown) with its reason.")
@output_option()
def logs(job: str, follow: bool, rank: str | None, replica: str | None, first_error: bool, output: str) -> None:
    """Print JOB's output: rank zero's lines plus the batch script's own (SLURM), or the
    Master pod's output (Kubernetes), by default; a local run's output.log (every rank's lines).

    With --first-error, triage a failed job: when one rank fails, the others fail after it, and
    the earliest failure (Kubernetes: by the kubelet's timestamps; SLURM: by its place in srun's
    output, which is the order of arrival) is the one that explains the job's end.

    \b
    Example:
      jobgen logs -f slurm://lab/42
      jobgen logs --rank 3 manifests/slurm-a100/quickstart
      jobgen logs -f --replica worker-0 k8s://prod/training/quickstart
      jobgen logs --first-error slurm://lab/42
    """
    if first_error:
        if follow or rank is not None or replica is not None:
            raise ConfigError("--first-error reads every rank's output; it does not combine with --follow, --rank or --replica",
                              hint="drop those options, or drop --first-error")
        submitted = api.resolve(job)  # a job directory is read once
        handle = str(submitted.handle)
        found = api.first_error(submitted)
        decided = classify(triage_evidence(found))
        if output == "json":
            click.echo(json.dumps({"handle": handle, "ordered_by": found.ordered_by,
                                   "first": None if found.first is None else found.first.to_json(),
                                   "failures": [f.to_json() for f in found.failures], "srun_exits": list(found.exits),
                                   "failure": None if decided is None else decided.to_json()}, indent=2))
        else:
            for line in format_triage(found, handle):
                click.echo(line)
            if decided is not None:
                click.echo("")
                click.echo(f"failure: {decided.describe()}")
        return
    if output == "json":
        raise ConfigError("logs -o json applies to --first-error only", hint="add --first-error, or drop -o json")
    try:
        api.logs(job, LogOptions(follow=follow, rank=rank, replica=replica), click.echo)
    except KeyboardInterrupt:
        click.echo("", err=True)


@click.command()
@job_argument
@click.option("--wait-s", default=120.0, show_default=True, help="Seconds to wait for the job to end after scancel / the delete.")
@output_option()
def cancel(job: str, wait_s: float, output: str) -> None:
    """Cancel JOB and wait until every rank has stopped (SLURM: scancel, then squeue;
    Kubernetes: delete with foreground propagation, so the pods go before the job)."""
    st = api.cancel(job, wait_s=wait_s, echo=echo_progress)
    if output == "json":
        echo_doc(st.to_json())
        return
    click.echo(f"{st.handle}  {st.state}")
