"""Loader: YAML errors, unknown keys with did-you-mean, types, overrides, inheritance, lookup."""

from __future__ import annotations

import pytest
import yaml

from jobgen.errors import ConfigError
from jobgen.specs import load
from jobgen.specs.load import apply_overrides, load_profile, load_spec, parse_yaml, search_dirs
from tests.conftest import EXAMPLES, PROFILES, REPO, write


def test_misspelt_key_names_path_and_suggests(tmp_path):
    spec = write(tmp_path / "s.yaml", "name: x\ntrainer:\n  max_step: 10\n")
    with pytest.raises(ConfigError, match=r"trainer\.max_step: unknown key \(did you mean 'max_steps'\?\)") as info:
        load_spec(spec)
    assert info.value.location == str(spec)
    assert "valid keys at trainer" in (info.value.hint or "")


def test_wrong_type_names_path_and_value(tmp_path):
    spec = write(tmp_path / "s.yaml", "name: x\ntrainer:\n  micro_batch_size: lots\n")
    with pytest.raises(ConfigError, match=r"trainer\.micro_batch_size: .*integer.*'lots'"):
        load_spec(spec)


def test_yaml_syntax_error_has_line(tmp_path):
    spec = write(tmp_path / "s.yaml", "name: x\ntrainer: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML") as info:
        load_spec(spec)
    assert info.value.location.startswith(f"{spec}:")


#: YAML that makes the two loaders differ if the libyaml one lost a rule: base-60 strings, YAML
#: 1.1 octal/hex/booleans/nulls, floats, timestamps, anchors, flow collections, quoting.
TRICKY_YAML = """\
nodes: 2:4
t: 1:30.5
neg: -1:00
octal: 0o17
old_octal: 017
hex: 0x1F
under: 1_000
yes_no: [yes, no, on, off, y, n]
nulls: [~, null, '']
floats: [1e3, 1.5e-4, .inf, -.inf, .nan]
date: 2024-01-02
time: 2024-01-02T03:04:05Z
anchor: &a {x: 1, y: [1, 2]}
alias: *a
merged: {<<: *a, z: 3}
quoted: ["08", '2:4', "a\\tb"]
block: |
  line one
  line two
folded: >
  one
  two
"""


@pytest.mark.parametrize("source", ["tricky", *sorted(p.relative_to(REPO).as_posix() for d in (EXAMPLES, PROFILES, REPO / "tests" / "golden" / "specs")
                                                   for p in d.glob("*.yaml"))])
def test_the_libyaml_loader_reads_what_the_python_loader_reads(source):
    """``_load_yaml`` parses with libyaml (speed: ``render --all``); every shipped spec and profile
    and the tricky document must come out equal to the pure-Python loader's reading."""
    text = TRICKY_YAML if source == "tricky" else (REPO / source).read_text()
    if load._FastLoader is load._Loader:
        pytest.skip("PyYAML without libyaml: one loader only")
    pure = yaml.load(text, Loader=load._Loader)  # noqa: S506 - a SafeLoader subclass
    assert load._load_yaml(text) == pure
    assert yaml.load(text, Loader=load._FastLoader) == pure  # noqa: S506 - SafeLoader rules


@pytest.mark.parametrize("text", ["a: [1,\n", "a: b: c\n", "a:\n\t- 1\n", "key: 'unterminated\n", "x: \x07\n"])
def test_invalid_yaml_is_reported_as_the_python_loader_reports_it(text):
    """Broken YAML gives PyYAML's own message, line and column, not libyaml's wording."""
    with pytest.raises(yaml.YAMLError) as pure:
        yaml.load(text, Loader=load._Loader)  # noqa: S506 - a SafeLoader subclass
    with pytest.raises(yaml.YAMLError) as used:
        load._load_yaml(text)
    assert str(used.value) == str(pure.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_spec(write(tmp_path / "s.yaml", text))


def test_missing_file():
    with pytest.raises(ConfigError, match="file not found"):
        load_spec("does/not/exist.yaml")


def test_newline_in_shell_value_rejected(tmp_path):
    spec = write(tmp_path / "s.yaml", 'name: x\nenv:\n  FOO: "a\\nb"\n')
    with pytest.raises(ConfigError, match=r"env: .*newlines"):
        load_spec(spec)


def test_bad_env_name_rejected(tmp_path):
    spec = write(tmp_path / "s.yaml", 'name: x\nenv:\n  "1BAD": v\n')
    with pytest.raises(ConfigError, match="not a valid name"):
        load_spec(spec)


def test_overrides_parse_yaml_values_and_split_on_first_equals():
    doc = apply_overrides({"trainer": {"max_steps": 5}}, ["trainer.max_steps=20", "env.A=x=y", "data.paths=[a, b]", "name='08'"])
    assert doc == {"trainer": {"max_steps": 20}, "env": {"A": "x=y"}, "data": {"paths": ["a", "b"]}, "name": "08"}


@pytest.mark.parametrize("bad", ["novalue", "=x", "a..b=1"])
def test_bad_override(bad):
    with pytest.raises(ConfigError, match="override"):
        apply_overrides({}, [bad])


def test_override_through_scalar_is_an_error():
    with pytest.raises(ConfigError, match="is a str, not a mapping"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_override_reaches_validation(tmp_path):
    spec = write(tmp_path / "s.yaml", "name: x\n")
    assert load_spec(spec, ["trainer.max_steps=77"]).trainer.max_steps == 77
    with pytest.raises(ConfigError, match=r"trainer\.max_stepz: unknown key"):
        load_spec(spec, ["trainer.max_stepz=77"])


def test_extends_merges_nested_sections():
    h100 = load_profile("slurm-h100", PROFILES)
    a100 = load_profile("slurm-a100", PROFILES)
    assert h100.gpu_type == "H100" and a100.gpu_type == "A100"
    assert h100.slurm.partition == "h100"
    assert h100.slurm.requeue_signal == a100.slurm.requeue_signal  # inherited
    assert h100.slurm.gres_gpu_type is None  # explicitly reset by the child
    assert h100.name == "slurm-h100"


def test_extends_cycle(tmp_path):
    write(tmp_path / "a.yaml", "extends: b\nscheduler: local\n")
    write(tmp_path / "b.yaml", "extends: a\n")
    with pytest.raises(ConfigError, match="inheritance cycle: a -> b -> a"):
        load_profile("a", tmp_path)


def test_unknown_profile_suggests(tmp_path):
    with pytest.raises(ConfigError, match="unknown profile 'slurm-a10'") as info:
        load_profile("slurm-a10", PROFILES)
    assert "did you mean 'slurm-a100'" in info.value.hint


def test_profile_dir_flag_wins_over_packaged(tmp_path):
    write(tmp_path / "local.yaml", "scheduler: local\ncpu_processes_per_node: 1\ndescription: mine\n")
    assert load_profile("local", tmp_path).description == "mine"
    assert search_dirs("cluster_profiles", tmp_path)[0] == tmp_path


def test_jobgen_home_comes_before_cwd(tmp_path, monkeypatch):
    write(tmp_path / "home" / "cluster_profiles" / "local.yaml", "scheduler: local\ndescription: from home\n")
    monkeypatch.setenv("JOBGEN_HOME", str(tmp_path / "home"))
    assert load_profile("local").description == "from home"


def test_container_runtime_needs_image(tmp_path):
    write(tmp_path / "p.yaml", "scheduler: slurm\nslurm:\n  container:\n    runtime: pyxis\n")
    with pytest.raises(ConfigError, match=r"slurm\.container: You set `container.runtime: pyxis`, but no `container.image`"):
        load_profile("p", tmp_path)


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_example_loads(example):
    assert load_spec(example).name


@pytest.mark.parametrize("profile", sorted(PROFILES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_loads(profile):
    assert load_profile(profile.stem, PROFILES).name == profile.stem


def test_empty_document_is_empty_mapping():
    assert parse_yaml("", "x") == {}


def test_warmup_ratio_becomes_warmup_steps_of_the_overridden_max_steps_and_reads_back(tmp_path):
    spec = write(tmp_path / "s.yaml", "name: x\ntrainer:\n  max_steps: 1000\n  warmup_ratio: 0.03\n")
    loaded = load_spec(spec, ["trainer.max_steps=250"])
    assert loaded.trainer.warmup_steps == 8  # ceil(0.03 x 250), Hugging Face's rule
    doc = loaded.model_dump(mode="json")
    assert (doc["trainer"]["warmup_ratio"], doc["trainer"]["warmup_steps"]) == (0.03, 8)
    assert type(loaded).model_validate(doc) == loaded  # spec.json holds both; they agree


@pytest.mark.parametrize(("trainer", "message"), [
    ("warmup_ratio: 0.1\n  warmup_steps: 5", r"trainer: .*warmup_steps=5 and warmup_ratio=0.1 \(= 100 of max_steps 1000\) disagree"),
    ("warmup_ratio: 0.1\n  max_steps: null\n  max_epochs: 2", r"warmup_ratio is a fraction of max_steps, which is null"),
    ("warmup_ratio: 1.5", r"trainer\.warmup_ratio: .*less than 1"),
    ("lr_schedule: linear", r"trainer\.lr_schedule: .*'cosine' or 'constant'"),
    ("compile: true\n  strategy: deepspeed_stage_2", r"compile with 'deepspeed_stage_2'"),
])
def test_schedule_and_compile_mistakes_name_the_field(tmp_path, trainer, message):
    spec = write(tmp_path / "s.yaml", f"name: x\ntrainer:\n  {trainer}\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_spec(spec)
    assert info.value.location == str(spec)
