"""``jobgen calibrate RUN_DIR...``: fold what finished runs measured into the calibration file
that ``jobgen plan``'s time prediction reads (:mod:`jobgen.planning.calibration`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from jobgen.cli.options import profiles_dir_option
from jobgen.cli.output import output_option


@click.command("calibrate")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--profile", "-p", default=None,
              help="The runs' cluster profile: its calibration file is updated, and its cores per rank and "
                   "bandwidths are used. Default: the profile each run's summary.json names.")
@click.option("--file", "file_", type=click.Path(dir_okay=False), default=None,
              help="Calibration file to update instead of the profile's (or the default under jobgen's state directory).")
@click.option("--dry-run", is_flag=True, help="Print what would be stored; write nothing.")
@output_option()
@profiles_dir_option
def calibrate_command(run_dirs: tuple[str, ...], profile: str | None, file_: str | None, dry_run: bool, output: str,
                      profiles_dir: str | None) -> None:
    """Store what finished runs measured, so that `jobgen plan` predicts from them.

    \b
    Each RUN_DIR is a finished run (summary.json and spec.json). From its steady tokens/s and
    FLOPs per token it takes, per (accelerator, compute dtype, layout family, size class):
    on GPUs the MFU of the compute part of a step (the step time less the collectives the time
    model charges for the layout); on CPUs the model FLOP/s per core. The calibration file keeps
    the mean over every run folded in, the smallest and largest, and the count.
    The file: --file, else the profile's `calibration` field, else $JOBGEN_CALIBRATION, else
    calibration.yaml in jobgen's state directory ($XDG_STATE_HOME/jobgen or ~/.local/state/jobgen).
    Writes the whole file at once (nothing half-written); exit 2 for a run or file that is not valid.

    \b
    Examples:
      jobgen calibrate runs/quickstart
      jobgen calibrate runs/a runs/b --profile slurm-h100 -o json
      jobgen calibrate runs/quickstart --file team-calibration.yaml --dry-run
    """
    from jobgen.jobdir.files import write_atomic
    from jobgen.planning.calibrate_runs import measure_run, update
    from jobgen.planning.calibration import calibration_path, default_path, dumps, load_file
    from jobgen.specs.load import load_profile

    prof = load_profile(profile, profiles_dir) if profile else None
    measured = [measure_run(Path(d), prof) for d in run_dirs]
    if file_:
        path = Path(file_)
    elif prof is not None:
        path = calibration_path(prof)[0]
    else:
        path = default_path()
    before = load_file(path)
    after = update(before, measured)
    if not dry_run:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, dumps(after))
    keys = {m.key for m in measured}
    stored = [r for r in after.rows if r.key in keys]
    if output == "json":
        click.echo(json.dumps({"file": str(path), "written": not dry_run, "runs": [m.to_json() for m in measured],
                               "rows": [r.model_dump(exclude_none=True) for r in stored]}, indent=2, sort_keys=True))
        return
    for m in measured:
        what = (f"{m.value / 1e9:,.2f} GFLOP/s per core ({m.cores_per_rank} core(s) per rank)" if m.key[0] == "cpu"
                else f"MFU {m.value:.1%} of the compute part")
        click.echo(f"{m.run_dir}: {' '.join(m.key)}: {m.tokens_per_s:,.0f} tokens/s x {m.flops_per_token:,} FLOPs/token on "
                   f"{m.devices} rank(s) -> {what}" + (f" (collectives {m.comm_s * 1000:.1f} ms of {m.step_s * 1000:.1f} ms per step)"
                                                       if m.comm_s else ""))
    for r in stored:
        click.echo(f"{'would store' if dry_run else 'stored'} {r.describe()} in {path}")
