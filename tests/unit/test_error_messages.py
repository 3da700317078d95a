"""Error messages that must not mislead or leak (issue 23, "Errors that mislead or leak")."""

from __future__ import annotations

import pytest
import yaml

from jobgen.errors import ConfigError, SubmitError, redact_urls
from tests.conftest import EXAMPLES, write

# --------------------------------------------------------------------------- credentials in URLs


@pytest.mark.parametrize(("text", "secrets", "kept"), [
    ("got 'https://hooks.example.com/x?token=abc123&user=me'", ["abc123", "=me"], ["https://hooks.example.com/x?token=", "&user="]),
    ("cannot clone https://oauth2:glpat-XYZ@gitlab.example.com/org/repo.git", ["glpat-XYZ", "oauth2"],
     ["gitlab.example.com/org/repo.git"]),
    ("two: http://u@h1/a?k=v1 and https://h2:8443/b?sig=v2#frag)", ["v1", "v2", "u@"], ["h1/a?k=", "https://h2:8443/b?sig=", ")"]),
    ("(got 'https://hooks.example.com/x?api_key=0123456789abcdef0123456789abcdef0123456", ["0123456789"], ["?api_key="]),
])
def test_redact_urls_hides_userinfo_and_query_values(text, secrets, kept):
    shown = redact_urls(text)
    for secret in secrets:
        assert secret not in shown, shown
    for part in kept:
        assert part in shown, shown


def test_text_without_url_credentials_is_unchanged():
    for text in ("no url here", "https://example.com/path/only", "git@github.com:org/repo.git", "a=b?c=d"):
        assert redact_urls(text) == text


def test_every_jobgen_error_redacts_what_it_shows():
    exc = SubmitError("POST https://h/x?token=s3cret failed", hint="retry https://u:pw@h/y", location="https://h/z?key=k3y: url")
    shown = str(exc)
    assert "s3cret" not in shown and ":pw@" not in shown and "k3y" not in shown, shown
    assert "https://h/x?token=" in shown and "h/y" in shown
    assert "s3cret" not in exc.message and "pw@" not in (exc.hint or "") and "k3y" not in (exc.location or "")
    assert isinstance(ConfigError("x"), Exception)


def test_the_notify_url_error_does_not_print_the_token(run_cli, tmp_path):
    doc = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    doc["notify"] = {"webhook": {"url": "https://hooks.example.com/x?token=abc123secret&user=me"}}
    spec = write(tmp_path / "spec.yaml", yaml.safe_dump(doc))
    result = run_cli("validate", str(spec))
    assert result.code == 2, result.stderr
    assert "notify.webhook.url" in result.stderr and "token" in result.stderr
    assert "abc123secret" not in result.stderr + result.stdout
