"""Typed errors for jobgen.

Every error a user can cause is a :class:`JobgenError`: it says what was given, where
(file + JSON path of the field), and carries a ``hint`` with the exact fix. The CLI prints
it without a traceback and exits with :attr:`JobgenError.exit_code` (2 for bad input, 1 for
cluster/submit failures, 130 for an interrupted run; docs/commands.md lists them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 1
#: Interrupted (Ctrl-C): 128 + SIGINT, the Unix shells' convention.
EXIT_INTERRUPTED = 130

#: A URL with a scheme (``https://...``, ``git+ssh://...``) inside running text: up to a space or quote.
_URL_RE = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
#: What stands in for a redacted credential.
REDACTED = "***"


def _redact_params(text: str) -> str:
    """``a=1&b`` with every value replaced by ``***`` (``a=***&b``)."""
    return "&".join((name + "=" + REDACTED) if value else name + eq
                    for name, eq, value in (p.partition("=") for p in text.split("&")))


def _redact_url(url: str) -> str:
    """``url`` with its userinfo (``user:password@``) and every query value and fragment
    parameter value (``#access_token=...``) replaced by ``***``; trailing sentence punctuation
    (``).,;:``) is left outside and kept as it was."""
    core = url.rstrip(").,;:")
    tail = url[len(core):]
    scheme, _, rest = core.partition("://")
    rest, hash_, fragment = rest.partition("#")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = REDACTED + "@" + authority.rpartition("@")[2]
    path, question, query = f"{slash}{path}".partition("?")
    if question:
        query = _redact_params(query)
    if "=" in fragment:
        fragment = _redact_params(fragment)
    return f"{scheme}://{authority}{path}{question}{query}{hash_}{fragment}{tail}"


def redact_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it hidden: userinfo and query values become
    ``***`` (a token in ``?token=...`` or ``https://user:token@host``). Error messages echo the
    values a user gave, and end up in terminals and CI logs; :class:`JobgenError` applies this to
    its message, hint and location."""
    return _URL_RE.sub(lambda m: _redact_url(m.group(0)), text) if "://" in text else text


class JobgenError(Exception):
    """An error the user can fix.

    Args:
        message: what was wrong, naming the value given (URLs in message, hint and location
            are shown with their credentials hidden, :func:`redact_urls`).
        hint: the exact fix (printed after ``hint:``), or ``None``.
        location: where: ``"<file>: <json.path>"`` or a field path; ``None`` when global.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, hint: str | None = None, location: str | None = None):
        message = redact_urls(message)  # a URL's credentials never reach a terminal or a CI log
        super().__init__(message)
        self.message = message
        self.hint = None if hint is None else redact_urls(hint)
        self.location = None if location is None else redact_urls(location)

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ConfigError(JobgenError):
    """A spec, profile or override is invalid (exit 2)."""


class DeepSpeedConfigError(ConfigError):
    """A DeepSpeed config breaks a rule that DeepSpeed's own validator does not check (exit 2).

    See :func:`jobgen.planning.deepspeed.check_deepspeed_config`.
    """


class PlanError(JobgenError):
    """Spec and profile are each valid but do not fit together (exit 2)."""


class NotSupportedError(JobgenError):
    """The requested operation is not available for this scheduler yet (exit 2)."""


class SubmitError(JobgenError):
    """The scheduler or a launched process failed (exit 1)."""

    exit_code = EXIT_RUNTIME


class InterruptedRun(SubmitError):
    """A run jobgen held in the foreground was stopped by Ctrl-C (exit 130, as a shell reports SIGINT)."""

    exit_code = EXIT_INTERRUPTED


class TrackerError(JobgenError):
    """An experiment tracker (W&B, MLflow) could not start its run: no key, no server (exit 1)."""

    exit_code = EXIT_RUNTIME


def printable(text: str) -> str:
    """``text`` with every non-printable character (newline, escape, NUL) as its Python escape
    (``\\n``, ``\\x1b``): a value from the environment or a file name cannot break a one-line
    error, a ``NAME=VALUE`` line or a shell word, nor drive the terminal."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


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
