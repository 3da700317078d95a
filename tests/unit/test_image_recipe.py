"""The training image recipe (examples/image/) and the Kubernetes lab's image (kubeimage.py)
install one list of versions: examples/image/constraints.txt.

- The list pins every package setup.cfg's install_requires and its image extras name (train,
  tensorboard, tracking, qlora), once each, within setup.cfg's bounds; nothing else.
- kubeimage.py's pip install reads the list (``-c``), its torch pin is the list's, and the list
  is an input of its image key.
- The Containerfile's pip install reads the same file, installs the ``train`` extra, starts from a
  base image tagged with the list's torch version, and ends as a numeric user without root; its
  RUN scripts pass shellcheck; its ignore file lets in what kubeimage builds the wheel from.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import sys
from types import ModuleType

import pytest

from tests.conftest import REPO, lint_bash, require

IMAGE = REPO / "examples" / "image"
CONSTRAINTS = IMAGE / "constraints.txt"
CONTAINERFILE = IMAGE / "Containerfile"
IGNOREFILE = IMAGE / "Containerfile.dockerignore"
#: The extras an image may install (the Containerfile's EXTRAS argument), beside install_requires.
IMAGE_EXTRAS = ("train", "tensorboard", "tracking", "qlora")


def _kubeimage() -> ModuleType:
    """tests/integration/k8s/kubeimage.py, imported by path (it is a script beside the lab tests)."""
    name = "kubeimage"
    if name in sys.modules:
        return sys.modules[name]
    lab = REPO / "tests" / "integration" / "k8s"
    if str(lab) not in sys.path:  # its parts (imagebase, ociarchive, imagesmoke) are imported by name beside it
        sys.path.insert(0, str(lab))
    spec = importlib.util.spec_from_file_location(name, lab / "kubeimage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a half-loaded module must not stand in for the next test's
        raise
    return module


def _declared() -> dict[str, list[str]]:
    """setup.cfg's requirement lines (comments dropped): install_requires and each image extra."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "setup.cfg")
    sections = {"install_requires": cfg["options"]["install_requires"]}
    sections |= {extra: cfg["options.extras_require"][extra] for extra in IMAGE_EXTRAS}
    return {name: [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]
            for name, text in sections.items()}


def _pins(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of a constraints file; every line must be ``name==version``."""
    utils = require("packaging.utils")
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)", line)
        assert match, f"constraints.txt: {line!r} is not name==version"
        name = utils.canonicalize_name(match.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = match.group(2)
    return pins


def _drift(pins: dict[str, str]) -> list[str]:
    """What differs between the pins and setup.cfg's requirements: a package named but not pinned,
    pinned but not named, or pinned outside the bounds."""
    requirements = require("packaging.requirements")
    utils = require("packaging.utils")
    problems = []
    named = set()
    for section, lines in _declared().items():
        for line in lines:
            req = requirements.Requirement(line)
            name = utils.canonicalize_name(req.name)
            named.add(name)
            if name not in pins:
                problems.append(f"{section}: {line} has no pin")
            elif not req.specifier.contains(pins[name], prereleases=True):
                problems.append(f"{section}: {name}=={pins[name]} is outside {req.specifier}")
    problems += [f"{name}=={pins[name]} is pinned but setup.cfg does not name it" for name in sorted(set(pins) - named)]
    return problems


def test_constraints_pin_exactly_what_setup_cfg_names():
    assert _drift(_pins(CONSTRAINTS.read_text())) == []


@pytest.mark.parametrize(("edit", "found"), [
    (lambda t: t.replace("lightning==2.6.6", "lightning==2.7.0"), "lightning==2.7.0 is outside"),
    (lambda t: t.replace("peft==0.21.2\n", ""), "peft>=0.13 has no pin"),
    (lambda t: t + "scipy==1.16.0\n", "scipy==1.16.0 is pinned but setup.cfg does not name it"),
], ids=["out-of-bounds", "missing", "extra"])
def test_the_drift_check_finds_each_kind_of_drift(edit, found):
    assert any(found in problem for problem in _drift(_pins(edit(CONSTRAINTS.read_text()))))


@pytest.mark.parametrize("line", ["jsonargparse[signatures]==4.53.0", "torch>=2.4", "torch==2.13.0\ntorch==2.13.0", "torch"])
def test_a_line_that_is_not_one_exact_pin_is_refused(line):
    with pytest.raises(AssertionError):
        _pins(line + "\n")


def test_kubeimage_installs_with_the_same_constraints(monkeypatch, tmp_path):
    kubeimage = _kubeimage()
    pins = _pins(CONSTRAINTS.read_text())
    assert kubeimage.CONSTRAINTS == CONSTRAINTS
    assert kubeimage.TORCH_PIN == f"torch=={pins['torch']}"
    ran: list[list[str]] = []
    monkeypatch.setattr(kubeimage, "_run", lambda argv, log, **kw: ran.append([str(a) for a in argv]))
    kubeimage._pip_install(tmp_path / "root", tmp_path / "jobgen-0-py3-none-any.whl", kubeimage.requirements(), log=lambda _m: None)
    (argv,) = ran
    assert argv[argv.index("-c") + 1] == str(CONSTRAINTS)
    assert f"{tmp_path / 'jobgen-0-py3-none-any.whl'}[train]" in argv and f"torch=={pins['torch']}" in argv
    assert kubeimage.build_inputs(variant="full")["constraints"] == CONSTRAINTS.read_text()


def _instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions: ``(KEYWORD, arguments)``, continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^([A-Za-z]+)\s+(.*)$", text, re.M)]


def test_containerfile_installs_train_with_the_constraints_on_the_pinned_torch():
    pins = _pins(CONSTRAINTS.read_text())
    steps = _instructions()
    (base,) = [args for keyword, args in steps if keyword == "FROM"]
    repository, _, tag = base.rpartition(":")
    assert repository.endswith("pytorch/pytorch") and tag.startswith(f"{pins['torch']}-cuda") and tag.endswith("-runtime"), base
    (install,) = [args for keyword, args in steps if keyword == "RUN" and "pip install" in args]
    assert "-c /tmp/jobgen-src/examples/image/constraints.txt" in install and "--no-cache-dir" in install
    assert '"/tmp/jobgen-src/${JOBGEN}[train${EXTRAS:+,${EXTRAS}}]"' in install
    assert ("ARG", "JOBGEN=.") in steps and ("ARG", "EXTRAS=") in steps
    users = [args for keyword, args in steps if keyword == "USER"]
    assert users and re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", users[-1]), users
    assert "latest" not in base


def test_containerfile_run_scripts_pass_shellcheck(tmp_path):
    """Each RUN, with the build arguments set as the defaults give them, as a bash script."""
    runs = [args for keyword, args in _instructions() if keyword == "RUN"]
    assert runs
    for i, args in enumerate(runs):
        script = re.sub(r"^--mount=\S+\s+", "", args)
        path = tmp_path / f"run-{i}.sh"
        path.write_text(f"#!/bin/bash\nset -o pipefail\nexport JOBGEN=. EXTRAS=\n{script}\n")
        lint_bash(path)


def test_the_build_context_holds_what_kubeimage_builds_the_wheel_from():
    kubeimage = _kubeimage()
    rules = [line for line in IGNOREFILE.read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "*", "the ignore file leaves everything out first, then lets in what the install reads"
    allowed = {line[1:] for line in rules if line.startswith("!")}
    assert set(kubeimage.SOURCE_PATHS) | {"examples/image/constraints.txt", "dist/*.whl"} == allowed
