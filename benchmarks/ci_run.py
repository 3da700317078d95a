#!/usr/bin/env python3
"""Time ``.ci/run`` (which runs the README's test command) in a fresh clone, cold or warm, and
print where the time went.

    python benchmarks/ci_run.py --cold            # every cache of the project emptied
    python benchmarks/ci_run.py --warm            # the machine's caches as they are
    python benchmarks/ci_run.py --cold --ref HEAD~1 --workdir /var/tmp/ci-cold

Cold means each cache the run fills is a new empty directory: pip's (``PIP_CACHE_DIR``), the
Kubernetes lab's binaries and training image (``JOBGEN_K8S_CACHE``), DeepSpeed's compiled ops
(``TORCH_EXTENSIONS_DIR``) and jobgen's own (``XDG_CACHE_HOME``). What a cold run cannot undo
here: Debian packages an earlier run installed (Go, SLURM, OpenSSH, g++) stay installed, and
the local index the machine serves torch from stays. The script says which of those it found.

The clone is ``git clone --no-local`` of ``--ref`` (default HEAD, committed files only), run as
CI runs it: ``CI=true bash .ci/run``, no standard input. Its output goes to ``<workdir>/ci.log``;
the phase table (tests/phases.py) and the total are printed at the end, with the CPU model. The
exit code is ``.ci/run``'s. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from render import cpu_model  # this folder: sys.path[0] when run as a script

REPO = Path(__file__).resolve().parent.parent
#: Debian packages whose presence makes a "cold" run warmer than a new machine's (the labs and
#: the build install them when missing).
PREINSTALLED_MARKERS = {
    "golang-1.19-go": "/usr/lib/go-1.19/bin/go",
    "slurm-wlm (slurmctld)": "/usr/sbin/slurmctld",
    "openssh-server (sshd)": "/usr/sbin/sshd",
    "kubernetes-client (kubectl)": "/usr/bin/kubectl",
    "g++": "/usr/bin/g++",
}


def default_signals() -> None:
    """SIGINT and SIGQUIT back to their defaults in ``.ci/run``: this script started in the
    background of a shell without job control (``cmd &``, nohup) inherits them ignored, and the
    tests of Ctrl-C would then see a process that ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cold", action="store_true", help="empty every cache of the project (new directories)")
    mode.add_argument("--warm", action="store_true", help="keep the machine's caches")
    parser.add_argument("--ref", default="HEAD", help="the commit to clone (default: HEAD)")
    parser.add_argument("--workdir", type=Path, help="where the clone and the caches go (default: a new temporary directory)")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="jobgen-ci-run-"))
    work.mkdir(parents=True, exist_ok=True)
    clone = work / "clone"
    if clone.exists():
        print(f"ci_run: {clone} exists; give an empty --workdir", file=sys.stderr)
        return 2
    subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(clone)], check=True, timeout=600)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", args.ref], check=True, timeout=60)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "JOBGEN_")) and k != "VIRTUAL_ENV"}
    env |= {"CI": "true", "JOBGEN_PHASES_FILE": str(work / "phases.jsonl")}
    if args.cold:
        for name, var in (("pip", "PIP_CACHE_DIR"), ("k8s", "JOBGEN_K8S_CACHE"), ("torch-extensions", "TORCH_EXTENSIONS_DIR"),
                          ("xdg", "XDG_CACHE_HOME")):
            path = work / "cache" / name
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            env[var] = str(path)
    present = [name for name, marker in PREINSTALLED_MARKERS.items() if os.path.exists(marker)]
    print(f"ci_run: {'cold' if args.cold else 'warm'} run of {commit} in {clone}; CPU {cpu_model()}, {os.cpu_count()} cores; "
          f"Debian packages already installed: {', '.join(present) or 'none'}", flush=True)
    started = time.monotonic()
    with open(work / "ci.log", "wb") as log:
        proc = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                              preexec_fn=default_signals)
    wall = time.monotonic() - started
    tail = (work / "ci.log").read_text(errors="replace").splitlines()
    summary = next((line for line in reversed(tail) if " passed" in line or " failed" in line), "(no pytest summary line)")
    print(summary)
    subprocess.run([sys.executable, str(REPO / "tests" / "phases.py"), "report", str(work / "phases.jsonl")], timeout=60)
    print(f"ci_run: .ci/run exited {proc.returncode} after {wall / 60:.1f} min ({wall:.0f} s); log {work / 'ci.log'}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
