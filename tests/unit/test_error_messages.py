"""Error messages that must not mislead or leak."""

from __future__ import annotations

import json

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


# --------------------------------------------------------------------------- the user's file, not ours


def test_plan_of_a_class_path_spec_names_the_spec_file_and_field(run_cli):
    result = run_cli("plan", "examples/usercode.yaml", "--profile", "local")
    assert result.code == 2, result.stderr
    assert "error: examples/usercode.yaml: model.class_path: " in result.stderr, result.stderr


# --------------------------------------------------------------------------- "Nothing was submitted" writes nothing


def test_a_refused_local_submit_writes_no_run_directory(run_cli, tmp_path):
    spec = write(tmp_path / "spec.yaml", "name: sec\nsecrets: [JG_H6_UNSET_SECRET]\n")
    result = run_cli("submit", str(spec), "--profile", "local", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 2 and "Nothing was submitted" in result.stderr, result.stderr
    assert f"{spec}: secrets" in result.stderr
    assert not (tmp_path / "runs").exists(), sorted(str(p) for p in (tmp_path / "runs").rglob("*"))


def test_a_refused_submit_into_an_existing_directory_puts_its_files_back(tmp_path):
    from jobgen.jobdir import SUBMISSION_FILE, DirUndo

    job_dir = tmp_path / "manifests" / "p" / "job"
    old_spec = '{"jobgen_version": "0", "old": true}\n'
    write(job_dir / "spec.json", old_spec)
    write(job_dir / "notes.txt", "mine\n")
    before = DirUndo.capture(job_dir)
    write(job_dir / "spec.json", '{"jobgen_version": "1", "new": true}\n')
    write(job_dir / "ds_config.json", '{"jobgen_version": "1"}\n')
    before.undo_unless_submitted()
    assert sorted(p.name for p in job_dir.iterdir()) == ["notes.txt", "spec.json"]
    assert (job_dir / "spec.json").read_text() == old_spec

    fresh = tmp_path / "runs" / "new-job"
    created = DirUndo.capture(fresh)
    write(fresh / "spec.json", '{"jobgen_version": "1"}\n')
    created.undo_unless_submitted()
    assert not (tmp_path / "runs").exists()  # the parents it created go too, while empty

    kept = DirUndo.capture(fresh)
    write(fresh / "spec.json", '{"jobgen_version": "1"}\n')
    write(fresh / SUBMISSION_FILE, "{}\n")  # the run started: its directory stays
    kept.undo_unless_submitted()
    assert (fresh / "spec.json").is_file()


# --------------------------------------------------------------------------- command-mode validate


def test_command_mode_validate_reports_no_global_batch_the_script_never_reads(run_cli):
    text = run_cli("validate", "examples/command-ddp.yaml", "--profile", "local")
    assert text.code == 0, text.stderr
    assert "world size 2" in text.stdout and "global batch" not in text.stdout, text.stdout
    assert "your script" in text.stdout
    doc = json.loads(run_cli("validate", "examples/command-ddp.yaml", "--profile", "local", "-o", "json").stdout)
    assert doc["world_size"] == 2 and doc["global_batch_size"] is None
    builtin = json.loads(run_cli("validate", "examples/quickstart.yaml", "--profile", "local", "-o", "json").stdout)
    assert builtin["global_batch_size"] == 16 * 1 * 2  # micro x accumulation x world size: the entrypoint uses it


# --------------------------------------------------------------------------- what a run says it left, and in which unit


def _local_run(tmp_path, monkeypatch, leaves: list[str]) -> list[str]:
    """Submit a local job whose (fake) run writes ``leaves`` (relative paths) into its run dir;
    returns what submit printed."""
    from jobgen import api
    from jobgen.backends import get_backend
    from jobgen.backends.base import SubmitOptions
    from jobgen.backends.local import LocalBackend

    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    spec = write(tmp_path / "spec.yaml", "name: smoky\n")
    job_plan = api.plan_job(spec, "local")
    options = SubmitOptions(runs_dir=tmp_path / "runs")
    backend = get_backend("local")
    job_dir = backend.job_dir(job_plan, tmp_path, options)
    job_plan.write(job_dir)

    def runner(argv, cwd, env):
        for leaf in leaves:
            write(job_dir / leaf, "{}\n")
        return 0

    said: list[str] = []
    LocalBackend(runner=runner).submit(job_dir, options, said.append, plan=job_plan)
    return said


def test_the_last_line_of_a_run_names_only_what_it_wrote(tmp_path, monkeypatch):
    smoke = _local_run(tmp_path / "a", monkeypatch, ["summary.json", "logs/metrics.csv"])[-1]
    assert "summary.json" in smoke and "logs/" in smoke and "checkpoints/" not in smoke, smoke
    full = _local_run(tmp_path / "b", monkeypatch, ["summary.json", "logs/metrics.csv", "checkpoints/step=1.ckpt"])[-1]
    assert "checkpoints/" in full, full


def _shown(line: str) -> tuple[int, float, float, str]:
    """``N CPUs x E h = T CPU-hours ...`` -> (N, E, T, unit)."""
    import re

    match = re.match(r"(\d+) ([A-Z]+)s x ([0-9.]+) h = ([0-9.]+) (\S+)", line)
    assert match, line
    return int(match[1]), float(match[3]), float(match[4]), match[5]


@pytest.mark.parametrize(("kind", "devices", "seconds"), [("cpu", 2, 21.6), ("gpu", 8, 5400.0), ("cpu", 1, 1.0),
                                                          ("gpu", 64, 3 * 3600 + 7.3), ("cpu", 1000, 123.4), ("gpu", 3, 0.4)])
def test_usage_line_arithmetic_holds_at_the_printed_precision(kind, devices, seconds):
    from jobgen.reports.usage import Usage

    usage = Usage(kind, devices, seconds, "test")
    n, elapsed_h, total, unit = _shown(usage.describe())
    assert n == devices and unit == f"{kind.upper()}-hours" == usage.unit
    assert abs(n * elapsed_h - total) < 0.001, usage.describe()  # the product, to the total's last digit
    assert abs(total - devices * seconds / 3600) <= 0.0005


def test_the_issue_s_status_line():
    from jobgen.reports.usage import Usage

    assert Usage("cpu", 2, 21.6, "src").describe() == "2 CPUs x 0.006 h = 0.012 CPU-hours (src)"


# --------------------------------------------------------------------------- kubeconfig: missing is not invalid


def _only_real_options(hint: str) -> None:
    """The hint names --kubeconfig only as the `jobgen submit` option it is (status, logs and
    cancel have none)."""
    assert hint.count("--kubeconfig") == hint.count("jobgen submit --kubeconfig"), hint


def test_a_missing_kubeconfig_is_reported_as_missing(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    result = run_cli("status", "k8s://ctx/training/job")
    assert result.code == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"kubeconfig {tmp_path / 'nope'} ($KUBECONFIG) does not exist" in result.stderr
    assert "Invalid" not in result.stderr and "invalid" not in result.stderr
    _only_real_options(result.stderr.partition("hint:")[2])


@pytest.mark.parametrize("text", ["just a string\n", "clusters: [\n", "apiVersion: v1\nkind: Config\ncontexts: 3\n"])
def test_an_invalid_kubeconfig_is_reported_as_invalid(tmp_path, text):
    from jobgen.backends.kubernetes.api import connect

    path = write(tmp_path / "kubeconfig", text)
    with pytest.raises(ConfigError) as info:
        connect(None, str(path))
    assert f"kubeconfig {path} is not a valid kubeconfig" in info.value.message, info.value.message
    _only_real_options(info.value.hint or "")


def test_a_missing_kubeconfig_given_to_submit_names_the_file(tmp_path):
    from jobgen.backends.kubernetes.api import connect

    with pytest.raises(ConfigError) as info:
        connect(None, str(tmp_path / "absent"))
    assert info.value.message.startswith(f"kubeconfig {tmp_path / 'absent'} does not exist"), info.value.message
    _only_real_options(info.value.hint or "")
