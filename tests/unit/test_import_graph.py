"""Imports flow one way (the project's architecture rule): the layers of :data:`LAYERS`, from
``jobgen.cli`` on top through the API, GitOps and ``jobgen doctor``, the backends and the
entrypoint, the planner, the job directory's contract and the specs down to ``jobgen.errors``.
No module imports from a package of its own layer or a higher one, and neither the modules nor
the packages import each other in a cycle.

A lower module never imports a higher one, "not even lazily inside a function": the graph below
takes every ``import`` statement of every module under jobgen/, wherever it stands (module
level, inside a function, under ``if TYPE_CHECKING:``), read with :mod:`ast` (nothing is
imported). An edge goes to the most specific jobgen module a statement names
(``from jobgen import deepspeed`` -> ``jobgen.planning.deepspeed``; ``from jobgen import __version__``
-> ``jobgen``). Imports by string (``importlib.import_module``, the backend registry's lazy
table) are not statements and are not edges: the registry names its backends, it does not
import them at load.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import jobgen

PACKAGE = Path(jobgen.__file__).parent


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """``jobgen.backends.base`` for ``<root>/backends/base.py``; a package is its ``__init__``."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: {jobgen modules it imports}}`` for every ``.py`` file under ``root``."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package holding this module
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import sub` names the submodule when there is one, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in known:  # `import jobgen.x.y` of a name we do not know
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, sorted for a stable answer)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt, BLACK) == GREY:
                return [*stack[stack.index(nxt):], nxt]
            if colour.get(nxt) == WHITE:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = BLACK
        return None

    for start in sorted(graph):
        if colour[start] == WHITE:
            found = visit(start)
            if found:
                return found
    return None


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), sorted: each holds a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def test_jobgen_has_no_import_cycle():
    graph = import_graph()
    components = all_cycles(graph)
    assert not components, "import cycles in jobgen/ (each line: modules that import each other, one example cycle):\n" + "\n".join(
        f"  {comp}: {' -> '.join(find_cycle({m: graph[m] & set(comp) for m in comp}) or [])}" for comp in components)


def test_the_planner_does_not_know_the_backends():
    """The caller hands the planner its backend: plan.py names nothing of jobgen.backends."""
    assert not {m for m in import_graph()["jobgen.planning.plan"] if m.startswith("jobgen.backends")}


def test_the_generic_estimate_does_not_know_the_hf_one():
    """The HF estimate sits on top of the generic one (imports it), never the other way."""
    graph = import_graph()
    assert "jobgen.planning.estimate" in graph["jobgen.planning.estimate_hf"]
    assert "jobgen.planning.estimate_hf" not in graph["jobgen.planning.estimate"]


#: The layers of jobgen/, lowest first (docs/development.md "Layout": imports flow one way). A
#: module imports only from a lower layer or from its own package: two packages of one layer never
#: import each other. The job directory's contract (``jobdir``: file names, spec.json, the world)
#: sits below the planner, which writes it, and above the specs, whose models it records.
#: Planning a spec's sweep and the project file is the planner's (the backends' planners handed
#: in); GitOps writes and compares what it planned, beside the API and ``jobgen doctor``.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("jobgen", "jobgen.errors"),  # the version and the errors every layer raises
    ("jobgen.specs",),  # what a user writes: specs, profiles, the project file, sweeps
    ("jobgen.jobdir",),  # the job directory's contract
    ("jobgen.planning", "jobgen.reports"),  # spec + profile -> JobPlan; what a run left
    ("jobgen.events", "jobgen.usercode"),  # a run's notifications; the user's code and its memory plan
    ("jobgen.backends", "jobgen.train"),  # the schedulers; the entrypoint on every node
    ("jobgen.api", "jobgen.doctor", "jobgen.gitops"),  # the Python API; `jobgen doctor`'s checks; manifests/
    ("jobgen.cli",),  # the top floor: every command may call anything below it
)

#: Below a package but still off its path (no use for it; a heavy or unrelated import kept away).
ALSO_FORBIDDEN = {
    "jobgen.reports": ("jobgen.specs",),  # what a run left, read from its files alone
    "jobgen.events": ("jobgen.planning",),  # sent by the entrypoint and the launchers, which plan nothing
    "jobgen.usercode": ("jobgen.planning.plan",),
    "jobgen.train": ("jobgen.planning.plan",),
    "jobgen.gitops": ("jobgen.train",),
    "jobgen.doctor": ("jobgen.train",),
}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def package_of(module: str) -> str:
    """``jobgen.backends`` for ``jobgen.backends.base``; ``jobgen`` and ``jobgen.errors`` are their own."""
    return ".".join(module.split(".")[:2])


def layer_of(package: str) -> int:
    """The index of ``package``'s layer in :data:`LAYERS`.

    Raises:
        KeyError: no layer holds it.
    """
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise KeyError(f"{package} is in no layer of LAYERS")


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to packages: ``{package: {other packages it imports}}``."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(package_of(module), set()).update(package_of(t) for t in targets if package_of(t) != package_of(module))
    return out


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``"module -> target"`` for every import of a package in the same layer or a higher one."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if package_of(t) != package_of(m) and layer_of(package_of(t)) >= layer_of(package_of(m)))


def test_no_package_imports_from_its_own_layer_or_above():
    wrong = upward_imports(import_graph())
    assert not wrong, "imports from a layer that is not below (tests/unit/test_import_graph.py LAYERS):\n  " + "\n  ".join(wrong)


def test_jobgen_has_no_package_cycle():
    graph = package_graph(import_graph())
    assert all_cycles(graph) == [], f"packages that import each other: {all_cycles(graph)}: {find_cycle(graph)}"


@pytest.mark.parametrize("package", sorted(ALSO_FORBIDDEN))
def test_packages_keep_off_what_they_do_not_use(package):
    graph = import_graph()
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items() if _inside(m, package)
                   for t in targets if any(_inside(t, f) for f in ALSO_FORBIDDEN[package]))
    assert not wrong, f"{package} imports what it has no use for:\n  " + "\n  ".join(wrong)


def test_sweeps_and_the_project_are_planned_below_the_backends():
    """Submitting a sweep plans it through the planner, not through GitOps: the API imports no GitOps module, and
    GitOps none of the backends (the caller hands the backends' planners in)."""
    graph = import_graph()
    assert {"jobgen.planning.sweep", "jobgen.planning.project"} <= set(graph)
    assert not [t for m, ts in graph.items() if _inside(m, "jobgen.api") for t in ts if _inside(t, "jobgen.gitops")]
    assert not [t for m, ts in graph.items() if _inside(m, "jobgen.gitops") for t in ts if _inside(t, "jobgen.backends")]


def test_every_package_has_a_layer():
    """A new package (or top-level module) of jobgen/ states where it sits: one layer of :data:`LAYERS`."""
    graph = import_graph()
    placed = [p for layer in LAYERS for p in layer]
    assert len(placed) == len(set(placed)), "a package in two layers"
    assert {package_of(m) for m in graph} == set(placed), {package_of(m) for m in graph} ^ set(placed)


# --- the graph walker itself, on a made-up package (so a walker that sees nothing cannot pass) ---

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("b_source", [
    "import pkg.a\n",                                       # module level
    "def f():\n    from pkg import a\n    return a\n",       # lazily, inside a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n",  # for types only
    "from . import a\n",                                     # relative
])
def test_the_walker_sees_a_cycle_however_it_is_imported(tmp_path, b_source):
    root = _package(tmp_path, {"__init__.py": "", "a.py": "from pkg.b import thing\n", "b.py": b_source})
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    assert all_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_layer_rule_sees_imports_up_and_across():
    graph = {"jobgen.specs.a": {"jobgen.planning.plan"}, "jobgen.reports.b": {"jobgen.planning.rules"},
             "jobgen.cli.c": {"jobgen.api", "jobgen.errors"}, "jobgen.planning.d": {"jobgen.planning.plan", "jobgen.jobdir.files"}}
    assert upward_imports(graph) == ["jobgen.reports.b -> jobgen.planning.rules", "jobgen.specs.a -> jobgen.planning.plan"]
    assert package_graph(graph) == {"jobgen.specs": {"jobgen.planning"}, "jobgen.reports": {"jobgen.planning"},
                                    "jobgen.cli": {"jobgen.api", "jobgen.errors"}, "jobgen.planning": {"jobgen.jobdir"}}
    assert all_cycles(package_graph({**graph, "jobgen.planning.e": {"jobgen.specs.a"}})) == [["jobgen.planning", "jobgen.specs"]]


def test_the_walker_accepts_a_one_way_graph(tmp_path):
    root = _package(tmp_path, {"__init__.py": "VERSION = 1\n", "low.py": "from pkg import VERSION\n",
                               "sub/__init__.py": "", "sub/high.py": "from pkg.low import x\nfrom ..low import y\nimport os\n"})
    graph = import_graph(root)
    assert graph == {"pkg": set(), "pkg.low": {"pkg"}, "pkg.sub": set(), "pkg.sub.high": {"pkg.low"}}
    assert find_cycle(graph) is None and all_cycles(graph) == []
