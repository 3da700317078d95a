"""Experiment trackers of a training spec: ``trainer.loggers``, the Weights & Biases and MLflow
options (``trainer.wandb``, ``trainer.mlflow``) and the profile's defaults for them
(``tracking:``). Credentials only by reference (a variable in ``secrets`` or a key file on the
nodes), never a value. No I/O.

MLflow tracking URIs (MLflow 3.x, mlflow.org/docs/latest/self-hosting): a database
(``sqlite:///``, ``postgresql://``, ``mysql://``, ``mssql://``, with an optional ``+driver``), a
tracking server (``http://``, ``https://``) or Databricks (``databricks``, ``databricks://<profile>``).
The file store (``file:`` URIs, plain paths such as ``./mlruns``) is refused here as MLflow 3 refuses
it by default ("the filesystem tracking backend is in maintenance mode"); MLflow's own default is a
SQLite database.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from jobgen.specs.base import _Model, check_shell_safe, url_credential

LoggerName = Literal["csv", "tensorboard", "wandb", "mlflow"]
#: Every logger, in the order spec.json lists them (``csv`` is always on).
LOGGERS: tuple[LoggerName, ...] = ("csv", "tensorboard", "wandb", "mlflow")
#: The loggers that are experiment trackers: one run per job across restarts (jobgen.train.tracking).
TRACKERS: tuple[LoggerName, ...] = ("wandb", "mlflow")

#: Database schemes MLflow's SQLAlchemy store takes (mlflow/store/db/db_types.py), optionally ``+driver``.
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
#: W&B forbids these in project and entity names (wandb/sdk/wandb_settings.py, project name checks).
_WANDB_NAME_FORBIDDEN = "/\\#?%:"
_FILE_STORE_HINT = ("use a database such as sqlite:////shared/mlflow/mlflow.db (four slashes: an absolute path) or a "
                    "tracking server (https://mlflow.example.com)")


def check_tracking_uri(value: str) -> str:
    """The shape of an MLflow tracking URI (see the module doc), checked without I/O.

    Refused: the file store (``file:`` or a plain path: MLflow 3 refuses it by default), a
    relative SQLite path (``sqlite:///mlflow.db`` resolves in each job's working directory,
    which differs by scheduler), credentials inside the URI (``user:password@``, ``?token=``:
    spec.json and the rendered files would hold them; MLflow reads ``MLFLOW_TRACKING_USERNAME``,
    ``MLFLOW_TRACKING_PASSWORD`` and ``MLFLOW_TRACKING_TOKEN`` from the environment), and
    other schemes.

    Raises:
        ValueError: with the fix.
    """
    check_shell_safe(value)
    from urllib.parse import urlsplit

    if value in ("databricks", "databricks-uc"):  # MLflow's names for the default Databricks profile
        return value
    scheme, sep, rest = value.partition(":")
    base = scheme.split("+", 1)[0].lower()
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme) or base == "file" or len(scheme) == 1:
        raise ValueError(f"{value!r} is MLflow's file store (a path or file: URI), which MLflow 3 refuses by default; "
                         + _FILE_STORE_HINT)
    if base in ("databricks", "databricks-uc") and rest.startswith("//"):
        return value
    if base not in (*_DB_SCHEMES, "http", "https"):
        raise ValueError(f"{value!r}: MLflow tracking URIs are sqlite:///, postgresql://, mysql://, mssql:// (a database), "
                         "http(s):// (a tracking server) or databricks; " + _FILE_STORE_HINT)
    parts = urlsplit(value)
    credential = url_credential(value)
    if credential:
        raise ValueError(f"{credential}; it would be written into spec.json and the rendered files. Remove it and pass "
                         "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) as secrets, or use "
                         "trainer.mlflow.token_file")
    if base == "sqlite":
        path = value.split("://", 1)[1] if "://" in value else ""
        if path in ("", "/", "/:memory:") or not path.startswith("//"):
            raise ValueError(f"{value!r} is not a SQLite database file on an absolute path; every start of the job must "
                             "find the same database: sqlite:////shared/mlflow/mlflow.db (four slashes)")
    elif base in ("http", "https") and not parts.hostname:
        raise ValueError(f"{value!r} names no host; e.g. https://mlflow.example.com")
    return value


def _key_file(value: str | None) -> str | None:
    if value is None:
        return None
    check_shell_safe(value)
    if not (value.startswith("/") or value.startswith("~/")):
        raise ValueError(f"{value!r} is not an absolute path (or ~/...): global rank zero reads it on its node, in the "
                         "run directory, so a relative path would not find it")
    return value


class _Options(_Model):
    """Left out of spec.json while unset (``None`` or empty), so that a spec and the profile's
    defaults merge field by field (:func:`jobgen.planning.tracking.resolve_tracking`)."""

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v not in (None, (), [])}

    def merged_over(self, defaults: _Options | None) -> dict[str, Any]:
        """This section's set fields over ``defaults``' (the profile's), as a document."""
        base = defaults.model_dump(mode="json") if defaults is not None else {}
        return {**base, **self.model_dump(mode="json")}


class WandbSpec(_Options):
    """Weights & Biases options (``wandb.init``; wandb 0.31). Credentials: the key comes from
    ``WANDB_API_KEY`` (listed in ``secrets``; on Kubernetes mapped by ``kubernetes.secret_env``)
    or from ``api_key_file``; never from a file jobgen writes."""

    project: str | None = Field(default=None, description=(
        "W&B project; ``null``: the profile's, else ``$WANDB_PROJECT`` on the node, else\n"
        "``uncategorized`` (W&B's default; jobgen passes it, where wandb would name the project\n"
        "after the git repository around the program: the job's code snapshot)."
    ))
    entity: str | None = Field(default=None, description=(
        "W&B entity (team or user); ``null``: the profile's, else ``$WANDB_ENTITY`` on the node,\n"
        "else the key's default entity."
    ))
    mode: Literal["online", "offline"] | None = Field(default=None, description=(
        "``online``: stream to the W&B server (the nodes need network access and a key);\n"
        "``offline``: write under ``<run_dir>/wandb/`` (``$WANDB_DIR/wandb/`` where that is set)\n"
        "only, for nodes without internet, synced later with ``wandb sync`` (every piece carries\n"
        "the same run id, so the pieces of a requeued job join one run). ``null``: the profile's,\n"
        "else ``$WANDB_MODE`` on the node (W&B's switch), else ``online``."
    ))
    tags: tuple[str, ...] = Field(default=(), description="Run tags (at most 64 characters each); ``[]``: the profile's.")
    api_key_file: str | None = Field(default=None, description=(
        "A file on the nodes holding the API key (absolute or ``~/...``), read by global rank zero\n"
        "at start; the alternative to ``secrets: [WANDB_API_KEY]`` on SLURM and local runs. ``null``:\n"
        "``WANDB_API_KEY`` from the environment, else W&B's own login (``~/.netrc``)."
    ))

    @field_validator("project", "entity")
    @classmethod
    def _wandb_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_shell_safe(value)
        bad = sorted({c for c in value if c in _WANDB_NAME_FORBIDDEN})
        if not value.strip() or bad or len(value) > 128:
            raise ValueError(f"{value!r} is not a W&B name: 1-128 characters without {' '.join(_WANDB_NAME_FORBIDDEN)}")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for tag in value:
            check_shell_safe(tag)
            if not tag.strip() or len(tag) > 64:
                raise ValueError(f"tag {tag!r}: W&B tags are 1-64 characters")
        return tuple(dict.fromkeys(value))

    @field_validator("api_key_file")
    @classmethod
    def _key_path(cls, value: str | None) -> str | None:
        return _key_file(value)


class MlflowSpec(_Options):
    """MLflow options (``MlflowClient``; MLflow 3.x). Credentials: ``MLFLOW_TRACKING_TOKEN`` /
    ``MLFLOW_TRACKING_USERNAME`` + ``MLFLOW_TRACKING_PASSWORD`` listed in ``secrets``, or
    ``token_file``."""

    tracking_uri: str | None = Field(default=None, description=(
        "Where runs are recorded: ``sqlite:////abs/path/mlflow.db``, a database URL, ``https://<server>``\n"
        "or ``databricks``; the file store (``./mlruns``, ``file:``) is refused (MLflow 3 refuses it).\n"
        "``null``: the profile's, else ``$MLFLOW_TRACKING_URI`` on the node, else\n"
        "``sqlite:///<run_dir>/mlflow.db``."
    ))
    experiment: str | None = Field(default=None, description=(
        "MLflow experiment name (created when missing); ``null``: the profile's, else\n"
        "``$MLFLOW_EXPERIMENT_NAME`` on the node, else MLflow's ``Default`` experiment."
    ))
    token_file: str | None = Field(default=None, description=(
        "A file on the nodes holding a tracking-server token (absolute or ``~/...``), read by global\n"
        "rank zero at start into ``MLFLOW_TRACKING_TOKEN``; the alternative to listing\n"
        "``MLFLOW_TRACKING_TOKEN`` in ``secrets``."
    ))

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        return None if value is None else check_tracking_uri(value)

    @field_validator("experiment")
    @classmethod
    def _experiment(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or len(value) > 500):
            raise ValueError("an MLflow experiment name is 1-500 characters")
        return None if value is None else check_shell_safe(value)

    @field_validator("token_file")
    @classmethod
    def _token_path(cls, value: str | None) -> str | None:
        return _key_file(value)


class TrackingDefaults(_Model):
    """A site's defaults for the experiment trackers (profile ``tracking:``): a spec's
    ``trainer.wandb`` / ``trainer.mlflow`` fields win, field by field; they apply only to specs
    whose ``trainer.loggers`` name the tracker."""

    wandb: WandbSpec | None = Field(default=None, description="Defaults for ``trainer.wandb`` (e.g. ``{entity: my-team, mode: offline}``).")
    mlflow: MlflowSpec | None = Field(default=None, description="Defaults for ``trainer.mlflow`` (e.g. ``{tracking_uri: https://mlflow.example.com}``).")


def normalise_loggers(value: Any) -> Any:
    """``trainer.loggers`` as spec.json holds it: ``csv`` first (always on), no repeats, in
    :data:`LOGGERS` order (a list of names, or one name). Other values pass through to
    pydantic's own type error."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return value
    unknown = [v for v in value if v not in LOGGERS]
    if unknown:
        return value  # pydantic names the allowed values
    return tuple(name for name in LOGGERS if name == "csv" or name in value)
