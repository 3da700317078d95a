"""The world of a job: its process layout (nodes x ranks per node) and the numbers derived from
it, as the planner resolves it (:func:`jobgen.planning.rules.resolve_world`) and the job
directory records it (spec.json's ``launch``). It sits in the job directory's contract, below
the planner and the backends that read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Accelerator = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class World:
    """The process layout of a job and the numbers derived from it, computed once.

    Attributes:
        num_nodes: nodes (SLURM nodes, Kubernetes pods, 1 for local).
        devices_per_node: ranks per node (one per GPU; CPU processes on CPU profiles).
        accelerator: ``"gpu"`` (one rank per GPU, NCCL) or ``"cpu"`` (gloo).
        micro_batch_size: sequences per rank per forward/backward.
        gradient_accumulation_steps: micro batches per optimizer step.
        cpus_per_rank: CPU cores each rank gets (``cpus_per_node // devices_per_node``): SLURM's
            ``--cpus-per-task`` and every backend's ``OMP_NUM_THREADS`` default.
        time_limit_min: wall-clock limit in minutes (the spec's ``resources.time_limit_min``,
            else the scheduler's default from the profile); ``None``: no limit.
        min_nodes: elastic worlds only (``resources.nodes: "min:max"``): the fewest nodes the
            job trains on; ``num_nodes`` is then the most (the pods requested, the Worker
            replicas, torchrun's ``--nnodes=min_nodes:num_nodes``), and ``world_size`` and
            ``gradient_accumulation_steps`` are the values at that maximum. ``global_batch_size``
            is the same at every node count of the range (:func:`elastic_world`). ``None``: a
            fixed world.
    """

    num_nodes: int
    devices_per_node: int
    accelerator: Accelerator
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    cpus_per_rank: int = 1
    time_limit_min: int | None = None
    min_nodes: int | None = None

    @property
    def elastic(self) -> bool:
        """Whether the node count may change while the job runs (an elastic range)."""
        return self.min_nodes is not None

    @property
    def fewest_nodes(self) -> int:
        """The smallest world's node count: ``min_nodes`` when elastic, else ``num_nodes``. Memory
        per GPU is largest there (FSDP and ZeRO partition states over fewer ranks)."""
        return self.num_nodes if self.min_nodes is None else self.min_nodes

    @property
    def world_size(self) -> int:
        """Total number of ranks (data-parallel processes): nodes x devices per node."""
        return self.num_nodes * self.devices_per_node

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step: micro batch x accumulation x world size (DeepSpeed's
        ``train_batch_size``; the data module's samples per step)."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.world_size

    def describe(self) -> str:
        """``"2 node(s) x 4 gpu rank(s) = world size 8"``; elastic: ``"2..4 node(s) x 4 gpu
        rank(s) = world size 8..16 (elastic)"``."""
        if self.min_nodes is not None:
            return (f"{self.min_nodes}..{self.num_nodes} node(s) x {self.devices_per_node} {self.accelerator} rank(s) = "
                    f"world size {self.min_nodes * self.devices_per_node}..{self.world_size} (elastic)")
        return (f"{self.num_nodes} node(s) x {self.devices_per_node} {self.accelerator} rank(s) = "
                f"world size {self.world_size}")
