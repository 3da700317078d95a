"""Markdown reference of the spec and profile fields, generated from the models' field docs.

``python -m jobgen.specs.reference`` prints it; README.md carries it between the
``<!-- reference:start -->`` / ``<!-- reference:end -->`` markers and a test keeps them equal
(``python -m jobgen.specs.reference --write README.md`` refreshes the README).
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import TrainingSpec

START, END = "<!-- reference:start -->", "<!-- reference:end -->"


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


def reference() -> str:
    """The Markdown reference: one table for the training spec, one for cluster profiles."""
    from jobgen.specs.project import Project, ProjectJob

    parts = []
    for title, model in (("Training spec (`examples/*.yaml`)", TrainingSpec), ("Cluster profile (`cluster_profiles/*.yaml`)", ClusterProfile),
                         ("Project file (`jobgen.yaml`)", Project)):
        rows: list[str] = []
        _rows(model, "", rows, {model})
        if model is Project:  # `jobs` is a list: its entries' fields follow as jobs[].<field>
            _rows(ProjectJob, "jobs[].", rows, {ProjectJob})
        parts.append(f"### {title}\n\n| field | type | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def splice(readme: str) -> str:
    """``readme`` with the text between the reference markers replaced by :func:`reference`.

    Raises:
        ValueError: the markers are missing.
    """
    head, start, rest = readme.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README lacks the {START} ... {END} markers")
    return f"{head}{START}\n{reference()}{END}{tail}"


def main(argv: list[str]) -> int:
    """``python -m jobgen.specs.reference [--write README.md]``."""
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(splice(path.read_text()))
        return 0
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
