"""GPU evidence suite: the bundled models through jobgen's own submit path, one table and one JSON.

Usage:
  python benchmarks/gpu_suite.py --out results/                 # every row this machine can run
  python benchmarks/gpu_suite.py --out results/ --cpu           # CPU mode (automatic without CUDA)
  python benchmarks/gpu_suite.py --out results/ --rows gpt350m-bf16,gpt350m-bf16-compile --steps 100 \\
      --set trainer.micro_batch_size=16     # --set: an override for every row run (repeatable)

Every row is a real jobgen run: a spec file (``<out>/specs/``), a local cluster profile generated
for this machine (``<out>/profiles/``: ``scheduler: local``, the visible GPUs, their
``gpu_type`` and memory), ``python -m jobgen.cli submit SPEC --profile PROFILE --smoke STEPS
--set ...`` (the local backend: torchrun + ``python -m jobgen.train``, so tokens/s, MFU and peak
memory are the entrypoint's own ``summary.json`` figures), and ``python -m jobgen.cli plan ...
--output json`` for the planned per-rank memory of the same spec (``jobgen.planning.estimate``). A row's
variations (precision, strategy, ``trainer.compile``, ranks) are ``--set`` overrides, recorded
in the JSON; a field this checkout's spec does not know (``trainer.compile`` before it lands)
makes that row ``unavailable: <the spec's error>`` instead of stopping the suite.

Rows, in this order (``--rows`` selects by name and runs them in the order given):
  GPU (one GPU unless said): gpt124m-bf16, gpt124m-bf16-compile, gpt124m-fp16, gpt350m-bf16,
  gpt350m-bf16-compile, gpt350m-fp16 (presets gpt2-124m / gpt2-350m, block 1024, byte-level
  stdlib text), gpt350m-fsdp-bf16 and gpt350m-ds2-bf16 (FSDP FULL_SHARD / DeepSpeed ZeRO-2 on
  all visible GPUs; the latter when ``import deepspeed`` works), llama-lora-bf16 and
  llama-qlora-bf16 (a tiny Llama built here with transformers' LlamaConfig + save_pretrained by
  tests/entrypoint/hf_helpers.py's builder, LoRA on q/v; QLoRA when bitsandbytes imports),
  llama7b-qlora-ddp, -fsdp, -ds2, -ds3 (examples/llama-7b-qlora-fsdp.yaml's recipe on a
  Llama-2-7B random-initialised from examples/hf-configs/llama-2-7b, one GPU; see llama7b_spec).
  CPU (tiny GPT: 4 layers, d_model 128, block 128): cpu-gpt-fp32, cpu-gpt-bf16 (only where the
  CPU has native bf16: avx512_bf16/amx_bf16; emulated bf16 is not timed), cpu-gpt-fp32-compile,
  cpu-gpt-ddp-fp32, cpu-gpt-fsdp-fp32, cpu-gpt-ds2-fp32 (2 CPU ranks), cpu-llama-lora-fp32.
With CUDA the GPU rows run; without it (or with --cpu) the CPU rows run and the GPU rows are
listed as ``unmeasured: no CUDA device``.

Each row: name, status (``ok`` / ``failed: reason`` / ``unmeasured: reason`` / ``unavailable:
reason``), tokens/s (``tokens_per_s_mean``: all ranks, first step left out), MFU (``mfu_mean``:
GPU only, PaLM model FLOPs over the datasheet peak of jobgen/train/measure.py), peak memory GiB
(the largest rank's ``torch.cuda.max_memory_allocated``; on CPU the RSS high-water mark, which
includes the interpreter and libraries), planned GiB (``jobgen plan``'s estimate for the spec's
own layout, per GPU / CPU rank, including its 1.5 GiB per-GPU overhead term), ratio measured /
planned, final loss (the last logged train loss), wall seconds (the whole submit: start-up, data
preparation, training, the final validation). Writes ``<out>/gpu_suite.json`` (the rows, each
with its run directory, summary.json, log and command), ``<out>/runs/<row>-smoke/`` (the runs),
``<out>/logs/<row>.log`` (each run's output).

What the rows measure of the MFU levers: ``trainer.compile`` (torch.compile, the ``-compile``
rows against the same row without it); fp16 with loss scaling against bf16; FSDP / ZeRO-2
against one GPU. The built-in GPT's attention is ``F.scaled_dot_product_attention`` (the flash
kernel on CUDA for bf16/fp16 with no explicit mask), so every GPU GPT row uses the SDPA path;
fused AdamW, TF32 and pinned loaders are what jobgen/train/speed.py chooses on the device (not
toggled here; summary.json ``levers`` records them). Every row sets ``trainer.compile`` explicitly.

The ceiling: beside each single-rank GPT row, benchmarks/plain_loop.py trains the same GPT, seed,
windows, batch and precision in a plain PyTorch loop on the row's finished run; the table's
``plain`` and ``j/plain`` columns and the JSON's ``plain``, ``plain_tokens_per_s`` and
``jobgen_over_plain`` (jobgen tokens/s / plain tokens/s) hold it.

Offline GPU machine (torch, lightning, transformers and peft present, no internet): jobgen and
the packages it needs beyond those travel as wheels. Here (with internet; give the GPU machine's
Python as --python-version). bitsandbytes and DeepSpeed's own dependencies are fetched with
--no-deps: with dependencies pip would add a torch wheel (the GPU machine keeps its CUDA torch).
  P="--only-binary=:all: --python-version 3.11 --implementation cp --platform manylinux2014_x86_64
     --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64"
  pip download $P -d wheels 'jinja2>=3.1' 'click>=8.1' 'pyyaml>=6.0' 'pydantic>=2.6' \\
      'jsonargparse[signatures]>=4.27' pytest 'setuptools>=70.1' wheel
  pip download $P --no-deps -d wheels 'bitsandbytes>=0.43' hjson ninja py-cpuinfo msgpack einops
  pip wheel --no-deps --no-build-isolation -w wheels deepspeed==0.19.8   # DeepSpeed is sdist-only
and there:
  pip install --no-index --find-links wheels -e .
  pip install --no-index --find-links wheels deepspeed bitsandbytes     # the ZeRO and QLoRA rows
install_requires (jinja2, click, pyyaml, pydantic) serve every row; setuptools + wheel build the
editable install without an index; jsonargparse is part of ``jobgen[train]``; deepspeed (+ hjson,
ninja, py-cpuinfo, msgpack, einops; it also needs psutil, tqdm, packaging, numpy, which transformers
and peft bring) the ZeRO row; bitsandbytes QLoRA; pytest runs the test suite there. The tiny-Llama builder
(tests/entrypoint/hf_helpers.py) needs no pytest. kubernetes / jsonschema are not needed (local
backend). docs/evidence.md, "On a GPU machine without internet", lists what this fetched and its size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jobgen.planning.estimate import GIB  # noqa: E402

#: torch.cuda.get_device_name() substrings -> jobgen.specs.profile.GpuType (most specific first).
GPU_TYPES = (("H200", "H200"), ("H100", "H100"), ("B200", "B200"), ("A100", "A100"), ("A10G", "A10G"),
             ("L40S", "L40S"), ("L4", "L4"), ("T4", "T4"), ("V100", "V100"))  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One measurement: a model, a precision, a strategy and how many ranks."""

    name: str
    device: str  # "gpu" or "cpu"
    model: str  # a key of MODELS
    precision: str
    strategy: str = "ddp"
    compile: bool = False
    ranks: str = "1"  # "1", "2" (CPU) or "all" (every visible GPU)
    needs: tuple[str, ...] = ()  # modules that must import
    qlora: bool = False

    def overrides(self) -> list[str]:
        """The ``--set`` arguments of this row over its model's base spec."""
        sets = [f"name={self.name}", f"trainer.precision={self.precision}", f"trainer.strategy={self.strategy}"]
        # explicit both ways: trainer.compile's default (auto) compiles the GPT under ddp on GPUs
        sets.append(f"trainer.compile={'true' if self.compile else 'false'}")
        if self.qlora:
            sets.append("model.load_in_4bit=true")
        return sets


MODELS: dict[str, dict[str, Any]] = {
    "gpt2-124m": {"model": {"preset": "gpt2-124m"}, "data": {"max_bytes": 16_000_000},
                  "trainer": {"micro_batch_size": 16}},
    "gpt2-350m": {"model": {"preset": "gpt2-350m"}, "data": {"max_bytes": 16_000_000},
                  "trainer": {"micro_batch_size": 8}},
    "gpt-tiny": {"model": {"preset": None, "n_layer": 4, "n_head": 4, "d_model": 128, "block_size": 128},
                 "data": {"max_bytes": 2_000_000}, "trainer": {"micro_batch_size": 8}},
    # host-bound: 24 blocks of d_model 64 on 32-token windows, one sequence per step (benchmarks/layout_host_time.py)
    "gpt-24x64": {"model": {"preset": None, "n_layer": 24, "n_head": 4, "d_model": 64, "block_size": 32},
                  "data": {"max_bytes": 2_000_000}, "trainer": {"micro_batch_size": 1}},
    "llama-tiny": {},  # filled in by llama_spec(): a local model directory and a JSONL file
    "llama7b": {},  # filled in by llama7b_spec(): examples/llama-7b-qlora-fsdp.yaml on a random-init 7B
}  # fmt: skip
"""Base spec sections per model (merged over :data:`COMMON`)."""

COMMON: dict[str, Any] = {
    "trainer": {"learning_rate": 1e-3, "warmup_steps": 5, "val_check_interval": 1000, "limit_val_batches": 2,
                "log_every_n_steps": 5},
    "checkpoint": {"every_n_steps": 1000, "resume": "never"},
}  # fmt: skip

QLORA = ("transformers", "peft", "bitsandbytes")

ROWS: tuple[Row, ...] = (
    Row("gpt124m-bf16", "gpu", "gpt2-124m", "bf16-mixed"),
    Row("gpt124m-bf16-compile", "gpu", "gpt2-124m", "bf16-mixed", compile=True),
    Row("gpt124m-fp16", "gpu", "gpt2-124m", "16-mixed"),
    Row("gpt350m-bf16", "gpu", "gpt2-350m", "bf16-mixed"),
    Row("gpt350m-bf16-compile", "gpu", "gpt2-350m", "bf16-mixed", compile=True),
    Row("gpt350m-fp16", "gpu", "gpt2-350m", "16-mixed"),
    Row("gpt350m-fsdp-bf16", "gpu", "gpt2-350m", "bf16-mixed", strategy="fsdp", ranks="all"),
    Row("gpt350m-ds2-bf16", "gpu", "gpt2-350m", "bf16-mixed", strategy="deepspeed_stage_2", ranks="all",
        needs=("deepspeed",)),
    Row("llama-lora-bf16", "gpu", "llama-tiny", "bf16-mixed", needs=("transformers", "peft")),
    Row("llama-qlora-bf16", "gpu", "llama-tiny", "bf16-mixed", needs=("transformers", "peft", "bitsandbytes"),
        qlora=True),
    Row("llama7b-qlora-ddp", "gpu", "llama7b", "bf16-mixed", ranks="1", needs=QLORA),
    Row("llama7b-qlora-fsdp", "gpu", "llama7b", "bf16-mixed", strategy="fsdp", ranks="1", needs=QLORA),
    Row("llama7b-qlora-ds2", "gpu", "llama7b", "bf16-mixed", strategy="deepspeed_stage_2", ranks="1",
        needs=(*QLORA, "deepspeed")),
    Row("llama7b-qlora-ds3", "gpu", "llama7b", "bf16-mixed", strategy="deepspeed_stage_3", ranks="1",
        needs=(*QLORA, "deepspeed")),
    Row("cpu-gpt-fp32", "cpu", "gpt-tiny", "32-true"),
    Row("cpu-gpt-bf16", "cpu", "gpt-tiny", "bf16-mixed"),
    Row("cpu-gpt-fp32-compile", "cpu", "gpt-tiny", "32-true", compile=True),
    Row("cpu-gpt-ddp-fp32", "cpu", "gpt-tiny", "32-true", ranks="2"),
    Row("cpu-gpt-fsdp-fp32", "cpu", "gpt-tiny", "32-true", strategy="fsdp", ranks="2"),
    Row("cpu-gpt-ds2-fp32", "cpu", "gpt-tiny", "32-true", strategy="deepspeed_stage_2", ranks="2", needs=("deepspeed",)),
    Row("cpu-llama-lora-fp32", "cpu", "llama-tiny", "32-true", needs=("transformers", "peft")),
)  # fmt: skip


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cpu_info() -> dict[str, Any]:
    """This machine's CPU: model name, torch's CPU capability, native bf16 (jobgen.backends.local)."""
    import torch
    from render import cpu_model  # benchmarks/ is sys.path[0]

    from jobgen.backends.local import native_bf16

    return {"model": cpu_model(), "cores": os.cpu_count(), "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": native_bf16()}  # fmt: skip


def gpu_info() -> dict[str, Any] | None:
    """The visible GPUs (name, count, memory, jobgen gpu_type), or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    gpu_type = next((t for key, t in GPU_TYPES if key in name.upper()), None)
    mem = torch.cuda.get_device_properties(0).total_memory / GIB
    return {"name": name, "count": torch.cuda.device_count(), "mem_gib": round(mem, 1), "gpu_type": gpu_type,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}  # fmt: skip


def write_profile(out: Path, gpu: dict[str, Any] | None) -> Path:
    """A local profile for this machine: the visible GPUs, or 2 CPU ranks (JSON is YAML)."""
    cores = os.cpu_count() or 2
    if gpu is not None:
        doc = {"description": f"gpu_suite: this machine, {gpu['count']} x {gpu['name']}", "scheduler": "local",
               "gpus_per_node": gpu["count"], "gpu_type": gpu["gpu_type"], "gpu_mem_gib": gpu["mem_gib"],
               "cpus_per_node": cores, "mem_gib_per_node": 64}  # fmt: skip
    else:
        doc = {"description": "gpu_suite: this machine, 2 CPU ranks (gloo)", "scheduler": "local", "gpus_per_node": 0,
               "cpu_processes_per_node": 2, "cpus_per_node": cores, "mem_gib_per_node": 8}  # fmt: skip
    path = out / "profiles" / ("gpu-suite-gpu.yaml" if gpu is not None else "gpu-suite-cpu.yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def llama_spec(out: Path) -> dict[str, Any]:
    """Build the tiny Llama + tokenizer and its JSONL data once under ``<out>/hf``; its spec sections."""
    from tests.entrypoint.hf_helpers import LORA_R, TARGETS, build_tiny_llama, records

    hf = out / "hf"
    model_dir, tok_dir = hf / "llama", hf / "tokenizer"
    if not (model_dir / "config.json").is_file():
        hf.mkdir(parents=True, exist_ok=True)
        model_dir, tok_dir = build_tiny_llama(hf)
    data = hf / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records() * 4))
    return {
        "model": {"preset": None, "hf_path": str(model_dir), "block_size": 96,
                  "lora": {"r": LORA_R, "alpha": 8, "target_modules": TARGETS}},
        "data": {"format": "jsonl", "paths": [str(data)], "tokenizer_path": str(tok_dir), "val_fraction": 0.125},
        "trainer": {"micro_batch_size": 8, "learning_rate": 2e-2, "weight_decay": 0.0},
    }  # fmt: skip


LLAMA7B_EXAMPLE = REPO / "examples" / "llama-7b-qlora-fsdp.yaml"
LLAMA7B_CONFIG = REPO / "examples" / "hf-configs" / "llama-2-7b"


def llama7b_spec(out: Path) -> dict[str, Any]:
    """examples/llama-7b-qlora-fsdp.yaml (its recipe: QLoRA r 64 on every projection, block
    2048, micro batch 4 x accumulation 4, bf16-mixed) on a random-initialised Llama-2-7B built from
    the shipped ``examples/hf-configs/llama-2-7b/config.json`` (nothing downloaded: bf16 weights
    saved once under ``<out>/hf/llama-2-7b``, ~13.5 GB, built on the GPU when there is one) and
    the tiny Llama's word-level tokenizer and JSONL records (tests/entrypoint/hf_helpers.py).
    The example's ``warmup_ratio`` becomes the suite's ``warmup_steps`` (a short run's warmup);
    the rows choose the strategy; one GPU (``resources``: the suite's)."""
    import yaml

    from tests.entrypoint.hf_helpers import build_tiny_llama, records

    hf = out / "hf"
    model_dir = hf / "llama-2-7b"
    if not (model_dir / "config.json").is_file() or not any(model_dir.glob("*.safetensors")):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(LLAMA7B_CONFIG, local_files_only=True)
        torch.manual_seed(0)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
        model.save_pretrained(model_dir)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    tok_dir = hf / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        hf.mkdir(parents=True, exist_ok=True)
        _, tok_dir = build_tiny_llama(hf)
    data = hf / "llama7b-train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records() * 32))
    doc = yaml.safe_load(LLAMA7B_EXAMPLE.read_text())
    doc.pop("name", None)
    doc.pop("resources", None)
    doc["trainer"].pop("warmup_ratio", None)
    doc["trainer"].pop("strategy", None)
    doc["trainer"].pop("val_check_interval", None)
    doc["trainer"].pop("limit_val_batches", None)
    doc["trainer"].pop("log_every_n_steps", None)
    doc.pop("checkpoint", None)
    doc["model"]["hf_path"] = str(model_dir)
    doc["data"] |= {"paths": [str(data)], "tokenizer_path": str(tok_dir)}
    return doc


def spec_file(out: Path, model: str) -> Path:
    """The base spec of ``model`` under ``<out>/specs/`` (written once per suite run)."""
    path = out / "specs" / f"{model}.yaml"
    if not path.is_file():
        builders = {"llama-tiny": llama_spec, "llama7b": llama7b_spec}
        body = builders[model](out) if model in builders else MODELS[model]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_merge(_merge({"name": model}, COMMON), body), indent=2) + "\n")
    return path


def child_env() -> dict[str, str]:
    """Children import jobgen from this checkout; no launcher variables leak in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_")) and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                                   "MASTER_ADDR", "MASTER_PORT")}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def error_line(text: str) -> str:
    """The most telling line of a failed run's output: jobgen's ``error:``, else the last exception line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("error:"):
            # jobgen's config errors: "error: FILE: invalid configuration:" then the field's line
            detail = lines[i + 1] if ln.endswith(":") and i + 1 < len(lines) else ""
            return f"{ln[len('error:'):].strip()} {detail}".strip()[:300]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln[:300]
    return (lines[-1] if lines else "no output")[:300]


def planned_bytes(spec: Path, profile: Path, sets: list[str]) -> tuple[int | None, str | None, int | None]:
    """``jobgen plan --output json`` for the spec's own layout: (total bytes per rank, why not, overhead bytes)."""
    argv = [sys.executable, "-m", "jobgen.cli", "plan", str(spec), "--profile", str(profile), "--output", "json"]
    argv += [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return None, f"jobgen plan: {error_line(proc.stderr + proc.stdout)}", None
    try:
        rows = json.loads(proc.stdout)["rows"]
        own = next(r for r in rows if r["is_spec"])
    except (ValueError, KeyError, StopIteration) as exc:
        return None, f"jobgen plan: unreadable output ({exc})", None
    return int(own["total_bytes"]), None, int(own["overhead_bytes"])


def last_train_loss(summary: dict[str, Any]) -> float | None:
    """The last logged ``train_loss`` of the run (rank zero's micro batch)."""
    import csv

    try:
        with open(summary["metrics_csv"], newline="") as f:
            losses = {int(r["step"]): float(r["train_loss"]) for r in csv.DictReader(f) if r.get("train_loss")}
    except (OSError, KeyError, ValueError):
        return None
    return losses[max(losses)] if losses else None


def skip_reason(row: Row, gpu: dict[str, Any] | None, cpu: dict[str, Any], cpu_mode: bool) -> str | None:
    """Why ``row`` is not run here (a full status), or None."""
    import importlib.util

    if row.device == "gpu" and cpu_mode:
        return "unmeasured: no CUDA device" if gpu is None else "unmeasured: --cpu given"
    if row.device == "cpu" and row.precision.startswith("bf16") and cpu["native_bf16"] is not True:
        return (f"unmeasured: CPU capability {cpu['torch_capability']} without avx512_bf16/amx_bf16 "
                "(bf16 is emulated there, ~25x slower matmuls: not timed)")  # fmt: skip
    missing = [m for m in row.needs if importlib.util.find_spec(m) is None]
    if missing:
        return f"unavailable: {', '.join(missing)} not importable"
    return None


def run_row(row: Row, out: Path, profile: Path, gpu: dict[str, Any] | None, steps: int, timeout: float,
            extra: tuple[str, ...] = (), levers_off: str = "", suffix: str = "", trace: str = "") -> dict[str, Any]:
    """Plan and submit one row through jobgen's CLI (``extra``: more ``--set`` overrides, last); read its summary.json.

    ``levers_off``: ``JOBGEN_LEVERS_OFF`` for the run (jobgen.train.speed: the levers' "before");
    ``suffix``: appended to the run's name (``-before``), so both runs keep their directories;
    ``trace``: ``JOBGEN_TRACE_STEPS`` for the run (a torch.profiler trace of those steps under the
    run directory's ``traces/``, jobgen.train.callbacks.StepTrace)."""
    ranks = {"1": 1, "2": 2, "all": gpu["count"] if gpu else 2}[row.ranks]
    result: dict[str, Any] = {"ranks": ranks}
    try:
        spec = spec_file(out, row.model)
    except Exception as exc:  # noqa: BLE001 (any builder failure is this row's status, not the suite's end)
        return result | {"status": f"failed: building the {row.model} spec: {type(exc).__name__}: {exc}"}
    # log often enough that a short run has a logged train loss at its end
    sets = [*row.overrides(), f"resources.devices_per_node={ranks}", f"trainer.log_every_n_steps={min(5, steps)}", *extra]
    if suffix:
        sets.append(f"name={row.name}{suffix}")
    planned, plan_note, overhead = planned_bytes(spec, profile, sets)
    argv = [sys.executable, "-m", "jobgen.cli", "submit", str(spec), "--profile", str(profile),
            "--runs-dir", str(out / "runs"), "--smoke", str(steps), *[a for s in sets for a in ("--set", s)]]  # fmt: skip
    log = out / "logs" / f"{row.name}{suffix}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    run_dir = out / "runs" / f"{row.name}{suffix}-smoke"
    result |= {"spec": str(spec), "overrides": sets, "command": argv, "log": str(log), "run_dir": str(run_dir),
               "planned_bytes": planned, "planned_overhead_bytes": overhead, "plan_note": plan_note}  # fmt: skip
    summary_path = run_dir / "summary.json"
    summary_path.unlink(missing_ok=True)
    started = time.perf_counter()
    with log.open("w") as fh:
        env = (child_env() | ({"JOBGEN_LEVERS_OFF": levers_off} if levers_off else {})
               | ({"JOBGEN_TRACE_STEPS": trace} if trace else {}))
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
    result["wall_s"] = round(time.perf_counter() - started, 1)
    text = log.read_text(errors="replace")
    if code is None:
        return result | {"status": f"failed: timed out after {timeout:.0f} s"}
    if code != 0:
        why = error_line(text)
        if row.compile and code == 2 and "compile" in why:
            return result | {"status": f"unavailable: this checkout's spec refuses trainer.compile ({why})"}
        return result | {"status": f"failed: exit {code}: {why}"}
    if not summary_path.is_file():
        return result | {"status": "failed: no summary.json"}
    summary = json.loads(summary_path.read_text())
    # steady state (the later half of the timed steps) where the entrypoint reports it, else the mean
    tps = summary.get("tokens_per_s_steady") or summary.get("tokens_per_s_mean")
    peak = summary.get("peak_memory_bytes")
    result |= {
        "summary_json": str(summary_path),
        "tokens_per_s": tps,
        "tokens_per_s_mean": summary.get("tokens_per_s_mean"),
        "mfu": summary.get("mfu_steady") or summary.get("mfu_mean"),
        "flops_per_token": summary.get("flops_per_token"),
        "layout": summary.get("layout"),
        "traces": sorted(str(t) for t in (run_dir / "traces").glob("*.json.gz")),
        "levers": summary.get("levers"),
        "levers_off": levers_off,
        "peak_memory_bytes": peak,
        "peak_memory_kind": summary.get("peak_memory_kind"),
        "ratio": round(peak / planned, 3) if peak and planned else None,
        "final_loss": last_train_loss(summary),
        "val_loss": summary.get("val_loss"),
        "train_wall_s": summary.get("wall_time_s"),
        "n_params": summary.get("n_params"),
        "trainable_params": summary.get("trainable_params"),
        "tokens_per_step": summary.get("tokens_per_step"),
    }
    loss = result["final_loss"]
    if not tps or tps <= 0 or loss is None or not math.isfinite(loss):
        return result | {"status": f"failed: no tokens/s or loss in summary.json (tokens/s {tps}, loss {loss})"}
    return result | {"status": "ok"}


def run_plain(row: Row, res: dict[str, Any], out: Path, cpu: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The ceiling beside a GPT row: benchmarks/plain_loop.py on the row's finished run (same GPT,
    seed, windows, batch, precision, compile; one process, so single-rank rows only). CPU: the
    jobgen rank's thread count (cores / ranks, the local backend's OMP_NUM_THREADS)."""
    if res.get("status") != "ok":
        return {"plain_status": "skipped: the jobgen run did not finish"}
    if res.get("ranks") != 1:
        return {"plain_status": "n/a: the plain loop is one process (single-rank rows only)"}
    json_out = out / "plain" / f"{row.name}.json"
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.unlink(missing_ok=True)
    argv = [sys.executable, str(REPO / "benchmarks" / "plain_loop.py"), res["run_dir"], "--json", str(json_out)]
    env = child_env() | {"OMP_NUM_THREADS": str(max(1, (cpu["cores"] or 1) // res["ranks"]))}
    log = out / "logs" / f"{row.name}.plain.log"
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"plain_status": f"failed: timed out after {timeout:.0f} s"}
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not json_out.is_file():
        return {"plain_status": f"failed: exit {proc.returncode}: {error_line(proc.stdout + proc.stderr)}", "plain_log": str(log)}
    plain = json.loads(json_out.read_text())
    tps, ours = plain.get("tokens_per_s_steady") or plain.get("tokens_per_s"), res.get("tokens_per_s")
    return {"plain_status": "ok", "plain_log": str(log), "plain": plain, "plain_tokens_per_s": tps,
            "jobgen_over_plain": round(ours / tps, 3) if ours and tps else None}  # fmt: skip


def fmt(value: Any, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'row':<22} {'ranks':>5} {'tokens/s':>10} {'before':>10} {'a/b':>5} {'plain':>10} {'j/plain':>7} "
            f"{'MFU':>6} {'peak GiB':>9} {'plan GiB':>9} {'ratio':>6} {'val':>7} {'wall s':>7}  status")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        peak = r.get("peak_memory_bytes")
        lines.append(
            f"{r['name']:<22} {fmt(r.get('ranks'), 'd'):>5} {fmt(r.get('tokens_per_s'), ',.0f'):>10} "
            f"{fmt((r.get('before') or {}).get('tokens_per_s'), ',.0f'):>10} {fmt(r.get('after_over_before'), '.2f'):>5} "
            f"{fmt(r.get('plain_tokens_per_s'), ',.0f'):>10} {fmt(r.get('jobgen_over_plain'), '.3f'):>7} "
            f"{fmt(None if r.get('mfu') is None else 100 * r['mfu'], '.1f', '%'):>6} "
            f"{fmt(None if peak is None else peak / GIB, '.2f'):>9} "
            f"{fmt(None if r.get('planned_bytes') is None else r['planned_bytes'] / GIB, '.2f'):>9} "
            f"{fmt(r.get('ratio'), '.2f'):>6} {fmt(r.get('val_loss'), '.3f'):>7} {fmt(r.get('wall_s'), '.1f'):>7}  {r['status']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results"), help="results directory (default results/)")
    parser.add_argument("--cpu", action="store_true", help="CPU mode even when CUDA is available")
    parser.add_argument("--rows", help="comma-separated row names (default: every row of the mode, in order)")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default 50 on GPU, 30 on CPU)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="a spec override for every row run, after the row's own (repeatable), "
                             "e.g. --set trainer.micro_batch_size=16")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run before it is killed (default 900)")
    parser.add_argument("--before", metavar="LEVERS", default="",
                        help="also run each row with JOBGEN_LEVERS_OFF=LEVERS (comma-separated names of "
                             "jobgen.train.speed.LEVERS), the 'before' column beside each row")
    parser.add_argument("--deadline", type=float, metavar="SECONDS",
                        help="start no run after this many seconds from the suite's start (the rows left "
                             "are 'unmeasured: deadline'); the JSON is written after every row")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain-loop ceiling beside the GPT rows")
    parser.add_argument("--trace-rows", default="", metavar="ROWS",
                        help="comma-separated rows to trace: after their timed runs, one more run each (and one "
                             "with --before's levers off) writes a torch.profiler trace of --trace-steps "
                             "(JOBGEN_TRACE_STEPS) under its run directory's traces/; the timed runs are not traced")
    parser.add_argument("--trace-steps", default="", metavar="FIRST-LAST",
                        help="the optimizer steps --trace-rows trace (default: three steps at 3/4 of --steps)")
    args = parser.parse_args(argv)
    names = [r.name for r in ROWS]
    wanted = names if args.rows is None else [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}; rows: {', '.join(names)}")

    import torch

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    gpu, cpu = gpu_info(), cpu_info()
    cpu_mode = args.cpu or gpu is None
    if gpu is None:
        print("gpu_suite: torch.cuda.is_available() is False: CPU mode (CPU rows at tiny sizes; GPU rows unmeasured)")
    elif args.cpu:
        print(f"gpu_suite: --cpu: CPU mode although {gpu['count']} x {gpu['name']} is visible")
    else:
        print(f"gpu_suite: {gpu['count']} x {gpu['name']} (gpu_type {gpu['gpu_type']}, {gpu['mem_gib']} GiB)")
    print(f"gpu_suite: CPU {cpu['model']}, {cpu['cores']} cores, torch CPU capability {cpu['torch_capability']}, "
          f"native bf16 {cpu['native_bf16']}")  # fmt: skip
    steps = args.steps or (30 if cpu_mode else 50)
    if steps < 2:
        parser.error("--steps must be at least 2 (the first step is left out of tokens/s)")
    profile = write_profile(out, None if cpu_mode else gpu)
    load_before = [round(x, 2) for x in os.getloadavg()]  # a shared machine's figures depend on it
    print(f"gpu_suite: load average (1/5/15 min) {load_before}")
    by_name = {r.name: r for r in ROWS}
    # --rows: those rows, in the order given; default: the suite's order (CPU rows in CPU mode)
    selected = ([by_name[n] for n in dict.fromkeys(wanted)] if args.rows is not None
                else [r for r in ROWS if r.device == "gpu" or cpu_mode])
    import lightning

    from jobgen.train.speed import levers_off

    levers_off({"JOBGEN_LEVERS_OFF": args.before})  # refuse an unknown lever before any run
    started = time.perf_counter()
    results: list[dict[str, Any]] = []

    def write_json() -> None:  # after every row: a suite stopped by a time limit keeps what it measured
        doc = {
            "mode": "cpu" if cpu_mode else "gpu",
            "command": [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])],
            "steps": steps,
            "before": args.before or None,
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "cpu": cpu,
            "gpu": gpu,
            "profile": str(profile),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "python": platform.python_version(),
            "rows": results,
        }
        (out / "gpu_suite.json").write_text(json.dumps(doc, indent=2) + "\n")

    for i, row in enumerate(selected, 1):
        base = {"name": row.name, "device": row.device, "model": row.model, "precision": row.precision,
                "strategy": row.strategy, "compile": row.compile}  # fmt: skip
        reason = skip_reason(row, gpu, cpu, cpu_mode)
        if reason is None and row.device == "cpu" and not cpu_mode:
            reason = "unmeasured: CPU row in GPU mode (give --cpu)"
        if reason is None and args.deadline is not None and time.perf_counter() - started > args.deadline:
            reason = f"unmeasured: deadline ({args.deadline:.0f} s) passed"
        if reason is not None:
            print(f"[{i}/{len(selected)}] {row.name}: {reason}", flush=True)
            results.append(base | {"status": reason})
            write_json()
            continue
        print(f"[{i}/{len(selected)}] {row.name}: running {steps} steps ({row.model}, {row.precision}, {row.strategy}"
              f"{', compile' if row.compile else ''}) ...", flush=True)  # fmt: skip
        trace = ""
        if row.name in {r.strip() for r in args.trace_rows.split(",")}:
            trace = args.trace_steps or f"{max(2, 3 * steps // 4)}-{max(2, 3 * steps // 4) + 2}"
        res = base | run_row(row, out, profile, None if cpu_mode else gpu, steps, args.timeout, tuple(args.sets))
        print(f"[{i}/{len(selected)}] {row.name}: {res['status']} ({fmt(res.get('tokens_per_s'), ',.0f')} tok/s, "
              f"{res.get('wall_s')} s; log {res.get('log')})", flush=True)  # fmt: skip
        if row.model.startswith("gpt") and not args.no_plain and row.strategy == "ddp":
            # one plain ceiling per model, precision and compile: the plain loop has no strategy
            res |= run_plain(row, res, out, cpu, args.timeout)
            print(f"[{i}/{len(selected)}] {row.name}: plain loop {res['plain_status']} "
                  f"({fmt(res.get('plain_tokens_per_s'), ',.0f')} tok/s; jobgen / plain "
                  f"{fmt(res.get('jobgen_over_plain'), '.3f')})", flush=True)  # fmt: skip
        results.append(res)
        write_json()
        if args.before and (args.deadline is None or time.perf_counter() - started <= args.deadline):
            before = run_row(row, out, profile, None if cpu_mode else gpu, steps, args.timeout, tuple(args.sets),
                             levers_off=args.before, suffix="-before")
            res["before"] = before
            ours, theirs = res.get("tokens_per_s"), before.get("tokens_per_s")
            res["after_over_before"] = round(ours / theirs, 3) if ours and theirs else None
            print(f"[{i}/{len(selected)}] {row.name}: before (JOBGEN_LEVERS_OFF={args.before}) {before['status']} "
                  f"({fmt(theirs, ',.0f')} tok/s; after / before {fmt(res['after_over_before'], '.2f')})", flush=True)
            write_json()
        if trace:
            # traces come from runs of their own: the profiler's cost and its export would otherwise
            # land in the timed steps (seen on an H200: a traced gpt350m row at 0.55x its untraced figure)
            res["trace_runs"] = []
            for off, suffix in (("", "-trace"), *(((args.before, "-before-trace"),) if args.before else ())):
                if args.deadline is not None and time.perf_counter() - started > args.deadline:
                    break
                traced = run_row(row, out, profile, None if cpu_mode else gpu, steps, args.timeout, tuple(args.sets),
                                 levers_off=off, suffix=suffix, trace=trace)
                res["trace_runs"].append({"levers_off": off, "status": traced["status"],
                                          "traces": traced.get("traces", [])})
                print(f"[{i}/{len(selected)}] {row.name}: trace of steps {trace}"
                      f"{f' (JOBGEN_LEVERS_OFF={off})' if off else ''}: {traced['status']} {traced.get('traces')}",
                      flush=True)
            write_json()

    print()
    print(table(results))
    print(f"\nwrote {out / 'gpu_suite.json'}")
    return 1 if any(r["status"].startswith("failed") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
