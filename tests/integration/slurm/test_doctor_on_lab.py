"""``jobgen profiles detect --scheduler slurm`` and ``jobgen doctor`` against the real lab cluster.

One module-scoped setup: ``jobgen profiles detect`` run with the lab's client environment writes
a profile of partition ``lab`` (2 CPU nodes), and the site adds the one thing detect cannot see:
``slurm.python``, the interpreter on the compute nodes that has jobgen[train] installed (detect
reads the controller, not the nodes' Pythons; the lab's nodes share this machine, so it is this
test's own). Then: the quick start runs with that profile (shortened as the other lab tests
shorten it), ``jobgen doctor`` passes on it with the spec and ``--probe``, and each mismatch
fails its own check: a wrong partition, a time limit above a MaxTime the admins lowered after
detection, an account the user has no association for (skipped where the lab runs without
slurmdbd, its default), and a compute-node Python without jobgen (``--probe``).
Wall times are printed (``-s``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from lab import run_slurm, wait_for

from tests.conftest import EXAMPLES, REPO

pytestmark = pytest.mark.slurm_lab

#: The quick start, shortened as test_jobgen_on_lab.py's jobs are: a 2-layer model on 1 MB of
#: text for 20 steps (the lab's nodes have 1 CPU each).
SHORT = ("--set", "model={preset: null, n_layer: 2, n_head: 2, d_model: 64, block_size: 64}", "--set", "data.max_bytes=1000000",
         "--set", "trainer.max_steps=20", "--set", "trainer.warmup_steps=5", "--set", "trainer.micro_batch_size=8",
         "--set", "trainer.val_check_interval=20", "--set", "trainer.limit_val_batches=2", "--set", "trainer.log_every_n_steps=10",
         "--set", "checkpoint.every_n_steps=20")
#: A Python on the machine (so on the lab's nodes) without torch: jobgen.train cannot import there.
BARE_PYTHON = "/usr/bin/python3"


@dataclass
class Site:
    """The module's directory (``root``), the environment jobgen runs in, and the profile files."""

    lab: object
    root: Path
    env: dict[str, str]
    detected: Path
    profile: Path
    spec: Path

    def jobgen(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=self.root, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def doctor(self, profile: Path, *args: str, timeout: float = 180) -> tuple[int, dict[str, dict]]:
        proc = self.jobgen("doctor", "--profile", str(profile), *args, "--runs-dir", str(self.root / "runs"), "-o", "json",
                           timeout=timeout)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}

    def derived(self, name: str, fields: dict) -> Path:
        """A profile extending the site's with ``fields`` changed."""
        path = self.root / "profiles" / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"extends": str(self.profile), **fields}, sort_keys=True))
        return path


@pytest.fixture(scope="module")
def site(slurm_lab, tmp_path_factory) -> Iterator[Site]:
    started = time.monotonic()
    root = tmp_path_factory.mktemp("doctor-lab")
    env = {**slurm_lab.client_env(), "JOBGEN_STATE_DIR": str(root / "state"), "PYTHONPATH": str(REPO)}
    env.pop("JOBGEN_DEBUG", None)
    detected = root / "profiles" / "detected.yaml"
    proc = subprocess.run([sys.executable, "-m", "jobgen.cli", "profiles", "detect", "--scheduler", "slurm", "--out", str(detected)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    profile = root / "profiles" / "site.yaml"
    profile.write_text(yaml.safe_dump({"extends": str(detected), "slurm": {"python": sys.executable}}))
    spec = root / "quickstart.yaml"
    shutil.copy(EXAMPLES / "quickstart.yaml", spec)  # outside a git work tree: no code snapshot to take
    print(f"\nsetup (profiles detect): {time.monotonic() - started:.1f} s", file=sys.stderr)
    yield Site(slurm_lab, root, env, detected, profile, spec)
    jobs = run_slurm(slurm_lab, "squeue", "-h", "-o", "%i").stdout.split()
    if jobs:  # a failed test must not leave a job holding the lab's nodes
        run_slurm(slurm_lab, "scancel", *jobs)


def test_detect_writes_the_partitions_profile_and_the_quickstart_completes_with_it(site):
    started = time.monotonic()
    doc = yaml.safe_load(site.detected.read_text())
    assert doc["scheduler"] == "slurm" and doc["slurm"]["partition"] == "lab" and doc["slurm"]["cluster"] == "jobgenlab"
    assert (doc["max_nodes"], doc["gpus_per_node"], doc["cpus_per_node"]) == (2, 0, site.lab.cpus_per_node)
    assert doc["mem_gib_per_node"] * 1024 <= site.lab.real_memory_mb
    proc = site.jobgen("submit", str(site.spec), "--profile", str(site.profile), "--runs-dir", str(site.root / "runs"), *SHORT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    handle = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    jid = handle.rsplit("/", 1)[1]

    def ended() -> str:
        state = run_slurm(site.lab, "squeue", "-h", "-t", "all", "-j", jid, "-o", "%T", check=False).stdout.strip()
        return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY") else ""

    state = wait_for(ended, 300, 1.0, what=f"job {jid} to end")
    log = "".join(p.read_text(errors="replace") for p in (site.root / "runs").rglob(f"slurm-{jid}.out"))
    assert state == "COMPLETED", log[-3000:]
    summary = json.loads((site.root / "runs" / "quickstart" / "summary.json").read_text())
    assert summary, summary
    status = json.loads(site.jobgen("status", "--json", handle).stdout)
    assert status["state"] == "COMPLETED", status
    print(f"\nquickstart on the detected profile: {time.monotonic() - started:.1f} s", file=sys.stderr)


def test_doctor_passes_on_the_detected_profile_with_the_spec_and_the_probe(site):
    started = time.monotonic()
    code, checks = site.doctor(site.profile, str(site.spec), *SHORT, "--probe", "--timeout", "120")
    print("".join(f"\n  {c['status']:4}  {name}  {c['detail']}" for name, c in checks.items()), file=sys.stderr)
    assert code == 0, checks
    assert {name: c["status"] for name, c in checks.items() if c["status"] != "skip"} == {
        name: "pass" for name in ("slurm.client", "slurm.partition", "slurm.gres", "slurm.nodes", "slurm.time",
                                  "slurm.test_only", "slurm.probe")}, checks
    # without slurmdbd detect leaves the account to SLURM (null: skipped); with it, the user's only account (checked)
    assert checks["slurm.account"]["status"] == ("pass" if site.lab.accounting else "skip"), checks["slurm.account"]
    assert checks["slurm.qos"]["status"] == "skip"  # detect leaves the QOS to the association's default
    assert "'lab'" in checks["slurm.partition"]["detail"] and "up" in checks["slurm.partition"]["detail"]
    assert "in partition lab" in checks["slurm.test_only"]["detail"]  # SLURM's own estimate
    assert "imports jobgen.train" in checks["slurm.probe"]["detail"]
    assert any(f"'{node}'" in checks["slurm.probe"]["detail"] for node in site.lab.nodes)
    assert not [p for p in (site.root / "runs").iterdir() if p.name.startswith(".jobgen-doctor-")]  # the probe cleans up
    print(f"\ndoctor --probe, passing: {time.monotonic() - started:.1f} s", file=sys.stderr)


def test_mismatches_fail_exactly_their_check(site):
    started = time.monotonic()
    failing: dict[str, list[str]] = {}

    def only_failure(name: str, checks: dict[str, dict]) -> dict:
        failing[name] = [n for n, c in checks.items() if c["status"] == "fail"]
        assert failing[name] == [name], checks
        return checks[name]

    code, checks = site.doctor(site.derived("wrong-partition", {"slurm": {"partition": "labb"}}))
    partition = only_failure("slurm.partition", checks)
    assert code == 1 and "did you mean 'lab'?" in partition["detail"] and "slurm.partition: lab" in partition["fix"]

    # The admins lower MaxTime after the profile was detected (it recorded UNLIMITED): doctor reads the live one.
    run_slurm(site.lab, "scontrol", "update", "PartitionName=lab", "MaxTime=30")
    try:
        code, checks = site.doctor(site.profile, str(site.spec), *SHORT, "--set", "resources.time_limit_min=45")
    finally:
        run_slurm(site.lab, "scontrol", "update", "PartitionName=lab", "MaxTime=INFINITE")
    limit = only_failure("slurm.time", checks)
    assert code == 1 and "45 min" in limit["detail"] and "30 min" in limit["detail"]
    assert "resources.time_limit_min: 30" in limit["fix"]

    code, checks = site.doctor(site.derived("no-such-account", {"slurm": {"account": "no-such-account"}}))
    if site.lab.accounting:
        account = only_failure("slurm.account", checks)
        assert code == 1 and "'no-such-account'" in account["detail"]
    else:  # no slurmdbd: sacctmgr does not answer, so the account cannot be checked
        assert code == 0, checks
        assert checks["slurm.account"]["status"] == "skip" and "sacctmgr" in checks["slurm.account"]["detail"]

    code, checks = site.doctor(site.derived("bare-python", {"slurm": {"python": BARE_PYTHON}}), "--probe", "--timeout", "120")
    probe = only_failure("slurm.probe", checks)
    assert code == 1 and f"'{BARE_PYTHON}' cannot import jobgen.train" in probe["detail"]
    assert "ModuleNotFoundError" in probe["detail"] and any(f"node '{node}'" in probe["detail"] for node in site.lab.nodes)
    assert "slurm.python" in probe["fix"]
    print(f"\nfour mismatches: {time.monotonic() - started:.1f} s", file=sys.stderr)
