"""Desired state vs disk: how what an output tree should hold (a
:class:`~jobgen.planning.sweep.Render`, planned by :mod:`jobgen.planning.sweep` and
:mod:`jobgen.planning.project`) differs from what is there (:func:`compare`), the unified diff
of that (:func:`unified_diff`) and the writes that settle it (:func:`apply`).

Everything before :func:`apply` only reads. Files jobgen did not write are never modified or
deleted: in a job directory jobgen owns only the files of the job-directory contract
(:mod:`jobgen.jobdir`) that carry its mark.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from jobgen.errors import ConfigError
from jobgen.jobdir.files import (
    EXECUTABLE_FILES,
    INDEX_FILE,
    KUSTOMIZATION_FILE,
    POINTS_DIR,
    is_generated,
    is_job_dir,
    owned_files,
    remove_empty_point_dirs,
    write_atomic,
)
from jobgen.planning.sweep import Render

# --------------------------------------------------------------------------- compare


@dataclass(frozen=True)
class Change:
    """One file that differs between the desired state and disk.

    ``old``: bytes on disk (None: the file is new); ``new``: desired text (None: to be removed);
    ``old_exec``/``new_exec``: the owner-execute bit; ``stale_dir``: the removal belongs to a
    job directory the project no longer lists (carried out only with ``--prune``).
    """

    path: str
    old: bytes | None
    new: str | None
    old_exec: bool = False
    new_exec: bool = False
    stale_dir: str | None = None

    @property
    def kind(self) -> str:
        """``add``, ``delete``, ``modify`` or ``mode``."""
        if self.old is None:
            return "add"
        if self.new is None:
            return "delete"
        return "modify" if self.old != self.new.encode() else "mode"


@dataclass
class Comparison:
    """Desired state vs disk: the changes, stale job directories and what was left alone."""

    render: Render
    changes: list[Change] = field(default_factory=list)
    stale_dirs: list[str] = field(default_factory=list)
    foreign: dict[str, list[str]] = field(default_factory=dict)
    unchanged: int = 0

    @property
    def in_sync(self) -> bool:
        """No file would change (stale job directories count as changes)."""
        return not self.changes


def is_exec(name: str) -> bool:
    """Whether jobgen writes ``name`` executable (0755; the rest 0644), as the job directory contract says."""
    return PurePosixPath(name).name in EXECUTABLE_FILES


def _read(path: Path) -> bytes | None:
    """Bytes of ``path``; None when it does not exist.

    Raises:
        ConfigError: a directory stands where jobgen writes a file (or a file where it needs a
            directory), or the file cannot be read.
    """
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except (IsADirectoryError, NotADirectoryError):
        raise ConfigError(f"cannot write {path}: a directory stands where jobgen writes a file, or a file where it needs a directory",
                          hint="move the file or directory that is in the way") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def _owned_in_job_dir(directory: Path) -> list[str]:
    """Paths (relative to ``directory``) of the files in it that jobgen wrote (and may replace
    or remove), a job array's ``points/<i>/`` files included (:func:`jobgen.jobdir.owned_files`)."""
    return owned_files(directory)


def _foreign(job_dir: Path, owned: list[str]) -> list[str]:
    """Entries of ``job_dir`` that jobgen did not write (``points/`` counts only when it holds such files)."""
    out = []
    for entry in sorted(job_dir.iterdir()):
        if entry.name in owned:
            continue
        if entry.name == POINTS_DIR and entry.is_dir():
            inside = sorted(p.relative_to(job_dir).as_posix() for p in entry.rglob("*") if not p.is_dir())
            out += [rel for rel in inside if rel not in owned]
            continue
        out.append(entry.name)
    return out


def compare(render: Render) -> Comparison:
    """Compare ``render`` with the files on disk (reads only).

    In scope: every desired file; files jobgen owns in the planned job directories; and for a
    project render, jobgen-owned job directories under ``out`` the project no longer lists
    (``stale_dirs``; files there that jobgen did not write are listed in ``foreign`` and never
    touched) and stale ``index.yaml``/``kustomization.yaml`` files that carry jobgen's header.
    """
    result = Comparison(render)
    out = render.out
    for rel, text in sorted(render.files.items()):
        path = out / rel
        old = _read(path)
        new_exec = is_exec(rel)
        old_exec = old is not None and bool(path.stat().st_mode & 0o100)
        if old is not None and old == text.encode() and old_exec == new_exec:
            result.unchanged += 1
            continue
        result.changes.append(Change(rel, old, text, old_exec, new_exec))
    for job_dir in sorted(render.job_dirs):
        for name in _owned_in_job_dir(out / job_dir):
            rel = f"{job_dir}/{name}"
            if rel not in render.files:
                result.changes.append(_removal(out, rel))
    if render.whole_tree and out.is_dir():
        for profile_dir in sorted(p for p in out.iterdir() if p.is_dir()):
            for job_dir in sorted(p for p in profile_dir.iterdir() if p.is_dir()):
                rel_dir = f"{profile_dir.name}/{job_dir.name}"
                if rel_dir in render.job_dirs or not is_job_dir(job_dir):
                    continue
                result.stale_dirs.append(rel_dir)
                owned = _owned_in_job_dir(job_dir)
                for name in owned:
                    result.changes.append(_removal(out, f"{rel_dir}/{name}", stale_dir=rel_dir))
                foreign = _foreign(job_dir, owned)
                if foreign:
                    result.foreign[rel_dir] = foreign
            aggregate = f"{profile_dir.name}/{KUSTOMIZATION_FILE}"
            if aggregate not in render.files and is_generated(out / aggregate):
                result.changes.append(_removal(out, aggregate))
        for aggregate in (INDEX_FILE, KUSTOMIZATION_FILE):
            if aggregate not in render.files and is_generated(out / aggregate):
                result.changes.append(_removal(out, aggregate))
    result.changes.sort(key=lambda c: c.path)
    return result


def _removal(out: Path, rel: str, stale_dir: str | None = None) -> Change:
    path = out / rel
    return Change(rel, path.read_bytes(), None, bool(path.stat().st_mode & 0o100), False, stale_dir)


# --------------------------------------------------------------------------- diff


def _lines(text: str) -> list[str]:
    lines = re.findall(r"[^\n]*\n|[^\n]+$", text)  # split on LF only, as git does
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def unified_diff(comparison: Comparison, display: str) -> str:
    """A unified diff (``a/`` = disk, ``b/`` = fresh render) of every change, paths shown as
    ``<display>/<path>``; new files come from ``/dev/null``, removed ones go to it, and an
    exec-bit change is shown as git does (``old mode``/``new mode``)."""
    import difflib  # only when there is a difference to show (as errors.did_you_mean does)

    parts = []
    for change in comparison.changes:
        shown = f"{display}/{change.path}" if display not in ("", ".") else change.path
        old_name = "/dev/null" if change.old is None else f"a/{shown}"
        new_name = "/dev/null" if change.new is None else f"b/{shown}"
        header = f"--- {old_name}\n+++ {new_name}\n"
        if change.kind == "mode":
            parts.append(f"{header}old mode {'100755' if change.old_exec else '100644'}\nnew mode {'100755' if change.new_exec else '100644'}\n")
            continue
        try:
            old_text = "" if change.old is None else change.old.decode("utf-8")
        except UnicodeDecodeError:
            parts.append(f"{header}(the file on disk is not UTF-8 text; jobgen would {'remove' if change.new is None else 'rewrite'} it)\n")
            continue
        new_text = change.new or ""
        if change.old is not None and change.new is not None and old_text.replace("\r\n", "\n") == new_text:
            parts.append(f"{header}(line endings: the file on disk has CRLF, jobgen writes LF; see .gitattributes in docs/gitops.md)\n")
            continue
        body = "".join(difflib.unified_diff(_lines(old_text), _lines(new_text), old_name, new_name, n=3))
        if change.kind != "modify" or change.old_exec == change.new_exec:
            parts.append(body)
        else:
            mode = f"old mode {'100755' if change.old_exec else '100644'}\nnew mode {'100755' if change.new_exec else '100644'}\n"
            parts.append(header + mode + body.split("\n", 2)[2])
    return "".join(parts)


# --------------------------------------------------------------------------- write


def apply(comparison: Comparison, *, prune: bool) -> tuple[list[str], list[str]]:
    """Carry out the changes: write new/changed files, fix exec bits, remove owned files jobgen
    no longer renders; stale job directories only with ``prune`` (then empty job and profile
    directories are removed too). Returns ``(written, removed)`` paths relative to ``out``."""
    out = comparison.render.out
    written, removed = [], []
    for change in comparison.changes:
        path = out / change.path
        if change.new is not None:
            if change.kind == "mode":
                os.chmod(path, 0o755 if change.new_exec else 0o644)
            else:
                write_atomic(path, change.new, executable=change.new_exec)
            written.append(change.path)
        elif change.stale_dir is None or prune:
            path.unlink(missing_ok=True)
            removed.append(change.path)
            if f"/{POINTS_DIR}/" in change.path:  # a job array's point that is no longer planned
                remove_empty_point_dirs(path.parent.parent.parent)
    if prune:
        for rel_dir in comparison.stale_dirs:
            for directory in (out / rel_dir, (out / rel_dir).parent):
                try:
                    directory.rmdir()  # only when empty: files jobgen did not write stay
                except OSError:
                    break
    return written, removed


def pending(comparison: Comparison, *, prune: bool) -> list[Change]:
    """The changes :func:`apply` carries out with this ``prune`` setting."""
    return [c for c in comparison.changes if c.new is not None or c.stale_dir is None or prune]
