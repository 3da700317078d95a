"""What a SLURM cluster says about itself, read from its client commands' output: the release
(``sinfo --version``), the controller's settings (``scontrol show config``), partitions and
their nodes (``sinfo --json``, or ``sinfo``'s text), the user's accounts and QOS (``sacctmgr``).

Pure: no I/O; :mod:`jobgen.backends.slurm.detect` runs the commands and hands the text in.
Every value read here is input from the cluster: a value that cannot be read becomes a note
naming the command and the line or JSON path (the record is left out), never an exception
other than :class:`InventoryError`, which names the same.

Sources of the formats (SchedMD's man pages and data_parser plugins, by release):

- ``sinfo --version`` / ``scontrol --version``: one line, ``slurm <MAJOR>.<MINOR>.<MICRO>``
  (Debian's packages print ``slurm-wlm``), sinfo(1) "-V".
- ``scontrol show config``: ``Name = value`` lines, scontrol(1) "show config"; read:
  ``ClusterName``, ``SelectType`` (slurm.conf(5)).
- ``sinfo --noheader --Node --format=...`` (:data:`SINFO_TEXT_FORMAT`): one line per node and
  partition, sinfo(1) "-o, --format": ``%N`` node name, ``%P`` partition (``*`` appended to the
  default one), ``%c`` CPUs, ``%m`` memory in megabytes (MiB), ``%G`` GRES, ``%f`` available
  features, ``%l`` MaxTime and ``%L`` DefaultTime (``days-hours:minutes:seconds``,
  ``infinite``, ``n/a``).
- ``sinfo --noheader --format=%R|%a`` (:data:`SINFO_AVAIL_ARGV`): one line per partition, its
  name and availability (``up``, ``down``, ``drain``, ``inact``), sinfo(1) "-o, --format".
- ``sinfo --json`` (21.08 and later; :func:`parse_sinfo_json`) in two shapes: up to 23.02
  (openapi/v0.0.38 in 22.05, data_parser/v0.0.39 in 23.02) a dump of ``nodes`` and
  ``partitions``; from 23.11 (data_parser/v0.0.40 - v0.0.43) ``sinfo``, one record per group
  of alike nodes of a partition, as sinfo's text groups them.
- ``sacctmgr --noheader --parsable2 show associations user=<u> format=Account,Partition,QOS``:
  ``|``-separated, sacctmgr(1) "--parsable2"; an empty Partition means every partition.
- GRES strings: ``name[:type][:count][(S:sockets)]``, comma-separated, gres.conf(5) and
  slurm.conf(5) "Gres".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from jobgen.errors import JobgenError, printable

#: ``sinfo`` in text: one line per node and partition, fields joined by :data:`SINFO_TEXT_SEP`.
SINFO_TEXT_FIELDS = ("%N", "%P", "%c", "%m", "%G", "%f", "%l", "%L")
SINFO_TEXT_SEP = "|"
SINFO_TEXT_FORMAT = SINFO_TEXT_SEP.join(SINFO_TEXT_FIELDS)
SINFO_TEXT_ARGV = ("sinfo", "--noheader", "--Node", f"--format={SINFO_TEXT_FORMAT}")
SINFO_JSON_ARGV = ("sinfo", "--json")
#: The first release whose sinfo prints JSON (``--json``, SLURM 21.08 NEWS).
SINFO_JSON_SINCE = (21, 8)


class InventoryError(JobgenError):
    """A cluster's output jobgen cannot read: names the command, the line or JSON path, the value."""


def clean(text: str) -> str:
    """``text`` fit for a terminal or a YAML comment: non-printable characters (newlines,
    escapes, bytes that were not UTF-8) as their Python escapes (:func:`jobgen.errors.printable`)."""
    return printable(text)


def not_plain(value: str) -> str | None:
    """Why ``value`` cannot go into a profile as it is (bytes that were not UTF-8, a line break,
    a NUL), or None when it can: quoting handles every other character."""
    if any("\udc80" <= ch <= "\udcff" for ch in value):
        return "bytes that are not UTF-8"
    if any(ch in value for ch in "\n\r\x00"):
        return "a line break or NUL byte"
    return None


# --------------------------------------------------------------------------- version, config


def parse_version(text: str) -> tuple[int, int, str] | None:
    """``(major, minor, release)`` from ``sinfo --version`` (``slurm 23.11.4`` -> ``(23, 11,
    "23.11.4")``), or None when the first line is not ``slurm[-wlm] <YY>.<MM>[...]``."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    match = re.fullmatch(r"slurm(?:-wlm)?\s+((\d{2})\.(\d{2})(?:\.\S+)?)\s*", first)
    if match is None:
        return None
    return int(match.group(2)), int(match.group(3)), match.group(1)


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Name = value`` lines as a mapping (other lines skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Za-z][A-Za-z0-9_]*)\s*=\s*(.*?)\s*", line)
        if match:
            out.setdefault(match.group(1), match.group(2))
    return out


# --------------------------------------------------------------------------- GRES, times


@dataclass(frozen=True)
class Gpus:
    """A node's GPUs: ``count`` of ``gpu_type`` (the GRES type, None when untyped)."""

    gpu_type: str | None
    count: int


def _split_top(text: str) -> list[str]:
    """``text`` split at commas outside parentheses (``gpu:a100:2(IDX:0,2),nvme:1``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")" and depth > 0
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


_COUNT_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def gpu_counts(gres: str) -> dict[str | None, int]:
    """Every GPU type of a node's GRES string and its count (None: untyped), e.g.
    ``gpu:a100:2(IDX:0,2),gpu:v100:1,nvme:1`` -> ``{"a100": 2, "v100": 1}``; ``gpu:8`` ->
    ``{None: 8}``; ``gpu`` -> one. Empty for none (``(null)``, empty, no ``gpu``). An item whose
    count is not a number, or that has a field too many (``name:type:extra:count``), is skipped."""
    counts: dict[str | None, int] = {}
    for item in _split_top(gres):
        item = re.sub(r"\(.*\)\s*$", "", item)
        parts = item.split(":")
        if parts[0].strip() != "gpu":
            continue
        gpu_type: str | None = None
        count = 1
        rest = parts[1:]
        if rest and re.fullmatch(r"\d+[KkMmGgTt]?", rest[-1].strip()):
            number = rest.pop().strip()
            suffix = number[-1].lower() if number[-1].isalpha() else ""
            count = int(number.rstrip("KkMmGgTt")) * _COUNT_SUFFIX[suffix]
        if len(rest) > 1:
            continue  # name:type:extra:count is no GRES form
        if rest:
            gpu_type = rest[0].strip() or None
        if count:
            counts[gpu_type] = counts.get(gpu_type, 0) + count
    return counts


def parse_gpus(gres: str) -> Gpus | None:
    """The GPUs of a node's GRES string (:func:`gpu_counts`), or None when it has none.

    ``gpu:a100:8(S:0-1),nvme:1`` -> ``Gpus("a100", 8)``; ``gpu:8`` -> ``Gpus(None, 8)``; ``gpu``
    -> one. A node with GPUs of several types gives the type it has most of (ties: the name
    first in sort order).
    """
    counts = gpu_counts(gres)
    if not counts:
        return None
    best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] or ""))[0]
    return Gpus(best[0], best[1])


def parse_minutes(text: str) -> int | None:
    """A SLURM time (sinfo ``%l``/``%L``, sbatch(1) "--time" forms: ``minutes``, ``minutes:seconds``,
    ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``,
    ``days-hours:minutes:seconds``) in whole minutes, rounded down (it is a limit), at least 1.
    None for no limit or none set (``infinite``, ``UNLIMITED``, ``n/a``, ``NONE``).

    Raises:
        ValueError: none of these forms.
    """
    value = text.strip()
    if value.lower() in ("infinite", "unlimited", "n/a", "none", ""):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if match is None:
        raise ValueError(f"{value!r} is not a SLURM time (days-hours:minutes:seconds)")
    days, a, b, c = match.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (nums + [0, 0])[:3]
        total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    elif len(nums) == 3:
        total = (nums[0] * 60 + nums[1]) * 60 + nums[2]
    elif len(nums) == 2:
        total = nums[0] * 60 + nums[1]
    else:
        total = nums[0] * 60
    return max(1, total // 60)


# --------------------------------------------------------------------------- partitions and nodes


@dataclass(frozen=True)
class Node:
    """One node as one partition sees it: ``cpus`` (CPUTot), ``memory_mib`` (RealMemory, MiB),
    ``gres`` (its GRES string), ``features`` (available features) and where it was read
    (``source``: the command and the line or JSON path)."""

    name: str
    cpus: int | None
    memory_mib: int | None
    gres: str
    features: tuple[str, ...]
    source: str

    @property
    def gpus(self) -> Gpus | None:
        return parse_gpus(self.gres)


@dataclass
class Partition:
    """A partition: its nodes, whether it is the default, MaxTime and DefaultTime in minutes
    (None: unlimited, or not set), and where each of those was read."""

    name: str
    nodes: list[Node] = field(default_factory=list)
    default: bool = False
    max_time_min: int | None = None
    default_time_min: int | None = None
    source: str = ""

    @property
    def gpu_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.gpus is not None]


@dataclass
class Inventory:
    """Partitions by name, in the order the command listed them, and notes on what was left out."""

    command: str
    partitions: dict[str, Partition] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def partition(self, name: str, source: str) -> Partition:
        if name not in self.partitions:
            self.partitions[name] = Partition(name, source=source)
        return self.partitions[name]


def _features(text: str) -> tuple[str, ...]:
    return tuple(f for f in (x.strip() for x in text.split(",")) if f and f != "(null)")


def _int_or_none(text: str) -> int | None:
    value = text.strip().rstrip("+")
    return int(value) if value.isdigit() else None


def parse_sinfo_text(text: str) -> Inventory:
    """``sinfo --noheader --Node --format=`` :data:`SINFO_TEXT_FORMAT` (one line per node and
    partition). A line without the 8 fields (a value holding ``|`` or a line break splits it)
    or with a time that is no SLURM time is left out with a note naming its line."""
    command = " ".join(SINFO_TEXT_ARGV)
    inv = Inventory(command)
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        cells = line.split(SINFO_TEXT_SEP)
        where = f"`{command}` line {number}"
        if len(cells) != len(SINFO_TEXT_FIELDS):
            inv.notes.append(f"{where} has {len(cells)} field(s), not {len(SINFO_TEXT_FIELDS)}: left out ({clean(line[:120])})")
            continue
        name, part, cpus, mem, gres, feats, max_time, def_time = cells
        default = part.endswith("*")
        part = part[:-1] if default else part
        try:
            max_min, def_min = parse_minutes(max_time), parse_minutes(def_time)
        except ValueError as exc:
            inv.notes.append(f"{where}: {clean(str(exc))}: left out")
            continue
        p = inv.partition(part, where)
        p.default = p.default or default
        p.max_time_min, p.default_time_min = max_min, def_min
        p.nodes.append(Node(name, _int_or_none(cpus), _int_or_none(mem), gres.strip(), _features(feats), where))
    return inv


#: Each partition's availability, one line each: ``%R`` (the name, no ``*``) and ``%a`` (``up``,
#: ``down``, ``drain``, ``inact``), sinfo(1) "-o, --format".
SINFO_AVAIL_ARGV = ("sinfo", "--noheader", f"--format=%R{SINFO_TEXT_SEP}%a")


def parse_partition_states(text: str) -> dict[str, str]:
    """``sinfo --noheader --format=%R|%a`` as ``{partition: availability}`` (lower case); a line
    that is not two fields (a name holding ``|`` or a line break) is skipped, so the partition
    it names reads as unknown."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        cells = line.split(SINFO_TEXT_SEP)
        if len(cells) == 2 and cells[0]:
            out.setdefault(cells[0], cells[1].strip().lower())
    return out


# --------------------------------------------------------------------------- sinfo --json


def _number(value: Any, path: str) -> int | None:
    """A count or time: a plain integer (22.05), or ``{"set", "infinite", "number"}`` (23.02 on);
    None for unset, infinite, or the NO_VAL/INFINITE sentinels (slurm.h: 0xfffffffe, 0xffffffff)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None:
            return None
        raise InventoryError(f"`sinfo --json`: {path} is {clean(json.dumps(value)[:80])}, not a number",
                             hint="report the SLURM release (sinfo --version) to jobgen; the text output is read with "
                                  "sinfo's --json unavailable")
    return None if value >= 0xFFFFFFFE else value


def _text(value: Any, path: str) -> str:
    """A string, or a list of strings (joined by commas, as 23.02 on lists features)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise InventoryError(f"`sinfo --json`: {path} is {clean(json.dumps(value)[:80])}, not a string",
                         hint="report the SLURM release (sinfo --version) to jobgen")


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _flags(value: Any) -> set[str]:
    return {str(v).upper() for v in value} if isinstance(value, list) else set()


def _time(doc: dict[str, Any], path: str, *candidates: tuple[str, ...]) -> int | None:
    for keys in candidates:
        value = _get(doc, *keys)
        if value is not None:
            return _number(value, f"{path}.{'.'.join(keys)}")
    return None


def _partition_info(inv: Inventory, doc: Any, path: str) -> Partition:
    """A partition record (``partitions[i]`` up to 23.02, ``sinfo[i].partition`` after): its name,
    MaxTime (``maximums.time``; 22.05 ``max_time_limit``), DefaultTime (``defaults.time``; 22.05
    ``default_time_limit``), and the default flag (``flags`` or ``partition.flags`` holding
    ``DEFAULT``, where the release prints one)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise InventoryError(f"`sinfo --json`: {path} has no partition name",
                             hint="report the SLURM release (sinfo --version) to jobgen")
    p = inv.partition(doc["name"], f"`sinfo --json` {path}")
    p.max_time_min = _time(doc, path, ("maximums", "time"), ("max_time_limit",), ("max_time",))
    p.default_time_min = _time(doc, path, ("defaults", "time"), ("default_time_limit",), ("default_time",))
    p.default = p.default or "DEFAULT" in _flags(doc.get("flags")) | _flags(_get(doc, "partition", "flags"))
    return p


def _node_record(doc: dict[str, Any], path: str) -> Node:
    name = doc.get("name") if isinstance(doc.get("name"), str) else doc.get("hostname")
    if not isinstance(name, str):
        raise InventoryError(f"`sinfo --json`: {path} has no node name", hint="report the SLURM release (sinfo --version) to jobgen")
    return Node(name, _number(doc.get("cpus"), f"{path}.cpus"), _number(doc.get("real_memory"), f"{path}.real_memory"),
                _text(doc.get("gres"), f"{path}.gres"), _features(_text(doc.get("features"), f"{path}.features")),
                f"`sinfo --json` {path}")


def parse_sinfo_json(text: str) -> Inventory | None:
    """``sinfo --json`` in either shape (see the module's docstring), or None for a document of
    another shape (a newer SLURM; the caller reads the text output instead).

    - ``nodes`` + ``partitions`` (22.05, 23.02): ``nodes[i]``: ``name``, ``cpus``, ``real_memory``
      (MiB), ``gres``, ``features`` (a string in 22.05, a list in 23.02), ``partitions`` (names);
      ``partitions[i]``: see :func:`_partition_info`.
    - ``sinfo`` (23.11 - 25.05): ``sinfo[i]``: ``partition`` (as above), ``nodes.nodes`` (names),
      ``cpus.minimum``, ``memory.minimum`` (MiB), ``gres.total``, ``features.total``.

    Numbers are plain (22.05) or ``{"set", "infinite", "number"}`` objects (23.02 on).

    Raises:
        InventoryError: not JSON, the document lists errors, or a field read here has another type.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InventoryError(f"`sinfo --json` printed no JSON document ({clean(str(exc))})",
                             hint="run `sinfo --json` yourself; jobgen reads its output") from None
    except RecursionError:
        raise InventoryError("`sinfo --json` printed a document nested too deep to read",
                             hint="run `sinfo --json` yourself; jobgen reads its output") from None
    if not isinstance(doc, dict):
        return None
    errors = doc.get("errors")
    if isinstance(errors, list) and errors:
        raise InventoryError(f"`sinfo --json` reports errors: {clean(json.dumps(errors)[:300])}",
                             hint="run `sinfo --json` yourself; jobgen reads its output")
    inv = Inventory(" ".join(SINFO_JSON_ARGV))
    if isinstance(doc.get("sinfo"), list):
        for i, rec in enumerate(doc["sinfo"]):
            path = f"sinfo[{i}]"
            if not isinstance(rec, dict):
                raise InventoryError(f"`sinfo --json`: {path} is not an object", hint="report the SLURM release to jobgen")
            p = _partition_info(inv, rec.get("partition"), f"{path}.partition")
            names = _get(rec, "nodes", "nodes")
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise InventoryError(f"`sinfo --json`: {path}.nodes.nodes is not a list of node names",
                                     hint="report the SLURM release (sinfo --version) to jobgen")
            cpus = _number(_get(rec, "cpus", "minimum"), f"{path}.cpus.minimum")
            mem = _number(_get(rec, "memory", "minimum"), f"{path}.memory.minimum")
            gres = _text(_get(rec, "gres", "total"), f"{path}.gres.total")
            feats = _features(_text(_get(rec, "features", "total"), f"{path}.features.total"))
            p.nodes.extend(Node(n, cpus, mem, gres, feats, f"`sinfo --json` {path}") for n in names)
        return inv
    if isinstance(doc.get("nodes"), list) and isinstance(doc.get("partitions"), list):
        for i, part in enumerate(doc["partitions"]):
            _partition_info(inv, part, f"partitions[{i}]")
        for i, rec in enumerate(doc["nodes"]):
            path = f"nodes[{i}]"
            if not isinstance(rec, dict):
                raise InventoryError(f"`sinfo --json`: {path} is not an object", hint="report the SLURM release to jobgen")
            node = _node_record(rec, path)
            parts = rec.get("partitions") or []
            if not isinstance(parts, list):
                parts = _features(_text(parts, f"{path}.partitions"))
            for name in parts:
                if isinstance(name, str):
                    inv.partition(name, f"`sinfo --json` {path}.partitions").nodes.append(node)
        return inv
    return None


# --------------------------------------------------------------------------- sacctmgr


def sacctmgr_argv(user: str) -> list[str]:
    """The user's associations: account, partition (empty: all) and QOS list, one per line."""
    return ["sacctmgr", "--noheader", "--parsable2", "show", "associations", f"user={user}", "format=Account,Partition,QOS"]


def parse_associations(text: str, partition: str) -> tuple[list[str], list[str]]:
    """``(accounts, qos)`` the user may use in ``partition`` (rows for it or for every
    partition), each sorted and without duplicates; lines that are not 3 fields are skipped."""
    accounts: set[str] = set()
    qos: set[str] = set()
    for line in text.split("\n"):
        cells = line.split("|")
        if len(cells) != 3 or cells[1] not in ("", partition) or not cells[0].strip():
            continue
        accounts.add(cells[0].strip())
        qos.update(q.strip() for q in cells[2].split(",") if q.strip())
    return sorted(accounts), sorted(qos)
