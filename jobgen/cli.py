"""The ``jobgen`` command line: parse -> load -> plan -> print/write/submit. Thin by design:
every operation is a call into :mod:`jobgen.api` / :mod:`jobgen.gitops.manifests`; no scheduler branching.

Size: above ~500 lines because each command's ``--help`` text (examples included) lives with its
options here, where users read it, and there is one command per verb (render, diff, submit,
status, ls, logs, cancel, validate, plan, profiles, schema); the logic is in the modules they call.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import yaml

from jobgen import __version__, api
from jobgen.backends.base import JOB_STATES, LogOptions, SubmitOptions
from jobgen.errors import ConfigError, JobgenError
from jobgen.jobdir import resolve_job
from jobgen.planning.plan import JobPlan
from jobgen.reports.triage import format_triage
from jobgen.specs.load import (
    list_profile_names,
    load_profile,
    load_profile_doc,
    load_spec,
)
from jobgen.specs.profile import PROFILE_FILE_CONTEXT
from jobgen.specs.training import TrainingSpec

#: Per invocation (reset by :meth:`JobgenGroup.main`): ``debug`` (tracebacks for errors) and
#: ``output`` (the -o format, which decides how an error is printed).
_STATE: dict[str, Any] = {"debug": False, "output": "text"}

# --------------------------------------------------------------------------- output format, errors, --debug
#
# The conventions every command follows (README "Usage"):
# - `-o/--output FORMAT` is the output format (text|json, plus yaml where manifests, a profile or
#   a schema are printed: render, profiles show, schema); the output directory is `--out DIR`
#   (render, diff, submit).
# - With -o json (or yaml), stdout holds exactly one document: the result, or on failure
#   {"error", "hint", "location", "exit_code"}; progress, warnings and notes go to stderr.
# - Exit codes: 0 done; 2 bad input (a JobgenError's default, click's usage errors); 1 a
#   scheduler, cluster, git or training failure (SubmitError, GitError); 130 interrupted.
# - `--debug` (tracebacks) is taken before the subcommand and by every subcommand.


class OutputFormat(click.Choice):
    """The ``-o/--output`` choice (case-insensitive). On a command that also has ``--out DIR``,
    a value that is no format is the old ``-o DIR`` habit: refused (exit 2) naming ``--out``."""

    def __init__(self, formats: tuple[str, ...], *, has_out: bool):
        super().__init__(formats, case_sensitive=False)
        self.has_out = has_out

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if self.has_out and str(value).lower() not in self.choices:
            self.fail(f"{value!r} is not an output format: -o/--output is the output format ({', '.join(self.choices)}); "
                      f"the output directory is --out {value}", param, ctx)
        return super().convert(value, param, ctx)


class StateChoice(click.Choice):
    """A job state, in any case (``--state running``); the valid states are listed as jobgen prints them (upper case)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(str(value).upper(), param, ctx)


def _remember_output(ctx: click.Context, param: click.Parameter, value: str) -> str:
    _STATE["output"] = value
    return value


def output_option(*formats: str, has_out: bool = False, yaml_help: str = "the same document as json, in YAML") -> Callable[[Any], Any]:
    """``-o/--output``: the command's output formats, the first being the default (``text``,
    ``json`` when none are given); ``yaml_help`` says what ``-o yaml`` prints where it is one.
    Eager, so an error while parsing the rest of the command line is already printed in the
    format asked for."""
    formats = formats or ("text", "json")
    return click.option(
        "--output", "-o", "output", type=OutputFormat(formats, has_out=has_out), default=formats[0], show_default=True,
        is_eager=True, callback=_remember_output,
        help="Output format: text for people; json for machines (one document, stable keys; errors too: "
             '{"error", "hint", "location", "exit_code"})' + (f"; yaml: {yaml_help}" if "yaml" in formats else "") + "."
        + (" The output directory is --out." if has_out else ""),
    )


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        _STATE["debug"] = True
    return value


def _debug_param() -> click.Option:
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                        help="Show tracebacks for errors (also: JOBGEN_DEBUG=1).")


def _document_mode() -> bool:
    """-o json or -o yaml: stdout holds one document (the result or the error), nothing else."""
    return _STATE["output"] in ("json", "yaml")


def _progress(message: Any = "", **kwargs: Any) -> None:
    """``click.echo`` for what a command says along the way: stderr with -o json|yaml (stdout holds the document)."""
    click.echo(message, **{**kwargs, "err": kwargs.get("err", False) or _document_mode()})


class _BlockDumper(yaml.SafeDumper):
    """YAML for -o yaml: a string of several lines (a rendered file) as a literal ``|`` block, so
    it reads as the file itself; PyYAML falls back to a quoted scalar where a block cannot hold
    the string exactly (e.g. trailing spaces)."""


_BlockDumper.add_representer(
    str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def _echo_doc(doc: Any) -> None:
    """Print the command's one document in the -o format: JSON (indented, sorted keys) or, with
    -o yaml, the same document as YAML (sorted keys; multi-line strings as ``|`` blocks)."""
    if _STATE["output"] == "yaml":
        click.echo(yaml.dump(doc, Dumper=_BlockDumper, sort_keys=True, allow_unicode=True, width=float("inf")), nl=False)
        return
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """With -o json|yaml, file descriptor 1 points at stderr while this runs, so what child
    processes print (a local run's ranks, a scheduler client) cannot mix into the document."""
    if not _document_mode():
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def print_error(exc: JobgenError | click.ClickException | click.exceptions.Abort) -> int:
    """Print ``exc`` the way the invocation asked (-o json|yaml: one document on stdout; else
    text on stderr, without a traceback unless --debug) and return its exit code."""
    if isinstance(exc, JobgenError):
        code = exc.exit_code
        error = f"{exc.location}: {exc.message}" if exc.location else exc.message
        hint, location = exc.hint, exc.location
        if _STATE["debug"]:
            traceback.print_exc()
    elif isinstance(exc, click.exceptions.Abort):
        code, error, hint, location = 130, "aborted", None, None
    else:
        code, error, location = exc.exit_code, exc.format_message(), None
        ctx = getattr(exc, "ctx", None)
        hint = f"{ctx.command_path} --help" if ctx is not None else None
    if _document_mode():
        _echo_doc({"error": error, "hint": hint, "location": location, "exit_code": code})
    elif isinstance(exc, JobgenError):
        click.echo(f"error: {exc}", err=True)
    elif isinstance(exc, click.ClickException):
        exc.show()
    else:
        click.echo("aborted", err=True)
    return code


class JobgenGroup(click.Group):
    """The ``jobgen`` group: every subcommand (of sub-groups too) also takes ``--debug``, and
    :meth:`main` prints errors through :func:`print_error` (so ``jobgen.cli.main`` and click's
    CliRunner behave alike)."""

    group_class = type  # sub-groups (`jobgen profiles`) are JobgenGroups too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any("--debug" in param.opts for param in cmd.params):
            cmd.params.append(_debug_param())
        super().add_command(cmd, name)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        _STATE.update(debug=bool(os.environ.get("JOBGEN_DEBUG")), output="text")
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except (JobgenError, click.ClickException, click.exceptions.Abort) as exc:
            code = print_error(exc)
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


_set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
    help="Override a spec field, e.g. --set trainer.max_steps=200 (repeatable; value parsed as YAML).",
)
_profiles_dir_option = click.option(
    "--profiles-dir", type=click.Path(file_okay=False), default=None,
    help="Directory searched first for profiles (then $JOBGEN_HOME/cluster_profiles, ./cluster_profiles, packaged).",
)


def _set_crds_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        os.environ["JOBGEN_CRDS_DIR"] = value  # read by jobgen.backends.k8s_validate.crds_dir()
    return value


_crds_dir_option = click.option(
    "--crds-dir", type=click.Path(file_okay=False), default=None, expose_value=False, is_eager=True, callback=_set_crds_dir,
    help="Kubernetes: directory of CRDs for offline validation (default: $JOBGEN_CRDS_DIR, else jobgen's packaged Kubeflow CRDs).",
)
_templates_dir_option = click.option(
    "--templates-dir", type=click.Path(file_okay=False), default=None,
    help="Directory searched first for templates (then $JOBGEN_HOME/templates, ./templates, packaged).",
)


@click.group(cls=JobgenGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="jobgen")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
              help="Show tracebacks for errors (also: JOBGEN_DEBUG=1; every subcommand takes it too).")
def cli() -> None:
    """Turn a cluster profile + a training spec into ready-to-run distributed training jobs.

    \b
    Quick start (trains a small GPT with 2 processes on this machine):
      jobgen submit examples/quickstart.yaml --profile local
    Render for a cluster (files go to manifests/<profile>/<job name>/):
      jobgen render examples/quickstart.yaml --profile slurm-a100
      jobgen render examples/quickstart.yaml --profile k8s-h100

    \b
    Every command that prints takes -o/--output text|json (errors too are JSON then), and
    yaml where manifests or a profile are printed (render, profiles show, schema);
    the output directory of render, diff and submit is --out DIR.
    """


def _warn(job_plan: JobPlan) -> None:
    for warning in job_plan.warnings:
        click.echo(f"warning: {warning}", err=True)


_sweep_option = click.option(
    "--sweep", "sweeps", multiple=True, metavar="KEY.PATH=V1,V2",
    help="Render one job per value (repeatable: the Cartesian grid), named <name>-<key><value>-..., e.g. --sweep trainer.learning_rate=1e-4,3e-4.",
)
_project_option = click.option(
    "--project", type=click.Path(dir_okay=False), default=None,
    help="Project file for --all (default: jobgen.yaml in the working directory or the nearest parent).",
)


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False), required=False)
@click.option("--profile", "-p", default=None, help="Cluster profile name (see `jobgen profiles list`) or a .yaml path.")
@click.option("--out", default="manifests", show_default=True, type=click.Path(file_okay=False),
              help="Output root; files go to <out>/<profile>/<job name>/.")
@output_option("text", "json", "yaml", has_out=True,
               yaml_help="the same document as json, in YAML, each file's text a literal block")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the plan (every file and the submit command) instead of writing.")
@click.option("--all", "all_jobs", is_flag=True, help="Render every job jobgen.yaml lists (plus index.yaml and kustomizations).")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 and print a unified diff if the files differ from a fresh render, 0 if in sync.")
@click.option("--prune", is_flag=True, help="With --all: remove job directories jobgen wrote that jobgen.yaml no longer lists.")
@click.option("--commit", "commit_flag", is_flag=True, help="Render, then git add exactly the rendered files and git commit them.")
@_project_option
@_sweep_option
@_set_option
@_profiles_dir_option
@_templates_dir_option
@_crds_dir_option
@click.pass_context
def render(ctx: click.Context, spec: str | None, profile: str | None, out: str, output: str, to_stdout: bool, all_jobs: bool,
           check: bool, prune: bool, commit_flag: bool, project: str | None, sweeps: tuple[str, ...], overrides: tuple[str, ...],
           profiles_dir: str | None, templates_dir: str | None) -> int | None:
    """Render SPEC for a cluster profile, or every job of jobgen.yaml (--all), without submitting.

    \b
    Writes <out>/<profile>/<job name>/:
      job.sbatch          SLURM profiles (submit with: cd <dir> && sbatch job.sbatch)
      pytorchjob.yaml     Kubernetes profiles (ConfigMap + Kubeflow PyTorchJob)
      kustomization.yaml  Kubernetes profiles (kubectl apply -k <dir>)
      spec.json           the resolved spec the entrypoint reads on every node
      ds_config.json      DeepSpeed strategies only
    The same inputs always give byte-identical files (commit them: GitOps).
    --all also writes <out>/index.yaml and kustomization.yaml per Kubernetes profile and on top.
    -o json prints {"out", "jobs": [{name, profile, scheduler, job_dir, world, files, ...}]}
    (with --stdout, files maps each name to its text; with --check, "in_sync" too);
    -o yaml prints the same document in YAML, each file's text a literal | block
    (--stdout -o yaml: every rendered file, readable, in one machine-readable stream).

    \b
    Examples:
      jobgen render examples/quickstart.yaml --profile slurm-a100 --set resources.nodes=2
      jobgen render examples/quickstart.yaml --profile slurm-a100 --out build/manifests -o json
      jobgen render examples/quickstart.yaml --profile k8s-h100 --stdout -o yaml
      jobgen render --all --check        # CI / pre-commit: exit 1 + diff when out of date
      jobgen render --all --prune --commit
      jobgen render examples/quickstart.yaml -p k8s-h100 --sweep trainer.learning_rate=1e-4,3e-4
    """
    from jobgen.gitops import manifests as gitops
    if to_stdout and (all_jobs or check or prune or commit_flag):
        raise ConfigError("--stdout cannot be combined with --all, --check, --prune or --commit", hint="drop --stdout")
    if prune and not all_jobs:
        raise ConfigError("--prune needs --all (stale jobs are those jobgen.yaml no longer lists)", hint="jobgen render --all --prune")
    if check and commit_flag:
        raise ConfigError("--check and --commit exclude each other", hint="--check only compares; --commit writes and commits")
    out_given = ctx.get_parameter_source("out") is not click.core.ParameterSource.DEFAULT
    rendered = gitops.build_render(spec=spec, profile=profile, all_jobs=all_jobs, project=project, overrides=overrides,
                                   sweeps=sweeps, out=out, out_given=out_given, profiles_dir=profiles_dir, templates_dir=templates_dir)
    if to_stdout:
        for job in rendered.jobs:
            _warn(job.plan)
            if output == "text":
                click.echo(str(job.plan), nl=False)
        if output != "text":
            _echo_doc({"out": None, "jobs": [_job_json(job.plan, None, with_text=True) for job in rendered.jobs]})
        return 0
    code = gitops.render_command(rendered, check=check, prune=prune, commit_flag=commit_flag, echo=_progress)
    if output != "text":
        doc: dict[str, Any] = {"out": str(rendered.out), "jobs": [_job_json(job.plan, rendered.out / job.subdir) for job in rendered.jobs]}
        if check:
            doc["in_sync"] = code == 0
        _echo_doc(doc)
        return code
    if len(rendered.jobs) == 1 and not all_jobs and not check:
        job_plan = rendered.jobs[0].plan
        job_dir = Path(out) / job_plan.job_subdir
        click.echo(f"{job_plan.scheduler}: {job_plan.world.describe()}; submit with: jobgen submit {job_dir}")
    return code


def _job_json(job_plan: JobPlan, job_dir: Path | None, *, with_text: bool = False) -> dict[str, Any]:
    """One rendered job for -o json: where it went (``job_dir``: None when nothing was written),
    its world, its files (names; with ``with_text``, name -> text) and how to submit it."""
    w = job_plan.world
    return {"name": job_plan.job_name, "profile": job_plan.profile, "scheduler": job_plan.scheduler,
            "job_dir": None if job_dir is None else str(job_dir), "num_nodes": w.num_nodes, "devices_per_node": w.devices_per_node,
            "world_size": w.world_size, "inputs_sha256": job_plan.inputs_sha256, "warnings": list(job_plan.warnings),
            "files": dict(job_plan.files) if with_text else [name for name, _ in job_plan.files],
            "submit": None if job_dir is None else f"jobgen submit {job_dir}",
            "submit_steps": [str(step) for step in job_plan.submit_steps]}


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False), required=False)
@click.option("--profile", "-p", default=None, help="Cluster profile (with SPEC).")
@click.option("--out", default="manifests", show_default=True, type=click.Path(file_okay=False),
              help="Output root (with SPEC).")
@output_option(has_out=True)
@click.option("--all", "all_jobs", is_flag=True, help="Every job of jobgen.yaml (the default when no SPEC is given).")
@_project_option
@_sweep_option
@_set_option
@_profiles_dir_option
@_templates_dir_option
@click.pass_context
def diff(ctx: click.Context, spec: str | None, profile: str | None, out: str, output: str, all_jobs: bool, project: str | None,
         sweeps: tuple[str, ...], overrides: tuple[str, ...], profiles_dir: str | None, templates_dir: str | None) -> int:
    """Preview what `jobgen render` would change, as a unified diff; writes nothing.

    Without SPEC: every job of jobgen.yaml (as `render --all`, stale job directories included).
    Exit code 0 whether or not files differ (2 for bad input); `render --check` is the form
    that exits 1 on differences, for CI. -o json prints {"out", "in_sync", "diff"}.

    \b
    Examples:
      jobgen diff
      jobgen diff examples/quickstart.yaml --profile k8s-h100 --set trainer.max_steps=900
    """
    from jobgen.gitops import manifests as gitops
    out_given = ctx.get_parameter_source("out") is not click.core.ParameterSource.DEFAULT
    rendered = gitops.build_render(spec=spec, profile=profile, all_jobs=all_jobs or spec is None, project=project, overrides=overrides,
                                   sweeps=sweeps, out=out, out_given=out_given, profiles_dir=profiles_dir, templates_dir=templates_dir)
    if output == "text":
        return gitops.diff_command(rendered, echo=click.echo)
    printed: list[str] = []  # the unified diff (stdout); the rest goes to stderr

    def capture(message: Any = "", err: bool = False, **kwargs: Any) -> None:
        if err:
            click.echo(message, err=True, **kwargs)
        else:
            printed.append(str(message))

    code = gitops.diff_command(rendered, echo=capture)
    text = "".join(printed)
    _echo_doc({"out": str(rendered.out), "in_sync": not text, "diff": text})
    return code


@cli.command()
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
@_set_option
@_profiles_dir_option
@_templates_dir_option
@_crds_dir_option
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
    --sweep renders and submits a sweep in one command (README "Submitting a sweep"); the
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
        _warn(target_or_plan)
        if not no_import_check:
            _import_check(target, loaded)
    with _stdout_to_stderr():
        result = api.submit(target_or_plan, options, out=out, echo=_progress)
    if output == "json":
        _echo_doc(_submit_json(result))
        return None
    _print_submitted(result)
    return None


def _submit_json(result: Any) -> dict[str, Any]:
    """One submitted job for ``jobgen submit -o json`` (a :class:`~jobgen.backends.base.SubmitResult`)."""
    record = result.record
    return {"action": result.action, "handle": None if result.handle is None else str(result.handle),
            "job_dir": record.job_dir if record else None, "run_dir": record.run_dir if record else None,
            "log_file": record.log_file if record else None, "lines": list(result.lines),
            "tasks": [{"handle": f"{result.handle}_{t.index}", **t.model_dump(mode="json")} for t in (record.array or ())]
            if record else []}


def _print_submitted(result: Any) -> None:
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
    """``jobgen submit SPEC --sweep ...`` (:mod:`jobgen.sweep_submit`): plan every point, check
    their classes, submit, print every handle. Returns the exit code (1: partly submitted)."""
    from jobgen import sweep_submit

    sweep = sweep_submit.plan_sweep(spec, profile, sweeps, overrides=overrides, profiles_dir=profiles_dir,
                                    templates_dir=templates_dir, preflight=preflight, smoke=smoke)
    for warning in dict.fromkeys(w for job in sweep.jobs for w in job.plan.warnings):  # once, not once per point
        click.echo(f"warning: {warning}", err=True)
    if import_check:
        shown: set[str] = set()
        for label, point_spec in sweep.point_specs():
            _import_check(spec, point_spec, shown=shown, source=f"{spec} ({label})")
    how = "one SLURM job array" if sweep.array else "one job per point"
    _progress(f"sweep of {sweep.name} on {sweep.profile}: {sweep.points} point(s), {how}")
    try:
        with _stdout_to_stderr():
            outcome = sweep_submit.submit_sweep(sweep, options, out=out, echo=_progress)
    except sweep_submit.SweepPartlySubmitted as exc:
        if not _document_mode():
            raise
        _echo_doc({"error": exc.message, "hint": exc.hint, "location": exc.location, "exit_code": exc.exit_code,
                    **sweep_submit.outcome_json(exc.outcome, _submit_json)})
        return exc.exit_code
    if _document_mode():
        _echo_doc(sweep_submit.outcome_json(outcome, _submit_json))
        return 0
    if sweep.array:
        click.echo(f"sweep {outcome.sweep_id}: {sweep.points} point(s) as one job array")
        _print_submitted(outcome.submitted[0][1])
        return 0
    click.echo(f"sweep {outcome.sweep_id}: {sweep.points} job(s), one per point")
    for job, result in outcome.submitted:
        click.echo(f"  {result.action} {result.handle or '(nothing queued)'}  {job.describe()}")
    if any(result.action != "completed" and result.handle is not None for _, result in outcome.submitted):
        click.echo("  list them: jobgen ls   follow one: jobgen logs -f <handle>   status: jobgen status <handle>")
    return 0


_job_argument = click.argument("job", metavar="JOB")


@cli.command(name="ls")
@click.option("--cluster", default=None, metavar="NAME",
              help="Only jobs of this SLURM cluster or Kubernetes context (`local` for local runs; the first host for ssh jobs).")
@click.option("--state", "states", multiple=True, type=StateChoice(JOB_STATES),
              help="Only jobs in this state after the refresh (repeatable, any case), e.g. --state RUNNING --state PENDING.")
@output_option()
def ls(cluster: str | None, states: tuple[str, ...], output: str) -> None:
    """List every job submitted from this machine (newest first), each refreshed from its
    scheduler: state, nodes x devices, start, elapsed and GPU-hours (CPU-hours on CPU
    clusters; cost when the profile has gpu_hour_price).

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
    table = [("HANDLE", "NAME", "STATE", "NODES x DEV", "STARTED (UTC)", "ELAPSED", "DEVICE TIME", "COST") + (("SWEEP",) if sweeps else ())]
    for row in rows:
        world = f"{row.num_nodes} x {row.devices_per_node} {row.accelerator}" if row.num_nodes else "-"
        name = (row.name or "-") + (f" (array of {len(row.record.array)})" if row.record.array else "")
        sweep = ((row.record.sweep.id if row.record.sweep is not None else "-"),) if sweeps else ()
        table.append((row.record.handle, name, row.state, world, *_usage_cells(row.status.usage if row.status else None), *sweep))
        task_usage = {t.handle.array_task: t.usage for t in row.status.tasks} if row.status is not None else {}
        for task in row.tasks() if row.record.array else ():  # a job array's tasks, under it
            table.append((f"  {task['handle']}", f"  {task['name']}", task["state"], world, *_usage_cells(task_usage.get(task["index"])),
                          *sweep))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    for row in rows:
        if row.stale:
            click.echo(f"note: {row.record.handle}: {row.stale}")


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


@cli.command()
@_job_argument
@output_option()
@click.option("--json", "as_json", is_flag=True, hidden=True, is_eager=True, help="Same as -o json (kept for scripts).",
              callback=lambda ctx, param, value: _remember_output(ctx, param, "json") if value else value)
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
    -o json: {"handle", "state", "source", "details", "usage"} (a job array adds "tasks");
    a scheduler that cannot be asked is an error (exit 1), as JSON too.
    """
    st = api.status(job)
    if output == "json" or as_json:
        click.echo(json.dumps(st.to_json(), sort_keys=True))
        return
    details = ", ".join(f"{k} {v}" for k, v in sorted(st.details.items()) if v not in ("", "None"))
    click.echo(f"{st.handle}  {st.state}  ({st.source}{'; ' + details if details else ''})")
    if st.usage is not None:
        click.echo(f"  usage: {st.usage.describe()}")
    for task in st.tasks:  # a SLURM job array: one line per task
        shown = ", ".join(f"{k} {v}" for k, v in sorted(task.details.items()) if v not in ("", "None") and k != "name")
        click.echo(f"  {task.handle}  {task.state}  {task.details.get('name', '')}  ({task.source}{'; ' + shown if shown else ''})")


@cli.command()
@_job_argument
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job ends (Ctrl-C stops following).")
@click.option("--rank", default=None, metavar="N|all",
              help="SLURM: global rank whose lines to show (srun --label prefixes), or `all` for the whole file [default: 0].")
@click.option("--replica", default=None, metavar="TYPE-INDEX",
              help="Kubernetes: the pod to read, e.g. master-0 (default; rank zero runs there), worker-1 (an elastic job's "
                   "default: worker-0; its rank zero runs on the pod its log names); TrainJob: node-0. "
                   "ssh: the node whose output to show, node-0 (default) .. node-<N-1>.")
@click.option("--first-error", is_flag=True,
              help="Read every rank's (SLURM; local: the run's output.log) or pod's (Kubernetes) output and show the first failure: its rank or pod, "
                   "node, traceback or NCCL error, then the others in order.")
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
        handle = str(resolve_job(job))  # a job directory is read once; the handle then parses without I/O
        found = api.first_error(handle)
        if output == "json":
            click.echo(json.dumps({"handle": handle, "ordered_by": found.ordered_by,
                                   "first": None if found.first is None else found.first.to_json(),
                                   "failures": [f.to_json() for f in found.failures], "srun_exits": list(found.exits)}, indent=2))
        else:
            for line in format_triage(found, handle):
                click.echo(line)
        return
    if output == "json":
        raise ConfigError("logs -o json applies to --first-error only", hint="add --first-error, or drop -o json")
    try:
        api.logs(job, LogOptions(follow=follow, rank=rank, replica=replica), click.echo)
    except KeyboardInterrupt:
        click.echo("", err=True)


@cli.command()
@_job_argument
@click.option("--wait-s", default=120.0, show_default=True, help="Seconds to wait for the job to end after scancel / the delete.")
@output_option()
def cancel(job: str, wait_s: float, output: str) -> None:
    """Cancel JOB and wait until every rank has stopped (SLURM: scancel, then squeue;
    Kubernetes: delete with foreground propagation, so the pods go before the job)."""
    st = api.cancel(job, wait_s=wait_s, echo=_progress)
    if output == "json":
        _echo_doc(st.to_json())
        return
    click.echo(f"{st.handle}  {st.state}")


def _put_user_code_first(spec: str, loaded: TrainingSpec) -> None:
    """Put the directory the spec's code imports from (the working tree's copy of what the
    snapshot puts first on the ranks' PYTHONPATH) first on sys.path, before importing it here."""
    from jobgen.usercode.snapshot import local_import_dir

    first = local_import_dir(loaded, Path(spec))
    if first is not None and str(first) not in sys.path:
        sys.path.insert(0, str(first))


def _import_check(spec: str, loaded: TrainingSpec, *, shown: set[str] | None = None, source: str | None = None) -> list[str]:
    """Import the class_path classes of ``loaded`` (the spec file ``spec``, already loaded) here
    and bind their init_args (``validate --import``); prints the notes (those not in ``shown``,
    which collects them: a sweep checks each point) and returns them. ``source``: where errors
    point (default ``spec``). Imports torch and Lightning (and the user's modules)."""
    from jobgen.usercode.classes import check_user_code

    _put_user_code_first(spec, loaded)
    notes = check_user_code(loaded, source or spec)
    for note in notes:
        if shown is None or note not in shown:
            click.echo(f"note: {note}", err=True)
    if shown is not None:
        shown.update(notes)
    return notes


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--profile", "-p", default=None, help="Also check the spec against this profile (devices, nodes, batch, precision).")
@click.option("--import", "import_check", is_flag=True,
              help="Import the spec's class_path classes in this environment: base classes (LightningModule / "
                   "LightningDataModule), init_args against their signatures (names and types), FSDP policy classes.")
@output_option()
@_set_option
@_profiles_dir_option
@_templates_dir_option
@_crds_dir_option
def validate(spec: str, profile: str | None, import_check: bool, output: str, overrides: tuple[str, ...],
             profiles_dir: str | None, templates_dir: str | None) -> None:
    """Check SPEC (and, with --profile, that it fits the cluster) without writing anything.

    \b
    Example:
      jobgen validate examples/quickstart.yaml --profile slurm-h100
      jobgen validate examples/quickstart.yaml -p local -o json
      jobgen validate examples/usercode.yaml -p local --import   # imports tinychar (PYTHONPATH)
    """
    loaded = load_spec(spec, overrides)
    if loaded.user_code:
        model_name: str = loaded.model.class_path
        n_params = None
    else:
        model_name = loaded.model.hf_path if loaded.model.hf_path is not None else "gpt"
        n_params = None if loaded.model.hf_path is not None else loaded.model.n_params
    doc: dict[str, Any] = {"spec": spec, "name": loaded.name, "strategy": loaded.trainer.strategy,
                           "precision": loaded.trainer.precision, "model": model_name, "n_params": n_params}
    if loaded.user_code:
        doc["data"] = loaded.data.class_path
    if loaded.entrypoint is not None:
        doc |= {"model": None, "n_params": None, "entrypoint": loaded.entrypoint.model_dump()}
    job_plan = None
    checked: list[str] = []
    if profile is not None:
        # the spec loaded above, planned (not read again); the plan hands its resolved spec over
        job_plan = api.plan_loaded(loaded, load_profile(profile, profiles_dir), spec, profile_source=profile, templates=templates_dir)
        _warn(job_plan)
        w = job_plan.world
        resolved = job_plan.resolved if job_plan.resolved is not None else read_plan_spec(job_plan)
        # command mode: the batch reaches the script only through ds_config.json (DeepSpeed)
        batch_used = loaded.entrypoint is None or resolved.spec.trainer.deepspeed_stage is not None
        doc |= {"profile": job_plan.profile, "precision": resolved.spec.trainer.precision,
                "num_nodes": w.num_nodes, "devices_per_node": w.devices_per_node, "world_size": w.world_size,
                "global_batch_size": w.global_batch_size if batch_used else None, "warnings": list(job_plan.warnings)}
        if w.elastic:  # num_nodes / world_size are then the values at the maximum; global_batch_size is kept at every one
            doc["min_nodes"] = w.min_nodes
        if loaded.entrypoint is not None:
            checked = _check_command(resolved.spec, job_plan, spec)
            doc["checked"] = checked
    else:
        from jobgen.planning.environment import check_env_credentials

        check_env_credentials(loaded.env, source=spec, origin="spec")  # the rule needs no profile
        if loaded.entrypoint is not None:
            checked = _check_command(loaded, None, spec)
            doc["checked"] = checked
    if import_check:
        doc["import_notes"] = _import_check(spec, loaded)
    if output == "json":
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    if loaded.entrypoint is not None:
        model = "command mode: " + ", ".join(checked)
    elif loaded.user_code:
        model = f"model {loaded.model.class_path}, data {loaded.data.class_path}"
    elif loaded.model.hf_path is not None:
        model = f"Hugging Face model {loaded.model.hf_path}"
    else:
        model = f"model {loaded.model.n_params / 1e6:.1f}M parameters"
    click.echo(f"{spec}: valid spec {loaded.name!r} ({model}, "
               f"strategy {loaded.trainer.strategy}, precision {loaded.trainer.precision})")
    if import_check and loaded.user_code:
        click.echo(f"imported {loaded.model.class_path} and {loaded.data.class_path} here; their init_args fit their signatures")
    if job_plan is not None:
        w = job_plan.world
        if doc["global_batch_size"] is None:
            click.echo(f"fits profile {job_plan.profile!r}: {w.describe()}, precision {doc['precision']}; "
                       "batch size: your script's own (command mode passes jobgen's batch settings only to DeepSpeed)")
            return
        if w.elastic:  # the global batch is kept at every node count; the accumulation follows the world
            most = w.global_batch_size // (w.micro_batch_size * w.fewest_nodes * w.devices_per_node)
            click.echo(f"fits profile {job_plan.profile!r}: {w.describe()}, global batch {w.global_batch_size} sequences "
                       f"at every world size (micro {w.micro_batch_size} x world size x accumulation {most} at {w.fewest_nodes} "
                       f"node(s) .. {w.gradient_accumulation_steps} at {w.num_nodes}), precision {doc['precision']}")
            return
        click.echo(f"fits profile {job_plan.profile!r}: {w.num_nodes} node(s) x {w.devices_per_node} = world size {w.world_size}, "
                   f"global batch {w.global_batch_size} sequences "
                   f"(micro {w.micro_batch_size} x accumulation {w.gradient_accumulation_steps} x world size {w.world_size}), "
                   f"precision {doc['precision']}")


def read_plan_spec(job_plan: JobPlan) -> Any:
    """The :class:`~jobgen.jobdir.ResolvedSpec` a plan writes as spec.json."""
    from jobgen.jobdir import SPEC_FILE, ResolvedSpec

    return ResolvedSpec.model_validate_json(job_plan.file(SPEC_FILE))


def _check_command(spec: Any, job_plan: JobPlan | None, spec_source: str) -> list[str]:
    """``jobgen validate`` of a command-mode spec, from the working directory (where `jobgen
    submit` will run the ranks): the script exists / the module is importable, and with a
    profile, LightningCLI ``--config`` files agree with the world. Kubernetes runs the script
    from the image, which cannot be looked into here: only said so. Returns what was checked."""
    from jobgen.planning.command import check_config_files, check_entrypoint_exists

    if job_plan is not None and job_plan.scheduler == "kubernetes":
        return ["entrypoint not checked: on Kubernetes it runs from the image's working directory"]
    work_dir = Path.cwd()
    checked = [check_entrypoint_exists(spec, work_dir, spec_source)]
    if job_plan is not None:
        checked += [f"LightningCLI config {path}" for path in check_config_files(spec, job_plan.world, work_dir, spec_source)]
    return checked


@cli.command("plan")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--profile", "-p", required=True, help="Cluster profile name (see `jobgen profiles list`) or a .yaml path.")
@click.option("--hf-config", "hf_config", type=click.Path(), default=None,
              help="config.json (or a directory holding it) of the model.hf_path model, read instead of <hf_path>/config.json "
                   "(for planning off the cluster), e.g. examples/hf-configs/llama-2-7b/config.json.")
@click.option("--import", "import_model", is_flag=True,
              help="model.class_path specs: import the classes here (as `validate --import`) and build the model on "
                   "PyTorch's meta device (nothing allocated, no weights read) to count its parameters; activations "
                   "are not estimated (each total is then a floor of the peak).")
@output_option()
@_set_option
@_profiles_dir_option
def plan_command(spec: str, profile: str, hf_config: str | None, import_model: bool, output: str, overrides: tuple[str, ...],
                 profiles_dir: str | None) -> None:
    """Estimate per-GPU memory of SPEC on a profile for each strategy, and recommend one.

    \b
    One row per layout (DDP, FSDP sharding strategies and CPU offload, DeepSpeed ZeRO-1/2/3
    with optimizer/parameter offload): parameters, gradients, optimizer states, activations
    and overhead in GiB per GPU (per rank on CPU profiles), the total, and whether it fits the
    profile's gpu_mem_gib (and, with offload, the node's host memory). Formulas: ZeRO
    (Rajbhandari et al. 2020) for model states, Korthikanti et al. 2022 for activations; see
    jobgen/planning/estimate.py. The recommendation follows the guide: DDP below ~500M parameters when it
    fits, FSDP for 500M-10B, DeepSpeed ZeRO-3 (then offload) beyond or when nothing else fits.
    Hugging Face models (model.hf_path) are sized from their config.json (--hf-config FILE, or
    <hf_path>/config.json; llama, mistral, qwen2, gpt2): full fine-tuning, LoRA and QLoRA
    (jobgen/planning/estimate_hf.py); a QLoRA ~7B spec that matches a row of the seed benchmark table
    (jobgen/planning/seeds.py) shows the measured figure next to the estimate.
    Your own model (model.class_path) is sized with --import: its classes are imported and it is
    built on the meta device to count its parameters (jobgen/usercode/memory.py); its activations
    are not estimated. Without --import such a spec is refused (planning imports no user code).
    Estimates of the peak, not bounds: within 15% of the peaks measured on one GPU (README "Memory
    plan"); the assumptions: block lists what they rest on. Exit 0 even when the spec's strategy
    does not fit (a warning goes to stderr); 2 for bad input.

    \b
    Examples:
      jobgen plan examples/gpt2-350m-zero3.yaml --profile slurm-a100
      jobgen plan examples/quickstart.yaml -p slurm-a100 --set model.preset=null --set model.n_layer=32 \\
          --set model.n_head=32 --set model.d_model=4096 --set model.block_size=4096 --set trainer.micro_batch_size=1
      jobgen plan examples/quickstart.yaml -p k8s-h100 --output json
      jobgen plan examples/llama-lora-jsonl.yaml -p slurm-a100 --hf-config examples/hf-configs/llama-2-7b/config.json
      jobgen plan examples/usercode.yaml -p slurm-a100 --import
    """
    from jobgen.planning.estimate_hf import plan_memory
    from jobgen.planning.micro_batch import resolve_micro_batch
    from jobgen.planning.rules import check_fit, resolve_precision, resolve_world

    prof = load_profile(profile, profiles_dir)
    loaded = resolve_micro_batch(resolve_precision(load_spec(spec, overrides), prof), prof, spec, hf_config)
    if loaded.entrypoint is not None:
        raise ConfigError(
            f"{spec} runs your own entrypoint (command mode): jobgen does not know its model, so it cannot estimate memory",
            location=f"{spec}: entrypoint",
            hint="estimate with a spec of the same shape for the built-in GPT (model.n_layer, n_head, d_model, block_size), "
            "or drop entrypoint",
        )
    world = resolve_world(loaded, prof, spec)
    check_fit(loaded, prof, world, spec)
    # elastic: the smallest world (largest shards)
    if loaded.user_code and import_model:
        from jobgen.usercode.memory import plan_memory as plan_user_memory

        _put_user_code_first(spec, loaded)
        mp = plan_user_memory(loaded, prof, world.fewest_nodes, world.devices_per_node, spec_source=spec)
    else:
        mp = plan_memory(loaded, prof, world.fewest_nodes, world.devices_per_node, hf_config=hf_config, spec_source=spec)
    if output == "json":
        click.echo(json.dumps({"spec": spec, "name": loaded.name, "profile": prof.name, **mp.to_json()}, indent=2, sort_keys=True))
    else:
        click.echo(_plan_table(loaded, prof, mp), nl=False)
    spec_row = mp.spec_row
    if not spec_row.fits:
        est = spec_row.estimate
        instead = f"use {mp.chosen.label}: " + " ".join(f"--set {o}" for o in mp.chosen.overrides) if mp.chosen else "nothing fits as is (see suggestions)"
        click.echo(f"warning: the spec's layout {est.layout.label} is estimated at {est.total_bytes / 2**30:.1f} GiB per rank "
                   f"(budget {mp.budget_bytes / 2**30:.1f} GiB"
                   + (f", host {est.host_bytes_per_node / 2**30:.1f} of {mp.host_bytes_per_node / 2**30:.1f} GiB per node" if est.host_bytes_per_node else "")
                   + f") and will not fit; {instead}", err=True)


def _plan_table(spec: Any, profile: Any, mp: Any) -> str:
    """The human-readable `jobgen plan` output (GiB = 2**30 bytes)."""
    g = 2**30
    unit = "GPU" if mp.accelerator == "gpu" else "CPU rank"
    n, d = mp.world
    batch = (f"micro batch {spec.trainer.micro_batch_size} x {spec.model.block_size} tokens" if mp.user is None
             else f"micro batch {spec.trainer.micro_batch_size}")
    model = "" if mp.user is None else f"{mp.user['class_path']}, "
    lines = [
        f"{spec.name} on {profile.name}: {model}{mp.n_params / 1e6:,.1f}M parameters, {mp.precision}, {batch}, "
        f"{n} node(s) x {d} {unit}(s) = world size {n * d}, budget {mp.budget_bytes / g:.1f} GiB per {unit}",
        "",
        f"  {'layout':38} {'params':>7} {'grads':>7} {'optim':>7} {'activ':>7} {'overhd':>7} {'total':>7}  fits  {'host/node':>9}",
    ]
    for r in mp.rows:
        e = r.estimate
        mark = "*" if mp.chosen is not None and e.layout == mp.chosen else " "
        cols = " ".join(f"{v / g:7.2f}" for v in (e.params_bytes, e.grads_bytes, e.optimizer_bytes, e.activations_bytes,
                                                  e.overhead_bytes, e.total_bytes))
        host = f"{e.host_bytes_per_node / g:9.2f}" if e.host_bytes_per_node else f"{'-':>9}"
        lines.append(f"{mark} {e.layout.label:38} {cols}  {'yes' if r.fits else 'no ':4}  {host}" + ("  <- spec" if r.is_spec else ""))
    lines.append(f"  (GiB per {unit}; * = recommended; host/node = offloaded states in each node's CPU memory)")
    if mp.hf is not None:
        h = mp.hf
        lines.append(f"  model: {h['model_type']} ({h['config']}), {h['mode']} fine-tuning, "
                     f"{h['trainable_params'] / 1e6:,.1f}M trainable parameters")
    if mp.seed is not None:
        sd = mp.seed
        lines.append(f"  seed table: {sd['recipe']} on {sd['gpus']} GPU(s): measured {sd['measured_gb_per_gpu']:g} GB "
                     f"({sd['measured_bytes_per_gpu'] / g:.1f} GiB) per GPU, {sd['tokens_per_s']:,} tokens/s; "
                     f"estimate {sd['estimate_bytes_per_gpu'] / g:.1f} GiB ({sd['estimate_over_measured']:.2f}x) "
                     f"[{sd['source']}]")
    lines.append("")
    if mp.chosen is not None:
        lines.append(f"recommended: {mp.chosen.label}  (" + " ".join(f"--set {o}" for o in mp.chosen.overrides) + ")")
    else:
        lines.append("recommended: nothing fits as configured")
    lines += [f"  - {r}" for r in mp.reasons]
    if mp.suggestions:
        lines.append("suggestions:")
        lines += [f"  - {s}" for s in mp.suggestions]
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in mp.assumptions]
    return "\n".join(lines) + "\n"


@cli.group()
def profiles() -> None:
    """List and show cluster profiles (inheritance resolved)."""


@profiles.command("list")
@output_option()
@_profiles_dir_option
def profiles_list(output: str, profiles_dir: str | None) -> None:
    """List every profile visible through the lookup order, with its scheduler and nodes."""
    rows = []
    for name in list_profile_names(profiles_dir):
        try:
            p = load_profile(name, profiles_dir)
        except JobgenError as exc:
            rows.append({"name": name, "error": exc.message.splitlines()[0]})
            continue
        rows.append({"name": name, "scheduler": p.scheduler, "max_nodes": p.max_nodes, "gpus_per_node": p.gpus_per_node,
                     "gpu_type": p.gpu_type, "cpu_processes_per_node": p.cpu_processes_per_node, "description": p.description})
    if output == "json":
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    for row in rows:
        if "error" in row:
            click.echo(f"{row['name']:16} (invalid: {row['error']})")
            continue
        shape = f"{row['gpus_per_node']}x {row['gpu_type']}" if row["gpus_per_node"] else f"{row['cpu_processes_per_node']} CPU rank(s)"
        click.echo(f"{row['name']:16} {row['scheduler']:10} up to {row['max_nodes']} node(s) of {shape:14} {row['description']}")


@profiles.command("show")
@click.argument("name")
@output_option("text", "yaml", "json", yaml_help="a profile file jobgen reads (with `extends:` resolved)")
@_profiles_dir_option
def profiles_show(name: str, output: str, profiles_dir: str | None) -> None:
    """Show profile NAME with `extends:` resolved and defaults filled in: text (one line per
    field, by its dotted path, as --set and the README reference name it), yaml (a profile file
    you can copy) or json."""
    _, path = load_profile_doc(name, profiles_dir)
    resolved = load_profile(name, profiles_dir).model_dump(mode="json", context=PROFILE_FILE_CONTEXT)
    if output == "json":
        _echo_doc(resolved)
        return
    click.echo(f"# {path}")
    if output == "yaml":
        click.echo(yaml.safe_dump(resolved, sort_keys=False), nl=False)
        return
    fields = dict(_flatten(resolved))
    width = max(map(len, fields))
    for key, value in fields.items():
        click.echo(f"{key:{width}}  {value}")


def _flatten(doc: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted.path, value)`` of every leaf of ``doc`` in order; lists and empty mappings as
    compact JSON, None as ``null``."""
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value if isinstance(value, str) else json.dumps(value)


@cli.command()
@click.argument("kind", type=click.Choice(["spec", "profile", "project"]))
@output_option("json", "yaml", yaml_help="the same schema in YAML")
def schema(kind: str, output: str) -> None:
    """Print the JSON Schema of a training spec, a cluster profile or jobgen.yaml (for editors).

    \b
    Example (VS Code YAML extension):
      jobgen schema spec > spec.schema.json
    """
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.project import Project
    from jobgen.specs.training import TrainingSpec

    model = {"spec": TrainingSpec, "profile": ClusterProfile, "project": Project}[kind]
    if output == "yaml":
        click.echo(yaml.safe_dump(model.model_json_schema(), sort_keys=True), nl=False)
        return
    _echo_doc(model.model_json_schema())


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs :data:`cli` and exits with its code; errors are printed by
    :func:`print_error` (JobgenError: message + hint, no traceback unless --debug)."""
    cli.main(args=argv, prog_name="jobgen")


if __name__ == "__main__":
    main()
