"""Claims of the user pages checked against what jobgen does, or against the project's own
measurements: a page that says what a command writes says what running it writes, and a page
that says what ran on a GPU agrees with the evidence page (docs/evidence.md)."""

from __future__ import annotations

import re
import shutil

import yaml
from click.testing import CliRunner

from jobgen.cli import cli
from tests.conftest import EXAMPLES, PROFILES
from tests.pages import text


def section(page: str, heading: str) -> str:
    """The text of one ``## heading`` section of a page, up to the next ``##`` heading."""
    body = text(page).split(f"\n## {heading}\n", 1)[1]
    return re.split(r"\n## ", body, maxsplit=1)[0]


def sentences_naming(body: str, phrase: str) -> list[str]:
    """The sentences of ``body`` (lines joined) that hold ``phrase``."""
    return [s for s in re.split(r"(?<=[.)])\s+(?=[A-Z(`])", " ".join(body.split())) if phrase in s]


def test_the_trainer_v2_section_names_the_file_render_all_lists(tmp_path, monkeypatch):
    """`jobgen render --all` with a ``job_api: trainjob`` profile: the kustomizations list
    ``trainjob.yaml``, and what docs/kubernetes.md says about ``render --all`` there names that
    file and no other manifest."""
    (tmp_path / "cluster_profiles").mkdir()
    (tmp_path / "examples").mkdir()
    shutil.copy(PROFILES / "k8s-a100.yaml", tmp_path / "cluster_profiles")
    shutil.copy(EXAMPLES / "quickstart.yaml", tmp_path / "examples")
    (tmp_path / "cluster_profiles" / "k8s-v2.yaml").write_text("extends: k8s-a100\nkubernetes:\n  job_api: trainjob\n")
    (tmp_path / "jobgen.yaml").write_text("jobs:\n  - spec: examples/quickstart.yaml\n    profiles: [k8s-v2]\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["render", "--all"], prog_name="jobgen")
    assert result.exit_code == 0, result.output
    listed = {resource.rsplit("/", 1)[-1] for path in (tmp_path / "manifests").rglob("kustomization.yaml")
              for resource in yaml.safe_load(path.read_text())["resources"]}
    assert listed == {"trainjob.yaml"}
    claims = sentences_naming(section("docs/kubernetes.md", "Trainer v2"), "render --all")
    named = {name for claim in claims for name in re.findall(r"`([a-z]+\.yaml)`", claim)}
    assert claims and named == listed, claims


def test_the_precision_paragraph_agrees_with_the_gpu_evidence():
    """docs/evidence.md reports a ``16-mixed`` (fp16) row measured on a GPU; the precision
    paragraph of docs/large-models.md may not say fp16 never ran, and links the evidence."""
    fp16_rows = re.findall(r"^\| gpt\d+m-fp16[^|]*\| [\d,]+ \|", text("docs/evidence.md"), flags=re.M)
    assert fp16_rows, "the evidence page reports no fp16 row: revisit this test"
    paragraph = next(p for p in text("docs/large-models.md").split("\n\n") if p.startswith("Precision (`trainer.precision`"))
    assert not re.search(r"fp16[^.]*not (been )?run", paragraph), paragraph
    assert "evidence.md#gpu-evidence-suite" in paragraph
