"""The README and the documentation site (docs/) are a contract: the test command is what CI runs,
the examples are what the commands print, every fenced block is one the tests check, and the
README stays a landing page. (The site's build and its generated reference: test_docs_site.py;
the pages' commands: test_readme_commands.py.)"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

import jobgen
from jobgen.specs import model as spec_model
from jobgen.specs import notify as spec_notify
from jobgen.specs import profile as profiles
from jobgen.specs import project
from jobgen.specs import trainer as spec_trainer
from jobgen.specs import training as spec
from jobgen.specs import user as spec_user
from tests.conftest import REPO
from tests.pages import PAGES, page_name, text

README = (REPO / "README.md").read_text()
#: The pages that give the two set-up commands (install and train, install and test).
SET_UP = ("README.md", "docs/quickstart.md")
#: The languages of fenced blocks, each checked: ``bash`` and ``text`` by test_readme_commands.py
#: (every ``jobgen`` command run, planned or skipped with its reason; other commands' paths
#: checked), ``yaml`` by its YAML test there, ``python`` and ``json`` by
#: :func:`test_every_fenced_block_is_one_the_tests_check` (and the snippet tests below).
CHECKED_LANGUAGES = ("bash", "text", "yaml", "python", "json")
#: The ```text blocks that hold no command (no ``$ `` or ``jobgen`` line: nothing to run), by their
#: first line, each with what checks it or why nothing does; any other such block fails
#: :func:`test_every_text_block_runs_a_command_or_is_a_listed_illustration`.
ILLUSTRATIONS = {
    "cluster profile (YAML) + training spec (YAML)": "the pipeline diagram (README.md, docs/index.md): a picture",
    "preflight: 2 ranks joining at node1:29500 (timeout 60 s)":
        "a 2-node preflight's output, figures illustrative (the page says so); the lines are jobgen/train/preflight.py's",
    "/tmp/sweeps/slurm-cpu-array/quickstart/":
        "a job array's directory: test_readme_commands.py checks that the page's commands wrote each file it lists",
    "jobgen: restart 1/3 after infrastructure failure (exit 137 on node2); excluding node2":
        "the SLURM batch script's restart decisions: tests/script/test_sbatch_restart.py produces each line of the block",
    "preflight: GPUs on node gpu5: 8 x NVIDIA H100 80GB HBM3 ok":
        "the preflight's GPU check: tests/unit/test_gpu_health.py produces each line of the block",
}
#: The most lines README.md may have: a landing page; the manual is the site.
README_MAX_LINES = 250


def fenced_commands(page: str = "README.md") -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", text(page), flags=re.S)


def fenced_blocks(page_text: str) -> list[tuple[int, str, str]]:
    """``(line, language, body)`` of every fenced block (indented ones in list items too)."""
    return [(page_text[:m.start()].count("\n") + 1, m.group(2), m.group(3))
            for m in re.finditer(r"^( *)```(\S*)\n(.*?)^ *```", page_text, flags=re.S | re.M)]


@pytest.mark.parametrize("page", SET_UP)
def test_ci_runs_the_readme_test_command(page):
    test_command = next(c for c in fenced_commands(page) if "pytest" in c)
    assert test_command in (REPO / ".ci" / "run").read_text().splitlines()


def test_the_readme_is_a_landing_page():
    """README.md was the manual (2,500 lines); now at most README_MAX_LINES, linking
    into every page of the site, with no lab recipe (the labs' page is one link)."""
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail into docs/"
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]+)?\)", README))
    assert {page_name(page) for page in PAGES[1:]} <= linked | {"docs/index.md"}, sorted({page_name(p) for p in PAGES[1:]} - linked)
    for recipe in ("lab.py", "kubelab", "sshlab", "JOBGEN_SKIP_", "tests/integration"):
        assert recipe not in README, f"README.md gives a lab recipe ({recipe}): it belongs in docs/labs.md"


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_fenced_block_is_one_the_tests_check(page):
    """No block goes unchecked silently: every fenced block is in a language the docs tests check
    (:data:`CHECKED_LANGUAGES`); a Python block compiles and a JSON one parses here."""
    import json

    for line, language, body in fenced_blocks(page.read_text()):
        where = f"{page_name(page)}:{line}"
        assert language in CHECKED_LANGUAGES, f"{where}: a ```{language} block, which no test checks: use one of {CHECKED_LANGUAGES}"
        if language == "python":
            compile(textwrap.dedent(body), where, "exec")
        elif language == "json":
            json.loads(body)


def test_every_text_block_runs_a_command_or_is_a_listed_illustration():
    """A ```text block is checked through its commands (test_readme_commands.py runs its ``$ `` and
    ``jobgen`` lines and compares the output shown); one without a command must be one of
    :data:`ILLUSTRATIONS`, which says what checks it, and every illustration listed is still there."""
    found = set()
    for page in PAGES:
        for line, language, body in fenced_blocks(page.read_text()):
            lines = textwrap.dedent(body).splitlines()
            if language != "text" or any(row.startswith(("$ ", "jobgen ")) for row in lines):
                continue
            assert lines[0] in ILLUSTRATIONS, (f"{page_name(page)}:{line}: a ```text block with no command, which no test checks: "
                                               "show a command and its output ($ jobgen ...), or add it to ILLUSTRATIONS with what checks it")
            found.add(lines[0])
    assert found == set(ILLUSTRATIONS), f"ILLUSTRATIONS lists blocks no page has: {sorted(set(ILLUSTRATIONS) - found)}"


def test_the_fenced_blocks_are_found():
    """The block extraction sees the pages' blocks (a format change must not make the test vacuous)."""
    languages = [language for page in PAGES for _, language, _ in fenced_blocks(page.read_text())]
    for language in CHECKED_LANGUAGES:
        assert language in languages, language
    assert len(languages) >= 40


@pytest.mark.parametrize("page", SET_UP)
def test_the_quick_starts_test_line_says_it_runs_the_labs_and_names_the_quick_tier(page):
    """The Quick start's "Test" line said "unit, golden, script and real 2-process training
    tests" for a command that also runs the SLURM, ssh and Kubernetes labs (root, apt installs, a
    build of many minutes)."""
    test_line = text(page).split("**Test**", 1)[1].split("```bash", 1)[0]
    tiers = "(docs/development.md#test-tiers)" if page == "README.md" else "(development.md#test-tiers)"
    for words in ("SLURM, ssh and Kubernetes labs", "root", "apt", '-m "not lab and not slow"', tiers):
        assert words in test_line, f"{page}'s Test line does not say {words!r}: {test_line}"
    # the tier it names is the one Test tiers defines
    assert '-m "not lab and not slow"`: the quick tier' in text("docs/development.md").split("## Test tiers", 1)[1]


@pytest.mark.parametrize("page", SET_UP)
def test_quickstart_command_pins_cpu_torch_and_runs_the_local_job(page):
    main = fenced_commands(page)[0]
    assert "torch==2.13.0" in main and "jobgen submit examples/quickstart.yaml --profile local" in main


def test_shipped_profiles_are_listed_in_the_profiles_page():
    for profile in (REPO / "cluster_profiles").glob("*.yaml"):
        assert f"`{profile.stem}`" in text("docs/profiles.md")


#: The modules the training spec's models are defined in (jobgen.specs.training re-exports them).
SPEC_MODULES = (spec, spec_model, spec_trainer, spec_user, spec_notify)


def public_models(*modules) -> list[type[BaseModel]]:
    """The pydantic models a module defines (names without a leading underscore)."""
    return [obj for module in modules for name, obj in sorted(vars(module).items())
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__ and not name.startswith("_")]


@pytest.mark.parametrize("model", public_models(*SPEC_MODULES, profiles, project), ids=lambda m: m.__name__)
def test_every_field_has_a_description(model):
    """Descriptions feed the reference pages (docs/reference/) and `jobgen schema`: a new field must say what it means."""
    undocumented = [name for name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert not undocumented, f"{model.__name__}: give {undocumented} a Field(description=...)"


@pytest.mark.parametrize("model", public_models(*SPEC_MODULES, profiles, project), ids=lambda m: m.__name__)
def test_render_path_models_do_not_parse_their_source(model):
    """use_attribute_docstrings makes pydantic read and parse the class source at import (about half
    the import time of jobgen.specs.training + jobgen.specs.profile); descriptions are Field(description=...) instead."""
    assert not model.model_config.get("use_attribute_docstrings")


def plan_examples() -> list[tuple[str, str]]:
    """``(command, shown output)`` of every ```text block of the README and docs/ that runs ``jobgen plan``."""
    blocks = [block for page in PAGES for block in re.findall(r"```text\n(\$ jobgen plan .+?)\n```", page.read_text(), flags=re.S)]
    assert blocks, "no page shows a `jobgen plan` example any more: update this test"
    out = []
    for block in blocks:
        lines = block.split("\n")
        command = lines.pop(0)
        while command.endswith("\\"):
            command = command[:-1] + " " + lines.pop(0).strip()
        out.append((command[2:], "\n".join(lines) + "\n"))
    return out


@pytest.mark.parametrize("command,shown", plan_examples(), ids=[c.split()[2] for c, _ in plan_examples()])
def test_readme_plan_output_is_what_the_command_prints(command, shown, monkeypatch):
    """The pages' `jobgen plan` examples are the command's stdout, `assumptions:` block included:
    run each and compare."""
    import shlex

    from click.testing import CliRunner

    from jobgen.cli import cli

    monkeypatch.chdir(REPO)
    argv = shlex.split(command)
    assert argv[:2] == ["jobgen", "plan"]
    result = CliRunner().invoke(cli, argv[1:])
    assert result.exit_code == 0, result.output
    assert result.stdout == shown


def test_the_seed_table_is_cited_by_its_public_source():
    """The throughput table comes from SparkTrainer's Distributed Training Guide, not
    from our tracker (one place: jobgen.planning.seeds.SEED_SOURCE, which `jobgen plan` prints)."""
    from jobgen.planning.seeds import SEED_SOURCE

    assert "SparkTrainer" in SEED_SOURCE and "Distributed Training Guide" in SEED_SOURCE
    assert "tracker" not in SEED_SOURCE
    # the pages' paragraphs that cite the table name no (issue) tracker; "experiment trackers"
    # (W&B, MLflow: trainer.loggers) are another subject
    citing = [p for page in PAGES for p in page.read_text().split("\n\n") if "SparkTrainer" in p]
    assert citing and not [p for p in citing if "tracker" in p], citing
    assert "SparkTrainer's Distributed Training Guide" in text("docs/large-models.md")


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_profile_the_readme_names_is_shipped_or_defined_there(page):
    """The job-array example once named `--profile slurm-cpu-array`, which was not shipped.
    Each page stands alone: a profile it defines is defined on that page (a YAML snippet headed
    with its file, in a list item too), or written there by ``jobgen profiles detect`` (a
    ``cluster_profiles/<name>.yaml`` path; test_readme_commands.py runs the page's detect and the
    commands that name the file)."""
    page_text = page.read_text()
    shipped = {p.stem for p in (REPO / "cluster_profiles").glob("*.yaml")}
    defined = set(re.findall(r"^ *# cluster_profiles/([\w-]+)\.yaml\n(?!.*shipped)", page_text, flags=re.M))
    named = set(re.findall(r"(?:--profile|-p)[ =]([a-z][\w./-]*)", page_text))
    paths = {n for n in named if "/" in n}
    if "jobgen profiles detect" in page_text:
        defined |= {Path(n).stem for n in paths if n.startswith("cluster_profiles/")}
    assert {Path(n).stem if n in paths else n for n in named} - shipped - defined == set()


def test_the_repository_root_holds_only_project_files():
    """No stray file at the root: a `ds.time` (a shell error message) was once committed there."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    top = {path.split("/")[0] for path in tracked}
    assert top <= {".ci", ".gitattributes", ".gitignore", "README.md", "benchmarks", "cluster_profiles", "docs", "examples", "jobgen", "jobgen.yaml",
                   "manifests", "mkdocs.yml", "pyproject.toml", "setup.cfg", "templates", "tests"}, top


def test_the_output_directories_the_readme_suggests_are_ignored_by_git():
    """`benchmarks/gpu_suite.py --out results/` once left an untracked results/ in the clone,
    and an untracked file blocks the next snapshotted submit (a dirty tree)."""
    import subprocess

    outs = {out for page in PAGES  # relative: in the clone
            for out in re.findall(r"benchmarks/gpu_suite\.py --out ([^\s`/][^\s`]*)", page.read_text())}
    assert outs, "no page names a gpu_suite.py --out directory any more: update this test"
    for out in sorted(outs):
        probe = f"{out.rstrip('/')}/gpu_suite.json"
        check = subprocess.run(["git", "check-ignore", "-q", "--no-index", probe], cwd=REPO)
        assert check.returncode == 0, f"{probe} is not ignored by .gitignore"


def test_readme_layout_names_every_package_and_module():
    """The Layout entry of docs/development.md is the map of jobgen/: a package or module added, moved or
    renamed without it fails here (each `jobgen/<package>/` line names all of its modules)."""
    layout = text("docs/development.md").split("- Layout:", 1)[1].split("\n- ", 1)[0]
    package = Path(jobgen.__file__).parent
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file() and p.name != "train"):
        assert f"`jobgen/{sub.name}/`" in layout, f"docs/development.md Layout does not name jobgen/{sub.name}/"
        entry = layout.split(f"`jobgen/{sub.name}/`", 1)[1].split("\n  - ", 1)[0]
        for module in sorted(m.stem for m in sub.glob("*.py") if m.stem != "__init__"):
            assert f"`{module}`" in entry, f"docs/development.md Layout's jobgen/{sub.name}/ line does not name {module}"
    for module in sorted(m.name for m in package.glob("*.py") if m.stem != "__init__"):
        assert f"`jobgen/{module}`" in layout, f"docs/development.md Layout does not name jobgen/{module}"


def test_the_python_api_snippet_leaves_the_committed_manifests_alone(tmp_path, monkeypatch):
    """The README's API example once rendered a two-node plan into manifests/, over the committed
    manifests/slurm-a100/quickstart/, and `render --all --check` failed after it. Its plan and
    render lines (docs/api.md's first Python block) run here (in a copy of the checkout's
    manifests/, examples and profiles)."""
    import shutil

    block = text("docs/api.md").split("```python\n", 1)[1].split("\n```", 1)[0]
    lines = block.splitlines()
    runnable = "\n".join(lines[:next(i for i, line in enumerate(lines) if line.startswith("result = api.submit"))])
    assert "api.render(" in runnable, runnable
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    for name in ("examples", "cluster_profiles", "templates", "jobgen.yaml"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    before = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in (tmp_path / "manifests").rglob("*") if p.is_file()}
    exec(compile(runnable.replace("print(job_plan)", "str(job_plan)"), "docs/api.md", "exec"), {})
    after = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in (tmp_path / "manifests").rglob("*") if p.is_file()}
    assert after == before, sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))


def example_files() -> list[str]:
    """Every file under examples/, relative to the repository (caches and compiled files left out)."""
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "examples").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".egg-info")) and
                  not any(part.endswith(".egg-info") for part in p.parts))


def test_the_examples_page_names_every_example_file():
    """docs/examples.md lists every file under examples/: by its path, or inside a directory it
    names (``examples/usercode/tinychar/`` with ``model.py``); a new example must be listed there."""
    page = text("docs/examples.md")
    files = example_files()
    assert "examples/quickstart.yaml" in files and "examples/image/Containerfile" in files
    missing = [f for f in files if f"`{f}`" not in page and not (f"`{f.rsplit('/', 1)[0]}/`" in page and f"`{f.rsplit('/', 1)[1]}`" in page)]
    assert not missing, f"docs/examples.md does not name {missing}: add a line saying what each shows and the command that runs it"
