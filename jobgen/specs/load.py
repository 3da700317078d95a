"""YAML -> validated models.

Handles: reading YAML safely, ``extends:`` inheritance between profiles, ``--set key.path=value``
overrides, finding profiles and templates (lookup order: :func:`search_dirs`), and turning
pydantic's errors into :class:`~jobgen.errors.ConfigError` with file, JSON path, did-you-mean
and a hint.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from jobgen.errors import ConfigError, did_you_mean, json_path
from jobgen.specs.capabilities import capabilities
from jobgen.specs.profile import ClusterProfile, LocalSettings
from jobgen.specs.training import BUILTIN_TAG, USER_CLASS_TAG, ClassSpec, TrainingSpec

M = TypeVar("M", bound=BaseModel)

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the jobgen package (this module is jobgen/specs/load.py)
MAX_EXTENDS_DEPTH = 16


#: YAML 1.1 base-60 ("sexagesimal") numbers: PyYAML reads ``2:4`` as 124 and ``1:30.5`` as 90.5.
_BASE60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads YAML 1.1 base-60 numbers as strings: ``nodes: 2:4`` is the elastic
    range "2:4", not the integer 124 (YAML 1.2 dropped base 60; no jobgen field means it)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0] and isinstance(value, str) and _BASE60.fullmatch(value):
            return "tag:yaml.org,2002:str"
        return yaml.resolver.Resolver.resolve(self, kind, value, implicit)  # both loaders' resolver


if getattr(yaml, "__with_libyaml__", False):

    class _FastLoader(yaml.CSafeLoader):
        """:class:`_Loader`'s rules on libyaml's parser (~6x faster on a spec; ``render --all``
        reads one spec per job). Only valid YAML goes this way: errors come from :class:`_Loader`."""

        resolve = _Loader.resolve

else:  # PyYAML built without libyaml
    _FastLoader = _Loader  # type: ignore[misc]


def _load_yaml(text: str) -> Any:
    """The document in ``text`` under :class:`_Loader`'s rules. Parsed with libyaml where PyYAML
    has it; YAML that libyaml refuses is parsed again by the pure-Python loader, so the error
    (its message, line and column) is PyYAML's own, the same with or without libyaml.

    Raises:
        yaml.YAMLError: the text is not valid YAML.
    """
    try:
        return yaml.load(text, Loader=_FastLoader)  # noqa: S506 - SafeLoader rules
    except yaml.YAMLError:
        if _FastLoader is _Loader:
            raise
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


# --------------------------------------------------------------------------- lookup


def _packaged_dir(subpackage: str, source_dir: str) -> Path:
    """Where the copies shipped with jobgen live: the installed data package, or the source tree."""
    installed = PACKAGE_ROOT / subpackage
    if installed.is_dir():
        return installed
    return PACKAGE_ROOT.parent / source_dir


def search_dirs(kind: str, override: str | os.PathLike[str] | None = None) -> list[Path]:
    """Directories searched for ``kind`` ("templates" or "cluster_profiles"), first match wins.

    Order: the ``--templates-dir``/``--profiles-dir`` flag, then
    ``$JOBGEN_HOME/<kind>``, then ``./<kind>`` in the working directory, then the copies
    packaged with jobgen.
    """
    dirs: list[Path] = []
    if override is not None:
        dirs.append(Path(override))
    home = os.environ.get("JOBGEN_HOME")
    if home:
        dirs.append(Path(home) / kind)
    dirs.append(Path.cwd() / kind)
    dirs.append(_packaged_dir("_templates" if kind == "templates" else "_profiles", kind))
    seen: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def find_profile_file(name: str, profiles_dir: str | os.PathLike[str] | None = None) -> Path:
    """Resolve a profile name (or a path to a ``.yaml`` file) to a file.

    Raises:
        ConfigError: no such profile; lists the known ones and a did-you-mean.
    """
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    for directory in search_dirs("cluster_profiles", profiles_dir):
        for suffix in (".yaml", ".yml"):
            path = directory / f"{name}{suffix}"
            if path.is_file():
                return path
    known = list_profile_names(profiles_dir)
    hint = did_you_mean(name, known) or "pass a profile name or a path to a .yaml file"
    raise ConfigError(
        f"unknown profile {name!r}; known profiles: {', '.join(known) or '(none found)'}",
        hint=f"{hint} (search order: {', '.join(str(d) for d in search_dirs('cluster_profiles', profiles_dir))})",
    )


def list_profile_names(profiles_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of all profiles visible through the lookup order, sorted."""
    names: set[str] = set()
    for directory in search_dirs("cluster_profiles", profiles_dir):
        names.update(p.stem for p in directory.glob("*.y*ml"))
    return sorted(names)


# --------------------------------------------------------------------------- YAML


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one YAML mapping from ``path``.

    Raises:
        ConfigError: the file is missing/unreadable, is not valid YAML (line and column given),
            or its top level is not a mapping.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}", hint="check the path (relative paths are from the current directory)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_yaml(text, str(path))


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """Parse YAML text holding one mapping (``{}`` for an empty document).

    Raises:
        ConfigError: invalid YAML, or a top level that is not a mapping.
    """
    try:
        doc = _load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML: {problem}", location=where, hint="fix the YAML syntax at that line") from None
    except RecursionError:
        raise ConfigError("invalid YAML: nesting too deep", location=source) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(
            f"the top level must be a mapping of keys to values, got {type(doc).__name__}",
            location=source,
            hint="start the file with 'name: ...' style key: value lines",
        )
    return doc


# --------------------------------------------------------------------------- overrides


#: Characters YAML reads as line breaks besides \n and \r (YAML 1.1): an override holding one is not parsed.
_YAML_LINE_BREAKS = re.compile("[\x85\u2028\u2029]")


def apply_overrides(doc: Mapping[str, Any], overrides: Sequence[str], source: str = "--set") -> dict[str, Any]:
    """Return a copy of ``doc`` with ``key.path=value`` overrides applied.

    The value is parsed as a YAML scalar/flow value (``8`` -> int, ``[a, b]`` -> list,
    ``'08'`` -> str); text YAML cannot read as written (invalid YAML, or holding NEL, U+2028 or
    U+2029, which YAML folds into a space) is taken as a string, as it is. Only the first ``=``
    separates key and value.

    Raises:
        ConfigError: an override without ``=``, an empty key segment, or a path through a
            non-mapping value.
    """
    result = _deep_copy(doc)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key.path=value", location=source, hint="e.g. --set trainer.max_steps=200")
        parts = key.split(".")
        if any(not p for p in parts):
            raise ConfigError(f"override key {key!r} has an empty segment", location=source, hint="e.g. --set trainer.max_steps=200")
        try:
            # YAML reads NEL, U+2028 and U+2029 as line breaks (folded into a space): such text is taken as it is
            value = _load_yaml(raw) if raw.strip() and not _YAML_LINE_BREAKS.search(raw) else raw
        except yaml.YAMLError:
            value = raw
        node: dict[str, Any] = result
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    f"cannot set {key!r}: {'.'.join(parts[: i + 1])!r} is a {type(child).__name__}, not a mapping",
                    location=source,
                )
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def deep_merge(base: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``child`` over ``base``: mappings merge recursively, everything else is replaced."""
    merged = _deep_copy(dict(base))
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = _deep_copy(value)
    return merged


# --------------------------------------------------------------------------- validation


def validate(model: type[M], doc: Any, source: str) -> M:
    """Validate ``doc`` as ``model``; pydantic errors become one :class:`ConfigError`.

    The message lists every problem with its JSON path; unknown keys get a did-you-mean
    against the valid keys at that place.

    Raises:
        ConfigError: ``doc`` does not validate.
    """
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise _config_error(model, exc, source) from None
    except (TypeError, ValueError, RecursionError) as exc:  # odd YAML shapes pydantic cannot wrap
        raise ConfigError(f"invalid value: {exc}", location=source) from None


def _config_error(model: type[BaseModel], exc: ValidationError, source: str) -> ConfigError:
    lines: list[str] = []
    hints: list[str] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = json_path(tuple(part for part in loc if part not in _UNION_TAGS))
        if err["type"] == "extra_forbidden":
            valid = _fields_at(model, loc[:-1])
            suggestion = did_you_mean(str(loc[-1]), valid) if valid else None
            lines.append(f"{path}: unknown key" + (f" ({suggestion})" if suggestion else ""))
            if valid:
                hints.append(f"valid keys at {json_path(tuple(p for p in loc[:-1] if p not in _UNION_TAGS))}: "
                             f"{', '.join(sorted(valid))}")
        elif err["type"] == "model_attributes_type" and loc and loc[-1] == USER_CLASS_TAG:
            lines.append(f"{path}: give a mapping {{class_path: pkg.module.Class, init_args: {{...}}}}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            given = err.get("input")
            shown = "" if isinstance(given, (dict, list, BaseModel)) or err["type"] == "missing" else f" (got {given!r:.60})"
            lines.append(f"{path}: {msg}{shown}")
    kind = getattr(model, "jobgen_schema_kind", "spec" if model is TrainingSpec else "profile")
    first_hint = hints[0] if hints else f"see `jobgen schema {kind}` for every field"
    message = "invalid configuration:\n    " + "\n    ".join(lines)
    return ConfigError(message, location=source, hint=first_hint)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc`` (best effort; [] when not a model)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if part in _UNION_TAGS:  # the branch of a model/data union that produced the error
            current = _UNION_TAGS[part] or current
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _model_type(fields[part].annotation)
        if current is None:
            return []
    return [f.alias or name for name, f in (getattr(current, "model_fields", {}) or {}).items()]


#: Union tags of TrainingSpec.model/data (pydantic puts them into error locations): dropped from
#: the printed path; the user-class tag selects ClassSpec for the valid keys (None: the first model
#: of the union, the built-in one, which _model_type already picked).
_UNION_TAGS: dict[str, type[BaseModel] | None] = {USER_CLASS_TAG: ClassSpec, BUILTIN_TAG: None}


def _model_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_type(arg)
        if found is not None:
            return found
    return None


# --------------------------------------------------------------------------- entry points


def load_spec(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> TrainingSpec:
    """Load and validate a training spec YAML file, with ``--set`` overrides applied.

    Raises:
        ConfigError: unreadable file, invalid YAML, or invalid fields (with JSON path + hint).
    """
    doc = apply_overrides(read_yaml(path), overrides)
    return validate(TrainingSpec, doc, str(path))


def load_profile_doc(name: str, profiles_dir: str | os.PathLike[str] | None = None) -> tuple[dict[str, Any], Path]:
    """Read a profile with its ``extends:`` chain merged in (base first), unvalidated.

    Raises:
        ConfigError: missing profile, an ``extends`` cycle or chain deeper than 16, bad YAML.
    """
    path = find_profile_file(name, profiles_dir)
    chain: list[tuple[Path, dict[str, Any]]] = []
    seen: list[str] = []
    current: Path | None = path
    while current is not None:
        key = str(current.resolve())
        if key in seen:
            cycle = " -> ".join(Path(s).stem for s in [*seen, key])
            raise ConfigError(f"profile inheritance cycle: {cycle}", location=str(path), hint="remove one 'extends:'")
        if len(seen) >= MAX_EXTENDS_DEPTH:
            raise ConfigError("profile 'extends:' chain is deeper than 16", location=str(path))
        seen.append(key)
        doc = read_yaml(current)
        chain.append((current, doc))
        parent = doc.get("extends")
        if parent is None:
            current = None
        elif not isinstance(parent, str) or not parent:
            raise ConfigError(f"extends must be a profile name, got {parent!r}", location=f"{current}: extends")
        else:
            parent_path = Path(parent)
            if parent_path.suffix in (".yaml", ".yml") and not parent_path.is_absolute():
                parent_path = current.parent / parent_path
                current = parent_path if parent_path.is_file() else find_profile_file(parent, profiles_dir)
            else:
                current = find_profile_file(parent, profiles_dir)
    merged: dict[str, Any] = {}
    placeholders: dict[str, Any] = {}
    for source, doc in reversed(chain):
        merged = deep_merge(merged, {k: v for k, v in doc.items() if k not in ("extends", "placeholders")})
        placeholders = _placeholders_after(placeholders, doc, source)
    if placeholders:
        merged["placeholders"] = placeholders
    merged["name"] = path.stem
    return merged, path


def _sets(doc: Mapping[str, Any], path: str) -> bool:
    """Whether the profile document ``doc`` gives a value (``null`` too) to the dotted ``path``."""
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _placeholders_after(inherited: dict[str, Any], doc: Mapping[str, Any], source: Path) -> dict[str, Any]:
    """The placeholders in force once the profile file ``source`` (its document ``doc``) is applied
    over a base whose placeholders are ``inherited``: the file's own set of a field replaces an
    inherited placeholder; the fields its ``placeholders:`` names are added, with the file's path.

    Raises:
        ConfigError: ``placeholders:`` is not a mapping.
    """
    kept = {key: value for key, value in inherited.items() if not _sets(doc, key)}
    declared = doc.get("placeholders")
    if declared is None:
        return kept
    if not isinstance(declared, dict):
        raise ConfigError(f"placeholders must be a mapping of field path to reason, got {type(declared).__name__}",
                          location=f"{source}: placeholders", hint="e.g. placeholders: {kubernetes.image: build yours (docs/install.md)}")
    for key, reason in declared.items():
        kept[key] = {"reason": reason, "file": str(source)} if isinstance(reason, str) else reason
    return kept


def _placeholders_without(doc: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``doc`` without the placeholders to which ``overrides`` (``key.path=value``, as
    :func:`load_profile` takes them) give a value, or give an enclosing section a value."""
    placeholders = doc.get("placeholders")
    if not isinstance(placeholders, dict) or not placeholders:
        return doc
    keys = [item.partition("=")[0] for item in overrides]
    kept = {path: value for path, value in placeholders.items()
            if not any(path == key or path.startswith(key + ".") for key in keys)}
    return {**doc, "placeholders": kept}


def load_profile(
    name: str, profiles_dir: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()
) -> ClusterProfile:
    """Load a cluster profile by name or path, with inheritance and overrides resolved; a local
    profile with ``local.detect_gpus: true`` takes this machine's GPUs when it has any
    (:mod:`jobgen.specs.local_gpus`).

    Raises:
        ConfigError: see :func:`load_profile_doc` and :func:`validate`.
    """
    doc, path = load_profile_doc(name, profiles_dir)
    doc = _placeholders_without(apply_overrides(doc, list(overrides), source="--profile-set"), list(overrides))
    profile = validate(ClusterProfile, doc, str(path))
    own = getattr(profile, capabilities(profile.scheduler).settings_attr)  # the scheduler's own section
    if isinstance(own, LocalSettings) and own.detect_gpus:
        from jobgen.specs import local_gpus  # only now: the device query's cost is documented there

        gpus = local_gpus.detect_gpus()
        if gpus is not None:
            profile = validate(ClusterProfile, local_gpus.apply_local_gpus(doc, gpus), f"{path} (this machine's GPUs)")
    return profile
