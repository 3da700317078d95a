"""``jobgen schema spec|profile|project`` describes the files as users write them: every shipped
file validates against the printed schema (an editor using it flags none of them), and the
schema still refuses what jobgen refuses (unknown keys, wrong types, a missing required field)."""

from __future__ import annotations

import functools
import json

import pytest
import yaml
from click.testing import CliRunner

from jobgen.cli import cli
from tests.conftest import EXAMPLES, PROFILES, REPO, require

#: The files each schema describes, as shipped.
SHIPPED = {"profile": sorted(PROFILES.glob("*.yaml")), "spec": sorted(EXAMPLES.glob("*.yaml")), "project": [REPO / "jobgen.yaml"]}


@functools.cache
def printed_schema(kind: str) -> dict:
    """What ``jobgen schema KIND`` prints, parsed."""
    result = CliRunner().invoke(cli, ["schema", kind], prog_name="jobgen")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def errors(kind: str, doc: object) -> list[str]:
    """The schema's findings on ``doc``, each as ``path: message``, those under an ``anyOf`` (a
    field that may be null) included; [] when it validates."""
    jsonschema = require("jsonschema")
    schema = printed_schema(kind)
    validator = jsonschema.validators.validator_for(schema)(schema)
    found, todo = [], list(validator.iter_errors(doc))
    while todo:
        error = todo.pop(0)
        found.append(f"{'.'.join(map(str, error.absolute_path)) or '<top>'}: {error.message}")
        todo += error.context
    return found


@pytest.mark.parametrize("path", [p for files in SHIPPED.values() for p in files], ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_shipped_file_validates_against_the_printed_schema(path):
    kind = next(kind for kind, files in SHIPPED.items() if path in files)
    assert errors(kind, yaml.safe_load(path.read_text())) == []


def test_the_shipped_profiles_include_both_kinds_of_file():
    """Standalone profiles and ones that extend another (so the test above covers both)."""
    extending = [p.name for p in SHIPPED["profile"] if "extends" in yaml.safe_load(p.read_text())]
    assert extending and len(extending) < len(SHIPPED["profile"])


STANDALONE = {"scheduler": "kubernetes", "kubernetes": {"image": "registry.example/train:1"}}


@pytest.mark.parametrize(("doc", "found"), [
    ({**STANDALONE, "bogus": 1}, "'bogus' was unexpected"),
    ({"extends": "k8s-a100", "bogus": 1}, "'bogus' was unexpected"),
    ({"kubernetes": {"image": "registry.example/train:1"}}, "'scheduler' is a required property"),
    ({"scheduler": "kubernetes", "kubernetes": {"namespace": "x"}}, "kubernetes: 'image' is a required property"),
    ({"extends": "k8s-a100", "max_nodes": "many"}, "max_nodes: 'many' is not of type 'integer'"),
    ({"extends": "k8s-a100", "kubernetes": {"tolerations": [{"operator": "Sometimes"}]}}, "'Sometimes' is not one of"),
    ({"extends": 3}, "extends: 3 is not of type 'string'"),
], ids=["unknown-key", "unknown-key-extending", "no-scheduler", "no-image", "wrong-type-extending", "bad-toleration", "extends-not-a-name"])
def test_the_profile_schema_refuses_what_jobgen_refuses(doc, found):
    assert any(found in error for error in errors("profile", doc)), errors("profile", doc)


@pytest.mark.parametrize("doc", [
    STANDALONE,
    {**STANDALONE, "name": "ignored"},
    {"extends": "k8s-a100", "kubernetes": {"queue_label": "q"}},
    {"extends": "slurm-a100", "slurm": {"container": {"runtime": "pyxis"}}},
], ids=["standalone", "with-name", "extending-partial-section", "extending-nested"])
def test_the_profile_schema_takes_what_the_loader_takes(doc):
    """``name`` is optional (the loader names a profile after its file); a file with ``extends``
    gives only what it changes, sections included (the loader merges them into the parent)."""
    assert errors("profile", doc) == []
