"""``jobgen profiles detect --scheduler slurm`` against fake ``sinfo``/``scontrol``/``sacctmgr``.

The fakes (tests/fakes/slurm/fakeslurm.py, :func:`detect_replies`) answer with one cluster per
release, 22.05, 23.02, 23.11, 24.05 and 25.05 (tests/fakes/slurm/detect/<release>/): ``sinfo
--json`` in the release's shape and sinfo's text output of the same nodes. The files are
written to the formats the man pages and SchedMD's data_parser plugins document for each
release, not captured from a cluster. Each case's expected profile is read from the fixture's
text (node lines, ``scontrol show config``, the version line) by the simple rules of the
documentation, the JSON run must give the same profile, and the written file must render
``examples/quickstart.yaml`` into an sbatch script ``bash -n`` accepts.

Hostile fixtures (values with spaces, quotes, line breaks, 300 bytes, bytes that are not UTF-8)
must never give a traceback, a file that does not load back as written, or an unquoted shell
value; what cannot be written is refused naming the command and the line or JSON path.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from jobgen.cli import cli
from jobgen.specs.load import load_profile
from tests.conftest import EXAMPLES
from tests.fakes.slurm.fakeslurm import DETECT_FIXTURES, SACCTMGR_NO_DBD, detect_replies, reply

RELEASES = ["22.05", "23.02", "23.11", "24.05", "25.05"]
#: The partition each release's case profiles (24.05 has two GPU partitions: one is named).
PARTITION = {"22.05": None, "23.02": None, "23.11": None, "24.05": "ampere", "25.05": None}
SPEC = EXAMPLES / "quickstart.yaml"


def jobgen(*args: str, cwd: Path):
    """``jobgen ARGS`` in-process (exit code, stdout and stderr apart), in ``cwd``."""
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args), prog_name="jobgen")
    finally:
        os.chdir(old)


def minutes(text: str) -> int | None:
    """sinfo's ``%l``/``%L``: ``[D-]H:MM:SS`` or ``M:SS``; None for ``infinite`` / ``n/a``."""
    if text in ("infinite", "n/a"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    seconds = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    return (int(days or 0) * 86400 + seconds) // 60


def expected(release: str, partition: str | None) -> dict:
    """The profile the fixture's text describes: the partition's GPU nodes of the most common
    GRES (type and count), their fewest CPUs and least memory; the version and SelectType decide
    the GPU request style."""
    where = DETECT_FIXTURES / release
    rows = [line.split("|") for line in (where / "sinfo.txt").read_text().splitlines()]
    if partition is None:
        gpu_parts = {r[1].rstrip("*") for r in rows if r[4].startswith("gpu")}
        assert len(gpu_parts) == 1, gpu_parts
        partition = gpu_parts.pop()
    nodes = [r for r in rows if r[1].rstrip("*") == partition]
    gres = Counter(re.sub(r"\(.*\)$", "", r[4]) for r in nodes if r[4].startswith("gpu"))
    shape = max(gres, key=lambda g: gres[g])
    chosen = [r for r in nodes if re.sub(r"\(.*\)$", "", r[4]) == shape]
    _, gres_type, count = shape.split(":")
    config = dict(re.findall(r"^(\w+)\s*=\s*(.*)$", (where / "config.txt").read_text(), flags=re.M))
    version = re.search(r"(\d\d\.\d\d)", (where / "version.txt").read_text()).group(1)
    max_time, default_time = minutes(chosen[0][6]), minutes(chosen[0][7])
    return {
        "partition": partition, "cluster": config["ClusterName"], "max_nodes": len(chosen), "gpus_per_node": int(count),
        "gres_gpu_type": gres_type, "cpus_per_node": min(int(r[2]) for r in chosen),
        "mem_mib": min(int(r[3]) for r in chosen), "version": version,
        "gpu_request_style": "gpus-per-node" if config["SelectType"] == "select/cons_tres" else "gres",
        "max_time_limit_min": max_time, "time_limit_min": default_time or min(60, max_time or 60),
    }


@pytest.fixture
def cwd(tmp_path):
    where = tmp_path / "work"
    where.mkdir()
    return where


def render_checked(profile: Path, cwd: Path) -> str:
    """``jobgen render examples/quickstart.yaml --profile FILE --stdout``: the sbatch script,
    after ``bash -n`` accepted it."""
    result = jobgen("render", str(SPEC), "--profile", str(profile), "--stdout", cwd=cwd)
    assert result.exit_code == 0, result.output
    script = re.split(r"^# ---- \S+ ----$", result.stdout.split("# ---- job.sbatch ----\n", 1)[1], flags=re.M)[0]
    assert script.startswith("#!/bin/bash\n")
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    return script


def sbatch_option(script: str, option: str) -> str | None:
    """The value of ``#SBATCH --option=VALUE`` as sbatch reads it (shell words, one word)."""
    for line in script.split("\n"):  # bash's lines: U+2028 and the like are no line breaks there
        if line.startswith(f"#SBATCH --{option}="):
            words = shlex.split(line.split("=", 1)[1])
            assert len(words) == 1, line
            return words[0]
    return None


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_gives_the_profile_its_nodes_describe(release, slurm, cwd):
    want = expected(release, PARTITION[release])
    results = {}
    for mode in ("json", "text"):
        detect_replies(slurm, release, with_json=mode == "json")
        out = cwd / f"{mode}.yaml"
        args = ["profiles", "detect", "--scheduler", "slurm", "--out", str(out)]
        result = jobgen(*args, *(["--partition", PARTITION[release]] if PARTITION[release] else []), cwd=cwd)
        assert result.exit_code == 0, result.output
        assert f"wrote {out}" in result.stdout
        assert ("`sinfo --json` failed" in result.stderr) is (mode == "text")
        profile = load_profile(str(out))
        s = profile.slurm_settings
        assert (s.partition, s.cluster, s.version) == (want["partition"], want["cluster"], want["version"])
        assert (profile.max_nodes, profile.gpus_per_node, s.gres_gpu_type) == (want["max_nodes"], want["gpus_per_node"], want["gres_gpu_type"])
        assert profile.cpus_per_node == want["cpus_per_node"]
        assert int(profile.mem_gib_per_node * 1024) <= want["mem_mib"] < int(profile.mem_gib_per_node * 1024) + 11  # rounded down
        assert (s.max_time_limit_min, s.time_limit_min) == (want["max_time_limit_min"], want["time_limit_min"])
        assert s.gpu_request_style == want["gpu_request_style"]
        assert profile.gpu_type is not None and profile.gpu_type.lower() in want["gres_gpu_type"]
        results[mode] = yaml.safe_load(out.read_text())
        script = render_checked(out, cwd)
        assert sbatch_option(script, "partition") == want["partition"]
        gpu_flag = "gres" if want["gpu_request_style"] == "gres" else "gpus-per-node"
        assert sbatch_option(script, gpu_flag).endswith(f"{want['gres_gpu_type']}:{want['gpus_per_node']}")
        assert int(sbatch_option(script, "mem").rstrip("M")) <= want["mem_mib"]  # --mem never above RealMemory
    assert results["json"] == results["text"]
    assert [c[0] for c in slurm.argvs()][:2] == ["sinfo", "scontrol"]


def test_every_value_names_its_source_and_the_file_is_deterministic(slurm, cwd):
    detect_replies(slurm, "23.11")
    first = jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "yaml", cwd=cwd)
    again = jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "yaml", cwd=cwd)
    assert first.exit_code == 0, first.output
    assert first.stdout == again.stdout  # byte-identical
    lines = first.stdout.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*[a-z_]+: \S", line) and not line.strip().startswith(("description", "scheduler", "default_nodes")):
            assert lines[i - 1].strip().startswith("#"), f"no source comment above {line!r}"
    text = first.stdout
    assert "# `sinfo --version` (23.11.10)" in text
    assert "SelectType=select/cons_tres" in text
    assert "sinfo --json` sinfo[" in text  # the record each node value came from
    doc = json.loads(jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd).stdout)
    assert doc["profile"] == yaml.safe_load(text)
    assert doc["sources"]["slurm.version"] == "`sinfo --version` (23.11.10)"
    assert not list(cwd.iterdir())  # -o yaml|json print; they write nothing


def test_mixed_partition_takes_the_shape_most_nodes_have(slurm, cwd):
    """23.11's hopper: two nodes of 8 H100 and one of 4: the profile is the 8-GPU nodes'."""
    detect_replies(slurm, "23.11")
    doc = json.loads(jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd).stdout)
    rows = [r.split("|") for r in (DETECT_FIXTURES / "23.11" / "sinfo.txt").read_text().splitlines() if "|hopper|" in r]
    eight = [r for r in rows if ":8(" in r[4]]
    assert doc["profile"]["max_nodes"] == len(eight) < len(rows)
    assert doc["profile"]["cpus_per_node"] == min(int(r[2]) for r in eight)
    assert doc["profile"]["gpu_mem_gib"] == 80  # nvidia_h100_80gb_hbm3
    assert "left out" in doc["sources"]["max_nodes"]


def test_a_cpu_partition_gives_a_cpu_profile(slurm, cwd):
    detect_replies(slurm, "25.05")
    out = cwd / "cluster_profiles" / "mine.yaml"
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", "cpu", "--out", str(out), cwd=cwd)
    assert result.exit_code == 0, result.output
    profile = load_profile(str(out))
    rows = [r.split("|") for r in (DETECT_FIXTURES / "25.05" / "sinfo.txt").read_text().splitlines() if "|cpu|" in r]
    assert (profile.gpus_per_node, profile.cpu_processes_per_node, profile.max_nodes) == (0, 1, len(rows))
    assert profile.cpus_per_node == min(int(r[2]) for r in rows)
    assert profile.slurm_settings.exclusive is False and profile.name == "mine"
    script = render_checked(out, cwd)
    assert sbatch_option(script, "gres") is None and sbatch_option(script, "gpus-per-node") is None


def test_several_gpu_partitions_are_listed(slurm, cwd):
    detect_replies(slurm, "24.05")
    result = jobgen("profiles", "detect", "--scheduler", "slurm", cwd=cwd)
    assert result.exit_code == 2
    assert "2 GPU partitions" in result.stderr and "l40s" in result.stderr and "ampere" in result.stderr
    assert "--partition NAME" in result.stderr and "Traceback" not in result.output
    assert not list(cwd.iterdir())
    wrong = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", "amper", cwd=cwd)
    assert wrong.exit_code == 2 and "did you mean 'ampere'?" in wrong.stderr


def test_an_existing_file_is_kept_without_force(slurm, cwd):
    detect_replies(slurm, "22.05")
    out = cwd / "site.yaml"
    out.write_text("# mine\n")
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--out", str(out), cwd=cwd)
    assert result.exit_code == 2 and "exists" in result.stderr and "--force" in result.stderr
    assert out.read_text() == "# mine\n"
    forced = jobgen("profiles", "detect", "--scheduler", "slurm", "--out", str(out), "--force", cwd=cwd)
    assert forced.exit_code == 0, forced.output
    assert load_profile(str(out)).slurm_settings.partition == "gpu"


def test_the_default_file_is_named_after_cluster_and_partition(slurm, cwd):
    detect_replies(slurm, "22.05")
    result = jobgen("profiles", "detect", "--scheduler", "slurm", cwd=cwd)
    assert result.exit_code == 0, result.output
    assert (cwd / "cluster_profiles" / "lab22-gpu.yaml").is_file()
    assert jobgen("validate", str(SPEC), "--profile", "lab22-gpu", cwd=cwd).exit_code == 0


def test_without_slurmdbd_account_and_qos_are_left_to_slurm(slurm, cwd):
    detect_replies(slurm, "23.02")  # no sacctmgr.txt: sacctmgr fails as without slurmdbd
    doc = json.loads(jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd).stdout)
    assert doc["profile"]["slurm"]["account"] is None and "did not answer" in doc["sources"]["slurm.account"]
    detect_replies(slurm, "22.05")  # ml-team for every partition and for gpu
    doc = json.loads(jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd).stdout)
    assert doc["profile"]["slurm"]["account"] == "ml-team"
    assert "gpu-high" in doc["sources"]["slurm.qos"]


def test_no_slurm_here_is_an_error_with_a_hint(slurm, cwd):
    result = jobgen("profiles", "detect", "--scheduler", "slurm", cwd=cwd)  # nothing queued: every command exits 97
    assert result.exit_code == 1, result.output
    assert "sinfo" in result.stderr and "Traceback" not in result.output
    doc = json.loads(jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd).stdout)
    assert doc["exit_code"] == 1 and "sinfo" in doc["error"]


def test_untyped_gpus_need_gpu_type(slurm, cwd, tmp_path):
    fixture = _copy_fixture("25.05", tmp_path, sinfo_text=lambda t: t.replace(b"gpu:h200:8(S:0-1)", b"gpu:8").replace(b"h200,ib", b"ib"))
    detect_replies(slurm, fixture, with_json=False)
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd)
    assert result.exit_code == 2 and "--gpu-type" in json.loads(result.stdout)["hint"]
    ok = jobgen("profiles", "detect", "--scheduler", "slurm", "--gpu-type", "H200", "-o", "json", cwd=cwd)
    doc = json.loads(ok.stdout)
    assert (doc["profile"]["gpu_type"], doc["profile"]["slurm"]["gres_gpu_type"]) == ("H200", None)
    featured = _copy_fixture("25.05", tmp_path / "featured", sinfo_text=lambda t: t.replace(b"gpu:h200:8(S:0-1)", b"gpu:8"))
    detect_replies(slurm, featured, with_json=False)  # untyped GRES, but every node has the feature h200
    doc = json.loads(jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd).stdout)
    assert doc["profile"]["gpu_type"] == "H200" and "node feature" in doc["sources"]["gpu_type"]


def test_hostile_values_in_sinfo_json_are_quoted(slurm, cwd, tmp_path):
    """25.05's JSON with a partition name of quotes and blanks, a 300-byte node name and features
    holding a line break and an escape: written quoted, comments escaped, the file loads back."""
    name = 'g "p" u\'s $HOME'
    fixture = _copy_fixture("25.05", tmp_path, sinfo_json=lambda t: t.replace(b'"name": "gpu"', b'"name": ' + json.dumps(name).encode())
                            .replace(b'"h200-01"', json.dumps("n" * 300).encode()).replace(b'"h200,ib"', b'"h200,ib,x\\ny\\u001b[0m"'))
    detect_replies(slurm, fixture)
    out = cwd / "p.yaml"
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", name, "--out", str(out), cwd=cwd)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    assert doc["slurm"]["partition"] == name and doc["gpu_type"] == "H200"
    assert "\x1b" not in out.read_text()
    assert sbatch_option(render_checked(out, cwd), "partition") == name


# --------------------------------------------------------------------------- hostile output


def _copy_fixture(release: str, tmp_path: Path, *, sinfo_text=None, sinfo_json=None, config=None) -> Path:
    """A copy of ``detect/<release>/`` with its files changed by the functions given (bytes -> bytes)."""
    where = tmp_path / f"fixture-{release}"
    where.mkdir(parents=True, exist_ok=True)
    for src in (DETECT_FIXTURES / release).iterdir():
        change = {"sinfo.txt": sinfo_text, "sinfo.json": sinfo_json, "config.txt": config}.get(src.name)
        (where / src.name).write_bytes(change(src.read_bytes()) if change else src.read_bytes())
    return where


LONG = "p" * 300
HOSTILE_PARTITIONS = {
    "spaces": "gpu big nodes",
    "quotes": "it's \"q\" `x` $(id)",
    "300 bytes": LONG,
    "yaml-ish": "- [a]: #b",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_PARTITIONS))
def test_hostile_partition_names_are_quoted_everywhere(kind, slurm, cwd, tmp_path):
    name = HOSTILE_PARTITIONS[kind]
    fixture = _copy_fixture("22.05", tmp_path, sinfo_text=lambda t: t.replace(b"|gpu|", f"|{name}|".encode()),
                            config=lambda t: t.replace(b"= lab22", b"= lab 22 \"x\""))
    detect_replies(slurm, fixture, with_json=False)
    out = cwd / "hostile.yaml"
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", name, "--out", str(out), cwd=cwd)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(out.read_text())
    assert doc["slurm"]["partition"] == name
    assert re.fullmatch(r"[A-Za-z0-9._-]+", doc["slurm"]["cluster"])  # a label in handles: letters, digits, . _ -
    printed = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", name, "-o", "json", cwd=cwd)
    assert yaml.safe_load(out.read_text()) == json.loads(printed.stdout)["profile"]
    script = render_checked(out, cwd)
    assert sbatch_option(script, "partition") == name


def test_hostile_node_values_stay_in_comments(slurm, cwd, tmp_path):
    """Features and GRES types with quotes, spaces, escapes and YAML line breaks (NEL, U+2028):
    the comments show them escaped, the values are quoted, and the file loads back as printed."""
    feature = 'ib,x "y" \x1b[31m\u2028z\x85'.encode()
    fixture = _copy_fixture("22.05", tmp_path, sinfo_text=lambda t: t.replace(b"|a100,ib|", b"|" + feature + b"|")
                            .replace(b"gpu:a100:8", "gpu:a100 '\u2028sxm':8".encode()))
    detect_replies(slurm, fixture, with_json=False)
    out = cwd / "p.yaml"
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--out", str(out), cwd=cwd)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    doc = yaml.safe_load(text)
    assert doc["slurm"]["gres_gpu_type"] == "a100 '\u2028sxm'"
    assert all(line.startswith(("#", " ", "}")) or re.match(r"[a-z_]+:", line) for line in text.split("\n") if line)
    assert "\x1b" not in text and "\x85" not in text
    script = render_checked(out, cwd)
    assert sbatch_option(script, "gres") == "gpu:a100 '\u2028sxm':8"


def test_line_breaks_in_sinfo_text_leave_the_broken_lines_out(slurm, cwd, tmp_path):
    """A partition name holding a newline splits its line: the pieces are left out with a note
    naming the lines, and the rest of the cluster is read."""
    fixture = _copy_fixture("22.05", tmp_path, sinfo_text=lambda t: t.replace(b"gpu04|gpu|", b"gpu04|g\x1b[2J\npu|"))
    detect_replies(slurm, fixture, with_json=False)
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "yaml", cwd=cwd)
    assert result.exit_code == 0, result.output
    assert "left out" in result.stderr and "line " in result.stderr
    assert "\x1b" not in result.output and "\\x1b[2J" in result.stderr  # shown escaped, never sent to the terminal
    doc = yaml.safe_load(result.stdout)
    assert doc["max_nodes"] == 3
    assert "# note: `sinfo --noheader --Node" in result.stdout


@pytest.mark.parametrize("where", ["text", "json"])
def test_bytes_that_are_not_utf8_are_refused_naming_the_source(where, slurm, cwd, tmp_path):
    if where == "text":
        fixture = _copy_fixture("22.05", tmp_path, sinfo_text=lambda t: t.replace(b"|gpu|", b"|gpu\xff\xfe|"))
    else:
        fixture = _copy_fixture("22.05", tmp_path, sinfo_json=lambda t: t.replace(b'"gpu"', b'"gpu\xff"'))
    detect_replies(slurm, fixture, with_json=where == "json")
    for output in ("text", "json"):
        result = jobgen("profiles", "detect", "--scheduler", "slurm", "-o", output, cwd=cwd)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
        message = result.stderr if output == "text" else json.loads(result.stdout)["error"]
        assert "not UTF-8" in message and "\\udcff" in message
        assert ("line " in message) if where == "text" else ("partitions[1]" in message)
    assert not list(cwd.iterdir())


def test_a_line_break_inside_a_json_value_is_refused(slurm, cwd, tmp_path):
    fixture = _copy_fixture("25.05", tmp_path, sinfo_json=lambda t: t.replace(b'"name": "gpu"', b'"name": "gpu\\nx"'))
    detect_replies(slurm, fixture)
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", "gpu\nx", cwd=cwd)
    assert result.exit_code == 2, result.output
    assert "line break" in result.stderr and "sinfo[0].partition" in result.stderr


def test_json_of_another_type_is_refused_and_an_unknown_shape_falls_back_to_text(slurm, cwd, tmp_path):
    fixture = _copy_fixture("24.05", tmp_path, sinfo_json=lambda t: t.replace(b'"minimum": 128,', b'"minimum": "lots",', 1))
    detect_replies(slurm, fixture)
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", "ampere", cwd=cwd)
    assert result.exit_code == 2, result.output
    assert re.search(r"sinfo\[\d+\]\.cpus\.minimum is \"lots\", not a number", result.stderr)
    for broken in ("[" * 100_000 + "]" * 100_000, "sinfo: no JSON here\n"):
        slurm.respond("sinfo --json", reply(stdout=broken))
        result = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", "ampere", cwd=cwd)
        assert result.exit_code == 2 and "`sinfo --json`" in result.stderr, result.output
    slurm.respond("sinfo --json", reply(stdout=json.dumps({"meta": {}, "clusters": []})))
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "--partition", "ampere", "-o", "json", cwd=cwd)
    assert result.exit_code == 0, result.output
    assert "shape jobgen does not read" in " ".join(json.loads(result.stdout)["notes"])


def test_sacctmgr_failure_with_bytes_that_are_not_utf8_is_no_traceback(slurm, cwd):
    detect_replies(slurm, "22.05")
    slurm.respond("sacctmgr", {"stdout_file": str(_bytes_file(cwd.parent, b"\xff\xfe")), "stderr": "", "rc": 1})
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "yaml", cwd=cwd)
    assert result.exit_code == 0, result.output
    assert "account: null" in result.stdout
    assert SACCTMGR_NO_DBD["rc"] == 1


def _bytes_file(where: Path, data: bytes) -> Path:
    path = where / "bytes.out"
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- the readers


@pytest.mark.parametrize(("text", "minutes_"), [
    ("infinite", None), ("n/a", None), ("UNLIMITED", None), ("30", 30), ("30:00", 30), ("1:00:00", 60),
    ("2-00:00:00", 2880), ("1-12", 2160), ("1-00:30", 1470), ("0:59", 1),
])
def test_slurm_times(text, minutes_):
    from jobgen.backends.slurm.inventory import parse_minutes

    assert parse_minutes(text) == minutes_


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:a100:8(S:0-1)", ("a100", 8)), ("gpu:8", (None, 8)), ("gpu", (None, 1)), ("(null)", None), ("", None),
    ("nvme:1,gpu:h100:4(S:0),gpu:h100:4(S:1)", ("h100", 8)), ("gpu:a100:2(IDX:0,2),gpu:v100:1", ("a100", 2)),
    ("gpu:a100:x", None), ("mps:100", None),
])
def test_gres_strings(gres, gpus):
    from jobgen.backends.slurm.inventory import parse_gpus

    found = parse_gpus(gres)
    assert (None if found is None else (found.gpu_type, found.count)) == gpus


@pytest.mark.parametrize(("text", "model"), [
    ("nvidia_a100-sxm4-80gb", "A100"), ("tesla_v100", "V100"), ("l40s", "L40S"), ("l40", None), ("nvidia_l4", "L4"),
    ("gh200", None), ("a10g", "A10G"), ("rtx_a6000", None),
])
def test_gpu_models(text, model):
    from jobgen.backends.slurm.detect import gpu_model

    assert gpu_model(text) == model


def test_version_lines():
    from jobgen.backends.slurm.inventory import parse_version

    assert parse_version("slurm 23.11.4\n") == (23, 11, "23.11.4")
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5, "22.05.8")
    assert parse_version("sinfo: error\n") is None and parse_version("") is None


def test_no_login_name_skips_sacctmgr(slurm, cwd, monkeypatch):
    """A uid without a password entry (a container): getpass.getuser raises; sacctmgr is not asked."""
    import getpass

    def no_entry():
        raise OSError("No username set in the environment")

    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)
    monkeypatch.setattr(getpass, "getuser", no_entry)
    detect_replies(slurm, "22.05")
    result = jobgen("profiles", "detect", "--scheduler", "slurm", "-o", "json", cwd=cwd)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["profile"]["slurm"]["account"] is None and "no login name" in doc["sources"]["slurm.account"]
    assert "sacctmgr" not in [argv[0] for argv in slurm.argvs()]
