"""GitOps: the rendered files under ``manifests/`` are the source of truth that users commit.

The drivers of ``jobgen render`` (``--all/--check/--prune/--commit/--sweep``) and ``jobgen diff``:
they take the desired state of an output tree that planning made (a
:class:`~jobgen.planning.sweep.Render`: :func:`jobgen.planning.project.build_render`) and compare,
write, prune or commit it.

The pieces: :mod:`jobgen.gitops.sync` (desired state vs disk: compare, diff, apply) and
:mod:`jobgen.gitops.git` (``--commit``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobgen.gitops.sync import apply, compare, unified_diff
from jobgen.planning.sweep import Render


def _display(out: Path) -> str:
    """``out`` as shown in messages and diffs: relative to the working directory when inside it."""
    try:
        return out.relative_to(Path.cwd().resolve()).as_posix() or "."
    except ValueError:
        return out.as_posix()


def _warn(render: Render, echo: Callable[..., Any]) -> None:
    for job in render.jobs:
        for warning in job.plan.warnings:
            echo(f"warning: {job.subdir}: {warning}", err=True)


def _command(render: Render, commit_flag: bool, prune: bool) -> str:
    if render.whole_tree:
        return "jobgen render --all" + (" --prune" if prune else "") + (" --commit" if commit_flag else "")
    jobs = render.jobs
    sweep = "".join(f" --sweep {k}=..." for k, _ in (jobs[0].sweep or jobs[0].array)) if jobs else ""
    return f"jobgen render {render.source} --profile {jobs[0].plan.profile if jobs else '?'}{sweep}" + (" --commit" if commit_flag else "")


def render_command(render: Render, *, check: bool, prune: bool, commit_flag: bool, echo: Callable[..., Any]) -> int:
    """``jobgen render`` with ``--all``, ``--check``, ``--prune``, ``--commit`` or ``--sweep``.

    Returns the exit code: 0 written/committed/in sync; 1 ``--check`` found files that differ
    from a fresh render (the unified diff is printed on stdout).

    Raises:
        ConfigError: ``--commit`` refused (not a work tree, unrelated staged changes).
        GitError: git failed.
    """
    _warn(render, echo)
    comparison = compare(render)
    display = _display(render.out)
    n_files, n_jobs = len(render.files), len(render.jobs)
    if check:
        if comparison.in_sync:
            echo(f"in sync: {n_files} file(s) of {n_jobs} job(s) under {display}/ match a fresh render")
            return 0
        echo(unified_diff(comparison, display), nl=False)
        stale = f", {len(comparison.stale_dirs)} stale job dir(s)" if comparison.stale_dirs else ""
        fix = "jobgen render --all" + (" --prune" if comparison.stale_dirs else "") if render.whole_tree else "the same command without --check"
        echo(f"out of date: {len(comparison.changes)} file(s) under {display}/ differ from a fresh render{stale}; run: {fix}", err=True)
        return 1
    if commit_flag:
        from jobgen.gitops.git import commit

        written, removed, commit_id = commit(comparison, prune=prune, command=_command(render, True, prune))
    else:
        written, removed = apply(comparison, prune=prune)
        commit_id = None
    for path in written:
        echo(f"wrote {display}/{path}")
    for path in removed:
        echo(f"removed {display}/{path}")
    for rel_dir in comparison.stale_dirs:
        if not prune:
            echo(f"stale: {display}/{rel_dir}/ was written by jobgen but {render.source} does not list it; "
                 f"`{_command(render, False, True)}` removes it", err=True)
        elif rel_dir in comparison.foreign:
            echo(f"kept {display}/{rel_dir}/: it holds files jobgen did not write ({', '.join(comparison.foreign[rel_dir])})", err=True)
    echo(f"{n_jobs} job(s) under {display}/: {len(written)} file(s) written, {len(removed)} removed, {comparison.unchanged} unchanged")
    if commit_flag:
        echo(f"committed {commit_id}" if commit_id else "nothing to commit: the rendered files are already committed")
    return 0


def diff_command(render: Render, *, echo: Callable[..., Any]) -> int:
    """``jobgen diff``: print the unified diff between disk and a fresh render; writes nothing.

    Returns 0 whether or not there are differences (``render --check`` is the failing form).
    """
    _warn(render, echo)
    comparison = compare(render)
    display = _display(render.out)
    if comparison.in_sync:
        echo(f"no differences: {len(render.files)} file(s) under {display}/ match a fresh render", err=True)
        return 0
    echo(unified_diff(comparison, display), nl=False)
    echo(f"{len(comparison.changes)} file(s) under {display}/ would change", err=True)
    return 0
