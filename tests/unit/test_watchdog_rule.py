"""The progress watchdog's spec fields (``watchdog.hang_timeout_s``, ``watchdog.step_time_factor``)
and its decision (:class:`jobgen.train.watchdog.Observer`) on fed heartbeats; the real thread on
an in-process store. The 2-rank runs with a stopped and a slow rank are in
tests/entrypoint/test_watchdog.py."""

from __future__ import annotations

import json

import pytest

from jobgen.errors import ConfigError
from jobgen.jobdir.summary import parse_summary
from jobgen.reports.failure_class import EXIT_HUNG, Evidence, classify
from jobgen.reports.straggler import straggler_details
from jobgen.specs.load import validate
from jobgen.specs.training import TrainingSpec, WatchdogSpec
from jobgen.train.watchdog import (
    CHECKPOINT,
    DONE,
    MIN_COMPUTE_SAMPLES,
    TRAIN,
    VALIDATE,
    Beat,
    Observer,
    Straggler,
    WatchLimits,
    WatchThread,
    find_straggler,
    tick_seconds,
)


def spec(watchdog: object, **extra: object) -> TrainingSpec:
    return validate(TrainingSpec, {"name": "job", "watchdog": watchdog, **extra}, "spec.yaml")


def test_defaults_are_600_s_and_10_and_stay_out_of_spec_json():
    plain = validate(TrainingSpec, {"name": "job"}, "spec.yaml")
    assert plain.watchdog == WatchdogSpec() and (plain.watchdog.hang_timeout_s, plain.watchdog.step_time_factor) == (600, 10)
    assert "watchdog" not in plain.model_dump(mode="json")
    dumped = spec({"hang_timeout_s": 3, "step_time_factor": 2.5}).model_dump(mode="json")
    assert dumped["watchdog"] == {"hang_timeout_s": 3, "step_time_factor": 2.5, "straggler_factor": 1.5}
    assert TrainingSpec.model_validate(dumped).watchdog.hang_timeout_s == 3  # spec.json reads back


@pytest.mark.parametrize(("field", "given", "says"), [
    ("hang_timeout_s", -1, "-1 is outside 1 to 604800"), ("hang_timeout_s", 0, "0 is outside 1 to 604800"),
    ("hang_timeout_s", 10**30, "is outside 1 to 604800"), ("hang_timeout_s", float("inf"), "inf is outside"),
    ("hang_timeout_s", float("nan"), "give a number from 1 to 604800"), ("hang_timeout_s", "600", "give a number"),
    ("hang_timeout_s", True, "give a number"), ("hang_timeout_s", None, "give a number"),
    ("hang_timeout_s", "x" * 300 + "\n\x1b[2J", "give a number"), ("hang_timeout_s", b"\xff\xfe", "give a number"),
    ("step_time_factor", 0.5, "0.5 is outside 1 to 1000"), ("step_time_factor", 1001, "1001 is outside 1 to 1000"),
    ("step_time_factor", "10", "give a number from 1 to 1000"), ("step_time_factor", [10], "give a number"),
    ("straggler_factor", 1, "1 is outside 1.1 to 1000"), ("straggler_factor", -2, "-2 is outside 1.1 to 1000"),
    ("straggler_factor", 1e309, "inf is outside"), ("straggler_factor", float("nan"), "give a number from 1.1 to 1000"),
    ("straggler_factor", "1.5", "give a number"), ("straggler_factor", False, "give a number"),
    ("straggler_factor", "x" * 300 + "\n\x1b[2J", "give a number"), ("straggler_factor", b"\xff", "give a number"),
])
def test_a_bad_value_is_refused_naming_the_field_and_the_fix(field, given, says):
    with pytest.raises(ConfigError) as caught:
        spec({field: given})
    text = str(caught.value)
    assert f"watchdog.{field}: " in text and says in text and "spec.yaml" in text, text
    assert "e.g. " in text and "\x1b" not in text and text.count("\n") <= 2


def test_unknown_keys_are_refused_and_command_mode_refuses_the_section():
    with pytest.raises(ConfigError, match=r"watchdog.hang_timeout: unknown key \(did you mean 'hang_timeout_s'\?\)"):
        spec({"hang_timeout": 3})
    with pytest.raises(ConfigError, match="so watchdog would do nothing"):
        spec({"hang_timeout_s": 3}, entrypoint={"module": "train"})


def beat(step: int, count: int, phase: str = TRAIN, host: str = "node-a", pid: int = 100) -> Beat:
    return Beat(step, phase, count, host, pid)


def feed(observer: Observer, times_and_beats):
    """Feed (time, {rank: beat}) ticks; the first verdict and its time, or (None, None)."""
    for now, beats in times_and_beats:
        verdict = observer.observe(now, beats)
        if verdict is not None:
            return now, verdict
    return None, None


def test_a_stopped_rank_is_named_once_no_rank_advanced_for_the_timeout():
    observer = Observer((0, 1), hang_timeout_s=3, factor=10, interval_s=0.1, start=0.0)
    ticks = [(t / 10, {0: beat(t, t), 1: beat(t, t, host="node-b", pid=7)}) for t in range(1, 20)]  # 1 step per tick
    # rank 1 stops at t=2.0 (step 20); rank 0 heart-beats on, stuck at step 20 in the collective
    ticks += [(2.0 + t / 10, {0: beat(20, 20 + t), 1: beat(20, 20, host="node-b", pid=7)}) for t in range(1, 60)]
    when, verdict = feed(observer, ticks)
    assert 2.1 + 3.0 - 1e-6 <= when <= 2.1 + 3.0 + 0.1 + 1e-6  # the last step (20) was seen at 2.1: found within a tick after 3 s
    assert verdict.limit_s == 3 and verdict.median_step_s == pytest.approx(0.1)
    assert [(s.rank, s.host, s.pid, s.step) for s in verdict.first] == [(1, "node-b", 7, 20)] and not verdict.behind
    text = verdict.text(3, 10)
    assert text.startswith(f"hang: no rank advanced its optimizer step for {verdict.idle_s:.1f} s (limit 3 s = "
                           "max(hang_timeout_s 3, 10 x median step 0.1 s))")
    assert f"heartbeat stopped first: rank 1 on node node-b (pid 7) at step 20, silent {verdict.first[0].silent_s:.1f} s" in text
    doc = verdict.to_json()
    assert doc["exit_code"] == EXIT_HUNG == 201 and doc["heartbeat_stopped_first"][0]["rank"] == 1
    assert classify([Evidence("watchdog", verdict="hang")]).rule == "hang"  # the classes' table knows the verdict


def test_slow_steps_raise_the_limit_to_factor_times_the_median():
    observer = Observer((0,), hang_timeout_s=3, factor=10, interval_s=1, start=0.0)
    ticks = [(float(t), {0: beat(t // 2, t)}) for t in range(1, 41)]  # a step every 2 s: median 2 s -> limit 20 s
    assert feed(observer, ticks) == (None, None)
    assert observer.limit_s() == pytest.approx(20)
    when, verdict = feed(observer, [(40.0 + t, {0: beat(20, 40 + t)}) for t in range(1, 40)])
    assert when == pytest.approx(40 + 20, abs=1.01) and verdict.limit_s == pytest.approx(20)
    assert not verdict.first and [s.rank for s in verdict.behind] == [0]  # every heartbeat live: a deadlock
    assert "every heartbeat is live" in verdict.text(3, 10)


@pytest.mark.parametrize("phase", [VALIDATE, CHECKPOINT, DONE])
def test_validation_and_checkpoint_pause_the_clock_while_the_rank_heart_beats(phase):
    observer = Observer((0, 1), hang_timeout_s=3, factor=10, interval_s=0.5, start=0.0)
    # rank 1 in a 30 s phase, heartbeat live; rank 0 waits at step 5
    ticks = [(t / 2, {0: beat(5, t), 1: beat(5, t, phase=phase)}) for t in range(1, 60)]
    assert feed(observer, ticks) == (None, None)
    # the phase ends and nothing advances: the clock runs again from there
    when, verdict = feed(observer, [(30 + t / 2, {0: beat(5, 60 + t), 1: beat(5, 60 + t)}) for t in range(1, 20)])
    assert when == pytest.approx(30 + 3, abs=0.51) and not verdict.first


def test_a_rank_stopped_inside_a_paused_phase_is_found_after_at_most_one_and_a_half_timeouts():
    observer = Observer((0, 1), hang_timeout_s=3, factor=10, interval_s=0.5, start=0.0)
    ticks = [(t / 2, {0: beat(5, t), 1: beat(5, 1, phase=CHECKPOINT)}) for t in range(1, 40)]  # rank 1's beat never moves
    when, verdict = feed(observer, ticks)
    assert when is not None and when <= 1.5 * 3 + 0.5 and [s.rank for s in verdict.first] == [1]


def test_a_live_rank_waiting_in_a_save_for_a_stopped_peer_does_not_hold_the_pause():
    """Rank 0 saved a checkpoint and waits in its barrier (phase ``checkpoint``, heartbeat live)
    for rank 1, stopped in a training step: the pause is void once rank 1 is silent for half the timeout."""
    observer = Observer((0, 1), hang_timeout_s=3, factor=10, interval_s=0.5, start=0.0)
    ticks = [(t / 2, {0: beat(20, t, phase=CHECKPOINT), 1: beat(20, 1)}) for t in range(1, 40)]
    when, verdict = feed(observer, ticks)
    assert when is not None and when <= 1.5 * 3 + 0.5 and [s.rank for s in verdict.first] == [1]


def test_a_rank_that_never_published_is_named():
    observer = Observer((0, 1, 2), hang_timeout_s=2, factor=10, interval_s=0.5, start=0.0)
    when, verdict = feed(observer, [(t / 2, {0: beat(0, t), 1: beat(0, t), 2: None}) for t in range(1, 20)])
    assert when == pytest.approx(2) and [(s.rank, s.step) for s in verdict.first] == [(2, None)]
    assert "rank 2 on node unknown (never published) (pid 0) at step unknown" in verdict.text(2, 10)


def test_a_silent_store_is_a_hang_after_the_timeout():
    observer = Observer((0, 1), hang_timeout_s=3, factor=10, interval_s=0.5, start=0.0)
    assert observer.observe(1.0, {0: beat(1, 1), 1: beat(1, 1)}) is None
    assert observer.store_silent(3.9, "10.0.0.1:29500") is None
    verdict = observer.store_silent(4.0, "10.0.0.1:29500")
    assert verdict.store == "10.0.0.1:29500" and "the rendezvous store at 10.0.0.1:29500 did not answer for 3.0 s" in verdict.text(3, 10)


@pytest.mark.parametrize("raw", [b"", b"\xff\xfe", b"{}", b'{"step": "x"}', b"[1]", b"x" * 300])
def test_a_malformed_heartbeat_reads_as_unpublished(raw):
    assert Beat.loads(raw) is None
    assert Beat.loads(beat(3, 4, host="h o\"s\nt").dumps().encode()) == beat(3, 4, host="h o\"s\nt")


def test_tick_is_a_twentieth_of_the_timeout_within_bounds():
    assert (tick_seconds(1), tick_seconds(3), tick_seconds(600), tick_seconds(6000)) == (0.1, 0.15, 5.0, 5.0)


def test_the_thread_on_a_real_store_dumps_its_stacks_writes_the_verdict_and_exits_201(tmp_path):
    """Two WatchThreads on one in-process HashStore, rank 1 never started (a rank stopped before
    its first beat): rank 0 decides, rank 0's stacks and the verdict land in hang/."""
    import threading

    import torch.distributed as dist

    store = dist.HashStore()
    exited = threading.Event()
    codes: list[int] = []
    thread = WatchThread(store, 0, 2, limits=WatchLimits(1, 10), run_dir=tmp_path / "run dir 'x'", address="here",
                         exit=lambda code: (codes.append(code), exited.set()))
    thread.start()
    assert exited.wait(30)
    assert codes == [EXIT_HUNG]
    hang = tmp_path / "run dir 'x'" / "hang"
    doc = json.loads((hang / "verdict.json").read_text())
    assert doc["decided_by_rank"] == 0 and [r["rank"] for r in doc["heartbeat_stopped_first"]] == [1]
    assert store.get("verdict").decode() == doc["text"]
    stacks = (hang / "stacks-rank0.txt").read_text()
    assert stacks.startswith("rank 0 on node ") and "(most recent call first)" in stacks and "_end" in stacks


def test_the_watchdogs_line_in_the_output_is_a_hang_not_an_entrypoint_error():
    observer = Observer((0, 1), hang_timeout_s=1, factor=10, interval_s=0.1, start=0.0)
    _, verdict = feed(observer, [(t / 10, {0: beat(0, t), 1: beat(0, 1)}) for t in range(1, 30)])
    line = f"python -m jobgen.train: error: {verdict.text(1, 10)}; the stacks of every live rank are in /r/hang (exit 201)"
    decided = classify([Evidence("rank 0", kind="error", text=line)])
    assert (decided.cls, decided.rule) == ("infrastructure", "hang")
    other = classify([Evidence("rank 0", kind="error", text="python -m jobgen.train: error: spec.json: name: hang: no")])
    assert (other.cls, other.rule) == ("user", "entrypoint-error")


def test_a_stopped_rank_zero_is_found_by_the_others(tmp_path):
    """Rank 0 published one heartbeat and then stopped (its thread as frozen as the rest of it):
    rank 1's thread, which watches only itself and rank 0, names rank 0 and ends the job."""
    import threading

    import torch.distributed as dist

    store = dist.HashStore()
    store.set("beat/0", beat(7, 1, host="node-0", pid=11).dumps())
    exited = threading.Event()
    thread = WatchThread(store, 1, 4, limits=WatchLimits(1, 10), run_dir=tmp_path, address="here",
                         exit=lambda code: exited.set())
    thread.step = 7
    thread.start()
    assert exited.wait(30)
    doc = json.loads((tmp_path / "hang" / "verdict.json").read_text())
    assert doc["decided_by_rank"] == 1 and [(r["rank"], r["host"], r["step"]) for r in doc["heartbeat_stopped_first"]] == [(0, "node-0", 7)]
    assert (tmp_path / "hang" / "stacks-rank1.txt").is_file() and not (tmp_path / "hang" / "stacks-rank0.txt").exists()


def timed(compute_s: dict[int, float | None], host: str = "node-{}") -> dict[int, Beat | None]:
    return {r: Beat(5, TRAIN, 1, host.format(r), 100 + r, c) for r, c in compute_s.items()}


def test_straggler_factor_defaults_to_1_5_and_reads_back_from_spec_json():
    assert WatchdogSpec().straggler_factor == 1.5
    dumped = spec({"straggler_factor": 2}).model_dump(mode="json")
    assert dumped["watchdog"] == {"hang_timeout_s": 600, "step_time_factor": 10, "straggler_factor": 2}
    assert TrainingSpec.model_validate(dumped).watchdog.straggler_factor == 2


def test_a_rank_more_than_the_factor_slower_than_the_others_median_is_the_straggler():
    found = find_straggler(timed({0: 0.20, 1: 0.21, 2: 0.42, 3: 0.19}), 1.5)
    assert (found.rank, found.node, round(found.ratio, 2)) == (2, "node-2", 2.1), found
    assert (found.step_time_s, found.median_step_time_s) == (0.42, 0.20)
    assert found.text() == "jobgen: rank 2 on node-2 is a straggler: 2.1x the median step time (0.42 s vs 0.20 s)"
    assert found.to_json() == {"rank": 2, "node": "node-2", "ratio": 2.1, "step_time_s": 0.42, "median_step_time_s": 0.2}
    # two ranks: the median of the others is the fast rank's own time (not the mean of both: 1.33x)
    two = find_straggler(timed({0: 0.1, 1: 0.2}), 1.5)
    assert (two.rank, two.ratio) == (1, 2.0)


@pytest.mark.parametrize("times", [
    {0: 0.20, 1: 0.29, 2: 0.21},  # noisy, 1.45x: below the factor
    {0: 0.20, 1: 0.30, 2: 0.20},  # exactly the factor: not more than it
    {0: 0.20, 1: 0.20},  # even
    {0: 0.20, 1: None, 2: None},  # one rank timed: nothing to compare
    {0: 0.20},
    {},
])
def test_no_straggler_below_the_factor_or_without_two_timed_ranks(times):
    assert find_straggler(timed(times), 1.5) is None


def test_unpublished_ranks_are_left_out_and_equal_times_name_the_lowest_rank():
    beats = timed({0: 0.1, 2: 0.5, 3: 0.5}) | {1: None}
    assert find_straggler(beats, 1.5).rank == 2


@pytest.mark.parametrize("raw", [b'"x"', b"-1", b"0", b"1e999", b"true", b"NaN"])
def test_a_compute_time_that_is_not_a_positive_number_reads_as_none(raw):
    text = Beat(1, TRAIN, 2, "h", 3).dumps().replace('"compute_s": null', '"compute_s": ' + raw.decode())
    assert Beat.loads(text.encode()) == Beat(1, TRAIN, 2, "h", 3)
    assert Beat.loads(Beat(1, TRAIN, 2, "h", 3, 0.25).dumps().encode()).compute_s == 0.25


def test_rank_zeros_thread_reports_a_straggler_once(tmp_path, capsys):
    """Rank 0's WatchThread on an in-process HashStore where rank 1 publishes a compute time 3x
    rank 0's: one line, once, and the record the summary takes."""
    import time

    import torch.distributed as dist

    store = dist.HashStore()
    thread = WatchThread(store, 0, 2, limits=WatchLimits(10, 10, straggler_factor=1.5), run_dir=tmp_path, address="here", exit=lambda code: None)
    thread.compute.extend([0.1] * MIN_COMPUTE_SAMPLES)
    store.set("beat/1", Beat(0, TRAIN, 1, "node b\n\x1b", 7, 0.3).dumps())
    thread.start()
    deadline = time.monotonic() + 30
    while thread.straggler is None and time.monotonic() < deadline:
        store.set("beat/1", Beat(0, TRAIN, int(time.monotonic() * 100), "node b\n\x1b", 7, 0.3).dumps())
        time.sleep(0.05)
    time.sleep(3 * thread.interval_s)
    thread.stop()
    assert thread.straggler == Straggler(1, "node b\n\x1b", thread.straggler.ratio, 0.3, 0.1)
    assert abs(thread.straggler.ratio - 3.0) < 1e-9
    out = capsys.readouterr().out
    assert out.count("is a straggler") == 1 and "jobgen: rank 1 on node b" in out, out


@pytest.mark.parametrize("summary", [
    None, [], {}, {"straggler": None}, {"straggler": "rank 1"}, {"straggler": {"rank": "1", "node": "n", "ratio": 2,
                                                                               "step_time_s": 1, "median_step_time_s": 0.5}},
    {"straggler": {"rank": True, "node": "n", "ratio": 2, "step_time_s": 1, "median_step_time_s": 0.5}},
    {"straggler": {"rank": 1, "node": 5, "ratio": 2, "step_time_s": 1, "median_step_time_s": 0.5}},
    {"straggler": {"rank": 1, "node": "n", "ratio": float("nan"), "step_time_s": 1, "median_step_time_s": 0.5}},
    {"straggler": {"rank": 1, "node": "n", "ratio": 2, "step_time_s": "1", "median_step_time_s": 0.5}},
])
def test_status_shows_nothing_for_a_summary_without_a_well_formed_straggler(summary):
    assert straggler_details(parse_summary(json.dumps(summary))) == {}  # summary.json as status reads it


def test_status_shows_the_straggler_printable_and_cut():
    record = Straggler(3, "node2\n\x1b[2J" + "x" * 300, 2.1, 0.42, 0.2).to_json()
    shown = straggler_details(parse_summary(json.dumps({"straggler": record})))["straggler"]
    assert shown.startswith("rank 3 on node2\\n\\x1b[2J") and shown.endswith(": 2.1x the median step time (0.42 s vs 0.20 s)")
    assert "\n" not in shown and "\x1b" not in shown and len(shown) < 200, shown


def _verdict_doc(*hosts: str) -> dict:
    return {"verdict": "hang", "exit_code": EXIT_HUNG,
            "heartbeat_stopped_first": [{"rank": r, "host": h, "pid": 1, "step": 3, "silent_s": 9.0} for r, h in enumerate(hosts)]}


def test_the_first_verdict_of_a_start_stands_and_names_the_stopped_nodes(tmp_path):
    """A rank stopped and resumed later (srun sends SIGCONT before it ends a step) finds the others
    gone and decides too: its verdict must not replace the one that named it. A verdict from an
    earlier start (written before this start's watch began) is replaced."""
    import time

    from jobgen.train.watchdog import write_verdict

    since = time.time()
    assert write_verdict(tmp_path, _verdict_doc("node2", "node2", "node 3"), since=since)
    assert (tmp_path / "hang" / "stopped-nodes").read_text() == "node2\nnode 3\n"
    assert not write_verdict(tmp_path, {**_verdict_doc(), "store": "node1:29501"}, since=since)
    kept = json.loads((tmp_path / "hang" / "verdict.json").read_text())
    assert [r["host"] for r in kept["heartbeat_stopped_first"]] == ["node2", "node2", "node 3"]
    assert (tmp_path / "hang" / "stopped-nodes").read_text() == "node2\nnode 3\n"
    # the next start: the earlier verdict is replaced, and a verdict naming no rank leaves no node
    assert write_verdict(tmp_path, {**_verdict_doc(), "store": "node1:29501"}, since=time.time() + 1)
    assert json.loads((tmp_path / "hang" / "verdict.json").read_text())["store"] == "node1:29501"
    assert (tmp_path / "hang" / "stopped-nodes").read_text() == ""


@pytest.mark.parametrize("existing", ["", "{", "[]", '{"written_at": "soon"}', '{"written_at": true}', '{"written_at": NaN}'])
def test_a_verdict_file_that_is_not_one_of_this_start_is_replaced(tmp_path, existing):
    import time

    from jobgen.train.watchdog import write_verdict

    (tmp_path / "hang").mkdir()
    (tmp_path / "hang" / "verdict.json").write_text(existing)
    assert write_verdict(tmp_path, _verdict_doc("node2"), since=time.time())
    assert json.loads((tmp_path / "hang" / "verdict.json").read_text())["heartbeat_stopped_first"][0]["host"] == "node2"


def test_the_node_name_is_slurms_under_srun_else_the_host_name():
    import socket

    from jobgen.train.watchdog import node_name

    assert node_name({"SLURMD_NODENAME": "gpu-a17"}) == "gpu-a17"
    assert node_name({}) == socket.gethostname()


def test_time_a_suspended_process_did_not_run_is_skipped():
    """SLURM suspends a job (``scontrol suspend``, gang scheduling, PreemptMode=SUSPEND) by stopping
    every process of it; the monotonic clock runs on. The thread tells the observer how long its
    wait overslept; that time is not time without progress, on this rank's clock nor on its view
    of the others (they stood still with it)."""
    observer = Observer((0, 1), hang_timeout_s=3, factor=10, interval_s=0.1, start=0.0)
    ticks = [(t / 10, {0: beat(t, t), 1: beat(t, t)}) for t in range(1, 20)]
    assert feed(observer, ticks) == (None, None)
    observer.skip(600.0)  # stopped for 600 s after t=1.9; the first tick after it sees the beats of before
    ticks = [(601.9 + t / 10, {0: beat(19, 19), 1: beat(19, 19)}) for t in range(1, 5)]
    ticks += [(602.3 + t / 10, {0: beat(19 + t, 19 + t), 1: beat(19 + t, 19 + t)}) for t in range(1, 20)]
    assert feed(observer, ticks) == (None, None)
    # a rank that stops after the resume is still found, a timeout after the last step
    when, verdict = feed(observer, [(604.2 + t / 10, {0: beat(38, 38 + t), 1: beat(38, 38)}) for t in range(1, 60)])
    assert when == pytest.approx(604.2 + 3, abs=0.21) and [s.rank for s in verdict.first] == [1]
    fresh = Observer((0, 1), hang_timeout_s=3, factor=10, interval_s=0.1, start=0.0)  # the same ticks without the skip
    assert feed(fresh, [(t / 10, {0: beat(t, t), 1: beat(t, t)}) for t in range(1, 20)] + [(601.9, {0: beat(19, 19), 1: beat(19, 19)})])[0] == 601.9
