"""Why a job failed, as one of three classes, and whether a restart can help.

- ``user``: an exception in the job's code, a spec or input the entrypoint refused, a time
  limit the job ran past: a restart would fail the same way, so it is never retried.
- ``infrastructure``: a hang, an NCCL or transport error, a lost peer, a failed node, a GPU
  hardware error, a process killed by the kernel (its OOM killer) or the scheduler, a
  preemption or eviction: retried (within the spec's ``restart.max_restarts``).
- ``unknown``: evidence that matches no row, or a crash that could be either (a signal such
  as SIGSEGV or SIGABRT from native code, an exit code without output). Retried: user
  exceptions leave a traceback or the entrypoint's error line, which the ``user`` rows match,
  so what remains unexplained is mostly what happened to the process from outside; the restart
  budget bounds what a wrong guess costs. Kubeflow training-operator's ``restartPolicy:
  ExitCode`` makes the same call for the codes it cannot attribute (128-255: retryable).

:data:`RULES` is the one table: each row names the evidence it matches, its class, the reason
shown to the user and the source of the rule. :func:`classify` looks up each piece of
:class:`Evidence` (the first row that matches it) and decides between pieces by class:
``user`` before ``infrastructure`` before ``unknown``, then in the order given (the triage's
order: the first failure first). A user error decides over everything the other ranks did
after it: a rank that raised leaves its peers waiting (a hang, an NCCL timeout), losing their
peer, or killed by the launcher, and a restart would raise again.

Exit codes (:func:`exit_code_for`): training-operator's ``restartPolicy: ExitCode`` restarts a
pod whose container exited 128-255 and leaves one that exited 1-127 failed (its API:
"1-127: permanent error, do not restart; 128-255: retryable error, will restart the pod"); 0
is success, nothing to restart. So a user error exits 1 (an exception) or 2 (an input error:
:data:`jobgen.errors.EXIT_BAD_INPUT`), and jobgen's infrastructure and unknown verdicts exit
above 192: 129-192 are 128 + a signal number (Linux signals 1-64, signal(7)) and 255 is what
ssh returns for its own errors, so :data:`EXIT_INFRASTRUCTURE`, :data:`EXIT_HUNG` and
:data:`EXIT_UNKNOWN` say who decided. The entrypoint (``python -m jobgen.train``) exits with
:func:`exit_code_for` of the exception that ended it (:func:`jobgen.train.__main__.failure_exit_code`):
2 for an input error, 200 for an NCCL or transport error, a lost peer or a GPU hardware error,
1 for any other exception; :data:`EXIT_HUNG` when its watchdog finds the job hung
(:mod:`jobgen.train.watchdog`).

torchrun exits 1 whatever its workers did, so a pod's exit code would say nothing. Rendered
PyTorchJobs (``restartPolicy: ExitCode``) start torchrun through :mod:`jobgen.train.launch`,
which ends with :func:`launcher_exit_code` of torchrun's first failure: :data:`LAUNCHER_EXITS`
is that table.

Pure: no I/O. The backends turn what their scheduler reports into :class:`Evidence`;
:func:`triage_evidence` turns a :class:`~jobgen.reports.triage.Triage` into it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from jobgen.errors import EXIT_BAD_INPUT, EXIT_RUNTIME, printable
from jobgen.reports.triage import NCCL_ERROR_RE, PEER_LOST_RE, SRUN_EXIT_RE, SRUN_TASK_RE, Triage

USER = "user"
INFRASTRUCTURE = "infrastructure"
UNKNOWN = "unknown"
#: The classes, in precedence order (see the module docstring).
CLASSES = (USER, INFRASTRUCTURE, UNKNOWN)
#: Whether a failure of each class is retried (see the module docstring for ``unknown``).
RETRIED = {USER: False, INFRASTRUCTURE: True, UNKNOWN: True}

#: The entrypoint's exit code when it finds the failure is the cluster's (an NCCL or transport
#: error, a lost peer, a GPU error): retryable under training-operator's ExitCode policy.
EXIT_INFRASTRUCTURE = 200
#: The entrypoint's exit code when a watchdog finds the job hung (no progress): retryable.
EXIT_HUNG = 201
#: The watchdog's verdict (:attr:`Evidence.verdict`), and the first word of its line in the
#: entrypoint's one-line error: ``python -m jobgen.train: error: hang: ...`` (:mod:`jobgen.train.watchdog`).
HANG_VERDICT = "hang"
HANG_LINE_RE = re.compile(rf"jobgen\.train: error: {HANG_VERDICT}: ")
#: The entrypoint's exit code for a failure it cannot attribute: retryable (as :data:`RETRIED`).
EXIT_UNKNOWN = 202
#: Below this, an exit code is permanent under ``restartPolicy: ExitCode``; from it, retryable.
RETRYABLE_FROM = 128

#: The longest scheduler text an evidence line keeps (a reason or message can run to kilobytes).
EVIDENCE_CHARS = 200

#: Linux signal numbers (signal(7), x86 and arm) of the signals the rows name.
SIGINT, SIGABRT, SIGBUS, SIGKILL, SIGSEGV, SIGTERM = 2, 6, 7, 9, 11, 15
#: srun's words for how a task ended (strsignal(3) of its signal; "Out Of Memory" is srun's own,
#: from the cgroup's OOM count).
SRUN_SIGNALS = {"Killed": SIGKILL, "Terminated": SIGTERM, "Segmentation fault": SIGSEGV, "Aborted": SIGABRT,
                "Bus error": SIGBUS, "Interrupt": SIGINT}

#: GPU hardware failures as the CUDA runtime and the driver word them (cudaErrorECCUncorrectable,
#: cudaErrorDevicesUnavailable, Xid 79 "GPU has fallen off the bus", NVML's "GPU is lost").
GPU_ERROR_RE = re.compile(r"uncorrectable ECC error|ECC error encountered|fallen off the bus|GPU is lost"
                          r"|uncorrectable NVLink error|CUDA-capable device\(s\) is/are busy or unavailable")
#: CUDA running out of device memory (torch.OutOfMemoryError's message).
CUDA_OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError")


@dataclass(frozen=True)
class Evidence:
    """One observation of how a job, one of its ranks or one of its pods ended.

    Attributes:
        source: who observed it: ``squeue``, ``sacct``, ``jobcomp``, ``pod worker-1``,
            ``rank 3``, ``srun``, ``watchdog``, ``local run``.
        state: the scheduler's job state (SLURM's JOB STATE CODES: ``NODE_FAIL``, ...).
        reason: the scheduler's reason: SLURM's ``state_reason``; the kubelet's reason of a
            pod (``Evicted``), of its container's end (``OOMKilled``) or of its
            ``DisruptionTarget`` condition (``PreemptionByScheduler``).
        exit_code: the exit status (0-255), or ``None``.
        signal: the number of the signal that ended the process, or ``None``.
        kind: the triage's kind of a failure in the output (``traceback``, ``nccl``,
            ``error``, ``abort``, ``exit``), or empty.
        text: the failure's line (a traceback's exception line), or empty.
        verdict: a watchdog's verdict (``hang``), or empty.
    """

    source: str
    state: str = ""
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    kind: str = ""
    text: str = ""
    verdict: str = ""

    def describe(self) -> str:
        """One printable line naming what was observed (scheduler text made printable and cut
        to :data:`EVIDENCE_CHARS`): ``sacct: state NODE_FAIL, exit 0:9``."""
        parts = []
        for label, value in (("state", self.state), ("reason", self.reason), ("verdict", self.verdict), ("kind", self.kind)):
            if value:
                parts.append(f"{label} {_cut(value)}")
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        if self.signal is not None:
            parts.append(f"signal {self.signal}")
        if self.text:
            parts.append(_cut(self.text))
        return f"{_cut(self.source)}: {', '.join(parts)}"


def _cut(text: str) -> str:
    """``text`` printable (:func:`~jobgen.errors.printable`) and at most :data:`EVIDENCE_CHARS` long."""
    shown = printable(text.strip())
    return shown if len(shown) <= EVIDENCE_CHARS else shown[:EVIDENCE_CHARS - 3] + "..."


@dataclass(frozen=True)
class Rule:
    """One row of :data:`RULES`.

    Attributes:
        name: the row's name (stable: tests and documentation refer to it).
        evidence: what it matches, in words (the documentation's table).
        cls: :data:`USER`, :data:`INFRASTRUCTURE` or :data:`UNKNOWN`.
        reason: what the user is told.
        source: where the rule comes from.
        matches: the test of one :class:`Evidence`.
    """

    name: str
    evidence: str
    cls: str
    reason: str
    source: str
    matches: Callable[[Evidence], bool]


@dataclass(frozen=True)
class Classification:
    """What :func:`classify` decided.

    Attributes:
        cls: :data:`USER`, :data:`INFRASTRUCTURE` or :data:`UNKNOWN`.
        reason: the rule's reason, for the user.
        evidence: the observation that decided it (:meth:`Evidence.describe`: printable, cut).
        rule: the name of the row of :data:`RULES` that matched.
    """

    cls: str
    reason: str
    evidence: str
    rule: str

    @property
    def retried(self) -> bool:
        """Whether a failure of this class is retried (:data:`RETRIED`)."""
        return RETRIED[self.cls]

    def to_json(self) -> dict[str, object]:
        """JSON-ready dict: ``class``, ``retried``, ``reason``, ``evidence``, ``rule``."""
        return {"class": self.cls, "retried": self.retried, "reason": self.reason, "evidence": self.evidence, "rule": self.rule}

    def describe(self) -> str:
        """One line: ``infrastructure (retried): <reason> [<evidence>]``."""
        return f"{self.cls} ({'retried' if self.retried else 'not retried'}): {self.reason} [{self.evidence}]"


def _signal(e: Evidence) -> int | None:
    """The signal that ended the process: ``signal``, else from an exit code 129-192 (a shell's and
    the kubelet's 128 + N)."""
    if e.signal:
        return e.signal
    if e.exit_code is not None and RETRYABLE_FROM < e.exit_code <= RETRYABLE_FROM + 64:
        return e.exit_code - RETRYABLE_FROM
    return None


def _log(e: Evidence) -> bool:
    """Whether ``e`` is a failure found in the job's output."""
    return e.kind in ("traceback", "error", "abort", "nccl", "exit")


SLURM_STATES = "SLURM squeue(1)/sacct(1) JOB STATE CODES"
K8S_POD = "Kubernetes Pod status (containerStatuses[].state.terminated.reason, status.reason)"
K8S_DISRUPTION = "Kubernetes Pod condition DisruptionTarget (reasons: pod disruption conditions)"

#: The table, in the order each piece of evidence is tried (the first row that matches it).
RULES: tuple[Rule, ...] = (
    Rule("hang", "a watchdog's verdict `hang`, its line in the output (`python -m jobgen.train: error: hang: ...`), or the "
         "entrypoint's exit code 201", INFRASTRUCTURE,
         "no rank made progress for the watchdog's timeout (a hang: a stuck collective, a dead peer that left no error)",
         "jobgen's watchdog (jobgen.train.watchdog)",
         lambda e: e.verdict == HANG_VERDICT or e.exit_code == EXIT_HUNG or (e.kind == "error" and bool(HANG_LINE_RE.search(e.text)))),
    Rule("nccl", "an NCCL or transport error in the output (kind `nccl`, or an exception or abort whose line matches "
         "`triage.NCCL_ERROR_RE`)", INFRASTRUCTURE,
         "an NCCL/transport error between ranks (a network or GPU interconnect fault)",
         "NCCL's and torch ProcessGroupNCCL's error lines", lambda e: _log(e) and bool(NCCL_ERROR_RE.search(e.text))),
    Rule("lost-peer", "a rank's error that says its peer went away (`triage.PEER_LOST_RE`)", INFRASTRUCTURE,
         "a rank lost its peer (the peer's process or node ended first)",
         "gloo's and NCCL's peer errors", lambda e: _log(e) and bool(PEER_LOST_RE.search(e.text))),
    Rule("gpu-error", "a GPU hardware error in the output (uncorrectable ECC, fallen off the bus, GPU lost)", INFRASTRUCTURE,
         "a GPU hardware error", "CUDA runtime error strings, NVIDIA Xid messages",
         lambda e: _log(e) and bool(GPU_ERROR_RE.search(e.text))),
    Rule("cuda-oom", "an exception `CUDA out of memory` (`torch.OutOfMemoryError`)", USER,
         "the model ran out of GPU memory: lower trainer.micro_batch_size, or shard more (strategy, activation checkpointing)",
         "torch.OutOfMemoryError", lambda e: e.kind in ("traceback", "error") and bool(CUDA_OOM_RE.search(e.text))),
    Rule("exception", "a Python traceback in the output (kind `traceback`)", USER,
         "an exception in the job's code: a restart would raise it again", "Python's traceback",
         lambda e: e.kind == "traceback"),
    Rule("entrypoint-error", "the entrypoint's one-line error (`python -m jobgen.train: error: ...`, kind `error`), or "
         "exit code 2", USER, "the entrypoint refused its input or its training raised: fix what its error names",
         "python -m jobgen.train's exit status (jobgen.errors.EXIT_BAD_INPUT)",
         lambda e: e.kind == "error" or e.exit_code == EXIT_BAD_INPUT),
    Rule("abort", "a C++ `terminate called ...` in the output (kind `abort`)", UNKNOWN,
         "native code aborted (std::terminate): a bug in an extension or the library, or a failing device",
         "libstdc++'s terminate handler", lambda e: e.kind == "abort"),
    Rule("node-fail", "SLURM state `NODE_FAIL` or `BOOT_FAIL`, or reason `NodeDown`", INFRASTRUCTURE,
         "a node of the job failed (or did not boot)", SLURM_STATES,
         lambda e: e.state in ("NODE_FAIL", "BOOT_FAIL") or e.reason == "NodeDown"),
    Rule("preempted", "SLURM state `PREEMPTED`; a pod's DisruptionTarget `PreemptionByScheduler`", INFRASTRUCTURE,
         "the scheduler preempted the job for another", f"{SLURM_STATES}; {K8S_DISRUPTION}",
         lambda e: e.state == "PREEMPTED" or e.reason in ("PreemptionByScheduler", "PreemptionByKubeScheduler")),
    Rule("host-oom", "SLURM state `OUT_OF_MEMORY`; srun's `Out Of Memory`; a container's `OOMKilled`", INFRASTRUCTURE,
         "the kernel's OOM killer ended a process (the node's or the container's memory ran out; "
         "check the data loader's workers if it repeats)", f"{SLURM_STATES}; srun; {K8S_POD}",
         lambda e: e.state == "OUT_OF_MEMORY" or e.reason in ("OOMKilled", "Out Of Memory")),
    Rule("evicted", "a pod's reason `Evicted`, `Terminated` (node shutdown), `NodeLost`, `UnexpectedAdmissionError`, or a "
         "DisruptionTarget `DeletionByTaintManager`, `EvictionByEvictionAPI`, `DeletionByPodGC`, `TerminationByKubelet`",
         INFRASTRUCTURE, "Kubernetes removed the pod from its node (eviction, node pressure, drain, shutdown, lost node)",
         f"{K8S_POD}; {K8S_DISRUPTION}",
         lambda e: e.reason in ("Evicted", "Terminated", "NodeLost", "UnexpectedAdmissionError", "DeletionByTaintManager",
                                "EvictionByEvictionAPI", "DeletionByPodGC", "TerminationByKubelet")),
    Rule("time-limit", "SLURM state `TIMEOUT` or `DEADLINE`; a job's reason `DeadlineExceeded`", USER,
         "the job ran past its time limit: raise resources.time_limit_min (a restart resumes from the last checkpoint "
         "but stops at the same limit)", f"{SLURM_STATES}; training-operator runPolicy.activeDeadlineSeconds",
         lambda e: e.state in ("TIMEOUT", "DEADLINE") or e.reason == "DeadlineExceeded"),
    Rule("infrastructure-exit", "the entrypoint's exit code 200", INFRASTRUCTURE,
         "the entrypoint found the cluster at fault (an NCCL/transport error, a lost peer, a GPU error)",
         "jobgen.reports.failure_class.EXIT_INFRASTRUCTURE", lambda e: e.exit_code == EXIT_INFRASTRUCTURE),
    Rule("killed", "signal 9 (SIGKILL) or 15 (SIGTERM): exit code 137 / 143, srun's `Killed` / `Terminated`", INFRASTRUCTURE,
         "the process was killed from outside (the kernel's OOM killer, or the scheduler ending the job)",
         "Linux signal numbers (signal(7)); 128 + N exit codes",
         lambda e: _signal(e) in (SIGKILL, SIGTERM)),
    Rule("interrupted", "signal 2 (SIGINT): exit code 130", USER, "the job was interrupted (Ctrl-C, or scancel --signal=INT)",
         "Linux signal numbers (signal(7)); jobgen.errors.EXIT_INTERRUPTED", lambda e: _signal(e) == SIGINT),
    Rule("crash", "another signal (SIGSEGV, SIGABRT, SIGBUS, ...): exit code 129-192", UNKNOWN,
         "the process crashed on a signal (native code: an extension, a driver, or the hardware)",
         "Linux signal numbers (signal(7)); 128 + N exit codes", lambda e: _signal(e) is not None),
    Rule("not-found", "exit code 126 or 127", USER, "the command could not run (not found or not executable): check the "
         "spec's entrypoint and the image", "POSIX shell exit status (126: not executable, 127: not found)",
         lambda e: e.exit_code in (126, 127)),
    Rule("sys-exit", "a rank's last line before it exited 1-127 without a traceback (kind `exit`)", USER,
         "the program ended itself with an error (sys.exit / SystemExit): its last line says why",
         "torchrun's and srun's exit reports", lambda e: e.kind == "exit" and e.exit_code is not None and 0 < e.exit_code < RETRYABLE_FROM),
    Rule("exit-code", "any other non-zero exit code", UNKNOWN,
         "the process exited non-zero without saying why here: `jobgen logs --first-error JOB` reads its output",
         "training-operator's restartPolicy ExitCode (1-127 permanent, 128-255 retryable)",
         lambda e: e.exit_code not in (None, 0)),
)

_PRECEDENCE = {cls: index for index, cls in enumerate(CLASSES)}


def match(evidence: Evidence) -> Rule | None:
    """The first row of :data:`RULES` that ``evidence`` matches, or ``None``."""
    return next((rule for rule in RULES if rule.matches(evidence)), None)


def classify(evidence: Iterable[Evidence]) -> Classification | None:
    """The class of a failure from everything observed about it.

    Args:
        evidence: the observations, in the order they happened as far as it is known (the
            triage's order first, then the scheduler's).

    Returns:
        the decision (see the module docstring for the order between pieces), or ``None``
        when no piece matches a row (nothing says the job failed).
    """
    best: tuple[tuple[int, int], Rule, Evidence] | None = None
    for index, piece in enumerate(evidence):
        rule = match(piece)
        if rule is None:
            continue
        key = (_PRECEDENCE[rule.cls], index)
        if best is None or key < best[0]:
            best = (key, rule, piece)
    if best is None:
        return None
    _, rule, piece = best
    return Classification(rule.cls, rule.reason, piece.describe(), rule.name)


def unclassified(what: str) -> Classification:
    """The ``unknown`` decision for a failure of which ``what`` (the job's state) is all that is known."""
    return Classification(UNKNOWN, "nothing the scheduler reported says why: `jobgen logs --first-error JOB` reads the output",
                          _cut(what), "no-evidence")


def exit_code_for(cls: str, *, input_error: bool = False, hung: bool = False) -> int:
    """The exit code the entrypoint ends with for a failure of class ``cls``: ``user``: 2 for
    an input error (``input_error``), else 1; ``infrastructure``: :data:`EXIT_HUNG` when a
    watchdog found it hung (``hung``), else :data:`EXIT_INFRASTRUCTURE`; ``unknown``:
    :data:`EXIT_UNKNOWN`. Under ``restartPolicy: ExitCode`` the first two are permanent and
    the others retryable (see the module docstring), as :data:`RETRIED` says.

    Raises:
        ValueError: ``cls`` is not one of :data:`CLASSES`.
    """
    if cls == USER:
        return EXIT_BAD_INPUT if input_error else EXIT_RUNTIME
    if cls == INFRASTRUCTURE:
        return EXIT_HUNG if hung else EXIT_INFRASTRUCTURE
    if cls == UNKNOWN:
        return EXIT_UNKNOWN
    raise ValueError(f"{cls!r} is not a failure class ({', '.join(CLASSES)})")


#: srun's words for how a task ended, as the exit code each stands for: 128 + the signal
#: (:data:`SRUN_SIGNALS`); ``Out Of Memory`` (the cgroup's OOM killer) as SIGKILL's 137. The
#: batch script's restart decision reads srun's task lines through it (:func:`task_exit_classes`).
SRUN_WORD_CODES: tuple[tuple[str, int], ...] = (*((word, RETRYABLE_FROM + number) for word, number in SRUN_SIGNALS.items()),
                                                 ("Out Of Memory", RETRYABLE_FROM + SIGKILL))


def task_exit_classes() -> tuple[tuple[int, int, str], ...]:
    """The class of a task that ended with each exit code 1-255, as ``(low, high, class)``
    ranges (inclusive, ascending, covering 1-255): what :func:`classify` decides from srun's
    report ``task N: Exited with exit code C`` (evidence of kind ``exit``). The SLURM batch
    script renders it to decide on a restart (templates/slurm/job.sbatch.j2): 1-127 ``user``
    (2: the entrypoint's input error), 137/143 and 200-201 ``infrastructure``, other signals
    and 202 ``unknown``."""
    ranges: list[tuple[int, int, str]] = []
    for code in range(1, 256):
        decided = classify([Evidence("srun", kind="exit", exit_code=code)])
        cls = UNKNOWN if decided is None else decided.cls
        if ranges and ranges[-1][2] == cls:
            ranges[-1] = (ranges[-1][0], code, cls)
        else:
            ranges.append((code, code, cls))
    return tuple(ranges)


def srun_evidence(line: str) -> Evidence | None:
    """Evidence from one of srun's task lines (``node: task 3: Out Of Memory``, ``...: Killed``,
    ``...: Exited with exit code 2``; the ``srun: error: `` prefix optional), or ``None``."""
    match_ = SRUN_TASK_RE.match(line if line.startswith("srun: error: ") else f"srun: error: {line}")
    if match_ is None:
        return None
    what = match_.group("what").strip()
    source = f"srun task {match_.group('tasks')}"
    code = SRUN_EXIT_RE.search(what)
    if code is not None:
        return Evidence(source, exit_code=int(code.group("code")))
    if what.startswith("Out Of Memory"):
        return Evidence(source, reason="Out Of Memory")
    signal = next((number for word, number in SRUN_SIGNALS.items() if what.startswith(word)), None)
    return Evidence(source, signal=signal, text=what) if signal is not None else None


def triage_evidence(result: Triage) -> list[Evidence]:
    """The evidence in a job's output: each failure in the triage's order (an ``exit`` with its
    code: a negative one is torchrun's ``-N`` for signal N), then srun's task lines."""
    found = []
    for failure in result.failures:
        code = failure.exit_code
        signal = -code if code is not None and code < 0 else None
        found.append(Evidence(failure.source, kind=failure.kind, text=failure.headline,
                              exit_code=None if signal is not None else code, signal=signal))
    found += [e for e in (srun_evidence(line) for line in result.exits) if e is not None]
    return found


def rules_table() -> str:
    """:data:`RULES` as a Markdown table (the documentation's, docs/failures.md), in the order the rows are tried."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| row | evidence | class | retried | reason | source |", "| --- | --- | --- | --- | --- | --- |"]
    rows += [f"| `{r.name}` | {cell(r.evidence)} | {r.cls} | {'yes' if RETRIED[r.cls] else 'no'} | {cell(r.reason)} | {cell(r.source)} |"
             for r in RULES]
    return "\n".join(rows) + "\n"


def exit_codes_table() -> str:
    """The entrypoint's exit code per class as a Markdown table (docs/failures.md)."""
    rows = ["| class | exit code | under `restartPolicy: ExitCode` |", "| --- | --- | --- |"]
    for label, code in ((f"{USER} (input error)", exit_code_for(USER, input_error=True)), (USER, exit_code_for(USER)),
                        (f"{INFRASTRUCTURE} (hang)", exit_code_for(INFRASTRUCTURE, hung=True)),
                        (INFRASTRUCTURE, exit_code_for(INFRASTRUCTURE)), (UNKNOWN, exit_code_for(UNKNOWN))):
        rows.append(f"| {label} | {code} | {'retryable' if code >= RETRYABLE_FROM else 'permanent'} |")
    return "\n".join(rows) + "\n"


#: What :mod:`jobgen.train.launch` exits with, per what ended torchrun: ``(what torchrun reported,
#: the launcher's exit code, the class it stands for)``. A worker's own code is kept, so the
#: entrypoint's class codes (1, 2, 200-202) reach the pod; a worker killed by signal N becomes
#: 128 + N, as a shell reports it (:func:`_signal` reads it back). torchrun's own failure is
#: jobgen's launch, not the user's code: a rendezvous that timed out or closed, or a store it
#: could not reach, means a peer pod or the network is missing (``infrastructure``); any other
#: exception inside torchrun is ``unknown``. Both are retryable under ``restartPolicy: ExitCode``.
LAUNCHER_EXITS: tuple[tuple[str, str, str], ...] = (
    ("a worker exited 1-255 (the entrypoint: 1 an exception, 2 an input error, 200-202 its class codes)",
     "the worker's code", "as that code: 1-127 user, 200-202 as above"),
    ("a worker was killed by signal N (torchrun's exitcode -N)", "128 + N (137 for SIGKILL)",
     "as the signal: SIGKILL and SIGTERM infrastructure, SIGINT user, others unknown"),
    ("torchrun's rendezvous failed (RendezvousError: timeout, closed, connection) or its store could not be reached",
     str(EXIT_INFRASTRUCTURE), INFRASTRUCTURE),
    ("the launcher itself got a signal N (the kubelet's SIGTERM when the pod is deleted)", "128 + N", "as the signal"),
    ("any other exception inside torchrun", str(EXIT_UNKNOWN), UNKNOWN),
)


def launcher_exit_code(worker_exit: int | None = None, *, rendezvous_error: bool = False, signal: int | None = None) -> int:
    """The exit code of :mod:`jobgen.train.launch` after torchrun failed (:data:`LAUNCHER_EXITS`).

    Args:
        worker_exit: torchrun's exit code of the first worker that failed
            (``ProcessFailure.exitcode``: -N for signal N, else 1-255), or ``None`` when no
            worker failed (torchrun itself raised).
        rendezvous_error: torchrun's own exception was a rendezvous or store failure.
        signal: the signal the launcher itself received (torchrun's ``SignalException``).

    Returns:
        1-255: 1-127 permanent, 128-255 retryable under ``restartPolicy: ExitCode``.
    """
    if signal is not None:
        return RETRYABLE_FROM + signal
    if worker_exit is None:
        return EXIT_INFRASTRUCTURE if rendezvous_error else EXIT_UNKNOWN
    if worker_exit < 0:
        return RETRYABLE_FROM + min(-worker_exit, 127)
    if 0 < worker_exit <= 255:
        return worker_exit
    return EXIT_UNKNOWN


def launcher_exits_table() -> str:
    """:data:`LAUNCHER_EXITS` as a Markdown table (docs/failures.md)."""
    rows = ["| torchrun reported | the pod exits | class |", "| --- | --- | --- |"]
    rows += [f"| {what} | {code} | {cls} |" for what, code, cls in LAUNCHER_EXITS]
    return "\n".join(rows) + "\n"
