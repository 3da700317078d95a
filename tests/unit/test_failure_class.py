"""jobgen.reports.failure_class: every row of the table, precedence between pieces of evidence,
the exit codes under training-operator's ExitCode policy, hostile scheduler text."""

from __future__ import annotations

import json

import pytest

from jobgen.errors import EXIT_BAD_INPUT, EXIT_RUNTIME
from jobgen.reports import failure_class as fc
from jobgen.reports.failure_class import Evidence, classify, exit_code_for, match
from jobgen.reports.triage import LogLine, triage

#: Row name -> evidence that only that row (first) matches, and the class it must give.
CASES = {
    "hang": [Evidence("watchdog", verdict="hang"), Evidence("pod master-0", exit_code=fc.EXIT_HUNG)],
    "nccl": [Evidence("rank 1", kind="nccl", text="NCCL WARN Net : Connection closed"),
             Evidence("rank 0", kind="traceback", text="torch.distributed.DistBackendError: NCCL error in: ...")],
    "lost-peer": [Evidence("rank 0", kind="traceback", text="RuntimeError: Connection closed by peer [10.0.0.2]:1234")],
    "gpu-error": [Evidence("rank 2", kind="traceback", text="RuntimeError: CUDA error: uncorrectable ECC error encountered")],
    "cuda-oom": [Evidence("rank 0", kind="traceback", text="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")],
    "exception": [Evidence("rank 3", kind="traceback", text="ValueError: bad shape")],
    "entrypoint-error": [Evidence("rank 0", kind="error", text="python -m jobgen.train: error: spec.yaml: data.paths: no file"),
                         Evidence("sacct", state="FAILED", exit_code=EXIT_BAD_INPUT)],
    "abort": [Evidence("rank 1", kind="abort", text="terminate called after throwing an instance of 'c10::Error'")],
    "node-fail": [Evidence("sacct", state="NODE_FAIL", exit_code=0), Evidence("sacct", state="BOOT_FAIL"),
                  Evidence("squeue", state="FAILED", reason="NodeDown")],
    "preempted": [Evidence("sacct", state="PREEMPTED", exit_code=0, signal=15),
                  Evidence("pod worker-1", reason="PreemptionByScheduler")],
    "host-oom": [Evidence("sacct", state="OUT_OF_MEMORY", exit_code=0, signal=9), Evidence("pod worker-0", reason="OOMKilled", exit_code=137),
                 Evidence("srun task 3", reason="Out Of Memory")],
    "evicted": [Evidence("pod worker-0", reason="Evicted"), Evidence("pod worker-2", reason="DeletionByTaintManager"),
                Evidence("pod master-0", reason="Terminated")],
    "time-limit": [Evidence("sacct", state="TIMEOUT", exit_code=0, signal=15), Evidence("kube-apiserver", reason="DeadlineExceeded")],
    "infrastructure-exit": [Evidence("pod worker-0", exit_code=fc.EXIT_INFRASTRUCTURE)],
    "killed": [Evidence("pod worker-0", exit_code=137), Evidence("sacct", state="FAILED", exit_code=0, signal=9),
               Evidence("srun task 1", signal=15), Evidence("rank 1", kind="exit", text="step 10", signal=9)],
    "interrupted": [Evidence("local run", exit_code=130)],
    "crash": [Evidence("pod worker-0", exit_code=139), Evidence("sacct", state="FAILED", exit_code=0, signal=7)],
    "not-found": [Evidence("pod master-0", exit_code=127), Evidence("sacct", state="FAILED", exit_code=126)],
    "sys-exit": [Evidence("rank 1", kind="exit", text="giving up: no data", exit_code=3)],
    "exit-code": [Evidence("sacct", state="FAILED", exit_code=1), Evidence("pod worker-0", exit_code=fc.EXIT_UNKNOWN)],
}


def test_every_row_has_a_case():
    assert [rule.name for rule in fc.RULES] == list(CASES)
    assert len({rule.name for rule in fc.RULES}) == len(fc.RULES)


@pytest.mark.parametrize(("name", "evidence"), [(name, e) for name, pieces in CASES.items() for e in pieces],
                         ids=lambda value: value if isinstance(value, str) else value.source)
def test_each_row_matches_its_evidence(name, evidence):
    rule = match(evidence)
    assert rule is not None and rule.name == name
    decided = classify([evidence])
    assert decided is not None and (decided.cls, decided.rule, decided.reason) == (rule.cls, name, rule.reason)
    assert decided.retried is fc.RETRIED[rule.cls]
    assert decided.evidence.startswith(evidence.source + ": ")


def test_the_classes_and_what_is_retried():
    expected = {"hang": "infrastructure", "nccl": "infrastructure", "lost-peer": "infrastructure", "gpu-error": "infrastructure",
                "cuda-oom": "user", "exception": "user", "entrypoint-error": "user", "abort": "unknown",
                "node-fail": "infrastructure", "preempted": "infrastructure", "host-oom": "infrastructure",
                "evicted": "infrastructure", "time-limit": "user", "infrastructure-exit": "infrastructure",
                "killed": "infrastructure", "interrupted": "user", "crash": "unknown", "not-found": "user",
                "sys-exit": "user", "exit-code": "unknown"}
    assert {rule.name: rule.cls for rule in fc.RULES} == expected
    assert fc.RETRIED == {"user": False, "infrastructure": True, "unknown": True}


@pytest.mark.parametrize("evidence", [Evidence("sacct", state="COMPLETED", exit_code=0), Evidence("sacct", state="CANCELLED"),
                                      Evidence("rank 0", text="loss 2.3"), Evidence("pod master-0", reason="Completed", exit_code=0)])
def test_nothing_that_says_failure_is_not_classified(evidence):
    assert match(evidence) is None
    assert classify([evidence]) is None


def test_a_user_traceback_wins_over_an_oom_kill_after_it():
    """An OOM kill of rank 1 after rank 0's user exception: the exception decides, whichever order."""
    user = Evidence("rank 0", kind="traceback", text="KeyError: 'labels'")
    oom = Evidence("srun task 1", reason="Out Of Memory")
    for order in ([user, oom], [oom, user]):
        decided = classify(order)
        assert decided is not None and (decided.cls, decided.rule) == ("user", "exception")
        assert decided.evidence.startswith("rank 0: ")


def test_a_user_error_wins_over_the_hang_and_lost_peers_it_causes():
    pieces = [Evidence("watchdog", verdict="hang"), Evidence("rank 0", kind="traceback", text="RuntimeError: Connection reset by peer"),
              Evidence("rank 1", kind="traceback", text="AssertionError: labels out of range")]
    decided = classify(pieces)
    assert decided is not None and (decided.cls, decided.evidence) == ("user", "rank 1: kind traceback, AssertionError: labels out of range")


def test_infrastructure_wins_over_unknown_and_the_earlier_piece_within_a_class():
    decided = classify([Evidence("sacct", state="FAILED", exit_code=1), Evidence("pod worker-1", reason="Evicted"),
                        Evidence("sacct", state="NODE_FAIL")])
    assert decided is not None and (decided.cls, decided.rule) == ("infrastructure", "evicted")


def test_from_a_triage_of_srun_output():
    """srun's output: rank 0's traceback, then srun's report of rank 1's OOM kill."""
    lines = ["0: Traceback (most recent call last):", '0:   File "train.py", line 3, in <module>', "0: ValueError: bad batch",
             "srun: error: gpu-7: task 1: Out Of Memory", "srun: error: gpu-6: task 0: Exited with exit code 1"]
    found = triage(_slurm_lines(lines))
    evidence = fc.triage_evidence(found)
    assert [e.source for e in evidence] == ["rank 0", "srun task 1", "srun task 0"]
    assert (evidence[1].reason, evidence[2].exit_code) == ("Out Of Memory", 1)
    decided = classify(evidence)
    assert decided is not None and (decided.cls, decided.rule) == ("user", "exception")
    only_oom = classify(fc.triage_evidence(triage(_slurm_lines(lines[3:4]))))
    assert only_oom is not None and (only_oom.cls, only_oom.rule) == ("infrastructure", "host-oom")


def _slurm_lines(texts: list[str]) -> list[LogLine]:
    out = []
    for position, text in enumerate(texts):
        label, sep, rest = text.partition(": ")
        if label.isdigit():
            out.append(LogLine(f"rank {label}", int(label), None, position, None, rest))
        else:
            out.append(LogLine("batch", None, None, position, None, text))
    return out


def test_torchrun_signal_exit_is_a_signal():
    """torchrun reports a worker killed by signal N as exitcode -N."""
    lines = ["[default1]:step 5", "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 77)"]
    from jobgen.reports.triage import torchrun_lines

    found = triage(torchrun_lines(lines))
    assert found.first is not None and (found.first.kind, found.first.exit_code) == ("exit", -9)
    decided = classify(fc.triage_evidence(found))
    assert decided is not None and (decided.rule, decided.cls) == ("killed", "infrastructure")


@pytest.mark.parametrize("line", ["gpu-1: task 2: Killed", "srun: error: gpu-1: tasks 0-3: Terminated",
                                  "gpu-1: task 2: Segmentation fault (core dumped)", "gpu-1: task 2: Exited with exit code 137"])
def test_srun_lines(line):
    evidence = fc.srun_evidence(line)
    assert evidence is not None and match(evidence) is not None


@pytest.mark.parametrize("line", ["not srun at all", "gpu-1: task x: Killed", "gpu-1: task 2: something else", ""])
def test_srun_lines_that_say_nothing(line):
    evidence = fc.srun_evidence(line)
    assert evidence is None or match(evidence) is None


HOSTILE = ["A" * 300, "Evicted\nhint: run rm -rf /", "\x1b[31mred\x1b[0m OOMKilled", "x\x00y\r\u202eevil", "'; $(reboot) `id`"]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_scheduler_text_is_shown_escaped_and_cut(text):
    decided = classify([Evidence("pod worker-0", reason=text, exit_code=137), Evidence(text, kind="traceback", text=text)])
    assert decided is not None
    shown = decided.evidence
    assert shown.isprintable() and "\n" not in shown and "\x1b" not in shown and "\x00" not in shown
    assert len(shown) <= 2 * fc.EVIDENCE_CHARS + 40
    # a hostile reason never matches a row by containing its word
    assert match(Evidence("pod worker-0", reason=text)) is None
    assert json.loads(json.dumps(decided.to_json()))["evidence"] == shown
    assert decided.describe().count("\n") == 0


def test_a_300_byte_reason_is_cut_with_an_ellipsis():
    shown = Evidence("squeue", state="FAILED", reason="R" * 300, exit_code=1).describe()
    assert "R" * (fc.EVIDENCE_CHARS - 3) + "..." in shown and "R" * fc.EVIDENCE_CHARS not in shown


def test_escapes_are_shown_as_escapes():
    shown = Evidence("squeue", state="FAILED", reason="a\nb\x1bc", exit_code=1).describe()
    assert "a\\nb\\x1bc" in shown


# ------------------------------------------------------------------ exit codes (restartPolicy: ExitCode)

def test_exit_codes_follow_the_exitcode_policy():
    """1-127 permanent, 128-255 retryable: a user error is permanent, infrastructure and unknown retryable."""
    assert exit_code_for("user") == EXIT_RUNTIME == 1
    assert exit_code_for("user", input_error=True) == EXIT_BAD_INPUT == 2
    assert exit_code_for("infrastructure") == fc.EXIT_INFRASTRUCTURE
    assert exit_code_for("infrastructure", hung=True) == fc.EXIT_HUNG
    assert exit_code_for("unknown") == fc.EXIT_UNKNOWN
    for cls in fc.CLASSES:
        for flags in ({}, {"input_error": True}, {"hung": True}):
            code = exit_code_for(cls, **flags)
            assert 0 < code <= 255
            assert (code >= fc.RETRYABLE_FROM) is fc.RETRIED[cls]
    codes = {fc.EXIT_INFRASTRUCTURE, fc.EXIT_HUNG, fc.EXIT_UNKNOWN}
    assert len(codes) == 3 and all(192 < code < 255 for code in codes)  # not 128 + a Linux signal, not ssh's 255


def test_the_entrypoint_exit_codes_classify_as_their_class():
    for cls, flags in (("user", {"input_error": True}), ("infrastructure", {}), ("infrastructure", {"hung": True}), ("unknown", {})):
        decided = classify([Evidence("pod worker-0", exit_code=exit_code_for(cls, **flags))])
        assert decided is not None and decided.cls == cls


@pytest.mark.parametrize("cls", ["", "User", "infra", None])
def test_exit_code_for_refuses_an_unknown_class(cls):
    with pytest.raises(ValueError, match="not a failure class"):
        exit_code_for(cls)


def test_the_tables_list_every_row():
    table = fc.rules_table()
    assert table.count("\n") == len(fc.RULES) + 2
    for rule in fc.RULES:
        assert f"| `{rule.name}` |" in table
    assert "| infrastructure (hang) | 201 | retryable |" in fc.exit_codes_table()
    assert "| user (input error) | 2 | permanent |" in fc.exit_codes_table()


# ------------------------------------------------------------------ a status's own evidence


@pytest.mark.parametrize(("details", "expected"), [
    ({"exit_code": "1:0", "reason": "None"}, ("", 1, None)),  # squeue's "None": no reason
    ({"exit_code": "0:9", "reason": "NonZeroExitCode"}, ("NonZeroExitCode", 0, 9)),
    ({"exit_code": "-9"}, ("", None, 9)),  # torchrun's -N: killed by signal N
    ({"exit_code": "2"}, ("", 2, None)),
    ({"exit_code": "1:0\nx"}, ("", None, None)), ({"exit_code": "a:b"}, ("", None, None)), ({}, ("", None, None)),
])
def test_status_evidence_reads_the_exit_code_and_reason(details, expected):
    from jobgen.backends.base import JobStatus, status_evidence
    from jobgen.jobdir.submission import JobHandle

    got = status_evidence(JobStatus(JobHandle.parse("slurm://lab/7"), "FAILED", "sacct", details))
    assert (got.reason, got.exit_code, got.signal) == expected and got.state == "FAILED"
