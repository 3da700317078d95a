"""`jobgen.api.executor`: submitit's SlurmExecutor configured from a profile (jobgen/backends/slurm/submitit_executor.py).

The script submitit would submit is compared with the ``job.sbatch`` jobgen renders from the same
profile: partition, account, QoS, constraint, the GPU request in the profile's style, memory,
time limit, requeue and signal must agree (both sides computed, nothing typed in). Submitting
runs against the fake SLURM commands (tests/fakes/slurm): the submission record, ``jobgen ls``
and ``status`` of a callable, job arrays, ``--clusters``, and sbatch's refusal. The real-cluster
counterpart is tests/integration/slurm/test_submitit_on_lab.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

submitit = pytest.importorskip("submitit", reason="submitit not installed (pip install -e .[submitit])")

from jobgen import api  # noqa: E402
from jobgen.backends.slurm import submitit_executor as slurm_submitit  # noqa: E402
from jobgen.backends.slurm.script import container_srun_options, format_time_limit  # noqa: E402
from jobgen.errors import ConfigError, NotSupportedError, SubmitError  # noqa: E402
from jobgen.jobdir import SBATCH_FILE, SUBMISSION_FILE, Submission  # noqa: E402
from jobgen.specs.load import load_profile  # noqa: E402
from tests.conftest import EXAMPLES, REPO  # noqa: E402
from tests.fakes.slurm.fakeslurm import SACCT_NO_ACCOUNTING, SQUEUE_INVALID_JOB, json_reply, reply, squeue_22_05, squeue_merged  # noqa: E402

#: Options both scripts must write alike (time: compared in minutes, below).
SITE_OPTIONS = ("partition", "account", "qos", "constraint", "exclusive", "requeue", "signal", "gres", "gpus-per-node",
                "gpus-per-task", "ntasks", "mem", "nodes", "ntasks-per-node", "cpus-per-task")

#: A site with every option set, GPUs per task (extends the shipped slurm-a100).
SITE_PROFILE = """\
extends: slurm-a100
slurm:
  account: proj-42
  qos: high
  constraint: "a100&ib"
  gpu_request_style: gpus-per-task
  requeue_signal: USR1
  signal_grace_s: 300
  modules: [cuda/12.4, nccl]
"""


def directives(script: str) -> dict[str, str | None]:
    """``#SBATCH --opt[=value]`` lines of a script as ``{opt: value}`` (shell quotes removed)."""
    out: dict[str, str | None] = {}
    for line in script.splitlines():
        match = re.fullmatch(r"#SBATCH --([a-z-]+)(?:=(.*))?", line)
        if match:
            out[match.group(1)] = None if match.group(2) is None else shlex.split(match.group(2))[0]
    return out


def minutes(value: str) -> int:
    """A ``--time`` value (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``) in minutes."""
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        return int(days or 0) * 1440 + parts[0]
    hours, mins = parts[0], parts[1]
    return int(days or 0) * 1440 + hours * 60 + mins


@pytest.fixture(autouse=True)
def fresh_watcher():
    """submitit's watcher is a class attribute: each test starts with none of the others' jobs."""
    watcher = slurm_submitit._executor_class().job_class.watcher
    yield watcher
    watcher.clear()
    watcher._registered.clear()
    watcher.submitted.clear()


@pytest.fixture
def profiles(tmp_path) -> Path:
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "site-x.yaml").write_text(SITE_PROFILE)
    return d


@pytest.fixture
def fake_srun(slurm):
    """submitit refuses to make a SlurmExecutor where ``srun`` is not on PATH; the fakes have none."""
    srun = slurm.bin / "srun"
    srun.write_text("#!/bin/sh\necho 'fake srun: not for running' >&2\nexit 97\n")
    srun.chmod(0o755)
    return slurm


def submitit_script(ex) -> str:
    """The sbatch script submitit writes for ``ex`` (its own method, as at submission)."""
    return ex._make_submission_file_text(ex._submitit_command_str, "uid")


@pytest.mark.parametrize("profile", ["slurm-a100", "slurm-h100", "slurm-cpu", "site-x"])
def test_the_executor_requests_what_the_rendered_job_requests(fake_srun, profiles, tmp_path, profile):
    """Same world (nodes, tasks = devices per node, CPUs per task) -> the same site options as job.sbatch."""
    plan = api.plan_job(EXAMPLES / "quickstart.yaml", profile, profiles_dir=profiles)
    rendered = directives(dict(plan.files)[SBATCH_FILE])
    world = plan.world
    gpus = world.devices_per_node if world.accelerator == "gpu" else 0
    ex = api.executor(profile, folder=tmp_path / "sub" / "%j", profiles_dir=profiles, nodes=world.num_nodes,
                      tasks_per_node=world.devices_per_node, gpus_per_node=gpus, cpus_per_task=world.cpus_per_rank)
    written = directives(submitit_script(ex))
    assert {k: written.get(k, "<absent>") for k in SITE_OPTIONS} == {k: rendered.get(k, "<absent>") for k in SITE_OPTIONS}
    assert minutes(written["time"]) == minutes(rendered["time"])
    # and the fields really came from the profile (not two empty sides agreeing)
    s = load_profile(profile, profiles).slurm_settings
    assert written.get("partition") == s.partition and written.get("account") == s.account and written.get("qos") == s.qos
    assert written["signal"] == f"{s.requeue_signal}@{s.signal_grace_s}"


def test_defaults_are_one_task_on_one_node_with_the_profiles_node(fake_srun, tmp_path):
    p = load_profile("slurm-a100")
    written = directives(submitit_script(api.executor("slurm-a100", folder=tmp_path / "%j")))
    s = p.slurm_settings
    assert (written["nodes"], written["ntasks-per-node"], written["cpus-per-task"]) == ("1", "1", str(p.cpus_per_node))
    assert written["gres"] == f"gpu:{s.gres_gpu_type}:{p.gpus_per_node}"
    assert minutes(written["time"]) == minutes(format_time_limit(s.time_limit_min))


def test_the_job_catches_the_profiles_signal_with_submitits_handler(fake_srun, profiles, tmp_path):
    """The script's setup exports SUBMITIT_PREEMPT_SIGNAL; submitit imported after it (as in the job)
    binds its checkpoint-and-requeue handler to the profile's signal, which --signal sends."""
    s = load_profile("site-x", profiles).slurm_settings
    script = submitit_script(api.executor("site-x", folder=tmp_path / "%j", profiles_dir=profiles))
    setup = script.split("# setup\n", 1)[1].split("\n\n", 1)[0]
    probe = f"{setup}\nexec {shlex.quote(sys.executable)} -c " + shlex.quote(
        "from submitit.core.job_environment import JobEnvironment as E; print(E._usr_sig().name)")
    env = {k: v for k, v in os.environ.items() if k != slurm_submitit.PREEMPT_SIGNAL_ENV}
    out = subprocess.run(["bash", "-c", probe.replace("module ", ": module ")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"SIG{s.requeue_signal}" != "SIGUSR2"  # not submitit's default
    assert directives(script)["signal"] == f"{s.requeue_signal}@{s.signal_grace_s}"
    assert [f"module load {m}" for m in s.modules] == [line for line in setup.splitlines() if line.startswith("module load")]


def test_the_fabric_environment_and_the_profiles_env_reach_the_job(fake_srun, tmp_path):
    from jobgen.planning.nccl import nccl_env

    p = load_profile("slurm-a100", overrides=["env.MY_SITE_VAR=a b"])
    ex = slurm_submitit.make_executor(p, {}, profile_source="slurm-a100", folder=tmp_path / "%j")
    exports = dict(line[len("export "):].split("=", 1) for line in submitit_script(ex).splitlines() if line.startswith("export "))
    expected = {**nccl_env(p.network_fabric, uses_nccl=True), "MY_SITE_VAR": "a b"}
    assert {k: shlex.split(exports[k])[0] for k in expected} == expected
    cpu = slurm_submitit.plan_executor(p, {"gpus_per_node": 0}, profile_source="slurm-a100")
    assert not any("NCCL" in line for line in cpu.parameters["setup"])  # no GPUs, no NCCL preset


def test_pyxis_flags_go_on_srun_and_apptainer_wraps_the_interpreter(fake_srun, tmp_path):
    h100 = load_profile("slurm-h100")
    srun_line = next(line for line in submitit_script(api.executor("slurm-h100", folder=tmp_path / "%j")).splitlines()
                     if line.startswith("srun "))
    assert all(shlex.quote(opt) in srun_line for opt in container_srun_options(h100.slurm_settings))
    assert srun_line.endswith(f" {h100.slurm_settings.python} -u -m submitit.core._submit {shlex.quote(str(tmp_path / '%j'))}")
    app = load_profile("slurm-a100", overrides=["slurm.container.runtime=apptainer", "slurm.container.image=/img/pt.sif"])
    plan = slurm_submitit.plan_executor(app, {}, profile_source="x")
    assert shlex.split(plan.python) == ["apptainer", "exec", "--nv", "/img/pt.sif", app.slurm_settings.python]
    assert slurm_submitit.plan_executor(load_profile("slurm-a100"), {}, profile_source="x").python == shlex.quote(sys.executable)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"gpus_per_nodes": 1}, r"gpus_per_nodes: unknown executor override \(did you mean 'gpus_per_node'\?\)"),
    ({"nodes": 0}, r"nodes=0: Input should be greater than or equal to 1"),
    ({"nodes": 17}, r"nodes=17, but profile 'slurm-a100' allows at most 16"),
    ({"gpus_per_node": 9}, r"gpus_per_node=9, but a node of profile 'slurm-a100' has 8 GPU"),
    ({"time_limit_min": 3000}, r"time_limit_min=3000, but partition gpu .* allows 2880 min"),
    ({"time_limit_min": 2}, r"SIGUSR2 would arrive before the callable starts"),
    ({"partition": "gpu\n#SBATCH --qos=top"}, r"partition: Value error, newlines"),
    ({"name": "a\nb"}, r"name=.*newlines"),
    ({"tasks_per_node": 3, "cpus_per_task": 64}, r"3 task\(s\) x 64 CPU\(s\) per node"),
])
def test_bad_overrides_are_config_errors_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match) as info:
        slurm_submitit.plan_executor(load_profile("slurm-a100"), overrides, profile_source="slurm-a100")
    assert info.value.hint


def test_a_batch_only_signal_is_refused_unless_overridden():
    p = load_profile("slurm-a100", overrides=["slurm.signal_target=batch"])
    with pytest.raises(ConfigError, match="signal_target: batch") as info:
        slurm_submitit.plan_executor(p, {}, profile_source="slurm-a100")
    assert "signal_target='tasks'" in info.value.hint and info.value.location.endswith("slurm.signal_target")
    plan = slurm_submitit.plan_executor(p, {"signal_target": "tasks"}, profile_source="slurm-a100")
    assert dict(plan.directives)["signal"] == "USR2@120"  # no B:


def test_a_kubernetes_profile_and_a_missing_srun_or_submitit_are_clear_errors(slurm, monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="schedules with kubernetes"):
        api.executor("k8s-a100")
    monkeypatch.setenv("PATH", str(slurm.bin))  # the fakes, without srun
    with pytest.raises(SubmitError, match="srun") as info:
        api.executor("slurm-a100", folder=tmp_path / "%j")
    assert "login node" in info.value.hint
    for name in [m for m in sys.modules if m == "submitit" or m.startswith("submitit.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    slurm_submitit._executor_class.cache_clear()
    try:
        with pytest.raises(ConfigError, match="needs submitit") as info:
            api.executor("slurm-a100")
        assert info.value.hint == "pip install 'jobgen[submitit]'"
    finally:
        monkeypatch.undo()
        slurm_submitit._executor_class.cache_clear()


def add(a: int, b: int) -> int:
    return a + b


def test_a_submitted_callable_is_recorded_listed_and_watched_through_jobgen(fake_srun, run_cli, tmp_path):
    slurm = fake_srun
    slurm.respond("sbatch", reply("Submitted batch job 4242\n"))
    ex = api.executor("slurm-cpu", folder=tmp_path / "sub" / "%j", time_limit_min=5)
    job = ex.submit(add, 2, 3)
    assert job.job_id == "4242"
    handle = f"slurm://{load_profile('slurm-cpu').slurm_settings.cluster}/4242"
    record = Submission.load(tmp_path / "sub" / "4242" / SUBMISSION_FILE)
    assert (record.handle, record.callable.function, record.callable.num_nodes) == (handle, f"{__name__}.add", 1)
    assert record.log_file == str(job.paths.stdout) and record.argv[0] == "sbatch"
    # jobgen ls / status read it without a spec.json
    slurm.respond("squeue", json_reply(squeue_22_05(4242, "RUNNING", name="submitit", nodes="node1")))
    listed = json.loads(run_cli("ls", "-o", "json").stdout)
    assert [(r["handle"], r["name"], r["state"], r["num_nodes"], r["devices_per_node"], r["accelerator"], r["stale"])
            for r in listed] == [(handle, "add", "RUNNING", 1, 1, "cpu", None)]
    assert "add" in run_cli("ls").stdout
    assert json.loads(run_cli("status", "-o", "json", str(tmp_path / "sub" / "4242")).stdout)["state"] == "RUNNING"
    # submitit's job.done()/state ask jobgen's status (squeue), not sacct alone: a job that ended without a result is done
    slurm.respond("squeue", json_reply(squeue_22_05(4242, "FAILED", name="submitit", nodes="node1", exit_status=256)))
    assert job.done(force_check=True) and job.state == "FAILED"
    assert not any(argv[0] == "sacct" for argv in slurm.argvs())


def test_a_job_array_is_one_recorded_job_with_its_tasks(fake_srun, run_cli, tmp_path):
    slurm = fake_srun
    slurm.respond("sbatch", reply("Submitted batch job 77\n"))
    ex = api.executor("slurm-cpu", folder=tmp_path / "sub" / "%j", time_limit_min=5)
    jobs = ex.map_array(add, [1, 2], [10, 20])
    assert [j.job_id for j in jobs] == ["77_0", "77_1"]
    record = Submission.load(tmp_path / "sub" / "77" / SUBMISSION_FILE)
    assert "#SBATCH --array=0-1%2" in Path(record.argv[1]).read_text().splitlines()
    slurm.respond("squeue", json_reply(squeue_merged(squeue_22_05(77, "COMPLETED", array_job_id=77, array_task_id=0),
                                                     squeue_22_05(78, "RUNNING", array_job_id=77, array_task_id=1))))
    [row] = json.loads(run_cli("ls", "-o", "json").stdout)
    assert (row["name"], [(t["index"], t["name"], t["state"]) for t in row["tasks"]]) == \
        ("add", [(0, "add_0", "COMPLETED"), (1, "add_1", "RUNNING")])
    assert row["tasks"][1]["run_dir"] == str(jobs[1].paths.folder)


def test_a_job_array_with_another_interpreter_is_refused_before_sbatch(fake_srun, tmp_path):
    ex = api.executor("slurm-cpu", folder=tmp_path / "%j", python="/opt/py/bin/python")
    with pytest.raises(NotSupportedError, match="job array"):
        ex.map_array(add, [1, 2], [3, 4])
    assert fake_srun.argvs("sbatch") == []


def test_clusters_from_the_profile_name_the_handle_and_every_later_command(fake_srun, run_cli, tmp_path):
    slurm = fake_srun
    p = load_profile("slurm-cpu", overrides=["slurm.extra_sbatch_args=[--clusters=gpu-b]"])
    ex = slurm_submitit.make_executor(p, {"time_limit_min": 5}, profile_source="slurm-cpu", folder=tmp_path / "%j")
    assert directives(submitit_script(ex))["clusters"] == "gpu-b"
    slurm.respond("sbatch", reply("Submitted batch job 9 on cluster gpu-b\n"))
    ex.submit(add, 1, 1)
    slurm.respond("squeue", SQUEUE_INVALID_JOB)
    slurm.respond("sacct", SACCT_NO_ACCOUNTING)
    slurm.respond("sacct -c", reply(""))
    assert json.loads(run_cli("status", "-o", "json", "slurm://gpu-b/9").stdout)["state"] == "UNKNOWN"
    assert all("--clusters=gpu-b" in argv for argv in slurm.argvs() if argv[0] != "sbatch")


def test_sbatch_refusing_is_a_submit_error_with_slurms_message(fake_srun, tmp_path, capfd):
    """sbatch's message once (in the error, not printed before it too), and
    nothing of the call left in submitit's folder (no pickle, no submission script)."""
    fake_srun.respond("sbatch", reply(stderr="sbatch: error: invalid partition specified: gpu\n", rc=1))
    folder = tmp_path / "sub"
    (folder / "keep.txt").parent.mkdir()
    (folder / "keep.txt").write_text("not submitit's")
    ex = api.executor("slurm-a100", folder=folder / "%j", partition="gpu-site")
    capfd.readouterr()
    with pytest.raises(SubmitError, match="invalid partition specified: gpu") as info:
        ex.submit(add, 1, 2)
    printed = capfd.readouterr()
    assert "invalid partition" not in printed.out + printed.err, printed
    assert "above" not in (info.value.hint or ""), info.value.hint
    assert not list((tmp_path / "state").glob("*/*.json"))  # nothing recorded
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]  # no .pkl, no .submission_file_*.sh
    with pytest.raises(SubmitError):  # a job array too
        ex.map_array(add, [1, 2], [3, 4])
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_a_refused_submit_into_a_new_folder_leaves_no_folder(fake_srun, tmp_path):
    fake_srun.respond("sbatch", reply(stderr="sbatch: error: Batch job submission failed\n", rc=1))
    ex = api.executor("slurm-a100", folder=tmp_path / "runs" / "submitit" / "%j", partition="gpu-site")
    with pytest.raises(SubmitError):
        ex.submit(add, 1, 2)
    assert not (tmp_path / "runs" / "submitit").exists()


def test_a_shared_node_gets_the_cpus_and_memory_of_the_gpus_asked_for(fake_srun, tmp_path):
    """On a profile with `exclusive: false` (or the override), a job of 1 of
    a node's 8 GPUs asks for 1/8 of its CPUs and memory, not the whole node; no GPU: one GPU's
    share; an exclusive node, or every GPU, the whole node; explicit values stand."""
    p = load_profile("slurm-a100")
    assert (p.gpus_per_node, p.cpus_per_node, p.mem_gib_per_node) == (8, 128, 960)

    def asked(**overrides):
        written = directives(submitit_script(api.executor("slurm-a100", folder=tmp_path / "%j", **overrides)))
        return written["cpus-per-task"], written["mem"], "exclusive" in written

    assert asked(gpus_per_node=1, exclusive=False) == ("16", f"{120 * 1024}M", False)
    assert asked(gpus_per_node=3, exclusive=False, tasks_per_node=3) == ("16", f"{360 * 1024}M", False)
    assert asked(gpus_per_node=0, exclusive=False) == ("16", f"{120 * 1024}M", False)
    assert asked(gpus_per_node=8, exclusive=False) == ("128", f"{960 * 1024}M", False)
    assert asked(gpus_per_node=1) == ("128", f"{960 * 1024}M", True)  # slurm-a100 is exclusive: the node is the job's
    assert asked(gpus_per_node=1, exclusive=False, cpus_per_task=40, mem_gib=200) == ("40", f"{200 * 1024}M", False)
    plan = slurm_submitit.plan_executor(p, {"gpus_per_node": 1, "exclusive": False}, profile_source="slurm-a100")
    assert plan.parameters["cpus_per_task"] == 16


def test_the_readme_example_uses_valid_overrides():
    """The Python snippet of docs/slurm.md (not run: it needs a cluster) compiles and its overrides validate."""
    text = (REPO / "docs" / "slurm.md").read_text()
    section = text.split("## Python callables on SLURM (submitit)", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    compile(code, "docs/slurm.md", "exec")
    calls = re.findall(r"api\.executor\(\"([^\"]+)\",?(.*?)\)\n", code)
    assert calls
    for profile, args in calls:
        overrides = eval(f"dict({args})")  # literal keyword arguments of the snippet
        slurm_submitit.plan_executor(load_profile(profile), overrides, profile_source=profile)


def test_a_profiles_example_values_are_refused_before_sbatch_unless_overridden(fake_srun, tmp_path):
    """A shipped profile's ``placeholders:`` (slurm-a100's partition) stop a callable's submission
    as they stop ``jobgen submit``; an override of the field (``partition=``) lifts it; making the
    executor (a plan, like ``render``) takes the profile as it is."""
    slurm = fake_srun
    slurm.respond("sbatch", reply("Submitted batch job 99\n"))
    ex = api.executor("slurm-a100", folder=tmp_path / "a" / "%j")
    with pytest.raises(ConfigError, match=r"example values(.|\n)*slurm\.partition") as caught:
        ex.submit(add, 1, 2)
    assert "extends: slurm-a100" in caught.value.hint
    assert not any(argv[0] == "sbatch" for argv in slurm.argvs())
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").rglob("*.pkl"))
    job = api.executor("slurm-a100", folder=tmp_path / "b" / "%j", partition="gpu-site").submit(add, 1, 2)
    assert job.job_id == "99"
    with pytest.raises(ConfigError, match=r"slurm\.container\.image"):
        api.executor("slurm-h100", folder=tmp_path / "c" / "%j", partition="h100-site").submit(add, 1, 2)
