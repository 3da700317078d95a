"""The preflight's GPU health check (jobgen.train.gpu_health) with a fake ``nvidia-smi`` on PATH.

No machine here has an NVIDIA GPU, so a script stands in for nvidia-smi: it prints what the real
one prints for ``--query-gpu=... --format=csv,noheader,nounits`` (one CSV line per GPU) and
exits as it would. The check runs it as a subprocess through PATH, as on a node.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from jobgen.reports.failure_class import EXIT_INFRASTRUCTURE
from jobgen.train import preflight
from jobgen.train.gpu_health import FIELDS, GPUHealthError, check_gpus
from tests.conftest import REPO

H100 = "NVIDIA H100 80GB HBM3"
HEALTHY = "".join(f"{i}, {H100}, 0, No, No\n" for i in range(8)).encode()


def fake_smi(tmp_path: Path, stdout: bytes = HEALTHY, code: int = 0, stderr: bytes = b"", old_driver: bool = False) -> dict[str, str]:
    """A PATH holding a fake nvidia-smi that records its arguments, prints ``stdout`` and exits
    ``code``; ``old_driver``: it refuses the pending fields as a driver that lacks them does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "out.bin").write_bytes(stdout)
    (tmp_path / "err.bin").write_bytes(stderr)
    refuse = ('case "$1" in *remapped_rows.pending*) echo \'Field "remapped_rows.pending" is not a valid field to query.\'; exit 2 ;; esac\n'
              if old_driver else "")
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> "{tmp_path}/args"\n{refuse}'
                      f'cat "{tmp_path}/out.bin"\ncat "{tmp_path}/err.bin" >&2\nexit {code}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_a_healthy_node_passes_with_one_line(tmp_path):
    env = fake_smi(tmp_path)
    assert check_gpus(8, "gpu-a1", env) == f"preflight: GPUs on node gpu-a1: 8 x {H100} ok"
    assert (tmp_path / "args").read_text() == f"--query-gpu={','.join(FIELDS)} --format=csv,noheader,nounits\n"
    assert FIELDS == ("index", "name", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "remapped_rows.pending")


def test_fields_a_gpu_does_not_report_are_no_failure(tmp_path):
    rows = b"0, Tesla T4, [N/A], [N/A], [N/A]\n1, Tesla T4, [Not Supported], No, [Not Supported]\n"
    assert check_gpus(2, "n1", fake_smi(tmp_path, rows)).endswith("2 x Tesla T4 ok")


@pytest.mark.parametrize(("row", "says"), [
    (b"3, NVIDIA A100-SXM4-80GB, 2, No, No", "GPU 3 (NVIDIA A100-SXM4-80GB): 2 uncorrectable ECC error(s) since the driver loaded"),
    (b"3, NVIDIA A100-SXM4-80GB, 0, Yes, No", "GPU 3 (NVIDIA A100-SXM4-80GB): a page retirement is pending (the GPU needs a reset)"),
    (b"3, NVIDIA A100-SXM4-80GB, 0, [N/A], Yes", "GPU 3 (NVIDIA A100-SXM4-80GB): a row remapping is pending (the GPU needs a reset)"),
], ids=["ecc", "retired-pages", "remapped-rows"])
def test_a_failed_gpu_fails_the_node_as_an_infrastructure_failure_naming_node_and_gpu(tmp_path, row, says):
    rows = b"".join(f"{i}, NVIDIA A100-SXM4-80GB, 0, No, No\n".encode() for i in range(3)) + row + b"\n"
    with pytest.raises(GPUHealthError) as caught:
        check_gpus(4, "gpu-b7", fake_smi(tmp_path, rows))
    assert caught.value.message == f"preflight: node gpu-b7: {says}"
    assert caught.value.exit_code == EXIT_INFRASTRUCTURE == 200


def test_a_missing_gpu_fails_the_node(tmp_path):
    rows = b"".join(f"{i}, {H100}, 0, No, No\n".encode() for i in range(7))
    with pytest.raises(GPUHealthError, match="node gpu-a1 shows 7 GPU\\(s\\), the profile gives each node 8"):
        check_gpus(8, "gpu-a1", fake_smi(tmp_path, rows))


@pytest.mark.parametrize(("stdout", "code", "stderr", "says"), [
    (b"", 9, b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
     "nvidia-smi on node n1 exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    (b"0, GPU, zero, No, No\n", 0, b"", "cannot be read: the ECC count 'zero' is not a number"),
    (b"0, GPU, 0, Maybe, No\n", 0, b"", "cannot be read: retired_pages.pending is 'Maybe', not Yes or No"),
    (b"garbage \x1b[2J\n", 0, b"", "cannot be read: 1 values where 5 were asked for in 'garbage \\\\x1b[2J'"),
    (b"0, GP\xff\xfeU, 0, No, No\n", 0, b"", "cannot be read: the output is not UTF-8"),
    (b"x" * 300 + b"\n", 0, b"", "cannot be read: 1 values where 5 were asked for"),
], ids=["driver-gone", "not-a-number", "not-yes-no", "escape", "non-utf8", "long"])
def test_output_that_cannot_be_read_fails_the_node_with_one_printable_line(tmp_path, stdout, code, stderr, says):
    with pytest.raises(GPUHealthError) as caught:
        check_gpus(1, "n1", fake_smi(tmp_path, stdout, code, stderr))
    text = caught.value.message
    assert says in text, text
    assert "\n" not in text and "\x1b" not in text and len(text) < 400
    assert caught.value.exit_code == EXIT_INFRASTRUCTURE


def test_an_older_driver_is_asked_again_without_the_pending_fields(tmp_path):
    env = fake_smi(tmp_path, b"0, Tesla V100-SXM2-32GB, 0\n", old_driver=True)
    line = check_gpus(1, "v1", env)
    assert line == "preflight: GPUs on node v1: 1 x Tesla V100-SXM2-32GB ok (this driver reports no pending retirements or remappings)"
    assert len((tmp_path / "args").read_text().splitlines()) == 2


def test_nvidia_smi_not_installed_skips_the_check_saying_so(tmp_path):
    (tmp_path / "empty").mkdir()
    assert check_gpus(8, "n1", {"PATH": str(tmp_path / "empty")}) == "preflight: GPU check on node n1 skipped: nvidia-smi is not on PATH"


def test_a_hostile_host_name_is_shown_printable(tmp_path):
    with pytest.raises(GPUHealthError) as caught:
        check_gpus(9, "n1\n$(touch PWNED)\x1b", fake_smi(tmp_path))
    assert "node n1\\n$(touch PWNED)\\x1b shows 8 GPU(s)" in caught.value.message and not list(tmp_path.rglob("PWNED"))


def test_the_preflight_checks_once_per_node_on_gpus_and_says_it_skipped_on_cpus(tmp_path, monkeypatch):
    """Step 0 of run_preflight: local rank zero checks; the others do not; a CPU profile prints one line from rank zero."""
    env = fake_smi(tmp_path)
    lines: list[str] = []
    monkeypatch.setattr(preflight.socket, "gethostname", lambda: "gpu-a1")
    preflight.check_node_gpus("gpu", 8, {**env, "SLURM_LOCALID": "0"}, lines.append)
    preflight.check_node_gpus("gpu", 8, {**env, "SLURM_LOCALID": "3"}, lines.append)
    preflight.check_node_gpus("gpu", 8, {**env, "LOCAL_RANK": "1"}, lines.append)
    assert lines == [f"preflight: GPUs on node gpu-a1: 8 x {H100} ok"]
    assert len((tmp_path / "args").read_text().splitlines()) == 1
    preflight.check_node_gpus("cpu", 1, {"SLURM_PROCID": "0"}, lines.append)
    preflight.check_node_gpus("cpu", 1, {"SLURM_PROCID": "1"}, lines.append)
    assert lines[1:] == ["preflight: GPU check skipped: the profile's nodes have no GPUs"]


def test_the_query_and_lines_docs_failures_md_shows_are_the_checks(tmp_path):
    page = (REPO / "docs" / "failures.md").read_text()
    assert f"$ nvidia-smi --query-gpu={','.join(FIELDS)} --format=csv,noheader,nounits\n" in page
    block = page.split("```text\npreflight: GPUs on node gpu5", 1)[1].split("```", 1)[0]
    shown = ("preflight: GPUs on node gpu5" + block).strip().splitlines()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    healthy = check_gpus(8, "gpu5", fake_smi(tmp_path / "a"))
    rows = HEALTHY.replace(f"3, {H100}, 0, No, No".encode(), f"3, {H100}, 2, No, No".encode())
    with pytest.raises(GPUHealthError) as caught:
        check_gpus(8, "gpu6", fake_smi(tmp_path / "b", rows))
    assert [healthy, caught.value.message] == shown
