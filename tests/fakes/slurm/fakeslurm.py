"""Fake SLURM client commands (sbatch, squeue, sacct, scancel, scontrol, sinfo, sacctmgr) for offline tests.

Run as a program (``fakeslurm.py PROG ARGS...``, through the wrappers :class:`FakeSlurm` puts
on PATH) it plays one client command: it appends ``{"prog", "argv", "cwd", ...}`` to the
``calls`` of the JSON state file named by ``$FAKE_SLURM_STATE`` and answers with the next
response queued for that command (``responses[<command>]``, a list; the last one repeats).
``sacct -c`` (the job-completion log) has its own queue, ``"sacct -c"``; so have ``"sacct --json"``, ``"sinfo --json"``,
``"sinfo --version"``, ``"scontrol --version"`` and ``"sinfo --format=%R|%a"`` (each partition's
availability, what ``jobgen doctor`` asks). A response's ``stdout_file`` is copied to
stdout byte for byte (output that is not UTF-8). A command with no response queued exits 97
and says so, so an unexpected call fails the test instead of passing silently.

Imported, it gives the tests :class:`FakeSlurm` and builders for the documents real SLURM
prints: ``squeue --json`` in the 22.05 shape (``job_state`` a string, ``exit_code`` a wait(2)
status, plain numbers) and the 23.11+ shape (``job_state`` a list of base state + flags,
numbers as ``{"set", "infinite", "number"}`` objects, ``exit_code`` an object), and
``sacct --parsable2`` rows. Every release's shape, 22.05 - 25.05, as whole documents:
tests/unit/fixtures/slurm_json/ (tests/unit/test_slurm_json.py). What ``jobgen profiles detect``
reads, per release (22.05, 23.02, 23.11, 24.05, 25.05): ``detect/<release>/`` and
:func:`detect_replies`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

PROGRAMS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "sacctmgr")
#: ``jobgen profiles detect``'s view of one cluster per release: see :func:`detect_replies`.
DETECT_FIXTURES = Path(__file__).parent / "detect"
NOT_CONFIGURED_RC = 97
#: sinfo's format for each partition's availability (jobgen.backends.slurm.inventory.SINFO_AVAIL_ARGV).
PARTITION_STATES_FORMAT = "--format=%R|%a"


# --------------------------------------------------------------------------- the fake programs


def _command_key(prog: str, args: list[str]) -> str:
    if prog == "sacct" and "-c" in args:
        return "sacct -c"
    if prog == "sacct" and "--json" in args:
        return "sacct --json"
    for flag in ("--version", "--json"):
        if prog in ("sinfo", "scontrol") and flag in args:
            return f"{prog} {flag}"
    if prog == "sinfo" and PARTITION_STATES_FORMAT in args:
        return f"sinfo {PARTITION_STATES_FORMAT}"
    return prog


def _call_record(prog: str, args: list[str]) -> dict[str, Any]:
    call: dict[str, Any] = {"prog": prog, "argv": args, "cwd": os.getcwd()}
    if prog == "sbatch":
        # what real sbatch would see: the script (read relative to the cwd), the --chdir target,
        # and the environment it exports to the job
        script = Path(args[-1]) if args else None
        call["script_exists"] = bool(script and script.is_file())
        chdir = next((a.split("=", 1)[1] for a in args if a.startswith("--chdir=")), None)
        call["chdir_exists"] = bool(chdir and Path(chdir).is_dir())
        # (plus the variables a test names in $FAKE_SLURM_RECORD_ENV, comma-separated)
        names = ("JOBGEN_RUN_DIR", *os.environ.get("FAKE_SLURM_RECORD_ENV", "").split(","))
        call["env"] = {k: os.environ[k] for k in names if k and k in os.environ}
    return call


def main(argv: list[str]) -> int:
    prog, args = argv[0], argv[1:]
    call = _call_record(prog, args)
    state_path = Path(os.environ["FAKE_SLURM_STATE"])
    with open(f"{state_path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(state_path.read_text())
        state["calls"].append(call)
        queue = state["responses"].get(_command_key(prog, args)) or []
        response = queue.pop(0) if len(queue) > 1 else (queue[0] if queue else None)
        tmp = state_path.with_name(state_path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, state_path)
    if response is None:
        sys.stderr.write(f"fakeslurm: no response queued for {_command_key(prog, args)!r} (argv {args})\n")
        return NOT_CONFIGURED_RC
    if prog == "sbatch" and not call["script_exists"]:
        sys.stderr.write(f"sbatch: error: Unable to open file {args[-1] if args else ''}\n")
        return 1
    if "json" in response:
        sys.stdout.write(json.dumps(response["json"], indent=2) + "\n")
    sys.stdout.write(response.get("stdout", ""))
    if "stdout_file" in response:
        sys.stdout.flush()
        sys.stdout.buffer.write(Path(response["stdout_file"]).read_bytes())
    sys.stderr.write(response.get("stderr", ""))
    return int(response.get("rc", 0))


# --------------------------------------------------------------------------- test side


class FakeSlurm:
    """The fake commands installed under ``root``: ``env`` puts them first on PATH."""

    def __init__(self, root: Path):
        self.bin = root / "fake-slurm-bin"
        self.state = root / "fake-slurm-state.json"
        self.bin.mkdir(parents=True)
        for prog in PROGRAMS:
            wrapper = self.bin / prog
            wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(__file__)} {prog} \"$@\"\n")
            wrapper.chmod(0o755)
        self.state.write_text(json.dumps({"responses": {}, "calls": []}))

    @property
    def env(self) -> dict[str, str]:
        """Only the fakes and the base system on PATH: a real SLURM client is never reached."""
        return {"PATH": f"{self.bin}{os.pathsep}/usr/bin{os.pathsep}/bin", "FAKE_SLURM_STATE": str(self.state)}

    def _update(self, change: Any) -> None:
        state = json.loads(self.state.read_text())
        change(state)
        self.state.write_text(json.dumps(state, indent=1))

    def respond(self, command: str, *responses: dict[str, Any]) -> None:
        """Queue ``responses`` for ``command`` (``"sbatch"``, ``"sacct -c"``, ...), replacing any left."""
        self._update(lambda s: s["responses"].__setitem__(command, list(responses)))

    def calls(self, prog: str | None = None) -> list[dict[str, Any]]:
        calls = json.loads(self.state.read_text())["calls"]
        return [c for c in calls if prog is None or c["prog"] == prog]

    def argvs(self, prog: str | None = None) -> list[list[str]]:
        """Every argv received, program name first, in call order."""
        return [[c["prog"], *c["argv"]] for c in self.calls(prog)]

    def forget_calls(self) -> None:
        self._update(lambda s: s.__setitem__("calls", []))


def reply(stdout: str = "", stderr: str = "", rc: int = 0) -> dict[str, Any]:
    return {"stdout": stdout, "stderr": stderr, "rc": rc}


def json_reply(doc: dict[str, Any]) -> dict[str, Any]:
    return {"json": doc, "rc": 0}


def file_reply(path: Path) -> dict[str, Any]:
    """Print the bytes of ``path`` (exit 0)."""
    return {"stdout_file": str(path), "rc": 0}


#: sinfo built without SLURM's JSON support (the data_parser / openapi plugins).
SINFO_NO_JSON = reply(stderr="sinfo: error: JSON plugin load failure\n", rc=1)
#: sacctmgr without slurmdbd.
SACCTMGR_NO_DBD = reply(stderr="sacctmgr: error: Problem talking to the database: Connection refused\n", rc=1)


def detect_replies(fake: FakeSlurm, release: str | Path, *, with_json: bool = True) -> Path:
    """Queue what ``jobgen profiles detect`` asks, from ``detect/<release>/`` (or a directory of
    the same files): ``version.txt`` (``sinfo --version``; ``scontrol --version`` alike),
    ``config.txt`` (``scontrol show config``), ``sinfo.json`` (``sinfo --json``; with ``with_json``
    False, or without the file, sinfo fails there as one without JSON support does),
    ``sinfo.txt`` (sinfo's text: ``--noheader --Node --format=%N|%P|%c|%m|%G|%f|%l|%L``) and
    ``sacctmgr.txt`` (associations; without it sacctmgr fails as without slurmdbd).

    The files are written to the formats the man pages and SchedMD's data_parser plugins
    document for that release (see jobgen/backends/slurm/inventory.py), not captured from a
    cluster. Returns the directory."""
    where = release if isinstance(release, Path) else DETECT_FIXTURES / release
    fake.respond("sinfo --version", file_reply(where / "version.txt"))
    fake.respond("scontrol --version", file_reply(where / "version.txt"))
    fake.respond("scontrol", file_reply(where / "config.txt"))
    has_json = with_json and (where / "sinfo.json").is_file()
    fake.respond("sinfo --json", file_reply(where / "sinfo.json") if has_json else SINFO_NO_JSON)
    fake.respond("sinfo", file_reply(where / "sinfo.txt"))
    fake.respond("sacctmgr", file_reply(where / "sacctmgr.txt") if (where / "sacctmgr.txt").is_file() else SACCTMGR_NO_DBD)
    return where


#: What squeue prints (exit 1) for a job id the controller does not know (any more).
SQUEUE_INVALID_JOB = reply(stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1)
#: sacct without slurmdbd.
SACCT_NO_ACCOUNTING = reply(stderr="sacct: error: Slurm accounting storage is disabled\n", rc=1)


def _number(value: int | None) -> dict[str, Any]:
    """A 23.02+ ``*_NO_VAL`` number object."""
    return {"set": value is not None, "infinite": False, "number": 0 if value is None else value}


def squeue_22_05(job_id: int, state: str, *, name: str = "quickstart", nodes: str = "node[1-2]", reason: str = "None",
                 restarts: int = 0, exit_status: int = 0, tres_alloc: str = "", start: int = 1700000000,
                 end: int = 1700003600, array_job_id: int = 0, array_task_id: int | None = None,
                 array_task_string: str = "") -> dict[str, Any]:
    """``squeue --json`` of SLURM 22.05 (openapi/v0.0.38 shape) holding one job.

    ``exit_status`` is the raw wait(2) status 22.05 prints (exit code << 8 | signal);
    ``tres_alloc`` the allocation (``cpu=2,node=2,billing=2``; empty until resources are
    allocated, as on the lab's 22.05), ``start``/``end`` epoch seconds (0: unset). A job array's
    task: ``array_job_id`` (the array's id) and ``array_task_id``; the array's own record of its
    still-pending tasks: ``array_task_id`` None and ``array_task_string`` (``2-3``, ``2-3%2``)."""
    return {
        "meta": {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
                 "Slurm": {"version": {"major": 22, "micro": 9, "minor": 5}, "release": "22.05.9"}},
        "errors": [],
        "jobs": [{
            "account": "", "array_job_id": array_job_id, "array_task_id": array_task_id,
            "array_task_string": array_task_string, "batch_flag": True, "cluster": "cpu",
            "command": "/home/u/job.sbatch", "cpus": 2, "end_time": end, "exit_code": exit_status,
            "job_id": job_id, "job_state": state, "name": name, "node_count": 2, "nodes": nodes, "partition": "lab",
            "restart_cnt": restarts, "start_time": start, "state_description": "", "state_reason": reason,
            "submit_time": 1699999990, "time_limit": 30, "user_name": "u", "tres_alloc_str": tres_alloc,
        }],
    }


def squeue_24_05(job_id: int, states: list[str], *, name: str = "quickstart", nodes: str = "node[1-2]", reason: str = "None",
                 restarts: int = 0, return_code: int | None = 0, signal: int | None = None, tres_alloc: str = "",
                 start: int = 1700000000, end: int = 1700003600, array_job_id: int = 0, array_task_id: int | None = None,
                 array_task_string: str = "") -> dict[str, Any]:
    """``squeue --json`` of SLURM 24.05 (data_parser v0.0.41; 23.11 - 25.05 spell these fields
    alike) holding one job; ``states`` is ``job_state`` as SLURM lists it: the base state, then
    any flags; times are ``{"set", "infinite", "number"}`` objects there (the array fields too;
    see :func:`squeue_22_05`)."""
    return {
        "jobs": [{
            "account": "", "array_job_id": _number(array_job_id), "array_task_id": _number(array_task_id),
            "array_task_string": array_task_string, "batch_flag": True, "cluster": "cpu",
            "command": "/home/u/job.sbatch", "cpus": _number(2), "end_time": _number(end or None),
            "exit_code": {"status": ["SUCCESS" if not return_code and signal is None else "ERROR"],
                          "return_code": _number(return_code), "signal": {"id": _number(signal), "name": ""}},
            "job_id": job_id, "job_state": states, "name": name, "node_count": _number(2), "nodes": nodes, "partition": "lab",
            "restart_cnt": restarts, "start_time": _number(start or None), "state_description": "", "state_reason": reason,
            "submit_time": _number(1699999990), "time_limit": _number(30), "user_name": "u", "tres_alloc_str": tres_alloc,
        }],
        "last_backfill": _number(1700000100), "last_update": _number(1700000200),
        "meta": {"plugin": {"type": "", "name": "", "data_parser": "data_parser/v0.0.41", "accounting_storage": ""},
                 "client": {"source": "/dev/pts/0", "user": "u", "group": "u"},
                 "command": ["squeue", "--json"],
                 "slurm": {"version": {"major": "24", "micro": "3", "minor": "05"}, "release": "24.05.3", "cluster": "cpu"}},
        "warnings": [],
        "errors": [],
    }


def squeue_merged(*docs: dict[str, Any]) -> dict[str, Any]:
    """One ``squeue --json`` document listing the jobs of ``docs`` (all of one shape), e.g. the
    tasks of a job array, as squeue prints for ``--jobs <array id>``."""
    merged = dict(docs[0])
    merged["jobs"] = [job for doc in docs for job in doc["jobs"]]
    return merged


def squeue_empty() -> dict[str, Any]:
    """``squeue --json`` that knows no such job (exit 0, no jobs)."""
    doc = squeue_24_05(0, ["PENDING"])
    doc["jobs"] = []
    return doc


def sacct_rows(*rows: tuple[str, ...]) -> dict[str, Any]:
    """``sacct --noheader --parsable2 --format=JobID,State,ExitCode,NodeList,Elapsed,ElapsedRaw,Start,End,AllocTRES,NCPUS,JobName``."""
    return reply(stdout="".join("|".join(row) + "\n" for row in rows))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
