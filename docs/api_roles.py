"""Griffe extension (mkdocs.yml, mkdocstrings' python ``extensions:``): the Sphinx roles of
jobgen's docstrings, e.g. ``:class:`~jobgen.errors.JobgenError```, become cross-references on
the Python API page instead of literal text.

A role becomes an optional autorefs reference: a link when its target is rendered on the site,
otherwise the name as code (no warning, so ``mkdocs build --strict`` still passes). ``~`` shows
the last component of the name only, as Sphinx does; a name without a dot that the docstring's
module defines is that module's (Sphinx's rule too). The source files are not changed.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from griffe import Extension, Object

#: A Sphinx role of the Python domain: ``:class:`X```, ``:py:func:`~a.b```, ``:meth:`!x```.
ROLE = re.compile(r":(?:py:)?(?:class|func|data|mod|meth|attr|exc|obj|const):`([~!]?)([^`]+)`")


def rewrite(text: str, qualify: Callable[[str], str] = str) -> str:
    """``text`` with every Sphinx role replaced by an optional autorefs reference (see above);
    ``qualify`` turns a role's target into the full name the reference points at."""

    def replace(match: re.Match[str]) -> str:
        prefix, target = match.group(1), match.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if prefix == "~" else target
        target = qualify(target)
        if prefix == "!" or not re.fullmatch(r"[A-Za-z_][\w.]*", target):
            return f"`{shown}`"
        return f'<autoref identifier="{html.escape(target)}" optional><code>{html.escape(shown)}</code></autoref>'

    return ROLE.sub(replace, text)


class SphinxRoles(Extension):
    """Rewrites every loaded object's docstring with :func:`rewrite`."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        """Called by griffe once per object (module, class, function, attribute) it loads."""
        if obj.docstring is None:
            return
        module = obj.module

        def qualify(target: str) -> str:
            return f"{module.path}.{target}" if "." not in target and target in module.members else target

        obj.docstring.value = rewrite(obj.docstring.value, qualify)
