"""docs/lint_prose.py measures the user pages and the public docstrings, and passes on this checkout.

Its measuring functions are tested on small hostile inputs, so that the script can fail correctly.
"""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("jobgen_lint_prose", REPO / "docs" / "lint_prose.py")
lint = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = lint
spec.loader.exec_module(lint)


def sentences_of(markdown: str) -> list[str]:
    return lint.sentences(lint.prose(textwrap.dedent(markdown)))


# --------------------------------------------------------------------------- the checkout


def test_the_user_pages_and_docstrings_pass():
    """``python docs/lint_prose.py`` exits 0 on this checkout: its table is the failure message."""
    result = subprocess.run([sys.executable, "docs/lint_prose.py"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "quickstart.md" in result.stdout and "mean" in result.stdout


def test_a_failing_page_fails_the_run(tmp_path):
    """run() exits 1 on a checkout whose user page breaks a rule (a copy with one page made worse)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "jobgen").mkdir()
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Home: index.md\n  - Developers:\n      - Notes: notes.md\n")
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nShort. As measured in issue 23.\n")
    (tmp_path / "docs" / "notes.md").write_text("Developer notes may cite issue 23 and aafdf85.\n")
    out = io.StringIO()
    assert lint.run(tmp_path, out=out) == 1
    assert "issue reference: 'issue 23'" in out.getvalue() and "notes.md" not in out.getvalue()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nShort. As measured.\n")
    assert lint.run(tmp_path, out=io.StringIO()) == 0


def test_the_developer_pages_are_not_user_pages():
    pages = lint.user_pages()
    assert "quickstart.md" in pages and "index.md" in pages
    assert "development.md" not in pages and "labs.md" not in pages


def test_the_pending_list_only_names_failing_pages():
    """A page fixed leaves the allow-list (run() fails otherwise); here: the list's figures are real."""
    for page, (mean, words) in lint.PENDING.items():
        figures = lint.measure((REPO / "docs" / page).read_text(), page)
        assert figures.problems(), f"{page} passes: remove it from PENDING"
        assert figures.mean <= mean + 0.05 and figures.words <= words, (page, figures.mean, figures.words)


# --------------------------------------------------------------------------- sentences


def test_abbreviations_do_not_end_a_sentence():
    assert sentences_of("Pick a strategy, e.g. FSDP or DDP. It runs, i.e. it trains. Done.") == [
        "Pick a strategy, e.g. FSDP or DDP.", "It runs, i.e. it trains.", "Done."]


def test_a_code_span_is_one_word_and_its_full_stops_end_nothing():
    found = sentences_of("Run `python -m jobgen.train --spec a.yaml. now` here. Then stop.")
    assert found == ["Run CODE here.", "Then stop."]
    assert len(lint.words(found[0])) == 3


def test_a_file_name_or_a_number_does_not_end_a_sentence():
    assert len(sentences_of("Edit setup.cfg and set 2.5 GiB in jobgen.yaml for it.")) == 1


def test_list_items_are_sentences_of_their_own():
    assert sentences_of("""
        Three things:

        - one item without a full stop
        - two
        1. three
        """) == ["Three things:", "one item without a full stop", "two", "three"]


def test_a_page_of_only_code_tables_and_headings_has_no_sentence():
    page = """
        ---
        title: Front matter is no prose. It has sentences.
        ---
        # A heading. With two sentences.

        ```bash
        jobgen submit examples/quickstart.yaml --profile local. Not prose.
        ```

        | a | b. c. d. |
        |---|---|
        | e. | f. |

        <!-- a comment. two. -->
        """
    assert sentences_of(page) == []
    figures = lint.measure(textwrap.dedent(page), "only-code.md")
    assert figures.sentences == 0 and figures.mean == 0.0 and not figures.problems()


def test_a_long_sentence_fails_and_short_ones_pass():
    long = " ".join(["word"] * 30) + "."
    assert lint.measure(long, "p.md").problems() == [f"mean sentence 30.0 words (at most {lint.MAX_MEAN_WORDS})"]
    assert not lint.measure("Short one. Another short one.\n", "p.md").problems()


def test_a_long_page_fails_on_words_outside_code():
    page = ("Ten words make a sentence here and that is all. " * 260) + "\n```text\n" + "code " * 5000 + "\n```\n"
    assert lint.measure(page, "p.md").words == 2600
    assert lint.measure(page, "p.md").problems() == [f"2600 words (at most {lint.MAX_PAGE_WORDS})"]


def test_indented_code_blocks_in_list_items_are_not_prose():
    page = "- Run this:\n\n    ```bash\n    jobgen validate a b c d e f g h i j k l m n o p q r s t u v w x y z.\n    ```\n"
    assert sentences_of(page) == ["Run this:"]


def test_tab_and_admonition_titles_are_not_prose_and_their_bodies_are():
    page = '''
        === "docker"

            Docker reads the ignore file by its name.

        !!! note "A title. With a full stop"
            Podman takes it with an option.

        ??? tip
            A collapsed body.
        '''
    assert sentences_of(page) == ["Docker reads the ignore file by its name.", "Podman takes it with an option.", "A collapsed body."]


# --------------------------------------------------------------------------- references


def rules(text: str, files: frozenset[str] = frozenset({"README.md"})) -> list[str]:
    return [f.rule for f in lint.references(text, "t", files)]


@pytest.mark.parametrize("text", ["as issue 23 says", "the issue-22 refusal", "Issues 21 and 28", "fixed in #123", "(#7)", "see PR 4"])
def test_issue_references_are_found(text):
    assert rules(text) == ["issue reference"]


@pytest.mark.parametrize("text", ["commit aafdf85 measured it", "at 37520df5,", "`7d8898c`"])
def test_commit_hashes_are_found(text):
    assert rules(text) == ["commit hash"]


@pytest.mark.parametrize("text", [
    "image@sha256:" + "0123456789abcdef" * 4,      # a digest
    "sha256 " + "a1b2c3d4" * 8,                    # a bare sha256 digest: 64 hex digits
    "colour #a1b2c3 and #123abc",                   # hex colours
    "value 0x1f2e3d4c",                             # a hex number
    "uuid 3f2a9b1c-1234-5678-9abc-def012345678",   # a UUID
    "1234567 steps and deadbeef",                   # a number, a word of hex letters
    "https://github.com/Lightning-AI/pytorch-lightning/issues/15022",  # an upstream issue, by its URL
    "https://github.com/SchedMD/slurm/commit/413792c5c0",             # an upstream commit, by its URL
    "page.md#section-2 and `# 1 node` and a100 bf16 fp16",
    "write to /tmp/sweeps and ~/data, mount /workspace",
])
def test_lookalikes_are_not_references(text):
    assert rules(text) == []


@pytest.mark.parametrize("text", ["/work/main/.venv", "in /root/.cache", "/tmp/pytest-of-root/x", "/home/alice/data", "/var/tmp/x",
                                  "/Users/bob/x"])
def test_machine_paths_are_found(text):
    assert rules(text) == ["machine path"]


@pytest.mark.parametrize("text", [f"see {lint.FOREIGN_FILES[0]}.md", f"{lint.FOREIGN_FILES[2]} says", lint.FOREIGN_FILES[1],
                                  f"{lint.FOREIGN_FILES[3]}/notes", "NOTES.md"])
def test_files_outside_the_repository_are_found(text):
    assert rules(text) == ["file not in the repository"]


def test_a_file_of_the_repository_is_no_finding():
    assert rules("the README.md and docs/labs.md") == []


def test_public_docstrings_are_walked_and_private_ones_skipped(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(textwrap.dedent('''
        """Module (issue 1)."""
        def public():
            """Public."""
        def _private():
            """Private, issue 2."""
        class Public:
            """Class."""
            def method(self):
                """Method."""
            def _hidden(self):
                """Hidden."""
        class _Private:
            def method(self):
                """Not public."""
        '''))
    assert [name for name, _ in lint.public_docstrings(source)] == ["module", "public", "Public", "Public.method"]


def test_every_nav_page_is_reachable_from_the_index():
    """docs/index.md's "I want to" table links every page of the nav (the developer pages too)."""
    import re

    import yaml

    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = {page for _, page in lint.nav_pages(config["nav"])} - {"index.md"}
    linked = set(re.findall(r"\]\(([\w/.-]+\.md)(?:#[\w-]+)?\)", (REPO / "docs" / "index.md").read_text()))
    assert pages <= linked, sorted(pages - linked)


def test_the_generated_reference_tables_are_checked():
    """A reference page holds a marker; the field descriptions the build puts there are checked too."""
    assert lint.generated("no marker here") == ""
    tables = lint.generated("<!-- jobgen-reference: spec -->\n")
    assert "trainer.precision" in tables
    assert lint.references(tables, "t", lint.repository_files()) == []


# --------------------------------------------------------------------------- comments and docstrings


def history_rules(text: str) -> list[str]:
    return [rule for rule, _ in lint.history_matches(text)]


@pytest.mark.parametrize("text", [
    "# as measured in issue 23", "(issue 22)", "Issue 30: a job", "Since issue 32 the CLI is a package",
    "Until issue 23 it trained", "issues 23, 32", "see #1386", "Part A of issue 31.", "kubenodes.py, issue 31",
    "(``fsdp`` at world size 1, issue 28)", "jobgen issue 12", "it was fixed in PR 4",
])
def test_this_projects_issue_references_are_history(text):
    assert history_rules(text) == ["issue reference"]


@pytest.mark.parametrize("text", [
    "pytest-xdist issue #1386", "(pytest-xdist issue #1386: the suffix)", "NVIDIA/nccl#704",
    "Lightning-AI/pytorch-lightning#21435", "a bug that Lightning issue #15022 tracks", "PyTorch issue 1234",
    "https://github.com/Lightning-AI/pytorch-lightning/issues/15022", "huggingface/transformers issue 123",
    "kubeflow/trainer tag v2.3.0 (commit 658725bd)", "at tag v1.9.0 (commit 6f74c7f6b; pkg/ is the same)",
    "finding 3 free nodes", "`# 1 node`", "stop the 2 ranks",
])
def test_other_projects_issues_and_lookalikes_are_not_history(text):
    assert history_rules(text) == []


@pytest.mark.parametrize(("text", "rule"), [
    ("on main at 572c1d4 the resume died", "commit hash"), ("written at stop 37", "session reference"),
    ("(issue 30, finding 14): the hint", "issue reference"), ("# finding 6: one run directory", "review finding"),
    ("findings 7, 8: control characters", "review finding"),
])
def test_commits_sessions_and_review_findings_are_history(text, rule):
    assert rule in history_rules(text)


PYTHON_SOURCE = '''\
"""Module docstring (issue 1)."""
DATA = "as issue 23 says"  # a comment on issue 2
ISSUE_TEXT = ["Issues 21 and 28", f"issue {DATA}"]
WIDTH = 3
"""An attribute's docstring since issue 3."""


def f():
    """pytest-xdist issue #1386 and NVIDIA/nccl#704 are citations."""
    return "(issue 4)"


class C:
    """Class (issue 5)."""

    def m(self):
        # comment in a method, issue 6
        return """not a docstring: issue 7"""
'''


def test_python_comments_and_docstrings_are_read_and_string_literals_are_not(tmp_path):
    """Comments (tokenize) and docstrings (string statements: a module's, a function's, a class's,
    an attribute's) are read; a string literal that is data, an f-string or a returned triple-quoted
    string is not, so a test may feed issue references to the checker as input."""
    source = tmp_path / "tests" / "test_m.py"
    source.parent.mkdir()
    source.write_text(PYTHON_SOURCE)
    found = [(f.where, f.text) for f in lint.comment_findings(tmp_path)]
    assert found == [("tests/test_m.py:1", "issue 1"), ("tests/test_m.py:2", "issue 2"), ("tests/test_m.py:5", "issue 3"),
                     ("tests/test_m.py:14", "issue 5"), ("tests/test_m.py:17", "issue 6")]


def test_a_docstring_finding_is_reported_on_its_own_line(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text('"""Line one.\n\nLine three names issue\n23 across a break."""\n')
    assert [str(f) for f in lint.comment_findings(tmp_path)] == ["benchmarks/b.py:3: issue reference: 'issue\\n23'"]


def test_hash_comments_of_shell_yaml_and_templates_are_read_and_their_values_are_not(tmp_path):
    files = {
        ".ci/run": "#!/usr/bin/env bash\n# runs the suite (issue 23)\necho \"a value # issue 24\" # but this is: issue 25\n"
                   "n=${#args[@]}  # count\n",
        "examples/spec.yaml": "name: 'a value # issue 26'\nnote: issue 27  # issue 28\n# NVIDIA/nccl#704 is cited\n",
        "templates/job.sbatch.j2": "#!/bin/bash\n{# Jinja comment: issue 29 #}\n#SBATCH --job-name={{ name }}\nx={{ '#30' }}\n",
        "jobgen/_crds/v1/crd.yaml": "# vendored: issue 31\n",
        "tests/golden/data/p/job.sbatch": "# rendered: issue 32\n",
        "tests/notes.txt": "# not a kind of file that is read: issue 33\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = sorted((f.where, f.text) for f in lint.comment_findings(tmp_path))
    assert found == [(".ci/run:2", "issue 23"), (".ci/run:3", "issue 25"), ("examples/spec.yaml:2", "issue 28"),
                     ("templates/job.sbatch.j2:2", "issue 29")]


def test_a_comment_with_an_issue_reference_fails_the_run(tmp_path):
    """run() exits 1 on a checkout whose test holds an issue reference in a comment, 0 once it is gone."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Home: index.md\n")
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nShort.\n")
    (tmp_path / "tests" / "test_x.py").write_text('CASES = ["issue 23"]  # measured in issue 23\n')
    out = io.StringIO()
    assert lint.run(tmp_path, out=out) == 1
    assert "tests/test_x.py:1: issue reference: 'issue 23'" in out.getvalue()
    (tmp_path / "tests" / "test_x.py").write_text('CASES = ["issue 23"]  # measured on 2 cores\n')
    assert lint.run(tmp_path, out=io.StringIO()) == 0


def test_a_comment_citing_a_notes_file_outside_the_repository_is_found(tmp_path):
    """A comment or docstring that sends the reader to a notes file the repository does not hold
    is a finding; the same name in a string literal (data) is not."""
    NOTES, SHARED = lint.FOREIGN_FILES[0], lint.FOREIGN_FILES[3]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "lab.py").write_text(
        f'"""The lab ({NOTES} pitfall 9)."""\nNAMES = ["{NOTES}"]\nx = 1  # see {SHARED}/docs\n')
    found = lint.comment_findings(tmp_path)
    assert [(f.where, f.rule, f.text) for f in found] == [
        ("tests/lab.py:1", "file not in the repository", NOTES),
        ("tests/lab.py:3", "file not in the repository", SHARED)]
