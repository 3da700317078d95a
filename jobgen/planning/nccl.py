"""Network fabric -> NCCL / libfabric environment presets.

The presets hold what a fabric needs on almost every site; site specifics (HCA names,
interface names) go in a profile's ``env``, which wins over the preset. Sources: NCCL's
environment-variable documentation (NCCL_IB_*, NCCL_SOCKET_IFNAME), AWS's EFA guide for
FI_* variables, PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING (fail fast instead of hanging).
"""

from __future__ import annotations

_COMMON = {
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_SOCKET_IFNAME": "^lo,docker0",
}

_PRESETS: dict[str, dict[str, str]] = {
    "infiniband": {"NCCL_IB_DISABLE": "0"},
    "roce": {"NCCL_IB_DISABLE": "0", "NCCL_IB_GID_INDEX": "3"},
    "efa": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1", "NCCL_IB_DISABLE": "1"},
    "tcp": {"NCCL_IB_DISABLE": "1"},
}


def nccl_env(fabric: str, *, uses_nccl: bool) -> dict[str, str]:
    """Environment variables for ``fabric`` (``infiniband | roce | efa | tcp``), sorted by name.

    Returns an empty mapping when the job does not use NCCL (CPU/gloo runs).

    Raises:
        KeyError: an unknown fabric (profiles validate the name first).
    """
    if not uses_nccl:
        return {}
    env = {**_COMMON, **_PRESETS[fabric]}
    return dict(sorted(env.items()))
