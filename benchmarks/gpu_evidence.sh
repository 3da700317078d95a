#!/usr/bin/env bash
# The GPU evidence of the speed levers in one command: first the GPU-only tests of the levers (pytest, CUDA
# tests of tests/entrypoint/test_speed_levers.py), then the gpt350m rows through `jobgen submit`
# (compiled ddp, ddp, fsdp, ZeRO-2; GPU_EVIDENCE_ROWS), each beside its "before"
# (JOBGEN_LEVERS_OFF=GPU_EVIDENCE_BEFORE, default loss_read: the log-step loss read of
# jobgen.train.speed.LogStepLoss; single_device,host_logging,fused_clip gives the paths main took
# before the earlier levers), the plain-loop ceiling of the single-rank GPT rows, then
# torch.profiler traces of three steady steps of the GPU_EVIDENCE_TRACE rows (before and after)
# in runs of their own. No run starts after GPU_EVIDENCE_DEADLINE_S (default 330 s; the rows are in
# priority order), so the command ends within about 8 minutes on one H200 (2026-11-27: four rows
# with their before runs and ceilings took ~470 s there, so the traces may be left out).
#
# Usage: bash benchmarks/gpu_evidence.sh OUT_DIR [WHEELS_DIR]
#   WHEELS_DIR: wheels to install first (an offline GPU machine; docs/evidence.md, "GPU evidence
#   suite" lists them: pydantic, pydantic_core, annotated_types, typing_inspection, hjson,
#   deepspeed, and pytest, pluggy, iniconfig for the tests), into a private directory put on
#   PYTHONPATH.
# Writes OUT_DIR/versions.txt, OUT_DIR/tests.log, OUT_DIR/suite.log, OUT_DIR/suite/gpu_suite.json
# and the runs.
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
# The CUDA-only tests (skipped on CPU): no conftest plugins beyond pytest's own, no xdist.
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/entrypoint/test_speed_levers.py -k "on_a_gpu" \
    2>&1 | tail -n 30 | tee "$out/tests.log"
python3 benchmarks/gpu_suite.py --out "$out/suite" --steps 120 \
    --rows "${GPU_EVIDENCE_ROWS:-gpt350m-bf16-compile,gpt350m-bf16,gpt350m-fsdp-bf16,gpt350m-ds2-bf16}" \
    --before "${GPU_EVIDENCE_BEFORE:-loss_read}" --trace-rows "${GPU_EVIDENCE_TRACE:-gpt350m-bf16-compile}" \
    --deadline "${GPU_EVIDENCE_DEADLINE_S:-330}" --timeout 200 2>&1 | tee "$out/suite.log"
