"""A non-editable install carries its data: the wheel built from this tree holds the Kubeflow CRDs
(with their LICENSE and PROVENANCE.txt) byte for byte, and jobgen unpacked from it, run from a
directory with nothing beside it, validates a rendered PyTorchJob against them.

Builds one wheel per session (``pip wheel --no-build-isolation``: no network; ~5-15 s on 2 busy
cores) from a copy of the sources in a temporary directory, so no ``build/`` or ``*.egg-info``
lands in the checkout and no stale ``build/lib`` can leak into the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import CRDS, EXAMPLES, REPO, require

#: What setup.cfg builds the wheel from (packages, package_dir targets, long_description).
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "jobgen", "templates", "cluster_profiles")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The jobgen wheel built from a copy of this tree."""
    require("setuptools.command.bdist_wheel", "building the wheel without isolation needs setuptools>=70.1 (pip install -e '.[dev]')")
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("jobgen-*.whl")
    return built


def test_wheel_ships_the_crds_licence_and_provenance_verbatim(wheel):
    shipped = sorted(p.relative_to(REPO).as_posix() for p in CRDS.rglob("*") if p.is_file())
    assert {"jobgen/_crds/LICENSE", "jobgen/_crds/PROVENANCE.txt",
            "jobgen/_crds/training-operator-v1.9.4/kubeflow.org_pytorchjobs.yaml",
            "jobgen/_crds/trainer-v2.3.0/trainer.kubeflow.org_trainjobs.yaml"} <= set(shipped)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = [name for name in shipped if name not in names]
        assert not missing, f"not in {wheel.name}: {missing}"
        changed = [name for name in shipped if zf.read(name) != (REPO / name).read_bytes()]
        assert not changed, f"differ from the checkout: {changed}"


def test_installed_wheel_validates_against_its_packaged_crds(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:  # a pure-Python wheel installs by unpacking
        zf.extractall(site)
    elsewhere = tmp_path / "elsewhere"  # no templates/, cluster_profiles/ or CRDs beside it
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("JOBGEN_CRDS_DIR", "JOBGEN_HOME", "JOBGEN_DEBUG")}
    env["PYTHONPATH"] = str(site)
    code = (
        "import jobgen, jobgen.backends.kubernetes.validate as kv\n"
        "print(jobgen.__file__)\n"
        "print(kv.crds_dir())\n"
        "from jobgen.cli import main\n"
        f"main(['render', {str(EXAMPLES / 'quickstart.yaml')!r}, '--profile', 'k8s-h100', '--stdout'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    module_file, crds, *_ = proc.stdout.splitlines()
    assert Path(module_file).is_relative_to(site) and Path(crds) == site / "jobgen" / "_crds"
    assert "kind: PyTorchJob" in proc.stdout
    assert "offline validation skipped" not in proc.stderr, proc.stderr


def test_wheel_ships_every_template_and_profile(wheel):
    """``jobgen render`` from a non-editable install finds what a checkout has (package_data lists
    the template directories one by one: a new backend's directory must be added there)."""
    shipped = {f"jobgen/_templates/{p.relative_to(REPO / 'templates').as_posix()}" for p in (REPO / "templates").rglob("*.j2")}
    shipped |= {f"jobgen/_profiles/{p.name}" for p in (REPO / "cluster_profiles").glob("*.yaml")}
    with zipfile.ZipFile(wheel) as zf:
        missing = sorted(shipped - set(zf.namelist()))
    assert "jobgen/_templates/ssh/launch.sh.j2" in shipped and not missing, f"not in {wheel.name}: {missing}"


def test_wheel_ships_every_module(wheel):
    """setup.cfg lists jobgen's packages one by one: a package made by a split (jobgen.cli,
    jobgen.jobdir, jobgen.api) must be added there, or a non-editable install lacks its modules."""
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "jobgen").rglob("*.py")}
    with zipfile.ZipFile(wheel) as zf:
        missing = sorted(modules - set(zf.namelist()))
    assert "jobgen/cli/app.py" in modules and not missing, f"not in {wheel.name} (add their packages to setup.cfg): {missing}"
