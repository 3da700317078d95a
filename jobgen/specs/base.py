"""The building blocks of jobgen's spec models: the base model (frozen, ``extra="forbid"``), the
shell-safety and environment checks, class-path checks, and the helpers that keep optional
fields out of serialised specs. No I/O."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A dotted import path of a class: ``package.module.Class`` (at least one dot, identifiers only).
CLASS_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

def check_shell_safe(value: str) -> str:
    """Reject NUL and newlines: a newline inside quotes still starts a new ``#SBATCH`` line.

    Raises:
        ValueError: the value holds a newline, carriage return or NUL.
    """
    if any(c in value for c in "\n\r\x00"):
        raise ValueError("newlines, carriage returns and NUL bytes are not allowed in values that reach a shell")
    return value


def check_env(env: dict[str, str]) -> dict[str, str]:
    """Validate an environment mapping (POSIX names, shell-safe values); returned sorted by name.

    Raises:
        ValueError: a key is not ``[A-Za-z_][A-Za-z0-9_]*`` or a value holds a newline/NUL.
    """
    for key, value in env.items():
        if not ENV_KEY_RE.match(key):
            raise ValueError(f"environment variable name {key!r} is not a valid name ([A-Za-z_][A-Za-z0-9_]*)")
        check_shell_safe(value)
    return dict(sorted(env.items()))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

#: Words of a URL parameter's name (whole words, case-insensitive, camelCase split: ``accessToken``
#: is ``access token``) that mark a credential: ``?token=``, ``?api_key=``, ``?apiKey=``, ``?sig=``,
#: ``?X-Amz-Signature=``, ``?clientSecret=``, ``?code=`` (an OAuth code), ``#access_token=``.
URL_SECRET_WORDS = frozenset({
    "token", "key", "apikey", "secret", "password", "passwd", "pass", "pwd", "auth", "authorization",
    "sig", "signature", "credential", "credentials", "session", "code",
})


def url_secret_params(query: str) -> list[str]:
    """Names of the parameters in ``query`` (a URL's query or fragment, ``a=1&b=2``, percent
    escapes decoded: ``%74oken`` is ``token``) whose name looks like a credential (:data:`URL_SECRET_WORDS`)."""
    from urllib.parse import parse_qsl

    found = []
    for name, _ in parse_qsl(query, keep_blank_values=True):
        words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
        if set(re.split(r"[^a-z0-9]+", words)) & URL_SECRET_WORDS or name.lower() in URL_SECRET_WORDS:
            found.append(name)
    return found


def url_credential(url: str) -> str | None:
    """What in ``url`` is a credential, or None: the one check for every URL a spec or profile
    holds (spec.json and the rendered files, often committed, would carry it).

    A credential is a password (``user:password@``); a user name in an ``http(s)`` URL (tokens
    travel as one: ``https://<token>@host``; ``ssh://git@host`` and ``postgresql://alice@db``
    name a user); a query or fragment parameter named like one (:func:`url_secret_params`)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        password, username = parts.password, parts.username
    except ValueError:  # a malformed authority (e.g. an unclosed IPv6 bracket): the caller's shape check says so
        return None
    if password is not None or (username is not None and parts.scheme.split("+", 1)[0].lower() in ("http", "https")):
        return "the URL carries user:password@ (or a user name, which is how a token travels in an http(s) URL)"
    secret = url_secret_params(parts.query) + url_secret_params(parts.fragment)
    if secret:
        return f"the URL's parameter(s) {', '.join(dict.fromkeys(secret))} look like a credential"
    return None


def check_class_path(value: str) -> str:
    """The shape of a dotted class path (``pkg.mod.Class``); nothing is imported.

    Raises:
        ValueError: not identifiers joined by dots, or no dot at all.
    """
    if not CLASS_PATH_RE.match(value):
        raise ValueError(
            f"{value!r} is not a dotted class path; give the module and the class, e.g. my_pkg.models.MyModule"
        )
    return value


def _check_json_value(value: Any, where: str) -> Any:
    """``value`` with every mapping sorted by key, if it is plain JSON (null, bool, int, finite
    float, str, list, str-keyed mapping); spec.json must hold it as is."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a finite number (JSON has no NaN or infinity)")
        return value
    if isinstance(value, (list, tuple)):
        return [_check_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise ValueError(f"{where}: key {key!r} is not a string (JSON object keys are strings)")
        return {k: _check_json_value(value[k], f"{where}.{k}") for k in sorted(value)}
    raise ValueError(
        f"{where}: a {type(value).__name__} is not a JSON value; use null, true/false, numbers, strings, lists "
        "and mappings (quote dates and other YAML types)"
    )

def field_error(model: type[BaseModel], loc: tuple[str | int, ...], message: str, value: Any) -> ValidationError:
    """A ValidationError at ``loc`` (a field path below ``model``), for a rule a model validator
    checks across fields: pydantic prefixes the location like any field error, so the user sees
    the path of the field to change rather than the spec's root."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": message}), loc=loc, input=value)
    return ValidationError.from_exception_data(model.__name__, [detail])

def _omit_defaults(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if not (k in defaults and v == defaults[k])}
