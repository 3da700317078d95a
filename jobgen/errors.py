"""Typed errors for jobgen.

Every error a user can cause is a :class:`JobgenError`: it says what was given, where
(file + JSON path of the field), and carries a ``hint`` with the exact fix. The CLI prints
it without a traceback and exits with :attr:`JobgenError.exit_code` (2 for bad input, 1 for
cluster/submit failures, see ARCHITECTURE.md "Errors").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 1


class JobgenError(Exception):
    """An error the user can fix.

    Args:
        message: what was wrong, naming the value given.
        hint: the exact fix (printed after ``hint:``), or ``None``.
        location: where: ``"<file>: <json.path>"`` or a field path; ``None`` when global.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, hint: str | None = None, location: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.location = location

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ConfigError(JobgenError):
    """A spec, profile or override is invalid (exit 2)."""


class DeepSpeedConfigError(ConfigError):
    """A DeepSpeed config breaks a rule that DeepSpeed's own validator does not check (exit 2).

    See :func:`jobgen.deepspeed.check_deepspeed_config`.
    """


class PlanError(JobgenError):
    """Spec and profile are each valid but do not fit together (exit 2)."""


class NotSupportedError(JobgenError):
    """The requested operation is not available for this scheduler yet (exit 2)."""


class SubmitError(JobgenError):
    """The scheduler or a launched process failed (exit 1)."""

    exit_code = EXIT_RUNTIME


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """Return ``"did you mean 'x'?"`` for the closest of ``choices``, or ``None``."""
    import difflib  # only on an error path: keeps difflib (and heapq) off every render

    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def json_path(loc: Sequence[str | int]) -> str:
    """Format a pydantic/JSON location tuple as ``a.b[0].c``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"
