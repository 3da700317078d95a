"""Command mode (spec ``entrypoint``): the spec rules, the command each backend launches, the
LightningCLI arguments, and what ``jobgen validate`` refuses. The rendered job.sbatch runs under
bash in tests/script/test_sbatch_script.py; real 2-rank runs are in tests/entrypoint/test_command_run.py."""

from __future__ import annotations

import json

import pytest
import yaml

from jobgen.backends import plan
from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir import ResolvedSpec
from jobgen.jobdir.world import World
from jobgen.planning.command import check_config_files, check_entrypoint_exists, trainer_args
from jobgen.planning.plan import JOB_DIR_PLACEHOLDER, SUBMIT_DIR_PLACEHOLDER, Command
from jobgen.specs.load import load_profile, validate
from jobgen.specs.training import TrainingSpec
from tests.conftest import EXAMPLES, PROFILES, TEMPLATES, write


def spec(**doc) -> TrainingSpec:
    return validate(TrainingSpec, {"name": "cmd", **doc}, "<t>")


def cmd_spec(entrypoint: dict | None = None, **doc) -> TrainingSpec:
    return spec(entrypoint={"script": "train.py", "args": ["--lr", "0.1"]} if entrypoint is None else entrypoint, **doc)


def planned(s: TrainingSpec, profile: str):
    return plan(s, load_profile(profile, PROFILES), TEMPLATES, spec_source="s.yaml")


# --------------------------------------------------------------------------- spec rules


@pytest.mark.parametrize(("section", "value"), [
    ("model", {"preset": "mini"}),
    ("data", {"max_bytes": 8192}),
    ("checkpoint", {"every_n_steps": 5}),
    ("trainer", {"max_steps": 500}),
    ("trainer", {"learning_rate": 0.1}),
])
def test_built_in_sections_set_explicitly_are_refused(section, value):
    with pytest.raises(ConfigError, match=r"entrypoint is set \(command mode.*would do nothing") as info:
        cmd_spec(**{section: value})
    assert "entrypoint.args" in str(info.value) and "resources" in str(info.value)


def test_the_fields_that_apply_are_kept():
    s = cmd_spec(trainer={"strategy": "deepspeed_stage_3", "precision": "bf16-mixed", "micro_batch_size": 2,
                          "gradient_accumulation_steps": 4, "offload_optimizer": "cpu", "gradient_clip_val": 0.5},
                 resources={"nodes": 2}, env={"NCCL_DEBUG": "INFO"}, secrets=["WANDB_API_KEY"])
    assert s.entrypoint is not None and s.trainer.micro_batch_size == 2


@pytest.mark.parametrize(("entrypoint", "message"), [
    ({"script": "t.py", "module": "pkg.t"}, "exactly one of module"),
    ({}, "exactly one of module"),
    ({"module": "pkg-train"}, "not a Python module name"),
    ({"script": "-rf"}, "must be a file path"),
    ({"script": "t.py", "args": ["a\nb"]}, "newlines"),
    ({"script": "t\r.py"}, "newlines"),
    ({"script": "t.py", "argz": []}, "argz"),
])
def test_bad_entrypoints_are_refused(entrypoint, message):
    with pytest.raises(ConfigError, match=message):
        cmd_spec(entrypoint)


def test_a_spec_without_entrypoint_serialises_as_before():
    assert "entrypoint" not in spec().model_dump()


def test_spec_json_of_a_command_job_reads_back(tmp_path):
    """spec.json leaves the built-in sections out, so reading it back does not trip the
    "explicitly set" refusal, and planning the read-back spec gives the same inputs hash."""
    job_plan = planned(cmd_spec(trainer={"strategy": "deepspeed_stage_2"}), "local")
    resolved = ResolvedSpec.model_validate_json(job_plan.file("spec.json"))
    raw = json.loads(job_plan.file("spec.json"))["spec"]
    assert not {"model", "data", "checkpoint"} & set(raw) and "max_steps" not in raw["trainer"]
    assert planned(resolved.spec, "local").inputs_sha256 == job_plan.inputs_sha256


# --------------------------------------------------------------------------- what each backend launches


def test_local_runs_torchrun_standalone_in_the_submit_dir():
    (step,) = planned(cmd_spec(), "local").submit_steps
    assert isinstance(step, Command) and step.cwd == SUBMIT_DIR_PLACEHOLDER
    assert step.argv == ("python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "--tee", "3", "train.py", "--lr", "0.1")
    env = dict(step.env)
    assert env["RUN_DIR"] == JOB_DIR_PLACEHOLDER and "PL_DEEPSPEED_CONFIG_PATH" not in env
    (ds,) = planned(cmd_spec({"module": "pkg.train"}, trainer={"strategy": "deepspeed_stage_2"}), "local").submit_steps
    assert ds.argv[-2:] == ("-m", "pkg.train")
    assert dict(ds.env)["PL_DEEPSPEED_CONFIG_PATH"] == f"{JOB_DIR_PLACEHOLDER}/ds_config.json"
    assert str(ds).startswith("cd '<submit dir>' && ")


def pod_container(job_plan, role: str = "Master") -> dict:
    docs = list(yaml.safe_load_all(job_plan.file("pytorchjob.yaml")))
    return docs[1]["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]


def test_kubernetes_runs_torchrun_in_each_pod_with_the_user_command():
    s = cmd_spec({"script": "train.py", "args": ["fit", "--name=$(HOME)"], "lightning_cli": True},
                 trainer={"strategy": "deepspeed_stage_2"}, resources={"nodes": 2})
    job_plan = planned(s, "k8s-h100")
    for role in ("Master", "Worker"):
        c = pod_container(job_plan, role)
        assert c["command"] == [
            "python", "-m", "torch.distributed.run", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)",
            "train.py", "fit", "--name=$$(HOME)",  # the kubelet would expand $(HOME); $$ keeps it literal
            "--trainer.num_nodes=2", "--trainer.devices=8", "--trainer.accelerator=gpu",
            "--trainer.strategy=deepspeed_stage_2", "--trainer.precision=bf16-mixed",
        ]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["PL_DEEPSPEED_CONFIG_PATH"] == "/etc/jobgen/ds_config.json"
        assert env["RUN_DIR"] == "/workspace/runs/cmd"
    docs = list(yaml.safe_load_all(job_plan.file("pytorchjob.yaml")))
    assert "ds_config.json" in docs[0]["data"]  # the ConfigMap mounted at /etc/jobgen carries it


def test_slurm_launch_line_and_submit_command():
    job_plan = planned(cmd_spec(), "slurm-a100")
    script = job_plan.file("job.sbatch")
    assert "jobgen.train" not in script and "jobgen-task python train.py --lr 0.1" in script
    assert "PL_DEEPSPEED_CONFIG_PATH" not in script
    (step,) = job_plan.submit_steps
    assert dict(step.env)["JOBGEN_WORKDIR"] == SUBMIT_DIR_PLACEHOLDER
    # the built-in entrypoint's submit command has no JOBGEN_WORKDIR
    (builtin,) = planned(spec(), "slurm-a100").submit_steps
    assert "JOBGEN_WORKDIR" not in dict(builtin.env)


def test_the_memory_estimate_is_not_shown_for_a_user_model():
    """The estimate is of the built-in GPT: a command job on a GPU profile has no fit warning."""
    job_plan = planned(cmd_spec(), "slurm-a100")
    assert not [w for w in job_plan.warnings if "GiB" in w]


# --------------------------------------------------------------------------- LightningCLI


def test_lightning_cli_gets_the_world_appended_after_the_user_args():
    s = cmd_spec({"script": "cli.py", "args": ["fit", "--config", "c.yaml"], "lightning_cli": True},
                 trainer={"strategy": "fsdp"}, resources={"nodes": 2, "devices_per_node": 4})
    script = planned(s, "slurm-a100").file("job.sbatch")
    assert ("python cli.py fit --config c.yaml --trainer.num_nodes=2 --trainer.devices=4 --trainer.accelerator=gpu "
            "--trainer.strategy=fsdp --trainer.precision=bf16-mixed") in script


@pytest.mark.parametrize(("strategy", "name"), [("ddp", "ddp"), ("fsdp", "fsdp"), ("deepspeed_stage_1", "deepspeed_stage_1"),
                                                ("deepspeed_stage_3", "deepspeed_stage_3")])
def test_strategy_names_are_lightning_registry_names(strategy, name):
    s = cmd_spec({"script": "c.py", "lightning_cli": True}, trainer={"strategy": strategy, "precision": "32-true"})
    assert f"--trainer.strategy={name}" in trainer_args(s, World(1, 2, "cpu"))


def test_resolved_precision_is_appended_never_auto():
    s = cmd_spec({"script": "c.py", "lightning_cli": True})
    (step,) = planned(s, "local").submit_steps
    assert "--trainer.precision=32-true" in step.argv and "--trainer.accelerator=cpu" in step.argv


def test_a_plain_script_gets_no_trainer_args():
    (step,) = planned(cmd_spec(), "local").submit_steps
    assert not [a for a in step.argv if a.startswith("--trainer.")]


@pytest.mark.parametrize("args", [["fit", "--trainer.devices=4"], ["fit", "--trainer.num_nodes", "3"],
                                  ["--trainer.precision=bf16-mixed"], ["--trainer.strategy=fsdp"]])
def test_trainer_args_in_entrypoint_args_that_contradict_the_world_are_refused(args):
    s = cmd_spec({"script": "c.py", "args": args, "lightning_cli": True})
    with pytest.raises(PlanError, match=r"You set `--trainer\.\w+=.*` in entrypoint.args, but the job runs") as info:
        planned(s, "local")
    assert info.value.location.startswith("s.yaml: entrypoint.args[") and "Remove it" in info.value.hint


def test_trainer_args_that_agree_are_accepted():
    s = cmd_spec({"script": "c.py", "args": ["fit", "--trainer.devices=2", "--trainer.precision=32"], "lightning_cli": True})
    planned(s, "local")


def lightning_spec(config: str) -> TrainingSpec:
    return cmd_spec({"script": "cli.py", "args": ["fit", "--config", config], "lightning_cli": True})


@pytest.mark.parametrize(("trainer", "field"), [
    ({"num_nodes": 4}, "num_nodes"),
    ({"devices": 8}, "devices"),
    ({"strategy": "fsdp"}, "strategy"),
    ({"precision": "bf16-mixed"}, "precision"),
    ({"accelerator": "gpu"}, "accelerator"),
])
def test_a_config_that_contradicts_the_world_is_refused_with_file_and_field(tmp_path, trainer, field):
    write(tmp_path / "cfg.yaml", yaml.safe_dump({"trainer": {"max_steps": 3, **trainer}}))
    with pytest.raises(PlanError, match=rf"cfg.yaml sets trainer.{field}: .*, but the job runs") as info:
        check_config_files(lightning_spec("cfg.yaml"), World(2, 2, "cpu"), tmp_path, "s.yaml")
    assert info.value.location == f"{tmp_path / 'cfg.yaml'}: trainer.{field}"
    assert f"Remove trainer.{field} from the config" in info.value.hint


def test_a_config_that_agrees_passes(tmp_path):
    s = spec(entrypoint={"script": "cli.py", "args": ["fit", "--config=cfg.yaml", "-c", "more.yaml"], "lightning_cli": True},
             trainer={"precision": "32-true"})
    write(tmp_path / "cfg.yaml", "trainer:\n  num_nodes: 1\n  devices: auto\n  precision: 32\n  strategy: ddp\n")
    write(tmp_path / "more.yaml", "model:\n  x: 1\n")
    assert check_config_files(s, World(1, 2, "cpu"), tmp_path) == [str(tmp_path / "cfg.yaml"), str(tmp_path / "more.yaml")]


def test_a_strategy_class_in_the_config_is_refused(tmp_path):
    write(tmp_path / "cfg.yaml", "trainer:\n  strategy:\n    class_path: lightning.pytorch.strategies.DDPStrategy\n")
    with pytest.raises(PlanError, match="sets trainer.strategy to a class"):
        check_config_files(lightning_spec("cfg.yaml"), World(1, 2, "cpu"), tmp_path)


def test_a_missing_config_is_refused(tmp_path):
    with pytest.raises(PlanError, match="cannot read the LightningCLI config"):
        check_config_files(lightning_spec("nope.yaml"), World(1, 2, "cpu"), tmp_path)


# --------------------------------------------------------------------------- entrypoint exists


def test_entrypoint_exists_script_and_module(tmp_path):
    write(tmp_path / "train.py", "")
    write(tmp_path / "mypkg" / "__init__.py", "raise SystemExit('imported!')\n")
    write(tmp_path / "mypkg" / "train.py", "raise SystemExit('imported!')\n")
    assert check_entrypoint_exists(cmd_spec(), tmp_path).startswith("script ")
    # find_spec of a top-level module imports nothing
    assert "mypkg" in check_entrypoint_exists(cmd_spec({"module": "mypkg"}), tmp_path)
    with pytest.raises(PlanError, match="does not exist"):
        check_entrypoint_exists(cmd_spec({"script": "other.py"}), tmp_path)
    with pytest.raises(PlanError, match="is not importable"):
        check_entrypoint_exists(cmd_spec({"module": "not_there_pkg.train"}), tmp_path)


# --------------------------------------------------------------------------- the CLI


def test_validate_refuses_a_contradicting_config_with_exit_2(run_cli, tmp_path):
    write(tmp_path / "cli.py", "")
    write(tmp_path / "cfg.yaml", "trainer:\n  num_nodes: 4\n")
    write(tmp_path / "s.yaml", "name: c\nentrypoint:\n  script: cli.py\n  args: [fit, --config, cfg.yaml]\n  lightning_cli: true\n"
          "resources:\n  nodes: 2\n")
    out = run_cli("validate", "s.yaml", "--profile", "slurm-cpu", cwd=tmp_path)
    assert out.code == 2, out.stdout + out.stderr
    assert "cfg.yaml: trainer.num_nodes" in out.stderr and "sets trainer.num_nodes: 4" in out.stderr
    assert "trainer.num_nodes=2" in out.stderr and "hint: Remove trainer.num_nodes from the config" in out.stderr
    write(tmp_path / "cfg.yaml", "trainer:\n  num_nodes: 2\n")
    ok = run_cli("validate", "s.yaml", "--profile", "slurm-cpu", cwd=tmp_path)
    assert ok.code == 0 and "LightningCLI config" in ok.stdout, ok.stderr


@pytest.mark.parametrize(("entrypoint", "message"), [("script: missing.py", "entrypoint.script 'missing.py' does not exist"),
                                                      ("module: no_such_pkg_xyz.train", "is not importable")])
def test_validate_refuses_a_missing_entrypoint_with_exit_2(run_cli, tmp_path, entrypoint, message):
    write(tmp_path / "s.yaml", f"name: c\nentrypoint:\n  {entrypoint}\n")
    for args in ((), ("--profile", "local")):
        out = run_cli("validate", "s.yaml", *args, cwd=tmp_path)
        assert out.code == 2 and message in out.stderr and "hint:" in out.stderr, out.stderr


def test_render_stdout_shows_the_exact_command(run_cli):
    out = run_cli("render", str(EXAMPLES / "command-ddp.yaml"), "--profile", "local", "--stdout")
    assert out.code == 0, out.stderr
    assert ("cd '<submit dir>' && OMP_NUM_THREADS=1 RUN_DIR='<job dir>' python -m torch.distributed.run --standalone "
            "--nproc-per-node 2 --tee 3 examples/scripts/ddp_allreduce.py --steps 3") in out.stdout


def test_plan_refuses_command_mode(run_cli):
    out = run_cli("plan", str(EXAMPLES / "command-ddp.yaml"), "--profile", "slurm-a100")
    assert out.code == 2 and "cannot estimate memory" in out.stderr
