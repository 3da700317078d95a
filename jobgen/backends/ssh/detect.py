"""``jobgen profiles detect --scheduler ssh``: a cluster profile from what each host says over ssh,
and the per-host facts ``jobgen doctor`` checks an ssh profile against (:mod:`jobgen.doctor.ssh`).

One ssh round trip per host (in parallel, with the ssh options of the profile:
:func:`~jobgen.backends.ssh.launch.ssh_argv`): ``sh -s`` runs :data:`PROBE_SCRIPT`, sent on stdin,
which needs only a POSIX shell there (jobgen need not be installed). It prints sections, each
opened by a line ``<marker> section <name>``, where ``<marker>`` is a random word chosen for each
probe (so no value a host prints can open a section):

- ``hostname``: ``hostname``;
- ``cpus``: ``nproc`` (the CPUs this login may use; run without ``OMP_NUM_THREADS`` and
  ``OMP_THREAD_LIMIT``, which GNU nproc prints instead when set), else ``getconf _NPROCESSORS_ONLN``;
- ``memory``: the ``MemTotal:`` line of ``/proc/meminfo`` (kB, proc(5));
- ``gpus``: ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`` (one ``<name>,
  <MiB> MiB`` line per GPU, nvidia-smi(1)), then ``<marker> exit <code>``; ``<marker> absent``
  when there is no nvidia-smi;
- ``python``: one JSON line from the profile's ``ssh.python`` (its version, and the version or the
  error of importing ``jobgen.train``, ``torch`` and ``lightning``), then ``<marker> exit <code>``;
  ``<marker> absent`` when the interpreter is not found;
- ``workdir``: ``<marker> workdir <state>`` for ``ssh.workdir``: ``writable`` (a file was written
  and removed there), ``creatable`` (missing; the nearest existing parent is a writable
  directory), ``unwritable``, ``uncreatable`` or ``notdir``, then the directory looked at.

The profile takes, across the hosts, the fewest CPUs, the least memory and the fewest GPUs, so a
job fits on every host; the comment of each value names the host it came from and a note says
when the hosts differ. GPU models come from nvidia-smi's name by the table of
:func:`jobgen.backends.slurm.detect.gpu_model`. Hosts without GPUs give a CPU profile (one gloo
rank per host, as ``ssh-2node``).
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobgen.backends.slurm.detect import DetectedProfile, check_detected, gpu_model
from jobgen.backends.slurm.inventory import InventoryError, clean, not_plain
from jobgen.backends.ssh.launch import remote_path, ssh_argv
from jobgen.errors import ConfigError, SubmitError
from jobgen.specs.load import apply_overrides, validate
from jobgen.specs.profile import GPU_COMPUTE_CAPABILITY, SshSettings

#: The probe, run by ``sh -s -- <marker> <python> <workdir>`` on each host. Every command reads
#: /dev/null, never the script's own stdin; nvidia-smi gets 30 s (``timeout``, where coreutils has it).
PROBE_SCRIPT = r"""m=$1; py=$2; wd=$3
sec() { printf '\n%s section %s\n' "$m" "$1"; }
to=; command -v timeout >/dev/null 2>&1 && to="timeout 30"
sec hostname; hostname </dev/null 2>&1
sec cpus; (unset OMP_NUM_THREADS OMP_THREAD_LIMIT; nproc </dev/null 2>/dev/null || getconf _NPROCESSORS_ONLN </dev/null 2>&1)
sec memory; grep '^MemTotal:' /proc/meminfo </dev/null 2>&1
sec gpus
if command -v nvidia-smi >/dev/null 2>&1; then
  $to nvidia-smi --query-gpu=name,memory.total --format=csv,noheader </dev/null 2>&1; printf '\n%s exit %s\n' "$m" "$?"
else printf '%s absent\n' "$m"; fi
sec python
if command -v "$py" >/dev/null 2>&1; then
  "$py" -c 'import json, sys
out = {"version": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable}
for name in ("jobgen.train", "torch", "lightning"):
    try:
        __import__(name)
        out[name] = str(getattr(sys.modules[name.split(".")[0]], "__version__", ""))
    except BaseException as exc:
        out[name + " error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))' </dev/null 2>&1; printf '\n%s exit %s\n' "$m" "$?"
else printf '%s absent\n' "$m"; fi
sec workdir
if [ -d "$wd" ]; then
  f="$wd/.jobgen-probe-$m"
  if ( : >"$f" ) 2>/dev/null; then rm -f -- "$f"; printf '%s workdir writable\n' "$m"; else printf '%s workdir unwritable\n' "$m"; fi
  printf '%s\n' "$wd"
elif [ -e "$wd" ]; then printf '%s workdir notdir\n%s\n' "$m" "$wd"
else
  d=$wd; while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
  if [ -d "$d" ] && [ -w "$d" ]; then printf '%s workdir creatable\n' "$m"; else printf '%s workdir uncreatable\n' "$m"; fi
  printf '%s\n' "$d"
fi
sec end
"""

#: The sections every probe output has (a missing one: the script did not run to its end).
SECTIONS = ("hostname", "cpus", "memory", "gpus", "python", "workdir", "end")
#: Longest text of a host's kept for a message or a comment (characters).
SHOWN_MAX = 200
#: Seconds the probe may run after ssh connected (importing torch on a busy host included).
PROBE_TIMEOUT_S = 120.0
#: The Python modules the bundled entrypoint (``python -m jobgen.train``) needs on every host.
ENTRYPOINT_MODULES = ("jobgen.train", "torch", "lightning")


def shown(text: str) -> str:
    """``text`` from a host, fit for one line of a message or comment: non-printable characters
    escaped (:func:`~jobgen.backends.slurm.inventory.clean`), cut to :data:`SHOWN_MAX` characters."""
    text = clean(text)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX] + "..."


@dataclass(frozen=True)
class Gpu:
    """One line of nvidia-smi: ``name`` as printed, ``mem_mib`` (memory.total; None when not a number)."""

    name: str
    mem_mib: int | None


@dataclass
class HostFacts:
    """What the probe found on one host (:func:`parse_probe`).

    Attributes:
        host: the host as the profile names it.
        hostname: what ``hostname`` printed there (shown in comments, never written as a value).
        cpus: CPUs, or None when unreadable (``problems`` says why).
        mem_kib: MemTotal in KiB, or None.
        gpus: nvidia-smi's GPUs; None without nvidia-smi. ``gpu_error``: nvidia-smi failed or
            printed a line jobgen cannot read (then ``gpus`` holds what it could).
        python: the interpreter's JSON (``version``, ``executable``, ``<module>`` versions,
            ``<module> error``); None when it did not answer (``python_error`` says why).
        workdir: ``writable``, ``creatable``, ``unwritable``, ``uncreatable``, ``notdir``, or ``""``;
            ``workdir_path``: the directory looked at.
        problems: what in the output could not be read, one line each.
    """

    host: str
    hostname: str = ""
    cpus: int | None = None
    mem_kib: int | None = None
    gpus: list[Gpu] | None = None
    gpu_error: str = ""
    python: dict[str, str] | None = None
    python_error: str = ""
    workdir: str = ""
    workdir_path: str = ""
    problems: list[str] = field(default_factory=list)

    def import_errors(self) -> list[str]:
        """``<module>: <error>`` for each of :data:`ENTRYPOINT_MODULES` the interpreter could not import."""
        if self.python is None:
            return []
        return [f"{name}: {self.python.get(name + ' error', 'not reported')}" for name in ENTRYPOINT_MODULES
                if name not in self.python]


def _sections(text: str, marker: str) -> dict[str, list[tuple[bool, str]]]:
    """The probe output's lines by section, blank lines dropped: ``(True, words)`` for a marker
    line (the words after the marker), ``(False, line)`` for a line the host printed (it cannot
    hold the marker, which it never saw)."""
    found: dict[str, list[tuple[bool, str]]] = {}
    current: list[tuple[bool, str]] | None = None
    for line in text.splitlines():
        if line.startswith(marker + " "):
            words = line[len(marker) + 1:]
            kind, _, name = words.partition(" ")
            if kind == "section" and name:
                current = found.setdefault(name, [])
            elif current is not None:
                current.append((True, words))
        elif current is not None and line.strip():
            current.append((False, line))
    return found


def _status(lines: list[tuple[bool, str]]) -> tuple[list[str], str | None]:
    """A section's lines from the host, and its first marker line's words (``absent``, ``exit 0``...), if any."""
    text = [line for is_marker, line in lines if not is_marker]
    status = next((line for is_marker, line in lines if is_marker), None)
    return text, status


def parse_probe(host: str, text: str, marker: str) -> HostFacts:
    """The facts in one host's probe output (``text``: decoded with ``surrogateescape``, so bytes
    that are not UTF-8 stay lone surrogates). Never raises: what it cannot read is left None (or
    ``""``) and said in ``problems``, ``gpu_error`` or ``python_error``, with the host's text
    shown by :func:`shown`."""
    facts = HostFacts(host)
    sections = _sections(text, marker)
    missing = [name for name in SECTIONS if name not in sections]
    if missing:
        facts.problems.append(f"the probe's output lacks section(s) {', '.join(missing)} (it needs a POSIX sh on the host)")
    lines = _status(sections.get("hostname", []))[0]
    facts.hostname = shown(lines[0]) if lines else ""
    cpus = _status(sections.get("cpus", []))[0]
    if cpus and re.fullmatch(r"\s*[0-9]{1,6}\s*", cpus[0]) and int(cpus[0]) > 0:
        facts.cpus = int(cpus[0])
    elif "cpus" in sections:
        facts.problems.append(f"nproc printed {shown(cpus[0]) if cpus else '(nothing)'!r}, not a CPU count")
    memory = _status(sections.get("memory", []))[0]
    match = re.fullmatch(r"MemTotal:\s*([0-9]{1,15})\s*kB\s*", memory[0]) if memory else None
    if match and int(match.group(1)) > 0:
        facts.mem_kib = int(match.group(1))
    elif "memory" in sections:
        facts.problems.append(f"/proc/meminfo's MemTotal line reads {shown(memory[0]) if memory else '(nothing)'!r}, not <n> kB")
    _parse_gpus(facts, sections.get("gpus"))
    _parse_python(facts, sections.get("python"))
    workdir = sections.get("workdir")
    if workdir is not None:
        text_lines, status = _status(workdir)
        state = (status or "").partition("workdir ")[2]
        if state in ("writable", "creatable", "unwritable", "uncreatable", "notdir"):
            facts.workdir, facts.workdir_path = state, shown(text_lines[0]) if text_lines else ""
        else:
            facts.problems.append("the work directory's state is missing from the probe's output")
    return facts


def _parse_gpus(facts: HostFacts, lines: list[tuple[bool, str]] | None) -> None:
    if lines is None:
        return
    text, status = _status(lines)
    if status == "absent":
        return
    facts.gpus = []
    if status != "exit 0":
        last = text[-1] if text else "(no output)"
        facts.gpu_error = f"nvidia-smi failed ({shown(status or 'no exit code')}): {shown(last)}"
        return
    for line in text:
        name, comma, mem = line.rpartition(",")
        match = re.fullmatch(r"\s*([0-9]{1,9})\s*MiB\s*", mem)
        if not comma or not name.strip() or not_plain(name):
            facts.gpu_error = f"nvidia-smi printed {shown(line)!r}, not '<name>, <memory> MiB'"
            return
        facts.gpus.append(Gpu(name.strip(), int(match.group(1)) if match else None))


def _parse_python(facts: HostFacts, lines: list[tuple[bool, str]] | None) -> None:
    if lines is None:
        facts.python_error = "not asked: the probe's output ends before its python section"
        return
    text, status = _status(lines)
    if status == "absent":
        facts.python_error = "not found (command -v finds no such interpreter)"
        return
    doc: Any = None
    for line in reversed(text):
        try:
            doc = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()) \
            or not isinstance(doc.get("version"), str):
        last = text[-1] if text else "(no output)"
        facts.python_error = f"did not run the probe ({shown(status or 'no exit code')}): {shown(last)}"
        return
    facts.python = {key: shown(value) for key, value in doc.items()}


@dataclass(frozen=True)
class HostProbe:
    """One host's answer: ``reached`` False when ssh failed (``error``: ssh's message); else ``facts``."""

    host: str
    rank: int
    reached: bool
    error: str = ""
    facts: HostFacts | None = None


#: Runs one ssh argv with the probe on stdin (tests pass fakes): ``(argv, script) -> CompletedProcess``.
Runner = Callable[[Sequence[str], bytes], "subprocess.CompletedProcess[bytes]"]


def _run_probe(argv: Sequence[str], script: bytes) -> subprocess.CompletedProcess[bytes]:
    from jobgen.backends.ssh.backend import run_ssh

    return run_ssh(argv, data=script, timeout_s=PROBE_TIMEOUT_S)


def probe_argv(settings: SshSettings, host: str, marker: str) -> tuple[str, ...]:
    """The ssh argv of one host's probe: ``sh -s -- <marker> <python> <workdir>`` (quoted words;
    the work directory as :func:`~jobgen.backends.ssh.launch.remote_path` writes it), the script on stdin."""
    remote = f"sh -s -- {shlex.quote(marker)} {shlex.quote(settings.python)} {remote_path(settings.workdir)}"
    return ssh_argv(settings, host, remote)


def probe_hosts(settings: SshSettings, hosts: Sequence[str] | None = None, *, run: Runner = _run_probe,
                marker: str | None = None) -> list[HostProbe]:
    """Probe ``hosts`` (default: ``settings.hosts``) at once, in node-rank order.

    Raises:
        SubmitError: ssh is not installed here.
    """
    from jobgen.backends.ssh.backend import _each, _why

    marker = marker or f"jobgen-{secrets.token_hex(8)}"
    script = PROBE_SCRIPT.encode()

    def ask(rank: int, host: str) -> HostProbe:
        proc = run(probe_argv(settings, host, marker), script)
        if proc.returncode == 255:
            return HostProbe(host, rank, reached=False, error=shown(_why(proc)))
        facts = parse_probe(host, proc.stdout.decode("utf-8", "surrogateescape"), marker)
        if proc.returncode != 0:
            facts.problems.append(f"the probe exited {proc.returncode}: {shown(_why(proc))}")
        return HostProbe(host, rank, reached=True, facts=facts)

    return _each(list(hosts if hosts is not None else settings.hosts), ask)


# --------------------------------------------------------------------------- detect


def parse_host_option(value: str) -> tuple[str | None, str, int | None]:
    """``USER@HOST[:PORT]`` (``--host``) -> ``(user, host, port)``; an IPv6 address with a port
    in brackets (``[fe80::1]:2222``), without one as it is.

    Raises:
        ConfigError: an empty part or a port that is not 1-65535.
    """
    user, at, rest = value.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        inside, bracket, after = rest[1:].partition("]")
        host = inside
        if not bracket or (after and not after.startswith(":")):
            raise ConfigError(f"--host {value!r}: a bracketed address must be [ADDRESS] or [ADDRESS]:PORT", location="--host",
                              hint="e.g. --host alice@[fe80::1]:2222")
        port_text = after[1:] if after else None
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        port_text = None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ConfigError(f"--host {value!r}: port {port_text!r} is not a number from 1 to 65535", location="--host",
                              hint="USER@HOST[:PORT], e.g. --host alice@node1:2222")
        port = int(port_text)
    if (at and not user) or not host:
        raise ConfigError(f"--host {value!r} has an empty user or host", location="--host", hint="USER@HOST[:PORT], e.g. --host alice@node1")
    return (user if at else None), host, port


def _settings_doc(hosts: Sequence[str], python: str | None, overrides: Sequence[str]) -> dict[str, Any]:
    """The ``ssh:`` mapping from ``--host``, ``--python`` and ``--profile-set ssh.*`` (applied last).

    Raises:
        ConfigError: no host, or hosts with different users or ports (a profile has one of each).
    """
    if not hosts:
        raise ConfigError("--scheduler ssh needs the hosts to profile", location="--host",
                          hint="name each with --host USER@HOST[:PORT], e.g. --host alice@node1 --host alice@node2")
    parsed = [parse_host_option(h) for h in hosts]
    users = sorted({u for u, _, _ in parsed}, key=str)
    ports = sorted({p for _, _, p in parsed}, key=str)
    if len(users) > 1 or len(ports) > 1:
        raise ConfigError("the hosts differ in " + " and ".join(w for w, v in (("user", users), ("port", ports)) if len(v) > 1)
                          + f" ({', '.join(hosts)}); an ssh profile has one ssh.user and one ssh.port for every host",
                          location="--host", hint="give every host the same USER@ and :PORT, or name Host aliases of "
                                                  "~/.ssh/config (each with its User and Port) in --host")
    ssh: dict[str, Any] = {"hosts": [h for _, h, _ in parsed]}
    if users[0] is not None:
        ssh["user"] = users[0]
    if ports[0] is not None:
        ssh["port"] = ports[0]
    if python is not None:
        ssh["python"] = python
    return apply_overrides({"ssh": ssh}, overrides, source="--profile-set")


def _name(host: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"ssh-{host}").strip("-.")[:64]
    return name or "ssh-detected"


@dataclass
class DetectedHosts(DetectedProfile):
    """A detected ssh profile (:class:`~jobgen.backends.slurm.detect.DetectedProfile`; ``partition``
    is empty) with the ``hosts`` probed."""

    hosts: tuple[str, ...] = ()

    @property
    def scope(self) -> str:
        """What was profiled, for messages: ``2 host(s) (node1, node2)``."""
        return f"{len(self.hosts)} host(s) ({', '.join(self.hosts)})"

    def as_json(self) -> dict[str, Any]:
        """``-o json``: ``name``, ``hosts``, ``profile``, ``sources``, ``notes``."""
        doc = super().as_json()
        del doc["partition"]
        return {"name": doc["name"], "hosts": list(self.hosts), **{k: v for k, v in doc.items() if k != "name"}}


def detect_ssh(*, hosts: Sequence[str], python: str | None = None, overrides: Sequence[str] = (), gpu_type: str | None = None,
               name: str | None = None, run: Runner = _run_probe) -> DetectedHosts:
    """Detect a profile of the machines ``hosts`` (``USER@HOST[:PORT]`` each) over ssh.

    Args:
        hosts: the hosts in node-rank order (the first is the rendezvous host).
        python: the interpreter on every host (``ssh.python``); None: the profile's default.
        overrides: ``--profile-set KEY.PATH=VALUE``: ``ssh.*`` ones also shape how the hosts are
            reached (``ssh.identity_file``, ``ssh.known_hosts``, ``ssh.options``...); all are
            applied to the profile last, their comment naming ``--profile-set``.
        gpu_type: the jobgen GPU type, for GPUs whose nvidia-smi name names no model jobgen knows.
        name: the profile's name (the file's stem); None: ``ssh-<first host>``.
        run: runs one probe (tests pass fakes).

    Returns:
        The profile, validated by :class:`~jobgen.specs.profile.ClusterProfile` and read back from
        its YAML text unchanged.

    Raises:
        ConfigError: bad ``--host``/``--profile-set`` values; GPUs of different models, or of no
            model jobgen knows (without ``gpu_type``).
        SubmitError: a host does not answer (each one named, with ssh's message).
        InventoryError: a host's output lacks a value the profile needs (the host named).
    """
    base = _settings_doc(hosts, python, overrides)
    settings = validate(SshSettings, base["ssh"], "--host, --python and --profile-set ssh.*")
    answers = probe_hosts(settings, run=run)
    down = [a for a in answers if not a.reached]
    if down:
        raise SubmitError(f"{len(down)} of {len(answers)} host(s) did not answer over ssh:\n  "
                          + "\n  ".join(f"{a.host} (node {a.rank}): {a.error}" for a in down),
                          hint="check that `ssh -o BatchMode=yes HOST true` works for each (keys: ssh-copy-id; host keys: "
                               "ssh once by hand, or --profile-set ssh.known_hosts=FILE; a key: --profile-set ssh.identity_file=FILE)")
    facts = [a.facts for a in answers if a.facts is not None]
    for f in facts:
        if f.cpus is None or f.mem_kib is None:
            raise InventoryError(f"host {f.host}: " + "; ".join(f.problems),
                                 hint="jobgen needs each host's CPU count and memory: run `nproc` and `grep MemTotal /proc/meminfo` there "
                                      "(the remote login shell must be a POSIX one)")
    notes: list[str] = []
    sources: dict[str, str] = {}
    n = len(facts)
    doc: dict[str, Any] = {"description": "", "scheduler": "ssh", "max_nodes": n, "default_nodes": n}
    sources["max_nodes"] = f"the {n} host(s) given with --host"
    sources["default_nodes"] = "every host"
    _gpu_fields(facts, gpu_type, doc, sources, notes)
    if not doc["gpus_per_node"]:
        doc["cpu_processes_per_node"] = 1
        sources["cpu_processes_per_node"] = "one gloo rank per host, as ssh-2node; raise it for several ranks per host"
    cpu_host = min(facts, key=lambda f: (f.cpus, f.host))
    mem_host = min(facts, key=lambda f: (f.mem_kib, f.host))
    doc["cpus_per_node"] = cpu_host.cpus
    sources["cpus_per_node"] = f"`nproc` on {cpu_host.host} ({cpu_host.hostname}), the fewest of the {n} host(s)"
    # rounded down to 0.01 GiB: never more than the host has
    doc["mem_gib_per_node"] = int((mem_host.mem_kib or 0) * 100 / 1024 / 1024) / 100
    sources["mem_gib_per_node"] = (f"MemTotal {mem_host.mem_kib} kB of /proc/meminfo on {mem_host.host}, the least of the {n} "
                                   "host(s), in GiB rounded down")
    for what, values in (("CPUs", {f.host: f.cpus for f in facts}), ("MemTotal kB", {f.host: f.mem_kib for f in facts})):
        if len(set(values.values())) > 1:
            notes.append(f"the hosts differ in {what}: " + ", ".join(f"{h} {v}" for h, v in values.items()) + "; the profile takes the least")
    doc["network_fabric"] = "tcp"
    sources["network_fabric"] = "not detected: tcp; set infiniband, roce or efa if the hosts have it"
    doc["ssh"] = {**base["ssh"]}
    sources["ssh.hosts"] = "--host, in node-rank order (the first is the rendezvous host)"
    if "user" in doc["ssh"]:
        sources["ssh.user"] = "--host USER@"
    if "port" in doc["ssh"]:
        sources["ssh.port"] = "--host :PORT"
    sources["ssh.python"] = ("--python" if python is not None else "the default") + "; " + _python_source(settings, facts, notes)
    if "python" not in doc["ssh"]:
        doc["ssh"]["python"] = settings.python
    shape = f"{doc['gpus_per_node']}x {doc['gpu_type']} per host" if doc["gpus_per_node"] else "CPU-only hosts"
    doc["description"] = f"{n} host(s) over ssh: {shape} (detected)"
    for item in overrides:
        sources[item.partition("=")[0]] = "--profile-set"
    doc = apply_overrides(doc, [o for o in overrides if not o.startswith("ssh.")], source="--profile-set")
    name = name or _name(settings.hosts[0])
    header = [f"{n} host(s) over ssh ({', '.join(settings.hosts)}), detected by `jobgen profiles detect --scheduler ssh`.",
              "The comment above each value names its source; edit it as any profile (docs/profiles.md, \"Detecting a profile\")."]
    found = DetectedHosts(name, "", doc, sources, header, notes, hosts=settings.hosts)
    check_detected(found, hint="leave that host out of --host, or write the profile by hand (docs/profiles.md)")
    return found


def _gpu_fields(facts: list[HostFacts], gpu_type: str | None, doc: dict[str, Any], sources: dict[str, str],
                notes: list[str]) -> None:
    """``gpus_per_node``, ``gpu_type`` and ``gpu_mem_gib`` from every host's nvidia-smi: the fewest
    GPUs (0 when a host has none: a CPU profile), the one model, the least memory per GPU.

    Raises:
        InventoryError: nvidia-smi failed or printed a line jobgen cannot read on a host.
        ConfigError: GPUs of several models, or a name naming no model jobgen knows (without ``gpu_type``).
    """
    for f in facts:
        if f.gpu_error:
            raise InventoryError(f"host {f.host}: {f.gpu_error}",
                                 hint="run `nvidia-smi` on that host and fix its driver, or leave that host out of --host")
    counts = {f.host: len(f.gpus or []) for f in facts}
    fewest = min(facts, key=lambda f: (counts[f.host], f.host))
    if len(set(counts.values())) > 1:
        notes.append("the hosts differ in GPUs (nvidia-smi): " + ", ".join(f"{h} {c}" for h, c in counts.items())
                     + "; the profile takes the fewest")
    if counts[fewest.host] == 0:
        doc["gpus_per_node"] = 0
        sources["gpus_per_node"] = (f"no GPUs on {fewest.host} ({'no nvidia-smi' if fewest.gpus is None else 'nvidia-smi lists none'})"
                                    ": a CPU profile")
        return
    gpus = [(f.host, g) for f in facts for g in f.gpus or []]
    models = {g.name: gpu_model(g.name) for _, g in gpus}
    if gpu_type is None:
        unknown = sorted(name for name, model in models.items() if model is None)
        if unknown:
            raise ConfigError(f"nvidia-smi names GPU(s) {', '.join(repr(shown(u)) for u in unknown)}, of no model jobgen knows",
                              location="--gpu-type", hint="pass --gpu-type, one of: " + ", ".join(GPU_COMPUTE_CAPABILITY))
        kinds = sorted({m for m in models.values() if m is not None})
        if len(kinds) > 1:
            per_host = "; ".join(f"{f.host}: {', '.join(sorted({str(gpu_model(g.name)) for g in f.gpus or []}))}" for f in facts)
            raise ConfigError(f"the hosts have GPUs of several models ({per_host}); a profile has one gpu_type", location="--host",
                              hint="profile the hosts of one model together (one detect per model, each with its own --out)")
        model, model_source = kinds[0], f"nvidia-smi name {shown(gpus[0][1].name)!r} on {gpus[0][0]}"
    else:
        model, model_source = gpu_type, "--gpu-type"
    doc["gpus_per_node"] = counts[fewest.host]
    sources["gpus_per_node"] = f"nvidia-smi on {fewest.host}: {counts[fewest.host]} GPU(s), the fewest of the {len(facts)} host(s)"
    doc["gpu_type"] = model
    sources["gpu_type"] = model_source
    sizes = [(g.mem_mib, host) for host, g in gpus if g.mem_mib is not None]
    if sizes:
        mib, host = min(sizes)
        doc["gpu_mem_gib"] = int(mib * 10 / 1024) / 10
        sources["gpu_mem_gib"] = f"nvidia-smi memory.total {mib} MiB on {host}, the least, in GiB rounded down"
    else:
        doc["gpu_mem_gib"] = None
        sources["gpu_mem_gib"] = "nvidia-smi printed no memory.total in MiB: set gpu_mem_gib (GiB per GPU)"


def _python_source(settings: SshSettings, facts: list[HostFacts], notes: list[str]) -> str:
    """The comment of ``ssh.python`` (its version on each host), with a note for each host where it
    is missing or cannot import the entrypoint's modules."""
    versions = sorted({f.python["version"] for f in facts if f.python})
    for f in facts:
        if f.python is None:
            notes.append(f"host {f.host}: {settings.python} {f.python_error}; install Python and jobgen[train] there before submitting")
        elif f.import_errors():
            notes.append(f"host {f.host}: {settings.python} cannot import " + "; ".join(f.import_errors())
                         + "; install jobgen[train] into it before submitting (docs/install.md)")
    ready = [f.host for f in facts if f.python and not f.import_errors()]
    torch = sorted({f.python.get("torch", "") for f in facts if f.python and f.python.get("torch")})
    return (f"Python {', '.join(versions) or '(not found)'}"
            + (f", torch {', '.join(torch)}" if torch else "")
            + f"; imports jobgen.train, torch and lightning on {len(ready)} of {len(facts)} host(s)")
