"""The Kubernetes lab's background build takes only the CPU the tests leave idle, unless asked
for a normal priority (``$JOBGEN_K8S_BUILD_PRIORITY=normal``: ``.ci/run``, where the node level
waits for the build on a cold machine).

Linux groups the processes of each session for the scheduler (autogroups, sched(7)), and shares
the CPU between groups by the GROUP's nice value: a build started with ``setsid nice -n 19`` sat
in a group of its own at nice 0 and took as much CPU as the whole test session (measured:
two such hogs on 2 cores slowed a CPU-bound loop 3x, 1.1x once their group's nice was
19). Needs no lab (Linux with autogroups; skipped elsewhere)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

KUBELAB = Path(__file__).resolve().parent / "kubelab.py"
AUTOGROUP = Path("/proc/self/autogroup")

pytestmark = pytest.mark.skipif(not AUTOGROUP.exists(), reason="the kernel has no autogroups (CONFIG_SCHED_AUTOGROUP)")

#: Prints this process's nice value and its autogroup's, after ``lowest_cpu_priority()`` when asked.
REPORT = """\
import os, sys
sys.path.insert(0, {dir!r})
if sys.argv[1] == "lower":
    import kubelab
    kubelab.lowest_cpu_priority()
print(os.getpriority(os.PRIO_PROCESS, 0), open("/proc/self/autogroup").read().split()[-1])
"""


def _priorities(*, lower: bool) -> tuple[int, int]:
    code = REPORT.format(dir=str(KUBELAB.parent))
    out = subprocess.run([sys.executable, "-c", code, "lower" if lower else "as-is"], capture_output=True,
                         text=True, check=True, start_new_session=True, timeout=60).stdout.split()
    return int(out[0]), int(out[1])


def test_lowest_cpu_priority_lowers_the_process_and_its_sessions_group():
    assert _priorities(lower=False) == (0, 0)  # a new session starts at full share
    assert _priorities(lower=True) == (19, 19)


def test_a_sessions_background_build_asks_for_the_lowest_priority_by_default(monkeypatch):
    """The build a test session starts at collection (build_in_background), kube's and the image's."""
    import kubelab

    monkeypatch.delenv(kubelab.BUILD_PRIORITY_ENV, raising=False)
    assert kubelab.background_build_argv(crd_server=True)[-1] == "--lowest-priority"
    monkeypatch.setenv(kubelab.BUILD_PRIORITY_ENV, "normal")
    assert "--lowest-priority" not in kubelab.background_build_argv(crd_server=True)
    for hostile in ("high", "normal; rm -rf /", "19", "lowest\n"):
        monkeypatch.setenv(kubelab.BUILD_PRIORITY_ENV, hostile)
        if hostile.strip() in kubelab.BUILD_PRIORITIES:
            continue
        with pytest.raises(kubelab.LabError, match=kubelab.BUILD_PRIORITY_ENV):
            kubelab.background_build_argv(crd_server=True)


def test_the_image_build_follows_the_same_priority(monkeypatch, tmp_path):
    import kubeimage
    import kubelab

    started = []
    monkeypatch.setattr(kubeimage, "cached_home", lambda: None)
    monkeypatch.setattr(kubeimage.subprocess, "Popen", lambda argv, **kw: started.append(argv))
    for value, expected in (("lowest", True), ("normal", False)):
        monkeypatch.setenv(kubelab.BUILD_PRIORITY_ENV, value)
        kubeimage.build_in_background(tmp_path / "log")
        assert ("--lowest-priority" in started[-1]) is expected


def test_ci_builds_at_normal_priority():
    """.ci/run's build is on a cold run's longest chain (the node tests wait for it)."""
    ci = (KUBELAB.parents[3] / ".ci" / "run").read_text().splitlines()
    ci_line = next(line for line in ci if "kubelab.py build" in line)
    assert "--lowest-priority" not in ci_line, ci_line
    assert "export JOBGEN_K8S_BUILD_PRIORITY=normal" in ci[:ci.index(ci_line)]
