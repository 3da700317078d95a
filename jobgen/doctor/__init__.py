"""``jobgen doctor``: a cluster profile (and, given one, a spec's request) checked against the
live cluster before anything queues.

Each scheduler's checks live beside this module (``jobgen/doctor/<scheduler>.py``) as one
function, ``checks(ctx: DoctorContext) -> Iterator[Check]``, that yields one :class:`Check` per
line of the report, in the order a user would fix them (reachability first, then what the
profile names, then what the spec asks for, then the opt-in probes). A check that cannot run
because an earlier one failed is a ``skip`` naming that check; an opt-in probe without
``--probe`` is a ``skip`` naming ``--probe``.

The report passes (exit 0) when no check failed; a skip does not fail it.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from jobgen.errors import JobgenError

if TYPE_CHECKING:
    from jobgen.planning.plan import JobPlan
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.training import TrainingSpec

#: A check's outcome: ``pass``; ``fail`` (the profile or spec does not match the cluster: the
#: check's ``fix`` says what to change); ``skip`` (not checked: an earlier check failed, the
#: check is opt-in, or it does not apply to this profile; ``detail`` says which).
Status = Literal["pass", "fail", "skip"]

#: The schedulers whose checks exist, each a module of this package.
SCHEDULERS = ("local", "slurm", "kubernetes", "ssh")


@dataclass(frozen=True)
class Check:
    """One line of the report.

    Attributes:
        name: dotted, scheduler first: ``slurm.partition``, ``kubernetes.crd``, ``ssh.python``.
        status: ``pass``, ``fail`` or ``skip`` (:data:`Status`).
        detail: what was found, one line (values read from the cluster shown with
            :func:`jobgen.errors.printable` or ``repr``, never raw).
        fix: for ``fail``, the exact change (a profile field and value, a command); else ``""``.
    """

    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_json(self) -> dict[str, Any]:
        """The check as ``-o json`` prints it: ``name``, ``status``, ``detail``, ``fix``."""
        return asdict(self)


@dataclass(frozen=True)
class DoctorContext:
    """What the checks are given.

    Attributes:
        profile: the profile, loaded as ``jobgen submit`` loads it (inheritance and
            ``--profile-set`` applied).
        profile_source: the name or path it was loaded from (for messages: ``fix`` names it).
        spec: the spec, when one was given; else ``None`` (request checks are skipped).
        spec_path: its file, or ``None``.
        plan: the spec planned on the profile (the rendered files are in ``plan``), or ``None``.
        probe: run the opt-in probes (a one-node SLURM job, a probe pod): they queue work on
            the cluster, so they run only when asked (``--probe``).
        timeout_s: seconds a probe may wait for the cluster (queueing included).
        runs_dir: where ``jobgen submit --runs-dir`` puts the runs (SLURM: a filesystem the
            compute nodes share; the SLURM probe writes there from a compute node).
    """

    profile: ClusterProfile
    profile_source: str
    spec: TrainingSpec | None = None
    spec_path: str | None = None
    plan: JobPlan | None = None
    probe: bool = False
    timeout_s: float = 300.0
    runs_dir: str = "runs"


def run_checks(ctx: DoctorContext) -> list[Check]:
    """Run the checks of ``ctx.profile``'s scheduler, in order.

    A :class:`~jobgen.errors.JobgenError` raised by a check (a client command missing, an API
    server that does not answer) ends that scheduler's checks with a ``fail`` line named
    ``<scheduler>.doctor`` that carries the error's message and hint, so the report is always
    printed.

    Returns:
        The checks, in the order they ran.
    """
    scheduler = ctx.profile.scheduler
    module = importlib.import_module(f"jobgen.doctor.{scheduler}")  # one module per scheduler: SCHEDULERS
    found: list[Check] = []
    try:
        for check in module.checks(ctx):
            found.append(check)
    except JobgenError as exc:
        found.append(Check(f"{scheduler}.doctor", "fail", exc.message, exc.hint or ""))
    return found


def passed(found: list[Check]) -> bool:
    """Whether the report passes: no check failed (skips do not fail it)."""
    return all(check.status != "fail" for check in found)


def skipped_after(name: str, what: str) -> Check:
    """The ``skip`` line of check ``name`` that could not run because check ``what`` failed."""
    return Check(name, "skip", f"not checked: {what} failed")


def needs_probe(name: str, what: str) -> Check:
    """The ``skip`` line of the opt-in probe ``name`` (``what``: what it would have checked)."""
    return Check(name, "skip", f"opt-in: {what} (pass --probe; it queues a small job on the cluster)")
