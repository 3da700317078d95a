"""A run's events sent to the spec's ``notify`` targets (a webhook, a command): the sending half,
used by the entrypoint (started, finished, failed, requeued) and by the launchers that decide a
restart (``restart``: a local run, the ssh watcher). It imports no torch and no Lightning.

It sits below the backends and the entrypoint, which both send through it, and above the specs,
the job directory and the reports it reads (tests/unit/test_import_graph.py ``FORBIDDEN``)."""
