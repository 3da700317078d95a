"""``python -m jobgen.cli ARGS``: the ``jobgen`` command."""

from jobgen.cli.app import main

main()
