"""The collection hook's background build stays out of the way of a build already under way
(`.ci/run` starts one before pytest): it starts no second build process and says why. Needs no
lab: the cache is a temporary directory, and no build runs (Popen is recorded, not called)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubelab  # noqa: E402


@pytest.mark.parametrize("lock", [".lock", ".lock-crd-server"])
def test_a_held_build_lock_means_a_build_is_running(tmp_path, lock):
    assert not kubelab.build_running(tmp_path)  # no lock file yet
    with kubelab._locked(tmp_path / lock):
        assert kubelab.build_running(tmp_path)
    assert not kubelab.build_running(tmp_path)  # released (the file stays)


def test_no_second_background_build_while_one_holds_the_lock(tmp_path, monkeypatch):
    started: list[list[str]] = []
    monkeypatch.setattr(kubelab.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    log = tmp_path / "logs" / "background.log"
    with kubelab._locked(tmp_path / ".lock"):
        assert kubelab.build_in_background(crd_server=True, log=log, cache=tmp_path) is None
    assert started == []
    kubelab.build_in_background(crd_server=True, log=log, cache=tmp_path)  # nothing built, no build running
    assert started == [kubelab.background_build_argv(crd_server=True)]


def _record_build_steps(monkeypatch, tmp_path, *, fail: str = ""):
    """Stand-ins for the three builds kubelab.build runs, recording when each step starts."""
    import threading

    import kubenodes

    steps: list[str] = []
    fetched = threading.Event()

    def kube(cache, *, log, keep_tree=False):
        fetched.wait(10)  # the CRD server's download has begun before the first compile ends
        steps.append(f"kube keep_tree={keep_tree}")
        if fail == "kube":
            raise kubelab.LabCommandError(["build.sh"], 2, "compile error")
        return {"recipe": kubelab.RECIPE}

    def nodes(cache, *, log):
        steps.append("nodes")
        return {"recipe": kubenodes.NODE_RECIPE}

    def crd(cache, *, log, before_compile):
        steps.append("crd download")
        fetched.set()
        before_compile()
        steps.append("crd compile")
        if fail == "crd":
            raise kubelab.LabUnavailable("sid moved")
        return {"binary": "x"}

    monkeypatch.setenv(kubelab.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("JOBGEN_PHASES_FILE", str(tmp_path / "phases.jsonl"))
    monkeypatch.setattr(kubelab, "ensure_binaries", kube)
    monkeypatch.setattr(kubelab, "ensure_crd_server", crd)
    monkeypatch.setattr(kubenodes, "ensure_node_binaries", nodes)
    return steps


def test_the_build_compiles_what_the_tests_need_first_and_downloads_the_crd_server_meanwhile(tmp_path, monkeypatch):
    from tests import phases

    steps = _record_build_steps(monkeypatch, tmp_path)
    info = kubelab.build(crd_server=True, with_nodes=True, log=lambda m: None)
    assert steps == ["crd download", "kube keep_tree=True", "nodes", "crd compile"]
    assert info["nodes"]["recipe"] and info["crd_server"] == {"binary": "x"}
    recorded = [e["phase"] for e in phases.read(tmp_path / "phases.jsonl")]
    assert sorted(recorded) == sorted(["build: kube-apiserver + kube-controller-manager + etcd",
                                       "build: kubelet + kube-scheduler + node runtime", "build: CRD server (sid download, then compile)"])


def test_without_the_node_level_the_tree_is_not_kept(tmp_path, monkeypatch):
    steps = _record_build_steps(monkeypatch, tmp_path)
    kubelab.build(crd_server=True, with_nodes=False, log=lambda m: None)
    assert steps == ["crd download", "kube keep_tree=False", "crd compile"]


@pytest.mark.parametrize("fail", ["kube", "crd"])
def test_a_failed_part_fails_the_build_after_the_crd_thread_ended(tmp_path, monkeypatch, fail):
    steps = _record_build_steps(monkeypatch, tmp_path, fail=fail)
    with pytest.raises(kubelab.LabError):
        kubelab.build(crd_server=True, with_nodes=True, log=lambda m: None)
    assert steps[-1] == "crd compile"  # the thread was let go and joined, not left waiting
    assert ("nodes" in steps) is (fail == "crd")


def test_a_kept_tree_is_reused_only_for_the_same_source_and_recipe(tmp_path):
    dsc = tmp_path / "src" / "kubernetes_1.20.2-1.dsc"
    tree = tmp_path / "src" / "tree"
    tree.mkdir(parents=True)
    assert kubelab.shared_tree(tmp_path, dsc) is None  # no stamp
    (tree / kubelab.SHARED_TREE_STAMP).write_text(json.dumps({"dsc": "kubernetes_1.20.2-1.dsc", "recipe": kubelab.RECIPE}))
    assert kubelab.shared_tree(tmp_path, dsc) == tree
    assert kubelab.shared_tree(tmp_path, dsc.with_name("kubernetes_1.20.3-1.dsc")) is None
    (tree / kubelab.SHARED_TREE_STAMP).write_text(json.dumps({"dsc": "kubernetes_1.20.2-1.dsc", "recipe": kubelab.RECIPE - 1}))
    assert kubelab.shared_tree(tmp_path, dsc) is None
    (tree / kubelab.SHARED_TREE_STAMP).write_text("not json\x00")
    assert kubelab.shared_tree(tmp_path, dsc) is None


def test_the_build_compiles_without_optimisation():
    env = kubelab.go_build_env(Path("/nonexistent"))
    assert env["GOGCFLAGS"] == "all=-N -l"


def test_the_build_command_runs_the_build(tmp_path, monkeypatch, capsys):
    """``kubelab.py build --crd-server --with-nodes`` (what .ci/run starts) runs :func:`kubelab.build`."""
    steps = _record_build_steps(monkeypatch, tmp_path)
    assert kubelab.main(["build", "--crd-server", "--with-nodes"]) == 0
    assert steps == ["crd download", "kube keep_tree=True", "nodes", "crd compile"]
    assert json.loads(capsys.readouterr().out)["crd_server"] == {"binary": "x"}
