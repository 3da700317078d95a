"""Committing a render with the git CLI (``jobgen render --commit``), always through argv lists.

:func:`commit` writes a :class:`~jobgen.gitops.sync.Comparison` and commits exactly its files, with a
message naming the specs and profiles whose files changed (:func:`commit_message`).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from jobgen import __version__
from jobgen.errors import EXIT_RUNTIME, ConfigError, JobgenError
from jobgen.gitops.sync import Comparison, apply, pending
from jobgen.planning.sweep import RenderedJob


class GitError(JobgenError):
    """A git command failed (exit 1); a repository not in a state to commit is a ConfigError (exit 2).

    ``argv``, ``returncode`` and ``stderr`` say what ran and how it failed.
    """

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None, stderr: str = "", hint: str | None = None):
        detail = f"\n    $ {shlex.join(argv)}  (exit {returncode})" if argv else ""
        detail += "".join(f"\n    {line}" for line in stderr.strip().splitlines())
        super().__init__(message + detail, hint=hint)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr


def git(args: Sequence[str], cwd: Path, *, stdin: str | None = None, ok: Iterable[int] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run ``git ARGS`` in ``cwd`` (argv list, no shell) and return the finished process.

    Raises:
        GitError: git is missing, or it exits with a code not in ``ok`` (argv, code, stderr given).
    """
    argv = ["git", *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=120)
    except FileNotFoundError:
        raise GitError("git is not installed (or not on PATH)", argv=argv, hint="install git, or commit the rendered files yourself") from None
    except subprocess.TimeoutExpired:
        raise GitError("git did not finish within 120 s", argv=argv) from None
    if proc.returncode not in tuple(ok):
        raise GitError(f"git {args[0] if args else ''} failed", argv=argv, returncode=proc.returncode, stderr=proc.stderr)
    return proc


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path if path.is_dir() else path.parent


def commit_message(comparison: Comparison, paths: Sequence[str], command: str) -> str:
    """Commit message naming the specs and profiles of the jobs whose files are committed.

    ``paths``: committed paths relative to the output root. Subject: ``jobgen: render <specs>
    for <profiles>`` (a count when that is longer than 72 characters); body: one line per job
    directory, removed stale directory and other file (index, kustomizations).
    """
    render = comparison.render
    by_dir = {job.subdir: job for job in render.jobs}
    touched: dict[str, RenderedJob] = {}
    removed_dirs: set[str] = set()
    other: set[str] = set()
    for path in paths:
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent in by_dir:
            touched[parent] = by_dir[parent]
        elif parent in comparison.stale_dirs:
            removed_dirs.add(parent)
        else:
            other.add(path)
    specs = sorted({j.spec for j in touched.values()})
    profiles = sorted({j.plan.profile for j in touched.values()})
    if specs:
        subject = f"jobgen: render {', '.join(specs)} for {', '.join(profiles)}"
        if len(subject) > 72:
            subject = f"jobgen: render {len(touched)} job(s) from {len(specs)} spec(s) for {len(profiles)} profile(s)"
    elif removed_dirs:
        subject = f"jobgen: prune {len(removed_dirs)} stale job(s)"
    else:
        subject = "jobgen: update " + ", ".join(sorted(other))
    shown = render.out.name
    body = [f"{shown}/{d}: {j.spec} on {j.plan.profile}" + (f" ({', '.join(f'{k}={v}' for k, v in j.sweep)})" if j.sweep else "")
            for d, j in sorted(touched.items())]
    body += [f"{shown}/{d}: removed (no longer rendered)" for d in sorted(removed_dirs)]
    body += [f"{shown}/{p}" for p in sorted(other)]
    return f"{subject}\n\n" + "\n".join(body) + f"\n\nRendered by jobgen {__version__}: {command}\n"


def commit(comparison: Comparison, *, prune: bool, command: str) -> tuple[list[str], list[str], str | None]:
    """Write the render and commit exactly its files with git.

    Before anything is written: refuses when the index holds staged changes to other paths.
    Then writes (as :func:`apply`), stages every rendered file and every removal, and commits
    with :func:`commit_message`. Nothing changed -> nothing is committed.

    Returns:
        ``(written, removed, commit id or None)``.

    Raises:
        ConfigError: not inside a git work tree, or unrelated staged changes (the user's to fix: exit 2).
        GitError: a git command failed (e.g. a commit hook refused: the rendered files are then
            written and staged; exit 1).
    """
    out = comparison.render.out
    here = _existing_ancestor(out)
    top_text = git(["rev-parse", "--show-toplevel"], here).stdout.strip()
    if not top_text:
        raise ConfigError(f"{out} is not inside a git work tree", hint="run `git init`, or render without --commit")
    top = Path(top_text).resolve()
    changes = pending(comparison, prune=prune)

    def rel(path: str) -> str:
        return (out / path).relative_to(top).as_posix()

    try:
        ours = {rel(p) for p in comparison.render.files} | {rel(c.path) for c in changes}
    except ValueError:
        raise ConfigError(f"{out} is outside the git work tree {top}", hint="render into a directory of the repository") from None
    staged = [p for p in git(["diff", "--cached", "--name-only", "--no-renames", "-z"], top).stdout.split("\0") if p]
    unrelated = sorted(set(staged) - ours)
    if unrelated:
        shown = ", ".join(unrelated[:5]) + (f" and {len(unrelated) - 5} more" if len(unrelated) > 5 else "")
        raise ConfigError(
            f"refusing to commit: changes to files jobgen did not render are already staged ({shown}); nothing was written or committed",
            hint="commit or unstage them first (git restore --staged <path>), or render without --commit and commit yourself",
        )
    written, removed = apply(comparison, prune=prune)
    present = sorted(rel(p) for p in comparison.render.files)
    if present:
        git(["--literal-pathspecs", "add", "--pathspec-from-file=-", "--pathspec-file-nul"], top, stdin="\0".join(present) + "\0")
    gone = sorted(rel(p) for p in removed)
    if gone:
        git(["--literal-pathspecs", "rm", "--cached", "--quiet", "--ignore-unmatch", "--pathspec-from-file=-", "--pathspec-file-nul"],
            top, stdin="\0".join(gone) + "\0")
    if git(["diff", "--cached", "--quiet"], top, ok=(0, 1)).returncode == 0:
        return written, removed, None
    staged_now = [p for p in git(["diff", "--cached", "--name-only", "--no-renames", "-z"], top).stdout.split("\0") if p]
    out_rel = out.relative_to(top)
    committed = [Path(p).relative_to(out_rel).as_posix() for p in staged_now]
    git(["commit", "--quiet", "-m", commit_message(comparison, committed, command)], top)
    return written, removed, git(["rev-parse", "--short", "HEAD"], top).stdout.strip()
