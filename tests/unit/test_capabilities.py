"""What each backend supports is data (:mod:`jobgen.specs.capabilities`), not scheduler-name
comparisons spread over the code.

- Outside ``jobgen/backends/`` no code compares a value with a backend's name or handle scheme
  (``scheduler == "slurm"``, ``scheme in ("local", "ssh")``, ``match``/``case "kubernetes"``): the
  source is read with :mod:`ast`, nothing is imported. One place is allowed: the handle URI's own
  syntax (:attr:`jobgen.jobdir.submission.JobHandle.cluster`, where each scheme puts its cluster).
- The table has one entry per backend of :data:`jobgen.backends.BACKENDS`, a reason for every
  capability a backend lacks, and nothing heavy on its import path.
- Refusals print the table's reasons (planned on the shipped profiles).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import jobgen
from jobgen.backends import BACKENDS, plan
from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir.submission import HANDLE_SCHEMES, JobHandle
from jobgen.specs.capabilities import CAPABILITIES, REFUSABLE, Capabilities, Refusal, capabilities, capabilities_table
from jobgen.specs.load import load_profile, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, REPO, TEMPLATES

PACKAGE = Path(jobgen.__file__).parent
#: Values that name a backend: scheduler names and handle schemes.
NAMES = frozenset(CAPABILITIES) | frozenset(HANDLE_SCHEMES)
#: ``(file under jobgen/, qualified function)`` allowed to compare with a name, and why.
ALLOWED = {("jobdir/submission.py", "JobHandle.cluster"): "the handle URI's syntax: where each scheme puts the cluster"}


def _literals(node: ast.AST) -> set[str]:
    """The string constants of ``node``: a constant, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_literals(e) for e in node.elts)) if node.elts else set()
    return set()


def name_comparisons(source: str, names: frozenset[str] = NAMES) -> list[tuple[str, int, str]]:
    """``(qualified function, line, code)`` of every comparison of a value with one of ``names``
    in ``source``: ``==``/``!=``/``in``/``not in``/``is`` against a string constant or a
    tuple/list/set of them, and ``case`` patterns of such constants."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = (*scope, node.name)
        hit = None
        if isinstance(node, ast.Compare) and any(_literals(x) & names for x in (node.left, *node.comparators)):
            hit = node
        elif isinstance(node, ast.MatchValue) and _literals(node.value) & names:
            hit = node
        if hit is not None:
            found.append((".".join(scope), hit.lineno, ast.unparse(hit)))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(ast.parse(source), ())
    return found


def test_no_code_outside_the_backends_compares_a_backend_name():
    """Capabilities come from the table; only jobgen/backends/ (each backend's own code) names itself."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("backends/"):
            continue
        for scope, line, code in name_comparisons(path.read_text(encoding="utf-8")):
            if (rel, scope) not in ALLOWED:
                wrong.append(f"jobgen/{rel}:{line} ({scope or 'module'}): {code}")
    assert not wrong, ("compare with a backend's name outside jobgen/backends/; look the capability up instead "
                       "(jobgen.specs.capabilities.capabilities(scheduler).<capability>, its refusal's reason):\n  "
                       + "\n  ".join(wrong))


def test_the_allowed_places_still_exist():
    """An allowance for code that no longer compares would hide the next comparison put there."""
    for rel, scope in ALLOWED:
        assert any(s == scope for s, _, _ in name_comparisons((PACKAGE / rel).read_text(encoding="utf-8"))), (rel, scope)


# --- the walker itself, on made-up sources (so a walker that sees nothing cannot pass) ---

@pytest.mark.parametrize("source", [
    'if profile.scheduler == "slurm":\n    pass\n',
    'ok = "kubernetes" != launch.scheduler\n',
    'ok = scheduler in ("local", "ssh")\n',
    'ok = kind not in ["ssh"]\n',
    'ok = handle.scheme == "k8s"\n',
    'ok = getattr(profile, "scheduler", "") == "local"\n',
    'match scheduler:\n    case "slurm":\n        pass\n',
    'def f(p):\n    return 1 if p.scheduler == "ssh" else 2\n',
])
def test_the_walker_finds_a_comparison(source):
    assert len(name_comparisons(source)) == 1


@pytest.mark.parametrize("source", [
    'ok = scheduler == other\n',
    'ok = name == "slurmd"\n',
    'ok = {"slurm": 1}["slurm"]\n',
    'ok = capabilities(scheduler).elastic\n',
    'ok = kind == "pcie"\n',
])
def test_the_walker_leaves_other_code_alone(source):
    assert name_comparisons(source) == []


def test_the_walker_names_the_function():
    source = "class JobHandle:\n    def cluster(self):\n        return self.scheme == 'local'\n"
    assert name_comparisons(source) == [("JobHandle.cluster", 3, "self.scheme == 'local'")]


# --- the table ---

def test_one_entry_per_backend_and_handle_scheme():
    assert set(CAPABILITIES) == set(BACKENDS)
    assert all(name == caps.name for name, caps in CAPABILITIES.items())
    assert {caps.handle_scheme: name for name, caps in CAPABILITIES.items()} == HANDLE_SCHEMES
    for name, caps in CAPABILITIES.items():  # every scheme parses back to its backend
        assert JobHandle.parse(f"{caps.handle_scheme}://c/1").scheduler == name


def test_every_missing_capability_has_a_reason_and_only_those():
    for caps in CAPABILITIES.values():
        assert set(caps.refusals) == {c for c, ok in caps.supports().items() if not ok}, caps.name
        for capability, refusal in caps.refusals.items():
            assert refusal.reason and not refusal.reason.endswith("."), (caps.name, capability)  # callers end the sentence
            assert "\n" not in refusal.reason + refusal.fix
            assert "{" not in refusal.hint(min_nodes=1, max_nodes=2)  # every field of a fix is one the callers fill


def test_an_entry_without_a_reason_for_what_it_lacks_is_refused_at_import():
    local = CAPABILITIES["local"]
    fields = {f: getattr(local, f) for f in Capabilities.__dataclass_fields__ if f != "refusals"}
    with pytest.raises(ValueError, match=r"local: refusals must name exactly the capabilities it lacks.*'elastic'"):
        Capabilities(**fields, refusals={k: v for k, v in local.refusals.items() if k != "elastic"})
    with pytest.raises(ValueError, match="refusals must name exactly"):  # a reason for what it has
        Capabilities(**fields, refusals={**local.refusals, "key_files": Refusal("x")})
    assert set(REFUSABLE) <= set(Capabilities.__dataclass_fields__)


@pytest.mark.parametrize("bad", ["slurm ", "SLURM", "", "k8s", "a\nb", "\x1b[31mred", "x" * 300, "caf\udce9"])
def test_an_unknown_scheduler_is_a_config_error_naming_the_backends(bad):
    with pytest.raises(ConfigError) as info:
        capabilities(bad)
    assert repr(bad) in info.value.message and "\n" not in info.value.message.replace(repr(bad), "")
    assert info.value.hint == "one of: local, slurm, kubernetes, ssh"


def test_the_table_imports_nothing_heavy():
    """The table is read on every render and by the entrypoint: the standard library and jobgen.errors only."""
    code = ("import sys\nbefore = set(sys.modules)\nimport jobgen.specs.capabilities\nimport json\n"
            "print(json.dumps(sorted(set(sys.modules) - before)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60, check=True)
    added = json.loads(out.stdout.splitlines()[-1])
    assert {m for m in added if m.startswith("jobgen")} <= {"jobgen", "jobgen.errors", "jobgen.specs", "jobgen.specs.capabilities"}
    heavy = ("pydantic", "yaml", "jinja2", "click", "torch", "lightning", "kubernetes", "numpy")
    assert not [m for m in added if m.split(".")[0] in heavy], added


# --- the refusals print the table's reasons ---

def _spec(doc: dict) -> TrainingSpec:
    return validate(TrainingSpec, {"name": "job", **doc}, "<spec>")


@pytest.mark.parametrize("profile", ["local", "slurm-cpu", "ssh-2node"])
def test_an_elastic_range_is_refused_with_the_tables_reason_and_fix(profile):
    loaded = load_profile(profile, PROFILES)
    refusal = capabilities(loaded.scheduler).refusal("elastic")
    with pytest.raises(PlanError) as info:
        plan(_spec({"resources": {"nodes": "1:2"}}), loaded, TEMPLATES, spec_source="spec.yaml")
    assert info.value.message == (f"You set the elastic range `resources.nodes: \"1:2\"`, but profile {loaded.name!r} "
                                  f"{refusal.reason}.")
    assert info.value.hint == refusal.hint(min_nodes=1, max_nodes=2)
    assert "{" not in info.value.hint


@pytest.mark.parametrize("profile", ["local", "slurm-cpu", "ssh-2node"])
def test_code_git_is_refused_with_the_tables_reason(profile):
    loaded = load_profile(profile, PROFILES)
    refusal = capabilities(loaded.scheduler).refusal("code_from_git")
    with pytest.raises(PlanError) as info:
        plan(_spec({"code": {"python_path": "src", "git": {"url": "https://git.example.com/team/proj.git", "ref": "0" * 40}}}), loaded, TEMPLATES,
             spec_source="spec.yaml")
    assert info.value.message == f"You set `code.git`, but profile {loaded.name!r} {refusal.reason}."
    assert info.value.location == "spec.yaml: code.git" and info.value.hint == refusal.fix


def test_a_kubernetes_secret_without_a_mapping_is_refused_with_the_tables_reason():
    loaded = load_profile("k8s-a100", PROFILES)
    with pytest.raises(PlanError) as info:
        plan(_spec({"secrets": ["DATASET_READ_CREDENTIAL"]}), loaded, TEMPLATES, spec_source="spec.yaml")
    assert info.value.message.endswith(f"; {capabilities('kubernetes').refusal('secrets_from_shell').reason}.")


def test_a_local_profile_of_two_nodes_is_refused_with_the_tables_reason():
    with pytest.raises(ConfigError) as info:
        load_profile("local", PROFILES, overrides=["max_nodes=2"])
    assert f"scheduler 'local' {capabilities('local').refusal('multi_node').reason}: max_nodes must be 1" in info.value.message


def test_the_support_table_has_a_row_per_capability_and_the_reasons_in_its_no_cells():
    """docs/support.md's table (docs/hooks.py expands it): ``yes``, or ``no:`` and the refusal's reason."""
    lines = capabilities_table().splitlines()
    assert lines[0] == "| capability | local | SLURM | Kubernetes | ssh |" and len(lines) == 2 + len(REFUSABLE)
    for line, (capability, what) in zip(lines[2:], REFUSABLE.items(), strict=True):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0] == what
        for cell, caps in zip(cells[1:], CAPABILITIES.values(), strict=True):
            assert cell == ("yes" if getattr(caps, capability) else f"no: {caps.refusal(capability).reason}"), (capability, caps.name)
