"""One meaning of ``-o``: the output format (``-o/--output text|json``, ``yaml`` where manifests,
a profile or a schema are printed), on every command that prints; the output directory is ``--out``.

In ``-o json`` mode stdout holds exactly one JSON document: the result (exit 0) or
``{"error", "hint", "location", "exit_code"}`` (the same non-zero exit code as in text mode);
progress, warnings and notes go to stderr. Exit codes: 2 bad input (click usage errors included),
1 scheduler/cluster failure. Everything runs in-process through click's CliRunner on the
repository's own specs and profiles; SLURM answers through the fake client commands
(tests/fakes/slurm).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from jobgen.cli import cli
from jobgen.specs.load import load_profile
from tests.conftest import EXAMPLES, PROFILES, REPO, write
from tests.fakes.slurm.fakeslurm import json_reply, reply, squeue_24_05

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
CLUSTER = load_profile("slurm-cpu", PROFILES).slurm_settings.cluster
HANDLE = f"slurm://{CLUSTER}/123"


def invoke(*args: str):
    """``jobgen ARGS`` in this process; the result has ``exit_code``, ``stdout``, ``stderr``."""
    return CliRunner().invoke(cli, list(args), prog_name="jobgen")


def json_error(result, code: int) -> dict:
    """The JSON error document a failed ``-o json`` command printed on stdout (and nothing else)."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    doc = json.loads(result.stdout)
    assert set(doc) == {"error", "hint", "location", "exit_code"} and doc["exit_code"] == code, doc
    assert "error:" not in result.stderr, "the error is printed once, as JSON"
    return doc


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


# --------------------------------------------------------------------------- -o is the format, --out the directory


def test_render_o_json_prints_what_it_wrote_and_makes_no_directory_named_json(cwd):
    result = invoke("render", QUICKSTART, "--profile", "slurm-a100", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert not (cwd / "json").exists()
    doc = json.loads(result.stdout)
    job_dir = cwd / "manifests" / "slurm-a100" / "quickstart"
    (job,) = doc["jobs"]
    assert (job["name"], job["profile"], job["scheduler"], job["world_size"]) == ("quickstart", "slurm-a100", "slurm", 8)
    assert Path(job["job_dir"]) == job_dir and sorted(job["files"]) == sorted(p.name for p in job_dir.iterdir())
    assert job["submit"] == f"jobgen submit {job['job_dir']}"


def test_render_stdout_o_json_holds_every_file_and_writes_nothing(cwd):
    result = invoke("render", QUICKSTART, "--profile", "k8s-h100", "--stdout", "-o", "json")
    assert result.exit_code == 0, result.stderr
    (job,) = json.loads(result.stdout)["jobs"]
    assert set(job["files"]) == {"kustomization.yaml", "pytorchjob.yaml", "spec.json"}
    assert "kind: PyTorchJob" in job["files"]["pytorchjob.yaml"]
    assert not (cwd / "manifests").exists()


@pytest.mark.parametrize("profile", ["slurm-a100", "k8s-h100"])
def test_render_stdout_o_yaml_is_the_json_document_in_yaml_with_each_file_a_literal_block(cwd, profile):
    as_json = invoke("render", QUICKSTART, "--profile", profile, "--stdout", "-o", "json")
    as_yaml = invoke("render", QUICKSTART, "--profile", profile, "--stdout", "-o", "yaml")
    assert as_yaml.exit_code == 0, as_yaml.stderr
    doc = yaml.safe_load(as_yaml.stdout)
    assert doc == json.loads(as_json.stdout)
    (job,) = doc["jobs"]
    for name, text in job["files"].items():  # every file readable as itself: a `|` block, not one escaped line
        if "\n" in text.rstrip("\n"):
            assert re.search(rf"^ +{re.escape(name)}: \|", as_yaml.stdout, flags=re.M), name
    manifest = "job.sbatch" if profile.startswith("slurm") else "pytorchjob.yaml"
    assert manifest in job["files"]
    if profile.startswith("k8s"):
        kinds = [obj["kind"] for obj in yaml.safe_load_all(job["files"]["pytorchjob.yaml"])]
        assert "PyTorchJob" in kinds
    assert not (cwd / "manifests").exists() and not (cwd / "yaml").exists()


def test_render_o_yaml_writes_and_prints_what_it_wrote(cwd):
    result = invoke("render", QUICKSTART, "--profile", "slurm-a100", "-o", "yaml")
    assert result.exit_code == 0, result.stderr
    (job,) = yaml.safe_load(result.stdout)["jobs"]
    assert Path(job["job_dir"]) == cwd / "manifests" / "slurm-a100" / "quickstart"
    assert (Path(job["job_dir"]) / "job.sbatch").is_file() and "job.sbatch" in job["files"]


def test_render_o_yaml_error_is_a_yaml_document_with_the_same_exit_code(cwd):
    spec = write(cwd / "bad.yaml", "name: x\ntrainer:\n  max_step: 10\n")
    result = invoke("render", str(spec), "--profile", "slurm-a100", "--stdout", "-o", "yaml")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    doc = yaml.safe_load(result.stdout)
    assert set(doc) == {"error", "hint", "location", "exit_code"} and doc["exit_code"] == 2
    assert "did you mean 'max_steps'" in doc["error"] and "error:" not in result.stderr


def test_render_out_dir_writes_there(cwd):
    result = invoke("render", QUICKSTART, "--profile", "slurm-a100", "--out", "elsewhere")
    assert result.exit_code == 0, result.stderr
    assert (cwd / "elsewhere" / "slurm-a100" / "quickstart" / "job.sbatch").is_file()


@pytest.mark.parametrize("command", [["render", QUICKSTART, "--profile", "slurm-a100"], ["diff", QUICKSTART, "--profile", "slurm-a100"],
                                     ["submit", QUICKSTART, "--profile", "slurm-cpu"]], ids=["render", "diff", "submit"])
def test_o_dir_from_the_old_habit_exits_2_naming_out(cwd, command):
    result = invoke(*command, "-o", "build/manifests")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "--out build/manifests" in result.stderr and "-o/--output" in result.stderr
    assert not (cwd / "build").exists() and not (cwd / "manifests").exists()


def test_submit_o_json_prints_the_handle_as_json(slurm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write(tmp_path / "quickstart.yaml", Path(QUICKSTART).read_text())  # outside a git work tree: no snapshot
    slurm.respond("sbatch", reply("123\n"))
    result = invoke("submit", str(spec), "--profile", "slurm-cpu", "--profiles-dir", str(PROFILES), "-o", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["action"], doc["handle"]) == ("submitted", HANDLE)
    assert Path(doc["job_dir"]) == (tmp_path / "runs" / "quickstart" / "job").resolve()  # with the run: no --out given
    assert Path(doc["run_dir"]) == (tmp_path / "runs" / "quickstart").resolve() and doc["log_file"]
    assert doc["tasks"] == []


def test_submit_o_json_when_sbatch_refuses_is_a_json_error_with_exit_1(slurm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write(tmp_path / "quickstart.yaml", Path(QUICKSTART).read_text())
    slurm.respond("sbatch", reply(stderr="sbatch: error: Invalid partition name specified\n", rc=1))
    doc = json_error(invoke("submit", str(spec), "--profile", "slurm-cpu", "--profiles-dir", str(PROFILES), "-o", "json"), 1)
    assert "Invalid partition name specified" in doc["error"] and doc["hint"]


# --------------------------------------------------------------------------- errors in -o json mode


@pytest.mark.parametrize("command", ["validate", "render", "plan"])
def test_bad_spec_in_json_mode_is_a_json_error_with_exit_2(cwd, command):
    spec = write(cwd / "bad.yaml", "name: x\ntrainer:\n  max_step: 10\n")
    doc = json_error(invoke(command, str(spec), "--profile", "slurm-a100", "-o", "json"), 2)
    assert "did you mean 'max_steps'" in doc["error"] and doc["location"].startswith(str(spec)) and doc["hint"]


def test_usage_error_in_json_mode_is_json_too(cwd):
    doc = json_error(invoke("validate", "-o", "json"), 2)
    assert "SPEC" in doc["error"]


def test_status_o_json_when_the_scheduler_fails_prints_json_with_exit_1(slurm):
    slurm.respond("squeue", reply(stderr="slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", rc=1))
    doc = json_error(invoke("status", HANDLE, "-o", "json"), 1)
    assert "Unable to contact slurm controller" in doc["error"]


def test_status_and_ls_o_json(slurm, tmp_path):
    slurm.respond("squeue", json_reply(squeue_24_05(123, ["RUNNING"])))
    got = json.loads(invoke("status", HANDLE, "-o", "json").stdout)
    assert (got["handle"], got["state"], got["source"]) == (HANDLE, "RUNNING", "squeue")
    assert json.loads(invoke("ls", "-o", "json").stdout) == []


def test_text_errors_stay_on_stderr(cwd):
    result = invoke("validate", str(cwd / "missing.yaml"))
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.startswith("error: ")


# --------------------------------------------------------------------------- per-command formats


def test_profiles_show_yaml_is_the_resolved_profile_and_text_is_not_yaml():
    as_json = json.loads(invoke("profiles", "show", "k8s-h100", "-o", "json").stdout)
    as_yaml = invoke("profiles", "show", "k8s-h100", "-o", "yaml")
    assert as_yaml.exit_code == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == as_json
    text = invoke("profiles", "show", "k8s-h100")
    assert text.exit_code == 0 and text.stdout != as_yaml.stdout
    # one line per resolved field, by the dotted path that --set and the README reference use
    assert re.search(r"^kubernetes\.namespace +training$", text.stdout, flags=re.M), text.stdout
    assert re.search(r"^gpu_type +H100$", text.stdout, flags=re.M)


def test_ls_state_is_a_choice_of_the_valid_states(cwd):
    bogus = invoke("ls", "--state", "BOGUS")
    assert bogus.exit_code == 2 and "RUNNING" in bogus.stderr and "PENDING" in bogus.stderr and "UNREACHABLE" in bogus.stderr
    assert invoke("ls", "--state", "running", "-o", "json").exit_code == 0  # case-insensitive


def test_cancel_and_schema_take_the_output_option():
    schema = invoke("schema", "profile", "-o", "yaml")
    assert schema.exit_code == 0 and yaml.safe_load(schema.stdout) == json.loads(invoke("schema", "profile").stdout)
    assert "-o, --output [text|json]" in invoke("cancel", "--help").stdout


# --------------------------------------------------------------------------- --debug anywhere


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_before_or_after_the_subcommand_shows_the_traceback(cwd, where):
    spec = str(write(cwd / "bad.yaml", "name: x\nbogus: 1\n"))
    args = ["--debug", "validate", spec] if where == "before" else ["validate", spec, "--debug"]
    result = invoke(*args)
    assert result.exit_code == 2 and "Traceback" in result.stderr, result.stderr
    assert "Traceback" not in invoke("validate", spec).stderr, "--debug of one call must not leak into the next"


def test_profiles_subcommands_take_debug_too():
    assert invoke("profiles", "show", "no-such-profile", "--debug").exit_code == 2


# --------------------------------------------------------------------------- every command, one convention


def commands() -> dict[str, click.Command]:
    """Every leaf command by its full name ("profiles show")."""
    found = {}
    for name, command in cli.commands.items():
        if isinstance(command, click.Group):
            found |= {f"{name} {sub}": c for sub, c in command.commands.items()}
        else:
            found[name] = command
    return found


@pytest.mark.parametrize(("name", "command"), sorted(commands().items()), ids=sorted(commands()))
def test_every_command_takes_o_as_the_format_and_debug(name, command):
    by_opt = {opt: param for param in command.params for opt in param.opts}
    output = by_opt["-o"]
    assert by_opt["--output"] is output and {"json"} <= set(output.type.choices)
    if name in ("render", "profiles show", "profiles detect", "schema"):  # they print manifests, a profile, a schema
        assert "yaml" in output.type.choices and "yaml:" in output.help
    assert "--debug" in by_opt
    if name in ("render", "diff", "submit"):
        assert by_opt["--out"].name == "out"


def usage_block() -> list[str]:
    text = (REPO / "docs" / "commands.md").read_text()
    block = re.search(r"## Usage\n\n```bash\n(.+?)\n```", text, flags=re.S)
    assert block, "docs/commands.md has a ## Usage block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_usage_block_names_only_options_the_commands_have():
    """docs/commands.md and --help agree: every option the Usage block shows belongs to the command it is
    shown for, and every -o there is a format the command takes."""
    known = commands()
    checked = 0
    for line in usage_block():
        for part in line.split(" | "):
            words = part.replace("[", " ").replace("]", " ").split()
            if words and words[0] == "jobgen":
                words = words[1:]
            name = next((n for n in sorted(known, key=len, reverse=True) if " ".join(words[: len(n.split())]) == n), None)
            if name is None:
                continue
            by_opt = {opt: param for param in known[name].params for opt in param.opts}
            for i, word in enumerate(words):
                option = word.split("=")[0]
                if option.startswith("-") and option not in ("-", "--"):
                    assert option in by_opt, f"docs/commands.md Usage: {name!r} has no option {option} ({line})"
                    checked += 1
                    if option in ("-o", "--output"):
                        for fmt in words[i + 1].split("|"):
                            assert fmt in by_opt[option].type.choices, f"docs/commands.md Usage: {name} -o {fmt}"
    assert checked > 20


def test_render_o_dir_is_gone_from_the_help_and_the_readme():
    assert not re.search(r"-o, --out\b(?!put)", invoke("render", "--help").stdout)
    pages = "\n".join(page.read_text() for page in (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))))
    bad = re.findall(r"jobgen (?:render|diff|submit) [^\n`]*?-o (?!json|text|yaml)\S+", pages)
    assert not bad, bad


def test_diff_o_json_holds_the_diff_and_says_whether_in_sync(cwd):
    before = json.loads(invoke("diff", QUICKSTART, "--profile", "slurm-a100", "-o", "json").stdout)
    assert before["in_sync"] is False and "+++ b/manifests/slurm-a100/quickstart/job.sbatch" in before["diff"]
    assert invoke("render", QUICKSTART, "--profile", "slurm-a100").exit_code == 0
    after = json.loads(invoke("diff", QUICKSTART, "--profile", "slurm-a100", "-o", "json").stdout)
    assert after == {"out": str(cwd / "manifests"), "in_sync": True, "diff": ""}
