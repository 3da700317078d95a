"""Hostile input, second round: every value a user controls on the ssh, tracker, sweep,
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


# --------------------------------------------------------------------------- names in bytes

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


# --------------------------------------------------------------------------- --sweep values

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


# --------------------------------------------------------------------------- one credential check for every URL

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
    """quickstart.yaml with ``extra``'s top-level sections instead of its own (a section ``None``: left out)."""
    import yaml

    doc = {k: v for k, v in {**yaml.safe_load(Path(QUICKSTART).read_text()), **extra}.items() if v is not None}
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


# --------------------------------------------------------------------------- control characters in manifests

#: Characters YAML reads as a line break (NEL, U+2028, U+2029: a double-quoted scalar folds them
#: into a space) or may not hold unescaped (DEL, the C1 controls, ESC, BOM).
CONTROL_VALUES = ["nel\x85x", "del\x7fx", "ls\u2028x", "ps\u2029x", "esc\x1b[31mx", "csi\x9bx", "bom\ufeffx", "tab\tx"]


def strings_in(value: object) -> list[str]:
    """Every string in a parsed document; a string that is itself JSON (spec.json in a ConfigMap) is searched too."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings_in(k), *strings_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    if isinstance(value, str):
        try:
            inner = json.loads(value)
        except ValueError:
            return [value]
        return [value, *strings_in(inner)] if isinstance(inner, (dict, list)) else [value]
    return []


def manifest_strings(root: Path) -> list[str]:
    import yaml

    found: list[str] = []
    for path in root.rglob("*"):
        if path.suffix in (".yaml", ".yml"):
            found += [s for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) for s in strings_in(doc)]
        elif path.suffix == ".json":
            found += strings_in(json.loads(path.read_text(encoding="utf-8")))
    return found


def k8s_surfaces(value: str) -> dict[str, tuple[dict, dict]]:
    """field -> (spec fields, profile fields) that put ``value`` into a Kubernetes job."""
    return {
        "env": ({"env": {"JG_X": value}}, {}),
        "trainer.wandb.project": ({"trainer": {"loggers": ["wandb"], "wandb": {"project": value, "mode": "offline"}}}, {}),
        "trainer.wandb.tags": ({"trainer": {"loggers": ["wandb"], "wandb": {"tags": [value], "mode": "offline"}}}, {}),
        "trainer.mlflow.experiment": ({"trainer": {"loggers": ["mlflow"], "mlflow": {"experiment": value}}}, {}),
        "notify.command": ({"notify": {"command": ["/bin/notify", value]}}, {}),
        "model.init_args": ({"model": {"class_path": "my_pkg.models.M", "init_args": {"label": value}},
                             "data": {"class_path": "my_pkg.data.D"}, "trainer": {"max_steps": 10}}, {}),
        "trainer.mlflow.tracking_uri": ({"trainer": {"loggers": ["mlflow"], "mlflow": {"tracking_uri": f"https://m.example.com/{value}"}}}, {}),
        "entrypoint.args": ({"entrypoint": {"module": "my_pkg.train", "args": ["--label", value]}, "model": None, "data": None,
                             "trainer": None, "checkpoint": None}, {}),
        "profile env": ({}, {"env": {"JG_Y": value}}),
        "kubernetes.image": ({}, {"kubernetes": {"image": f"registry.example.com/img:{value}"}}),
        "kubernetes.node_selector": ({}, {"kubernetes": {"node_selector": {"pool": value}}}),
    }


@pytest.mark.parametrize("value", CONTROL_VALUES, ids=lambda v: v[:3])
@pytest.mark.parametrize("surface", list(k8s_surfaces("x")))
def test_control_characters_reach_a_manifest_intact_or_are_refused_naming_the_field(tmp_path, surface, value):
    """U+0085 became a space in the manifest (PyYAML folds it), DEL made "pytorchjob.yaml is not
    valid YAML ... check templates/kubernetes/": either verdict of the hostile-input rule now,
    refused at load naming the field, or the value byte for byte in what Kubernetes reads."""
    spec_fields, profile_fields = k8s_surfaces(value)[surface]
    spec = spec_with(tmp_path, spec_fields)
    profile = write(tmp_path / "profiles" / "site.yaml", "extends: k8s-a100\n" + "".join(
        f"{k}: {json.dumps(v)}\n" for k, v in profile_fields.items()))
    result = invoke("render", str(spec), "-p", str(profile))
    check_verdict(tmp_path, result, value, surface.split()[-1].split(".")[-1], str(spec if spec_fields else profile))


def check_verdict(tmp_path: Path, result, value: str, *words: str) -> None:
    """The hostile-input rule: refused with exit 2 naming ``words`` (field, file) and nothing
    written, or rendered with ``value`` byte for byte in what the cluster reads."""
    if result.exit_code == 2:
        refused(result, *words)
        assert not (tmp_path / "manifests").exists()
    else:
        assert result.exit_code == 0, result.stderr + result.stdout
        assert any(value in s for s in manifest_strings(tmp_path / "manifests")), f"{value!r} not intact"


@pytest.mark.parametrize("value", CONTROL_VALUES, ids=lambda v: v[:3])
@pytest.mark.parametrize("key", ["env.JG_X", "name"])
def test_control_characters_given_by_set_arrive_intact_or_are_refused(tmp_path, key, value):
    """``--set`` values are YAML: U+0085 in one became a space before any check ran."""
    result = invoke("render", QUICKSTART, "-p", "k8s-a100", "--set", f"{key}={value}")
    check_verdict(tmp_path, result, value, key.split(".")[-1])


# --------------------------------------------------------------------------- notify URLs the sender cannot send

@pytest.mark.parametrize("url", [
    "https://h.example.com/a b", "https://h.example.com/a\tb", "https://h.example.com/a\x7fb", "https://h.example.com/é",
    "https://h.example.com/x?q=日本", "https://h.example.com/x?q=a b", "https://h.example.com/x#a b", "https://h.example.com/a\x85b",
    "https://h.example.com/a\u2028b", "https://h.example.com/a\x1bb", "https://h.exa mple.com/x",
])
def test_a_webhook_url_that_cannot_be_sent_is_refused_at_load(tmp_path, url):
    """urllib refuses these when the run sends its first notification (InvalidURL,
    UnicodeEncodeError) and nothing is delivered: refused at load instead, with the encoded form."""
    result = invoke("render", str(spec_with(tmp_path, {"notify": {"webhook": {"url": url}}})), "-p", "slurm-a100")
    refused(result, "notify.webhook.url", "percent-encode")
    assert not (tmp_path / "manifests").exists()


@pytest.mark.parametrize("url", ["https://h.example.com/a%20b?q=%E6%97%A5", "https://bücher.example/hook", "http://127.0.0.1:8080/x?a=1&b=2"])
def test_webhook_urls_the_sender_takes_arrive_intact(tmp_path, url):
    import urllib.request

    urllib.request.Request(url).get_full_url()  # what the sender builds
    result = invoke("render", str(spec_with(tmp_path, {"notify": {"webhook": {"url": url}}})), "-p", "slurm-a100")
    assert result.exit_code == 0, result.stderr
    assert any(url in s for s in manifest_strings(tmp_path / "manifests"))


# --------------------------------------------------------------------------- the verdict rule on the ssh, tracker and notify surfaces

from tests.conftest import ADVERSARIAL  # noqa: E402

#: The project's adversarial values, GNU tar's escapes (``\057``, ``\t``, ``\\``), control characters and a long multi-byte value.
HOSTILE = [*ADVERSARIAL, "..\\057..\\057escaped", "tab\\tand\\\\", "nel\x85x", "del\x7fx", "日本語", "-oProxyCommand=touch PWNED",
           "a -oProxyCommand=x"]


def ssh_fields(value: str) -> dict[str, dict]:
    """ssh field -> the profile's ssh section with ``value`` there."""
    base = {"hosts": ["node-a", "node-b"], "workdir": "/srv/runs"}
    return {
        "hosts": {**base, "hosts": [value, "node-b"]},
        "user": {**base, "user": value},
        "workdir": {**base, "workdir": f"/srv/{value}"},
        "python": {**base, "python": f"/opt/{value}/python3"},
        "master_addr": {**base, "master_addr": value},
        "identity_file": {**base, "identity_file": f"~/.ssh/{value}"},
        "known_hosts": {**base, "known_hosts": f"/etc/{value}"},
        "options": {**base, "options": [f"ProxyJump={value}"]},
    }


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("field", list(ssh_fields("x")))
def test_hostile_ssh_settings_are_refused_naming_the_field_or_arrive_intact(tmp_path, field, value):
    profile = write(tmp_path / "profiles" / "site.yaml", "scheduler: ssh\nmax_nodes: 2\ndefault_nodes: 2\nssh: "
                    + json.dumps(ssh_fields(value)[field]) + "\n")
    result = invoke("render", QUICKSTART, "-p", str(profile))
    check_verdict(tmp_path, result, value, f"ssh.{field}", str(profile))
    assert not list(tmp_path.rglob("PWNED"))


def tracker_and_notify_fields(value: str) -> dict[str, dict]:
    return {
        "trainer.wandb.project": {"trainer": {"loggers": ["wandb"], "wandb": {"project": value}}},
        "trainer.wandb.entity": {"trainer": {"loggers": ["wandb"], "wandb": {"entity": value}}},
        "trainer.wandb.tags": {"trainer": {"loggers": ["wandb"], "wandb": {"tags": [value]}}},
        "trainer.mlflow.experiment": {"trainer": {"loggers": ["mlflow"], "mlflow": {"experiment": value}}},
        "trainer.mlflow.tracking_uri": {"trainer": {"loggers": ["mlflow"], "mlflow": {"tracking_uri": f"https://m.example.com/{value}"}}},
        "notify.command": {"notify": {"command": ["/usr/local/bin/notify", value]}},
        "notify.webhook.url": {"notify": {"webhook": {"url": f"https://h.example.com/{value}"}}},
    }


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("field", list(tracker_and_notify_fields("x")))
def test_hostile_tracker_and_notify_values_are_refused_naming_the_field_or_arrive_intact(tmp_path, field, value):
    spec = spec_with(tmp_path, tracker_and_notify_fields(value)[field])
    result = invoke("render", str(spec), "-p", "slurm-a100")
    check_verdict(tmp_path, result, value, field, str(spec))
    assert not list(tmp_path.rglob("PWNED"))
