"""``jobgen plan``: the per-GPU memory plan of a spec on a profile, one row per layout, and the
recommended strategy (:mod:`jobgen.planning.estimate_hf`, :mod:`jobgen.usercode.memory`)."""

from __future__ import annotations

import json
from typing import Any

import click

from jobgen.cli.options import profiles_dir_option, set_option
from jobgen.cli.output import output_option
from jobgen.cli.validate import put_user_code_first
from jobgen.errors import ConfigError
from jobgen.specs.load import load_profile, load_spec


@click.command("plan")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--profile", "-p", required=True, help="Cluster profile name (see `jobgen profiles list`) or a .yaml path.")
@click.option("--hf-config", "hf_config", type=click.Path(), default=None,
              help="config.json (or a directory holding it) of the model.hf_path model, read instead of <hf_path>/config.json "
                   "(for planning off the cluster), e.g. examples/hf-configs/llama-2-7b/config.json.")
@click.option("--import", "import_model", is_flag=True,
              help="model.class_path specs: import the classes here (as `validate --import`) and build the model on "
                   "PyTorch's meta device (nothing allocated, no weights read) to count its parameters; activations "
                   "are not estimated (each total is then a floor of the peak).")
@output_option()
@set_option
@profiles_dir_option
def plan_command(spec: str, profile: str, hf_config: str | None, import_model: bool, output: str, overrides: tuple[str, ...],
                 profiles_dir: str | None) -> None:
    """Estimate per-GPU memory of SPEC on a profile for each strategy, and recommend one.

    \b
    One row per layout (DDP, FSDP sharding strategies and CPU offload, DeepSpeed ZeRO-1/2/3
    with optimizer/parameter offload): parameters, gradients, optimizer states, activations
    and overhead in GiB per GPU (per rank on CPU profiles), the total, and whether it fits the
    profile's gpu_mem_gib (and, with offload, the node's host memory). Formulas: ZeRO
    (Rajbhandari et al. 2020) for model states, Korthikanti et al. 2022 for activations; see
    jobgen/planning/estimate.py. The recommendation follows the guide: DDP below ~500M parameters when it
    fits, FSDP for 500M-10B, DeepSpeed ZeRO-3 (then offload) beyond or when nothing else fits.
    Hugging Face models (model.hf_path) are sized from their config.json (--hf-config FILE, or
    <hf_path>/config.json; llama, mistral, qwen2, gpt2): full fine-tuning, LoRA and QLoRA
    (jobgen/planning/estimate_hf.py); a QLoRA ~7B spec that matches a row of the seed benchmark table
    (jobgen/planning/seeds.py) shows the measured figure next to the estimate.
    Your own model (model.class_path) is sized with --import: its classes are imported and it is
    built on the meta device to count its parameters (jobgen/usercode/memory.py); its activations
    are not estimated. Without --import such a spec is refused (planning imports no user code).
    Estimates of the peak, not bounds: within 15% of the peaks measured on one GPU (docs/large-models.md,
    "Memory plan"); the assumptions: block lists what they rest on. Exit 0 even when the spec's strategy
    does not fit (a warning goes to stderr); 2 for bad input.
    Time: per layout the step time, tokens/s, wall time to max_steps, device-hours and cost
    (gpu_hour_price), each with a band, from FLOPs per token, the GPU's datasheet peak, the MFU
    of a calibration row and the collectives the layout adds (jobgen/planning/time_model.py;
    docs/predict.md). The layouts that fit are ranked by it: the fastest is recommended when it
    beats the guide's pick beyond both bands. Calibration: the seeded table, and the file
    `jobgen calibrate` writes; CPU profiles have no prediction until a run is calibrated.

    \b
    Examples:
      jobgen plan examples/gpt2-350m-zero3.yaml --profile slurm-a100
      jobgen plan examples/quickstart.yaml -p slurm-a100 --set model.preset=null --set model.n_layer=32 \\
          --set model.n_head=32 --set model.d_model=4096 --set model.block_size=4096 --set trainer.micro_batch_size=1
      jobgen plan examples/quickstart.yaml -p k8s-h100 --output json
      jobgen plan examples/llama-lora-jsonl.yaml -p slurm-a100 --hf-config examples/hf-configs/llama-2-7b/config.json
      jobgen plan examples/usercode.yaml -p slurm-a100 --import
    """
    from jobgen.planning.estimate_hf import plan_memory
    from jobgen.planning.micro_batch import resolve_micro_batch
    from jobgen.planning.rules import check_fit, resolve_precision, resolve_world

    prof = load_profile(profile, profiles_dir)
    loaded = resolve_micro_batch(resolve_precision(load_spec(spec, overrides), prof), prof, spec, hf_config)
    if loaded.entrypoint is not None:
        raise ConfigError(
            f"{spec} runs your own entrypoint (command mode): jobgen does not know its model, so it cannot estimate memory",
            location=f"{spec}: entrypoint",
            hint="estimate with a spec of the same shape for the built-in GPT (model.n_layer, n_head, d_model, block_size), "
            "or drop entrypoint",
        )
    world = resolve_world(loaded, prof, spec)
    check_fit(loaded, prof, world, spec)
    # elastic: the smallest world (largest shards)
    if loaded.user_code and import_model:
        from jobgen.usercode.memory import plan_memory as plan_user_memory

        put_user_code_first(spec, loaded)
        mp = plan_user_memory(loaded, prof, world.fewest_nodes, world.devices_per_node, spec_source=spec)
    else:
        mp = plan_memory(loaded, prof, world.fewest_nodes, world.devices_per_node, hf_config=hf_config, spec_source=spec)
    from jobgen.planning.time_model import plan_time, with_ranking

    tp = plan_time(loaded, prof, mp, hf_config=hf_config, spec_source=spec)
    mp = with_ranking(mp, tp)
    if output == "json":
        click.echo(json.dumps({"spec": spec, "name": loaded.name, "profile": prof.name, **mp.to_json(), "prediction": tp.to_json()},
                              indent=2, sort_keys=True))
    else:
        click.echo(_plan_table(loaded, prof, mp, tp), nl=False)
    spec_row = mp.spec_row
    if not spec_row.fits:
        est = spec_row.estimate
        instead = f"use {mp.chosen.label}: " + " ".join(f"--set {o}" for o in mp.chosen.overrides) if mp.chosen else "nothing fits as is (see suggestions)"
        click.echo(f"warning: the spec's layout {est.layout.label} is estimated at {est.total_bytes / 2**30:.1f} GiB per rank "
                   f"(budget {mp.budget_bytes / 2**30:.1f} GiB"
                   + (f", host {est.host_bytes_per_node / 2**30:.1f} of {mp.host_bytes_per_node / 2**30:.1f} GiB per node" if est.host_bytes_per_node else "")
                   + f") and will not fit; {instead}", err=True)


def _plan_table(spec: Any, profile: Any, mp: Any, tp: Any = None) -> str:
    """The human-readable `jobgen plan` output (GiB = 2**30 bytes)."""
    g = 2**30
    unit = "GPU" if mp.accelerator == "gpu" else "CPU rank"
    n, d = mp.world
    batch = (f"micro batch {spec.trainer.micro_batch_size} x {spec.model.block_size} tokens" if mp.user is None
             else f"micro batch {spec.trainer.micro_batch_size}")
    model = "" if mp.user is None else f"{mp.user['class_path']}, "
    lines = [
        f"{spec.name} on {profile.name}: {model}{mp.n_params / 1e6:,.1f}M parameters, {mp.precision}, {batch}, "
        f"{n} node(s) x {d} {unit}(s) = world size {n * d}, budget {mp.budget_bytes / g:.1f} GiB per {unit}",
        "",
        f"  {'layout':38} {'params':>7} {'grads':>7} {'optim':>7} {'activ':>7} {'overhd':>7} {'total':>7}  fits  {'host/node':>9}",
    ]
    for r in mp.rows:
        e = r.estimate
        mark = "*" if mp.chosen is not None and e.layout == mp.chosen else " "
        cols = " ".join(f"{v / g:7.2f}" for v in (e.params_bytes, e.grads_bytes, e.optimizer_bytes, e.activations_bytes,
                                                  e.overhead_bytes, e.total_bytes))
        host = f"{e.host_bytes_per_node / g:9.2f}" if e.host_bytes_per_node else f"{'-':>9}"
        lines.append(f"{mark} {e.layout.label:38} {cols}  {'yes' if r.fits else 'no ':4}  {host}" + ("  <- spec" if r.is_spec else ""))
    lines.append(f"  (GiB per {unit}; * = recommended; host/node = offloaded states in each node's CPU memory)")
    if mp.hf is not None:
        h = mp.hf
        lines.append(f"  model: {h['model_type']} ({h['config']}), {h['mode']} fine-tuning, "
                     f"{h['trainable_params'] / 1e6:,.1f}M trainable parameters")
    if mp.seed is not None:
        sd = mp.seed
        lines.append(f"  seed table: {sd['recipe']} on {sd['gpus']} GPU(s): measured {sd['measured_gb_per_gpu']:g} GB "
                     f"({sd['measured_bytes_per_gpu'] / g:.1f} GiB) per GPU, {sd['tokens_per_s']:,} tokens/s; "
                     f"estimate {sd['estimate_bytes_per_gpu'] / g:.1f} GiB ({sd['estimate_over_measured']:.2f}x) "
                     f"[{sd['source']}]")
    if tp is not None:
        lines += _time_table(mp, tp)
    lines.append("")
    if mp.chosen is not None:
        lines.append(f"recommended: {mp.chosen.label}  (" + " ".join(f"--set {o}" for o in mp.chosen.overrides) + ")")
    else:
        lines.append("recommended: nothing fits as configured")
    lines += [f"  - {r}" for r in mp.reasons]
    if mp.suggestions:
        lines.append("suggestions:")
        lines += [f"  - {s}" for s in mp.suggestions]
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in mp.assumptions]
    return "\n".join(lines) + "\n"


def _time_table(mp: Any, tp: Any) -> list[str]:
    """The prediction's lines of the `jobgen plan` table: per layout the step time, tokens/s, wall
    time to max_steps, device-hours and cost, each as value (low-high); the calibration row used."""
    from jobgen.planning.time_model import fmt_count, fmt_duration

    lines = ["", f"  time: {tp.message}"]
    if not tp.rows:
        return lines
    unit = tp.device_kind
    steps = f"wall ({tp.max_steps:,} steps)" if tp.max_steps else "wall (no max_steps)"
    lines.append(f"  {'layout':38} {'step':>9} {'tokens/s':>22} {steps:>26} {unit + '-hours':>10} {'cost':>10}")
    for r in mp.rows:
        p = tp.rows.get(r.estimate.layout.label)
        if p is None:
            continue
        tps = f"{fmt_count(p.tokens_per_s.value)} ({fmt_count(p.tokens_per_s.low)}-{fmt_count(p.tokens_per_s.high)})"
        wall = (f"{fmt_duration(p.wall_s.value)} ({fmt_duration(p.wall_s.low)}-{fmt_duration(p.wall_s.high)})"
                if p.wall_s is not None else "-")
        hours = f"{p.device_hours.value:,.2f}" if p.device_hours is not None else "-"
        cost = f"{p.cost.value:,.2f}" if p.cost is not None else "-"
        lines.append(f"  {r.estimate.layout.label:38} {fmt_duration(p.step_s.value):>9} {tps:>22} {wall:>26} {hours:>10} "
                     f"{cost:>10}" + ("" if r.fits else "  (does not fit)"))
    used: dict[str, Any] = {}
    for p in tp.rows.values():
        used.setdefault(p.lookup.row.describe() + f" [{p.lookup.origin}" + (f"; {p.lookup.note}" if p.lookup.note else "") + "]", p)
    lines.append("  calibration rows used: " + "; ".join(used))
    link = tp.link
    lines.append("  (step = compute at the row's efficiency + collectives not overlapped; bandwidth: " + ", ".join(link.sources)
                 + "; cost = device-hours x gpu_hour_price" + ("" if tp.price is not None else " (no gpu_hour_price: no cost)")
                 + "; wall time excludes start-up and validation)")
    return lines
