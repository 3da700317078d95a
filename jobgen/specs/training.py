"""TrainingSpec: what to train, independent of where it runs.

A spec is loaded from YAML by :mod:`jobgen.specs.load` and validated here (pydantic v2,
``extra="forbid"``, frozen). No I/O happens in this module. Units are in field names
(``time_limit_min``) or stated in the field description.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from jobgen.specs.base import (  # noqa: F401  (re-exported: the spec's public names live here)
    CLASS_PATH_RE,
    ENV_KEY_RE,
    _check_json_value,
    _Model,
    _omit_defaults,
    check_class_path,
    check_env,
    check_shell_safe,
    field_error,
)
from jobgen.specs.model import MODEL_PRESETS, LoraSpec, ModelSpec  # noqa: F401
from jobgen.specs.notify import NOTIFY_EVENTS, NotifyEvent, NotifySpec, WebhookSpec  # noqa: F401
from jobgen.specs.trainer import (  # noqa: F401
    _TRAINER_OPTIONAL_FIELDS,
    BUILTIN_OPTIMIZER_FIELDS,
    OffloadDevice,
    Precision,
    Strategy,
    TrainerSpec,
    warmup_steps_of,
)
from jobgen.specs.user import (  # noqa: F401
    BUILTIN_SECTIONS,
    COMMAND_TRAINER_FIELDS,
    ClassSpec,
    CodeGitSource,
    CodeSpec,
    EntrypointSpec,
)


def _user_or_builtin(value: Any) -> str:
    """Which branch of ``model``/``data`` a value is: a mapping with ``class_path`` is a
    :class:`ClassSpec`, anything else the built-in spec (so errors come from one branch)."""
    if isinstance(value, ClassSpec) or (isinstance(value, dict) and "class_path" in value):
        return USER_CLASS_TAG
    return BUILTIN_TAG


#: The environment variable a command-mode smoke run (``jobgen submit --smoke N``) sets to N on
#: every rank (``env``): jobgen does not drive a user script's steps, the script reads it.
SMOKE_STEPS_ENV = "JOBGEN_SMOKE_STEPS"
#: Tags of the ``model``/``data`` unions. pydantic puts them into error locations
#: (``model.<tag>.field``); :mod:`jobgen.specs.load` drops them from the paths it prints.
USER_CLASS_TAG = "class-path-branch"
BUILTIN_TAG = "built-in-branch"


_DATA_FORMAT_FIELDS = {"format": "text", "token_dtype": None, "vocab_size": None, "tokenizer_path": None}


#: Most bytes (UTF-8) in a job name: it is a directory name (255 bytes on most file systems),
#: with room for what jobgen appends (``-smoke``, a log file's ``-<jobid>.out``).
MAX_NAME_BYTES = 200

#: Longest job name (= job directory name) that every backend uses unchanged: Kubernetes names
#: its objects after the job, and the operator's pod and Service names (``<name>-worker-<index>``)
#: must fit a 63-character DNS label. A longer name (or one that is not a DNS-1035 label) gets a
#: derived, hashed object name there (:func:`jobgen.backends.kubernetes.manifest.k8s_name`, with a
#: warning); generated names stay within it (:func:`jobgen.specs.sweeps.sweep_job_names`).
MAX_NAME = 48

class DataSpec(_Model):
    """Training data: local text read as raw bytes (``format: text``, byte-level tokens, no
    tokenizer), pre-tokenized token files (``tokens``) or JSONL instruction data (``jsonl``).
    Nothing is ever downloaded."""

    paths: tuple[str, ...] = Field(default=(), description=(
        "Local files, directories (read recursively) or glob patterns. ``text``: any files; empty:\n"
        "the Python standard library source of the running interpreter (``*.py``, site-packages\n"
        "excluded). ``tokens``: ``*.bin`` files; ``jsonl``: ``*.jsonl`` files (required for both)."
    ))
    val_fraction: float = Field(default=0.05, gt=0.0, le=0.5, description=(
        "Fraction held out for validation, deterministic: whole byte blocks (``text``), the last\n"
        "tokens of the stream (``tokens``), every ``round(1/val_fraction)``-th record (``jsonl``)."
    ))
    max_bytes: int | None = Field(default=None, ge=4096, description=(
        "``text`` only: upper bound on bytes read from ``paths`` (files in sorted order); ``null``:\n"
        "no bound."
    ))
    format: Literal["text", "tokens", "jsonl"] = Field(default="text", description=(
        "``text``: raw bytes (built-in GPT only). ``tokens``: flat little-endian token ids\n"
        "(``uint16``/``uint32``), memory-mapped. ``jsonl``: one JSON object per line with\n"
        "``instruction``, optional ``input`` and ``output`` (alpaca); prompt tokens are masked out of\n"
        "the loss."
    ))
    token_dtype: Literal["uint16", "uint32"] | None = Field(default=None, description=(
        "``tokens``: element type of the ``.bin`` files; ``null``: read ``dtype`` from the sidecar\n"
        "``meta.json`` next to the files."
    ))
    vocab_size: int | None = Field(default=None, ge=1, description=(
        "``tokens``: vocabulary the files were encoded with (checked <= the model's vocabulary);\n"
        "``null``: ``vocab_size`` of the sidecar ``meta.json``, if any. Token ids are checked too."
    ))
    tokenizer_path: str | None = Field(default=None, description=(
        "``jsonl``: local directory of a Hugging Face tokenizer (``save_pretrained`` output),\n"
        "loaded with ``local_files_only=True``; ``null``: ``model.hf_path``."
    ))

    @field_validator("paths")
    @classmethod
    def _paths_shell_safe(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            check_shell_safe(path)
        return value

    @model_validator(mode="after")
    def _format_rules(self) -> DataSpec:
        if self.format != "text":
            if not self.paths:
                raise ValueError(f"format {self.format!r} needs paths (the default stdlib source is text)")
            if self.max_bytes is not None:
                raise ValueError(f"max_bytes applies to format 'text' only (format is {self.format!r})")
        if self.format != "tokens" and (self.token_dtype is not None or self.vocab_size is not None):
            raise ValueError("token_dtype and vocab_size apply to format 'tokens' only")
        if self.format != "jsonl" and self.tokenizer_path is not None:
            raise ValueError("tokenizer_path applies to format 'jsonl' only")
        return self

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        return _omit_defaults(handler(self), _DATA_FORMAT_FIELDS)

_NODE_RANGE = re.compile(r"\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?")


class ResourcesSpec(_Model):
    """How much of the cluster the job asks for; unset fields take the profile's defaults."""

    nodes: Annotated[int, Field(ge=1)] | Annotated[str, Field(pattern=r"^[0-9]+:[0-9]+$")] | None = Field(default=None, description=(
        "Number of nodes (SLURM nodes, Kubernetes pods), or an elastic range ``\"min:max\"`` (e.g.\n"
        "``\"2:4\"``) for a Kubernetes PyTorchJob with an ``elasticPolicy`` (torchrun\n"
        "``--nnodes=min:max``; refused on SLURM, local and TrainJob profiles). jobgen reads an\n"
        "unquoted 2:4 as the range, not as YAML 1.1's base-60 number 124; quote it for other YAML\n"
        "tools. A range whose ends are equal is that fixed count. Default: the profile's default_nodes."
    ))
    devices_per_node: int | None = Field(default=None, ge=1, description=(
        "Processes (GPUs) per node. Default: all GPUs of a node (or the profile's CPU processes)."
    ))
    time_limit_min: int | None = Field(default=None, ge=1, description="Wall-clock limit in minutes. Default: the profile's time limit.")

    @field_validator("nodes", mode="before")
    @classmethod
    def _node_count_or_range(cls, value: Any) -> int | str | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError(f"nodes must be at least 1 (got {value})")
            return value
        match = _NODE_RANGE.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"{value!r} is neither a node count (e.g. 2) nor an elastic range \"min:max\" (e.g. \"2:4\")")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if low < 1:
            raise ValueError(f"the elastic range {value!r} starts below 1 node; give at least 1 as the minimum")
        if low > high:
            raise ValueError(f"the elastic range {value!r} has its minimum ({low}) above its maximum ({high}); write \"{high}:{low}\"")
        return low if low == high else f"{low}:{high}"

    @property
    def node_range(self) -> tuple[int, int] | None:
        """``(min, max)`` nodes of an elastic range (``nodes: "2:4"``); ``None`` for a fixed count."""
        if not isinstance(self.nodes, str):
            return None
        low, high = self.nodes.split(":")
        return int(low), int(high)


class CheckpointSpec(_Model):
    """Checkpointing and resume."""

    every_n_steps: int = Field(default=100, ge=1, description="Save a checkpoint every N optimizer steps (plus ``last.ckpt`` and one at the end).")
    keep_last_k: int = Field(default=2, ge=1, description="Step checkpoints to keep (newest first); ``last.ckpt`` is kept in addition.")
    resume: Literal["auto", "never"] = Field(default="auto", description=(
        "``auto``: continue from the newest checkpoint in the run directory when one exists\n"
        "(what a requeued job needs); ``never``: always start from step 0."
    ))

#: The most restarts a spec may allow (``restart.max_restarts``): a budget beyond it is a typo
#: or a job that should be fixed rather than run again.
MAX_RESTARTS = 100


class RestartSpec(_Model):
    """The restart budget: how often the job may be started again after a failure that
    :mod:`jobgen.reports.failure_class` classes as retried (``infrastructure`` or ``unknown``;
    never a ``user`` failure)."""

    max_restarts: int = Field(default=0, ge=0, le=MAX_RESTARTS, description=(
        f"Restarts allowed after a retried failure (0 to {MAX_RESTARTS}; 0: none). A local run: jobgen\n"
        "starts the ranks again, resuming from the newest checkpoint, and records each restart's class\n"
        "and reason in summary.json and ``jobgen status``. Hosts over ssh: a watcher on the submitting\n"
        "machine does the same for every host. SLURM: the batch script requeues the job after\n"
        "such a failure while ``SLURM_RESTART_COUNT`` (every requeue of the job, whatever its cause) is\n"
        "below it. Kubernetes: a PyTorchJob's ``runPolicy.backoffLimit`` with ``restartPolicy: ExitCode``\n"
        "(the operator recreates a pod that failed so; 0 here takes the profile's ``kubernetes.backoff_limit``;\n"
        "docs/failures.md). An elastic PyTorchJob's torchrun ``--max-restarts`` is not counted against it."
    ))
    exclude_failed_nodes: bool = Field(default=True, description=(
        "SLURM: a restart adds the node of the task that failed to the job's excluded nodes\n"
        "(``scontrol update ExcNodeList``), so the requeued job does not run there again."
    ))

    @field_validator("max_restarts", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        # YAML's "3", 3.0 or true are not a count: pydantic would take them as 3 or 1
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"give a whole number of restarts from 0 to {MAX_RESTARTS}, e.g. max_restarts: 3 "
                             "(unquoted; 0: no restarts)")
        if not 0 <= value <= MAX_RESTARTS:
            raise ValueError(f"{value} restarts is outside 0 to {MAX_RESTARTS}; give a budget in that range (0: no restarts)")
        return value


#: The watchdog's bounds: a hang timeout from 1 s to 7 days (seconds), a step-time factor from 1 to 1000.
HANG_TIMEOUT_RANGE_S = (1, 7 * 24 * 3600)
STEP_TIME_FACTOR_RANGE = (1, 1000)
#: A straggler's factor: from 1.1 (a rank 10% slower than the others' median) to 1000.
STRAGGLER_FACTOR_RANGE = (1.1, 1000)


def _bounded_number(value: Any, low: float, high: float, example: str) -> Any:
    """``value`` when it is a number (int or float, not a bool or a string) in ``[low, high]``;
    else ValueError with the range and an example (YAML's ``"600"`` or ``true`` is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"give a number from {low:g} to {high:g}, e.g. {example} (unquoted)")
    if not low <= value <= high:
        raise ValueError(f"{value:g} is outside {low:g} to {high:g}; give a value in that range, e.g. {example}")
    return value


class WatchdogSpec(_Model):
    """The progress watchdog of jobgen's entrypoint (``python -m jobgen.train``; docs/failures.md):
    the job is hung when no rank advanced its optimizer step for ``max(hang_timeout_s,
    step_time_factor x the median step time)`` seconds, validation and checkpoint saves not
    counted. Then every live rank writes its threads' Python stacks to ``<run dir>/hang/`` and
    the job exits :data:`jobgen.reports.failure_class.EXIT_HUNG`. Not used in command mode
    (``entrypoint:``): a user's own script has no optimizer step jobgen can see. It also reports
    a straggler: a rank whose compute time per batch is more than ``straggler_factor`` times the
    median of the others' (:func:`jobgen.train.watchdog.find_straggler`)."""

    hang_timeout_s: float = Field(default=600, ge=HANG_TIMEOUT_RANGE_S[0], le=HANG_TIMEOUT_RANGE_S[1], description=(
        f"Seconds without an optimizer step on any rank before the job counts as hung ({HANG_TIMEOUT_RANGE_S[0]} to\n"
        f"{HANG_TIMEOUT_RANGE_S[1]}); the floor of the limit, which grows with slow steps (``step_time_factor``)."
    ))
    step_time_factor: float = Field(default=10, ge=STEP_TIME_FACTOR_RANGE[0], le=STEP_TIME_FACTOR_RANGE[1], description=(
        f"The limit is at least this many median step times ({STEP_TIME_FACTOR_RANGE[0]} to {STEP_TIME_FACTOR_RANGE[1]}):\n"
        "a job whose steps take minutes is not called hung after ``hang_timeout_s``."
    ))
    straggler_factor: float = Field(default=1.5, ge=STRAGGLER_FACTOR_RANGE[0], le=STRAGGLER_FACTOR_RANGE[1], description=(
        f"A rank whose compute time per batch is more than this many times the median of the other ranks'\n"
        f"is reported once as a straggler, with its node ({STRAGGLER_FACTOR_RANGE[0]:g} to {STRAGGLER_FACTOR_RANGE[1]}):\n"
        "in the log, summary.json (``straggler``) and ``jobgen status``."
    ))

    @field_validator("hang_timeout_s", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> Any:
        return _bounded_number(value, *HANG_TIMEOUT_RANGE_S, "hang_timeout_s: 600")

    @field_validator("step_time_factor", mode="before")
    @classmethod
    def _factor(cls, value: Any) -> Any:
        return _bounded_number(value, *STEP_TIME_FACTOR_RANGE, "step_time_factor: 10")

    @field_validator("straggler_factor", mode="before")
    @classmethod
    def _straggler(cls, value: Any) -> Any:
        return _bounded_number(value, *STRAGGLER_FACTOR_RANGE, "straggler_factor: 1.5")


class TrainingSpec(_Model):
    """A training job: model, data, trainer settings, resources, checkpointing and env."""

    name: str = Field(min_length=1, max_length=128, description=(
        "Job name; also the directory name under ``manifests/<profile>/`` and ``runs/``: at most 128\n"
        "characters and 200 bytes in UTF-8."))
    model: Annotated[
        Annotated[ModelSpec, Tag(BUILTIN_TAG)] | Annotated[ClassSpec, Tag(USER_CLASS_TAG)], Discriminator(_user_or_builtin)
    ] = Field(default_factory=lambda: ModelSpec.model_validate({}), description=(
        "The model to train: jobgen's built-in GPT / a Hugging Face model (ModelSpec), or your own\n"
        "LightningModule as ``{class_path, init_args}`` (ClassSpec)."
    ))
    data: Annotated[
        Annotated[DataSpec, Tag(BUILTIN_TAG)] | Annotated[ClassSpec, Tag(USER_CLASS_TAG)], Discriminator(_user_or_builtin)
    ] = Field(default=DataSpec(), validate_default=True, description=(
        "The training data: jobgen's formats (DataSpec), or your own LightningDataModule as\n"
        "``{class_path, init_args}`` (ClassSpec; needed by, and only with, a ``class_path`` model)."
    ))
    trainer: TrainerSpec = Field(default=TrainerSpec(), validate_default=True, description="Strategy, precision, batch sizes, optimisation.")
    resources: ResourcesSpec = Field(default=ResourcesSpec(), description="Nodes, devices per node and time limit.")
    checkpoint: CheckpointSpec = Field(default=CheckpointSpec(), description="Checkpoint cadence and resume behaviour.")
    restart: RestartSpec = Field(default=RestartSpec(), description=(
        "The restart budget after a failure jobgen classes as retried (docs/failures.md); left out of\n"
        "spec.json while it is the default."
    ))
    watchdog: WatchdogSpec = Field(default=WatchdogSpec(), description=(
        "The progress watchdog: when the job counts as hung (docs/failures.md); left out of spec.json\n"
        "while it is the default."
    ))
    env: dict[str, str] = Field(default={}, description=(
        "Extra environment variables for every rank (set after the profile's env). Values are\n"
        "written into the rendered files, so names that look like credentials (``*TOKEN*``,\n"
        "``*SECRET*``, ``*PASSWORD*``, ``*_API_KEY``, ...) are refused: use ``secrets``."
    ))
    entrypoint: EntrypointSpec | None = Field(default=None, description=(
        "Command mode: run your own script (``module`` or ``script`` + ``args``) under jobgen's\n"
        "launchers instead of the built-in entrypoint; ``model``, ``data``, ``checkpoint`` and the\n"
        "trainer's optimisation fields do not apply then (refused when set). ``null``: the built-in\n"
        "entrypoint (``python -m jobgen.train``)."
    ))
    secrets: tuple[str, ...] = Field(default=(), description=(
        "Names (never values) of environment variables that hold credentials, e.g.\n"
        "``[WANDB_API_KEY, HF_TOKEN]``; every rank gets them, no rendered file holds them. SLURM and\n"
        "local: ``jobgen submit`` takes each value from the environment it runs in and refuses\n"
        "(exit 2, nothing submitted) when one is unset; sbatch passes them to the job (its default\n"
        "``--export=ALL``; a profile's ``--export`` must keep them) and job.sbatch stops before\n"
        "``srun`` when one is missing. Kubernetes: each name must be mapped to a Secret by the\n"
        "profile's ``kubernetes.secret_env``."
    ))
    code: CodeSpec | None = Field(default=None, description=(
        "The user's code as an immutable snapshot (see CodeSpec); ``null``: for a spec that runs the\n"
        "user's code (``entrypoint``, or a ``class_path`` model/data), the git repository holding the\n"
        "spec file, snapshotted at submit (none when the spec is not in one); for the built-in models\n"
        "and data, no snapshot."
    ))
    notify: NotifySpec | None = Field(default=None, description=(
        "Notifications (webhook and/or command) on started / requeued / finished / failed, sent\n"
        "by rank zero; ``null``: none."
    ))
    smoke: bool = Field(default=False, description=(
        "A smoke run, set by ``jobgen submit --smoke N`` together with ``trainer.max_steps: N``,\n"
        "``checkpoint.resume: never`` and the name ``<name>-smoke``: a cheap first run that writes\n"
        "no checkpoints (and resumes from none). Its warmup is the full run's fraction of the steps\n"
        "(``trainer.warmup_ratio``, ``warmup_steps = ceil(ratio x N)``), or none (``warmup_steps: 0``)\n"
        "where no step would follow it. Command mode: ``env.JOBGEN_SMOKE_STEPS: N`` (and\n"
        "``--trainer.max_steps=N`` for a LightningCLI script) instead."
    ))

    @field_validator("data")
    @classmethod
    def _data_fits_model(cls, value: DataSpec | ClassSpec, info: ValidationInfo) -> DataSpec | ClassSpec:
        model = info.data.get("model")
        if model is None:
            return value  # the model failed: its error is reported
        if isinstance(model, ClassSpec) and not isinstance(value, ClassSpec):
            raise ValueError(
                f"model.class_path ({model.class_path}) needs data.class_path: jobgen's data formats feed its own "
                "models' batches; give your LightningDataModule as data: {class_path: ..., init_args: {...}}"
            )
        if isinstance(value, ClassSpec) and not isinstance(model, ClassSpec):
            raise ValueError(
                f"data.class_path ({value.class_path}) needs model.class_path: the built-in GPT / Hugging Face models "
                "train on jobgen's data formats only; give your LightningModule as model: {class_path: ...}, or use "
                "a data format (text, tokens, jsonl)"
            )
        return value

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer_fits_model(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(info.data.get("model"), ClassSpec):
            return value
        if isinstance(value, TrainerSpec):  # the default (or a model instance): what it would serialise to
            value = value.model_dump(mode="json", exclude=set(BUILTIN_OPTIMIZER_FIELDS))
        if not isinstance(value, dict):
            return value
        given = [k for k in BUILTIN_OPTIMIZER_FIELDS if k in value]
        if given:
            raise ValueError(
                f"{', '.join(given)}: jobgen's optimiser settings for its built-in models; a model.class_path "
                "module brings its own configure_optimizers (and scheduler): remove them and set the learning "
                "rate in model.init_args"
            )
        # No jobgen warmup for a class_path model (its warmup_steps < max_steps rule does not apply).
        return {**value, "warmup_steps": 0}

    @field_validator("name")
    @classmethod
    def _name_is_a_directory_name(cls, value: str) -> str:
        check_shell_safe(value)
        if "/" in value or value in (".", "..") or value.startswith("-"):
            raise ValueError(
                "the job name becomes a directory name: it must not contain '/', start with '-', or be '.'/'..'"
            )
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_NAME_BYTES:
            raise ValueError(
                f"the job name is {size} bytes in UTF-8 (at most {MAX_NAME_BYTES}): it becomes a directory name, and file "
                "systems allow 255 bytes with room for what jobgen appends (-smoke); use a shorter name"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_ok(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env(value)

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not ENV_KEY_RE.match(name):
                raise ValueError(f"environment variable name {name!r} is not a valid name ([A-Za-z_][A-Za-z0-9_]*); "
                                 "secrets lists names only, never values")
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed more than once")
        return value

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # left out while empty/unset/off: specs without them keep the spec.json (and hashes) they had
        data = handler(self)
        if self.entrypoint is None:  # left out while unset, like secrets
            data = {k: v for k, v in data.items() if k != "entrypoint"}
        else:  # command mode: only what applies (spec.json reads back without "explicitly set" refusals)
            data = {k: v for k, v in data.items() if k not in BUILTIN_SECTIONS}
            data["trainer"] = {k: v for k, v in data["trainer"].items() if k in COMMAND_TRAINER_FIELDS}
        if self.user_code and isinstance(data.get("trainer"), dict):
            # jobgen's optimiser settings do not apply to a class_path model: not written
            data["trainer"] = {k: v for k, v in data["trainer"].items() if k not in BUILTIN_OPTIMIZER_FIELDS}
        omit = {key for key, empty in (("secrets", not self.secrets), ("code", self.code is None),
                                       ("notify", self.notify is None), ("smoke", not self.smoke),
                                       ("restart", self.restart == RestartSpec()),
                                       ("watchdog", self.watchdog == WatchdogSpec())) if empty}
        return {k: v for k, v in data.items() if k not in omit}

    @property
    def user_code(self) -> bool:
        """Whether the model (and so the data) is the user's own class (``class_path``)."""
        return isinstance(self.model, ClassSpec)

    @property
    def runs_user_code(self) -> bool:
        """Whether the job runs the user's code (an ``entrypoint``, or a ``class_path`` model or
        data module) rather than only jobgen's built-in models and data: such specs are
        snapshotted at submit by default (:mod:`jobgen.usercode.snapshot`)."""
        return self.entrypoint is not None or self.user_code or isinstance(self.data, ClassSpec)

    def as_smoke(self, steps: int) -> TrainingSpec:
        """This spec as a smoke run (:meth:`smoke_doc`), validated again.

        Raises:
            pydantic.ValidationError: the changed spec breaks a rule (e.g. the name gets too long).
        """
        return TrainingSpec.model_validate(self.smoke_doc(steps))

    def smoke_doc(self, steps: int) -> dict[str, Any]:
        """This spec, as a document, changed into a smoke run of ``steps`` optimizer steps
        (``jobgen submit --smoke N``): name ``<name>-smoke`` and ``smoke: true``, then

        - built-in entrypoint: ``max_steps: steps`` (no epoch bound), validation at most every
          ``steps`` steps, no checkpoints written or resumed (``resume: never``), and jobgen's
          warmup scaled to the smoke run: the full run's warmup fraction (``warmup_ratio``, or
          ``warmup_steps / max_steps``) is kept as ``warmup_ratio``, so ``warmup_steps =
          ceil(ratio x steps)``; where that leaves no step after the warmup (e.g. ``--smoke 1``)
          the warmup is dropped (``warmup_steps: 0``, no ratio). spec.json says which.
        - command mode (``entrypoint``): jobgen does not drive the steps, so the script is told:
          ``JOBGEN_SMOKE_STEPS=steps`` in ``env`` and, for a LightningCLI script,
          ``--trainer.max_steps=steps`` appended to ``entrypoint.args`` (later arguments win).
        """
        doc = self.model_dump(mode="json")
        doc.update(name=f"{self.name}-smoke", smoke=True)
        if self.entrypoint is not None:
            doc["env"] = {**doc.get("env", {}), SMOKE_STEPS_ENV: str(steps)}
            if self.entrypoint.lightning_cli:
                doc["entrypoint"]["args"] = [*doc["entrypoint"]["args"], f"--trainer.max_steps={steps}"]
            return doc
        t = doc["trainer"]
        t.update(max_steps=steps, max_epochs=None, val_check_interval=min(self.trainer.val_check_interval, steps))
        doc["checkpoint"] = {**doc["checkpoint"], "resume": "never"}
        if self.user_code:
            return doc
        full = self.trainer
        ratio = full.warmup_ratio
        if ratio is None and full.warmup_steps and full.max_steps:
            ratio = full.warmup_steps / full.max_steps  # built-in models always have max_steps
        t.pop("warmup_steps", None)
        if ratio is not None and warmup_steps_of(ratio, steps) < steps:
            t["warmup_ratio"] = ratio  # scaled: TrainerSpec derives warmup_steps from it
        else:  # dropped: no warmup fits (or there was none)
            t.update(warmup_ratio=None, warmup_steps=0)
        return doc

    @model_validator(mode="after")
    def _command_mode(self) -> TrainingSpec:
        if self.entrypoint is None:
            return self
        target = f"module {self.entrypoint.module}" if self.entrypoint.module else f"script {self.entrypoint.script}"
        given = [name for name in BUILTIN_SECTIONS if name in self.model_fields_set]
        given += [f"trainer.{name}" for name in sorted(self.trainer.model_fields_set - COMMAND_TRAINER_FIELDS)]
        if given:
            raise ValueError(
                f"entrypoint is set (command mode: your {target} trains), so {', '.join(given)} would do nothing: "
                "they configure the built-in entrypoint only. Remove them and configure your script through "
                "entrypoint.args (e.g. [fit, --config, train.yaml]); what still applies: resources, trainer."
                f"{{{','.join(sorted(COMMAND_TRAINER_FIELDS))}}}, env, secrets"
            )
        return self

    @model_validator(mode="after")
    def _notify_secrets_listed(self) -> TrainingSpec:
        hook = self.notify.webhook if self.notify is not None else None
        for field in ("token_env", "url_env"):
            name = getattr(hook, field, None) if hook is not None else None
            if name is not None and name not in self.secrets:
                raise ValueError(
                    f"notify.webhook.{field} names {name}, which is not in secrets; list it there "
                    f"(secrets: [{', '.join((*self.secrets, name))}]) so that its value reaches the ranks "
                    "from your environment (or a Kubernetes Secret) and no file holds it"
                )
        return self

    @model_validator(mode="after")
    def _model_fits_data(self) -> TrainingSpec:
        m, d, t = self.model, self.data, self.trainer
        if self.smoke and self.entrypoint is None and self.checkpoint.resume != "never":
            raise field_error(TrainingSpec, ("checkpoint", "resume"), "smoke: true (a --smoke run) keeps no checkpoints "
                              "and resumes from none: it needs checkpoint.resume: never", self.checkpoint.resume)
        if isinstance(d, ClassSpec):
            batch = d.init_args.get("batch_size")
            if batch is not None and batch != t.micro_batch_size:
                raise field_error(TrainingSpec, ("data", "init_args", "batch_size"),
                    f"{batch!r} but trainer.micro_batch_size is {t.micro_batch_size}: jobgen passes "
                    "trainer.micro_batch_size to the data module (the global batch is computed from it); "
                    "remove data.init_args.batch_size and set trainer.micro_batch_size", batch)
        else:
            for key in ("max_epochs", "gradient_accumulation_schedule"):
                if getattr(t, key) is not None:
                    raise field_error(TrainingSpec, ("trainer", key),
                        f"{key} needs data.class_path (your LightningDataModule): jobgen's data formats have no "
                        "epochs of their own; use trainer.max_steps / gradient_accumulation_steps", getattr(t, key))
        if isinstance(m, ClassSpec):
            if t.compile is True:
                raise field_error(TrainingSpec, ("trainer", "compile"),
                    "trainer.compile compiles jobgen's built-in networks; with model.class_path call torch.compile "
                    "inside your LightningModule (e.g. in configure_model) and remove trainer.compile", True)
            if t.strategy == "fsdp" and t.activation_checkpointing and t.fsdp_activation_checkpointing_policy is None:
                raise field_error(TrainingSpec, ("trainer", "activation_checkpointing"),
                    "with model.class_path, name the classes to recompute in trainer.fsdp_activation_checkpointing_policy "
                    "(the default policy is jobgen's GPT Block)", True)
            return self
        if m.is_hf and d.format == "text":
            raise ValueError(
                "model.hf_path with data.format 'text': raw bytes are the built-in GPT's tokens, not the "
                "Hugging Face model's; use data.format 'jsonl' (with its tokenizer) or 'tokens' (files "
                "encoded with the model's tokenizer)"
            )
        if d.format == "jsonl" and d.tokenizer_path is None and not m.is_hf:
            raise ValueError("data.format 'jsonl' needs data.tokenizer_path (or model.hf_path to use its tokenizer)")
        return self
