"""Markdown reference of the spec, profile and project fields, generated from the models' field docs.

The documentation site's reference pages (docs/reference/*.md) hold a marker, e.g.
``<!-- jobgen-reference: spec -->``, that the site's build hook (docs/hooks.py) replaces with
:func:`table` of that model, so the pages are never edited by hand: a field added to a model is
in the next build. ``python -m jobgen.specs.reference`` prints every table.

A row's field is the path a user writes in the file: ``trainer.strategy`` for a nested
section's field, ``kubernetes.tolerations[].key`` for a field of each entry of a list, and
``kubernetes.secret_env.<name>.secret`` for a field of each value of a mapping. A field that
takes one of several sections (``model``: jobgen's built-in model or your own class) gets one
table per form, after the main table. Types are named as YAML writes them (string, integer,
number, boolean, list, mapping, null).
"""

from __future__ import annotations

import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from jobgen.specs.file_schema import EXTENDS_DOC, PROFILE_NAME_DOC
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import BUILTIN_TAG, USER_CLASS_TAG, TrainingSpec

#: The marker a documentation page holds where a table goes: ``<!-- jobgen-reference: NAME -->``.
MARKER = re.compile(r"^<!-- jobgen-reference: ([a-z]+) -->$", flags=re.M)

#: YAML's names of Python's scalar types.
_SCALARS: dict[object, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null",
                               typing.Any: "any"}
#: What a form of a union of sections is called, by the tag its discriminator gives it
#: (jobgen.specs.training: a mapping with ``class_path`` is the user's class).
_FORMS = {BUILTIN_TAG: ("jobgen's built-in {leaf}", "has no `class_path`"), USER_CLASS_TAG: ("your own class", "has a `class_path`")}
#: ModelSpec's GPT sizes: filled from ``preset`` when not given (jobgen.specs.model).
_FROM_PRESET = ("n_layer", "n_head", "d_model", "block_size")
#: The origins of a union: ``Union[A, B]`` and ``A | B``.
_UNIONS = (typing.Union, types.UnionType)
#: A ``|`` inside a table cell (a bare one ends the cell in Markdown).
_PIPE = "\\|"


@dataclass(frozen=True)
class _Table:
    """One table: its heading and lead (empty for a page's main table) and its rows."""

    heading: str = ""
    lead: str = ""
    rows: list[str] = field(default_factory=list)


def _members(annotation: typing.Any) -> tuple[typing.Any, ...]:
    """The members of a union (``Annotated`` unwrapped), or the annotation itself."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in _UNIONS:
        return tuple(m for arg in typing.get_args(annotation) for m in _members(arg))
    return (annotation,)


def _is_model(annotation: typing.Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _forms(annotation: typing.Any) -> list[tuple[str, type[BaseModel]]]:
    """``(tag, model)`` of each section of a union of two or more sections (``model``); [] otherwise."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _forms(typing.get_args(annotation)[0])
    forms: list[tuple[str, type[BaseModel]]] = []
    for arg in typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS else ():
        inner, tag = arg, ""
        if typing.get_origin(arg) is typing.Annotated:
            inner, *extras = typing.get_args(arg)
            tag = next((getattr(e, "tag", "") for e in extras if getattr(e, "tag", None)), "")
        if _is_model(inner):
            forms.append((tag, inner))
    return forms if len(forms) > 1 else []


def _type_name(annotation: typing.Any) -> str:
    """The YAML name of an annotation: ``integer``, ``list of string``, ``one of `a`, `b```,
    ``section or null``."""
    members = _members(annotation)
    if len(members) > 1:
        if _forms(annotation):
            return "one of the forms below"
        named = [_type_name(m) for m in members if m is not type(None)]
        text = " or ".join(named)
        if type(None) in members:
            text += ("; or null" if any(m.startswith("one of") for m in named) else " or null")
        return text
    annotation = members[0]
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if _is_model(annotation):
        return "section"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        values = [f"`{_yaml(v)}`" for v in args]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if origin in (tuple, list, Sequence):
        items = [a for a in args if a is not Ellipsis]
        if len(items) == 1 and (Ellipsis in args or origin is not tuple):
            item = items[0]
            return "list of sections" if _is_model(item) else f"list of {_list_item(_type_name(item))}"
        return "list [" + ", ".join(_type_name(a) for a in items) + "]"
    if origin in (dict, Mapping):
        key, value = args
        if value is typing.Any:
            return "mapping"
        if _is_model(value):
            return "mapping of name to section"
        return f"mapping of {_type_name(key)} to {_list_item(_type_name(value))}"
    return getattr(annotation, "__name__", str(annotation))


def _list_item(name: str) -> str:
    """A type name inside ``list of ...``: bracketed when it holds an ``or`` or a list of values."""
    return f"({name})" if " or " in name or name.startswith("one of") else name


def _yaml(value: typing.Any) -> str:
    """``value`` as one line of YAML (tuples as lists)."""
    def plain(v: typing.Any) -> typing.Any:
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return yaml.safe_dump(plain(value), default_flow_style=True, width=10**6).removesuffix("\n").removesuffix("\n...")


def _default(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    if model.__name__ == "ModelSpec" and name in _FROM_PRESET:
        return "from `preset`"
    if info.is_required():
        return "**required**"
    value = info.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return ""
    if isinstance(value, BaseModel):
        return "its fields' defaults"
    return f"`{_yaml(value)}`".replace("|", _PIPE)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", _PIPE)


class _Builder:
    """Walks a model's fields into tables: the main one, then one per form of each union."""

    def __init__(self, overrides: Mapping[str, tuple[str, str, str]] | None = None,
                 extra_rows: Sequence[tuple[str, str, str, str]] = ()):
        """``overrides``: top-level field -> (type, default, meaning) shown instead of the model's;
        ``extra_rows``: (field, type, default, meaning) of keys no model holds, after ``name``."""
        self.tables: list[_Table] = [_Table()]
        self.pending: list[tuple[str, list[tuple[str, type[BaseModel]]], frozenset[type[BaseModel]]]] = []
        self.overrides = overrides or {}
        self.extra_rows = extra_rows

    def build(self, model: type[BaseModel]) -> str:
        self.fields(model, "", self.tables[0].rows, frozenset({model}))
        while self.pending:
            path, forms, chain = self.pending.pop(0)
            for tag, form in forms:
                label, when = _FORMS.get(tag, (form.__name__, ""))
                doc = _cell((form.__doc__ or "").strip().split("\n\n")[0]).replace("``", "`")
                lead = f"Used when `{path}` {when}. {doc}" if when else doc
                table = _Table(f"`{path}`: {label.format(leaf=path.rsplit('.', 1)[-1])} ({form.__name__})", lead)
                self.tables.append(table)
                self.fields(form, f"{path}.", table.rows, chain | {form})
        return "\n\n".join(_render(t) for t in self.tables) + "\n"

    def fields(self, model: type[BaseModel], prefix: str, rows: list[str], chain: frozenset[type[BaseModel]]) -> None:
        for name, info in model.model_fields.items():
            path = f"{prefix}{info.alias or name}"
            shown, default, doc = _type_name(info.annotation), _default(model, name, info), info.description or ""
            if not prefix and path in self.overrides:
                shown, default, doc = self.overrides[path]
            rows.append(f"| `{path}` | {shown} | {default} | {_cell(doc)} |")
            if not prefix and path == "name":
                rows += [f"| `{p}` | {t} | {d} | {_cell(m)} |" for p, t, d, m in self.extra_rows]
            self.inner(info.annotation, path, rows, chain)

    def inner(self, annotation: typing.Any, path: str, rows: list[str], chain: frozenset[type[BaseModel]]) -> None:
        """The rows of the sections one field's annotation holds: a section's fields, a list's
        or a mapping's entries' fields, or (deferred to tables of their own) a union's forms."""
        forms = _forms(annotation)
        if forms:
            self.pending.append((path, [(tag, m) for tag, m in forms if m not in chain], chain))
            return
        for member in _members(annotation):
            if _is_model(member):
                if member not in chain:
                    self.fields(member, f"{path}.", rows, chain | {member})
                continue
            origin, args = typing.get_origin(member), typing.get_args(member)
            if origin in (tuple, list, Sequence):
                for item in (a for a in args if a is not Ellipsis):
                    self.inner(item, f"{path}[]", rows, chain)
            elif origin in (dict, Mapping):
                self.inner(args[1], f"{path}.<name>", rows, chain)


def _render(table: _Table) -> str:
    head = f"## {table.heading}\n\n{table.lead}\n\n" if table.heading else ""
    return head + "| field | type | default | meaning |\n|---|---|---|---|\n" + "\n".join(table.rows)


def _models() -> dict[str, tuple[str, type[BaseModel]]]:
    """``name -> (title, model)``, in the site's order."""
    from jobgen.specs.project import Project

    return {"spec": ("Training spec (`examples/*.yaml`)", TrainingSpec),
            "profile": ("Cluster profile (`cluster_profiles/*.yaml`)", ClusterProfile),
            "project": ("Project file (`jobgen.yaml`)", Project)}


def table(name: str) -> str:
    """The Markdown of one file's fields (``spec``, ``profile`` or ``project``): a table of
    field paths in the models' field order, then a table (under a ``##`` heading) for each form
    of a field that takes one of several sections.

    Raises:
        ValueError: an unknown name (the valid ones are listed).
    """
    models = _models()
    if name not in models:
        raise ValueError(f"no reference table {name!r}; valid: {', '.join(models)}")
    if name == "profile":  # a file's name is its file name; `extends` is read by the loader, not the model
        builder = _Builder({"name": ("string", "the file's name", PROFILE_NAME_DOC)},
                           [("extends", "string", "(none)", EXTENDS_DOC)])
    else:
        builder = _Builder()
    return builder.build(models[name][1])


#: Every table a marker may name: this module's, by name.
TABLES: dict[str, Callable[[], str]] = {name: (lambda name=name: table(name)) for name in ("spec", "profile", "project")}


def expand(markdown: str, tables: Mapping[str, Callable[[], str]] | None = None) -> str:
    """``markdown`` with every ``<!-- jobgen-reference: NAME -->`` line replaced by the Markdown
    ``tables[NAME]()`` builds (``tables``: :data:`TABLES` when not given).

    Raises:
        ValueError: a marker names no table (the valid ones are listed).
    """
    tables = TABLES if tables is None else tables

    def replace(match: re.Match[str]) -> str:
        if match.group(1) not in tables:
            raise ValueError(f"no reference table {match.group(1)!r}; valid: {', '.join(tables)}")
        return tables[match.group(1)]().rstrip("\n")

    return MARKER.sub(replace, markdown)


def reference() -> str:
    """Every table, each under its title (what ``python -m jobgen.specs.reference`` prints)."""
    return "\n".join(f"# {title}\n\n{table(name)}" for name, (title, _) in _models().items())


def page_main(argv: list[str], module: str, page: Callable[[], str]) -> int:
    """The ``main`` of a reference page's module, ``python -m <module>``: writes ``page()`` to
    stdout and returns 0; any argument is a usage error (usage on stderr, 2)."""
    if argv:
        sys.stderr.write(f"usage: python -m {module}\n")
        return 2
    sys.stdout.write(page())
    return 0


def main(argv: list[str]) -> int:
    """``python -m jobgen.specs.reference``."""
    return page_main(argv, "jobgen.specs.reference", reference)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
