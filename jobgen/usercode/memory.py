"""The memory plan of a ``model.class_path`` model (``jobgen plan --import``): the user's classes
are imported and bound as ``jobgen validate --import`` does (:mod:`jobgen.usercode.classes`), the model
is built on PyTorch's meta device (parameters with shapes but no storage: nothing is allocated
and no weights are read), and the parameters it has are counted. The generic plan
(:func:`jobgen.planning.memory_plan.plan_memory`, which this module sits on; it does not know this one)
then applies its model-state formulas (ZeRO, Rajbhandari et al. 2020) to that count.

Activations are not estimated: they depend on the model's own forward pass, which jobgen does not
know. Every row's activations column is 0, so the totals are a floor of the peak; a ``--smoke``
run measures the peak (its summary.json has ``peak_memory_bytes``).

Imports torch, Lightning, jsonargparse and the user's modules, inside the functions only: the
render path never comes here (tests/unit/test_render_imports.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from jobgen.errors import ConfigError
from jobgen.planning.estimate import DEEPSPEED_STAGE3_PERSISTENCE_THRESHOLD, Estimate, model_states, with_activations
from jobgen.planning.memory_plan import MemoryPlan, SizedModel
from jobgen.planning.memory_plan import plan_memory as generic_plan_memory
from jobgen.specs.training import TrainingSpec


@dataclass(frozen=True)
class UserShape:
    """A built ``class_path`` model's parameters, in the attribute names the model-state formulas
    of :func:`jobgen.planning.estimate.model_states` read (see :class:`jobgen.planning.estimate.Shape`).

    Attributes:
        class_path: the model's class (``model.class_path``).
        n_params: parameters (shared ones once).
        trainable_params: those with ``requires_grad`` (the formulas count every parameter as trained).
        n_layer: FSDP units: the outermost submodules of the ``fsdp_auto_wrap_policy`` classes, or
            1 (the whole model is one unit when the spec names no classes, as jobgen wraps it).
        block_params: the largest unit's parameters.
        root_params: parameters outside the units.
        largest_module_params: the largest module's own parameters (DeepSpeed ZeRO-3's working set,
            torch AdamW's per-tensor temporaries on CPU).
        persistent_params: parameters in tensors below DeepSpeed's
            ``stage3_param_persistence_threshold`` (kept gathered on every rank under ZeRO-3).
        micro_batch_size, accumulation: the spec's (``trainer.micro_batch_size``,
            ``gradient_accumulation_steps``).
    """

    class_path: str
    n_params: int
    trainable_params: int
    n_layer: int
    block_params: int
    root_params: int
    largest_module_params: int
    persistent_params: int
    micro_batch_size: int
    accumulation: int = 1


def build_on_meta(spec: TrainingSpec, spec_source: str) -> tuple[Any, set[type] | None]:
    """Import and bind the spec's classes (:func:`jobgen.usercode.classes.bind_user_code`) and build the
    model on the meta device, its ``configure_model()`` hook included (where Lightning models
    create their layers lazily). Returns the module and the FSDP auto-wrap classes (None: none named).

    Raises:
        ConfigError: an import or binding problem (as ``validate --import``), or building on
            the meta device raised (an ``__init__`` that reads tensor values or loads weights).
    """
    import torch

    from jobgen.usercode.classes import bind_user_code

    code = bind_user_code(spec, f"{spec_source}: ")
    class_path = spec.model.class_path  # type: ignore[union-attr]
    try:
        with torch.device("meta"):
            module = code.model.instantiate()
            module.configure_model()
    except Exception as exc:  # the user's __init__: anything can fail on the meta device
        problem = " ".join(str(exc).split())[:300]
        raise ConfigError(
            f"building {class_path} on PyTorch's meta device (to count its parameters without allocating them) raised "
            f"{type(exc).__name__}: {problem}",
            location=f"{spec_source}: model.class_path",
            hint="a model whose __init__ reads tensor values or loads weights cannot be sized this way; measure it "
                 "instead: jobgen submit SPEC --profile P --smoke 5 (summary.json has peak_memory_bytes)",
        ) from None
    return module, code.auto_wrap


def user_shape(spec: TrainingSpec, module: Any, auto_wrap: set[type] | None) -> UserShape:
    """The :class:`UserShape` of ``module`` (built by :func:`build_on_meta`) at the spec's batch."""

    def count(m: Any, recurse: bool = True) -> int:
        return sum(p.numel() for p in m.parameters(recurse=recurse))

    units: list[Any] = []

    def outermost(m: Any) -> None:
        for child in m.children():
            if auto_wrap and isinstance(child, tuple(auto_wrap)):
                units.append(child)
            else:
                outermost(child)

    if auto_wrap and not isinstance(module, tuple(auto_wrap)):
        outermost(module)
    units = units or [module]
    n_params = count(module)
    in_units = sum(count(u) for u in units)
    t = spec.trainer
    return UserShape(
        class_path=spec.model.class_path,  # type: ignore[union-attr]
        n_params=n_params,
        trainable_params=sum(p.numel() for p in module.parameters() if p.requires_grad),
        n_layer=len(units),
        block_params=max(count(u) for u in units),
        root_params=max(0, n_params - in_units),
        largest_module_params=max((count(m, recurse=False) for m in module.modules()), default=0),
        persistent_params=sum(p.numel() for p in module.parameters() if p.numel() < DEEPSPEED_STAGE3_PERSISTENCE_THRESHOLD),
        micro_batch_size=int(t.micro_batch_size),
        accumulation=t.gradient_accumulation_steps,
    )


def states_only(shape: Any, precision: str, layout: Any, *, num_nodes: int, devices_per_node: int, accelerator: str,
                checkpointing: bool) -> Estimate:
    """:func:`jobgen.planning.estimate.model_states` with no activations (the ``size`` the generic plan calls)."""
    return with_activations(model_states(shape, precision, layout, num_nodes=num_nodes, devices_per_node=devices_per_node,
                                         accelerator=accelerator), 0)


def plan_memory(spec: TrainingSpec, profile: Any, num_nodes: int, devices_per_node: int, *,
                spec_source: str = "spec") -> MemoryPlan:
    """The memory plan of a ``model.class_path`` spec on ``profile``: every layout's parameters,
    gradients, optimizer states and overhead for the model as built (:func:`build_on_meta`,
    :func:`user_shape`); activations 0 (see the module doc). :attr:`MemoryPlan.user` holds what
    the build told: ``class_path``, ``n_params``, ``trainable_params``, ``fsdp_units``,
    ``largest_unit_params``.

    Raises:
        ConfigError: see :func:`build_on_meta`.
    """
    shape = user_shape(spec, *build_on_meta(spec, spec_source))
    frozen = shape.n_params - shape.trainable_params
    units = ("the whole model is one FSDP unit (no trainer.fsdp_auto_wrap_policy)" if shape.root_params == 0 and shape.n_layer == 1
             else f"{shape.n_layer} FSDP unit(s) of trainer.fsdp_auto_wrap_policy, the largest "
                  f"{shape.block_params / 1e6:,.2f}M parameters")
    lines = (
        f"model: {shape.class_path} built on PyTorch's meta device: {shape.n_params / 1e6:,.2f}M parameters"
        + (f", {frozen / 1e6:,.2f}M of them frozen (counted as trained, as the formulas do)" if frozen else "")
        + f"; {units}",
        "AdamW (what jobgen assumes; the model's configure_optimizers decides); parameters + gradients + optimizer "
        "states + overhead",
        "activations: not estimated (0 in every row): they depend on the model's forward pass, so each total is a "
        "floor of the peak; measure the peak with a --smoke run (its summary.json has peak_memory_bytes)",
    )
    mp = generic_plan_memory(spec, profile, num_nodes, devices_per_node, model=SizedModel(shape, states_only, assumptions=lines),
                             spec_source=spec_source)
    info = {"class_path": shape.class_path, "n_params": shape.n_params, "trainable_params": shape.trainable_params,
            "fsdp_units": shape.n_layer, "largest_unit_params": shape.block_params}
    return replace(mp, user=info)
