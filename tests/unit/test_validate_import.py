"""``jobgen validate --import`` and the import check of ``jobgen submit``: the spec's class_path
classes are imported in this environment and their init_args bound (jsonargparse); every failure
exits 2 with the file, the field path and a hint, and no traceback. Each case runs the real CLI
in a subprocess (``python -m jobgen.cli``, whose working directory is on sys.path: the user
modules written here are importable from it); the ``validate --import`` cases of this module
share one subprocess (:func:`import_checks`), which runs the CLI's entry point once per case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO, write

BORING = "lightning.pytorch.demos.boring_classes"
TIMEOUT_S = 180

USER_MODULE = '''\
from lightning.pytorch import LightningModule


class Needs(LightningModule):
    def __init__(self, width: int, depth: int = 2):
        super().__init__()
'''


def _spec(tmp_path, model: dict, data: dict | None = None) -> str:
    doc = {"name": "mine", "model": model, "data": data or {"class_path": f"{BORING}.BoringDataModule"}}
    return str(write(tmp_path / "spec.yaml", json.dumps(doc)))


#: ``jobgen.cli.main`` once per case in one interpreter, as ``python -m jobgen.cli`` runs it: in the
#: case's directory, that directory first on sys.path; each case's exit code (click's SystemExit),
#: stdout and stderr, as a JSON list on stdout. Lightning is imported once, not once per case.
CASES_DRIVER = """\
import contextlib, io, json, os, sys
from jobgen.cli.app import main
results = []
for cwd, argv in json.loads(sys.argv[1]):
    os.chdir(cwd)
    sys.path[0] = cwd
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print("RESULTS " + json.dumps(results))
"""


def run_cases(cases: list[tuple[Path, list[str]]], timeout: float) -> list[dict]:
    """Run :data:`CASES_DRIVER` on ``cases`` ((working directory, CLI arguments) each) in one
    subprocess; one ``{"code", "stdout", "stderr"}`` per case, in order."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("JOBGEN_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", CASES_DRIVER, json.dumps([[str(cwd), argv] for cwd, argv in cases])],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


FAILURES = [
    ({"class_path": "nosuch_pkg.models.Net"}, "model.class_path",
     "cannot import 'nosuch_pkg.models.Net': no module named 'nosuch_pkg'", "put its parent directory on PYTHONPATH"),
    ({"class_path": f"{BORING}.DemoModl"}, "model.class_path",
     f"'{BORING}' has no attribute 'DemoModl' (did you mean 'DemoModel'?)", "classes there: BoringDataModule"),
    ({"class_path": f"{BORING}.BoringDataModule"}, "model.class_path",
     f"{BORING}.BoringDataModule is not a lightning.pytorch.LightningModule subclass", "subclass lightning.pytorch.LightningModule"),
    ({"class_path": f"{BORING}.DemoModel", "init_args": {"out_dm": 3}}, "model.init_args.out_dm",
     f"{BORING}.DemoModel takes no argument 'out_dm' (did you mean 'out_dim'?)", "its arguments: learning_rate, out_dim"),
    ({"class_path": f"{BORING}.DemoModel", "init_args": {"out_dim": "ten"}}, "model.init_args.out_dim",
     "argument 'out_dim': Expected a <class 'int'>. Got value: ten", "give out_dim a value of the type"),
    ({"class_path": "usermod.Needs", "init_args": {"depth": 3}}, "model.init_args",
     "usermod.Needs needs the argument 'width' (it has no default)", "add width: <value> under model.init_args"),
    ({"class_path": "brokenmod.Net"}, "model.class_path",
     "importing 'brokenmod' for 'brokenmod.Net' raised RuntimeError: no GPU here", "python -c 'import brokenmod'"),
]
FAILURE_IDS = ["missing-module", "missing-class", "wrong-base", "misspelt-arg", "wrong-type", "missing-required", "import-raises"]


@pytest.fixture(scope="module")
def import_checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict]]:
    """Case id -> (its spec file, the result of ``jobgen validate SPEC ... --import`` in its own
    directory), all cases in one subprocess (:func:`run_cases`): each case of :data:`FAILURES`
    (``--profile local``, beside ``usermod.py`` and ``brokenmod.py``), ``data-wrong-base`` (a
    LightningModule as the data module, no profile) and ``another-library`` (Lightning's DemoModel
    on BoringDataModule, ``--profile local -o json``)."""
    specs, cases = {}, []
    for case, (model, *_) in zip(FAILURE_IDS, FAILURES, strict=True):
        directory = tmp_path_factory.mktemp(case)
        write(directory / "usermod.py", USER_MODULE)
        write(directory / "brokenmod.py", "raise RuntimeError('no GPU here')\n")
        specs[case] = _spec(directory, model)
        cases.append((directory, ["validate", specs[case], "--profile", "local", "--import"]))
    directory = tmp_path_factory.mktemp("data-wrong-base")
    specs["data-wrong-base"] = _spec(directory, {"class_path": f"{BORING}.BoringModel"}, {"class_path": f"{BORING}.BoringModel"})
    cases.append((directory, ["validate", specs["data-wrong-base"], "--import"]))
    directory = tmp_path_factory.mktemp("another-library")
    specs["another-library"] = _spec(directory, {"class_path": f"{BORING}.DemoModel", "init_args": {"out_dim": 4}})
    cases.append((directory, ["validate", specs["another-library"], "--profile", "local", "--import", "-o", "json"]))
    return {case: (specs[case], result) for case, result in zip(specs, run_cases(cases, TIMEOUT_S), strict=True)}


# slow: the cases import Lightning in a `jobgen validate --import` process (seconds of CPU);
# the quick tier keeps one passing import (the example package) and one failing one through submit.
@pytest.mark.slow
@pytest.mark.parametrize(("case", "field", "message", "hint"), [(case, *rest) for case, (_, *rest) in zip(FAILURE_IDS, FAILURES, strict=True)],
                         ids=FAILURE_IDS)
def test_validate_import_failures_exit_2_with_path_and_hint(import_checks, case, field, message, hint):
    spec, result = import_checks[case]
    assert result["code"] == 2, result["stdout"] + result["stderr"]
    assert "Traceback" not in result["stderr"]
    first, _, rest = result["stderr"].partition("\n")
    assert first.startswith(f"error: {spec}: {field}: ") and message in first, result["stderr"]
    assert rest.startswith("  hint: ") and hint in rest, result["stderr"]


@pytest.mark.slow
def test_data_module_of_the_wrong_base_is_refused(import_checks):
    spec, result = import_checks["data-wrong-base"]
    assert result["code"] == 2 and "Traceback" not in result["stderr"]
    assert f"{spec}: data.class_path: {BORING}.BoringModel is not a lightning.pytorch.LightningDataModule subclass" in result["stderr"]


@pytest.mark.slow
def test_validate_import_passes_for_another_librarys_module_with_a_note(import_checks):
    _, result = import_checks["another-library"]
    assert result["code"] == 0, result["stderr"]
    doc = json.loads(result["stdout"])
    assert doc["model"] == f"{BORING}.DemoModel" and doc["data"] == f"{BORING}.BoringDataModule"
    # BoringDataModule takes no batch_size: trainer.micro_batch_size cannot reach it, and the user is told
    assert doc["import_notes"] and "takes no batch_size" in doc["import_notes"][0]
    assert "note: " in result["stderr"]


def test_validate_import_of_the_example_package(run_cli):
    result = run_cli("validate", str(EXAMPLES / "usercode.yaml"), "--import", cwd=EXAMPLES / "usercode", timeout=TIMEOUT_S)
    assert result.code == 0, result.stderr
    assert "imported tinychar.CharModel and tinychar.CharDataModule here; their init_args fit their signatures" in result.stdout
    assert result.stderr == ""  # CharDataModule takes batch_size: no note


def test_validate_without_import_never_imports_user_code(run_cli, tmp_path):
    spec = _spec(tmp_path, {"class_path": "nosuch_pkg.models.Net"})
    result = run_cli("validate", spec, "--profile", "local", cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.code == 0, result.stderr  # the shape is valid; importing is --import's job


def test_submit_checks_imports_before_anything_runs(run_cli, tmp_path):
    spec = _spec(tmp_path, {"class_path": f"{BORING}.DemoModel", "init_args": {"out_dm": 3}})
    runs = tmp_path / "runs"
    result = run_cli("submit", spec, "--profile", "local", "--runs-dir", str(runs), cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.code == 2 and "Traceback" not in result.stderr
    assert f"{spec}: model.init_args.out_dm: " in result.stderr
    assert not runs.exists()  # nothing written, nothing started


def test_submit_no_import_check_skips_it(run_cli, tmp_path):
    spec = _spec(tmp_path, {"class_path": "nosuch_pkg.models.Net"})
    result = run_cli("render", spec, "--profile", "slurm-cpu", "--stdout", cwd=REPO, timeout=TIMEOUT_S)
    assert result.code == 0, result.stderr  # rendering never imports user code
    result = run_cli("submit", spec, "--profile", "slurm-cpu", "--no-import-check", "--test-only",
                     "--out", str(tmp_path / "manifests"), cwd=tmp_path, timeout=TIMEOUT_S)
    assert "nosuch_pkg" not in result.stderr, result.stderr  # got past the check (to sbatch, absent or not)


@pytest.mark.slow
def test_validate_import_finds_a_module_at_the_repository_root(run_cli, tmp_path):
    """``mymodels.py`` at the root of the user's git repository and ``model.class_path:
    mymodels.Regressor``: the snapshot's python_path defaults to the repository root, so the
    import check imports from there (run from outside the repository: no cwd on sys.path).
    ``python_path: .`` and the other spellings: test_code_snapshot's local_import_dir tests."""
    from tests.integration.usercode_repo import git

    repo = tmp_path / "userrepo"
    write(repo / "mymodels.py", USER_MODULE.replace("Needs", "Regressor"))
    spec = write(repo / "jobs" / "train.yaml", f"name: byo\nmodel: {{class_path: mymodels.Regressor, init_args: {{width: 4}}}}\n"
                                                f"data: {{class_path: {BORING}.BoringDataModule}}\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "my model")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_cli("validate", str(spec), "--profile", "local", "--import", cwd=elsewhere, timeout=TIMEOUT_S)
    assert result.code == 0, result.stderr
    assert "imported mymodels.Regressor" in result.stdout
