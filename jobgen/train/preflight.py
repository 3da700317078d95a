"""Preflight: a short all-reduce across the whole allocation before training.

Turned on by the profile's ``preflight: true`` or ``jobgen submit --preflight`` (recorded as
``launch.preflight`` in spec.json). The entrypoint runs it before Lightning builds its Trainer;
a failure exits 1 with one line naming the node. Steps, every rank:

0. on a GPU profile, local rank zero of each node checks the node's GPUs with nvidia-smi
   (:mod:`jobgen.train.gpu_health`: a failed GPU exits 200, an infrastructure failure); on a CPU
   profile global rank zero says the check was skipped;

1. writes a marker ``<run_dir>/preflight/<attempt>/<rank>-<hostname>`` (best effort; on a shared
   run directory rank zero can then name a rank that started but never reached it);
2. joins a rendezvous: a TCPStore at MASTER_ADDR:MASTER_PORT (hosted by rank zero under srun,
   torchrun's agent store under torchrun), ``joined/<rank>`` = hostname. Rank zero waits up to
   ``launch.preflight_timeout_s`` for every rank; if one is missing it names its node (from the
   marker, else SLURM's node list) and every rank exits 1 with that line. A rank that cannot
   reach rank zero names itself;
3. initialises torch.distributed's default process group on that store (NCCL on GPUs, gloo on
   CPU, the backend and timeout Lightning would use); Lightning finds it initialised and uses it
   (``_init_dist_connection`` returns early), so no second rendezvous happens;
4. all-reduces a buffer (64 MiB on GPU, 4 MiB on CPU): 3 warm-up + 10 timed operations, timed
   on each rank; bus bandwidth = algbw x 2(n-1)/n (n = ranks; algbw = bytes / seconds per
   all-reduce, the nccl-tests definitions). Each rank's hostname and time go to rank zero, which
   prints one line per node (its slowest rank) and fails when a node's busbw is below half the
   median over the nodes (:data:`SLOW_FRACTION`). A watchdog ends the process (exit 1, one line)
   when init or the all-reduces take longer than the timeout.

A collective runs at the pace of its slowest link, so on a uniformly slow fabric every node shows
the same low figure (compare it with what the fabric should do); the rule catches a node whose
own ranks take much longer than the others'.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen.errors import EXIT_RUNTIME, JobgenError
from jobgen.events.notifier import RESTART_COUNT_ENV
from jobgen.specs.capabilities import capabilities

if TYPE_CHECKING:
    from jobgen.jobdir.spec import ResolvedSpec

#: A node is slow when its bus bandwidth is below this fraction of the median over the nodes.
SLOW_FRACTION = 0.5
#: Buffer sizes (bytes) of the all-reduce: GPU (NCCL) and CPU (gloo).
GPU_BYTES = 64 * 2**20
CPU_BYTES = 4 * 2**20
WARMUP = 3
ITERS = 10
#: How often rank zero looks for ranks that have joined (seconds).
_POLL_S = 0.2
#: A rank other than zero gives up connecting to the rendezvous after this fraction of the
#: timeout, so that its own "cannot reach" line is out before rank zero, waiting the whole
#: timeout, names it and exits: on SLURM rank zero's exit ends the step (srun
#: --kill-on-bad-exit=1) and would kill this rank before it could name itself.
CONNECT_FRACTION = 0.8
#: Seconds such a rank stays after the whole timeout, for rank zero's verdict to come out first.
LINGER_S = 10.0


class PreflightError(JobgenError):
    """The preflight failed: a node did not join, could not reach rank zero, or is slow.
    ``reported``: the rank already printed it (the entrypoint does not print it again)."""

    exit_code = EXIT_RUNTIME
    reported = False


# --------------------------------------------------------------------------- pure helpers


def expand_nodelist(text: str) -> list[str]:
    """Expand a SLURM host list (``node[1-3,07],gpu-a1``) into host names, in order."""
    hosts: list[str] = []
    for token in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", token)
        if not match:
            hosts.append(token)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for number in range(int(lo), int(hi or lo) + 1):
                for rest in expand_nodelist(suffix) if "[" in suffix else [suffix]:
                    hosts.append(f"{prefix}{number:0{width}d}{rest}")
    return hosts


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce (bytes/s): algbw x 2(n-1)/n, algbw = bytes / seconds."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class NodeResult:
    """One node's all-reduce figures: its slowest rank's time per operation and the bandwidths."""

    host: str
    ranks: tuple[int, ...]
    seconds: float
    algbw: float
    busbw: float


def node_results(times: Mapping[int, tuple[str, float]], nbytes: int, world_size: int) -> list[NodeResult]:
    """Per node (hostname), in order of its lowest rank: the slowest rank's seconds per all-reduce."""
    by_host: dict[str, list[int]] = {}
    for rank in sorted(times):
        by_host.setdefault(times[rank][0], []).append(rank)
    out = []
    for host, ranks in by_host.items():
        seconds = max(times[r][1] for r in ranks)
        out.append(NodeResult(host, tuple(ranks), seconds, nbytes / seconds, bus_bandwidth(nbytes, seconds, world_size)))
    return out


def slow_nodes(results: list[NodeResult], fraction: float = SLOW_FRACTION) -> tuple[list[NodeResult], float]:
    """The nodes whose busbw is below ``fraction`` x the median busbw over the nodes, and that median."""
    median = statistics.median(r.busbw for r in results)
    return [r for r in results if r.busbw < fraction * median], median


def _ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(r) for r in ranks)


def format_node_line(result: NodeResult) -> str:
    """``preflight: node1  ranks 0,1  busbw 12.34 GB/s  algbw 8.23 GB/s  (1.02 ms per all-reduce)``."""
    return (f"preflight: {result.host}  ranks {_ranks_text(result.ranks)}  busbw {result.busbw / 1e9:.2f} GB/s  "
            f"algbw {result.algbw / 1e9:.2f} GB/s  ({result.seconds * 1e3:.2f} ms per all-reduce)")


def attempt_id(environ: Mapping[str, str]) -> str:
    """This start of the job, as a key prefix of its own: ``slurm-<job>-<restart count>``,
    ``torchrun-<run id>-<restart count>``, else ``run`` (characters outside ``[A-Za-z0-9_.-]`` replaced);
    ``-r<n>`` added for a start jobgen restarted itself (``JOBGEN_RESTART_COUNT`` n > 0: local, ssh and
    Kubernetes restarts, where a static rendezvous gives every start the run id ``none``)."""
    if environ.get("SLURM_JOB_ID"):
        raw = f"slurm-{environ['SLURM_JOB_ID']}-{environ.get('SLURM_RESTART_COUNT') or 0}"
    elif environ.get("TORCHELASTIC_RUN_ID"):
        raw = f"torchrun-{environ['TORCHELASTIC_RUN_ID']}-{environ.get('TORCHELASTIC_RESTART_COUNT') or 0}"
    else:
        raw = "run"
    restarts = environ.get(RESTART_COUNT_ENV, "")
    if restarts.isdigit() and int(restarts) > 0:
        raw += f"-r{int(restarts)}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def missing_hosts(missing: list[int], marker_dir: Path, devices_per_node: int, environ: Mapping[str, str]) -> dict[int, tuple[str, bool]]:
    """rank -> (host name, whether it wrote a marker) for ranks that did not join: the marker's
    host, else the SLURM node list's node of that rank (block distribution), else ``rank <r>``."""
    markers: dict[int, str] = {}
    try:
        for path in marker_dir.iterdir():
            rank, _, host = path.name.partition("-")
            if rank.isdigit() and host:
                markers[int(rank)] = host
    except OSError:
        pass
    nodes = expand_nodelist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")
    out = {}
    for rank in missing:
        if rank in markers:
            out[rank] = (markers[rank], True)
        elif rank // devices_per_node < len(nodes):
            out[rank] = (nodes[rank // devices_per_node], False)
        else:
            out[rank] = (f"rank {rank} (host unknown)", False)
    return out


def missing_message(missing: dict[int, tuple[str, bool]], address: str, timeout_s: float, marker_dir: Path) -> str:
    """The one-line error when ranks did not join: names their nodes first."""
    hosts: dict[str, list[int]] = {}
    for rank, (host, _) in sorted(missing.items()):
        hosts.setdefault(host, []).append(rank)
    started = sorted({host for host, marked in missing.values() if marked})
    names = ", ".join(f"{host} (rank {_ranks_text(ranks)})" for host, ranks in hosts.items())
    node = "node" if len(hosts) == 1 else "nodes"
    detail = (f"{', '.join(started)} started (marker in {marker_dir}) but never reached rank 0: check the network "
              f"between {'it' if len(started) == 1 else 'them'} and {address}") if started else (
              f"no marker in {marker_dir}: not started there, or the run directory is not shared")
    return f"preflight: {node} {names} did not join the rendezvous at {address} within {timeout_s:g} s; {detail}"


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Place:
    """Where this process sits: ranks, world size and the rendezvous address."""

    rank: int
    world_size: int
    local_rank: int
    address: str
    port: int


def find_place(resolved: ResolvedSpec) -> Place:
    """This rank's place from the launcher, through the cluster environment Lightning will use
    (SLURMEnvironment under srun, TorchElasticEnvironment under torchrun).

    Raises:
        PreflightError: neither launcher's variables are set, or the world size disagrees with spec.json.
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    launch = resolved.launch
    env: Any
    if capabilities(launch.scheduler).slurm_allocation and SLURMEnvironment.detect():
        env = SLURMEnvironment()
    elif TorchElasticEnvironment.detect():
        env = TorchElasticEnvironment()
    else:
        raise PreflightError(
            "preflight: this process was not started by srun or torchrun (no SLURM_PROCID/RANK), so it cannot join the others",
            hint="launch through the rendered job (jobgen submit), or turn preflight off",
        )
    place = Place(env.global_rank(), env.world_size(), env.local_rank(), env.main_address, env.main_port)
    if place.world_size != launch.world_size:
        raise PreflightError(f"preflight: the launcher says world size {place.world_size}, spec.json says {launch.world_size}",
                             hint="submit the job as rendered (nodes x devices per node must match the allocation)")
    return place


def _connect(place: Place, host: str, timeout: datetime.timedelta) -> Any:
    from torch.distributed import TCPStore

    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    is_master = place.rank == 0 and not agent_store
    try:
        return TCPStore(place.address, place.port, place.world_size, is_master, timeout,
                        wait_for_workers=False, multi_tenant=is_master)
    except Exception as exc:  # noqa: BLE001 - DistNetworkError, RuntimeError, OSError: all mean "not reached"
        what = "cannot host" if is_master else "cannot reach"
        reason = " ".join(str(exc).split())[:200]
        raise PreflightError(
            f"preflight: node {host} (rank {place.rank}) {what} the rendezvous at {place.address}:{place.port} "
            f"within {timeout.total_seconds():g} s: {reason}",
            hint="check the network between this node and the first node (MASTER_ADDR), or the port",
        ) from None


class _Watchdog:
    """Ends the process (exit 1, one line on stderr) when the collectives outlive the timeout."""

    def __init__(self, timeout_s: float, describe: Callable[[], str], on_fire: Callable[[str], None]):
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True
        self.describe, self.on_fire = describe, on_fire

    def _fire(self) -> None:
        answer: list[str] = []

        def ask() -> None:
            try:
                answer.append(self.describe())
            except Exception as exc:  # noqa: BLE001 - the exit must happen whatever the store says
                answer.append(f"preflight: the all-reduce did not finish in time ({type(exc).__name__} while asking the others)")

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(10.0)  # the store may be as stuck as the collectives
        text = answer[0] if answer else "preflight: the all-reduce did not finish in time (the rendezvous store did not answer)"
        print(f"python -m jobgen.train: error: {text}", file=sys.stderr, flush=True)
        try:
            self.on_fire(text)
        finally:
            sys.stdout.flush()
            os._exit(EXIT_RUNTIME)

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def check_node_gpus(accelerator: str, devices_per_node: int, environ: Mapping[str, str], out: Callable[[str], None]) -> None:
    """Step 0 of the preflight: on a GPU profile, local rank zero (``SLURM_LOCALID``, else
    torchrun's ``LOCAL_RANK``) checks this node's GPUs and prints one line; on a CPU profile
    global rank zero (``SLURM_PROCID``, else ``RANK``) prints that the check was skipped.

    Raises:
        GPUHealthError: see :func:`jobgen.train.gpu_health.check_gpus`.
    """
    if accelerator != "gpu":
        if environ.get("SLURM_PROCID", environ.get("RANK", "0")) == "0":
            out("preflight: GPU check skipped: the profile's nodes have no GPUs")
        return
    if environ.get("SLURM_LOCALID", environ.get("LOCAL_RANK", "0")) != "0":
        return
    from jobgen.train.gpu_health import check_gpus

    out(check_gpus(devices_per_node, socket.gethostname(), environ))


def run_preflight(resolved: ResolvedSpec, run_dir: Path, environ: Mapping[str, str] = os.environ,
                  out: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
    """Run the preflight on this rank (every rank calls it); returns with torch.distributed's
    default process group initialised for Lightning to use, or raises.

    Raises:
        PreflightError: a node did not join in time, this node cannot reach rank zero, or a node
            is slow (see the module doc); the message names the node(s).
        GPUHealthError: this node's GPUs failed the check (exit 200; :mod:`jobgen.train.gpu_health`).
    """
    launch = resolved.launch
    check_node_gpus(launch.accelerator, launch.devices_per_node, environ, out)
    if launch.world_size == 1:
        out("preflight: 1 rank, no collective to test")
        return
    import torch
    import torch.distributed as dist

    begun = time.monotonic()
    timeout_s = float(launch.preflight_timeout_s)
    timeout = datetime.timedelta(seconds=timeout_s)
    place = find_place(resolved)
    host = socket.gethostname()
    attempt = attempt_id(environ)
    marker_dir = run_dir / "preflight" / attempt
    try:
        marker_dir.mkdir(parents=True, exist_ok=True)
        (marker_dir / f"{place.rank}-{host}").write_text(f"{os.getpid()}\n")
    except OSError:
        pass  # the marker only improves the message when a node is missing
    address = f"{place.address}:{place.port}"
    if place.rank == 0:
        out(f"preflight: {launch.world_size} ranks joining at {address} (timeout {timeout_s:g} s)")
    store = _connect_or_linger(place, host, timeout_s)
    store.set_timeout(timeout)  # waiting for rank zero's verdict: the whole timeout
    keys = dist.PrefixStore(f"jobgen-preflight/{attempt}", store)
    keys.set(f"joined/{place.rank}", host)
    verdict = _join_verdict(keys, place, host, begun + timeout_s, timeout_s, marker_dir, launch.devices_per_node, environ)
    if verdict:
        raise PreflightError(verdict)
    hosts = {r: keys.get(f"joined/{r}").decode() for r in range(place.world_size)}
    store.set_timeout(datetime.timedelta(minutes=30))  # later groups (Lightning's) get the usual patience

    def describe() -> str:
        return _stall_message(place, attempt, hosts, timeout_s)

    def on_fire(text: str) -> None:
        if resolved.spec.notify is not None:
            from jobgen.train.notify import notify_failure

            notify_failure(resolved, run_dir, text)

    gpu = launch.accelerator == "gpu"
    backend = "nccl" if gpu else "gloo"
    nbytes = GPU_BYTES if gpu else CPU_BYTES
    with _Watchdog(timeout_s, describe, on_fire):
        keys.set(f"stage/{place.rank}", "init")
        if gpu:
            torch.cuda.set_device(place.local_rank)
        device = torch.device("cuda", place.local_rank) if gpu else torch.device("cpu")
        dist.init_process_group(backend, store=dist.PrefixStore(f"jobgen-preflight/{attempt}/default_pg", store),
                                rank=place.rank, world_size=place.world_size, timeout=datetime.timedelta(minutes=30))
        try:
            _time_all_reduce(keys, place.rank, host, device, nbytes)
            if place.rank == 0:
                verdict = _judge(keys, place, nbytes, backend, out)
                if verdict:
                    _wait_for_acks(keys, "speed", list(range(1, place.world_size)))
            else:
                verdict = keys.get("verdict/speed").decode()
                keys.set(f"ack/speed/{place.rank}", "")
        except BaseException:
            dist.destroy_process_group()
            raise
    if verdict:
        dist.destroy_process_group()
        raise PreflightError(verdict)
    if place.rank == 0:
        out(f"preflight: ok in {time.monotonic() - begun:.1f} s")


def _connect_or_linger(place: Place, host: str, timeout_s: float) -> Any:
    """The preflight's store client (:func:`_connect`): rank zero waits ``timeout_s``, the others
    :data:`CONNECT_FRACTION` of it. A rank other than zero that cannot connect says so on stderr
    at once, then stays until rank zero has named its node too (rank zero waits the whole
    timeout): on SLURM the first rank to exit ends the step (srun ``--kill-on-bad-exit=1``), so
    exiting at once would cut rank zero's verdict off. Rank zero's exit ends this one.

    Raises:
        PreflightError: the store could not be reached in time (``reported`` set on ranks other
            than zero).
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        return _connect(place, host, timeout if place.rank == 0 else timeout * CONNECT_FRACTION)
    except PreflightError as exc:
        if place.rank == 0:
            raise
        print(f"python -m jobgen.train: error: {exc.message}; hint: {exc.hint}", file=sys.stderr, flush=True)
        exc.reported = True
        time.sleep((1 - CONNECT_FRACTION) * timeout_s + LINGER_S)
        raise


def _join_verdict(keys: Any, place: Place, host: str, deadline: float, timeout_s: float, marker_dir: Path,
                  devices_per_node: int, environ: Mapping[str, str]) -> str:
    """Whether every rank joined (``joined/<rank>`` keys): rank zero waits until ``deadline``
    (``time.monotonic()``) and writes the verdict, naming the missing ranks' hosts
    (:func:`missing_hosts`, :func:`missing_message`); the others read it and acknowledge. Returns
    ``""`` when all joined, else the message."""
    address = f"{place.address}:{place.port}"
    if place.rank != 0:
        try:
            verdict = keys.get("verdict/join").decode()
            keys.set(f"ack/join/{place.rank}", "")
            return verdict
        except Exception:  # noqa: BLE001 - rank zero went away or stayed silent
            return f"preflight: rank 0 at {address} gave no verdict within {timeout_s:g} s (seen from {host}, rank {place.rank})"
    wanted = [f"joined/{r}" for r in range(place.world_size)]
    while not keys.check(wanted) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    missing = [r for r in range(place.world_size) if not keys.check([f"joined/{r}"])]
    verdict = ""
    if missing:
        verdict = missing_message(missing_hosts(missing, marker_dir, devices_per_node, environ), address, timeout_s, marker_dir)
    keys.set("verdict/join", verdict)
    if verdict:
        _wait_for_acks(keys, "join", [r for r in range(1, place.world_size) if r not in missing])
    return verdict


def _stall_message(place: Place, attempt: str, hosts: dict[int, str], timeout_s: float) -> str:
    """What the watchdog says when the all-reduce did not finish in time: the stage each rank
    reached (``stage/<rank>`` keys), and the node(s) furthest behind, read through a store client
    of its own (the main thread may be blocked inside the store's client)."""
    import torch.distributed as dist
    from torch.distributed import TCPStore

    probe = dist.PrefixStore(f"jobgen-preflight/{attempt}", TCPStore(place.address, place.port, place.world_size, False,
                                                                     datetime.timedelta(seconds=5), wait_for_workers=False))
    stages = {r: (probe.get(f"stage/{r}").decode() if probe.check([f"stage/{r}"]) else "joined") for r in hosts}
    order = ["joined", "init", "warmup", "timed", "done"]
    behind = min(order.index(s) for s in stages.values())
    late = sorted({hosts[r] for r, s in stages.items() if order.index(s) == behind})
    everyone = len(late) == len(set(hosts.values()))
    where = "every node" if everyone else "node(s) " + ", ".join(late)
    return (f"preflight: the all-reduce across {place.world_size} ranks did not finish within {timeout_s:g} s; "
            f"{where} stuck at '{order[behind]}'" + (" (the network between the nodes?)" if everyone else ""))


def _time_all_reduce(keys: Any, rank: int, host: str, device: Any, nbytes: int) -> None:
    """Time :data:`ITERS` all-reduces of ``nbytes`` on ``device`` after :data:`WARMUP` ones and a
    barrier; record the stage reached (``stage/<rank>``) and the mean seconds
    (``result/<rank>``) in ``keys``."""
    import torch
    import torch.distributed as dist

    gpu = device.type == "cuda"
    buffer = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    keys.set(f"stage/{rank}", "warmup")
    for _ in range(WARMUP):
        dist.all_reduce(buffer)
    dist.barrier()
    if gpu:
        torch.cuda.synchronize(device)
    keys.set(f"stage/{rank}", "timed")
    t0 = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(buffer)
    if gpu:
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - t0) / ITERS
    keys.set(f"result/{rank}", json.dumps({"host": host, "seconds": seconds}))
    keys.set(f"stage/{rank}", "done")


def _wait_for_acks(keys: Any, what: str, ranks: list[int], timeout_s: float = 5.0) -> None:
    """Rank zero, before it exits on a failed verdict: let the other ranks read it first (its
    store goes away with it), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    wanted = [f"ack/{what}/{r}" for r in ranks]
    while wanted and not keys.check(wanted) and time.monotonic() < deadline:
        time.sleep(0.05)


def _judge(keys: Any, place: Place, nbytes: int, backend: str, out: Callable[[str], None]) -> str:
    """Rank zero: gather every rank's time, print one line per node, decide; tells the others."""
    times = {}
    for r in range(place.world_size):
        got = json.loads(keys.get(f"result/{r}").decode())
        times[r] = (got["host"], float(got["seconds"]))
    results = node_results(times, nbytes, place.world_size)
    out(f"preflight: all-reduce of {nbytes // 2**20} MiB over {place.world_size} ranks on {len(results)} node(s) "
        f"({backend}; {WARMUP} warm-up + {ITERS} timed; busbw = algbw x 2(n-1)/n)")
    for result in results:
        out(format_node_line(result))
    slow, median = slow_nodes(results)
    verdict = ""
    if slow:
        names = ", ".join(f"{r.host} ({r.busbw / 1e9:.2f} GB/s)" for r in slow)
        verdict = (f"preflight: slow {'node' if len(slow) == 1 else 'nodes'} {names}: below {SLOW_FRACTION:g} x the median "
                   f"bus bandwidth over the nodes ({median / 1e9:.2f} GB/s)")
    keys.set("verdict/speed", verdict)
    return verdict
