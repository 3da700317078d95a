"""Credentials never sit in a rendered file, on any scheduler (jobgen.planning.environment).

- ``env`` names that look like credentials are refused at plan time for SLURM, local and
  Kubernetes profiles, in the spec's env and in the profile's env, each with the file + field
  path and a hint to the mechanism of that scheduler; one sample name per word and suffix of
  the lists, written out here so that dropping an entry from the lists turns a test red.
- ``secrets`` (names only): its rules at plan time (one source, not a launcher's variable,
  mapped to a Secret on Kubernetes, SLURM ``--export`` passes it on), a value set in the
  environment never appears in any rendered file, and a local run passes it to torchrun
  through the environment and refuses to start without it. (SLURM submit through fake sbatch:
  tests/unit/test_slurm_offline.py; the batch script under bash: tests/script.)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobgen import api
from jobgen.backends import get_backend, plan
from jobgen.backends.base import SubmitOptions
from jobgen.backends.local import LocalBackend
from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir import SUBMISSION_FILE
from jobgen.planning.environment import SECRET_SUFFIXES, SECRET_WORDS, looks_secret
from jobgen.specs.load import load_profile, validate
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import TrainingSpec
from tests.conftest import PROFILES, TEMPLATES, write

#: One realistic name per pattern, caught by that entry of the lists alone. Written out (not
#: derived from the lists): removing ``_API_KEY`` from SECRET_SUFFIXES must fail these tests.
CREDENTIAL_SAMPLES = {
    "HF_TOKEN": "TOKEN",
    "OAUTH_CLIENT_SECRET": "SECRET",
    "DB_PASSWORD": "PASSWORD",
    "SMTP_PASSWD": "PASSWD",
    "GPG_PASSPHRASE": "PASSPHRASE",
    "OPENAI_APIKEY": "APIKEY",
    "SERVICE_CREDENTIAL": "CREDENTIAL",
    "GOOGLE_APPLICATION_CREDENTIALS": "CREDENTIALS",
    "WANDB_API_KEY": "_API_KEY",
    "MINIO_ACCESS_KEY": "_ACCESS_KEY",
    "SSH_PRIVATE_KEY": "_PRIVATE_KEY",
    "PUSHER_AUTH_KEY": "_AUTH_KEY",
}
#: Names that only resemble credentials (whole words count, not substrings).
LOOKALIKES = ["TOKENIZERS_PARALLELISM", "MAX_TOKENS", "KEYBOARD_LAYOUT", "SECRETARY_EMAIL", "NCCL_SOCKET_IFNAME"]
#: A profile of each scheduler.
SCHEDULERS = {"slurm": "slurm-cpu", "local": "local", "kubernetes": "k8s-a100"}
MARKER = "mArKeR-9f3c-secret-value"


@functools.cache
def _profile_doc(name: str) -> dict[str, Any]:
    return load_profile(name, PROFILES).model_dump()


def plan_job(profile: str, spec: dict[str, Any] | None = None, *, profile_env: dict[str, str] | None = None,
             **profile_fields: Any):
    """Plan ``spec`` (name ``job``) on the shipped ``profile`` with ``profile_env`` added to its env
    and ``profile_fields`` merged into its sections; sources ``spec.yaml`` / ``site.yaml``."""
    doc = json.loads(json.dumps(_profile_doc(profile)))
    doc["env"] = {**doc["env"], **(profile_env or {})}
    for key, value in profile_fields.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
    training = validate(TrainingSpec, {"name": "job", **(spec or {})}, "spec.yaml")
    return plan(training, validate(ClusterProfile, doc, "site.yaml"), TEMPLATES, spec_source="spec.yaml", profile_source="site.yaml")


# --------------------------------------------------------------------------- the name rule


def test_every_word_and_suffix_has_a_sample_that_only_it_catches():
    assert set(CREDENTIAL_SAMPLES.values()) == SECRET_WORDS | set(SECRET_SUFFIXES), "a pattern without a sample here"
    for name, entry in CREDENTIAL_SAMPLES.items():
        assert looks_secret(name) and looks_secret(name.lower()), name
        if entry.startswith("_"):
            assert not looks_secret(name, suffixes=[s for s in SECRET_SUFFIXES if s != entry]), f"{entry} is not needed for {name}"
        else:
            assert not looks_secret(name, words=SECRET_WORDS - {entry}), f"{entry} is not needed for {name}"


@pytest.mark.parametrize("name", LOOKALIKES)
def test_lookalikes_are_not_credentials(name):
    assert not looks_secret(name)


# --------------------------------------------------------------------------- env refusals


@pytest.mark.parametrize("origin", ["spec", "profile"])
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
@pytest.mark.parametrize("name", list(CREDENTIAL_SAMPLES))
def test_a_credential_in_env_is_refused_on_every_scheduler(name, scheduler, origin):
    spec_env, profile_env = ({name: "v"}, None) if origin == "spec" else ({}, {name: "v"})
    with pytest.raises(PlanError, match="looks like a credential") as info:
        plan_job(SCHEDULERS[scheduler], {"env": spec_env}, profile_env=profile_env)
    error = info.value
    assert error.location == f"{'spec' if origin == 'spec' else 'site'}.yaml: env.{name}" and error.exit_code == 2
    if scheduler == "kubernetes":
        assert f"kubernetes.secret_env: {{{name}: {{secret: <Secret name>, key: <key>}}}}" in error.hint
    else:
        assert f"`secrets: [{name}]`" in error.hint and f"export {name}" in error.hint


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_tokenizers_parallelism_is_not_a_credential(scheduler):
    job_plan = plan_job(SCHEDULERS[scheduler], {"env": {"TOKENIZERS_PARALLELISM": "false"}},
                        profile_env={"TOKENIZERS_PARALLELISM": "true"})
    assert any('"TOKENIZERS_PARALLELISM": "false"' in text for _, text in job_plan.files)  # spec.json, at least


def test_cli_refuses_a_credential_in_a_slurm_spec_with_exit_2(run_cli, tmp_path):
    spec = write(tmp_path / "spec.yaml", yaml.safe_dump({"name": "j", "env": {"WANDB_API_KEY": MARKER}}))
    out = run_cli("render", str(spec), "-p", "slurm-cpu", "--out", str(tmp_path / "m"))
    assert out.code == 2, out.stderr
    assert f"{spec}: env.WANDB_API_KEY" in out.stderr and "secrets: [WANDB_API_KEY]" in out.stderr and "hint:" in out.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("output", ["text", "json"])
def test_validate_without_a_profile_refuses_a_credential_in_env(run_cli, tmp_path, output):
    """The credential rule does not depend on a profile: `validate SPEC` once said "valid spec"
    for what render and submit refuse."""
    spec = write(tmp_path / "spec.yaml", yaml.safe_dump({"name": "j", "env": {"HF_TOKEN": MARKER, "TOKENIZERS_PARALLELISM": "false"}}))
    out = run_cli("validate", str(spec), "-o", output)
    assert out.code == 2, out.stdout + out.stderr
    assert "valid spec" not in out.stdout and MARKER not in out.stdout + out.stderr
    if output == "json":
        error = json.loads(out.stdout)
        assert error["location"] == f"{spec}: env.HF_TOKEN" and error["exit_code"] == 2, error
        assert "`secrets: [HF_TOKEN]`" in error["hint"] and "kubernetes.secret_env" in error["hint"], error
    else:
        assert f"{spec}: env.HF_TOKEN" in out.stderr and "looks like a credential" in out.stderr and "hint:" in out.stderr
    fine = write(tmp_path / "fine.yaml", yaml.safe_dump({"name": "j", "env": {"TOKENIZERS_PARALLELISM": "false"}}))
    assert run_cli("validate", str(fine)).code == 0


# --------------------------------------------------------------------------- secrets at plan time


@pytest.mark.parametrize(("secrets", "fragment"), [
    (["1BAD"], "is not a valid name"),
    (["HF_TOKEN=abc"], "secrets lists names only"),
    (["HF_TOKEN", "HF_TOKEN"], "HF_TOKEN listed more than once"),
])
def test_bad_secret_names_are_config_errors(secrets, fragment):
    with pytest.raises(ConfigError, match="invalid configuration") as info:
        validate(TrainingSpec, {"name": "j", "secrets": secrets}, "spec.yaml")
    assert fragment in str(info.value) and "secrets" in str(info.value)


@pytest.mark.parametrize(("profile", "spec", "profile_env", "fragment"), [
    ("slurm-cpu", {"env": {"MY_KEY": "x"}}, None, "the spec's env (env.MY_KEY) also sets"),
    ("local", {}, {"MY_KEY": "x"}, "the profile's env (site.yaml: env.MY_KEY) also sets"),
    ("slurm-a100", {}, None, "the NCCL preset of network_fabric infiniband"),
    ("slurm-cpu", {}, None, "the launcher"),
])
def test_a_secret_has_one_source(profile, spec, profile_env, fragment):
    name = "NCCL_IB_DISABLE" if "NCCL" in fragment else "MASTER_ADDR" if "launcher" in fragment else "MY_KEY"
    with pytest.raises(PlanError) as info:
        plan_job(profile, {**spec, "secrets": ["OTHER", name]}, profile_env=profile_env)
    assert fragment in info.value.message and info.value.location == "spec.yaml: secrets[1]" and info.value.hint


@pytest.mark.parametrize("name", ["MASTER_PORT", "RANK", "OMP_NUM_THREADS", "RUN_DIR", "PET_NNODES", "SLURM_JOB_ID",
                                  "SLURM_EXPORT_ENV", "PYTHONPATH"])
def test_a_secret_cannot_be_a_variable_the_launch_sets(name):
    with pytest.raises(PlanError, match="sets in every rank"):
        plan_job("slurm-cpu", {"secrets": [name]})


def test_spec_json_names_the_secrets_and_omits_the_field_when_empty():
    spec_json = json.loads(plan_job("slurm-cpu", {"secrets": ["WANDB_API_KEY"]}).file("spec.json"))
    assert spec_json["spec"]["secrets"] == ["WANDB_API_KEY"]
    assert "secrets" not in json.loads(plan_job("slurm-cpu").file("spec.json"))["spec"]  # hashes of older specs stay


def test_kubernetes_secrets_must_be_mapped_by_secret_env():
    with pytest.raises(PlanError, match="maps no Secret") as info:
        plan_job("k8s-a100", {"secrets": ["HF_TOKEN"]})
    assert info.value.location == "spec.yaml: secrets[0]"
    assert "kubernetes.secret_env: {HF_TOKEN: {secret: <Secret name>, key: <key>}}" in info.value.hint
    job_plan = plan_job("k8s-a100", {"secrets": ["HF_TOKEN"]}, kubernetes={"secret_env": {"HF_TOKEN": {"secret": "hf", "key": "token"}}})
    assert 'secretKeyRef' in job_plan.file("pytorchjob.yaml") and '"HF_TOKEN"' in job_plan.file("pytorchjob.yaml")


@pytest.mark.parametrize(("field", "args", "secrets", "fragment"), [
    ("extra_sbatch_args", ["--export=NONE"], ["WANDB_API_KEY"], "--export=NONE does not pass the spec's secrets WANDB_API_KEY"),
    ("extra_sbatch_args", ["--export=PATH,HOME"], ["WANDB_API_KEY", "HF_TOKEN"], "WANDB_API_KEY, HF_TOKEN"),
    ("extra_sbatch_args", ["--export=ALL,HF_TOKEN=hf_abc"], [], "--export entry HF_TOKEN=... looks like a credential"),
    ("extra_srun_args", ["--export", "NIL"], ["HF_TOKEN"], "--export=NIL does not pass"),
    ("extra_srun_args", ["--export=PATH,WANDB_API_KEY=k"], [], "looks like a credential"),
])
def test_slurm_export_must_pass_the_secrets_and_hold_no_credential(field, args, secrets, fragment):
    with pytest.raises(PlanError) as info:
        plan_job("slurm-cpu", {"secrets": secrets}, slurm={field: args})
    assert fragment in info.value.message and info.value.location == f"site.yaml: slurm.{field}" and info.value.hint


@pytest.mark.parametrize("export", ["--export=ALL", "--export=ALL,FOO=bar", "--export=PATH,WANDB_API_KEY", "--export=NONE"])
def test_slurm_exports_that_pass_the_secrets_are_kept(export):
    secrets = [] if export.endswith("NONE") else ["WANDB_API_KEY"]  # no secrets: NONE stays the site's business
    script = plan_job("slurm-cpu", {"secrets": secrets}, slurm={"extra_sbatch_args": [export]}).file("job.sbatch")
    assert f"#SBATCH {export}\n" in script


# --------------------------------------------------------------------------- values never written


def _secrets_case(tmp_path: Path, profile: str) -> tuple[Path, str]:
    spec = write(tmp_path / "spec.yaml", yaml.safe_dump({"name": "sec", "secrets": ["WANDB_API_KEY", "HF_TOKEN"]}))
    if profile.startswith("k8s"):
        refs = {name: {"secret": "creds", "key": name.lower()} for name in ("WANDB_API_KEY", "HF_TOKEN")}
        profile = str(write(tmp_path / "site.yaml", yaml.safe_dump({"extends": str(PROFILES / f"{profile}.yaml"),
                                                                     "kubernetes": {"secret_env": refs}})))
    return spec, profile


@pytest.mark.parametrize("profile", ["slurm-cpu", "local", "k8s-a100"])
def test_a_secrets_value_is_in_no_rendered_file(run_cli, tmp_path, monkeypatch, profile):
    monkeypatch.setenv("WANDB_API_KEY", MARKER)
    monkeypatch.setenv("HF_TOKEN", MARKER + "-hf")
    spec, profile_arg = _secrets_case(tmp_path, profile)
    out = tmp_path / "manifests"
    rendered = run_cli("render", str(spec), "-p", profile_arg, "--out", str(out))
    shown = run_cli("render", str(spec), "-p", profile_arg, "--stdout")
    assert rendered.code == 0 and shown.code == 0, rendered.stderr + shown.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and any(p.name == "spec.json" and "WANDB_API_KEY" in p.read_text() for p in files)
    for path in files:
        assert MARKER.encode() not in path.read_bytes(), f"a secret's value was written into {path}"
    assert MARKER not in rendered.stdout + rendered.stderr + shown.stdout + shown.stderr


# --------------------------------------------------------------------------- local submit


def _local_job(tmp_path: Path):
    spec, _ = _secrets_case(tmp_path, "local")
    job_plan = api.plan_job(spec, "local")
    options = SubmitOptions(runs_dir=tmp_path / "runs")
    backend = get_backend("local")
    job_dir = backend.job_dir(job_plan, tmp_path, options)
    job_plan.write(job_dir)
    return backend, job_plan, job_dir, options


def test_local_run_gets_the_secrets_through_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("WANDB_API_KEY", MARKER)
    monkeypatch.setenv("HF_TOKEN", MARKER + "-hf")
    backend, job_plan, job_dir, options = _local_job(tmp_path)
    ran: list[dict[str, str]] = []
    result = LocalBackend(runner=lambda argv, cwd, env: ran.append(env) or 0).submit(job_dir, options, lambda _: None, plan=job_plan)
    assert result.action == "completed"
    assert ran[0]["WANDB_API_KEY"] == MARKER and ran[0]["HF_TOKEN"] == MARKER + "-hf"
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):
        assert MARKER.encode() not in path.read_bytes(), f"a secret's value was written into {path}"


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_local_run_refuses_to_start_without_a_secret(tmp_path, monkeypatch, value):
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HF_TOKEN", "hf")
    if value is None:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    else:
        monkeypatch.setenv("WANDB_API_KEY", value)
    backend, job_plan, job_dir, options = _local_job(tmp_path)
    ran: list[list[str]] = []
    with pytest.raises(ConfigError, match=r"secret WANDB_API_KEY of the spec \(`secrets`\) is not set") as info:
        LocalBackend(runner=lambda argv, cwd, env: ran.append(argv) or 0).submit(job_dir, options, lambda _: None, plan=job_plan)
    assert info.value.exit_code == 2 and "export WANDB_API_KEY=..." in info.value.hint and "HF_TOKEN" not in info.value.message
    assert info.value.location == f"{job_plan.spec_file}: secrets"  # the user's file, not the rendered spec.json
    assert ran == [] and not (job_dir / SUBMISSION_FILE).exists()
    with pytest.raises(ConfigError) as info:  # a job directory submitted as is: its spec.json is the input
        LocalBackend(runner=lambda argv, cwd, env: ran.append(argv) or 0).submit(job_dir, options, lambda _: None)
    assert info.value.location == f"{job_dir.resolve() / 'spec.json'}: spec.secrets"
