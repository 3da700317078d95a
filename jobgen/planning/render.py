"""The one Jinja Environment and its quoting filters.

Templates hold the skeleton; Python makes every decision and passes typed values. Every
interpolated string goes through a filter:

- ``sh``: one shell word (``shlex.quote``); newlines, carriage returns and NUL are rejected
  (a newline inside quotes still starts a new ``#SBATCH`` line). A :class:`ShellText` passes
  through unquoted — only jobgen's own code builds those (e.g. ``"$JOB_DIR/spec.json"``).
- ``sh_argv``: a list of words, each quoted, joined by spaces.
- ``tojson``: a YAML/JSON scalar (JSON is valid YAML: "0123" stays a string, "on" stays a string).
- ``yaml_block(indent)``: multi-line text as a literal block (falls back to ``tojson``).

The Environment uses ``StrictUndefined`` so a misspelt variable is an error, never "".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import pydantic_core

from jobgen.errors import ConfigError
from jobgen.planning.cache import cached_json, content_key, template_bytecode_cache

_UNSAFE = re.compile(r"[\n\r\x00]")


class ShellText(str):
    """Trusted shell text that the ``sh`` filter leaves unquoted (e.g. ``"${JOB_DIR}/spec.json"``).

    Only jobgen's code constructs these from constants; user values never become ShellText.
    """


def sh_quote(value: Any) -> str:
    """Quote ``value`` as one shell word.

    Raises:
        ConfigError: the value holds a newline, carriage return or NUL byte.
    """
    if isinstance(value, ShellText):
        return str(value)
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"internal: refusing to shell-quote {value!r}")
    text = str(value)
    if _UNSAFE.search(text):
        raise ConfigError(
            f"value {text!r} contains a newline or NUL byte, which cannot be passed safely to bash/sbatch",
            hint="remove the line break from the value",
        )
    return shlex.quote(text)


def sh_argv(values: Iterable[Any]) -> str:
    """Quote each element of ``values`` (see :func:`sh_quote`) and join with spaces."""
    return " ".join(sh_quote(v) for v in values)


def sbatch_quote(value: Any) -> str:
    """Quote a value for an ``#SBATCH --option=<value>`` line.

    sbatch reads these lines itself, not bash: it honours single and double quotes like the
    shell, but treats a backslash as an escape even inside single quotes (measured on SLURM
    22.05: ``--job-name='back\\slash'`` arrives as ``backslash``). So backslashes are doubled,
    then the value is shell-quoted (:func:`sh_quote`, which also rejects newlines: a newline
    would start a new directive).
    """
    return sh_quote(str(value).replace("\\", "\\\\"))


#: Characters a YAML reader does not take as they are inside a double-quoted scalar: DEL and the C1
#: controls (not printable in YAML 1.1/1.2: "not valid YAML"), NEL, U+2028, U+2029 (line breaks:
#: folded into a space), the BOM, surrogates and U+FFFE/U+FFFF. JSON's ``\uXXXX`` escapes are
#: YAML's too, so :func:`to_json` writes them escaped (json.dumps escapes the C0 controls itself).
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff\ufffe\uffff]")


def to_json(value: Any) -> str:
    """A JSON scalar or flow collection: safe as a YAML value in any position; every string
    arrives byte for byte (characters YAML would refuse or fold are ``\\uXXXX`` escapes)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def yaml_block(value: str, indent: int) -> str:
    """``value`` as a YAML literal block scalar (``|``) indented by ``indent`` spaces.

    Readable in diffs for multi-line text such as JSON files in a ConfigMap. Text a literal
    block cannot carry exactly (non-printable characters, tabs, trailing spaces, no final
    newline) falls back to a :func:`to_json` scalar; callers parse the document back.
    """
    lines = value.split("\n")
    plain = value.endswith("\n") and not value.endswith("\n\n") and value.strip() != ""
    # A leading space on the first line would be read as the block's indentation.
    if not plain or lines[0].startswith(" ") or any(not ln.isprintable() or ln != ln.rstrip() for ln in lines):
        return to_json(value)
    pad = " " * indent
    return "|\n" + "\n".join(pad + ln if ln else ln for ln in lines[:-1])


@functools.lru_cache(maxsize=8)
def environment(templates_dir: str) -> jinja2.Environment:
    """The Jinja Environment for templates under ``templates_dir`` (cached per directory)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        auto_reload=False,  # templates do not change during one process; skips a stat per render
        bytecode_cache=template_bytecode_cache(),  # compiled templates, checked against their source
    )
    env.filters["sh"] = sh_quote
    env.filters["sh_argv"] = sh_argv
    env.filters["sbatch"] = sbatch_quote
    env.filters["tojson"] = to_json
    env.filters["yaml_block"] = yaml_block
    return env


@contextlib.contextmanager
def _template_errors(templates_dir: Path | str, name: str) -> Iterator[None]:
    """Turn Jinja's missing-template and syntax errors for ``name`` into ConfigError."""
    try:
        yield
    except jinja2.TemplateNotFound:
        raise ConfigError(
            f"template {name!r} not found in {templates_dir}",
            hint="copy it from jobgen's templates/ or drop --templates-dir / JOBGEN_HOME",
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"template syntax error: {exc.message}", location=f"{exc.filename or name}:{exc.lineno}") from None


def render_template(templates_dir: Path, template: str, **context: Any) -> str:
    """Render ``template`` (e.g. ``slurm/job.sbatch.j2``) from ``templates_dir``.

    Raises:
        ConfigError: the template is missing, has a syntax error, or uses an undefined variable.
    """
    try:
        with _template_errors(templates_dir, template):
            return environment(str(templates_dir)).get_template(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise ConfigError(f"template {template!r} uses an undefined variable: {exc.message}", location=str(templates_dir / template)) from None


@functools.lru_cache(maxsize=64)
def _referenced_templates(templates_dir: str, source: str) -> tuple[str | None, ...]:
    """Names ``source`` includes, imports or extends (None for one Jinja cannot resolve statically).

    Cached by the source text, so a template several others include (``kubernetes/_pod.yaml.j2``)
    is parsed once per process, and across processes in :mod:`jobgen.planning.cache` (keyed by the
    source and the Jinja version): an edited template is parsed again.

    Raises:
        jinja2.TemplateSyntaxError: ``source`` does not parse.
    """
    def parse() -> list[str | None]:
        return list(jinja2.meta.find_referenced_templates(environment(templates_dir).parse(source)))

    return tuple(cached_json("template-refs", content_key(jinja2.__version__, source), parse))


@functools.lru_cache(maxsize=32)
def template_sha256(templates_dir: str, template: str) -> str:
    """sha256 (hex) of ``template`` and every template it includes, imports or extends.

    The sources are hashed with LF line endings (a CRLF checkout hashes like an LF one), as
    sorted ``(name, source)`` pairs. A reference Jinja cannot resolve statically
    (``{% include some_variable %}``) makes the hash cover every file of ``templates_dir``.
    Cached per process, like the Environment (templates do not change during one render).

    Raises:
        ConfigError: the template (or one it references) is missing or has a syntax error.
    """
    env = environment(templates_dir)
    sources: dict[str, str] = {}
    pending = [template]
    while pending:
        name = pending.pop()
        if name in sources:
            continue
        with _template_errors(templates_dir, name):
            source, _, _ = env.loader.get_source(env, name)  # type: ignore[union-attr]
            refs = _referenced_templates(templates_dir, source)
        sources[name] = source.replace("\r\n", "\n")
        if None in refs:  # dynamic reference: cover the whole directory
            pending.extend(env.list_templates())
        pending.extend(r for r in refs if r is not None)
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(pydantic_core.to_json([name, sources[name]]) + b"\n")
    return digest.hexdigest()
