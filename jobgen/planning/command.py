"""Command mode: the user's own training script under jobgen's launch contracts.

A spec with ``entrypoint`` (:class:`jobgen.specs.training.EntrypointSpec`) runs ``python -m MODULE`` or
``python SCRIPT`` plus its ``args`` on every rank instead of ``python -m jobgen.train``; the
backends put the launcher in front (srun on SLURM, torchrun in each pod on Kubernetes,
``torchrun --standalone`` locally). This module decides what the launchers need:

- :func:`target_argv`: the part after the interpreter (``-m pkg.train`` or ``train.py``, the
  args, and for a LightningCLI script the ``--trainer.*`` arguments of :func:`trainer_args`).
- :func:`check_trainer_args`: plan-time rule (pure): ``--trainer.*`` values in ``args`` must
  agree with the world jobgen launches.
- :func:`check_entrypoint_exists` and :func:`check_config_files`: ``jobgen validate`` only
  (they read files): the script exists / the module is importable (``importlib.util.find_spec``,
  nothing is imported), and a ``--config`` YAML's ``trainer:`` section agrees with the world.

Where the ranks run (decided here, documented in docs/own-code.md, "Command mode"): in the directory
``jobgen submit`` runs in (local and SLURM; :data:`jobgen.planning.plan.SUBMIT_DIR_PLACEHOLDER` in a plan),
or the image's working directory on Kubernetes. A relative ``script`` and relative paths in
``args`` resolve there.

Everything raises :class:`jobgen.errors.PlanError` (exit 2) with file + field path + hint.
Torch-free and cheap to import.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen.errors import PlanError

if TYPE_CHECKING:
    from jobgen.jobdir.world import World
    from jobgen.specs.training import TrainingSpec

#: The environment variable Lightning's DeepSpeedStrategy reads its config path from when it
#: is given no ``config`` (lightning/pytorch/strategies/deepspeed.py ``DEEPSPEED_ENV_VAR``).
DEEPSPEED_CONFIG_ENV = "PL_DEEPSPEED_CONFIG_PATH"
#: Where ``jobgen submit`` tells a SLURM job the directory it ran in (the ranks' working directory).
WORKDIR_ENV = "JOBGEN_WORKDIR"
#: The job's run directory (absolute), for the user's outputs: job.sbatch exports it on SLURM;
#: local runs and Kubernetes pods get it in command mode.
RUN_DIR_ENV = "RUN_DIR"

#: The ``--trainer.*`` keys jobgen appends for a LightningCLI script (in this order).
TRAINER_KEYS = ("num_nodes", "devices", "accelerator", "strategy", "precision")
#: Lightning's short precision names -> the names jobgen resolves to (Lightning 2.x
#: ``_PRECISION_INPUT``: 32 / "32" mean "32-true", 16 / "16" mean "16-mixed", "bf16" "bf16-mixed").
_PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}
#: Config flags of LightningCLI (jsonargparse ActionConfigFile).
_CONFIG_FLAGS = ("--config", "-c")


def command_mode(spec: TrainingSpec) -> bool:
    """True when ``spec`` runs the user's entrypoint (``entrypoint`` set)."""
    return spec.entrypoint is not None


def trainer_values(spec: TrainingSpec, world: World) -> dict[str, str]:
    """What the world says for each of :data:`TRAINER_KEYS`, as LightningCLI arguments take it.

    The strategy names are Lightning's registry names (``ddp``, ``fsdp``, ``deepspeed_stage_N``,
    the same as jobgen's); the precision is the resolved one (never ``auto``).
    """
    return {
        "num_nodes": str(world.num_nodes),
        "devices": str(world.devices_per_node),
        "accelerator": world.accelerator,
        "strategy": spec.trainer.strategy,
        "precision": spec.trainer.precision,
    }


def trainer_args(spec: TrainingSpec, world: World) -> list[str]:
    """``--trainer.num_nodes=N --trainer.devices=D --trainer.accelerator=A --trainer.strategy=S
    --trainer.precision=P`` for a LightningCLI script (appended after the user's args, so they
    win over a ``--config`` file; :func:`check_config_files` refuses one that disagrees)."""
    return [f"--trainer.{key}={value}" for key, value in trainer_values(spec, world).items()]


def target_argv(spec: TrainingSpec, world: World) -> list[str]:
    """What follows the interpreter (or torchrun's options): ``-m MODULE`` or ``SCRIPT``, then
    ``args``, then for a LightningCLI script :func:`trainer_args`."""
    e = spec.entrypoint
    assert e is not None, "target_argv is for command mode (entrypoint set)"
    target = ["-m", e.module] if e.module is not None else [e.script or ""]
    return [*target, *e.args, *(trainer_args(spec, world) if e.lightning_cli else [])]


def _normalise(key: str, value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if key == "precision":
        return _PRECISION_ALIASES.get(text, text)
    return text


def _mismatch(key: str, value: Any, want: str) -> bool:
    """True when a user's ``trainer.<key>`` value contradicts ``want`` (``auto`` agrees with anything)."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return False
    return _normalise(key, value) != want


def _hint_for(key: str) -> str:
    return {
        "num_nodes": "resources.nodes",
        "devices": "resources.devices_per_node",
        "accelerator": "the profile (GPU profiles run on gpu, the rest on cpu)",
        "strategy": "trainer.strategy",
        "precision": "trainer.precision",
    }[key]


def trainer_args_in(args: tuple[str, ...] | list[str]) -> list[tuple[int, str, str]]:
    """``(index, key, value)`` for every ``--trainer.<key>=V`` / ``--trainer.<key> V`` in ``args``
    whose key is one of :data:`TRAINER_KEYS`."""
    found = []
    for i, arg in enumerate(args):
        for key in TRAINER_KEYS:
            flag = f"--trainer.{key}"
            if arg.startswith(flag + "="):
                found.append((i, key, arg[len(flag) + 1:]))
            elif arg == flag and i + 1 < len(args):
                found.append((i, key, args[i + 1]))
    return found


def check_trainer_args(spec: TrainingSpec, world: World, spec_source: str = "<spec>") -> None:
    """Plan-time rule for a LightningCLI entrypoint: a ``--trainer.<key>`` in ``entrypoint.args``
    must agree with the world (jobgen appends its own values after the user's, which would win
    silently otherwise).

    Raises:
        PlanError: naming the argument, the world's value and the spec field to change.
    """
    e = spec.entrypoint
    if e is None or not e.lightning_cli:
        return
    want = trainer_values(spec, world)
    for i, key, value in trainer_args_in(e.args):
        if _mismatch(key, value, want[key]):
            raise PlanError(
                f"You set `--trainer.{key}={value}` in entrypoint.args, but the job runs {world.describe()} with "
                f"trainer.{key}={want[key]}; jobgen appends `--trainer.{key}={want[key]}` to a LightningCLI script.",
                location=f"{spec_source}: entrypoint.args[{i}]",
                hint=f"Remove it from entrypoint.args; set {_hint_for(key)} in the spec instead.",
            )


def check_entrypoint_exists(spec: TrainingSpec, work_dir: Path, spec_source: str = "<spec>") -> str:
    """``jobgen validate``: the script exists under ``work_dir`` (the directory ``jobgen submit``
    will run in), or the module is importable with ``work_dir`` first on ``sys.path`` (as
    ``python -m`` puts the working directory first). Nothing is imported: the module is only
    located (``importlib.util.find_spec``; a dotted name imports its parent packages' ``__init__``).
    Returns a line saying what was found.

    Raises:
        PlanError: the script is not a file, or the module is not found.
    """
    e = spec.entrypoint
    assert e is not None
    if e.script is not None:
        path = work_dir / e.script
        if not path.is_file():
            raise PlanError(
                f"entrypoint.script {e.script!r} does not exist: no file {path}.",
                location=f"{spec_source}: entrypoint.script",
                hint="Give the path relative to the directory you run `jobgen submit` in (or an absolute path), "
                "and run jobgen validate there.",
            )
        return f"script {path}"
    module = e.module or ""
    saved = list(sys.path)
    sys.path.insert(0, str(work_dir))
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path[:] = saved
    if found is None:
        raise PlanError(
            f"entrypoint.module {module!r} is not importable from {work_dir} with {sys.executable}.",
            location=f"{spec_source}: entrypoint.module",
            hint="Install your package into this environment (pip install -e .) or run jobgen validate in the directory "
            "that holds it; the nodes need it too.",
        )
    return f"module {module} ({found.origin})"


def config_files(args: tuple[str, ...] | list[str]) -> list[tuple[int, str]]:
    """``(index, path)`` of each ``--config FILE`` / ``--config=FILE`` / ``-c FILE`` in ``args``."""
    found = []
    for i, arg in enumerate(args):
        if arg in _CONFIG_FLAGS and i + 1 < len(args):
            found.append((i + 1, args[i + 1]))
        elif arg.startswith("--config="):
            found.append((i, arg.removeprefix("--config=")))
    return found


def check_config_files(spec: TrainingSpec, world: World, work_dir: Path, spec_source: str = "<spec>") -> list[str]:
    """``jobgen validate`` for a LightningCLI entrypoint: every ``--config`` YAML in ``args``
    (relative to ``work_dir``) whose ``trainer:`` section sets one of :data:`TRAINER_KEYS` must
    agree with the world (``auto`` agrees with anything). A ``trainer.strategy`` given as a class
    (``class_path``/``init_args``) is refused: jobgen's ``--trainer.strategy=<name>`` replaces it.
    Returns the files checked.

    Raises:
        PlanError: the file is missing or not YAML, or a value contradicts the world (file +
            field path + hint).
    """
    import yaml

    e = spec.entrypoint
    if e is None or not e.lightning_cli:
        return []
    want = trainer_values(spec, world)
    checked = []
    for i, name in config_files(e.args):
        path = work_dir / name
        where = f"{spec_source}: entrypoint.args[{i}]"
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise PlanError(f"cannot read the LightningCLI config {path}: {exc.strerror or exc}", location=where,
                            hint="Give the path relative to the directory you run `jobgen submit` in.") from None
        except yaml.YAMLError as exc:
            raise PlanError(f"the LightningCLI config {path} is not valid YAML: {exc}", location=where) from None
        checked.append(str(path))
        trainer = doc.get("trainer") if isinstance(doc, dict) else None
        if not isinstance(trainer, dict):
            continue
        for key in TRAINER_KEYS:
            if key not in trainer:
                continue
            value = trainer[key]
            if key == "strategy" and isinstance(value, dict):
                raise PlanError(
                    f"{path} sets trainer.strategy to a class ({value.get('class_path', '?')}), but jobgen passes "
                    f"`--trainer.strategy={want[key]}`, which replaces it and its init_args.",
                    location=f"{path}: trainer.strategy",
                    hint="Remove trainer.strategy from the config; choose the strategy with the spec's trainer.strategy "
                    "(DeepSpeed settings come from the rendered ds_config.json through PL_DEEPSPEED_CONFIG_PATH).",
                )
            if _mismatch(key, value, want[key]):
                raise PlanError(
                    f"{path} sets trainer.{key}: {value}, but the job runs {world.describe()} with "
                    f"trainer.{key}={want[key]} (jobgen appends `--trainer.{key}={want[key]}`).",
                    location=f"{path}: trainer.{key}",
                    hint=f"Remove trainer.{key} from the config (jobgen sets it), or change {_hint_for(key)} in the spec "
                    f"({spec_source}).",
                )
    return checked
