"""The rendered sbatch script run under real bash with srun/scontrol/module stubbed.

Proves that adversarial values in the job name, env values, module names and extra srun
arguments arrive byte-for-byte as single arguments / values, and that nothing in them runs.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from jobgen.backends import plan
from jobgen.backends.slurm.script import run_dir_name
from jobgen.errors import ConfigError
from jobgen.specs.load import load_profile, validate
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.training import TrainingSpec
from tests.conftest import ADVERSARIAL, PROFILES, TEMPLATES, lint_bash

STUB = """#!/bin/bash
out="$STUB_OUT/$(basename "$0")"
printf '%s\\0' "$@" > "$out.args"
env -0 > "$out.env"
if [ "$(basename "$0")" = scontrol ]; then echo "${STUB_FIRST_NODE:-node1}"; echo node2; fi
"""


def stub_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "module"):
        path = bin_dir / name
        path.write_text(STUB)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def run_sbatch(script: str, tmp_path: Path, extra_env: dict[str, str] | None = None,
               check: bool = True) -> tuple[list[str], dict[str, str], subprocess.CompletedProcess[str]]:
    """Run ``script`` as the batch shell; ``extra_env`` joins the batch environment (what sbatch
    exported); ``check=False`` returns a failed run with ``([], {}, proc)`` when srun never ran."""
    work = tmp_path / "submit dir"  # a space in the submit directory too
    work.mkdir()
    (work / "job.sbatch").write_text(script)
    out = tmp_path / "stub-out"
    out.mkdir()
    env = {
        "PATH": f"{stub_bin(tmp_path)}:/usr/bin:/bin",
        "STUB_OUT": str(out),
        "SLURM_SUBMIT_DIR": str(work),
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NUM_NODES": "2",
        "HOME": str(tmp_path),
        **(extra_env or {}),
    }
    proc = subprocess.run(["bash", str(work / "job.sbatch")], cwd=work, env=env, capture_output=True, text=True, timeout=30)
    if not check and not (out / "srun.args").exists():
        return [], {}, proc
    assert proc.returncode == 0, proc.stderr
    argv = (out / "srun.args").read_bytes().decode().split("\0")[:-1]
    srun_env = dict(item.split("=", 1) for item in (out / "srun.env").read_bytes().decode().split("\0") if "=" in item)
    return argv, srun_env, proc


def adversarial_profile(value: str) -> ClusterProfile:
    base = load_profile("slurm-a100", PROFILES).model_dump()
    base["slurm"] = {**base["slurm"], "extra_srun_args": [f"--comment={value}", value], "modules": [value]}
    return validate(ClusterProfile, base, "<test>")


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_adversarial_values_arrive_intact_and_nothing_runs(tmp_path, value):
    name = f"job {value}"
    spec = validate(TrainingSpec, {"name": name, "env": {"ODD_VALUE": value}, "resources": {"nodes": 2}}, "<test>")
    job_plan = plan(spec, adversarial_profile(value), TEMPLATES)
    argv, srun_env, proc = run_sbatch(job_plan.file("job.sbatch"), tmp_path)
    work = tmp_path / "submit dir"
    assert argv == [
        "--kill-on-bad-exit=1", "--label", f"--comment={value}", value,
        "python", "-m", "jobgen.train", "--spec", f"{work}/spec.json", "--run-dir", f"{work}/runs/{run_dir_name(name)}",
    ]
    assert srun_env["ODD_VALUE"] == value
    assert srun_env["MASTER_ADDR"] == "node1" and srun_env["MASTER_PORT"] == "29500"
    assert (tmp_path / "stub-out" / "module.args").read_bytes().decode().split("\0")[:-1] == ["load", value]
    assert not list(tmp_path.rglob("PWNED")), "a value was executed"
    # sbatch reads "#SBATCH" lines itself: exactly one job-name line, which splits back to the name
    lines = [ln for ln in job_plan.file("job.sbatch").splitlines() if ln.startswith("#SBATCH --job-name")]
    # sbatch honours shell quotes but treats "\\" as an escape even inside single quotes, so
    # jobgen doubles backslashes (the real-cluster test in tests/integration checks the name SLURM keeps)
    assert len(lines) == 1 and shlex.split(lines[0].removeprefix("#SBATCH "))[0] == "--job-name=" + name.replace("\\", "\\\\")


def test_env_overrides_order_and_requeue_directives(tmp_path):
    spec = validate(TrainingSpec, {"name": "j", "env": {"NCCL_DEBUG": "INFO"}}, "<test>")
    job_plan = plan(spec, load_profile("slurm-a100", PROFILES), TEMPLATES)
    _, srun_env, proc = run_sbatch(job_plan.file("job.sbatch"), tmp_path)
    assert srun_env["NCCL_DEBUG"] == "INFO", "the spec's env must win over the fabric preset"
    assert srun_env["NCCL_IB_DISABLE"] == "0" and srun_env["OMP_NUM_THREADS"] == "16"
    assert "#SBATCH --signal=USR2@120" in job_plan.file("job.sbatch")
    assert "#SBATCH --requeue" in job_plan.file("job.sbatch")
    assert "jobgen: job 42 on 2 node(s)" in proc.stdout


def _quickstart_on(profile: str, **slurm: object) -> str:
    base = load_profile(profile, PROFILES).model_dump()
    base["slurm"] = {**base["slurm"], **slurm}
    spec = validate(TrainingSpec, {"name": "q", "resources": {"nodes": 2}}, "<test>")
    return plan(spec, validate(ClusterProfile, base, "<test>"), TEMPLATES).file("job.sbatch")


def test_shared_nodes_take_the_rendezvous_port_from_the_job_id(tmp_path):
    """Two jobs of a profile with exclusive: false that share their first node
    once met at the fixed port 29500; each job now has its own, master_port + job id mod 1000 (a
    requeued job keeps its id, so its port)."""
    script = _quickstart_on("slurm-cpu")
    ports = []
    for job_id in ("42", "1043"):
        run = tmp_path / job_id
        run.mkdir()
        _, srun_env, proc = run_sbatch(script, run, {"SLURM_JOB_ID": job_id})
        ports.append(srun_env["MASTER_PORT"])
    assert ports == ["29542", "29543"]
    # exclusive nodes keep the profile's port: no other job is on the node
    exclusive = tmp_path / "exclusive"
    exclusive.mkdir()
    _, srun_env, _ = run_sbatch(_quickstart_on("slurm-cpu", exclusive=True), exclusive, {"SLURM_JOB_ID": "42"})
    assert srun_env["MASTER_PORT"] == "29500"
    # near the top of the port range the window shrinks instead of passing 65535
    top = tmp_path / "top"
    top.mkdir()
    _, srun_env, _ = run_sbatch(_quickstart_on("slurm-cpu", master_port=65530), top, {"SLURM_JOB_ID": "42"})
    assert srun_env["MASTER_PORT"] == str(65530 + 42 % 6)


def test_shared_nodes_pass_a_port_something_already_listens_on(tmp_path):
    """The job id's port is taken on the first node (a job whose id is congruent, another
    program): the next free one in the window."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for port in range(29600, 30400):
        try:
            listener.bind(("127.0.0.1", port))
        except OSError:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                listener.close()
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                continue
        break
    listener.listen()
    try:
        _, srun_env, proc = run_sbatch(_quickstart_on("slurm-cpu"), tmp_path,
                                       {"SLURM_JOB_ID": str(port - 29500), "STUB_FIRST_NODE": "127.0.0.1"})
    finally:
        listener.close()
    assert srun_env["MASTER_PORT"] == str(port + 1), proc.stdout
    assert f"port {port} is in use on 127.0.0.1" in proc.stderr


def test_shared_node_script_passes_bash_n_and_shellcheck(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(_quickstart_on("slurm-cpu"))
    lint_bash(path)


@pytest.mark.parametrize("field", ["name", "env"])
def test_newline_values_never_reach_a_script(field):
    doc = {"name": "a\n#SBATCH --uid=0"} if field == "name" else {"name": "x", "env": {"K": "a\nb"}}
    with pytest.raises(ConfigError, match="newline"):
        validate(TrainingSpec, doc, "<test>")


def test_pyxis_and_apptainer_launch_lines(tmp_path):
    spec = validate(TrainingSpec, {"name": "c"}, "<test>")
    pyxis = plan(spec, load_profile("slurm-h100", PROFILES), TEMPLATES)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    argv, _, _ = run_sbatch(pyxis.file("job.sbatch"), tmp_path / "a")
    assert argv[:4] == ["--kill-on-bad-exit=1", "--label", "--container-image=nvcr.io#nvidia/pytorch:25.01-py3", "--container-mounts=/scratch:/scratch"]
    base = load_profile("slurm-a100", PROFILES).model_dump()
    base["slurm"]["container"] = {"runtime": "apptainer", "image": "/images/train.sif", "mounts": ["/data"]}
    apptainer = plan(spec, validate(ClusterProfile, base, "<t>"), TEMPLATES)
    argv, _, _ = run_sbatch(apptainer.file("job.sbatch"), tmp_path / "b")
    assert argv[2:7] == ["apptainer", "exec", "--nv", "--bind", "/data"] and argv[7] == "/images/train.sif"
    assert os.path.basename(argv[8]) == "python"


SIGNAL_SRUN = """#!/bin/bash
# srun stand-in: records the signals it gets; exits 0 once it has seen SIGUSR2.
trap 'echo USR2 >> "$STUB_OUT/srun.signals"; exit 0' USR2
echo started > "$STUB_OUT/srun.started"
for _ in $(seq 200); do sleep 0.05; done
exit 3
"""


def start_batch_signal_job(tmp_path: Path, name: str, scontrol: str | None = None) -> tuple[subprocess.Popen[str], Path]:
    """Render a slurm-cpu job with ``signal_target: batch`` and start its script under bash with
    the SIGNAL_SRUN stand-in (and ``scontrol``, when given); returns the process and the stubs'
    output directory."""
    base = load_profile("slurm-cpu", PROFILES).model_dump()
    base["slurm"]["signal_target"] = "batch"
    job_plan = plan(validate(TrainingSpec, {"name": name}, "<t>"), validate(ClusterProfile, base, "<t>"), TEMPLATES)
    script = job_plan.file("job.sbatch")
    assert "#SBATCH --signal=B:USR2@60" in script
    work = tmp_path / "w"
    work.mkdir()
    (work / "job.sbatch").write_text(script)
    bin_dir = stub_bin(tmp_path)
    (bin_dir / "srun").write_text(SIGNAL_SRUN)
    if scontrol is not None:
        (bin_dir / "scontrol").write_text(scontrol)
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "SLURM_SUBMIT_DIR": str(work),
           "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "HOME": str(tmp_path)}
    proc = subprocess.Popen(["bash", str(work / "job.sbatch")], env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, out


def test_batch_signal_form_forwards_the_signal_to_srun_and_returns_its_status(tmp_path):
    """--signal=B:USR2@T signals only the batch shell; the script must pass it on to srun
    (which forwards it to every rank) and still exit with srun's status."""
    proc, out = start_batch_signal_job(tmp_path, "sig")
    for _ in range(100):
        if (out / "srun.started").exists():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=30)
    assert (out / "srun.signals").read_text() == "USR2\n", stderr
    assert proc.returncode == 0, "the batch shell must wait for srun and exit with its status"


HOLDING_SCONTROL = """#!/bin/bash
# scontrol stand-in that holds the batch script before srun has started, until the test says go.
touch "$STUB_OUT/scontrol.started"
for _ in $(seq 1000); do [ -e "$STUB_OUT/go" ] && break; sleep 0.01; done
echo node1
"""


def test_batch_signal_that_arrives_before_srun_has_started_still_reaches_srun(tmp_path):
    """SLURM may send B:USR2 at any time after the job starts (up to 60 s early, or to a job that
    starts close to its limit). The batch shell must already trap it while it prepares the launch
    (here: while `scontrol show hostnames` runs), remember it, and pass it on once srun runs;
    without the trap bash's default action for SIGUSR2 kills the batch shell and srun never runs."""
    proc, out = start_batch_signal_job(tmp_path, "early", scontrol=HOLDING_SCONTROL)
    for _ in range(500):
        if (out / "scontrol.started").exists():
            break
        time.sleep(0.01)
    assert not (out / "srun.started").exists()
    proc.send_signal(signal.SIGUSR2)  # to the batch shell only, as --signal=B: does
    time.sleep(0.2)  # let bash take it while it still waits for scontrol, i.e. before srun runs
    (out / "go").touch()
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, f"batch shell exit {proc.returncode}; srun started: {(out / 'srun.started').exists()}\n{stderr}"
    assert (out / "srun.signals").read_text() == "USR2\n", "srun must get the signal once it runs"


def test_batch_signal_form_passes_bash_n_and_shellcheck(tmp_path):
    """No shipped profile uses signal_target: batch, so the golden shellcheck never sees this branch."""
    base = load_profile("slurm-a100", PROFILES).model_dump()
    base["slurm"]["signal_target"] = "batch"
    script = tmp_path / "job.sbatch"
    script.write_text(plan(validate(TrainingSpec, {"name": "sc"}, "<t>"), validate(ClusterProfile, base, "<t>"), TEMPLATES).file("job.sbatch"))
    assert "trap forward_signal USR2" in script.read_text()
    lint_bash(script)


# --------------------------------------------------------------------------- secrets

SECRET_VALUE = "s3cr3t 'value' $(touch PWNED)"


def secrets_script() -> str:
    spec = validate(TrainingSpec, {"name": "sec", "secrets": ["WANDB_API_KEY", "HF_TOKEN"]}, "<t>")
    return plan(spec, load_profile("slurm-a100", PROFILES), TEMPLATES).file("job.sbatch")


def test_secrets_from_the_batch_environment_reach_srun_even_under_export_none(tmp_path):
    """sbatch exports the submitting environment (the secrets) to the batch shell; srun must
    pass it on even when sbatch ran with --export=NONE (then SLURM_EXPORT_ENV=NONE is set)."""
    script = secrets_script()
    assert SECRET_VALUE not in script and "WANDB_API_KEY" in script
    batch_env = {"WANDB_API_KEY": SECRET_VALUE, "HF_TOKEN": "hf", "SLURM_EXPORT_ENV": "NONE"}
    _, srun_env, _ = run_sbatch(script, tmp_path, batch_env)
    assert srun_env["WANDB_API_KEY"] == SECRET_VALUE and srun_env["HF_TOKEN"] == "hf"
    assert srun_env["SLURM_EXPORT_ENV"] == "ALL", "srun would otherwise inherit sbatch's --export=NONE"
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("batch_env", [{"HF_TOKEN": "hf"}, {"HF_TOKEN": "hf", "WANDB_API_KEY": ""}], ids=["unset", "empty"])
def test_a_secret_missing_in_the_job_stops_it_before_srun(tmp_path, batch_env):
    argv, _, proc = run_sbatch(secrets_script(), tmp_path, batch_env, check=False)
    assert proc.returncode == 2 and argv == [], "srun must not start without the secret"
    assert "jobgen: secret WANDB_API_KEY is not set in the job's environment" in proc.stderr


def test_secrets_script_passes_bash_n_and_shellcheck(tmp_path):
    """No shipped example lists secrets, so the golden shellcheck never sees this branch."""
    script = tmp_path / "job.sbatch"
    script.write_text(secrets_script())
    lint_bash(script)


# --------------------------------------------------------------------------- command mode

#: srun stand-in that really starts the tasks: one process per task of the allocation
#: (SLURM_JOB_NUM_NODES x SLURM_NTASKS_PER_NODE), each with the variables SLURM gives a task
#: (srun(1) "OUTPUT ENVIRONMENT VARIABLES": SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID,
#: SLURM_NTASKS) and nothing else a launcher would set; waits for all, exits with the worst status.
TASK_SRUN = """#!/bin/bash
while [ "$#" -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done   # srun's own --options
per_node="${SLURM_NTASKS_PER_NODE}"
ntasks=$(( SLURM_JOB_NUM_NODES * per_node ))
pids=()
for (( i = 0; i < ntasks; i++ )); do
    SLURM_PROCID=$i SLURM_LOCALID=$(( i % per_node )) SLURM_NODEID=$(( i / per_node )) SLURM_NTASKS=$ntasks "$@" &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
"""

#: "python" stand-in that records what a task sees (its environment and working directory).
TASK_PYTHON_ENV = """#!/bin/bash
{ env -0; printf 'PWD_SEEN=%s\\0' "$(pwd)"; printf 'ARGV_SEEN=%s\\0' "$*"; } > "$STUB_OUT/task-${SLURM_PROCID}.env"
"""


def command_job(tmp_path: Path, spec_doc: dict, port: int | None = None) -> tuple[str, Path]:
    """The job.sbatch of a command-mode spec on slurm-cpu (2 nodes x 1 task) and a bin directory
    with the task-starting srun, a scontrol that names this machine, and module."""
    base = load_profile("slurm-cpu", PROFILES).model_dump()
    if port is not None:
        base["slurm"]["master_port"] = port
    job_plan = plan(validate(TrainingSpec, spec_doc, "<t>"), validate(ClusterProfile, base, "<t>"), TEMPLATES)
    bin_dir = stub_bin(tmp_path)
    (bin_dir / "srun").write_text(TASK_SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    return job_plan.file("job.sbatch"), bin_dir


def run_command_job(script: str, tmp_path: Path, bin_dir: Path, workdir: Path, extra_env: dict[str, str] | None = None,
                    timeout: float = 120) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "job dir"
    work.mkdir()
    (work / "job.sbatch").write_text(script)
    (tmp_path / "out").mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(tmp_path / "out"), "SLURM_SUBMIT_DIR": str(work),
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "1",
           "HOME": str(tmp_path), "JOBGEN_WORKDIR": str(workdir), **(extra_env or {})}
    return subprocess.run(["bash", str(work / "job.sbatch")], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


def test_command_mode_tasks_get_rank_world_and_local_rank_from_slurm(tmp_path):
    """Each srun task exports RANK=SLURM_PROCID, WORLD_SIZE=SLURM_NTASKS, LOCAL_RANK=SLURM_LOCALID,
    NODE_RANK=SLURM_NODEID (a RANK the batch environment carried is replaced), runs in
    JOBGEN_WORKDIR, and gets the DeepSpeed config's absolute path and every argument intact."""
    odd = "it's a \"$(touch PWNED)\" `x` \\ value"
    spec = {"name": "cmd-env", "entrypoint": {"script": "train me.py", "args": ["--note", odd]},
            "trainer": {"strategy": "deepspeed_stage_2"}}
    script, bin_dir = command_job(tmp_path, spec)
    (bin_dir / "python").write_text(TASK_PYTHON_ENV)
    (bin_dir / "python").chmod(0o755)
    workdir = tmp_path / "my project"
    workdir.mkdir()
    proc = run_command_job(script, tmp_path, bin_dir, workdir, {"RANK": "7", "WORLD_SIZE": "99"})
    assert proc.returncode == 0, proc.stderr
    job_dir = tmp_path / "job dir"
    for rank in (0, 1):
        raw = (tmp_path / "out" / f"task-{rank}.env").read_bytes().decode().split("\0")
        env = dict(item.split("=", 1) for item in raw if "=" in item)
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["NODE_RANK"]) == (str(rank), "2", "0", str(rank))
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29509"  # slurm-cpu shares nodes: job 9
        assert env["PWD_SEEN"] == str(workdir)
        assert env["PL_DEEPSPEED_CONFIG_PATH"] == f"{job_dir}/ds_config.json"
        assert env["ARGV_SEEN"] == f"train me.py --note {odd}"
    assert not list(tmp_path.rglob("PWNED")), "an argument was executed"


def test_command_mode_plain_torch_ddp_script_runs_under_the_srun_launch(tmp_path):
    """The shipped plain-torch example under the rendered job.sbatch with an srun that starts two
    real tasks: init_process_group("env://") finds the world from the exported variables, and the
    all-reduce and DDP steps agree across ranks."""
    import sys

    from tests.conftest import REPO
    from tests.ports import ATTEMPTS, address_in_use, next_port

    require_torch = pytest.importorskip("torch", reason="torch not installed (pip install -e .[train])")
    assert require_torch
    spec = {"name": "cmd-ddp", "entrypoint": {"script": "examples/scripts/ddp_allreduce.py", "args": ["--steps", "2"]}}
    for attempt in range(ATTEMPTS):
        attempt_dir = tmp_path / str(attempt)
        attempt_dir.mkdir()
        script, bin_dir = command_job(attempt_dir, spec, port=next_port())
        (bin_dir / "python").write_text(f"#!/bin/bash\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        (bin_dir / "python").chmod(0o755)
        proc = run_command_job(script, attempt_dir, bin_dir, REPO, {"OMP_NUM_THREADS": "1"})
        if proc.returncode == 0 or not address_in_use(proc.stdout + proc.stderr):
            break
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"ddp: rank {rank} of world size 2, local rank 0, node rank {rank}, master 127.0.0.1:" in proc.stdout
        assert f"ddp: rank {rank} all_reduce(sum of rank+1) = 3 (expected 3)" in proc.stdout
        assert f"ddp: rank {rank} 2 step(s), weights in sync across ranks: True" in proc.stdout


def pyxis_command_plan(spec_doc: dict | None = None, mounts: tuple[str, ...] = ("/scratch:/scratch",)):
    """A command-mode job on slurm-h100 (pyxis) with the container ``mounts`` given."""
    base = load_profile("slurm-h100", PROFILES).model_dump()
    base["slurm"]["container"]["mounts"] = list(mounts)
    doc = spec_doc or {"name": "cmd-pyxis", "entrypoint": {"script": "train.py"}}
    return plan(validate(TrainingSpec, doc, "<t>"), validate(ClusterProfile, base, "<t>"), TEMPLATES)


@pytest.mark.parametrize("mounts", [("/scratch:/scratch",), ()], ids=["profile-mounts", "no-profile-mounts"])
@pytest.mark.parametrize("workdir", ["submit dir", "my 'odd' $(touch PWNED) project"], ids=["default", "JOBGEN_WORKDIR"])
def test_command_mode_under_pyxis_mounts_the_working_directory_and_starts_there(tmp_path, mounts, workdir):
    """pyxis runs each task in a container that sees only what is mounted: the directory the
    ranks run in (JOBGEN_WORKDIR, else the submit directory) is mounted at the same path, once,
    in the one --container-mounts flag with the profile's mounts, and is the container's workdir."""
    script = pyxis_command_plan(mounts=mounts).file("job.sbatch")
    extra = {} if workdir == "submit dir" else {"JOBGEN_WORKDIR": str(tmp_path / workdir)}
    argv, _, _ = run_sbatch(script, tmp_path, extra)
    wd = str(tmp_path / workdir)
    flags = [a for a in argv if a.startswith("--container-")]
    assert flags == ["--container-image=nvcr.io#nvidia/pytorch:25.01-py3",
                     "--container-mounts=" + ",".join([f"{wd}:{wd}", *mounts]), f"--container-workdir={wd}"]
    assert not list(tmp_path.rglob("PWNED")), "the working directory was executed"


def test_the_built_in_entrypoint_under_pyxis_keeps_the_profile_mounts_only(tmp_path):
    base = load_profile("slurm-h100", PROFILES)
    argv, _, _ = run_sbatch(plan(validate(TrainingSpec, {"name": "c"}, "<t>"), base, TEMPLATES).file("job.sbatch"), tmp_path)
    assert [a for a in argv if a.startswith("--container-")] == [
        "--container-image=nvcr.io#nvidia/pytorch:25.01-py3", "--container-mounts=/scratch:/scratch"]


def test_command_mode_under_pyxis_passes_bash_n_and_shellcheck(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(pyxis_command_plan(mounts=("/scratch:/scratch", "/data:/data:ro")).file("job.sbatch"))
    lint_bash(path)


def test_command_mode_script_passes_bash_n_and_shellcheck(tmp_path):
    spec = {"name": "cmd-lint", "entrypoint": {"module": "pkg.train", "args": ["fit", "--config", "a b.yaml"], "lightning_cli": True},
            "trainer": {"strategy": "deepspeed_stage_3"}}
    script, _ = command_job(tmp_path, spec)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    lint_bash(path)


# --------------------------------------------------------------------------- job arrays


def _array_plan(tmp_path: Path, exclusive: bool = False):
    from jobgen.api import PLANNERS
    from jobgen.planning.sweep import SpecOptions, plan_single

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "slurm-cpu-array.yaml").write_text(
        f"extends: slurm-cpu\nslurm: {{sweep_as_array: true, exclusive: {str(exclusive).lower()}}}\n")
    render = plan_single(str(PROFILES.parent / "examples" / "quickstart.yaml"), "slurm-cpu-array", PLANNERS,
                         SpecOptions(sweeps=["trainer.learning_rate=1e-4,3e-4", "trainer.micro_batch_size=4,8"], out=str(tmp_path / "m"),
                                     profiles_dir=str(profiles), templates_dir=str(TEMPLATES)))
    return render.jobs[0].plan


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared", "exclusive"])
@pytest.mark.parametrize("task", [0, 2, 3])
def test_array_task_runs_its_points_spec_in_its_own_run_dir_and_requeues_itself(tmp_path, task, exclusive):
    """Task i of the array: srun gets points/<i>/spec.json and <runs dir>/<point i's name>, a port of
    its own (exclusive nodes: master_port + i; shared nodes: from the task's own job id), and the
    array variables from which RequeueOnSignal requeues `<array job id>_<task>`."""
    from jobgen.train.callbacks import RequeueOnSignal

    job_plan = _array_plan(tmp_path, exclusive)
    names = [p["name"] for p in json.loads(job_plan.file("array.json"))["points"]]
    runs = tmp_path / "runs"
    env = {"SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": str(task), "SLURM_JOB_ID": str(71 + task),
           "JOBGEN_RUN_DIR": str(runs)}
    argv, srun_env, proc = run_sbatch(job_plan.file("job.sbatch"), tmp_path, env)
    work = tmp_path / "submit dir"
    assert argv == ["--kill-on-bad-exit=1", "--label", "python", "-m", "jobgen.train",
                    "--spec", f"{work}/points/{task}/spec.json", "--run-dir", f"{runs}/{names[task]}"]
    assert srun_env["RUN_DIR"] == f"{runs}/{names[task]}"
    assert srun_env["MASTER_PORT"] == str(29500 + (task if exclusive else 71 + task)), proc.stdout
    assert f"jobgen: job 70_{task} ({names[task]})" in proc.stdout
    # the requeue path (RequeueOnSignal, run by rank 0 inside srun) names this task, not the array
    assert RequeueOnSignal.slurm_job_id(srun_env) == f"70_{task}"
    requeue = RequeueOnSignal(signal.SIGUSR2, tmp_path, RequeueOnSignal.slurm_job_id(srun_env))
    assert [*requeue.requeue_command, requeue.job_id] == ["scontrol", "requeue", f"70_{task}"]


@pytest.mark.parametrize("task", [None, "4", "x"])
def test_array_script_outside_an_array_task_stops_before_srun(tmp_path, task):
    job_plan = _array_plan(tmp_path)
    env = {} if task is None else {"SLURM_ARRAY_TASK_ID": task}
    argv, _, proc = run_sbatch(job_plan.file("job.sbatch"), tmp_path, env, check=False)
    assert argv == [] and proc.returncode == 2
    assert "job array of 4 tasks (0-3)" in proc.stderr


def test_array_golden_script_passes_bash_n(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(_array_plan(tmp_path).file("job.sbatch"))
    lint_bash(path)
