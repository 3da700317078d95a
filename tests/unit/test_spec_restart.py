"""The spec's restart budget (``restart.max_restarts``): what it accepts, how it is refused,
and that spec.json carries it only when set."""

from __future__ import annotations

import pytest

from jobgen.errors import ConfigError
from jobgen.specs.load import validate
from jobgen.specs.training import MAX_RESTARTS, RestartSpec, TrainingSpec


def spec(restart: object) -> TrainingSpec:
    return validate(TrainingSpec, {"name": "job", "restart": restart}, "spec.yaml")


@pytest.mark.parametrize("budget", [0, 1, MAX_RESTARTS])
def test_a_budget_in_range_is_kept(budget):
    assert spec({"max_restarts": budget}).restart.max_restarts == budget


def test_the_default_is_no_restart_and_stays_out_of_spec_json():
    plain = validate(TrainingSpec, {"name": "job"}, "spec.yaml")
    assert plain.restart == RestartSpec() and plain.restart.max_restarts == 0
    assert "restart" not in plain.model_dump(mode="json")
    assert "restart" not in spec({"max_restarts": 0}).model_dump(mode="json")
    dumped = spec({"max_restarts": 3}).model_dump(mode="json")
    assert dumped["restart"] == {"max_restarts": 3, "exclude_failed_nodes": True}
    assert TrainingSpec.model_validate(dumped).restart.max_restarts == 3  # spec.json reads back


@pytest.mark.parametrize(("given", "says"), [
    (-1, "-1 restarts is outside 0 to 100"), (MAX_RESTARTS + 1, "101 restarts is outside 0 to 100"), (10**30, "is outside 0 to 100"),
    ("3", "give a whole number of restarts"), (3.0, "give a whole number"), (True, "give a whole number"),
    (None, "give a whole number"), ("x" * 300 + "\n\x1b[2J", "give a whole number"), ([3], "give a whole number"),
])
def test_a_bad_budget_is_refused_naming_the_field_and_the_fix(given, says):
    with pytest.raises(ConfigError) as caught:
        spec({"max_restarts": given})
    text = str(caught.value)
    assert "restart.max_restarts: " in text and says in text and "spec.yaml" in text
    assert "0 to 100" in text
    assert "\x1b" not in text and text.count("\n") <= 2  # the value is shown as its repr, cut: one line each


def test_unknown_keys_of_restart_are_refused_with_the_valid_ones():
    with pytest.raises(ConfigError) as caught:
        spec({"max_restart": 3})
    assert "restart.max_restart: unknown key (did you mean 'max_restarts'?)" in str(caught.value)
    with pytest.raises(ConfigError, match="restart: "):
        spec(3)
