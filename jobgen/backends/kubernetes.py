"""Kubernetes backend: plans a Kubeflow PyTorchJob (kubeflow.org/v1) or a Trainer v2 TrainJob
(trainer.kubeflow.org/v1alpha1) plus a ConfigMap, checks it offline, and submits it with the
official ``kubernetes`` client.

Launch contract (ARCHITECTURE.md): one pod per node, a container running ``torchrun``
(``python -m torch.distributed.run``) with nproc-per-node = GPUs per pod, so Lightning sees
TorchElasticEnvironment (KubeflowEnvironment assumes one process per pod and is not used).

- PyTorchJob: Master (1) + Worker (nodes - 1), container ``pytorch``. The training-operator
  (v1.9, pkg/controller.v1/pytorch/envvar.go) injects PET_NNODES, PET_NPROC_PER_NODE (from
  ``spec.nprocPerNode``), PET_NODE_RANK, MASTER_ADDR, MASTER_PORT, WORLD_SIZE (= pods x
  processes) and RANK (= the pod's index, not a process rank) — but no PET_MASTER_ADDR /
  PET_MASTER_PORT, and torchrun ignores MASTER_ADDR (its ``--master-addr`` defaults to
  127.0.0.1). So the command passes ``--master-addr=$(MASTER_ADDR) --master-port=$(MASTER_PORT)``,
  which the kubelet expands from the container's environment; without it every pod would wait
  for a rendezvous on itself. torchrun then sets each process's RANK/LOCAL_RANK/WORLD_SIZE.
- TrainJob: the Trainer's torch plugin injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR and PET_MASTER_PORT (and refuses them in ``spec.trainer.env``), so the command
  is plain ``torchrun -m jobgen.train``; pod settings travel as a ``runtimePatches`` entry.

The resolved spec (and DeepSpeed config) travel in a ConfigMap mounted at /etc/jobgen. Planning
is pure and never imports ``kubernetes``; the offline validators (:mod:`jobgen.k8s_validate`)
and the client are imported only when used.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from jobgen import __version__
from jobgen.backends.base import (
    DS_CONFIG_FILE,
    SPEC_FILE,
    SUBMISSION_FILE,
    JobHandle,
    JobStatus,
    Submission,
    common_files,
    job_env,
    render_job_template,
)
from jobgen.errors import ConfigError, PlanError, SubmitError
from jobgen.plan import JobPlan, PlanContext

TEMPLATE = "kubernetes/pytorchjob.yaml.j2"
TRAINJOB_TEMPLATE = "kubernetes/trainjob.yaml.j2"
#: Every template this backend may render (all of them feed the inputs hash).
TEMPLATES = (TEMPLATE, TRAINJOB_TEMPLATE)
MANIFEST_FILE = "pytorchjob.yaml"
TRAINJOB_FILE = "trainjob.yaml"
#: Makes every Kubernetes job directory ``kubectl apply -k`` ready (Argo CD, Flux accept it too).
KUSTOMIZATION_FILE = "kustomization.yaml"
CONFIG_MOUNT = "/etc/jobgen"
RUN_ROOT = "/workspace/runs"
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: Longest job name that leaves room for the operator's pod and Service names
#: (``<name>-worker-<index>``) inside the 63-character DNS label limit.
MAX_NAME = 48
#: Annotation holding the sha256 of the inputs: how ``submit`` tells an identical re-submit
#: from a changed one. (A label value cannot hold 64 characters.)
INPUTS_ANNOTATION = "jobgen.dev/inputs-sha256"
JOB_NAME_ANNOTATION = "jobgen.dev/job-name"
MANAGED_BY = {"app.kubernetes.io/managed-by": "jobgen"}
#: The training-operator's default port name on the Master's ``pytorch`` container.
PORT_NAME = "pytorchjob-port"
#: What the Trainer v2 ``torch-distributed`` runtime calls its replicated job and container.
TRAINJOB_NODE = "node"

#: Environment the launchers own: the training-operator (envvar.go, master.go) sets these in
#: every pod, torchrun sets RANK/LOCAL_RANK/WORLD_SIZE for each process, and the Trainer's torch
#: plugin rejects PET_* in a TrainJob. A value from a profile or spec would break rank semantics.
LAUNCHER_ENV = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
    "GROUP_RANK", "PYTHONUNBUFFERED",
})
_SECRET_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY", "CREDENTIAL", "CREDENTIALS"})
_SECRET_SUFFIXES = ("_API_KEY", "_ACCESS_KEY", "_SECRET_KEY", "_PRIVATE_KEY", "_AUTH_KEY")


@dataclass(frozen=True)
class K8sKind:
    """The custom resource jobgen renders: API group/version, plural, kind, manifest file."""

    group: str
    version: str
    plural: str
    kind: str
    manifest: str

    @property
    def api_version(self) -> str:
        """``group/version`` as in a manifest's ``apiVersion``."""
        return f"{self.group}/{self.version}"


PYTORCHJOB = K8sKind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", MANIFEST_FILE)
TRAINJOB = K8sKind("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", TRAINJOB_FILE)
KINDS = {"pytorchjob": PYTORCHJOB, "trainjob": TRAINJOB}


# --------------------------------------------------------------------------- names


def k8s_name(name: str) -> tuple[str, bool]:
    """A DNS-1035 object name for job ``name``; ``(name, derived)``.

    A valid name of at most 48 characters is used as is. Otherwise a name is derived, never
    silently: lowercase, runs of other characters -> '-', truncated, plus ``-`` and the first
    8 hex digits of sha256(name) so distinct names stay distinct; ``derived`` is then True
    and the plan warns. A name with no letter or digit a-z/0-9 at all derives ``job-<hash>``
    (see :func:`object_name`, which refuses it for rendering).
    """
    if _DNS1035.match(name) and len(name) <= MAX_NAME:
        return name, False
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    slug = re.sub(r"^[^a-z]+", "", slug)[: MAX_NAME - 9].rstrip("-") or "job"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}", True


def object_name(ctx: PlanContext) -> tuple[str, tuple[str, ...]]:
    """The job's Kubernetes object name and the warnings about it.

    Raises:
        PlanError: the spec's name has no character a DNS-1035 name can keep (it starts with a
            letter a-z and holds only a-z, 0-9 and '-'), so any object name would be a hash the
            user never chose.
    """
    spec_name = ctx.spec.name
    if not re.search(r"[a-z]", spec_name.lower()):
        raise PlanError(
            f"You set `name: {spec_name!r}`, but Kubernetes object names must be DNS-1035 labels (a letter a-z first, then "
            f"a-z, 0-9 or '-', at most 63 characters) and nothing of {spec_name!r} survives that, not even a letter.",
            location=f"{ctx.spec_source}: name",
            hint="Give the job a name with letters, e.g. --set name=gpt-run-1 (at most 48 characters keeps it unchanged).",
        )
    name, derived = k8s_name(spec_name)
    if not derived:
        return name, ()
    return name, (f"job name {spec_name!r} is not a DNS-1035 name of <= {MAX_NAME} chars; Kubernetes objects are named {name!r}",)


def config_map_name(name: str) -> str:
    """The ConfigMap that carries ``spec.json`` (and ``ds_config.json``) for job ``name``."""
    return f"{name}-config"


def manifest_file(job_plan: JobPlan) -> str:
    """The manifest a Kubernetes plan writes: ``pytorchjob.yaml`` or ``trainjob.yaml`` (what an
    aggregated kustomization must list for that job)."""
    names = {name for name, _ in job_plan.files}
    return TRAINJOB_FILE if TRAINJOB_FILE in names else MANIFEST_FILE


def kustomization_yaml(header: str, resources: list[str]) -> str:
    """A kustomize ``Kustomization`` listing ``resources`` (relative file paths, kept in the
    given order), after ``header`` (comment lines, each starting with ``#``).

    Only ``resources`` with file paths: kubectl 1.20 (Debian 12's kubernetes-client, kustomize
    v2.0.3) rejects directories there, and newer kustomize deprecates ``bases``. Paths are
    JSON-quoted (JSON is YAML), so any job name survives.
    """
    lines = [*header.splitlines(), "apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", "resources:"]
    lines += [f"  - {json.dumps(r, ensure_ascii=False)}" for r in resources]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plan-time checks


def _cpu_quantity(cores: float) -> str:
    """Cores as a Kubernetes quantity: ``8`` -> "8", ``1.5`` -> "1500m"."""
    return str(int(cores)) if float(cores).is_integer() else f"{round(cores * 1000)}m"


def _mib(gib: float) -> str:
    """GiB as a whole-MiB Kubernetes quantity ("921600Mi")."""
    return f"{int(gib * 1024)}Mi"


def _kubelet_literal(value: str) -> str:
    """Escape ``$(`` as ``$$(`` so the kubelet passes the text through instead of expanding a
    variable reference (Kubernetes expands ``$(VAR)`` in command, args and env values)."""
    return value.replace("$(", "$$(")


def looks_secret(name: str) -> bool:
    """True for variable names that usually hold credentials (``HF_TOKEN``, ``WANDB_API_KEY``,
    ``DB_PASSWORD``); ``TOKENIZERS_PARALLELISM`` is not one (whole ``_``-separated words only)."""
    upper = name.upper()
    return bool(_SECRET_WORDS & set(upper.split("_"))) or upper.endswith(_SECRET_SUFFIXES)


def check_settings(ctx: PlanContext) -> None:
    """Plan-time checks of a Kubernetes profile against the job.

    Rules and their sources:
    - requests <= limits for every resource (core/v1 validation of a Pod rejects it otherwise):
      ``cpus_per_node`` (request) vs ``kubernetes.cpu_limit``, ``kubernetes.mem_request_gib``
      vs ``mem_gib_per_node`` (limit); the memory-backed /dev/shm counts against the limit.
    - no secret values: an ``env`` entry whose name looks like a credential (``*_TOKEN``,
      ``*_API_KEY``, ``*PASSWORD*``) must come from ``kubernetes.secret_env`` instead.
    - launcher variables (MASTER_ADDR, RANK, WORLD_SIZE, PET_*, ...) are set by the operator and
      torchrun; a profile/spec value would override them and break rank semantics.
    - TrainJob: only pod fields the v2.3.0 CRD lets a ``runtimePatches`` entry set.

    Raises:
        PlanError: with the field to change (file + path) and a hint.
    """
    p, k, where = ctx.profile, ctx.profile.kubernetes, ctx.profile_source
    assert k is not None  # ClusterProfile validation guarantees it for scheduler: kubernetes
    if k.cpu_limit is not None and k.cpu_limit < p.cpus_per_node:
        raise PlanError(
            f"You set `kubernetes.cpu_limit: {k.cpu_limit:g}`, but the pods request `cpus_per_node: {p.cpus_per_node}` CPUs; "
            "Kubernetes rejects a pod whose request exceeds its limit.",
            location=f"{where}: kubernetes.cpu_limit",
            hint=f"Raise cpu_limit to at least {p.cpus_per_node}, lower cpus_per_node, or drop cpu_limit (no CPU limit).",
        )
    if k.mem_request_gib is not None and k.mem_request_gib > p.mem_gib_per_node:
        raise PlanError(
            f"You set `kubernetes.mem_request_gib: {k.mem_request_gib:g}`, but the memory limit is `mem_gib_per_node: "
            f"{p.mem_gib_per_node:g}`; Kubernetes rejects a pod whose request exceeds its limit.",
            location=f"{where}: kubernetes.mem_request_gib",
            hint=f"Set mem_request_gib to at most {p.mem_gib_per_node:g}, or drop it (request = limit).",
        )
    if k.shm_size_gib >= p.mem_gib_per_node:
        raise PlanError(
            f"You set `kubernetes.shm_size_gib: {k.shm_size_gib:g}`, but the pod's memory limit is {p.mem_gib_per_node:g} GiB; "
            "/dev/shm is memory-backed and counts against that limit, so training would be OOM-killed.",
            location=f"{where}: kubernetes.shm_size_gib",
            hint="Keep shm_size_gib well below mem_gib_per_node (a quarter of it is plenty for DataLoader workers and NCCL).",
        )
    for source, env, field in ((where, p.env, "env"), (ctx.spec_source, ctx.spec.env, "env")):
        for name in env:
            if looks_secret(name):
                raise PlanError(
                    f"`{field}.{name}` looks like a credential; its value would be written into the manifest and the ConfigMap "
                    "(and committed under manifests/).",
                    location=f"{source}: {field}.{name}",
                    hint=f"Create a Secret in the cluster and reference it from the profile: kubernetes.secret_env: "
                    f"{{{name}: {{secret: <Secret name>, key: <key>}}}}; remove {name} from {field}.",
                )
            if name in LAUNCHER_ENV or name.startswith(("PET_", "TORCHELASTIC_")):
                raise PlanError(
                    f"`{field}.{name}` is set by the launcher (training-operator / Trainer / torchrun) in every pod; "
                    "overriding it breaks rank semantics (every process would see the same rank or world size).",
                    location=f"{source}: {field}.{name}",
                    hint=f"Remove {name}: nodes come from resources.nodes, processes per pod from resources.devices_per_node.",
                )
            if name in k.secret_env:
                raise PlanError(
                    f"`{field}.{name}` is also in kubernetes.secret_env; one variable cannot have two sources.",
                    location=f"{source}: {field}.{name}",
                    hint=f"Remove {name} from {field} (the Secret reference stays).",
                )
    for name in k.secret_env:
        if name in LAUNCHER_ENV or name.startswith(("PET_", "TORCHELASTIC_")):
            raise PlanError(f"`kubernetes.secret_env.{name}` names a launcher variable", location=f"{where}: kubernetes.secret_env.{name}",
                            hint=f"Pick another variable name than {name}.")
    if k.job_api == "trainjob":
        unsupported = [(f, v) for f, v in (("priority_class", k.priority_class), ("scheduler_name", k.scheduler_name))
                       if v is not None]
        for f, value in unsupported:
            raise PlanError(
                f"You set `kubernetes.{f}: {value}` with `job_api: trainjob`, but a TrainJob's runtimePatches cannot set it "
                "(Trainer v2.3.0 CRD: only nodeSelector, tolerations, affinity, serviceAccountName, imagePullSecrets, "
                "volumes and container mounts/securityContext).",
                location=f"{where}: kubernetes.{f}",
                hint=f"Set {f} in the ClusterTrainingRuntime {k.trainer_runtime!r}, or render a PyTorchJob (job_api: pytorchjob).",
            )


# --------------------------------------------------------------------------- plan


def pod_values(ctx: PlanContext, name: str, kind: K8sKind) -> dict[str, Any]:
    """Everything the pod templates need, decided here (templates only place and quote it).

    Returns a mapping with: ``image``, ``image_pull_policy``, ``command`` (argv list), ``env``
    (sorted ``(name, value)`` pairs), ``secret_env`` (sorted ``(name, secretKeyRef dict)``),
    ``requests`` / ``limits`` (resource name -> quantity string, requests <= limits),
    ``capabilities`` (["IPC_LOCK"] on RDMA fabrics), ``port`` / ``port_name`` (PyTorchJob),
    ``volume_mounts`` / ``volumes`` (dicts), and the pod-level settings of the profile.
    """
    p, k, w = ctx.profile, ctx.profile.kubernetes, ctx.world
    assert k is not None
    run_dir = f"{RUN_ROOT}/{name}"
    launcher = [_kubelet_literal(k.python), "-m", "torch.distributed.run"]
    if kind is PYTORCHJOB:
        # The operator sets MASTER_ADDR/MASTER_PORT, torchrun reads only --master-addr/PET_MASTER_ADDR.
        launcher += ["--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]
    command = [*launcher, "-m", "jobgen.train", "--spec", f"{CONFIG_MOUNT}/{SPEC_FILE}", "--run-dir", run_dir]
    env = job_env(ctx) | {"OMP_NUM_THREADS": str(max(1, p.cpus_per_node // w.devices_per_node))}
    env = {key: _kubelet_literal(value) for key, value in sorted(env.items())}
    secret_env = [(key, {"name": ref.secret, "key": ref.key, **({"optional": True} if ref.optional else {})})
                  for key, ref in sorted(k.secret_env.items())]
    requests: dict[str, str] = {"cpu": str(p.cpus_per_node), "memory": _mib(k.mem_request_gib or p.mem_gib_per_node)}
    limits: dict[str, str] = {"memory": _mib(p.mem_gib_per_node)}
    if k.cpu_limit is not None:
        limits = {"cpu": _cpu_quantity(k.cpu_limit), **limits}
    extended: dict[str, str] = {}
    if w.accelerator == "gpu":
        extended["nvidia.com/gpu"] = str(w.devices_per_node)
    rdma = p.network_fabric in ("infiniband", "roce", "efa")
    if rdma and k.rdma_resource:
        extended[k.rdma_resource] = str(k.rdma_devices)
    extended.update({key: str(count) for key, count in k.extra_resources.items()})
    for key, value in sorted(extended.items()):  # extended resources: requests must equal limits
        requests[key] = value
        limits[key] = value
    mounts = [
        {"mountPath": "/dev/shm", "name": "dshm"},
        {"mountPath": CONFIG_MOUNT, "name": "jobgen-config", "readOnly": True},
        {"mountPath": RUN_ROOT, "name": "runs"},
    ]
    runs = ({"name": "runs", "persistentVolumeClaim": {"claimName": k.runs_volume_claim}} if k.runs_volume_claim
            else {"emptyDir": {}, "name": "runs"})
    volumes = [
        {"emptyDir": {"medium": "Memory", "sizeLimit": _mib(k.shm_size_gib)}, "name": "dshm"},
        {"configMap": {"name": config_map_name(name)}, "name": "jobgen-config"},
        runs,
    ]
    return {
        "image": k.image,
        "image_pull_policy": k.image_pull_policy,
        "command": command,
        "env": list(env.items()),
        "secret_env": secret_env,
        "requests": requests,
        "limits": limits,
        "capabilities": ["IPC_LOCK"] if rdma else [],
        "port": k.master_port if kind is PYTORCHJOB else None,
        "port_name": PORT_NAME,
        "volume_mounts": mounts,
        "volumes": volumes,
        "service_account": k.service_account,
        "priority_class": k.priority_class,
        "scheduler_name": k.scheduler_name,
        "node_selector": dict(sorted(k.node_selector.items())),
        "tolerations": [t.model_dump(exclude_none=True) for t in k.tolerations],
        "affinity": k.affinity,
        "image_pull_secrets": list(k.image_pull_secrets),
    }


def run_policy(ctx: PlanContext) -> dict[str, Any]:
    """PyTorchJob ``spec.runPolicy`` (training-operator RunPolicy), keys in a fixed order."""
    k = ctx.profile.kubernetes
    assert k is not None
    policy: dict[str, Any] = {"backoffLimit": k.backoff_limit, "cleanPodPolicy": k.clean_pod_policy}
    if k.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = k.ttl_seconds_after_finished
    minutes = ctx.spec.resources.time_limit_min or k.time_limit_min
    if minutes:
        policy["activeDeadlineSeconds"] = minutes * 60
    if k.scheduler_name == "volcano":
        scheduling: dict[str, Any] = {"minAvailable": ctx.world.num_nodes}
        if k.volcano_queue:
            scheduling["queue"] = k.volcano_queue
        if k.priority_class:
            scheduling["priorityClass"] = k.priority_class
        policy["schedulingPolicy"] = scheduling
    return policy


def plan(ctx: PlanContext) -> JobPlan:
    """Plan ``pytorchjob.yaml`` (ConfigMap + PyTorchJob) or ``trainjob.yaml`` (ConfigMap +
    TrainJob), ``kustomization.yaml`` (for ``kubectl apply -k``) + ``spec.json``
    (+ ``ds_config.json``), and check the objects offline (:mod:`jobgen.k8s_validate`).

    Raises:
        PlanError: the profile breaks a rule of :func:`check_settings`, the job name cannot be a
            DNS-1035 name, or an offline validator rejects the objects (path + rule + hint).
        ConfigError: the rendered YAML does not parse back to the expected objects.
    """
    k = ctx.profile.kubernetes
    assert k is not None  # guaranteed by ClusterProfile validation
    kind = KINDS[k.job_api]
    name, warnings = object_name(ctx)
    check_settings(ctx)
    files = common_files(ctx)
    w = ctx.world
    labels = {**MANAGED_BY, "app.kubernetes.io/name": name}
    job_labels = dict(labels)
    if k.queue_label:  # on the job only: Kueue admits the job; a pod label would make Kueue gate the pods too
        job_labels["kueue.x-k8s.io/queue-name"] = k.queue_label
    annotations = {JOB_NAME_ANNOTATION: ctx.spec.name, INPUTS_ANNOTATION: ctx.inputs_sha256}
    pod = pod_values(ctx, name, kind)
    common = {
        "name": name,
        "namespace": k.namespace,
        "labels": labels,
        "job_labels": job_labels,
        "annotations": annotations,
        "config_map": config_map_name(name),
        "config_files": [(fname, body) for fname, body in files if fname in (SPEC_FILE, DS_CONFIG_FILE)],
        "p": pod,
    }
    if kind is PYTORCHJOB:
        roles = [("Master", 1)] + ([("Worker", w.num_nodes - 1)] if w.num_nodes > 1 else [])
        text = render_job_template(ctx, TEMPLATE, nproc_per_node=str(w.devices_per_node), run_policy=run_policy(ctx),
                                   roles=roles, **common)
    else:
        minutes = ctx.spec.resources.time_limit_min or k.time_limit_min
        text = render_job_template(ctx, TRAINJOB_TEMPLATE, runtime=k.trainer_runtime, num_nodes=w.num_nodes,
                                   nproc_per_node=w.devices_per_node, active_deadline_s=minutes * 60 if minutes else None,
                                   replicated_job=TRAINJOB_NODE, container=TRAINJOB_NODE, **common)
    docs = parse_manifest(text, kind.manifest)
    _check_parsed(docs, kind, name, w.num_nodes, dict(files))
    from jobgen import k8s_validate  # lazy: jsonschema and kubernetes-validate stay off other render paths

    report = k8s_validate.validate_manifest(docs, source=f"{ctx.profile.name}/{ctx.spec.name}/{kind.manifest}",
                                            k8s_version=k.version, profile_source=ctx.profile_source)
    warnings += report.warnings
    rdma_fabric = ctx.profile.network_fabric in ("infiniband", "roce", "efa")
    if rdma_fabric and w.accelerator == "gpu" and not k.rdma_resource:
        warnings += (f"network_fabric {ctx.profile.network_fabric} but no kubernetes.rdma_resource: pods get IPC_LOCK but no RDMA "
                     "device unless the cluster injects one (e.g. hostNetwork or a device plugin default); NCCL may fall back "
                     "to TCP sockets",)
    files.append((kind.manifest, text))
    header = (f"# Generated by jobgen {__version__} from profile {ctx.profile.name}; re-render instead of editing.\n"
              "# apply: kubectl apply -k <this directory>")
    files.append((KUSTOMIZATION_FILE, kustomization_yaml(header, [kind.manifest])))
    return JobPlan(
        scheduler="kubernetes",
        profile=ctx.profile.name,
        job_name=ctx.spec.name,
        files=tuple(sorted(files)),
        submit_argv=("kubectl", "apply", "-f", kind.manifest),
        world=w,
        inputs_sha256=ctx.inputs_sha256,
        warnings=warnings,
    )


def parse_manifest(text: str, source: str) -> list[dict[str, Any]]:
    """The YAML documents of a rendered manifest (empty documents dropped).

    Raises:
        ConfigError: the text is not valid YAML, or a document is not a mapping.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        docs = [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}", hint="re-render it, or check templates/kubernetes/") from None
    if not all(isinstance(d, dict) for d in docs):
        raise ConfigError(f"{source}: every YAML document must be a mapping (a Kubernetes object)")
    return docs


def _check_parsed(docs: list[dict[str, Any]], kind: K8sKind, name: str, nodes: int, config_files: dict[str, str]) -> None:
    """Check the rendered objects' shape before anything is written (a user-edited template can
    break it): a ConfigMap carrying the files byte for byte, then the job with its replicas."""
    kinds = [d.get("kind") for d in docs]
    if kinds != ["ConfigMap", kind.kind]:
        raise ConfigError(f"the {kind.kind} template must render a ConfigMap and a {kind.kind}, got {kinds}",
                          hint="check templates/kubernetes/")
    if docs[0].get("data") != config_files:
        raise ConfigError(f"the ConfigMap in the rendered manifest does not carry {', '.join(sorted(config_files))} byte for byte")
    job: dict[str, Any] = docs[1]
    if job.get("metadata", {}).get("name") != name:
        raise ConfigError(f"rendered {kind.kind} is named {job.get('metadata', {}).get('name')!r}, expected {name!r}")
    if kind is PYTORCHJOB:
        specs = job["spec"]["pytorchReplicaSpecs"]
        replicas = {role: spec.get("replicas") for role, spec in specs.items()}
        expected = {"Master": 1, **({"Worker": nodes - 1} if nodes > 1 else {})}
        if replicas != expected:
            raise ConfigError(f"rendered PyTorchJob has replicas {replicas}, expected {expected} (Master 1 + Worker nodes - 1)")
    elif job["spec"]["trainer"].get("numNodes") != nodes:
        raise ConfigError(f"rendered TrainJob has numNodes {job['spec']['trainer'].get('numNodes')}, expected {nodes}")


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
            f"{job_dir} is not a rendered Kubernetes job directory (needs exactly one of {MANIFEST_FILE}, {TRAINJOB_FILE})",
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
    label = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    if handle.scheme != "k8s" or len(parts) != 3 or not parts[0] or not label.match(parts[1]) or not label.match(parts[2]):
        raise ConfigError(f"{handle} is not a Kubernetes job handle", hint="Kubernetes handles look like k8s://<context>/<namespace>/<name>")
    return parts[0], parts[1], parts[2]


# --------------------------------------------------------------------------- talking to a cluster

#: Environment variables that override the profile's context / namespace (flags override both).
ENV_CONTEXT = "JOBGEN_K8S_CONTEXT"
ENV_NAMESPACE = "JOBGEN_K8S_NAMESPACE"
#: First server minor version with the ``fieldValidation`` query parameter on by default
#: (beta in 1.25, GA in 1.27); older servers ignore it and prune unknown fields silently.
FIELD_VALIDATION_SINCE = (1, 25)


class ApiError(SubmitError):
    """The API server answered with an error status.

    Attributes:
        status: the HTTP status (404, 409, 422, ...).
        reason: the Status object's ``reason`` (NotFound, AlreadyExists, Invalid, ...).
    """

    def __init__(self, message: str, *, status: int, reason: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.status = status
        self.reason = reason


class Cluster:
    """A connection to one kubeconfig context, over the official ``kubernetes`` client's
    ApiClient (auth, TLS, exec plugins). Requests go through :meth:`request` with plain dicts,
    so the generated models never drop or coerce a field jobgen sent."""

    def __init__(self, api: Any, context: str):
        self.api = api
        self.context = context
        self._version: tuple[int, int] | None = None

    def request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None, body: Any = None,
                timeout: float | tuple[float, float] = 30.0, stream: bool = False) -> Any:
        """One API call; returns the decoded JSON body (or the raw urllib3 response with ``stream``).

        Raises:
            ApiError: a non-2xx answer (status, the server's message).
            SubmitError: the server cannot be reached.
        """
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            serialized = self.api.param_serialize(method=method, resource_path=path, query_params=query or [],
                                                  header_params=headers, body=body, auth_settings=["BearerToken"])
            response = self.api.call_api(*serialized, _request_timeout=timeout)
        except Exception as exc:  # urllib3 connection errors, TLS, exec-plugin failures
            if isinstance(exc, ApiError):
                raise
            raise SubmitError(f"cannot reach the Kubernetes API server of context {self.context!r}: {exc}",
                              hint="check `kubectl --context <context> get --raw /readyz`, the kubeconfig and the network") from None
        if 200 <= response.status < 300:
            if stream:
                return response.response
            data = response.read()
            return json.loads(data) if data else {}
        data = response.read() or b""
        message, reason = data.decode("utf-8", "replace").strip(), ""
        try:
            status_doc = json.loads(data)
            message, reason = status_doc.get("message", message), status_doc.get("reason", "")
        except ValueError:
            pass
        raise ApiError(f"{method} {path}: {response.status} {reason or response.reason}: {message}", status=response.status, reason=reason)

    @property
    def server_version(self) -> tuple[int, int] | None:
        """``(major, minor)`` from ``/version`` (None when the server does not say). Not the
        client's ``VersionApi``: it asks ``/version/``, which newer servers answer with 404."""
        if self._version is None:
            try:
                doc = self.request("GET", "/version")
                self._version = (int(doc["major"]), int(re.sub(r"\D.*", "", str(doc["minor"]))))
            except (ApiError, KeyError, ValueError):
                return None
        return self._version

    @property
    def field_validation(self) -> bool:
        """Whether the server rejects unknown fields with ``fieldValidation=Strict``."""
        version = self.server_version
        return version is not None and version >= FIELD_VALIDATION_SINCE


def kubeconfig_path(kubeconfig: str | None) -> str:
    """The kubeconfig file(s) to read: the given path, else ``$KUBECONFIG`` (a ``:``-separated
    list is merged, as kubectl does), else ``~/.kube/config``."""
    import os

    return kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def connect(context: str | None = None, kubeconfig: str | None = None) -> Cluster:
    """Open a :class:`Cluster` for ``context`` (None: the kubeconfig's current context).

    Raises:
        ConfigError: the ``kubernetes`` client is not installed, the kubeconfig is missing or
            invalid, or it has no such context (the known ones are listed).
    """
    try:
        from kubernetes import config as kube_config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ConfigError("submitting to Kubernetes needs the official client", hint="pip install 'jobgen[k8s]'") from None
    path = kubeconfig_path(kubeconfig)
    try:
        contexts, active = kube_config.list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}",
                          hint="set kubernetes.kubeconfig in the profile, $KUBECONFIG, or --kubeconfig") from None
    names = [c["name"] for c in contexts or []]
    name = context or (active or {}).get("name")
    if not name or name not in names:
        raise ConfigError(
            f"kubeconfig {path} has no context {name!r}" if name else f"kubeconfig {path} has no current context",
            hint=f"pick one of: {', '.join(names) or '(none)'} (--context, ${ENV_CONTEXT} or kubernetes.context in the profile)",
        )
    try:
        api = kube_config.new_client_from_config(config_file=path, context=name, persist_config=False)
    except (ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"kubeconfig {path}, context {name!r}: {exc}", hint="check the context's cluster and user entries") from None
    return Cluster(api, name)


def _collection(kind: K8sKind, namespace: str) -> str:
    return f"/apis/{kind.group}/{kind.version}/namespaces/{namespace}/{kind.plural}"


def _core(namespace: str, resource: str) -> str:
    return f"/api/v1/namespaces/{namespace}/{resource}"


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
    from jobgen.k8s_validate import pod_templates

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
            checks.append((f"ConfigMap {obj['metadata']['name']}", _core(namespace, "configmaps"), obj))
        elif obj is job:
            checks.append((f"{kind.kind} {job['metadata']['name']}", _collection(kind, namespace), obj))
    checks += [(f"Pod {name} (from the {kind.kind}'s pod template)", _core(namespace, "pods"), pod) for name, pod in replica_pods(job)]
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
        return cluster.request("GET", f"{_collection(kind, namespace)}/{name}")
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
        cluster.request("DELETE", f"{_collection(kind, namespace)}/{name}",
                        body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"})
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _apply_config_map(cluster: Cluster, config_map: dict[str, Any], strict_query: list[tuple[str, str]]) -> dict[str, Any]:
    namespace, name = config_map["metadata"]["namespace"], config_map["metadata"]["name"]
    try:
        return cluster.request("POST", _core(namespace, "configmaps"), query=strict_query, body=config_map)
    except ApiError as exc:
        if exc.status != 409:
            raise
    current = cluster.request("GET", f"{_core(namespace, 'configmaps')}/{name}")
    labels = (current.get("metadata", {}).get("labels") or {})
    if labels.get("app.kubernetes.io/managed-by") != "jobgen":
        raise SubmitError(f"ConfigMap {namespace}/{name} exists and was not created by jobgen",
                          hint="rename the job (name: in the spec) or remove that ConfigMap")
    body = {**config_map, "metadata": {**config_map["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    return cluster.request("PUT", f"{_core(namespace, 'configmaps')}/{name}", query=strict_query, body=body)


@dataclass(frozen=True)
class SubmitResult:
    """What :func:`submit_dir` did: ``action`` is ``created``, ``replaced``, ``unchanged`` or
    ``dry-run``; ``handle`` is None for a dry run."""

    action: str
    handle: JobHandle | None
    lines: tuple[str, ...] = ()


def resolve_target(*, context: str | None, namespace: str | None, profile_context: str | None = None) -> tuple[str | None, str | None]:
    """The context and namespace to use: the flag, else ``$JOBGEN_K8S_CONTEXT`` /
    ``$JOBGEN_K8S_NAMESPACE``, else the profile's context (the namespace then comes from the
    manifest); None: the kubeconfig's current context / the manifest's namespace."""
    import os

    return (context or os.environ.get(ENV_CONTEXT) or profile_context,
            namespace or os.environ.get(ENV_NAMESPACE) or None)


def submit_dir(job_dir: Path, *, context: str | None = None, namespace: str | None = None, kubeconfig: str | None = None,
               dry_run: bool = False, replace: bool = False, wait_s: float = 120.0,
               out: Callable[[str], None] = print) -> SubmitResult:
    """Submit the rendered manifest in ``job_dir`` (what is committed is what runs).

    An existing job of the same name is compared by its ``jobgen.dev/inputs-sha256``
    annotation: identical inputs -> nothing is changed (``unchanged``, no request beyond the
    read); other inputs -> refused unless ``replace``. Before anything is deleted or created,
    :func:`server_dry_run` validates every object (``dry_run`` stops there); ``replace`` then
    deletes the old job (foreground: its pods first), waits up to ``wait_s`` for it to go, and
    creates the new one. The ConfigMap is
    created (or updated) first and then owned by the job, so deleting the job removes it.
    The submission is recorded in the job directory and the state index.

    Raises:
        ConfigError: not a Kubernetes job directory; kubeconfig/context problems.
        SubmitError: the server rejected an object, the job exists with other inputs (without
            ``replace``), or the cluster cannot be reached.
    """
    jd = read_job_dir(job_dir)
    objects = [json.loads(json.dumps(o)) for o in jd.objects]  # deep copy; namespace may change
    ns = namespace or jd.namespace
    for obj in objects:
        obj.setdefault("metadata", {})["namespace"] = ns
    if namespace and namespace != jd.namespace:
        out(f"jobgen: submitting into namespace {ns} (the manifest says {jd.namespace})")
    cluster = connect(context, kubeconfig)
    kind = jd.kind
    existing = _get_job(cluster, kind, ns, jd.name)
    if dry_run:
        if existing is not None:
            same = (existing.get("metadata", {}).get("annotations") or {}).get(INPUTS_ANNOTATION) == jd.inputs_sha256
            out(f"jobgen: {kind.kind} {ns}/{jd.name} exists with {'identical' if same else 'other'} inputs")
        return SubmitResult("dry-run", None, tuple(server_dry_run(cluster, kind, tuple(objects), out=out)))
    handle = make_handle(cluster.context, ns, jd.name)
    action = "created"
    if existing is not None:
        old = (existing.get("metadata", {}).get("annotations") or {}).get(INPUTS_ANNOTATION)
        if existing.get("metadata", {}).get("deletionTimestamp"):
            raise SubmitError(f"{kind.kind} {ns}/{jd.name} is being deleted", hint="wait until `jobgen status` says UNKNOWN, then submit again")
        if old == jd.inputs_sha256 and not replace:
            _record(jd, handle, kind, kubeconfig)
            return SubmitResult("unchanged", handle)
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
        _wait_gone(cluster, kind, ns, jd.name, wait_s, out)
        action = "replaced"
    strict_query = [("fieldValidation", "Strict")] if cluster.field_validation else []
    config_map = next((o for o in objects if o.get("kind") == "ConfigMap"), None)
    if config_map is not None:
        _apply_config_map(cluster, config_map, strict_query)
    job = next(o for o in objects if o.get("kind") == kind.kind)
    try:
        created = cluster.request("POST", _collection(kind, ns), query=strict_query, body=job)
    except ApiError as exc:
        raise ApiError(f"the API server rejected {kind.kind} {ns}/{jd.name}: {exc.message}", status=exc.status, reason=exc.reason,
                       hint=_hint_for(exc, kind, ns)) from None
    if config_map is not None:  # the job owns its ConfigMap: deleting the job garbage-collects it
        owner = {"apiVersion": kind.api_version, "kind": kind.kind, "name": jd.name, "uid": created["metadata"]["uid"],
                 "blockOwnerDeletion": False}
        cm_path = f"{_core(ns, 'configmaps')}/{config_map['metadata']['name']}"
        current = cluster.request("GET", cm_path)
        current["metadata"]["ownerReferences"] = [owner]
        cluster.request("PUT", cm_path, body=current)
    _record(jd, handle, kind, kubeconfig)
    return SubmitResult(action, handle, lines)


def _record(jd: JobDir, handle: JobHandle, kind: K8sKind, kubeconfig: str | None) -> None:
    context, namespace, name = parse_handle(handle)
    argv = ("kubernetes", "create", f"{kind.plural}.{kind.group}/{kind.version}", f"{namespace}/{name}", "--context", context)
    if kubeconfig:
        argv += ("--kubeconfig", kubeconfig)
    Submission(handle=str(handle), job_dir=str(jd.path), run_dir=f"{RUN_ROOT}/{name} (in the pods)", log_file=None,
               argv=argv, inputs_sha256=jd.inputs_sha256).save()


def _recorded(handle: JobHandle) -> tuple[list[K8sKind], str | None]:
    """The kinds to look for (the recorded one first) and the recorded kubeconfig."""
    from jobgen.backends.base import find_submission

    record = find_submission(handle)
    kinds, kubeconfig = [PYTORCHJOB, TRAINJOB], None
    if record is not None:
        argv = list(record.argv)
        if "--kubeconfig" in argv:
            kubeconfig = argv[argv.index("--kubeconfig") + 1]
        kinds.sort(key=lambda k: f"{k.plural}.{k.group}/{k.version}" not in argv)
    return kinds, kubeconfig


def _find(handle: JobHandle, kubeconfig: str | None = None) -> tuple[Cluster, K8sKind, str, str, dict[str, Any] | None]:
    context, namespace, name = parse_handle(handle)
    kinds, recorded = _recorded(handle)
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
#: PyTorchJob; Trainer v2 TrainJob says Complete/Failed/Suspended).
_CONDITION_STATES = (("Failed", "FAILED"), ("Succeeded", "SUCCEEDED"), ("Complete", "SUCCEEDED"), ("Suspended", "SUSPENDED"),
                     ("Restarting", "RESTARTING"), ("Running", "RUNNING"), ("Created", "CREATED"))


def job_state(job: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """``(state, details)`` from a job object's ``status``: the most decisive condition that is
    True (FAILED, SUCCEEDED, SUSPENDED, RESTARTING, RUNNING, CREATED), TERMINATING while a
    delete is in progress, SUBMITTED when no controller has reported yet; details hold the
    condition's reason/message, replica counts (``master``, ``worker``: "active 1 succeeded 0
    failed 0") and start/completion times."""
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if str(c.get("status")) == "True"}
    details: dict[str, str] = {}
    state = "SUBMITTED"
    for ctype, name in _CONDITION_STATES:
        if ctype in conditions:
            state = name
            cond = conditions[ctype]
            details["reason"] = str(cond.get("reason") or "")
            details["message"] = str(cond.get("message") or "")
            break
    else:
        details["reason"] = "no conditions yet: the operator has not picked the job up (is it running in the cluster?)"
    if job.get("metadata", {}).get("deletionTimestamp"):
        state = "TERMINATING"
    for role, counts in sorted((status.get("replicaStatuses") or {}).items()):
        details[role.lower()] = " ".join(f"{key} {counts.get(key, 0)}" for key in ("active", "succeeded", "failed"))
    for key, field in (("started", "startTime"), ("completed", "completionTime")):
        if status.get(field):
            details[key] = str(status[field])
    return state, details


def status(handle: JobHandle, *, kubeconfig: str | None = None) -> JobStatus:
    """The job's state from the API server (see :func:`job_state`); ``UNKNOWN`` when the object
    does not exist (deleted, or never created).

    Raises:
        ConfigError: not a k8s handle, or no usable kubeconfig context.
        SubmitError: the API server cannot be reached or refuses the request.
    """
    _, kind, namespace, name, job = _find(handle, kubeconfig)
    if job is None:
        return JobStatus(handle, "UNKNOWN", "kube-apiserver", {"reason": f"no {kind.kind} {namespace}/{name} (deleted, or never created)"})
    state, details = job_state(job)
    details["kind"] = kind.kind
    return JobStatus(handle, state, "kube-apiserver", details)


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
            return cluster.request("GET", f"{_core(namespace, 'pods')}/{pod_name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
    items = cluster.request("GET", _core(namespace, "pods"), query=[("labelSelector", selector or "")]).get("items") or []
    items.sort(key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "")
    return items[-1] if items else None


def _container_started(pod: dict[str, Any], container: str) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            state = cs.get("state") or {}
            return "running" in state or "terminated" in state or bool(cs.get("restartCount"))
    return False


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


def logs(handle: JobHandle, *, replica: str = "master-0", follow: bool = False, poll_s: float = 2.0,
         kubeconfig: str | None = None, out: Callable[[str], None] = print) -> None:
    """Print the output of one replica's pod (``master-0`` by default: global rank zero lives
    there); with ``follow``, wait for the pod to start, stream until the job ends, and attach
    again after a container restart.

    Raises:
        ConfigError: bad ``replica``; no such job.
        SubmitError: the API server cannot be reached or refuses the request.
    """
    cluster, kind, namespace, name, job = _find(handle, kubeconfig)
    if job is None:
        raise ConfigError(f"no {kind.kind} {namespace}/{name} on context {cluster.context}", hint="check `jobgen status` (deleted?)")
    pod_name, selector, container = replica_selector(kind, name, replica)
    announced = ""
    attached = 0
    while True:
        pod = _pod(cluster, namespace, pod_name, selector)
        state = _current_state(cluster, kind, namespace, name)
        if pod is None or not _container_started(pod, container):
            what = f"no pod for {replica} yet" if pod is None else f"pod {pod['metadata']['name']} is {(pod.get('status') or {}).get('phase', 'Pending')}"
            if not follow or state in ("SUCCEEDED", "FAILED", "UNKNOWN"):
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
        response = cluster.request("GET", f"{_core(namespace, 'pods')}/{pod['metadata']['name']}/log", query=query,
                                   timeout=(30.0, None) if follow else 60.0, stream=True)  # type: ignore[arg-type]
        try:
            for line in iter_lines(response.stream(64 * 1024)):
                out(line)
        finally:
            response.release_conn()
        attached += 1
        if not follow:
            return
        if _current_state(cluster, kind, namespace, name) in ("SUCCEEDED", "FAILED", "TERMINATING", "UNKNOWN"):
            return
        time.sleep(poll_s)


def cancel(handle: JobHandle, *, wait_s: float = 120.0, kubeconfig: str | None = None,
           out: Callable[[str], None] = print) -> JobStatus:
    """Delete the job with foreground propagation (its pods are deleted first, then the job) and
    wait up to ``wait_s`` until it is gone; then remove its ConfigMap if the garbage collector
    has not. Returns ``DELETED`` (or ``UNKNOWN`` when there was no such job).

    Raises:
        SubmitError: the job still exists after ``wait_s`` (the message names its finalizers),
            or the API server refuses.
    """
    cluster, kind, namespace, name, job = _find(handle, kubeconfig)
    if job is None or not _delete_job(cluster, kind, namespace, name):
        return JobStatus(handle, "UNKNOWN", "kube-apiserver", {"reason": f"no {kind.kind} {namespace}/{name} to delete"})
    _wait_gone(cluster, kind, namespace, name, wait_s, out)
    cm_path = f"{_core(namespace, 'configmaps')}/{config_map_name(name)}"
    try:
        current = cluster.request("GET", cm_path)
        if (current.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "jobgen":
            cluster.request("DELETE", cm_path)
    except ApiError as exc:
        if exc.status != 404:
            raise
    return JobStatus(handle, "DELETED", "kube-apiserver", {"kind": kind.kind, "propagation": "Foreground"})


def submit(plan: JobPlan, job_dir: Path, **options: Any) -> JobHandle | None:
    """Submit a written plan from ``job_dir`` (see :func:`submit_dir`); the Backend protocol's entry."""
    return submit_dir(job_dir, **options).handle


__all__ = [
    "CONFIG_MOUNT", "KUSTOMIZATION_FILE", "MANIFEST_FILE", "MAX_NAME", "RUN_ROOT", "SUBMISSION_FILE", "TRAINJOB_FILE",
    "ApiError", "Cluster", "JobDir", "K8sKind", "SubmitResult", "cancel", "check_settings", "connect", "job_state",
    "k8s_name", "kustomization_yaml", "logs", "make_handle", "manifest_file", "object_name", "parse_handle", "plan", "pod_values",
    "pruned_paths", "read_job_dir", "replica_selector", "server_dry_run", "status", "submit", "submit_dir",
]
