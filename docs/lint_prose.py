"""Measure the prose of the user pages and the public docstrings of jobgen; check the comments.

Run it from the repository root::

    python docs/lint_prose.py

It prints one row per user page, then the findings in docstrings and comments, and exits non-zero
when a rule below is broken.
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
- Comments state the rule, not its history: no comment and no docstring of the code, tests,
  benchmarks, examples, templates and CI scripts (:data:`COMMENTED`) holds an issue reference of
  this project, a commit hash, a work-session reference or a review's numbered finding
  (:func:`history_matches` defines each).
  Only comments and docstrings are read (:func:`comments`): a string literal is data, and may hold
  an issue reference as a test's input. A citation of another project's issue (``owner/repo#N``,
  ``pytest-xdist issue #1386``, an issue's URL) is a source, not history, and passes.

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
#: Files that other projects or sessions keep and this repository does not hold (joined from
#: pieces, so that this file itself names none of them).
FOREIGN_FILES = ("-".join(("LAB", "NOTES")), "-".join(("HOUSE", "STYLE")), "ARCHI" + "TECTURE.md", ".." + "/shared")
#: Any of :data:`FOREIGN_FILES` in a text.
FOREIGN = re.compile("|".join(re.escape(name) for name in FOREIGN_FILES))


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

#: ``issue 23``, ``issue-22``, ``issues 23 and 30``, ``#123``, ``(#12)``, ``PR 4``.
ISSUE = re.compile(r"\b(?:issues?|PRs?|pull request)(?:\s+|-)#?\d+\b|(?<![\w&/#])#\d{1,5}\b", re.I)
#: A commit hash: 7 to 40 hex digits with a digit and a letter, not part of a longer hex run,
#: a sha256 digest (``sha256:...``), a colour (``#a1b2c3``), a number (``0x...``) or a UUID.
COMMIT = re.compile(r"(?<![\w./:@#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])")
#: A path on one machine: a checkout, a home directory, a test's scratch directory.
#: ``/tmp/<name>`` alone is fine (a page's scratch output); ``~`` stands for a home directory.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home/[\w.-]+|Users/[\w.-]+|var/tmp|tmp/pytest-of-[\w.-]*)(?=/|\b)")


#: A work session named by its number: ``stop 37``, ``session 12``.
SESSION = re.compile(r"\b(?:stop|session)\s+#?\d+\b", re.I)
#: A review's numbered finding, as a label: ``finding 6:``, ``(finding 14)``, ``findings 7, 8:``.
FINDING = re.compile(r"\bfindings?\s+\d+(?:\s*(?:,|and)\s*\d+)*\s*[:)]", re.I)
#: Words before ``issue N`` that make it this project's: ``(issue 22)``, ``since issue 32``, ``in issue 23``.
OWN_ISSUE_WORDS = frozenset({
    "a", "after", "an", "and", "as", "at", "before", "by", "cf", "during", "for", "from", "in", "jobgen", "jobgen's",
    "of", "on", "our", "per", "see", "since", "the", "this", "to", "until", "with", "when", "where", "while"})


def other_project(text: str, start: int) -> bool:
    """Whether the issue reference at ``text[start:]`` cites another project's issue tracker.

    It does when the word right before ``issue``/``PR`` names a project: a word with a hyphen, a dot,
    a slash or a digit (``pytest-xdist``, ``huggingface/transformers``), one with a capital past its
    first letter (``PyTorch``, ``NCCL``), or a capitalised word inside a sentence (``Lightning``).
    A word of :data:`OWN_ISSUE_WORDS` (``since issue 32``), a sentence's first word and a word that
    ends a clause (``kubenodes.py, issue 31``) do not.
    """
    before = re.search(r"(\S+)\s+$", text[:start])
    if not before:
        return False
    word = before.group(1).lstrip("([{\"'`")
    if not re.search(r"[A-Za-z]", word) or not re.search(r"\w$", word) or word.lower() in OWN_ISSUE_WORDS:
        return False
    if re.search(r"[-./\d]", word.rstrip(".")) or re.search(r"[A-Z]", word[1:]):
        return True
    first_of_sentence = re.search(r"(?:^|[.!?:]\s+)$", text[:before.start()]) is not None
    return word[0].isupper() and not first_of_sentence


def history_matches(text: str) -> list[tuple[str, re.Match]]:
    """``(rule, match)`` of each reference to this project's history in a comment or docstring ``text``.

    An issue reference of this project (:data:`ISSUE`, unless :func:`other_project` says it cites
    another project), a commit hash (:data:`COMMIT`) unless it pins another project's release tag
    (``kubeflow/trainer tag v2.3.0 (commit 658725bd)``), a work session (:data:`SESSION`) and a
    review's numbered finding (:data:`FINDING`), and the name of a notes file that is not in the
    repository (:data:`FOREIGN_FILES`).
    """
    found = [("issue reference", m) for m in ISSUE.finditer(text)
             if not (m.group()[0].isalpha() and other_project(text, m.start()))]
    found += [("commit hash", m) for m in COMMIT.finditer(text)
              if not re.search(r"\btag v?\d+(?:\.\d+)+\W{1,3}(?:commit\s+)?$", text[max(0, m.start() - 40):m.start()])]
    found += [("session reference", m) for m in SESSION.finditer(text)]
    found += [("review finding", m) for m in FINDING.finditer(text)]
    found += [("file not in the repository", m) for m in FOREIGN.finditer(text)]
    return sorted(found, key=lambda found: found[1].start())


@dataclass(frozen=True)
class Finding:
    """A reference that a user page, a docstring or a comment may not hold."""

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


# --------------------------------------------------------------------------- comments

#: The directories whose comments and docstrings :func:`comment_findings` reads.
COMMENTED = ("jobgen", "tests", "benchmarks", "examples", "templates", ".ci")
#: Directories under :data:`COMMENTED` that hold what other projects wrote or what jobgen generated:
#: vendored resource definitions and the golden files rendered from templates/.
NOT_OURS = ("jobgen/_crds", "tests/golden/data")
#: The files read for ``#`` comments, by suffix or by name; a file starting with ``#!`` is read too.
HASH_COMMENTED = (".sh", ".yaml", ".yml", ".toml", ".j2")
HASH_COMMENTED_NAMES = ("Containerfile", "Dockerfile")


def python_comments(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of a Python source's comments and docstrings.

    A comment is a ``#`` token (tokenize). A docstring is a string statement of its own: a module's,
    a class's or a function's first statement, or an attribute's docstring after an assignment.
    Every other string literal is data and not read. A docstring's line is the one it starts on.
    """
    import io
    import tokenize

    out: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            out.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.append((node.lineno, node.value.value))
    return sorted(out)


def hash_comments(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of the ``#`` comments of a shell script, a YAML file or a template, and its
    Jinja ``{# ... #}`` comments.

    A ``#`` starts a comment at the start of a line or after white space, outside quotes (shell's and
    YAML's rule); a ``#!`` first line is no comment. ``{#`` and ``$#`` are no comment either.
    """
    out: list[tuple[int, str]] = []
    for match in re.finditer(r"\{#.*?#\}", source, flags=re.S):
        out.append((source.count("\n", 0, match.start()) + 1, match.group()[2:-2]))
    plain = re.sub(r"\{#.*?#\}", lambda m: re.sub(r"[^\n]", " ", m.group()), source, flags=re.S)
    for number, line in enumerate(plain.splitlines(), 1):
        if number == 1 and line.startswith("#!"):
            continue
        quote = ""
        for i, char in enumerate(line):
            if quote:
                if char == quote and (quote == "'" or line[i - 1] != "\\"):
                    quote = ""
            elif char in "'\"" and (i == 0 or line[i - 1] != "\\"):
                quote = char
            elif char == "#" and (i == 0 or line[i - 1] in " \t"):
                out.append((number, line[i:]))
                break
    return out


def comments(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, text)`` of a file's comments and docstrings; empty for a file of another kind.

    ``source`` is the file's text when the caller has read it already.
    """
    if source is None:
        try:
            source = path.read_text()
        except (UnicodeDecodeError, OSError):
            return []
    if path.suffix == ".py":
        try:
            return python_comments(source)
        except (SyntaxError, ValueError):  # a file that is not Python (a test's input): no comments to read
            return []
    if path.suffix in HASH_COMMENTED or path.name in HASH_COMMENTED_NAMES or source.startswith("#!"):
        return hash_comments(source)
    return []


def commented_files(repo: Path = REPO) -> list[Path]:
    """The files under :data:`COMMENTED`, less :data:`NOT_OURS`: git's tracked files, or, outside a
    git checkout, every file there."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z", "--", *COMMENTED], cwd=repo, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip("\0"):
        paths = [repo / name for name in listed.stdout.split("\0") if name]
    else:
        paths = [p for top in COMMENTED if (repo / top).is_dir() for p in (repo / top).rglob("*")]
    ours = [p for p in paths if p.is_file() and not any(p.relative_to(repo).as_posix().startswith(d + "/") for d in NOT_OURS)]
    return sorted(p for p in ours if "__pycache__" not in p.parts)


def comment_findings(repo: Path = REPO) -> list[Finding]:
    """The history references (:func:`history_matches`) of the comments and docstrings under
    :data:`COMMENTED`, each at ``path:line``."""
    out: list[Finding] = []
    for path in commented_files(repo):
        if path.suffix not in (".py", *HASH_COMMENTED) and path.name not in HASH_COMMENTED_NAMES:
            with path.open("rb") as file:
                if file.read(2) != b"#!":
                    continue  # a data file: no comments to read
        try:
            source = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if not any(rule.search(source) for rule in (COMMIT, SESSION, FINDING, ISSUE, FOREIGN)):
            continue  # nothing in the file can match: no need to parse it
        relative = path.relative_to(repo).as_posix()
        for line, text in comments(path, source):
            for rule, match in history_matches(text):
                out.append(Finding(f"{relative}:{line + text.count(chr(10), 0, match.start())}", rule, match.group()))
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
    """Measure the user pages, the docstrings and the comments, print a table, return the exit status."""
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
    in_comments = comment_findings(repo)
    print(f"comments and docstrings of {', '.join(d + '/' for d in COMMENTED)}: {len(in_comments)} findings", file=out)
    for finding in in_comments:
        print(f"    {finding}", file=out)
    return 1 if failed or docstrings or in_comments else 0


if __name__ == "__main__":
    sys.exit(run())
