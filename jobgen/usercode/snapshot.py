"""Code snapshots, taken by ``jobgen submit`` (SLURM and local; never at plan or render time).

The user's code must be exactly what a queued job runs, even when they edit files after
submitting and when SLURM requeues the job hours later. So submit extracts the committed tree
of their git repository (``git archive <HEAD commit>``) into ``<run dir>/code/<commit>/``
(:data:`jobgen.jobdir.CODE_SUBDIR`) with a :class:`~jobgen.jobdir.CodeSnapshot` record in its
root (:data:`jobgen.jobdir.CODE_INFO_FILE`), and passes that directory to every rank as
``$JOBGEN_CODE_DIR``, which job.sbatch, the local launch and the entrypoint put first on
PYTHONPATH.

Which specs: those with a ``code`` section, and those that run the user's code
(:attr:`jobgen.specs.training.TrainingSpec.runs_user_code`: an ``entrypoint``, or a ``class_path`` model or
data module) even without one. A spec of the built-in models and data runs jobgen's installed
code: nothing of the user's to snapshot, unless ``code`` asks for it.

Which repository: the spec's ``code.repo`` (relative to the spec file; default ``.``), i.e. the
git work tree holding the spec file. A rendered job directory submitted as is does not say where
its spec file was: the work tree holding the job directory is used (a ``code.repo`` other than
``.`` is refused there). Not in a git work tree and no ``code`` section: no snapshot, said once.

Uncommitted changes — modified, deleted and untracked (not ignored) files — are refused: the
snapshot would not hold them, and an untracked new module is the typical "works here, fails in
the queue" mistake. Changes inside the job directory, the run directory and to the spec file
itself are not code and do not count (``jobgen submit SPEC`` writes the rendered files first).
``--allow-dirty`` copies the working tree's changed files over the snapshot and records their
``git diff --binary`` against the commit (:data:`jobgen.jobdir.CODE_DIFF_FILE`) and its sha256.

Every git call takes an argv list (no shell) and a failure names argv, exit code and stderr.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobgen.errors import ConfigError, SubmitError
from jobgen.jobdir.files import CODE_DIFF_FILE, CODE_DIR_ENV, CODE_INFO_FILE, CODE_SUBDIR, is_jobgen_output, write_atomic
from jobgen.jobdir.runs import CodeSnapshot, read_code_snapshot
from jobgen.specs.training import TrainingSpec

Echo = Callable[[str], None]
#: Uncommitted changes named in the refusal (the rest are counted).
SHOWN_CHANGES = 8
_GIT_TIMEOUT_S = 300


@dataclass(frozen=True)
class Change:
    """One uncommitted change: git's two-letter status (``" M"``, ``"D "``, ``"??"``, ...) and
    the path relative to the work tree root (``/``-separated)."""

    status: str
    path: str


@dataclass(frozen=True)
class CodeRepo:
    """The repository a snapshot is taken from: its work tree root, the HEAD commit, the
    sub-directory for PYTHONPATH and the uncommitted changes that count."""

    top: Path
    commit: str
    python_path: str
    changes: tuple[Change, ...]


def _git(args: Sequence[str], cwd: Path, *, env: dict[str, str] | None = None, stdin: bytes | None = None,
         ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[bytes]:
    argv = ["git", *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, timeout=_GIT_TIMEOUT_S,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", **(env or {})})
    except FileNotFoundError:
        raise SubmitError("git is not installed (or not on PATH): cannot snapshot the code",
                          hint="install git, or set `code: {snapshot: false}` in the spec") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"git did not finish within {_GIT_TIMEOUT_S} s: {' '.join(argv)}") from None
    if proc.returncode not in ok:
        raise SubmitError(
            f"{' '.join(argv)} failed (exit {proc.returncode}) in {cwd}: {proc.stderr.decode(errors='replace').strip()}",
            hint="git's message is above",
        )
    return proc


def _toplevel(start: Path) -> tuple[Path | None, str]:
    """The work tree root holding ``start``, or ``(None, why)``."""
    try:
        proc = _git(["rev-parse", "--show-toplevel"], start, ok=(0, 128))
    except SubmitError as exc:
        return None, exc.message
    if proc.returncode != 0:
        return None, proc.stderr.decode(errors="replace").strip().splitlines()[0] if proc.stderr.strip() else "not a git work tree"
    return Path(proc.stdout.decode().strip()).resolve(), ""


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def changes(top: Path, exclude: Sequence[Path] = ()) -> tuple[Change, ...]:
    """Uncommitted changes in the work tree ``top`` (``git status``: modified, staged, deleted,
    untracked-not-ignored), minus paths at or under ``exclude`` (absolute paths) and minus
    jobgen's own outputs (:func:`jobgen.jobdir.is_jobgen_output`: rendered job files, index and
    kustomization files with the generated mark, submission records), so that a render or an
    earlier submit never blocks the next submit. Run directories ignore themselves
    (:func:`jobgen.jobdir.ignore_run_dir`)."""
    out = _git(["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"], top).stdout.decode("utf-8", "surrogateescape")
    roots = [p.resolve() for p in exclude]
    found = []
    for entry in out.split("\0"):
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:].rstrip("/")
        full = top / path
        if _inside(full.resolve() if not full.is_symlink() else full, roots):
            continue
        if full.is_file() and not full.is_symlink() and is_jobgen_output(full):
            continue
        found.append(Change(status, path))
    return tuple(found)


def find_repo(spec: TrainingSpec, *, spec_file: Path | None, job_dir: Path, run_dir: Path, out: Echo) -> CodeRepo | None:
    """The repository to snapshot for ``spec``, or None (``code.snapshot: false``; no ``code``
    section and not in a git work tree: said once through ``out``).

    ``spec_file``: the spec file the job was planned from (``jobgen submit SPEC``); None for a
    rendered job directory submitted as is (the work tree holding ``job_dir`` is used then).

    Raises:
        ConfigError: ``code`` is set but names no git work tree, or a path relative to a spec
            file that is not known; the repository has no commit yet.
        SubmitError: git failed.
    """
    code = spec.code
    if code is not None and (not code.snapshot or code.git is not None):
        return None
    if code is None and not spec.runs_user_code:
        return None  # the built-in models and data: jobgen's installed code is what runs
    if spec_file is None:
        if code is not None and code.repo != ".":
            raise ConfigError(
                f"code.repo is {code.repo!r} (relative to the spec file), but a rendered job directory does not say where its "
                f"spec file was, so the repository cannot be found from {job_dir}",
                location=f"{job_dir}: spec.code.repo",
                hint="submit the spec file instead: jobgen submit SPEC --profile P (it renders and submits)",
            )
        start, where = job_dir, f"the job directory {job_dir}"
    else:
        start = (spec_file.resolve().parent / (code.repo if code is not None else ".")).resolve()
        where = f"{start} (code.repo, relative to {spec_file})" if code is not None else f"{start} (the spec file's directory)"
    if not start.is_dir():
        raise ConfigError(f"{where} is not a directory", location=f"{spec_file}: code.repo",
                          hint="code.repo is a directory of the git work tree, relative to the spec file")
    top, why = _toplevel(start)
    if top is None:
        if code is None:
            out(f"jobgen: code: {start} is not in a git work tree ({why}): no code snapshot; the ranks import the code "
                "they find when they start (put the code in a git repository, or name one with `code.repo`)")
            return None
        raise ConfigError(f"{where} is not in a git work tree ({why})", location=f"{spec_file or job_dir}: code.repo",
                          hint="commit the code in a git repository (git init && git add -A && git commit), "
                          "or set `code: {snapshot: false}`")
    head = _git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], top, ok=(0, 1, 128))
    if head.returncode != 0:
        raise ConfigError(f"the git repository {top} has no commit yet: there is nothing to snapshot",
                          location=f"{spec_file or job_dir}: code", hint="commit the code first: git add -A && git commit -m 'code'")
    exclude = [job_dir, run_dir, *([spec_file] if spec_file is not None else [])]
    return CodeRepo(top, head.stdout.decode().strip(), code.python_path if code is not None else "", changes(top, exclude))


def check_clean(repo: CodeRepo, *, allow_dirty: bool) -> None:
    """Refuse uncommitted changes unless ``allow_dirty``.

    Raises:
        ConfigError: naming the changes (exit 2; nothing was submitted).
    """
    if not repo.changes or allow_dirty:
        return
    shown = ", ".join(f"{c.status.strip()} {c.path}" for c in repo.changes[:SHOWN_CHANGES])
    more = f" and {len(repo.changes) - SHOWN_CHANGES} more" if len(repo.changes) > SHOWN_CHANGES else ""
    raise ConfigError(
        f"the git work tree {repo.top} has {len(repo.changes)} uncommitted change(s) the job would not run: {shown}{more} "
        "(M modified, D deleted, ?? untracked). The job runs a snapshot of the committed tree "
        f"({repo.commit[:12]}). Nothing was submitted.",
        hint="commit them (git add -A && git commit), or submit with --allow-dirty to copy the working tree's changed "
        "files over the snapshot (their git diff and its sha256 are recorded)",
    )


def diff(repo: CodeRepo) -> bytes:
    """``git diff --binary`` of the repository's changes (untracked files included) against its
    commit, made with a temporary index (the user's index is not touched)."""
    with tempfile.TemporaryDirectory(prefix="jobgen-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(["read-tree", repo.commit], repo.top, env=env)
        paths = b"".join(c.path.encode("utf-8", "surrogateescape") + b"\0" for c in repo.changes)
        _git(["--literal-pathspecs", "add", "--all", "--pathspec-from-file=-", "--pathspec-file-nul"], repo.top, env=env, stdin=paths)
        return _git(["diff", "--cached", "--binary", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", repo.commit],
                    repo.top, env=env).stdout


def _extract(repo: CodeRepo, dest: Path) -> None:
    """``git archive`` of the commit, extracted into ``dest``."""
    argv = ["git", "archive", "--format=tar", repo.commit]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=repo.top, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                if hasattr(tarfile, "tar_filter"):  # Python >= 3.12, and 3.10.12+/3.11.4+ backports
                    tar.extractall(dest, filter="tar")
                else:  # pragma: no cover - older patch releases; git archive writes no absolute or ../ paths
                    tar.extractall(dest)
        finally:
            proc.stdout.close()
            code = proc.wait()
        if code != 0:
            err.seek(0)
            raise SubmitError(f"{' '.join(argv)} failed (exit {code}) in {repo.top}: {err.read().decode(errors='replace').strip()}")


def _overlay(repo: CodeRepo, dest: Path) -> None:
    """Copy the working tree's changed files over the extracted commit (deleted ones removed)."""
    for change in repo.changes:
        src, dst = repo.top / change.path, dest / change.path
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        elif dst.is_dir() and not src.is_dir():
            shutil.rmtree(dst)
        if not os.path.lexists(src):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():  # an untracked nested repository or a submodule
            shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        else:
            shutil.copy2(src, dst)


@dataclass(frozen=True)
class TakenSnapshot:
    """A code snapshot on disk: its directory ``<run dir>/code/<id>/`` and its record.

    What every backend does with one lives here: the ranks' environment, the working
    directory of command mode, and the fields of the submission record."""

    dir: Path
    record: CodeSnapshot

    @property
    def id(self) -> str:
        """The directory's name: ``<commit>`` or ``<commit>-dirty-<12 hex of the diff's sha256>``."""
        return self.dir.name

    def environment(self, pythonpath_rest: str | None) -> dict[str, str]:
        """The ranks' variables: ``$JOBGEN_CODE_DIR`` (:data:`jobgen.jobdir.CODE_DIR_ENV`) names the
        snapshot, and its import directory goes first on ``PYTHONPATH`` ahead of ``pythonpath_rest``
        (the caller's PYTHONPATH, or None)."""
        return {CODE_DIR_ENV: str(self.dir), "PYTHONPATH": pythonpath(self.record.import_dir(self.dir), pythonpath_rest)}

    def workdir(self, path: Path) -> Path:
        """``path`` in the snapshot (:func:`inside_snapshot`): command mode's working directory."""
        return inside_snapshot(path, self.dir, self.record)


def take(repo: CodeRepo, run_dir: Path, *, allow_dirty: bool, out: Echo) -> TakenSnapshot:
    """Extract the snapshot into ``<run_dir>/code/<commit>[-dirty-<12 hex>]/`` (atomically: a
    temporary directory renamed into place) and return it with its record; an existing snapshot
    of the same commit and diff is reused (it is immutable).

    Raises:
        ConfigError: uncommitted changes without ``allow_dirty`` (:func:`check_clean`), or the
            target exists but is not the same snapshot.
        SubmitError: git failed.
    """
    check_clean(repo, allow_dirty=allow_dirty)
    patch = diff(repo) if repo.changes else None
    digest = hashlib.sha256(patch).hexdigest() if patch is not None else None
    info = CodeSnapshot(commit=repo.commit, dirty=patch is not None, diff_sha256=digest, repo=str(repo.top), python_path=repo.python_path)
    ident = repo.commit if digest is None else f"{repo.commit}-dirty-{digest[:12]}"
    parent = run_dir / CODE_SUBDIR
    dest = parent / ident
    described = f"{repo.top} at {repo.commit[:12]}" + (f" + {len(repo.changes)} uncommitted change(s), diff sha256 {digest[:12]}"
                                                        if digest else "")
    if dest.exists():
        existing = _same(dest, info)
        out(f"jobgen: code: {described}: snapshot {dest} (already there)")
        return TakenSnapshot(dest, existing)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{ident[:12]}.", suffix=".tmp"))
    try:
        _extract(repo, tmp)
        if patch is not None:
            _overlay(repo, tmp)
            (tmp / CODE_DIFF_FILE).write_bytes(patch)
        write_atomic(tmp / CODE_INFO_FILE, info.dumps())
        tmp.chmod(0o755)
        try:
            os.rename(tmp, dest)
        except OSError:  # another submit put the same snapshot there first
            if not dest.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            info = _same(dest, info)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    out(f"jobgen: code: {described}: snapshot {dest}")
    return TakenSnapshot(dest, info)


def _same(dest: Path, info: CodeSnapshot) -> CodeSnapshot:
    """The record of the existing snapshot ``dest``, checked to be ``info``'s commit and diff."""
    try:
        existing = read_code_snapshot(dest)
    except ConfigError:
        existing = None
    if existing is None or (existing.commit, existing.diff_sha256) != (info.commit, info.diff_sha256):
        raise ConfigError(f"{dest} exists but is not the snapshot of {info.commit}"
                          + (f" with diff sha256 {info.diff_sha256}" if info.diff_sha256 else ""),
                          hint=f"remove {dest} (it is not a jobgen snapshot of this code) and submit again")
    return existing


def snapshot_for(spec: TrainingSpec, *, spec_file: Path | None, job_dir: Path, run_dir: Path, allow_dirty: bool,
                 out: Echo, check_only: bool = False) -> TakenSnapshot | None:
    """Find the repository (:func:`find_repo`) and take its snapshot (:func:`take`); None when
    there is none to take. ``check_only`` (``sbatch --test-only``): refuse uncommitted changes
    as submit would, but write nothing."""
    repo = find_repo(spec, spec_file=spec_file, job_dir=job_dir, run_dir=run_dir, out=out)
    if repo is None:
        return None
    if check_only:
        check_clean(repo, allow_dirty=allow_dirty)
        out(f"jobgen: code: {repo.top} at {repo.commit[:12]} would be snapshotted into {run_dir / CODE_SUBDIR}/")
        return None
    return take(repo, run_dir, allow_dirty=allow_dirty, out=out)


def inside_snapshot(path: Path, root: Path, info: CodeSnapshot) -> Path:
    """``path`` in the snapshot ``root`` when it lies in the work tree the snapshot was taken from
    (``info.repo``), else ``path`` unchanged. Command mode runs the ranks there: a relative
    ``script`` (and relative config paths in ``args``) then resolve to the committed copies,
    not to files the user may edit while the job waits."""
    try:
        relative = path.resolve().relative_to(Path(info.repo).resolve())
    except ValueError:
        return path
    return root / relative


def local_import_dir(spec: TrainingSpec, spec_file: Path) -> Path | None:
    """Where the ranks will import the user's code from, in this working tree: the directory of
    the snapshot that goes first on their PYTHONPATH (:meth:`jobgen.jobdir.CodeSnapshot.import_dir`),
    i.e. ``code.python_path`` of the repository, by default its root (no ``code`` section, an
    empty or ``.`` python_path). ``jobgen validate --import`` and submit's import check put it
    first on ``sys.path``, as the snapshot goes first on the ranks' PYTHONPATH.

    ``None`` when no snapshot would be taken (:func:`find_repo`): a spec of the built-in models
    and data without ``code``, ``code.snapshot: false``, a git URL (the code is not here), or no
    git work tree holding the spec (then the ranks import what they find, as here).
    """
    code = spec.code
    if code is not None and (not code.snapshot or code.git is not None):
        return None
    if code is None and not spec.runs_user_code:
        return None
    start = (spec_file.resolve().parent / (code.repo if code is not None else ".")).resolve()
    top, _ = _toplevel(start) if start.is_dir() else (None, "")
    if top is None:
        return None
    python_path = code.python_path if code is not None else ""
    return top / python_path if python_path else top


def pythonpath(first: Path, rest: str | None) -> str:
    """``first`` ahead of an existing PYTHONPATH value (``rest``; empty parts dropped)."""
    return os.pathsep.join([str(first), *(p for p in (rest or "").split(os.pathsep) if p)])
