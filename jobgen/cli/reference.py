"""Markdown reference of every ``jobgen`` command, generated from the click commands themselves.

The documentation site's command reference (docs/reference/cli.md) holds the marker
``<!-- jobgen-reference: cli -->``, which the site's build hook (docs/hooks.py) replaces with
:func:`cli_reference`, so a command or option added to the code is on the page at the next
build. ``python -m jobgen.cli.reference`` prints it.

Each command (sub-groups' commands too, in the order ``jobgen --help`` lists them) gets a
``##`` section: its usage line, its help text, and a table of its arguments and options with
their values and help. Options marked hidden are left out, as ``--help`` leaves them out;
``-h/--help`` itself is named once, in the lead.
"""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
from collections.abc import Iterator

import click

#: Characters Markdown reads as markup in prose (outside code spans), and their escapes.
_MARKUP = {"\\": "\\\\", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]", "<": "&lt;", ">": "&gt;", "#": "\\#"}
_LEAD = ("Every command, its arguments and its options, generated from the commands themselves. "
         "Every command also takes `-h`/`--help`, which prints the same text.")


def commands(group: click.Group | None = None) -> Iterator[tuple[str, click.Command, click.Context]]:
    """``(full name, command, context)`` of ``group`` (default: ``jobgen``) and of every command
    under it, depth first, in the order the group's help lists them."""
    from jobgen.cli.app import cli

    root = group or cli
    yield from _walk(root, click.Context(root, info_name="jobgen"), "jobgen")


def _walk(command: click.Command, ctx: click.Context, name: str) -> Iterator[tuple[str, click.Command, click.Context]]:
    yield name, command, ctx
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, click.Context(sub, info_name=sub_name, parent=ctx), f"{name} {sub_name}")


def _prose(text: str, *, table: bool = False) -> str:
    """``text`` as Markdown prose: markup characters outside ``code spans`` escaped (and ``|``
    in a table cell), lines joined."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    out = []
    for part in parts:
        if not part.startswith("`"):
            part = "".join(_MARKUP.get(c, c) for c in part)
            if table:
                part = part.replace("|", "\\|")
        out.append(part)
    return "".join(out)


def _help(command: click.Command) -> str:
    """A command's help as Markdown: prose paragraphs, and each ``\\b`` paragraph (kept as
    written by click) as a ``text`` block."""
    blocks = []
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(command.help or "")):
        if paragraph.startswith("\b"):
            body = textwrap.dedent(paragraph.removeprefix("\b").strip("\n")).rstrip()
            if body:
                blocks.append(f"```text\n{body}\n```")
        elif paragraph.strip():
            blocks.append(_prose(paragraph))
    return "\n\n".join(blocks)


def _value(param: click.Parameter, ctx: click.Context) -> str:
    """What an argument or option takes: the choices, a metavar, or nothing (a flag)."""
    if isinstance(param, click.Option) and (param.is_flag or param.count):
        return "flag"
    if isinstance(param.type, click.Choice):
        return "one of " + ", ".join(f"`{choice}`" for choice in param.type.choices)
    metavar = param.metavar or param.type.get_metavar(param, ctx) or param.type.name.upper()
    return f"`{metavar}`"


def _rows(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.params:
        if isinstance(param, click.Argument):
            need = "required" if param.required else "optional"
            many = ", any number" if param.nargs == -1 else ""
            rows.append(f"| `{param.human_readable_name}` | {_value(param, ctx)} | argument ({need}{many}) |")
        elif isinstance(param, click.Option) and not param.hidden:
            names = ", ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))
            record = param.get_help_record(ctx)
            rows.append(f"| {names} | {_value(param, ctx)} | {_prose(record[1] if record else '', table=True)} |")
    return rows


def section(name: str, command: click.Command, ctx: click.Context) -> str:
    """The Markdown section of one command: heading, usage, help, the table of its parameters."""
    usage = " ".join([name, *command.collect_usage_pieces(ctx)])
    parts = [f"## `{name}`", f"```text\n{usage}\n```", _help(command)]
    rows = _rows(command, ctx)
    if rows:
        parts.append("| argument or option | value | meaning |\n|---|---|---|\n" + "\n".join(rows))
    if isinstance(command, click.Group):
        subs = [f"`{name} {sub}`" for sub in command.list_commands(ctx)]
        parts.append("Commands: " + ", ".join(subs) + ".")
    return "\n\n".join(part for part in parts if part)


def cli_reference() -> str:
    """The whole reference: the lead, then one section per command (see the module's doc)."""
    return _LEAD + "\n\n" + "\n\n".join(section(*entry) for entry in commands()) + "\n"


def main(argv: list[str]) -> int:
    """``python -m jobgen.cli.reference``."""
    from jobgen.specs.reference import page_main

    return page_main(argv, "jobgen.cli.reference", cli_reference)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
