"""Kubernetes backend: plans a Kubeflow PyTorchJob (kubeflow.org/v1) plus a ConfigMap.

Launch contract (ARCHITECTURE.md): one pod per node, Master (1) + Worker (nodes - 1), a
container named ``pytorch`` running ``torchrun`` which reads the operator's PET_* variables
(PET_NNODES, PET_NPROC_PER_NODE from ``spec.nprocPerNode``, PET_NODE_RANK, PET_MASTER_ADDR,
PET_MASTER_PORT) -> Lightning's TorchElasticEnvironment. KubeflowEnvironment is not used: it
assumes one process per pod. The resolved spec (and DeepSpeed config) travel in a ConfigMap
mounted at /etc/jobgen. The ``kubernetes`` client is never imported here.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from jobgen import __version__
from jobgen.backends.base import DS_CONFIG_FILE, SPEC_FILE, JobHandle, common_files, job_env, render_job_template
from jobgen.errors import ConfigError, NotSupportedError
from jobgen.plan import JobPlan, PlanContext

TEMPLATE = "kubernetes/pytorchjob.yaml.j2"
MANIFEST_FILE = "pytorchjob.yaml"
#: Makes every Kubernetes job directory ``kubectl apply -k`` ready (Argo CD, Flux accept it too).
KUSTOMIZATION_FILE = "kustomization.yaml"
CONFIG_MOUNT = "/etc/jobgen"
RUN_ROOT = "/workspace/runs"
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: Longest job name that leaves room for the operator's pod names (<name>-worker-<index>)
#: inside the 63-character DNS label limit.
MAX_NAME = 48


def k8s_name(name: str) -> tuple[str, bool]:
    """A DNS-1035 object name for job ``name``; ``(name, derived)``.

    A valid name of at most 48 characters is used as is. Otherwise a name is derived, never
    silently: lowercase, runs of other characters -> '-', truncated, plus ``-`` and the first
    8 hex digits of sha256(name) so distinct names stay distinct; ``derived`` is then True
    and the plan warns.
    """
    if _DNS1035.match(name) and len(name) <= MAX_NAME:
        return name, False
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    slug = re.sub(r"^[^a-z]+", "", slug)[: MAX_NAME - 9].rstrip("-") or "job"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}", True


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


def plan(ctx: PlanContext) -> JobPlan:
    """Plan ``pytorchjob.yaml`` (ConfigMap + PyTorchJob), ``kustomization.yaml`` (for
    ``kubectl apply -k``) + ``spec.json`` (+ ``ds_config.json``).

    Raises:
        ConfigError: the rendered YAML does not parse back to the expected objects.
    """
    k = ctx.profile.kubernetes
    assert k is not None  # guaranteed by ClusterProfile validation
    name, derived = k8s_name(ctx.spec.name)
    files = common_files(ctx)
    w = ctx.world
    resources_limits: dict[str, str] = {"memory": f"{int(ctx.profile.mem_gib_per_node * 1024)}Mi"}
    if w.accelerator == "gpu":
        resources_limits["nvidia.com/gpu"] = str(w.devices_per_node)
    labels = {"app.kubernetes.io/managed-by": "jobgen", "app.kubernetes.io/name": name}
    if k.queue_label:
        labels["kueue.x-k8s.io/queue-name"] = k.queue_label
    entry = [
        k.python, "-m", "torch.distributed.run",
        "-m", "jobgen.train", "--spec", f"{CONFIG_MOUNT}/{SPEC_FILE}", "--run-dir", f"{RUN_ROOT}/{name}",
    ]
    text = render_job_template(
        ctx,
        TEMPLATE,
        name=name,
        job_name=ctx.spec.name,
        namespace=k.namespace,
        labels=labels,
        config_files=[(fname, body) for fname, body in files if fname in (SPEC_FILE, DS_CONFIG_FILE)],
        nproc_per_node=str(w.devices_per_node),
        workers=w.num_nodes - 1,
        image=k.image,
        image_pull_policy=k.image_pull_policy,
        command=entry,
        env=job_env(ctx) | {"OMP_NUM_THREADS": str(max(1, ctx.profile.cpus_per_node // w.devices_per_node))},
        cpu_request=str(ctx.profile.cpus_per_node),
        limits=resources_limits,
        shm_size=f"{int(k.shm_size_gib * 1024)}Mi",
        node_selector=k.node_selector,
        tolerations=[t.model_dump(exclude_none=True) for t in k.tolerations],
        priority_class=k.priority_class,
        service_account=k.service_account,
        config_mount=CONFIG_MOUNT,
        run_root=RUN_ROOT,
        master_port=k.master_port,
    )
    _check_parsed(text, name, w.num_nodes, dict(files))
    files.append((MANIFEST_FILE, text))
    header = (f"# Generated by jobgen {__version__} from profile {ctx.profile.name}; re-render instead of editing.\n"
              "# apply: kubectl apply -k <this directory>")
    files.append((KUSTOMIZATION_FILE, kustomization_yaml(header, [MANIFEST_FILE])))
    warnings = (f"job name {ctx.spec.name!r} is not a DNS-1035 name of <= {MAX_NAME} chars; Kubernetes objects are named {name!r}",) if derived else ()
    return JobPlan(
        scheduler="kubernetes",
        profile=ctx.profile.name,
        job_name=ctx.spec.name,
        files=tuple(sorted(files)),
        submit_argv=("kubectl", "apply", "-f", MANIFEST_FILE),
        world=w,
        inputs_sha256=ctx.inputs_sha256,
        warnings=warnings,
    )


def _check_parsed(text: str, name: str, nodes: int, config_files: dict[str, str]) -> None:
    """Parse the rendered YAML back and check its shape before anything is written."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"the PyTorchJob template rendered invalid YAML: {exc}", hint="check templates/kubernetes/pytorchjob.yaml.j2") from None
    kinds = [d.get("kind") for d in docs]
    if kinds != ["ConfigMap", "PyTorchJob"]:
        raise ConfigError(f"the PyTorchJob template must render a ConfigMap and a PyTorchJob, got {kinds}")
    if docs[0].get("data") != config_files:
        raise ConfigError("the ConfigMap in the rendered manifest does not carry spec.json/ds_config.json byte for byte")
    job: dict[str, Any] = docs[1]
    specs = job["spec"]["pytorchReplicaSpecs"]
    replicas = {role: spec["replicas"] for role, spec in specs.items()}
    expected = {"Master": 1, **({"Worker": nodes - 1} if nodes > 1 else {})}
    if job["metadata"]["name"] != name or replicas != expected:
        raise ConfigError(f"rendered PyTorchJob has name/replicas {job['metadata']['name']}/{replicas}, expected {name}/{expected}")
    for role, spec in specs.items():
        containers = spec["template"]["spec"]["containers"]
        if [c["name"] for c in containers][:1] != ["pytorch"]:
            raise ConfigError(f"{role}: the first container must be named 'pytorch' (PyTorchJob operator rule)")


def submit(plan: JobPlan, job_dir: Path) -> JobHandle:
    """Submitting to Kubernetes arrives with the Kubernetes issue; rendering works today."""
    raise NotSupportedError(
        "submitting to Kubernetes is not supported yet",
        hint=f"the manifest is rendered in {job_dir}: apply it with `kubectl apply -f {job_dir / MANIFEST_FILE}`",
    )
