"""The Kubernetes backend: :class:`~jobgen.backends.kubernetes.backend.KubernetesBackend` creates a
rendered PyTorchJob or TrainJob (and its ConfigMap) through the API server and reads a job's status,
logs and failures from its pods. The manifest is planned in :mod:`~jobgen.backends.kubernetes.manifest`
and checked offline by :mod:`~jobgen.backends.kubernetes.validate`; the API client is
:mod:`~jobgen.backends.kubernetes.api`.

Modules are imported only when used: importing this package imports none of them (nor the
``kubernetes`` client).
"""
