"""Values in a rendered pod reach the container unchanged after the kubelet's ``$(VAR)`` expansion.

Kubernetes expands ``$(NAME)`` references in a container's ``command``, ``args`` and ``env``
values, and reduces every ``$$`` to ``$`` while doing so. :func:`kubelet_expand` is an
independent implementation of those rules, written from their description in the Kubernetes
source (third_party/forked/golang/expansion/expand.go, function ``Expand``) and API reference
(``EnvVar.value``: "Double $$ are reduced to a single $, which allows for escaping the
$(VAR_NAME) syntax"):

- ``$$`` -> ``$`` (the escape);
- ``$(NAME)`` (up to the first ``)``) -> the value of NAME, or the text unchanged when NAME is not
  defined;
- ``$(`` without a closing ``)``, ``$`` before any other character, and a ``$`` at the end of
  the string stay as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jobgen import jobdir
from jobgen.backends import plan
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.errors import JobgenError
from jobgen.specs.load import load_profile, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import ADVERSARIAL, PROFILES, TEMPLATES, write

#: What the training operator / torchrun give every pod, for expanding the launcher's references.
OPERATOR_ENV = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "PET_RDZV_ENDPOINT": "job-master-0:29400"}


def kubelet_expand(text: str, variables: dict[str, str]) -> str:
    """``text`` after the kubelet's expansion with ``variables`` (rules in the module doc)."""
    out, i, n = [], 0, len(text)
    while i < n:
        char = text[i]
        if char != "$" or i + 1 == n:
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = text.find(")", i + 2)
            if close == -1:
                out.append("$(")
                i += 2
            else:
                name = text[i + 2:close]
                out.append(variables[name] if name in variables else text[i:close + 1])
                i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


def test_the_expansion_rules_as_documented():
    variables = {"A": "x", "B": "y"}
    assert kubelet_expand("$(A)-$(B)", variables) == "x-y"
    assert kubelet_expand("$$(A)", variables) == "$(A)"
    assert kubelet_expand("$$$(A)", variables) == "$x"
    assert kubelet_expand("a $$$$(A)", variables) == "a $$(A)"
    assert kubelet_expand("$(UNDEFINED)", variables) == "$(UNDEFINED)"
    assert kubelet_expand("$(A", variables) == "$(A"
    assert kubelet_expand("$HOME ${A} $", variables) == "$HOME ${A} $"
    assert kubelet_expand("$$", variables) == "$"


DOLLAR_TEXT = st.text(alphabet=st.sampled_from("$()AB_x {}\\'\"`"), max_size=24) | st.text(max_size=24)


@given(DOLLAR_TEXT)
@settings(max_examples=300)
def test_kubelet_literal_round_trips_any_string(value):
    variables = {"A": "expanded-A", "B": "expanded-B", "": "expanded-empty", **OPERATOR_ENV}
    assert kubelet_expand(k8s_manifest._kubelet_literal(value), variables) == value


# --------------------------------------------------------------------------- whole manifests


def _render(tmp_path: Path, spec: dict[str, Any], kubernetes: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"extends": str(PROFILES / "k8s-a100.yaml")}
    if kubernetes:
        doc["kubernetes"] = kubernetes
    profile = load_profile(str(write(tmp_path / "site.yaml", yaml.safe_dump(doc))))
    training = validate(TrainingSpec, {"name": "job", **spec}, "<spec>")
    job_plan = plan(training, profile, TEMPLATES, spec_source="spec.yaml", profile_source="site.yaml")
    _, job = k8s_manifest.parse_manifest(job_plan.file(jobdir.PYTORCHJOB_FILE), jobdir.PYTORCHJOB_FILE)
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def _container_view(container: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The env and argv the container process sees: env values expanded in order (each may use
    the ones before it and the operator's), then command + args with the whole env."""
    seen = dict(OPERATOR_ENV)
    env = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = seen[entry["name"]] = kubelet_expand(entry["value"], seen)
    argv = [kubelet_expand(arg, seen) for arg in [*container.get("command", []), *container.get("args", [])]]
    return env, argv


def test_env_values_from_the_issue_reach_the_container_unchanged(tmp_path):
    values = {"JG_X": "a $$$(JG_Y)", "JG_Y": "y", "JG_Z": "$$(MASTER_ADDR)", "JG_W": "$(MASTER_ADDR)",
              **{f"JG_ADV{i}": v for i, v in enumerate(ADVERSARIAL)}}
    env, argv = _container_view(_render(tmp_path, {"env": values}))
    assert {k: env[k] for k in values} == values
    assert "--master-addr=job-master-0" in argv  # jobgen's own references still expand


def test_command_mode_args_and_python_reach_the_container_unchanged(tmp_path):
    args = ["--price=$$5", "$(MASTER_ADDR)", "a $$$(JG_Y)", "$$", "cost: 3$"]
    container = _render(tmp_path, {"entrypoint": {"module": "mypkg.train", "args": args}, "env": {"JG_Y": "y"}},
                        {"python": "/opt/$$venv/bin/python"})
    _, argv = _container_view(container)
    assert argv[0] == "/opt/$$venv/bin/python"
    assert argv[-len(args):] == args


@given(st.lists(st.text(alphabet=st.sampled_from("$$$()AB_x -"), max_size=12), min_size=1, max_size=3),
       st.text(alphabet=st.sampled_from("$$$()JG_Y -"), max_size=16))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_env_value_and_arg_round_trips_through_a_manifest(tmp_path, args, value):
    try:
        container = _render(tmp_path, {"entrypoint": {"module": "mypkg.train", "args": args},
                                       "env": {"JG_V": value, "JG_Y": "y"}})
    except JobgenError:
        assume(False)  # a value the spec refuses never reaches a manifest
    env, argv = _container_view(container)
    assert env["JG_V"] == value
    assert argv[-len(args):] == args


def test_the_code_checkout_script_is_written_as_it_runs():
    """``code.git``'s ``sh -c`` script goes into the command as is: it must hold no ``$$`` or
    ``$(`` (it uses backquotes for command substitution), or the kubelet would change it."""
    variables = {**OPERATOR_ENV, "JOBGEN_CODE_DIR": "/code/x", "JOBGEN_CODE_URL": "u", "JOBGEN_CODE_REF": "r", "dest": "d"}
    assert kubelet_expand(k8s_manifest.CHECKOUT_SCRIPT, variables) == k8s_manifest.CHECKOUT_SCRIPT
