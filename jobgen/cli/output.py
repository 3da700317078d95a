"""What every ``jobgen`` command shares on the way out: the ``-o/--output`` formats (text, json,
yaml), where progress goes (stderr while stdout holds one document), how a
:class:`~jobgen.errors.JobgenError` (or a click error) is printed and which exit code it gives,
``--debug``, and :class:`JobgenGroup`, which routes every command's errors through
:func:`print_error`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import click
import yaml

from jobgen.errors import JobgenError
from jobgen.planning.plan import JobPlan

#: Per invocation (reset by :meth:`JobgenGroup.main`): ``debug`` (tracebacks for errors) and
#: ``output`` (the -o format, which decides how an error is printed).
_STATE: dict[str, Any] = {"debug": False, "output": "text"}

# --------------------------------------------------------------------------- output format, errors, --debug
#
# The conventions every command follows (docs/commands.md, "Usage"):
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


def remember_output(ctx: click.Context, param: click.Parameter, value: str) -> str:
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
        is_eager=True, callback=remember_output,
        help="Output format: text for people; json for machines (one document, stable keys; errors too: "
             '{"error", "hint", "location", "exit_code"})' + (f"; yaml: {yaml_help}" if "yaml" in formats else "") + "."
        + (" The output directory is --out." if has_out else ""),
    )


def set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        _STATE["debug"] = True
    return value


def _debug_param() -> click.Option:
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True, callback=set_debug,
                        help="Show tracebacks for errors (also: JOBGEN_DEBUG=1).")


def document_mode() -> bool:
    """-o json or -o yaml: stdout holds one document (the result or the error), nothing else."""
    return _STATE["output"] in ("json", "yaml")


def echo_progress(message: Any = "", **kwargs: Any) -> None:
    """``click.echo`` for what a command says along the way: stderr with -o json|yaml (stdout holds the document)."""
    click.echo(message, **{**kwargs, "err": kwargs.get("err", False) or document_mode()})


class _BlockDumper(yaml.SafeDumper):
    """YAML for -o yaml: a string of several lines (a rendered file) as a literal ``|`` block, so
    it reads as the file itself; PyYAML falls back to a quoted scalar where a block cannot hold
    the string exactly (e.g. trailing spaces)."""


_BlockDumper.add_representer(
    str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def echo_doc(doc: Any) -> None:
    """Print the command's one document in the -o format: JSON (indented, sorted keys) or, with
    -o yaml, the same document as YAML (sorted keys; multi-line strings as ``|`` blocks)."""
    if _STATE["output"] == "yaml":
        click.echo(yaml.dump(doc, Dumper=_BlockDumper, sort_keys=True, allow_unicode=True, width=float("inf")), nl=False)
        return
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """With -o json|yaml, file descriptor 1 points at stderr while this runs, so what child
    processes print (a local run's ranks, a scheduler client) cannot mix into the document."""
    if not document_mode():
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
    if document_mode():
        echo_doc({"error": error, "hint": hint, "location": location, "exit_code": code})
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



def warn_plan(job_plan: JobPlan) -> None:
    for warning in job_plan.warnings:
        click.echo(f"warning: {warning}", err=True)
