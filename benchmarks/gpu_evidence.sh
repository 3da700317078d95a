#!/usr/bin/env bash
# Issue 28's GPU evidence in one command, sized to finish in under 8 minutes on one H100/H200:
# the gpt350m rows (ddp, fsdp, ZeRO-2, compiled ddp; gpt124m if time is left) through
# `jobgen submit`, each beside its "before" (JOBGEN_LEVERS_OFF=single_device,host_logging,fused_clip:
# the paths main took before those levers), the plain-loop ceiling, and torch.profiler traces of
# three steady steps of the gpt350m ddp and fsdp runs (before and after).
#
# Usage: bash benchmarks/gpu_evidence.sh OUT_DIR [WHEELS_DIR]
#   WHEELS_DIR: wheels to install first (an offline GPU machine; the README's "GPU evidence
#   suite" lists them: pydantic, pydantic_core, annotated_types, typing_inspection, hjson,
#   deepspeed), into a private directory put on PYTHONPATH.
# Writes OUT_DIR/versions.txt, OUT_DIR/suite.log, OUT_DIR/suite/gpu_suite.json and the runs.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_evidence.sh OUT_DIR [WHEELS_DIR]}
wheels=${2:-}
cd "$(dirname "$0")/.."
mkdir -p "$out"
if [ -n "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$out/site" "$wheels"/*.whl || exit 1
    export PYTHONPATH="$out/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export DS_ACCELERATOR=cuda PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import sys, torch, lightning, pydantic; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "lightning", lightning.__version__, "pydantic", pydantic.VERSION)'
    python3 -c 'import deepspeed; print("deepspeed", deepspeed.__version__)'
    grep -m1 'model name' /proc/cpuinfo
} >"$out/versions.txt" 2>&1
cat "$out/versions.txt"
python3 benchmarks/gpu_suite.py --out "$out/suite" --steps 120 \
    --rows gpt350m-bf16,gpt350m-fsdp-bf16,gpt350m-ds2-bf16,gpt350m-bf16-compile,gpt124m-bf16,gpt124m-bf16-compile \
    --before single_device,host_logging,fused_clip --trace-rows gpt350m-bf16,gpt350m-fsdp-bf16 \
    --deadline "${GPU_EVIDENCE_DEADLINE_S:-330}" --timeout 200 2>&1 | tee "$out/suite.log"
