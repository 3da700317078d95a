"""The ``jobgen`` group: its options (``--version``, ``--debug``), its help, every command of the
modules beside this one, and :func:`main`, the console entry point."""

from __future__ import annotations

import click

from jobgen import __version__
from jobgen.cli.doctor import doctor
from jobgen.cli.jobs import cancel, logs, ls, status
from jobgen.cli.output import JobgenGroup, set_debug
from jobgen.cli.plan import plan_command
from jobgen.cli.profiles import profiles, schema
from jobgen.cli.render import diff, render
from jobgen.cli.submit import submit
from jobgen.cli.validate import validate


@click.group(cls=JobgenGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="jobgen")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=set_debug,
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


for _command in (render, diff, submit, ls, status, logs, cancel, validate, plan_command, doctor, profiles, schema):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs :data:`cli` and exits with its code; errors are printed by
    :func:`~jobgen.cli.output.print_error` (JobgenError: message + hint, no traceback unless --debug)."""
    cli.main(args=argv, prog_name="jobgen")
