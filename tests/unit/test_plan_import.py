"""`jobgen plan` on a ``model.class_path`` spec: refused without an import (planning never imports
user code), sized with ``--import`` (the classes imported and bound as ``validate --import`` does,
the model built on PyTorch's meta device to count its parameters; activations not estimated).
In-process through click's CliRunner: torch and Lightning are imported once per test session."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from jobgen.cli import cli
from tests.conftest import EXAMPLES, require, write

USERCODE = str(EXAMPLES / "usercode.yaml")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="jobgen")


@pytest.fixture
def user_path(monkeypatch):
    """The import puts the spec's code directory first on sys.path (as the ranks' PYTHONPATH):
    give it a copy to change, and forget the user modules it imported afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("tinychar", "metafail"):
            del sys.modules[name]


def test_plan_of_a_class_path_spec_without_import_says_how_to_size_it():
    result = invoke("plan", USERCODE, "-p", "slurm-a100")
    assert result.exit_code == 2, result.output
    assert "model.class_path" in result.stderr and "--import" in result.stderr, result.stderr


def test_plan_import_counts_the_built_models_parameters_and_fsdp_units(user_path):
    require("torch")
    result = invoke("plan", USERCODE, "-p", "slurm-a100", "--import", "-o", "json",
                    "--set", "trainer.strategy=fsdp", "--set", "trainer.fsdp_auto_wrap_policy=[tinychar.Block]")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    from tinychar import Block, CharModel  # importable now: the import check put examples/usercode first

    built = CharModel(d_model=64, n_layer=2, lr=0.003)  # examples/usercode.yaml's init_args, on the CPU
    expected = sum(p.numel() for p in built.parameters())
    blocks = [m for m in built.modules() if isinstance(m, Block)]
    assert doc["n_params"] == expected and doc["user"]["trainable_params"] == expected
    assert doc["user"]["class_path"] == "tinychar.CharModel" and doc["user"]["fsdp_units"] == len(blocks) == 2
    assert doc["user"]["largest_unit_params"] == max(sum(p.numel() for p in b.parameters()) for b in blocks)
    assert all(row["activations_bytes"] == 0 for row in doc["rows"])
    ddp = next(row for row in doc["rows"] if row["layout"] == "ddp")
    assert ddp["params_bytes"] == 6 * expected  # bf16-mixed DDP: fp32 weights + autocast's 16-bit copies
    assert any("activations: not estimated" in a and "--smoke" in a for a in doc["assumptions"]), doc["assumptions"]


def test_plan_import_text_names_the_model_and_the_missing_activations(user_path):
    require("torch")
    result = invoke("plan", USERCODE, "-p", "slurm-a100", "--import")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("usercode on slurm-a100: ") and "tinychar.CharModel" in first and "tokens" not in first
    assert "activations: not estimated" in result.stdout


def test_a_model_that_cannot_be_built_on_the_meta_device_is_a_clean_error(user_path, tmp_path):
    require("lightning")
    write(tmp_path / "metafail.py", (
        "import torch\n"
        "from lightning.pytorch import LightningModule\n\n\n"
        "class Net(LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.ones(4))\n"
        "        self.scale = float(self.w.sum())  # needs the values: not on the meta device\n"
    ))
    spec = write(tmp_path / "spec.yaml", json.dumps({
        "name": "metafail", "model": {"class_path": "metafail.Net"},
        "data": {"class_path": "lightning.pytorch.demos.boring_classes.BoringDataModule"}}))
    sys.path.insert(0, str(tmp_path))
    result = invoke("plan", str(spec), "-p", "slurm-a100", "--import")
    assert result.exit_code == 2, result.output
    assert f"{spec}: model.class_path" in result.stderr and "meta device" in result.stderr
    assert "--smoke" in result.stderr and "Traceback" not in result.stderr
