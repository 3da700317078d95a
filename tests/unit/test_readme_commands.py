"""The commands of the README and of every page of the documentation site (docs/) run, so the
documentation cannot drift from jobgen.

Every ``jobgen ...`` command of a page's fenced ``bash`` and ``text`` blocks (``$ jobgen ...``
lines too, with the output shown under them) is taken from the page as it is and run, in page
order, in a scratch copy of the repository of that page's own (its own git repository, so the
code snapshot and the dirty-tree check are real): each page stands alone, and nothing its
examples write lands in this checkout. (tests/unit/test_docs.py checks that every fenced block
of a page is in a language some test checks.)
What cannot run here is planned instead, or skipped, with the reason printed (``-rs`` / ``-s``):

- synopsis lines (``SPEC``, ``[--out manifests]``): every option they name must be in that
  subcommand's ``--help``;
- ``submit`` to a SLURM, Kubernetes or ssh profile: ``validate`` + ``render --stdout`` of the same spec
  and ``--set``s (the submits themselves run against the labs in tests/integration);
  ``submit DIR``: DIR must be a rendered job directory;
- ``status``/``logs``/``cancel`` of a ``slurm://``/``k8s://``/``ssh://`` handle: the labs (skipped here);
- ``profiles detect --scheduler slurm``: run against fake SLURM commands that answer as a SLURM
  25.05 cluster named ``grace`` with a GPU partition ``gpu`` (tests/fakes/slurm/detect/25.05/,
  the cluster docs/howto-own-slurm.md names), so the page's later commands take the profile it
  wrote; tests/unit/test_profiles_detect.py covers every release;
- ``profiles detect`` of other schedulers: the ssh hosts or a kube context (skipped here, its
  options checked against ``--help``; tests/unit and tests/integration run it against fakes and labs);
- ``doctor`` of a SLURM, Kubernetes or ssh profile: the cluster (its options checked against
  ``--help``; tests/integration runs it against the labs); of the ``local`` profile: run;
- a local training run: ``validate`` + ``render --stdout`` (the trainings run in tests/entrypoint);
  the command-mode example, a 3-step all-reduce, runs for real (where it runs, its summary.json,
  ``jobgen status`` COMPLETED);
- shell commands other than jobgen (pip, kubectl, sbatch, ...): not run; a ``manifests/`` or
  ``examples/`` path they name must exist by then.

Shown output (lines under a ``$ jobgen`` command) must appear in the command's output, in order.
At the end each page's own outputs leave ``jobgen render --all --check`` green and no change
that the next ``jobgen submit`` would refuse, but for the profiles ``profiles detect`` wrote: those
are the user's to review and commit. Commands run in-process (:func:`jobgen.cli.main`)
to keep the test short; only the command-mode run starts processes (torchrun, 2 ranks).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.pages import PAGES, page_name

README = (REPO / "README.md").read_text()
#: What the scratch copy of the repository holds (what the pages' commands read).
COPIED = ("examples", "cluster_profiles", "templates", "manifests", "jobgen.yaml")
#: Words of a synopsis line, not of a runnable command.
PLACEHOLDERS = {"SPEC", "PROFILE", "DIR", "HANDLE-or-DIR", "N", "C", "S", "FILE", "NAME", "JOB"}
#: Options of a cluster ``submit`` that ``render`` shares (the rest are submit-only).
SHARED_OPTIONS = {"--set", "-s", "--profile", "-p"}
#: Options of ``submit`` that ``render`` shares and ``validate`` does not take.
RENDER_OPTIONS = {"--sweep"}
#: The command-mode example that runs for real (3 steps of a 2-rank all-reduce, no training).
REAL_RUN = "examples/command-ddp.yaml"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


@dataclass(frozen=True)
class Shown:
    """One command of a page: its line, its words, the output shown under it."""

    line: int
    words: tuple[str, ...]
    expected: tuple[str, ...] = ()
    page: str = "README.md"

    @property
    def jobgen(self) -> bool:
        return bool(self.words) and Path(self.words[0]).name == "jobgen"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.words)}"


def readme_commands(text: str = README, page: str = "README.md") -> list[Shown]:
    """The commands of ``text``'s fenced bash/text blocks, in order: continuation lines joined,
    ``&&`` chains split, comments dropped; a ``$ `` line of a text block takes the lines under
    it (up to the next ``$ `` line) as its shown output."""
    found: list[Shown] = []
    for block in re.finditer(r"^( *)```(bash|text)\n(.*?)^ *```", text, flags=re.S | re.M):
        first = text[:block.start(3)].count("\n") + 1
        lines = [line[len(block.group(1)):] for line in block.group(3).splitlines()]
        i = 0
        while i < len(lines):
            start, logical = i, lines[i]
            while logical.endswith("\\") and i + 1 < len(lines):
                i += 1
                logical = logical[:-1] + " " + lines[i].strip()
            i += 1
            dollar = logical.startswith("$ ")
            if not dollar and (block.group(2) == "text" and not logical.startswith("jobgen ")):
                continue
            expected: list[str] = []
            if dollar:
                while i < len(lines) and not lines[i].startswith("$ "):
                    expected.append(lines[i].rstrip())
                    i += 1
            command = logical[2:] if dollar else logical
            for part in command.split(" && "):
                try:
                    words = tuple(shlex.split(part, comments=True))
                except ValueError:  # a shell construct shlex does not take: not a jobgen command
                    words = tuple(part.split())
                if words:
                    found.append(Shown(first + start, words, tuple(e for e in expected if e.strip()), page))
    return found


def page_commands(page: Path) -> list[Shown]:
    """The commands of one page (README.md or a page of docs/)."""
    return readme_commands(page.read_text(), page_name(page))


def test_the_readme_commands_are_found():
    """The extraction sees the pages' commands (a format change must not make the test vacuous)."""
    commands = [c for page in PAGES for c in page_commands(page) if c.jobgen]
    assert len(commands) >= 30
    assert len([c for c in readme_commands() if c.jobgen]) >= 8  # the landing page: one example per backend
    assert any(c.words[1:3] == ("submit", "examples/quickstart.yaml") for c in commands)
    assert any(c.words[1] == "plan" and c.expected for c in commands)


# --------------------------------------------------------------------------- running them


@dataclass
class Result:
    code: int
    out: str


class Scratch:
    """A scratch copy of the repository (its own git repository) that commands run in."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, profiles: dict[str, str] | None = None):
        self.root = root
        #: The profiles ``jobgen profiles detect`` wrote (the user reviews and commits them).
        self.detected: list[Path] = []
        for name in COPIED:
            src = REPO / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / name)
        for relative, content in (profiles or {}).items():  # the page's own profiles, as the user added them
            (root / relative).write_text(content)
        self.tmp = root.parent / "tmp"  # the pages' /tmp/, outside the repository
        self.tmp.mkdir()
        for key, value in GIT_ENV.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("JOBGEN_STATE_DIR", str(root.parent / "state"))
        for key in ("JOBGEN_DEBUG", "JOBGEN_CODE_DIR", "JOBGEN_HOME", "SBATCH_EXPORT", "PYTHONPATH"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("PYTHONPATH", str(REPO))  # the ranks import this checkout's jobgen
        monkeypatch.chdir(root)
        for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the repository, as cloned"]):
            subprocess.run(["git", *argv], cwd=root, check=True, capture_output=True)

    def words(self, shown: Shown) -> list[str]:
        """The command's arguments, ``/tmp/`` (the pages' scratch place) moved into the scratch copy."""
        return [w.replace("/tmp/", f"{self.tmp}/") for w in shown.words[1:]]

    def detect(self, *argv: str) -> Result:
        """``jobgen profiles detect ARGV`` against fake ``sinfo``/``scontrol``/``sacctmgr`` that answer
        as the SLURM 25.05 cluster ``grace`` (tests/fakes/slurm/detect/25.05/); the profile it
        writes is remembered in :attr:`detected`."""
        from tests.fakes.slurm.fakeslurm import FakeSlurm, detect_replies

        fake_root = self.root.parent / f"fake-slurm-{len(list(self.root.parent.glob('fake-slurm-*')))}"
        fake = FakeSlurm(fake_root)
        detect_replies(fake, "25.05")
        before = set((self.root / "cluster_profiles").glob("*.yaml"))
        with pytest.MonkeyPatch.context() as env:
            for key, value in fake.env.items():
                env.setenv(key, value)
            result = self.jobgen("profiles", "detect", *argv)
        self.detected += sorted(set((self.root / "cluster_profiles").glob("*.yaml")) - before)
        return result

    def jobgen(self, *argv: str) -> Result:
        """``jobgen ARGV`` in-process (the console entry point: exit code, stdout + stderr)."""
        from jobgen.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main(list(argv))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return Result(code, out.getvalue())


def options_in(words: list[str]) -> list[str]:
    """The options a synopsis names (``[--out manifests]`` -> ``--out``, ``--dry-run=server`` -> ``--dry-run``)."""
    return [w.strip("[]|").split("=")[0] for w in words if w.strip("[]|").startswith("-") and w.strip("[]|") not in ("-", "--")]


def check_synopsis(scratch: Scratch, words: list[str], shown: Shown) -> None:
    """Each subcommand a synopsis line names exists and takes the options it lists (a group's
    subcommand, ``profiles show``, is looked up in the group)."""
    import click

    from jobgen.cli import cli

    segments: list[list[str]] = []
    for word in words:
        bare = word.strip("[]|")
        group = cli.commands.get(segments[-1][0]) if segments else None
        if bare in cli.commands and not (isinstance(group, click.Group) and len(segments[-1]) == 1):
            segments.append([bare])
        elif segments:
            segments[-1].append(word)
    assert segments, f"{shown}: names no subcommand"
    for segment in segments:
        command = [segment[0]]
        group = cli.commands[segment[0]]
        if isinstance(group, click.Group) and len(segment) > 1:
            assert segment[1] in group.commands, f"{shown}: `jobgen {segment[0]}` has no subcommand {segment[1]}"
            command.append(segment[1])
        help_text = scratch.jobgen(*command, "--help")
        assert help_text.code == 0, f"{shown}: jobgen {' '.join(command)} --help -> {help_text.code}\n{help_text.out}"
        for option in options_in(segment[len(command):]):
            assert re.search(rf"(^|[\s,]){re.escape(option)}([\s,=/]|$)", help_text.out, flags=re.M), (
                f"{shown}: `jobgen {' '.join(command)}` has no option {option} (its --help:\n{help_text.out})")


def assert_shows(result: Result, shown: Shown, scratch: Scratch) -> None:
    """The page's shown output lines appear in the command's output, in this order."""
    got = [line.rstrip() for line in result.out.splitlines()]
    at = 0
    for line in shown.expected:
        want = line.replace("/tmp/", f"{scratch.tmp}/")
        while at < len(got) and got[at] != want:
            at += 1
        assert at < len(got), f"{shown}: the page shows\n  {want}\nwhich the command does not print (in this order):\n{result.out}"
        at += 1


def cluster_profile(scratch: Scratch, profile: str | None) -> bool:
    if profile is None:
        return False
    from jobgen.specs.load import load_profile

    return load_profile(profile).scheduler != "local"


def local_profile(profile: str | None) -> bool:
    """``profile`` loads and is a local one (not a cluster's, nor a file a skipped ``detect`` would write)."""
    from jobgen.errors import ConfigError
    from jobgen.specs.load import load_profile

    try:
        return profile is not None and load_profile(profile).scheduler == "local"
    except ConfigError:
        return False


def option(words: list[str], *names: str) -> str | None:
    for i, word in enumerate(words):
        if word in names and i + 1 < len(words):
            return words[i + 1]
        for name in names:
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def plan_instead(scratch: Scratch, words: list[str], shown: Shown) -> None:
    """``validate`` and ``render --stdout`` of a submit's spec, profile and --set overrides
    (``render`` with its ``--sweep`` axes too)."""
    spec, shared, swept, i = words[1], [], [], 2
    while i < len(words):
        if words[i] in SHARED_OPTIONS | RENDER_OPTIONS and i + 1 < len(words):
            (shared if words[i] in SHARED_OPTIONS else swept).extend(words[i:i + 2])
            i += 2
        else:
            i += 1
    for argv in (["validate", spec, *shared], ["render", spec, *shared, *swept, "--stdout"]):
        result = scratch.jobgen(*argv)
        assert result.code == 0, f"{shown}: jobgen {shlex.join(argv)} -> {result.code}\n{result.out}"


def run_real(scratch: Scratch, words: list[str], shown: Shown) -> None:
    """The command-mode example, for real: it runs in the snapshot's copy of the submit
    directory (docs/own-code.md, "Where it runs") and ends COMPLETED with a summary.json."""
    result = scratch.jobgen(*words)
    assert result.code == 0, f"{shown} -> {result.code}\n{result.out}"
    run_dir = scratch.root / "runs" / "command-ddp"
    summary = json.loads((run_dir / "summary.json").read_text())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=scratch.root, capture_output=True, text=True, check=True).stdout.strip()
    assert summary["cwd"] == str(run_dir.resolve() / "code" / commit), summary
    status = scratch.jobgen("status", f"local://{run_dir.resolve()}")
    assert status.code == 0 and "COMPLETED" in status.out, status.out


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_the_readme_commands_run(page, tmp_path, monkeypatch):
    commands = page_commands(page)
    if not commands:  # nothing to run (the reference pages: generated tables)
        return
    scratch = Scratch(tmp_path / "repo", monkeypatch, profiles=invented_profiles(page.read_text()))
    skipped: list[str] = []
    timings: list[tuple[float, str]] = []
    for shown in commands:
        started = time.perf_counter()
        try:
            run_one(scratch, shown, skipped)
        finally:
            timings.append((time.perf_counter() - started, str(shown)))
    for line, root, files in file_trees(page.read_text()):  # a directory the page shows: its commands wrote it
        where = Path(root.replace("/tmp/", f"{scratch.tmp}/"))
        missing = [f for f in files if not (where / f).is_file()]
        assert not missing, f"{page_name(page)}:{line}: {root} lacks {missing} after the page's commands"
    # Following the page leaves it true: the committed manifests are current, and nothing the
    # examples wrote would make the next `jobgen submit` refuse (jobgen's outputs never block it).
    check = scratch.jobgen("render", "--all", "--check")
    assert check.code == 0, check.out
    from jobgen.usercode.snapshot import changes

    assert changes(scratch.root, exclude=scratch.detected) == ()
    slowest = [f"{seconds:6.1f} s  {what}" for seconds, what in sorted(timings, reverse=True)[:5]]
    print("\n".join([f"{page_name(page)}: commands not run here, and why:", *skipped, f"slowest {page_name(page)} commands:", *slowest]))


def run_one(scratch: Scratch, shown: Shown, skipped: list[str]) -> None:
    """Run (or plan, check, skip) one command of a page; see the module docstring."""
    words = scratch.words(shown)
    if not shown.jobgen:
        if shown.words[0] == "printf":  # writes a page's example config into /tmp/
            subprocess.run(["bash", "-c", shlex.join(shown.words).replace("'>'", ">").replace("/tmp/", f"{scratch.tmp}/")],
                           cwd=scratch.root, check=True)
            return
        for word in shown.words:
            path = word.strip("()")
            if path.startswith(("manifests/", "examples/")):
                assert (scratch.root / path).exists(), f"{shown}: {path} does not exist after the commands above it"
        skipped.append(f"{shown}: not jobgen; not run here")
        return
    if not words:
        return
    if any(w.strip("[]|") in PLACEHOLDERS or w.startswith("[") or w == "|" for w in words):
        check_synopsis(scratch, words, shown)
        return
    if any(w.startswith(("slurm://", "k8s://", "ssh://")) for w in words):
        skipped.append(f"{shown}: needs the cluster (tests/integration runs it against the labs)")
        return
    if words[:2] == ["profiles", "detect"]:
        check_synopsis(scratch, words, shown)
        if option(words, "--scheduler") != "slurm":
            skipped.append(f"{shown}: needs the ssh hosts or a kube context (tests/unit and tests/integration run it against "
                           "fakes and the labs); its options checked against --help")
            return
        result = scratch.detect(*words[2:])
        assert result.code == 0, f"{shown} (against the fake SLURM 25.05 cluster 'grace') -> {result.code}\n{result.out}"
        assert_shows(result, shown, scratch)
        return
    profile = option(words, "--profile", "-p")
    if words[0] == "doctor" and not local_profile(profile):
        check_synopsis(scratch, words, shown)
        skipped.append(f"{shown}: checks a live cluster (tests/integration runs doctor against the labs); its options checked against --help")
        return
    if words[0] == "submit" and Path(words[1]).suffix not in (".yaml", ".yml"):
        from jobgen.jobdir import is_job_dir

        assert is_job_dir(scratch.root / words[1]), f"{shown}: {words[1]} is not a rendered job directory"
        skipped.append(f"{shown}: submits to a cluster (tests/integration); checked that it is a job directory")
        return
    if words[0] == "submit" and cluster_profile(scratch, profile):
        plan_instead(scratch, words, shown)
        skipped.append(f"{shown}: submits to a cluster (tests/integration); validated and rendered --stdout here")
        return
    if words[0] == "submit" and words[1] == REAL_RUN:
        run_real(scratch, words, shown)
        return
    if words[0] == "submit":
        plan_instead(scratch, words, shown)
        skipped.append(f"{shown}: a training run (tests/entrypoint trains); validated and rendered --stdout here")
        return
    if words[0] == "calibrate" and not all((scratch.root / w / "summary.json").is_file() for w in words[1:] if not w.startswith("-")):
        check_synopsis(scratch, words, shown)
        skipped.append(f"{shown}: needs a finished training run (the page's run was rendered only here); "
                       "tests/unit/test_calibration.py calibrates run directories")
        return
    result = scratch.jobgen(*words)
    want = 2 if any(line.startswith("error:") for line in shown.expected) else 0
    assert result.code == want, f"{shown}: exit {result.code}, expected {want}\n{result.out}"
    assert_shows(result, shown, scratch)


def file_trees(text: str) -> list[tuple[int, str, list[str]]]:
    """``(line, directory, files)`` of every ```text block of ``text`` that shows a directory: its
    first line a path ending in ``/``, then a file per line, indented two blanks, its comment
    after it (lines indented further continue a comment; ``...`` stands for more files)."""
    trees = []
    for m in re.finditer(r"^```text\n(/.*?/)\n(.*?)^```", text, flags=re.S | re.M):
        files = [row.split()[0] for row in m.group(2).splitlines() if re.match(r"  \S", row) and row.split()[0] != "..."]
        trees.append((text[:m.start()].count("\n") + 2, m.group(1), files))
    return trees


def test_a_directory_a_page_shows_is_found():
    """The sweeps page's job-array directory is one :func:`file_trees` reads (not vacuous)."""
    trees = [tree for page in PAGES for tree in file_trees(page.read_text())]
    assert ("/tmp/sweeps/slurm-cpu-array/quickstart/", ["job.sbatch", "array.json", "points/0/spec.json", "points/3/spec.json"]) in [
        (root, files) for _, root, files in trees]


# --------------------------------------------------------------------------- YAML snippets


def yaml_snippets(text: str = README) -> list[tuple[int, str]]:
    """``(line, text)`` of every fenced ``yaml`` block of ``text`` (indentation of list items removed)."""
    return [(text[:m.start(3)].count("\n") + 1, "\n".join(line[len(m.group(1)):] for line in m.group(3).splitlines()))
            for m in re.finditer(r"^( *)```(yaml)\n(.*?)^ *```", text, flags=re.S | re.M)]


def invented_profiles(text: str) -> dict[str, str]:
    """``{"cluster_profiles/<name>.yaml": text}`` of every YAML snippet of ``text`` headed
    ``# cluster_profiles/<name>.yaml`` that names no shipped profile: a profile the page has the
    user write (``site-h100``), which the page's commands then name."""
    found = {}
    for _, snippet in yaml_snippets(text):
        header = re.match(r"# (cluster_profiles/[\w.-]+\.yaml)\s*$", snippet.splitlines()[0])
        if header and not (REPO / header.group(1)).exists():
            found[header.group(1)] = snippet + "\n"
    return found


def test_a_page_profile_is_found():
    """docs/profiles.md's ``site-h100`` is one :func:`invented_profiles` reads; a shipped one is not."""
    found = invented_profiles((REPO / "docs" / "profiles.md").read_text())
    assert "cluster_profiles/site-h100.yaml" in found and "extends: k8s-h100" in found["cluster_profiles/site-h100.yaml"]
    assert "cluster_profiles/k8s-h100.yaml" not in found


def is_subset(part: object, whole: object) -> bool:
    """Every key and value of ``part`` is in ``whole`` (mappings recursively; other values equal)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and is_subset(v, whole[k]) for k, v in part.items())
    return part == whole


def test_the_yaml_snippets_are_found():
    """The extraction sees the pages' YAML snippets, some of them naming a shipped file."""
    snippets = [text for page in PAGES for _, text in yaml_snippets(page.read_text())]
    assert len(snippets) >= 8
    assert len([t for t in snippets if re.match(r"# ((?:examples|cluster_profiles)/[\w./-]+\.yaml)\s*$", t.splitlines()[0])]) >= 2


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_the_readme_yaml_snippets_parse_and_match_the_files_they_name(page, tmp_path):
    """Every YAML snippet parses; one headed ``# examples/X.yaml`` or ``# cluster_profiles/X.yaml``
    says what the shipped file says, and a profile a page invents (``mysite``) loads."""
    import yaml

    from jobgen.specs.load import load_profile

    where = page_name(page)
    for line, text in yaml_snippets(page.read_text()):
        doc = yaml.safe_load(text)
        assert doc is not None, f"{where}:{line}: an empty YAML snippet"
        header = re.match(r"# ((?:examples|cluster_profiles)/[\w./-]+\.yaml)\s*$", text.splitlines()[0])
        if header is None:
            continue
        path = REPO / header.group(1)
        if path.is_file() and header.group(1).startswith("examples/"):  # the same spec once defaults are filled in
            from jobgen.specs.load import load_spec

            (tmp_path / path.name).write_text(text)
            assert load_spec(tmp_path / path.name) == load_spec(path), f"{where}:{line}: the snippet differs from {header.group(1)}"
        elif path.is_file():
            assert is_subset(doc, yaml.safe_load(path.read_text())), f"{where}:{line}: the snippet differs from {header.group(1)}"
        else:
            assert header.group(1).startswith("cluster_profiles/"), f"{where}:{line}: {header.group(1)} does not exist"
            (tmp_path / path.name).write_text(text)
            assert load_profile(path.stem, tmp_path).name == path.stem
