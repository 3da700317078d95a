"""``jobgen validate``: a spec checked (and, with a profile, planned) without writing anything; and
the ``--import`` check of the spec's own classes that ``submit`` and ``plan --import`` share."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from jobgen import api
from jobgen.cli.options import crds_dir_option, profiles_dir_option, set_option, templates_dir_option
from jobgen.cli.output import output_option, warn_plan
from jobgen.planning.plan import JobPlan
from jobgen.specs.capabilities import capabilities
from jobgen.specs.load import load_profile, load_spec
from jobgen.specs.training import TrainingSpec


def put_user_code_first(spec: str, loaded: TrainingSpec) -> None:
    """Put the directory the spec's code imports from (the working tree's copy of what the
    snapshot puts first on the ranks' PYTHONPATH) first on sys.path, before importing it here."""
    from jobgen.usercode.snapshot import local_import_dir

    first = local_import_dir(loaded, Path(spec))
    if first is not None and str(first) not in sys.path:
        sys.path.insert(0, str(first))


def check_imports(spec: str, loaded: TrainingSpec, *, shown: set[str] | None = None, source: str | None = None) -> list[str]:
    """Import the class_path classes of ``loaded`` (the spec file ``spec``, already loaded) here
    and bind their init_args (``validate --import``); prints the notes (those not in ``shown``,
    which collects them: a sweep checks each point) and returns them. ``source``: where errors
    point (default ``spec``). Imports torch and Lightning (and the user's modules)."""
    from jobgen.usercode.classes import check_user_code

    put_user_code_first(spec, loaded)
    notes = check_user_code(loaded, source or spec)
    for note in notes:
        if shown is None or note not in shown:
            click.echo(f"note: {note}", err=True)
    if shown is not None:
        shown.update(notes)
    return notes


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--profile", "-p", default=None, help="Also check the spec against this profile (devices, nodes, batch, precision).")
@click.option("--import", "import_check", is_flag=True,
              help="Import the spec's class_path classes in this environment: base classes (LightningModule / "
                   "LightningDataModule), init_args against their signatures (names and types), FSDP policy classes.")
@output_option()
@set_option
@profiles_dir_option
@templates_dir_option
@crds_dir_option
def validate(spec: str, profile: str | None, import_check: bool, output: str, overrides: tuple[str, ...],
             profiles_dir: str | None, templates_dir: str | None) -> None:
    """Check SPEC (and, with --profile, that it fits the cluster) without writing anything.

    \b
    Example:
      jobgen validate examples/quickstart.yaml --profile slurm-h100
      jobgen validate examples/quickstart.yaml -p local -o json
      jobgen validate examples/usercode.yaml -p local --import   # imports tinychar (PYTHONPATH)
    """
    loaded = load_spec(spec, overrides)
    if loaded.user_code:
        model_name: str = loaded.model.class_path
        n_params = None
    else:
        model_name = loaded.model.hf_path if loaded.model.hf_path is not None else "gpt"
        n_params = None if loaded.model.hf_path is not None else loaded.model.n_params
    doc: dict[str, Any] = {"spec": spec, "name": loaded.name, "strategy": loaded.trainer.strategy,
                           "precision": loaded.trainer.precision, "model": model_name, "n_params": n_params}
    if loaded.user_code:
        doc["data"] = loaded.data.class_path
    if loaded.entrypoint is not None:
        doc |= {"model": None, "n_params": None, "entrypoint": loaded.entrypoint.model_dump()}
    job_plan = None
    checked: list[str] = []
    if profile is not None:
        # the spec loaded above, planned (not read again); the plan hands its resolved spec over
        job_plan = api.plan_loaded(loaded, load_profile(profile, profiles_dir), spec, profile_source=profile, templates=templates_dir)
        warn_plan(job_plan)
        w = job_plan.world
        resolved = job_plan.resolved if job_plan.resolved is not None else read_plan_spec(job_plan)
        # command mode: the batch reaches the script only through ds_config.json (DeepSpeed)
        batch_used = loaded.entrypoint is None or resolved.spec.trainer.deepspeed_stage is not None
        doc |= {"profile": job_plan.profile, "precision": resolved.spec.trainer.precision,
                "num_nodes": w.num_nodes, "devices_per_node": w.devices_per_node, "world_size": w.world_size,
                "global_batch_size": w.global_batch_size if batch_used else None, "warnings": list(job_plan.warnings)}
        if w.elastic:  # num_nodes / world_size are then the values at the maximum; global_batch_size is kept at every one
            doc["min_nodes"] = w.min_nodes
        if loaded.entrypoint is not None:
            checked = _check_command(resolved.spec, job_plan, spec)
            doc["checked"] = checked
    else:
        from jobgen.planning.environment import check_env_credentials

        check_env_credentials(loaded.env, source=spec, origin="spec")  # the rule needs no profile
        if loaded.entrypoint is not None:
            checked = _check_command(loaded, None, spec)
            doc["checked"] = checked
    if import_check:
        doc["import_notes"] = check_imports(spec, loaded)
    if output == "json":
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    if loaded.entrypoint is not None:
        model = "command mode: " + ", ".join(checked)
    elif loaded.user_code:
        model = f"model {loaded.model.class_path}, data {loaded.data.class_path}"
    elif loaded.model.hf_path is not None:
        model = f"Hugging Face model {loaded.model.hf_path}"
    else:
        model = f"model {loaded.model.n_params / 1e6:.1f}M parameters"
    click.echo(f"{spec}: valid spec {loaded.name!r} ({model}, "
               f"strategy {loaded.trainer.strategy}, precision {loaded.trainer.precision})")
    if import_check and loaded.user_code:
        click.echo(f"imported {loaded.model.class_path} and {loaded.data.class_path} here; their init_args fit their signatures")
    if job_plan is not None:
        click.echo(_fit_line(job_plan, doc["precision"], batch_used=doc["global_batch_size"] is not None))


def _fit_line(job_plan: JobPlan, precision: str, batch_used: bool) -> str:
    """The text line saying the spec fits the plan's profile: the world, the global batch (kept at
    every node count of an elastic range, the accumulation following the world) and
    ``precision``; without ``batch_used`` (command mode without DeepSpeed) the batch is the
    script's own."""
    w = job_plan.world
    if not batch_used:
        return (f"fits profile {job_plan.profile!r}: {w.describe()}, precision {precision}; "
                "batch size: your script's own (command mode passes jobgen's batch settings only to DeepSpeed)")
    if w.elastic:
        most = w.global_batch_size // (w.micro_batch_size * w.fewest_nodes * w.devices_per_node)
        return (f"fits profile {job_plan.profile!r}: {w.describe()}, global batch {w.global_batch_size} sequences "
                f"at every world size (micro {w.micro_batch_size} x world size x accumulation {most} at {w.fewest_nodes} "
                f"node(s) .. {w.gradient_accumulation_steps} at {w.num_nodes}), precision {precision}")
    return (f"fits profile {job_plan.profile!r}: {w.num_nodes} node(s) x {w.devices_per_node} = world size {w.world_size}, "
            f"global batch {w.global_batch_size} sequences "
            f"(micro {w.micro_batch_size} x accumulation {w.gradient_accumulation_steps} x world size {w.world_size}), "
            f"precision {precision}")


def read_plan_spec(job_plan: JobPlan) -> Any:
    """The :class:`~jobgen.jobdir.ResolvedSpec` a plan writes as spec.json."""
    from jobgen.jobdir.files import SPEC_FILE
    from jobgen.jobdir.spec import ResolvedSpec

    return ResolvedSpec.model_validate_json(job_plan.file(SPEC_FILE))


def _check_command(spec: Any, job_plan: JobPlan | None, spec_source: str) -> list[str]:
    """``jobgen validate`` of a command-mode spec, from the working directory (where `jobgen
    submit` will run the ranks): the script exists / the module is importable, and with a
    profile, LightningCLI ``--config`` files agree with the world. Kubernetes runs the script
    from the image, which cannot be looked into here: only said so. Returns what was checked."""
    from jobgen.planning.command import check_config_files, check_entrypoint_exists

    caps = capabilities(job_plan.scheduler) if job_plan is not None else None
    if caps is not None and not caps.entrypoint_on_submit_host:
        return [f"entrypoint not checked: {caps.refusal('entrypoint_on_submit_host').reason}"]
    work_dir = Path.cwd()
    checked = [check_entrypoint_exists(spec, work_dir, spec_source)]
    if job_plan is not None:
        checked += [f"LightningCLI config {path}" for path in check_config_files(spec, job_plan.world, work_dir, spec_source)]
    return checked
