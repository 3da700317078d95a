"""``jobgen profiles list|show`` (cluster profiles, ``extends:`` resolved), ``jobgen profiles detect``
(a profile from a SLURM login node or from hosts over ssh) and ``jobgen schema`` (the JSON Schema
of a spec, a profile or jobgen.yaml)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import yaml

from jobgen.cli.options import profiles_dir_option
from jobgen.cli.output import JobgenGroup, echo_doc, echo_progress, output_option
from jobgen.errors import ConfigError, JobgenError, printable
from jobgen.specs.file_schema import KINDS, file_schema
from jobgen.specs.load import list_profile_names, load_profile, load_profile_doc
from jobgen.specs.profile import GPU_COMPUTE_CAPABILITY, PROFILE_FILE_CONTEXT


@click.group(cls=JobgenGroup)
def profiles() -> None:
    """List, show and detect cluster profiles (inheritance resolved)."""


@profiles.command("list")
@output_option()
@profiles_dir_option
def profiles_list(output: str, profiles_dir: str | None) -> None:
    """List every profile visible through the lookup order, with its scheduler and nodes; a
    profile with example values to replace (``placeholders:``) says how many."""
    rows = []
    for name in list_profile_names(profiles_dir):
        try:
            p = load_profile(name, profiles_dir)
        except JobgenError as exc:
            rows.append({"name": name, "error": exc.message.splitlines()[0]})
            continue
        rows.append({"name": name, "scheduler": p.scheduler, "max_nodes": p.max_nodes, "gpus_per_node": p.gpus_per_node,
                     "gpu_type": p.gpu_type, "cpu_processes_per_node": p.cpu_processes_per_node, "description": p.description,
                     "example_values": sorted(p.placeholders)})
    if output == "json":
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    for row in rows:
        if "error" in row:
            click.echo(f"{row['name']:16} (invalid: {row['error']})")
            continue
        shape = f"{row['gpus_per_node']}x {row['gpu_type']}" if row["gpus_per_node"] else f"{row['cpu_processes_per_node']} CPU rank(s)"
        example = f"  [example: {len(row['example_values'])} value(s) to set]" if row["example_values"] else ""
        click.echo(f"{row['name']:16} {row['scheduler']:10} up to {row['max_nodes']} node(s) of {shape:14} {row['description']}{example}")


@profiles.command("show")
@click.argument("name")
@output_option("text", "yaml", "json", yaml_help="a profile file jobgen reads (with `extends:` resolved)")
@profiles_dir_option
def profiles_show(name: str, output: str, profiles_dir: str | None) -> None:
    """Show profile NAME with `extends:` resolved and defaults filled in: text (one line per
    field, by its dotted path, as --set and the reference (docs/reference/) name it), yaml (a profile file
    you can copy) or json. The example values still in force end it, under ``placeholders``:
    a copy keeps them marked."""
    _, path = load_profile_doc(name, profiles_dir)
    profile = load_profile(name, profiles_dir)
    resolved = profile.model_dump(mode="json", context=PROFILE_FILE_CONTEXT)
    if profile.placeholders:
        resolved["placeholders"] = {key: profile.placeholders[key].reason for key in sorted(profile.placeholders)}
    if output == "json":
        echo_doc(resolved)
        return
    click.echo(f"# {path}")
    if output == "yaml":
        click.echo(yaml.safe_dump(resolved, sort_keys=False), nl=False)
        return
    fields = dict(_flatten(resolved))
    width = max(map(len, fields))
    for key, value in fields.items():
        click.echo(f"{key:{width}}  {value}")


def _detect_slurm(*, partition: str | None, gpu_type: str | None, name: str | None, **_: Any) -> Any:
    from jobgen.backends.slurm.detect import detect_slurm  # runs SLURM commands: off every other command's path

    return detect_slurm(partition=partition, gpu_type=gpu_type, name=name)


def _detect_kubernetes(*, context: str | None, namespace: str | None, gpu_type: str | None, name: str | None, **_: Any) -> Any:
    from jobgen.backends.kubernetes.detect import connect_and_detect  # the kubernetes client: off every other command's path

    return connect_and_detect(context=context, namespace=namespace, gpu_type=gpu_type, name=name)


def _detect_ssh(*, hosts: tuple[str, ...], python: str | None, overrides: tuple[str, ...], gpu_type: str | None, name: str | None,
                **_: Any) -> Any:
    from jobgen.backends.ssh.detect import detect_ssh  # runs ssh: off every other command's path

    return detect_ssh(hosts=hosts, python=python, overrides=overrides, gpu_type=gpu_type, name=name)


#: ``profiles detect --scheduler`` -> the detection of that backend (each imports its backend module only when called).
_DETECT = {"slurm": _detect_slurm, "kubernetes": _detect_kubernetes, "ssh": _detect_ssh}


@profiles.command("detect")
@click.option("--scheduler", type=click.Choice(list(_DETECT)), required=True,
              help="The scheduler to ask (slurm: run on a login node, where sinfo, scontrol and sacctmgr work; "
                   "kubernetes: the API server of a kubeconfig context; ssh: the --host machines, over ssh).")
@click.option("--partition", default=None, metavar="NAME",
              help="slurm: the partition to profile (default: the only GPU partition, else the only partition).")
@click.option("--gpu-type", type=click.Choice(list(GPU_COMPUTE_CAPABILITY)), default=None,
              help="The GPU model, for GPUs whose GRES type and features (kubernetes: nvidia.com/gpu.product label; "
                   "ssh: nvidia-smi's name) name none (gpu:8), or to take that model's nodes in a mixed partition or cluster.")
@click.option("--context", default=None, metavar="NAME",
              help="kubernetes: the kubeconfig context to read (default: $JOBGEN_K8S_CONTEXT, else the current context).")
@click.option("--namespace", default=None, metavar="NAME",
              help="kubernetes: the namespace jobs go to (default: $JOBGEN_K8S_NAMESPACE, else the context's, else default).")
@click.option("--host", "hosts", multiple=True, metavar="USER@HOST[:PORT]",
              help="ssh: a machine to profile (repeatable, in node-rank order; USER@ and :PORT optional, the same for every host).")
@click.option("--python", default=None, metavar="PATH",
              help="ssh: the Python interpreter on every host (ssh.python; default python3).")
@click.option("--profile-set", "profile_overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="ssh: a profile field to set, e.g. --profile-set ssh.identity_file=~/.ssh/lab_key (repeatable; "
                   "ssh.* fields also reach the hosts: workdir, known_hosts, options).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The profile file to write (default: cluster_profiles/<cluster>-<partition>.yaml; kubernetes: "
                   "cluster_profiles/<context>-<namespace>.yaml; ssh: cluster_profiles/ssh-<first host>.yaml); "
                   "its name (without .yaml) is the profile's name.")
@click.option("--force", is_flag=True, help="Overwrite FILE when it exists.")
@output_option("text", "yaml", "json", yaml_help="the profile file, printed instead of written")
def profiles_detect(scheduler: str, partition: str | None, gpu_type: str | None, context: str | None, namespace: str | None,
                    hosts: tuple[str, ...], python: str | None, profile_overrides: tuple[str, ...], out_file: str | None,
                    force: bool, output: str) -> None:
    """Write a cluster profile from what this SLURM login node's commands say, what a
    Kubernetes API server says, or what the hosts say over ssh.

    \b
    Reads: the SLURM version (sinfo --version), ClusterName and SelectType (scontrol show
    config), the partitions and their nodes' CPUs, memory, GRES (GPU type and count),
    features, MaxTime and DefaultTime (sinfo --json from SLURM 21.08, else sinfo's text),
    and your accounts and QOS (sacctmgr; skipped with a comment without slurmdbd).
    The version and SelectType decide the GPU request jobgen renders (--gpus-per-node on
    SLURM >= 19.05 with select/cons_tres, else --gres). Each value of the file carries a
    comment naming its source. The profile is validated before it is written; an existing
    file is kept unless --force. Several GPU partitions: an error listing them (choose one
    with --partition; run detect once per partition, each with its own --out).

    \b
    Kubernetes reads, from the API server of --context: the server version, the nodes'
    allocatable nvidia.com/gpu, CPU and memory and GPU feature discovery's product and memory
    labels, taints and RDMA resources, the operator CRDs (PyTorchJob, TrainJob), the namespace's
    ReadWriteMany claims, the PriorityClasses and Kueue LocalQueues. The image cannot be read:
    the file keeps an example under placeholders:, which jobgen submit refuses until you set it.

    \b
    Example:
      jobgen profiles detect --scheduler slurm --partition gpu
      jobgen validate examples/quickstart.yaml --profile cluster_profiles/<cluster>-gpu.yaml
      jobgen profiles detect --scheduler kubernetes --context prod --namespace training

    \b
    ssh: one ssh round trip per host (BatchMode) reads its CPUs (nproc), memory (MemTotal),
    GPUs (nvidia-smi), and whether --python imports jobgen.train, torch and lightning. The
    profile takes the fewest CPUs, memory and GPUs across the hosts. Example:
      jobgen profiles detect --scheduler ssh --host alice@node1 --host alice@node2 --python /opt/venv/bin/python
    """
    if out_file is not None and output != "text":
        raise click.UsageError("-o json|yaml prints the profile instead of writing it; leave out --out FILE, or -o")
    applies = {"--partition": ("slurm",), "--context": ("kubernetes",), "--namespace": ("kubernetes",),
               "--host": ("ssh",), "--python": ("ssh",), "--profile-set": ("ssh",)}
    given = {"--partition": partition, "--context": context, "--namespace": namespace, "--host": hosts,
             "--python": python, "--profile-set": profile_overrides}
    wrong = [flag for flag, value in given.items() if value and scheduler not in applies[flag]]
    if wrong:
        raise click.UsageError(f"{', '.join(wrong)} does not apply to --scheduler {scheduler}")
    name = Path(out_file).stem if out_file else None
    found = _DETECT[scheduler](partition=partition, context=context, namespace=namespace, hosts=hosts, python=python,
                               overrides=profile_overrides, gpu_type=gpu_type, name=name)
    for note in found.notes:
        echo_progress(f"note: {printable(note)}", err=True)
    if output == "json":
        echo_doc(found.as_json())
        return
    text = found.yaml_text()
    if output == "yaml":
        click.echo(text, nl=False)
        return
    path = Path(out_file) if out_file else Path("cluster_profiles") / f"{found.name}.yaml"
    if path.exists() and not force:
        raise ConfigError(f"{path} exists; jobgen does not overwrite a profile", location="--out",
                          hint="pass --force to overwrite it, or --out OTHER.yaml (or -o yaml to print the profile)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    shape = f"{found.doc['gpus_per_node']}x {found.doc['gpu_type']}" if found.doc["gpus_per_node"] else "CPU-only"
    click.echo(f"wrote {path}: profile {found.name} ({found.scope}, {found.doc['max_nodes']} node(s), {shape})")
    if found.doc.get("placeholders"):  # example values (kubernetes.image) that jobgen submit refuses
        click.echo(f"next: set {', '.join(found.doc['placeholders'])} (placeholders:), then jobgen doctor --profile {path}")
    else:
        click.echo(f"next: jobgen validate examples/quickstart.yaml --profile {path}")


def _flatten(doc: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted.path, value)`` of every leaf of ``doc`` in order; lists and empty mappings as
    compact JSON, None as ``null``."""
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value if isinstance(value, str) else json.dumps(value)


@click.command()
@click.argument("kind", type=click.Choice(KINDS))
@output_option("json", "yaml", yaml_help="the same schema in YAML")
def schema(kind: str, output: str) -> None:
    """Print the JSON Schema of a training spec, a cluster profile or jobgen.yaml file (for editors).

    The profile schema describes a profile file as written: no `name` (the file name is the
    profile's name), and `extends: <profile>` allowed, whose file gives only what it changes.

    \b
    Example (VS Code YAML extension):
      jobgen schema spec > spec.schema.json
    """
    doc = file_schema(kind)
    if output == "yaml":
        click.echo(yaml.safe_dump(doc, sort_keys=True), nl=False)
        return
    echo_doc(doc)
