"""Experiment trackers without training: ``trainer.loggers`` and its options, the
profile's ``tracking`` defaults, the plan-time credential rules, the run key record made at submit
(local, SLURM, per array task), what the entrypoint sends (redaction, parameters), and the
logger's step gating with stand-in trackers. The real wandb/MLflow runs: tests/entrypoint/test_tracking.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir import (
    TRACKING_FILE,
    DirUndo,
    ResolvedSpec,
    TrackingRecord,
    ensure_tracking_record,
    read_tracking_record,
    write_tracking_record,
)
from jobgen.planning.environment import TRACKER_CREDENTIALS, looks_secret
from jobgen.planning.tracking import check_tracking, resolve_tracking
from jobgen.specs.profile import ClusterProfile
from jobgen.specs.tracking import check_tracking_uri
from jobgen.specs.training import TrainingSpec
from tests.conftest import EXAMPLES

KEY = "wk-a1b2c3d4e5f60718293a4b5c6d7e8f90"


def spec_of(**trainer: Any) -> TrainingSpec:
    return TrainingSpec.model_validate({"name": "t", "trainer": trainer})


def profile_of(scheduler: str = "slurm", **fields: Any) -> ClusterProfile:
    extra = {"kubernetes": {"image": "img:1", **fields.pop("kubernetes", {})}} if scheduler == "kubernetes" else {}
    return ClusterProfile.model_validate({"name": "p", "scheduler": scheduler, **extra, **fields})


# --------------------------------------------------------------------------- the spec


def test_loggers_are_normalised_csv_first_and_the_default_stays_out_of_spec_json() -> None:
    spec = spec_of(loggers=["mlflow", "wandb", "mlflow"])
    assert spec.trainer.loggers == ("csv", "wandb", "mlflow") and spec.trainer.trackers == ("wandb", "mlflow")
    assert spec.model_dump(mode="json")["trainer"]["loggers"] == ["csv", "wandb", "mlflow"]
    assert "loggers" not in spec_of().model_dump(mode="json")["trainer"]
    assert spec_of(loggers="tensorboard").trainer.loggers == ("csv", "tensorboard")


def test_trainer_tensorboard_is_an_alias_and_a_contradiction_is_refused() -> None:
    assert spec_of(tensorboard=True).trainer.loggers == ("csv", "tensorboard")
    assert spec_of(tensorboard=False).trainer.loggers == ("csv",)
    assert spec_of(tensorboard=True, loggers=["tensorboard", "wandb"]).trainer.loggers == ("csv", "tensorboard", "wandb")
    doc = spec_of(tensorboard=True).model_dump(mode="json")["trainer"]
    assert "tensorboard" not in doc and doc["loggers"] == ["csv", "tensorboard"]
    with pytest.raises(ValidationError, match="tensorboard: true contradicts loggers: \\[csv, wandb\\]"):
        spec_of(tensorboard=True, loggers=["wandb"])
    with pytest.raises(ValidationError, match="tensorboard: false contradicts"):
        spec_of(tensorboard=False, loggers=["tensorboard"])


def test_unknown_loggers_and_options_without_their_logger_are_refused() -> None:
    with pytest.raises(ValidationError, match="'csv', 'tensorboard', 'wandb' or 'mlflow'"):
        spec_of(loggers=["comet"])
    with pytest.raises(ValidationError, match="wandb: options are set, but loggers \\[csv\\] does not name wandb"):
        spec_of(wandb={"project": "x"})
    with pytest.raises(ValidationError, match="trainer.loggers would do nothing"):
        TrainingSpec.model_validate({"name": "c", "entrypoint": {"module": "train"}, "trainer": {"loggers": ["wandb"]}})


@pytest.mark.parametrize("uri", ["sqlite:////shared/mlflow/mlflow.db", "postgresql+psycopg2://db.example.com/mlflow",
                                 "https://mlflow.example.com", "http://127.0.0.1:5000", "databricks", "databricks://prod",
                                 "mysql://db/mlflow"])
def test_tracking_uris_mlflow_takes(uri: str) -> None:
    assert check_tracking_uri(uri) == uri


@pytest.mark.parametrize(("uri", "why"), [
    ("./mlruns", "MLflow's file store"), ("/shared/mlruns", "file store"), ("file:///shared/mlruns", "file store"),
    ("mlruns", "file store"), ("sqlite:///mlflow.db", "absolute path"), ("sqlite://", "absolute path"),
    ("https://alice:s3cret@mlflow.example.com", "user:password@"), ("https://mlflow.example.com/?token=abc", "token"),
    ("s3://bucket/mlruns", "tracking URIs are"), ("https:///path", "names no host"), ("sqlite:////a\nb.db", "newlines"),
])
def test_tracking_uris_refused_with_the_fix(uri: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_tracking_uri(uri)


def test_key_files_are_absolute_and_tags_checked() -> None:
    assert spec_of(loggers=["wandb"], wandb={"api_key_file": "~/.config/wandb/key"}).trainer.wandb.api_key_file
    with pytest.raises(ValidationError, match="not an absolute path"):
        spec_of(loggers=["wandb"], wandb={"api_key_file": "key.txt"})
    with pytest.raises(ValidationError, match="not a W&B name"):
        spec_of(loggers=["wandb"], wandb={"project": "a/b"})
    with pytest.raises(ValidationError, match="1-64 characters"):
        spec_of(loggers=["wandb"], wandb={"tags": ["x" * 65]})


# --------------------------------------------------------------------------- plan time


def test_profile_defaults_merge_field_by_field_and_only_into_specs_with_the_tracker() -> None:
    profile = profile_of(tracking={"wandb": {"entity": "team", "mode": "offline", "tags": ["site"]},
                                   "mlflow": {"tracking_uri": "https://mlflow.example.com", "experiment": "site"}})
    spec = resolve_tracking(spec_of(loggers=["wandb", "mlflow"], wandb={"project": "p", "tags": ["mine"]},
                                    mlflow={"experiment": "mine"}), profile)
    assert spec.trainer.wandb.model_dump() == {"project": "p", "entity": "team", "mode": "offline", "tags": ("mine",)}
    assert (spec.trainer.mlflow.tracking_uri, spec.trainer.mlflow.experiment) == ("https://mlflow.example.com", "mine")
    assert resolve_tracking(spec_of(loggers=["wandb"]), profile_of()).trainer.wandb.mode is None  # WANDB_MODE's, on the node
    plain = spec_of()
    assert resolve_tracking(plain, profile) is plain


def test_rendering_with_trackers_writes_their_options_into_spec_json_and_no_key(tmp_path: Path, monkeypatch) -> None:
    from jobgen.cli import main

    monkeypatch.setenv("WANDB_API_KEY", KEY)
    spec = tmp_path / "s.yaml"
    doc = {"name": "tracked", "secrets": ["WANDB_API_KEY"],
           "trainer": {"loggers": ["wandb", "mlflow"], "wandb": {"project": "p"}, "mlflow": {"tracking_uri": "https://mlflow.example.com"}}}
    spec.write_text(json.dumps(doc))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "k8s-wandb.yaml").write_text("extends: k8s-a100\nkubernetes:\n  secret_env: {WANDB_API_KEY: {secret: wandb, key: api-key}}\n")
    for profile in ("slurm-cpu", "local", "k8s-wandb"):
        with pytest.raises(SystemExit) as done:
            main(["render", str(spec), "-p", profile, "--profiles-dir", str(profiles), "--out", str(tmp_path / "m")])
        assert done.value.code in (0, None)
    written = [p for p in (tmp_path / "m").rglob("*") if p.is_file()]
    resolved = json.loads(next(p for p in written if p.name == "spec.json" and "slurm-cpu" in str(p)).read_text())
    assert resolved["spec"]["trainer"]["wandb"] == {"project": "p"}
    assert resolved["spec"]["secrets"] == ["WANDB_API_KEY"]
    assert any("secretKeyRef" in p.read_text() for p in written if p.suffix == ".yaml")
    assert not [str(p) for p in written if KEY.encode() in p.read_bytes()]


@pytest.mark.parametrize(("spec", "profile", "match"), [
    (dict(loggers=["wandb"]), profile_of("kubernetes"), "maps no Secret to WANDB_API_KEY"),
    (dict(loggers=["wandb"], wandb={"mode": "offline", "api_key_file": "/k"}), profile_of("kubernetes"), "mounts no such file"),
    (dict(loggers=["mlflow"], mlflow={"token_file": "/t"}), profile_of("kubernetes"), "mounts no such file"),
    (dict(loggers=["wandb"], wandb={"api_key_file": "/k"}), profile_of(), "both give wandb's credential"),
    (dict(loggers=["mlflow"]), profile_of(env={"MLFLOW_TRACKING_URI": "./mlruns"}), "file store"),
    (dict(loggers=["mlflow"], mlflow={"tracking_uri": "sqlite:////a.db"}), profile_of(env={"MLFLOW_TRACKING_URI": "https://m.example.com"}),
     "two sources"),
])
def test_plan_time_credential_and_store_rules(spec: dict[str, Any], profile: ClusterProfile, match: str) -> None:
    secrets = ["WANDB_API_KEY"] if spec.get("wandb", {}).get("api_key_file") and profile.scheduler == "slurm" else []
    training = TrainingSpec.model_validate({"name": "t", "trainer": spec, "secrets": secrets})
    with pytest.raises(PlanError, match=match) as err:
        check_tracking(training, profile, spec_source="s.yaml", profile_source="p.yaml")
    assert err.value.hint and err.value.location


def test_what_plan_time_accepts() -> None:
    mapped = profile_of("kubernetes", kubernetes={"secret_env": {"WANDB_API_KEY": {"secret": "wandb", "key": "k"}}})
    check_tracking(spec_of(loggers=["wandb"]), mapped)
    check_tracking(spec_of(loggers=["wandb"], wandb={"mode": "offline"}), profile_of("kubernetes"))
    check_tracking(spec_of(loggers=["wandb", "mlflow"], wandb={"api_key_file": "~/.wandb-key"}), profile_of("local"))
    check_tracking(spec_of(loggers=["mlflow"]), profile_of(env={"MLFLOW_TRACKING_URI": "https://m.example.com"}))


def test_the_tracker_credentials_are_credentials_to_every_existing_check() -> None:
    names = [n for group in TRACKER_CREDENTIALS.values() for n in group]
    assert names and all(looks_secret(n) for n in names)
    from jobgen.jobdir.world import World
    from jobgen.planning.environment import check_job_env

    for name in names:
        with pytest.raises(PlanError, match="looks like a credential"):
            check_job_env(TrainingSpec.model_validate({"name": "t", "env": {name: "x"}}), profile_of(),
                          World(num_nodes=1, devices_per_node=1, accelerator="cpu", micro_batch_size=1, gradient_accumulation_steps=1))


# --------------------------------------------------------------------------- the run key record


def test_the_record_is_made_once_and_a_broken_one_is_reported(tmp_path: Path) -> None:
    first = ensure_tracking_record(tmp_path)
    assert ensure_tracking_record(tmp_path) == first == read_tracking_record(tmp_path)
    assert len(first.run_key) == 16 and first.mlflow_run_id is None
    assert TrackingRecord.new().run_key != first.run_key
    write_tracking_record(tmp_path, first.model_copy(update={"mlflow_run_id": "abc", "logged_step": 30}))
    assert read_tracking_record(tmp_path).logged_step == 30
    (tmp_path / TRACKING_FILE).write_text("{}")
    with pytest.raises(ConfigError, match="not a jobgen tracking record"):
        read_tracking_record(tmp_path)


def test_a_submit_that_does_not_go_ahead_takes_back_a_new_record(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    undo = DirUndo.capture(tmp_path / "old")
    ensure_tracking_record(tmp_path / "old")
    undo.undo()
    assert not (tmp_path / "old" / TRACKING_FILE).exists()
    kept = ensure_tracking_record(tmp_path / "old")
    DirUndo.capture(tmp_path / "old").undo()
    assert read_tracking_record(tmp_path / "old") == kept


def test_local_submit_makes_the_record_and_a_resubmit_keeps_it(tmp_path: Path, monkeypatch) -> None:
    from jobgen.backends import get_backend, plan
    from jobgen.backends.base import SubmitOptions
    from jobgen.backends.local import LocalBackend
    from jobgen.specs.load import load_profile, load_spec, search_dirs

    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    spec = load_spec(EXAMPLES / "quickstart.yaml", overrides=["trainer.loggers=[mlflow]"])
    backend = get_backend("local")
    job_plan = plan(spec, load_profile("local"), search_dirs("templates")[0])
    options = SubmitOptions(runs_dir=tmp_path / "runs")
    job_dir = backend.job_dir(job_plan, None, options)
    job_plan.write(job_dir)
    keys = []
    for _ in range(2):
        LocalBackend(runner=lambda argv, cwd, env: 0).submit(job_dir, options, out=lambda line: None, plan=job_plan)
        keys.append(read_tracking_record(job_dir).run_key)
    assert keys[0] == keys[1]


def test_slurm_submit_makes_one_record_per_array_task(slurm, run_cli, tmp_path: Path) -> None:
    from tests.fakes.slurm.fakeslurm import reply
    from tests.unit.test_slurm_array import NAMES, SPEC, SWEEPS, profile_dir

    profiles = profile_dir(tmp_path)
    assert run_cli("render", str(SPEC), "-p", "slurm-cpu-array", "--profiles-dir", str(profiles), "--out", str(tmp_path / "m"),
                   "--set", "trainer.loggers=[wandb]", "--set", "trainer.wandb.mode=offline", *SWEEPS, cwd=tmp_path).code == 0
    slurm.respond("sbatch", reply("123\n"))
    job_dir = (tmp_path / "m" / "slurm-cpu-array" / "quickstart").resolve()
    result = run_cli("submit", str(job_dir), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.code == 0, result.stderr
    runs = (tmp_path / "runs").resolve()
    keys = {read_tracking_record(runs / name).run_key for name in NAMES}
    assert len(keys) == len(NAMES), "one run per task"
    assert read_tracking_record(runs / "quickstart") is None  # the array's own directory trains nothing


# --------------------------------------------------------------------------- the entrypoint's side


def resolved_with(**trainer: Any) -> ResolvedSpec:
    from tests.entrypoint.conftest import TINY_SPEC, resolved_doc

    spec = {**TINY_SPEC, "secrets": ["WANDB_API_KEY"], "trainer": {**TINY_SPEC["trainer"], **trainer}}
    return ResolvedSpec.model_validate(resolved_doc(spec))


def test_what_is_sent_has_no_key_and_no_url_credentials() -> None:
    from jobgen.train.tracking import flat_params, scrub, secret_values

    resolved = resolved_with(loggers=["wandb"], wandb={"tags": [f"k-{KEY}"], "project": "p"})
    secrets = secret_values(resolved, {"WANDB_API_KEY": KEY, "MLFLOW_TRACKING_TOKEN": "tok-123456", "OTHER": "zzzzzz"})
    assert secrets == [KEY, "tok-123456"]
    doc = scrub({**resolved.model_dump(mode="json"), "u": "see https://bob:pw@h.example.com/x?token=1"}, secrets)
    text = json.dumps(doc)
    assert KEY not in text and "k-***" in text and "bob:pw" not in text and "token=***" in text
    params = flat_params(doc)
    assert params["spec.trainer.max_steps"] == "20" and params["spec.secrets"] == '["WANDB_API_KEY"]'
    assert params["spec.trainer.wandb.project"] == "p" and list(params) == sorted(params)


def test_run_identity_continues_a_run_and_starts_a_new_one_when_it_must(tmp_path: Path) -> None:
    from jobgen.train.tracking import run_identity

    resolved = resolved_with(loggers=["mlflow"])
    first, lost = run_identity(tmp_path, resolved, None)
    assert not lost and read_tracking_record(tmp_path) == first
    assert run_identity(tmp_path, resolved, None)[0] == first  # a fresh start that sent nothing yet: the same run
    write_tracking_record(tmp_path, first.model_copy(update={"logged_step": 20}))
    assert run_identity(tmp_path, resolved, 20)[0].run_key == first.run_key  # resumed: the same run
    renewed, _ = run_identity(tmp_path, resolved, None)  # from step 0 after metrics were sent: a new run
    assert renewed.run_key != first.run_key and renewed.logged_step is None
    never = ResolvedSpec.model_validate({**resolved.model_dump(mode="json"), "spec": {
        **resolved.spec.model_dump(mode="json"), "checkpoint": {"resume": "never"}}})
    assert run_identity(tmp_path, never, None)[0].run_key != renewed.run_key
    (tmp_path / TRACKING_FILE).unlink()
    assert run_identity(tmp_path, resolved, 40)[1] is True  # lost while resuming: MLflow looks it up by tags


class Recorder:
    """A stand-in tracker that confirms every row it gets."""

    name = "recorder"
    floor = None

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.status: str | None = None

    def log(self, rows):
        self.rows.extend(rows)

    def flush(self):
        pass

    def confirmed_step(self):
        return max((step for step, _ in self.rows), default=None)

    def close(self, status):
        self.status = status

    def describe(self):
        return {}


def gated_logger(tmp_path: Path, resumed: int | None = None, logged: int | None = None) -> tuple[Any, Recorder, SimpleNamespace]:
    from jobgen.train.tracking import TrackerLogger

    logger = TrackerLogger(resolved_with(loggers=["mlflow"]), tmp_path, resumed)
    recorder, trainer = Recorder(), SimpleNamespace(global_step=resumed or 0)
    logger.trackers, logger._trainer = [recorder], trainer
    logger.record = TrackingRecord.new().model_copy(update={"logged_step": logged})
    logger.floor = -1 if logged is None else logged
    logger.floors = {recorder.name: logger.floor}
    return logger, recorder, trainer


def log_at(logger: Any, trainer: SimpleNamespace, step: int, **metrics: float) -> None:
    trainer.global_step = step
    logger.log_metrics(metrics or {"train_loss": 1.0, "epoch": 0.0}, step - 1)


def test_metrics_wait_for_the_checkpoint_that_covers_them_and_a_kill_drops_the_rest(tmp_path: Path) -> None:
    logger, recorder, trainer = gated_logger(tmp_path)
    for step in (2, 4):
        log_at(logger, trainer, step)
    assert recorder.rows == []  # no checkpoint yet
    logger.checkpoint_written(4)
    assert [s for s, _ in recorder.rows] == [2, 4]
    log_at(logger, trainer, 4, val_loss=2.0, epoch=0.0)  # the checkpoint step's validation: covered, sent at once
    assert recorder.rows[-1] == (4, {"val_loss": 2.0})  # epoch already sent at step 4: each step once per metric
    log_at(logger, trainer, 6)
    logger.close("KILLED")
    assert [s for s, _ in recorder.rows] == [2, 4, 4] and recorder.status == "KILLED"
    assert read_tracking_record(tmp_path).logged_step == 4


def test_a_failed_run_sends_its_tail_and_a_later_start_never_sends_a_step_twice(tmp_path: Path) -> None:
    logger, recorder, trainer = gated_logger(tmp_path)
    log_at(logger, trainer, 2)
    logger.checkpoint_written(2)
    log_at(logger, trainer, 4)
    logger.close("FAILED")
    assert [s for s, _ in recorder.rows] == [2, 4] and read_tracking_record(tmp_path).logged_step == 4
    again, recorder, trainer = gated_logger(tmp_path, resumed=2, logged=4)  # resumed from step 2
    for step in (4, 6):
        log_at(again, trainer, step)
    again.checkpoint_written(6)
    assert [s for s, _ in recorder.rows] == [6] and again.skipped == 1


class Dead(Recorder):
    """A tracker whose helper is gone: W&B after SLURM's SIGTERM reached ``wandb-core`` (every
    process of a requeued step gets one), where each call raises ``ConnectionResetError``."""

    name = "dead"

    def log(self, rows):
        raise ConnectionResetError("Connection lost")

    def flush(self):
        raise ConnectionResetError("Connection lost")

    def confirmed_step(self):
        return None


def test_a_tracker_that_fails_leaves_the_others_and_training_going(tmp_path: Path, capsys) -> None:
    """Seen on the SLURM lab: SLURM's SIGTERM for a requeue reached ``wandb-core``
    right after the step-50 checkpoint, whose rows W&B then failed to take: the exception left
    ``checkpoint_written``, MLflow never got the rows, and training ended on it before the step's
    validation (its val_loss then missing from metrics.csv and every tracker for good). A failing
    tracker gets nothing more in this start (it confirmed nothing new: the next start sends it
    what it lacks); the others go on, and so does training."""
    logger, recorder, trainer = gated_logger(tmp_path)
    dead = Dead()
    logger.trackers = [dead, recorder]
    logger.floors = {dead.name: -1, recorder.name: -1}
    for step in (2, 4):
        log_at(logger, trainer, step)
    logger.checkpoint_written(4)
    log_at(logger, trainer, 4, val_loss=2.0, epoch=0.0)  # the step's validation: covered, sent at once
    log_at(logger, trainer, 6)
    logger.checkpoint_written(6)
    assert [s for s, _ in recorder.rows] == [2, 4, 4, 6]
    out = capsys.readouterr().out
    assert out.count("tracking: warning: dead failed: ConnectionResetError: Connection lost") == 1, out
    assert read_tracking_record(tmp_path).logged_steps == {"recorder": 6}  # the dead one confirmed nothing
    logger.close("KILLED")
    assert recorder.status == "KILLED"


def test_mlflow_finds_its_run_by_key_tag_and_by_job_when_the_record_is_lost(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install -e .[tracking])")
    from jobgen.specs.tracking import MlflowSpec
    from jobgen.train.tracking import MlflowRun

    options = MlflowSpec(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", experiment="e")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def start(record: TrackingRecord, lost: bool = False) -> MlflowRun:
        return MlflowRun(options, record, lost, run_dir, "job", {"spec.a": "1"}, {"jobgen.nodes": "n"}, resumed=True)

    first = start(TrackingRecord.new())
    first.close("KILLED")
    assert read_tracking_record(run_dir) == first.record and first.record.mlflow_run_id == first.run_id
    # killed between creating the run and recording its id: found by the jobgen.run_key tag
    again = start(first.record.model_copy(update={"mlflow_run_id": None}))
    assert again.run_id == first.run_id and again.client.get_run(again.run_id).info.status == "RUNNING"
    # the record lost while a checkpoint is resumed: found by job and run dir, and the old key comes back
    lost = start(TrackingRecord.new(), lost=True)
    assert (lost.run_id, lost.record.run_key) == (first.run_id, first.record.run_key)
    # a new key and no checkpoint: a new run
    assert start(TrackingRecord.new()).run_id != first.run_id
    assert lost.describe() == {"run_id": first.run_id, "experiment_id": first.experiment_id,
                               "tracking_uri": options.tracking_uri, "url": None}


def test_key_files_are_read_into_the_trackers_variables_on_rank_zero(tmp_path: Path) -> None:
    from jobgen.train.tracking import read_key_files

    key_file = tmp_path / "wandb-key"
    resolved = resolved_with(loggers=["wandb", "mlflow"], wandb={"api_key_file": str(key_file)},
                             mlflow={"token_file": str(tmp_path / "none")})
    resolved = ResolvedSpec.model_validate({**resolved.model_dump(mode="json"), "spec": {**resolved.spec.model_dump(mode="json"),
                                                                                         "secrets": []}})
    environ: dict[str, str] = {}
    key_file.write_text(f"{KEY}\n")
    with pytest.raises(ConfigError, match="cannot read .*none") as err:
        read_key_files(resolved, environ)
    assert err.value.location == "spec.trainer.mlflow.token_file"
    (tmp_path / "none").write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        read_key_files(resolved, environ)
    (tmp_path / "none").write_text("tok\n")
    read_key_files(resolved, environ)
    assert environ == {"WANDB_API_KEY": KEY, "MLFLOW_TRACKING_TOKEN": "tok"}


# --------------------------------------------------------------------------- the trackers' own variables
# A field the spec and the profile leave unset defers to W&B's and MLflow's
# environment variables on the node, as wandb.init and MLflow do without jobgen.

WANDB_VARIABLES = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR")


@pytest.fixture
def quiet_wandb(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """W&B quiet and writing nothing outside tmp_path, none of its variables set; the cwd a git
    repository (where wandb.init without a project names one after the repository)."""
    pytest.importorskip("wandb", reason="wandb not installed (pip install -e .[tracking])")
    import subprocess

    for name in (*WANDB_VARIABLES, "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("CONFIG", "CACHE", "DATA"):
        monkeypatch.setenv(f"WANDB_{name}_DIR", str(tmp_path / f"wandb-{name.lower()}"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    code = tmp_path / "snapshot" / "code"
    code.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tmp_path / "snapshot")], check=True)
    monkeypatch.chdir(code)
    import wandb

    wandb.teardown()  # wandb keeps the settings (variables included) of its first setup in the process
    yield tmp_path
    wandb.teardown()


def wandb_run(tmp_path: Path, **options: Any) -> Any:
    from jobgen.specs.tracking import WandbSpec
    from jobgen.train.tracking import WandbRun

    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    return WandbRun(WandbSpec(**options), TrackingRecord.new(), run_dir, "job", {"a": 1})


def test_spec_json_leaves_wandb_mode_to_wandb_mode_on_the_node() -> None:
    # resolve_tracking wrote mode: online into spec.json, which overrode WANDB_MODE=offline on the node
    assert resolve_tracking(spec_of(loggers=["wandb"]), profile_of()).trainer.wandb.mode is None
    assert resolve_tracking(spec_of(loggers=["wandb"]), profile_of()).trainer.wandb.model_dump(mode="json") == {}


@pytest.mark.parametrize("where", ["profile", "spec"])
def test_kubernetes_takes_wandb_mode_offline_from_the_rendered_env(where: str) -> None:
    env = {"env": {"WANDB_MODE": "offline"}}
    profile = profile_of("kubernetes", **(env if where == "profile" else {}))
    spec = TrainingSpec.model_validate({"name": "t", "trainer": {"loggers": ["wandb"]}, **(env if where == "spec" else {})})
    check_tracking(spec, profile)  # the pods log offline: no key needed
    online = TrainingSpec.model_validate({"name": "t", "trainer": {"loggers": ["wandb"]}, "env": {"WANDB_MODE": "online"}})
    with pytest.raises(PlanError, match="maps no Secret to WANDB_API_KEY") as err:
        check_tracking(online, profile_of("kubernetes"))
    assert "env: {WANDB_MODE: offline}" in err.value.hint


def test_wandb_defers_to_its_variables_where_the_spec_sets_nothing(quiet_wandb: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "site-project")
    monkeypatch.setenv("WANDB_ENTITY", "site-team")
    monkeypatch.setenv("WANDB_DIR", str(quiet_wandb / "wandb-dir"))
    (quiet_wandb / "wandb-dir").mkdir()
    run = wandb_run(quiet_wandb)
    try:
        where = run.describe()
    finally:
        run.close("FINISHED")
    assert (where["mode"], where["project"], where["entity"]) == ("offline", "site-project", "site-team"), where
    assert Path(where["dir"]).parent == quiet_wandb / "wandb-dir" / "wandb", where
    assert where["sync"] == f"wandb sync {quiet_wandb}/wandb-dir/wandb/offline-run-*-{where['id']}", where
    assert list((quiet_wandb / "wandb-dir" / "wandb").glob(f"offline-run-*-{where['id']}"))
    # the spec's fields win over the variables
    run = wandb_run(quiet_wandb, project="mine", entity="us")
    try:
        assert (run.describe()["project"], run.describe()["entity"]) == ("mine", "us")
    finally:
        run.close("FINISHED")


def test_wandb_without_a_project_anywhere_is_uncategorized_not_one_per_code_snapshot(quiet_wandb: Path) -> None:
    # wandb.init without a project names it after the git repository around the program (the code
    # snapshot: one project per job); the reference promises W&B's default
    run = wandb_run(quiet_wandb, mode="offline")
    try:
        where = run.describe()
    finally:
        run.close("FINISHED")
    assert where["project"] == "uncategorized", where
    assert Path(where["dir"]).parent == quiet_wandb / "run" / "wandb", where  # no WANDB_DIR: the run directory


def test_mlflow_defers_to_its_variables_where_the_spec_sets_nothing(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install -e .[tracking])")
    from jobgen.specs.tracking import MlflowSpec
    from jobgen.train.tracking import MlflowRun

    uri = f"sqlite:///{tmp_path / 'site.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "site-experiment")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = MlflowRun(MlflowSpec(), TrackingRecord.new(), False, run_dir, "job", {}, {}, resumed=False)
    run.close("FINISHED")
    assert run.uri == uri
    assert run.client.get_experiment(run.experiment_id).name == "site-experiment"
    mine = MlflowRun(MlflowSpec(experiment="mine"), TrackingRecord.new(), False, run_dir, "job2", {}, {}, resumed=False)
    mine.close("FINISHED")
    assert mine.client.get_experiment(mine.experiment_id).name == "mine"


@pytest.mark.parametrize(("environ", "tag"), [
    ({}, "0"),
    ({"JOBGEN_RESTART_COUNT": "2"}, "2"),  # a local, ssh or Kubernetes restart of jobgen's budget
    ({"JOBGEN_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "0"}, "1"),
    ({"SLURM_RESTART_COUNT": "3"}, "3"),
    ({"TORCHELASTIC_RESTART_COUNT": "1"}, "1"),
    ({"JOBGEN_RESTART_COUNT": "two; rm -rf /", "SLURM_RESTART_COUNT": "1"}, "1"),  # not a count: the next source
    ({"SLURM_RESTART_COUNT": "\n1\x00"}, "0"),
])
def test_the_trackers_restart_tag_counts_restarts_as_the_notifications_do(environ: dict[str, str], tag: str) -> None:
    from jobgen.events.notifier import restart_count
    from jobgen.train.tracking import restart_tag

    assert restart_tag(environ) == tag == str(restart_count(environ))
