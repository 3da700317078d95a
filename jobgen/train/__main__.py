"""jobgen's bundled training entrypoint: ``python -m jobgen.train --spec spec.json``.

Every rank of every node runs the same command; Lightning reads the launcher's environment
(torchrun, SLURM) to learn its global/local rank and the world size. Launch lines:

local, one machine, 2 processes (gloo on CPU; strategy ddp or fsdp)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 -m jobgen.train --spec spec.json

SLURM, one task per GPU (``#SBATCH --ntasks-per-node=<GPUs per node>``; Lightning's
SLURMEnvironment; ``--signal=USR2@<grace_s>`` triggers checkpoint + requeue, see RequeueOnSignal)::

    srun python -m jobgen.train --spec spec.json

Kubernetes PyTorchJob, one pod per node, torchrun in each pod; torchrun takes its settings
from the operator's PET_* variables (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK) and the
master address from the flags (the v1 operator sets MASTER_ADDR/MASTER_PORT, which torchrun
does not read; the kubelet expands ``$(VAR)``)::

    python -m torch.distributed.run --master-addr=$(MASTER_ADDR) --master-port=$(MASTER_PORT) \
        -m jobgen.train --spec /etc/jobgen/spec.json --run-dir /workspace/runs/<name>

(A Trainer v2 TrainJob sets PET_MASTER_ADDR/PET_MASTER_PORT too: there the flags are omitted.)

Code snapshot: when ``$JOBGEN_CODE_DIR`` names the snapshot ``jobgen submit`` took
(``<run dir>/code/<commit>/``), its import directory goes first on ``sys.path`` and PYTHONPATH
before anything else is read, and ``summary.json`` records what it is (``code``).

Elastic PyTorchJob (``resources.nodes: "min:max"``), Worker pods only, a c10d rendezvous whose
store runs in worker 0's torchrun agent (the operator sets PET_RDZV_ENDPOINT to it); the node
count is whatever torchrun admitted, and the entrypoint passes Trainer(num_nodes = WORLD_SIZE /
processes per node) and the accumulation that keeps the planned global batch there
(:func:`jobgen.train.resolved.runtime_world`); a checkpoint written at another world size
resumes at the same optimizer step, learning rate and sample (:mod:`jobgen.train.position`).
Global rank 0 is on whichever pod the rendezvous ranks first (torch sorts the participants by
host name, pid and a counter), not necessarily worker 0: nothing here depends on it, and the
first line of every pod's log names it::

    python -m torch.distributed.run --nnodes=2:4 --nproc-per-node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=$(PET_RDZV_ENDPOINT) --max-restarts=3 -m jobgen.train --spec ...

Options: ``--run-dir DIR`` (default ``runs/<spec.name>`` in the current directory) holds the
data bins, checkpoints, CSV metrics and ``summary.json``. With ``checkpoint.resume: auto`` a
restarted job continues from the newest checkpoint there.

Exit status: 0 when training reached ``max_steps`` (or already had), 2 for bad input (spec
file, data paths, unsupported strategy/precision), 200 for a failure that is the cluster's (an
NCCL or transport error, a lost peer, a GPU hardware error: :func:`failure_exit_code`), 201 when
the progress watchdog finds the job hung (:data:`jobgen.reports.failure_class.EXIT_HUNG`;
:mod:`jobgen.train.watchdog`), 1 for
any other failure. Errors are one
line on stderr; ``--debug`` shows the traceback. An error in a spec field names the user's spec
file and the field as written there when ``$JOBGEN_SPEC_SOURCE`` says which file it was (``jobgen
submit`` sets it), else spec.json and its ``spec.`` path. Under torchrun the launcher exits 1
whatever its ranks exited; the 2 of an input error is in its report ("Root Cause ... exitcode"),
which the local backend reads (:func:`jobgen.backends.local.ranks_exit_code`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from jobgen.errors import EXIT_RUNTIME, JobgenError, printable
from jobgen.jobdir.files import CODE_DIR_ENV, SPEC_SOURCE_ENV
from jobgen.jobdir.runs import read_code_snapshot
from jobgen.jobdir.spec import ResolvedSpec, load_resolved_spec
from jobgen.reports.failure_class import Evidence, classify, exit_code_for
from jobgen.specs.training import TrainingSpec
from jobgen.train.formats import InstructionFiles, TokenFiles, discover_token_files, read_instruction_files
from jobgen.train.resolved import check_runtime_support, runtime_world
from jobgen.train.sources import SplitLayout, TextSources, check_enough_bytes, discover_sources, split_layout

PROG = "python -m jobgen.train"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the entrypoint's command line."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Train the model described by a jobgen spec file on this rank."
    )
    parser.add_argument(
        "--spec", required=True, type=Path, help="resolved spec file (spec.json) written by jobgen"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="run directory (default: runs/<spec.name> in the current directory)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser.parse_args(argv)


def one_line(exc: JobgenError) -> str:
    """``<location>: <message>; hint: <hint>`` on one line (job logs are grepped line by line)."""
    text = f"{exc.location}: {exc.message}" if exc.location else exc.message
    if exc.hint:
        text += f"; hint: {exc.hint}"
    return " ".join(text.split())


def error_location(field: str, spec_json: Path, environ: MutableMapping[str, str] = os.environ) -> str:
    """Where an error in ``field`` (a spec.json path: ``spec.data.paths[0]``, ``launch.x``) is:
    for a ``spec.`` field, the user's spec file (``$JOBGEN_SPEC_SOURCE``) and the field as written
    there (``data.paths[0]``); else, or without the variable, ``spec_json`` and the path."""
    source = environ.get(SPEC_SOURCE_ENV)
    if source and field.startswith("spec."):
        return f"{printable(source)}: {field[len('spec.'):]}"
    return f"{spec_json}: {field}"


def check_data(spec: TrainingSpec) -> tuple[TextSources | TokenFiles | InstructionFiles, SplitLayout | None]:
    """Find and check ``spec.data`` for its format (no torch): text files and their byte split,
    token files, or JSONL instruction records (every line parsed).

    Raises:
        ConfigError: missing/empty files, too little data, a malformed JSONL line (file:line,
            field), an unknown token dtype.
    """
    d = spec.data
    if d.format == "tokens":
        return discover_token_files(d.paths, d.token_dtype, d.vocab_size, d.val_fraction, spec.model.block_size), None
    if d.format == "jsonl":
        return read_instruction_files(d.paths, d.val_fraction), None
    sources = discover_sources(d.paths, d.max_bytes)
    layout = split_layout(sources.total_bytes, d.val_fraction)
    check_enough_bytes(layout, spec.model.block_size, sources.origin)
    return sources, layout


def use_code_snapshot(environ: MutableMapping[str, str] = os.environ, path: list[str] = sys.path) -> dict[str, Any] | None:
    """Put the code snapshot named by ``$JOBGEN_CODE_DIR`` first on ``path`` (``sys.path``) and
    on ``PYTHONPATH`` (for processes this rank starts); returns its record plus ``dir`` for
    ``summary.json``, or None when the variable is unset.

    Raises:
        ConfigError: the variable names no snapshot (e.g. a run directory the node cannot see).
    """
    root = environ.get(CODE_DIR_ENV)
    if not root:
        return None
    info = read_code_snapshot(Path(root))
    first = str(info.import_dir(Path(root)))
    if not path or path[0] != first:
        path.insert(0, first)
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if rest[:1] != [first]:
        environ["PYTHONPATH"] = os.pathsep.join([first, *rest])
    return {**info.model_dump(mode="json"), "dir": root}


def main(argv: list[str] | None = None) -> int:
    """Run the entrypoint; returns the process exit code (never raises, except with --debug)."""
    started = time.time()
    args = parse_args(argv)
    resolved: ResolvedSpec | None = None
    run_dir: Path | None = None
    try:
        code = use_code_snapshot()
        resolved = load_resolved_spec(args.spec)
        check_runtime_support(resolved)  # the planned world (an elastic job: its whole range)
        # elastic: the node count torchrun formed, the accumulation that keeps the global batch there
        resolved = runtime_world(resolved, os.environ)
        spec = resolved.spec
        run_dir = (args.run_dir if args.run_dir is not None else Path("runs") / spec.name).resolve()
        # a class_path data module is the user's: it finds and checks its own data on every rank
        sources, layout = (None, None) if spec.user_code else check_data(spec)
        if resolved.launch.preflight:  # before Lightning: it then uses the process group this sets up
            from jobgen.train.checkpoints import completed_checkpoint
            from jobgen.train.trainer import RunPaths

            done = completed_checkpoint(spec, RunPaths(run_dir).checkpoints)
            if done is None:
                from jobgen.train.preflight import run_preflight

                run_preflight(resolved, run_dir)
            else:
                from jobgen.train.run import rank_zero_print

                rank_zero_print(f"preflight: skipped, the run is already complete at step {done.global_step} "
                                f"(max_steps={spec.trainer.max_steps})")

        from jobgen.train.run import train  # torch + Lightning: only once the input is known good

        exit_code = train(resolved, args.spec.resolve(), run_dir, sources, layout, started, code=code)
        if exit_code != 0:
            _notify_failed(resolved, run_dir, f"training ended with exit code {exit_code} before max_steps")
        return exit_code
    except JobgenError as exc:
        if exc.location and exc.location.startswith(("spec.", "launch.")):
            exc.location = error_location(exc.location, args.spec)  # name the file, as the planner's errors do
        _notify_failed(resolved, run_dir, one_line(exc))
        if args.debug:
            raise
        if not getattr(exc, "reported", False):
            print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - top level: one line, non-zero exit
        text = printable(" ".join(str(exc).split()))  # the message is the job's: no escape reaches the log
        _notify_failed(resolved, run_dir, f"{type(exc).__name__}: {text}")
        if args.debug:
            raise
        print(
            f"{PROG}: error: {type(exc).__name__}: {text} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return failure_exit_code(exc)


def failure_exit_code(exc: BaseException) -> int:
    """The exit code for a failure that ended the entrypoint with ``exc``: a
    :class:`~jobgen.errors.JobgenError`'s own code (2: input error, 1: other; subclasses that
    find the cluster at fault set 200); otherwise ``exit_code_for`` of the class
    :func:`jobgen.reports.failure_class.classify` gives the exception as a traceback's
    evidence: 200 for an NCCL/transport error, a lost peer or a GPU hardware error, 1 for any
    other exception (CUDA out of memory included). The text classified is each exception of
    the chain (``__cause__``, else ``__context__``) as ``<qualified type>: <message>``, so an
    NCCL error that a wrapper re-raised still counts."""
    if isinstance(exc, JobgenError):
        return exc.exit_code
    lines, seen, current = [], set(), exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current)
        lines.append(f"{kind.__module__}.{kind.__qualname__}: {' '.join(str(current).split())}")
        current = current.__cause__ or current.__context__
    decided = classify([Evidence(PROG, kind="traceback", text=" | ".join(lines))])
    return EXIT_RUNTIME if decided is None else exit_code_for(decided.cls)


def _notify_failed(resolved: ResolvedSpec | None, run_dir: Path | None, error: str) -> None:
    """The ``failed`` notification (rank zero, specs with ``notify:``); never raises."""
    if resolved is None or resolved.spec.notify is None:
        return
    from jobgen.train.notify import notify_failure

    notify_failure(resolved, run_dir, error)


def exit_process(code: int) -> None:
    """Leave the process with ``code``; after training, without interpreter teardown.

    Once torch.distributed has run, interpreter teardown can abort a rank whose run has finished
    and written everything: a process-group worker thread still holds its last collective's
    tensors while Python finalises, C++ calls ``std::terminate`` ("terminate called without an
    active exception", SIGABRT), and the launcher reports the whole job failed. Every file the
    run writes is closed by then (checkpoints, summary.json, loggers finalised by Lightning), so
    after flushing stdout/stderr the process ends with ``os._exit``. Without training (bad
    input, --help) it exits normally. Users' own scripts get the same advice in
    docs/own-code.md, "Command mode". A script that wraps :func:`main` (adds callbacks, then
    calls it) ends with this function too.
    """
    if "jobgen.train.run" not in sys.modules:
        sys.exit(code)
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_process(main())
