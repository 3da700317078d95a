"""``jobgen doctor`` on a Kubernetes profile: what the profile names, checked against the API
server of its context (``kubernetes.context``, else ``$JOBGEN_K8S_CONTEXT``, else the current
one) in its namespace (``$JOBGEN_K8S_NAMESPACE`` overrides it, as for ``jobgen submit``).

Checks, in order: ``kubernetes.api`` (the server answers ``/version``), ``crd`` (the CRD of
``job_api`` serves the version jobgen renders), ``operator`` (a running controller pod for it),
``namespace``, ``claim`` (``runs_volume_claim``: exists, Bound, ReadWriteMany), ``priority_class``,
``local_queue`` (Kueue), ``secrets`` (each Secret and key ``secret_env`` names, and each
``image_pull_secrets`` entry; never a value), ``nodes`` (enough schedulable nodes with the
profile's GPU model and count) and, with ``--probe``, ``image`` (a pod with the profile's image
starts on a node; it is deleted afterwards). Only GETs, except the probe's pod.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import time
from collections.abc import Callable, Iterator
from typing import Any

from jobgen.backends.kubernetes import api as k8s_api
from jobgen.backends.kubernetes.api import ENV_CONTEXT, ENV_NAMESPACE, ApiError, Cluster
from jobgen.backends.kubernetes.detect import LOCALQUEUE_CRD, PRODUCT_LABEL, read_nodes, shown, storage_version
from jobgen.backends.kubernetes.manifest import KINDS, K8sKind
from jobgen.doctor import Check, DoctorContext, needs_probe, skipped_after
from jobgen.errors import JobgenError

#: The commands that install each operator (training-operator v1.9 standalone overlay; Kubeflow
#: Trainer v2 manager overlay), from their installation guides.
INSTALL = {
    "pytorchjob": 'kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.3"',
    "trainjob": 'kubectl apply --server-side -k "https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"',
}
#: Label selectors of each operator's controller pods (the upstream manifests' Deployments).
CONTROLLER_SELECTORS = {
    "pytorchjob": ("control-plane=kubeflow-training-operator", "app.kubernetes.io/name=training-operator"),
    "trainjob": ("app.kubernetes.io/name=trainer", "control-plane=kubeflow-trainer-controller-manager"),
}
#: Waiting reasons of a container whose image cannot be pulled (kubelet's images package).
PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable",
               "ImageInspectError")
#: Label on the probe pod, so a leftover one is found (``kubectl delete pod -l``).
PROBE_LABEL = "jobgen.io/doctor-probe"
CHECKS = ("api", "crd", "operator", "namespace", "claim", "priority_class", "local_queue", "secrets", "nodes", "image")


def checks(ctx: DoctorContext) -> Iterator[Check]:
    """The checks of the module docstring, one :class:`~jobgen.doctor.Check` each, in that order.
    After ``kubernetes.api`` fails, every other check is a skip naming it."""
    k = ctx.profile.kubernetes
    assert k is not None  # ClusterProfile requires it for scheduler: kubernetes
    namespace = os.environ.get(ENV_NAMESPACE) or k.namespace
    try:
        cluster = k8s_api.connect(os.environ.get(ENV_CONTEXT) or k.context, k.kubeconfig)
        version = cluster.request("GET", "/version")
    except JobgenError as exc:
        yield Check("kubernetes.api", "fail", exc.message.splitlines()[0], exc.hint or "")
        for name in CHECKS[1:]:
            yield skipped_after(f"kubernetes.{name}", "kubernetes.api")
        return
    git = version.get("gitVersion") if isinstance(version, dict) else None
    yield Check("kubernetes.api", "pass", f"context {shown(cluster.context)}: Kubernetes {shown(git or '(version not given)')}")
    kind = KINDS[k.job_api]
    crd = _crd_check(cluster, kind, k.job_api)
    yield crd
    yield (_operator_check(cluster, k.job_api) if crd.status == "pass" else skipped_after("kubernetes.operator", "kubernetes.crd"))
    ns = _namespace_check(cluster, namespace, ctx.profile_source)
    yield ns
    if ns.status == "fail":
        for name in ("claim", "local_queue", "secrets"):
            yield skipped_after(f"kubernetes.{name}", "kubernetes.namespace")
    else:
        yield _claim_check(cluster, namespace, ctx)
    yield _priority_class_check(cluster, k.priority_class, ctx.profile_source)
    if ns.status != "fail":
        yield _local_queue_check(cluster, namespace, k.queue_label, ctx.profile_source)
        yield _secrets_check(cluster, namespace, ctx)
    yield _nodes_check(cluster, ctx)
    if not ctx.probe:
        yield needs_probe("kubernetes.image", "a pod with kubernetes.image on a node, which pulls the image")
    elif ns.status == "fail":
        yield skipped_after("kubernetes.image", "kubernetes.namespace")
    else:
        yield _image_probe(cluster, namespace, ctx)


def _get(cluster: Cluster, path: str) -> Any:
    """The object at ``path``, or None when it does not exist (404)."""
    try:
        return cluster.request("GET", path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _forbidden(name: str, exc: ApiError, what: str) -> Check:
    return Check(name, "skip", f"not checked: your credentials may not read {what} ({exc.status} {exc.reason or 'Forbidden'})")


class _Forbidden(Exception):
    """The API server answered 403 while a check read: ``check`` is that check's result."""

    def __init__(self, check: Check):
        super().__init__(check.name)
        self.check = check


@contextlib.contextmanager
def _forbidden_skips(name: str, what: str) -> Iterator[None]:
    """The reads inside: a 403 ends the check ``name`` as skipped (:func:`_forbidden`: the
    credentials may not read ``what``), inside a check decorated with
    :func:`_skip_when_forbidden`; any other :class:`ApiError` propagates."""
    try:
        yield
    except ApiError as exc:
        if exc.status == 403:
            raise _Forbidden(_forbidden(name, exc, what)) from None
        raise


def _skip_when_forbidden(check: Callable[..., Check]) -> Callable[..., Check]:
    """``check`` returning the skip of a 403 met inside :func:`_forbidden_skips`."""

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Check:
        try:
            return check(*args, **kwargs)
        except _Forbidden as forbidden:
            return forbidden.check

    return run


def _names(doc: Any) -> list[str]:
    items = doc.get("items") if isinstance(doc, dict) else None
    return sorted(str((item.get("metadata") or {}).get("name")) for item in items or [] if isinstance(item, dict))


def _listing(names: list[str]) -> str:
    return ", ".join(shown(n) for n in names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "") or "(none)"


@_skip_when_forbidden
def _crd_check(cluster: Cluster, kind: K8sKind, job_api: str) -> Check:
    name = f"{kind.plural}.{kind.group}"
    with _forbidden_skips("kubernetes.crd", "CustomResourceDefinitions"):
        crd = _get(cluster, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    operator = "the Kubeflow training operator" if job_api == "pytorchjob" else "Kubeflow Trainer v2"
    if crd is None:
        return Check("kubernetes.crd", "fail", f"CRD {name} is not installed: the cluster cannot run a {kind.kind} "
                     f"(kubernetes.job_api: {job_api})", f"install {operator}: {INSTALL[job_api]}; or set kubernetes.job_api "
                     "to the API the cluster has")
    versions = [v for v in (crd.get("spec") or {}).get("versions") or [] if isinstance(v, dict)]
    served = [str(v.get("name")) for v in versions if v.get("served")]
    if kind.version not in served:
        return Check("kubernetes.crd", "fail", f"CRD {name} serves {_listing(served)}, not {kind.version}, which jobgen renders",
                     f"upgrade {operator}: {INSTALL[job_api]}")
    return Check("kubernetes.crd", "pass", f"CRD {name} serves {kind.api_version}")


@_skip_when_forbidden
def _operator_check(cluster: Cluster, job_api: str) -> Check:
    pods: list[dict[str, Any]] = []
    with _forbidden_skips("kubernetes.operator", "pods in all namespaces"):
        for selector in CONTROLLER_SELECTORS[job_api]:
            doc = cluster.request("GET", "/api/v1/pods", query=[("labelSelector", selector)])
            pods += [p for p in (doc.get("items") or []) if isinstance(p, dict)]
            if pods:
                break
    selectors = " or ".join(CONTROLLER_SELECTORS[job_api])
    if not pods:
        return Check("kubernetes.operator", "skip", f"no controller pod labelled {selectors} in any namespace: it may run "
                     "outside the cluster or under other labels; not checked")
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
               and all(c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [] if isinstance(c, dict))]
    where = [f"{shown((p.get('metadata') or {}).get('namespace'))}/{shown((p.get('metadata') or {}).get('name'))}" for p in pods]
    if running:
        return Check("kubernetes.operator", "pass", f"controller pod {where[pods.index(running[0])]} is running and ready")
    first = pods[0].get("metadata") or {}
    phase = (pods[0].get("status") or {}).get("phase")
    return Check("kubernetes.operator", "fail", f"controller pod(s) {', '.join(where[:5])} not running and ready (phase "
                 f"{shown(phase)})", f"kubectl -n {shlex.quote(str(first.get('namespace')))} describe pod "
                 f"{shlex.quote(str(first.get('name')))}; jobs are accepted but nothing starts their pods until it runs")


@_skip_when_forbidden
def _namespace_check(cluster: Cluster, namespace: str, source: str) -> Check:
    with _forbidden_skips("kubernetes.namespace", f"namespace {namespace}"):
        doc = _get(cluster, f"/api/v1/namespaces/{namespace}")
    if doc is None:
        return Check("kubernetes.namespace", "fail", f"namespace {namespace} does not exist",
                     f"kubectl create namespace {namespace}, or set kubernetes.namespace in {source}")
    phase = (doc.get("status") or {}).get("phase")
    if phase == "Terminating":
        return Check("kubernetes.namespace", "fail", f"namespace {namespace} is being deleted",
                     f"set kubernetes.namespace in {source} to a namespace that stays")
    return Check("kubernetes.namespace", "pass", f"namespace {namespace} ({shown(phase or 'Active')})")


@_skip_when_forbidden
def _claim_check(cluster: Cluster, namespace: str, ctx: DoctorContext) -> Check:
    k = ctx.profile.kubernetes
    assert k is not None
    claim = k.runs_volume_claim
    if claim is None:
        return Check("kubernetes.claim", "skip", "kubernetes.runs_volume_claim is null: runs go to an emptyDir, lost with the pod")
    collection = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    with _forbidden_skips("kubernetes.claim", f"PersistentVolumeClaims in namespace {namespace}"):
        doc = _get(cluster, f"{collection}/{claim}")
        if doc is None or "ReadWriteMany" not in ((doc.get("spec") or {}).get("accessModes") or []):
            rwx = _rwx_claims(cluster.request("GET", collection))
    if doc is None:
        return Check("kubernetes.claim", "fail", f"PersistentVolumeClaim {claim} does not exist in namespace {namespace}",
                     f"create it (ReadWriteMany), or set kubernetes.runs_volume_claim in {ctx.profile_source} to one of the "
                     f"namespace's ReadWriteMany claims: {_listing(rwx)}")
    spec, status = doc.get("spec") or {}, doc.get("status") or {}
    modes = [str(m) for m in spec.get("accessModes") or []]
    phase = status.get("phase")
    if phase != "Bound":
        return Check("kubernetes.claim", "fail", f"claim {claim} is {shown(phase or 'not Bound')}, not Bound: pods that mount "
                     "it stay Pending", f"kubectl -n {namespace} describe pvc {claim} (its StorageClass or PersistentVolume)")
    nodes = ctx.plan.world.num_nodes if ctx.plan is not None else ctx.profile.max_nodes
    if "ReadWriteMany" not in modes:
        if nodes == 1:
            return Check("kubernetes.claim", "pass", f"claim {claim} is Bound, {_listing(modes)}: enough for one pod")
        return Check("kubernetes.claim", "fail", f"claim {claim} is {_listing(modes)}, not ReadWriteMany: the pods of a "
                     f"{nodes}-node job on several nodes cannot all mount it",
                     f"use a ReadWriteMany claim: set kubernetes.runs_volume_claim in {ctx.profile_source} to one of "
                     f"{_listing(rwx)}, or create one with accessModes [ReadWriteMany] (a StorageClass that offers it: NFS, CephFS)")
    return Check("kubernetes.claim", "pass", f"claim {claim} is Bound, ReadWriteMany")


def _rwx_claims(doc: Any) -> list[str]:
    """The names of a PersistentVolumeClaimList's ReadWriteMany claims, sorted."""
    items = [i for i in (doc.get("items") if isinstance(doc, dict) else None) or [] if isinstance(i, dict)]
    return sorted(str((i.get("metadata") or {}).get("name")) for i in items
                  if "ReadWriteMany" in ((i.get("spec") or {}).get("accessModes") or []))


@_skip_when_forbidden
def _priority_class_check(cluster: Cluster, name: str | None, source: str) -> Check:
    if name is None:
        return Check("kubernetes.priority_class", "skip", "kubernetes.priority_class is null: the cluster's default priority")
    collection = "/apis/scheduling.k8s.io/v1/priorityclasses"
    with _forbidden_skips("kubernetes.priority_class", "PriorityClasses"):
        if _get(cluster, f"{collection}/{name}") is not None:
            return Check("kubernetes.priority_class", "pass", f"PriorityClass {name} exists")
        known = [n for n in _names(cluster.request("GET", collection)) if not n.startswith("system-")]
    return Check("kubernetes.priority_class", "fail", f"PriorityClass {name} does not exist: the API server refuses the pods",
                 f"set kubernetes.priority_class in {source} to one of: {_listing(known)} (or null); or ask the admins to "
                 f"create {name}")


@_skip_when_forbidden
def _local_queue_check(cluster: Cluster, namespace: str, queue: str | None, source: str) -> Check:
    if queue is None:
        return Check("kubernetes.local_queue", "skip", "kubernetes.queue_label is null: no Kueue queue")
    with _forbidden_skips("kubernetes.local_queue", f"Kueue LocalQueues in namespace {namespace}"):
        crd = _get(cluster, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{LOCALQUEUE_CRD}")
        if crd is None:
            return Check("kubernetes.local_queue", "fail", f"kubernetes.queue_label is {queue}, and Kueue is not installed "
                         f"(no CRD {LOCALQUEUE_CRD}): no controller admits the job", f"set kubernetes.queue_label: null in {source}, "
                         "or install Kueue (kueue.sigs.k8s.io/docs/installation)")
        version = storage_version(crd, "v1beta1")
        collection = f"/apis/kueue.x-k8s.io/{version}/namespaces/{namespace}/localqueues"
        if _get(cluster, f"{collection}/{queue}") is not None:
            return Check("kubernetes.local_queue", "pass", f"LocalQueue {queue} exists in namespace {namespace}")
        known = _names(cluster.request("GET", collection))
    return Check("kubernetes.local_queue", "fail", f"LocalQueue {queue} does not exist in namespace {namespace}: Kueue never "
                 "admits the job", f"set kubernetes.queue_label in {source} to one of: {_listing(known)}")


@_skip_when_forbidden
def _secrets_check(cluster: Cluster, namespace: str, ctx: DoctorContext) -> Check:
    """Each (Secret, key) of ``secret_env`` (optional ones may be missing) and each pull secret
    exists; only key names are read into the report, never a value."""
    k = ctx.profile.kubernetes
    assert k is not None
    wanted = [(ref.secret, ref.key, env, ref.optional) for env, ref in sorted(k.secret_env.items())]
    wanted += [(name, None, "image_pull_secrets", False) for name in k.image_pull_secrets]
    if not wanted:
        return Check("kubernetes.secrets", "skip", "the profile names no Secret (kubernetes.secret_env, image_pull_secrets)")
    problems, found = [], []
    for secret, key, env, optional in wanted:
        with _forbidden_skips("kubernetes.secrets", f"Secrets in namespace {namespace} (the pods' service account may)"):
            doc = _get(cluster, f"/api/v1/namespaces/{namespace}/secrets/{secret}")
        keys = sorted(str(name) for name in (doc.get("data") or {})) if isinstance(doc, dict) else []
        where = f"{env}: Secret {secret}" + (f" key {key}" if key else "")
        if doc is None and not optional:
            create = (f"kubectl -n {namespace} create secret generic {secret} --from-literal={key}=<value>" if key
                      else f"kubectl -n {namespace} create secret docker-registry {secret} --docker-server=<registry> ...")
            problems.append((f"{where}: no Secret {secret} in namespace {namespace}", create))
        elif doc is not None and key and key not in keys and not optional:
            problems.append((f"{where}: Secret {secret} has no key {key} (keys: {_listing(keys)})",
                             f"add key {key} to Secret {secret}, or set kubernetes.secret_env.{env}.key in {ctx.profile_source} "
                             "to one of its keys"))
        else:
            found.append(where + (" (optional, missing)" if doc is None or (key and key not in keys) else ""))
    if problems:
        return Check("kubernetes.secrets", "fail", "; ".join(p for p, _ in problems), "; ".join(f for _, f in problems))
    return Check("kubernetes.secrets", "pass", f"{len(found)} found: {', '.join(found)}")


@_skip_when_forbidden
def _nodes_check(cluster: Cluster, ctx: DoctorContext) -> Check:
    """Enough schedulable nodes with the profile's ``node_selector`` labels and, on a GPU profile,
    ``gpus_per_node`` allocatable GPUs of ``gpu_type`` (by the GPU product label, where a node has it)."""
    p, k = ctx.profile, ctx.profile.kubernetes
    assert k is not None
    with _forbidden_skips("kubernetes.nodes", "the nodes"):
        nodes, _ = read_nodes(cluster.request("GET", "/api/v1/nodes"))
    needed = ctx.plan.world.num_nodes if ctx.plan is not None else 1
    asked = f"the spec needs {needed}" if ctx.plan is not None else "a job needs 1 (pass a spec to check its node count)"
    selected = [n for n in nodes if n.schedulable and all(n.labels.get(key) == value for key, value in k.node_selector.items())]
    selector = f" matching node_selector {k.node_selector}" if k.node_selector else ""
    if p.gpus_per_node == 0:
        status = "pass" if len(selected) >= needed else "fail"
        return Check("kubernetes.nodes", status, f"CPU profile: {len(selected)} schedulable node(s){selector}; {asked}; "
                     "GPUs not checked", "" if status == "pass" else f"lower the node count, or fix node_selector in "
                     f"{ctx.profile_source}")
    fit = [n for n in selected if n.gpus >= p.gpus_per_node and (n.model is None or n.model == p.gpu_type)]
    unlabelled = [n for n in fit if n.model is None]
    detail = (f"{len(fit)} schedulable node(s){selector} with >= {p.gpus_per_node} allocatable nvidia.com/gpu of {p.gpu_type}"
              + (f" ({len(unlabelled)} without the {PRODUCT_LABEL} label: type not verified)" if unlabelled else "")
              + f"; {asked}")
    if len(fit) >= needed:
        return Check("kubernetes.nodes", "pass", detail)
    shapes = sorted({f"{n.gpus}x {n.model or shown(n.product) if n.product else n.gpus}" for n in nodes if n.gpus})
    return Check("kubernetes.nodes", "fail", detail + (f"; GPU nodes have: {', '.join(shapes[:8])}" if shapes else "; no GPU node"),
                 f"set gpus_per_node / gpu_type / kubernetes.node_selector in {ctx.profile_source} to a node shape the cluster "
                 "has (jobgen profiles detect --scheduler kubernetes reads it), or ask for fewer nodes")


def probe_pod(ctx: DoctorContext, namespace: str) -> dict[str, Any]:
    """The probe pod: the profile's image, pull policy, pull secrets, service account, node
    selector and tolerations; ``restartPolicy: Never``; it runs ``<python> -c 'import
    jobgen.train'`` with a small CPU and memory request and no GPU (it only pulls and starts)."""
    k = ctx.profile.kubernetes
    assert k is not None
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": max(int(ctx.timeout_s) + 60, 60),
        "containers": [{"name": "probe", "image": k.image, "imagePullPolicy": k.image_pull_policy,
                        "command": [k.python, "-c", "import jobgen.train"],
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "4Gi"}}}],
    }
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    if k.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in k.tolerations]
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in k.image_pull_secrets]
    if k.service_account:
        spec["serviceAccountName"] = k.service_account
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "jobgen-doctor-probe-", "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "jobgen", PROBE_LABEL: "image"}},
            "spec": spec}


def _image_probe(cluster: Cluster, namespace: str, ctx: DoctorContext) -> Check:
    """Create the probe pod, wait (at most ``ctx.timeout_s``) until its container runs or ends, or
    its image cannot be pulled, and delete it in every case."""
    k = ctx.profile.kubernetes
    assert k is not None
    collection = f"/api/v1/namespaces/{namespace}/pods"
    try:
        created = cluster.request("POST", collection, body=probe_pod(ctx, namespace))
    except ApiError as exc:
        return Check("kubernetes.image", "fail", f"the API server refused the probe pod: {exc.message[:300]}",
                     "the message names the cause (a quota, a policy, the pull secret); fix it and run doctor --probe again")
    name = str(created["metadata"]["name"])
    try:
        return _wait_probe(cluster, f"{collection}/{name}", k.image, ctx.timeout_s)
    finally:
        try:
            cluster.request("DELETE", f"{collection}/{name}", body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                                    "gracePeriodSeconds": 0})
        except ApiError as exc:
            if exc.status != 404:
                raise


def _wait_probe(cluster: Cluster, path: str, image: str, timeout_s: float) -> Check:
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while True:
        pod = cluster.request("GET", path)
        status = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        for state in [c.get("state") or {} for c in status.get("containerStatuses") or [] if isinstance(c, dict)]:
            waiting, running, ended = state.get("waiting") or {}, state.get("running"), state.get("terminated")
            if waiting.get("reason") in PULL_ERRORS:
                return Check("kubernetes.image", "fail", f"node {shown(node)} cannot pull {shown(image)}: {shown(waiting.get('reason'))}: "
                             f"{shown(waiting.get('message') or '', 400)}",
                             "push the image where the nodes can pull it, fix kubernetes.image (pinned by digest), or add its "
                             "registry's pull secret to kubernetes.image_pull_secrets")
            if ended is not None:
                code = ended.get("exitCode")
                if code == 0:
                    return Check("kubernetes.image", "pass", f"{shown(image)} pulled on node {shown(node)}; it imports jobgen.train")
                return Check("kubernetes.image", "fail", f"{shown(image)} pulled and started on node {shown(node)}, but "
                             f"`python -c 'import jobgen.train'` ended with exit code {code} ({shown(ended.get('reason') or '')}: "
                             f"{shown(ended.get('message') or '', 400)})",
                             "build the image with jobgen[train] (docs/install.md), or set kubernetes.python to its interpreter")
            if running is not None and time.monotonic() > deadline:
                return Check("kubernetes.image", "pass", f"{shown(image)} pulled and started on node {shown(node)} "
                             "(the import had not finished when the timeout came)")
        last = status
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    conditions = [c for c in last.get("conditions") or [] if isinstance(c, dict) and c.get("status") == "False"]
    why = "; ".join(f"{shown(c.get('reason') or c.get('type'))}: {shown(c.get('message') or '')}" for c in conditions[:2])
    return Check("kubernetes.image", "fail", f"the probe pod did not start within {timeout_s:.0f} s (phase "
                 f"{shown(last.get('phase') or 'unknown')}{'; ' + why if why else ''})",
                 "no node took the pod or the pull is slow: check kubernetes.node_selector and tolerations, or pass a longer "
                 "--timeout")
