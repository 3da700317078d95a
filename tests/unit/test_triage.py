"""jobgen.reports.triage: each rank's first failure, the earliest first (`jobgen logs --first-error`)."""

from __future__ import annotations

from datetime import datetime, timezone

from jobgen.reports.triage import LiveFilter, LogLine, format_triage, parse_rfc3339, torchrun_line, torchrun_lines, triage

#: A 2-node job in which rank 1 raised; rank 0 then failed in the next collective, and srun
#: reported both tasks (the merged srun --label stream, in the order srun wrote it).
SRUN_LOG = """\
jobgen: job 77 on 2 node(s), restart 0, master node1:29500
0: step 10/100 loss 5.10
1: step 10/100 loss 5.11
1: Traceback (most recent call last):
1:   File "/work/user/model.py", line 40, in training_step
1:     loss = self.loss(batch)
1:            ^^^^^^^^^^^^^^^^
1: ValueError: batch 17 has NaN labels
0: Traceback (most recent call last):
0:   File "/usr/lib/python3/site-packages/torch/distributed/c10d.py", line 9, in all_reduce
0:     work.wait()
0: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.213.7.12]:41522
srun: error: node2: task 1: Exited with exit code 1
srun: error: node1: task 0: Exited with exit code 1
"""


def srun_lines(text: str) -> list[LogLine]:
    lines = []
    for position, line in enumerate(text.splitlines()):
        label, sep, rest = line.partition(": ")
        if sep and label.strip().isdigit():
            lines.append(LogLine(f"rank {int(label)}", int(label), None, position, None, rest))
        else:
            lines.append(LogLine("batch script", None, None, position, None, line))
    return lines


def test_the_rank_that_raised_first_is_first_with_its_node_and_traceback():
    result = triage(srun_lines(SRUN_LOG))
    first = result.first
    assert first is not None
    assert (first.rank, first.node, first.kind) == (1, "node2", "traceback")
    assert first.headline == "ValueError: batch 17 has NaN labels"
    assert first.lines[0] == "Traceback (most recent call last):" and first.lines[-1] == first.headline
    assert [f.rank for f in result.failures] == [1, 0]
    assert result.failures[1].node == "node1" and "Connection closed by peer" in result.failures[1].headline
    assert result.ordered_by == "position"
    assert result.exits == ("node2: task 1: Exited with exit code 1", "node1: task 0: Exited with exit code 1")


#: What the SLURM lab wrote (torch 2.13): once init_process_group has run, torch.distributed's
#: excepthook prefixes each line of an uncaught exception with "[rank<N>]: ".
TORCH_EXCEPTHOOK_LOG = """\
0: failing: rank 0 on node1 after all_reduce = 2
1: failing: rank 1 on node2 after all_reduce = 2
1: [rank1]: Traceback (most recent call last):
1: [rank1]:   File "/tmp/job/fail_on_rank1.py", line 11, in <module>
1: [rank1]:     raise ValueError("rank 1 fails on purpose after the all-reduce")
1: [rank1]: ValueError: rank 1 fails on purpose after the all-reduce
1: terminate called without an active exception
0: [rank0]: Traceback (most recent call last):
0: [rank0]:   File "/tmp/job/fail_on_rank1.py", line 12, in <module>
0: [rank0]:     dist.barrier()
0: [rank0]:     ^^^^^^^^^^^^^^
0: [rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer
srun: error: node2: task 1: Aborted
0: slurmstepd-node1: error: *** STEP 3.0 ON node1 CANCELLED AT 2026-11-23T07:34:07 ***
srun: error: node1: task 0: Terminated
"""


def test_tracebacks_with_torch_distributeds_rank_prefix_are_found():
    result = triage(srun_lines(TORCH_EXCEPTHOOK_LOG))
    first = result.first
    assert first is not None and (first.rank, first.node, first.kind) == (1, "node2", "traceback")
    assert first.headline == "ValueError: rank 1 fails on purpose after the all-reduce"
    assert first.lines[0] == "Traceback (most recent call last):" and len(first.lines) == 4
    assert [f.rank for f in result.failures] == [1, 0] and result.failures[1].headline.startswith("RuntimeError: ")


def test_order_in_the_stream_decides_not_the_rank_number():
    # rank 0's error is a cause of its own here (a lost peer would come after: see below)
    swapped = SRUN_LOG.replace("ValueError: batch 17", "ValueError: batch 18").replace(
        "Connection closed by peer [10.213.7.12]:41522", "CUDA error: an illegal memory access was encountered")
    lines = srun_lines(swapped)
    # move rank 0's traceback before rank 1's: now rank 0 failed first
    rank0 = [line for line in lines if line.rank == 0 and line.position >= 8]
    others = [line for line in lines if line not in rank0]
    reordered = [LogLine(x.source, x.rank, x.node, i, x.timestamp, x.text) for i, x in enumerate(others[:3] + rank0 + others[3:])]
    assert triage(reordered).first.rank == 0


def test_a_chained_traceback_ends_at_its_last_exception_line():
    text = """\
0: Traceback (most recent call last):
0:   File "a.py", line 1, in f
0: KeyError: 'x'
0:
0: During handling of the above exception, another exception occurred:
0:
0: Traceback (most recent call last):
0:   File "a.py", line 3, in g
0: RuntimeError: lookup failed
0: step 11 after the error
"""
    first = triage(srun_lines(text)).first
    assert first.headline == "RuntimeError: lookup failed"
    assert first.lines[-1] == "RuntimeError: lookup failed" and "KeyError: 'x'" in first.lines


def test_nccl_errors_and_the_entrypoints_one_line_error_are_failures():
    text = """\
0: node1:123:456 [0] NCCL INFO Channel 00/02
1: node2:789:790 [1] NCCL WARN NET/IB : Got completion with error 12, opcode 0
1: more context
0: python -m jobgen.train: error: spec.data.paths: no files match 'missing/*.txt'; hint: check the paths
"""
    result = triage(srun_lines(text))
    assert [(f.rank, f.kind) for f in result.failures] == [(1, "nccl"), (0, "error")]
    assert "NCCL WARN" in result.first.headline and result.first.lines[1] == "more context"
    assert "NCCL INFO" not in " ".join(f.headline for f in result.failures)


def test_timestamps_order_pods_when_every_failure_has_one():
    def pod(name, position, stamp, text, node="n1"):
        return LogLine(f"pod {name}", None, node, position, parse_rfc3339(stamp), text)

    lines = [
        pod("job-master-0", 0, "2026-11-23T07:00:05.000000002Z", "Traceback (most recent call last):"),
        pod("job-master-0", 1, "2026-11-23T07:00:05.000000003Z", "RuntimeError: peer closed"),
        pod("job-worker-0", 0, "2026-11-23T07:00:04.5Z", "Traceback (most recent call last):", node="n2"),
        pod("job-worker-0", 1, "2026-11-23T07:00:04.6Z", "ZeroDivisionError: division by zero", node="n2"),
    ]
    result = triage(lines)
    assert result.ordered_by == "timestamp"
    assert result.first.source == "pod job-worker-0" and result.first.node == "n2"
    assert result.first.timestamp == datetime(2026, 11, 23, 7, 0, 4, 500000, tzinfo=timezone.utc)
    # one failure without a time: positions decide, and the report says so
    untimed = [lines[0], lines[1], LogLine("pod job-worker-0", None, "n2", 5, None, "Traceback (most recent call last):"),
               LogLine("pod job-worker-0", None, "n2", 6, None, "ZeroDivisionError: division by zero")]
    assert triage(untimed).ordered_by == "position" and triage(untimed).first.source == "pod job-master-0"


def test_rfc3339_parsing():
    assert parse_rfc3339("2026-11-23T07:01:02.123456789Z") == datetime(2026, 11, 23, 7, 1, 2, 123456, tzinfo=timezone.utc)
    assert parse_rfc3339("2026-11-23T07:01:02+02:00").utcoffset().total_seconds() == 7200
    assert parse_rfc3339("step") is None and parse_rfc3339("2026-13-40T99:00:00Z") is None


def test_output_without_a_failure_says_so():
    result = triage(srun_lines("0: step 1\n1: step 1\n"))
    assert result.first is None and result.failures == ()
    assert "no rank's output shows" in format_triage(result, "slurm://c/1")[0]


def test_the_report_leads_with_the_first_failure():
    text = "\n".join(format_triage(triage(srun_lines(SRUN_LOG)), "slurm://c/77"))
    assert text.startswith("first failure: rank 1 on node2 (traceback; first in the job's output of 2 failed source(s))")
    assert "  | ValueError: batch 17 has NaN labels" in text
    assert "rank 0 on node1: RuntimeError" in text.split("then:")[1]


def test_local_jobs_say_first_error_is_not_theirs(run_cli, tmp_path):
    result = run_cli("logs", "--first-error", f"local://{tmp_path}")
    assert result.code == 2 and "not supported for local jobs" in result.stderr and "hint:" in result.stderr


def test_a_rank_that_lost_its_peer_comes_after_the_peers_own_error():
    # what 2 local gloo ranks wrote: rank 0's lost connection came out first
    lines = srun_lines(SRUN_LOG)
    rank0 = [line for line in lines if line.rank == 0 and line.position >= 8]
    others = [line for line in lines if line not in rank0]
    reordered = [LogLine(x.source, x.rank, x.node, i, x.timestamp, x.text) for i, x in enumerate(others[:3] + rank0 + others[3:])]
    result = triage(reordered)
    assert [f.rank for f in result.failures] == [1, 0] and result.first.headline == "ValueError: batch 17 has NaN labels"
    assert format_triage(result, "local:///r")[0].endswith("of 2 failed source(s); rank 0 reported a lost peer earlier)")


def test_torchrun_tee_labels_name_the_ranks_and_torchruns_own_report_is_no_rank():
    text = [
        "==== jobgen submit 2026-11-25T16:15:35+00:00 $ python -m torch.distributed.run --tee 3 -m jobgen.train",
        "[default1]:[rank1]: Traceback (most recent call last):",
        "[default1]:[rank1]:   File \"m.py\", line 7, in training_step",
        "[default1]:[rank1]: ValueError: rank one broke",
        "[default0]:python -m jobgen.train: error: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:7078",
        "Traceback (most recent call last):",
        "  File \"run.py\", line 1, in <module>",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ]
    result = triage(torchrun_lines(text))
    assert [(f.source, f.kind) for f in result.failures] == [("rank 1", "traceback"), ("rank 0", "error")]
    assert result.first.headline == "ValueError: rank one broke"


def test_the_live_filter_shows_the_ranks_lines_and_holds_back_failures_and_torchruns_report():
    text = [
        "[default0]:step 1/4 | loss 1.0",
        "[default1]:rank 1 says hello",                        # every rank's own lines are shown
        "W1125 16:15:35 api.py:1028] some torchrun warning",    # torchrun, before any failure: shown
        "[default1]:[rank1]: Traceback (most recent call last):",
        "[default1]:[rank1]:   File \"m.py\", line 7, in training_step",
        "[default1]:[rank1]: ValueError: rank one broke",
        "[default0]:[rank0]: Traceback (most recent call last):",
        "[default0]:[rank0]:   File \"c10d.py\", line 9, in barrier",
        "[default0]:[rank0]: RuntimeError: Connection closed by peer",
        "[default0]:teardown note",                            # rank 0 after its traceback: shown
        "E1125 16:15:35 api.py:1002] failed (exitcode: 1) local_rank: 1",
        "Traceback (most recent call last):",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "Root Cause (first observed failure):",
    ]
    live = LiveFilter()
    shown = [out for i, t in enumerate(text) if (out := live.show(torchrun_line(t, i))) is not None]
    assert shown == ["step 1/4 | loss 1.0", "rank 1 says hello", "W1125 16:15:35 api.py:1028] some torchrun warning",
                     "teardown note"]
    assert live.failed


#: A failed CI run (the SLURM lab, examples/scripts/ddp_allreduce.py before it ended
#: with os._exit): both ranks finished, then rank 1 aborted in interpreter teardown and srun
#: killed rank 0. No traceback anywhere.
TEARDOWN_ABORT_LOG = """\
jobgen: job 7 on 2 node(s), restart 0, master node1:29500
0: ddp: rank 0 3 step(s), weights in sync across ranks: True
1: ddp: rank 1 3 step(s), weights in sync across ranks: True
1: terminate called without an active exception
srun: error: node2: task 1: Aborted
srun: launch/slurm: _step_signal: Terminating StepId=7.0
0: slurmstepd-node1: error: *** STEP 7.0 ON node1 CANCELLED AT 2026-11-26T09:33:43 ***
srun: error: node1: task 0: Terminated
srun: Force Terminated StepId=7.0
"""


def test_a_cpp_abort_is_a_failure_and_one_at_teardown_names_the_remedy():
    result = triage(srun_lines(TEARDOWN_ABORT_LOG))
    assert [(f.rank, f.node, f.kind) for f in result.failures] == [(1, "node2", "abort")]
    assert result.first.headline == "terminate called without an active exception"
    assert "os._exit" in result.first.hint and "Command mode" in result.first.hint
    assert result.first.to_json()["hint"] == result.first.hint
    text = "\n".join(format_triage(result, "slurm://c/7"))
    assert text.startswith("first failure: rank 1 on node2 (abort;")
    assert f"  hint: {result.first.hint}" in text


def test_an_uncaught_cpp_exception_is_an_abort_with_its_what_and_no_teardown_hint():
    text = """\
0: terminate called after throwing an instance of 'gloo::IoException'
0:   what():  [../gloo/transport/tcp/pair.cc:589] Read error [10.0.0.2]:3977: Connection reset by peer
1: Traceback (most recent call last):
1:   File "train.py", line 3, in <module>
1: KeyError: 'x'
"""
    result = triage(srun_lines(text))
    # rank 0's abort says it lost its peer: rank 1's own error comes first
    assert [(f.rank, f.kind) for f in result.failures] == [(1, "traceback"), (0, "abort")]
    abort = result.failures[1]
    assert abort.headline == ("terminate called after throwing an instance of 'gloo::IoException': what():  "
                              "[../gloo/transport/tcp/pair.cc:589] Read error [10.0.0.2]:3977: Connection reset by peer")
    assert abort.hint is None and result.first.hint is None


def test_the_live_filter_holds_back_an_abort_line():
    live = LiveFilter()
    assert live.show(torchrun_line("[default1]:step 4/4", 0)) == "step 4/4"
    assert live.show(torchrun_line("[default1]:terminate called without an active exception", 1)) is None
    assert live.failed


def test_a_rank_srun_reports_exited_without_a_traceback_is_named_by_its_last_line():
    """``sys.exit("message")`` on a rank leaves no traceback, only the message; srun's
    exit line says the task failed, so its last line is its failure (kind ``exit``), after any
    rank with a traceback; a rank srun reports as exiting 0 is no failure."""
    log = ("0: step 10/100 loss 5.10\n1: step 10/100 loss 5.11\n1: config error: no dataset named 'wiki'\n"
           "srun: error: node2: task 1: Exited with exit code 3\n")
    found = triage(srun_lines(log))
    assert [(f.source, f.kind, f.node) for f in found.failures] == [("rank 1", "exit", "node2")]
    assert found.first.headline == "config error: no dataset named 'wiki'" and "code 3" in found.first.hint
    with_traceback = triage(srun_lines(log + "0: Traceback (most recent call last):\n0:   File \"x\", line 1\n0: KeyError: 'a'\n"))
    assert [(f.source, f.kind) for f in with_traceback.failures] == [("rank 0", "traceback"), ("rank 1", "exit")]
    assert triage(srun_lines("0: all done\n")).first is None  # no launcher report of an exit: nothing guessed
