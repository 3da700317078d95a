"""The ssh lab's own bookkeeping: when a lab another test session left may be taken over.

CI once failed every ssh lab test with LabConflictError because a session killed before its
fixture's teardown had left the bridge, the namespaces and lab.json behind (its sshd long gone);
these checks need no running lab.
"""

from __future__ import annotations

import os
import subprocess

from lab import _process_identity
from sshlab import SshLab


def test_a_lab_is_abandoned_once_its_root_its_owner_or_its_sshd_are_gone(tmp_path):
    lab = SshLab(tmp_path / "left")
    assert "is gone" in lab.abandoned()  # no lab.json: its temporary root was deleted

    dead = subprocess.Popen(["sleep", "30"])
    dead_identity = _process_identity(dead.pid)
    dead.kill()
    dead.wait()

    # No owner recorded (`sshlab.py up`, or a lab.json written before owners were): held while
    # any sshd it started lives, abandoned once none does.
    lab._write_state(owner=None, sshd={"host1": dead.pid, "host2": dead.pid})
    assert lab.abandoned() == "none of its sshd processes is alive"
    lab._write_state(sshd={})  # up() before its sshd start: not abandoned on that ground
    assert lab.abandoned() is None

    me = _process_identity(os.getpid())
    lab._write_state(owner=me, sshd={"host1": dead.pid})
    assert lab.abandoned() is None  # its owner lives: held, whatever its sshd
    lab._write_state(owner=dead_identity)
    assert lab.abandoned() == f"its owner, pid {dead.pid}, has exited"
    lab._write_state(owner={**me, "start": me["start"] - 1})
    assert "has exited" in lab.abandoned()  # the PID was reused by a later process
