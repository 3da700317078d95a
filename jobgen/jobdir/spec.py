"""``spec.json`` (:class:`ResolvedSpec`: the training spec plus the launch facts, read by the
entrypoint on every node) and a job array's ``array.json`` (:class:`ArrayIndex`). Part of the job
directory's contract (:mod:`jobgen.jobdir`)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from jobgen.errors import ConfigError, json_path
from jobgen.jobdir.files import ARRAY_INDEX_FILE, SPEC_FILE, point_file, pretty_json
from jobgen.jobdir.world import World
from jobgen.specs.profile import SshSettings
from jobgen.specs.training import TrainingSpec

# --------------------------------------------------------------------------- spec.json


class LaunchSpec(BaseModel):
    """Where and how the job runs, as decided by the planner."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduler: Literal["local", "slurm", "kubernetes", "ssh"] = Field(description="Which backend launches the job.")
    accelerator: Literal["cpu", "gpu"] = Field(description="Device type of every rank.")
    num_nodes: int = Field(ge=1, description="Nodes (SLURM nodes, Kubernetes pods, 1 for local).")
    devices_per_node: int = Field(ge=1, description="Processes (GPUs) per node.")
    world_size: int = Field(ge=1, description="Total processes = num_nodes x devices_per_node.")
    deepspeed_config: str | None = Field(
        default=None, description="DeepSpeed JSON config, relative to the spec file's directory (DeepSpeed strategies only).")
    requeue_signal: str | None = Field(
        default=None, description="SLURM: the signal (name without ``SIG``) that asks the job to checkpoint and requeue.")
    gpu_type: str | None = Field(default=None, description="GPU model (decides bf16/fp8 support on the node).")
    cluster: str | None = Field(default=None, description="SLURM cluster name from the profile (used in job handles).")
    gpu_hour_price: float | None = Field(default=None, ge=0, description=(
        "The profile's price of one GPU-hour (cost = GPU-hours x price); left out of the file when unset."))
    min_nodes: int | None = Field(default=None, ge=1, description=(
        "Elastic jobs only: the fewest nodes torchrun may train on (``num_nodes`` is then the most, and\n"
        "``world_size`` the world at that maximum); the entrypoint reads the real count from torchrun."))
    preflight: bool = Field(default=False, description=(
        "Run the all-reduce preflight (jobgen.train.preflight) before training (profile ``preflight``\n"
        "or ``jobgen submit --preflight``)."
    ))
    preflight_timeout_s: int = Field(default=60, ge=1, description="Seconds the preflight waits to join, and for its all-reduces.")
    ssh: SshSettings | None = Field(default=None, description=(
        "ssh profiles: the hosts the job runs on (the profile's first ``num_nodes``, in node-rank order) and how\n"
        "jobgen reaches them; what ``jobgen submit`` of the job directory uses. Left out of the file otherwise."))

    @field_validator("requeue_signal")
    @classmethod
    def _known_signal(cls, value: str | None) -> str | None:
        if value is not None and not isinstance(getattr(signal, "SIG" + value, None), signal.Signals):
            raise ValueError(f"unknown signal {value!r}; give a name without 'SIG', e.g. 'USR1' or 'USR2'")
        return value

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # Left out while unset / at their defaults, so jobs without them keep the spec.json (and
        # hashes) they had: the price (profiles without one), min_nodes (fixed-size jobs), the preflight.
        defaults = {"gpu_hour_price": None, "min_nodes": None, "preflight": False, "preflight_timeout_s": 60, "ssh": None}
        return {k: v for k, v in handler(self).items() if not (k in defaults and v == defaults[k])}

    @model_validator(mode="after")
    def _world_size_is_product(self) -> LaunchSpec:
        if self.min_nodes is not None and self.min_nodes > self.num_nodes:
            raise ValueError(f"min_nodes={self.min_nodes} is above num_nodes={self.num_nodes} (the elastic maximum)")
        if self.world_size != self.num_nodes * self.devices_per_node:
            raise ValueError(
                f"world_size={self.world_size} but num_nodes x devices_per_node = "
                f"{self.num_nodes} x {self.devices_per_node} = {self.num_nodes * self.devices_per_node}"
            )
        return self


class ResolvedSpec(BaseModel):
    """The whole ``spec.json``: the training spec plus launch facts. The planner builds and
    writes it (:meth:`dumps`); every reader loads it with :func:`load_resolved_spec`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobgen_version: str = Field(description="Version of jobgen that planned the job (also the file's generated mark).")
    inputs_sha256: str = Field(description="Hash of the planner's inputs (resolved spec, profile, templates).")
    profile: str = Field(description="Cluster profile name.")
    spec: TrainingSpec = Field(description="What to train.")
    launch: LaunchSpec = Field(description="Where it runs.")

    @model_validator(mode="after")
    def _precision_resolved(self) -> ResolvedSpec:
        if self.spec.trainer.precision == "auto":
            raise ValueError("spec.trainer.precision is 'auto': the planner resolves it from the profile before writing spec.json")
        return self

    def dumps(self) -> str:
        """The file's text: deterministic JSON (field order, 2-space indent, final newline)."""
        return pretty_json(self)

    @property
    def world(self) -> World:
        """The launch's :class:`World` with the spec's batch arithmetic (world size, global
        batch). CPUs per rank and the time limit are not recorded in spec.json (the scheduler
        enforces them), so those two keep World's defaults here."""
        t = self.spec.trainer
        return World(num_nodes=self.launch.num_nodes, devices_per_node=self.launch.devices_per_node,
                     accelerator=self.launch.accelerator, micro_batch_size=t.micro_batch_size,
                     gradient_accumulation_steps=t.gradient_accumulation_steps, min_nodes=self.launch.min_nodes)


def load_resolved_spec(path: Path) -> ResolvedSpec:
    """Read and validate a ``spec.json``.

    Raises:
        ConfigError: missing/unreadable file, invalid JSON, a key this jobgen does not know
            (a file from another version, or hand-edited), or a field that fails validation;
            the location names the file and the JSON path.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the resolved spec: {exc.strerror or exc}",
            location=str(path),
            hint=f"pass the {SPEC_FILE} that `jobgen render` wrote into the job directory",
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", location=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"expected a JSON object with 'spec' and 'launch', got {type(raw).__name__}", location=str(path))
    try:
        return ResolvedSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more error(s))" if exc.error_count() > 1 else ""
        version = raw.get("jobgen_version")
        from jobgen import __version__

        other = f" (written by jobgen {version}; this is {__version__})" if version != __version__ else ""
        raise ConfigError(
            f"{first['msg']}{more}{other}",
            location=f"{path}: {json_path(first['loc'])}",
            hint="re-render the job directory with this jobgen (`jobgen render SPEC --profile P`)",
        ) from None


# --------------------------------------------------------------------------- job arrays


class ArrayPoint(BaseModel):
    """One task of a job array: its index (``$SLURM_ARRAY_TASK_ID``), its job name (the sweep
    point's name, also its run directory's name) and the overrides that make its spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="The array task id that trains this point.")
    name: str = Field(description="The point's job name (``<base>-<key><value>-...``); its run directory is ``<runs dir>/<name>``.")
    overrides: dict[str, str] = Field(description="The sweep point: key path -> value (as given to --sweep), in axis order.")


class ArrayIndex(BaseModel):
    """``array.json``: the index of a job array's points, written by the planner; read by
    ``jobgen submit`` (task names and run directories), status, logs and ``ls``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobgen_version: str = Field(description="Version of jobgen that planned the array (also the file's generated mark).")
    inputs_sha256: str = Field(description="Hash of the planner's inputs (every point's spec, the profile, the template).")
    profile: str = Field(description="Cluster profile name.")
    name: str = Field(description="The sweep's base name: the job directory's and the SLURM job's name.")
    parallelism: int | None = Field(default=None, description="At most this many tasks at once (``%P``); None: no limit.")
    points: tuple[ArrayPoint, ...] = Field(min_length=1, description="Every task, by index 0..N-1.")

    @model_validator(mode="after")
    def _indexed(self) -> ArrayIndex:
        if [p.index for p in self.points] != list(range(len(self.points))):
            raise ValueError("points must be indexed 0..N-1 in order")
        return self

    def dumps(self) -> str:
        """The file's text: deterministic JSON (field order, 2-space indent, final newline)."""
        return pretty_json(self)

    def point(self, index: int) -> ArrayPoint:
        """Point ``index``.

        Raises:
            ConfigError: the array has no such task.
        """
        if not 0 <= index < len(self.points):
            raise ConfigError(f"array {self.name!r} has tasks 0-{len(self.points) - 1}, not {index}",
                              hint=f"pick a task index between 0 and {len(self.points) - 1}")
        return self.points[index]


def read_array_index(job_dir: Path) -> ArrayIndex | None:
    """The :class:`ArrayIndex` of a job array's directory, or None when ``job_dir`` is not an array.

    Raises:
        ConfigError: ``array.json`` exists but is unreadable or invalid.
    """
    path = job_dir / ARRAY_INDEX_FILE
    if not path.is_file():
        return None
    try:
        return ArrayIndex.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a jobgen array index ({exc})",
                          hint="re-render the job directory with this jobgen (`jobgen render SPEC --profile P --sweep ...`)") from None


def read_resolved_spec(job_dir: Path) -> ResolvedSpec:
    """The :class:`ResolvedSpec` of a rendered job directory. For a job array, point 0's: the
    planner checks that every point has the same launch facts (scheduler, cluster, world,
    secrets), which is what callers of this function read.

    Raises:
        ConfigError: ``job_dir`` has no ``spec.json``, or it is invalid (see :func:`load_resolved_spec`).
    """
    path = job_dir / SPEC_FILE
    if not path.is_file() and (job_dir / ARRAY_INDEX_FILE).is_file():
        path = job_dir / point_file(0, SPEC_FILE)
    if not path.is_file():
        raise ConfigError(
            f"{job_dir} is not a jobgen job directory: it has no {SPEC_FILE}",
            hint="render one first: jobgen render SPEC --profile P (files go to manifests/<profile>/<job name>/)",
        )
    return load_resolved_spec(path)
