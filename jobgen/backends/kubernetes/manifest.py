"""Kubernetes manifests: a Kubeflow PyTorchJob (kubeflow.org/v1) or a Trainer v2 TrainJob
(trainer.kubeflow.org/v1alpha1) plus a ConfigMap, planned purely and checked offline
(:mod:`jobgen.backends.kubernetes.validate`). Submitting, status, logs and cancel live in
:mod:`jobgen.backends.kubernetes.backend`; the API client in :mod:`jobgen.backends.kubernetes.api`.

Launch contract (docs/own-code.md, "Launch contracts"): one pod per node, a container running ``torchrun``
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
- Elastic PyTorchJob (``resources.nodes: "min:max"``): Worker replicas only (= max) and
  ``spec.elasticPolicy`` (minReplicas, maxReplicas, rdzvBackend c10d, maxRestarts). The operator
  then injects PET_RDZV_ENDPOINT (``<name>-worker-0:<port>``), PET_RDZV_BACKEND, PET_NNODES
  ("min:max") and PET_MAX_RESTARTS (pkg/controller.v1/pytorch/elastic.go), but neither
  MASTER_ADDR nor PET_NPROC_PER_NODE: envvar.go sets those only when a Master replica exists.
  So the command passes torchrun ``--nnodes=min:max --nproc-per-node=<GPUs per pod>
  --rdzv-backend=c10d --rdzv-endpoint=$(PET_RDZV_ENDPOINT) --max-restarts=<n>``; without
  ``--nproc-per-node`` torchrun would start one process per pod. The rendezvous (a c10d TCP
  store) is hosted by worker 0's torchrun agent: the operator's design ties the job to that pod.
  Global rank 0 is not placed by the operator: the rendezvous numbers the agents of each round
  in the order of their node descriptors (host FQDN, pid, counter; torch 2.13
  ``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``, ``_mark_rendezvous_complete``),
  so it lands on worker 0 only when that pod's name happens to sort first. Nothing jobgen
  renders or runs is keyed on a pod name or replica index: every Worker runs the same command,
  and rank 0's duties (data bins, checkpoints, summary.json, notifications) go to whichever
  process is rank 0, in the run directory all pods share. An elastic job keeps its global
  batch at every pod count (:func:`jobgen.planning.rules.check_elastic`).
- TrainJob: the Trainer's torch plugin injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR and PET_MASTER_PORT (and refuses them in ``spec.trainer.env``), so the command
  is plain ``torchrun -m jobgen.train``; pod settings travel as a ``runtimePatches`` entry.

The resolved spec (and DeepSpeed config) travel in a ConfigMap mounted at /etc/jobgen. Planning
is pure and never imports ``kubernetes``; the offline validators (:mod:`jobgen.backends.kubernetes.validate`)
and the client are imported only when used.

Size: above ~500 lines on purpose: the two job APIs (PyTorchJob, elastic PyTorchJob, TrainJob)
share one set of pod values, names, the code checkout and the parse-back checks; split by API,
each would repeat them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from jobgen import __version__
from jobgen.backends.base import common_files, job_env, render_job_template
from jobgen.errors import ConfigError, PlanError
from jobgen.jobdir.files import (
    CODE_DIR_ENV,
    CODE_INFO_FILE,
    DS_CONFIG_FILE,
    KUSTOMIZATION_FILE,
    PYTORCHJOB_FILE,
    SPEC_FILE,
    TRAINJOB_FILE,
    generated_header,
    kustomization_yaml,
)
from jobgen.jobdir.runs import CodeSnapshot
from jobgen.planning.command import DEEPSPEED_CONFIG_ENV, RUN_DIR_ENV, target_argv
from jobgen.planning.environment import launcher_owned
from jobgen.planning.plan import ApiRequest, ClusterObject, JobPlan, PlanContext
from jobgen.specs.k8s_names import DNS1035_LABEL
from jobgen.specs.training import MAX_NAME

TEMPLATE = "kubernetes/pytorchjob.yaml.j2"
TRAINJOB_TEMPLATE = "kubernetes/trainjob.yaml.j2"
#: Every template this backend may render for a fixed-size job (all of them feed the inputs hash).
TEMPLATES = (TEMPLATE, TRAINJOB_TEMPLATE)
#: The elastic PyTorchJob (``resources.nodes: "min:max"``); feeds the hash of elastic jobs only.
ELASTIC_TEMPLATE = "kubernetes/pytorchjob-elastic.yaml.j2"
#: torchrun's rendezvous backend for elastic jobs: c10d (a TCP store in worker 0's agent; the
#: operator's default; etcd would need an etcd server the job does not bring).
RDZV_BACKEND = "c10d"
CONFIG_MOUNT = "/etc/jobgen"
RUN_ROOT = "/workspace/runs"
#: Annotation holding the sha256 of the inputs: how ``submit`` tells an identical re-submit
#: from a changed one. (A label value cannot hold 64 characters.)
INPUTS_ANNOTATION = "jobgen.dev/inputs-sha256"
JOB_NAME_ANNOTATION = "jobgen.dev/job-name"
MANAGED_BY = {"app.kubernetes.io/managed-by": "jobgen"}
#: The module the bundled entrypoint's pods start torchrun through (:mod:`jobgen.train.launch`):
#: the pod's exit code then carries the failure's class, as ``restartPolicy: ExitCode`` reads it.
LAUNCH_MODULE = "jobgen.train.launch"
#: Every replica's restart policy (training-operator v1.9 ``RestartPolicyExitCode``): exit codes
#: 1-127 fail the job, 128-255 recreate the pod (jobgen.reports.failure_class).
RESTART_POLICY = "ExitCode"
#: An elastic job's torchrun ``--max-restarts`` (and ``elasticPolicy.maxRestarts``): how often the
#: agent restarts the worker group in its pod after a worker failed, of any class. A pod leaving
#: (a scale-down, a lost node) fails the ranks that were its peers, and these restarts let the
#: others re-form the rendezvous without it; they are not the spec's restart budget
#: (``restart.max_restarts``, :func:`restart_budget`), which counts the pods' failures after it.
ELASTIC_GROUP_RESTARTS = 3
#: The training-operator's default port name on the Master's ``pytorch`` container.
PORT_NAME = "pytorchjob-port"
#: What the Trainer v2 ``torch-distributed`` runtime calls its replicated job and container.
TRAINJOB_NODE = "node"
#: ``code.git``: where the checked-out commits live in every pod (an emptyDir volume).
CODE_MOUNT = "/jobgen-code"
CODE_VOLUME = "jobgen-code"
#: ``code.git``: the container's command runs this (``sh -c SCRIPT jobgen-code <torchrun argv>``)
#: before exec'ing torchrun. Every value arrives through the environment (never spliced into the
#: text); no ``$(`` (the kubelet would expand it). A fetch by commit id needs a server that allows
#: it (GitHub, GitLab, Gitea do); otherwise every branch and tag is fetched. The checkout is
#: verified against the commit, its ``.git`` removed, and it is renamed into place only when
#: complete, so a restarted container reuses it.
CHECKOUT_SCRIPT = "\n".join([
    "set -eu",
    'dest="$JOBGEN_CODE_DIR"',
    f'if [ ! -f "$dest/{CODE_INFO_FILE}" ]; then',
    '  rm -rf "$dest.tmp" && git init -q "$dest.tmp" && cd "$dest.tmp"',
    '  git fetch -q --depth 1 "$JOBGEN_CODE_URL" "$JOBGEN_CODE_REF" || '
    "git fetch -q \"$JOBGEN_CODE_URL\" '+refs/heads/*:refs/remotes/origin/*' '+refs/tags/*:refs/tags/*'",
    '  git -c advice.detachedHead=false checkout -q "$JOBGEN_CODE_REF"',
    '  test "`git rev-parse HEAD`" = "$JOBGEN_CODE_REF"',
    f'  rm -rf .git && printf \'%s\\n\' "$JOBGEN_CODE_INFO" > {CODE_INFO_FILE}',
    '  cd / && mv "$dest.tmp" "$dest"',
    "fi",
    'echo "jobgen: code $JOBGEN_CODE_REF from $JOBGEN_CODE_URL in $dest"',
    'exec "$@"',
])

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


PYTORCHJOB = K8sKind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", PYTORCHJOB_FILE)
TRAINJOB = K8sKind("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", TRAINJOB_FILE)
KINDS = {"pytorchjob": PYTORCHJOB, "trainjob": TRAINJOB}


# --------------------------------------------------------------------------- names


def k8s_name(name: str) -> tuple[str, bool]:
    """A DNS-1035 object name for job ``name``; ``(name, derived)``.

    A valid name of at most :data:`~jobgen.jobdir.MAX_NAME` (48) characters is used as is. Otherwise a name is derived, never
    silently: lowercase, runs of other characters -> '-', truncated, plus ``-`` and the first
    8 hex digits of sha256(name) so distinct names stay distinct; ``derived`` is then True
    and the plan warns. A name with no letter or digit a-z/0-9 at all derives ``job-<hash>``
    (see :func:`object_name`, which refuses it for rendering).
    """
    if DNS1035_LABEL.match(name) and len(name) <= MAX_NAME:
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


# --------------------------------------------------------------------------- API paths


def job_collection(kind: K8sKind, namespace: str) -> str:
    """API path of ``kind``'s collection in ``namespace``."""
    return f"/apis/{kind.group}/{kind.version}/namespaces/{namespace}/{kind.plural}"


def core_path(namespace: str, resource: str) -> str:
    """API path of a core/v1 ``resource`` collection (``pods``, ``configmaps``) in ``namespace``."""
    return f"/api/v1/namespaces/{namespace}/{resource}"


# --------------------------------------------------------------------------- plan-time checks


def _cpu_quantity(cores: float) -> str:
    """Cores as a Kubernetes quantity: ``8`` -> "8", ``1.5`` -> "1500m"."""
    return str(int(cores)) if float(cores).is_integer() else f"{round(cores * 1000)}m"


def _mib(gib: float) -> str:
    """GiB as a whole-MiB Kubernetes quantity ("921600Mi")."""
    return f"{int(gib * 1024)}Mi"


def _kubelet_literal(value: str) -> str:
    """``value`` written so that the container gets it unchanged: every ``$`` doubled.

    Kubernetes expands ``$(VAR)`` references in a container's command, args and env values and,
    in the same pass, reduces every ``$$`` to ``$`` (k8s.io/kubernetes
    third_party/forked/golang/expansion, ``Expand``; API reference of ``EnvVar.value``). Escaping
    only ``$(`` is not enough: ``a $$$(X)`` would arrive as ``a $$(X)``, and ``$$(MASTER_ADDR)`` as
    ``$`` plus the master's address. With every ``$`` doubled the text holds only ``$$`` pairs,
    each of which expands back to one ``$``."""
    return value.replace("$", "$$")


def check_settings(ctx: PlanContext) -> None:
    """Plan-time checks of a Kubernetes profile against the job.

    Rules and their sources:
    - requests <= limits for every resource (core/v1 validation of a Pod rejects it otherwise):
      ``cpus_per_node`` (request) vs ``kubernetes.cpu_limit``, ``kubernetes.mem_request_gib``
      vs ``mem_gib_per_node`` (limit); the memory-backed /dev/shm counts against the limit.
    - no secret values: an ``env`` entry whose name looks like a credential is refused for
      every scheduler by :func:`jobgen.planning.environment.check_job_env` (hint: ``kubernetes.secret_env``),
      which also requires every name of the spec's ``secrets`` in ``kubernetes.secret_env``.
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
            if launcher_owned(name):
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
        if launcher_owned(name):
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
    # The bundled entrypoint's image has jobgen: its launcher gives the pod the failure's class as exit code
    # and, with a budget, ends the restarts once it is spent (the operator does not: restart_ledger).
    launcher = [_kubelet_literal(k.python), "-m", LAUNCH_MODULE if ctx.spec.entrypoint is None else "torch.distributed.run"]
    budget = restart_budget(ctx)
    if kind is PYTORCHJOB and ctx.spec.entrypoint is None and budget:  # a TrainJob's Job restarts in place (OnFailure)
        launcher += [f"--restart-budget={budget}", f"--restart-ledger={_kubelet_literal(restart_ledger(run_dir, ctx))}"]
    if kind is PYTORCHJOB and w.elastic:
        # No Master: the operator sets PET_RDZV_* and PET_NNODES but not PET_NPROC_PER_NODE (module doc).
        launcher += [f"--nnodes={w.fewest_nodes}:{w.num_nodes}", f"--nproc-per-node={w.devices_per_node}",
                     f"--rdzv-backend={RDZV_BACKEND}", "--rdzv-endpoint=$(PET_RDZV_ENDPOINT)",
                     f"--max-restarts={ELASTIC_GROUP_RESTARTS}"]
    elif kind is PYTORCHJOB:
        # The operator sets MASTER_ADDR/MASTER_PORT, torchrun reads only --master-addr/PET_MASTER_ADDR.
        launcher += ["--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]
    env = job_env(ctx) | {"OMP_NUM_THREADS": str(max(1, p.cpus_per_node // w.devices_per_node))}
    if ctx.spec.entrypoint is None:
        command = [*launcher, "-m", "jobgen.train", "--spec", f"{CONFIG_MOUNT}/{SPEC_FILE}", "--run-dir", run_dir]
    else:  # command mode: torchrun runs the user's module/script in the image's working directory
        command = [*launcher, *(_kubelet_literal(arg) for arg in target_argv(ctx.spec, w))]
        env[RUN_DIR_ENV] = run_dir
        if ctx.spec.trainer.deepspeed_stage is not None:
            env[DEEPSPEED_CONFIG_ENV] = f"{CONFIG_MOUNT}/{DS_CONFIG_FILE}"
    code = git_code(ctx)
    if code is not None:
        command = ["sh", "-c", CHECKOUT_SCRIPT, "jobgen-code", *command]
        env |= code
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
    if code is not None:
        mounts.append({"mountPath": CODE_MOUNT, "name": CODE_VOLUME})
        volumes.append({"emptyDir": {}, "name": CODE_VOLUME})
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


def git_code(ctx: PlanContext) -> dict[str, str] | None:
    """``code.git``: the environment that makes the container's command (:data:`CHECKOUT_SCRIPT`)
    check out ``code.git.ref`` into ``<CODE_MOUNT>/<ref>`` (an emptyDir volume) and puts it
    (plus ``code.python_path``) first on PYTHONPATH, ahead of a PYTHONPATH from ``env``;
    ``JOBGEN_CODE_INFO`` is the :class:`~jobgen.jobdir.CodeSnapshot` the entrypoint reads back
    for summary.json. None when the spec has no ``code.git`` (the image is the code)."""
    code = ctx.spec.code
    if code is None or not code.snapshot or code.git is None:
        return None
    root = f"{CODE_MOUNT}/{code.git.ref}"
    info = CodeSnapshot(commit=code.git.ref, repo=code.git.url, python_path=code.python_path)
    first = f"{root}/{code.python_path}" if code.python_path else root
    rest = job_env(ctx).get("PYTHONPATH")
    return {
        CODE_DIR_ENV: root,
        "JOBGEN_CODE_URL": code.git.url,
        "JOBGEN_CODE_REF": code.git.ref,
        "JOBGEN_CODE_INFO": json.dumps(info.model_dump(mode="json"), sort_keys=True),
        "PYTHONPATH": f"{first}:{rest}" if rest else first,
    }


def image_warning(ctx: PlanContext) -> str | None:
    """The warning for a job whose code is the image (no ``code.git``) when the profile's image is
    not pinned by digest: a tag can move, so a restarted pod could run other code."""
    code, image = ctx.spec.code, (ctx.profile.kubernetes.image if ctx.profile.kubernetes else "")
    if (code is not None and (not code.snapshot or code.git is not None)) or "@sha256:" in image:
        return None
    return (f"the image is the code on Kubernetes, and image {image!r} is not pinned by digest: a tag can move, so a "
            "restarted pod could run other code; pin it (image: <repo>@sha256:<digest>), or ship the code as a commit with "
            "code.git: {url, ref}, or set code.snapshot: false")


def restart_budget(ctx: PlanContext) -> int:
    """The job's restart budget on Kubernetes: the spec's ``restart.max_restarts`` when it is
    above 0, else the profile's ``kubernetes.backoff_limit`` (the default for the cluster's jobs;
    ``null``: 0). One number: ``runPolicy.backoffLimit`` and :mod:`jobgen.train.launch`'s
    ``--restart-budget``; an elastic job's torchrun restarts in its pods are apart
    (:data:`ELASTIC_GROUP_RESTARTS`)."""
    k = ctx.profile.kubernetes
    assert k is not None
    return ctx.spec.restart.max_restarts or k.backoff_limit or 0


def restart_ledger(run_dir: str, ctx: PlanContext) -> str:
    """Where :mod:`jobgen.train.launch` counts each pod's starts: ``<run dir>/restarts/<first 12
    hex digits of the inputs sha256>``, so a changed job starts a new count. training-operator
    v1.9 ends ExitCode restarts by ``backoffLimit`` only when it is 0 (a recreated pod's
    ``restartCount`` starts at 0: pkg/core/job.go ``PastBackoffLimit``), so the launcher spends
    the budget. It lasts only as long as the run directory: an emptyDir goes with the pod
    (:func:`plan` warns)."""
    return f"{run_dir}/restarts/{ctx.inputs_sha256[:12]}"


def run_policy(ctx: PlanContext) -> dict[str, Any]:
    """PyTorchJob ``spec.runPolicy`` (training-operator RunPolicy), keys in a fixed order:
    ``backoffLimit`` is :func:`restart_budget`."""
    k = ctx.profile.kubernetes
    assert k is not None
    policy: dict[str, Any] = {"backoffLimit": restart_budget(ctx), "cleanPodPolicy": k.clean_pod_policy}
    if k.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = k.ttl_seconds_after_finished
    minutes = ctx.spec.resources.time_limit_min or k.time_limit_min
    if minutes:
        policy["activeDeadlineSeconds"] = minutes * 60
    if k.scheduler_name == "volcano":  # gang: all pods, or the elastic minimum
        scheduling: dict[str, Any] = {"minAvailable": ctx.world.fewest_nodes}
        if k.volcano_queue:
            scheduling["queue"] = k.volcano_queue
        if k.priority_class:
            scheduling["priorityClass"] = k.priority_class
        policy["schedulingPolicy"] = scheduling
    return policy


def elastic_policy(ctx: PlanContext) -> dict[str, Any]:
    """PyTorchJob ``spec.elasticPolicy`` for an elastic world, keys in a fixed order: the node
    range, torchrun's rendezvous backend, and ``maxRestarts`` = :data:`ELASTIC_GROUP_RESTARTS`
    (as the command's ``--max-restarts``)."""
    w = ctx.world
    assert w.min_nodes is not None
    return {"minReplicas": w.min_nodes, "maxReplicas": w.num_nodes, "rdzvBackend": RDZV_BACKEND, "maxRestarts": ELASTIC_GROUP_RESTARTS}


def plan(ctx: PlanContext) -> JobPlan:
    """Plan ``pytorchjob.yaml`` (ConfigMap + PyTorchJob) or ``trainjob.yaml`` (ConfigMap +
    TrainJob), ``kustomization.yaml`` (for ``kubectl apply -k``) + ``spec.json``
    (+ ``ds_config.json``), and check the objects offline (:mod:`jobgen.backends.kubernetes.validate`).

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
    files, resolved = common_files(ctx)
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
    if kind is PYTORCHJOB and w.elastic:  # Worker only: every pod is alike, the rendezvous assigns node ranks
        text = render_job_template(ctx, ELASTIC_TEMPLATE, nproc_per_node=str(w.devices_per_node), run_policy=run_policy(ctx),
                                   roles=[("Worker", w.num_nodes)], restart_policy=RESTART_POLICY, elastic_policy=elastic_policy(ctx),
                                   min_nodes=w.min_nodes, max_nodes=w.num_nodes, **common)
    elif kind is PYTORCHJOB:
        roles = [("Master", 1)] + ([("Worker", w.num_nodes - 1)] if w.num_nodes > 1 else [])
        text = render_job_template(ctx, TEMPLATE, nproc_per_node=str(w.devices_per_node), run_policy=run_policy(ctx),
                                   roles=roles, restart_policy=RESTART_POLICY, **common)
    else:
        minutes = ctx.spec.resources.time_limit_min or k.time_limit_min
        text = render_job_template(ctx, TRAINJOB_TEMPLATE, runtime=k.trainer_runtime, num_nodes=w.num_nodes,
                                   nproc_per_node=w.devices_per_node, active_deadline_s=minutes * 60 if minutes else None,
                                   replicated_job=TRAINJOB_NODE, container=TRAINJOB_NODE, **common)
    docs = parse_manifest(text, kind.manifest)
    _check_parsed(docs, kind, name, w.num_nodes, dict(files), min_nodes=w.min_nodes)
    from jobgen.backends.kubernetes import validate as k8s_validate  # lazy: jsonschema and kubernetes-validate stay off other render paths

    report = k8s_validate.validate_manifest(docs, source=f"{ctx.profile.name}/{ctx.spec.name}/{kind.manifest}",
                                            k8s_version=k.version, profile_source=ctx.profile_source)
    warnings += report.warnings
    if kind is PYTORCHJOB and restart_budget(ctx) and not k.runs_volume_claim:
        warnings += (f"restart budget {restart_budget(ctx)} without kubernetes.runs_volume_claim: the run directory is an "
                     "emptyDir, so a recreated pod starts from step 0 and jobgen cannot count its restarts (they are then "
                     "bounded by nothing); set runs_volume_claim to a ReadWriteMany PersistentVolumeClaim",)
    unpinned = image_warning(ctx)
    if unpinned:
        warnings += (unpinned,)
    rdma_fabric = ctx.profile.network_fabric in ("infiniband", "roce", "efa")
    if rdma_fabric and w.accelerator == "gpu" and not k.rdma_resource:
        warnings += (f"network_fabric {ctx.profile.network_fabric} but no kubernetes.rdma_resource: pods get IPC_LOCK but no RDMA "
                     "device unless the cluster injects one (e.g. hostNetwork or a device plugin default); NCCL may fall back "
                     "to TCP sockets",)
    files.append((kind.manifest, text))
    header = generated_header(__version__, ctx.profile.name, "apply: kubectl apply -k <this directory>").rstrip("\n")
    files.append((KUSTOMIZATION_FILE, kustomization_yaml(header, [kind.manifest])))
    pods = [role.lower() for role, _, _ in k8s_validate.pod_templates(docs[1])]
    return JobPlan(
        scheduler="kubernetes",
        profile=ctx.profile.name,
        job_name=ctx.spec.name,
        files=tuple(sorted(files)),
        submit_steps=submit_requests(kind, k.namespace, name, pods),
        world=w,
        inputs_sha256=ctx.inputs_sha256,
        warnings=warnings,
        apply_files=(kind.manifest,),
        cluster_object=ClusterObject(kind.kind, k.namespace, name, context=k.context, kubeconfig=k.kubeconfig,
                                     objects=tuple(docs)),
        resolved=resolved,
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


def _check_parsed(docs: list[dict[str, Any]], kind: K8sKind, name: str, nodes: int, config_files: dict[str, str],
                  *, min_nodes: int | None = None) -> None:
    """Check the rendered objects' shape before anything is written (a user-edited template can
    break it): a ConfigMap carrying the files byte for byte, then the job with its replicas (and,
    elastic, its elasticPolicy range: ``min_nodes``..``nodes``)."""
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
        if min_nodes is not None:
            policy = job["spec"].get("elasticPolicy") or {}
            got = (replicas, policy.get("minReplicas"), policy.get("maxReplicas"))
            if got != ({"Worker": nodes}, min_nodes, nodes):
                raise ConfigError(f"rendered elastic PyTorchJob has replicas {replicas} and elasticPolicy {policy}, expected Worker "
                                  f"{nodes} with minReplicas {min_nodes} and maxReplicas {nodes}", hint="check templates/kubernetes/")
            return
        expected = {"Master": 1, **({"Worker": nodes - 1} if nodes > 1 else {})}
        if replicas != expected:
            raise ConfigError(f"rendered PyTorchJob has replicas {replicas}, expected {expected} (Master 1 + Worker nodes - 1)")
    elif job["spec"]["trainer"].get("numNodes") != nodes:
        raise ConfigError(f"rendered TrainJob has numNodes {job['spec']['trainer'].get('numNodes')}, expected {nodes}")


def submit_requests(kind: K8sKind, namespace: str, name: str, pod_roles: list[str]) -> tuple[ApiRequest, ...]:
    """The API requests ``jobgen submit`` makes for a new job, in order (what ``str(plan)``
    shows; :meth:`jobgen.backends.kubernetes.backend.KubernetesBackend.submit` makes them, and a test compares):
    read the existing job, a server-side dry run (``dryRun=All``) of the ConfigMap, the job and
    a Pod from each replica's template, then create the ConfigMap and the job and make the job
    own the ConfigMap. Creates carry ``fieldValidation=Strict`` where the server supports it
    (Kubernetes >= 1.25)."""
    jobs, config_maps, pods = job_collection(kind, namespace), core_path(namespace, "configmaps"), core_path(namespace, "pods")
    cm = config_map_name(name)
    dry = (("dryRun", "All"),)
    return (
        ApiRequest("GET", f"{jobs}/{name}", when="exists with the same inputs: stop (unchanged); with other inputs: "
                   "refused unless --replace"),
        ApiRequest("POST", config_maps, dry, body=f"ConfigMap {cm}"),
        ApiRequest("POST", jobs, dry, body=f"{kind.kind} {name}"),
        *(ApiRequest("POST", pods, dry, body=f"Pod from the {role} template") for role in pod_roles),
        ApiRequest("DELETE", f"{jobs}/{name}", body="propagationPolicy: Foreground", when="--replace and it exists"),
        ApiRequest("POST", config_maps, body=f"ConfigMap {cm}"),
        ApiRequest("POST", jobs, body=f"{kind.kind} {name}"),
        ApiRequest("GET", f"{config_maps}/{cm}"),
        ApiRequest("PUT", f"{config_maps}/{cm}", body=f"ownerReferences: the {kind.kind}"),
    )
