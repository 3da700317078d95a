"""JSON Schemas of the files a user writes: a training spec, a cluster profile, ``jobgen.yaml``
(what ``jobgen schema KIND`` prints, for editors). No I/O.

A schema describes the file as written, which is not always the model it is validated into. A
profile file has no ``name`` (the loader names a profile after its file) and may hold
``extends: <profile>``; a file with ``extends`` gives only what it changes, since the loader
merges it into its parent (:func:`jobgen.specs.load.load_profile_doc`). Rules the models check
across fields (``scheduler: kubernetes`` needs a ``kubernetes`` section) are not in the schemas:
``jobgen validate`` reports them.
"""

from __future__ import annotations

import copy
from typing import Any

#: The kinds ``jobgen schema`` takes, in the order its help lists them.
KINDS = ("spec", "profile", "project")

#: Keywords whose value maps names to schemas (the names are not keywords).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs")
#: Keywords whose value is data, not a schema.
_DATA = ("default", "examples", "const", "enum")
#: The meaning of a profile file's ``extends`` (the schema's and the reference's).
EXTENDS_DOC = ("The profile this one inherits from: a profile name (looked up as any profile is) or a path to a "
               ".yaml file (relative to this file). This file's fields are merged over the parent's, sections key "
               "by key, so it gives only what it changes.")
#: The meaning of ``name`` in a profile file.
PROFILE_NAME_DOC = "Optional: a profile's name is always its file's name (without .yaml); a name given here is ignored."
#: What the name of a schema definition of an extending profile file ends with.
_PARTIAL = "Changes"


def file_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, as pydantic writes it) of one kind of file: ``spec``,
    ``profile`` or ``project``.

    Raises:
        ValueError: an unknown kind (the valid ones are listed).
    """
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.project import Project
    from jobgen.specs.training import TrainingSpec

    if kind == "profile":
        return _profile_file_schema(ClusterProfile.model_json_schema())
    if kind == "spec":
        return TrainingSpec.model_json_schema()
    if kind == "project":
        return Project.model_json_schema()
    raise ValueError(f"no schema {kind!r}; valid: {', '.join(KINDS)}")


def _profile_file_schema(model: dict[str, Any]) -> dict[str, Any]:
    """A profile file's schema from the ClusterProfile model's (``model``).

    The top level lists every field with every requirement dropped (at every depth), so a
    file with ``extends`` is checked for unknown keys and types only. Without ``extends``,
    the ``else`` branch adds the model's requirements (``scheduler``, ``kubernetes.image``,
    ...), ``name`` excepted.
    """
    full_defs = model.get("$defs", {})
    properties = copy.deepcopy(model["properties"])
    properties["name"]["description"] = PROFILE_NAME_DOC
    partial = {name: _without_requirements(value) for name, value in properties.items()}
    partial["extends"] = {
        "type": "string", "minLength": 1, "title": "Extends",
        "description": EXTENDS_DOC,
    }
    schema: dict[str, Any] = {
        "title": "Cluster profile file",
        "description": model.get("description", ""),
        "type": "object",
        "additionalProperties": False,
        "properties": partial,
        "if": {"required": ["extends"], "properties": {"extends": {"type": "string"}}},
        "else": {"required": [name for name in model.get("required", []) if name != "name"],
                 "properties": {name: value for name, value in properties.items() if _refers(value)}},
        "$defs": {**full_defs, **{f"{name}{_PARTIAL}": _without_requirements(value) for name, value in full_defs.items()}},
    }
    return schema


def _without_requirements(node: Any) -> Any:
    """``node`` (a schema or part of one) with every ``required`` list dropped and every
    ``#/$defs/X`` reference turned into ``#/$defs/X`` + :data:`_PARTIAL`."""
    if isinstance(node, list):
        return [_without_requirements(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "required" and isinstance(value, list):
            continue
        if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
            out[key] = value + _PARTIAL
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _without_requirements(sub) for name, sub in value.items()}
        elif key in _DATA:
            out[key] = value
        else:
            out[key] = _without_requirements(value)
    return out


def _refers(node: Any) -> bool:
    """Whether a schema refers to a definition (so its requirements differ from the top level's)."""
    if isinstance(node, dict):
        return any(key == "$ref" or _refers(value) for key, value in node.items() if key not in _DATA)
    if isinstance(node, list):
        return any(_refers(item) for item in node)
    return False
