"""Example values in profiles (``placeholders:``): the shipped cluster profiles name a made-up
image, queue, priority class, claim, partition and hosts. ``jobgen submit`` refuses them before
anything is written or sent; render, validate, plan and the dry runs take them as they are.
A profile of the user's that sets a field (``extends:``), or an override of load_profile, replaces it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from jobgen import api
from jobgen.backends.kubernetes import backend as k8s
from jobgen.errors import ConfigError
from jobgen.specs.load import load_profile
from jobgen.specs.profile import example_values, field_value
from tests.conftest import EXAMPLES, PROFILES, TEMPLATES, site_profile, write

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
#: The shipped profiles and the fields each must mark as examples.
SHIPPED = {
    "k8s-a100": {"kubernetes.image", "kubernetes.rdma_resource", "kubernetes.runs_volume_claim"},
    "k8s-h100": {"kubernetes.image", "kubernetes.rdma_resource", "kubernetes.runs_volume_claim",
                 "kubernetes.queue_label", "kubernetes.priority_class"},
    "slurm-a100": {"slurm.partition"},
    "slurm-h100": {"slurm.partition", "slurm.container.image", "slurm.container.mounts"},
    "ssh-2node": {"ssh.hosts"},
    "local": set(),
    "slurm-cpu": set(),
    "slurm-cpu-array": set(),
}
HOSTILE = ["has space", "quote'\"", "new\nline", "x" * 300, "kubernetes..image", "Kubernetes.Image", "kubernetes.image ",
           "kubernetes.nope", "name", "placeholders", "kubernetes.node_selector.gpu"]


def _profile(tmp_path: Path, name: str, doc: dict) -> Path:
    return write(tmp_path / "profiles" / f"{name}.yaml", yaml.safe_dump(doc, sort_keys=False))


def test_every_shipped_profile_marks_its_site_values():
    assert {p.stem for p in PROFILES.glob("*.yaml")} == set(SHIPPED)
    for name, fields in SHIPPED.items():
        profile = load_profile(name, PROFILES)
        assert set(profile.placeholders) == fields, name
        for path, item in profile.placeholders.items():
            assert field_value(profile, path) is not None and item.reason and item.file, (name, path)


def test_placeholders_are_not_rendered_and_do_not_change_the_inputs_hash():
    """The marker is data about the file, not about the job: a profile that sets every field to
    the same value renders byte-identical files."""
    shipped = api.plan_job(QUICKSTART, "k8s-h100", templates=TEMPLATES)
    assert [p for p, _, _ in shipped.placeholders] == sorted(SHIPPED["k8s-h100"])
    assert "placeholders" not in load_profile("k8s-h100", PROFILES).model_dump()
    assert not any("placeholder" in text for _, text in shipped.files)


def test_a_site_profile_that_sets_the_fields_clears_them(tmp_path):
    site = site_profile(tmp_path, "k8s-h100")
    profile = load_profile(str(site))
    assert profile.placeholders == {} and profile.name == "k8s-h100"
    assert api.plan_job(QUICKSTART, str(site), templates=TEMPLATES).files == api.plan_job(QUICKSTART, "k8s-h100", templates=TEMPLATES).files


def test_setting_one_field_clears_that_one_only_and_a_child_may_add_its_own(tmp_path):
    _profile(tmp_path, "mine", {"extends": "k8s-h100", "kubernetes": {"image": "registry.example/me:1", "queue_label": None},
                                "placeholders": {"kubernetes.namespace": "the team's namespace"}})
    profile = load_profile("mine", tmp_path / "profiles")
    assert set(profile.placeholders) == SHIPPED["k8s-h100"] - {"kubernetes.image", "kubernetes.queue_label"} | {"kubernetes.namespace"}
    assert profile.placeholders["kubernetes.namespace"].file == str(tmp_path / "profiles" / "mine.yaml")
    assert profile.placeholders["kubernetes.priority_class"].file.endswith("k8s-h100.yaml")


def test_an_override_clears_the_field_it_sets_or_a_section_above_it():
    profile = load_profile("slurm-h100", PROFILES, ["slurm.partition=h100-site", "slurm.container={runtime: none}"])
    assert profile.placeholders == {}
    partial = load_profile("k8s-h100", PROFILES, ["kubernetes.image=registry.example/me:1"])
    assert "kubernetes.image" not in partial.placeholders and "kubernetes.queue_label" in partial.placeholders


@pytest.mark.parametrize("key", HOSTILE, ids=range(len(HOSTILE)))
def test_a_placeholder_that_names_no_field_is_refused_with_file_and_path(tmp_path, key):
    path = _profile(tmp_path, "bad", {"extends": "local", "placeholders": {key: "why"}})
    with pytest.raises(ConfigError) as err:
        load_profile("bad", tmp_path / "profiles")
    assert str(path) in str(err.value) and "placeholders" in str(err.value)
    assert "not a profile field path" in str(err.value) or "needs a value" in str(err.value)


@pytest.mark.parametrize("reason", ["", "two\nlines", "tab\there", "bell\x07", "csi\x9b31m", "line\u2028sep", "x" * 300, 7, None, ["a"]],
                         ids=range(10))
def test_a_reason_that_is_not_one_short_line_is_refused(tmp_path, reason):
    path = _profile(tmp_path, "bad", {"extends": "k8s-h100", "placeholders": {"kubernetes.namespace": reason}})
    with pytest.raises(ConfigError) as err:
        load_profile("bad", tmp_path / "profiles")
    assert str(path) in str(err.value) and "placeholders.kubernetes.namespace" in str(err.value)


@pytest.mark.parametrize("value", ["kubernetes.image", ["kubernetes.image"], 3])
def test_placeholders_must_be_a_mapping(tmp_path, value):
    path = _profile(tmp_path, "bad", {"extends": "k8s-h100", "placeholders": value})
    with pytest.raises(ConfigError, match="placeholders must be a mapping") as err:
        load_profile("bad", tmp_path / "profiles")
    assert err.value.location == f"{path}: placeholders"


def test_a_placeholder_on_an_unset_field_is_refused(tmp_path):
    _profile(tmp_path, "bad", {"extends": "k8s-h100", "placeholders": {"kubernetes.service_account": "yours"}})
    with pytest.raises(ConfigError, match="leaves unset"):
        load_profile("bad", tmp_path / "profiles")


def test_hostile_values_show_on_one_line_and_long_ones_are_cut(tmp_path):
    image = "reg.example/a b'\"\n" + "x" * 300
    _profile(tmp_path, "mine", {"extends": "k8s-h100", "kubernetes": {"namespace": "team-a"},
                                "placeholders": {"kubernetes.namespace": "the team's \"namespace\""},
                                "slurm": {"partition": "p"}})
    profile = load_profile("mine", tmp_path / "profiles", [f"kubernetes.image={image}"])
    shown = dict((p, v) for p, v, _ in example_values(profile))
    assert shown["kubernetes.namespace"] == '"team-a"'
    assert "kubernetes.image" not in shown
    _profile(tmp_path, "long", {"extends": "local", "description": image, "placeholders": {"description": "x"}})
    (_, value, _), = example_values(load_profile("long", tmp_path / "profiles"))
    assert "\n" not in value and len(value) == 160 and value.endswith("...")


def test_cli_submit_refuses_before_anything_is_written_or_sent(tmp_path, monkeypatch):
    """A real submit names the file, each field with its value and reason, and the fix; exit 2;
    no job directory, no run directory, no request to the cluster."""
    from jobgen.cli import cli
    from tests.unit.test_k8s_submit import FakeCluster

    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["submit", QUICKSTART, "-p", "k8s-h100", "--profiles-dir", str(PROFILES), "--out", "manifests"])
    assert result.exit_code == 2, result.output
    err = result.stderr
    assert f"{PROFILES / 'k8s-a100.yaml'}: kubernetes.image: profile 'k8s-h100' holds example values" in err
    for field in SHIPPED["k8s-h100"]:
        assert f"  {field} = " in err
    assert '"training-high" (' in err and "kubectl get priorityclasses" in err
    assert "hint: write a profile of your own with 'extends: k8s-h100' that sets kubernetes.image, " in err
    assert "Traceback" not in err
    assert cluster.calls == [] and not (tmp_path / "manifests").exists() and not (tmp_path / "runs").exists()


def test_python_api_submit_refuses_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # were the refusal gone, no real sbatch would run
    job_plan = api.plan_job(QUICKSTART, "slurm-a100", templates=TEMPLATES)
    with pytest.raises(ConfigError, match="slurm.partition") as err:
        api.submit(job_plan, api.SubmitOptions(runs_dir=tmp_path / "runs"), out=tmp_path / "manifests")
    assert err.value.location.endswith("slurm-a100.yaml: slurm.partition")
    assert not (tmp_path / "manifests").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", [["render", "--stdout"], ["validate"], ["plan"]])
def test_render_validate_and_plan_take_the_shipped_profiles_quietly(run_cli, command):
    result = run_cli(command[0], QUICKSTART, "-p", "k8s-h100", *command[1:])
    assert result.code == 0, result.stderr
    assert "example values" not in result.stderr + result.stdout


def test_server_dry_run_takes_the_profile_and_warns(tmp_path, monkeypatch):
    from jobgen.cli import cli
    from tests.unit.test_k8s_submit import FakeCluster

    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["submit", QUICKSTART, "-p", "k8s-h100", "--dry-run=server"])
    assert result.exit_code == 0, result.output
    assert "nothing was queued or created" in result.stdout
    assert "warning: profile 'k8s-h100' holds example values (kubernetes.image, " in result.stderr
    assert not [path for path in cluster.objects if "/pytorchjobs/" in path]


def test_a_sweep_is_refused_before_its_first_point(tmp_path, monkeypatch):
    from jobgen.cli import cli
    from tests.unit.test_k8s_submit import FakeCluster

    cluster = FakeCluster()
    monkeypatch.setattr(k8s, "connect", lambda context=None, kubeconfig=None: cluster)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["submit", QUICKSTART, "-p", "k8s-h100", "--sweep", "trainer.learning_rate=1e-4,3e-4"])
    assert result.exit_code == 2 and "holds example values" in result.stderr, result.output
    assert cluster.calls == [] and not (tmp_path / "runs").exists()


def test_a_slurm_array_sweep_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # were the refusal gone, no real sbatch would run
    _profile(tmp_path, "array", {"extends": "slurm-a100", "slurm": {"sweep_as_array": True}})
    from jobgen.api.sweep import plan_sweep, submit_sweep

    sweep = plan_sweep(QUICKSTART, "array", ["trainer.learning_rate=1e-4,3e-4"], profiles_dir=str(tmp_path / "profiles"),
                       templates_dir=str(TEMPLATES))
    assert sweep.array
    with pytest.raises(ConfigError, match="slurm.partition"):
        submit_sweep(sweep, api.SubmitOptions(runs_dir=tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_sbatch_test_only_takes_the_profile_and_a_real_submit_never_runs_sbatch(slurm, run_cli, tmp_path):
    """``--test-only`` asks SLURM (with a warning); the real submit after it is refused before sbatch."""
    from tests.fakes.slurm.fakeslurm import reply

    slurm.respond("sbatch", reply(stderr="sbatch: Job 124 to start at 2025-01-01T10:00:00 using 16 processors in partition gpu\n"))
    spec = write(tmp_path / "quickstart.yaml", Path(QUICKSTART).read_text())  # outside a git work tree: no code snapshot
    checked = run_cli("submit", str(spec), "-p", "slurm-a100", "--test-only", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert checked.code == 0, checked.stderr
    assert "warning: profile 'slurm-a100' holds example values (slurm.partition)" in checked.stderr
    refused = run_cli("submit", str(spec), "-p", "slurm-a100", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert refused.code == 2 and 'slurm.partition = "gpu"' in refused.stderr and "sinfo -s" in refused.stderr
    assert [argv[0] for argv in slurm.argvs()] == ["sbatch"] and "--test-only" in slurm.argvs()[0]


def test_profiles_show_ends_with_the_example_values_and_a_copy_keeps_them(run_cli, tmp_path):
    """``profiles show -o yaml`` is a file to copy: the copy still lists the example values, so
    its submit is refused until they are set and their lines deleted."""
    shown = run_cli("profiles", "show", "k8s-h100", "-o", "yaml")
    assert shown.code == 0, shown.stderr
    doc = yaml.safe_load(shown.stdout)
    assert list(doc)[-1] == "placeholders" and set(doc["placeholders"]) == SHIPPED["k8s-h100"]
    assert doc["placeholders"]["kubernetes.queue_label"].startswith("your namespace's Kueue LocalQueue")
    copy = load_profile(str(write(tmp_path / "copy.yaml", shown.stdout)))
    assert set(copy.placeholders) == SHIPPED["k8s-h100"] and copy.placeholders["kubernetes.image"].file == str(tmp_path / "copy.yaml")
    edited = {**doc, "kubernetes": {**doc["kubernetes"], "image": "registry.example/me:1"}}
    edited["placeholders"] = {k: v for k, v in doc["placeholders"].items() if k != "kubernetes.image"}
    assert "kubernetes.image" not in load_profile(str(write(tmp_path / "edited.yaml", yaml.safe_dump(edited)))).placeholders
    assert "placeholders" not in yaml.safe_load(run_cli("profiles", "show", "slurm-cpu", "-o", "yaml").stdout)


def test_profiles_list_says_which_profiles_hold_example_values(run_cli):
    text = run_cli("profiles", "list", "--profiles-dir", str(PROFILES))
    assert text.code == 0, text.stderr
    lines = {line.split()[0]: line for line in text.stdout.splitlines()}
    assert lines["k8s-h100"].endswith("[example: 5 value(s) to set]") and lines["slurm-a100"].endswith("[example: 1 value(s) to set]")
    assert "[example" not in lines["slurm-cpu"] and "[example" not in lines["local"]
    rows = {row["name"]: row for row in json.loads(run_cli("profiles", "list", "-o", "json", "--profiles-dir", str(PROFILES)).stdout)}
    assert {name: set(row["example_values"]) for name, row in rows.items()} == SHIPPED
