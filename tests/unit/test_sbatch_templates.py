"""One sbatch template: the job array (templates/slurm/array.sbatch.j2) is the single job
(job.sbatch.j2) plus the blocks where an array task differs, so a fix to the launch, the signal
trap or the environment is made once."""

from __future__ import annotations

import re
import shutil

from jobgen.planning.render import template_sha256
from tests.conftest import TEMPLATES

SINGLE = TEMPLATES / "slurm" / "job.sbatch.j2"
ARRAY = TEMPLATES / "slurm" / "array.sbatch.j2"
_TAG = re.compile(r"^\s*(\{%.*%\}|\{#.*#\})\s*$")


def _text_lines(path):
    """The template's lines that render as script text (not a lone Jinja tag or comment), stripped, non-blank."""
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not _TAG.match(ln)]


def test_the_array_template_extends_the_single_job_and_holds_only_blocks():
    source = ARRAY.read_text()
    assert '{% extends "slurm/job.sbatch.j2" %}' in source
    outside = re.sub(r"\{% block (\w+) %\}.*?\{% endblock %\}", "", source, flags=re.S)
    outside = re.sub(r"\{#.*?#\}|\{% extends [^%]*%\}", "", outside, flags=re.S)
    assert outside.strip() == "", f"text outside blocks is ignored by Jinja: {outside!r}"
    overridden = set(re.findall(r"\{% block (\w+) %\}", source))
    assert overridden <= set(re.findall(r"\{% block (\w+) %\}", SINGLE.read_text())), "a block the single job lacks"


def test_no_line_of_the_single_job_is_repeated_in_the_array_template():
    single = set(_text_lines(SINGLE))
    repeated = [ln for ln in _text_lines(ARRAY) if ln in single and ln not in {"fi", "exit 2"}]
    assert repeated == [], f"lines copied from job.sbatch.j2 (put them in the single job, outside the blocks): {repeated}"


def test_the_array_hash_covers_the_single_job_template(tmp_path):
    """An edit to job.sbatch.j2 changes what an array renders, so it changes the array's inputs hash."""
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    before = template_sha256(str(templates), "slurm/array.sbatch.j2")
    single = templates / "slurm" / "job.sbatch.j2"
    single.write_text(single.read_text().replace("set -euo pipefail", "set -euo pipefail\n# edited"))
    template_sha256.cache_clear()
    assert template_sha256(str(templates), "slurm/array.sbatch.j2") != before
