"""The emulated Kubeflow training-operator: what training-operator v1.9's PyTorchJob controller
does to a cluster, for the Kubernetes labs (the real one is a Go program that cannot be built
here: no Go module proxy). It is the one emulated part of the pod lab; everything it talks to is
real (kube-apiserver, etcd, the garbage collector, and in the pod lab the kubelets).

Run it as a process::

    python tests/integration/k8s/training_operator.py --kubeconfig KUBECONFIG --context CONTEXT

or import it (:class:`Operator`, :func:`operator_env`, :func:`desired_pod`, ...). It needs the
standard library and the official ``kubernetes`` client only; nothing from jobgen.

Read from kubeflow/training-operator at tag v1.9.0 (commit 6f74c7f6b; pkg/ is the same on the
release-1.9 branch, and jobgen ships the v1.9.3/v1.9.4 CRDs, whose schema is unchanged). The
sources, all under pkg/:

* controller.v1/pytorch/envvar.go (``setPodEnv``), master.go, elastic.go: the variables appended
  to every container (see :func:`injected_env`);
* controller.v1/pytorch/initcontainer.go, config/config.go: the ``init-pytorch`` container
  (alpine:3.10, ``nslookup`` of the Master's Service, 100 tries) added to Worker pods when the
  job has a Master;
* apis/kubeflow.org/v1/pytorch_defaults.go, defaulting_utils.go: defaults (replicas 1,
  restartPolicy OnFailure, port ``pytorchjob-port`` 23456, cleanPodPolicy None, nprocPerNode
  "auto", elastic min/max);
* controller.v1/common/job.go (``ReconcileJobs``), pod.go (``ReconcilePods``, ``createNewPod``),
  service.go (``ReconcileServices``, ``CreateNewService``), job_controller.go (labels, owner
  reference), core/job.go (``PastBackoffLimit``), core/pod.go (``SetRestartPolicy``),
  core/status.go (replica counts), util/status.go (``setCondition``), util/train/train_util.go
  (``IsRetryableExitCode``: exit codes >= 128 are retryable);
* controller.v1/pytorch/pytorchjob_controller.go: ``UpdateJobStatus`` (the success policy: the
  job succeeds when the Master succeeds, or without a Master when every Worker did, or, elastic,
  when one did), ``onOwnerCreateFunc`` (the Created condition), status written with
  ``Status().Update`` (PUT on the /status subresource).

Emulated as v1.9 does it: pods ``<job>-<replica type lowercased>-<index>`` from the replica's
template with the operator's labels, a controller owner reference (blockOwnerDeletion) and the
injected environment; one headless Service per pod (same name, all of the ``pytorch``
container's ports); restart policies Always, OnFailure, Never and ExitCode (the pod gets
restartPolicy Never; a retryable exit deletes it and the next pass recreates it); backoffLimit as
v1.9 counts it (container restartCounts of Running pods, plus "a new failure and backoffLimit 0",
because its work queue never counts requeues); activeDeadlineSeconds; cleanPodPolicy and
ttlSecondsAfterFinished; suspend/resume; conditions with v1.9's reasons, messages and transition
rules; replicaStatuses with their selector; startTime, completionTime.

Not emulated: the admission webhooks (validation; the defaults are applied in memory, as the
reconciler's ``Scheme.Default`` does, never written back), Events, metrics, gang scheduling
(PodGroups), the HPA of elasticPolicy.metrics, adoption (and release) of orphaned pods, leader
election, the informer cache and its expectations (each pass reads the API server instead, one
pass at a time), the other job kinds (TFJob, MPIJob, ...).
Replica types are visited Master then Worker (Go's map order is random: when the Master succeeds
the pass ends before the Worker's failure check, as it may in v1.9). Faithful quirks of v1.9 that
show here: a retryable ExitCode failure never exhausts a backoffLimit above 0, and a permanent
ExitCode failure sets Failed without a completionTime.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # imported from this directory or run as a script: the repository's tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

# The PyTorchJob objects the controller derives (pytorchjob.py); the names tests use are re-exported here.
from tests.integration.k8s.pytorchjob import (  # noqa: E402, F401
    CONTROLLER_NAME,
    GROUP,
    INIT_CONTAINER_IMAGE,
    INIT_CONTAINER_MAX_TRIES,
    JOB_NAME_LABEL,
    JOB_ROLE_LABEL,
    KIND,
    MANAGED_BY,
    MASTER,
    OPERATOR_NAME_LABEL,
    PLURAL,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    VERSION,
    WORKER,
    _condition_true,
    _exit_code,
    _is_active,
    _parse_time,
    _pod_phase,
    _reason,
    defaulted,
    desired_pod,
    desired_service,
    init_containers,
    injected_env,
    is_finished,
    job_labels,
    now,
    operator_env,
    replica_name,
    set_condition,
)
from tests.processes import process_running  # noqa: E402

log = logging.getLogger("jobgen-lab-operator")


# --------------------------------------------------------------------------- the controller


class Operator:
    """The PyTorchJob controller. :meth:`reconcile` runs one pass for one job (importable, for
    tests); :meth:`run` watches PyTorchJobs, and the pods and Services the operator labels, in
    all namespaces, and reconciles the jobs they belong to until ``stop`` is set."""

    def __init__(self, api_client: Any, *, init_image: str = INIT_CONTAINER_IMAGE, init_max_tries: int = INIT_CONTAINER_MAX_TRIES,
                 init_template: str | None = None, resync_s: float = 30.0):
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.init_image, self.init_max_tries, self.init_template, self.resync_s = init_image, init_max_tries, init_template, resync_s
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    # ----- API helpers (plain dicts, camelCase as on the wire)

    def _raw(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        response = call(*args, _preload_content=False, **kwargs)
        return json.loads(response.data or b"{}")

    def _get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._raw(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _owned(self, kind: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        selector = ",".join(f"{k}={v}" for k, v in job_labels(name).items())
        call = self.core.list_namespaced_pod if kind == "pod" else self.core.list_namespaced_service
        items = self._raw(call, namespace, label_selector=selector).get("items") or []
        if kind == "service":  # GetServicesForJob: by label only
            return items
        uid = job["metadata"]["uid"]  # ClaimPods: pods this job controls (orphans are not adopted here)
        return [p for p in items if any(r.get("controller") and r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

    def _ignore(self, status: int, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            call(*args, _preload_content=False, **kwargs)  # the answer is not needed (nor always the type the client expects)
        except ApiException as exc:
            if exc.status != status:
                raise

    def _delete_pod(self, pod: dict[str, Any]) -> None:
        if pod["metadata"].get("deletionTimestamp"):  # pod_control.go: terminating, skip
            return
        log.info("deleting pod %s/%s", pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._ignore(404, self.core.delete_namespaced_pod, pod["metadata"]["name"], pod["metadata"]["namespace"])

    def _delete_service(self, namespace: str, name: str) -> None:
        self._ignore(404, self.core.delete_namespaced_service, name, namespace)

    def _write_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        """UpdateJobStatusInApiServer: PUT the object with the new status on /status (a conflict
        raises: the caller requeues)."""
        body = {**job, "status": status}
        self.custom.replace_namespaced_custom_object_status(GROUP, VERSION, job["metadata"]["namespace"], PLURAL,
                                                            job["metadata"]["name"], body, _preload_content=False)

    # ----- one reconcile pass (common/job.go ReconcileJobs)

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One pass over job ``namespace``/``name``; returns seconds until it needs another pass
        regardless of events (activeDeadlineSeconds, ttlSecondsAfterFinished), or None."""
        stored = self._get_job(namespace, name)
        if stored is None or stored["metadata"].get("deletionTimestamp"):
            return None
        managed_by = ((stored.get("spec") or {}).get("runPolicy") or {}).get("managedBy")
        if managed_by and managed_by != MANAGED_BY:
            return None
        job = defaulted(stored)
        status = copy.deepcopy(stored.get("status") or {})
        set_condition(status, "Created", "True", _reason("Created"), f"{KIND} {name} is created.")  # onOwnerCreateFunc
        old = copy.deepcopy(status)
        run_policy = job["spec"]["runPolicy"]
        replicas = job["spec"]["pytorchReplicaSpecs"]
        rtypes = sorted(replicas)
        pods = self._owned("pod", job)
        services = self._owned("service", job)

        if is_finished(status):
            requeue = self._clean_up(job, run_policy, status, pods)
            if _condition_true(status, "Succeeded"):
                for counts in (status.get("replicaStatuses") or {}).values():
                    if counts.get("active"):
                        counts["succeeded"] = counts.get("succeeded", 0) + counts.pop("active")
            if status != old:
                self._write_status(stored, status)
            return requeue

        if run_policy.get("suspend"):
            self._clean_up(job, run_policy, status, pods)
            for counts in (status.get("replicaStatuses") or {}).values():
                counts.pop("active", None)
            message = f"{KIND} {name} is suspended."
            if _condition_true(status, "Running"):
                set_condition(status, "Running", "False", _reason("Suspended"), message)
            if not _condition_true(status, "Suspended"):
                set_condition(status, "Suspended", "True", _reason("Suspended"), message)
            if status != old:
                self._write_status(stored, status)
            return None
        if _condition_true(status, "Suspended"):
            set_condition(status, "Suspended", "False", _reason("Resumed"), f"{KIND} {name} is resumed.")
            status["startTime"] = now()

        active = sum(1 for p in pods if _is_active(p))
        failed = sum(1 for p in pods if _pod_phase(p) == "Failed")
        total = sum(int(r["replicas"]) for r in replicas.values())
        previously_failed = sum(int(c.get("failed", 0)) for c in (status.get("replicaStatuses") or {}).values())
        failure = None
        limit = run_policy.get("backoffLimit")
        if limit is not None:
            # previousRetry is 0: v1.9 runs this reconciler with a FakeWorkQueue (NumRequeues 0)
            exceeds = failed > previously_failed and active != total and 0 + 1 > int(limit)
            if exceeds or self._past_backoff_limit(job, pods, int(limit)):
                failure = f"Job {name} has failed because it has reached the specified backoff limit"
        if failure is None and self._past_active_deadline(run_policy, status):
            failure = f"Job {name} has failed because it was active longer than specified deadline"
        if failure is not None:
            status.setdefault("completionTime", now())
            self._delete_pods_and_services(run_policy, status, pods)
            requeue = self._cleanup_job(job, run_policy, status)
            set_condition(status, "Failed", "True", _reason("Failed"), failure)
            self._write_status(stored, status)
            return requeue

        for rtype in rtypes:
            self._reconcile_pods(job, status, pods, rtype)
            self._reconcile_services(job, services, rtype)
        self._update_job_status(job, status)
        if status != old:
            self._write_status(stored, status)
        deadline = run_policy.get("activeDeadlineSeconds")
        if deadline is not None and status.get("startTime"):
            return max(0.0, _parse_time(status["startTime"]) + int(deadline) - time.time())
        return None

    def _past_backoff_limit(self, job: dict[str, Any], pods: list[dict[str, Any]], limit: int) -> bool:
        """core/job.go ``PastBackoffLimit``: restartCounts of the Running pods of replicas whose
        policy is OnFailure, Always or ExitCode."""
        restarts = 0
        for rtype, replica in job["spec"]["pytorchReplicaSpecs"].items():
            if replica["restartPolicy"] not in ("OnFailure", "Always", "ExitCode"):
                continue
            for pod in pods:
                if pod["metadata"].get("labels", {}).get(REPLICA_TYPE_LABEL) != rtype.lower() or _pod_phase(pod) != "Running":
                    continue
                pod_status = pod.get("status") or {}
                for cs in (pod_status.get("initContainerStatuses") or []) + (pod_status.get("containerStatuses") or []):
                    restarts += int(cs.get("restartCount", 0))
        return restarts > 0 if limit == 0 else restarts >= limit

    @staticmethod
    def _past_active_deadline(run_policy: dict[str, Any], status: dict[str, Any]) -> bool:
        deadline = run_policy.get("activeDeadlineSeconds")
        if deadline is None or not status.get("startTime"):
            return False
        return time.time() - _parse_time(status["startTime"]) >= int(deadline)

    def _delete_pods_and_services(self, run_policy: dict[str, Any], status: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """common/job.go ``DeletePodsAndServices`` (cleanPodPolicy applies to finished jobs only)."""
        if not pods:
            return
        finished = is_finished(status)
        if finished and run_policy["cleanPodPolicy"] == "None":
            return
        for pod in pods:
            if finished and run_policy["cleanPodPolicy"] == "Running" and _pod_phase(pod) not in ("Running", "Pending"):
                continue
            self._delete_pod(pod)
            self._delete_service(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _cleanup_job(self, job: dict[str, Any], run_policy: dict[str, Any], status: dict[str, Any]) -> float | None:
        """common/job.go ``CleanupJob``: ttlSecondsAfterFinished deletes the job; returns the seconds left."""
        ttl = run_policy.get("ttlSecondsAfterFinished")
        if ttl is None or run_policy.get("suspend"):
            return None
        if not status.get("completionTime"):
            log.warning("job %s: completion time is nil, cannot cleanup", job["metadata"]["name"])
            return None
        remaining = _parse_time(status["completionTime"]) + int(ttl) - time.time()
        if remaining < 0:
            log.info("deleting job %s/%s (ttlSecondsAfterFinished)", job["metadata"]["namespace"], job["metadata"]["name"])
            self._ignore(404, self.custom.delete_namespaced_custom_object, GROUP, VERSION, job["metadata"]["namespace"], PLURAL,
                         job["metadata"]["name"])
            return None
        return remaining

    def _clean_up(self, job: dict[str, Any], run_policy: dict[str, Any], status: dict[str, Any], pods: list[dict[str, Any]]) -> float | None:
        self._delete_pods_and_services(run_policy, status, pods)
        return self._cleanup_job(job, run_policy, status)

    def _reconcile_pods(self, job: dict[str, Any], status: dict[str, Any], pods: list[dict[str, Any]], rtype: str) -> None:
        """common/pod.go ``ReconcilePods``."""
        replica = job["spec"]["pytorchReplicaSpecs"][rtype]
        count = int(replica["replicas"])
        name = job["metadata"]["name"]
        counts: dict[str, int] = {}
        status.setdefault("replicaStatuses", {})[rtype] = counts  # initializeReplicaStatuses
        slices: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            if labels.get(REPLICA_TYPE_LABEL) != rtype.lower():
                continue
            try:
                slices.setdefault(int(labels[REPLICA_INDEX_LABEL]), []).append(pod)
            except (KeyError, ValueError):
                log.warning("pod %s has no replica index", pod["metadata"]["name"])
        for index in range(max([count, *(i + 1 for i in slices)])):
            found = slices.get(index, [])
            if len(found) > 1:
                log.warning("too many pods for %s %d", rtype.lower(), index)
                continue
            if not found:
                if index < count:
                    self._create(job, rtype, index)
                continue
            pod = found[0]
            if index >= count:
                self._delete_pod(pod)
            if _pod_phase(pod) == "Failed":
                code, policy = _exit_code(pod), replica["restartPolicy"]
                if (policy == "ExitCode" and code >= 128) or policy in ("OnFailure", "Always"):
                    self._delete_pod(pod)
                    set_condition(status, "Restarting", "True", _reason("Restarting"),
                                  f"job {name} is restarting because {rtype} replica(s) failed.")
                elif policy == "ExitCode":
                    set_condition(status, "Failed", "True", _reason("Failed"), f'job "{name}" is failing because "{rtype}" replica(s) failed.')
            phase = _pod_phase(pod)  # core/status.go UpdateJobReplicaStatuses
            key = {"Running": "failed" if pod["metadata"].get("deletionTimestamp") else "active", "Succeeded": "succeeded",
                   "Failed": "failed"}.get(phase)
            if key:
                counts[key] = counts.get(key, 0) + 1

    def _create(self, job: dict[str, Any], rtype: str, index: int) -> None:
        from kubernetes.client.exceptions import ApiException

        pod = desired_pod(job, rtype, index, init_image=self.init_image, init_max_tries=self.init_max_tries, init_template=self.init_template)
        log.info("creating pod %s/%s", pod["metadata"]["namespace"], pod["metadata"]["name"])
        try:
            self.core.create_namespaced_pod(pod["metadata"]["namespace"], pod, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:  # already exists: the previous pod is still being deleted; the next pass sees it
                raise

    def _reconcile_services(self, job: dict[str, Any], services: list[dict[str, Any]], rtype: str) -> None:
        """common/service.go ``ReconcileServices``."""
        count = int(job["spec"]["pytorchReplicaSpecs"][rtype]["replicas"])
        slices: dict[int, list[dict[str, Any]]] = {}
        for svc in services:
            labels = svc["metadata"].get("labels") or {}
            if labels.get(REPLICA_TYPE_LABEL) == rtype.lower() and (labels.get(REPLICA_INDEX_LABEL) or "").isdigit():
                slices.setdefault(int(labels[REPLICA_INDEX_LABEL]), []).append(svc)
        for index in range(max([count, *(i + 1 for i in slices)])):
            found = slices.get(index, [])
            if len(found) > 1:
                log.warning("too many services for %s %d", rtype, index)
            elif not found and index < count:
                self._ignore(409, self.core.create_namespaced_service, job["metadata"]["namespace"], desired_service(job, rtype, index))
            elif found and index >= count:
                self._delete_service(job["metadata"]["namespace"], found[0]["metadata"]["name"])

    def _update_job_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        """pytorchjob_controller.go ``UpdateJobStatus``."""
        name = job["metadata"]["name"]
        replicas = job["spec"]["pytorchReplicaSpecs"]
        status.setdefault("startTime", now())
        for rtype in sorted(replicas):
            counts = status["replicaStatuses"].setdefault(rtype, {})
            labels = {**job_labels(name), REPLICA_TYPE_LABEL: rtype.lower()}
            counts["selector"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))  # metav1.FormatLabelSelector
            succeeded, running, failed = counts.get("succeeded", 0), counts.get("active", 0), counts.get("failed", 0)
            wanted = int(replicas[rtype]["replicas"])
            expected = wanted - succeeded
            if MASTER in replicas:
                if rtype == MASTER:
                    if running > 0:
                        set_condition(status, "Running", "True", _reason("Running"), f"{KIND} {name} is running.")
                    if expected == 0:
                        status.setdefault("completionTime", now())
                        set_condition(status, "Succeeded", "True", _reason("Succeeded"), f"{KIND} {name} is successfully completed.")
                        return
            elif rtype == WORKER:
                namespace = job["metadata"]["namespace"]
                if expected == 0 or (job["spec"].get("elasticPolicy") is not None and succeeded > 0):
                    status.setdefault("completionTime", now())
                    set_condition(status, "Succeeded", "True", _reason("Succeeded"), f"{KIND} {namespace}/{name} successfully completed.")
                elif running > 0:
                    set_condition(status, "Running", "True", _reason("Running"), f"{KIND} {namespace}/{name} is running.")
            if failed > 0 and wanted > succeeded + running:
                if replicas[rtype]["restartPolicy"] != "Never":
                    set_condition(status, "Restarting", "True", _reason("Restarting"),
                                  f"{KIND} {name} is restarting because {failed} {rtype} replica(s) failed.")
                else:
                    status.setdefault("completionTime", now())
                    set_condition(status, "Failed", "True", _reason("Failed"), f"{KIND} {name} is failed because {failed} {rtype} replica(s) failed.")

    # ----- the event loop

    def enqueue(self, namespace: str, name: str, after: float = 0.0) -> None:
        if after > 0:
            timer = threading.Timer(after, self.enqueue, (namespace, name))
            timer.daemon = True
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
            timer.start()
            return
        with self._lock:
            if (namespace, name) in self._queued:
                return
            self._queued.add((namespace, name))
        self._queue.put((namespace, name))

    def _watch(self, what: str, stop: threading.Event) -> None:
        """Watch ``what`` (jobs, pods, services) in all namespaces and enqueue the job each event
        belongs to; every watch starts with the current objects (a resync)."""
        from kubernetes import watch

        selector = f"{OPERATOR_NAME_LABEL}={CONTROLLER_NAME}"
        calls = {
            "jobs": (self.custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL), {}),
            "pods": (self.core.list_pod_for_all_namespaces, (), {"label_selector": selector}),
            "services": (self.core.list_service_for_all_namespaces, (), {"label_selector": selector}),
        }
        call, args, kwargs = calls[what]
        while not stop.is_set():
            watcher = watch.Watch(return_type="object")  # plain dicts: no client model to outgrow
            try:
                for event in watcher.stream(call, *args, timeout_seconds=max(1, int(self.resync_s)), **kwargs):
                    if event["type"] == "ERROR":  # e.g. 410 Gone: the watch ends, the next one lists again
                        log.info("watch %s: %s", what, event["raw_object"].get("message"))
                        break
                    meta = event["raw_object"]["metadata"]
                    if what == "jobs":
                        self.enqueue(meta["namespace"], meta["name"])
                    else:
                        owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller") and r.get("kind") == KIND), None)
                        if owner is not None:
                            self.enqueue(meta["namespace"], owner["name"])
                    if stop.is_set():
                        break
            except Exception as exc:  # the server went away, a watch expired: start again
                if not stop.is_set():
                    log.warning("watch %s: %s", what, exc)
                    stop.wait(1.0)
            finally:
                watcher.stop()

    def run(self, stop: threading.Event) -> None:
        """Watch and reconcile until ``stop`` is set."""
        from kubernetes.client.exceptions import ApiException

        threads = [threading.Thread(target=self._watch, args=(what, stop), name=f"watch-{what}", daemon=True)
                   for what in ("jobs", "pods", "services")]
        for thread in threads:
            thread.start()
        log.info("watching %s.%s/%s, pods and services in all namespaces", PLURAL, GROUP, VERSION)
        while not stop.is_set():
            try:
                key = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            with self._lock:
                self._queued.discard(key)
            try:
                after = self.reconcile(*key)
            except ApiException as exc:
                log.info("reconcile %s/%s: %s %s; again", *key, exc.status, exc.reason)
                self.enqueue(*key, after=0.2)
                continue
            except Exception:
                log.exception("reconcile %s/%s failed; again in 1 s", *key)
                self.enqueue(*key, after=1.0)
                continue
            if after is not None:
                self.enqueue(*key, after=after + 0.05)
        for timer in self._timers:
            timer.cancel()
        for thread in threads:  # daemon threads: a watch still waiting on the server ends with the process
            thread.join(timeout=0.5)


@contextlib.contextmanager
def operator_process(kubeconfig: Path | str, log_path: Path, *args: str, context: str = "jobgen-lab") -> Iterator[subprocess.Popen[bytes]]:
    """This module run as a process (``--kubeconfig KUBECONFIG --context CONTEXT --resync-s 10
    ARGS``) for the ``with`` block, its output in ``log_path``; stopped (TERM, then KILL after
    15 s) on the way out. Raises AssertionError when it exits at start or when its log shows a
    traceback (a controller pass that failed) once it has stopped."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--kubeconfig", str(kubeconfig), "--context", context, "--resync-s", "10", *args]
    with process_running(argv, log_path, "operator") as proc:
        yield proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The emulated training-operator v1.9 PyTorchJob controller (jobgen's k8s labs).")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--context", default=None)
    parser.add_argument("--pytorch-init-container-image", default=INIT_CONTAINER_IMAGE)
    parser.add_argument("--pytorch-init-container-max-tries", type=int, default=INIT_CONTAINER_MAX_TRIES)
    parser.add_argument("--pytorch-init-container-template-file", default=None,
                        help="a YAML list of init containers for Worker pods (v1.9's flag; unreadable: the default template)")
    parser.add_argument("--resync-s", type=float, default=30.0, help="how long one watch lasts before it starts again (a resync)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from kubernetes import config

    api_client = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)
    template = None
    if args.pytorch_init_container_template_file:
        try:
            with open(args.pytorch_init_container_template_file) as fh:
                template = fh.read()
        except OSError as exc:  # v1.9 falls back to its default template too
            log.warning("init container template: %s; the default one is used", exc)
    operator = Operator(api_client, init_image=args.pytorch_init_container_image, init_max_tries=args.pytorch_init_container_max_tries,
                        init_template=template, resync_s=args.resync_s)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    operator.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
