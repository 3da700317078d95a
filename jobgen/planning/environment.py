"""A job's environment, for every backend: which variable names hold credentials, which names
the launchers own, and how a secret reaches the ranks without any file holding its value.

Two ways into the environment of every rank:

- ``env`` (profile and spec): literal values, written into the rendered files (``job.sbatch``,
  ``spec.json``, the Kubernetes manifest and ConfigMap) and so committed under ``manifests/``.
  A name that looks like a credential (:func:`looks_secret`) is refused there, at plan time,
  on every scheduler.
- ``secrets`` (spec, names only): SLURM and local runs take each value from the environment
  ``jobgen submit`` runs in (sbatch exports the submitting environment to the job; torchrun
  inherits it), checked before anything is submitted (:func:`check_present`). On Kubernetes
  each name must be mapped to a Secret by the profile's ``kubernetes.secret_env``.

Plan-time rules: :func:`check_job_env` (called by :func:`jobgen.planning.plan.plan` for every
scheduler; its credential rule, :func:`check_env_credentials`, also by ``jobgen validate`` without
a profile) and :func:`export_problem` (SLURM's ``--export``). Submit-time rules:
:func:`check_present` and :func:`unexported` (``$SBATCH_EXPORT``). Everything raises
:class:`~jobgen.errors.PlanError` or :class:`~jobgen.errors.ConfigError` (exit 2) with the
file + field path and a hint.
Torch-free and cheap to import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from jobgen.errors import ConfigError, PlanError
from jobgen.planning.nccl import nccl_env
from jobgen.specs.capabilities import capabilities

if TYPE_CHECKING:
    from jobgen.jobdir.world import World
    from jobgen.specs.profile import ClusterProfile
    from jobgen.specs.training import TrainingSpec

#: Whole ``_``-separated words that mark a credential: ``HF_TOKEN``, ``DB_PASSWORD``,
#: ``AWS_SECRET_ACCESS_KEY``, ``WANDB_APIKEY``, ``GOOGLE_APPLICATION_CREDENTIALS``. Whole words
#: only, so ``TOKENIZERS_PARALLELISM`` is not one.
SECRET_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY", "CREDENTIAL", "CREDENTIALS"})
#: Name endings that mark a credential where no single word does: ``WANDB_API_KEY``,
#: ``MINIO_ACCESS_KEY``, ``SSH_PRIVATE_KEY``, ``PUSHER_AUTH_KEY``. (``*_SECRET_KEY`` needs no
#: entry: the word SECRET already marks it.) Every entry of both lists is load-bearing; a test
#: checks that removing any one of them lets a credential through.
SECRET_SUFFIXES = ("_API_KEY", "_ACCESS_KEY", "_PRIVATE_KEY", "_AUTH_KEY")
#: The variables each experiment tracker reads its credentials from (wandb 0.31: ``WANDB_API_KEY``;
#: MLflow 3.x ``mlflow.environment_variables``: a bearer token, or basic auth's password). They are
#: credentials by :func:`looks_secret` too (so ``env`` refuses them); the entrypoint also scrubs their
#: values from what it sends to the trackers (jobgen.train.tracking).
TRACKER_CREDENTIALS: dict[str, tuple[str, ...]] = {
    "wandb": ("WANDB_API_KEY",),
    "mlflow": ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD"),
}

#: Environment the launchers own: the training-operator (envvar.go, master.go) sets these in
#: every pod, torchrun sets RANK/LOCAL_RANK/WORLD_SIZE for each process, and the Trainer's torch
#: plugin rejects PET_* in a TrainJob. A value from a profile or spec would break rank semantics.
LAUNCHER_ENV = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
    "GROUP_RANK", "PYTHONUNBUFFERED",
})
#: Prefixes of launcher-owned names (torchrun's PET_* / TORCHELASTIC_*).
LAUNCHER_PREFIXES = ("PET_", "TORCHELASTIC_")
#: Further names jobgen's own launch sets (job.sbatch, the local run): a secret of that name
#: would be overwritten before any rank starts. SLURM_* comes from SLURM itself.
JOBGEN_SET_ENV = frozenset({"OMP_NUM_THREADS", "JOB_DIR", "RUN_DIR", "JOBGEN_JOB_DIR", "JOBGEN_RUN_DIR", "PYTHONPATH",
                            "SLURM_EXPORT_ENV", "JOBGEN_WORKDIR", "PL_DEEPSPEED_CONFIG_PATH", "JOBGEN_CODE_DIR",
                            "JOBGEN_SSH_JOB"})
_JOBGEN_SET_PREFIXES = ("SLURM_",)

#: Where a literal ``env`` value ends up, per scheduler and per file the field comes from.
_WRITTEN_TO = {
    ("slurm", "profile"): "job.sbatch (committed under manifests/)",
    ("slurm", "spec"): "job.sbatch and spec.json (committed under manifests/)",
    ("local", "profile"): "the torchrun command jobgen prints (jobgen render --stdout, jobgen submit)",
    ("local", "spec"): "spec.json in the run directory",
    ("kubernetes", "profile"): "the manifest (committed under manifests/)",
    ("kubernetes", "spec"): "the manifest and the ConfigMap (committed under manifests/)",
    ("ssh", "profile"): "launch.sh (copied to every host; committed under manifests/ with --out)",
    ("ssh", "spec"): "launch.sh and spec.json (copied to every host; committed under manifests/ with --out)",
}


def looks_secret(name: str, *, words: Iterable[str] = SECRET_WORDS, suffixes: Iterable[str] = SECRET_SUFFIXES) -> bool:
    """True for variable names that usually hold credentials (``HF_TOKEN``, ``WANDB_API_KEY``,
    ``DB_PASSWORD``); ``TOKENIZERS_PARALLELISM`` is not one (whole ``_``-separated words only).
    ``words`` / ``suffixes`` default to :data:`SECRET_WORDS` / :data:`SECRET_SUFFIXES`."""
    upper = name.upper()
    return bool(set(words) & set(upper.split("_"))) or upper.endswith(tuple(suffixes))


def launcher_owned(name: str) -> bool:
    """True for names the launchers set in every rank (:data:`LAUNCHER_ENV`, PET_*, TORCHELASTIC_*)."""
    return name in LAUNCHER_ENV or name.startswith(LAUNCHER_PREFIXES)


def _env_hint(scheduler: str | None, name: str, field: str) -> str:
    k8s = f"kubernetes.secret_env: {{{name}: {{secret: <Secret name>, key: <key>}}}}"
    if scheduler is None:  # no profile: both ways
        return (f"Remove {name} from {field} and name it in the spec instead: `secrets: [{name}]`; jobgen submit takes its "
                f"value from the environment it runs in (SLURM, ssh, local: export {name} there first; Kubernetes: map it "
                f"to a Secret in the profile, {k8s}) and no file holds it.")
    if not capabilities(scheduler).secrets_from_shell:
        return f"Create a Secret in the cluster and reference it from the profile: {k8s}; remove {name} from {field}."
    return (f"Remove {name} from {field} and name it in the spec instead: `secrets: [{name}]`; jobgen submit then takes "
            f"its value from the environment it runs in (export {name} there first) and no file holds it.")


def check_env_credentials(env: Mapping[str, str], *, source: str, origin: str, scheduler: str | None = None) -> None:
    """No credential in a literal ``env`` (of the ``origin`` ``"spec"`` or ``"profile"``, read from
    ``source``): a name that :func:`looks_secret` is refused, since its value would be written into
    the rendered files. ``scheduler`` (None: not known, ``jobgen validate`` without a profile) picks
    where the hint sends the value.

    Raises:
        PlanError: naming ``<source>: env.<name>``, with the hint.
    """
    for name in env:
        if looks_secret(name):
            written = _WRITTEN_TO[scheduler, origin] if scheduler is not None else "spec.json and the rendered job files, on every scheduler"
            raise PlanError(
                f"`env.{name}` looks like a credential; its value would be written into {written}.",
                location=f"{source}: env.{name}",
                hint=_env_hint(scheduler, name, "env"),
            )


def check_job_env(spec: TrainingSpec, profile: ClusterProfile, world: World, *, spec_source: str = "<spec>",
                  profile_source: str = "<profile>") -> None:
    """Plan-time rules for the job's environment, on every scheduler.

    - No credential in ``env``: a profile or spec ``env`` name that :func:`looks_secret` is
      refused (its value would be written into the rendered files and committed). The hint
      names ``secrets`` (SLURM, local) or ``kubernetes.secret_env`` (Kubernetes).
    - A spec ``secrets`` name has one source: it is in neither ``env`` nor the fabric's NCCL
      preset, and it is not a name the launchers or jobgen's launch set (it would be
      overwritten before the ranks start).
    - Kubernetes: every ``secrets`` name is mapped to a Secret by ``kubernetes.secret_env``
      (values come from the cluster there, not from the submitting shell).

    Raises:
        PlanError: with the file + field path and a hint.
    """
    scheduler = profile.scheduler
    caps = capabilities(scheduler)
    for source, env, origin in ((profile_source, profile.env, "profile"), (spec_source, spec.env, "spec")):
        check_env_credentials(env, source=source, origin=origin, scheduler=scheduler)
    preset = nccl_env(profile.network_fabric, uses_nccl=world.accelerator == "gpu")
    for i, name in enumerate(spec.secrets):
        where = f"{spec_source}: secrets[{i}]"
        sources = ((profile.env, f"the profile's env ({profile_source}: env.{name})", f"Remove {name} from the profile's env or from `secrets`."),
                   (spec.env, f"the spec's env (env.{name})", f"Remove {name} from the spec's env or from `secrets`."),
                   (preset, f"the NCCL preset of network_fabric {profile.network_fabric}", f"Pick another variable name than {name} for the secret."))
        for env, what, hint in sources:
            if name in env:
                raise PlanError(
                    f"`secrets` names {name}, which {what} also sets; one variable cannot have two sources "
                    "(the literal value would overwrite the secret in every rank).",
                    location=where,
                    hint=hint,
                )
        if launcher_owned(name) or name in JOBGEN_SET_ENV or name.startswith(_JOBGEN_SET_PREFIXES):
            raise PlanError(
                f"`secrets` names {name}, which the launcher (torchrun, SLURM, the training-operator or jobgen's launch) "
                "sets in every rank; a secret of that name would be overwritten.",
                location=where,
                hint=f"Pick another variable name than {name} for the secret.",
            )
        k8s = profile.kubernetes
        if not caps.secrets_from_shell and k8s is not None and name not in k8s.secret_env:
            raise PlanError(
                f"`secrets` names {name}, but profile {profile.name!r} maps no Secret to it; "
                f"{caps.refusal('secrets_from_shell').reason}.",
                location=where,
                hint=f"Map it in the profile ({profile_source}): kubernetes.secret_env: {{{name}: {{secret: <Secret name>, key: <key>}}}} "
                "(kubectl create secret generic <Secret name> --from-literal=<key>=...).",
            )


def _export_entries(value: str) -> list[str]:
    return [entry for entry in value.split(",") if entry]


def unexported(value: str, secrets: Iterable[str]) -> list[str]:
    """The names of ``secrets`` that an ``--export`` value (sbatch, srun, ``$SBATCH_EXPORT``)
    does not pass to the job.

    sbatch(1): ``--export=ALL`` (the default) passes the whole submitting environment;
    ``NONE`` / ``NIL`` pass only SLURM_* variables; a list without ``ALL`` passes only the
    variables it names (``NAME`` with the submitting environment's value, ``NAME=value``).
    """
    names = {entry.partition("=")[0] for entry in _export_entries(value)}
    return [] if "ALL" in names else [name for name in secrets if name not in names]


def export_problem(value: str, secrets: Iterable[str]) -> tuple[str, str] | None:
    """What is wrong with an ``--export`` value written into job.sbatch (the profile's
    ``extra_sbatch_args`` / ``extra_srun_args``) for a job with ``secrets``, as
    ``(message, hint)``; ``None`` when nothing is: a ``NAME=value`` entry whose name
    :func:`looks_secret` (the value would be committed), or a secret it does not pass on
    (:func:`unexported`)."""
    entries = _export_entries(value)
    for entry in entries:
        name, eq, _ = entry.partition("=")
        if eq and looks_secret(name):
            return (f"--export entry {name}=... looks like a credential; its value would be written into job.sbatch "
                    "(committed under manifests/).",
                    f"Remove {name}=... from --export and name it in the spec instead: `secrets: [{name}]` (jobgen submit "
                    "takes the value from the environment it runs in).")
    missing = unexported(value, secrets)
    if missing:
        names = {entry.partition("=")[0] for entry in entries}
        return (f"--export={value} does not pass the spec's secrets {', '.join(missing)} to the job: it exports only "
                + ("SLURM_* variables" if names & {"NONE", "NIL"} else "the variables it names")
                + ", and secrets come from the submitting environment.",
                f"Use --export=ALL (sbatch's default: or drop --export), or name them: "
                f"--export={','.join([*(e for e in entries if e not in ('NONE', 'NIL')), *missing])}.")
    return None


def check_present(secrets: Iterable[str], environ: Mapping[str, str], *, location: str) -> None:
    """Submit-time: every name in ``secrets`` is set, non-empty, in ``environ`` (the
    environment the job is submitted or started with).

    Raises:
        ConfigError: naming every missing variable (nothing has been submitted yet).
    """
    missing = [name for name in secrets if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"{'secret' if len(missing) == 1 else 'secrets'} {', '.join(missing)} of the spec (`secrets`) "
            f"{'is' if len(missing) == 1 else 'are'} not set (or empty) in this environment; jobgen never stores a secret's "
            "value, so submit takes it from the environment it runs in. Nothing was submitted.",
            location=location,
            hint="export " + " ".join(f"{name}=..." for name in missing) + " in this shell (e.g. from your password manager) "
            "and submit again.",
        )
