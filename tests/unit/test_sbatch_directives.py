"""Every ``#SBATCH`` value of a rendered job.sbatch, checked against the profile and spec fields
it comes from (not against a golden file, which `UPDATE_GOLDEN=1` would silently rewrite).

Each case renders through the CLI (``jobgen render SPEC --profile P --set ...``), reads the
``#SBATCH`` lines back the way sbatch does (shell words; one option each) and compares them,
option by option and as a whole set, with what the loaded profile and spec say SLURM must get:
``--cpus-per-task`` = cpus_per_node // ranks per node, ``--mem`` = mem_gib_per_node in MiB,
``--time`` = the spec's (else the profile's) limit as ``[D-]HH:MM:SS``, the GPU request in the
profile's style, ``--exclusive``/``--requeue``/``--signal`` exactly when the profile says.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from jobgen.specs.load import load_profile, load_spec
from tests.conftest import EXAMPLES

SPEC = EXAMPLES / "quickstart.yaml"

#: Profiles beyond the shipped ones, for the settings those leave at one value.
SITE_PROFILES = {
    # --gpus-per-task (needs --ntasks), untyped GPUs, no --exclusive, account/qos/constraint,
    # the batch-shell signal form, an extra site option
    "site-tasks": """\
extends: slurm-a100
slurm:
  gpu_request_style: gpus-per-task
  gres_gpu_type: null
  exclusive: false
  account: proj-42
  qos: high
  constraint: "a100&ib"
  signal_target: batch
  signal_grace_s: 300
  extra_sbatch_args: ["--reservation=big", "--hint=nomultithread"]
""",
    # typed --gpus-per-node, no requeue (so no --signal), the site's default partition, a CPU
    # count that does not divide evenly and a fractional memory size
    "site-norequeue": """\
extends: slurm-h100
cpus_per_node: 100
mem_gib_per_node: 503.5
slurm:
  gres_gpu_type: h100
  requeue: false
  partition: null
""",
    # untyped --gres, 4 GPUs per node
    "site-gres": """\
extends: slurm-a100
gpus_per_node: 4
cpus_per_node: 64
slurm:
  gres_gpu_type: null
""",
}

CASES = [
    ("slurm-cpu", ()),
    ("slurm-cpu", ("resources.nodes=4", "resources.time_limit_min=90")),
    ("slurm-a100", ()),
    ("slurm-a100", ("resources.nodes=3", "resources.devices_per_node=4", "resources.time_limit_min=1500")),
    ("slurm-a100", ("resources.time_limit_min=2880",)),
    ("slurm-h100", ("resources.devices_per_node=2", "resources.time_limit_min=59")),
    ("site-tasks", ("resources.nodes=2",)),
    ("site-norequeue", ()),
    ("site-gres", ("resources.time_limit_min=1441",)),
]


def sbatch_options(script: str) -> list[tuple[str, str | None]]:
    """``(option, value)`` of each ``#SBATCH`` line, as sbatch reads it (value None: a flag)."""
    out = []
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            words = shlex.split(line.removeprefix("#SBATCH"))
            assert len(words) == 1 and words[0].startswith("--"), f"one long option per #SBATCH line: {line!r}"
            option, eq, value = words[0][2:].partition("=")
            out.append((option, value if eq else None))
    return out


def slurm_time(minutes: int) -> str:
    """sbatch(1) --time: "hours:minutes:seconds" below a day, "days-hours:minutes:seconds" from one day."""
    days, minutes = divmod(minutes, 24 * 60)
    hms = f"{minutes // 60:02d}:{minutes % 60:02d}:00"
    return f"{days}-{hms}" if days else hms


@pytest.mark.parametrize(("minutes", "text"), [(1, "00:01:00"), (59, "00:59:00"), (90, "01:30:00"), (1439, "23:59:00"),
                                               (1440, "1-00:00:00"), (1441, "1-00:01:00"), (1500, "1-01:00:00"),
                                               (2880, "2-00:00:00")])
def test_slurm_time_format_of_this_test(minutes, text):
    assert slurm_time(minutes) == text


def expected_options(profile_name: str, profiles_dir: Path, overrides: tuple[str, ...]) -> dict[str, str | None]:
    """What sbatch must be asked for, from the loaded profile and spec alone."""
    profile = load_profile(profile_name, profiles_dir)
    spec = load_spec(SPEC, overrides)
    s = profile.slurm_settings
    nodes = spec.resources.nodes or profile.default_nodes
    ranks = spec.resources.devices_per_node or profile.devices_per_node
    opts: dict[str, str | None] = {
        "job-name": spec.name,
        "nodes": str(nodes),
        "ntasks-per-node": str(ranks),
        "cpus-per-task": str(profile.cpus_per_node // ranks),
        "mem": f"{int(profile.mem_gib_per_node * 1024)}M",
        "time": slurm_time(spec.resources.time_limit_min or s.time_limit_min),
        "open-mode": "append",
        "output": "slurm-%j.out",
    }
    if profile.gpus_per_node:
        typed = f"{s.gres_gpu_type}:" if s.gres_gpu_type else ""
        if s.gpu_request_style == "gres":
            opts["gres"] = f"gpu:{typed}{ranks}"
        elif s.gpu_request_style == "gpus-per-node":
            opts["gpus-per-node"] = f"{typed}{ranks}"
        else:
            opts["gpus-per-task"] = f"{typed}1"
            opts["ntasks"] = str(nodes * ranks)
    for option in ("partition", "account", "qos", "constraint"):
        if getattr(s, option):
            opts[option] = getattr(s, option)
    if s.exclusive:
        opts["exclusive"] = None
    if s.requeue:
        opts["requeue"] = None
        opts["signal"] = f"{'B:' if s.signal_target == 'batch' else ''}{s.requeue_signal}@{s.signal_grace_s}"
    for arg in s.extra_sbatch_args:
        option, eq, value = arg[2:].partition("=")
        opts[option] = value if eq else None
    return opts


@pytest.mark.parametrize(("profile", "overrides"), CASES, ids=[f"{p}-{'-'.join(o) or 'defaults'}" for p, o in CASES])
def test_every_sbatch_directive_follows_from_the_profile_and_spec(run_cli, tmp_path, profile, overrides):
    profiles_dir = tmp_path / "profiles"
    profiles_dir.mkdir()
    for name, text in SITE_PROFILES.items():
        (profiles_dir / f"{name}.yaml").write_text(text)
    sets = [arg for o in overrides for arg in ("--set", o)]
    result = run_cli("render", str(SPEC), "--profile", profile, "--profiles-dir", str(profiles_dir), "--out", str(tmp_path / "out"), *sets)
    assert result.code == 0, result.stderr
    script = (tmp_path / "out" / profile / load_spec(SPEC).name / "job.sbatch").read_text()
    got = sbatch_options(script)
    assert len({o for o, _ in got}) == len(got), f"an option repeated: {got}"
    want = expected_options(profile, profiles_dir, overrides)
    for option, value in want.items():
        assert dict(got).get(option, "<missing>") == value, f"--{option}"
    assert dict(got) == want, "unexpected #SBATCH options"


def test_the_cases_cover_each_switch_both_ways(tmp_path):
    """Guards the case list: each profile setting this file checks takes every value in some case."""
    profiles_dir = tmp_path / "profiles"
    profiles_dir.mkdir()
    for name, text in SITE_PROFILES.items():
        (profiles_dir / f"{name}.yaml").write_text(text)
    settings = [load_profile(p, profiles_dir) for p, _ in CASES]
    assert {p.slurm_settings.exclusive for p in settings} == {True, False}
    assert {p.slurm_settings.requeue for p in settings} == {True, False}
    assert {p.slurm_settings.signal_target for p in settings} == {"tasks", "batch"}
    assert {p.slurm_settings.gpu_request_style for p in settings if p.gpus_per_node} == {"gres", "gpus-per-node", "gpus-per-task"}
    assert {bool(p.slurm_settings.gres_gpu_type) for p in settings if p.gpus_per_node} == {True, False}
    assert {p.gpus_per_node > 0 for p in settings} == {True, False}
    assert any(p.cpus_per_node % p.devices_per_node for p in settings), "a CPU count that does not divide evenly"
