"""The entrypoint's exit code says the failure's class (jobgen.reports.failure_class.exit_code_for).

Each case raises its exception where the entrypoint reads the spec and runs the real
``python -m jobgen.train`` exit path in process (``main``): the error line it prints, the
class it decides and the code it returns. No training runs (no torch import).
"""

from __future__ import annotations

import json

import pytest

from jobgen.errors import EXIT_BAD_INPUT, EXIT_RUNTIME, ConfigError, SubmitError
from jobgen.reports import failure_class as fc
from jobgen.train import __main__ as entrypoint
from jobgen.train.gpu_health import GPUHealthError
from jobgen.train.preflight import PreflightError


class DistBackendError(RuntimeError):
    """Stands in for torch.distributed.DistBackendError (its name is what NCCL_ERROR_RE matches)."""


class Wrapper(RuntimeError):
    """An exception that wraps another (as Lightning's strategies re-raise)."""


def _wrapped(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as caught:
            raise outer from caught
    except BaseException as result:  # noqa: BLE001 - the chained exception is the value
        return result


CASES = [
    (ConfigError("no file", location="spec.data.paths[0]", hint="give a file"), EXIT_BAD_INPUT),
    (SubmitError("the run directory is not writable"), EXIT_RUNTIME),
    (PreflightError("preflight: node node2 is slow"), EXIT_RUNTIME),
    (GPUHealthError("preflight: node gpu-b7: GPU 3 (NVIDIA A100): 2 uncorrectable ECC error(s)"), fc.EXIT_INFRASTRUCTURE),
    (ValueError("bad shape (2, 3)"), EXIT_RUNTIME),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), EXIT_RUNTIME),
    (DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"), fc.EXIT_INFRASTRUCTURE),
    (RuntimeError("NCCL WARN NET/IB : Got completion with error 12"), fc.EXIT_INFRASTRUCTURE),
    (RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234"), fc.EXIT_INFRASTRUCTURE),
    (RuntimeError("CUDA error: uncorrectable ECC error encountered"), fc.EXIT_INFRASTRUCTURE),
    (RuntimeError("CUDA error: unspecified launch failure; GPU has fallen off the bus"), fc.EXIT_INFRASTRUCTURE),
    (_wrapped(DistBackendError("NCCL error: remote process exited"), Wrapper("the strategy failed")), fc.EXIT_INFRASTRUCTURE),
    (_wrapped(ValueError("bad label"), Wrapper("the strategy failed")), EXIT_RUNTIME),
    (ValueError("odd \x1b[2J\n\udcff " + "x" * 300), EXIT_RUNTIME),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_the_exit_code_is_the_failures_class(tmp_path, monkeypatch, capsys, exc, code):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"spec": {"name": "x"}}))

    def fail(path):
        raise exc

    monkeypatch.setattr(entrypoint, "load_resolved_spec", fail)
    assert entrypoint.main(["--spec", str(spec)]) == code
    err = capsys.readouterr().err
    assert err.startswith(f"{entrypoint.PROG}: error: ") and err.count("\n") == 1, err  # one line, whatever the message held
    assert "\x1b" not in err
    if code != EXIT_BAD_INPUT:
        assert entrypoint.failure_exit_code(exc) == code

