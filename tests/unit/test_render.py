"""Quoting filters: every adversarial value survives a real bash round trip; newlines are rejected."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from jobgen.errors import ConfigError
from jobgen.planning.render import ShellText, render_template, sh_argv, sh_quote, to_json, yaml_block
from tests.conftest import ADVERSARIAL


def bash_argv(words: str, tmp_path: Path) -> list[str]:
    """Run `printf '%s\\0' <words>` in bash (in tmp_path) and return the arguments bash saw."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {words}"], cwd=tmp_path, capture_output=True, timeout=10, check=True)
    return out.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_sh_quote_round_trips_through_bash(value, tmp_path):
    assert bash_argv(sh_quote(value), tmp_path) == [value]
    assert not (tmp_path / "PWNED").exists()


def test_sh_argv_keeps_word_boundaries(tmp_path):
    assert bash_argv(sh_argv(ADVERSARIAL), tmp_path) == ADVERSARIAL
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b", "#SBATCH x\n#SBATCH --uid=0"])
def test_newlines_and_nul_rejected(value):
    with pytest.raises(ConfigError, match="newline or NUL"):
        sh_quote(value)


def test_shelltext_is_not_quoted():
    assert sh_quote(ShellText('"${X}"/a')) == '"${X}"/a'
    assert sh_quote('"${X}"/a') == "'\"${X}\"/a'"


@pytest.mark.parametrize("value", ["0123", "on", "yes", "null", "1e3", "a: b", "- x", "#c", *ADVERSARIAL])
def test_tojson_scalars_stay_strings_in_yaml(value):
    assert yaml.safe_load(f"k: {to_json(value)}") == {"k": value}


#: Every character a YAML reader refuses raw or folds (NEL became a space, DEL made the
#: manifest "not valid YAML"), and the C0 controls.
YAML_HOSTILE = "".join(map(chr, [*range(1, 32), *range(0x7F, 0xA0), 0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF]))


@pytest.mark.parametrize("char", YAML_HOSTILE, ids=lambda c: f"U+{ord(c):04X}")
def test_tojson_carries_every_control_and_line_break_character_through_yaml(char):
    value = f"a{char}b"
    assert yaml.safe_load(f"k: {to_json(value)}") == {"k": value}
    assert yaml.safe_load(f"k: {yaml_block(value + chr(10), 2)}\n") == {"k": value + chr(10)}


@pytest.mark.parametrize("text", ['{\n  "a": 1\n}\n', "plain\n", "trailing \n", "no newline", "\ttab\n", " lead\n", "x\n\n"])
def test_yaml_block_round_trips(text):
    assert yaml.safe_load("k: " + yaml_block(text, 2) + "\n") == {"k": text}


def test_strict_undefined(tmp_path):
    (tmp_path / "t.j2").write_text("{{ misspelt }}\n")
    with pytest.raises(ConfigError, match="undefined variable"):
        render_template(tmp_path, "t.j2")


def test_missing_template(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        render_template(tmp_path, "nope.j2")


def test_a_template_included_twice_is_parsed_once_for_the_hash(tmp_path):
    """Hashing two templates that both include a third parses the third once (the Kubernetes
    backend hashes pytorchjob and trainjob, which both include _pod); an edit is parsed again."""
    from jobgen.planning.render import _referenced_templates, template_sha256

    (tmp_path / "_shared.j2").write_text("shared\n")
    (tmp_path / "a.j2").write_text('a {% include "_shared.j2" %}\n')
    (tmp_path / "b.j2").write_text('b {% include "_shared.j2" %}\n')
    _referenced_templates.cache_clear()
    first = template_sha256(str(tmp_path), "a.j2"), template_sha256(str(tmp_path), "b.j2")
    assert _referenced_templates.cache_info().misses == 3
    assert first[0] != first[1]
    (tmp_path / "_shared.j2").write_text('edited {% include "_leaf.j2" %}\n')
    (tmp_path / "_leaf.j2").write_text("leaf\n")
    template_sha256.cache_clear()
    assert template_sha256(str(tmp_path), "a.j2") != first[0]
    assert _referenced_templates.cache_info().misses == 5  # the edited _shared.j2, and _leaf.j2 once
