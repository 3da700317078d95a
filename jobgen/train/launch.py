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

The API used (``parse_args(argv)``, ``run(args)``, ``ChildFailedError.failures`` mapping local
ranks to ``ProcessFailure`` with ``exitcode``, ``SignalException.sigval``) is torch's, not
documented as public: tests/unit/test_launch.py pins it.
"""

from __future__ import annotations

import sys

#: The prefix of the launcher's own lines on stderr.
PROG = "jobgen.train.launch"


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


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (its own arguments, as ``torchrun`` takes them); return 0 when
    every worker succeeded, else the exit code of
    :func:`jobgen.reports.failure_class.launcher_exit_code`. One line on stderr names the
    decision; torchrun's own report (the first failure's rank, exit code, error file) comes first."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from jobgen.errors import printable
    from jobgen.reports.failure_class import launcher_exit_code

    args = parse_args(sys.argv[1:] if argv is None else argv)
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
