"""ClusterProfile: where a job runs — scheduler, node shape, site conventions.

Profiles are YAML files under ``cluster_profiles/`` (lookup order: :func:`jobgen.specs.load.search_dirs`) and
may inherit from another with ``extends: <profile>`` (resolved by :mod:`jobgen.specs.load`). This
module only validates; it does no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)

from jobgen.errors import ConfigError
from jobgen.specs.capabilities import capabilities
from jobgen.specs.k8s_names import is_dns1123_label, is_dns1123_subdomain
from jobgen.specs.tracking import TrackingDefaults
from jobgen.specs.training import ENV_KEY_RE, _omit_defaults, check_env, check_shell_safe

Scheduler = Literal["slurm", "kubernetes", "local", "ssh"]
Fabric = Literal["infiniband", "roce", "efa", "tcp"]
GpuType = Literal["V100", "T4", "A10G", "A100", "L4", "L40S", "H100", "H200", "B200"]

#: CUDA compute capability per GPU type (NVIDIA's published table). bf16 needs >= 8.0
#: (Ampere), fp8 (transformer-engine) needs >= 8.9 on Ada/Hopper; jobgen requires Hopper (9.0).
GPU_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "V100": (7, 0),
    "T4": (7, 5),
    "A100": (8, 0),
    "A10G": (8, 6),
    "L4": (8, 9),
    "L40S": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "B200": (10, 0),
}

_SIGNALS = Literal["USR1", "USR2", "TERM", "INT", "HUP", "XCPU"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _shell_safe_all(values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        check_shell_safe(value)
    return values


class ContainerSettings(_Model):
    """Container to run each SLURM task in."""

    runtime: Literal["none", "pyxis", "apptainer"] = Field(default="none", description=(
        "``pyxis`` (srun --container-image, NVIDIA enroot) or ``apptainer`` (apptainer exec --nv)."
    ))
    image: str | None = Field(default=None, description="Image reference (pyxis: ``nvcr.io#nvidia/pytorch:24.05-py3``; apptainer: a .sif path).")
    mounts: tuple[str, ...] = Field(default=(), description="Bind mounts ``src:dst[:flags]`` (pyxis --container-mounts, apptainer --bind).")

    @field_validator("image")
    @classmethod
    def _image_safe(cls, value: str | None) -> str | None:
        return None if value is None else check_shell_safe(value)

    @field_validator("mounts")
    @classmethod
    def _mounts_safe(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _shell_safe_all(value)

    @model_validator(mode="after")
    def _image_needed(self) -> ContainerSettings:
        if self.runtime != "none" and not self.image:
            raise ValueError(
                f"You set `container.runtime: {self.runtime}`, but no `container.image`: "
                + ("srun --container-image needs an image reference, e.g. nvcr.io#nvidia/pytorch:24.05-py3"
                   if self.runtime == "pyxis" else "apptainer exec needs an image, e.g. /shared/images/pytorch.sif")
            )
        return self


#: SlurmSettings fields left out of its serialised form (and the inputs hash) while at these defaults.
_SLURM_OPTIONAL_FIELDS: dict[str, Any] = {"sweep_as_array": False, "array_parallelism": None}


class SlurmSettings(_Model):
    """SLURM site conventions (sbatch directives and the srun launch line)."""

    cluster: str = Field(default="default", description="Cluster name used in job handles ``slurm://<cluster>/<jobid>``.")
    partition: str | None = Field(default=None, description="``--partition``; ``null``: the site's default partition.")
    account: str | None = Field(default=None, description="``--account`` to charge.")
    qos: str | None = Field(default=None, description="``--qos``.")
    time_limit_min: int = Field(default=60, ge=1, description="Default wall-clock limit in minutes (``--time``); a spec may ask for a different one.")
    max_time_limit_min: int | None = Field(default=None, ge=1, description="The partition's MaxTime in minutes, checked at plan time; ``null``: not checked.")
    version: str | None = Field(default=None, description=(
        "The site's SLURM version (``MAJOR.MINOR``, e.g. ``\"22.05\"``, from ``sbatch --version``);\n"
        "checked against the GPU request style at plan time; ``null``: assume a current SLURM."
    ))
    gpu_request_style: Literal["gres", "gpus-per-node", "gpus-per-task"] = Field(default="gres", description=(
        "How GPUs are requested: ``--gres=gpu[:type]:N`` (all versions), ``--gpus-per-node``\n"
        "(SLURM >= 19.05, select/cons_tres) or ``--gpus-per-task=1`` (SLURM >= 19.05; jobgen adds the\n"
        "explicit ``--ntasks`` SLURM requires with it)."
    ))
    gres_gpu_type: str | None = Field(default=None, description="GPU type in the GRES string, e.g. ``a100`` -> ``--gres=gpu:a100:8``; ``null``: untyped.")
    constraint: str | None = Field(default=None, description="``--constraint`` feature expression, e.g. ``a100&ib``.")
    exclusive: bool = Field(default=True, description="``--exclusive``: no other job shares the nodes.")
    modules: tuple[str, ...] = Field(default=(), description="Environment modules loaded before launch (``module load <m>``).")
    container: ContainerSettings = Field(default=ContainerSettings(), description="Container runtime and image for the tasks.")
    requeue: bool = Field(default=True, description="``--requeue``: the job may be requeued after pre-emption or a node failure.")
    requeue_signal: _SIGNALS = Field(default="USR2", description=(
        "Signal SLURM sends ``signal_grace_s`` before the time limit; jobgen's entrypoint catches it,\n"
        "all ranks save an HPC checkpoint at the same step and global rank 0 runs ``scontrol requeue``.\n"
        "USR2, not USR1: NCCL may catch SIGUSR1\n"
        "(NVIDIA/nccl#704; submitit defaults to USR2 for the same reason)."
    ))
    signal_grace_s: int = Field(default=120, ge=10, le=3600, description=(
        "Seconds between the signal and the time limit (``--signal=<SIG>@<grace_s>``). SLURM may\n"
        "send it up to 60 s early (sbatch(1)), so leave room for one checkpoint save."
    ))
    signal_target: Literal["tasks", "batch"] = Field(default="tasks", description=(
        "Who receives the signal: ``tasks`` (``--signal=SIG@T``: every rank; Lightning catches it) or\n"
        "``batch`` (``--signal=B:SIG@T``: only the batch shell, which forwards it to srun and so to the\n"
        "ranks; for sites whose wrappers or containers do not pass signals to steps)."
    ))
    master_port: int = Field(default=29500, ge=1024, le=65535, description=(
        "Rendezvous port on the first node (a job array's task i: + i). With ``exclusive: false``\n"
        "(another job may share the first node) the first of a window: each job takes\n"
        "``master_port + SLURM_JOB_ID % 1000`` (fewer near 65535), past a port something already\n"
        "listens on there. Lightning's own default, 10000 + the id's last four digits, collides\n"
        "across jobs."
    ))
    python: str = Field(default="python", description="Python interpreter on the compute nodes (with jobgen[train] installed).")
    extra_srun_args: tuple[str, ...] = Field(default=(), description="Extra arguments for ``srun``, each quoted as one argument.")
    extra_sbatch_args: tuple[str, ...] = Field(default=(), description=(
        "Extra ``#SBATCH`` lines as ``--option=value`` or ``--flag`` (e.g. ``--reservation=big``);\n"
        "options jobgen derives from the world (nodes, tasks, GPUs) are refused at plan time."
    ))
    sweep_as_array: bool = Field(default=False, description=(
        "Render a sweep (``--sweep``, ``sweep:`` in jobgen.yaml) as ONE job array: one job directory\n"
        "named after the sweep's base name, one ``job.sbatch`` with ``#SBATCH --array=0-<N-1>``, each\n"
        "task training its own point (``points/<i>/spec.json``) in its own run directory. Every\n"
        "point must ask for the same resources. ``false``: one job per point."
    ))
    array_parallelism: int | None = Field(default=None, ge=1, description=(
        "With ``sweep_as_array``: at most this many tasks of an array run at once (``--array=0-<N-1>%P``);\n"
        "``null``: as many as the cluster schedules."
    ))

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # Left out while at their defaults, so profiles without them keep their inputs hash.
        return _omit_defaults(handler(self), _SLURM_OPTIONAL_FIELDS)

    @model_validator(mode="after")
    def _parallelism_needs_array(self) -> SlurmSettings:
        if self.array_parallelism is not None and not self.sweep_as_array:
            raise ValueError("array_parallelism limits the tasks of a job array: it needs `sweep_as_array: true`")
        return self

    @field_validator("version")
    @classmethod
    def _version_format(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d{2}\.\d{2}(\.\d+)?", value):
            raise ValueError(f"SLURM version {value!r} is not MAJOR.MINOR like '22.05' (see `sbatch --version`)")
        return value

    @field_validator("extra_sbatch_args")
    @classmethod
    def _sbatch_args_form(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            if not re.fullmatch(r"--[a-z][a-z0-9-]*(=.+)?", arg, flags=re.S):
                raise ValueError(f"extra_sbatch_args entry {arg!r} is not --option=value or --flag (long form)")
        return _shell_safe_all(value)

    @field_validator("cluster", "partition", "account", "qos", "constraint", "gres_gpu_type", "python")
    @classmethod
    def _safe(cls, value: str | None) -> str | None:
        return None if value is None else check_shell_safe(value)

    @field_validator("modules", "extra_srun_args")
    @classmethod
    def _safe_all(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _shell_safe_all(value)


class Toleration(_Model):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, description="Taint key the toleration matches; ``null`` (with ``operator: Exists``): every taint key.")
    operator: Literal["Exists", "Equal"] = Field(
        default="Exists", description="``Exists``: any value of the taint matches; ``Equal``: the taint's value must equal ``value``.")
    value: str | None = Field(default=None, description="Taint value to match with ``operator: Equal``; ``null`` with ``Exists``.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match (``NoSchedule``, ``PreferNoSchedule``, ``NoExecute``); ``null``: every effect.")


#: DNS-1123 subdomain (core/v1 object names: Secret, ConfigMap, PVC, ServiceAccount, PriorityClass).
#: Keys of a Secret or ConfigMap (apimachinery IsConfigMapKey).
_CONFIG_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
#: A label value (apimachinery IsValidLabelValue): <= 63 chars, alphanumeric at both ends.
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
#: A qualified resource name such as ``nvidia.com/gpu`` or ``rdma/ib`` (prefix/name).
_RESOURCE_NAME_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _dns_subdomain(value: str, what: str) -> str:
    if not is_dns1123_subdomain(value):
        raise ValueError(f"{what} {value!r} is not a DNS-1123 subdomain (lowercase a-z, 0-9, '-', '.', <= 253 chars), "
                         "which Kubernetes requires for object names")
    return value


class SecretRef(_Model):
    """One key of a Kubernetes Secret (core/v1 SecretKeySelector). jobgen writes
    ``valueFrom.secretKeyRef`` into the pods; the secret's value never appears in a manifest."""

    secret: str = Field(description="Name of the Secret in the job's namespace.")
    key: str = Field(description="Key inside the Secret.")
    optional: bool = Field(default=False, description="Start the pods even when the Secret or key is missing (the variable is then unset).")

    @field_validator("secret")
    @classmethod
    def _secret_name(cls, value: str) -> str:
        return _dns_subdomain(value, "Secret name")

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if len(value) > 253 or not _CONFIG_KEY_RE.match(value):
            raise ValueError(f"Secret key {value!r} is not a valid key ([-._a-zA-Z0-9]+, <= 253 chars)")
        return value


class KubernetesSettings(_Model):
    """Kubernetes (Kubeflow PyTorchJob or Trainer v2 TrainJob) conventions."""

    context: str | None = Field(default=None, description=(
        "kubeconfig context for submission; ``null``: the current context (``--context`` and\n"
        "``$JOBGEN_K8S_CONTEXT`` override it)."
    ))
    kubeconfig: str | None = Field(default=None, description="kubeconfig file for submission; ``null``: ``$KUBECONFIG``, else ``~/.kube/config``.")
    namespace: str = Field(default="default", description="Namespace of the job and its ConfigMap.")
    job_api: Literal["pytorchjob", "trainjob"] = Field(default="pytorchjob", description=(
        "What to render: a Kubeflow training-operator ``PyTorchJob`` (kubeflow.org/v1) or a\n"
        "Kubeflow Trainer v2 ``TrainJob`` (trainer.kubeflow.org/v1alpha1) that references\n"
        "``trainer_runtime``."
    ))
    trainer_runtime: str = Field(default="torch-distributed", description=(
        "TrainJob only: the ClusterTrainingRuntime it references (the runtime must run torchrun)."
    ))
    version: str | None = Field(default=None, description=(
        "The cluster's Kubernetes version (``MAJOR.MINOR``, e.g. ``\"1.30\"``): the core/v1 schema\n"
        "that pod templates are checked against at render time; ``null``: the newest schema\n"
        "kubernetes-validate bundles."
    ))
    image: str = Field(description="Container image with jobgen[train] installed (runs ``python -m jobgen.train``).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(default="IfNotPresent", description="Pod imagePullPolicy.")
    image_pull_secrets: tuple[str, ...] = Field(default=(), description="Names of docker-registry Secrets for pulling the image (pod imagePullSecrets).")
    node_selector: dict[str, str] = Field(default={}, description="Pod nodeSelector labels.")
    tolerations: tuple[Toleration, ...] = Field(default=(), description="Pod tolerations (e.g. for the nvidia.com/gpu taint).")
    affinity: dict[str, Any] = Field(default={}, description=(
        "Pod affinity, a core/v1 ``Affinity`` written as given (nodeAffinity, podAffinity,\n"
        "podAntiAffinity); checked against the core/v1 schema at render time."
    ))
    priority_class: str | None = Field(default=None, description="Pod priorityClassName (PyTorchJob; with Volcano also the PodGroup's priority class).")
    service_account: str | None = Field(default=None, description="Pod serviceAccountName.")
    queue_label: str | None = Field(default=None, description="Kueue LocalQueue name (label ``kueue.x-k8s.io/queue-name`` on the job).")
    scheduler_name: str | None = Field(default=None, description=(
        "Pod schedulerName, e.g. ``volcano`` for gang scheduling (PyTorchJob only); ``null``:\n"
        "the cluster's default scheduler."
    ))
    volcano_queue: str | None = Field(default=None, description="Volcano queue (``runPolicy.schedulingPolicy.queue``); needs ``scheduler_name: volcano``.")
    shm_size_gib: float = Field(default=16.0, gt=0, description=(
        "Size of the memory-backed /dev/shm emptyDir in GiB (DataLoader workers and NCCL need it);\n"
        "it counts against the pod's memory limit."
    ))
    cpu_limit: float | None = Field(default=None, gt=0, description=(
        "CPU limit per pod in cores (the request is ``cpus_per_node``; requests must not exceed\n"
        "limits); ``null``: no CPU limit."
    ))
    mem_request_gib: float | None = Field(default=None, gt=0, description=(
        "Memory request per pod in GiB (the limit is ``mem_gib_per_node``); ``null``: equal to the limit."
    ))
    rdma_resource: str | None = Field(default=None, description=(
        "Extended resource that gives a pod its RDMA devices, e.g. ``rdma/ib`` (k8s-rdma-shared-dev-plugin),\n"
        "``nvidia.com/hostdev`` or ``vpc.amazonaws.com/efa``; requested on fabrics infiniband, roce and\n"
        "efa, where the container also gets the IPC_LOCK capability (pinned memory)."
    ))
    rdma_devices: int = Field(default=1, ge=1, le=64, description="How many ``rdma_resource`` devices each pod requests.")
    extra_resources: dict[str, int] = Field(default={}, description=(
        "Further extended resources per pod, e.g. ``{example.com/fpga: 1}`` (requests = limits, as\n"
        "Kubernetes requires for extended resources)."
    ))
    secret_env: dict[str, SecretRef] = Field(default={}, description=(
        "Environment variables taken from Secrets: ``NAME: {secret: <Secret name>, key: <key>}``\n"
        "(written as ``valueFrom.secretKeyRef``; never a value). Every name in a spec's ``secrets``\n"
        "must be mapped here."
    ))
    runs_volume_claim: str | None = Field(default=None, description=(
        "PersistentVolumeClaim mounted at /workspace/runs (checkpoints, metrics); it must be\n"
        "ReadWriteMany for multi-pod jobs. ``null``: an emptyDir, lost when a pod is replaced."
    ))
    backoff_limit: int | None = Field(default=None, ge=0, description=(
        "The restart budget of this cluster's jobs whose spec sets none (``restart.max_restarts`` 0); a\n"
        "spec's budget above 0 wins. ``null``: 0, no restarts. Rendered as PyTorchJob\n"
        "``runPolicy.backoffLimit`` with ``restartPolicy: ExitCode`` (docs/kubernetes.md)."))
    clean_pod_policy: Literal["None", "Running", "All"] = Field(default="None", description=(
        "PyTorchJob ``runPolicy.cleanPodPolicy``: which pods to delete when the job ends."
    ))
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, description=(
        "PyTorchJob ``runPolicy.ttlSecondsAfterFinished``: delete the finished job after this many\n"
        "seconds; ``null``: keep it."
    ))
    time_limit_min: int | None = Field(default=None, ge=1, description=(
        "Default wall-clock limit in minutes (``activeDeadlineSeconds``); the spec's\n"
        "``resources.time_limit_min`` wins; ``null``: no limit."
    ))
    master_port: int = Field(default=23456, ge=1024, le=65535, description="Rendezvous port of the Master pod (PyTorchJob's default).")
    python: str = Field(default="python", description="Python interpreter in the image.")

    @field_validator("namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not is_dns1123_label(value):
            raise ValueError(f"namespace {value!r} is not a DNS-1123 label (lowercase a-z, 0-9, '-', <= 63 chars)")
        return value

    @field_validator("priority_class", "service_account", "runs_volume_claim", "trainer_runtime", "scheduler_name")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        return None if value is None else _dns_subdomain(value, "name")

    @field_validator("image_pull_secrets")
    @classmethod
    def _pull_secrets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _dns_subdomain(name, "Secret name")
        return value

    @field_validator("queue_label", "volcano_queue")
    @classmethod
    def _label_value(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not value or not _LABEL_VALUE_RE.match(value)):
            raise ValueError(f"{value!r} is not a valid label value (<= 63 chars of A-Z a-z 0-9 - _ ., alphanumeric at both ends)")
        return value

    @field_validator("version")
    @classmethod
    def _k8s_version(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"1\.\d{1,2}", value):
            raise ValueError(f"Kubernetes version {value!r} is not MAJOR.MINOR like '1.30' (see `kubectl version`)")
        return value

    @field_validator("rdma_resource")
    @classmethod
    def _resource_name(cls, value: str | None) -> str | None:
        if value is not None and not _RESOURCE_NAME_RE.match(value):
            raise ValueError(f"resource name {value!r} is not a qualified name like 'rdma/ib' or 'vpc.amazonaws.com/efa'")
        return value

    @field_validator("extra_resources")
    @classmethod
    def _extra_resources(cls, value: dict[str, int]) -> dict[str, int]:
        for name, count in value.items():
            if not _RESOURCE_NAME_RE.match(name) or "/" not in name:
                raise ValueError(f"extra_resources key {name!r} is not an extended resource name like 'example.com/fpga' "
                                 "(cpu, memory and GPUs come from cpus_per_node, mem_gib_per_node and gpus_per_node)")
            if count < 0:
                raise ValueError(f"extra_resources[{name!r}] = {count}: a resource count cannot be negative")
        return dict(sorted(value.items()))

    @field_validator("secret_env", mode="before")
    @classmethod
    def _secret_refs_only(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name, ref in value.items():
                if not isinstance(ref, dict):
                    raise ValueError(
                        f"secret_env.{name} is a literal value; jobgen never writes a secret's value into a manifest. "
                        f"Create the Secret in the cluster (kubectl create secret generic <name> --from-literal=<key>=...) "
                        f"and give a reference: {name}: {{secret: <Secret name>, key: <key>}}"
                    )
                if not ENV_KEY_RE.match(str(name)):
                    raise ValueError(f"environment variable name {name!r} is not a valid name ([A-Za-z_][A-Za-z0-9_]*)")
            return dict(sorted(value.items()))
        return value

    @model_validator(mode="after")
    def _scheduling(self) -> KubernetesSettings:
        if self.volcano_queue and self.scheduler_name != "volcano":
            raise ValueError("volcano_queue needs scheduler_name: volcano (the Volcano scheduler reads the PodGroup's queue)")
        if self.queue_label and self.scheduler_name == "volcano":
            raise ValueError("queue_label (Kueue) and scheduler_name: volcano exclude each other: pick one gang/queueing system")
        return self


#: ``model_dump(context=...)`` of a profile shown as a file to copy: loader directives such as
#: ``local.detect_gpus`` are kept (the inputs hash and spec.json leave them out).
PROFILE_FILE_CONTEXT = {"directives": True}


class BandwidthSettings(_Model):
    """Bus bandwidths (GB/s) for ``jobgen plan``'s time model instead of its defaults (jobgen.planning.time_model)."""

    intra_node_gb_per_s: float | None = Field(default=None, gt=0, lt=1e5, description="Within a node (NVLink/PCIe; gloo on CPU).")
    inter_node_gb_per_s: float | None = Field(default=None, gt=0, lt=1e5, description="Across nodes (e.g. the preflight's busbw).")
    pcie_gb_per_s: float | None = Field(default=None, gt=0, lt=1e5, description="Between a GPU and host memory (offload).")


class LocalSettings(_Model):
    """The embedded default: the entrypoint under torchrun on this machine."""

    omp_threads_per_process: int | None = Field(default=None, ge=1, description="OMP_NUM_THREADS per rank; ``null``: CPU cores / processes (at least 1).")
    python: str | None = Field(default=None, description="Interpreter for the ranks; ``null``: the one running jobgen.")
    detect_gpus: bool = Field(default=False, description=(
        "Use this machine's GPUs when it has any (jobgen.specs.local_gpus, when the profile is loaded): one\n"
        "rank per GPU, ``gpu_type``/``gpu_mem_gib`` (so ``precision: auto`` and the plan's budget) and\n"
        "the machine's cores and memory from the device query; without GPUs the profile is used as\n"
        "written. Renders then differ between GPU and CPU machines. Not part of the inputs hash\n"
        "(the values it sets are)."
    ))

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # a loader directive: what it found is in the profile's fields (and hash), not the flag;
        # kept where the dump is a profile to copy (PROFILE_FILE_CONTEXT: `jobgen profiles show`)
        doc = handler(self)
        if (info.context or {}).get("directives"):
            return doc
        return {k: v for k, v in doc.items() if k != "detect_gpus"}


#: Characters OpenSSH refuses in a host or user name given on its command line (OpenSSH 9.6
#: ssh.c ``valid_hostname`` / ``valid_ruser``, the fix of CVE-2023-51385): refused at load, so
#: a profile that a newer ssh would reject fails here and not at submit.
_SSH_REFUSED_CHARS = "'`\"$\\;&<>|(){}"
#: ``ssh -o`` options jobgen sets itself (the field to use instead), or that break how it talks to a host.
_SSH_OWN_OPTIONS = {
    "batchmode": "(always yes: jobgen never waits for a password prompt)",
    "connecttimeout": "ssh.connect_timeout_s", "port": "ssh.port", "user": "ssh.user", "identityfile": "ssh.identity_file",
    "identitiesonly": "ssh.identity_file (jobgen adds IdentitiesOnly=yes with it)", "userknownhostsfile": "ssh.known_hosts",
    "stricthostkeychecking": "ssh.known_hosts (yes with a file, accept-new without)",
    "remotecommand": "(jobgen sends its own commands)", "requesttty": "(jobgen's commands need no terminal)",
    "sessiontype": "(jobgen's commands need a shell session)", "stdinnull": "(jobgen feeds the copy on stdin)",
    "forkafterauthentication": "(jobgen waits for each command)",
}
#: ``ssh -o`` options that make ssh run a program or load code on the submitting machine
#: (ssh_config(5), OpenSSH 9.6): a profile is shared and committed, and jobgen runs ssh for every
#: submit, status, logs and cancel, so none of them is taken from it (a Host block in your own
#: ~/.ssh/config may still set them: name its alias in ssh.hosts).
_SSH_LOCAL_PROGRAM_OPTIONS = frozenset({
    "proxycommand", "knownhostscommand", "localcommand", "permitlocalcommand", "pkcs11provider", "securitykeyprovider",
    "xauthlocation",
})


def _ssh_name(value: str, what: str, *, spaces: bool) -> str:
    """A host or user name as OpenSSH >= 9.6 takes it on its command line (see :data:`_SSH_REFUSED_CHARS`)."""
    check_shell_safe(value)
    if not value or value.startswith("-"):
        raise ValueError(f"{what} {value!r} is empty or starts with '-' (ssh would read it as an option)")
    bad = sorted({c for c in value if c in _SSH_REFUSED_CHARS or (not spaces and c.isspace()) or not c.isprintable()})
    if bad:
        raise ValueError(f"{what} {value!r} holds {''.join(bad)!r}, which OpenSSH refuses in names given on its command line "
                         "(OpenSSH 9.6, CVE-2023-51385); use a Host alias from ~/.ssh/config")
    if re.search(r"\s-", value):  # OpenSSH 9.6 valid_ruser: no '-' after a blank (an option smuggled into a name)
        raise ValueError(f"{what} {value!r} has a '-' after a blank, which OpenSSH refuses in names given on its command line "
                         "(OpenSSH 9.6, CVE-2023-51385); use a Host alias from ~/.ssh/config with its User")
    return value


class SshSettings(_Model):
    """Machines without a scheduler, reached over OpenSSH (``scheduler: ssh``): the same
    launch script on every host, started, watched and stopped by ``ssh`` in BatchMode."""

    hosts: tuple[str, ...] = Field(min_length=1, description=(
        "The machines, in node-rank order: ssh destinations (host names, addresses, or ``Host`` aliases\n"
        "of ``~/.ssh/config``). A job on N nodes runs on the first N; the first is the rendezvous host\n"
        "(torchrun ``--master-addr``) unless ``master_addr`` says otherwise."
    ))
    user: str | None = Field(default=None, description=(
        "Login name on every host (``ssh -l``); ``null``: ssh's default (``~/.ssh/config``, else your local name)."))
    port: int = Field(default=22, ge=1, le=65535, description="sshd port on every host (``ssh -p``).")
    workdir: str = Field(default="~/jobgen-runs", description=(
        "Directory on every host under which jobs run: ``<workdir>/<job name>/`` is the run\n"
        "directory (``job/``: the copied job directory, ``code/``: the code snapshot, checkpoints,\n"
        "``node-<rank>.log``). Absolute, or ``~/...`` in the home directory of the login on each\n"
        "host (the default, as SkyPilot's ``~/sky_workdir``). Created when missing; any characters\n"
        "but newlines (quoted by jobgen)."
    ))
    python: str = Field(default="python3", description="Python interpreter on every host, with jobgen[train] installed (runs torchrun and the entrypoint).")
    master_addr: str | None = Field(default=None, description=(
        "Address the other hosts reach the first one at for the rendezvous (e.g. its InfiniBand or\n"
        "private-network address); ``null``: the first host as written in ``hosts``."
    ))
    master_port: int = Field(default=29500, ge=1024, le=65535, description="Rendezvous port on the first host (torchrun ``--master-port``).")
    identity_file: str | None = Field(default=None, description=(
        "Private key to log in with (``ssh -i``, with ``IdentitiesOnly=yes``); ``null``: ssh's default keys\n"
        "and agent. ssh expands ``~``."
    ))
    known_hosts: str | None = Field(default=None, description=(
        "known_hosts file holding every host's key: ``StrictHostKeyChecking=yes`` against it (an unknown\n"
        "or changed key is refused). ``null``: ``StrictHostKeyChecking=accept-new`` with your own\n"
        "known_hosts (a host seen for the first time is trusted and recorded; a changed key is refused)."
    ))
    connect_timeout_s: int = Field(default=10, ge=1, le=300, description="Seconds ssh waits for each host to answer (``ConnectTimeout``).")
    options: tuple[str, ...] = Field(default=(), description=(
        "Further ``ssh -o`` options, ``Key=Value`` each (e.g. ``ProxyJump=bastion``); options jobgen sets\n"
        "from the fields above are refused, and so are those that run a program or load code on this\n"
        "machine (ProxyCommand, KnownHostsCommand, LocalCommand, PermitLocalCommand, PKCS11Provider,\n"
        "SecurityKeyProvider, XAuthLocation: set them in ~/.ssh/config for a Host alias)."
    ))

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            _ssh_name(host, "host", spaces=False)
        twice = sorted({h for h in value if value.count(h) > 1})
        if twice:
            raise ValueError(f"hosts lists {', '.join(twice)} more than once; each host is one node")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return None if value is None else _ssh_name(value, "user", spaces=True)

    @field_validator("master_addr")
    @classmethod
    def _master_addr(cls, value: str | None) -> str | None:
        return None if value is None else _ssh_name(value, "master_addr", spaces=False)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        check_shell_safe(value)
        if not (value.startswith("/") or value == "~" or value.startswith("~/")):
            raise ValueError(f"workdir {value!r} is not an absolute path or ~/... (the login's home on each host); give "
                             "the directory as every host sees it, e.g. /home/alice/jobgen-runs or ~/jobgen-runs")
        return value.rstrip("/") or "/"

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        return check_shell_safe(value)

    @field_validator("identity_file", "known_hosts")
    @classmethod
    def _path(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return None
        check_shell_safe(value)
        # ssh expands %-tokens in both, and splits an -o value (UserKnownHostsFile=...) at blanks and quotes
        bad = "%" if info.field_name == "identity_file" else "%\"' \t\\"
        found = "".join(sorted({c for c in value if c in bad}))
        if not value or found:
            raise ValueError(f"{info.field_name} {value!r} is empty or holds {found!r}, which ssh would expand or split "
                             "(ssh_config(5): %-tokens, and -o values split at blanks and quotes); use a path without them")
        return value

    @field_validator("options")
    @classmethod
    def _options(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for option in value:
            check_shell_safe(option)
            key, eq, arg = option.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key) or not arg.strip():
                raise ValueError(f"options entry {option!r} is not Key=Value (an ssh_config(5) keyword and its value)")
            if key.lower() in _SSH_OWN_OPTIONS:
                raise ValueError(f"options entry {option!r}: jobgen sets {key} itself; use {_SSH_OWN_OPTIONS[key.lower()]}")
            if key.lower() in _SSH_LOCAL_PROGRAM_OPTIONS:
                raise ValueError(f"options entry {option!r}: {key} runs a program or loads code on this machine at every "
                                 "ssh call jobgen makes, so a profile may not set it; put it in a Host block of your own "
                                 "~/.ssh/config and name that Host in ssh.hosts (ProxyJump=... is taken here)")
        return value

    @property
    def rendezvous_host(self) -> str:
        """The address torchrun's ``--master-addr`` names: ``master_addr``, else the first host."""
        return self.master_addr or self.hosts[0]


#: A placeholder's field path: lower-case field names joined by dots (``kubernetes.image``).
_PLACEHOLDER_PATH_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
#: Longest placeholder reason, in characters: one line of an error message.
PLACEHOLDER_REASON_MAX = 200


class Placeholder(_Model):
    """A profile value that is an example, not a site's: ``jobgen submit`` refuses it.

    A profile file declares it under ``placeholders:`` as ``field.path: reason``; the loader
    (:func:`jobgen.specs.load.load_profile_doc`) fills in ``file`` and drops it once a profile
    extending that file, or an override of :func:`jobgen.specs.load.load_profile`, sets the field.
    """

    reason: str = Field(min_length=1, max_length=PLACEHOLDER_REASON_MAX, description=(
        "What the field must name at your site, on one line (at most 200 characters)."
    ))
    file: str | None = Field(default=None, description="The profile file that declared it (set by the loader).")

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in value):
            raise ValueError("must be one line of text (no line breaks, tabs or control characters)")
        return value


#: What a profile file holds for one placeholder (the reason; the loader adds the file).
_PLACEHOLDER_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": PLACEHOLDER_REASON_MAX}


def _field_path_exists(model: type[BaseModel], parts: list[str]) -> bool:
    """Whether ``parts`` (``["kubernetes", "image"]``) names a field of ``model`` or of the models
    nested in it (a mapping field, such as ``node_selector``, ends the path)."""
    field = model.model_fields.get(parts[0])
    if field is None:
        return False
    if len(parts) == 1:
        return True
    for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return _field_path_exists(arg, parts[1:])
    return False


def field_value(profile: BaseModel, path: str) -> Any:
    """The value at ``path`` (dotted field names) of ``profile``; None where a section is unset."""
    value: Any = profile
    for part in path.split("."):
        if value is None:
            return None
        value = getattr(value, part)
    return value


#: Longest value an example-value message shows, in characters (longer ones end in "...").
_SHOWN_VALUE_MAX = 160


def example_values(profile: ClusterProfile) -> tuple[tuple[str, str, Placeholder], ...]:
    """The profile's placeholders in force, sorted by field path: ``(field path, its value as
    one line of JSON, at most 160 characters, the placeholder)``."""
    shown = []
    for path in sorted(profile.placeholders):
        text = pydantic_core.to_json(field_value(profile, path)).decode()
        shown.append((path, text if len(text) <= _SHOWN_VALUE_MAX else text[:_SHOWN_VALUE_MAX - 3] + "...", profile.placeholders[path]))
    return tuple(shown)


def placeholder_error(profile: str, values: tuple[tuple[str, str, Placeholder], ...]) -> ConfigError:
    """The error ``jobgen submit`` raises for a profile (named ``profile``) that still holds the
    example ``values`` (:func:`example_values`; at least one): each field, its value, the file that
    declared it and why; the fix in the hint."""
    first_path, _, first = values[0]
    lines = [f"  {path} = {value} ({item.file or 'the profile'}): {item.reason}" for path, value, item in values]
    fields = ", ".join(path for path, _, _ in values)
    return ConfigError(
        f"profile {profile!r} holds example values, not your site's; jobgen submit sends none of them to a cluster:\n"
        + "\n".join(lines),
        location=f"{first.file or profile}: {first_path}",
        hint=f"write a profile of your own with 'extends: {profile}' that sets {fields} (in a copy of the file that lists "
             "them instead: set each value and delete its line under placeholders:); render, validate, plan, "
             "submit --dry-run=server and --test-only take the profile as it is",
    )


#: ClusterProfile fields left out of its serialised form (and the inputs hash) while at these defaults.
_PROFILE_OPTIONAL_FIELDS: dict[str, Any] = {"gpu_hour_price": None, "preflight": False, "preflight_timeout_s": 60, "ssh": None,
                                            "tracking": None, "calibration": None, "bandwidth": None}


class ClusterProfile(_Model):
    """A cluster: scheduler, node shape (GPUs, CPUs, memory), network fabric, site settings."""

    name: str = Field(min_length=1, description="Profile name (set from the file name by the loader).")
    description: str = Field(default="", description="One line shown by ``jobgen profiles list``.")
    scheduler: Scheduler = Field(description=(
        "Where jobs go: ``slurm``, ``kubernetes``, ``local`` (this machine) or ``ssh`` (machines without a\n"
        "scheduler, listed in ``ssh.hosts``)."
    ))
    max_nodes: int = Field(default=1, ge=1, description="Most nodes a job may use.")
    default_nodes: int = Field(default=1, ge=1, description="Nodes a job gets when its spec does not say.")
    gpus_per_node: int = Field(default=0, ge=0, le=64, description="GPUs per node; 0 for CPU-only clusters (then ``cpu_processes_per_node`` ranks run).")
    cpu_processes_per_node: int = Field(default=1, ge=1, description="Ranks per node on CPU-only clusters (``gpus_per_node: 0``), gloo backend.")
    gpu_type: GpuType | None = Field(default=None, description="GPU model; decides which precisions are allowed (bf16 needs Ampere+).")
    gpu_mem_gib: float | None = Field(default=None, gt=0, description="Memory per GPU in GiB.")
    gpu_hour_price: float | None = Field(default=None, ge=0, description=(
        "Price of one GPU-hour on this cluster (any currency; jobgen only multiplies): ``status``, ``ls`` and\n"
        "summary.json then show cost = GPU-hours x price. ``null``: no cost shown. GPU profiles only."
    ))
    cpus_per_node: int = Field(default=2, ge=1, description="CPU cores per node available to the job.")
    mem_gib_per_node: float = Field(default=8.0, gt=0, description="Host memory per node available to the job, in GiB.")
    network_fabric: Fabric = Field(default="tcp", description="Inter-node network; selects the NCCL environment preset (see jobgen.planning.nccl).")
    bandwidth: BandwidthSettings | None = Field(default=None, description="``jobgen plan`` time model's bandwidths; ``null``: defaults.")
    calibration: str | None = Field(default=None, min_length=1, max_length=4096, description=(
        "``jobgen plan``'s calibration file (``jobgen calibrate`` writes it); ``null``: $JOBGEN_CALIBRATION or the state dir's."))
    env: dict[str, str] = Field(default={}, description=(
        "Extra environment variables for every rank (the spec's env wins on conflicts). Values are\n"
        "written into the rendered files, so names that look like credentials are refused: use the\n"
        "spec's ``secrets`` (and, on Kubernetes, ``kubernetes.secret_env``)."
    ))
    slurm: SlurmSettings | None = Field(default=None, description="SLURM settings (used when ``scheduler: slurm``).")
    kubernetes: KubernetesSettings | None = Field(default=None, description="Kubernetes settings (required when ``scheduler: kubernetes``).")
    local: LocalSettings = Field(default=LocalSettings(), description="Local-run settings (used when ``scheduler: local``).")
    ssh: SshSettings | None = Field(default=None, description="Hosts and login (required when ``scheduler: ssh``).")
    preflight: bool = Field(default=False, description=(
        "Before training, every rank joins a short all-reduce test (NCCL on GPUs, gloo on CPU) that\n"
        "prints the bus bandwidth per node and stops the job (exit 1, naming the node) when a node\n"
        "does not join within ``preflight_timeout_s`` or is far slower than the others\n"
        "(``jobgen submit --preflight`` turns it on for one submission)."
    ))
    preflight_timeout_s: int = Field(default=60, ge=5, le=3600, description=(
        "Seconds the preflight waits for every rank to join, and again for the all-reduces to finish."
    ))
    tracking: TrackingDefaults | None = Field(default=None, description=(
        "The site's defaults for the experiment trackers: ``wandb`` (entity, project, mode, tags,\n"
        "api_key_file) and ``mlflow`` (tracking_uri, experiment, token_file); a spec's\n"
        "``trainer.wandb`` / ``trainer.mlflow`` win field by field. ``null``: none."
    ))
    placeholders: dict[str, Annotated[Placeholder, WithJsonSchema(_PLACEHOLDER_SCHEMA)]] = Field(default={}, exclude=True, description=(
        "Fields whose values are examples, not a site's: ``field.path: reason`` (e.g. ``kubernetes.image:\n"
        "build yours``). ``jobgen submit`` refuses the profile until each is set in a profile that\n"
        "extends this one; render, validate, plan and dry runs work.\n"
        "Not part of the rendered files or the inputs hash."
    ))

    @field_validator("placeholders", mode="before")
    @classmethod
    def _reason_only(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: {"reason": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("placeholders")
    @classmethod
    def _known_fields(cls, value: dict[str, Placeholder]) -> dict[str, Placeholder]:
        for path in value:
            known = _PLACEHOLDER_PATH_RE.fullmatch(path) and path not in ("name", "placeholders")
            if not known or not _field_path_exists(cls, path.split(".")):
                raise ValueError(f"{path!r} is not a profile field path (e.g. kubernetes.image, slurm.partition)")
        return value

    @field_validator("env")
    @classmethod
    def _env_ok(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env(value)

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # Fields added after profiles were in use are left out while at their defaults, so the inputs hash (and every
        # rendered file) of a profile without them stays as it was; jobgen plan's own fields are never in it.
        doc = _omit_defaults(handler(self), _PROFILE_OPTIONAL_FIELDS)
        return doc if (info.context or {}).get("directives") else {k: v for k, v in doc.items() if k not in ("bandwidth", "calibration")}

    @model_validator(mode="after")
    def _consistent(self) -> ClusterProfile:
        if self.default_nodes > self.max_nodes:
            raise ValueError(f"default_nodes={self.default_nodes} exceeds max_nodes={self.max_nodes}")
        if self.gpus_per_node > 0 and self.gpu_type is None:
            raise ValueError("gpus_per_node > 0 needs gpu_type (one of: " + ", ".join(GPU_COMPUTE_CAPABILITY) + ")")
        caps = capabilities(self.scheduler)
        own = getattr(self, caps.settings_attr)
        if caps.section_required is not None and own is None:
            raise ValueError(f"scheduler {self.scheduler!r} {caps.section_required}")
        if caps.fixed_hosts and isinstance(own, SshSettings) and self.max_nodes > len(own.hosts):
            raise ValueError(f"max_nodes={self.max_nodes} but ssh.hosts lists {len(own.hosts)} host(s): each node is one host; "
                             f"set max_nodes to at most {len(own.hosts)} or add hosts")
        if not caps.multi_node and self.max_nodes != 1:
            raise ValueError(f"scheduler {self.scheduler!r} {caps.refusal('multi_node').reason}: max_nodes must be 1")
        if self.gpu_hour_price is not None and self.gpus_per_node == 0:
            raise ValueError("gpu_hour_price prices GPU-hours, and this profile has no GPUs (gpus_per_node: 0); remove it")
        for path in self.placeholders:
            if field_value(self, path) is None:
                raise ValueError(f"placeholders names {path}, which this profile leaves unset: an example needs a value to replace")
        return self

    @property
    def devices_per_node(self) -> int:
        """Ranks per node the hardware offers: GPUs, or CPU processes on CPU-only profiles."""
        return self.gpus_per_node or self.cpu_processes_per_node

    @property
    def slurm_settings(self) -> SlurmSettings:
        """SLURM settings, defaulted when the profile has no ``slurm:`` section."""
        return self.slurm or SlurmSettings()
