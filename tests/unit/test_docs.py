"""The README is a contract: its test command is what CI runs, its reference is current."""

from __future__ import annotations

import re
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
from jobgen.specs.reference import splice
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def fenced_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in fenced_commands() if "pytest" in c)
    assert test_command in (REPO / ".ci" / "run").read_text().splitlines()


def test_the_quick_starts_test_line_says_it_runs_the_labs_and_names_the_quick_tier():
    """Issue 30: the Quick start's "Test" line said "unit, golden, script and real 2-process training
    tests" for a command that also runs the SLURM, ssh and Kubernetes labs (root, apt installs, a
    build of many minutes)."""
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    test_line = quick_start.split("**Test**", 1)[1].split("```bash", 1)[0]
    for words in ("SLURM, ssh and Kubernetes labs", "root", "apt", '-m "not lab and not slow"', "(#test-tiers)"):
        assert words in test_line, f"the Quick start's Test line does not say {words!r}: {test_line}"
    assert '-m "not lab and not slow"`: the quick tier' in README  # the tier it names is the one Test tiers defines


def test_quickstart_command_pins_cpu_torch_and_runs_the_local_job():
    main = fenced_commands()[0]
    assert "torch==2.13.0" in main and "jobgen submit examples/quickstart.yaml --profile local" in main


def test_reference_is_current():
    assert splice(README) == README, "refresh README.md's reference: jobgen.specs.reference.splice"


def test_shipped_profiles_are_listed_in_readme():
    for profile in (REPO / "cluster_profiles").glob("*.yaml"):
        assert f"`{profile.stem}`" in README


#: The modules the training spec's models are defined in (jobgen.specs.training re-exports them).
SPEC_MODULES = (spec, spec_model, spec_trainer, spec_user, spec_notify)


def public_models(*modules) -> list[type[BaseModel]]:
    """The pydantic models a module defines (names without a leading underscore)."""
    return [obj for module in modules for name, obj in sorted(vars(module).items())
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__ and not name.startswith("_")]


@pytest.mark.parametrize("model", public_models(*SPEC_MODULES, profiles, project), ids=lambda m: m.__name__)
def test_every_field_has_a_description(model):
    """Descriptions feed the README reference and `jobgen schema`: a new field must say what it means."""
    undocumented = [name for name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert not undocumented, f"{model.__name__}: give {undocumented} a Field(description=...)"


@pytest.mark.parametrize("model", public_models(*SPEC_MODULES, profiles, project), ids=lambda m: m.__name__)
def test_render_path_models_do_not_parse_their_source(model):
    """use_attribute_docstrings makes pydantic read and parse the class source at import (about half
    the import time of jobgen.specs.training + jobgen.specs.profile); descriptions are Field(description=...) instead."""
    assert not model.model_config.get("use_attribute_docstrings")


def plan_examples() -> list[tuple[str, str]]:
    """``(command, shown output)`` of every ```text block of the README that runs ``jobgen plan``."""
    blocks = re.findall(r"```text\n(\$ jobgen plan .+?)\n```", README, flags=re.S)
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
    """The README's `jobgen plan` examples are the command's stdout, `assumptions:` block included
    (issue 23): run each and compare."""
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
    """Issue 23: the throughput table comes from SparkTrainer's Distributed Training Guide, not
    from our tracker (one place: jobgen.planning.seeds.SEED_SOURCE, which `jobgen plan` prints)."""
    from jobgen.planning.seeds import SEED_SOURCE

    assert "SparkTrainer" in SEED_SOURCE and "Distributed Training Guide" in SEED_SOURCE
    assert "tracker" not in SEED_SOURCE
    # the README's paragraphs that cite the table name no (issue) tracker; "experiment trackers"
    # (W&B, MLflow: trainer.loggers) are another subject
    citing = [p for p in README.split("\n\n") if "SparkTrainer" in p]
    assert citing and not [p for p in citing if "tracker" in p], citing
    assert "SparkTrainer's Distributed Training Guide" in README


def test_every_profile_the_readme_names_is_shipped_or_defined_there():
    """Issue 23: the job-array example named `--profile slurm-cpu-array`, which was not shipped."""
    shipped = {p.stem for p in (REPO / "cluster_profiles").glob("*.yaml")}
    defined = set(re.findall(r"^# cluster_profiles/([\w-]+)\.yaml\n(?!.*shipped)", README, flags=re.M))
    named = set(re.findall(r"(?:--profile|-p)[ =]([a-z][\w-]*)", README))
    assert named - shipped - defined == set()


def test_the_repository_root_holds_only_project_files():
    """Issue 23: a stray `ds.time` (a shell error message) was committed at the root."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    top = {path.split("/")[0] for path in tracked}
    assert top <= {".ci", ".gitattributes", ".gitignore", "README.md", "benchmarks", "cluster_profiles", "docs", "examples", "jobgen", "jobgen.yaml",
                   "manifests", "mkdocs.yml", "pyproject.toml", "setup.cfg", "templates", "tests"}, top


def test_the_output_directories_the_readme_suggests_are_ignored_by_git():
    """Issue 30: `benchmarks/gpu_suite.py --out results/` left an untracked results/ in the clone,
    and an untracked file blocks the next snapshotted submit (a dirty tree)."""
    import subprocess

    outs = set(re.findall(r"benchmarks/gpu_suite\.py --out ([^\s`/][^\s`]*)", README))  # relative: in the clone
    assert outs, "the README names no gpu_suite.py --out directory any more: update this test"
    for out in sorted(outs):
        probe = f"{out.rstrip('/')}/gpu_suite.json"
        check = subprocess.run(["git", "check-ignore", "-q", "--no-index", probe], cwd=REPO)
        assert check.returncode == 0, f"{probe} is not ignored by .gitignore"


def test_readme_layout_names_every_package_and_module():
    """The README's Layout entry is the map of jobgen/: a package or module added, moved or
    renamed without it fails here (each `jobgen/<package>/` line names all of its modules)."""
    layout = README.split("- Layout:", 1)[1].split("\n- ", 1)[0]
    package = Path(jobgen.__file__).parent
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file() and p.name != "train"):
        assert f"`jobgen/{sub.name}/`" in layout, f"README Layout does not name jobgen/{sub.name}/"
        entry = layout.split(f"`jobgen/{sub.name}/`", 1)[1].split("\n  - ", 1)[0]
        for module in sorted(m.stem for m in sub.glob("*.py") if m.stem != "__init__"):
            assert f"`{module}`" in entry, f"README Layout's jobgen/{sub.name}/ line does not name {module}"
    for module in sorted(m.name for m in package.glob("*.py") if m.stem != "__init__"):
        assert f"`jobgen/{module}`" in layout, f"README Layout does not name jobgen/{module}"


def test_the_python_api_snippet_leaves_the_committed_manifests_alone(tmp_path, monkeypatch):
    """Issue 30: the README's API example rendered a two-node plan into manifests/, over the committed
    manifests/slurm-a100/quickstart/, and `render --all --check` failed after it. Its plan and
    render lines run here (in a copy of the checkout's manifests/, examples and profiles)."""
    import shutil

    block = README.split("### Python API", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]
    lines = block.splitlines()
    runnable = "\n".join(lines[:next(i for i, line in enumerate(lines) if line.startswith("result = api.submit"))])
    assert "api.render(" in runnable, runnable
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    for name in ("examples", "cluster_profiles", "templates", "jobgen.yaml"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    before = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in (tmp_path / "manifests").rglob("*") if p.is_file()}
    exec(compile(runnable.replace("print(job_plan)", "str(job_plan)"), "README.md", "exec"), {})
    after = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in (tmp_path / "manifests").rglob("*") if p.is_file()}
    assert after == before, sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
