"""The user's code in a training spec: their classes (``model``/``data``: ``class_path`` +
``init_args``), command mode (``entrypoint``) and the code snapshot (``code``). No I/O; nothing
here imports the user's code (``jobgen validate --import`` does, :mod:`jobgen.usercode.classes`)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from jobgen.specs.base import _check_json_value, _Model, check_class_path, check_shell_safe, url_credential


class ClassSpec(_Model):
    """Your own class, in LightningCLI's convention: ``class_path`` + ``init_args``.

    ``model: {class_path: my_pkg.models.MyModule, init_args: {hidden: 64}}`` names a
    ``LightningModule``; ``data: {class_path: ..., init_args: {...}}`` a ``LightningDataModule``.
    Rendering never imports them (only the shape of the path is checked); ``jobgen validate
    --import`` and ``jobgen submit`` import them and bind ``init_args`` to the class's signature,
    and the entrypoint instantiates them with jsonargparse (what LightningCLI uses), so nested
    ``{class_path, init_args}`` values and type checks work as in LightningCLI.
    """

    class_path: str = Field(description=(
        "Dotted import path of the class, e.g. ``my_pkg.models.MyModule``; importable on every node\n"
        "(installed, or on PYTHONPATH)."
    ))
    init_args: dict[str, Any] = Field(default={}, description=(
        "Keyword arguments of the class's ``__init__`` (JSON values; nested ``{class_path,\n"
        "init_args}`` mappings are instantiated too). A data module whose ``__init__`` takes\n"
        "``batch_size`` gets ``trainer.micro_batch_size``: leave ``batch_size`` out (or equal to it)."
    ))

    @field_validator("class_path")
    @classmethod
    def _class_path_shape(cls, value: str) -> str:
        return check_class_path(value)

    @field_validator("init_args")
    @classmethod
    def _init_args_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not key.isidentifier():
                raise ValueError(f"init_args key {key!r} is not a Python argument name")
        return _check_json_value(value, "init_args")

_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: TrainerSpec fields that still apply in command mode (``entrypoint`` set): they decide the
#: world, the DeepSpeed config and the ``--trainer.*`` arguments of a LightningCLI script.
#: Every other trainer field configures the built-in entrypoint only.
COMMAND_TRAINER_FIELDS = frozenset({
    "strategy", "precision", "micro_batch_size", "gradient_accumulation_steps", "global_batch_size",
    "offload_optimizer", "offload_params", "nvme_path", "gradient_clip_val",
})
#: TrainingSpec sections that configure the built-in entrypoint only (refused in command mode).
BUILTIN_SECTIONS = ("model", "data", "checkpoint", "watchdog")


class EntrypointSpec(_Model):
    """Command mode: run your own training script under jobgen's launch contracts instead of
    the bundled ``python -m jobgen.train``. Give ``module`` or ``script``.

    The ranks run in the directory ``jobgen submit`` runs in (local and SLURM; on SLURM it must
    be on a filesystem the nodes share) or in the image's working directory (Kubernetes), so a
    relative ``script`` and relative paths in ``args`` resolve there. Each rank finds its world
    in MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK (``init_process_group("env://")``
    works on every backend); DeepSpeed specs get ``PL_DEEPSPEED_CONFIG_PATH`` (the rendered
    ``ds_config.json``, an absolute path on the node).
    """

    module: str | None = Field(default=None, description=(
        "Python module to run as ``python -m MODULE`` (e.g. ``pkg.train``); importable on the\n"
        "nodes (``jobgen validate`` checks it is importable here)."
    ))
    script: str | None = Field(default=None, description=(
        "Python script to run as ``python SCRIPT``, relative to the ranks' working directory (the\n"
        "directory ``jobgen submit`` runs in; Kubernetes: the image's working directory) or absolute."
    ))
    args: tuple[str, ...] = Field(default=(), description=(
        "Arguments after the module/script, each passed as one argument (quoted by jobgen; no\n"
        "newlines), e.g. ``[fit, --config, configs/train.yaml]``."
    ))
    lightning_cli: bool = Field(default=False, description=(
        "The script is a LightningCLI script: jobgen appends ``--trainer.num_nodes``,\n"
        "``--trainer.devices``, ``--trainer.accelerator``, ``--trainer.strategy`` and\n"
        "``--trainer.precision`` from the world, and ``jobgen validate`` refuses a ``--config`` file\n"
        "whose ``trainer:`` section contradicts them."
    ))

    @field_validator("module")
    @classmethod
    def _module_name(cls, value: str | None) -> str | None:
        if value is not None and not _MODULE_RE.match(value):
            raise ValueError(f"{value!r} is not a Python module name (dotted identifiers, e.g. pkg.train)")
        return value

    @field_validator("script")
    @classmethod
    def _script_path(cls, value: str | None) -> str | None:
        if value is None:
            return value
        check_shell_safe(value)
        if not value.strip() or value.startswith("-"):
            raise ValueError(f"script {value!r} must be a file path (not empty, not starting with '-')")
        return value

    @field_validator("args")
    @classmethod
    def _args_shell_safe(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            check_shell_safe(arg)
        return value

    @model_validator(mode="after")
    def _one_target(self) -> EntrypointSpec:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of module (python -m MODULE) or script (python SCRIPT)")
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


#: A full git commit id (SHA-1: 40 hex digits; SHA-256 repositories: 64).
_COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
#: ``code.python_path``: a plain relative directory (it is placed into job.sbatch as shell text).
_SUBDIR_RE = re.compile(r"^[A-Za-z0-9._/-]*$")


class CodeGitSource(_Model):
    """Kubernetes: the code as one commit of a git repository, checked out in every pod before
    torchrun starts (the profile's image needs ``git`` and ``sh``)."""

    url: str = Field(min_length=1, description=(
        "URL every pod fetches (``https://...`` or ``ssh://...``); credentials are not\n"
        "written here (a public repository, or a URL the cluster's git setup can read)."
    ))
    ref: str = Field(description=(
        "The commit to check out: its full 40-hex id (64 for SHA-256 repositories), never a branch\n"
        "or tag (they move: a restarted pod would run other code). ``git rev-parse HEAD`` prints it."
    ))

    @field_validator("url")
    @classmethod
    def _shell_safe(cls, value: str) -> str:
        check_shell_safe(value)
        credential = url_credential(value)
        if credential:
            raise ValueError(f"{credential}; it would be written into the rendered manifest (and committed). Use a public "
                             "repository, or a URL the cluster's git setup can read with its own credentials")
        return value

    @field_validator("ref")
    @classmethod
    def _full_commit(cls, value: str) -> str:
        if not _COMMIT_RE.match(value):
            raise ValueError(
                f"ref {value!r} is not a full commit id: a branch or tag moves, so a restarted pod would run other "
                "code; give the 40-hex commit (git rev-parse <branch>, e.g. git rev-parse HEAD)"
            )
        return value


class CodeSpec(_Model):
    """The user's code, shipped as an immutable snapshot (docs/code-snapshots.md).

    SLURM and local: at submit, ``git archive HEAD`` of the repository holding ``repo`` is
    extracted into ``<run dir>/code/<commit>/`` and put first on every rank's PYTHONPATH.
    Kubernetes: the image is the code, or ``git`` (every pod checks out one commit).
    Without a ``code`` section, a spec that runs the user's code (an ``entrypoint``, or a
    ``class_path`` model or data module) snapshots the repository holding the spec file (none
    when the spec is not in a git work tree); one of the built-in models and data does not.
    """

    repo: str = Field(default=".", min_length=1, description=(
        "A directory in the git work tree to snapshot, relative to the spec file; the whole\n"
        "repository holding it is snapshotted (its committed tree, ``git archive HEAD``)."
    ))
    python_path: str = Field(default="", description=(
        "Sub-directory of the repository put first on PYTHONPATH, e.g. ``src``; empty: the\n"
        "repository root."
    ))
    snapshot: bool = Field(default=True, description=(
        "``false``: no snapshot; the ranks import the code found when they start (as before)."
    ))
    git: CodeGitSource | None = Field(default=None, description=(
        "Kubernetes only: every pod checks out this commit into an emptyDir volume before torchrun\n"
        "starts and puts it first on PYTHONPATH (PyTorchJob and TrainJob). ``null``: the image is\n"
        "the code (pin it by digest, ``image: repo@sha256:...``)."
    ))

    @field_validator("repo")
    @classmethod
    def _repo_shell_safe(cls, value: str) -> str:
        return check_shell_safe(value)

    @field_validator("python_path")
    @classmethod
    def _relative_subdir(cls, value: str) -> str:
        parts = value.split("/")
        if not _SUBDIR_RE.match(value) or value.startswith("/") or ".." in parts:
            raise ValueError(
                f"python_path {value!r} must be a sub-directory of the repository: relative, without '..', of letters, "
                "digits and . _ - / only (e.g. src)"
            )
        return "/".join(p for p in parts if p not in ("", "."))
