"""``jobgen profiles list|show`` (cluster profiles, ``extends:`` resolved) and ``jobgen schema`` (the
JSON Schema of a spec, a profile or jobgen.yaml)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click
import yaml

from jobgen.cli.options import profiles_dir_option
from jobgen.cli.output import JobgenGroup, echo_doc, output_option
from jobgen.errors import JobgenError
from jobgen.specs.load import list_profile_names, load_profile, load_profile_doc
from jobgen.specs.profile import PROFILE_FILE_CONTEXT


@click.group(cls=JobgenGroup)
def profiles() -> None:
    """List and show cluster profiles (inheritance resolved)."""


@profiles.command("list")
@output_option()
@profiles_dir_option
def profiles_list(output: str, profiles_dir: str | None) -> None:
    """List every profile visible through the lookup order, with its scheduler and nodes; a
    profile with example values to replace (``placeholders:``) says how many."""
    rows = []
    for name in list_profile_names(profiles_dir):
        try:
            p = load_profile(name, profiles_dir)
        except JobgenError as exc:
            rows.append({"name": name, "error": exc.message.splitlines()[0]})
            continue
        rows.append({"name": name, "scheduler": p.scheduler, "max_nodes": p.max_nodes, "gpus_per_node": p.gpus_per_node,
                     "gpu_type": p.gpu_type, "cpu_processes_per_node": p.cpu_processes_per_node, "description": p.description,
                     "example_values": sorted(p.placeholders)})
    if output == "json":
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    for row in rows:
        if "error" in row:
            click.echo(f"{row['name']:16} (invalid: {row['error']})")
            continue
        shape = f"{row['gpus_per_node']}x {row['gpu_type']}" if row["gpus_per_node"] else f"{row['cpu_processes_per_node']} CPU rank(s)"
        example = f"  [example: {len(row['example_values'])} value(s) to set]" if row["example_values"] else ""
        click.echo(f"{row['name']:16} {row['scheduler']:10} up to {row['max_nodes']} node(s) of {shape:14} {row['description']}{example}")


@profiles.command("show")
@click.argument("name")
@output_option("text", "yaml", "json", yaml_help="a profile file jobgen reads (with `extends:` resolved)")
@profiles_dir_option
def profiles_show(name: str, output: str, profiles_dir: str | None) -> None:
    """Show profile NAME with `extends:` resolved and defaults filled in: text (one line per
    field, by its dotted path, as --set and the reference (docs/reference/) name it), yaml (a profile file
    you can copy) or json. The example values still in force end it, under ``placeholders``:
    a copy keeps them marked."""
    _, path = load_profile_doc(name, profiles_dir)
    profile = load_profile(name, profiles_dir)
    resolved = profile.model_dump(mode="json", context=PROFILE_FILE_CONTEXT)
    if profile.placeholders:
        resolved["placeholders"] = {key: profile.placeholders[key].reason for key in sorted(profile.placeholders)}
    if output == "json":
        echo_doc(resolved)
        return
    click.echo(f"# {path}")
    if output == "yaml":
        click.echo(yaml.safe_dump(resolved, sort_keys=False), nl=False)
        return
    fields = dict(_flatten(resolved))
    width = max(map(len, fields))
    for key, value in fields.items():
        click.echo(f"{key:{width}}  {value}")


def _flatten(doc: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted.path, value)`` of every leaf of ``doc`` in order; lists and empty mappings as
    compact JSON, None as ``null``."""
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value if isinstance(value, str) else json.dumps(value)


@click.command()
@click.argument("kind", type=click.Choice(["spec", "profile", "project"]))
@output_option("json", "yaml", yaml_help="the same schema in YAML")
def schema(kind: str, output: str) -> None:
    """Print the JSON Schema of a training spec, a cluster profile or jobgen.yaml (for editors).

    \b
    Example (VS Code YAML extension):
      jobgen schema spec > spec.schema.json
    """
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.project import Project
    from jobgen.specs.training import TrainingSpec

    model = {"spec": TrainingSpec, "profile": ClusterProfile, "project": Project}[kind]
    if output == "yaml":
        click.echo(yaml.safe_dump(model.model_json_schema(), sort_keys=True), nl=False)
        return
    echo_doc(model.model_json_schema())
