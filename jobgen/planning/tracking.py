"""Plan-time rules of the experiment trackers (``trainer.loggers: [wandb, mlflow]``): the
profile's defaults merged into the spec (:func:`resolve_tracking`), and where each tracker's
credentials come from (:func:`check_tracking`). Torch-free, no I/O; the runtime side is
:mod:`jobgen.train.tracking`, the run identity record :class:`jobgen.jobdir.TrackingRecord`.

Credentials by reference only (the values never reach a rendered file, spec.json or a tracker's
parameters):

- SLURM and local: the variable named in the spec's ``secrets`` (``WANDB_API_KEY``,
  ``MLFLOW_TRACKING_TOKEN``, ...), taken from the environment ``jobgen submit`` runs in, or a key
  file on the nodes (``api_key_file`` / ``token_file``) read by global rank zero at start; W&B
  may also use its own login (``~/.netrc`` on a shared home).
- Kubernetes: a Secret mapped by the profile's ``kubernetes.secret_env`` (every pod gets it); a
  key file is refused (jobgen mounts no such file).
"""

from __future__ import annotations

from jobgen.errors import PlanError
from jobgen.planning.environment import TRACKER_CREDENTIALS
from jobgen.specs.capabilities import capabilities
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.tracking import MlflowSpec, WandbSpec, check_tracking_uri
from jobgen.specs.training import TrainingSpec

#: The variable MLflow reads its tracking URI from when none is given (mlflow.environment_variables).
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
#: The variable MLflow reads its experiment's name from when none is given (mlflow.environment_variables).
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
#: The variable W&B reads its mode from (wandb 0.31 ``Settings.mode``): ``online``, ``offline``, ...
WANDB_MODE_ENV = "WANDB_MODE"
#: The W&B project of a spec, profile and node that name none (W&B's default outside a git
#: repository; jobgen passes it, as wandb would name the project after the job's code snapshot).
WANDB_DEFAULT_PROJECT = "uncategorized"
#: Per tracker: its key-file field and the variable that file's content is read into.
KEY_FILES: dict[str, tuple[str, str]] = {"wandb": ("api_key_file", "WANDB_API_KEY"),
                                         "mlflow": ("token_file", "MLFLOW_TRACKING_TOKEN")}


def resolve_tracking(spec: TrainingSpec, profile: ClusterProfile) -> TrainingSpec:
    """``spec`` with, for each tracker in ``trainer.loggers``, its options merged over the
    profile's ``tracking`` defaults (the spec's set fields win). Fields both leave unset stay
    unset in spec.json: on the nodes they are the trackers' own (``WANDB_MODE``,
    ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, then
    the defaults the option descriptions name). A spec without trackers is returned unchanged (a
    profile's defaults add nothing to it)."""
    t = spec.trainer
    if not t.trackers:
        return spec
    defaults = profile.tracking
    update = {}
    if "wandb" in t.trackers:
        own = t.wandb or WandbSpec()
        update["wandb"] = WandbSpec.model_validate(own.merged_over(defaults.wandb if defaults else None))
    if "mlflow" in t.trackers:
        own_ml = t.mlflow or MlflowSpec()
        update["mlflow"] = MlflowSpec.model_validate(own_ml.merged_over(defaults.mlflow if defaults else None))
    return spec.model_copy(update={"trainer": t.model_copy(update=update)})


def _origin(spec: TrainingSpec, tracker: str, field: str, spec_source: str, profile_source: str) -> str:
    """Where a merged option came from: the spec's ``trainer.<tracker>.<field>`` or the profile's."""
    own = getattr(spec.trainer, tracker)
    if own is not None and getattr(own, field) not in (None, ()):
        return f"{spec_source}: trainer.{tracker}.{field}"
    return f"{profile_source}: tracking.{tracker}.{field}"


def check_tracking(spec: TrainingSpec, profile: ClusterProfile, *, spec_source: str = "<spec>",
                   profile_source: str = "<profile>") -> None:
    """Plan-time rules for the trackers of ``spec`` (as written; the profile's defaults are
    merged here as :func:`resolve_tracking` merges them):

    - one source per credential: a key file (``wandb.api_key_file``, ``mlflow.token_file``) and
      the same variable in ``secrets`` exclude each other;
    - Kubernetes: W&B ``online`` (``mode``, else ``WANDB_MODE`` in the profile's or spec's
      ``env``, else online) needs ``WANDB_API_KEY`` mapped to a Secret by
      ``kubernetes.secret_env`` (pods have no other source); key files are refused;
    - ``MLFLOW_TRACKING_URI`` in a profile's or spec's ``env`` is checked like
      ``mlflow.tracking_uri`` (:func:`jobgen.specs.tracking.check_tracking_uri`: no file store, no
      credentials in it) and cannot be given beside it.

    Raises:
        PlanError: with the file + field path and a hint.
    """
    resolved = resolve_tracking(spec, profile)
    t = resolved.trainer
    caps = capabilities(profile.scheduler)
    # where secrets come from the cluster, the pods' W&B key is one of kubernetes.secret_env
    k8s = profile.kubernetes if not caps.secrets_from_shell else None
    for tracker in t.trackers:
        options = getattr(t, tracker)
        field, variable = KEY_FILES[tracker]
        key_file = getattr(options, field)
        where = _origin(spec, tracker, field, spec_source, profile_source)
        if key_file is not None and variable in spec.secrets:
            raise PlanError(
                f"{tracker}.{field} and `secrets: [{variable}]` both give {tracker}'s credential; one variable cannot have "
                "two sources.",
                location=where,
                hint=f"Keep one: remove {variable} from secrets, or remove {field}.",
            )
        if not caps.key_files and key_file is not None:
            raise PlanError(
                f"{tracker}.{field} names a file on the nodes, but {caps.refusal('key_files').reason}.",
                location=where,
                hint=f"Map {variable} to a Secret in the profile ({profile_source}): kubernetes.secret_env: "
                f"{{{variable}: {{secret: <Secret name>, key: <key>}}}}, and remove {field}.",
            )
    wandb = t.wandb if "wandb" in t.trackers else None
    # the pods' environment is what jobgen renders: the profile's env, then the spec's
    pod_mode = {**profile.env, **spec.env}.get(WANDB_MODE_ENV)
    if k8s is not None and wandb is not None and (wandb.mode or pod_mode or "online") in ("online", "run"):
        (variable,) = TRACKER_CREDENTIALS["wandb"]
        if variable not in k8s.secret_env:
            raise PlanError(
                f"trainer.loggers has wandb in online mode, but profile {profile.name!r} maps no Secret to {variable}: "
                "the pods would have no W&B key.",
                location=f"{spec_source}: trainer.loggers",
                hint=f"kubectl create secret generic wandb --from-literal=api-key=... and add to the profile "
                f"({profile_source}): kubernetes.secret_env: {{{variable}: {{secret: wandb, key: api-key}}}}; "
                "or log offline (trainer.wandb.mode: offline, or env: {WANDB_MODE: offline}) and run wandb sync later.",
            )
    if "mlflow" not in t.trackers:
        return
    assert t.mlflow is not None  # resolve_tracking set it
    for source, env, what in ((profile_source, profile.env, "profile"), (spec_source, spec.env, "spec")):
        value = env.get(MLFLOW_URI_ENV)
        if value is None:
            continue
        location = f"{source}: env.{MLFLOW_URI_ENV}"
        if t.mlflow.tracking_uri is not None:
            raise PlanError(
                f"the {what}'s env sets {MLFLOW_URI_ENV} and mlflow.tracking_uri is {t.mlflow.tracking_uri!r}; one setting "
                "cannot have two sources.",
                location=location,
                hint=f"Remove {MLFLOW_URI_ENV} from env and keep trainer.mlflow.tracking_uri (or the profile's "
                "tracking.mlflow.tracking_uri).",
            )
        try:
            check_tracking_uri(value)
        except ValueError as exc:
            raise PlanError(str(exc), location=location,
                            hint="set trainer.mlflow.tracking_uri instead, to a sqlite://// path or a server") from None
