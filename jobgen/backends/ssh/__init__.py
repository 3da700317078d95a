"""The ssh backend: :class:`~jobgen.backends.ssh.backend.SshBackend` copies a rendered job directory
to bare machines over ssh and starts one launcher per host (:mod:`~jobgen.backends.ssh.launch`);
:mod:`~jobgen.backends.ssh.restart` restarts a failed run, and :mod:`~jobgen.backends.ssh.detect`
probes the hosts for ``jobgen profiles detect`` and ``doctor``.

Modules are imported only when used: importing this package imports none of them.
"""
