"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict`` (a broken
link or anchor, a page missing from the nav, a docstring mkdocstrings cannot read fails), and its
spec/profile/project reference is generated from the pydantic models, never kept by hand."""

from __future__ import annotations

import collections.abc
import importlib.util
import os
import re
import subprocess
import sys
import typing

import pytest
import yaml
from pydantic import BaseModel, Field

from jobgen.specs import reference
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.project import Project
from jobgen.specs.trainer import TrainerSpec
from jobgen.specs.training import TrainingSpec
from tests.conftest import REPO, require
from tests.pages import DOCS, PAGES, page_name

MARKER = "<!-- jobgen-reference: {} -->"


def nav_pages(nav: list) -> list[str]:
    """The page paths of mkdocs.yml's ``nav`` (sections flattened), in order."""
    out: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def mkdocs_config() -> dict:
    # mkdocs.yml holds no YAML tags (no !!python/name: ...), so the safe loader reads it whole.
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_the_nav_lists_every_page_once():
    """Each page of docs/ is in the site's navigation, once (mkdocs only reports an omitted page)."""
    listed = nav_pages(mkdocs_config()["nav"])
    assert len(listed) == len(set(listed)), listed
    assert sorted(listed) == sorted(page_name(page).removeprefix("docs/") for page in PAGES[1:])


def test_the_build_is_strict_and_the_reference_comes_from_the_hook():
    config = mkdocs_config()
    assert config["strict"] is True and config["hooks"] == ["docs/hooks.py"]
    assert set(config["validation"].values()) == {"warn"}  # with strict: every finding fails the build


def test_a_local_build_is_ignored_by_git():
    """`mkdocs build` writes site/ (mkdocs' default site_dir) in the clone: an untracked file there
    would block the next snapshotted `jobgen submit` (a dirty tree)."""
    assert "site_dir" not in mkdocs_config()
    check = subprocess.run(["git", "check-ignore", "-q", "--no-index", "site/index.html"], cwd=REPO)
    assert check.returncode == 0, "site/ is not ignored by .gitignore"


def field_paths(model: type[BaseModel], prefix: str = "", chain: frozenset = frozenset()) -> set[str]:
    """Every path a user can write in a file of ``model``, found by this test's own walk over the
    models' fields and their annotations (not the generator's): ``a.b`` for a nested model's
    field, ``a[].b`` for a field of a list's entries, ``a.<name>.b`` for a field of a mapping's
    values, and each model of a union (``model: ModelSpec | ClassSpec``) under the same path."""
    paths: set[str] = set()
    for field_name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or field_name}"
        paths.add(path)
        paths |= annotation_paths(field.annotation, path, chain | {model})
    return paths


def annotation_paths(annotation: object, path: str, chain: frozenset) -> set[str]:
    """The field paths reachable through one annotation at ``path`` (see :func:`field_paths`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return set() if annotation in chain else field_paths(annotation, f"{path}.", chain)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        return set().union(*(annotation_paths(arg, f"{path}[]", chain) for arg in args if arg is not Ellipsis))
    if origin in (dict, collections.abc.Mapping):
        return annotation_paths(args[1], f"{path}.<name>", chain)
    if origin is typing.Annotated:
        return annotation_paths(args[0], path, chain)
    return set().union(*(annotation_paths(arg, path, chain) for arg in args))  # a union; () for a plain type


def shown_paths(markdown: str) -> list[str]:
    """The field of every row of every table in ``markdown`` (the first column's code)."""
    return re.findall(r"^\| `([^`]+)` \|", markdown, flags=re.M)


#: Keys of a file that no model field holds: the profile's ``extends`` (read by the loader).
FILE_ONLY = {"spec": set(), "profile": {"extends"}, "project": set()}


@pytest.mark.parametrize("table,model", [("spec", TrainingSpec), ("profile", ClusterProfile), ("project", Project)])
def test_the_reference_lists_every_field_path_of_the_models(table, model):
    """Every path a file may hold is a row of the reference, and every row is such a path: the
    nested lists (``kubernetes.tolerations[].key``) and mappings (``kubernetes.secret_env.<name>.key``)
    of models included; each row has a meaning."""
    markdown = reference.table(table)
    shown = shown_paths(markdown)
    expected = field_paths(model) | FILE_ONLY[table]
    missing, extra = sorted(expected - set(shown)), sorted(set(shown) - expected)
    assert not missing and not extra, f"missing from the reference: {missing}; not a field: {extra}"
    assert len(shown) == len(set(shown)), "a field listed twice"
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    assert all(not row.endswith("|  |") for row in rows), "a field without a description"


def tables_of(markdown: str) -> list[list[str]]:
    """The fields of each table of ``markdown``, table by table."""
    return [shown_paths(block) for block in re.split(r"\n(?!\|)", markdown) if shown_paths(block)]


def test_the_forms_of_a_union_are_shown_apart():
    """``model`` is jobgen's built-in model or your own class: each form is a table of its own,
    so ``model.class_path`` is required where it applies and nowhere near ``model.preset``."""
    tables = tables_of(reference.table("spec"))
    for field, builtin in (("model", "model.preset"), ("data", "data.paths")):
        own = next(t for t in tables if f"{field}.class_path" in t)
        assert builtin not in own and {f"{field}.class_path", f"{field}.init_args"} == set(own)
        assert any(builtin in t and f"{field}.class_path" not in t for t in tables)
    class_path = re.search(r"^\| `model\.class_path` \| ([^|]+) \| ([^|]+) \|", reference.table("spec"), flags=re.M)
    assert class_path.group(2).strip() == "**required**"


@pytest.mark.parametrize(("field", "type_shown"), [
    ("kubernetes.tolerations", "list of sections"),
    ("kubernetes.secret_env", "mapping of name to section"),
    ("kubernetes.image_pull_secrets", "list of string"),
    ("gpu_type", "one of `V100`, `T4`, `A10G`, `A100`, `L4`, `L40S`, `H100`, `H200`, `B200`; or null"),
    ("max_nodes", "integer"),
    ("mem_gib_per_node", "number"),
    ("slurm", "section or null"),
    ("kubernetes.tolerations[].effect", "one of `NoSchedule`, `PreferNoSchedule`, `NoExecute`; or null"),
])
def test_the_types_are_named_as_yaml_has_them(field, type_shown):
    row = re.search(rf"^\| `{re.escape(field)}` \| ([^|]+(?:\\\|[^|]*)*) \|", reference.table("profile"), flags=re.M)
    assert row and row.group(1) == type_shown, row and row.group(1)


def test_a_field_added_to_a_model_is_in_the_reference_without_a_hand_edit(monkeypatch):
    """The reference is generated. A field added to the spec, and one
    added to a nested section, appear in the page the build makes from the marker."""

    class Trainer(TrainerSpec):
        added_nested: float = Field(0.5, description="A nested field no page names.")

    class Spec(TrainingSpec):
        added_top: int = Field(3, description="A field no page names.")
        trainer: Trainer = Field(default=Trainer(), description="Strategy, precision, batch sizes, optimisation.")

    page = "# Training spec reference\n\n" + MARKER.format("spec") + "\n"
    before = reference.expand(page)
    assert "added_top" not in before
    monkeypatch.setattr(reference, "TrainingSpec", Spec)
    after = reference.expand(page)
    assert "| `added_top` | integer | `3` | A field no page names. |" in after
    assert "| `trainer.added_nested` | number | `0.5` | A nested field no page names. |" in after
    assert MARKER.format("spec") not in after and after.startswith("# Training spec reference\n\n| field |")


def load_hooks():
    """docs/hooks.py, loaded by path as mkdocs does."""
    spec = importlib.util.spec_from_file_location("jobgen_docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_site_hook_expands_the_markers_of_the_reference_pages():
    """docs/hooks.py turns each reference page's marker into its table (the models' fields, or
    the commands: ``cli``); every table is on a page, once, and a page without a marker is left
    alone."""
    hooks = load_hooks()
    markers = [m for page in PAGES for m in reference.MARKER.findall(page.read_text())]
    assert sorted(markers) == sorted([*reference._models(), "cli", "failures", "exitcodes", "launcherexits", "capabilities"]) == sorted(hooks.REFERENCES)
    for table, build in hooks.REFERENCES.items():
        page = next(p for p in PAGES if table in reference.MARKER.findall(p.read_text()))
        assert page.parent == DOCS / "reference" or (page.name, table) in (("failures.md", "failures"), ("failures.md", "exitcodes"),
                                                                                         ("failures.md", "launcherexits"),
                                                                                         ("support.md", "capabilities"))
        built = hooks.on_page_markdown(page.read_text(), page=None, config=None, files=None)
        assert build().rstrip("\n") in built and "jobgen-reference" not in built
    untouched = (DOCS / "quickstart.md").read_text()
    assert hooks.on_page_markdown(untouched, page=None, config=None, files=None) == untouched


def test_an_unknown_table_fails_the_build_naming_the_valid_ones():
    with pytest.raises(ValueError, match="no reference table 'specs'; valid: spec, profile, project$"):
        reference.expand(MARKER.format("specs"))
    with pytest.raises(ValueError, match="no reference table 'clis'; valid: spec, profile, project, cli, failures, exitcodes, launcherexits, capabilities$"):
        load_hooks().on_page_markdown(MARKER.format("clis"), page=None, config=None, files=None)


def test_the_reference_is_deterministic():
    """The same models give the same Markdown: twice in this process, and in a fresh process
    under another hash seed (a set's order would show there)."""
    here = reference.reference()
    assert reference.reference() == here
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-m", "jobgen.specs.reference"], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout == here


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """`mkdocs build --strict` (what CI runs, through this test): exit 0, no warning, every page
    built, the reference tables generated and the Python API rendered from its docstrings."""
    require("mkdocs", "the documentation site needs mkdocs (pip install -e '.[docs]')")
    require("material", "the documentation site needs mkdocs-material (pip install -e '.[docs]')")
    require("mkdocstrings_handlers.python", "the documentation site needs mkdocstrings[python] (pip install -e '.[docs]')")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                            "--site-dir", str(site)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    assert "WARNING" not in build.stderr, build.stderr
    for page in PAGES[1:]:
        relative = page_name(page).removeprefix("docs/").removesuffix(".md")
        html = site / ("index.html" if relative == "index" else f"{relative}/index.html")
        assert html.is_file(), f"{page_name(page)} was not built"
    spec_page = (site / "reference" / "spec" / "index.html").read_text()
    assert "jobgen-reference" not in spec_page and "<code>trainer.strategy</code>" in spec_page
    profile_page = (site / "reference" / "profile" / "index.html").read_text()
    assert "<code>kubernetes.tolerations[].key</code>" in profile_page
    assert "<code>kubernetes.secret_env.&lt;name&gt;.secret</code>" in profile_page
    cli_page = (site / "reference" / "cli" / "index.html").read_text()
    assert "jobgen-reference" not in cli_page and "<code>--kubeconfig</code>" in cli_page
    api_page = (site / "api" / "index.html").read_text()
    for function in ("plan_job", "render", "submit", "status", "logs", "cancel", "executor"):
        assert f'id="jobgen.api.{function}"' in api_page, function
    assert not literal_roles(api_page), literal_roles(api_page)


#: A Sphinx role as the page would show it, were it left in a docstring (``:class:`X```).
SPHINX_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc|obj):")


def literal_roles(html: str) -> list[str]:
    """Each Sphinx role left in the page's text (tags removed), with the words around it."""
    words = re.sub(r"<[^>]+>", "", html)
    return [words[max(0, m.start() - 30):m.end() + 40] for m in SPHINX_ROLE.finditer(words)]


def test_a_role_left_in_a_page_is_found():
    """The check of the API page above, on the HTML mkdocstrings makes of ``:class:`X```."""
    assert literal_roles('<p>Raises :class:<code>~jobgen.errors.JobgenError</code> and :func:<code>f</code></p>')
    assert not literal_roles('<p>Raises <a href="#x"><code>JobgenError</code></a> (a class: see below)</p>')


def test_the_api_page_extension_turns_roles_into_optional_references():
    """docs/api_roles.py (the griffe extension mkdocs.yml names): each role becomes an optional
    autorefs reference to its full name (a link where the target is on the site, code elsewhere);
    ``~`` shows the last name; a role's literal form is gone."""
    require("griffe", "the documentation site needs mkdocstrings[python] (pip install -e '.[docs]')")
    spec = importlib.util.spec_from_file_location("jobgen_api_roles", DOCS / "api_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    assert "docs/api_roles.py" in mkdocs_config()["plugins"][1]["mkdocstrings"]["handlers"]["python"]["options"]["extensions"]
    text = "Raises :class:`~jobgen.errors.JobgenError`; see :func:`plan_job` and :py:meth:`!x.y`."
    out = roles.rewrite(text, lambda name: {"plan_job": "jobgen.api.plan_job"}.get(name, name))
    assert out == ('Raises <autoref identifier="jobgen.errors.JobgenError" optional><code>JobgenError</code></autoref>; '
                   'see <autoref identifier="jobgen.api.plan_job" optional><code>plan_job</code></autoref> and `x.y`.')
    assert not SPHINX_ROLE.search(out)
