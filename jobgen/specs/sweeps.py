"""Sweeps: a Cartesian grid of spec override values, one job per point.

An axis is a spec field path and its values as text (:class:`SweepAxis`), written as
``key.path=v1,v2,...`` (``--sweep``, or ``sweep:`` in ``jobgen.yaml``, which also takes a mapping);
each point is applied through the same override path as ``--set``. :func:`sweep_job_names` gives
every point a readable, DNS-1035-safe, collision-proof job name. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobgen.errors import ConfigError
from jobgen.specs.training import MAX_NAME

#: Short names of common spec fields in sweep job names (``quickstart-lr1e-4-mbs4``); other
#: fields use their last path segment without underscores.
SWEEP_ABBREVIATIONS: dict[str, str] = {
    "learning_rate": "lr",
    "micro_batch_size": "mbs",
    "gradient_accumulation_steps": "gas",
    "global_batch_size": "gbs",
    "max_steps": "steps",
    "warmup_steps": "warmup",
    "weight_decay": "wd",
    "gradient_clip_val": "clip",
    "devices_per_node": "dpn",
    "time_limit_min": "time",
    "fsdp_sharding_strategy": "shard",
    "offload_optimizer": "offopt",
    "offload_params": "offparam",
    "val_fraction": "valfrac",
    "max_bytes": "bytes",
    "block_size": "ctx",
    "d_model": "dmodel",
    "n_layer": "layers",
    "n_head": "heads",
    "every_n_steps": "ckpt",
}


@dataclass(frozen=True)
class SweepAxis:
    """One sweep axis: a spec field path and its values, as text (parsed as YAML when applied,
    exactly like ``--set key.path=value``)."""

    key: str
    values: tuple[str, ...]


_CLOSER = {"[": "]", "{": "}"}


def _quoted_end(raw: str, start: int) -> int:
    """The index after the YAML quoted scalar opening at ``raw[start]`` (``'...'`` with ``''``
    for a quote inside, ``"..."`` with backslash escapes); raises ValueError when it never closes."""
    quote, i = raw[start], start + 1
    while i < len(raw):
        if quote == '"' and raw[i] == "\\":
            i += 2
            continue
        if raw[i] == quote:
            if quote == "'" and raw[i + 1:i + 2] == "'":
                i += 2
                continue
            return i + 1
        i += 1
    raise ValueError(f"sweep value {raw[start:]!r} opens a quote ({quote}) that is never closed (unterminated quote); "
                     "close it, or leave quotes out: a quote inside a word is an ordinary character")


def _split_values(raw: str) -> list[str]:
    """Split ``v1,v2,...`` into values (docs/sweeps.md): at commas, except inside ``[...]`` or
    ``{...}`` (which must balance) and inside a quoted string (YAML ``'...'`` or ``"..."``) that
    begins a value or an item of a ``[...]``/``{...}``. A quote inside a word (``a'b``) is an
    ordinary character. Raises ValueError for an unterminated quote or unbalanced brackets."""
    values: list[str] = []
    current: list[str] = []
    open_brackets: list[str] = []
    token_start = True  # only blanks since the value's start, or since [ { , (or : inside brackets)
    i = 0
    while i < len(raw):
        char = raw[i]
        if char in "'\"" and token_start:
            end = _quoted_end(raw, i)
            current.append(raw[i:end])
            i, token_start = end, False
            continue
        if char in _CLOSER:
            open_brackets.append(char)
        elif char in "]}":
            if not open_brackets or _CLOSER[open_brackets.pop()] != char:
                raise ValueError(f"sweep values {raw!r}: unbalanced {char!r}; a value that is a list or mapping needs "
                                 "matching brackets ([a, b] or {k: v})")
        elif char == "," and not open_brackets:
            values.append("".join(current).strip())
            current, token_start, i = [], True, i + 1
            continue
        current.append(char)
        token_start = char in "[{," or (char == ":" and bool(open_brackets)) or (char.isspace() and token_start)
        i += 1
    if open_brackets:
        raise ValueError(f"sweep values {raw!r}: unclosed {open_brackets[-1]!r}; close it with {_CLOSER[open_brackets[-1]]!r}")
    values.append("".join(current).strip())
    return values


def _check_axis(key: str, values: Sequence[str]) -> SweepAxis:
    """Validate one axis; raises ValueError (pydantic turns it into a located error)."""
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"sweep key {key!r} is not a key.path (e.g. trainer.learning_rate)")
    if key == "name":
        raise ValueError("'name' cannot be swept: sweep jobs are named <name>-<values>; set the base name with set/--set name=...")
    if not values or any(v == "" for v in values):
        raise ValueError(f"sweep {key!r} needs one or more non-empty values (e.g. {key}=1,2)")
    dupes = sorted({v for v in values if list(values).count(v) > 1})
    if dupes:
        raise ValueError(f"sweep {key!r} lists {', '.join(dupes)} more than once")
    return SweepAxis(key, tuple(values))


def _axis_from_text(text: str) -> SweepAxis:
    """``key.path=v1,v2,...`` as an axis; raises ValueError (see :func:`parse_sweep`)."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise ValueError(f"sweep {text!r} is not key.path=v1,v2,...")
    return _check_axis(key.strip(), _split_values(raw))


def _repeated_key(axes: Sequence[SweepAxis]) -> str | None:
    """The first (sorted) key that two axes share, or None."""
    keys = [a.key for a in axes]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    return repeated[0] if repeated else None


def parse_sweep(text: str, source: str = "--sweep") -> SweepAxis:
    """Parse ``key.path=v1,v2,...`` (values split as :func:`_split_values` says).

    Raises:
        ConfigError: no ``=``, an empty key segment, ``name`` as key, an empty or repeated value,
            an unterminated quote or unbalanced brackets.
    """
    try:
        return _axis_from_text(text)
    except ValueError as exc:
        raise ConfigError(str(exc), location=source, hint="e.g. --sweep trainer.learning_rate=1e-4,3e-4; how values split: "
                          "docs/sweeps.md") from None


def _scalar_text(value: str | bool | int | float) -> str:
    """A YAML scalar from a parsed mapping as override text (``True`` -> ``true``, ``0.0003`` -> ``0.0003``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


def parse_axes(sweep: Sequence[str] | Mapping[str, Sequence[Any]]) -> tuple[SweepAxis, ...]:
    """A whole sweep, in the order written: ``key.path=v1,v2`` strings, or a mapping of key path
    to a list of values (YAML scalars, spelt back as override text).

    Raises:
        ValueError: an axis is malformed (see :func:`parse_sweep`) or a key repeats.
    """
    if isinstance(sweep, Mapping):
        axes = [_check_axis(k, [_scalar_text(v) for v in values]) for k, values in sweep.items()]
    else:
        axes = [_axis_from_text(text) for text in sweep]
    repeated = _repeated_key(axes)
    if repeated:
        raise ValueError(f"sweep key {repeated!r} is given twice")
    return tuple(axes)


def sweep_points(axes: Sequence[SweepAxis]) -> list[tuple[tuple[str, str], ...]]:
    """The Cartesian grid of ``axes`` in a fixed order (first axis slowest): one
    ``((key, value), ...)`` tuple per job. No axes: one empty point.

    Raises:
        ConfigError: the same key in two axes.
    """
    repeated = _repeated_key(axes)
    if repeated:
        raise ConfigError(f"sweep key {repeated!r} is given twice", hint="give all its values in one sweep: key=v1,v2,...")
    keys = [a.key for a in axes]
    return [tuple(zip(keys, combo, strict=True)) for combo in itertools.product(*(a.values for a in axes))]


def _abbreviation(key: str) -> str:
    last = key.rsplit(".", 1)[-1]
    return SWEEP_ABBREVIATIONS.get(last) or re.sub(r"[^a-z0-9]+", "", last.lower()) or "x"


_EXACT_TOKEN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_DECIMAL = re.compile(r"^[0-9]*\.[0-9]+(e-?[0-9]+)?$")


def _value_token(text: str) -> tuple[str, bool]:
    """``(token, faithful)``: a name-safe token for a sweep value. Faithful: the text itself when
    it is ``[a-z0-9-]`` (``1e-4``, ``bf16-mixed``), or a decimal number with ``.`` written as
    ``p`` (``0.0003`` -> ``0p0003``). Anything else is lowercased with other runs as ``-`` and is
    not faithful (``FULL_SHARD``, ``-1``, ``[a, b]``): the name then carries a hash."""
    if _EXACT_TOKEN.match(text):
        return text, True
    if _DECIMAL.match(text):
        return text.replace(".", "p"), True
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x", False


def _point_hash(base: str, point: Sequence[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps([base, [list(kv) for kv in point]]).encode()).hexdigest()[:8]


def sweep_job_names(base: str, points: Sequence[Sequence[tuple[str, str]]]) -> list[str]:
    """Job names for the sweep ``points`` of a spec named ``base``, in the same order.

    ``<base>-<abbr><value>-...`` (``quickstart-lr1e-4-mbs4``): each key's short name (see
    :data:`SWEEP_ABBREVIATIONS`) followed by the value's token (``0.0003`` -> ``0p0003``). A
    name is suffixed with ``-`` and 8 hex digits of sha256(base, point) when a token does not
    spell its value faithfully (``FULL_SHARD`` -> ``full-shard``, ``-1`` -> ``1``: never a
    silently mangled name), when another value of the same key gives the same token (``0.5``
    and ``0p5``), when two points would otherwise get the same name, or when the name is longer
    than :data:`~jobgen.specs.training.MAX_NAME` (48) characters (the readable part is truncated). A base that is a DNS-1035 label thus gives DNS-1035 names.
    A name depends on its point, and on the other values of the grid only when two values of
    one key share a token.

    Raises:
        ConfigError: two points still share a name (only possible through a hash collision).
    """
    if not points or not points[0]:
        return [base for _ in points]
    keys = [k for k, _ in points[0]]
    short = [_abbreviation(k) for k in keys]
    # Two keys with the same short name (model.dropout, x.dropout): spell their paths out.
    abbrs = [re.sub(r"[^a-z0-9]+", "-", k.lower()).strip("-") if short.count(a) > 1 else a for k, a in zip(keys, short, strict=True)]
    needs_hash: set[tuple[int, str]] = set()
    for i in range(len(keys)):
        values = sorted({dict(p)[keys[i]] for p in points})
        tokens = [_value_token(v) for v in values]
        needs_hash |= {(i, v) for v, (t, faithful) in zip(values, tokens, strict=True)
                       if not faithful or [u for u, _ in tokens].count(t) > 1}
    names = []
    for point in points:
        readable = "-".join([base, *(a + _value_token(v)[0] for a, (_, v) in zip(abbrs, point, strict=True))])
        hashed = any((i, v) in needs_hash for i, (_, v) in enumerate(point)) or len(readable) > MAX_NAME
        names.append((readable, hashed, point))
    counts = {r: sum(1 for o, _, _ in names if o == r) for r, _, _ in names}
    out = []
    for readable, hashed, point in names:
        if hashed or counts[readable] > 1:
            readable = f"{readable[: MAX_NAME - 9].rstrip('-')}-{_point_hash(base, point)}"
        out.append(readable)
    if len(set(out)) != len(out):
        raise ConfigError(f"sweep of {base!r} gives two jobs the same name", hint="spell the sweep values differently")
    return out
