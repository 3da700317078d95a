"""``notify:`` (spec) and ``preflight`` (profile, ``jobgen submit --preflight``): what is
refused at load, and what reaches spec.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen import api
from jobgen.errors import ConfigError
from jobgen.jobdir import SPEC_FILE, load_resolved_spec
from tests.conftest import EXAMPLES, write

QUICKSTART = str(EXAMPLES / "quickstart.yaml")


def _spec(tmp_path: Path, notify: dict, secrets: list[str] | None = None) -> Path:
    doc = {"name": "n", "notify": notify, **({"secrets": secrets} if secrets is not None else {})}
    return write(tmp_path / "n.yaml", json.dumps(doc))


@pytest.mark.parametrize("url", [
    "https://hooks.example.com/x?token=abc", "https://h.example/x?api_key=abc", "https://h.example/x?apiKey=abc",
    "https://h.example/x?a=1&X-Amz-Signature=abc", "https://h.example/x?access_token=abc", "https://user:pw@h.example/x",
])
def test_a_credential_in_the_url_is_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigError, match=r"notify\.webhook\.url: .*(look like a credential|user:password@)"):
        api.load(_spec(tmp_path, {"webhook": {"url": url}}), "local")


def test_plain_urls_and_harmless_parameters_load(tmp_path: Path) -> None:
    spec, _ = api.load(_spec(tmp_path, {"webhook": {"url": "https://h.example/hook?channel=ml&monkey=1"}}), "local")
    assert spec.notify is not None and spec.notify.events == ("started", "restart", "requeued", "finished", "failed")


@pytest.mark.parametrize("field", ["token_env", "url_env"])
def test_env_references_must_be_listed_in_secrets(tmp_path: Path, field: str) -> None:
    hook = {"url": "https://h.example/x"} if field == "token_env" else {}
    hook[field] = "HOOK_TOKEN"
    with pytest.raises(ConfigError, match=rf"notify\.webhook\.{field} names HOOK_TOKEN, which is not in secrets"):
        api.load(_spec(tmp_path, {"webhook": hook}), "local")
    spec, _ = api.load(_spec(tmp_path, {"webhook": hook}, ["HOOK_TOKEN"]), "local")
    assert getattr(spec.notify.webhook, field) == "HOOK_TOKEN"


def test_notify_needs_a_target_and_a_valid_env_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a webhook"):
        api.load(_spec(tmp_path, {"events": ["failed"]}), "local")
    with pytest.raises(ConfigError, match="not an environment variable name"):
        api.load(_spec(tmp_path, {"webhook": {"url": "https://h.example/x", "token_env": "abc def"}}), "local")


def test_preflight_reaches_spec_json_only_when_asked(tmp_path: Path) -> None:
    plain = api.plan_job(QUICKSTART, "slurm-cpu")
    with_preflight = api.plan_job(QUICKSTART, "slurm-cpu", preflight=True)
    assert '"preflight"' not in plain.file(SPEC_FILE)  # unchanged spec.json (and inputs hash) without it
    api.render(with_preflight, tmp_path)
    resolved = load_resolved_spec(tmp_path / "slurm-cpu" / "quickstart" / SPEC_FILE)
    assert resolved.launch.preflight is True and resolved.launch.preflight_timeout_s == 60
    assert with_preflight.inputs_sha256 != plain.inputs_sha256


def test_submit_preflight_is_refused_for_a_rendered_directory(run_cli, tmp_path: Path) -> None:
    out = run_cli("render", QUICKSTART, "--profile", "slurm-cpu", "--out", str(tmp_path))
    assert out.code == 0, out.stderr
    result = run_cli("submit", str(tmp_path / "slurm-cpu" / "quickstart"), "--preflight")
    assert result.code == 2 and "--preflight, --smoke and --sweep apply to spec files" in result.stderr and "hint:" in result.stderr
