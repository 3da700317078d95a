"""summary.json's contract (jobgen.jobdir.summary): the file the entrypoint writes through
:class:`RunSummary` is byte for byte the file it wrote as a plain dict, and every reader's entry
point (:func:`read_summary`, :func:`parse_summary`) takes any file without raising.

The fixtures are summary.json files two real CPU runs of the entrypoint wrote with the dict
writer (the built-in GPT with a prediction file beside spec.json; a ``class_path`` module under
``--smoke``, which adds ``data``, ``epoch`` and ``smoke``), their run directory paths replaced."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobgen.jobdir import SUMMARY_FILE
from jobgen.jobdir.summary import MAX_SUMMARY_BYTES, RunSummary, SpeedLevers, parse_summary, read_summary, write_summary
from jobgen.reports.attempts import with_restarts
from jobgen.train.watchdog import Straggler

FIXTURES = Path(__file__).parent / "fixtures" / "summary"
HOSTILE = "x" * 150 + "\n\x1b[31m'\" " + "é" * 140  # 300 bytes and more: newline, escape, quotes, non-ASCII


@pytest.mark.parametrize("name", ["gpt-with-prediction.json", "class-path-smoke.json"])
def test_the_model_writes_the_same_bytes_as_the_entrypoint_s_dict(tmp_path, name):
    text = (FIXTURES / name).read_text(encoding="utf-8")
    summary = parse_summary(text.encode())
    assert summary is not None and not summary.extras()  # every key the entrypoint writes is a field
    write_summary(tmp_path / SUMMARY_FILE, summary)
    assert (tmp_path / SUMMARY_FILE).read_text(encoding="utf-8") == text
    assert list(summary.to_json()) == list(json.loads(text))  # same keys, same order


def test_the_fields_written_only_when_set_and_the_nested_records_keep_their_order():
    straggler = Straggler(3, "node 2", 2.1234, 0.4, 0.2).to_json()
    levers = SpeedLevers(compile=True, matmul_precision="high", pin_memory=True, single_device=False, host_logging=True,
                         fused_clip=True, off=["tf32"])
    base = RunSummary(name="tiny", global_step=4, straggler=straggler, levers=levers)
    doc = base.to_json()
    assert not {"data", "epoch", "smoke", "tracking", "restarts"} & set(doc)  # absent, not null
    assert doc["straggler"] == straggler and list(doc["straggler"]) == list(straggler)
    assert list(doc["levers"]) == ["compile", "matmul_precision", "pin_memory", "single_device", "host_logging", "fused_clip",
                                   "off"]  # fused_adamw is known after fit only
    done = base.model_copy(update={"levers": levers.model_copy(update={"fused_adamw": True}), "smoke": True, "epoch": 0,
                                   "tracking": {"run_key": "0" * 16}, "prediction": None})
    doc = done.to_json()
    assert doc["levers"]["fused_adamw"] is True and doc["epoch"] == 0 and doc["smoke"] is True
    keys = list(doc)
    assert keys.index("data_format") < keys.index("epoch") < keys.index("smoke") < keys.index("straggler")
    assert keys[-3:] == ["code", "tracking", "prediction"]


def test_a_summary_with_restarts_and_a_command_mode_summary_read_back_with_their_keys(tmp_path):
    entry = json.loads((FIXTURES / "gpt-with-prediction.json").read_text())
    history = [{"restart": 1, "class": "HUNG", "reason": HOSTILE}]
    summary = parse_summary(json.dumps(with_restarts(entry, 2, history), indent=2))
    assert summary is not None and summary.restarts == {"max_restarts": 2, "used": 1, "history": history}
    assert summary.dumps() == json.dumps(with_restarts(entry, 2, history), indent=2) + "\n"
    command = {"code": None, "cwd": "/w", "entrypoint": {"module": "train"}, "exit_code": 0, "name": "cmd", "wall_time_s": 12}
    summary = parse_summary(json.dumps(command, sort_keys=True))
    assert summary is not None and summary.wall_time_s == 12.0 and summary.global_step is None
    assert summary.extras() == {"cwd": "/w", "entrypoint": {"module": "train"}, "exit_code": 0}


@pytest.mark.parametrize("raw", [
    b"", b"\xff\xfe{", b"[]", b"null", b'"summary"', b"{", b'{"a": 1}}', b"[" * 100000 + b"]" * 100000,
    b'{"a": "' + b"x" * MAX_SUMMARY_BYTES + b'"}',
])  # fmt: skip
def test_what_is_not_a_summary_reads_as_none(raw):
    assert parse_summary(raw) is None


def test_a_field_that_does_not_hold_its_type_reads_as_none_and_the_rest_is_kept():
    doc = {"name": HOSTILE, "global_step": "4", "world_size": True, "wall_time_s": 3, "val_loss": float("nan"),
           "straggler": {"rank": 1, "node": "n", "ratio": float("inf"), "step_time_s": 1, "median_step_time_s": 0.5},
           "levers": {"matmul_precision": None}, "usage": [1], "profile": "p\x00\x1b", HOSTILE: {"nested": [HOSTILE]}}
    summary = parse_summary(json.dumps(doc))
    assert summary is not None
    assert summary.name == HOSTILE and summary.profile == "p\x00\x1b"  # kept as written; shown with printable
    assert summary.global_step is None and summary.world_size is None and summary.straggler is None and summary.usage is None
    assert summary.wall_time_s == 3.0 and summary.val_loss != summary.val_loss  # NaN: a diverged run's loss
    assert summary.levers == SpeedLevers(matmul_precision=None) and summary.levers.compile is None
    assert summary.extras() == {HOSTILE: {"nested": [HOSTILE]}}


def test_read_summary_never_raises(tmp_path):
    assert read_summary(tmp_path / "missing.json") is None
    assert read_summary(tmp_path) is None  # a directory
    assert read_summary(tmp_path / ("x" * 300)) is None  # a name too long for the filesystem
    path = tmp_path / SUMMARY_FILE
    path.write_bytes(b"\x00\x01 not json")
    assert read_summary(path) is None
    path.write_text(json.dumps({"global_step": 7}))
    assert read_summary(path) == RunSummary(global_step=7)
    if os.geteuid() != 0:  # root reads any file
        path.chmod(0)
        assert read_summary(path) is None
