"""Plan-time checks of SLURM site settings (the launch contract Lightning enforces at runtime)."""

from __future__ import annotations

import pytest

from jobgen.backends import plan
from jobgen.backends.slurm.backend import filter_rank, job_id
from jobgen.backends.slurm.script import check_directives, run_dir_name
from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir import JobHandle
from jobgen.jobdir.world import World
from jobgen.specs.load import load_profile, validate
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, TEMPLATES


def profile(name: str = "slurm-a100", **slurm) -> ClusterProfile:
    base = load_profile(name, PROFILES).model_dump()
    base["slurm"] = {**base["slurm"], **slurm}
    return validate(ClusterProfile, base, "p.yaml")


def render(prof: ClusterProfile, **resources) -> str:
    spec = validate(TrainingSpec, {"name": "j", "resources": resources}, "s.yaml")
    return plan(spec, prof, TEMPLATES, spec_source="s.yaml", profile_source="p.yaml").file("job.sbatch")


def test_ntasks_per_node_that_disagrees_with_devices_is_refused_in_lightnings_words():
    with pytest.raises(PlanError, match=r"You set `slurm.extra_sbatch_args: --ntasks-per-node=1`, but the job runs Trainer\(devices=8\)") as info:
        render(profile(extra_sbatch_args=["--ntasks-per-node=1"]))
    assert info.value.location == "p.yaml: slurm.extra_sbatch_args" and "Remove --ntasks-per-node=1" in info.value.hint


@pytest.mark.parametrize("args", [["--nodes=1"], ["-N", "1"]])
def test_srun_nodes_that_disagree_with_num_nodes_are_refused(args):
    with pytest.raises(PlanError, match=r"--nodes=1`, but the job runs Trainer\(num_nodes=2\)"):
        render(profile(extra_srun_args=args), nodes=2)


def test_srun_ntasks_per_node_torchrun_style_is_refused():
    with pytest.raises(PlanError, match=r"Trainer\(devices=8\); Lightning's SLURMEnvironment requires --ntasks-per-node == devices"):
        render(profile(extra_srun_args=["--ntasks-per-node=1"]))


def test_any_derived_sbatch_option_is_refused_even_when_equal():
    with pytest.raises(PlanError, match="jobgen derives --time"):
        render(profile(extra_sbatch_args=["--time=01:00:00"]))


def test_site_specific_sbatch_options_pass_through_as_directives():
    script = render(profile(extra_sbatch_args=["--reservation=big run", "--hint=nomultithread"]))
    assert "#SBATCH --reservation='big run'\n" in script and "#SBATCH --hint=nomultithread\n" in script


def test_gpus_per_task_gets_an_explicit_ntasks():
    script = render(profile(gpu_request_style="gpus-per-task"), nodes=2)
    assert "#SBATCH --ntasks=16\n" in script and "#SBATCH --gpus-per-task=a100:1\n" in script
    assert "#SBATCH --ntasks-per-node=8\n" in script


def test_gpus_per_task_without_ntasks_is_refused():
    with pytest.raises(PlanError, match="--gpus-per-task=1 without --ntasks on SLURM 20.02") as info:
        check_directives([("nodes", "1"), ("ntasks-per-node", "8"), ("gpus-per-task", "1")], World(1, 8, "gpu"), "20.02")
    assert "--ntasks=8" in info.value.hint


@pytest.mark.parametrize("style", ["gpus-per-node", "gpus-per-task"])
def test_gpu_flags_newer_than_the_sites_slurm_are_refused(style):
    with pytest.raises(PlanError, match=rf"gpu_request_style: {style}`, but the site runs SLURM 18.08") as info:
        render(profile(gpu_request_style=style, version="18.08"))
    assert "gres" in info.value.hint


def test_gres_works_on_old_slurm_and_version_format_is_checked():
    assert "#SBATCH --gres=gpu:a100:8\n" in render(profile(version="17.11"))
    with pytest.raises(ConfigError, match="not MAJOR.MINOR"):
        profile(version="22")


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_container_runtime_without_image_is_refused(runtime):
    with pytest.raises(ConfigError, match=rf"You set `container.runtime: {runtime}`, but no `container.image`") as info:
        profile(container={"runtime": runtime})
    assert "slurm.container: You set" in info.value.message


@pytest.mark.parametrize(("arg", "command_mode"), [
    ("--container-mounts=/data:/data", False), ("--container-image=other", False),
    ("--container-workdir=/w", True), ("--container-mounts=/data:/data", True),
])
def test_pyxis_flags_jobgen_writes_are_refused_in_extra_srun_args(arg, command_mode):
    """One flag each: jobgen writes --container-image, --container-mounts (the profile's mounts,
    plus the working directory in command mode) and, in command mode, --container-workdir."""
    doc = {"name": "j"} | ({"entrypoint": {"script": "train.py"}} if command_mode else {})
    with pytest.raises(PlanError, match=f"jobgen writes {arg.split('=')[0]}") as info:
        plan(validate(TrainingSpec, doc, "s.yaml"), profile("slurm-h100", extra_srun_args=[arg]), TEMPLATES, profile_source="p.yaml")
    assert info.value.location == "p.yaml: slurm.extra_srun_args" and "container" in info.value.hint


def test_container_workdir_passes_through_for_the_built_in_entrypoint():
    assert "--container-workdir=/w" in render(profile("slurm-h100", extra_srun_args=["--container-workdir=/w"]))


def test_signal_grace_longer_than_the_time_limit_is_refused():
    with pytest.raises(PlanError, match=r"signal_grace_s: 120`, but the time limit is 2 min") as info:
        render(profile(time_limit_min=2))
    assert info.value.location == "p.yaml: slurm.signal_grace_s"


def test_cpu_profile_requests_no_gpus_and_one_task_per_node():
    script = render(load_profile("slurm-cpu", PROFILES), nodes=2)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in script
    assert "gpu" not in script.split("set -euo pipefail")[0].lower().replace("jobgen", "")


def test_rank_filter_keeps_one_ranks_lines_and_the_batch_shells():
    lines = ["jobgen: job 1", "0: step 1", "1: step 1", " 10: x", "0: ", "Traceback"]
    assert list(filter_rank(lines, 0)) == ["jobgen: job 1", "step 1", "", "Traceback"]
    assert list(filter_rank(lines, 10)) == ["jobgen: job 1", "x", "Traceback"]
    assert list(filter_rank(lines, None)) == lines


@pytest.mark.parametrize("text", ["slurm://lab/12x", "slurm://12", "local:///tmp/run"])
def test_job_id_needs_a_slurm_handle_with_a_number(text):
    with pytest.raises(ConfigError, match="is not a SLURM job handle"):
        job_id(JobHandle.parse(text))


def test_run_dir_name_avoids_what_slurm_output_paths_cannot_carry():
    assert run_dir_name("it's a job") == "it's a job"
    odd = [run_dir_name(n) for n in ("a\\b", "a%b", "a_b")]
    assert odd[0].startswith("a_b-") and odd[1].startswith("a_b-") and odd[2] == "a_b"
    assert len(set(odd)) == 3, "names that differ must keep distinct run directories"
