"""``jobgen doctor``: a profile (and a spec's request) checked against the live cluster, one line
per check (:mod:`jobgen.doctor`)."""

from __future__ import annotations

import click

from jobgen.cli.options import profiles_dir_option, set_option, templates_dir_option
from jobgen.cli.output import echo_doc, echo_progress, output_option
from jobgen.errors import printable

_MARK = {"pass": "ok  ", "fail": "FAIL", "skip": "skip"}


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False), required=False)
@click.option("--profile", "-p", required=True, help="The profile to check (name or path).")
@click.option("--probe", is_flag=True,
              help="Also run the checks that queue work on the cluster: a one-node SLURM job that imports "
                   "jobgen.train on a compute node and sees the runs directory, a Kubernetes pod that pulls the "
                   "image. Without it they are reported as skipped.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="SECONDS",
              help="How long a probe may wait for the cluster, queueing included.")
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="The runs directory `jobgen submit --runs-dir` will use; the SLURM probe checks that a compute node "
                   "can write it and that this machine sees what it wrote.")
@output_option("text", "json", "yaml")
@set_option
@profiles_dir_option
@templates_dir_option
def doctor(spec: str | None, profile: str, probe: bool, timeout_s: float, runs_dir: str, output: str, overrides: tuple[str, ...],
           profiles_dir: str | None, templates_dir: str | None) -> None:
    """Check PROFILE (and SPEC's request, when given) against the live cluster before anything queues.

    \b
    Each check prints one line: ok, FAIL (with the fix) or skip (with why). SLURM: partition,
    account, QOS, GRES type, node count and time limit against the partition's limits,
    sbatch --test-only of the rendered job; with --probe, a one-node job that imports
    jobgen.train with slurm.python and sees the runs directory. Kubernetes: the operator's
    CRDs, namespace, claim (bound, ReadWriteMany), PriorityClass, Kueue LocalQueue, the
    secrets of secret_env; with --probe, a pod that pulls the image. ssh: each host
    reachable, its Python importing jobgen.train, its GPUs, its work directory writable;
    with SPEC, the work directory shared when the job resumes on several hosts. Exit 0 when
    no check failed, 1 when one did, 2 for bad input.

    \b
    Example:
      jobgen doctor --profile cluster_profiles/mycluster-gpu.yaml
      jobgen doctor --profile mycluster-gpu examples/quickstart.yaml --probe
      jobgen doctor --profile k8s-h100 -o json
    """
    from jobgen import api
    from jobgen.doctor import DoctorContext, passed, run_checks
    from jobgen.specs.load import load_profile, load_spec

    prof = load_profile(profile, profiles_dir)
    loaded = load_spec(spec, overrides) if spec else None
    job_plan = (api.plan_loaded(loaded, prof, spec, profile_source=profile, templates=templates_dir)
                if loaded is not None and spec is not None else None)
    ctx = DoctorContext(profile=prof, profile_source=profile, spec=loaded, spec_path=spec, plan=job_plan, probe=probe,
                        timeout_s=timeout_s, runs_dir=runs_dir)
    if output == "text":
        echo_progress(f"checking profile {printable(profile)} ({prof.scheduler})" + (f" with {printable(spec)}" if spec else ""))
    found = run_checks(ctx)
    ok = passed(found)
    if output != "text":
        echo_doc({"profile": profile, "scheduler": prof.scheduler, "spec": spec, "passed": ok,
                  "checks": [check.as_json() for check in found]})
    else:
        width = max((len(check.name) for check in found), default=0)
        for check in found:
            click.echo(f"{_MARK[check.status]}  {check.name:{width}}  {check.detail}")
            if check.status == "fail" and check.fix:
                click.echo(f"      {'':{width}}  fix: {check.fix}")
        counts = {status: sum(check.status == status for check in found) for status in _MARK}
        click.echo(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    if not ok:
        raise SystemExit(1)
