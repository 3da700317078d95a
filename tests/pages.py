"""The documentation the tests hold to its word: README.md (the landing page) and every page of
the documentation site, docs/ (mkdocs.yml). Each test of a page's content takes its text from
here, so a page added under docs/ is covered without a test edit."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"
#: README.md, then every Markdown page of docs/ (sub-directories included), in path order.
PAGES: tuple[Path, ...] = (README, *sorted(DOCS.rglob("*.md")))


def page_name(page: Path) -> str:
    """The page's path relative to the repository (``docs/slurm.md``): test ids and messages."""
    return page.relative_to(REPO).as_posix()


def text(relative: str) -> str:
    """The text of one page, by its path relative to the repository (``docs/large-models.md``)."""
    return (REPO / relative).read_text()
