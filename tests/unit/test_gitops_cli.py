"""GitOps end to end through the CLI and real git (no mocks): a fresh clone is in sync, one spec
edit makes `render --check` fail with a diff of that job only, --commit/--prune, byte-identical
output across directories and environments, and `kubectl kustomize` builds the output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, skip_or_fail, write

QUICKSTART_SWEEP = ("--sweep", "trainer.learning_rate=1e-4,3e-4", "--sweep", "trainer.micro_batch_size=4,8")


@pytest.fixture(autouse=True)
def git_identity(tmp_path, monkeypatch):
    """Real git with a known identity and no user/system config (hooks, signing) leaking in."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(write(tmp_path / "gitconfig", "[init]\n\tdefaultBranch = main\n")))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "jobgen test")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "test@jobgen.invalid")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, timeout=60).stdout


def fresh_clone(dest: Path) -> Path:
    """`git clone` of this repository, plus its uncommitted working-tree changes committed on top
    (none in CI, where the checkout is clean), so the test sees the code under test."""
    if not (REPO / ".git").exists():
        pytest.skip("the repository is not a git checkout")
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], check=True, capture_output=True, timeout=120)
    changed = [p for p in git(REPO, "ls-files", "-z", "--modified", "--others", "--exclude-standard").split("\0") if p]
    for rel in changed:
        src, dst = REPO / rel, dest / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        else:
            dst.unlink(missing_ok=True)
    if changed:
        git(dest, "add", "-A")
        git(dest, "commit", "--quiet", "--allow-empty", "-m", "uncommitted working tree of the repository under test")
    return dest


def diff_paths(diff: str) -> set[str]:
    """Paths named by the ---/+++ headers of a unified diff (a/ and b/ stripped)."""
    return {re.sub(r"^[ab]/", "", m) for m in re.findall(r"^(?:---|\+\+\+) (\S+)", diff, flags=re.M)} - {"/dev/null"}


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777) for p in sorted(root.rglob("*")) if p.is_file()}


def test_fresh_clone_renders_exactly_what_is_committed(run_cli, tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    rendered = run_cli("render", "--all", cwd=clone)
    assert rendered.code == 0, rendered.stderr
    assert git(clone, "status", "--porcelain") == ""
    check = run_cli("render", "--all", "--check", cwd=clone)
    assert check.code == 0 and check.stdout.startswith("in sync:"), check.stdout + check.stderr


def test_one_spec_field_fails_check_with_that_jobs_diff_only_then_rerender_fixes_it(run_cli, tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    spec = clone / "examples" / "gpt2-350m-zero3.yaml"
    spec.write_text(spec.read_text().replace("max_steps: 20000", "max_steps: 25000"))
    check = run_cli("render", "--all", "--check", cwd=clone)
    assert check.code == 1
    assert {p.rsplit("/", 1)[0] for p in diff_paths(check.stdout)} == {"manifests/slurm-h100/gpt2-350m-zero3"}
    assert '+      "max_steps": 25000,' in check.stdout
    assert "out of date" in check.stderr and "jobgen render --all" in check.stderr
    preview = run_cli("diff", cwd=clone)
    assert preview.code == 0 and preview.stdout == check.stdout, "diff previews exactly what --check reports"
    assert run_cli("render", "--all", cwd=clone).code == 0
    assert run_cli("render", "--all", "--check", cwd=clone).code == 0
    changed = sorted(line[3:] for line in git(clone, "status", "--porcelain").splitlines())
    assert changed == ["examples/gpt2-350m-zero3.yaml", "manifests/slurm-h100/gpt2-350m-zero3/job.sbatch",
                       "manifests/slurm-h100/gpt2-350m-zero3/spec.json"]


def _render_env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "HOME": str(home), **extra}


def test_two_directories_and_environments_give_identical_bytes(tmp_path):
    clones = [fresh_clone(tmp_path / "a"), fresh_clone(tmp_path / "second clone")]
    envs = [
        _render_env(tmp_path / "home-a", LANG="C.UTF-8", TZ="UTC", PYTHONHASHSEED="0"),
        _render_env(tmp_path / "home-b", LANG="de_DE.ISO-8859-1", LC_ALL="C", TZ="Pacific/Chatham", PYTHONHASHSEED="4242",
                    PWD="/nonexistent", USER="someone-else", SOURCE_DATE_EPOCH="1", COLUMNS="40", UMASK="077"),
    ]
    cwds = [clones[0], clones[1] / "examples"]  # the second run finds jobgen.yaml from a subdirectory
    trees = []
    for clone, env, cwd in zip(clones, envs, cwds, strict=True):
        shutil.rmtree(clone / "manifests")
        proc = subprocess.run([sys.executable, "-m", "jobgen.cli", "render", "--all"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        trees.append(tree(clone / "manifests"))
        assert git(clone, "status", "--porcelain") == "", "a render from scratch equals the committed files"
    assert trees[0] == trees[1]
    for rel, (data, _) in trees[0].items():
        assert b"\r" not in data and str(tmp_path).encode() not in data and b"home-a" not in data, rel


def test_diff_of_one_spec_previews_without_writing(run_cli):
    before = tree(REPO / "manifests")
    result = run_cli("diff", "examples/quickstart.yaml", "--profile", "slurm-a100", "--set", "trainer.max_steps=5000")
    assert result.code == 0, result.stderr
    assert diff_paths(result.stdout) == {"manifests/slurm-a100/quickstart/job.sbatch", "manifests/slurm-a100/quickstart/spec.json"}
    assert '+      "max_steps": 5000,' in result.stdout and "would change" in result.stderr
    assert tree(REPO / "manifests") == before


def test_sweep_2x2_gives_four_stably_named_jobs_and_a_rerun_no_diff(run_cli, tmp_path):
    spec = str(REPO / "examples" / "quickstart.yaml")
    first = run_cli("render", spec, "--profile", "k8s-h100", *QUICKSTART_SWEEP, cwd=tmp_path)
    assert first.code == 0, first.stderr
    names = sorted(p.name for p in (tmp_path / "manifests" / "k8s-h100").iterdir())
    assert names == ["quickstart-lr1e-4-mbs4", "quickstart-lr1e-4-mbs8", "quickstart-lr3e-4-mbs4", "quickstart-lr3e-4-mbs8"]
    check = run_cli("render", spec, "--profile", "k8s-h100", *QUICKSTART_SWEEP, "--check", cwd=tmp_path)
    assert check.code == 0 and "in sync" in check.stdout
    again = run_cli("render", spec, "--profile", "k8s-h100", *QUICKSTART_SWEEP, cwd=tmp_path)
    assert "0 file(s) written" in again.stdout
    job = yaml.safe_load_all((tmp_path / "manifests" / "k8s-h100" / "quickstart-lr3e-4-mbs8" / "pytorchjob.yaml").read_text())
    config_map, pytorchjob = list(job)
    assert pytorchjob["metadata"]["name"] == "quickstart-lr3e-4-mbs8"
    trainer = json.loads(config_map["data"]["spec.json"])["spec"]["trainer"]
    assert (trainer["learning_rate"], trainer["micro_batch_size"]) == (3e-4, 8)


def test_project_sweep_is_listed_in_the_index(run_cli):
    index = yaml.safe_load((REPO / "manifests" / "index.yaml").read_text())
    swept = [j for j in index["jobs"] if j["sweep"]]
    assert len(swept) == 4 and {tuple(j["sweep"]) for j in swept} == {("trainer.learning_rate", "trainer.micro_batch_size")}
    assert all((REPO / "manifests" / j["dir"] / "pytorchjob.yaml").is_file() for j in swept)


def test_commit_stages_exactly_the_rendered_files_and_names_specs_and_profiles(run_cli, tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    head = git(clone, "rev-parse", "HEAD")
    spec = clone / "examples" / "gpt2-350m-zero3.yaml"
    spec.write_text(spec.read_text().replace("max_steps: 20000", "max_steps: 25000"))
    write(clone / "manifests" / "slurm-h100" / "gpt2-350m-zero3" / "NOTES.md", "not jobgen's\n")
    result = run_cli("render", "--all", "--commit", cwd=clone)
    assert result.code == 0, result.stderr
    assert "committed" in result.stdout
    assert git(clone, "rev-parse", "HEAD^") == head
    message = git(clone, "log", "-1", "--format=%B")
    assert message.startswith("jobgen: render examples/gpt2-350m-zero3.yaml for slurm-h100\n")
    committed = sorted(git(clone, "show", "--name-only", "--format=", "HEAD").split())
    assert committed == ["manifests/slurm-h100/gpt2-350m-zero3/job.sbatch", "manifests/slurm-h100/gpt2-350m-zero3/spec.json"]
    assert sorted(git(clone, "status", "--porcelain").splitlines()) == [" M examples/gpt2-350m-zero3.yaml", "?? manifests/slurm-h100/gpt2-350m-zero3/NOTES.md"]
    again = run_cli("render", "--all", "--commit", cwd=clone)
    assert again.code == 0 and "nothing to commit" in again.stdout
    assert git(clone, "rev-parse", "HEAD^") == head


def test_commit_refuses_when_unrelated_changes_are_staged(run_cli, tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    head = git(clone, "rev-parse", "HEAD")
    spec = clone / "examples" / "gpt2-350m-zero3.yaml"
    spec.write_text(spec.read_text().replace("max_steps: 20000", "max_steps: 25000"))
    git(clone, "add", "examples/gpt2-350m-zero3.yaml")
    result = run_cli("render", "--all", "--commit", cwd=clone)
    assert result.code == 2, "the repository's state is the user's to fix (exit 2), as submit's refusal of uncommitted changes"
    assert "refusing to commit" in result.stderr and "examples/gpt2-350m-zero3.yaml" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert git(clone, "rev-parse", "HEAD") == head
    assert git(clone, "status", "--porcelain").splitlines() == ["M  examples/gpt2-350m-zero3.yaml"], "nothing was written"


def test_commit_outside_a_git_repository_reports_the_git_command(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    project = tmp_path / "project"
    write(project / "jobgen.yaml", "jobs:\n  - spec: quickstart.yaml\n    profiles: [slurm-a100]\n")
    shutil.copy(REPO / "examples" / "quickstart.yaml", project / "quickstart.yaml")
    result = run_cli("render", "--all", "--commit", cwd=project)
    assert result.code == 1
    assert "$ git rev-parse --show-toplevel  (exit 128)" in result.stderr and "not a git repository" in result.stderr
    assert not (project / "manifests").exists()


def test_prune_through_the_cli(run_cli, tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    project = clone / "jobgen.yaml"
    doc = yaml.safe_load(project.read_text())
    doc["jobs"] = [j for j in doc["jobs"] if j["spec"] != "examples/gpt2-350m-zero3.yaml"]
    project.write_text(yaml.safe_dump(doc))
    render = run_cli("render", "--all", cwd=clone)
    assert render.code == 0 and "stale: manifests/slurm-h100/gpt2-350m-zero3/" in render.stderr and "--prune" in render.stderr
    assert (clone / "manifests" / "slurm-h100" / "gpt2-350m-zero3" / "job.sbatch").is_file()
    check = run_cli("render", "--all", "--check", cwd=clone)
    assert check.code == 1 and "+++ /dev/null" in check.stdout and "--prune" in check.stderr
    pruned = run_cli("render", "--all", "--prune", cwd=clone)
    assert pruned.code == 0 and "removed manifests/slurm-h100/gpt2-350m-zero3/job.sbatch" in pruned.stdout
    assert not (clone / "manifests" / "slurm-h100").exists()
    assert run_cli("render", "--all", "--check", cwd=clone).code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["render"], "give a SPEC file (with --profile) or --all"),
        (["render", "--all", "examples/quickstart.yaml"], "SPEC cannot be combined with --all"),
        (["render", "--all", "--set", "trainer.max_steps=1"], "--set cannot be combined with --all"),
        (["render", "--all", "--out", "elsewhere"], "--out cannot be combined with --all"),
        (["render", "examples/quickstart.yaml", "-p", "slurm-a100", "--prune"], "--prune needs --all"),
        (["render", "--all", "--check", "--commit"], "--check and --commit exclude each other"),
        (["render", "--all", "--stdout"], "--stdout cannot be combined"),
        (["render", "examples/quickstart.yaml", "--check"], "rendering a spec needs --profile"),
        (["render", "examples/quickstart.yaml", "-p", "slurm-a100", "--sweep", "trainer.seed"], "is not key.path=v1,v2"),
        (["diff", "--project", "missing.yaml"], "file not found: missing.yaml"),
    ],
)
def test_option_misuse_exits_2_with_a_hint(run_cli, tmp_path, args, message):
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    result = run_cli(*args, cwd=tmp_path)
    assert result.code == 2, result.stdout + result.stderr
    assert message in result.stderr and "hint:" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "manifests").exists()


def test_schema_project(run_cli):
    schema = json.loads(run_cli("schema", "project").stdout)
    assert schema["additionalProperties"] is False and "jobs" in schema["required"]


def test_render_all_check_imports_no_heavy_modules(tmp_path):
    code = (
        "import sys\n"
        "from jobgen.cli import main\n"
        "try:\n"
        "    main(['render', '--all', '--check'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in ('torch', 'lightning', 'deepspeed', 'kubernetes', 'numpy') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def _kubectl() -> str | None:
    return os.environ.get("JOBGEN_KUBECTL") or shutil.which("kubectl")


@pytest.mark.parametrize("target", ["manifests/k8s-h100", "manifests", "manifests/k8s-h100/quickstart"])
def test_kubectl_kustomize_builds_the_committed_manifests(target):
    kubectl = _kubectl() or skip_or_fail("kubectl not installed (Debian: apt-get install kubernetes-client; .ci/run installs it)")
    proc = subprocess.run([kubectl, "kustomize", str(REPO / target)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    index = yaml.safe_load((REPO / "manifests" / "index.yaml").read_text())
    under = Path(target).relative_to("manifests").as_posix()  # ".", a profile or one job
    expected = {j["job"] for j in index["jobs"] if j["scheduler"] == "kubernetes"
                and (under == "." or j["dir"] == under or j["dir"].startswith(under + "/"))}
    jobs = {d["metadata"]["annotations"]["jobgen.dev/job-name"] for d in docs if d["kind"] == "PyTorchJob"}
    assert jobs == expected and len(docs) == 2 * len(expected)
