"""MkDocs hook (mkdocs.yml `hooks:`): the reference pages' field tables, generated at build time.

Each ``<!-- jobgen-reference: NAME -->`` line of a page becomes the table
:func:`jobgen.specs.reference.table` builds from the pydantic models, so the reference is never
kept by hand (tests/unit/test_docs_site.py).
"""

from __future__ import annotations

from jobgen.specs.reference import expand


def on_page_markdown(markdown: str, **_: object) -> str:
    """Replace the reference markers of one page (other pages come back unchanged)."""
    return expand(markdown)
