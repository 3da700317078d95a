"""``jobgen doctor`` on SLURM profiles (:mod:`jobgen.doctor.slurm`) against the fake SLURM client
commands (tests/fakes/slurm/fakeslurm.py).

The cluster is the 22.05 fixture of ``jobgen profiles detect``'s tests (tests/fakes/slurm/detect/22.05:
partitions ``debug`` and ``gpu``, four nodes of 8 A100 with MaxTime 2 days, associations of account
``ml-team``), written to the formats SLURM's man pages document, not captured from a cluster;
the real cluster is tests/integration/slurm/test_doctor_on_lab.py's. The matching profile is
the one ``jobgen profiles detect`` writes for it; each mismatch is one field changed in a
profile that extends it, and must fail its own check, with the fix, and no other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobgen.cli import cli
from tests.conftest import EXAMPLES, write
from tests.fakes.slurm.fakeslurm import (
    DETECT_FIXTURES,
    PARTITION_STATES_FORMAT,
    SACCTMGR_NO_DBD,
    detect_replies,
    file_reply,
    json_reply,
    reply,
    squeue_24_05,
)

STATES_KEY = f"sinfo {PARTITION_STATES_FORMAT}"
TEST_ONLY = "sbatch: Job 4242 to start at 2025-01-15T10:00:00 using 8 processors on nodes gpu01 in partition gpu\n"
ORDER = ["slurm.client", "slurm.partition", "slurm.account", "slurm.qos", "slurm.gres", "slurm.nodes", "slurm.time",
         "slurm.test_only", "slurm.probe"]


def jobgen(*args: str, cwd: Path):
    """``jobgen ARGS`` in-process in ``cwd`` (exit code, stdout and stderr apart)."""
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args), prog_name="jobgen")
    finally:
        os.chdir(old)


@pytest.fixture
def cluster(slurm, tmp_path) -> Path:
    """The 22.05 cluster answering (both partitions up, sbatch --test-only accepting), and the
    profile ``jobgen profiles detect`` writes for its GPU partition, plus ``qos: gpu-high``
    (detect leaves the QOS to the association's default): ``<tmp>/work/match.yaml``."""
    detect_replies(slurm, "22.05")
    slurm.respond(STATES_KEY, reply("debug|up\ngpu|up\n"))
    slurm.respond("sbatch", reply(stderr=TEST_ONLY))
    work = tmp_path / "work"
    work.mkdir()
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--out", str(work / "detected.yaml"), cwd=work)
    assert result.exit_code == 0, result.output
    write(work / "match.yaml", f"extends: {work / 'detected.yaml'}\nslurm: {{qos: gpu-high}}\n")
    shutil.copy(EXAMPLES / "quickstart.yaml", work / "quickstart.yaml")  # outside a git work tree: no snapshot
    slurm.forget_calls()
    return work


def doctor(work: Path, profile: str, *args: str) -> tuple[int, dict]:
    result = jobgen("doctor", "--profile", str(work / profile), *args, "-o", "json", cwd=work)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


def by_name(doc: dict) -> dict[str, dict]:
    return {check["name"]: check for check in doc["checks"]}


def test_a_detected_profile_passes_every_check(cluster, slurm):
    code, doc = doctor(cluster, "match.yaml", str(cluster / "quickstart.yaml"))
    assert code == 0, doc
    checks = by_name(doc)
    assert [c["name"] for c in doc["checks"]] == ORDER
    assert {name: c["status"] for name, c in checks.items()} == {**dict.fromkeys(ORDER, "pass"), "slurm.probe": "skip"}
    assert "22.05.8" in checks["slurm.client"]["detail"]
    assert "'gpu'" in checks["slurm.partition"]["detail"] and "up" in checks["slurm.partition"]["detail"]
    assert "4 of the 4 node(s) of partition 'gpu'" in checks["slurm.gres"]["detail"] and "'gpu:a100:8'" in checks["slurm.gres"]["detail"]
    assert "2880 min" in checks["slurm.time"]["detail"]
    assert "gpu01 in partition gpu" in checks["slurm.test_only"]["detail"]
    assert "--probe" in checks["slurm.probe"]["detail"]
    sbatch = slurm.argvs("sbatch")
    assert len(sbatch) == 1 and "--test-only" in sbatch[0] and sbatch[0][-1] == "job.sbatch"
    assert not (cluster / "runs").exists()  # the plan went to a temporary directory


def test_text_report_shows_one_line_per_check(cluster):
    result = jobgen("doctor", "--profile", str(cluster / "match.yaml"), cwd=cluster)
    assert result.exit_code == 0, result.output
    assert "ok    slurm.partition" in result.stdout
    assert result.stdout.rstrip().endswith("7 passed, 0 failed, 2 skipped")  # no spec: test_only; no --probe


MISMATCHES = {
    # name: (profile fields, --set overrides, the check that fails, text its fix must hold)
    "wrong partition": ("slurm: {partition: gpuu}", (), "slurm.partition", "slurm.partition: gpu in"),
    "unknown account": ("slurm: {account: ml-tem}", (), "slurm.account", "set slurm.account in"),
    "unknown QOS": ("slurm: {qos: gpu-hi}", (), "slurm.qos", "set slurm.qos in"),
    "time above MaxTime": ("slurm: {max_time_limit_min: null}", ("--set", "resources.time_limit_min=3000"), "slurm.time",
                           "resources.time_limit_min: 2880 (or fewer)"),
    "profile MaxTime above the partition's": ("slurm: {max_time_limit_min: 5000}", (), "slurm.time", "slurm.max_time_limit_min: 2880"),
    "missing GRES type": ("slurm: {gres_gpu_type: h100}", (), "slurm.gres", "slurm.gres_gpu_type: a100"),
    "more GPUs than a node has": ("gpus_per_node: 16", (), "slurm.gres", "gpus_per_node: 8"),
    "too many nodes": ("max_nodes: 8", (), "slurm.nodes", "max_nodes: 4"),
    "more CPUs than a node has": ("cpus_per_node: 256", (), "slurm.nodes", "cpus_per_node: 128"),
    "--gpus-per-node on select/cons_res": ("slurm: {gpu_request_style: gpus-per-node}", (), "slurm.client",
                                           "gpu_request_style: gres"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_each_mismatch_fails_exactly_its_check_with_the_fix(case, cluster, slurm):
    fields, overrides, failing, fix = MISMATCHES[case]
    write(cluster / "wrong.yaml", f"extends: {cluster / 'match.yaml'}\n{fields}\n")
    code, doc = doctor(cluster, "wrong.yaml", str(cluster / "quickstart.yaml"), *overrides)
    assert code == 1, doc
    checks = by_name(doc)
    assert [name for name, c in checks.items() if c["status"] == "fail"] == [failing], doc
    assert fix in checks[failing]["fix"], checks[failing]
    assert str(cluster / "wrong.yaml") in checks[failing]["fix"] or "quickstart.yaml" in checks[failing]["fix"]
    assert checks["slurm.test_only"]["status"] == "skip" and failing in checks["slurm.test_only"]["detail"]
    assert "sbatch" not in [argv[0] for argv in slurm.argvs()]  # nothing submitted after a failed check


def test_a_wrong_partition_lists_the_partitions_and_skips_what_needs_it(cluster):
    write(cluster / "wrong.yaml", f"extends: {cluster / 'match.yaml'}\nslurm: {{partition: gpuu}}\n")
    _, doc = doctor(cluster, "wrong.yaml")
    checks = by_name(doc)
    assert "'debug', 'gpu'" in checks["slurm.partition"]["detail"] and "did you mean 'gpu'?" in checks["slurm.partition"]["detail"]
    assert all(checks[name]["status"] == "skip" and "slurm.partition failed" in checks[name]["detail"] for name in ORDER[2:])


def test_a_partition_that_is_down_fails(cluster, slurm):
    slurm.respond(STATES_KEY, reply("debug|up\ngpu|drain\n"))
    code, doc = doctor(cluster, "match.yaml")
    assert code == 1
    partition = by_name(doc)["slurm.partition"]
    assert partition["status"] == "fail" and "'drain'" in partition["detail"] and "'debug'" in partition["fix"]


def test_without_slurmdbd_account_and_qos_are_skipped_with_the_reason(cluster, slurm):
    slurm.respond("sacctmgr", SACCTMGR_NO_DBD)
    code, doc = doctor(cluster, "match.yaml")
    assert code == 0, doc
    checks = by_name(doc)
    for name in ("slurm.account", "slurm.qos"):
        assert checks[name]["status"] == "skip" and "sacctmgr" in checks[name]["detail"] and "slurmdbd" in checks[name]["detail"]


def test_sbatch_test_only_refusing_the_job_fails_with_its_message(cluster, slurm):
    message = "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"
    slurm.respond("sbatch", reply(stderr=message, rc=1))
    code, doc = doctor(cluster, "match.yaml", str(cluster / "quickstart.yaml"))
    assert code == 1
    checks = by_name(doc)
    assert [name for name, c in checks.items() if c["status"] == "fail"] == ["slurm.test_only"]
    assert "Requested node configuration is not available" in checks["slurm.test_only"]["detail"]


def test_no_slurm_here_fails_the_client_check_and_skips_the_rest(slurm, tmp_path):
    profile = write(tmp_path / "p.yaml", "extends: slurm-cpu\n")
    result = jobgen("doctor", "--profile", str(profile), "-o", "json", cwd=tmp_path)  # nothing queued: every command exits 97
    assert result.exit_code == 1, result.output
    checks = by_name(json.loads(result.stdout))
    assert checks["slurm.client"]["status"] == "fail" and "login node" in checks["slurm.client"]["fix"]
    assert all(checks[name]["status"] == "skip" for name in ORDER[1:])


def test_a_probe_that_outlasts_the_timeout_is_cancelled(cluster, slurm):
    """The fake job never starts: squeue keeps it PENDING, so the probe gives up after
    --timeout, cancels it, and leaves no directory behind in the runs directory it made."""
    slurm.respond("sbatch", reply("4242\n"))
    slurm.respond("squeue", json_reply(squeue_24_05(4242, ["PENDING"], reason="Resources")))
    slurm.respond("scancel", reply())
    runs = cluster / "shared" / "runs"
    code, doc = doctor(cluster, "match.yaml", "--probe", "--timeout", "1", "--runs-dir", str(runs))
    assert code == 1
    probe = by_name(doc)["slurm.probe"]
    assert probe["status"] == "fail" and "4242 still PENDING" in probe["detail"] and "'Resources'" in probe["detail"]
    assert "--timeout" in probe["fix"]
    assert ["scancel", "4242"] in slurm.argvs("scancel")
    sbatch = slurm.argvs("sbatch")[0]
    assert "--partition=gpu" in sbatch and "--account=ml-team" in sbatch and "--qos=gpu-high" in sbatch
    assert "--gres=gpu:a100:1" in sbatch and "--nodes=1" in sbatch
    assert not (cluster / "shared").exists()


# --------------------------------------------------------------------------- hostile output

HOSTILE = {
    "spaces": b"gpu big nodes",
    "quotes": b"it's \"q\" `x` $(id)",
    "newline": b"de\x1b[2J\nbug",
    "300 bytes": b"p" * 300,
    "not UTF-8": b"gpu\xff\xfe",
}


def _hostile_fixture(tmp_path: Path, value: bytes) -> Path:
    where = tmp_path / "fixture"
    where.mkdir()
    for src in (DETECT_FIXTURES / "22.05").iterdir():
        (where / src.name).write_bytes(src.read_bytes())
    text = (where / "sinfo.txt").read_bytes()
    (where / "sinfo.txt").write_bytes(text.replace(b"|debug*|", b"|" + value + b"*|").replace(b"gpu01|", value + b"|"))
    return where


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_partition_and_node_names_never_give_a_traceback(kind, cluster, slurm, tmp_path):
    fixture = _hostile_fixture(tmp_path, HOSTILE[kind])
    detect_replies(slurm, fixture, with_json=False)
    states = tmp_path / "states.txt"
    states.write_bytes(HOSTILE[kind] + b"|up\ngpu|up\n")
    slurm.respond(STATES_KEY, file_reply(states))
    write(cluster / "elsewhere.yaml", f"extends: {cluster / 'match.yaml'}\nslurm: {{partition: nope}}\n")
    printed = {}
    for profile, want, outputs in (("match.yaml", 0, ("text",)), ("elsewhere.yaml", 1, ("text", "json", "yaml"))):
        for output in outputs:
            result = jobgen("doctor", "--profile", str(cluster / profile), "-o", output, cwd=cluster)
            assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
            assert result.exit_code == want, result.output
            assert "Traceback" not in result.output
            for line in result.stdout.splitlines():
                assert line.isprintable(), repr(line)
            printed[profile, output] = result.stdout
    listed = by_name(json.loads(printed["elsewhere.yaml", "json"]))
    detail = listed["slurm.partition"]["detail"]
    assert "'gpu'" in detail
    if kind != "newline":  # a name holding a line break splits sinfo's line: that line is left out
        assert (repr(HOSTILE[kind].decode("utf-8", "surrogateescape"))[:20]) in detail
    else:
        assert "record(s) of its output left out" in listed["slurm.client"]["detail"]


def test_the_probe_script_quotes_every_profile_value(tmp_path):
    """The probe's batch script with hostile modules, env values, interpreter and runs directory:
    bash and shellcheck accept it, and run here (no SLURM) it reports the interpreter's failure
    and writes the job id into the runs directory, each value intact."""
    import subprocess

    from jobgen.doctor import DoctorContext
    from jobgen.doctor.slurm import PROBE_MARK, probe_script
    from jobgen.specs.load import load_profile
    from tests.conftest import ADVERSARIAL, lint_bash

    runs = tmp_path / "runs $(touch PWNED) 'x'"
    runs.mkdir()
    profile = write(tmp_path / "p.yaml", json.dumps({  # JSON is YAML
        "extends": "slurm-cpu", "env": {f"V{i}": value for i, value in enumerate(ADVERSARIAL)},
        "slurm": {"python": str(tmp_path / "no such python"), "cluster": "cpu"}}))
    ctx = DoctorContext(profile=load_profile(str(profile)), profile_source=str(profile))
    script = write(tmp_path / "probe.sbatch", probe_script(ctx, runs / "written-on-node"))
    lint_bash(script)
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node 'one'"}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60).stdout
    lines = [line for line in out.splitlines() if line.startswith(PROBE_MARK)]
    assert lines[0] == f"{PROBE_MARK} node node 'one'"
    assert f"{PROBE_MARK} import failed" in lines and any("no such python" in line for line in lines)
    assert (runs / "written-on-node").read_text() == "77\n" and f"{PROBE_MARK} runs dir written" in lines
    assert not (tmp_path / "PWNED").exists()
