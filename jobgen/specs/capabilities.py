"""What each scheduler backend supports, as data: one :class:`Capabilities` per scheduler name.

Code outside ``jobgen/backends/`` asks this table (``capabilities(profile.scheduler).elastic``)
instead of comparing scheduler names, and a refusal prints the table's reason for the missing
capability. A new backend adds one entry here beside its entry in
:data:`jobgen.backends.BACKENDS` (a unit test keeps the two key sets equal).

The table sits in ``jobgen.specs``, the lowest package the profile model, the planner, the job
directory's contract and the entrypoint may all import (``jobgen.backends`` sits above the
planner, and importing it would load the planner). It imports nothing but the standard library
and :mod:`jobgen.errors`, so reading it costs nothing on the render path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobgen.errors import ConfigError

#: The capabilities a user can ask for and a backend can lack -> what users read for each (the
#: rows of :func:`capabilities_table`); each one a backend lacks has a :class:`Refusal` in its
#: :attr:`Capabilities.refusals`.
REFUSABLE = {
    "multi_node": "more than one node (`max_nodes` above 1)",
    "elastic": 'an elastic node count (`resources.nodes: "2:4"`)',
    "code_from_git": "`code.git`: a checkout of the commit in each pod",
    "secrets_from_shell": "`secrets:` take their values from the shell that runs `jobgen submit`",
    "key_files": "a tracker's key file on the nodes (`wandb.api_key_file`, `mlflow.token_file`)",
    "entrypoint_on_submit_host": "`jobgen validate` looks at a command-mode entrypoint in the working directory",
    "requeue": "a requeue on the time-limit signal",
    "job_arrays": "a sweep as one job array",
}


@dataclass(frozen=True)
class Refusal:
    """Why a backend lacks a capability, in the words a refusal prints.

    ``reason`` completes a sentence about the profile (``profile 'x' <reason>``, or after a
    semicolon), without its final full stop; ``fix`` is the hint, a whole sentence that may name
    ``{min_nodes}`` and ``{max_nodes}`` (filled by :meth:`hint`)."""

    reason: str
    fix: str = ""

    def hint(self, **values: object) -> str:
        """:attr:`fix` with its ``{name}`` fields filled from ``values``."""
        return self.fix.format(**values)


@dataclass(frozen=True)
class Capabilities:
    """What one scheduler backend does (booleans) and, for each capability of :data:`REFUSABLE`
    it lacks, the :class:`Refusal` that says why.

    Refusable capabilities:

    - ``multi_node``: more than one node (``max_nodes`` above 1).
    - ``elastic``: a node range (``resources.nodes: "2:4"``) admitted while the job runs: the
      training-operator's PyTorchJob ``elasticPolicy`` (kubeflow.org/v1).
    - ``code_from_git``: ``code.git``, a checkout by an init container in each pod.
    - ``secrets_from_shell``: ``secrets: [NAME]`` take their values from the environment of the
      shell that runs ``jobgen submit``; without it they come from the cluster
      (``kubernetes.secret_env``).
    - ``key_files``: a tracker's key file (``wandb.api_key_file``) is a file the nodes read.
    - ``entrypoint_on_submit_host``: a command-mode entrypoint runs from the submitting working
      directory, so ``jobgen validate`` can look at it.
    - ``requeue``: the scheduler requeues the job on its time-limit signal
      (``scontrol requeue``, Lightning's SLURMEnvironment ``requeue_signal``).
    - ``job_arrays``: a sweep as one job array (``slurm.sweep_as_array``; sbatch ``--array``).

    Facts (no refusal):

    - ``label``: the name users read (``SLURM``); ``section``: the profile's section for this
      scheduler; ``settings_attr``: the :class:`~jobgen.specs.profile.ClusterProfile` attribute
      that holds it (``slurm_settings``: the ``slurm:`` section with its defaults when absent);
      ``section_required``: what the profile model says when a required section is
      absent, after ``scheduler '<name>'`` (None: the section is optional).
    - ``handle_scheme``: the scheme of the job's handle (``k8s`` in ``k8s://<context>/<ns>/<name>``).
    - ``fixed_hosts``: each node is one host of the profile's list (``ssh.hosts``): ``max_nodes``
      is at most its length.
    - ``slurm_allocation``: the ranks run inside a SLURM allocation, started by srun (``SLURM_*``
      variables; Lightning's SLURMEnvironment).
    - ``time_limit``: the section has a default ``time_limit_min``.
    - ``job_dir_is_run_dir``: the job directory is the run directory (``local://<run dir>``), so
      it is not ignored in git as ``<run dir>/job`` is.
    - ``run_dir_on_filesystem``: the run directory is a directory on a filesystem (this machine,
      a shared one, the hosts'), not inside pods.
    - ``restarts_by_jobgen``: who restarts a failed run when jobgen does (``jobgen status`` prints
      it beside the restart budget); None where the scheduler does.
    """

    name: str
    label: str
    section: str
    settings_attr: str
    handle_scheme: str
    section_required: str | None
    multi_node: bool
    elastic: bool
    code_from_git: bool
    secrets_from_shell: bool
    key_files: bool
    entrypoint_on_submit_host: bool
    requeue: bool
    job_arrays: bool
    fixed_hosts: bool
    slurm_allocation: bool
    time_limit: bool
    job_dir_is_run_dir: bool
    run_dir_on_filesystem: bool
    restarts_by_jobgen: str | None
    refusals: dict[str, Refusal] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        lacking = {name for name in REFUSABLE if not getattr(self, name)}
        if set(self.refusals) != lacking:
            raise ValueError(f"{self.name}: refusals must name exactly the capabilities it lacks, {sorted(lacking)}; "
                             f"they name {sorted(self.refusals)}")

    def refusal(self, capability: str) -> Refusal:
        """Why this backend lacks ``capability`` (one of :data:`REFUSABLE`).

        Raises:
            KeyError: the backend has the capability, or no such capability exists.
        """
        return self.refusals[capability]

    def supports(self) -> dict[str, bool]:
        """``{capability: bool}`` for every name of :data:`REFUSABLE`, in that order."""
        return {name: getattr(self, name) for name in REFUSABLE}


_ELASTIC_FIX = ("Give a fixed count, e.g. --set resources.nodes={max_nodes} (or {min_nodes}); elastic ranges run as Kubernetes "
                "PyTorchJobs.")
_CODE_GIT = (": an init container's checkout is a Kubernetes option; SLURM, ssh and local jobs run a snapshot of the local "
             "repository that `jobgen submit` takes")
_CODE_GIT_FIX = "Remove code.git (set code.repo to the repository, relative to the spec file), or use a Kubernetes profile."
_ARRAYS_FIX = "Submit the sweep as one job per point (the default), or use a SLURM profile with `slurm.sweep_as_array: true`."

#: Scheduler name (the profile's ``scheduler``) -> its capabilities.
CAPABILITIES: dict[str, Capabilities] = {c.name: c for c in (
    Capabilities(
        name="local", label="local", section="local", handle_scheme="local", settings_attr="local", section_required=None,
        multi_node=False, elastic=False, code_from_git=False, secrets_from_shell=True, key_files=True,
        entrypoint_on_submit_host=True, requeue=False, job_arrays=False, fixed_hosts=False, slurm_allocation=False,
        time_limit=False, job_dir_is_run_dir=True, run_dir_on_filesystem=True,
        restarts_by_jobgen="jobgen restarts a local run itself",
        refusals={
            "multi_node": Refusal("runs on this machine"),
            "elastic": Refusal("runs on this one machine", "Remove resources.nodes for a local run (or --set resources.nodes=1)."),
            "code_from_git": Refusal("runs on local" + _CODE_GIT, _CODE_GIT_FIX),
            "requeue": Refusal("runs on this machine, with no scheduler to requeue it; jobgen restarts a failed run itself "
                               "(restart.max_restarts)"),
            "job_arrays": Refusal("runs on this machine, with no scheduler to hold a job array", _ARRAYS_FIX),
        }),
    Capabilities(
        name="slurm", label="SLURM", section="slurm", handle_scheme="slurm", settings_attr="slurm_settings", section_required=None,
        multi_node=True, elastic=False, code_from_git=False, secrets_from_shell=True, key_files=True,
        entrypoint_on_submit_host=True, requeue=True, job_arrays=True, fixed_hosts=False, slurm_allocation=True,
        time_limit=True, job_dir_is_run_dir=False, run_dir_on_filesystem=True, restarts_by_jobgen=None,
        refusals={
            "elastic": Refusal("is a SLURM cluster: an allocation has a fixed node count (sbatch --nodes), and Lightning's "
                               "SLURMEnvironment stops every rank unless SLURM_NNODES equals num_nodes", _ELASTIC_FIX),
            "code_from_git": Refusal("runs on slurm" + _CODE_GIT, _CODE_GIT_FIX),
        }),
    Capabilities(
        name="kubernetes", label="Kubernetes", section="kubernetes", handle_scheme="k8s", settings_attr="kubernetes",
        section_required="needs a 'kubernetes:' section with at least 'image'",
        multi_node=True, elastic=True, code_from_git=True, secrets_from_shell=False, key_files=False,
        entrypoint_on_submit_host=False, requeue=False, job_arrays=False, fixed_hosts=False, slurm_allocation=False,
        time_limit=True, job_dir_is_run_dir=False, run_dir_on_filesystem=False, restarts_by_jobgen=None,
        refusals={
            "secrets_from_shell": Refusal(
                "on Kubernetes a secret comes from the cluster (kubernetes.secret_env), not from the shell that submits"),
            "key_files": Refusal("on Kubernetes jobgen mounts no such file into the pods"),
            "entrypoint_on_submit_host": Refusal("on Kubernetes it runs from the image's working directory"),
            "requeue": Refusal("restarts a failed pod in place (the training-operator's restartPolicy); the job is not "
                               "requeued"),
            "job_arrays": Refusal("runs each sweep point as its own job (Kubernetes has no job array)", _ARRAYS_FIX),
        }),
    Capabilities(
        name="ssh", label="ssh", section="ssh", handle_scheme="ssh", settings_attr="ssh", section_required="needs an 'ssh:' section with at least 'hosts'",
        multi_node=True, elastic=False, code_from_git=False, secrets_from_shell=True, key_files=True,
        entrypoint_on_submit_host=True, requeue=False, job_arrays=False, fixed_hosts=True, slurm_allocation=False,
        time_limit=False, job_dir_is_run_dir=False, run_dir_on_filesystem=True,
        restarts_by_jobgen="hosts over ssh: jobgen's watcher restarts them",
        refusals={
            "elastic": Refusal("starts a fixed list of hosts over ssh (torchrun --nnodes N --node-rank i, a static rendezvous)",
                               _ELASTIC_FIX),
            "code_from_git": Refusal("runs on ssh" + _CODE_GIT, _CODE_GIT_FIX),
            "requeue": Refusal("starts hosts with no scheduler to requeue them; jobgen's watcher restarts a failed run "
                               "(restart.max_restarts)"),
            "job_arrays": Refusal("starts hosts with no scheduler to hold a job array", _ARRAYS_FIX),
        }),
)}


def capabilities(scheduler: str) -> Capabilities:
    """The capabilities of the backend named ``scheduler`` (``local``, ``slurm``, ``kubernetes``, ``ssh``).

    Raises:
        ConfigError: no backend has that name.
    """
    try:
        return CAPABILITIES[scheduler]
    except KeyError:
        raise ConfigError(f"no backend for scheduler {scheduler!r}", hint=f"one of: {', '.join(CAPABILITIES)}") from None



def capabilities_table() -> str:
    """:data:`CAPABILITIES` as a Markdown table, one row per capability of :data:`REFUSABLE` and one
    column per backend: ``yes``, or ``no:`` and the refusal's reason (docs/support.md)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| capability | " + " | ".join(c.label for c in CAPABILITIES.values()) + " |",
            "|---" * (len(CAPABILITIES) + 1) + "|"]
    for name, what in REFUSABLE.items():
        cells = ("yes" if getattr(c, name) else f"no: {cell(c.refusal(name).reason)}" for c in CAPABILITIES.values())
        rows.append(f"| {cell(what)} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"
