"""The user's own classes named by a spec (``model.class_path``, ``data.class_path``, the FSDP
policies): import them, check their base class, bind ``init_args`` to their signatures and
instantiate them, with jsonargparse (what LightningCLI uses), so nested ``{class_path,
init_args}`` values and type checks behave as they do under LightningCLI.

Two callers: ``jobgen validate --import`` / ``jobgen submit`` (:func:`check_user_code`, before
anything is queued) and the entrypoint on every rank (:func:`instantiate_user_code`). Rendering
never comes here: torch, Lightning, jsonargparse and the user's modules are imported inside the
functions only (tests/unit/test_render_imports.py guards the render path).

Every problem is a :class:`~jobgen.errors.ConfigError` (exit 2) located at the spec field
(``<where>model.init_args.lr``) with a hint: a missing module, a missing class (did-you-mean), a
wrong base class, an unknown init argument (did-you-mean), a value of the wrong type (the type
expected), a missing required argument.
"""

from __future__ import annotations

import importlib
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobgen.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from jobgen.specs.training import ClassSpec, TrainingSpec

#: The key the class's arguments live under in the jsonargparse parser.
_KEY = "init_args"


@dataclass(frozen=True)
class BoundClass:
    """A class with ``init_args`` bound to its signature (checked, not yet instantiated).

    Attributes:
        cls: the imported class.
        parameters: the argument names its ``__init__`` takes (as jsonargparse resolves them,
            ``**kwargs`` passed on to a parent class included).
        init_args: the arguments it will get: the spec's, plus ``batch_size`` when jobgen
            passes ``trainer.micro_batch_size``.
        batch_size_from_jobgen: whether ``batch_size`` was added by jobgen.
    """

    cls: type
    parameters: tuple[str, ...]
    init_args: dict[str, Any]
    batch_size_from_jobgen: bool
    _parser: Any
    _config: Any

    def instantiate(self) -> Any:
        """Build the object through jsonargparse (nested ``class_path`` values included)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # jsonargparse's deprecation notices (instantiate_classes)
            make = getattr(self._parser, "instantiate", None) or self._parser.instantiate_classes
            return make(self._config)[_KEY]


def import_class(class_path: str, location: str) -> type:
    """Import ``pkg.module.Class`` (the longest importable module prefix, then attributes).

    Raises:
        ConfigError: the module is missing (or one it imports), importing it raised, it has no
            such attribute (with did-you-mean), or the attribute is not a class.
    """
    parts = class_path.split(".")
    module = None
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing and (name == missing or name.startswith(missing + ".")):
                continue  # this prefix is not a module: try a shorter one
            raise ConfigError(
                f"importing {name!r} for {class_path!r} failed: {exc} (a module it imports is missing)",
                location=location,
                hint=f"install {missing.split('.')[0]!r} in this environment (and on the nodes)",
            ) from None
        except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
            raise ConfigError(
                f"importing {name!r} for {class_path!r} raised {type(exc).__name__}: {exc}",
                location=location,
                hint=f"fix the module: python -c 'import {name}' shows the traceback",
            ) from None
        remaining = parts[cut:]
        break
    if module is None:
        raise ConfigError(
            f"cannot import {class_path!r}: no module named {parts[0]!r}",
            location=location,
            hint="install the package that holds it (pip install -e <dir>) or put its parent directory on "
                 "PYTHONPATH, in this environment and on the nodes",
        )
    obj: Any = module
    for i, attr in enumerate(remaining):
        if not hasattr(obj, attr):
            owner = ".".join(parts[: len(parts) - len(remaining) + i])
            names = [n for n in dir(obj) if not n.startswith("_")]
            suggestion = did_you_mean(attr, names)
            own = sorted(n for n in names if isinstance(getattr(obj, n, None), type)
                         and getattr(getattr(obj, n), "__module__", "").startswith(owner))
            raise ConfigError(
                f"{owner!r} has no attribute {attr!r}" + (f" ({suggestion})" if suggestion else ""),
                location=location,
                hint=f"check the class name in {class_path!r}" + (f"; classes there: {', '.join(own[:12])}" if own else ""),
            )
        obj = getattr(obj, attr)
    if not isinstance(obj, type):
        raise ConfigError(f"{class_path!r} is a {type(obj).__name__}, not a class", location=location,
                          hint="class_path names a class (its __init__ takes init_args)")
    return obj


def check_base(cls: type, base: type, class_path: str, location: str, base_name: str) -> None:
    """Refuse a class that does not subclass ``base`` (called ``base_name`` in the message).

    Raises:
        ConfigError: it does not.
    """
    if not issubclass(cls, base):
        bases = ", ".join(f"{b.__module__}.{b.__qualname__}" for b in cls.__bases__ if b is not object) or "object"
        raise ConfigError(
            f"{class_path} is not a {base_name} subclass (its bases: {bases})",
            location=location,
            hint=f"subclass {base_name}"
                 + (" (lightning.pytorch and pytorch_lightning are different packages: use lightning.pytorch)"
                    if any(b.__module__.startswith("pytorch_lightning") for b in cls.__mro__) else ""),
        )


def _parser(cls: type) -> tuple[Any, tuple[str, ...]]:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parser.add_class_arguments(cls, _KEY, fail_untyped=False)
    prefix = _KEY + "."
    names = {a.dest[len(prefix):].split(".")[0] for a in parser._actions if a.dest.startswith(prefix)}
    return parser, tuple(sorted(names))


_TYPE_ERROR_RE = re.compile(r'Parser key "' + _KEY + r'\.([^"]+)":\s*(.*)', re.S)
_REQUIRED_RE = re.compile(r'Key "' + _KEY + r'\.([^"]+)" is required|arguments are required: ' + _KEY + r'\.([A-Za-z_0-9]+)')


def bind(spec: ClassSpec, base: type, base_name: str, where: str, field: str, *, batch_size: int | None = None) -> BoundClass:
    """Import ``spec.class_path``, check it subclasses ``base`` and bind ``spec.init_args`` to its
    ``__init__`` (types checked by jsonargparse). With ``batch_size``, a class whose ``__init__``
    takes ``batch_size`` gets it (unless ``init_args`` has it: the spec checked they agree).

    Args:
        spec: the class and its arguments.
        base: the class it must subclass (LightningModule, LightningDataModule).
        base_name: how the message names ``base`` (its public import path).
        where: prefix of every location (``"spec.yaml: "`` or ``"spec."``).
        field: the spec field (``"model"`` or ``"data"``).
        batch_size: ``trainer.micro_batch_size`` for a data module, else None.

    Raises:
        ConfigError: see :func:`import_class`, :func:`check_base`; an unknown argument
            (did-you-mean), a wrong type (the type expected), a missing required argument.
    """
    cls = import_class(spec.class_path, f"{where}{field}.class_path")
    check_base(cls, base, spec.class_path, f"{where}{field}.class_path", base_name)
    parser, names = _parser(cls)
    for key in spec.init_args:
        if key not in names:
            suggestion = did_you_mean(key, names)
            raise ConfigError(
                f"{spec.class_path} takes no argument {key!r}" + (f" ({suggestion})" if suggestion else ""),
                location=f"{where}{field}.init_args.{key}",
                hint=f"its arguments: {', '.join(names) or '(none)'}",
            )
    init_args = dict(spec.init_args)
    added = batch_size is not None and "batch_size" in names and "batch_size" not in init_args
    if added:
        init_args["batch_size"] = batch_size
    from jsonargparse import ArgumentError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = parser.parse_object({_KEY: init_args})
    except ArgumentError as exc:
        text = str(exc)
        if (m := _TYPE_ERROR_RE.search(text)) is not None:
            key, detail = m.group(1), " ".join(m.group(2).split())
            raise ConfigError(
                f"{spec.class_path} argument {key!r}: {detail}",
                location=f"{where}{field}.init_args.{key}",
                hint=f"give {key} a value of the type {spec.class_path}.__init__ declares",
            ) from None
        if (m := _REQUIRED_RE.search(text)) is not None:
            key = m.group(1) or m.group(2)
            raise ConfigError(
                f"{spec.class_path} needs the argument {key!r} (it has no default)",
                location=f"{where}{field}.init_args",
                hint=f"add {key}: <value> under {field}.init_args",
            ) from None
        raise ConfigError(f"{spec.class_path}: init_args do not fit its signature: {' '.join(text.split())}",
                          location=f"{where}{field}.init_args", hint=f"its arguments: {', '.join(names) or '(none)'}") from None
    return BoundClass(cls, names, init_args, added, parser, config)


def policy_classes(paths: tuple[str, ...], where: str, field: str) -> set[type]:
    """Import the ``torch.nn.Module`` classes an FSDP policy names.

    Raises:
        ConfigError: a class cannot be imported or is not a ``torch.nn.Module``.
    """
    import torch

    classes = set()
    for i, path in enumerate(paths):
        cls = import_class(path, f"{where}trainer.{field}[{i}]")
        check_base(cls, torch.nn.Module, path, f"{where}trainer.{field}[{i}]", "torch.nn.Module")
        classes.add(cls)
    return classes


@dataclass(frozen=True)
class UserCode:
    """The bound classes of a ``class_path`` spec (model, data and the FSDP policies)."""

    model: BoundClass
    data: BoundClass
    auto_wrap: set[type] | None
    checkpointing: set[type] | None

    def notes(self) -> list[str]:
        """What a user should know before running (e.g. a data module without ``batch_size``)."""
        out = []
        if "batch_size" not in self.data.parameters:
            out.append(
                f"{self.data.cls.__module__}.{self.data.cls.__qualname__} takes no batch_size: trainer.micro_batch_size "
                "is not applied, the batch is whatever its loaders give (samples/s is measured from the batches)"
            )
        return out


def bind_user_code(spec: TrainingSpec, where: str) -> UserCode:
    """Import and bind everything a ``class_path`` spec names (imports torch and Lightning).

    Raises:
        ConfigError: see :func:`bind` and :func:`policy_classes`.
    """
    from lightning.pytorch import LightningDataModule, LightningModule

    t = spec.trainer
    model = bind(spec.model, LightningModule, "lightning.pytorch.LightningModule", where, "model")  # type: ignore[arg-type]
    data = bind(spec.data, LightningDataModule, "lightning.pytorch.LightningDataModule", where, "data",  # type: ignore[arg-type]
                batch_size=t.micro_batch_size)
    wrap = None if t.fsdp_auto_wrap_policy is None else policy_classes(t.fsdp_auto_wrap_policy, where, "fsdp_auto_wrap_policy")
    ckpt = (None if t.fsdp_activation_checkpointing_policy is None
            else policy_classes(t.fsdp_activation_checkpointing_policy, where, "fsdp_activation_checkpointing_policy"))
    return UserCode(model, data, wrap, ckpt)


def check_user_code(spec: TrainingSpec, source: str) -> list[str]:
    """``jobgen validate --import`` / ``jobgen submit``: import and bind the spec's classes in
    this environment (nothing is instantiated). Returns notes to show (may be empty); a spec
    without ``class_path`` classes only gets its FSDP policy classes imported.

    Raises:
        ConfigError: located at ``<source>: <field path>``.
    """
    where = f"{source}: "
    if not spec.user_code:
        t = spec.trainer
        for field in ("fsdp_auto_wrap_policy", "fsdp_activation_checkpointing_policy"):
            if getattr(t, field) is not None:
                policy_classes(getattr(t, field), where, field)
        return []
    return bind_user_code(spec, where).notes()
