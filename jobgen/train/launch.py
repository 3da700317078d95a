"""torchrun with an exit code that carries the failure's class: ``python -m jobgen.train.launch
<torchrun arguments>``.

torchrun (``python -m torch.distributed.run``) exits 1 whatever its workers did, so under
training-operator's ``restartPolicy: ExitCode`` (1-127 permanent, 128-255 retryable) every
failure would be permanent. This launcher runs torchrun in this process, the way HF
accelerate's ``accelerate launch`` does (``torch.distributed.run.parse_args`` then
``torch.distributed.run.run``), and on failure exits with
:func:`jobgen.reports.failure_class.launcher_exit_code` of what ended it: the first failed
worker's own exit code (the entrypoint's 1, 2, 200-202), 128 + N for a worker killed by signal
N, 200 for a failed rendezvous, 202 for any other error inside torchrun.

Signals: torchrun's elastic agent installs its handlers for SIGTERM, SIGINT, SIGHUP and SIGQUIT
(``torch.distributed.elastic.multiprocessing.api``) in this process as it would in its own, so
the kubelet's SIGTERM reaches every worker; the agent then raises ``SignalException``, and the
launcher exits 128 + the signal.

The restart budget: training-operator v1.9 bounds ExitCode restarts by ``runPolicy.backoffLimit``
only when it is 0 (a retryable exit deletes the pod, and the recreated pod's ``restartCount``,
which ``PastBackoffLimit`` sums, starts at 0: pkg/core/job.go, pkg/controller.v1/common/pod.go,
v1.9.0). So with ``--restart-budget=N --restart-ledger=DIR`` ahead of torchrun's arguments the
launcher counts the starts of its pod (the pod name, ``$HOSTNAME``, keeps across recreation) in
``DIR/<pod name>`` (one line per start; DIR on the run directory's shared volume), and once N
restarts are spent it ends a retryable failure with exit 1 (permanent: the operator fails the
job), saying so on stderr; a start beyond the budget (a pod killed from outside, which the launcher
could not answer) exits 1 before torchrun runs.

The API used (``parse_args(argv)``, ``run(args)``, ``ChildFailedError.failures`` mapping local
ranks to ``ProcessFailure`` with ``exitcode``, ``SignalException.sigval``) is torch's, not
documented as public: tests/unit/test_launch.py pins it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from jobgen.errors import printable
from jobgen.reports.attempts import LAUNCH_PROG as PROG
from jobgen.reports.attempts import RESTART_LINE

#: The prefix of the launcher's own lines on stderr.


def _is_rendezvous_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a failed rendezvous or an unreachable store."""
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (RendezvousError, DistError)):
            return True
        current = current.__cause__ or current.__context__
    return False


#: The launcher's own options, ahead of torchrun's: ``--restart-budget=N``, ``--restart-ledger=DIR``.
BUDGET_FLAG, LEDGER_FLAG = "--restart-budget=", "--restart-ledger="
#: What the launcher exits with when the budget is spent: permanent under ``restartPolicy: ExitCode``.
EXIT_BUDGET_SPENT = 1


def own_options(argv: list[str]) -> tuple[int | None, Path | None, list[str]]:
    """``(budget, ledger directory, torchrun's arguments)`` from the launcher's command line: its
    options come first, each as one ``--flag=value`` word.

    Raises:
        SystemExit: 2 with a message when a budget is not a whole number from 0, or only one of the
            two options is given.
    """
    budget: int | None = None
    ledger: Path | None = None
    rest = list(argv)
    while rest and rest[0].startswith((BUDGET_FLAG, LEDGER_FLAG)):
        word = rest.pop(0)
        if word.startswith(BUDGET_FLAG):
            value = word[len(BUDGET_FLAG):]
            if not value.isdigit():
                raise SystemExit(f"{PROG}: error: {BUDGET_FLAG}{printable(value)!s}: give a whole number of restarts from 0")
            budget = int(value)
        else:
            ledger = Path(word[len(LEDGER_FLAG):])
    if (budget is None) != (ledger is None):
        raise SystemExit(f"{PROG}: error: give both {BUDGET_FLAG}N and {LEDGER_FLAG}DIR, or neither")
    return budget, ledger, rest




def pod_name(environ: dict[str, str] | None = None) -> str:
    """This pod's name as a file name: ``$HOSTNAME`` (the kubelet sets it to the pod's name), with
    any character outside ``a-z 0-9 . -`` replaced by ``_`` and cut to 253 characters; ``pod``
    when unset."""
    name = (os.environ if environ is None else environ).get("HOSTNAME", "")
    name = re.sub(r"[^a-z0-9.-]", "_", name)[:253].lstrip(".")
    return name or "pod"


def record_start(ledger: Path, name: str) -> int:
    """Append this start to ``ledger/name`` and return how many starts it held before (the
    restarts so far).

    Raises:
        OSError: the ledger cannot be written (the caller reports it).
    """
    ledger.mkdir(parents=True, exist_ok=True)
    path = ledger / name
    try:
        before = path.read_bytes().count(b"\n")
    except FileNotFoundError:
        before = 0
    with open(path, "ab") as f:
        f.write(f"{time.time():.0f}\n".encode())
    return before


#: The restart records of a pod, ``<ledger>/<pod name>`` + this suffix: one JSON line per restart.
RECORDS_SUFFIX = ".restarts.jsonl"


def record_restart(ledger: Path, name: str, number: int, code: int) -> None:
    """Append restart ``number`` of pod ``name`` to its records (``<ledger>/<name>`` +
    :data:`RECORDS_SUFFIX`): ``restart``, ``class`` (of exit ``code``, as the SLURM batch script
    classes a task's code: :func:`jobgen.reports.failure_class.task_exit_classes`), ``reason``,
    ``exit_code``, ``at`` (UTC). The restarted pod's rank zero reads it
    (:func:`jobgen.events.notifier.restart_of_this_start`). A record that cannot be written is
    said on stderr and does not change the exit code."""
    import json
    from datetime import datetime, timezone

    from jobgen.reports.failure_class import task_exit_classes

    cls = next((c for low, high, c in task_exit_classes() if low <= code <= high), "unknown")
    doc = {"restart": number, "class": cls, "reason": f"pod {name}: exit {code}", "exit_code": code,
           "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        with open(ledger / f"{name}{RECORDS_SUFFIX}", "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")
    except OSError as exc:
        print(f"{PROG}: could not record restart {number} in {printable(str(ledger))}: {printable(str(exc))}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (the launcher's options, then torchrun's own arguments); return 0 when
    every worker succeeded, else the exit code of
    :func:`jobgen.reports.failure_class.launcher_exit_code`. One line on stderr names the
    decision; torchrun's own report (the first failure's rank, exit code, error file) comes first.
    With a restart budget (:func:`own_options`), a retryable code once the budget is spent becomes
    :data:`EXIT_BUDGET_SPENT` (module docstring); within the budget it is recorded
    (:func:`record_restart`) for the restarted pod's ``restart`` notification and summary.json."""
    from jobgen.reports.failure_class import RETRYABLE_FROM

    budget, ledger, torchrun_argv = own_options(sys.argv[1:] if argv is None else argv)
    restarts = 0
    if budget is not None and ledger is not None:
        # the workers inherit it: rank zero sends this restart's record as the `restart` notification
        os.environ["JOBGEN_RESTART_RECORD"] = str(ledger / f"{pod_name()}{RECORDS_SUFFIX}")  # notifier.RESTART_RECORD_ENV
        try:
            restarts = record_start(ledger, pod_name())
        except OSError as exc:
            print(f"{PROG}: error: cannot count this pod's starts in {printable(str(ledger))}: {printable(str(exc))}",
                  file=sys.stderr, flush=True)
            return EXIT_BUDGET_SPENT
        # the workers inherit it: the entrypoint's notifications say which restart of the pod this is
        os.environ["JOBGEN_RESTART_COUNT"] = str(restarts)  # jobgen.events.notifier.RESTART_COUNT_ENV
        if restarts:  # a first start prints nothing: the job's output begins with the entrypoint's
            print(RESTART_LINE.format(restarts=restarts, budget=budget), file=sys.stderr, flush=True)
        if restarts > budget:
            print(f"{PROG}: this start is restart {restarts}, beyond the budget of {budget}: exit {EXIT_BUDGET_SPENT}",
                  file=sys.stderr, flush=True)
            return EXIT_BUDGET_SPENT
    code = _torchrun(torchrun_argv)
    if code >= RETRYABLE_FROM and budget is not None and restarts >= budget:
        print(f"{PROG}: restart budget spent ({restarts} of {budget}): exit {EXIT_BUDGET_SPENT} instead of {code}, so the job fails",
              file=sys.stderr, flush=True)
        return EXIT_BUDGET_SPENT
    if code >= RETRYABLE_FROM and budget is not None and ledger is not None:  # the operator starts the pod again
        record_restart(ledger, pod_name(), restarts + 1, code)
    return code


def _torchrun(argv: list[str]) -> int:
    """torchrun with ``argv`` in this process: 0, or the exit code of
    :func:`~jobgen.reports.failure_class.launcher_exit_code` (one line on stderr names it)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from jobgen.reports.failure_class import launcher_exit_code

    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as exc:
        local_rank, failure = exc.get_first_failure()
        code = launcher_exit_code(failure.exitcode)
        print(f"{PROG}: worker (local rank {local_rank}) failed with exit code {failure.exitcode}: exit {code}",
              file=sys.stderr, flush=True)
        return code
    except SignalException as exc:
        code = launcher_exit_code(signal=int(exc.sigval))
        print(f"{PROG}: got signal {int(exc.sigval)}; torchrun stopped its workers: exit {code}", file=sys.stderr, flush=True)
        return code
    except Exception as exc:  # torchrun's own failure: rendezvous, store, agent
        rendezvous = _is_rendezvous_error(exc)
        code = launcher_exit_code(rendezvous_error=rendezvous)
        what = "rendezvous failed" if rendezvous else "torchrun failed"
        print(f"{PROG}: {what}: {type(exc).__name__}: {printable(str(exc))[:500]}: exit {code}", file=sys.stderr, flush=True)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
