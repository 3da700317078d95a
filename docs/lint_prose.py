"""Measure the prose of the user pages and the public docstrings of jobgen.

Run it from the repository root::

    python docs/lint_prose.py

It prints one row per user page and exits non-zero when a rule below is broken.
The user pages are the pages of mkdocs.yml's ``nav`` outside the developer section
(:data:`DEVELOPER_SECTION`).

The rules:

- Sentence length: the mean sentence of a page's prose is at most :data:`MAX_MEAN_WORDS` words.
  Prose is the text outside fenced code blocks, tables, headings, HTML comments and front matter.
  The title line of an admonition (``!!! note``, ``??? note``) or of a tab (``=== "docker"``) is no
  prose; their indented bodies are.
  A code span counts as one word.
- Page length: a page has at most :data:`MAX_PAGE_WORDS` words outside fenced code blocks.
- References: no user page and no public docstring of jobgen/ holds an issue reference, a commit
  hash, a machine path or the name of a file that is not in the repository
  (:func:`references` defines each).
  A reference page's generated tables (its ``<!-- jobgen-reference: NAME -->`` marker, expanded as
  the site's build hook does) are checked too: they show the models' field descriptions.

A page of :data:`PENDING` is measured and reported but fails only when its figures get worse than
the ones listed.
A page of :data:`PENDING` that passes every rule fails the run until it is removed from the list.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
#: The most words a user page's sentences may have on average.
MAX_MEAN_WORDS = 25
#: The most words a user page may have outside its code blocks.
MAX_PAGE_WORDS = 2500
#: The title of the nav section whose pages are developer pages (not measured).
DEVELOPER_SECTION = "Developers"
#: Pages not yet rewritten: ``page: (mean words per sentence, words)`` as last measured.
#: A page here may not get worse than its figures; the list only shrinks.
PENDING: dict[str, tuple[float, int]] = {}

#: Abbreviations whose full stop does not end a sentence.
ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "incl.", "no.", "fig.", "mr.", "dr.", "et al.")
#: Files that other projects or sessions keep and this repository does not hold.
FOREIGN_FILES = ("LAB-NOTES", "HOUSE-STYLE", "ARCHITECTURE.md", "../shared")


# --------------------------------------------------------------------------- prose


def strip_front_matter(text: str) -> str:
    """The text without a leading ``---`` YAML front matter block."""
    match = re.match(r"\s*---\n.*?\n---\n", text, flags=re.S)
    return text[match.end():] if match else text


def strip_code_blocks(text: str) -> str:
    """The text without fenced code blocks (indented ones in list items too) and HTML comments."""
    text = re.sub(r"^( *)(```|~~~).*?^ *\2 *$", "", text, flags=re.S | re.M)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def prose(text: str) -> str:
    """The prose of a Markdown page: no front matter, code blocks, tables, headings or comments.

    A code span becomes one word (``CODE``) and a link becomes its text.
    Paragraphs and list items are separated by blank lines.
    """
    text = strip_code_blocks(strip_front_matter(text))
    text = re.sub(r"`+[^`\n]*`+", "CODE", text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", text)
    kept: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("|", "#")) or re.match(r"\[[^\]]+\]:", stripped) or stripped.startswith(("<", "!!!", "???", "===")):
            kept.append("")
            continue
        item = re.match(r"(?:[-*+]|\d+[.)])\s+(.*)", stripped)
        if item:  # a list item starts a paragraph of its own
            kept += ["", item.group(1)]
        else:
            kept.append(stripped)
    return "\n".join(kept)


def words(text: str) -> list[str]:
    """The words of ``text``: whitespace-separated tokens holding a letter or a digit."""
    return [token for token in text.split() if re.search(r"\w", token)]


def sentences(text: str) -> list[str]:
    """The sentences of a page's prose (:func:`prose`), each a string.

    A sentence ends at ``.``, ``!`` or ``?`` followed by white space, or at the end of a paragraph.
    The full stop of an abbreviation (:data:`ABBREVIATIONS`) does not end one.
    A paragraph without a word is no sentence.
    """
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        for abbreviation in ABBREVIATIONS:
            flat = re.sub(rf"(?<!\w){re.escape(abbreviation)}", abbreviation.replace(".", "\0"), flat, flags=re.I)
        for sentence in re.split(r"(?<=[.!?])[)\"']?\s+", flat):
            if words(sentence):
                out.append(sentence.replace("\0", "."))
    return out


# --------------------------------------------------------------------------- references

#: ``issue 23``, ``issues 23 and 30``, ``#123``, ``(#12)``, ``PR 4``.
ISSUE = re.compile(r"\b(?:issues?|PRs?|pull request)\s+#?\d+\b|(?<![\w&/#])#\d{1,5}\b", re.I)
#: A commit hash: 7 to 40 hex digits with a digit and a letter, not part of a longer hex run,
#: a sha256 digest (``sha256:...``), a colour (``#a1b2c3``), a number (``0x...``) or a UUID.
COMMIT = re.compile(r"(?<![\w./:@#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])")
#: A path on one machine: a checkout, a home directory, a test's scratch directory.
#: ``/tmp/<name>`` alone is fine (a page's scratch output); ``~`` stands for a home directory.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home/[\w.-]+|Users/[\w.-]+|var/tmp|tmp/pytest-of-[\w.-]*)(?=/|\b)")


@dataclass(frozen=True)
class Finding:
    """A reference that a user page or a public docstring may not hold."""

    where: str
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}: {self.text!r}"


def references(text: str, where: str, repo_files: frozenset[str] = frozenset()) -> list[Finding]:
    """The issue references, commit hashes, machine paths and foreign file names of ``text``.

    ``repo_files`` holds the base names of the repository's files.
    An all-capitals Markdown name (``NOTES.md``) that is not one of them is a foreign file.
    """
    found = [Finding(where, "issue reference", m.group()) for m in ISSUE.finditer(text)]
    found += [Finding(where, "commit hash", m.group()) for m in COMMIT.finditer(text)]
    found += [Finding(where, "machine path", m.group()) for m in MACHINE_PATH.finditer(text)]
    for name in FOREIGN_FILES:
        if name in text:
            found.append(Finding(where, "file not in the repository", name))
    for match in re.finditer(r"(?<![\w/.-])[A-Z][A-Z0-9_-]+\.md\b", text):
        if match.group() not in repo_files and not any(name in match.group() for name in FOREIGN_FILES):
            found.append(Finding(where, "file not in the repository", match.group()))
    return found


def public_docstrings(path: Path) -> list[tuple[str, str]]:
    """``(name, docstring)`` of a module, its public classes and functions, and their public methods."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[str, str]] = []
    if (doc := ast.get_docstring(tree)) is not None:
        out.append(("module", doc))

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if (doc := ast.get_docstring(node)) is not None:
                    out.append((prefix + node.name, doc))
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")

    walk(tree.body, "")
    return out


# --------------------------------------------------------------------------- pages


def nav_pages(nav: list, section: str = "") -> list[tuple[str, str]]:
    """``(section, page)`` of every page of mkdocs.yml's ``nav``; ``section`` is the top-level title."""
    out: list[tuple[str, str]] = []
    for entry in nav:
        title, value = next(iter(entry.items())) if isinstance(entry, dict) else ("", entry)
        if isinstance(value, list):
            out += nav_pages(value, section or title)
        else:
            out.append((section, value))
    return out


def user_pages(repo: Path = REPO) -> list[str]:
    """The user pages: the nav's pages outside :data:`DEVELOPER_SECTION`, relative to docs/."""
    config = yaml.load((repo / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    return [page for section, page in nav_pages(config["nav"]) if section != DEVELOPER_SECTION]


@dataclass
class Measure:
    """The figures of one page."""

    page: str
    words: int
    sentences: int
    findings: list[Finding] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return self.words_in_sentences / self.sentences if self.sentences else 0.0

    words_in_sentences: int = 0
    #: The words of the longest sentence (reported, not a rule).
    longest: int = 0

    def problems(self) -> list[str]:
        """What breaks a rule, in words."""
        out = []
        if self.mean > MAX_MEAN_WORDS:
            out.append(f"mean sentence {self.mean:.1f} words (at most {MAX_MEAN_WORDS})")
        if self.words > MAX_PAGE_WORDS:
            out.append(f"{self.words} words (at most {MAX_PAGE_WORDS})")
        out += [str(f) for f in self.findings]
        return out


def measure(text: str, page: str, repo_files: frozenset[str] = frozenset()) -> Measure:
    """The figures of one page's text."""
    found = sentences(prose(text))
    lengths = [len(words(s)) for s in found]
    return Measure(page, len(words(strip_code_blocks(strip_front_matter(text)))), len(found),
                   references(text, page, repo_files), sum(lengths), max(lengths, default=0))


def repository_files(repo: Path = REPO) -> frozenset[str]:
    """The base names of the repository's files: git's tracked files, or, outside a git checkout,
    the files under ``repo`` (hidden directories, virtual environments and builds skipped)."""
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        return frozenset(Path(line).name for line in listed.stdout.splitlines())
    skip = {".git", ".venv", "venv", "node_modules", "site", "__pycache__"}
    return frozenset(p.name for p in repo.rglob("*") if p.is_file() and not skip & set(p.relative_to(repo).parts))


def docstring_findings(repo: Path = REPO, repo_files: frozenset[str] = frozenset()) -> list[Finding]:
    """The references of the public docstrings of jobgen/."""
    out: list[Finding] = []
    for path in sorted((repo / "jobgen").rglob("*.py")):
        relative = path.relative_to(repo).as_posix()
        for name, doc in public_docstrings(path):
            out += references(doc, f"{relative}:{name}", repo_files)
    return out


def generated(text: str) -> str:
    """What the site's build hook puts in place of a page's reference markers (empty without one)."""
    if "<!-- jobgen-reference:" not in text:
        return ""
    if str(REPO) not in sys.path:  # this checkout's jobgen, not another one installed
        sys.path.insert(0, str(REPO))
    import importlib.util

    from jobgen.specs.reference import expand

    # the build hook's own table of markers (docs/hooks.py REFERENCES), so both know the same names
    spec = importlib.util.spec_from_file_location("jobgen_docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    markers = "\n".join(line for line in text.splitlines() if line.startswith("<!-- jobgen-reference:"))
    return expand(markers, hooks.REFERENCES)


def run(repo: Path = REPO, out=sys.stdout) -> int:
    """Measure the user pages and the docstrings, print a table, return the exit status."""
    repo_files = repository_files(repo)
    failed = False
    print(f"{'page':<28} {'words':>6} {'sentences':>9} {'mean':>5} {'longest':>7} {'refs':>4}  status", file=out)
    for page in user_pages(repo):
        text = (repo / "docs" / page).read_text()
        figures = measure(text, f"docs/{page}", repo_files)
        figures.findings += references(generated(text), f"docs/{page} (generated)", repo_files)
        problems = figures.problems()
        status = "ok"
        if page in PENDING:
            mean, words_then = PENDING[page]
            if not problems:
                status, failed = "passes: remove it from PENDING", True
            elif figures.findings or figures.mean > mean + 0.05 or figures.words > words_then:
                status, failed = f"worse than PENDING {PENDING[page]}", True
            else:
                status = "pending"
        elif problems:
            status, failed = "FAIL", True
        print(f"{page:<28} {figures.words:>6} {figures.sentences:>9} {figures.mean:>5.1f} {figures.longest:>7} {len(figures.findings):>4}  {status}", file=out)
        if status != "pending":
            for problem in problems:
                print(f"    {problem}", file=out)
    stale = sorted(set(PENDING) - set(user_pages(repo)))
    if stale:
        failed = True
        print(f"PENDING names pages that are not user pages: {stale}", file=out)
    docstrings = docstring_findings(repo, repo_files)
    print(f"public docstrings of jobgen/: {len(docstrings)} findings", file=out)
    for finding in docstrings:
        print(f"    {finding}", file=out)
    return 1 if failed or docstrings else 0


if __name__ == "__main__":
    sys.exit(run())
