"""``jobgen doctor`` on a SLURM profile: the profile (and a spec's request) against what the
cluster's client commands say, read by the same readers as ``jobgen profiles detect``
(:mod:`jobgen.backends.slurm.detect`, :mod:`jobgen.backends.slurm.inventory`).

The checks, in order (each one line; ``fix`` names the profile or spec field to change):

1. ``slurm.client``: ``sinfo --version`` (else ``scontrol --version``), ``scontrol show
   config`` and the partitions (``sinfo --json``, else sinfo's text) answer; a profile asking
   for GPUs with ``--gpus-per-node``/``--gpus-per-task`` needs SLURM >= 19.05 with
   ``SelectType=select/cons_tres`` (sbatch(1), slurm.conf(5)).
2. ``slurm.partition``: the partition exists (``null``: the cluster's default) and is ``up``
   (``sinfo --format=%R|%a``).
3. ``slurm.account``, ``slurm.qos``: named ones are among the user's associations for the
   partition (``sacctmgr show associations``); skipped when sacctmgr does not answer (no slurmdbd).
4. ``slurm.gres``: some node of the partition has ``gpus_per_node`` GPUs of GRES type
   ``slurm.gres_gpu_type`` (gres.conf(5)); a CPU profile passes.
5. ``slurm.nodes``: ``max_nodes`` (and the job's node count) fit in the partition's nodes (of
   that GRES), enough of which have ``cpus_per_node`` CPUs and ``mem_gib_per_node`` memory.
6. ``slurm.time``: the job's time limit (the spec's, else ``slurm.time_limit_min``) and the
   profile's ``slurm.max_time_limit_min`` are within the partition's MaxTime.
7. ``slurm.test_only``: with a spec, ``sbatch --test-only`` of the rendered job, through
   ``jobgen submit --test-only``'s own path (:meth:`jobgen.backends.slurm.backend.SlurmBackend.submit`), in a
   temporary directory.
8. ``slurm.probe`` (``--probe``): a one-node job that imports the entrypoint (``jobgen.train``
   with torch and Lightning) with ``slurm.python`` and writes into the runs directory; cancelled
   when it outlasts the timeout.

Checks 3-6 need the partition (skipped when check 2 fails), ``slurm.nodes`` needs the GRES
nodes (skipped after ``slurm.gres``), and the two that submit (7, 8) run only when every
earlier check passed or was skipped, so one mismatch fails one line. Every value read from
the cluster is shown with ``repr`` (non-printable characters escaped, long values cut).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jobgen.backends.slurm.detect import login_name, read_inventory, read_version, request_style, run_client
from jobgen.backends.slurm.inventory import (
    SINFO_AVAIL_ARGV,
    Inventory,
    Node,
    Partition,
    gpu_counts,
    parse_associations,
    parse_config,
    parse_partition_states,
    sacctmgr_argv,
)
from jobgen.doctor import Check, DoctorContext, needs_probe, skipped_after
from jobgen.errors import JobgenError, SubmitError, did_you_mean, printable

#: The checks, in the order :func:`checks` yields them.
NAMES = ("slurm.client", "slurm.partition", "slurm.account", "slurm.qos", "slurm.gres", "slurm.nodes", "slurm.time",
         "slurm.test_only", "slurm.probe")
#: Lines of the probe job's output that carry its findings start with this.
PROBE_MARK = "jobgen-doctor:"
#: What the probe runs with ``slurm.python``: the entrypoint's imports (``jobgen.train`` itself
#: imports neither torch nor Lightning; ``jobgen.train.run`` does), then the interpreter and versions.
PROBE_IMPORT = ("import json, sys, torch, lightning, jobgen.train.run; "
                "print(json.dumps([sys.executable, torch.__version__, lightning.__version__]))")
#: The probe job's time limit in minutes (less when the partition's MaxTime is shorter).
PROBE_TIME_MIN = 5
#: Seconds between two looks at the probe job's state.
PROBE_POLL_S = 1.0
#: Seconds the probe's output may take to show up here after the job ended.
PROBE_SETTLE_S = 10.0
#: How many names a listing shows before "...".
_LISTED = 12


def shown(value: str, limit: int = 80) -> str:
    """A value read from the cluster, for one line of the report: ``repr`` (quotes; newlines,
    escapes and bytes that were not UTF-8 escaped), cut to ``limit`` characters."""
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


def yaml_scalar(value: str) -> str:
    """``value`` as the fix writes it into a profile line: bare when it is a plain word, else a
    JSON string (valid YAML, one line, every special character escaped)."""
    return value if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value) else json.dumps(value)


def listing(values: list[str]) -> str:
    """``values`` shown (:func:`shown`), comma-separated, at most :data:`_LISTED` of them."""
    if not values:
        return "(none)"
    more = f", ... ({len(values) - _LISTED} more)" if len(values) > _LISTED else ""
    return ", ".join(shown(v, 40) for v in values[:_LISTED]) + more


def closest(word: str, choices: list[str]) -> str | None:
    """The choice :func:`jobgen.errors.did_you_mean` suggests for ``word``, as the value itself."""
    import ast

    hint = did_you_mean(word, choices)
    return None if hint is None else ast.literal_eval(hint.removeprefix("did you mean ").removesuffix("?"))


def last_line(exc: JobgenError) -> str:
    """The last line of an error's message (a client command's own message), printable."""
    lines = [line for line in exc.message.splitlines() if line.strip()] or [exc.message]
    return printable(lines[-1].strip())[:300]


@dataclass
class Cluster:
    """What the client commands said: the release (``version`` as ``(major, minor)``), the
    controller's settings, the partitions and the notes on what could not be read."""

    version: tuple[int, int] | None
    release: str | None
    config: dict[str, str]
    inventory: Inventory
    notes: list[str] = field(default_factory=list)


def read_cluster() -> Cluster:
    """Version, ``scontrol show config`` and the partitions (as ``jobgen profiles detect`` reads them).

    Raises:
        SubmitError: sinfo/scontrol are missing, or the controller does not answer.
        InventoryError: sinfo's output cannot be read (the command and path named).
    """
    notes: list[str] = []
    version, release, _ = read_version(run_client, notes)
    if version is None:
        raise SubmitError("; ".join(printable(n) for n in notes) or "sinfo --version printed no SLURM version",
                          hint="run jobgen doctor on a login node of the cluster (sinfo, scontrol and sbatch on PATH; "
                               "SLURM_CONF set where the site needs it)")
    config = parse_config(run_client(["scontrol", "show", "config"], "scontrol show config"))
    inventory = read_inventory(run_client, version, notes)
    return Cluster(version, release, config, inventory, notes + inventory.notes)


def checks(ctx: DoctorContext) -> Iterator[Check]:
    """The SLURM checks of ``ctx`` (see the module's docstring), in order: one :class:`Check` each."""
    try:
        cluster = read_cluster()
    except JobgenError as exc:
        yield Check("slurm.client", "fail", f"the SLURM client commands did not answer: {last_line(exc)}",
                    exc.hint or "run jobgen doctor on a login node of the cluster")
        yield from (skipped_after(name, "slurm.client") for name in NAMES[1:])
        return
    found = [client_check(ctx, cluster)]
    partition_check, partition = check_partition(ctx, cluster)
    found.append(partition_check)
    yield from found
    if partition is None:
        yield from (skipped_after(name, "slurm.partition") for name in NAMES[2:])
        return
    later = [*association_checks(ctx, partition)]
    gres, gpu_nodes = gres_check(ctx, partition)
    later.append(gres)
    later.append(nodes_check(ctx, partition, gpu_nodes) if gres.status != "fail" else skipped_after("slurm.nodes", "slurm.gres"))
    later.append(time_check(ctx, partition))
    yield from later
    found += later
    failed = next((c.name for c in found if c.status == "fail"), None)
    if ctx.plan is None:
        test_only = Check("slurm.test_only", "skip", "no spec given: `jobgen doctor --profile P SPEC` lets sbatch --test-only check the job")
    elif failed:
        test_only = skipped_after("slurm.test_only", failed)
    else:
        test_only = test_only_check(ctx)
    yield test_only
    failed = failed or (test_only.name if test_only.status == "fail" else None)
    if not ctx.probe:
        yield needs_probe("slurm.probe", "a one-node job that imports jobgen.train with slurm.python and writes the runs directory")
    elif failed:
        yield skipped_after("slurm.probe", failed)
    else:
        yield probe_check(ctx, partition)


# --------------------------------------------------------------------------- 1. client


def client_check(ctx: DoctorContext, cluster: Cluster) -> Check:
    """``slurm.client``: the release and SelectType, and the profile's GPU request style against them."""
    s = ctx.profile.slurm_settings
    select = cluster.config.get("SelectType", "")
    detail = (f"SLURM {printable(cluster.release or '?')}, cluster {shown(cluster.config.get('ClusterName', ''))}, "
              f"SelectType {shown(select)}, partitions from `{cluster.inventory.command}`")
    left_out = cluster.inventory.notes
    if left_out:
        detail += f"; {len(left_out)} record(s) of its output left out (first: {printable(left_out[0])[:160]})"
    if s.version is not None and cluster.version is not None and s.version[:5] != f"{cluster.version[0]:02d}.{cluster.version[1]:02d}":
        detail += f" (the profile records slurm.version {s.version})"
    if ctx.profile.gpus_per_node and s.gpu_request_style != "gres":
        allowed, why = request_style(cluster.version, cluster.release, select)
        if allowed == "gres":
            return Check("slurm.client", "fail",
                         f"the profile requests GPUs with --{s.gpu_request_style}; {printable(why.split(': ', 1)[-1])}",
                         f"set slurm.gpu_request_style: gres in {ctx.profile_source} (--gres=gpu:<type>:<n> works on every SLURM)")
        detail += f"; --{s.gpu_request_style} is available"
    return Check("slurm.client", "pass", detail)


# --------------------------------------------------------------------------- 2. partition


def check_partition(ctx: DoctorContext, cluster: Cluster) -> tuple[Check, Partition | None]:
    """``slurm.partition`` and the partition (None when it failed): the profile's, or the
    cluster's default for ``slurm.partition: null``; it must list nodes and be ``up``."""
    s = ctx.profile.slurm_settings
    inv = cluster.inventory
    listed = [p for p in inv.partitions.values() if p.nodes]
    names = [p.name for p in listed]
    if s.partition is None:
        default = next((p for p in listed if p.default), None)
        if default is None:
            return Check("slurm.partition", "fail", f"the profile names no partition and the cluster has no default one "
                         f"(partitions: {listing(names)})",
                         f"set slurm.partition in {ctx.profile_source} to one of the partitions listed"), None
        partition, which = default, f"the default partition {shown(default.name)} (slurm.partition: null)"
    elif s.partition in inv.partitions and inv.partitions[s.partition].nodes:
        partition, which = inv.partitions[s.partition], f"partition {shown(s.partition)}"
    else:
        suggestion = closest(s.partition, names)
        fix = (f"set slurm.partition: {yaml_scalar(suggestion)} in {ctx.profile_source}" if suggestion
               else f"set slurm.partition in {ctx.profile_source} to one of the partitions listed")
        return Check("slurm.partition", "fail", f"no partition {shown(s.partition)} with nodes in `{inv.command}`; "
                     f"partitions: {listing(names)}" + (f" (did you mean {shown(suggestion)}?)" if suggestion else ""), fix), None
    try:
        states = parse_partition_states(run_client(list(SINFO_AVAIL_ARGV), "sinfo (partition availability)"))
    except SubmitError as exc:
        states, unknown = {}, f"availability unknown: {last_line(exc)}"
    else:
        unknown = "availability unknown: `sinfo --format=%R|%a` does not list it"
    state = states.get(partition.name)
    detail = f"{which}: {len(partition.nodes)} node(s), MaxTime {_minutes(partition.max_time_min)}"
    if state is not None and state != "up":
        return Check("slurm.partition", "fail", f"{which} is {shown(state)}, not up: SLURM starts no job there",
                     f"ask the cluster's admins when it is up again, or set slurm.partition in {ctx.profile_source} to another "
                     f"partition (up: {listing(sorted(n for n, st in states.items() if st == 'up'))})"), None
    return Check("slurm.partition", "pass", f"{detail}, {'up' if state == 'up' else unknown}"), partition


def _minutes(value: int | None) -> str:
    return "UNLIMITED" if value is None else f"{value} min"


# --------------------------------------------------------------------------- 3. account, QOS


def association_checks(ctx: DoctorContext, partition: Partition) -> list[Check]:
    """``slurm.account`` and ``slurm.qos``: each the profile names is among the user's
    associations for the partition (sacctmgr); skipped when unnamed or sacctmgr does not answer."""
    s = ctx.profile.slurm_settings
    wanted = {"account": s.account, "qos": s.qos}
    unnamed = {"account": "the profile names no account (slurm.account: null): SLURM charges your default account",
               "qos": "the profile names no QOS (slurm.qos: null): the association's default QOS"}
    if not any(wanted.values()):
        return [Check(f"slurm.{key}", "skip", unnamed[key]) for key in wanted]
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or login_name()
    why = None
    text = ""
    if not user:
        why = "no login name ($USER, $LOGNAME, the password database) to ask sacctmgr about"
    else:
        try:
            text = run_client(sacctmgr_argv(user), "sacctmgr show associations")
        except SubmitError as exc:
            why = f"`sacctmgr` did not answer ({last_line(exc)}): no accounting database (slurmdbd) to check against"
    out = []
    accounts, qos = parse_associations(text, partition.name) if why is None else ([], [])
    for key, found in (("account", accounts), ("qos", qos)):
        value = wanted[key]
        if value is None:
            out.append(Check(f"slurm.{key}", "skip", unnamed[key]))
        elif why is not None:
            out.append(Check(f"slurm.{key}", "skip", f"not checked: {why}"))
        elif value in found:
            out.append(Check(f"slurm.{key}", "pass", f"{key} {shown(value)} is among the associations of user {shown(user or '')} "
                             f"for partition {shown(partition.name)} (sacctmgr)"))
        else:
            suggestion = closest(value, found)
            label = "account" if key == "account" else "QOS"
            out.append(Check(f"slurm.{key}", "fail",
                             f"{label} {shown(value)} is not among the associations of user {shown(user or '')} for partition "
                             f"{shown(partition.name)}; sacctmgr lists: {listing(found)}"
                             + (f" (did you mean {shown(suggestion)}?)" if suggestion else ""),
                             f"set slurm.{key} in {ctx.profile_source} to one of those, or null for "
                             f"{'your default account' if key == 'account' else 'the default QOS'}"))
    return out


# --------------------------------------------------------------------------- 4. GRES


def gres_check(ctx: DoctorContext, partition: Partition) -> tuple[Check, list[Node]]:
    """``slurm.gres`` and the nodes a job of the profile can run on: those with ``gpus_per_node``
    GPUs of GRES type ``slurm.gres_gpu_type`` (any type when it is null); a CPU profile: every node."""
    want = ctx.profile.gpus_per_node
    gres_type = ctx.profile.slurm_settings.gres_gpu_type
    if not want:
        return Check("slurm.gres", "pass", f"CPU profile (gpus_per_node: 0): no GPUs requested; partition "
                     f"{shown(partition.name)} has {len(partition.gpu_nodes)} GPU node(s)"), list(partition.nodes)
    counts = {node.name: gpu_counts(node.gres) for node in partition.nodes}

    def has(node: Node) -> int:
        found = counts[node.name]
        return sum(found.values()) if gres_type is None else found.get(gres_type, 0)

    fitting = [n for n in partition.nodes if has(n) >= want]
    request = f"gpu:{gres_type}:{want}" if gres_type else f"gpu:{want}"
    if fitting:
        return Check("slurm.gres", "pass", f"{len(fitting)} of the {len(partition.nodes)} node(s) of partition "
                     f"{shown(partition.name)} have GRES {shown(request)}"), fitting
    shapes: dict[str, int] = {}
    for node in partition.nodes:
        for kind, count in counts[node.name].items():
            label = f"gpu:{kind}:{count}" if kind else f"gpu:{count}"
            shapes[label] = shapes.get(label, 0) + 1
    found = ", ".join(f"{shown(k, 40)} x{v}" for k, v in sorted(shapes.items())[:_LISTED]) or "no GPUs"
    types = {kind: max(c.get(kind, 0) for c in counts.values()) for c in counts.values() for kind in c}
    if gres_type is not None and gres_type in types:
        fix = f"set gpus_per_node: {types[gres_type]} in {ctx.profile_source} (the most GPUs of type {shown(gres_type)} a node has)"
    elif gres_type is not None and types:
        enough = sorted((k for k, v in types.items() if k is not None and v >= want), key=lambda k: -types[k])
        fix = (f"set slurm.gres_gpu_type: {yaml_scalar(enough[0])} in {ctx.profile_source}" if enough
               else f"set gpus_per_node and slurm.gres_gpu_type in {ctx.profile_source} to a shape listed")
        suggestion = closest(gres_type, [k for k in types if k is not None])
        fix += f" (did you mean {shown(suggestion)}?)" if suggestion and not enough else ""
    elif types:
        fix = f"set gpus_per_node: {max(sum(c.values()) for c in counts.values())} in {ctx.profile_source}"
    else:
        fix = f"set slurm.partition in {ctx.profile_source} to a partition with GPUs, or gpus_per_node: 0 for a CPU job"
    return Check("slurm.gres", "fail", f"no node of partition {shown(partition.name)} has GRES {shown(request)} "
                 f"(gres_gpu_type, gpus_per_node); it has: {found}", fix), []


# --------------------------------------------------------------------------- 5. nodes


def nodes_check(ctx: DoctorContext, partition: Partition, usable: list[Node]) -> Check:
    """``slurm.nodes``: the job's node count and ``max_nodes`` against the nodes it can run on
    (``usable``: of the GRES), and enough of them with ``cpus_per_node`` CPUs and
    ``mem_gib_per_node`` memory (the ``--mem`` jobgen writes: whole MiB)."""
    p = ctx.profile
    total = len(usable)
    of = f"partition {shown(partition.name)}" + (" with that GRES" if p.gpus_per_node else "")
    job_nodes = ctx.plan.world.num_nodes if ctx.plan is not None else None
    if job_nodes is not None and job_nodes > total:
        return Check("slurm.nodes", "fail", f"the job asks for {job_nodes} node(s); {of} has {total}",
                     f"set resources.nodes: {total} (or fewer) in {ctx.spec_path} (or --set resources.nodes={total})")
    if p.max_nodes > total:
        return Check("slurm.nodes", "fail", f"max_nodes: {p.max_nodes} in the profile; {of} has {total} node(s)",
                     f"set max_nodes: {total} in {ctx.profile_source}")
    mem_mib = int(p.mem_gib_per_node * 1024)
    few_cpus = [n for n in usable if n.cpus is not None and n.cpus < p.cpus_per_node]
    little_mem = [n for n in usable if n.memory_mib is not None and n.memory_mib < mem_mib]
    fitting = total - len({n.name for n in few_cpus + little_mem})
    needed = max(p.max_nodes, job_nodes or 0)
    if fitting < needed:
        fixes = []
        if few_cpus:
            fixes.append(f"cpus_per_node: {min(n.cpus for n in usable if n.cpus is not None)}")
        if little_mem:
            fixes.append(f"mem_gib_per_node: {int(min(n.memory_mib for n in usable if n.memory_mib is not None) * 100 / 1024) / 100}")
        smallest = (few_cpus + little_mem)[0]
        return Check("slurm.nodes", "fail",
                     f"{fitting} of the {total} node(s) of {of} have {p.cpus_per_node} CPUs and {mem_mib} MiB (cpus_per_node, "
                     f"mem_gib_per_node); {needed} are needed; node {shown(smallest.name)} has {smallest.cpus} CPUs, "
                     f"{smallest.memory_mib} MiB",
                     f"set {' and '.join(fixes)} in {ctx.profile_source} (the smallest node's), or lower max_nodes to {fitting}")
    unknown = sum(1 for n in usable if n.cpus is None or n.memory_mib is None)
    return Check("slurm.nodes", "pass", f"{total} node(s) in {of}, {fitting} with >= {p.cpus_per_node} CPUs and >= {mem_mib} MiB"
                 + (f" ({unknown} of unknown size)" if unknown else "") + f"; max_nodes {p.max_nodes}"
                 + (f", the job asks for {job_nodes}" if job_nodes is not None else ""))


# --------------------------------------------------------------------------- 6. time


def time_check(ctx: DoctorContext, partition: Partition) -> Check:
    """``slurm.time``: the job's time limit (with a spec: ``resources.time_limit_min``, else the
    profile's ``slurm.time_limit_min``, as ``#SBATCH --time``) and the profile's
    ``slurm.max_time_limit_min`` against the partition's MaxTime (slurm.conf(5) "MaxTime": a
    longer job is refused or left pending)."""
    s = ctx.profile.slurm_settings
    if ctx.plan is not None:
        minutes = ctx.plan.world.time_limit_min or s.time_limit_min
        asked = f"the job asks for {minutes} min (--time)"

        def fix_where(limit: int) -> str:
            return (f"set resources.time_limit_min: {limit} (or fewer) in {ctx.spec_path} (or --set "
                    f"resources.time_limit_min={limit}); the job resumes from its checkpoint after a requeue")
    else:
        minutes = s.time_limit_min
        asked = f"the profile's default time limit is {minutes} min (slurm.time_limit_min)"

        def fix_where(limit: int) -> str:
            return f"set slurm.time_limit_min: {limit} (or fewer) in {ctx.profile_source}"
    limit = partition.max_time_min
    name = shown(partition.name)
    if limit is None:
        return Check("slurm.time", "pass", f"{asked}; partition {name} has no MaxTime (UNLIMITED)")
    if minutes > limit:
        return Check("slurm.time", "fail", f"{asked}; the MaxTime of partition {name} is {limit} min",
                     fix_where(limit))
    if s.max_time_limit_min is not None and s.max_time_limit_min > limit:
        return Check("slurm.time", "fail", f"the profile says partition {name} allows {s.max_time_limit_min} min "
                     f"(slurm.max_time_limit_min); its MaxTime is {limit} min", f"set slurm.max_time_limit_min: {limit} in {ctx.profile_source}")
    recorded = "" if s.max_time_limit_min is not None else \
        f"; slurm.max_time_limit_min is null, so plans are not checked against it (set it to {limit})"
    return Check("slurm.time", "pass", f"{asked}; the MaxTime of partition {name} is {limit} min{recorded}")


# --------------------------------------------------------------------------- 7. sbatch --test-only


def test_only_check(ctx: DoctorContext) -> Check:
    """``slurm.test_only``: the plan written to a temporary directory and submitted with
    ``jobgen submit --test-only``'s code (:meth:`jobgen.backends.slurm.backend.SlurmBackend.submit`: secrets
    checked, the code's work tree looked at, ``sbatch --test-only``; SLURM checks the request and
    estimates a start, queueing nothing). Uncommitted changes are allowed here: submit refuses
    them on its own."""
    from jobgen.backends import get_backend
    from jobgen.backends.base import SubmitOptions

    assert ctx.plan is not None
    said: list[str] = []
    with tempfile.TemporaryDirectory(prefix="jobgen-doctor-") as tmp:
        job_dir = Path(tmp) / "job"
        ctx.plan.write(job_dir)
        try:
            get_backend("slurm").submit(job_dir, SubmitOptions(runs_dir=Path(tmp) / "runs", test_only=True, allow_dirty=True),
                                        said.append, plan=ctx.plan)
        except JobgenError as exc:
            return Check("slurm.test_only", "fail", f"sbatch --test-only refused the job: {last_line(exc)}",
                         exc.hint if exc.hint and "message is above" not in exc.hint
                         else "change what SLURM's message names (partition, account, QOS, time, nodes, GRES) in the profile or spec")
    answer = next((line for line in reversed("\n".join(said).splitlines()) if line.strip()), "(no message)")
    return Check("slurm.test_only", "pass", f"sbatch --test-only: {printable(answer.strip())[:300]}")


# --------------------------------------------------------------------------- 8. probe


def probe_script(ctx: DoctorContext, marker: Path) -> str:
    """The probe job's batch script: the node's name, the modules and ``env`` of the profile as
    job.sbatch sets them, ``<slurm.python> -c`` :data:`PROBE_IMPORT` (its last error lines on
    failure), and the job id written to ``marker`` in the runs directory. Every value is quoted
    (``shlex.quote``); findings are lines starting with :data:`PROBE_MARK`."""
    s = ctx.profile.slurm_settings
    q = shlex.quote
    lines = ["#!/bin/bash", "# Values from the profile are literals in single quotes (shlex.quote): nothing in them expands.",
             "# shellcheck disable=SC1003,SC2016", f'echo "{PROBE_MARK} node ${{SLURMD_NODENAME:-$(hostname)}}"']
    if s.modules:
        lines.append("module purge")
        lines += [f"module load {q(m)} || echo {q(f'{PROBE_MARK} module load {m} failed')}" for m in s.modules]
    lines += [f"export {key}={q(value)}" for key, value in ctx.profile.env.items()]
    python = q(s.python)
    lines += [
        f"if out=$({python} -c {q(PROBE_IMPORT)} 2>&1); then",
        f'    echo "{PROBE_MARK} import ok ${{out##*$\'\\n\'}}"',
        "else",
        f'    echo "{PROBE_MARK} import failed"',
        f"    printf '%s\\n' \"$out\" | tail -n 3 | sed 's/^/{PROBE_MARK} python: /'",
        "fi",
        f'if echo "${{SLURM_JOB_ID}}" > {q(str(marker))}; then echo "{PROBE_MARK} runs dir written"; '
        f'else echo "{PROBE_MARK} runs dir not writable"; fi',
    ]
    return "\n".join(lines) + "\n"


def probe_argv(ctx: DoctorContext, partition: Partition, probe_dir: Path, script: Path) -> list[str]:
    """``sbatch --parsable`` of the probe: one node, one task, the profile's partition, account,
    QOS, constraint and ``extra_sbatch_args``, one GPU of its GRES on a GPU profile (so it lands on
    a node of the kind the jobs use), a short time limit, output into ``probe_dir``."""
    from jobgen.backends.slurm.script import format_time_limit, gpu_directives

    s = ctx.profile.slurm_settings
    minutes = min(PROBE_TIME_MIN, partition.max_time_min or PROBE_TIME_MIN)
    argv = ["sbatch", "--parsable", "--job-name=jobgen-doctor-probe", f"--partition={partition.name}", "--nodes=1",
            f"--time={format_time_limit(minutes)}", f"--chdir={probe_dir}", f"--output={probe_dir}/probe-%j.out"]
    argv += [f"--account={s.account}"] if s.account else []
    argv += [f"--qos={s.qos}"] if s.qos else []
    argv += [f"--constraint={s.constraint}"] if s.constraint else []
    directives = gpu_directives(s, gpus_per_node=1, tasks_per_node=1, nodes=1) if ctx.profile.gpus_per_node else []
    argv += [f"--{option}" + ("" if value is None else f"={value}") for option, value in directives]
    argv += [] if any(option == "ntasks" for option, _ in directives) else ["--ntasks=1"]
    argv += list(s.extra_sbatch_args)
    return [*argv, str(script)]


def probe_check(ctx: DoctorContext, partition: Partition) -> Check:
    """``slurm.probe``: sbatch the probe (:func:`probe_script`) into a directory made for it under
    the runs directory, wait for it (``ctx.timeout_s``, queueing included; scancel on timeout),
    then read its output there: the compute node must have imported jobgen.train with
    ``slurm.python`` and written the runs directory, and this machine must see what it wrote.
    The probe's directory (and a runs directory made for it) is removed afterwards."""
    s = ctx.profile.slurm_settings
    if s.container.runtime != "none":
        return Check("slurm.probe", "skip", f"slurm.container.runtime is {s.container.runtime}: the probe does not start the "
                     "container; `jobgen submit SPEC --smoke 5` checks the image")
    runs = Path(ctx.runs_dir).resolve()
    for char in ("%", "\\"):
        if char in str(runs):
            return Check("slurm.probe", "fail", f"the runs directory {shown(str(runs))} holds {char!r}, which SLURM's output "
                         "file names do not take (sbatch(1), filename pattern)", "use another --runs-dir")
    made = [d for d in (runs, *runs.parents) if not d.exists()]
    with tempfile.TemporaryDirectory(prefix="jobgen-doctor-") as local:
        try:
            runs.mkdir(parents=True, exist_ok=True)
            probe_dir = Path(tempfile.mkdtemp(prefix=".jobgen-doctor-", dir=runs))
        except OSError as exc:
            return Check("slurm.probe", "fail", f"cannot write the runs directory {shown(str(runs))} here: "
                         f"{printable(exc.strerror or str(exc))}", "pass a --runs-dir you can write, on a filesystem the compute nodes share")
        try:
            script = Path(local) / "probe.sbatch"
            script.write_text(probe_script(ctx, probe_dir / "written-on-node"))
            return _run_probe(ctx, partition, probe_dir, script)
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
            for directory in made:  # innermost first: only those made here, and only while empty
                try:
                    directory.rmdir()
                except OSError:
                    break


def _run_probe(ctx: DoctorContext, partition: Partition, probe_dir: Path, script: Path) -> Check:
    from jobgen.backends import get_backend
    from jobgen.backends.base import SubmittedJob, run_command
    from jobgen.jobdir.submission import JobHandle

    try:
        answer = run_command(probe_argv(ctx, partition, probe_dir, script), what="sbatch (probe)", timeout_s=60,
                             undecodable="surrogateescape").stdout.strip()
    except SubmitError as exc:
        return Check("slurm.probe", "fail", f"sbatch refused the probe job: {last_line(exc)}",
                     "change what SLURM's message names in the profile (partition, account, QOS, constraint)")
    jid = answer.split(";", 1)[0]
    if not jid.isdigit():
        return Check("slurm.probe", "fail", f"sbatch printed {shown(answer)}, not a job id", "check the site's sbatch wrapper")
    job = SubmittedJob(JobHandle("slurm", f"{ctx.profile.slurm_settings.cluster}/{jid}"))  # no record: a probe is not recorded
    deadline = time.monotonic() + ctx.timeout_s
    state = get_backend("slurm").status(job)
    while not (state.finished or state.state == "UNKNOWN"):
        if time.monotonic() > deadline:
            try:
                run_command(["scancel", jid], what="scancel (probe)", timeout_s=30)
                cancelled = "cancelled"
            except SubmitError as exc:
                cancelled = f"scancel failed: {last_line(exc)}"
            reason = state.details.get("reason", "")
            return Check("slurm.probe", "fail", f"probe job {jid} still {state.state} after {ctx.timeout_s:g} s"
                         + (f" (reason {shown(reason)})" if reason else "") + f"; {cancelled}",
                         f"run it again with a longer --timeout, or see why it waits: squeue -j {jid} -o %R")
        time.sleep(PROBE_POLL_S)
        state = get_backend("slurm").status(job)
    output = probe_dir / f"probe-{jid}.out"
    # a shared filesystem may show the node's last writes a moment after the job ended
    settle = time.monotonic() + min(PROBE_SETTLE_S, max(deadline - time.monotonic(), 1.0))
    while time.monotonic() < settle and not (output.is_file() and "runs dir" in output.read_text(errors="replace")):
        time.sleep(PROBE_POLL_S)
    text = output.read_text(encoding="utf-8", errors="backslashreplace") if output.is_file() else None
    findings = [line[len(PROBE_MARK):].strip() for line in (text or "").splitlines() if line.startswith(PROBE_MARK)]
    node = next((f.split(" ", 1)[1] for f in findings if f.startswith("node ")), state.details.get("nodes", "") or "?")
    on = f"probe job {jid} ({state.state}) on node {shown(node)}"
    python = shown(ctx.profile.slurm_settings.python)
    if text is None:
        return Check("slurm.probe", "fail", f"{on} left no output in {shown(str(probe_dir))}: the node could not write the runs "
                     "directory, or this machine does not see what it wrote",
                     "pass a --runs-dir on a filesystem the login and compute nodes share (jobgen submit --runs-dir too)")
    if "import failed" in findings:
        error = next((f.split(": ", 1)[1] for f in reversed(findings) if f.startswith("python: ")), "(no message)")
        return Check("slurm.probe", "fail", f"{on}: {python} cannot import jobgen.train: {printable(error)[:200]}",
                     f"set slurm.python in {ctx.profile_source} to the compute nodes' interpreter with jobgen[train] "
                     "installed, or install it there (pip install 'jobgen[train]')")
    imported = next((f for f in findings if f.startswith("import ok")), None)
    if imported is None:
        return Check("slurm.probe", "fail", f"{on} did not get to the import (output: {shown(text.strip()[-200:])})",
                     f"read {output.name}'s lines above; check slurm.modules and env in {ctx.profile_source}")
    marker = probe_dir / "written-on-node"
    if "runs dir written" not in findings or not marker.is_file() or marker.read_text(errors="replace").strip() != jid:
        return Check("slurm.probe", "fail", f"{on}: the file it wrote into {shown(str(probe_dir))} is not here",
                     "pass a --runs-dir on a filesystem the login and compute nodes share (jobgen submit --runs-dir too)")
    try:
        interpreter, torch_version, lightning_version = (str(v) for v in json.loads(imported[len("import ok"):].strip()))
        found = f"torch {printable(torch_version)[:40]}, lightning {printable(lightning_version)[:40]}" + (
            "" if interpreter == ctx.profile.slurm_settings.python else f", {shown(interpreter, 120)}")
    except ValueError:
        found = shown(imported[len("import ok"):].strip(), 120)
    return Check("slurm.probe", "pass", f"{on}: {python} ({found}) imports jobgen.train; it wrote "
                 f"{shown(str(ctx.runs_dir))} and this machine sees it")
