"""``jobgen doctor`` on an ssh profile: every host answers, runs the entrypoint, has the GPUs and a
work directory it can write, and, where a resumed job needs it, shares the work directory.

The checks, one line per host each, named ``ssh.<check>[<host>]`` with the host as ``ssh.hosts``
writes it (``ssh.reachable[node1]``), in this order:

- ``ssh.reachable[<host>]``: the host answers ssh in BatchMode within ``ssh.connect_timeout_s``
  and runs the probe (:mod:`jobgen.backends.ssh.detect`: one round trip per host, in parallel);
- ``ssh.python[<host>]``: ``ssh.python`` exists there and imports jobgen.train, torch and
  lightning (what ``python -m jobgen.train`` needs);
- ``ssh.gpus[<host>]``: nvidia-smi's GPUs against ``gpus_per_node`` and ``gpu_type`` (a CPU
  profile passes, saying so);
- ``ssh.workdir[<host>]``: ``ssh.workdir`` is a directory the login can write (a file is written
  and removed), or is missing under one it can write (submit creates it);

then one line for the hosts together:

- ``ssh.shared_workdir``: with a spec on more than one host that resumes (``checkpoint.resume:
  auto``, not a smoke run), a file written under ``ssh.workdir`` on the first host is read on
  every other host. Every node looks for the newest checkpoint in its own run directory
  (``<workdir>/<job name>/checkpoints``, :mod:`jobgen.train.checkpoints`) while global rank zero,
  on the first host, writes them; on disks of their own the other hosts would start from step
  0 while it resumes. Skipped, saying why, otherwise.

With a spec, the hosts are those its job runs on (the first ``nodes`` of ``ssh.hosts``).
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Iterator

from jobgen.backends.slurm.detect import gpu_model
from jobgen.backends.ssh.detect import HostFacts, HostProbe, probe_hosts, shown
from jobgen.backends.ssh.launch import remote_path, ssh_argv
from jobgen.doctor import Check, DoctorContext, skipped_after
from jobgen.specs.profile import SshSettings

#: The install command a ``ssh.python`` failure's fix names (docs/install.md).
INSTALL = "{python} -m pip install '<jobgen checkout or wheel>[train]'"


def checks(ctx: DoctorContext) -> Iterator[Check]:
    """The checks of the module docstring, in its order."""
    settings = ctx.profile.ssh
    assert settings is not None  # the profile model requires it for scheduler: ssh
    hosts = settings.hosts[:ctx.plan.world.num_nodes] if ctx.plan is not None else settings.hosts
    answers = probe_hosts(settings, hosts)
    source = ctx.profile_source
    for a in answers:
        yield _reachable(a, settings)
    for a in answers:
        yield _python(a, settings, source)
    for a in answers:
        yield _gpus(a, ctx, source)
    for a in answers:
        yield _workdir(a, settings, source)
    yield from _shared_workdir(ctx, settings, answers)


def _name(check: str, host: str) -> str:
    return f"ssh.{check}[{shown(host)}]"


def _usable(a: HostProbe) -> HostFacts | None:
    """The host's facts when it answered and the probe ran to its end; else None."""
    return a.facts if a.reached and a.facts is not None and not a.facts.problems else None


def _reachable(a: HostProbe, settings: SshSettings) -> Check:
    name = _name("reachable", a.host)
    if not a.reached:
        return Check(name, "fail", f"ssh to {shown(a.host)} failed: {a.error}",
                     f"make `{shlex.join(ssh_argv(settings, a.host, 'true'))}` work (keys: ssh-copy-id; a host seen for the "
                     "first time: ssh to it once by hand, or list its key in ssh.known_hosts)")
    facts = a.facts
    assert facts is not None
    if facts.problems:
        return Check(name, "fail", f"{shown(a.host)} answered, but the probe did not run to its end: " + "; ".join(facts.problems),
                     "make the login shell of that user on the host a POSIX one (bash, dash, zsh), with sh, nproc and /proc")
    return Check(name, "pass", f"{shown(a.host)} answered (hostname {facts.hostname!r}, {facts.cpus} CPU(s), "
                               f"{(facts.mem_kib or 0) / 1024 / 1024:.1f} GiB)")


def _python(a: HostProbe, settings: SshSettings, source: str) -> Check:
    name = _name("python", a.host)
    facts = _usable(a)
    if facts is None:
        return skipped_after(name, _name("reachable", a.host))
    install = INSTALL.format(python=shlex.quote(settings.python))
    if facts.python is None:
        return Check(name, "fail", f"{shown(a.host)}: {shown(settings.python)} {facts.python_error}",
                     f"on {shown(a.host)}: install Python 3 and `{install}`, or set ssh.python in {source} to an interpreter that has jobgen[train]")
    errors = facts.import_errors()
    version = facts.python.get("version", "")
    if errors:
        return Check(name, "fail", f"{shown(a.host)}: {shown(settings.python)} (Python {version}) cannot import " + "; ".join(errors),
                     f"on {shown(a.host)}: `{install}` (docs/install.md), or set ssh.python in {source} to an interpreter that has it")
    return Check(name, "pass", f"{shown(settings.python)}: Python {version}, jobgen {facts.python.get('jobgen.train', '')}, "
                               f"torch {facts.python.get('torch', '')}, lightning {facts.python.get('lightning', '')}")


def _gpus(a: HostProbe, ctx: DoctorContext, source: str) -> Check:
    name = _name("gpus", a.host)
    facts = _usable(a)
    if facts is None:
        return skipped_after(name, _name("reachable", a.host))
    found = facts.gpus or []
    have = f"{len(found)} GPU(s)" + (f" ({', '.join(sorted({shown(g.name) for g in found}))})" if found else "")
    wanted = ctx.profile.gpus_per_node
    if wanted == 0:
        return Check(name, "pass", f"CPU profile ({ctx.profile.cpu_processes_per_node} gloo rank(s) per host); "
                                   f"{shown(a.host)} has {have if facts.gpus is not None else 'no nvidia-smi'}")
    if facts.gpu_error:
        return Check(name, "fail", f"{shown(a.host)}: {facts.gpu_error}",
                     f"run nvidia-smi on {shown(a.host)} and fix its driver, or leave the host out of ssh.hosts in {source}")
    if facts.gpus is None:
        return Check(name, "fail", f"the profile uses {wanted} GPU(s) per host; {shown(a.host)} has no nvidia-smi (no NVIDIA driver)",
                     f"install the NVIDIA driver on {shown(a.host)}, or set gpus_per_node: 0 in {source} for a CPU profile")
    if len(found) < wanted:
        return Check(name, "fail", f"the profile uses {wanted} GPU(s) per host; {shown(a.host)} has {have}",
                     f"set gpus_per_node: {len(found)} in {source}" if found else f"set gpus_per_node: 0 in {source} for a CPU profile")
    models = sorted({str(gpu_model(g.name)) for g in found})
    if ctx.profile.gpu_type is not None and ctx.profile.gpu_type not in models:
        return Check(name, "fail", f"the profile says gpu_type {ctx.profile.gpu_type}; {shown(a.host)} has {have}",
                     f"set gpu_type: {models[0]} in {source}" if len(models) == 1 and models[0] != "None"
                     else f"set gpu_type in {source} to the hosts' model")
    return Check(name, "pass", f"{have}; the profile uses {wanted} per host")


def _workdir(a: HostProbe, settings: SshSettings, source: str) -> Check:
    name = _name("workdir", a.host)
    facts = _usable(a)
    if facts is None:
        return skipped_after(name, _name("reachable", a.host))
    where = f"{shown(settings.workdir)} on {shown(a.host)}"
    if facts.workdir == "writable":
        return Check(name, "pass", f"{where}: a directory the login can write")
    if facts.workdir == "creatable":
        return Check(name, "pass", f"{where}: missing; submit creates it under {facts.workdir_path!r}, which the login can write")
    why = {"unwritable": "a directory the login cannot write to", "notdir": "exists and is not a directory",
           "uncreatable": f"missing, and {facts.workdir_path!r} (its nearest existing parent) is not a directory the login can write"}
    return Check(name, "fail", f"{where}: {why.get(facts.workdir, 'not reported by the probe')}",
                 f"create it on {shown(a.host)} with write access for the login, or set ssh.workdir in {source} to a directory it can write")


def _shared_workdir(ctx: DoctorContext, settings: SshSettings, answers: list[HostProbe]) -> Iterator[Check]:
    name = "ssh.shared_workdir"
    if ctx.spec is None:
        yield Check(name, "skip", "no spec given: a spec that resumes on several hosts needs a work directory they share")
        return
    if len(answers) < 2:
        yield Check(name, "skip", "the job runs on one host: its checkpoints are on the disk it resumes from")
        return
    if ctx.spec.smoke or ctx.spec.checkpoint.resume == "never":
        yield Check(name, "skip", "the spec does not resume (checkpoint.resume: never, or a smoke run): each host may have its own disk")
        return
    broken = [a for a in answers if _usable(a) is None or a.facts is None or a.facts.workdir not in ("writable", "creatable")]
    if broken:
        yield skipped_after(name, ", ".join(_name("workdir", a.host) for a in broken))
        return
    from jobgen.backends.ssh.backend import _each, _timeout, _why, run_ssh

    token = f"jobgen-doctor-{secrets.token_hex(8)}"
    path = remote_path(f"{settings.workdir}/.{token}")
    first = answers[0].host
    timeout = _timeout(settings, 30)
    wrote = run_ssh(ssh_argv(settings, first, f"mkdir -p -- {remote_path(settings.workdir)} && printf %s {token} > {path}"),
                    timeout_s=timeout)
    if wrote.returncode != 0:
        yield Check(name, "fail", f"could not write a file under {shown(settings.workdir)} on {shown(first)}: {shown(_why(wrote))}",
                    f"make ssh.workdir writable on {shown(first)}")
        return
    try:
        seen = _each([a.host for a in answers[1:]], lambda _, host: run_ssh(
            ssh_argv(settings, host, f"cat -- {path} 2>/dev/null || true"), timeout_s=timeout))
    finally:
        run_ssh(ssh_argv(settings, first, f"rm -f -- {path}"), timeout_s=timeout)
    unseen = [a.host for a, proc in zip(answers[1:], seen, strict=True) if proc.stdout.decode(errors="replace").strip() != token]
    if unseen:
        yield Check(name, "fail", f"a file written under {shown(settings.workdir)} on {shown(first)} is not there on "
                                  f"{', '.join(shown(h) for h in unseen)}: the spec resumes (checkpoint.resume: auto), and those "
                                  "hosts would not see the checkpoints rank 0 writes",
                    f"put ssh.workdir in {ctx.profile_source} on a file system every host mounts (NFS), or set "
                    f"checkpoint.resume: never in {ctx.spec_path}")
        return
    yield Check(name, "pass", f"a file written under {shown(settings.workdir)} on {shown(first)} is seen on the other "
                              f"{len(answers) - 1} host(s): a resumed job finds its checkpoints on every host")
