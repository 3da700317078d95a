"""The user's own classes in a spec (``model``/``data`` as ``{class_path, init_args}``), the
trainer options they need, and smoke runs: parsing, the rules between fields, and the paths
and hints of every error. Pure: nothing here imports torch or the user's code."""

from __future__ import annotations

import json
import os

import pytest

from jobgen import api
from jobgen.errors import ConfigError, PlanError
from jobgen.planning.rules import check_batch, resolve_world
from jobgen.specs.load import load_profile, load_spec
from jobgen.specs.training import ClassSpec, DataSpec, ModelSpec, TrainingSpec
from tests.conftest import EXAMPLES, PROFILES, write

USER = """\
name: mine
model:
  class_path: my_pkg.models.Net
  init_args: {hidden: 32, lr: 0.01, layers: {b: 2, a: 1}}
data:
  class_path: my_pkg.data.Data
"""


def _spec(tmp_path, text: str, *overrides: str) -> TrainingSpec:
    return load_spec(write(tmp_path / "s.yaml", text), list(overrides))


def _error(tmp_path, text: str, *overrides: str) -> ConfigError:
    path = write(tmp_path / "s.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_spec(path, list(overrides))
    assert info.value.location == str(path)  # the file is named
    return info.value


def test_class_path_selects_class_spec_and_serialises_sorted(tmp_path):
    spec = _spec(tmp_path, USER)
    assert isinstance(spec.model, ClassSpec) and isinstance(spec.data, ClassSpec) and spec.user_code
    assert spec.model.init_args == {"hidden": 32, "layers": {"a": 1, "b": 2}, "lr": 0.01}
    doc = spec.model_dump(mode="json")
    assert list(doc["model"]["init_args"]) == ["hidden", "layers", "lr"]
    assert list(doc["model"]["init_args"]["layers"]) == ["a", "b"]
    assert doc["data"] == {"class_path": "my_pkg.data.Data", "init_args": {}}
    # jobgen's optimiser settings do not apply to a class_path model: not written, and reading
    # the written spec back gives the same spec (spec.json round trip)
    assert not {"learning_rate", "warmup_steps", "weight_decay"} & set(doc["trainer"])
    assert TrainingSpec.model_validate_json(spec.model_dump_json()) == spec
    assert "smoke" not in doc and "max_epochs" not in doc["trainer"]


def test_builtin_specs_still_select_the_builtin_models():
    spec = load_spec(EXAMPLES / "quickstart.yaml")
    assert isinstance(spec.model, ModelSpec) and isinstance(spec.data, DataSpec) and not spec.user_code


@pytest.mark.parametrize(("text", "path", "words"), [
    (USER.replace("init_args: {hidden", "init_arg: {hidden"), r"model\.init_arg: unknown key \(did you mean 'init_args'\?\)", None),
    (USER.replace("my_pkg.models.Net", "Net"), r"model\.class_path: 'Net' is not a dotted class path", None),
    (USER.replace("my_pkg.models.Net", "my-pkg.Net"), r"model\.class_path: 'my-pkg.Net' is not a dotted class path", None),
    (USER.replace("lr: 0.01", "lr: 2024-01-01"), r"model\.init_args: init_args\.lr: a date is not a JSON value", None),
    ("name: x\nmodel: {class_path: a.B}\n", r"^invalid configuration:\n    data: model\.class_path \(a\.B\) needs data\.class_path", None),
    ("name: x\ndata: {class_path: a.D}\n", r"data: data\.class_path \(a\.D\) needs model\.class_path", None),
    (USER + "trainer: {learning_rate: 0.1, weight_decay: 0.0}\n",
     r"trainer: learning_rate, weight_decay: jobgen's optimiser settings .* set the learning rate in model\.init_args", None),
    (USER.replace("my_pkg.data.Data", "my_pkg.data.Data\n  init_args: {batch_size: 4}") + "trainer: {micro_batch_size: 8}\n",
     r"data\.init_args\.batch_size: 4 but trainer\.micro_batch_size is 8", None),
    ("name: x\nmodel: {presett: tiny}\n", r"model\.presett: unknown key \(did you mean 'preset'\?\)", "valid keys at model: block_size"),
])
def test_class_spec_errors_name_the_field(tmp_path, text, path, words):
    err = _error(tmp_path, text)
    assert "branch" not in str(err)  # pydantic's union tags never reach the user
    import re

    assert re.search(path, err.message, re.M), err.message
    if words:
        assert words in (err.hint or "")


def test_unknown_key_in_class_spec_hints_its_own_keys(tmp_path):
    err = _error(tmp_path, USER.replace("init_args: {hidden", "init_arg: {hidden"))
    assert err.hint == "valid keys at model: class_path, init_args"


def test_batch_size_equal_to_micro_batch_is_fine(tmp_path):
    spec = _spec(tmp_path, USER.replace("my_pkg.data.Data", "my_pkg.data.Data\n  init_args: {batch_size: 8}"))
    assert spec.data.init_args == {"batch_size": 8}


# --------------------------------------------------------------------------- trainer options


@pytest.mark.parametrize(("trainer", "message"), [
    ({"strategy": "fsdp", "find_unused_parameters": True}, r"trainer: find_unused_parameters is a DDP option"),
    ({"fsdp_auto_wrap_policy": ["a.B"]}, r"trainer: fsdp_auto_wrap_policy: FSDP option\(s\) \(strategy is 'ddp'\)"),
    ({"strategy": "deepspeed_stage_2", "fsdp_forward_prefetch": True}, r"fsdp_forward_prefetch: FSDP option"),
    ({"strategy": "fsdp", "fsdp_auto_wrap_policy": ["Block"]}, r"trainer\.fsdp_auto_wrap_policy: 'Block' is not a dotted class path"),
    ({"strategy": "deepspeed_stage_2", "gradient_clip_algorithm": "value"}, r"gradient_clip_algorithm 'value' with strategy 'deepspeed_stage_2'"),
    ({"gradient_accumulation_schedule": {1: 4}}, r"trainer\.gradient_accumulation_schedule: the schedule must start at epoch 0"),
    ({"gradient_accumulation_schedule": {0: 0}}, r"accumulation factors >= 1"),
    ({"gradient_accumulation_schedule": {0: 4}, "gradient_accumulation_steps": 2},
     r"gradient_accumulation_steps=2 but gradient_accumulation_schedule starts with 4"),
    ({"strategy": "deepspeed_stage_1", "gradient_accumulation_schedule": {0: 4}}, r"DeepSpeed fixes the batch"),
    ({"max_steps": None}, r"max_steps is null and max_epochs is not set"),
    ({"profiler": "fancy"}, r"trainer\.profiler: Input should be 'simple', 'advanced' or 'pytorch'"),
    ({"strategy": "fsdp", "activation_checkpointing": True},
     r"trainer\.activation_checkpointing: with model\.class_path, name the classes to recompute"),
    ({"compile": True}, r"trainer\.compile: trainer\.compile compiles jobgen's built-in networks"),
    ({"lr_schedule": "constant"}, r"trainer: lr_schedule: jobgen's optimiser settings"),
])
def test_trainer_option_rules(tmp_path, trainer, message):
    err = _error(tmp_path, USER + "trainer: " + json.dumps(trainer) + "\n")
    import re

    assert re.search(message, err.message), err.message


@pytest.mark.parametrize("key, value", [("max_epochs", 3), ("gradient_accumulation_schedule", {0: 2})])
def test_epoch_options_need_a_user_data_module(tmp_path, key, value):
    err = _error(tmp_path, "name: x\ntrainer: " + json.dumps({key: value}) + "\n")
    assert f"trainer.{key}: {key} needs data.class_path" in err.message


def test_trainer_options_for_a_user_module_parse_and_serialise(tmp_path):
    options = {
        "strategy": "fsdp", "max_steps": None, "max_epochs": 3, "gradient_accumulation_schedule": {0: 4, 2: 2},
        "gradient_clip_algorithm": "value", "sync_batchnorm": True, "deterministic": True, "benchmark": False,
        "num_sanity_val_steps": 0, "profiler": "simple", "fsdp_auto_wrap_policy": ["my_pkg.models.Block", "my_pkg.models.Attn"],
        "fsdp_activation_checkpointing_policy": ["my_pkg.models.Block"], "fsdp_backward_prefetch": "BACKWARD_POST",
        "fsdp_forward_prefetch": True, "fsdp_limit_all_gathers": False,
    }
    spec = _spec(tmp_path, USER + "trainer: " + json.dumps(options) + "\n")
    t = spec.trainer
    assert t.gradient_accumulation_steps == 4  # the schedule's epoch-0 value
    assert t.fsdp_auto_wrap_policy == ("my_pkg.models.Attn", "my_pkg.models.Block")  # sorted: deterministic
    written = spec.model_dump(mode="json")["trainer"]
    assert written["gradient_accumulation_schedule"] == {"0": 4, "2": 2}
    assert written["max_steps"] is None and written["max_epochs"] == 3
    assert TrainingSpec.model_validate_json(spec.model_dump_json()) == spec


def test_find_unused_parameters_on_ddp_is_fine(tmp_path):
    assert _spec(tmp_path, USER + "trainer: {find_unused_parameters: true}\n").trainer.find_unused_parameters


def test_global_batch_with_a_schedule_is_refused_at_plan_time(tmp_path):
    spec = _spec(tmp_path, USER + "trainer: {gradient_accumulation_schedule: {0: 4, 5: 2}, global_batch_size: 64, micro_batch_size: 8}\n")
    profile = load_profile("local", PROFILES)
    world = resolve_world(spec, profile, "s.yaml")
    with pytest.raises(PlanError, match=r"global batch changes by epoch \(epoch 0\+: 64, epoch 5\+: 32") as info:
        check_batch(spec, world, "s.yaml")
    assert info.value.location == "s.yaml: trainer.global_batch_size"


# --------------------------------------------------------------------------- smoke runs


def test_smoke_plan_says_what_runs(tmp_path):
    path = write(tmp_path / "s.yaml", USER + "trainer: {max_steps: 500, val_check_interval: 100}\n")
    job_plan = api.plan_job(path, "local", profiles_dir=PROFILES, smoke=3)
    spec = json.loads(job_plan.file("spec.json"))["spec"]
    assert job_plan.job_name == "mine-smoke"
    assert spec["smoke"] is True and spec["name"] == "mine-smoke"
    assert spec["trainer"]["max_steps"] == 3 and spec["trainer"]["val_check_interval"] == 3
    assert spec["checkpoint"]["resume"] == "never"


def test_smoke_shortens_the_builtin_warmup():
    spec = load_spec(EXAMPLES / "quickstart.yaml").as_smoke(2)
    assert (spec.trainer.max_steps, spec.trainer.warmup_steps, spec.smoke) == (2, 1, True)


def test_smoke_spec_with_resume_auto_is_refused(tmp_path):
    err = _error(tmp_path, USER + "smoke: true\n")
    assert "checkpoint.resume: smoke: true (a --smoke run) keeps no checkpoints" in err.message


def test_smoke_on_a_rendered_directory_is_refused(run_cli, tmp_path):
    (tmp_path / "job").mkdir()
    result = run_cli("submit", str(tmp_path / "job"), "--smoke", "3")
    assert result.code == 2, result.stderr
    assert "--preflight, --smoke and --sweep apply to spec files" in result.stderr


# --------------------------------------------------------------------------- local runs, jobgen plan


def test_local_ranks_get_relative_pythonpath_entries_made_absolute(tmp_path, monkeypatch):
    from jobgen.backends import get_backend
    from jobgen.backends.base import SubmitOptions
    from jobgen.backends.local import LocalBackend

    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["pkgs/mine", str(tmp_path / "abs")]))
    job_plan = api.plan_job(write(tmp_path / "s.yaml", USER), "local", profiles_dir=PROFILES)
    options = SubmitOptions(runs_dir=tmp_path / "runs")
    backend = get_backend("local")
    job_dir = backend.job_dir(job_plan, tmp_path, options)
    job_plan.write(job_dir)
    ran: list[dict[str, str]] = []
    LocalBackend(runner=lambda argv, cwd, env: ran.append(env) or 0).submit(job_dir, options, lambda _: None, plan=job_plan)
    entries = ran[0]["PYTHONPATH"].split(os.pathsep)
    # the ranks run in the run directory: the user's relative entry must still name tmp_path/pkgs/mine
    assert entries[1:] == [str(tmp_path / "pkgs" / "mine"), str(tmp_path / "abs")]


def test_memory_plan_refuses_a_class_path_model(tmp_path):
    from jobgen.errors import NotSupportedError
    from jobgen.planning.memory_plan import fit_warning, plan_memory

    spec, profile = _spec(tmp_path, USER), load_profile("slurm-a100", PROFILES)
    with pytest.raises(NotSupportedError, match="planning imports no user code unless asked") as info:
        plan_memory(spec, profile, 1, 8, spec_source="team/user.yaml")
    assert info.value.location == "team/user.yaml: model.class_path" and "--import" in info.value.hint
    assert fit_warning(spec, profile, 1, 8) is None  # rendering for a GPU profile still works
