"""Kubernetes backend: submit a rendered job directory (PyTorchJob or TrainJob + ConfigMap)
with the official ``kubernetes`` client, then status, logs and cancel by handle
(``k8s://<context>/<namespace>/<name>``). Planning lives in :mod:`jobgen.backends.kubernetes.manifest`,
the API client in :mod:`jobgen.backends.kubernetes.api`; the operations are the methods of
:class:`KubernetesBackend`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jobgen.backends.base import Backend, Echo, JobStatus, LogOptions, PendingSubmit, SubmitOptions, SubmitResult, SubmittedJob, plan_spec_file
from jobgen.backends.kubernetes.api import ENV_CONTEXT, ENV_NAMESPACE, ApiError, Cluster, connect
from jobgen.backends.kubernetes.manifest import (
    ELASTIC_TEMPLATE,
    INPUTS_ANNOTATION,
    PYTORCHJOB,
    RUN_ROOT,
    TEMPLATES,
    TRAINJOB,
    TRAINJOB_NODE,
    K8sKind,
    config_map_name,
    core_path,
    job_collection,
    parse_manifest,
)
from jobgen.backends.kubernetes.manifest import plan as plan_manifest
from jobgen.backends.kubernetes.pods import container_started, job_pods, pod_evidence, pod_summary, pod_usage
from jobgen.backends.kubernetes.restarts import restarts_used
from jobgen.errors import ConfigError, SubmitError
from jobgen.jobdir.files import PYTORCHJOB_FILE, TRAINJOB_FILE
from jobgen.jobdir.submission import JobHandle, Submission
from jobgen.jobdir.world import World
from jobgen.planning.plan import JobPlan, PlanContext
from jobgen.reports.triage import LogLine, Triage, parse_rfc3339, triage
from jobgen.specs.k8s_names import is_dns1123_label

# --------------------------------------------------------------------------- the job directory


@dataclass(frozen=True)
class JobDir:
    """A rendered Kubernetes job directory, read back for submission.

    Attributes:
        path: the directory (absolute).
        kind: PyTorchJob or TrainJob.
        objects: the manifest's objects in file order (ConfigMap first, then the job).
        job: the job object (one of ``objects``).
        inputs_sha256: from the job's ``jobgen.dev/inputs-sha256`` annotation.
    """

    path: Path
    kind: K8sKind
    objects: tuple[dict[str, Any], ...]
    job: dict[str, Any]
    inputs_sha256: str

    @property
    def name(self) -> str:
        """The job object's name."""
        return str(self.job["metadata"]["name"])

    @property
    def namespace(self) -> str:
        """The namespace the manifest names."""
        return str(self.job["metadata"].get("namespace") or "default")


def read_job_dir(job_dir: Path) -> JobDir:
    """Read ``pytorchjob.yaml`` or ``trainjob.yaml`` from a rendered job directory.

    Raises:
        ConfigError: no manifest (or both), invalid YAML, or no job object with jobgen's
            inputs annotation in it.
    """
    found = [kind for kind in (PYTORCHJOB, TRAINJOB) if (job_dir / kind.manifest).is_file()]
    if len(found) != 1:
        raise ConfigError(
            f"{job_dir} is not a rendered Kubernetes job directory (needs exactly one of {PYTORCHJOB_FILE}, {TRAINJOB_FILE})",
            hint="render it first: jobgen render SPEC --profile <kubernetes profile>",
        )
    kind = found[0]
    path = job_dir / kind.manifest
    docs = parse_manifest(path.read_text(encoding="utf-8"), str(path))
    jobs = [d for d in docs if d.get("kind") == kind.kind and d.get("apiVersion") == kind.api_version]
    if len(jobs) != 1:
        raise ConfigError(f"{path} must hold exactly one {kind.kind} ({kind.api_version}), found {len(jobs)}", hint="re-render the job directory")
    digest = (jobs[0].get("metadata", {}).get("annotations") or {}).get(INPUTS_ANNOTATION)
    if not digest:
        raise ConfigError(f"{path}: the {kind.kind} has no {INPUTS_ANNOTATION} annotation (not rendered by jobgen?)",
                          hint="re-render the job directory with jobgen render")
    return JobDir(job_dir.resolve(), kind, tuple(docs), jobs[0], str(digest))


def planned_job_dir(job_dir: Path, plan: JobPlan) -> JobDir | None:
    """The :class:`JobDir` of ``plan`` just written into ``job_dir``, from the objects the plan
    parsed and checked (``plan.cluster_object.objects``) instead of the manifest read back;
    None when the plan does not carry them."""
    target = plan.cluster_object
    if target is None or not target.objects:
        return None
    kind = next(k for k in (PYTORCHJOB, TRAINJOB) if k.kind == target.kind)
    job = next(o for o in target.objects if o.get("kind") == kind.kind and o.get("apiVersion") == kind.api_version)
    return JobDir(job_dir.resolve(), kind, target.objects, job, plan.inputs_sha256)


# --------------------------------------------------------------------------- handles


def make_handle(context: str, namespace: str, name: str) -> JobHandle:
    """``k8s://<context>/<namespace>/<name>``."""
    return JobHandle("k8s", f"{context}/{namespace}/{name}")


def parse_handle(handle: JobHandle) -> tuple[str, str, str]:
    """``(context, namespace, name)`` of ``k8s://<context>/<ns>/<name>``. The context may itself
    contain ``/`` (EKS contexts are ARNs), so the path splits from the right.

    Raises:
        ConfigError: not a k8s handle, or namespace/name are not DNS labels.
    """
    parts = handle.path.rsplit("/", 2)
    if handle.scheme != "k8s" or len(parts) != 3 or not parts[0] or not is_dns1123_label(parts[1]) or not is_dns1123_label(parts[2]):
        raise ConfigError(f"{handle} is not a Kubernetes job handle", hint="Kubernetes handles look like k8s://<context>/<namespace>/<name>")
    return parts[0], parts[1], parts[2]


def pruned_paths(sent: Any, returned: Any, prefix: str = "") -> list[str]:
    """Paths of keys in ``sent`` that ``returned`` lacks: what an API server without strict
    field validation dropped (pruned) from the object. Values may differ (defaults,
    normalised quantities); only missing keys count."""
    out: list[str] = []
    if isinstance(sent, dict) and isinstance(returned, dict):
        for key, value in sent.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in returned:
                out.append(path)
            else:
                out += pruned_paths(value, returned[key], path)
    elif isinstance(sent, list) and isinstance(returned, list) and len(sent) == len(returned):
        for i, (a, b) in enumerate(zip(sent, returned, strict=True)):
            out += pruned_paths(a, b, f"{prefix}[{i}]")
    return out


def replica_pods(job: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(pod name, Pod object)`` for the first pod of each replica type, as the operator would
    create it from the template (name ``<job>-<type>-0``; the TrainJob's node pod gets
    ``<job>-node-0-0``), for a Pod server-side dry run."""
    from jobgen.backends.kubernetes.validate import pod_templates

    meta = job["metadata"]
    pods = []
    for role, _, template in pod_templates(job):
        name = f"{meta['name']}-{role}-0" + ("-0" if job.get("kind") == "TrainJob" else "")
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": meta.get("namespace", "default"),
                            "labels": dict((template.get("metadata") or {}).get("labels") or {})},
               "spec": template.get("spec") or {}}
        pods.append((name, pod))
    return pods


def server_dry_run(cluster: Cluster, kind: K8sKind, objects: tuple[dict[str, Any], ...],
                   out: Callable[[str], None] = print) -> list[str]:
    """Ask the API server to validate everything ``submit`` would create, persisting nothing
    (``dryRun=All``): the ConfigMap, the job (with ``fieldValidation=Strict`` where the server
    has it, else a check that nothing was pruned from the answer), and a Pod made from each
    replica's template (the only place Kubernetes applies Pod validation and admission:
    requests vs limits, priority classes, quotas, security policies).

    Returns one line per object checked.

    Raises:
        ApiError / SubmitError: the server rejected an object (its message is shown), or a
            field was pruned.
    """
    strict_query = [("fieldValidation", "Strict")] if cluster.field_validation else []
    lines = []
    job = next(o for o in objects if o.get("kind") == kind.kind)
    namespace = job["metadata"]["namespace"]
    checks: list[tuple[str, str, dict[str, Any]]] = []
    for obj in objects:
        if obj.get("kind") == "ConfigMap":
            checks.append((f"ConfigMap {obj['metadata']['name']}", core_path(namespace, "configmaps"), obj))
        elif obj is job:
            checks.append((f"{kind.kind} {job['metadata']['name']}", job_collection(kind, namespace), obj))
    checks += [(f"Pod {name} (from the {kind.kind}'s pod template)", core_path(namespace, "pods"), pod) for name, pod in replica_pods(job)]
    for label, path, body in checks:
        try:
            returned = cluster.request("POST", path, query=[("dryRun", "All"), *strict_query], body=body)
        except ApiError as exc:
            if exc.status == 409:  # validation and admission passed; the object exists already
                lines.append(f"{label}: valid (it exists already)")
                continue
            raise ApiError(f"the API server rejected {label} (dry run): {exc.message}", status=exc.status, reason=exc.reason,
                           hint=_hint_for(exc, kind, namespace)) from None
        pruned = pruned_paths(body, returned)
        if pruned:
            raise SubmitError(
                f"the API server accepted {label} but dropped field(s) it does not know: {', '.join(pruned)}",
                hint="the cluster's API (or the CRD version installed) is older than the manifest; fix the field or upgrade the CRD",
            )
        lines.append(f"{label}: valid" + ("" if strict_query else " (no pruned fields)"))
    mode = "fieldValidation=Strict" if strict_query else "server without strict field validation: pruning checked client-side"
    out(f"server-side dry run on context {cluster.context} ({mode}):")
    for line in lines:
        out(f"  {line}")
    return lines


def _hint_for(exc: ApiError, kind: K8sKind, namespace: str) -> str:
    if exc.status == 404 and "namespaces" in exc.message and f'"{namespace}" not found' in exc.message:
        return f"create the namespace first: kubectl create namespace {namespace}"
    if exc.status == 404:
        return f"is the {kind.kind} CRD ({kind.plural}.{kind.group}) installed? kubectl get crd {kind.plural}.{kind.group}"
    if exc.status == 403:
        return "your credentials may not create these objects in this namespace (RBAC)"
    return "the server's message names the field; fix the profile (or template) and re-render"


def _get_job(cluster: Cluster, kind: K8sKind, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return cluster.request("GET", f"{job_collection(kind, namespace)}/{name}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _wait_gone(cluster: Cluster, kind: K8sKind, namespace: str, name: str, wait_s: float,
               out: Callable[[str], None]) -> None:
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        current = _get_job(cluster, kind, namespace, name)
        if current is None:
            return
        if time.monotonic() > deadline:
            finalizers = current.get("metadata", {}).get("finalizers") or []
            raise SubmitError(
                f"{kind.kind} {namespace}/{name} still exists {wait_s:.0f} s after a foreground delete"
                + (f" (finalizers: {', '.join(finalizers)})" if finalizers else ""),
                hint="foreground deletion waits for the job's pods; the cluster's garbage collector (kube-controller-manager) "
                "removes them — check `kubectl get pods -l training.kubeflow.org/job-name=" + name + "`",
            )
        if not announced:
            out(f"jobgen: waiting for {kind.kind} {namespace}/{name} and its pods to be deleted ...")
            announced = True
        time.sleep(0.5)


def _delete_job(cluster: Cluster, kind: K8sKind, namespace: str, name: str) -> bool:
    """Delete with foreground propagation (pods go first, then the job); False if absent."""
    try:
        cluster.request("DELETE", f"{job_collection(kind, namespace)}/{name}",
                        body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"})
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _apply_config_map(cluster: Cluster, config_map: dict[str, Any], strict_query: list[tuple[str, str]]) -> dict[str, Any]:
    namespace, name = config_map["metadata"]["namespace"], config_map["metadata"]["name"]
    try:
        return cluster.request("POST", core_path(namespace, "configmaps"), query=strict_query, body=config_map)
    except ApiError as exc:
        if exc.status != 409:
            raise
    current = cluster.request("GET", f"{core_path(namespace, 'configmaps')}/{name}")
    labels = (current.get("metadata", {}).get("labels") or {})
    if labels.get("app.kubernetes.io/managed-by") != "jobgen":
        raise SubmitError(f"ConfigMap {namespace}/{name} exists and was not created by jobgen",
                          hint="rename the job (name: in the spec) or remove that ConfigMap")
    body = {**config_map, "metadata": {**config_map["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    return cluster.request("PUT", f"{core_path(namespace, 'configmaps')}/{name}", query=strict_query, body=body)


def resolve_target(*, context: str | None, namespace: str | None, profile_context: str | None = None) -> tuple[str | None, str | None]:
    """The context and namespace to use: the flag, else ``$JOBGEN_K8S_CONTEXT`` /
    ``$JOBGEN_K8S_NAMESPACE``, else the profile's context (the namespace then comes from the
    manifest); None: the kubeconfig's current context / the manifest's namespace."""
    return (context or os.environ.get(ENV_CONTEXT) or profile_context,
            namespace or os.environ.get(ENV_NAMESPACE) or None)


def _record(jd: JobDir, handle: JobHandle, kind: K8sKind, kubeconfig: str | None) -> Submission:
    _, _, name = parse_handle(handle)
    record = Submission.now(handle=str(handle), job_dir=str(jd.path), run_dir=f"{RUN_ROOT}/{name} (in the pods)",
                        inputs_sha256=jd.inputs_sha256, kind=f"{kind.plural}.{kind.group}/{kind.version}",
                        kubeconfig=kubeconfig)
    record.save()
    return record


def _recorded(job: SubmittedJob) -> tuple[list[K8sKind], str | None]:
    """The kinds to look for (the recorded one first) and the recorded kubeconfig."""
    record = job.record
    kinds = [PYTORCHJOB, TRAINJOB]
    if record is None:
        return kinds, None
    kinds.sort(key=lambda k: f"{k.plural}.{k.group}/{k.version}" != record.kind)
    return kinds, record.kubeconfig


def _find(submitted: SubmittedJob, kubeconfig: str | None = None) -> tuple[Cluster, K8sKind, str, str, dict[str, Any] | None]:
    """``(cluster, kind, namespace, name, object)`` of the job ``submitted``: its kind the one
    its record names, tried first, else the other; ``object`` None when neither exists.
    ``kubeconfig``: this file instead of the recorded one."""
    context, namespace, name = parse_handle(submitted.handle)
    kinds, recorded = _recorded(submitted)
    cluster = connect(context, kubeconfig or recorded)
    for kind in kinds:
        try:
            job = _get_job(cluster, kind, namespace, name)
        except ApiError as exc:
            if exc.status == 404:  # the CRD is not installed: try the other kind
                continue
            raise
        if job is not None:
            return cluster, kind, namespace, name, job
    return cluster, kinds[0], namespace, name, None


# --------------------------------------------------------------------------- status, logs, cancel

#: Condition type -> jobgen state, most decisive first (kubeflow common JobConditionType for
#: PyTorchJob; Trainer v2 TrainJob says Complete/Failed/Suspended). A job that succeeded is
#: COMPLETED, the word the other backends use (``ls --state COMPLETED`` finds every such job);
#: ``details["condition"]`` keeps the operator's own word.
_CONDITION_STATES = (("Failed", "FAILED"), ("Succeeded", "COMPLETED"), ("Complete", "COMPLETED"), ("Suspended", "SUSPENDED"),
                     ("Restarting", "RESTARTING"), ("Running", "RUNNING"), ("Created", "CREATED"))


def job_state(job: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """``(state, details)`` from a job object's ``status``: the most decisive condition that is
    True (FAILED, COMPLETED for Succeeded/Complete, SUSPENDED, RESTARTING, RUNNING, CREATED),
    TERMINATING while a delete is in progress, SUBMITTED when no controller has reported yet;
    a TrainJob without a condition is RUNNING once its ``jobsStatus`` has an active Job (Trainer
    v2.3.0 sets none while it runs). Details hold the condition's type, reason and message,
    replica counts (``master``, ``worker``: "active 1 succeeded 0 failed 0"; a TrainJob's
    replicated Jobs, ``node``: "jobs active 1 ready 1 succeeded 0 failed 0 suspended 0": counts of
    Jobs, not pods) and start/completion times."""
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if str(c.get("status")) == "True"}
    details: dict[str, str] = {}
    state = "SUBMITTED"
    for ctype, name in _CONDITION_STATES:
        if ctype in conditions:
            state = name
            cond = conditions[ctype]
            details["condition"] = ctype
            details["reason"] = str(cond.get("reason") or "")
            details["message"] = str(cond.get("message") or "")
            break
    else:
        details["reason"] = "no conditions yet: the operator has not picked the job up (is it running in the cluster?)"
        # Trainer v2.3.0 sets no condition while a TrainJob runs: its JobSet's Jobs say so.
        if any(int(j.get("active") or 0) > 0 for j in status.get("jobsStatus") or []):
            state, details["reason"] = "RUNNING", "jobsStatus: active Jobs (a running TrainJob has no condition)"
    if job.get("metadata", {}).get("deletionTimestamp"):
        state = "TERMINATING"
    for role, counts in sorted((status.get("replicaStatuses") or {}).items()):
        details[role.lower()] = " ".join(f"{key} {counts.get(key, 0)}" for key in ("active", "succeeded", "failed"))
    for entry in status.get("jobsStatus") or []:  # TrainJob: counts of the JobSet's Jobs, not of pods
        details[str(entry.get("name"))] = "jobs " + " ".join(f"{key} {entry.get(key, 0)}" for key in ("active", "ready", "succeeded", "failed", "suspended"))
    for key, field in (("started", "startTime"), ("completed", "completionTime")):
        if status.get(field):
            details[key] = str(status[field])
    return state, details


#: Seconds ``submit --replace`` waits for the old job to be gone before creating the new one.
REPLACE_WAIT_S = 120.0

#: Seconds between two looks at a followed job (``jobgen logs -f``).
LOG_POLL_S = 2.0

_REPLICA_RE = re.compile(r"^(master|worker|node)-(\d+)$")


def replica_selector(kind: K8sKind, name: str, replica: str) -> tuple[str | None, str | None, str]:
    """How to find the pod of ``replica`` (``master-0``, ``worker-3``; ``node-1`` for a TrainJob):
    ``(pod name, label selector, container)`` — the operator names PyTorchJob pods
    ``<job>-<type>-<index>`` (container ``pytorch``); JobSet names TrainJob pods with a random
    suffix, so those are found by labels (container ``node``).

    Raises:
        ConfigError: ``replica`` is not ``<type>-<index>`` or names a type the job does not have.
    """
    match = _REPLICA_RE.match(replica)
    valid = ("node",) if kind is TRAINJOB else ("master", "worker")
    if not match or match.group(1) not in valid:
        example = "node-0, node-1" if kind is TRAINJOB else "master-0, worker-0, worker-1"
        raise ConfigError(f"--replica {replica!r} is not a replica of this {kind.kind}", hint=f"use one of: {example}")
    if kind is PYTORCHJOB:
        return f"{name}-{replica}", None, "pytorch"
    selector = (f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name={TRAINJOB_NODE},"
                f"batch.kubernetes.io/job-completion-index={match.group(2)}")
    return None, selector, TRAINJOB_NODE


def _pod(cluster: Cluster, namespace: str, pod_name: str | None, selector: str | None) -> dict[str, Any] | None:
    if pod_name is not None:
        try:
            return cluster.request("GET", f"{core_path(namespace, 'pods')}/{pod_name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
    items = cluster.request("GET", core_path(namespace, "pods"), query=[("labelSelector", selector or "")]).get("items") or []
    items.sort(key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "")
    return items[-1] if items else None


def iter_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Split a byte stream into text lines (UTF-8, undecodable bytes replaced); a final line
    without a newline is yielded too."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


def _current_state(cluster: Cluster, kind: K8sKind, namespace: str, name: str) -> str:
    """The job's state now (see :func:`job_state`), ``UNKNOWN`` once it is gone."""
    job = _get_job(cluster, kind, namespace, name)
    return "UNKNOWN" if job is None else job_state(job)[0]


def _restart_key(pod: dict[str, Any], container: str) -> tuple[str, int]:
    """What changes when ``container`` starts again: the pod's uid (the operator recreated the
    pod) and the container's ``restartCount`` (the kubelet restarted it in place)."""
    count = next((int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or []
                  if cs.get("name") == container), 0)
    return str((pod.get("metadata") or {}).get("uid", "")), count


def _wait_for_restart(cluster: Cluster, kind: K8sKind, namespace: str, name: str, pod: dict[str, Any], container: str,
                      selector: str | None, poll_s: float) -> str | None:
    """After a followed log stream of ``pod`` ended: wait until its container starts again
    (None: attach again) or there is nothing more to follow: the job ended ("") or the pod did
    (phase Succeeded/Failed: a sentence naming the pod and its exit code), while the job may run on."""
    seen = _restart_key(pod, container)
    pod_name = pod["metadata"]["name"]
    while True:
        if _current_state(cluster, kind, namespace, name) in ("COMPLETED", "FAILED", "TERMINATING", "UNKNOWN", "CANCELLED"):
            return ""
        now = _pod(cluster, namespace, None if selector else pod_name, selector)
        if now is not None and _restart_key(now, container) != seen and container_started(now, container):
            return None
        phase = ((now or {}).get("status") or {}).get("phase")
        if now is not None and _restart_key(now, container) == seen and phase in ("Succeeded", "Failed"):
            code = next(((cs.get("state") or {}).get("terminated", {}).get("exitCode")
                         for cs in now["status"].get("containerStatuses") or [] if cs.get("name") == container), None)
            return f"{pod_name} ended (exit code {'?' if code is None else code}, pod {phase})"
        time.sleep(poll_s)


def _previous_ended(pod: dict[str, Any], container: str) -> bool:
    """Whether the kubelet keeps the log of an earlier run of ``container`` (restarted in place:
    ``lastState.terminated``), which ``previous=true`` reads."""
    return any(cs.get("name") == container and (cs.get("lastState") or {}).get("terminated")
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


@dataclass
class KubernetesSubmit(PendingSubmit):
    """A Kubernetes submission on its way: where to (the context and namespace, None: the
    kubeconfig's current context and the manifest's namespace), the kubeconfig file, and the
    plan's objects (None: read back from the manifest)."""

    context: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    planned: JobDir | None = None


class KubernetesBackend(Backend):
    """Kubeflow PyTorchJob / Trainer v2 TrainJob through the Kubernetes API."""

    name = "kubernetes"
    templates = TEMPLATES

    def templates_for(self, world: World) -> tuple[str, ...]:
        """The fixed-size templates, plus the elastic PyTorchJob's for an elastic world (so fixed
        jobs keep their inputs hash)."""
        return (*TEMPLATES, ELASTIC_TEMPLATE) if world.elastic else TEMPLATES

    submit_options = frozenset({"dry_run", "replace", "context", "namespace", "kubeconfig"})
    log_options = frozenset({"replica"})

    def plan(self, ctx: PlanContext) -> JobPlan:
        """See :func:`jobgen.backends.kubernetes.manifest.plan`."""
        return plan_manifest(ctx)

    def begin_submit(self, job_dir: Path, options: SubmitOptions, out: Echo, plan: JobPlan | None) -> KubernetesSubmit:
        """Where to submit the rendered directory (:meth:`~jobgen.backends.base.Backend.submit` runs
        the steps; :meth:`launch` creates the objects). Context, namespace and kubeconfig: the
        options, then ``$JOBGEN_K8S_CONTEXT`` / ``$JOBGEN_K8S_NAMESPACE``, then the profile the
        directory's spec.json names (when it can be found), then the kubeconfig's current context.
        With ``plan`` the profile is the one it was planned with (its ``cluster_object``), not
        loaded again, and the objects sent are the plan's (not read back from the manifest).
        Nothing is snapshotted or written on this machine before the launch: the image holds the
        code, and the cluster's Secrets the secrets.

        Raises:
            ConfigError: ``job_dir`` holds no valid spec.json.
        """
        from jobgen.jobdir.spec import read_resolved_spec

        resolved = plan.resolved if plan is not None and plan.resolved is not None else read_resolved_spec(job_dir)
        target = plan.cluster_object if plan is not None else None
        if target is not None:
            profile_context, profile_kubeconfig = target.context, target.kubeconfig
        else:
            from jobgen.specs.load import load_profile

            try:
                settings = load_profile(resolved.profile).kubernetes
            except (OSError, ValueError, ConfigError):
                settings = None
                out(f"jobgen: profile {resolved.profile!r} named in {job_dir}/spec.json was not found; using the kubeconfig's context")
            profile_context = settings.context if settings else None
            profile_kubeconfig = settings.kubeconfig if settings else None
        context, namespace = resolve_target(context=options.context, namespace=options.namespace, profile_context=profile_context)
        return KubernetesSubmit(job_dir, options, out, plan, resolved, spec_file=plan_spec_file(plan),
                                context=context, namespace=namespace, kubeconfig=options.kubeconfig or profile_kubeconfig,
                                planned=planned_job_dir(job_dir, plan) if plan is not None else None)

    def launch(self, job: PendingSubmit) -> SubmitResult:
        """Submit the rendered manifest in ``job.job_dir`` (what is committed is what runs): the
        manifest's objects as the plan just written there holds them (:func:`planned_job_dir`), else
        read back from the manifest.

        An existing job of the same name is compared by its ``jobgen.dev/inputs-sha256``
        annotation: identical inputs -> nothing is changed (``unchanged``, no request beyond the
        read); other inputs -> refused unless ``options.replace``. Before anything is deleted or created,
        :func:`server_dry_run` validates every object (``options.dry_run`` stops there); ``replace`` then
        deletes the old job (foreground: its pods first), waits up to :data:`REPLACE_WAIT_S` for it to go, and
        creates the new one. The ConfigMap is
        created (or updated) first and then owned by the job, so deleting the job removes it.
        The submission is recorded in the job directory and the state index.

        Raises:
            ConfigError: not a Kubernetes job directory; kubeconfig/context problems.
            SubmitError: the server rejected an object, the job exists with other inputs (without
                ``replace``), or the cluster cannot be reached.
        """
        assert isinstance(job, KubernetesSubmit)
        job_dir, namespace, kubeconfig, replace, out = job.job_dir, job.namespace, job.kubeconfig, job.options.replace, job.out
        jd = job.planned if job.planned is not None else read_job_dir(job_dir)
        objects = [json.loads(json.dumps(o)) for o in jd.objects]  # deep copy; namespace may change
        ns = namespace or jd.namespace
        for obj in objects:
            obj.setdefault("metadata", {})["namespace"] = ns
        if namespace and namespace != jd.namespace:
            out(f"jobgen: submitting into namespace {ns} (the manifest says {jd.namespace})")
        cluster = connect(job.context, kubeconfig)
        kind = jd.kind
        existing = _get_job(cluster, kind, ns, jd.name)
        if job.options.dry_run:
            if existing is not None:
                same = (existing.get("metadata", {}).get("annotations") or {}).get(INPUTS_ANNOTATION) == jd.inputs_sha256
                out(f"jobgen: {kind.kind} {ns}/{jd.name} exists with {'identical' if same else 'other'} inputs")
            return SubmitResult("validated", None, None, tuple(server_dry_run(cluster, kind, tuple(objects), out=out)))
        handle = make_handle(cluster.context, ns, jd.name)
        action = "created"
        if existing is not None:
            old = (existing.get("metadata", {}).get("annotations") or {}).get(INPUTS_ANNOTATION)
            if existing.get("metadata", {}).get("deletionTimestamp"):
                raise SubmitError(f"{kind.kind} {ns}/{jd.name} is being deleted", hint="wait until `jobgen status` says UNKNOWN, then submit again")
            if old == jd.inputs_sha256 and not replace:
                return SubmitResult("unchanged", handle, _record(jd, handle, kind, kubeconfig))
            if not replace:
                raise SubmitError(
                    f"{kind.kind} {ns}/{jd.name} already exists with other inputs (inputs sha256 {str(old)[:12]}..., "
                    f"this directory {jd.inputs_sha256[:12]}...)",
                    hint=f"`jobgen submit {job_dir} --replace` deletes the running job and its pods and creates this one; "
                    "or give the job another name",
                )
        lines = tuple(server_dry_run(cluster, kind, tuple(objects), out=out))  # preflight: nothing is deleted or created if it fails
        if existing is not None:
            out(f"jobgen: replacing {kind.kind} {ns}/{jd.name} (inputs {str(old)[:12]}... -> {jd.inputs_sha256[:12]}...)")
            _delete_job(cluster, kind, ns, jd.name)
            _wait_gone(cluster, kind, ns, jd.name, REPLACE_WAIT_S, out)
            action = "replaced"
        strict_query = [("fieldValidation", "Strict")] if cluster.field_validation else []
        config_map = next((o for o in objects if o.get("kind") == "ConfigMap"), None)
        if config_map is not None:
            _apply_config_map(cluster, config_map, strict_query)
        job = next(o for o in objects if o.get("kind") == kind.kind)
        try:
            created = cluster.request("POST", job_collection(kind, ns), query=strict_query, body=job)
        except ApiError as exc:
            raise ApiError(f"the API server rejected {kind.kind} {ns}/{jd.name}: {exc.message}", status=exc.status, reason=exc.reason,
                           hint=_hint_for(exc, kind, ns)) from None
        if config_map is not None:  # the job owns its ConfigMap: deleting the job garbage-collects it
            owner = {"apiVersion": kind.api_version, "kind": kind.kind, "name": jd.name, "uid": created["metadata"]["uid"],
                     "blockOwnerDeletion": False}
            cm_path = f"{core_path(ns, 'configmaps')}/{config_map['metadata']['name']}"
            current = cluster.request("GET", cm_path)
            current["metadata"]["ownerReferences"] = [owner]
            cluster.request("PUT", cm_path, body=current)
        return SubmitResult(action, handle, _record(jd, handle, kind, kubeconfig), lines)

    def status(self, job: SubmittedJob) -> JobStatus:
        """The job's state from the API server (see :func:`job_state`), with what each of its pods
        is doing (``details["pods"]``, :func:`~jobgen.backends.kubernetes.pods.pod_summary`; absent before
        the controller made any) and their device-hours. When the object does not exist:
        ``CANCELLED`` (source ``jobgen cancel``) if `jobgen cancel` deleted it (the submission
        record's ``cancelled_at``), else ``UNKNOWN`` (deleted by someone else, or never created).

        Raises:
            ConfigError: not a k8s handle, or no usable kubeconfig context.
            SubmitError: the API server cannot be reached or refuses the request.
        """
        handle = job.handle
        cluster, kind, namespace, name, obj = _find(job)
        if obj is None:
            record = job.record
            if record is not None and record.cancelled_at:
                return JobStatus(handle, "CANCELLED", "jobgen cancel", {
                    "cancelled_at": record.cancelled_at, "reason": f"`jobgen cancel` deleted {kind.kind} {namespace}/{name}"})
            return JobStatus(handle, "UNKNOWN", "kube-apiserver", {"reason": f"no {kind.kind} {namespace}/{name} (deleted, or never created)"})
        state, details = job_state(obj)
        details["kind"] = kind.kind
        pods, container = job_pods(cluster, kind, namespace, name)
        if pods:
            details["pods"] = pod_summary(pods, name, container)
        details |= restarts_used(cluster, namespace, obj, pods, container)
        return JobStatus(handle, state, "kube-apiserver", details, pod_usage(pods, container, job),
                         evidence=pod_evidence(pods, name, container))

    def logs(self, job: SubmittedJob, options: LogOptions, out: Echo = print) -> None:
        """Print the output of one replica's pod, ``options.replica`` (default ``master-0``: global rank zero lives
        there; ``node-0`` for a TrainJob; ``worker-0`` for an elastic PyTorchJob, which has no Master: its rendezvous store runs
        there, while global rank zero runs on whichever pod the rendezvous ranks first, named by an
        ``elastic: global rank 0 runs on <host>`` line in every pod's log); with ``options.follow``, wait for
        the pod to start, stream until the job ends, and attach again after a container restart (a
        new container or pod, :func:`_restart_key`); a pod that ended while the job runs on (a worker
        done before the Master) ends the follow, saying so.

        Raises:
            ConfigError: bad ``replica``; no such job.
            SubmitError: the API server cannot be reached or refuses the request.
        """
        self.check_options(options)
        replica, follow, poll_s = options.replica or None, options.follow, LOG_POLL_S
        handle = job.handle
        cluster, kind, namespace, name, obj = _find(job)
        if obj is None:
            raise ConfigError(f"no {kind.kind} {namespace}/{name} on context {cluster.context}", hint="check `jobgen status` (deleted?)")
        if replica is None:  # a TrainJob's global rank 0 is on node-0 (PET_NODE_RANK 0)
            roles = (obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}
            replica = f"{TRAINJOB_NODE}-0" if kind is TRAINJOB else "worker-0" if roles and "Master" not in roles else "master-0"
            if replica == "worker-0":
                out("jobgen: an elastic job has no Master: showing worker-0; global rank 0 may run on another worker "
                    "(the 'elastic: global rank 0 runs on <host>' line names it; --replica worker-N)")
        pod_name, selector, container = replica_selector(kind, name, replica)
        announced = ""
        attached = 0
        while True:
            pod = _pod(cluster, namespace, pod_name, selector)
            state = _current_state(cluster, kind, namespace, name)
            if pod is None or not container_started(pod, container):
                what = f"no pod for {replica} yet" if pod is None else f"pod {pod['metadata']['name']} is {(pod.get('status') or {}).get('phase', 'Pending')}"
                if not follow or state in ("COMPLETED", "FAILED", "UNKNOWN", "CANCELLED"):
                    out(f"jobgen: {handle} is {state}; {what}" + (" (jobgen logs -f waits for it)" if not follow else ""))
                    return
                if announced != what:
                    out(f"jobgen: {handle} is {state}; {what}; waiting (Ctrl-C stops)")
                    announced = what
                time.sleep(poll_s)
                continue
            query = [("container", container)] + ([("follow", "true")] if follow else [])
            if attached:
                out(f"jobgen: {pod['metadata']['name']} restarted; attaching again")
                query.append(("sinceSeconds", str(max(1, int(poll_s * 2)))))
            response = cluster.request("GET", f"{core_path(namespace, 'pods')}/{pod['metadata']['name']}/log", query=query,
                                       timeout=(30.0, None) if follow else 60.0, stream=True)  # type: ignore[arg-type]
            try:
                for line in iter_lines(response.stream(64 * 1024)):
                    out(line)
            finally:
                response.release_conn()
            attached += 1
            if not follow:
                return
            ended = _wait_for_restart(cluster, kind, namespace, name, pod, container, selector, poll_s)
            if ended is not None:
                if ended:
                    out(f"jobgen: {ended}; {handle} is {_current_state(cluster, kind, namespace, name)}")
                return

    def first_error(self, job: SubmittedJob) -> Triage:
        """Each pod's first failure, earliest first, from every pod of the job (current and
        finished), read with the kubelet's timestamps (``timestamps=true``: RFC 3339 per line). A
        container restarted in place is read twice: its previous run (``previous=true``, the one
        the kubelet keeps), then its current one, which after a crash may not have failed again yet.

        Raises:
            ConfigError: no such job.
            SubmitError: the API server cannot be reached or refuses the request.
        """
        cluster, kind, namespace, name, obj = _find(job)
        if obj is None:
            raise ConfigError(f"no {kind.kind} {namespace}/{name} on context {cluster.context}", hint="check `jobgen status` (deleted?)")
        pods, container = job_pods(cluster, kind, namespace, name)
        lines: list[LogLine] = []
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            node = (pod.get("spec") or {}).get("nodeName")
            if not container_started(pod, container):
                continue
            position = 0
            for previous in (True, False) if _previous_ended(pod, container) else (False,):
                query = [("container", container), ("timestamps", "true"), *([("previous", "true")] if previous else [])]
                try:
                    response = cluster.request("GET", f"{core_path(namespace, 'pods')}/{pod_name}/log", query=query, timeout=60.0,
                                               stream=True)  # type: ignore[arg-type]
                except ApiError:
                    if previous:  # gone since the pod was read (restarted again, garbage-collected): the current run still counts
                        continue
                    raise
                try:
                    for line in iter_lines(response.stream(64 * 1024)):
                        stamp, _, text = line.partition(" ")
                        when = parse_rfc3339(stamp)
                        lines.append(LogLine(f"pod {pod_name}", None, node, position, when, text if when else line))
                        position += 1
                finally:
                    response.release_conn()
        return triage(lines)

    def cancel(self, job: SubmittedJob, *, wait_s: float = 120.0, out: Echo = print) -> JobStatus:
        """Delete the job with foreground propagation (its pods are deleted first, then the job) and
        wait up to ``wait_s`` until it is gone; then remove its ConfigMap if the garbage collector
        has not; the submission record (if any) notes ``cancelled_at``, so :meth:`status` says
        CANCELLED afterwards. Returns ``DELETED`` (or ``UNKNOWN`` when there was no such job).

        Raises:
            SubmitError: the job still exists after ``wait_s`` (the message names its finalizers),
                or the API server refuses.
        """
        handle = job.handle
        cluster, kind, namespace, name, obj = _find(job)
        if obj is None or not _delete_job(cluster, kind, namespace, name):
            return JobStatus(handle, "UNKNOWN", "kube-apiserver", {"reason": f"no {kind.kind} {namespace}/{name} to delete"})
        record = job.record
        if record is not None:
            record.model_copy(update={"cancelled_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}).save()
        _wait_gone(cluster, kind, namespace, name, wait_s, out)
        cm_path = f"{core_path(namespace, 'configmaps')}/{config_map_name(name)}"
        try:
            current = cluster.request("GET", cm_path)
            if (current.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "jobgen":
                cluster.request("DELETE", cm_path)
        except ApiError as exc:
            if exc.status != 404:
                raise
        return JobStatus(handle, "DELETED", "kube-apiserver", {"kind": kind.kind, "propagation": "Foreground"})
