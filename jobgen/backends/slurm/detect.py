"""``jobgen profiles detect --scheduler slurm``: a cluster profile from what a SLURM login node's
client commands say (the readers: :mod:`jobgen.backends.slurm.inventory`).

Commands, in order (argv lists, no shell, 30 s each): ``sinfo --version`` (else ``scontrol
--version``), ``scontrol show config`` (ClusterName, SelectType), ``sinfo --json`` from SLURM
21.08 on (else, or when it fails or prints a shape jobgen does not read, ``sinfo``'s text
output), and ``sacctmgr`` for the user's accounts and QOS (skipped, with a comment, when it
does not answer: no slurmdbd).

Which partition: ``--partition``, else the only GPU partition, else (no GPU partition) the only
partition; several candidates are an error listing them. The profile takes the partition's
nodes of one GPU type and count (the shape most nodes have; ``--gpu-type`` narrows it to one
model): the smallest CPU count and memory among them, so a job fits on every one of them. A partition without GPUs
gives a CPU profile (one gloo rank per node, shared nodes, as ``slurm-cpu``).
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from jobgen.backends.base import run_command
from jobgen.backends.slurm.inventory import (
    SINFO_JSON_ARGV,
    SINFO_JSON_SINCE,
    SINFO_TEXT_ARGV,
    Inventory,
    InventoryError,
    Node,
    Partition,
    clean,
    not_plain,
    parse_associations,
    parse_config,
    parse_sinfo_json,
    parse_sinfo_text,
    parse_version,
    sacctmgr_argv,
)
from jobgen.errors import ConfigError, SubmitError, did_you_mean
from jobgen.specs.load import parse_yaml, validate
from jobgen.specs.profile import GPU_COMPUTE_CAPABILITY, ClusterProfile

#: Runs one command (argv) and returns its stdout, or raises SubmitError (see :func:`run_client`).
Runner = Callable[[list[str], str], str]

#: GPU models jobgen knows, as they appear in GRES types and node features (``a100``,
#: ``nvidia_a100-sxm4-80gb``, ``tesla_v100``): the first match, not inside a longer name.
_MODEL_RE = re.compile(r"(?<![a-z0-9])(h200|h100|b200|a100|a10g|l40s|l4|t4|v100)(?![0-9])")
#: Memory per GPU in GiB of the models that come in one size only (NVIDIA's data sheets).
_ONE_SIZE_GIB = {"T4": 16, "A10G": 24, "L4": 24, "L40S": 48, "H200": 141}
#: Node features that name the interconnect -> ``network_fabric``.
_FABRIC_FEATURES = {"ib": "infiniband", "infiniband": "infiniband", "hdr": "infiniband", "ndr": "infiniband",
                    "edr": "infiniband", "roce": "roce", "efa": "efa"}
#: The oldest SLURM with ``--gpus-per-node`` (select/cons_tres, SLURM 19.05 release notes).
GPUS_PER_NODE_SINCE = (19, 5)


def run_client(argv: list[str], what: str) -> str:
    """Run a SLURM client command and return its stdout, bytes that are not UTF-8 kept as lone
    surrogates (refused where a value is used, :func:`jobgen.backends.slurm.inventory.not_plain`).

    Raises:
        SubmitError: the command is missing, timed out or failed.
    """
    return run_command(argv, what=what, timeout_s=30, undecodable="surrogateescape").stdout


def gpu_model(text: str) -> str | None:
    """The jobgen GPU type named in ``text`` (a GRES type or a feature), e.g. ``nvidia_h100_80gb_hbm3``
    -> ``H100``; None when none is."""
    match = _MODEL_RE.search(text.lower())
    return match.group(1).upper() if match else None


def gpu_memory_gib(gres_type: str | None, model: str, what: str = "the GRES type") -> tuple[float | None, str]:
    """Memory per GPU: the size a GRES type (or another GPU name, called ``what`` in the reason)
    names (``nvidia_a100-sxm4-80gb`` -> 80), else the one size of a model sold in one
    (:data:`_ONE_SIZE_GIB`), else None; with the reason."""
    match = re.search(r"(?<![0-9])(\d{1,3})\s*gb?(?![a-z0-9])", (gres_type or "").lower())
    if match and 4 <= int(match.group(1)) <= 512:
        return float(match.group(1)), f"{what} {gres_type!r} names {match.group(1)} GB"
    if model in _ONE_SIZE_GIB:
        return float(_ONE_SIZE_GIB[model]), f"{model} comes in one size, {_ONE_SIZE_GIB[model]} GB"
    return None, f"{model} comes in several sizes and {what} does not say which: set gpu_mem_gib (GiB per GPU)"


@dataclass
class DetectedProfile:
    """A detected profile: its ``name`` (the file name), the document (``doc``, without
    ``name``, in file order), the source of each value (``sources``, by dotted path), the file's
    header comment lines and ``notes`` (what was left out or could not be read)."""

    name: str
    partition: str
    doc: dict[str, Any]
    sources: dict[str, str]
    header: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def scope(self) -> str:
        """What was profiled, for the CLI's one-line summary: the partition."""
        return f"partition {clean(self.partition)!r}"

    def yaml_text(self) -> str:
        """The profile file: the header, then every value under a comment naming its source.
        Values are written by ``yaml.safe_dump`` (quoted where YAML needs it); comments show
        non-printable characters escaped, so no value read from the cluster can end a comment."""
        out = [f"# {clean(line)}" for line in self.header]
        out += [f"# note: {clean(note)}" for note in self.notes]
        emit_commented(self.doc, self.sources, 0, "", out)
        return "\n".join(out) + "\n"

    def as_json(self) -> dict[str, Any]:
        """``-o json``: ``name``, ``partition``, ``profile`` (the document), ``sources`` and ``notes``
        (as the file's comments show them: non-printable characters escaped)."""
        return {"name": self.name, "partition": self.partition, "profile": self.doc,
                "sources": {path: clean(text) for path, text in self.sources.items()}, "notes": [clean(n) for n in self.notes]}


def emit_commented(doc: dict[str, Any], sources: dict[str, str], indent: int, prefix: str, out: list[str]) -> None:
    """Append ``doc``'s YAML lines to ``out`` at ``indent`` spaces, each value under the comment
    ``sources[dotted.path]`` (non-printable characters escaped); values by ``yaml.safe_dump``."""
    pad = " " * indent
    for key, value in doc.items():
        source = sources.get(prefix + key)
        if source:
            out.append(f"{pad}# {clean(source)}")
        if isinstance(value, dict):
            out.append(f"{pad}{key}:")
            emit_commented(value, sources, indent + 2, f"{prefix}{key}.", out)
            continue
        text = yaml.safe_dump({key: value}, sort_keys=False, allow_unicode=True, width=float("inf"), default_flow_style=False)
        out.extend(pad + line for line in text.rstrip("\n").split("\n"))


def _plain(value: str, what: str, source: str, hint: str) -> str:
    why = not_plain(value)
    if why:
        raise InventoryError(f"{what} {clean(value)!r} from {source} holds {why}; jobgen cannot write it into a profile",
                             location=source, hint=hint)
    return value


def read_version(run: Runner, notes: list[str]) -> tuple[tuple[int, int] | None, str | None, str]:
    """((major, minor), release, source) from ``sinfo --version``, else ``scontrol --version``."""
    for prog in ("sinfo", "scontrol"):
        try:
            text = run([prog, "--version"], f"{prog} --version")
        except SubmitError as exc:
            notes.append(f"`{prog} --version` failed: {exc.message.splitlines()[-1]}")
            continue
        found = parse_version(text)
        if found:
            return (found[0], found[1]), found[2], f"`{prog} --version` ({found[2]})"
        notes.append(f"`{prog} --version` printed {clean(text.strip()[:80])!r}, not `slurm <YY.MM>...`")
    return None, None, "no SLURM version (sinfo/scontrol --version did not print one)"


def read_inventory(run: Runner, version: tuple[int, int] | None, notes: list[str]) -> Inventory:
    """Partitions and nodes: ``sinfo --json`` where the release has it, else (or when it fails or
    prints a shape jobgen does not read) ``sinfo``'s text output.

    Raises:
        SubmitError: sinfo is missing or fails.
        InventoryError: sinfo's JSON has a field of the wrong type, or lists errors.
    """
    if version is not None and version >= SINFO_JSON_SINCE:
        try:
            text = run(list(SINFO_JSON_ARGV), "sinfo --json")
        except SubmitError as exc:
            notes.append(f"`sinfo --json` failed ({exc.message.splitlines()[-1][:160]}): read sinfo's text output instead")
        else:
            inv = parse_sinfo_json(text)
            if inv is not None:
                return inv
            notes.append("`sinfo --json` printed a document of a shape jobgen does not read: read sinfo's text output instead")
    inv = parse_sinfo_text(run(list(SINFO_TEXT_ARGV), "sinfo"))
    return inv


def choose_partition(inv: Inventory, wanted: str | None) -> Partition:
    """``wanted``, else the only GPU partition, else (no GPU partition) the only partition.

    Raises:
        ConfigError: ``wanted`` is not a partition, or several candidates (listed, with the default marked).
    """
    listed = [p for p in inv.partitions.values() if p.nodes]
    if wanted is not None:
        if wanted in inv.partitions and inv.partitions[wanted].nodes:
            return inv.partitions[wanted]
        names = [clean(p.name) for p in listed]
        raise ConfigError(f"--partition {clean(wanted)!r}: no such partition with nodes in `{inv.command}`; "
                          f"partitions: {', '.join(names) or '(none)'}", location="--partition",
                          hint=did_you_mean(wanted, names) or "pass one of the partitions listed")
    gpu = [p for p in listed if p.gpu_nodes]
    candidates = gpu or listed
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ConfigError(f"`{inv.command}` lists no partition with nodes", hint="run `sinfo` yourself: does this account see any partition?")
    shown = "; ".join(f"{clean(p.name)}{' (default)' if p.default else ''}: {_shape(p)}" for p in candidates)
    kind = "GPU partitions" if gpu else "partitions"
    raise ConfigError(f"this cluster has {len(candidates)} {kind}: {shown}", location="--partition",
                      hint="choose one with --partition NAME; run detect once per partition (with --out) for a profile each")


def _shape(p: Partition) -> str:
    gpus = sorted({f"{n.gpus.count}x {n.gpus.gpu_type or 'gpu'}" for n in p.gpu_nodes if n.gpus})
    return f"{len(p.nodes)} node(s)" + (f", {', '.join(gpus)}" if gpus else ", no GPUs")


def _gpu_group(p: Partition, gpu_type: str | None) -> tuple[str | None, list[Node], str]:
    """The GRES type to request and the nodes the profile describes: of the partition's GPU
    nodes grouped by GRES type and GPU count, the group with the most nodes (ties: the larger
    count, then the type's name); with ``gpu_type`` given, only groups whose type names that
    model (or is untyped) take part."""
    groups: dict[tuple[str | None, int], list[Node]] = {}
    for node in p.gpu_nodes:
        if node.gpus:
            groups.setdefault((node.gpus.gpu_type, node.gpus.count), []).append(node)
    if gpu_type is not None:
        groups = {key: ns for key, ns in groups.items() if key[0] is None or gpu_model(key[0]) == gpu_type}
        if not groups:
            types = sorted({str(n.gpus.gpu_type) for n in p.gpu_nodes if n.gpus})
            raise ConfigError(f"partition {clean(p.name)!r} has no {gpu_type} GPUs (GRES types: {clean(', '.join(types))})",
                              location="--gpu-type", hint="leave out --gpu-type, or choose another partition")
    (gres_type, count), nodes = sorted(groups.items(), key=lambda kv: (-len(kv[1]), -kv[0][1], kv[0][0] or ""))[0]
    others = len(p.gpu_nodes) - len(nodes)
    why = f"{len(nodes)} of partition {p.name}'s {len(p.nodes)} node(s) have {count} GPU(s) of GRES type {gres_type or '(untyped)'}"
    return gres_type, nodes, why + (f"; {others} GPU node(s) of other types or counts left out" if others else "")


def _smallest(nodes: list[Node], attr: str, what: str, p: Partition) -> tuple[int, Node]:
    known = [n for n in nodes if getattr(n, attr) is not None]
    if not known:
        raise InventoryError(f"no {what} for the nodes of partition {clean(p.name)!r} in {nodes[0].source}",
                             location=nodes[0].source, hint="run `sinfo -N -l` yourself; jobgen needs the nodes' CPUs and memory")
    node = min(known, key=lambda n: (getattr(n, attr), n.name))
    return getattr(node, attr), node


def _fabric(nodes: list[Node]) -> tuple[str, str]:
    found = {_FABRIC_FEATURES[f.lower()] for n in nodes for f in n.features if f.lower() in _FABRIC_FEATURES}
    every = [fab for fab in sorted(found) if all(any(_FABRIC_FEATURES.get(f.lower()) == fab for f in n.features) for n in nodes)]
    if len(every) == 1:
        return every[0], f"every node has a feature naming {every[0]} ({', '.join(k for k, v in _FABRIC_FEATURES.items() if v == every[0])})"
    return "tcp", "no interconnect feature (ib, infiniband, roce, efa) on every node: tcp; set infiniband, roce or efa if the nodes have it"


def _name(cluster: str, partition: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{cluster}-{partition}").strip("-.")[:64]
    return name or "slurm-detected"


def detect_slurm(*, partition: str | None = None, gpu_type: str | None = None, name: str | None = None,
                 user: str | None = None, run: Runner = run_client) -> DetectedProfile:
    """Detect a profile of one partition of the SLURM cluster this machine's client commands talk to.

    Args:
        partition: the partition; None: the only GPU partition, else the only partition.
        gpu_type: a jobgen GPU type (``A100``) for GPUs whose GRES type and features name none,
            or to choose that type's nodes in a mixed partition.
        name: the profile's name (the file's stem); None: ``<ClusterName>-<partition>``.
        user: whose accounts and QOS sacctmgr lists; None: this login.
        run: runs one command (tests pass fakes; default :func:`run_client`).

    Returns:
        The profile, validated by :class:`~jobgen.specs.profile.ClusterProfile` and read back
        from its YAML text unchanged.

    Raises:
        SubmitError: ``sinfo`` is missing or fails (not a SLURM login node).
        ConfigError: no such partition, several candidates, or GPUs of no known model.
        InventoryError: a value the profile needs is unreadable (its command and line or path named).
    """
    notes: list[str] = []
    sources: dict[str, str] = {}
    version, release, version_source = read_version(run, notes)
    try:
        config = parse_config(run(["scontrol", "show", "config"], "scontrol show config"))
    except SubmitError as exc:
        config = {}
        notes.append(f"`scontrol show config` failed ({exc.message.splitlines()[-1][:160]}): cluster name and SelectType unknown")
    inv = read_inventory(run, version, notes)
    notes.extend(inv.notes)
    p = choose_partition(inv, partition)
    _plain(p.name, "partition name", p.source, "choose another partition with --partition, or ask the admins to rename it")

    raw_cluster = config.get("ClusterName", "")
    cluster = re.sub(r"[^A-Za-z0-9._-]+", "-", raw_cluster).strip("-.")[:64] or "default"
    cluster_source = ("`scontrol show config` ClusterName" + ("" if cluster == raw_cluster else f" {clean(raw_cluster)!r}, "
                      "with characters other than letters, digits, '.', '_', '-' replaced") if raw_cluster
                      else "`scontrol show config` names no ClusterName: the label in job handles (slurm://<cluster>/<id>)")
    name = name or _name(cluster, p.name)

    doc: dict[str, Any] = {"description": "", "scheduler": "slurm"}
    slurm: dict[str, Any] = {"cluster": cluster, "partition": p.name}
    sources["slurm.cluster"] = cluster_source
    sources["slurm.partition"] = f"{p.source}" + (" (the default partition)" if p.default else "")
    gres_type: str | None = None
    if p.gpu_nodes:
        gres_type, nodes = _gpu_fields(p, gpu_type, doc, sources)
    else:
        nodes = p.nodes
        doc.update(max_nodes=len(nodes), default_nodes=1, gpus_per_node=0, cpu_processes_per_node=1)
        sources["max_nodes"] = f"partition {p.name} has {len(nodes)} node(s), none with GPUs (GRES): a CPU profile"
        sources["cpu_processes_per_node"] = "one gloo rank per node, as slurm-cpu; raise it for several ranks per node"
    cpus, cpu_node = _smallest(nodes, "cpus", "CPU count", p)
    mem_mib, mem_node = _smallest(nodes, "memory_mib", "memory size", p)
    # rounded down to 0.01 GiB: the --mem jobgen writes (whole MiB) never exceeds RealMemory
    mem_gib = int(mem_mib * 100 / 1024) / 100
    fabric, fabric_why = _fabric(nodes)
    doc.update(cpus_per_node=cpus, mem_gib_per_node=mem_gib, network_fabric=fabric)
    sources["cpus_per_node"] = f"CPUs of node {cpu_node.name} ({cpu_node.source}), the fewest of the {len(nodes)} node(s) profiled"
    sources["mem_gib_per_node"] = (f"RealMemory {mem_mib} MiB of node {mem_node.name} ({mem_node.source}), the least of the "
                                   f"{len(nodes)} node(s) profiled, in GiB rounded down")
    sources["network_fabric"] = fabric_why
    _time_fields(p, slurm, sources)
    slurm["version"] = None if version is None else f"{version[0]:02d}.{version[1]:02d}"
    sources["slurm.version"] = version_source
    if doc["gpus_per_node"]:
        slurm["gpu_request_style"], sources["slurm.gpu_request_style"] = request_style(version, release, config.get("SelectType", ""))
        slurm["gres_gpu_type"] = gres_type
        sources["slurm.gres_gpu_type"] = ("the GRES type of the nodes chosen, so the request lands on them" if gres_type
                                          else "the GRES is untyped: GPUs of any type")
    _accounts(run, p.name, user, slurm, sources)
    slurm["exclusive"] = bool(doc["gpus_per_node"])
    sources["slurm.exclusive"] = ("whole nodes for GPU jobs (one rank per GPU), as slurm-a100" if doc["gpus_per_node"]
                                  else "CPU nodes shared with other jobs, as slurm-cpu")
    doc["slurm"] = slurm
    shape = f"{doc['gpus_per_node']}x {doc['gpu_type']} per node" if doc["gpus_per_node"] else "CPU-only nodes"
    doc["description"] = f"SLURM {cluster}, partition {p.name}: {shape}, {len(nodes)} node(s) (detected)"
    header = [f"SLURM partition {p.name} of cluster {cluster}, detected by `jobgen profiles detect --scheduler slurm`",
              f"from `{inv.command}`, SLURM {release or '(version unknown)'}. The comment above each value names its source;",
              "edit it as any profile (docs/profiles.md, \"Detecting a profile\")."]
    found = DetectedProfile(name, p.name, doc, sources, header, notes)
    check_detected(found, hint="choose another partition with --partition, or write the profile by hand (docs/profiles.md)")
    return found


def _gpu_fields(p: Partition, gpu_type: str | None, doc: dict[str, Any], sources: dict[str, str]) -> tuple[str | None, list[Node]]:
    """The GPU fields of a GPU partition's profile (``max_nodes``, ``gpus_per_node``, ``gpu_type``,
    ``gpu_mem_gib``) into ``doc`` and ``sources``; returns the GRES type to request and the nodes
    profiled (:func:`_gpu_group`). The model: ``gpu_type`` (``--gpu-type``), else the one the GRES
    type names, else the one node feature naming a model.

    Raises:
        ConfigError: no model found (the hint names ``--gpu-type``).
        InventoryError: the GRES type holds a line break or bytes that are not UTF-8.
    """
    gres_type, nodes, why = _gpu_group(p, gpu_type)
    first = nodes[0]
    if gres_type is not None:
        _plain(gres_type, "GRES type", first.source, "pass --gpu-type for another type's nodes, or ask the admins")
    model, model_source = gpu_type, "--gpu-type"
    if model is None and gres_type is not None:
        model, model_source = gpu_model(gres_type), f"GRES type {gres_type!r} ({first.source})"
    if model is None:
        named = sorted({m for n in nodes for f in n.features if (m := gpu_model(f))})
        if len(named) == 1:
            model, model_source = named[0], f"node feature naming {named[0]} ({first.source})"
    if model is None:
        raise ConfigError(
            f"the GPUs of partition {clean(p.name)!r} (GRES {clean(first.gres)!r}, {first.source}) name no GPU model "
            "jobgen knows in their GRES type or features", location="--gpu-type",
            hint="pass --gpu-type, one of: " + ", ".join(GPU_COMPUTE_CAPABILITY))
    mem_gpu, mem_why = gpu_memory_gib(gres_type, model)
    doc.update(max_nodes=len(nodes), default_nodes=1, gpus_per_node=first.gpus.count if first.gpus else 0, gpu_type=model,
               gpu_mem_gib=mem_gpu)
    sources.update({"max_nodes": why, "gpus_per_node": f"GRES {first.gres!r} of node {first.name} ({first.source})",
                    "gpu_type": model_source, "gpu_mem_gib": mem_why})
    return gres_type, nodes


def _time_fields(p: Partition, slurm: dict[str, Any], sources: dict[str, str]) -> None:
    """``max_time_limit_min`` (MaxTime; null when UNLIMITED) and ``time_limit_min`` (DefaultTime,
    else an hour, never above MaxTime) into ``slurm`` and ``sources``."""
    slurm["max_time_limit_min"] = p.max_time_min
    sources["slurm.max_time_limit_min"] = (f"MaxTime of partition {p.name} ({p.source})" if p.max_time_min is not None
                                           else f"partition {p.name} has no MaxTime (UNLIMITED): not checked")
    limit = p.default_time_min or min(60, p.max_time_min or 60)
    slurm["time_limit_min"] = min(limit, p.max_time_min or limit)
    sources["slurm.time_limit_min"] = (f"DefaultTime of partition {p.name} ({p.source})" if p.default_time_min
                                       else "no DefaultTime: one hour, or MaxTime when shorter; a spec's resources.time_limit_min wins")


def request_style(version: tuple[int, int] | None, release: str | None, select: str) -> tuple[str, str]:
    """``gpu_request_style`` and why: ``gpus-per-node`` on SLURM >= 19.05 with
    ``SelectType=select/cons_tres`` (sbatch(1) "--gpus-per-node"; slurm.conf(5) "SelectType"),
    else ``gres`` (``--gres=gpu:<type>:<n>``, every release)."""
    if version is not None and version >= GPUS_PER_NODE_SINCE and select == "select/cons_tres":
        return "gpus-per-node", f"SLURM {release} with SelectType=select/cons_tres (`scontrol show config`): --gpus-per-node"
    why = ("the version is unknown" if version is None else
           f"SLURM {release} has no --gpus-per-node (19.05 and later)" if version < GPUS_PER_NODE_SINCE else
           f"SelectType is {clean(select) or 'unknown'}, and --gpus-per-node needs select/cons_tres")
    return "gres", "--gres=gpu:<type>:<n>, which every SLURM takes: " + why


def _accounts(run: Runner, partition: str, user: str | None, slurm: dict[str, Any], sources: dict[str, str]) -> None:
    """``slurm.account`` (the one account the user has for the partition, else null) and
    ``slurm.qos`` (null: the association's default) from ``sacctmgr``, with the lists found."""
    user = user or os.environ.get("USER") or os.environ.get("LOGNAME") or login_name()
    if not user:
        slurm["account"] = slurm["qos"] = None
        sources["slurm.account"] = "no login name ($USER, $LOGNAME, the password database) to ask sacctmgr for: SLURM's default account"
        sources["slurm.qos"] = "not read (no login name): the association's default QOS"
        return
    argv = sacctmgr_argv(user)
    try:
        text = run(argv, "sacctmgr show associations")
    except SubmitError as exc:
        slurm["account"] = slurm["qos"] = None
        why = exc.message.splitlines()[-1][:160]
        sources["slurm.account"] = f"`{' '.join(argv)}` did not answer ({why}): SLURM's default account"
        sources["slurm.qos"] = "not read (sacctmgr did not answer): the association's default QOS"
        return
    accounts, qos = parse_associations(text, partition)
    plain = [a for a in accounts if not not_plain(a)]
    slurm["account"] = plain[0] if len(plain) == 1 else None
    sources["slurm.account"] = (f"`{' '.join(argv)}`: " + (f"your only account for partition {partition}" if len(plain) == 1 else
                                f"accounts you may charge: {', '.join(accounts[:10]) or '(none)'}; null: your default account"))
    slurm["qos"] = None
    sources["slurm.qos"] = f"`sacctmgr`: QOS you may use: {', '.join(qos[:10]) or '(none listed)'}; null: the association's default"


def login_name() -> str | None:
    """This process's login name from the password database, or None where it has no entry
    (a container's uid): ``getpass.getuser`` raises then."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


def check_detected(found: Any, *, hint: str) -> None:
    """The YAML text reads back as the document, and the document is a valid profile.

    Args:
        found: a detected profile of any scheduler (``name``, ``scope``, ``doc``, ``yaml_text()``).
        hint: how to get around a value the profile model refuses (another partition, other hosts).

    Raises:
        InventoryError: either fails (a value from the cluster jobgen did not refuse before).
    """
    source = f"detected profile {found.name} ({found.scope})"
    try:
        loaded = parse_yaml(found.yaml_text(), source)
    except ConfigError as exc:
        raise InventoryError(f"{source}: its YAML does not read back: {exc.message}", hint="report this to jobgen") from None
    if loaded != found.doc:
        raise InventoryError(f"{source}: its YAML reads back differently", hint="report this to jobgen")
    try:
        validate(ClusterProfile, {**loaded, "name": found.name}, source)
    except ConfigError as exc:
        raise InventoryError(f"{source} is no valid profile: {exc.message}", location=exc.location,
                             hint=f"a value read from the cluster is refused by the profile model; {hint}") from None
