"""Fixtures for the training entrypoint tests: tiny spec files and real subprocess runs.

Training runs go through real subprocesses (``torch.distributed.run`` / ``python -m
jobgen.train``): Lightning's DDP launcher re-executes the command line, and exit codes and
stderr are part of the contract under test.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

#: A 2-layer, d_model 64 GPT on 1 MB of stdlib text: ~120k parameters, a step takes ~10 ms.
TINY_SPEC: dict[str, Any] = {
    "name": "tiny",
    "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
    "data": {"max_bytes": 1_000_000},
    "trainer": {
        "precision": "32-true",
        "micro_batch_size": 4,
        "max_steps": 20,
        "warmup_steps": 2,
        "learning_rate": 3e-3,
        "val_check_interval": 10,
        "limit_val_batches": 4,
        "log_every_n_steps": 5,
    },
    "checkpoint": {"every_n_steps": 10, "keep_last_k": 2},
}

# Variables a launcher (SLURM, torchrun, an outer test run) may have set that would change
# how Lightning sees the world in the child processes.
_LAUNCHER_ENV_PREFIXES = ("SLURM_", "PET_", "TORCHELASTIC_", "PL_")
_LAUNCHER_ENV_KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def resolved_doc(spec: dict[str, Any], **launch: Any) -> dict[str, Any]:
    """A resolved spec document built through the job directory's contract (spec validated by
    TrainingSpec; ``launch`` overrides the local 1 x 2 CPU defaults unvalidated, so a test can
    write a bad value and check the entrypoint refuses it)."""
    from jobgen import __version__
    from jobgen.jobdir import LaunchSpec, ResolvedSpec
    from jobgen.specs.training import TrainingSpec

    defaults = {"scheduler": "local", "accelerator": "cpu", "num_nodes": 1, "devices_per_node": 2, "world_size": 2}
    doc = ResolvedSpec.model_construct(
        jobgen_version=__version__, inputs_sha256="0" * 64, profile="local", spec=TrainingSpec.model_validate(spec),
        launch=LaunchSpec.model_construct(**(defaults | launch)),
    )
    return doc.model_dump(mode="json")


@pytest.fixture
def tiny_spec() -> dict[str, Any]:
    """A fresh deep copy of TINY_SPEC (a TrainingSpec dict) to modify in a test."""
    return copy.deepcopy(TINY_SPEC)


@pytest.fixture(name="resolved_doc")
def resolved_doc_fixture() -> Callable[..., dict[str, Any]]:
    """:func:`resolved_doc`: ``resolved_doc(spec_dict, **launch) -> dict``."""
    return resolved_doc


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """``write_spec(overrides={...}, filename="spec.json", **launch) -> path``: TINY_SPEC merged
    with ``overrides`` (nested dicts merge), written as a resolved spec file under tmp_path."""

    def _write(overrides: dict[str, Any] | None = None, filename: str = "spec.json", **launch: Any) -> Path:
        doc = resolved_doc(_merge(TINY_SPEC, overrides or {}), **launch)
        path = tmp_path / filename
        path.write_text(json.dumps(doc, indent=2))
        return path

    return _write


@dataclass
class Result:
    """Outcome of one entrypoint run."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout and stderr together (for assertion messages)."""
        return f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def child_env() -> dict[str, str]:
    """The environment for entrypoint subprocesses: one OpenMP thread per process (2 cores, 2
    ranks), jobgen importable, and no inherited launcher variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_LAUNCHER_ENV_PREFIXES) and k not in _LAUNCHER_ENV_KEYS
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, ...), from /proc's parent links
    (proc(5), /proc/PID/stat field 4); empty where there is no /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_process(argv: list[str], cwd: Path, timeout: float) -> Result:
    """Run ``argv`` in its own session; on timeout kill it and every process it started, and
    fail the test with the output so far. The descendants are found and killed one by one, not
    only through the process group: torchrun starts each worker in a session of its own, and a
    worker left alive keeps the output pipes open (tests/entrypoint/test_run_process.py)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = descendants(proc.pid)  # before the launcher dies and they are handed to init
        for pid in [proc.pid, *workers]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a grandchild outside the tree still holds a pipe
            proc.kill()
            stdout, stderr = "", f"(no output: the pipes stayed open after the kill of {[proc.pid, *workers]})"
        pytest.fail(f"{argv} timed out after {timeout} s\n{Result(-9, stdout, stderr).output}")
    return Result(proc.returncode, stdout, stderr)


#: DeepSpeed's CPU ops (op builder class names) that trainings JIT-compile on first use:
#: shm_comm (DeepSpeed's communication on the CPU accelerator) and cpu_adam (optimizer offload).
DEEPSPEED_CPU_OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")
#: Seconds the compile of :data:`DEEPSPEED_CPU_OPS` may take (~23 s + ~55 s on an idle
#: 2-core machine; over 240 s beside a loaded suite and the Kubernetes lab's build).
DEEPSPEED_OPS_TIMEOUT_S = 1200


@pytest.fixture(scope="session")
def deepspeed_cpu_ops() -> None:
    """Compile :data:`DEEPSPEED_CPU_OPS` once, before any training's timeout starts counting:
    in a fresh ``TORCH_EXTENSIONS_DIR`` (CI) the first ZeRO offload run of the strategy matrix
    compiled cpu_adam inside its 240 s and timed out under a loaded 2-core machine, and the killed
    compile left torch's build lock behind for every later run. A cached op loads in seconds; a
    second worker waits on torch's lock (cpp_extension's FileBaton) while the first compiles."""
    code = ("from deepspeed.accelerator import get_accelerator\n"
            f"for name in {DEEPSPEED_CPU_OPS!r}:\n"
            "    get_accelerator().create_op_builder(name).load()\n")
    result = run_process([sys.executable, "-c", code], cwd=REPO, timeout=DEEPSPEED_OPS_TIMEOUT_S)
    if result.code != 0:
        pytest.fail(f"building DeepSpeed's CPU ops {DEEPSPEED_CPU_OPS} failed\n{result.output}")


@pytest.fixture
def run_entrypoint(tmp_path: Path) -> Callable[..., Result]:
    """``run_entrypoint(*args, nproc=None, timeout=...)``: ``python -m jobgen.train ARGS`` in
    tmp_path; with ``nproc`` under ``torch.distributed.run --standalone`` (free port chosen by
    torchrun's standalone rendezvous)."""

    def _run(*args: str, nproc: int | None = None, timeout: float = 300) -> Result:
        if nproc is None:
            argv = [sys.executable, "-m", "jobgen.train", *args]
        else:
            argv = [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                "-m", "jobgen.train", *args,
            ]  # fmt: skip
        return run_process(argv, cwd=tmp_path, timeout=timeout)

    return _run


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama, its tokenizer and ``train.jsonl`` (tests/entrypoint/hf_helpers.py), once per
    module; the caller checks that transformers, tokenizers and peft are importable first."""
    from tests.entrypoint.hf_helpers import build_tiny_llama, write_records

    directory = tmp_path_factory.mktemp("hf")
    build_tiny_llama(directory)
    write_records(directory / "train.jsonl")
    return directory
