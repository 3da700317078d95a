"""Bad input to ``python -m jobgen.train``: exit 2, one clear line on stderr, no traceback.

These checks run before torch/Lightning are imported, so each subprocess takes well under a
second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobgen.errors import ConfigError
from jobgen.jobdir import ResolvedSpec, load_resolved_spec
from jobgen.jobdir.world import World
from jobgen.specs.training import TrainingSpec
from jobgen.train.resolved import load_deepspeed_config

ERROR_PREFIX = "python -m jobgen.train: error:"


def _assert_clean_error(result: Any, *fragments: str) -> None:
    assert result.code == 2, result.output
    assert "Traceback" not in result.stderr, result.output
    error_lines = [line for line in result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(error_lines) == 1, result.output
    for fragment in fragments:
        assert fragment in error_lines[0], result.output


def test_missing_spec_file(run_entrypoint) -> None:
    _assert_clean_error(run_entrypoint("--spec", "nope.json"), "nope.json", "cannot read the resolved spec")


def test_spec_file_that_is_not_json(run_entrypoint, tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text("name: tiny\n")
    _assert_clean_error(run_entrypoint("--spec", "spec.json"), "not valid JSON", "line 1")


def test_invalid_field_names_its_json_path(run_entrypoint, resolved_doc, tiny_spec, tmp_path: Path) -> None:
    doc = resolved_doc(tiny_spec)
    doc["spec"]["trainer"]["max_steps"] = 0
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    _assert_clean_error(
        run_entrypoint("--spec", "spec.json"), "spec.trainer.max_steps", "greater than or equal to 1"
    )


def test_world_size_must_be_nodes_times_devices(run_entrypoint, write_spec) -> None:
    write_spec(world_size=3)
    _assert_clean_error(run_entrypoint("--spec", "spec.json"), "launch", "world_size=3")


def test_deepspeed_on_cpu_without_its_config_is_refused(run_entrypoint, write_spec) -> None:
    """DeepSpeed runs on CPU ranks (see test_strategy_matrix.py), configured by the rendered file."""
    write_spec({"trainer": {"strategy": "deepspeed_stage_2"}})
    _assert_clean_error(
        run_entrypoint("--spec", "spec.json"), "launch.deepspeed_config", "needs launch.deepspeed_config"
    )


@pytest.mark.slow
def test_hand_edited_deepspeed_config_is_checked(run_entrypoint, write_spec, tmp_path: Path) -> None:
    """What DeepSpeed's validator accepts but ignores is refused before training."""
    (tmp_path / "ds_config.json").write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    )
    write_spec({"trainer": {"strategy": "deepspeed_stage_2"}}, deepspeed_config="ds_config.json")
    _assert_clean_error(
        run_entrypoint("--spec", "spec.json"),
        "ds_config.json: zero_optimization.offload_param",
        "only ZeRO stage 3 partitions parameters",
    )


def test_fsdp_hybrid_shard_on_cpu_is_refused(run_entrypoint, write_spec) -> None:
    write_spec({"trainer": {"strategy": "fsdp", "fsdp_sharding_strategy": "HYBRID_SHARD"}})
    _assert_clean_error(
        run_entrypoint("--spec", "spec.json"), "spec.trainer.fsdp_sharding_strategy", "'HYBRID_SHARD'`, but this node has no GPUs"
    )


def test_fp16_on_cpu_is_refused(run_entrypoint, write_spec) -> None:
    write_spec({"trainer": {"precision": "16-mixed"}})
    _assert_clean_error(run_entrypoint("--spec", "spec.json"), "'16-mixed'", "fp16 needs a CUDA GPU")


def test_data_paths_matching_nothing(run_entrypoint, write_spec) -> None:
    write_spec({"data": {"paths": ["texts/*.md"]}})
    _assert_clean_error(
        run_entrypoint("--spec", "spec.json"), "spec.data.paths[0]", "'texts/*.md' matches no files"
    )


def test_an_input_error_names_the_users_spec_file_and_field(run_entrypoint, write_spec, monkeypatch) -> None:
    """`jobgen submit` tells the ranks the user's spec file
    ($JOBGEN_SPEC_SOURCE): a spec field's error names it and the field as the user wrote it, not
    spec.json's ``spec.`` path; a hostile value (a newline, an escape sequence) cannot break the
    one-line error or reach the terminal raw."""
    write_spec({"data": {"paths": ["texts/*.md"]}})
    monkeypatch.setenv("JOBGEN_SPEC_SOURCE", "/home/me/my specs/run.yaml")
    _assert_clean_error(run_entrypoint("--spec", "spec.json"), "/home/me/my specs/run.yaml: data.paths[0]: 'texts/*.md' matches no files")
    monkeypatch.setenv("JOBGEN_SPEC_SOURCE", "evil\x1b[31m\nname" + "x" * 300 + ".yaml")
    result = run_entrypoint("--spec", "spec.json")
    _assert_clean_error(result, "data.paths[0]: 'texts/*.md' matches no files", "\\x1b[31m")
    assert "\x1b" not in result.stderr, result.stderr
    monkeypatch.delenv("JOBGEN_SPEC_SOURCE")  # a job directory submitted as is: spec.json's own path
    _assert_clean_error(run_entrypoint("--spec", "spec.json"), "spec.json: spec.data.paths[0]")


def test_too_little_text(run_entrypoint, write_spec, tmp_path: Path) -> None:
    (tmp_path / "small.txt").write_text("tiny corpus\n" * 20)
    write_spec({"data": {"paths": ["small.txt"]}})
    _assert_clean_error(
        run_entrypoint("--spec", "spec.json"), "too little training text", "block_size + 1 = 65"
    )


def test_missing_spec_argument_is_a_usage_error(run_entrypoint) -> None:
    result = run_entrypoint()
    assert result.code == 2
    assert "--spec" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("where", "path"), [("top", "planner_note"), ("launch", "launch.master_port")])
def test_unknown_keys_are_refused_with_the_path(resolved_doc, tiny_spec, tmp_path: Path, where: str, path: str) -> None:
    """spec.json is the job directory's contract (extra="forbid"): a key this jobgen does not
    write is an error naming the file and field, never silently dropped."""
    doc = resolved_doc(tiny_spec)
    (doc if where == "top" else doc["launch"])[path.rpartition(".")[2]] = "x"
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="Extra inputs are not permitted") as info:
        load_resolved_spec(tmp_path / "spec.json")
    assert info.value.location == f"{tmp_path / 'spec.json'}: {path}" and "re-render" in (info.value.hint or "")


def test_unknown_requeue_signal_is_rejected(resolved_doc, tiny_spec, tmp_path: Path) -> None:
    doc = resolved_doc(tiny_spec, scheduler="slurm", requeue_signal="SIGUSR2")
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="unknown signal 'SIGUSR2'"):
        load_resolved_spec(tmp_path / "spec.json")


@pytest.fixture
def deepspeed_spec(tiny_spec) -> dict[str, Any]:
    tiny_spec["trainer"].update(strategy="deepspeed_stage_2", gradient_accumulation_steps=4)
    return tiny_spec


def _write_deepspeed_job(
    tmp_path: Path, resolved_doc, spec: dict[str, Any], ds_config: dict[str, Any]
) -> tuple[Path, ResolvedSpec]:
    job = tmp_path / "job"
    job.mkdir()
    (job / "ds_config.json").write_text(json.dumps(ds_config))
    (job / "spec.json").write_text(
        json.dumps(resolved_doc(spec, accelerator="gpu", deepspeed_config="ds_config.json"))
    )
    resolved = load_resolved_spec(job / "spec.json")
    return job / "spec.json", resolved


def test_rendered_deepspeed_config_is_passed_through_without_accumulation(
    resolved_doc, deepspeed_spec, tmp_path: Path
) -> None:
    from jobgen.planning.deepspeed import deepspeed_config

    rendered = deepspeed_config(spec := TrainingSpec.model_validate(deepspeed_spec),
                                World(1, 2, "cpu", micro_batch_size=spec.trainer.micro_batch_size,
                                      gradient_accumulation_steps=spec.trainer.gradient_accumulation_steps))
    spec_path, resolved = _write_deepspeed_job(tmp_path, resolved_doc, deepspeed_spec, rendered)
    ds_path, config = load_deepspeed_config(resolved, spec_path)
    assert ds_path == tmp_path / "job" / "ds_config.json"  # relative to the spec file, not the cwd
    # Lightning sets gradient_accumulation_steps from Trainer(accumulate_grad_batches) and refuses
    # a config that already has it; everything else is passed through unchanged.
    assert "gradient_accumulation_steps" not in config
    assert config == {k: v for k, v in rendered.items() if k != "gradient_accumulation_steps"}


def test_deepspeed_config_that_disagrees_with_the_spec_is_refused(
    resolved_doc, deepspeed_spec, tmp_path: Path
) -> None:
    ds_config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2},
    }
    spec_path, resolved = _write_deepspeed_job(tmp_path, resolved_doc, deepspeed_spec, ds_config)
    with pytest.raises(
        ConfigError, match="gradient_accumulation_steps=2 in the DeepSpeed config, but the spec gives 4"
    ):
        load_deepspeed_config(resolved, spec_path)
