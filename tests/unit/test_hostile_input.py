"""Hostile input, second round (issue 29): every value a user controls on the ssh, tracker, sweep,
notify and Kubernetes surfaces is either refused at load, exit 2, with the file and the field
named, or arrives intact byte for byte where it is used. Never a traceback, never a half-written
job directory. In-process through click's CliRunner (as tests/unit/test_cli_output.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobgen.cli import cli
from tests.conftest import EXAMPLES, write

QUICKSTART = str(EXAMPLES / "quickstart.yaml")


def invoke(*args: str):
    """``jobgen ARGS`` in this process; the result has ``exit_code``, ``stdout``, ``stderr``."""
    return CliRunner().invoke(cli, list(args), prog_name="jobgen")


def refused(result, *words: str) -> str:
    """The error text of a refusal: exit 2 (never a traceback) naming each of ``words``."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    text = result.stderr + result.stdout
    assert "Traceback" not in text
    for word in words:
        assert word in text, (word, text)
    return text


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))


# --------------------------------------------------------------------------- finding 3: names in bytes

@pytest.mark.parametrize("name", ["日" * 100, "é" * 128], ids=["cjk-100", "e-acute-128"])
def test_a_job_name_too_long_in_bytes_is_refused_naming_the_field(tmp_path, name):
    """At most 128 characters but over 255 bytes: the job directory could not be made
    (``OSError: File name too long``, a traceback). Refused at load, naming the field."""
    refused(invoke("render", QUICKSTART, "-p", "slurm-a100", "--set", f"name={name}"), "name", "bytes")
    spec = write(tmp_path / "s.yaml", Path(QUICKSTART).read_text() + f"\nname: {name}\n")
    refused(invoke("render", str(spec), "-p", "slurm-a100"), "name", "bytes", str(spec))
    assert not (tmp_path / "manifests").exists() or not any((tmp_path / "manifests").rglob("*.json"))


def test_a_long_name_that_fits_in_bytes_renders(tmp_path):
    name = "日" * 60  # 180 bytes: its directory, and <name>-smoke, fit a file system's 255
    result = invoke("render", QUICKSTART, "-p", "slurm-a100", "--set", f"name={name}")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "manifests" / "slurm-a100" / name / "spec.json").read_text())["spec"]["name"] == name


# --------------------------------------------------------------------------- finding 4: --sweep values

@pytest.mark.parametrize("value", ["a'b", 'a"b', "it's", "$(touch PWNED)", "日本"])
def test_a_sweep_value_with_a_quote_inside_a_word_is_its_own_point(tmp_path, value):
    """``--sweep "env.JG_PAYLOAD=a'b,plain"`` rendered ONE job with ``a'b,plain``: two, each intact."""
    result = invoke("render", QUICKSTART, "-p", "slurm-a100", "--sweep", f"env.JG_PAYLOAD={value},plain")
    assert result.exit_code == 0, result.stderr
    payloads = sorted(json.loads(p.read_text())["spec"]["env"]["JG_PAYLOAD"]
                      for p in (tmp_path / "manifests" / "slurm-a100").glob("*/spec.json"))
    assert payloads == sorted([value, "plain"])
    assert not list(tmp_path.rglob("PWNED"))


def test_a_sweep_value_the_grammar_cannot_split_is_refused_before_anything_is_written(tmp_path):
    refused(invoke("render", QUICKSTART, "-p", "slurm-a100", "--sweep", "env.JG_PAYLOAD='a,plain"), "--sweep", "unterminated quote")
    assert not (tmp_path / "manifests").exists()


# --------------------------------------------------------------------------- finding 5: one credential check for every URL

#: A credential in a URL, as users write them (SECRET is the credential): every URL a spec or
#: profile holds is refused with any of these, naming the field and never echoing SECRET.
CREDENTIAL_URLS = [
    "https://h.example.com/x?token=SECRET", "https://h.example.com/?x=1&accessToken=SECRET",
    "https://h.example.com/?authToken=SECRET", "https://h.example.com/?clientSecret=SECRET",
    "https://h.example.com/?%74oken=SECRET", "https://h.example.com/?code=SECRET", "https://h.example.com/?api_key=SECRET",
    "https://h.example.com/?apiKey=SECRET", "https://h.example.com/?a=1&X-Amz-Signature=SECRET",
    "https://h.example.com/?access_token=SECRET", "https://h.example.com/?sig=SECRET", "https://h.example.com/?password=SECRET",
    "https://h.example.com/?session=SECRET", "https://h.example.com/?Authorization=SECRET",
    "https://h.example.com/x#access_token=SECRET", "https://alice:SECRET@h.example.com/x", "https://SECRET@h.example.com/x",
]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def spec_with(tmp_path: Path, extra: dict) -> Path:
    doc = {**json.loads(json.dumps(__import__("yaml").safe_load(Path(QUICKSTART).read_text()))), **extra}
    return write(tmp_path / "s.yaml", json.dumps(doc))


@pytest.mark.parametrize("url", CREDENTIAL_URLS)
@pytest.mark.parametrize("surface", ["notify", "mlflow", "git", "profile-mlflow"])
def test_a_credential_in_any_url_is_refused_naming_the_field(tmp_path, surface, url):
    profile = "slurm-a100"
    if surface == "notify":
        spec, field = spec_with(tmp_path, {"notify": {"webhook": {"url": url}}}), "notify.webhook.url"
    elif surface == "mlflow":
        spec = spec_with(tmp_path, {"trainer": {"loggers": ["mlflow"], "mlflow": {"tracking_uri": url}}})
        field = "trainer.mlflow.tracking_uri"
    elif surface == "git":
        spec, field = spec_with(tmp_path, {"code": {"git": {"url": url, "ref": COMMIT}}}), "code.git.url"
    else:
        spec = spec_with(tmp_path, {})
        write(tmp_path / "profiles" / "site.yaml", "extends: slurm-a100\ntracking: " + json.dumps({"mlflow": {"tracking_uri": url}}) + "\n")
        profile, field = str(tmp_path / "profiles" / "site.yaml"), "tracking.mlflow.tracking_uri"
    text = refused(invoke("render", str(spec), "-p", profile), field, "credential" if "SECRET@" not in url else "@")
    assert "SECRET" not in text
    assert not (tmp_path / "manifests").exists()


@pytest.mark.parametrize(("surface", "url"), [
    ("mlflow", "postgresql://alice@db.example.com/mlflow"), ("mlflow", "https://mlflow.example.com/?x=1&monkey=2"),
    ("git", "ssh://git@github.com/org/repo.git"), ("git", "https://github.com/org/repo.git"),
    ("notify", "https://h.example.com/hook?channel=ml&keyboard=1"),
])
def test_urls_without_a_credential_arrive_intact(tmp_path, surface, url):
    extra = {"notify": {"webhook": {"url": url}}} if surface == "notify" else (
        {"trainer": {"loggers": ["mlflow"], "mlflow": {"tracking_uri": url}}} if surface == "mlflow" else
        {"code": {"git": {"url": url, "ref": COMMIT}}})
    result = invoke("render", str(spec_with(tmp_path, extra)), "-p", "k8s-a100" if surface == "git" else "slurm-a100")
    assert result.exit_code == 0, result.stderr + result.stdout
    assert any(url in p.read_text() for p in (tmp_path / "manifests").rglob("*.json"))
