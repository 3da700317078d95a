"""``jobgen doctor`` on a local profile: this machine runs the ranks, so the checks are that its
Python imports the entrypoint and that it has the GPUs the profile asks for."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

from jobgen.doctor import Check, DoctorContext


def checks(ctx: DoctorContext) -> Iterator[Check]:
    """``local.entrypoint`` (``python -m jobgen.train``'s imports: torch, lightning) and
    ``local.gpus`` (the profile's ``gpus_per_node`` against ``torch.cuda.device_count()``)."""
    probe = ("import json, torch, lightning, jobgen.train; "
             "print(json.dumps([torch.__version__, lightning.__version__, torch.cuda.device_count()]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=ctx.timeout_s,
                          encoding="utf-8", errors="backslashreplace")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        yield Check("local.entrypoint", "fail", f"{sys.executable} cannot import jobgen.train: {last}",
                    "pip install 'jobgen[train]' into this Python (docs/install.md)")
        yield Check("local.gpus", "skip", "not checked: local.entrypoint failed")
        return
    import json

    torch_version, lightning_version, gpus = json.loads(proc.stdout.strip().splitlines()[-1])
    yield Check("local.entrypoint", "pass", f"{sys.executable}: torch {torch_version}, lightning {lightning_version}")
    wanted = ctx.profile.gpus_per_node
    if wanted == 0:
        yield Check("local.gpus", "pass", f"CPU profile (gloo); this machine has {gpus} GPU(s)")
    elif gpus >= wanted:
        yield Check("local.gpus", "pass", f"{gpus} GPU(s), the profile uses {wanted}")
    else:
        yield Check("local.gpus", "fail", f"the profile uses {wanted} GPU(s); torch sees {gpus}",
                    f"set gpus_per_node: {gpus} in {ctx.profile_source} (or local.detect_gpus: true)")
