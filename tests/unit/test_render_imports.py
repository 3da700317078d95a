"""What a render imports (behaviour, not timing; `python benchmarks/render.py` times it).

A SLURM render needs jinja2, yaml, click and pydantic; the training stack, the Kubernetes client
and the offline validators must stay off its path. A Kubernetes render loads the validators
(it validates every manifest offline) but still neither the client nor the training stack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO

TRAINING_STACK = ("torch", "lightning", "deepspeed", "numpy", "transformers", "peft")
VALIDATORS = ("jsonschema", "kubernetes_validate", "referencing")
#: jobgen modules a SLURM render has no use for: every Kubernetes module and the entrypoint.
#: (jobgen.planning.sweep and jobgen.planning.project are not: every `jobgen render` plans through them, and
#: they take what they need for kustomizations from the plan, so they import no Kubernetes module.)
OFF_THE_SLURM_PATH = ("jobgen.backends.kubernetes.validate", "jobgen.backends.kubernetes.manifest", "jobgen.backends.kubernetes.api",
                      "jobgen.backends.kubernetes.backend", "jobgen.backends.kubernetes.pods",
                      "jobgen.train", "jobgen.backends.slurm.submitit_executor")
#: jobgen modules a single render of a non-DeepSpeed spec has no use for (as profiled):
#: DeepSpeed's config (DeepSpeed specs only), the code snapshot and its tarfile (submit only),
#: the project file's model (--all only) and git (--commit only).
OFF_THE_SINGLE_RENDER_PATH = ("jobgen.planning.deepspeed", "jobgen.usercode.snapshot", "tarfile", "jobgen.specs.project", "jobgen.gitops.git")


def modules_after_render(profile: str, example: str = "quickstart.yaml") -> set[str]:
    """Names in sys.modules after ``jobgen render examples/<example> -p PROFILE --stdout`` run
    through ``jobgen.cli.main`` in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from jobgen.cli import main\n"
        "try:\n"
        f"    main(['render', {str(EXAMPLES / example)!r}, '--profile', {profile!r}, '--stdout'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('MODULES', json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):]))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` (packages or modules) are loaded, submodules counted."""
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_slurm_render_imports_neither_training_stack_nor_kubernetes_nor_validators():
    modules = modules_after_render("slurm-a100")
    assert loaded(modules, (*TRAINING_STACK, "kubernetes", *VALIDATORS, *OFF_THE_SLURM_PATH, "submitit")) == []


def test_kubernetes_render_loads_the_validators_but_not_the_client_or_training_stack():
    pytest.importorskip("jsonschema", reason="jsonschema not installed (pip install -e .[k8s])")
    modules = modules_after_render("k8s-h100")
    assert loaded(modules, (*TRAINING_STACK, "kubernetes")) == []
    assert "jsonschema" in modules and "jobgen.backends.kubernetes.validate" in modules


def test_rendering_a_class_path_spec_imports_neither_user_code_nor_the_training_stack():
    # examples/usercode.yaml names tinychar.CharModel: rendering checks the path's shape only
    modules = modules_after_render("slurm-a100", "usercode.yaml")
    assert loaded(modules, (*TRAINING_STACK, "jsonargparse", "tinychar", "jobgen.usercode.classes", *OFF_THE_SLURM_PATH)) == []


@pytest.mark.parametrize("profile", ["slurm-a100", "k8s-h100"])
def test_a_single_render_leaves_deepspeed_snapshot_project_and_git_alone(profile):
    if profile.startswith("k8s"):
        pytest.importorskip("jsonschema", reason="jsonschema not installed (pip install -e .[k8s])")
    assert loaded(modules_after_render(profile), OFF_THE_SINGLE_RENDER_PATH) == []


def test_a_deepspeed_spec_still_renders_its_config():
    assert "jobgen.planning.deepspeed" in modules_after_render("slurm-h100", "gpt2-350m-zero3.yaml")


def test_a_numbered_batch_render_leaves_the_memory_plan_alone():
    # quickstart.yaml sets micro_batch_size: 16; only `auto` needs the search (jobgen.planning.micro_batch)
    # and the Hugging Face memory plan under it (jobgen.planning.estimate_hf)
    assert loaded(modules_after_render("slurm-a100"), ("jobgen.planning.estimate_hf", "jobgen.planning.micro_batch")) == []
