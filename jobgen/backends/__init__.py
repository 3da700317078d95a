"""Scheduler backends behind one interface (:class:`jobgen.backends.base.Backend`).

A new backend is a module (or a package with its class in ``backend``) holding a ``Backend``
subclass, plus one entry in :data:`BACKENDS`. Every backend submits through the same steps
(:meth:`jobgen.backends.base.Backend.submit`): a backend writes its ``launch`` and, where its
checks differ, its ``begin_submit``.

Modules are imported only when used (TorchX-style lazy table), so rendering a SLURM script
never imports the Kubernetes client, and nothing here imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from jobgen.errors import ConfigError
from jobgen.planning import plan as planner

if TYPE_CHECKING:
    from pathlib import Path

    from jobgen.backends.base import Backend
    from jobgen.planning.plan import JobPlan
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.training import TrainingSpec

#: scheduler name -> ``module:class`` of its backend.
BACKENDS: dict[str, str] = {
    "local": "jobgen.backends.local:LocalBackend",
    "slurm": "jobgen.backends.slurm.backend:SlurmBackend",
    "kubernetes": "jobgen.backends.kubernetes.backend:KubernetesBackend",
    "ssh": "jobgen.backends.ssh.backend:SshBackend",
}

_INSTANCES: dict[str, Backend] = {}


def get_backend(scheduler: str) -> Backend:
    """The backend for ``scheduler`` (imported on first use, then cached).

    Raises:
        ConfigError: no backend has that name.
    """
    if scheduler not in _INSTANCES:
        if scheduler not in BACKENDS:
            raise ConfigError(f"no backend for scheduler {scheduler!r}", hint=f"one of: {', '.join(BACKENDS)}")
        module, _, cls = BACKENDS[scheduler].partition(":")
        _INSTANCES[scheduler] = getattr(importlib.import_module(module), cls)()
    return _INSTANCES[scheduler]


def plan(
    spec: TrainingSpec,
    profile: ClusterProfile,
    templates_dir: Path,
    *,
    spec_source: str = "<spec>",
    profile_source: str = "<profile>",
    spec_file: str | None = None,
) -> JobPlan:
    """:func:`jobgen.planning.plan.plan` with the backend of ``profile.scheduler`` from this registry.

    Raises:
        ConfigError: no backend for the profile's scheduler, or as :func:`jobgen.planning.plan.plan`.
        PlanError: as :func:`jobgen.planning.plan.plan`.
    """
    return planner.plan(spec, profile, templates_dir, get_backend(profile.scheduler), spec_source=spec_source,
                        profile_source=profile_source, spec_file=spec_file)
