"""The local profile uses this machine's GPUs (jobgen.specs.local_gpus): with the device
query faked (GPUs found), one rank per GPU, ``precision: auto`` from the GPU, the plan's budget
from its memory; without GPUs (faked, and for real on this CPU machine) the profile, and so every
rendered file, is what it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jobgen import api
from jobgen.specs import local_gpus
from jobgen.specs.load import load_profile, load_profile_doc, validate
from jobgen.specs.local_gpus import LocalGpus, gpu_type_of
from jobgen.specs.profile import ClusterProfile
from tests.conftest import EXAMPLES, PROFILES, REPO

H100 = LocalGpus(count=2, name="NVIDIA H100 80GB HBM3", mem_gib=79.19, capability=(9, 0), source="nvml")
T4 = LocalGpus(count=1, name="Tesla T4", mem_gib=14.57, capability=(7, 5), source="torch.cuda")


def _as_written() -> ClusterProfile:
    doc, path = load_profile_doc("local", PROFILES)
    return validate(ClusterProfile, doc, str(path))


def _fake(monkeypatch, gpus: LocalGpus | None) -> list[int]:
    calls: list[int] = []

    def fake() -> LocalGpus | None:
        calls.append(1)
        return gpus

    monkeypatch.setattr(local_gpus, "detect_gpus", fake)
    return calls


def test_with_gpus_the_local_profile_runs_one_rank_per_gpu_in_bf16_within_their_memory(monkeypatch) -> None:
    calls = _fake(monkeypatch, H100)
    profile = load_profile("local", PROFILES)
    assert calls == [1]
    assert (profile.gpus_per_node, profile.gpu_type, profile.gpu_mem_gib) == (2, "H100", 79.1)
    assert "2x NVIDIA H100 80GB HBM3" in profile.description and "differ" in profile.description
    job = api.plan_job(EXAMPLES / "quickstart.yaml", "local", profiles_dir=PROFILES)
    resolved = json.loads(job.file("spec.json"))
    assert resolved["spec"]["trainer"]["precision"] == "bf16-mixed"  # quickstart says precision: auto
    launch = resolved["launch"]
    assert (launch["accelerator"], launch["devices_per_node"], launch["world_size"], launch["gpu_type"]) == ("gpu", 2, 2, "H100")
    (step,) = job.submit_steps
    assert step.argv[step.argv.index("--nproc-per-node") + 1] == "2"


def test_the_plans_budget_is_the_detected_gpu_memory(monkeypatch) -> None:
    from jobgen.planning.estimate import GIB
    from jobgen.planning.memory_plan import budget_bytes
    from jobgen.specs.load import load_spec

    _fake(monkeypatch, T4)
    profile = load_profile("local", PROFILES)
    assert (profile.gpus_per_node, profile.gpu_type, profile.gpu_mem_gib) == (1, "T4", 14.5)
    per_rank, _, note = budget_bytes(load_spec(EXAMPLES / "quickstart.yaml"), profile, profile.gpus_per_node)
    assert (per_rank, note) == (int(14.5 * GIB), None)


def test_auto_precision_on_a_gpu_without_bf16_is_fp16(monkeypatch) -> None:
    _fake(monkeypatch, T4)
    resolved = json.loads(api.plan_job(EXAMPLES / "quickstart.yaml", "local", profiles_dir=PROFILES).file("spec.json"))
    assert resolved["spec"]["trainer"]["precision"] == "16-mixed"


def test_without_gpus_the_local_profile_and_its_render_are_as_written(monkeypatch) -> None:
    calls = _fake(monkeypatch, None)
    profile = load_profile("local", PROFILES)
    assert calls == [1] and profile == _as_written() and profile.gpus_per_node == 0
    with_gpus = api.plan_job(EXAMPLES / "quickstart.yaml", "local", profiles_dir=PROFILES)
    _fake(monkeypatch, H100)
    assert api.plan_job(EXAMPLES / "quickstart.yaml", "local", profiles_dir=PROFILES).inputs_sha256 != with_gpus.inputs_sha256


def test_other_profiles_never_query_the_device(monkeypatch) -> None:
    calls = _fake(monkeypatch, H100)
    for name in ("slurm-cpu", "slurm-a100", "k8s-h100"):
        load_profile(name, PROFILES)
    assert calls == []


def test_the_flag_is_not_an_input_of_the_hash() -> None:
    # the shipped local profile sets detect_gpus; its dump (the inputs hash) holds what it found only
    assert "detect_gpus" not in _as_written().model_dump(mode="json")["local"]


@pytest.mark.parametrize(("name", "capability", "expected"), [
    ("NVIDIA A100-SXM4-80GB", (8, 0), "A100"), ("NVIDIA A10G", (8, 6), "A10G"), ("NVIDIA L40S", (8, 9), "L40S"),
    ("NVIDIA L4", (8, 9), "L4"), ("Tesla V100-SXM2-16GB", (7, 0), "V100"), ("NVIDIA H200", (9, 0), "H200"),
    ("NVIDIA GeForce RTX 4090", (8, 9), "L4"),     # unknown: a known model of its compute capability
    ("NVIDIA GeForce RTX 3090", (8, 6), "A10G"),
    ("Quadro P6000", (6, 1), "V100"),              # older than every known one: the oldest
])
def test_gpu_type_of_the_drivers_name(name, capability, expected) -> None:
    assert gpu_type_of(LocalGpus(1, name, 10.0, capability, "nvml")) == expected


def test_an_empty_cuda_visible_devices_means_no_gpus(monkeypatch) -> None:
    monkeypatch.setattr(local_gpus, "_driver_present", lambda root=None: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_gpus.detect_gpus() is None


def test_on_this_cpu_machine_the_local_profile_is_unchanged_and_torch_is_not_imported() -> None:
    """The real query (nothing faked): this machine has no GPU, so the profile is as written and
    `render --profile local` imports no torch (the driver check answers first)."""
    if local_gpus._driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    assert local_gpus.detect_gpus() is None
    assert load_profile("local", PROFILES) == _as_written()
    code = ("import json, sys\nfrom jobgen.cli import main\ntry:\n"
            f"    main(['render', {str(EXAMPLES / 'quickstart.yaml')!r}, '--profile', 'local', '--stdout'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "TORCH False"


@pytest.mark.parametrize("output", ["yaml", "json", "text"])
def test_profiles_show_keeps_the_flag_so_a_copy_keeps_gpu_detection(run_cli, tmp_path, output) -> None:
    # `profiles show local -o yaml`, the profile file to copy, once dropped
    # local.detect_gpus: true (the dump leaves it out of the inputs hash), so a copy lost detection
    shown = run_cli("profiles", "show", "local", "-o", output, "--profiles-dir", str(PROFILES))
    assert shown.code == 0, shown.stderr
    if output == "text":
        assert any(line.split() == ["local.detect_gpus", "true"] for line in shown.stdout.splitlines()), shown.stdout
        return
    import yaml

    doc = json.loads(shown.stdout) if output == "json" else yaml.safe_load(shown.stdout)
    assert doc["local"]["detect_gpus"] is True, shown.stdout
    copy = tmp_path / "profiles" / "mine.yaml"
    copy.parent.mkdir()
    copy.write_text(yaml.safe_dump({k: v for k, v in doc.items() if k != "name"}))
    assert load_profile("mine", copy.parent).local.detect_gpus is True
    assert "detect_gpus" not in load_profile("mine", copy.parent).model_dump(mode="json")["local"]  # still not hashed
