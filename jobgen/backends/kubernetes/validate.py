"""Offline validation of rendered Kubernetes manifests: what a cluster would reject, found
before anything is written or submitted, without a cluster.

Four checks, weakest dependency first (each names the source of its rules):

1. **Operator admission rules** (no dependency): the training-operator's PyTorchJob webhook
   (v1.9, ``pkg/webhooks/pytorch/pytorchjob_webhook.go`` + ``pkg/webhooks/utils``): the name is a
   DNS-1035 label, only ``Master``/``Worker`` replicas, Master replicas = 1, Worker replicas >= 1,
   every replica has a container named ``pytorch`` and every container an image; with an
   ``elasticPolicy`` a Worker replica spec is required and ``elasticPolicy.nProcPerNode`` may not
   be used with ``spec.nprocPerNode``. An elastic job is also checked against what the operator
   and torchrun do with it (:func:`elastic_problems`: the node range, the replicas, the
   rendezvous backend, and the torchrun flags the operator does not inject). For a TrainJob,
   the v2.3.0 CRD's CEL rules on ``metadata.name`` (DNS-1035, <= 63) and the Trainer torch
   plugin's rule that ``spec.trainer.env`` holds no ``PET_*`` variable it sets itself.
2. **Pod rules the API server enforces** beyond any schema (k8s.io/kubernetes
   ``pkg/apis/core/validation``): requests <= limits, extended resources whole and with
   requests = limits, volume mounts name a volume, unique DNS-1123 container/volume names,
   port names of <= 15 characters. A CRD accepts all of these; only a Pod create fails.
3. **CRD schema, strict** (jsonschema): the job against the ``openAPIV3Schema`` of the CRD in the
   CRDs directory, with every object that lists ``properties`` closed (``additionalProperties:
   false``) unless it says ``x-kubernetes-preserve-unknown-fields`` — an API server prunes
   unknown fields silently, so a misspelt field would otherwise vanish. ``metadata`` is checked
   as a core ObjectMeta (step 4's schemas).
4. **Core objects** (kubernetes-validate, strict): the ConfigMap, and each replica's pod template
   as a core/v1 ``PodTemplate`` of the profile's Kubernetes version.

CRDs are read from ``--crds-dir`` / ``$JOBGEN_CRDS_DIR``, else from the copies packaged with
jobgen (:data:`PACKAGED_CRDS_DIR`: training-operator v1.9.4 and v1.9.3, Trainer v2.3.0; source
and licence in its PROVENANCE.txt). A check whose input is missing (a CRDs directory without the
kind's CRD, no jsonschema, no kubernetes-validate) is skipped and the plan says so; a failing
check raises :class:`PlanError`. Schemas are loaded once per process.

Size: one module above ~500 lines on purpose: the four checks report through one
:class:`Problem` list and one error, and each is a transcription of an upstream rule set that
reads best beside the others it complements.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from jobgen import __version__
from jobgen.errors import ConfigError, PlanError
from jobgen.planning.cache import cached_json, content_key
from jobgen.specs.k8s_names import DNS1035_LABEL, is_dns1035_label, is_dns1123_label, is_port_name

#: Which CRD file holds each kind: (group, plural, preferred sub-directory, served version).
CRD_FILES: dict[str, tuple[str, str, str, str]] = {
    "PyTorchJob": ("kubeflow.org", "pytorchjobs", "training-operator-v1.9.4", "v1"),
    "TrainJob": ("trainer.kubeflow.org", "trainjobs", "trainer-v2.3.0", "v1alpha1"),
}
ENV_CRDS_DIR = "JOBGEN_CRDS_DIR"
#: Variables the Trainer v2 torch plugin sets and refuses in ``spec.trainer.env``
#: (constants.TorchRunReservedEnvNames).
TRAINER_RESERVED_ENV = frozenset({"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"})
#: IsEnvVarName (apimachinery): what every server version accepts (1.30+ may relax it).
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
#: Resources Kubernetes lets a pod overcommit; every other one is "extended" (whole units,
#: requests = limits): ``IsOvercommitAllowed`` in pkg/apis/core/helper.
_OVERCOMMIT = frozenset({"cpu", "memory", "ephemeral-storage"})

#: The Kubeflow CRDs shipped inside the package (package data, see setup.cfg).
PACKAGED_CRDS_DIR = Path(__file__).resolve().parents[2] / "_crds"  # jobgen/_crds


@dataclass(frozen=True)
class Report:
    """What offline validation checked and what it skipped (with the reason)."""

    checked: tuple[str, ...]
    skipped: tuple[str, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
        """One plan warning per skipped check."""
        return tuple(f"offline validation skipped: {reason}" for reason in self.skipped)


# --------------------------------------------------------------------------- where the CRDs are


def crds_dir() -> Path:
    """The CRDs directory: ``$JOBGEN_CRDS_DIR`` (the ``--crds-dir`` flag sets it), else the copies
    packaged with jobgen (:data:`PACKAGED_CRDS_DIR`).

    Raises:
        ConfigError: ``$JOBGEN_CRDS_DIR`` is set but is not a directory.
    """
    configured = os.environ.get(ENV_CRDS_DIR)
    if configured:
        path = Path(configured)
        if not path.is_dir():
            raise ConfigError(f"{ENV_CRDS_DIR}={configured} is not a directory",
                              hint=f"point it (or --crds-dir) at a directory of CRD YAML files, or unset it to use jobgen's own ({PACKAGED_CRDS_DIR})")
        return path
    return PACKAGED_CRDS_DIR


def crd_file(kind: str, directory: Path) -> Path | None:
    """The CRD file for ``kind`` in ``directory``: kubebuilder's ``<group>_<plural>.yaml`` in the
    preferred sub-directory (e.g. ``training-operator-v1.9.4/``), else in any sub-directory (the
    last in name order), else at the top; None when there is none."""
    group, plural, preferred, _ = CRD_FILES[kind]
    name = f"{group}_{plural}.yaml"
    if (directory / preferred / name).is_file():
        return directory / preferred / name
    found = sorted(directory.glob(f"*/{name}"))
    if found:
        return found[-1]
    return directory / name if (directory / name).is_file() else None


# --------------------------------------------------------------------------- schemas (cached)


#: Names the rules :func:`strict` and :func:`_crd_validator` apply to a CRD's schema; part of the
#: cache key of the derived schema, so change it whenever they change.
STRICT_RULES = "additionalProperties-false-unless-preserved;metadata-open;v1"


def strict(schema: Any) -> Any:
    """Copy of an openAPIV3Schema in which every object that lists ``properties`` rejects other
    keys (``additionalProperties: false``), unless it says ``x-kubernetes-preserve-unknown-fields``
    or already constrains ``additionalProperties``; ``metadata`` at the top is left open (checked
    as ObjectMeta separately)."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(value) for value in schema]
    return schema


@functools.lru_cache(maxsize=8)
def _crd_validator(path: str, mtime_ns: int, version: str) -> Any:
    """A jsonschema validator for ``version`` of the CRD at ``path`` (strict, see :func:`strict`).

    The strict schema is derived from the file's bytes alone, so it is kept in :mod:`jobgen.planning.cache`
    (keyed by their sha256 and ``version``): parsing the CRD YAML is most of a cold Kubernetes
    render's time, and the packaged CRDs never change between renders.
    """
    del mtime_ns  # part of the cache key only
    import jsonschema

    raw = Path(path).read_bytes()

    def derive() -> dict[str, Any]:
        import yaml

        crd = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        try:
            served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
            schema = dict(served["schema"]["openAPIV3Schema"])
        except (KeyError, TypeError, StopIteration):
            raise ConfigError(f"{path} is not a CRD serving version {version} with an openAPIV3Schema",
                              hint=f"point {ENV_CRDS_DIR} / --crds-dir at the Kubeflow CRDs, or unset it to use jobgen's own ({PACKAGED_CRDS_DIR})") from None
        schema = strict(schema)
        schema["properties"] = {**schema.get("properties", {}), "metadata": {"type": "object"}}
        return schema

    key = content_key(raw, version, STRICT_RULES, __version__)
    return jsonschema.Draft7Validator(cached_json("crd-schema", key, derive))


def _k8s_schema_dir(version: str | None) -> tuple[Any, str, str | None]:
    """kubernetes-validate's strict schema directory for ``version`` ("1.30"; None: newest),
    the version used, and a note when it differs from the one asked for."""
    from importlib import resources

    from kubernetes_validate import utils

    bundled = [v for v in utils.all_versions()]
    minors = sorted({".".join(v.split(".")[:2]) for v in bundled}, key=lambda v: tuple(int(x) for x in v.split(".")))
    note = None
    if version is None:
        use = minors[-1]
    elif version in minors:
        use = version
    else:
        key = tuple(int(x) for x in version.split("."))
        older = [m for m in minors if tuple(int(x) for x in m.split(".")) <= key]
        use = older[-1] if older else minors[0]
        note = f"kubernetes-validate bundles core/v1 schemas for {minors[0]}..{minors[-1]}; checked against {use} instead of {version}"
    full = next(v for v in bundled if ".".join(v.split(".")[:2]) == use)
    return resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{full}-local-strict", use, note


@functools.lru_cache(maxsize=4)
def _core_definitions(version: str | None) -> tuple[Any, Any, str, str | None]:
    """kubernetes-validate's strict schema directory for ``version``, a registry holding its
    ``_definitions.json`` (1.8 MB of JSON: parsed once per process and version, shared by every
    core/v1 validator), the Kubernetes version used, and a version note."""
    import json

    from referencing import Registry, Resource

    directory, used, note = _k8s_schema_dir(version)
    definitions = json.loads((directory / "_definitions.json").read_text(encoding="utf-8"))
    return directory, Resource.from_contents(definitions) @ Registry(), used, note


@functools.lru_cache(maxsize=16)
def _core_validator(version: str | None, schema_file: str) -> tuple[Any, str, str | None]:
    """A Draft 2020-12 validator for one kubernetes-validate strict schema file (e.g.
    ``podtemplate-v1.json``), the Kubernetes version used, and a version note."""
    import json

    import jsonschema
    from referencing import Resource

    directory, definitions, used, note = _core_definitions(version)
    if schema_file == "objectmeta":
        schema: dict[str, Any] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://kubernetes.io/api/jobgen-objectmeta.json",
            "$ref": "_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        }
    else:
        schema = json.loads((directory / schema_file).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema, registry=Resource.from_contents(schema) @ definitions), used, note


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """One finding: JSON path in the object, what is wrong, and the rule's source."""

    path: str
    message: str
    source: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} [{self.source}]"


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _schema_problems(validator: Any, obj: Any, prefix: str, source: str) -> Iterator[Problem]:
    for err in sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path]):
        message = err.message
        if err.validator == "additionalProperties" and err.validator_value is False:
            message += " (unknown field: the API server would drop it silently)"
        yield Problem(_path([prefix, *err.absolute_path]) if prefix else _path(err.absolute_path), message, source)


# ----- operator webhook rules


#: A replica's ``restartPolicy`` values (training-operator v1.9 common_types.go): ExitCode gives its
#: pods ``restartPolicy: Never`` and decides by the container's exit code (core/pod.go ``SetRestartPolicy``).
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")


def pytorchjob_webhook_problems(job: dict[str, Any]) -> list[Problem]:
    """The training-operator v1.9 PyTorchJob validating webhook's rules (validatePyTorchJob)."""
    src = "training-operator PyTorchJob webhook"
    out: list[Problem] = []
    name = str(job.get("metadata", {}).get("name", ""))
    if not is_dns1035_label(name):
        out.append(Problem("metadata.name", f"{name!r} is not a DNS-1035 label (a-z first, then a-z 0-9 '-', <= 63 chars)", src))
    spec = job.get("spec") or {}
    specs = spec.get("pytorchReplicaSpecs")
    if not isinstance(specs, dict) or not specs:
        return [*out, Problem("spec.pytorchReplicaSpecs", "must be set", src)]
    for role, rspec in specs.items():
        where = f"spec.pytorchReplicaSpecs.{role}"
        if role not in ("Master", "Worker"):
            out.append(Problem(where, f"replica type {role!r} is not supported: only Master and Worker", src))
        rspec = rspec or {}
        replicas = rspec.get("replicas")
        if role == "Master" and replicas != 1:
            out.append(Problem(f"{where}.replicas", f"must be 1 (got {replicas!r})", src))
        elif role != "Master" and replicas is not None and isinstance(replicas, int) and replicas < 1:
            out.append(Problem(f"{where}.replicas", f"must be at least 1 (got {replicas})", src))
        containers = ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            out.append(Problem(f"{where}.template.spec.containers", "must be specified", src))
        for i, container in enumerate(containers):
            if not (container or {}).get("image"):
                out.append(Problem(f"{where}.template.spec.containers[{i}].image", "must be set", src))
        if containers and not any((c or {}).get("name") == "pytorch" for c in containers):
            out.append(Problem(f"{where}.template.spec.containers", "must have a container named 'pytorch'", src))
        policy = rspec.get("restartPolicy")
        if policy is not None and policy not in RESTART_POLICIES:
            # neither the CRD nor the webhook checks it; the operator copies it into each pod, which the API server refuses
            out.append(Problem(f"{where}.restartPolicy", f"{policy!r} is not one of {', '.join(RESTART_POLICIES)}",
                               "training-operator v1.9 pkg/apis/kubeflow.org/v1/common_types.go RestartPolicy"))
    if "elasticPolicy" in spec and spec["elasticPolicy"] is not None:
        elastic = spec["elasticPolicy"] or {}
        if "Worker" not in specs:
            out.append(Problem("spec.pytorchReplicaSpecs.Worker", "must be configured if elastic policy is used", src))
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            out.append(Problem("spec.elasticPolicy.nProcPerNode", "must not be used with spec.nprocPerNode", src))
        out += elastic_problems(job)
    return out


#: torchrun flags (either spelling) that :func:`elastic_problems` compares with the elasticPolicy.
_TORCHRUN_FLAGS = {"nnodes": "--nnodes", "nproc-per-node": "--nproc-per-node", "rdzv-backend": "--rdzv-backend",
                   "max-restarts": "--max-restarts"}


def _torchrun_flags(command: list[Any]) -> dict[str, str] | None:
    """``{flag name: value}`` of the torchrun options in ``command`` (``--flag=value`` or
    ``--flag value``, ``_`` or ``-`` spelling) before the training module/script; None when the
    command does not run torchrun (``torchrun``, ``python -m torch.distributed.run``, or jobgen's
    launcher ``python -m jobgen.train.launch``, which takes torchrun's arguments)."""
    argv = [str(a) for a in command]
    module = next((m for m in ("torch.distributed.run", "jobgen.train.launch") if m in argv), None)
    if module is not None:
        start = argv.index(module) + 1
    elif argv and argv[0].rsplit("/", 1)[-1] == "torchrun":
        start = 1
    else:
        return None
    flags: dict[str, str] = {}
    i = start
    while i < len(argv) and argv[i].startswith("--"):
        key, eq, value = argv[i][2:].partition("=")
        key = key.replace("_", "-")
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value, i = argv[i + 1], i + 1
        flags[key] = value
        i += 1
    return flags


def elastic_problems(job: dict[str, Any]) -> list[Problem]:
    """What an elastic PyTorchJob needs beyond the webhook, from what the training-operator
    (v1.9, ``pkg/controller.v1/pytorch/elastic.go``, ``envvar.go``) and torchrun do with it:

    - ``minReplicas`` >= 1 and ``maxReplicas`` >= ``minReplicas`` (the CRD's field description;
      torchrun stops: "min_nodes must be > 0 and <= max_nodes").
    - Worker replicas within [minReplicas, maxReplicas]: fewer pods never reach the minimum,
      more wait outside a full rendezvous (jobgen renders Worker = maxReplicas).
    - no Master: with a Master the operator injects a fixed world (WORLD_SIZE, RANK, MASTER_ADDR
      for Master + Workers) and the Master pod joins the rendezvous as one more node.
    - ``rdzvBackend`` c10d (the operator's default): ``static`` is not elastic and ``etcd`` /
      ``etcd-v2`` need an etcd server the job does not bring.
    - the Worker's torchrun: without a Master the operator sets no PET_NPROC_PER_NODE, so the
      command must pass ``--nproc-per-node`` = ``spec.nprocPerNode`` (torchrun starts one process
      per pod otherwise), and ``--nproc-per-node`` must equal the pod's ``nvidia.com/gpu``;
      ``--nnodes``, ``--rdzv-backend`` and ``--max-restarts``, when given, must match the policy
      (a flag overrides the PET_* variable the operator derives from it).
    """
    src_op = "training-operator v1.9 elastic PyTorchJob"
    src_run = "torchrun (torch.distributed.run)"
    spec = job.get("spec") or {}
    policy = spec.get("elasticPolicy") or {}
    replicas = spec.get("pytorchReplicaSpecs") or {}
    out: list[Problem] = []
    low, high = policy.get("minReplicas"), policy.get("maxReplicas")
    if isinstance(low, int) and low < 1:
        out.append(Problem("spec.elasticPolicy.minReplicas", f"must be at least 1 (got {low}): min_nodes must be > 0", src_run))
    if isinstance(low, int) and isinstance(high, int) and high < low:
        out.append(Problem("spec.elasticPolicy.maxReplicas", f"{high} is smaller than minReplicas {low}: "
                           "min_nodes must be > 0 and <= max_nodes", src_run))
    worker = replicas.get("Worker") or {}
    count = worker.get("replicas")
    if isinstance(count, int) and isinstance(low, int) and isinstance(high, int) and not low <= count <= high:
        out.append(Problem("spec.pytorchReplicaSpecs.Worker.replicas", f"{count} is outside the elastic range "
                           f"[{low}, {high}]: fewer pods never reach minReplicas, more wait outside a full rendezvous", src_op))
    if "Master" in replicas:
        out.append(Problem("spec.pytorchReplicaSpecs.Master", "an elastic job runs Worker replicas only: with a Master the "
                           "operator injects a fixed WORLD_SIZE/RANK and the Master joins the rendezvous as an extra node", src_op))
    backend = policy.get("rdzvBackend", "c10d")
    if backend != "c10d":
        out.append(Problem("spec.elasticPolicy.rdzvBackend", f"{backend!r}: use c10d (static is not elastic; etcd and etcd-v2 "
                           "need an etcd server the job does not bring)", src_run))
    nproc = spec.get("nprocPerNode")
    for ci, container in enumerate(((worker.get("template") or {}).get("spec") or {}).get("containers") or []):
        if (container or {}).get("name") != "pytorch":
            continue
        where = f"spec.pytorchReplicaSpecs.Worker.template.spec.containers[{ci}]"
        flags = _torchrun_flags((container.get("command") or []) + (container.get("args") or []))
        if flags is None:
            continue
        expected = {"nnodes": f"{low}:{high}" if isinstance(low, int) and isinstance(high, int) else None,
                    "rdzv-backend": backend, "max-restarts": None if policy.get("maxRestarts") is None else str(policy["maxRestarts"])}
        for key, want in expected.items():
            if key in flags and want is not None and flags[key] != want:
                out.append(Problem(f"{where}.command", f"torchrun {_TORCHRUN_FLAGS[key]}={flags[key]} but the elasticPolicy "
                                   f"gives {want} (the flag overrides the operator's PET_* variable)", src_run))
        if policy.get("nProcPerNode") is None:
            if "nproc-per-node" not in flags:
                out.append(Problem(f"{where}.command", "torchrun needs --nproc-per-node: without a Master the operator sets no "
                                   "PET_NPROC_PER_NODE, and torchrun would start one process per pod", src_op))
            elif nproc is not None and flags["nproc-per-node"] != str(nproc):
                out.append(Problem(f"{where}.command", f"torchrun --nproc-per-node={flags['nproc-per-node']} but spec.nprocPerNode "
                                   f"is {nproc!r}", src_op))
        gpus = ((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        launched = flags.get("nproc-per-node", str(policy.get("nProcPerNode", "")))
        if gpus is not None and launched.isdigit() and str(gpus) != launched:
            out.append(Problem(f"{where}.resources.limits.nvidia.com/gpu", f"{gpus} GPU(s) per pod but torchrun starts "
                               f"{launched} process(es) per pod (one per GPU)", src_run))
    return out


def trainjob_rule_problems(job: dict[str, Any]) -> list[Problem]:
    """Trainer v2.3.0 TrainJob rules: the CRD's CEL rules on ``metadata.name`` and the torch
    plugin's reserved environment variables."""
    out: list[Problem] = []
    name = str(job.get("metadata", {}).get("name", ""))
    if not DNS1035_LABEL.match(name):
        out.append(Problem("metadata.name", "metadata.name must match RFC 1035 DNS label format", "TrainJob CRD x-kubernetes-validations"))
    if len(name) > 63:
        out.append(Problem("metadata.name", "metadata.name must be no more than 63 characters", "TrainJob CRD x-kubernetes-validations"))
    trainer = (job.get("spec") or {}).get("trainer") or {}
    reserved = sorted(e.get("name") for e in trainer.get("env") or [] if e.get("name") in TRAINER_RESERVED_ENV)
    if reserved:
        out.append(Problem("spec.trainer.env", f"must not have reserved envs, invalid envs configured: {reserved}", "Trainer torch plugin"))
    return out


# ----- pod rules of the API server


@functools.lru_cache(maxsize=1)
def _kubernetes_parse_quantity() -> Callable[[Any], Decimal] | None:
    """The kubernetes client's own ``parse_quantity`` (kubernetes/utils/quantity.py: the
    apimachinery quantity grammar), or None when the kubernetes package is not installed.

    Loaded from its file, so the client package's ``__init__`` (hundreds of modules, ~0.3 s)
    stays off the render path; the module itself imports only ``decimal``.
    """
    spec = importlib.util.find_spec("kubernetes")
    path = Path(spec.origin).parent / "utils" / "quantity.py" if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location("jobgen._kubernetes_quantity", path)
    if module_spec is None or module_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.parse_quantity


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity ("1500m", "64Gi", "8", 2) as a Decimal; None if malformed.

    Parsed by the kubernetes client's ``parse_quantity`` (see :func:`_kubernetes_parse_quantity`).

    Raises:
        ModuleNotFoundError: the kubernetes package is not installed (``pip install 'jobgen[k8s]'``).
    """
    parser = _kubernetes_parse_quantity()
    if parser is None:
        raise ModuleNotFoundError("the kubernetes package is not installed (pip install 'jobgen[k8s]')")
    if isinstance(value, bool):
        return None
    try:
        return parser(value)
    except (ValueError, TypeError, ArithmeticError):
        return None


def pod_problems(pod_spec: dict[str, Any], prefix: str) -> list[Problem]:
    """Rules of core/v1 Pod validation (k8s.io/kubernetes pkg/apis/core/validation) that no
    JSON schema expresses; ``prefix`` is the pod spec's path in the object."""
    src = "core/v1 Pod validation"
    out: list[Problem] = []
    volumes = pod_spec.get("volumes") or []
    names = [v.get("name") for v in volumes]
    for i, name in enumerate(names):
        if not is_dns1123_label(name):
            out.append(Problem(f"{prefix}.volumes[{i}].name", f"{name!r} is not a DNS-1123 label", src))
        elif names.index(name) != i:
            out.append(Problem(f"{prefix}.volumes[{i}].name", f"duplicate volume name {name!r}", src))
        size = ((volumes[i] or {}).get("emptyDir") or {}).get("sizeLimit")
        if size is not None and _kubernetes_parse_quantity() is not None and parse_quantity(size) is None:
            out.append(Problem(f"{prefix}.volumes[{i}].emptyDir.sizeLimit", f"{size!r} is not a quantity", src))
    seen: set[str] = set()
    for group in ("initContainers", "containers"):
        for ci, container in enumerate(pod_spec.get(group) or []):
            where = f"{prefix}.{group}[{ci}]"
            cname = container.get("name")
            if not is_dns1123_label(cname):
                out.append(Problem(f"{where}.name", f"{cname!r} is not a DNS-1123 label", src))
            elif cname in seen:
                out.append(Problem(f"{where}.name", f"duplicate container name {cname!r}", src))
            seen.add(str(cname))
            for mi, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("name") not in names:
                    out.append(Problem(f"{where}.volumeMounts[{mi}].name", f"no volume named {mount.get('name')!r} in the pod", src))
            mount_paths = [m.get("mountPath") for m in container.get("volumeMounts") or []]
            for mi, mount_path in enumerate(mount_paths):
                if mount_paths.index(mount_path) != mi:
                    out.append(Problem(f"{where}.volumeMounts[{mi}].mountPath", f"{mount_path!r} is mounted twice", src))
            env_names = [e.get("name") for e in container.get("env") or []]
            for ei, env_name in enumerate(env_names):
                if not isinstance(env_name, str) or not _ENV_NAME.match(env_name):
                    out.append(Problem(f"{where}.env[{ei}].name", f"{env_name!r} is not a valid environment variable name "
                                       "(letters, digits, '_', '-', '.'; not starting with a digit)", src))
            for pi, port in enumerate(container.get("ports") or []):
                pname = port.get("name")
                if pname is not None and (not is_port_name(str(pname)) or not re.search(r"[a-z]", str(pname))):
                    out.append(Problem(f"{where}.ports[{pi}].name", f"{pname!r} is not an IANA service name (<= 15 chars, a-z 0-9 '-')", src))
                number = port.get("containerPort")
                if not isinstance(number, int) or not 1 <= number <= 65535:
                    out.append(Problem(f"{where}.ports[{pi}].containerPort", f"{number!r} must be between 1 and 65535", src))
            out += _resource_problems(container.get("resources") or {}, f"{where}.resources", src)
    return out


def _resource_problems(resources: dict[str, Any], where: str, src: str) -> list[Problem]:
    out: list[Problem] = []
    if _kubernetes_parse_quantity() is None:
        return out  # validate_manifest reports the quantity checks as skipped
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    parsed: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
    for part, values in (("requests", requests), ("limits", limits)):
        for key, value in values.items():
            quantity = parse_quantity(value)
            if quantity is None:
                out.append(Problem(f"{where}.{part}.{key}", f"{value!r} is not a quantity (e.g. 8, 1500m, 64Gi)", src))
            elif quantity < 0:
                out.append(Problem(f"{where}.{part}.{key}", f"{value!r} must be greater than or equal to 0", src))
            else:
                parsed[part][key] = quantity
    for key, request in parsed["requests"].items():
        limit = parsed["limits"].get(key)
        extended = key not in _OVERCOMMIT and not key.startswith("hugepages-")
        if extended:
            if request != request.to_integral_value():
                out.append(Problem(f"{where}.requests.{key}", f"{requests[key]!r}: {key} must be a whole number", src))
            if limit is None:
                out.append(Problem(f"{where}.limits.{key}", f"must be set for {key} (extended resources cannot be overcommitted)", src))
            elif limit != request:
                out.append(Problem(f"{where}.requests.{key}", f"must be equal to {key} limit ({limits[key]!r})", src))
        elif limit is not None and request > limit:
            out.append(Problem(f"{where}.requests.{key}", f"{requests[key]!r} must be less than or equal to {key} limit {limits[key]!r}", src))
    for key, limit in parsed["limits"].items():
        if key not in _OVERCOMMIT and not key.startswith("hugepages-") and limit != limit.to_integral_value():
            out.append(Problem(f"{where}.limits.{key}", f"{limits[key]!r}: {key} must be a whole number", src))
    return out


# --------------------------------------------------------------------------- pod templates


def pod_templates(job: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(role, path of the pod spec, PodTemplateSpec)`` for each replica of a PyTorchJob, or the
    one node template of a TrainJob as the Trainer assembles it (trainer container fields +
    jobgen's runtime patch; the runtime's own fields are not known offline)."""
    spec = job.get("spec") or {}
    if job.get("kind") == "PyTorchJob":
        return [(role.lower(), f"spec.pytorchReplicaSpecs.{role}.template.spec", r.get("template") or {})
                for role, r in (spec.get("pytorchReplicaSpecs") or {}).items()]
    trainer = spec.get("trainer") or {}
    patches = spec.get("runtimePatches") or []
    pod: dict[str, Any] = {}
    labels: dict[str, Any] = {}
    container: dict[str, Any] = {}
    for patch in patches:
        for rjob in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []:
            template = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
            labels.update((template.get("metadata") or {}).get("labels") or {})
            pod.update({k: v for k, v in (template.get("spec") or {}).items() if k != "containers"})
            for c in (template.get("spec") or {}).get("containers") or []:
                container.update(c)
    container.update({key: value for key, value in (("image", trainer.get("image")), ("command", trainer.get("command")),
                                                    ("args", trainer.get("args")), ("env", trainer.get("env")),
                                                    ("resources", trainer.get("resourcesPerNode"))) if value is not None})
    container.setdefault("name", "node")
    pod["containers"] = [container]
    return [("node", "spec.trainer + spec.runtimePatches", {"metadata": {"labels": labels}, "spec": pod})]


# --------------------------------------------------------------------------- entry point


def validate_manifest(docs: list[dict[str, Any]], *, source: str, k8s_version: str | None = None,
                      profile_source: str = "<profile>") -> Report:
    """Check a rendered manifest's objects (a ConfigMap and a PyTorchJob or TrainJob) offline.

    ``source`` names the manifest in messages; ``k8s_version`` ("1.30") picks the core/v1
    schema (None: the newest bundled).

    Returns a :class:`Report` of the checks run and those skipped (with why).

    Raises:
        PlanError: any check fails; the message lists every problem as ``path: message [rule
            source]``.
        ConfigError: ``$JOBGEN_CRDS_DIR`` names no directory, or a CRD file is not a CRD.
    """
    checked: list[str] = []
    skipped: list[str] = []
    problems: list[tuple[str, Problem]] = []
    try:
        import jsonschema  # noqa: F401  (the schema checks need it; the rule checks below do not)
    except ImportError:
        jsonschema = None
        skipped.append("CRD and core/v1 schemas: jsonschema is not installed (pip install 'jobgen[k8s]')")
    if _kubernetes_parse_quantity() is None:
        skipped.append("resource quantities: the kubernetes package is not installed (pip install 'jobgen[k8s]')")
    jobs = [d for d in docs if d.get("kind") in CRD_FILES]
    for job in jobs:
        kind = job["kind"]
        label = f"{kind} {job.get('metadata', {}).get('name')}"
        rules = pytorchjob_webhook_problems(job) if kind == "PyTorchJob" else trainjob_rule_problems(job)
        problems += [(label, p) for p in rules]
        for _, prefix, template in pod_templates(job):
            problems += [(label, p) for p in pod_problems(template.get("spec") or {}, prefix)]
        checked.append(f"{kind} admission rules")
        if jsonschema is None:
            continue
        directory = crds_dir()
        path = crd_file(kind, directory)
        if path is None:
            skipped.append(f"{kind} CRD schema: no {CRD_FILES[kind][0]}_{CRD_FILES[kind][1]}.yaml in {directory}")
        else:
            validator = _crd_validator(str(path), path.stat().st_mtime_ns, CRD_FILES[kind][3])
            problems += [(label, p) for p in _schema_problems(validator, job, "", f"{path.parent.name}/{path.name} (strict)")]
            checked.append(f"{kind} CRD schema ({path.parent.name}, strict)")
    if jsonschema is None:
        _raise(problems, source, profile_source)
        return Report(tuple(checked), tuple(skipped))
    try:
        import kubernetes_validate  # noqa: F401  (presence check; schemas are read below)
    except ImportError:
        skipped.append("core/v1 schemas: kubernetes-validate is not installed (pip install 'jobgen[k8s]')")
        _raise(problems, source, profile_source)
        return Report(tuple(checked), tuple(skipped))
    meta_validator, used, note = _core_validator(k8s_version, "objectmeta")
    if note:
        skipped.append(note)
    for doc in docs:
        label = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        if doc.get("kind") == "ConfigMap":
            validator, _, _ = _core_validator(k8s_version, "configmap-v1.json")
            problems += [(label, p) for p in _schema_problems(validator, doc, "", f"core/v1 ConfigMap {used} (kubernetes-validate, strict)")]
            continue
        problems += [(label, p) for p in _schema_problems(meta_validator, doc.get("metadata") or {}, "metadata",
                                                          f"ObjectMeta {used} (kubernetes-validate, strict)")]
        if doc.get("kind") in CRD_FILES:
            template_validator, _, _ = _core_validator(k8s_version, "podtemplate-v1.json")
            for role, prefix, template in pod_templates(doc):
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{doc['metadata'].get('name')}-{role}"},
                           "template": template}
                for p in _schema_problems(template_validator, wrapped, "", f"core/v1 PodTemplate {used} (kubernetes-validate, strict)"):
                    path = p.path.replace("template.spec", prefix, 1) if p.path.startswith("template.spec") else f"{role}: {p.path}"
                    problems.append((label, Problem(path, p.message, p.source)))
    checked.append(f"core/v1 ConfigMap, ObjectMeta and pod templates ({used}, kubernetes-validate strict)")
    _raise(problems, source, profile_source)
    return Report(tuple(checked), tuple(skipped))


def _raise(problems: list[tuple[str, Problem]], source: str, profile_source: str) -> None:
    if not problems:
        return
    lines = [f"{label}: {problem}" for label, problem in problems]
    raise PlanError(
        f"the rendered manifest {source} would be rejected by the cluster ({len(lines)} problem(s)):\n    " + "\n    ".join(lines),
        location=profile_source,
        hint="fix the profile field (or the edited template) that produced the path above; each problem names its rule's source",
    )
