"""MkDocs hook (mkdocs.yml `hooks:`): the reference pages' tables, generated at build time.

Each ``<!-- jobgen-reference: NAME -->`` line of a page becomes what the code builds for NAME:
the field tables of :mod:`jobgen.specs.reference` (``spec``, ``profile``, ``project``), built
from the pydantic models, the command reference of :mod:`jobgen.cli.reference` (``cli``),
built from the click commands, and the failure classes' rules and exit codes of
:mod:`jobgen.reports.failure_class` (``failures``, ``exitcodes``, ``launcherexits``; docs/failures.md), and what
each backend offers, from :mod:`jobgen.specs.capabilities` (``capabilities``; docs/support.md). So the
reference is never kept by hand (tests/unit/test_docs_site.py).
"""

from __future__ import annotations

from jobgen.cli.reference import cli_reference
from jobgen.reports.failure_class import exit_codes_table, launcher_exits_table, rules_table
from jobgen.specs.capabilities import capabilities_table
from jobgen.specs.reference import TABLES, expand

#: Every table a page's marker may name.
REFERENCES = {**TABLES, "cli": cli_reference, "failures": rules_table, "exitcodes": exit_codes_table,
              "launcherexits": launcher_exits_table, "capabilities": capabilities_table}


def on_page_markdown(markdown: str, **_: object) -> str:
    """Replace the reference markers of one page (other pages come back unchanged).

    Raises:
        ValueError: a marker names no table (the valid ones are listed); the build fails.
    """
    return expand(markdown, REFERENCES)
