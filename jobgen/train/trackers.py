"""The experiment trackers behind :class:`jobgen.train.tracking.TrackerLogger`: what is sent
(the resolved spec as parameters, with every secret replaced by ``***``), the run's identity
across starts (:func:`run_identity`, the run directory's tracking record), and one client per
tracker: :class:`WandbRun` (with :class:`WandbFileSteps`, which reads back what W&B's run file
holds) and :class:`MlflowRun`. Global rank zero only; ``wandb`` and ``mlflow`` are imported when a
run starts. How a run survives requeue, and why, is told in :mod:`jobgen.train.tracking`.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from jobgen.errors import REDACTED, ConfigError, TrackerError, redact_urls
from jobgen.jobdir.files import MLFLOW_DB_FILE, TRACKING_FILE, WANDB_SUBDIR
from jobgen.jobdir.runs import TrackingRecord, read_tracking_record, write_tracking_record
from jobgen.jobdir.spec import ResolvedSpec
from jobgen.planning.environment import TRACKER_CREDENTIALS
from jobgen.planning.tracking import KEY_FILES, MLFLOW_EXPERIMENT_ENV, MLFLOW_URI_ENV, WANDB_DEFAULT_PROJECT
from jobgen.specs.tracking import MlflowSpec, WandbSpec, check_tracking_uri

Status = Literal["FINISHED", "KILLED", "FAILED"]
Row = tuple[int, dict[str, float]]
#: MLflow's limits (mlflow/utils/validation.py, MLflow 3.x): metrics and params per log_batch call, param value length.
_MLFLOW_BATCH_METRICS, _MLFLOW_BATCH_PARAMS, _MLFLOW_PARAM_CHARS = 1000, 100, 6000


def say(text: str) -> None:
    """Print ``tracking: <text>`` on this rank's output (nothing when that output is gone)."""
    try:
        print(f"tracking: {text}", flush=True)
    except OSError:  # the job's output is gone (a launcher stopped reading it): nothing to tell
        pass


# --------------------------------------------------------------------------- what is sent


def secret_values(resolved: ResolvedSpec, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The values, in ``environ``, of the spec's ``secrets`` and of every tracker credential
    variable (:data:`jobgen.planning.environment.TRACKER_CREDENTIALS`): what must never reach a tracker
    (longest first, so that a value containing another is replaced whole)."""
    names = {*resolved.spec.secrets, *(n for names in TRACKER_CREDENTIALS.values() for n in names)}
    return sorted({v for n in names if len(v := environ.get(n, "")) >= 4}, key=len, reverse=True)


def scrub(value: Any, secrets: list[str]) -> Any:
    """``value`` (JSON data) with every string's URL credentials (:func:`jobgen.errors.redact_urls`)
    and every occurrence of a value of ``secrets`` replaced by ``***``."""
    if isinstance(value, str):
        text = redact_urls(value)
        for secret in secrets:
            text = text.replace(secret, REDACTED)
        return text
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, secrets) for v in value]
    return value


def flat_params(doc: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested JSON document as ``{"a.b.c": "<value>"}``: scalars as text (``null``, ``true``,
    numbers as JSON writes them), lists as JSON, empty mappings left out; sorted by key."""
    out: dict[str, str] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return dict(sorted(out.items()))


def read_key_files(resolved: ResolvedSpec, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """For each tracker with a key file (``wandb.api_key_file``, ``mlflow.token_file``), read it
    (``~`` expanded) into its variable in ``environ`` (this process only: the tracker reads it
    there). Global rank zero only.

    Raises:
        ConfigError: the file is missing, unreadable or empty.
    """
    t = resolved.spec.trainer
    for tracker in t.trackers:
        field, variable = KEY_FILES[tracker]
        path = getattr(getattr(t, tracker), field)
        if path is None:
            continue
        location = f"spec.trainer.{tracker}.{field}"
        try:
            key = Path(path).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {path} on {socket.gethostname()}: {exc.strerror or exc}", location=location,
                              hint=f"put the key into {path} on a filesystem the nodes see (chmod 600), or list {variable} "
                              "in secrets instead") from None
        if not key:
            raise ConfigError(f"{path} is empty", location=location, hint=f"write the key into {path}")
        environ[variable] = key


# --------------------------------------------------------------------------- the run's identity


def run_identity(run_dir: Path, resolved: ResolvedSpec, resumed_step: int | None) -> tuple[TrackingRecord, bool]:
    """The record this start logs under, written back when new; and whether the record was lost
    (none, while a checkpoint is resumed: the MLflow run is then looked up by job and run dir).

    A new record (a new tracker run) when ``checkpoint.resume`` is ``never``, when there is none,
    or when training starts from step 0 (no checkpoint resumed) after metrics were sent.
    """
    record = read_tracking_record(run_dir)
    lost = record is None and resumed_step is not None
    renew = (record is None or resolved.spec.checkpoint.resume == "never"
             or (resumed_step is None and (record.logged_step is not None or bool(record.logged_steps))))
    if renew:
        record = TrackingRecord.new()
        write_tracking_record(run_dir, record)
    assert record is not None
    return record, lost


# --------------------------------------------------------------------------- the trackers

#: Seconds between ``wandb-core``'s writes of the run's ``.wandb`` file (wandb's
#: ``x_transaction_log_flush_interval``, 15 s by default in wandb 0.31): what it holds in memory
#: is lost when it is killed (SLURM sends every process of a requeued step SIGTERM).
WANDB_FLUSH_S = 1.0
_BLOCK, _HEADER = 32768, 7  # LevelDB's log format: 32 KiB blocks, 7-byte record headers


def _flush_setting(wandb: Any) -> dict[str, float]:
    """``x_transaction_log_flush_interval`` for ``wandb.Settings``, where this wandb has it."""
    fields = getattr(wandb.Settings, "model_fields", {})
    return {"x_transaction_log_flush_interval": WANDB_FLUSH_S} if "x_transaction_log_flush_interval" in fields else {}


class WandbFileSteps:
    """The history steps in a W&B run file (``run-<id>.wandb``, the transaction log ``wandb-core``
    writes: offline, the whole run), read as it grows.

    The format (wandb 0.31 has no Python reader; ``wandb.proto`` has the records): a 7-byte
    header (``:W&B``, ...), then LevelDB's log format (32 KiB blocks, each record a 7-byte header:
    checksum, length, type: full 1, first 2, middle 3, last 4; then its bytes) of
    ``wandb_internal_pb2.Record`` messages. A record not yet complete (the end of the file, where
    ``wandb-core`` is writing or was killed) is read at the next :meth:`read`.
    """

    def __init__(self, path: Path):
        self.path = path
        self.max_step: int | None = None
        self._pos = 0
        self._pending = b""

    def read(self) -> int | None:
        """Read what was added since the last call; the highest history step so far (None: none)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return self.max_step
        if self._pos == 0:
            if len(data) < _HEADER or data[:4] != b":W&B":
                return self.max_step
            self._pos, data = _HEADER, data[_HEADER:]
        off = 0
        while True:
            room = _BLOCK - (self._pos + off) % _BLOCK
            if room < _HEADER:  # a block's zero trailer
                if len(data) - off < room:
                    break
                off += room
                continue
            if len(data) - off < _HEADER:
                break
            length, kind = int.from_bytes(data[off + 4:off + 6], "little"), data[off + 6]
            if kind not in (1, 2, 3, 4) or len(data) - off < _HEADER + length:
                break  # not written yet
            chunk = data[off + _HEADER:off + _HEADER + length]
            off += _HEADER + length
            if kind in (1, 2):
                self._pending = chunk
            else:
                self._pending += chunk
            if kind in (1, 4):
                self._record(self._pending)
                self._pending = b""
        self._pos += off
        return self.max_step

    def _record(self, data: bytes) -> None:
        from wandb.proto import wandb_internal_pb2 as pb

        record = pb.Record()
        try:
            record.ParseFromString(data)
        except Exception:  # noqa: BLE001 - a damaged record: not a step W&B holds
            return
        if record.WhichOneof("record_type") == "history":
            self.max_step = max(self.max_step if self.max_step is not None else -1, record.history.step.num)


class WandbRun:
    """A W&B run on global rank zero (``wandb.init(id=<run key>, resume="allow")``), see the module doc.

    Raises:
        TrackerError: ``wandb`` is missing or ``wandb.init`` failed (no key, no network).
    """

    name = "wandb"

    def __init__(self, options: WandbSpec, record: TrackingRecord, run_dir: Path, job: str, config: dict[str, Any]):
        try:
            import wandb
        except ImportError as exc:
            raise TrackerError(f"trainer.loggers has wandb, but it cannot be imported ({exc})", location="spec.trainer.loggers",
                               hint="pip install 'jobgen[tracking]' (or wandb) on every node") from None
        self.options, self.run_dir = options, run_dir
        # console off: the job's output is the scheduler's log; git off: jobgen records the code
        # snapshot's commit itself (and a remote URL may carry credentials)
        settings = wandb.Settings(console="off", disable_git=True, save_code=False, **_flush_setting(wandb))
        # Unset fields are W&B's own: entity and mode None let wandb read WANDB_ENTITY and
        # WANDB_MODE. The project and the directory are passed (wandb would name an unset project
        # after the git repository around the program, the job's code snapshot: one project per
        # job), from WANDB_PROJECT and WANDB_DIR where those are set.
        project = options.project or os.environ.get("WANDB_PROJECT") or WANDB_DEFAULT_PROJECT
        mode = options.mode or os.environ.get("WANDB_MODE") or "online"
        self.wandb_dir = Path(os.environ.get("WANDB_DIR") or run_dir)
        """Where W&B writes its run directories (``<it>/wandb/``): ``$WANDB_DIR``, else the run directory."""
        try:
            self.run = wandb.init(
                project=project, entity=options.entity, id=record.run_key, resume="allow",
                mode=options.mode, dir=str(self.wandb_dir), name=job,
                tags=list(options.tags) or None, settings=settings,
            )  # fmt: skip
            self.run.config.update(config, allow_val_change=True)
        except Exception as exc:  # noqa: BLE001 - wandb raises its own types (UsageError, CommError, ...)
            raise TrackerError(
                f"W&B could not start run {record.run_key} ({mode}): {type(exc).__name__}: {exc}",
                location="spec.trainer.wandb",
                hint="online needs a key (secrets: [WANDB_API_KEY], trainer.wandb.api_key_file or `wandb login`) and "
                "network access from the node; or log offline (trainer.wandb.mode: offline, or WANDB_MODE=offline on the "
                "nodes) and run wandb sync later",
            ) from None
        self.offline = mode == "offline"
        self._open: Row | None = None
        self._committed: int | None = None
        self._file = WandbFileSteps(Path(self.run.settings.sync_file)) if self.offline else None
        self.floor = self._held_before(record.run_key)
        """The highest step this W&B run held before this start (None: cannot tell; see :meth:`_held_before`)."""

    def _held_before(self, key: str) -> int | None:
        """Offline: the highest history step in the earlier pieces' files of this run
        (``<wandb_dir>/wandb/offline-run-*-<key>/run-<key>.wandb``; -1 when they hold none, None
        when there is no earlier piece). Online: the step before the resumed run's
        ``starting_step`` (W&B continues a run after its last step; -1 for a new run)."""
        if not self.offline:
            return self.run.starting_step - 1 if self.run.resumed else -1
        assert self._file is not None
        own = self._file.path.resolve()
        found = None
        for path in (self.wandb_dir / WANDB_SUBDIR).glob(f"offline-run-*-{key}/run-{key}.wandb"):
            if path.resolve() != own:
                step = WandbFileSteps(path).read()
                found = max(found if found is not None else -1, -1 if step is None else step)
        return found

    def log(self, rows: list[Row]) -> None:
        """Send ``rows`` (optimizer step, metrics), in step order. Each step is one W&B row,
        committed (``commit=True``: it goes to ``wandb-core`` and the run's file) once a later step
        arrives or :meth:`flush` is called: the rows of one step (the training row and the
        validation row come in separate calls) are merged first, as W&B drops a row logged at a
        step it has already committed."""
        for step, metrics in rows:
            if self._open is not None and step == self._open[0]:
                self._open = (step, {**self._open[1], **metrics})
                continue
            self.flush()
            if self._committed is not None and step <= self._committed:
                say(f"W&B row at step {step} not sent: W&B has committed step {self._committed}")
                continue
            self._open = (step, dict(metrics))

    def flush(self) -> None:
        """Commit the step still open (see :meth:`log`)."""
        if self._open is not None:
            step, metrics = self._open
            self._open = None
            self.run.log(metrics, step=step, commit=True)
            self._committed = step

    def confirmed_step(self) -> int | None:
        """The highest step W&B holds for sure (None: none). Offline: the highest history step in
        this piece's ``.wandb`` file (``wandb-core`` writes it every
        :data:`WANDB_FLUSH_S` seconds, and on finish), else the earlier pieces'. Online: the highest
        step committed to ``wandb-core`` (it uploads it; W&B tells a resumed start where it stands)."""
        before = self.floor
        if self._file is None:
            held = self._committed
        else:
            held = self._file.read()
        candidates = [s for s in (before, held) if s is not None and s >= 0]
        return max(candidates) if candidates else None

    def close(self, status: Status) -> None:
        """Commit the open step and finish the run (exit code 0 when finished, 1 otherwise;
        pre-empting when killed); finishing writes the rest of the run's file."""
        try:
            self.flush()
        finally:
            if status == "KILLED":
                self.run.mark_preempting()
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def describe(self) -> dict[str, Any]:
        """``summary.json``'s ``tracking.wandb``: id, mode, project, entity, url (online), dir and
        the sync command (offline)."""
        offline = bool(self.run.offline)
        mode = "offline" if offline else str(self.run.settings.mode)  # online, or WANDB_MODE's disabled
        piece = Path(self.run.dir).parent  # <dir>/wandb/offline-run-<time>-<id>/files
        pieces = f"{piece.parent}/offline-run-*-{self.run.id}"
        return {"id": self.run.id, "mode": mode, "project": self.run.project or None,
                "entity": self.run.entity or None, "url": self.run.url if mode == "online" else None,
                "dir": str(piece),
                **({"sync": f"wandb sync {pieces}"} if offline else {})}


class MlflowRun:
    """An MLflow run on global rank zero (``MlflowClient``), created once and resumed by id or
    tag (see the module doc); its id is written into ``record``.

    Raises:
        TrackerError: ``mlflow`` is missing or the tracking store refused (no server, bad token).
        ConfigError: ``$MLFLOW_TRACKING_URI`` on the node is a file store.
    """

    name = "mlflow"

    def __init__(self, options: MlflowSpec, record: TrackingRecord, lost: bool, run_dir: Path, job: str,
                 params: dict[str, str], tags: dict[str, str], resumed: bool):
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise TrackerError(f"trainer.loggers has mlflow, but it cannot be imported ({exc})", location="spec.trainer.loggers",
                               hint="pip install 'jobgen[tracking]' (or mlflow-skinny with sqlalchemy and alembic) on every node") from None
        self._metric, self._param, self._tag = Metric, Param, RunTag
        uri = options.tracking_uri or os.environ.get(MLFLOW_URI_ENV) or f"sqlite:///{run_dir / MLFLOW_DB_FILE}"
        if not options.tracking_uri and os.environ.get(MLFLOW_URI_ENV):
            try:
                check_tracking_uri(uri)
            except ValueError as exc:
                raise ConfigError(str(exc), location=f"environment: {MLFLOW_URI_ENV}") from None
        self.uri = uri
        try:
            self.client = MlflowClient(tracking_uri=uri)
            self.experiment_id = self._experiment(options.experiment)
            run = self._find(record, lost, job, run_dir)
            self.floor = -1
            """The highest step of the run's metrics before this start (-1: none)."""
            if run is None:
                run = self.client.create_run(self.experiment_id, run_name=job, tags={
                    "jobgen.run_key": record.run_key, "jobgen.job": job, "jobgen.run_dir": str(run_dir)})
            else:
                self.floor = max((m.step for key in run.data.metrics
                                  for m in self.client.get_metric_history(run.info.run_id, key)), default=-1)
                if resumed or run.info.status != "RUNNING":
                    self.client.update_run(run.info.run_id, status="RUNNING")
            self.run_id = run.info.run_id
            self._sent: int | None = None
            self._log_params(run.data.params, params)
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in sorted(tags.items())])
        except TrackerError:
            raise
        except Exception as exc:  # noqa: BLE001 - MlflowException, SQLAlchemy and HTTP errors
            raise TrackerError(f"MLflow could not start the run in {redact_urls(uri)}: {type(exc).__name__}: {exc}",
                               location="spec.trainer.mlflow",
                               hint="check the tracking URI and that the node reaches it (token: secrets: "
                               "[MLFLOW_TRACKING_TOKEN] or trainer.mlflow.token_file)") from None
        # a run found by job and run dir (the record was lost) keeps the run key it was created with
        key = run.data.tags.get("jobgen.run_key", record.run_key) if lost else record.run_key
        self.record = record.model_copy(update={"mlflow_run_id": self.run_id, "run_key": key})
        write_tracking_record(run_dir, self.record)

    def _experiment(self, name: str | None) -> str:
        name = name or os.environ.get(MLFLOW_EXPERIMENT_ENV) or None
        if name is None:
            return "0"  # MLflow's Default experiment
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # noqa: BLE001 - another job created it meanwhile (RESOURCE_ALREADY_EXISTS)
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _search(self, **tags: str) -> Any:
        query = " and ".join(f"tags.`{k}` = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in tags.items())
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=1,
                                       order_by=["attributes.start_time DESC"])
        return runs[0] if runs else None

    def _find(self, record: TrackingRecord, lost: bool, job: str, run_dir: Path) -> Any:
        """The run to continue: by recorded id, by ``jobgen.run_key``, or (record lost) by job and run dir."""
        if record.mlflow_run_id is not None:
            try:
                run = self.client.get_run(record.mlflow_run_id)
                if run.info.lifecycle_stage == "active":
                    return run
            except Exception:  # noqa: BLE001 - not in this store (deleted, or another tracking URI)
                pass
        run = self._search(**{"jobgen.run_key": record.run_key})
        if run is None and lost:
            run = self._search(**{"jobgen.job": job, "jobgen.run_dir": str(run_dir)})
            if run is not None:
                say(f"no {TRACKING_FILE} in {run_dir}; continuing MLflow run {run.info.run_id} "
                     "(found by its jobgen.job and jobgen.run_dir tags)")
        return run

    def _log_params(self, existing: Mapping[str, str], params: dict[str, str]) -> None:
        """Params not yet on the run (MLflow refuses to change one: a changed value is named, not sent)."""
        new = [self._param(k[:250], v[:_MLFLOW_PARAM_CHARS]) for k, v in params.items() if k[:250] not in existing]
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v[:_MLFLOW_PARAM_CHARS])
        for i in range(0, len(new), _MLFLOW_BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=new[i:i + _MLFLOW_BATCH_PARAMS])
        if changed:
            say(f"MLflow keeps the first value of changed parameter(s) {', '.join(changed[:5])}"
                 + (f" and {len(changed) - 5} more" if len(changed) > 5 else "") + " (MLflow params cannot change)")

    def log(self, rows: list[Row]) -> None:
        """Send ``rows`` (optimizer step, metrics) as metrics with their step, in batches."""
        now = int(time.time() * 1000)
        metrics = [self._metric(k, v, now, step) for step, row in rows for k, v in row.items()]
        for i in range(0, len(metrics), _MLFLOW_BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + _MLFLOW_BATCH_METRICS])
        if rows:
            self._sent = max(self._sent if self._sent is not None else -1, *(step for step, _ in rows))

    def flush(self) -> None:
        """Nothing: :meth:`log` returns once the tracking store has the metrics."""

    def confirmed_step(self) -> int | None:
        """The highest step the run holds (its metrics before this start, or a returned
        :meth:`log` call); None: none."""
        held = max(self.floor, -1 if self._sent is None else self._sent)
        return held if held >= 0 else None

    def close(self, status: Status) -> None:
        """Mark the run ``status`` (FINISHED, KILLED, FAILED)."""
        self.client.set_terminated(self.run_id, status)

    def describe(self) -> dict[str, Any]:
        """``summary.json``'s ``tracking.mlflow``: run id, experiment id, tracking URI (credentials
        hidden), and the run's page for a tracking server."""
        web = self.uri.startswith(("http://", "https://"))
        url = f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}" if web else None
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": redact_urls(self.uri),
                "url": None if url is None else redact_urls(url)}
