"""Arbitrary YAML documents and --set values give a clean result or a JobgenError, nothing else."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobgen.backends import plan
from jobgen.errors import JobgenError
from jobgen.specs.load import apply_overrides, load_profile, load_spec
from tests.conftest import PROFILES, TEMPLATES

SPEC_KEYS = ["name", "model", "data", "trainer", "resources", "checkpoint", "env", "preset", "n_layer", "n_head",
             "d_model", "block_size", "strategy", "precision", "micro_batch_size", "global_batch_size", "max_steps",
             "warmup_steps", "paths", "nodes", "devices_per_node", "offload_params", "nvme_path", "extends", "scheduler",
             "slurm", "kubernetes", "gpus_per_node", "gpu_type", "container", "runtime", "image"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["ddp", "fsdp", "deepspeed_stage_3", "bf16-mixed", "tiny", "cpu", "nvme", "A100", "slurm"]),
)
keys = st.one_of(st.sampled_from(SPEC_KEYS), st.text(max_size=8), st.integers(-3, 3))
documents = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=25)


def _check(fn, *args):
    try:
        fn(*args)
    except JobgenError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_spec_loader_and_planner_never_crash(tmp_path, doc):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))

    def load_and_plan():
        spec = load_spec(path)
        plan(spec, load_profile("slurm-a100", PROFILES), TEMPLATES)

    _check(load_and_plan)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_profile_loader_never_crashes(tmp_path, doc):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    _check(load_profile, "p", tmp_path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_raw_text_never_crashes(tmp_path, text):
    (tmp_path / "spec.yaml").write_text(text)
    _check(load_spec, tmp_path / "spec.yaml")


@settings(max_examples=300, deadline=None)
@given(overrides=st.lists(st.text(max_size=30), max_size=4), doc=documents)
def test_overrides_never_crash(overrides, doc):
    _check(apply_overrides, doc if isinstance(doc, dict) else {}, overrides)
