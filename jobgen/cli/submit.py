"""``jobgen submit``: one job (a spec or a rendered job directory) through :func:`jobgen.api.submit`,
or a sweep through :mod:`jobgen.api.sweep`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from jobgen import api
from jobgen.backends.base import SubmitOptions
from jobgen.cli.options import crds_dir_option, profiles_dir_option, set_option, templates_dir_option
from jobgen.cli.output import document_mode, echo_doc, echo_progress, output_option, stdout_to_stderr, warn_plan
from jobgen.cli.validate import check_imports
from jobgen.errors import ConfigError
from jobgen.planning.plan import JobPlan


@click.command()
@click.argument("target", type=click.Path())
@click.option("--profile", "-p", default=None, help="Cluster profile (required when TARGET is a spec file).")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Runs go to <runs-dir>/<job name>/ (checkpoints, metrics, summary.json; SLURM: slurm-<jobid>.out). "
                   "SLURM: must be on a filesystem the compute nodes share.")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="SLURM/Kubernetes: render a spec into <out>/<profile>/<job name>/ before submitting (e.g. "
                   "--out manifests for GitOps); default: <runs-dir>/<job name>/job/, so manifests/ is touched only when asked.")
@output_option(has_out=True)
@click.option("--test-only", is_flag=True, help="SLURM: `sbatch --test-only`: let SLURM check the request and estimate a start; queue nothing.")
@click.option("--force", is_flag=True, help="SLURM: submit even though the same job directory has a job pending or running.")
@click.option("--dry-run", "dry_run", type=click.Choice(["server"]), default=None, is_flag=False, flag_value="server",
              help="Kubernetes: `--dry-run=server`: the API server validates the job, its ConfigMap and a Pod from each "
                   "replica's template (dryRun=All, strict fields where supported); nothing is created.")
@click.option("--allow-dirty", is_flag=True,
              help="SLURM/local/ssh: snapshot the code although its git work tree has uncommitted changes; they are copied "
                   "over the committed tree and their git diff + sha256 recorded.")
@click.option("--replace", is_flag=True, help="Kubernetes: when the job exists with other inputs, delete it (and its pods) and create this one.")
@click.option("--context", "k8s_context", default=None, help="Kubernetes: kubeconfig context (default: $JOBGEN_K8S_CONTEXT, the profile's, the current one).")
@click.option("--namespace", "-n", "k8s_namespace", default=None, help="Kubernetes: namespace (default: $JOBGEN_K8S_NAMESPACE, else the manifest's).")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False),
              help="Kubernetes: kubeconfig file (default: the profile's, $KUBECONFIG, ~/.kube/config).")
@click.option("--preflight", is_flag=True,
              help="Start the job with the all-reduce preflight (bandwidth per node; exit 1 naming a node that does not "
                   "join or is far slower), as if the profile said `preflight: true`. Spec files only.")
@click.option("--smoke", type=click.IntRange(min=1), default=None, metavar="N",
              help="A cheap first run: N optimizer steps, named <name>-smoke, no checkpoints written or resumed "
                   "(spec.json records it: smoke: true).")
@click.option("--no-import-check", "no_import_check", is_flag=True,
              help="Skip importing the spec's class_path classes in this environment before submitting "
                   "(for code that exists on the nodes only).")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY.PATH=V1,V2",
              help="Render and submit a sweep (repeatable: the Cartesian grid; the syntax and names of `render --sweep`): "
                   "ONE job array on a SLURM profile with slurm.sweep_as_array, else one job per point; every handle is "
                   "printed and `jobgen ls` lists them together. Spec files only.")
@set_option
@profiles_dir_option
@templates_dir_option
@crds_dir_option
def submit(target: str, profile: str | None, runs_dir: str, out: str | None, output: str, test_only: bool, force: bool, dry_run: str | None,
           allow_dirty: bool, replace: bool, k8s_context: str | None, k8s_namespace: str | None, kubeconfig: str | None,
           preflight: bool, smoke: int | None, no_import_check: bool, sweeps: tuple[str, ...],
           overrides: tuple[str, ...], profiles_dir: str | None, templates_dir: str | None) -> int | None:
    """Run or submit TARGET: a spec file (rendered for --profile first) or a rendered job directory.

    \b
    local profile: the job runs in the foreground on this machine (torchrun, one
      process per rank, progress on screen); Ctrl-C stops every rank.
    SLURM profile: renders to <runs-dir>/<job name>/job/ (or --out), runs `sbatch --parsable`
      there and prints the handle slurm://<cluster>/<jobid>; the submission is recorded
      in the job directory, so status/logs/cancel take the handle or the directory.
    Kubernetes profile: renders, asks the API server to validate everything (dry run),
      then creates the ConfigMap and the PyTorchJob/TrainJob and prints the handle
      k8s://<context>/<namespace>/<name>. The same inputs again: nothing changes;
      other inputs: refused unless --replace.
    ssh profile: checks that every host answers (ssh in BatchMode), copies the job
      directory and code snapshot to <workdir>/<job name>/ on each, starts
      `bash launch.sh <node rank>` there and prints ssh://<first host><run dir>.
    A rendered job directory (e.g. committed under manifests/) is submitted as is.
    SLURM, ssh and local: the code (the git repository holding the spec, or the spec's
    `code.repo`) is snapshotted into <runs-dir>/<job name>/code/<commit>/ and put
    first on every rank's PYTHONPATH; uncommitted changes are refused unless --allow-dirty.
    A spec naming your own classes (model/data class_path) is imported and its
    init_args checked here first (as `jobgen validate --import`), unless --no-import-check.
    --smoke N runs N steps as <name>-smoke, keeping no checkpoints: a cheap first run.
    Running the same job again resumes from the newest checkpoint in
    <runs-dir>/<job name>/checkpoints (the spec's checkpoint.resume: auto);
    start over with --set checkpoint.resume=never, or a new --set name=...
    --sweep renders and submits a sweep in one command (docs/sweeps.md, "Submitting a sweep"); the
    first failure stops it, naming the points submitted and those not (exit 1).
    -o json prints {"action", "handle", "job_dir", "run_dir", "log_file", "tasks", "lines"}
    on stdout once submit is done (--sweep: {"sweep", "jobs": [that + "index", "name",
    "point"], "failed", "not_submitted"}); progress (a local run's ranks too) goes to stderr.

    \b
    Examples:
      jobgen submit examples/quickstart.yaml --profile local
      jobgen submit examples/quickstart.yaml --profile slurm-cpu --set resources.nodes=2
      jobgen submit examples/quickstart.yaml -p slurm-cpu-array --sweep trainer.learning_rate=1e-4,3e-4
      jobgen submit manifests/slurm-a100/quickstart --test-only
      jobgen submit examples/quickstart.yaml --profile k8s-h100 --dry-run=server
      jobgen submit manifests/k8s-h100/quickstart --context prod --replace
      jobgen submit examples/quickstart.yaml --profile slurm-cpu -o json
    """
    options = SubmitOptions(runs_dir=Path(runs_dir), test_only=test_only, force=force, dry_run=dry_run == "server",
                            replace=replace, context=k8s_context, namespace=k8s_namespace, kubeconfig=kubeconfig,
                            allow_dirty=allow_dirty)
    target_or_plan: str | JobPlan = target
    if Path(target).is_dir():
        if overrides or profile or preflight or smoke or sweeps:
            raise ConfigError(
                f"{target} is a rendered job directory: --set, --profile, --preflight, --smoke and --sweep apply to spec files",
                hint="change the spec (or set `preflight: true` in the profile) and re-render (jobgen render SPEC --profile P), "
                     "then submit the directory",
            )
    else:
        if profile is None:
            raise ConfigError("submitting a spec needs --profile", hint=f"e.g. jobgen submit {target} --profile local")
        if sweeps:
            return _submit_sweep(target, profile, sweeps, options, out=out, overrides=overrides, profiles_dir=profiles_dir,
                                 templates_dir=templates_dir, preflight=preflight, smoke=smoke, import_check=not no_import_check)
        loaded, prof = api.load(target, profile, overrides=overrides, profiles_dir=profiles_dir, preflight=preflight)
        target_or_plan = api.plan_loaded(loaded, prof, target, profile_source=profile, templates=templates_dir, smoke=smoke)
        warn_plan(target_or_plan)
        if options.dry_run or options.test_only:
            warn_example_values(target_or_plan)
        if not no_import_check:
            check_imports(target, loaded)
    with stdout_to_stderr():
        result = api.submit(target_or_plan, options, out=out, echo=echo_progress)
    if output == "json":
        echo_doc(submit_json(result))
        return None
    print_submitted(result)
    return None


def warn_example_values(job_plan: JobPlan) -> None:
    """On stderr: the plan's profile holds example values (:attr:`JobPlan.placeholders`), which
    this dry run takes and a real submit refuses. Nothing when it holds none."""
    if job_plan.placeholders:
        fields = ", ".join(path for path, _, _ in job_plan.placeholders)
        click.echo(f"warning: profile {job_plan.profile!r} holds example values ({fields}); a real jobgen submit refuses it "
                   "until a profile of yours sets them (docs/profiles.md, \"Example values\")", err=True)


def submit_json(result: Any) -> dict[str, Any]:
    """One submitted job for ``jobgen submit -o json`` (a :class:`~jobgen.backends.base.SubmitResult`)."""
    record = result.record
    return {"action": result.action, "handle": None if result.handle is None else str(result.handle),
            "job_dir": record.job_dir if record else None, "run_dir": record.run_dir if record else None,
            "log_file": record.log_file if record else None, "lines": list(result.lines),
            "tasks": [{"handle": f"{result.handle}_{t.index}", **t.model_dump(mode="json")} for t in (record.array or ())]
            if record else []}


def print_submitted(result: Any) -> None:
    """What ``jobgen submit`` prints for one job (a :class:`~jobgen.backends.base.SubmitResult`)."""
    if result.handle is None:
        click.echo("validated: the scheduler accepts the job; nothing was queued or created")
        return
    handle = result.handle
    verb = {"unchanged": f"unchanged {handle}: it already exists with identical inputs; nothing was submitted"}.get(
        result.action, f"{result.action} {handle}")
    click.echo(verb)
    if result.record is not None and result.action == "submitted" and result.record.array:
        tasks = result.record.array
        click.echo(f"  job array of {len(tasks)} task(s), one per sweep point; one task: {handle}_<task>")
        for task in tasks:
            click.echo(f"  {handle}_{task.index}  {task.name}  run dir {task.run_dir}  log {task.log_file}")
    elif result.record is not None and result.action == "submitted":
        click.echo(f"  run dir: {result.record.run_dir}" + (f"\n  log:     {result.record.log_file}" if result.record.log_file else ""))
    if result.action != "completed":
        quoted = shlex.quote(str(handle))  # an ssh handle holds the hosts' run directory, which may need quotes
        click.echo(f"  follow:  jobgen logs -f {quoted}   status: jobgen status {quoted}   stop: jobgen cancel {quoted}")


def _submit_sweep(spec: str, profile: str, sweeps: tuple[str, ...], options: SubmitOptions, *, out: str | None,
                  overrides: tuple[str, ...], profiles_dir: str | None, templates_dir: str | None, preflight: bool,
                  smoke: int | None, import_check: bool) -> int:
    """``jobgen submit SPEC --sweep ...`` (:mod:`jobgen.api.sweep`): plan every point, check
    their classes, submit, print every handle. Returns the exit code (1: partly submitted)."""
    from jobgen.api.sweep import SweepPartlySubmitted, outcome_json, plan_sweep, submit_sweep

    sweep = plan_sweep(spec, profile, sweeps, overrides=overrides, profiles_dir=profiles_dir,
                       templates_dir=templates_dir, preflight=preflight, smoke=smoke)
    for warning in dict.fromkeys(w for job in sweep.jobs for w in job.plan.warnings):  # once, not once per point
        click.echo(f"warning: {warning}", err=True)
    if options.dry_run or options.test_only:
        warn_example_values(sweep.jobs[0].plan)
    if import_check:
        shown: set[str] = set()
        for label, point_spec in sweep.point_specs():
            check_imports(spec, point_spec, shown=shown, source=f"{spec} ({label})")
    how = "one SLURM job array" if sweep.array else "one job per point"
    echo_progress(f"sweep of {sweep.name} on {sweep.profile}: {sweep.points} point(s), {how}")
    try:
        with stdout_to_stderr():
            outcome = submit_sweep(sweep, options, out=out, echo=echo_progress)
    except SweepPartlySubmitted as exc:
        if not document_mode():
            raise
        echo_doc({"error": exc.message, "hint": exc.hint, "location": exc.location, "exit_code": exc.exit_code,
                   **outcome_json(exc.outcome, submit_json)})
        return exc.exit_code
    if document_mode():
        echo_doc(outcome_json(outcome, submit_json))
        return 0
    if sweep.array:
        click.echo(f"sweep {outcome.sweep_id}: {sweep.points} point(s) as one job array")
        print_submitted(outcome.submitted[0][1])
        return 0
    click.echo(f"sweep {outcome.sweep_id}: {sweep.points} job(s), one per point")
    for job, result in outcome.submitted:
        click.echo(f"  {result.action} {result.handle or '(nothing queued)'}  {job.describe()}")
    if any(result.action != "completed" and result.handle is not None for _, result in outcome.submitted):
        click.echo("  list them: jobgen ls   follow one: jobgen logs -f <handle>   status: jobgen status <handle>")
    return 0
