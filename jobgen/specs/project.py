"""The project file ``jobgen.yaml``: which specs render for which profiles (``jobgen render --all``).

:class:`Project` is the file's model (``jobgen schema project``, docs/reference/project.md);
:func:`load_project` finds, reads and validates it. Planning a project into files is
:func:`jobgen.planning.project.plan_project`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobgen.errors import ConfigError
from jobgen.specs.load import read_yaml, validate
from jobgen.specs.sweeps import SweepAxis, parse_axes

PROJECT_FILE = "jobgen.yaml"


class _ProjectModel(BaseModel):
    # Descriptions as Field(description=...): use_attribute_docstrings would parse this file's
    # source at import, and every `render --all` imports this module (through jobgen.planning.project).
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProjectJob(_ProjectModel):
    """One entry of ``jobs:``: a spec rendered for one or more profiles."""

    spec: str = Field(min_length=1, description="Training spec file, relative to the directory of ``jobgen.yaml``.")
    profiles: tuple[str, ...] = Field(
        min_length=1, description="Cluster profiles to render the spec for (names as in ``jobgen profiles list``).")
    overrides: tuple[str, ...] = Field(
        default=(), alias="set", description="Spec overrides, exactly like ``--set key.path=value`` (value parsed as YAML).")
    sweep: tuple[str, ...] | dict[str, tuple[str | bool | int | float, ...]] = Field(
        default=(),
        description="Sweep axes, like ``--sweep``: ``key.path=v1,v2`` strings or a mapping of key path to a list of values; "
        "one job per point of the grid.",
    )

    @field_validator("profiles")
    @classmethod
    def _profiles_unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({p for p in value if value.count(p) > 1})
        if repeated:
            raise ValueError(f"profile {repeated[0]!r} is listed twice")
        return value

    @field_validator("overrides")
    @classmethod
    def _overrides_are_assignments(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if "=" not in item or item.startswith("="):
                raise ValueError(f"override {item!r} is not key.path=value (e.g. trainer.max_steps=200)")
        return value

    @field_validator("sweep")
    @classmethod
    def _sweep_parses(cls, value: Any) -> Any:
        parse_axes(value)
        return value

    @property
    def axes(self) -> tuple[SweepAxis, ...]:
        """The sweep axes (validated at load; see :func:`jobgen.specs.sweeps.parse_axes`)."""
        return parse_axes(self.sweep)


class Project(_ProjectModel):
    """``jobgen.yaml``: which specs render for which profiles (``jobgen render --all``)."""

    jobgen_schema_kind: ClassVar[str] = "project"

    out: str = Field(default="manifests", description="Output root, relative to ``jobgen.yaml``: jobs go to ``<out>/<profile>/<job>/``.")
    profiles_dir: str | None = Field(
        default=None,
        description="Directory searched first for profiles, relative to ``jobgen.yaml``; ``null``: ``$JOBGEN_HOME``,\n"
        "then ``cluster_profiles/`` next to ``jobgen.yaml``, then the packaged ones.",
    )
    templates_dir: str | None = Field(
        default=None,
        description="Directory of the templates, relative to ``jobgen.yaml``; ``null``: ``$JOBGEN_HOME``, then\n"
        "``templates/`` next to ``jobgen.yaml``, then the packaged ones.",
    )
    top_level_kustomization: bool = Field(
        default=True,
        description="Write ``<out>/kustomization.yaml`` over every Kubernetes profile (needs object names unique across them); "
        "per-profile ones are always written.",
    )
    jobs: tuple[ProjectJob, ...] = Field(description="The specs to render, each for its profiles.")

    @field_validator("jobs")
    @classmethod
    def _some_jobs(cls, value: tuple[ProjectJob, ...]) -> tuple[ProjectJob, ...]:
        if not value:
            raise ValueError("list at least one job (spec + profiles)")
        return value

    @field_validator("out")
    @classmethod
    def _out_is_a_subdirectory(cls, value: str) -> str:
        path = PurePosixPath(value.replace("\\", "/"))
        if path.is_absolute() or ".." in path.parts or str(path) in ("", "."):
            raise ValueError("out must be a subdirectory of the project, like 'manifests'")
        return str(path)


@dataclass(frozen=True)
class LoadedProject:
    """A validated project file and the directory its paths are relative to."""

    path: Path
    root: Path
    project: Project


def find_project(start: Path | None = None) -> Path:
    """``jobgen.yaml`` in ``start`` (default: the working directory) or the nearest parent.

    Raises:
        ConfigError: none found.
    """
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / PROJECT_FILE
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"no {PROJECT_FILE} in {here} or its parent directories",
        hint=f"create {PROJECT_FILE} (see docs/gitops.md) or pass --project PATH",
    )


def load_project(path: str | os.PathLike[str] | None = None) -> LoadedProject:
    """Read and validate a project file (``None``: :func:`find_project`).

    Raises:
        ConfigError: missing/unreadable file, bad YAML, unknown keys (did-you-mean), bad values;
            the message names the file and the field path (``jobs[1].sweep``).
    """
    file = Path(path) if path is not None else find_project()
    doc = read_yaml(file)
    project = validate(Project, doc, str(file))
    return LoadedProject(file, file.resolve().parent, project)
