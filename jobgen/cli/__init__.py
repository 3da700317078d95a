"""The ``jobgen`` command line: parse -> load -> plan -> print/write/submit. Thin by design:
every operation is a call into :mod:`jobgen.api`, :mod:`jobgen.planning.project` or
:mod:`jobgen.gitops.manifests`; no scheduler branching.

One module per command group, each command's ``--help`` text (examples included) beside its
options, where users read it:

- :mod:`jobgen.cli.app`: the ``jobgen`` group and :func:`main` (the console entry point, ``python -m jobgen.cli``);
- :mod:`jobgen.cli.render`: ``render``, ``diff`` (GitOps);
- :mod:`jobgen.cli.submit`: ``submit`` (one job or a sweep);
- :mod:`jobgen.cli.jobs`: ``ls``, ``status``, ``logs``, ``cancel``;
- :mod:`jobgen.cli.validate`: ``validate`` (and the ``--import`` check submit and plan share);
- :mod:`jobgen.cli.plan`: ``plan`` (the memory plan);
- :mod:`jobgen.cli.profiles`: ``profiles list|show``, ``schema``;
- :mod:`jobgen.cli.output`: output formats (``-o text|json|yaml``), error rendering, ``--debug``;
- :mod:`jobgen.cli.options`: the options several commands share.
"""

from jobgen.cli.app import cli, main

__all__ = ["cli", "main"]
