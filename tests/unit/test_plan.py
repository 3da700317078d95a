"""Plan-time checks (Lightning-style messages), determinism, file set, and the render path's imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobgen.backends import plan
from jobgen.errors import PlanError
from jobgen.specs.load import load_profile, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, REPO, TEMPLATES


def spec(**sections) -> TrainingSpec:
    return validate(TrainingSpec, {"name": "t", **sections}, "<test>")


def make(spec_obj: TrainingSpec, profile: str):
    return plan(spec_obj, load_profile(profile, PROFILES), TEMPLATES, spec_source="s.yaml")


def test_devices_more_than_gpus_per_node():
    with pytest.raises(PlanError, match=r"You set `resources.devices_per_node=16`.*have 8 GPUs") as info:
        make(spec(resources={"devices_per_node": 16}), "slurm-a100")
    assert info.value.location == "s.yaml: resources.devices_per_node"
    assert "at most 8" in info.value.hint


def test_nodes_more_than_profile_allows():
    with pytest.raises(PlanError, match=r"`resources.nodes=2`.*at most 1 node"):
        make(spec(resources={"nodes": 2}), "local")


def test_global_batch_inconsistent_names_every_factor():
    s = spec(resources={"nodes": 2}, trainer={"micro_batch_size": 4, "gradient_accumulation_steps": 2, "global_batch_size": 100})
    with pytest.raises(PlanError, match=r"micro_batch_size \(4\) x gradient_accumulation_steps \(2\) x world size \(16 = 2 node\(s\) x 8\) = 128"):
        make(s, "slurm-a100")


def test_global_batch_hint_gives_the_accumulation_that_works():
    s = spec(trainer={"micro_batch_size": 4, "global_batch_size": 128})
    with pytest.raises(PlanError) as info:
        make(s, "slurm-a100")
    assert "gradient_accumulation_steps=4" in info.value.hint


def test_global_batch_consistent_passes():
    s = spec(trainer={"micro_batch_size": 4, "gradient_accumulation_steps": 4, "global_batch_size": 128})
    assert make(s, "slurm-a100").world.world_size == 8


def test_bf16_refused_on_pre_ampere(tmp_path):
    (tmp_path / "v100.yaml").write_text("extends: slurm-a100\ngpu_type: V100\n")
    profile = load_profile("v100", tmp_path)
    with pytest.raises(PlanError, match=r"V100 GPUs \(compute capability 7.0\); bf16 needs Ampere"):
        plan(spec(trainer={"precision": "bf16-mixed"}), profile, TEMPLATES)
    assert plan(spec(trainer={"precision": "16-mixed"}), profile, TEMPLATES).world.world_size == 8


def test_fp16_and_hybrid_shard_refused_on_cpu():
    with pytest.raises(PlanError, match="fp16 needs a CUDA GPU"):
        make(spec(trainer={"precision": "16-mixed"}), "local")
    with pytest.raises(PlanError, match="HYBRID_SHARD") as excinfo:
        make(spec(trainer={"strategy": "fsdp", "fsdp_sharding_strategy": "HYBRID_SHARD"}), "local")
    assert excinfo.value.location.endswith("trainer.fsdp_sharding_strategy")
    assert make(spec(trainer={"strategy": "fsdp"}), "local").world.world_size == 2


def test_fp8_needs_hopper_and_a_gpu():
    fp8 = spec(trainer={"precision": "transformer-engine"})
    with pytest.raises(PlanError, match=r"A100 GPUs \(compute capability 8.0\); jobgen runs fp8 on Hopper") as info:
        make(fp8, "slurm-a100")
    assert info.value.location == "s.yaml: trainer.precision" and "bf16-mixed" in info.value.hint
    with pytest.raises(PlanError, match="has no GPUs; Transformer Engine"):
        make(fp8, "local")
    assert make(fp8, "slurm-h100").world.world_size == 8


def test_fp8_and_ddp_options_are_refused_with_other_strategies():
    with pytest.raises(Exception, match="transformer-engine' \\(fp8\\) runs with strategy ddp"):
        spec(trainer={"precision": "transformer-engine", "strategy": "fsdp"})
    with pytest.raises(Exception, match="are DDP options"):
        spec(trainer={"strategy": "fsdp", "ddp_static_graph": True})
    with pytest.raises(Exception, match="fsdp_state_dict_type is an FSDP option"):
        spec(trainer={"fsdp_state_dict_type": "full"})


def test_full_fsdp_state_dict_is_gpu_only():
    full = spec(trainer={"strategy": "fsdp", "fsdp_state_dict_type": "full"})
    with pytest.raises(PlanError, match="segfaults on CPU ranks") as info:
        make(full, "local")
    assert info.value.location == "s.yaml: trainer.fsdp_state_dict_type"
    assert make(full, "slurm-h100").world.world_size == 8


def test_new_trainer_options_stay_out_of_the_resolved_spec_until_set():
    plain = json.loads(dict(make(spec(), "local").files)["spec.json"])["spec"]["trainer"]
    assert not {"ddp_static_graph", "ddp_gradient_as_bucket_view", "fsdp_state_dict_type"} & set(plain)
    tuned = json.loads(dict(make(spec(trainer={"ddp_static_graph": True}), "local").files)["spec.json"])["spec"]["trainer"]
    assert tuned["ddp_static_graph"] is True


def test_deepspeed_rehearses_on_cpu():
    """ZeRO 1-3 (with CPU offload) run on CPU ranks with gloo (CPUDeepSpeedStrategy)."""
    p = make(spec(trainer={"strategy": "deepspeed_stage_3", "offload_optimizer": "cpu", "offload_params": "cpu"}), "local")
    assert "ds_config.json" in dict(p.files)
    assert json.loads(p.file("spec.json"))["launch"]["accelerator"] == "cpu"


def test_deepspeed_plan_has_consistent_config_and_spec_points_at_it():
    p = make(spec(resources={"nodes": 2}, trainer={"strategy": "deepspeed_stage_2", "micro_batch_size": 3, "gradient_accumulation_steps": 5}), "slurm-a100")
    ds = json.loads(p.file("ds_config.json"))
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (3 * 5 * 16, 3, 5)
    launch = json.loads(p.file("spec.json"))["launch"]
    assert launch == {**launch, "deepspeed_config": "ds_config.json", "world_size": 16, "num_nodes": 2, "requeue_signal": "USR2"}


def test_files_per_scheduler():
    assert [n for n, _ in make(spec(), "slurm-a100").files] == ["job.sbatch", "spec.json"]
    assert [n for n, _ in make(spec(), "k8s-h100").files] == ["kustomization.yaml", "pytorchjob.yaml", "spec.json"]
    assert [n for n, _ in make(spec(trainer={"strategy": "deepspeed_stage_1"}), "k8s-h100").files] == [
        "ds_config.json", "kustomization.yaml", "pytorchjob.yaml", "spec.json"]
    assert [n for n, _ in make(spec(), "local").files] == ["spec.json"]


def test_plan_is_deterministic_and_hash_tracks_inputs():
    a, b = make(spec(), "slurm-a100"), make(spec(), "slurm-a100")
    assert a.files == b.files and a.inputs_sha256 == b.inputs_sha256
    c = make(spec(trainer={"max_steps": 999}), "slurm-a100")
    assert c.inputs_sha256 != a.inputs_sha256
    assert c.inputs_sha256 in c.file("job.sbatch")


def test_write_removes_stale_owned_files(tmp_path):
    make(spec(trainer={"strategy": "deepspeed_stage_2"}), "slurm-a100").write(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    make(spec(), "slurm-a100").write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch", "notes.txt", "spec.json"]


def test_k8s_name_is_derived_with_hash_and_warned():
    p = make(spec(name="My Job_v2!"), "k8s-a100")
    assert p.warnings and "my-job-v2-" in p.warnings[0]
    other = make(spec(name="my job v2"), "k8s-a100")
    assert p.file("pytorchjob.yaml") != other.file("pytorchjob.yaml")


def test_render_path_imports_no_heavy_modules():
    code = (
        "import sys\n"
        "from jobgen.cli import main\n"
        "try:\n"
        f"    main(['render', {str(REPO / 'examples' / 'quickstart.yaml')!r}, '--profile', 'k8s-h100', '--stdout'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in ('torch', 'lightning', 'deepspeed', 'kubernetes', 'numpy') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def _copy_templates(tmp_path, name="t"):
    import shutil

    dst = tmp_path / name
    shutil.copytree(TEMPLATES, dst)
    return dst


@pytest.mark.parametrize("profile", ["slurm-a100", "k8s-h100"])
def test_inputs_hash_covers_the_templates(tmp_path, profile):
    """A template edit, even one that renders the same text, changes the header hash; CRLF does not."""
    base = _copy_templates(tmp_path, "base")
    edited = _copy_templates(tmp_path, "edited")
    crlf = _copy_templates(tmp_path, "crlf")
    template = "slurm/job.sbatch.j2" if profile.startswith("slurm") else "kubernetes/pytorchjob.yaml.j2"
    (edited / template).write_text((base / template).read_text() + "{# reviewed #}\n")
    (crlf / template).write_bytes((base / template).read_bytes().replace(b"\n", b"\r\n"))
    prof = load_profile(profile, PROFILES)
    plans = {d.name: plan(spec(), prof, d) for d in (base, edited, crlf)}
    assert plans["edited"].inputs_sha256 != plans["base"].inputs_sha256
    assert plans["crlf"].inputs_sha256 == plans["base"].inputs_sha256
    main_file = "job.sbatch" if profile.startswith("slurm") else "pytorchjob.yaml"
    assert plans["edited"].inputs_sha256 in plans["edited"].file(main_file)
    assert plans["edited"].inputs_sha256 in plans["edited"].file("spec.json")


def test_inputs_hash_covers_included_templates(tmp_path):
    templates = _copy_templates(tmp_path)
    main = templates / "slurm" / "job.sbatch.j2"
    main.write_text(main.read_text() + '{% include "slurm/extra.j2" %}\n')
    (templates / "slurm" / "extra.j2").write_text("# extra one\n")
    prof = load_profile("slurm-a100", PROFILES)
    first = plan(spec(), prof, templates)
    from jobgen.planning.render import environment, template_sha256

    (templates / "slurm" / "extra.j2").write_text("# extra two\n")
    template_sha256.cache_clear()
    environment.cache_clear()
    second = plan(spec(), prof, templates)
    assert "# extra two" in second.file("job.sbatch")
    assert first.inputs_sha256 != second.inputs_sha256


def test_inputs_hash_covers_the_whole_extends_chain(tmp_path):
    """Editing a base profile changes the hash of a profile that extends it."""
    import shutil

    profiles = tmp_path / "profiles"
    shutil.copytree(PROFILES, profiles)
    before = plan(spec(), load_profile("slurm-h100", profiles), TEMPLATES).inputs_sha256
    base = profiles / "slurm-a100.yaml"
    base.write_text(base.read_text().replace("signal_grace_s: 120", "signal_grace_s: 90"))
    after = plan(spec(), load_profile("slurm-h100", profiles), TEMPLATES)
    assert after.inputs_sha256 != before and "--signal=USR2@90" in after.file("job.sbatch")
