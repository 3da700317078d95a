"""`jobgen plan` and the render memory warning, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO


@pytest.fixture(autouse=True)
def no_calibration_file(monkeypatch, tmp_path):
    """No user calibration file: the plan's time prediction rests on the seeded table only, as in
    the docs' examples (a developer's own ``jobgen calibrate`` would change them)."""
    monkeypatch.setenv("JOBGEN_CALIBRATION", str(tmp_path / "calibration.yaml"))

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
SEVEN_B = [a for kv in ("model.preset=null", "model.n_layer=32", "model.n_head=32", "model.d_model=4096",
                        "model.block_size=4096", "trainer.micro_batch_size=1") for a in ("--set", kv)]


def test_plan_table_7b_on_a100(run_cli):
    result = run_cli("plan", QUICKSTART, "--profile", "slurm-a100", *SEVEN_B)
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    ddp = next(line for line in lines if line.strip().startswith("ddp"))
    chosen = [line for line in lines if line.startswith("* ")]
    assert " no " in ddp and "<- spec" in ddp
    assert len(chosen) == 1 and "fsdp:FULL_SHARD" in chosen[0] and " yes " in chosen[0]
    assert "recommended: fsdp:FULL_SHARD" in result.stdout
    assert "warning:" in result.stderr and "will not fit" in result.stderr and "warning" not in result.stdout


def test_plan_json_has_stable_keys(run_cli):
    result = run_cli("plan", QUICKSTART, "-p", "slurm-a100", "--output", "json", *SEVEN_B)
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"accelerator", "assumptions", "budget_bytes", "chosen", "chosen_overrides", "devices_per_node",
                        "host_bytes_per_node", "n_params", "name", "num_nodes", "precision", "prediction", "profile", "reasons",
                        "rows", "spec", "spec_fits", "spec_layout", "suggestions"}
    row = doc["rows"][0]
    assert set(row) == {"activations_bytes", "chosen", "fits", "grads_bytes", "host_bytes_per_node", "is_spec", "layout",
                        "notes", "optimizer_bytes", "overhead_bytes", "overrides", "params_bytes", "total_bytes"}
    assert row["total_bytes"] == sum(row[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                       "activations_bytes", "overhead_bytes"))
    assert doc["chosen"] == "fsdp:FULL_SHARD" and doc["spec_fits"] is False
    again = run_cli("plan", QUICKSTART, "-p", "slurm-a100", "--output", "json", *SEVEN_B)
    assert again.stdout == result.stdout


def test_plan_bad_input_is_a_jobgen_error(run_cli):
    result = run_cli("plan", QUICKSTART, "-p", "slurm-a100", "--set", "trainer.micro_batch_size=0")
    assert result.code == 2 and "trainer.micro_batch_size" in result.stderr and "quickstart.yaml" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("plan", QUICKSTART, "-p", "slurm-a100", "--set", "resources.nodes=99")
    assert result.code == 2 and "resources.nodes" in result.stderr and "hint:" in result.stderr


def test_plan_help(run_cli):
    result = run_cli("plan", "--help")
    assert result.code == 0 and "--output" in result.stdout and "Example" in result.stdout and "ZeRO" in result.stdout


def test_render_warns_on_stderr_and_files_are_unchanged(run_cli, tmp_path):
    plain = run_cli("render", QUICKSTART, "-p", "slurm-a100", "--out", str(tmp_path / "a"))
    assert plain.code == 0 and "warning" not in plain.stderr
    big = run_cli("render", QUICKSTART, "-p", "slurm-a100", "--stdout", *SEVEN_B)
    assert big.code == 0 and "warning:" in big.stderr and "jobgen plan" in big.stderr and "warning" not in big.stdout
    files = {p.name: p.read_bytes() for p in (tmp_path / "a" / "slurm-a100" / "quickstart").iterdir()}
    assert run_cli("render", QUICKSTART, "-p", "slurm-a100", "--out", str(tmp_path / "b")).code == 0
    assert files == {p.name: p.read_bytes() for p in (tmp_path / "b" / "slurm-a100" / "quickstart").iterdir()}


def test_plan_imports_no_heavy_modules():
    code = (
        "import sys\n"
        "from jobgen.cli import main\n"
        "try:\n"
        f"    main(['plan', {QUICKSTART!r}, '--profile', 'slurm-a100'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'deepspeed', 'kubernetes', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_readme_example_is_current(run_cli):
    result = run_cli("plan", QUICKSTART.replace(str(REPO) + "/", ""), "-p", "slurm-a100", *SEVEN_B)
    page = (REPO / "docs" / "large-models.md").read_text()
    shown = result.stdout.split("assumptions:")[0].rstrip()
    assert shown in page, "re-run the `jobgen plan` example of docs/large-models.md and paste its output"


def test_spec_activation_checkpointing_shrinks_every_rows_activations(run_cli):
    base = ("plan", QUICKSTART, "-p", "slurm-a100", "--output", "json", *SEVEN_B, "--set", "trainer.strategy=fsdp")
    plain = json.loads(run_cli(*base).stdout)
    ckpt = json.loads(run_cli(*base, "--set", "trainer.activation_checkpointing=true").stdout)
    for off, on in zip(plain["rows"], ckpt["rows"], strict=True):
        assert off["layout"] == on["layout"]
        if off["activations_bytes"]:  # 0 when the gradients and step temporaries outweigh the activations
            assert on["activations_bytes"] < off["activations_bytes"] / 4, (off, on)
        assert on["total_bytes"] <= off["total_bytes"]
    assert any(r["activations_bytes"] for r in plain["rows"])
    assert any("activation checkpointing on transformer blocks" in a for a in ckpt["assumptions"])


def test_hugging_face_spec_without_a_local_config_renders_and_plan_asks_for_hf_config(run_cli, tmp_path):
    hf = str(REPO / "examples" / "llama-lora-jsonl.yaml")  # hf_path is a cluster path: no config.json here
    rendered = run_cli("render", hf, "-p", "slurm-a100", "--out", str(tmp_path))
    assert rendered.code == 0 and "Traceback" not in rendered.stderr, rendered.stderr
    planned = run_cli("plan", hf, "-p", "slurm-a100")
    assert planned.code == 2 and "Traceback" not in planned.stderr
    assert "model.hf_path" in planned.stderr and "--hf-config" in planned.stderr
    validated = run_cli("validate", hf, "-p", "slurm-a100")
    assert validated.code == 0 and "Hugging Face model" in validated.stdout and "0.0M" not in validated.stdout


LLAMA_CONFIG = str(EXAMPLES / "hf-configs" / "llama-2-7b" / "config.json")
QLORA_FSDP = ("--set", "trainer.strategy=fsdp", "--set", "resources.devices_per_node=4",
              "--set", "model.block_size=2048", "--set", "model.load_in_4bit=true",
              "--set", "model.lora={r: 64, alpha: 16, dropout: 0.05, target_modules: [q_proj, k_proj, v_proj, o_proj, "
                       "gate_proj, up_proj, down_proj]}")


def test_plan_hf_qlora_fsdp_with_hf_config_shows_the_seed_row(run_cli):
    hf = str(REPO / "examples" / "llama-lora-jsonl.yaml")
    result = run_cli("plan", hf, "-p", "slurm-a100", "--hf-config", LLAMA_CONFIG, *QLORA_FSDP)
    assert result.code == 0, result.stderr
    assert "6,738.4M parameters" in result.stdout and "world size 4" in result.stdout
    spec_line = next(line for line in result.stdout.splitlines() if "<- spec" in line)
    assert "fsdp:FULL_SHARD" in spec_line
    seed = next(line for line in result.stdout.splitlines() if "seed table:" in line)
    assert "FSDP + QLoRA on 4 GPU(s)" in seed and "22 GB" in seed and "31,200 tokens/s" in seed and "SparkTrainer" in seed and "tracker" not in seed
    doc = json.loads(run_cli("plan", hf, "-p", "slurm-a100", "--hf-config", LLAMA_CONFIG, "-o", "json", *QLORA_FSDP).stdout)
    spec_row = next(r for r in doc["rows"] if r["is_spec"])
    assert doc["seed"]["measured_bytes_per_gpu"] == 22 * 10**9
    assert doc["seed"]["estimate_bytes_per_gpu"] == spec_row["total_bytes"]
    assert doc["hf"]["config"] == LLAMA_CONFIG and doc["hf"]["mode"] == "qlora"


def test_readme_hf_example_is_current(run_cli):
    hf = "examples/llama-lora-jsonl.yaml"
    config = "examples/hf-configs/llama-2-7b/config.json"
    result = run_cli("plan", hf, "-p", "slurm-a100", "--hf-config", config, *QLORA_FSDP)
    shown = result.stdout.split("assumptions:")[0].rstrip()
    assert shown in (REPO / "docs" / "large-models.md").read_text(), "re-run the Hugging Face `jobgen plan` example of docs/large-models.md"


def test_plan_hf_unknown_target_is_a_clean_error(run_cli):
    hf = str(REPO / "examples" / "llama-lora-jsonl.yaml")
    result = run_cli("plan", hf, "-p", "slurm-a100", "--hf-config", LLAMA_CONFIG,
                     "--set", "model.lora.target_modules=[q_proj, qkv]")
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "model.lora.target_modules" in result.stderr and "down_proj" in result.stderr


def test_plan_hf_imports_no_heavy_modules():
    code = (
        "import sys\n"
        "from jobgen.cli import main\n"
        "try:\n"
        f"    main(['plan', {str(REPO / 'examples' / 'llama-lora-jsonl.yaml')!r}, '-p', 'slurm-a100', '--hf-config', {LLAMA_CONFIG!r}])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'peft', 'lightning', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_help_assumptions_and_readme_describe_the_estimate_alike(run_cli):
    """`plan --help` once called estimates upper bounds while the README called the HF
    figures a floor. One reading everywhere: an estimate of the peak, not a bound."""
    helptext = " ".join(run_cli("plan", "--help").stdout.split())
    assert "Estimates of the peak, not bounds" in helptext
    plan = json.loads(run_cli("plan", QUICKSTART, "-p", "slurm-a100", "--output", "json").stdout)
    assert any("an estimate of the peak, not a bound" in a for a in plan["assumptions"])
    page = (REPO / "docs" / "large-models.md").read_text()
    section = " ".join(page.split("## Memory plan: `jobgen plan`")[1].split("\n## ")[0].split())
    assert "estimates of the peak, not bounds" in section and "estimate the peak; they are not bounds" in section
    for claim in ("upper bound", "upper-bound", "as a floor"):
        assert claim not in section and claim not in helptext, claim
