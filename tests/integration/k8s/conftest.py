"""The ``k8s_lab`` fixture: a real kube-apiserver 1.20 (+ etcd, + the garbage collector) on
this machine, built from Debian's source package and cached (see kubelab.py).

Skips, with the reason, where the machine can't host it: not Linux, not root (apt-get,
/var/cache), no Debian mirror or source package, packages that cannot be installed; under CI
(``$CI`` set, see tests/conftest.py ``skip_or_fail``) each of those fails instead.
``JOBGEN_SKIP_K8S_LAB=1`` skips it everywhere. A build or start-up failure on a machine that
can host it is an error (with the build log or daemon log tails), not a skip. ``JOBGEN_K8S_CACHE`` moves the build cache,
``JOBGEN_K8S_LAB_ROOT`` keeps the lab's files (logs, kubeconfig) in a directory of your choice.
The optional ``k8s_crd_server`` level (Debian sid's apiextensions-apiserver 0.36) skips when it
does not build (fails under CI), and skips everywhere with ``JOBGEN_SKIP_K8S_CRD_SERVER=1``.
The ``k8s_nodes`` level (two kubelet nodes, kube-scheduler, cluster DNS: pods run; kubenodes.py)
and the ``pods`` fixture on it (podlab.py: the training image, the emulated operator) run last;
``JOBGEN_SKIP_K8S_NODES=1`` skips them everywhere.

Test time: the lab's tests run last among the labs (the xdist worker that runs the labs runs the
SLURM and ssh labs first), and when the session selects any of them and the cache lacks a
binary they need (the node level's too, when its tests are selected), the build starts in the
background as soon as collection ends, and so does the training image's (kubeimage.py) when the
``pods`` tests are selected and the cache lacks it
(kubelab.build_in_background: nice 19 for it and its session's scheduling group, its log in the cache's logs/background.log; under xdist
from worker gw0 only), so minutes of compiling overlap the rest of the suite instead of following
it; the fixtures then wait for it. A single-process session that ends first stops the build it
started (the cache keeps no half-built stamp); an xdist worker leaves it to finish.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also under --import-mode=importlib

from kubelab import BUILD_PRIORITY_ENV, K8sLab, LabError, LabUnavailable, build_in_background, build_running, cache_dir, ensure_binaries, ensure_crd_server  # noqa: E402

from tests import phases  # noqa: E402
from tests.conftest import skip_or_fail  # noqa: E402

MARKER = "k8s_lab"
#: The fixtures of the node level (pods that really run: kubenodes.py, podlab.py).
NODE_FIXTURES = frozenset({"k8s_nodes", "pod_lab", "pods"})
#: ``JOBGEN_SKIP_K8S_NODES=1`` skips the node level everywhere (the API-server lab still runs).
SKIP_NODES_ENV = "JOBGEN_SKIP_K8S_NODES"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: needs a real kube-apiserver built from Debian's kubernetes source package (root, apt); "
        "skipped with a reason elsewhere, or with JOBGEN_SKIP_K8S_LAB=1",
    )


#: The background build this session started (:func:`pytest_collection_modifyitems`), if any.
_BACKGROUND: list[subprocess.Popen[bytes]] = []


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only the tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the tests that need the lab to the end of the session (stable order otherwise: the
    API-server tests, the node level, the CRD server's tests), and start the lab's build in the background when they need binaries the cache lacks (see the
    module docstring)."""
    lab_items = [item for item in items if item.get_closest_marker(MARKER)]
    if not lab_items:
        return
    node_items = [item for item in lab_items if NODE_FIXTURES & set(getattr(item, "fixturenames", ()))]
    crd_items = [item for item in lab_items if "k8s_crd_server" in getattr(item, "fixturenames", ()) and item not in node_items]
    # In the order kubelab.build finishes what they need: the API server, the node level (and the
    # training image), the optional CRD server.
    items[:] = ([item for item in items if not item.get_closest_marker(MARKER)]
                + [item for item in lab_items if item not in node_items and item not in crd_items] + node_items + crd_items)
    if (config.option.collectonly or os.environ.get("JOBGEN_SKIP_K8S_LAB") == "1" or lab_unavailable_reason()
            or os.environ.get("JOBGEN_K8S_BACKGROUND_BUILD") == "0"):
        return
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":  # every xdist worker collects: one build is enough
        return
    crd_server = os.environ.get("JOBGEN_SKIP_K8S_CRD_SERVER") != "1" and any(
        "k8s_crd_server" in getattr(item, "fixturenames", ()) for item in lab_items)
    with_nodes = bool(node_items) and os.environ.get(SKIP_NODES_ENV) != "1"
    log = cache_dir() / "logs" / "background.log"
    priority = os.environ.get(BUILD_PRIORITY_ENV) or "lowest"
    if with_nodes and any("pods" in getattr(item, "fixturenames", ()) for item in node_items):
        import kubeimage

        try:
            image = kubeimage.build_in_background(cache_dir() / "logs" / "image-background.log")
        except (OSError, LabError, kubeimage.ImageError) as exc:  # the fixture builds in the foreground and reports it
            print(f"k8s lab: no background image build ({exc})", file=sys.stderr)
        else:
            if image is not None:
                _BACKGROUND.append(image)
                print(f"\nk8s lab: building the training image in the background (CPU priority: {priority})", file=sys.stderr)
    if build_running(cache_dir()):
        print("\nk8s lab: a build into the cache is under way (e.g. .ci/run's); the lab's tests will wait for it",
              file=sys.stderr)
        return
    try:
        proc = build_in_background(crd_server=crd_server, log=log, with_nodes=with_nodes)
    except (OSError, LabError) as exc:  # e.g. the cache directory cannot be made: the fixture reports it
        print(f"k8s lab: no background build ({exc})", file=sys.stderr)
        return
    if proc is not None:
        _BACKGROUND.append(proc)
        print(f"\nk8s lab: building in the background (CPU priority: {priority}) while the other tests run; log: {log}", file=sys.stderr)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop a background build this session started that is still running (an early end, -x).
    Not in an xdist worker: the lab's tests may run on another worker, which waits for this build
    (its lock); it ends by itself (lowest CPU priority) and leaves its cache for the next session."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for proc in _BACKGROUND:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def lab_unavailable_reason() -> str | None:
    """Why this machine can't host the lab (None: it can try)."""
    if not sys.platform.startswith("linux"):
        return f"the Kubernetes lab builds Linux binaries from Debian packages (platform: {sys.platform})"
    if os.geteuid() != 0:
        return f"the Kubernetes lab needs root (apt-get, {cache_dir()}); running as uid {os.geteuid()}"
    return None


@pytest.fixture(scope="session")
def k8s_build() -> dict[str, Any]:
    """The cached (or freshly built) binaries' stamp: versions, ``build_s``, ``cached``."""
    if os.environ.get("JOBGEN_SKIP_K8S_LAB") == "1":
        pytest.skip("JOBGEN_SKIP_K8S_LAB=1")
    reason = lab_unavailable_reason()
    if reason:
        skip_or_fail(reason)
    if any(proc.poll() is None for proc in _BACKGROUND):
        print(f"\nk8s lab: waiting for the background build (log: {cache_dir() / 'logs' / 'background.log'})", file=sys.stderr)
    try:
        with phases.waited("wait: kube-apiserver binaries"):
            info = ensure_binaries(log=lambda m: print(m, file=sys.stderr))
    except LabUnavailable as exc:
        skip_or_fail(f"the Kubernetes lab cannot be built here: {exc}")
    state = "cached" if info["cached"] else "built"
    print(f"\nk8s lab binaries {state}: kube {info.get('kube_version')} (source {info['source_version']}, reflect2 "
          f"{info['reflect2_version']}, go {info['go_version']}), etcd {info.get('etcd_version')}; build took {info['build_s']} s "
          f"(compile {info.get('compile_s')} s) {'when it was built' if info['cached'] else 'now'}", file=sys.stderr)
    return info


@pytest.fixture(scope="session")
def k8s_lab(k8s_build: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sLab]:
    """An up K8sLab for the whole session, with namespace ``training`` and PriorityClass
    ``training-high`` (what the shipped k8s profiles reference) created."""
    configured = os.environ.get("JOBGEN_K8S_LAB_ROOT")
    root = Path(configured) if configured else tmp_path_factory.mktemp("k8s-lab")
    lab = K8sLab(root, k8s_build)
    try:
        lab.up()
    except BaseException:
        print(f"Kubernetes lab failed to come up under {root}:\n{lab.log_tails(40)}", file=sys.stderr)
        lab.down()
        raise
    print(f"k8s lab up in {lab.timings['total_s']} s (etcd {lab.timings['etcd_s']} s, kube-apiserver ready "
          f"{lab.timings['apiserver_ready_s']} s, CRDs {lab.timings['crds_s']} s) at {lab.server}", file=sys.stderr)
    lab.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "training"}})
    lab.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "training-high"},
               "value": 100000, "description": "jobgen lab: the class the k8s-h100 profile names"})
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="session")
def k8s_crd_server(k8s_lab: K8sLab) -> str:
    """The optional 1.36 CRD level: Debian sid's apiextensions-apiserver started next to the lab
    (strict field validation, CEL, the Trainer v2 CRDs); returns its kubeconfig context. Skips
    with the reason when it does not build (sid moves), fails then under CI;
    ``JOBGEN_SKIP_K8S_CRD_SERVER=1`` skips it everywhere."""
    if os.environ.get("JOBGEN_SKIP_K8S_CRD_SERVER") == "1":
        pytest.skip("JOBGEN_SKIP_K8S_CRD_SERVER=1")
    try:
        with phases.waited("wait: CRD server"):
            info = ensure_crd_server(log=lambda m: print(m, file=sys.stderr))
    except LabUnavailable as exc:
        skip_or_fail(str(exc))
    print(f"\napiextensions-apiserver {info['package_version']} ({info['go']}, {info['packages']} Debian sid packages) "
          f"{'cached' if info['cached'] else 'built'}; build took {info['build_s']} s (compile {info['compile_s']} s)", file=sys.stderr)
    context = k8s_lab.start_crd_server(info["binary"])
    print(f"apiextensions-apiserver ready in {k8s_lab.timings['crd_server_ready_s']} s; CRDs: {k8s_lab.crd_server_crds}", file=sys.stderr)
    return context




@pytest.fixture(scope="session")
def k8s_nodes(k8s_build: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[K8sLab, Any]]:
    """``(K8sLab, NodeLab)``: a lab of its own (not ``k8s_lab``'s) with two kubelet nodes,
    kube-scheduler and cluster DNS, up for the session; skips with ``JOBGEN_SKIP_K8S_NODES=1``.
    The node binaries are built (minutes) when the cache lacks them."""
    if os.environ.get(SKIP_NODES_ENV) == "1":
        pytest.skip(f"{SKIP_NODES_ENV}=1")
    import kubenodes

    try:
        with phases.waited("wait: node binaries"):
            info = kubenodes.ensure_node_binaries(log=lambda m: print(m, file=sys.stderr))
    except LabUnavailable as exc:
        skip_or_fail(f"the lab's node binaries cannot be built here: {exc}")
    print(f"\nk8s node binaries {'cached' if info['cached'] else 'built'}: kubelet + kube-scheduler {info.get('kube_version')}, "
          f"runtime {info.get('runtime')}; build took {info.get('build_s')} s (compile {info.get('compile_s')} s)", file=sys.stderr)
    configured = os.environ.get("JOBGEN_K8S_NODES_ROOT")
    root = Path(configured) if configured else tmp_path_factory.mktemp("k8s-nodes")
    lab, nodes = kubenodes.up_with_nodes(root)
    print(f"k8s lab with nodes up in {lab.timings['with_nodes_total_s']} s ({lab.timings} {nodes.timings})", file=sys.stderr)
    try:
        yield lab, nodes
    finally:
        left = kubenodes.down_and_check(lab, nodes)  # after every test that used the lab (test_pods_on_nodes.py says why here)
    assert not left, f"the node lab's down left: {left}"


@pytest.fixture(scope="session")
def pod_lab(k8s_nodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The pod lab (podlab.py :func:`~podlab.pod_lab`), once per session: the node lab with the
    training image on both nodes, the emulated training-operator and Trainer v2 stack running (the
    Trainer CRDs made for 1.20 installed), the ``k8s-lab`` profile and its TrainJob variant."""
    import podlab

    yield from podlab.pod_lab(k8s_nodes, tmp_path_factory)


@pytest.fixture(scope="module")
def pods(pod_lab) -> Iterator[Any]:
    """The session's pod lab for one test module; after the module its jobs, pods and containers
    are deleted (podlab.delete_jobs), so the next module (and the node tests) find none."""
    import podlab

    yield pod_lab
    podlab.delete_jobs(pod_lab)
