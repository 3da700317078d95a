"""The options several ``jobgen`` commands take, declared once: ``--set``, ``--profiles-dir``,
``--templates-dir``, ``--crds-dir``, ``--sweep``, ``--project`` and the JOB argument."""

from __future__ import annotations

import os

import click

set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
    help="Override a spec field, e.g. --set trainer.max_steps=200 (repeatable; value parsed as YAML).",
)
profiles_dir_option = click.option(
    "--profiles-dir", type=click.Path(file_okay=False), default=None,
    help="Directory searched first for profiles (then $JOBGEN_HOME/cluster_profiles, ./cluster_profiles, packaged).",
)


def _set_crds_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        os.environ["JOBGEN_CRDS_DIR"] = value  # read by jobgen.backends.kubernetes.validate.crds_dir()
    return value


crds_dir_option = click.option(
    "--crds-dir", type=click.Path(file_okay=False), default=None, expose_value=False, is_eager=True, callback=_set_crds_dir,
    help="Kubernetes: directory of CRDs for offline validation (default: $JOBGEN_CRDS_DIR, else jobgen's packaged Kubeflow CRDs).",
)
templates_dir_option = click.option(
    "--templates-dir", type=click.Path(file_okay=False), default=None,
    help="Directory searched first for templates (then $JOBGEN_HOME/templates, ./templates, packaged).",
)


sweep_option = click.option(
    "--sweep", "sweeps", multiple=True, metavar="KEY.PATH=V1,V2",
    help="Render one job per value (repeatable: the Cartesian grid), named <name>-<key><value>-..., e.g. --sweep trainer.learning_rate=1e-4,3e-4.",
)
project_option = click.option(
    "--project", type=click.Path(dir_okay=False), default=None,
    help="Project file for --all (default: jobgen.yaml in the working directory or the nearest parent).",
)

job_argument = click.argument("job", metavar="JOB")
