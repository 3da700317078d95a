"""What every backend shares: the Backend protocol, job handles, and the common files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from jobgen import __version__, deepspeed
from jobgen.errors import ConfigError
from jobgen.nccl import nccl_env
from jobgen.plan import JobPlan, PlanContext, resolved_spec_doc
from jobgen.render import render_template

SPEC_FILE = "spec.json"
DS_CONFIG_FILE = "ds_config.json"


class Backend(Protocol):
    """A scheduler backend module (slurm, kubernetes, local)."""

    def plan(self, ctx: PlanContext) -> JobPlan:
        """Turn validated inputs into a JobPlan. Pure: no subprocess, network, clock."""
        ...

    def submit(self, plan: JobPlan, job_dir: Path) -> JobHandle:
        """Submit a written plan from ``job_dir``; never mutates ``plan``."""
        ...


_HANDLE_RE = re.compile(r"^(slurm|k8s|local)://(.+)$")


@dataclass(frozen=True)
class JobHandle:
    """A submitted job as a URI: ``slurm://<cluster>/<jobid>``, ``k8s://<context>/<ns>/<name>``,
    ``local://<run dir>``."""

    scheme: str
    path: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.path}"

    @classmethod
    def parse(cls, text: str) -> JobHandle:
        """Parse a handle URI.

        Raises:
            ConfigError: not of the form ``slurm://...``, ``k8s://...`` or ``local://...``.
        """
        match = _HANDLE_RE.match(text)
        if not match:
            raise ConfigError(
                f"{text!r} is not a job handle",
                hint="handles look like slurm://<cluster>/<jobid>, k8s://<context>/<ns>/<name> or local://<run dir>",
            )
        return cls(match.group(1), match.group(2))


def common_files(ctx: PlanContext, *, requeue_signal: str | None = None) -> list[tuple[str, str]]:
    """``spec.json`` (the resolved spec the entrypoint reads) and, for DeepSpeed, ``ds_config.json``."""
    files = []
    ds_name = None
    if ctx.spec.trainer.deepspeed_stage is not None:
        ds_name = DS_CONFIG_FILE
        files.append((DS_CONFIG_FILE, deepspeed.dumps(deepspeed.deepspeed_config(ctx.spec, ctx.world.world_size))))
    files.append((SPEC_FILE, resolved_spec_doc(ctx, deepspeed_config=ds_name, requeue_signal=requeue_signal)))
    return sorted(files)


def render_job_template(ctx: PlanContext, template: str, **context: Any) -> str:
    """Render ``template`` with the header fields every generated file names (jobgen version,
    profile, inputs sha256) plus ``context``."""
    return render_template(
        ctx.templates_dir, template, version=__version__, profile=ctx.profile.name, inputs_sha256=ctx.inputs_sha256, **context
    )


def job_env(ctx: PlanContext) -> dict[str, str]:
    """Environment for every rank: NCCL preset < profile env < spec env, sorted by name."""
    env = {
        **nccl_env(ctx.profile.network_fabric, uses_nccl=ctx.world.accelerator == "gpu"),
        **ctx.profile.env,
        **ctx.spec.env,
    }
    return dict(sorted(env.items()))
