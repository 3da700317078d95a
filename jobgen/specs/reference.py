"""Markdown reference of the spec, profile and project fields, generated from the models' field docs.

The documentation site's reference pages (docs/reference/*.md) hold a marker, e.g.
``<!-- jobgen-reference: spec -->``, that the site's build hook (docs/hooks.py) replaces with
:func:`table` of that model, so the pages are never edited by hand: a field added to a model is
in the next build. ``python -m jobgen.specs.reference`` prints every table.
"""

from __future__ import annotations

import re
import sys
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import TrainingSpec

#: The marker a documentation page holds where a table goes: ``<!-- jobgen-reference: NAME -->``.
MARKER = re.compile(r"^<!-- jobgen-reference: ([a-z]+) -->$", flags=re.M)


def _type_name(annotation: typing.Any) -> str:
    args = typing.get_args(annotation)
    if any(typing.get_origin(a) is typing.Annotated for a in args):  # a union of constrained types: their base types
        bases = [typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args]
        return " \\| ".join("None" if a is type(None) else _type_name(a) for a in bases)
    text = str(annotation).replace("typing.", "").replace("jobgen.specs.training.", "").replace("jobgen.specs.profile.", "")
    if isinstance(annotation, type):
        text = annotation.__name__
    return text.replace("|", "\\|")


def _nested(annotation: typing.Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested(arg)
        if found is not None:
            return found
    return None


def _all_nested(annotation: typing.Any) -> list[type[BaseModel]]:
    """Every model of a union (``model: ModelSpec | ClassSpec``), in order; [] for none."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += [m for m in _all_nested(arg) if m not in found]
    return found


def _rows(model: type[BaseModel], prefix: str, out: list[str], seen: set[type[BaseModel]]) -> None:
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        nested = _nested(field.annotation)
        alternatives = _all_nested(field.annotation) if nested is not None else []
        if model.__name__ == "ModelSpec" and name in ("n_layer", "n_head", "d_model", "block_size"):
            default = "from `preset`"
        elif field.is_required():
            default = "**required**"
        elif field.default_factory is not None or nested is not None and field.default is not None:
            default = "(see below)" if nested else "{}"
        else:
            default = f"`{field.default!r}`" if field.default is not PydanticUndefined else ""
        doc = " ".join((field.description or "").split()).replace("|", "\\|")
        shown = _type_name(field.annotation) if nested is None else " \\| ".join(m.__name__ for m in alternatives)
        out.append(f"| `{path}` | {shown} | {default} | {doc} |")
        if nested is not None and typing.get_origin(field.annotation) not in (tuple, list):
            for alternative in alternatives:  # a union's models each get their rows (ClassSpec after ModelSpec)
                if alternative not in seen:
                    _rows(alternative, f"{path}.", out, seen | {alternative})


def _models() -> dict[str, tuple[str, type[BaseModel], tuple[tuple[str, type[BaseModel]], ...]]]:
    """``name -> (title, model, (prefix, model) of list entries whose fields follow)``, in the site's order."""
    from jobgen.specs.project import Project, ProjectJob

    return {"spec": ("Training spec (`examples/*.yaml`)", TrainingSpec, ()),
            "profile": ("Cluster profile (`cluster_profiles/*.yaml`)", ClusterProfile, ()),
            "project": ("Project file (`jobgen.yaml`)", Project, (("jobs[].", ProjectJob),))}


def table(name: str) -> str:
    """The Markdown table of one model's fields (``spec``, ``profile`` or ``project``), nested
    models' fields as dotted paths, in the models' field order.

    Raises:
        ValueError: an unknown name (the valid ones are listed).
    """
    models = _models()
    if name not in models:
        raise ValueError(f"no reference table {name!r}; valid: {', '.join(models)}")
    _, model, entries = models[name]
    rows: list[str] = []
    _rows(model, "", rows, {model})
    for prefix, entry in entries:  # `jobs` is a list: its entries' fields follow as jobs[].<field>
        _rows(entry, prefix, rows, {entry})
    return "| field | type | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- jobgen-reference: NAME -->`` line replaced by :func:`table`."""
    return MARKER.sub(lambda match: table(match.group(1)).rstrip("\n"), markdown)


def reference() -> str:
    """Every table, each under its title (what ``python -m jobgen.specs.reference`` prints)."""
    return "\n".join(f"## {title}\n\n{table(name)}" for name, (title, _, _) in _models().items())


def main(argv: list[str]) -> int:
    """``python -m jobgen.specs.reference``."""
    if argv:
        sys.stderr.write("usage: python -m jobgen.specs.reference\n")
        return 2
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
