"""``jobgen profiles detect --scheduler kubernetes``: a cluster profile from what the API server of
one kubeconfig context says (the client: :mod:`jobgen.backends.kubernetes.api`).

Reads, in order (GET requests; a 403 or 404 leaves the value at its default with a comment
saying so): ``/version`` (``kubernetes.version``), the nodes (``/api/v1/nodes``: allocatable
``nvidia.com/gpu``, CPU and memory; the labels of NVIDIA GPU feature discovery,
``nvidia.com/gpu.product`` and ``nvidia.com/gpu.memory``; taints; RDMA resources), the CRDs of
the training operator (``pytorchjobs.kubeflow.org``), Kubeflow Trainer v2
(``trainjobs.trainer.kubeflow.org``) and Kueue (``localqueues.kueue.x-k8s.io``), the namespace,
its PersistentVolumeClaims, the PriorityClasses and the namespace's Kueue LocalQueues.

Which nodes: the schedulable nodes with allocatable ``nvidia.com/gpu``, grouped by GPU model
and count; the group most nodes are in (``--gpu-type`` narrows it to one model) gives the
profile, with the smallest allocatable CPU and memory among them, so a pod fits on every one.
A cluster without GPU nodes gives a CPU profile. The image cannot be read from a cluster: the
profile keeps an example image, declared under ``placeholders:``, so ``jobgen submit`` refuses
it until a profile of yours sets one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobgen.backends.kubernetes.api import ApiError
from jobgen.backends.slurm.detect import DetectedProfile, check_detected, gpu_memory_gib, gpu_model
from jobgen.backends.slurm.inventory import InventoryError, clean, not_plain
from jobgen.errors import ConfigError, SubmitError
from jobgen.specs.k8s_names import is_dns1123_label, is_dns1123_subdomain
from jobgen.specs.profile import GPU_COMPUTE_CAPABILITY

#: GETs one API path and returns the decoded JSON body (tests pass fakes). Raises ApiError for a
#: non-2xx answer, SubmitError when the server cannot be reached.
Getter = Callable[[str], Any]

#: The extended resource NVIDIA's device plugin advertises (k8s-device-plugin README).
GPU_RESOURCE = "nvidia.com/gpu"
#: GPU feature discovery's labels (NVIDIA gpu-feature-discovery README): the product name and
#: the memory per GPU in MiB.
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
#: The CRDs whose presence decides ``job_api`` (and Kueue's ``queue_label``).
PYTORCHJOB_CRD = "pytorchjobs.kubeflow.org"
TRAINJOB_CRD = "trainjobs.trainer.kubeflow.org"
LOCALQUEUE_CRD = "localqueues.kueue.x-k8s.io"
#: The example image a detected profile carries until you set yours (the shipped k8s-a100's).
EXAMPLE_IMAGE = "ghcr.io/example/jobgen-train:0.1.0@sha256:786eed7c9ade5b6ba50d95ebb5292ebbfd13140fa97d93ab341a3727eb35bef8"
IMAGE_REASON = "an example image; build yours with jobgen[train] (docs/install.md), pin it by digest"
#: Label values (apimachinery IsValidLabelValue): <= 63 characters, alphanumeric at both ends.
_LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
#: Taints a job does not tolerate on purpose: the node lifecycle's and the control plane's.
_SYSTEM_TAINT_PREFIXES = ("node.kubernetes.io/", "node-role.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
#: Allocatable resources that give a pod RDMA devices -> the fabric they mean.
_RDMA_RESOURCES = (("rdma/", "infiniband"), ("vpc.amazonaws.com/efa", "efa"), ("nvidia.com/hostdev", "infiniband"))
#: Longest cluster value a comment shows, in characters.
_SHOWN_MAX = 120


def shown(value: Any, limit: int = _SHOWN_MAX) -> str:
    """A value read from the cluster as a comment or a report shows it: quoted, non-printable
    characters escaped, at most ``limit`` characters (then ``...``)."""
    text = clean(repr(value) if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class KubernetesDetected(DetectedProfile):
    """A detected Kubernetes profile (:class:`~jobgen.backends.slurm.detect.DetectedProfile`;
    ``partition`` is empty; ``doc`` has ``placeholders`` last) with the ``context`` and
    ``namespace`` read."""

    context: str = ""
    namespace: str = ""

    @property
    def scope(self) -> str:
        """What was profiled, for the CLI's one-line summary."""
        return f"context {shown(self.context)}, namespace {shown(self.namespace)}"

    def as_json(self) -> dict[str, Any]:
        """``-o json``: ``name``, ``context``, ``namespace``, ``profile`` (the document), ``sources``
        and ``notes`` (non-printable characters escaped, as the file's comments show them)."""
        doc = super().as_json()
        del doc["partition"]
        return {"name": doc.pop("name"), "context": self.context, "namespace": self.namespace, **doc}


@dataclass(frozen=True)
class NodeInfo:
    """One node as detect and doctor read it: ``name``; ``gpus`` (allocatable ``nvidia.com/gpu``,
    0 without); ``product`` (the GPU product label, or None); ``model`` (the jobgen GPU type it
    names, or None); ``gpu_mem_mib`` (the memory label, or None); ``cpus`` (allocatable cores,
    rounded down) and ``mem_bytes`` (allocatable memory), None when unreadable; ``labels``;
    ``taints`` (``(key, effect)`` pairs); ``resources`` (allocatable resource names);
    ``schedulable`` (not cordoned)."""

    name: str
    gpus: int
    product: str | None
    model: str | None
    gpu_mem_mib: int | None
    cpus: int | None
    mem_bytes: int | None
    labels: dict[str, str]
    taints: tuple[tuple[str, str], ...]
    resources: tuple[str, ...]
    schedulable: bool


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _quantity(value: Any) -> float | None:
    """A Kubernetes quantity (``"96"``, ``"95500m"``, ``"1056Gi"``) as a number, None when it is none."""
    from jobgen.backends.kubernetes.validate import parse_quantity

    if not isinstance(value, (str, int)) or isinstance(value, bool):
        return None
    try:
        number = parse_quantity(value)
    except Exception:  # the client's parser raises ValueError and decimal errors alike
        return None
    if number is None or not number.is_finite() or not math.isfinite(float(number)):
        return None
    return float(number)


def read_nodes(doc: Any, source: str = "GET /api/v1/nodes") -> tuple[list[NodeInfo], list[str]]:
    """The nodes of a NodeList answer, and notes on the ones left out (a node without a name, or
    whose GPU count is no whole number). Values of any type are taken without a traceback.

    Raises:
        InventoryError: the answer is not a NodeList (no ``items`` list).
    """
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise InventoryError(f"{source}: the answer has no 'items' list (got {shown(type(doc).__name__)})", location=source,
                             hint="check that the context points at a Kubernetes API server: kubectl get nodes")
    nodes, notes = [], []
    for index, item in enumerate(items):
        meta, spec, status = (_mapping(_mapping(item).get(k)) for k in ("metadata", "spec", "status"))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            notes.append(f"{source}: items[{index}] has no name; left out")
            continue
        labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
        allocatable = _mapping(status.get("allocatable"))
        raw_gpus = allocatable.get(GPU_RESOURCE)
        gpus = _quantity(raw_gpus) if raw_gpus is not None else 0.0
        if gpus is None or gpus != int(gpus) or gpus < 0:
            notes.append(f"node {shown(name)}: allocatable {GPU_RESOURCE} {shown(str(raw_gpus))} is no whole number; left out")
            continue
        product = labels.get(PRODUCT_LABEL)
        memory = labels.get(MEMORY_LABEL, "")
        cpus = _quantity(allocatable.get("cpu"))
        mem = _quantity(allocatable.get("memory"))
        taints = tuple((str(t.get("key")), str(t.get("effect"))) for t in (spec.get("taints") or []) if isinstance(t, dict))
        nodes.append(NodeInfo(
            name=name, gpus=int(gpus), product=product, model=gpu_model(product) if product else None,
            gpu_mem_mib=int(memory) if memory.isascii() and memory.isdigit() and len(memory) <= 7 else None,
            cpus=None if cpus is None else int(math.floor(cpus)), mem_bytes=None if mem is None else int(mem),
            labels=labels, taints=taints, resources=tuple(sorted(str(k) for k in allocatable)),
            schedulable=not spec.get("unschedulable")))
    return nodes, notes


def get_or_none(get: Getter, path: str, notes: list[str], what: str) -> Any:
    """``get(path)``, or None when the object does not exist (404) or may not be read (403: a
    note names ``what`` and the path).

    Raises:
        ApiError: another error status. SubmitError: the server cannot be reached.
    """
    try:
        return get(path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        if exc.status == 403:
            notes.append(f"{what}: not read, your credentials may not GET {path} (RBAC)")
            return None
        raise


def _names(doc: Any) -> list[str]:
    """The ``metadata.name`` of each item of a list answer (strings only), sorted."""
    items = doc.get("items") if isinstance(doc, dict) else None
    return sorted({n for item in items or [] if isinstance(n := _mapping(_mapping(item).get("metadata")).get("name"), str)})


def _plain_name(value: str, what: str, source: str) -> str:
    """``value`` if a profile can hold it (printable: no line break, control character or byte
    that was not UTF-8), else an InventoryError naming ``source``."""
    why = not_plain(value) or (None if value.isprintable() else "a character that is not printable")
    if why:
        raise InventoryError(f"{what} {shown(value)} from {source} holds {why}", location=source,
                             hint="pass another --context, or write the profile by hand (docs/profiles.md)")
    return value


def _profile_name(context: str, namespace: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{context}-{namespace}").strip("-.")[:64]
    return name or "kubernetes-detected"


def detect_kubernetes(get: Getter, *, context: str, namespace: str, namespace_source: str, gpu_type: str | None = None,
                      name: str | None = None) -> KubernetesDetected:
    """Detect a profile of the cluster ``get`` talks to, for jobs in ``namespace``.

    Args:
        get: GETs an API path (:meth:`jobgen.backends.kubernetes.api.Cluster.request`; tests pass fakes).
        context: the kubeconfig context's name (``kubernetes.context``).
        namespace: the namespace jobs go to; ``namespace_source`` says where it came from.
        gpu_type: a jobgen GPU type for GPUs whose product label names none, or to take that
            model's nodes in a mixed cluster.
        name: the profile's name (the file's stem); None: ``<context>-<namespace>``.

    Returns:
        The profile, validated by :class:`~jobgen.specs.profile.ClusterProfile` and read back
        from its YAML text unchanged.

    Raises:
        SubmitError: the API server cannot be reached (or answers an error other than 403/404).
        ConfigError: no nodes may be listed, or GPUs of no known model (the hint names ``--gpu-type``).
        InventoryError: a value the profile needs holds a line break or bytes that are not UTF-8.
    """
    notes: list[str] = []
    sources: dict[str, str] = {}
    _plain_name(context, "the context name", "the kubeconfig")
    if not is_dns1123_label(namespace):
        raise ConfigError(f"namespace {shown(namespace)} ({clean(namespace_source)}) is not a DNS-1123 label", location="--namespace",
                          hint="pass --namespace NAME (lowercase a-z, 0-9, '-', at most 63 characters)")
    version_doc = get_or_none(get, "/version", notes, "the server version")
    nodes_doc = get_or_none(get, "/api/v1/nodes", notes, "the nodes")
    if nodes_doc is None:
        raise ConfigError(f"context {shown(context)}: the nodes cannot be listed (GET /api/v1/nodes answered 403 or 404)",
                          location="GET /api/v1/nodes",
                          hint="detect reads the nodes' GPUs, CPUs and memory: ask the admins for `get nodes`, or write the "
                               "profile by hand from cluster_profiles/k8s-a100.yaml (docs/profiles.md)")
    nodes, node_notes = read_nodes(nodes_doc)
    notes.extend(node_notes)
    schedulable = [n for n in nodes if n.schedulable]
    if not schedulable:
        raise ConfigError(f"context {shown(context)} lists {len(nodes)} node(s), none schedulable", location="GET /api/v1/nodes",
                          hint="run detect against a cluster with nodes (kubectl get nodes), or write the profile by hand")
    doc: dict[str, Any] = {"description": "", "scheduler": "kubernetes"}
    gpu_nodes = [n for n in schedulable if n.gpus > 0]
    if gpu_nodes:
        chosen = _gpu_fields(gpu_nodes, gpu_type, doc, sources)
    else:
        chosen = schedulable
        doc.update(max_nodes=len(chosen), default_nodes=1, gpus_per_node=0, cpu_processes_per_node=1)
        sources["max_nodes"] = f"{len(chosen)} schedulable node(s), none with allocatable {GPU_RESOURCE}: a CPU profile"
        sources["gpus_per_node"] = f"no node has allocatable {GPU_RESOURCE}"
        sources["cpu_processes_per_node"] = "one gloo rank per pod; raise it for several ranks per pod"
    rdma = _shape_fields(chosen, doc, sources)
    k8s = _kubernetes_fields(get, context, namespace, namespace_source, version_doc, chosen, bool(gpu_nodes), notes, sources)
    if rdma:
        k8s["rdma_resource"] = rdma
        sources["kubernetes.rdma_resource"] = "the RDMA device plugin's resource every node profiled offers"
    doc["kubernetes"] = k8s
    doc["placeholders"] = {"kubernetes.image": IMAGE_REASON}
    sources["placeholders"] = ("example values jobgen submit refuses: set kubernetes.image in a profile that extends this one, "
                               "or here, deleting its line below")
    shape = f"{doc['gpus_per_node']}x {doc['gpu_type']} per pod" if doc["gpus_per_node"] else "CPU-only nodes"
    doc["description"] = f"Kubernetes {context}, namespace {namespace}: {shape}, {doc['max_nodes']} node(s) (detected)"
    name = name or _profile_name(context, namespace)
    header = [f"Kubernetes context {context}, namespace {namespace}, detected by `jobgen profiles detect --scheduler kubernetes`.",
              "The comment above each value names its source. kubernetes.image is an example (placeholders:);",
              "edit it as any profile (docs/profiles.md, \"Detecting a profile\"), then: jobgen doctor --profile <this file>"]
    found = KubernetesDetected(name, "", doc, sources, header, notes, context=context, namespace=namespace)
    check_detected(found, hint="pass --gpu-type or --namespace, or write the profile by hand (docs/profiles.md)")
    return found


def _gpu_fields(gpu_nodes: list[NodeInfo], gpu_type: str | None, doc: dict[str, Any], sources: dict[str, str]) -> list[NodeInfo]:
    """``max_nodes``, ``gpus_per_node``, ``gpu_type``, ``gpu_mem_gib`` from the GPU nodes of the
    largest (model, count) group; returns that group's nodes.

    Raises:
        ConfigError: ``gpu_type`` matches no node, or the group's GPUs name no known model.
    """
    groups: dict[tuple[str | None, int], list[NodeInfo]] = {}
    for node in gpu_nodes:
        groups.setdefault((node.model, node.gpus), []).append(node)
    if gpu_type is not None:
        groups = {key: ns for key, ns in groups.items() if key[0] in (None, gpu_type)}
        if not groups:
            products = sorted({shown(n.product) for n in gpu_nodes})
            raise ConfigError(f"no GPU node has {gpu_type} GPUs (product labels: {', '.join(products)})", location="--gpu-type",
                              hint="leave out --gpu-type to take the most common GPU nodes")
    (model, count), nodes = sorted(groups.items(), key=lambda kv: (-len(kv[1]), -kv[0][1], kv[0][0] or ""))[0]
    first = nodes[0]
    others = len(gpu_nodes) - len(nodes)
    model_source = f"label {PRODUCT_LABEL}={shown(first.product)} of node {shown(first.name)}"
    if gpu_type is not None:
        model, model_source = gpu_type, "--gpu-type"
    if model is None:
        raise ConfigError(f"the GPUs of node {shown(first.name)} name no GPU model jobgen knows (label {PRODUCT_LABEL}: "
                          f"{shown(first.product) if first.product else 'none'})", location="--gpu-type",
                          hint="pass --gpu-type, one of: " + ", ".join(GPU_COMPUTE_CAPABILITY))
    memory, memory_source = _gpu_memory(nodes, model)
    doc.update(max_nodes=len(nodes), default_nodes=1, gpus_per_node=count, gpu_type=model, gpu_mem_gib=memory)
    sources["max_nodes"] = (f"{len(nodes)} schedulable node(s) with {count}x {model}"
                            + (f"; {others} GPU node(s) of other models or counts left out" if others else ""))
    sources["gpus_per_node"] = f"allocatable {GPU_RESOURCE} of node {shown(first.name)}"
    sources["gpu_type"] = model_source
    sources["gpu_mem_gib"] = memory_source
    return nodes


def _gpu_memory(nodes: list[NodeInfo], model: str) -> tuple[float | None, str]:
    """Memory per GPU in GiB: the smallest ``nvidia.com/gpu.memory`` label (MiB, rounded down to
    0.1 GiB), else the size the product name or the model gives (:func:`gpu_memory_gib`)."""
    labelled = [n for n in nodes if n.gpu_mem_mib]
    if labelled:
        node = min(labelled, key=lambda n: (n.gpu_mem_mib or 0, n.name))
        mib = node.gpu_mem_mib or 0
        return math.floor(mib * 10 / 1024) / 10, f"label {MEMORY_LABEL}={mib} (MiB) of node {shown(node.name)}, in GiB rounded down"
    product = nodes[0].product
    return gpu_memory_gib(product if product and not not_plain(product) else None, model, what="the product label")


def _shape_fields(nodes: list[NodeInfo], doc: dict[str, Any], sources: dict[str, str]) -> str | None:
    """``cpus_per_node``, ``mem_gib_per_node`` (the smallest allocatable among ``nodes``) and
    ``network_fabric`` (an RDMA resource every node has) into ``doc``; returns that resource."""
    with_cpus = [n for n in nodes if n.cpus]
    with_mem = [n for n in nodes if n.mem_bytes]
    if not with_cpus or not with_mem:
        raise InventoryError(f"node {shown(nodes[0].name)}: no allocatable cpu or memory", location="GET /api/v1/nodes",
                             hint="check `kubectl describe node`; jobgen needs each node's allocatable CPU and memory")
    cpu_node = min(with_cpus, key=lambda n: (n.cpus or 0, n.name))
    mem_node = min(with_mem, key=lambda n: (n.mem_bytes or 0, n.name))
    # rounded down to 0.01 GiB: the memory limit jobgen writes never exceeds what the node offers
    mem_gib = math.floor((mem_node.mem_bytes or 0) * 100 / 2**30) / 100
    doc.update(cpus_per_node=cpu_node.cpus, mem_gib_per_node=max(mem_gib, 0.01))
    sources["cpus_per_node"] = (f"allocatable cpu of node {shown(cpu_node.name)}, the fewest of the {len(nodes)} node(s) "
                                "profiled (DaemonSets take some of it: lower it if pods do not fit)")
    sources["mem_gib_per_node"] = (f"allocatable memory of node {shown(mem_node.name)}, the least of the {len(nodes)} node(s) "
                                   "profiled, in GiB rounded down; the pod's /dev/shm (kubernetes.shm_size_gib) counts against it")
    fabric, resource = "tcp", None
    for prefix, kind in _RDMA_RESOURCES:
        common = [r for r in nodes[0].resources if r.startswith(prefix) and all(r in n.resources for n in nodes)]
        if common and not not_plain(common[0]):
            fabric, resource = kind, common[0]
            break
    doc["network_fabric"] = fabric
    sources["network_fabric"] = (f"every node profiled offers the RDMA resource {shown(resource)} (set roce for RoCE)" if resource
                                 else "no RDMA resource (rdma/*, vpc.amazonaws.com/efa) on every node: tcp")
    return resource


def _kubernetes_fields(get: Getter, context: str, namespace: str, namespace_source: str, version_doc: Any,
                       nodes: list[NodeInfo], gpu: bool, notes: list[str], sources: dict[str, str]) -> dict[str, Any]:
    """The ``kubernetes:`` section (see the module docstring for what each value is read from)."""
    k8s: dict[str, Any] = {"context": context}
    sources["kubernetes.context"] = "the kubeconfig context detect read (--context, else the current context)"
    k8s["namespace"] = namespace
    sources["kubernetes.namespace"] = namespace_source
    if get_or_none(get, f"/api/v1/namespaces/{namespace}", notes, "the namespace") is None:
        notes.append(f"namespace {namespace} does not exist (or cannot be read): kubectl create namespace {namespace}")
    found = {crd: get_or_none(get, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}", notes, f"CRD {crd}")
             for crd in (PYTORCHJOB_CRD, TRAINJOB_CRD, LOCALQUEUE_CRD)}
    crds = {crd: doc is not None for crd, doc in found.items()}
    if crds[PYTORCHJOB_CRD] or not crds[TRAINJOB_CRD]:
        k8s["job_api"] = "pytorchjob"
        sources["kubernetes.job_api"] = (
            f"CRD {PYTORCHJOB_CRD} is installed (the training operator)" + (f"; {TRAINJOB_CRD} too: trainjob also works"
                                                                            if crds[TRAINJOB_CRD] else "")
            if crds[PYTORCHJOB_CRD] else f"neither {PYTORCHJOB_CRD} nor {TRAINJOB_CRD} is installed: install the training operator "
            "(jobgen doctor names the command)")
    else:
        k8s["job_api"] = "trainjob"
        sources["kubernetes.job_api"] = f"CRD {TRAINJOB_CRD} is installed (Kubeflow Trainer v2), {PYTORCHJOB_CRD} is not"
        runtimes = _names(get_or_none(get, "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", notes,
                                      "the ClusterTrainingRuntimes"))
        runtime = "torch-distributed" if "torch-distributed" in runtimes or not runtimes else runtimes[0]
        k8s["trainer_runtime"] = runtime
        sources["kubernetes.trainer_runtime"] = f"ClusterTrainingRuntimes: {', '.join(shown(r) for r in runtimes) or '(none listed)'}"
    version = _version(version_doc)
    k8s["version"] = version
    sources["kubernetes.version"] = ("GET /version: the core/v1 schema pod templates are checked against" if version
                                     else "GET /version did not answer MAJOR.MINOR: the newest schema jobgen bundles")
    k8s["image"] = EXAMPLE_IMAGE
    sources["kubernetes.image"] = "not readable from a cluster: an example (see placeholders:), put your image, pinned by digest"
    if gpu:
        products = {n.product for n in nodes}
        product = products.pop() if len(products) == 1 else None
        if product and _label_value(product):
            k8s["node_selector"] = {PRODUCT_LABEL: product}
            sources["kubernetes.node_selector"] = f"label {PRODUCT_LABEL} of the {len(nodes)} node(s) profiled: pods land on them"
        elif product:
            notes.append(f"label {PRODUCT_LABEL} {shown(product)} is no valid label value: no node_selector written")
    tolerations = _tolerations(nodes)
    if tolerations:
        k8s["tolerations"] = tolerations
        sources["kubernetes.tolerations"] = "taints every node profiled carries (NoSchedule, NoExecute)"
    _choose(k8s, sources, "priority_class", "PriorityClasses", is_dns1123_subdomain,
            [n for n in _names(get_or_none(get, "/apis/scheduling.k8s.io/v1/priorityclasses", notes, "the PriorityClasses"))
             if not n.startswith("system-")], pick_one=False)
    queues: list[str] = []
    if crds[LOCALQUEUE_CRD]:
        version = storage_version(found[LOCALQUEUE_CRD], "v1beta1")
        queues = _names(get_or_none(get, f"/apis/kueue.x-k8s.io/{version}/namespaces/{namespace}/localqueues", notes,
                                    "the Kueue LocalQueues"))
        _choose(k8s, sources, "queue_label", f"Kueue LocalQueues in namespace {namespace}", _label_value, queues, pick_one=True)
    else:
        k8s["queue_label"] = None
        sources["kubernetes.queue_label"] = f"CRD {LOCALQUEUE_CRD} is not installed: no Kueue"
    claims = _rwx_claims(get_or_none(get, f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", notes, "the claims"))
    _choose(k8s, sources, "runs_volume_claim", f"ReadWriteMany claims in namespace {namespace}", is_dns1123_subdomain, claims,
            pick_one=True)
    return k8s


def storage_version(crd: Any, default: str) -> str:
    """The version a CRD stores (``spec.versions[].storage``), or ``default`` when it names none
    jobgen can put in a path."""
    versions = _mapping(_mapping(crd).get("spec")).get("versions")
    for entry in versions if isinstance(versions, list) else []:
        name = _mapping(entry).get("name")
        if _mapping(entry).get("storage") and isinstance(name, str) and re.fullmatch(r"v\d+((alpha|beta)\d+)?", name):
            return name
    return default


def _label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE_RE.fullmatch(value) is not None


def _choose(k8s: dict[str, Any], sources: dict[str, str], key: str, what: str, valid: Callable[[str], bool], names: list[str], *,
            pick_one: bool) -> None:
    """``k8s[key]``: the only name of ``names`` when ``pick_one`` and ``valid`` takes it (a name the
    profile field can hold), else null; the comment lists them."""
    plain = [n for n in names if valid(n)]
    listed = ", ".join(shown(n) for n in names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    if pick_one and len(plain) == 1:
        k8s[key] = plain[0]
        sources[f"kubernetes.{key}"] = f"the only one of the {what}"
        return
    k8s[key] = None
    sources[f"kubernetes.{key}"] = (f"{what}: {listed}; null: set one" if names else f"no {what}: null")


def _rwx_claims(doc: Any) -> list[str]:
    items = doc.get("items") if isinstance(doc, dict) else None
    found = []
    for item in items or []:
        spec = _mapping(_mapping(item).get("spec"))
        name = _mapping(_mapping(item).get("metadata")).get("name")
        modes = spec.get("accessModes")
        if isinstance(name, str) and isinstance(modes, list) and "ReadWriteMany" in modes:
            found.append(name)
    return sorted(found)


def _tolerations(nodes: list[NodeInfo]) -> list[dict[str, Any]]:
    """A toleration (``operator: Exists``) for each NoSchedule/NoExecute taint every node carries,
    system taints left out."""
    common = set(nodes[0].taints)
    for node in nodes[1:]:
        common &= set(node.taints)
    return [{"key": key, "operator": "Exists", "effect": effect} for key, effect in sorted(common)
            if effect in ("NoSchedule", "NoExecute") and not key.startswith(_SYSTEM_TAINT_PREFIXES)
            and not not_plain(key) and re.fullmatch(r"[A-Za-z0-9./_-]{1,253}", key)]


def _version(doc: Any) -> str | None:
    """``MAJOR.MINOR`` from a ``/version`` answer (``minor`` may end in ``+``), or None."""
    if not isinstance(doc, dict):
        return None
    major, minor = str(doc.get("major", "")), re.sub(r"\D.*", "", str(doc.get("minor", "")))
    return f"{major}.{minor}" if major == "1" and minor.isdigit() and len(minor) <= 2 else None


def connect_and_detect(*, context: str | None, namespace: str | None, gpu_type: str | None, name: str | None,
                       kubeconfig: str | None = None) -> KubernetesDetected:
    """Connect to ``context`` (None: ``$JOBGEN_K8S_CONTEXT``, else the current context) and detect.
    The namespace: ``namespace``, else ``$JOBGEN_K8S_NAMESPACE``, else the context's, else ``default``.

    Raises:
        ConfigError: no kubeconfig or context (:func:`jobgen.backends.kubernetes.api.connect`), and as
            :func:`detect_kubernetes`. SubmitError: the API server cannot be reached.
    """
    import os

    from jobgen.backends.kubernetes.api import ENV_CONTEXT, ENV_NAMESPACE, connect, kubeconfig_path

    cluster = connect(context or os.environ.get(ENV_CONTEXT), kubeconfig)
    if namespace:
        source = "--namespace"
    elif os.environ.get(ENV_NAMESPACE):
        namespace, source = os.environ[ENV_NAMESPACE], f"${ENV_NAMESPACE}"
    else:
        namespace = _context_namespace(kubeconfig_path(kubeconfig), cluster.context)
        source = f"the namespace of context {cluster.context} in the kubeconfig" if namespace else "the context names none: default"
        namespace = namespace or "default"

    def get(path: str) -> Any:
        try:
            return cluster.request("GET", path)
        except (ApiError, SubmitError):
            raise
        except ValueError as exc:  # an answer that is not JSON
            raise InventoryError(f"GET {path}: the answer is not JSON ({exc})", location=f"GET {path}",
                                 hint="check that the context points at a Kubernetes API server") from None

    return detect_kubernetes(get, context=cluster.context, namespace=namespace, namespace_source=source,
                             gpu_type=gpu_type, name=name)


def _context_namespace(path: str, context: str) -> str | None:
    """The ``namespace`` the kubeconfig gives ``context``, or None."""
    from kubernetes import config as kube_config

    try:
        contexts, _ = kube_config.list_kube_config_contexts(config_file=path)
    except Exception:  # connect() read the same file a moment ago; a race leaves the default
        return None
    for entry in contexts or []:
        if entry.get("name") == context:
            value = _mapping(entry.get("context")).get("namespace")
            return value if isinstance(value, str) and value else None
    return None
