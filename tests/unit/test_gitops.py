"""GitOps building blocks in-process: sweeps and their names, the project file, render/compare/apply.

The CLI and git end to end (fresh clone, --check, --commit, kubectl kustomize) are in
test_gitops_cli.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from jobgen.api import PLANNERS
from jobgen.errors import ConfigError
from jobgen.gitops.sync import apply, compare, unified_diff
from jobgen.planning.project import plan_project
from jobgen.planning.render import environment, template_sha256
from jobgen.planning.sweep import SpecOptions, plan_single
from jobgen.specs.project import Project, ProjectJob, load_project
from jobgen.specs.sweeps import parse_sweep, sweep_job_names, sweep_points
from jobgen.specs.training import MAX_NAME
from tests.conftest import EXAMPLES, PROFILES, TEMPLATES, write

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def make_project(root: Path, body: str) -> Path:
    """A project directory like a user's GitOps repo: examples/, cluster_profiles/, templates/, jobgen.yaml."""
    for src in (EXAMPLES, PROFILES, TEMPLATES):
        shutil.copytree(src, root / src.name)
    return write(root / "jobgen.yaml", body)


def render_all(project: Path, prune: bool = False):
    comparison = compare(plan_project(load_project(project), PLANNERS))
    apply(comparison, prune=prune)
    return comparison


BASIC = """\
jobs:
  - spec: examples/quickstart.yaml
    profiles: [slurm-a100, k8s-h100]
  - spec: examples/gpt2-350m-zero3.yaml
    profiles: [slurm-h100]
"""


# --------------------------------------------------------------------------- sweeps


def test_parse_sweep_splits_on_top_level_commas_only():
    assert parse_sweep("trainer.learning_rate=1e-4,3e-4").values == ("1e-4", "3e-4")
    assert parse_sweep("data.paths=[a,b],[c]").values == ("[a,b]", "[c]")
    assert parse_sweep("env={A: '1,2'},{}").values == ("{A: '1,2'}", "{}")


@pytest.mark.parametrize(("text", "values"), [
    # a quote inside a word is an ordinary character (it made one value of a'b,plain)
    ("env.P=a'b,plain", ("a'b", "plain")),
    ('env.P=a"b,plain', ('a"b', "plain")),
    ("env.P=it's,x'", ("it's", "x'")),
    ("data.paths=[a'b, c],d", ("[a'b, c]", "d")),
    # a value quoted as a whole keeps its commas (YAML quoting: '' and \" inside)
    ("env.P='a,b',c", ("'a,b'", "c")),
    ('env.P="a,b", c', ('"a,b"', "c")),
    ("env.P='it''s, ok',c", ("'it''s, ok'", "c")),
    ('env.P="say \\"hi,\\" x",c', ('"say \\"hi,\\" x"', "c")),
    ('env={"A":"1,2"},{B: \'3,4\'}', ('{"A":"1,2"}', "{B: '3,4'}")),
])
def test_sweep_values_follow_the_documented_grammar(text, values):
    assert parse_sweep(text).values == values


@pytest.mark.parametrize(("text", "message"), [
    ("env.P='a,b", "unterminated quote"),
    ('env.P=x,"a', "unterminated quote"),
    ("data.paths=[a,b", "unclosed '['"),
    ("data.paths=a],b", "unbalanced ']'"),
    ("data.paths=[a},b", "unbalanced '}'"),
])
def test_sweep_values_the_grammar_cannot_split_are_refused(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        parse_sweep(text)
    assert info.value.location == "--sweep" and "docs/sweeps.md" in info.value.hint


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("trainer.learning_rate", "is not key.path=v1,v2"),
        ("trainer.learning_rate=", "non-empty values"),
        ("trainer.learning_rate=1,,2", "non-empty values"),
        ("trainer..lr=1", "is not a key.path"),
        ("trainer.learning_rate=1,1", "more than once"),
        ("name=a,b", "'name' cannot be swept"),
    ],
)
def test_parse_sweep_rejects_malformed_axes(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        parse_sweep(text)
    assert info.value.hint and info.value.location == "--sweep"


def test_sweep_grid_is_cartesian_in_axis_order():
    points = sweep_points([parse_sweep("trainer.learning_rate=1e-4,3e-4"), parse_sweep("trainer.micro_batch_size=4,8")])
    assert points == [
        (("trainer.learning_rate", "1e-4"), ("trainer.micro_batch_size", "4")),
        (("trainer.learning_rate", "1e-4"), ("trainer.micro_batch_size", "8")),
        (("trainer.learning_rate", "3e-4"), ("trainer.micro_batch_size", "4")),
        (("trainer.learning_rate", "3e-4"), ("trainer.micro_batch_size", "8")),
    ]
    with pytest.raises(ConfigError, match="given twice"):
        sweep_points([parse_sweep("trainer.seed=1"), parse_sweep("trainer.seed=2")])


def test_sweep_names_are_readable_dns_safe_and_stable():
    points = sweep_points([parse_sweep("trainer.learning_rate=1e-4,3e-4"), parse_sweep("trainer.micro_batch_size=4,8")])
    names = sweep_job_names("quickstart", points)
    assert names == ["quickstart-lr1e-4-mbs4", "quickstart-lr1e-4-mbs8", "quickstart-lr3e-4-mbs4", "quickstart-lr3e-4-mbs8"]
    assert names == sweep_job_names("quickstart", list(reversed(points)))[::-1], "a name depends on its point only"
    assert all(DNS1035.match(n) for n in names)


@pytest.mark.parametrize(
    "sweeps",
    [
        ["trainer.learning_rate=0.5,0p5,0-5"],  # tokens that would collide
        ["trainer.precision=bf16-mixed,BF16-MIXED", "trainer.fsdp_sharding_strategy=FULL_SHARD,full_shard"],
        ["trainer.learning_rate=" + ",".join(f"{i}e-5" for i in range(1, 7)), "trainer.warmup_steps=" + ",".join(str(10**i) for i in range(8))],
        ["env={A: x},{A: y}", "data.paths=[a b],[a_b]"],
    ],
    ids=["dot-vs-p", "case-and-underscore", "long-grid", "flow-values"],
)
def test_sweep_names_never_collide_and_stay_dns_safe(sweeps):
    points = sweep_points([parse_sweep(s) for s in sweeps])
    names = sweep_job_names("a-rather-long-base-job-name-for-kubernetes", points)
    assert len(set(names)) == len(points)
    for name in names:
        assert DNS1035.match(name) and len(name) <= MAX_NAME, name


def test_sweep_value_token_keeps_decimal_points_readable():
    assert sweep_job_names("q", [(("trainer.learning_rate", "0.0003"),), (("trainer.learning_rate", "1.5e-4"),)]) == ["q-lr0p0003", "q-lr1p5e-4"]


@pytest.mark.parametrize("value", ["-1", "FULL_SHARD", "[a, b]", "1e+4"])
def test_sweep_value_that_cannot_be_spelt_gets_a_hash_not_a_mangled_name(value):
    (name,) = sweep_job_names("q", [(("trainer.seed", value),)])
    assert re.fullmatch(r"q-seed[a-z0-9-]*-[0-9a-f]{8}", name), name
    assert sweep_job_names("q", [(("trainer.seed", value),)]) == [name]


def test_sweep_mapping_form_equals_string_form():
    as_strings = ProjectJob.model_validate({"spec": "s", "profiles": ["p"], "sweep": ["trainer.learning_rate=1e-4,0.0003", "trainer.seed=1,2"]})
    as_mapping = ProjectJob.model_validate({"spec": "s", "profiles": ["p"], "sweep": {"trainer.learning_rate": ["1e-4", 0.0003], "trainer.seed": [1, 2]}})
    assert as_strings.axes == as_mapping.axes


# --------------------------------------------------------------------------- project file


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("jobs:\n  - spec: s.yaml\n    profile: [a]\n", "jobs[0].profile: unknown key (did you mean 'profiles'?)"),
        ("outt: x\njobs: [{spec: s.yaml, profiles: [a]}]\n", "outt: unknown key (did you mean 'out'?)"),
        ("jobs: []\n", "jobs: list at least one job"),
        ("out: ../elsewhere\njobs: [{spec: s.yaml, profiles: [a]}]\n", "out: out must be a subdirectory"),
        ("jobs: [{spec: s.yaml, profiles: [a, a]}]\n", "jobs[0].profiles: Value error, profile 'a' is listed twice".replace("Value error, ", "")),
        ("jobs: [{spec: s.yaml, profiles: [a], set: [max_steps]}]\n", "jobs[0].set: override 'max_steps' is not key.path=value"),
        ("jobs: [{spec: s.yaml, profiles: [a], sweep: [trainer.seed]}]\n", "jobs[0].sweep: sweep 'trainer.seed' is not key.path=v1,v2"),
        ("jobs: [{spec: s.yaml, profiles: [a], sweep: {name: [a, b]}}]\n", "jobs[0].sweep: 'name' cannot be swept"),
    ],
)
def test_project_file_errors_name_file_field_and_hint(tmp_path, body, expected):
    path = write(tmp_path / "jobgen.yaml", body)
    with pytest.raises(ConfigError) as info:
        load_project(path)
    assert expected in info.value.message
    assert info.value.location == str(path) and info.value.hint


def test_project_schema_is_strict():
    schema = Project.model_json_schema()
    assert schema["additionalProperties"] is False and "set" in schema["$defs"]["ProjectJob"]["properties"]


def test_entry_errors_are_all_reported_and_nothing_is_written(tmp_path):
    project = make_project(tmp_path, BASIC + "  - spec: examples/missing.yaml\n    profiles: [slurm-a100]\n"
                                               "  - spec: examples/quickstart.yaml\n    profiles: [slurm-a10]\n")
    with pytest.raises(ConfigError) as info:
        plan_project(load_project(project), PLANNERS)
    text = str(info.value)
    assert "2 of 4 job entries cannot be rendered; nothing was written" in text
    assert "jobs[2]" in text and "file not found" in text
    assert "jobs[3].profiles[0]" in text and "did you mean 'slurm-a100'?" in text
    assert not (tmp_path / "manifests").exists()


def test_two_entries_rendering_one_directory_are_refused(tmp_path):
    project = make_project(tmp_path, BASIC + "  - spec: examples/quickstart.yaml\n    profiles: [slurm-a100]\n    set: [trainer.max_steps=500]\n")
    with pytest.raises(ConfigError, match=r"jobs\[0\] \(examples/quickstart.yaml\) and jobs\[2\] .* both render slurm-a100/quickstart/") as info:
        plan_project(load_project(project), PLANNERS)
    assert "name=" in (info.value.hint or "")


def test_kubernetes_object_clash_across_profiles_is_caught_before_writing(tmp_path):
    project = make_project(tmp_path, "jobs:\n  - spec: examples/quickstart.yaml\n    profiles: [k8s-a100, k8s-h100]\n")
    with pytest.raises(ConfigError, match="both define PyTorchJob 'quickstart' in namespace 'training'") as info:
        plan_project(load_project(project), PLANNERS)
    assert "top_level_kustomization: false" in (info.value.hint or "")
    write(project, "top_level_kustomization: false\n" + project.read_text())
    render = plan_project(load_project(project), PLANNERS)
    assert "kustomization.yaml" not in render.files and "k8s-a100/kustomization.yaml" in render.files


def test_a_pytorchjob_and_a_trainjob_of_one_name_and_namespace_clash_too(tmp_path):
    project = make_project(tmp_path, "jobs:\n  - spec: examples/quickstart.yaml\n    profiles: [k8s-h100, k8s-v2]\n")
    write(tmp_path / "cluster_profiles" / "k8s-v2.yaml", "extends: k8s-h100\nkubernetes:\n  job_api: trainjob\n  priority_class: null\n")
    with pytest.raises(ConfigError, match=r"k8s-h100/quickstart and k8s-v2/quickstart both define objects named 'quickstart' "
                                          r"\(PyTorchJob, TrainJob\) in namespace 'training'"):
        plan_project(load_project(project), PLANNERS)


def test_only_jobs_applied_to_a_cluster_are_aggregated(tmp_path):
    dirs = {"profiles_dir": str(PROFILES), "templates_dir": str(TEMPLATES)}
    (job,) = plan_single(str(EXAMPLES / "quickstart.yaml"), "slurm-a100", PLANNERS, SpecOptions(out=tmp_path, **dirs)).jobs
    assert job.plan.apply_files == () and job.plan.cluster_object is None
    (job,) = plan_single(str(EXAMPLES / "quickstart.yaml"), "k8s-h100", PLANNERS, SpecOptions(out=tmp_path, **dirs)).jobs
    assert job.plan.apply_files == ("pytorchjob.yaml",) and set(job.plan.apply_files) <= dict(job.plan.files).keys()
    assert (job.plan.cluster_object.kind, job.plan.cluster_object.key) == ("PyTorchJob", ("training", "quickstart"))


# --------------------------------------------------------------------------- render, compare, apply


def test_render_all_writes_jobs_index_and_kustomizations(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    out = tmp_path / "manifests"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "index.yaml",
        "k8s-h100/kustomization.yaml",
        "k8s-h100/quickstart/kustomization.yaml",
        "k8s-h100/quickstart/pytorchjob.yaml",
        "k8s-h100/quickstart/spec.json",
        "kustomization.yaml",
        "slurm-a100/quickstart/job.sbatch",
        "slurm-a100/quickstart/spec.json",
        "slurm-h100/gpt2-350m-zero3/ds_config.json",
        "slurm-h100/gpt2-350m-zero3/job.sbatch",
        "slurm-h100/gpt2-350m-zero3/spec.json",
    ]
    index = yaml.safe_load((out / "index.yaml").read_text())
    assert [(j["dir"], j["spec"], j["scheduler"]) for j in index["jobs"]] == [
        ("k8s-h100/quickstart", "examples/quickstart.yaml", "kubernetes"),
        ("slurm-a100/quickstart", "examples/quickstart.yaml", "slurm"),
        ("slurm-h100/gpt2-350m-zero3", "examples/gpt2-350m-zero3.yaml", "slurm"),
    ]
    assert yaml.safe_load((out / "kustomization.yaml").read_text())["resources"] == ["k8s-h100/quickstart/pytorchjob.yaml"]
    assert yaml.safe_load((out / "k8s-h100" / "kustomization.yaml").read_text())["resources"] == ["quickstart/pytorchjob.yaml"]
    assert (out / "slurm-a100/quickstart/job.sbatch").stat().st_mode & 0o777 == 0o755
    assert (out / "slurm-a100/quickstart/spec.json").stat().st_mode & 0o777 == 0o644
    assert compare(plan_project(load_project(project), PLANNERS)).in_sync


def test_kustomizations_list_the_trainjob_manifest_of_trainjob_profiles(tmp_path):
    project = make_project(tmp_path, "jobs:\n  - spec: examples/quickstart.yaml\n    profiles: [k8s-v2]\n")
    write(tmp_path / "cluster_profiles" / "k8s-v2.yaml", "extends: k8s-h100\nkubernetes:\n  job_api: trainjob\n  priority_class: null\n")
    render_all(project)
    out = tmp_path / "manifests"
    assert (out / "k8s-v2" / "quickstart" / "trainjob.yaml").is_file()
    assert yaml.safe_load((out / "kustomization.yaml").read_text())["resources"] == ["k8s-v2/quickstart/trainjob.yaml"]
    assert yaml.safe_load((out / "k8s-v2" / "kustomization.yaml").read_text())["resources"] == ["quickstart/trainjob.yaml"]


def test_spec_edit_changes_only_that_jobs_files(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    spec = tmp_path / "examples" / "gpt2-350m-zero3.yaml"
    spec.write_text(spec.read_text().replace("max_steps: ", "max_steps: 1"))
    comparison = compare(plan_project(load_project(project), PLANNERS))
    assert {c.path.rsplit("/", 1)[0] for c in comparison.changes} == {"slurm-h100/gpt2-350m-zero3"}
    assert {c.kind for c in comparison.changes} == {"modify"}
    diff = unified_diff(comparison, "manifests")
    assert '-      "max_steps": 20000,' in diff and '+      "max_steps": 120000,' in diff


def test_template_edit_is_drift(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    template = tmp_path / "templates" / "slurm" / "job.sbatch.j2"
    template.write_text(template.read_text().replace("set -euo pipefail", "set -euo pipefail\numask 077"))
    environment.cache_clear()  # one process keeps its templates (auto_reload=False); a new CLI run reads them again
    template_sha256.cache_clear()
    changed = {c.path for c in compare(plan_project(load_project(project), PLANNERS)).changes}
    assert changed == {"slurm-a100/quickstart/job.sbatch", "slurm-a100/quickstart/spec.json",
                       "slurm-h100/gpt2-350m-zero3/job.sbatch", "slurm-h100/gpt2-350m-zero3/spec.json"}


def test_stale_job_dirs_are_reported_and_pruned_but_foreign_files_survive(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    out = tmp_path / "manifests"
    write(out / "slurm-h100" / "gpt2-350m-zero3" / "NOTES.md", "my notes\n")
    handmade = write(out / "slurm-a100" / "handmade" / "job.sbatch", "#!/bin/bash\necho mine\n")
    project.write_text(BASIC.split("  - spec: examples/gpt2")[0])
    comparison = render_all(project)
    assert comparison.stale_dirs == ["slurm-h100/gpt2-350m-zero3"]
    assert comparison.foreign == {"slurm-h100/gpt2-350m-zero3": ["NOTES.md"]}
    assert (out / "slurm-h100" / "gpt2-350m-zero3" / "job.sbatch").exists(), "stale dirs stay without --prune"
    assert not compare(plan_project(load_project(project), PLANNERS)).in_sync, "a stale dir is drift for --check"
    render_all(project, prune=True)
    assert sorted(p.name for p in (out / "slurm-h100" / "gpt2-350m-zero3").iterdir()) == ["NOTES.md"]
    assert handmade.read_text() == "#!/bin/bash\necho mine\n", "a directory jobgen did not write is never touched"
    assert compare(plan_project(load_project(project), PLANNERS)).in_sync


def test_pruning_an_only_job_removes_its_profile_dir(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    project.write_text(BASIC.split("  - spec: examples/gpt2")[0])
    render_all(project, prune=True)
    assert not (tmp_path / "manifests" / "slurm-h100").exists()


def test_removing_the_last_kubernetes_job_removes_its_kustomizations(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    project.write_text(BASIC.replace("[slurm-a100, k8s-h100]", "[slurm-a100]"))
    comparison = render_all(project, prune=True)
    out = tmp_path / "manifests"
    assert not (out / "kustomization.yaml").exists() and not (out / "k8s-h100").exists()
    assert {"kustomization.yaml", "k8s-h100/kustomization.yaml", "k8s-h100/quickstart/pytorchjob.yaml"} <= {c.path for c in comparison.changes}


def test_hand_edit_and_lost_exec_bit_are_drift_and_get_repaired(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    script = tmp_path / "manifests" / "slurm-a100" / "quickstart" / "job.sbatch"
    script.chmod(0o644)
    spec = script.with_name("spec.json")
    spec.write_text(spec.read_text().replace('"max_steps": 600', '"max_steps": 601'))
    comparison = compare(plan_project(load_project(project), PLANNERS))
    assert {(c.path, c.kind) for c in comparison.changes} == {("slurm-a100/quickstart/job.sbatch", "mode"), ("slurm-a100/quickstart/spec.json", "modify")}
    diff = unified_diff(comparison, "manifests")
    assert "old mode 100644\nnew mode 100755" in diff and '-      "max_steps": 601,' in diff
    apply(comparison, prune=False)
    assert script.stat().st_mode & 0o777 == 0o755 and compare(plan_project(load_project(project), PLANNERS)).in_sync


def test_owned_stale_file_in_a_live_job_dir_is_removed(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    job = tmp_path / "manifests" / "slurm-a100" / "quickstart"
    write(job / "ds_config.json", "{}\n")
    write(job / "kustomization.yaml", "resources: []\n")  # not jobgen's (no header): left alone
    comparison = compare(plan_project(load_project(project), PLANNERS))
    assert [(c.path, c.kind) for c in comparison.changes] == [("slurm-a100/quickstart/ds_config.json", "delete")]
    assert "+++ /dev/null" in unified_diff(comparison, "manifests")


def test_single_spec_sweep_renders_the_grid(tmp_path):
    render = plan_single(str(EXAMPLES / "quickstart.yaml"), "k8s-h100", PLANNERS,
                         SpecOptions(out=tmp_path / "m", sweeps=["trainer.learning_rate=1e-4,3e-4", "trainer.micro_batch_size=4,8"],
                                     profiles_dir=str(PROFILES), templates_dir=str(TEMPLATES)))
    assert sorted(render.job_dirs) == [f"k8s-h100/quickstart-lr{lr}-mbs{m}" for lr in ("1e-4", "3e-4") for m in ("4", "8")]
    apply(compare(render), prune=False)
    spec = json.loads((tmp_path / "m" / "k8s-h100" / "quickstart-lr3e-4-mbs8" / "spec.json").read_text())["spec"]
    assert (spec["name"], spec["trainer"]["learning_rate"], spec["trainer"]["micro_batch_size"]) == ("quickstart-lr3e-4-mbs8", 3e-4, 8)
    again = plan_single(str(EXAMPLES / "quickstart.yaml"), "k8s-h100", PLANNERS,
                        SpecOptions(out=tmp_path / "m", sweeps=["trainer.learning_rate=1e-4,3e-4", "trainer.micro_batch_size=4,8"],
                                    profiles_dir=str(PROFILES), templates_dir=str(TEMPLATES)))
    assert compare(again).in_sync


def test_sweep_point_goes_through_set_override_parsing(tmp_path):
    """Values are YAML-parsed exactly like --set: '[a, b]' is a list, '08' stays what --set makes of it."""
    render = plan_single(str(EXAMPLES / "quickstart.yaml"), "slurm-a100", PLANNERS,
                         SpecOptions(out=tmp_path, sweeps=["data.paths=[a.txt, b.txt],[c.txt]"],
                                     profiles_dir=str(PROFILES), templates_dir=str(TEMPLATES)))
    paths = sorted(json.loads(dict(j.plan.files)["spec.json"])["spec"]["data"]["paths"] for j in render.jobs)
    assert paths == [["a.txt", "b.txt"], ["c.txt"]]
    assert all(DNS1035.match(j.plan.job_name) for j in render.jobs)


def test_invalid_sweep_value_is_reported_with_its_point():
    with pytest.raises(ConfigError, match=r"(?s)sweep point trainer.micro_batch_size=many.*trainer.micro_batch_size: expected a positive integer or 'auto'"):
        plan_single(str(EXAMPLES / "quickstart.yaml"), "slurm-a100", PLANNERS,
                    SpecOptions(sweeps=["trainer.micro_batch_size=4,many"], profiles_dir=str(PROFILES), templates_dir=str(TEMPLATES)))


def test_a_file_in_the_way_is_a_clear_error_before_writing(tmp_path):
    project = make_project(tmp_path, BASIC)
    write(tmp_path / "manifests" / "slurm-a100", "a file where a profile directory goes\n")
    with pytest.raises(ConfigError, match="a file where it needs a directory"):
        compare(plan_project(load_project(project), PLANNERS))
    assert not (tmp_path / "manifests" / "k8s-h100").exists()


def test_diff_marks_a_missing_final_newline_and_crlf(tmp_path):
    project = make_project(tmp_path, BASIC)
    render_all(project)
    job = tmp_path / "manifests" / "slurm-a100" / "quickstart"
    spec = job / "spec.json"
    spec.write_bytes(spec.read_bytes().rstrip(b"\n"))
    script = job / "job.sbatch"
    script.write_bytes(script.read_bytes().replace(b"\n", b"\r\n"))
    diff = unified_diff(compare(plan_project(load_project(project), PLANNERS)), "manifests")
    assert "\\ No newline at end of file" in diff
    assert "line endings: the file on disk has CRLF" in diff
