"""``jobgen render`` and ``jobgen diff``: the GitOps commands (manifests written, checked,
previewed; :mod:`jobgen.planning.project` plans them, :mod:`jobgen.gitops.manifests` does the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from jobgen.cli.options import crds_dir_option, profiles_dir_option, project_option, set_option, sweep_option, templates_dir_option
from jobgen.cli.output import echo_doc, echo_progress, output_option, warn_plan
from jobgen.errors import ConfigError
from jobgen.planning.plan import JobPlan


@click.command()
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
@project_option
@sweep_option
@set_option
@profiles_dir_option
@templates_dir_option
@crds_dir_option
@click.pass_context
def render(ctx: click.Context, spec: str | None, profile: str | None, out: str, output: str, to_stdout: bool, all_jobs: bool,
           check: bool, prune: bool, commit_flag: bool, project: str | None, sweeps: tuple[str, ...], overrides: tuple[str, ...],
           profiles_dir: str | None, templates_dir: str | None) -> int | None:
    """Render SPEC for a cluster profile, or every job of jobgen.yaml (--all), without submitting.

    \b
    Writes <out>/<profile>/<job name>/:
      job.sbatch          SLURM profiles (submit with: cd <dir> && sbatch job.sbatch)
      pytorchjob.yaml     Kubernetes profiles (ConfigMap + Kubeflow PyTorchJob)
      trainjob.yaml       Kubernetes profiles with job_api: trainjob (ConfigMap + TrainJob)
      launch.sh           ssh profiles (the script every host runs)
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
    from jobgen import api
    from jobgen.gitops import manifests as gitops
    from jobgen.planning.project import build_render
    from jobgen.planning.sweep import SpecOptions
    if to_stdout and (all_jobs or check or prune or commit_flag):
        raise ConfigError("--stdout cannot be combined with --all, --check, --prune or --commit", hint="drop --stdout")
    if prune and not all_jobs:
        raise ConfigError("--prune needs --all (stale jobs are those jobgen.yaml no longer lists)", hint="jobgen render --all --prune")
    if check and commit_flag:
        raise ConfigError("--check and --commit exclude each other", hint="--check only compares; --commit writes and commits")
    options = SpecOptions(overrides=overrides, sweeps=sweeps, out=out, profiles_dir=profiles_dir, templates_dir=templates_dir)
    rendered = build_render(spec, profile, api.PLANNERS, options, all_jobs=all_jobs, project=project, out_given=_out_given(ctx))
    if to_stdout:
        for job in rendered.jobs:
            warn_plan(job.plan)
            if output == "text":
                click.echo(str(job.plan), nl=False)
        if output != "text":
            echo_doc({"out": None, "jobs": [_job_json(job.plan, None, with_text=True) for job in rendered.jobs]})
        return 0
    code = gitops.render_command(rendered, check=check, prune=prune, commit_flag=commit_flag, echo=echo_progress)
    if output != "text":
        doc: dict[str, Any] = {"out": str(rendered.out), "jobs": [_job_json(job.plan, rendered.out / job.subdir) for job in rendered.jobs]}
        if check:
            doc["in_sync"] = code == 0
        echo_doc(doc)
        return code
    if len(rendered.jobs) == 1 and not all_jobs and not check:
        job_plan = rendered.jobs[0].plan
        job_dir = Path(out) / job_plan.job_subdir
        click.echo(f"{job_plan.scheduler}: {job_plan.world.describe()}; submit with: jobgen submit {job_dir}")
    return code


def _out_given(ctx: click.Context) -> bool:
    """Whether ``--out`` was given on the command line rather than defaulted."""
    return ctx.get_parameter_source("out") is not click.core.ParameterSource.DEFAULT


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


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False), required=False)
@click.option("--profile", "-p", default=None, help="Cluster profile (with SPEC).")
@click.option("--out", default="manifests", show_default=True, type=click.Path(file_okay=False),
              help="Output root (with SPEC).")
@output_option(has_out=True)
@click.option("--all", "all_jobs", is_flag=True, help="Every job of jobgen.yaml (the default when no SPEC is given).")
@project_option
@sweep_option
@set_option
@profiles_dir_option
@templates_dir_option
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
    from jobgen import api
    from jobgen.gitops import manifests as gitops
    from jobgen.planning.project import build_render
    from jobgen.planning.sweep import SpecOptions
    options = SpecOptions(overrides=overrides, sweeps=sweeps, out=out, profiles_dir=profiles_dir, templates_dir=templates_dir)
    rendered = build_render(spec, profile, api.PLANNERS, options, all_jobs=all_jobs or spec is None, project=project,
                            out_given=_out_given(ctx))
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
    echo_doc({"out": str(rendered.out), "in_sync": not text, "diff": text})
    return code
