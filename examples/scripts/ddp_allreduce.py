"""A plain PyTorch DDP script (no Lightning, no jobgen import) for jobgen's command mode.

It reads its world from the standard variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK) through ``init_process_group(init_method="env://")``, prints them, checks an
all-reduce (the sum of rank + 1 over all ranks is world * (world + 1) / 2) and takes a few DDP
steps on a tiny linear model, then checks that every rank holds the same weights.

    torchrun --standalone --nproc-per-node 2 examples/scripts/ddp_allreduce.py --steps 3
    jobgen submit examples/command-ddp.yaml --profile local      # the same, launched by jobgen
    jobgen submit examples/command-ddp.yaml --profile slurm-cpu  # srun, one task per device

Exits 1 when a check fails. Ends with ``os._exit`` (see the end of the file for why).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="DDP optimizer steps")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    print(f"ddp: rank {rank} of world size {world}, local rank {local_rank}, node rank "
          f"{os.environ.get('NODE_RANK', os.environ.get('GROUP_RANK', '?'))}, master "
          f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}, cwd {os.getcwd()}", flush=True)

    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    print(f"ddp: rank {rank} all_reduce(sum of rank+1) = {value.item():g} (expected {expected:g})", flush=True)

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1).to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)  # a different batch on every rank
    for _ in range(args.steps):
        x = torch.randn(4, 8, generator=generator).to(device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    in_sync = all(torch.equal(gathered[0], w) for w in gathered)
    print(f"ddp: rank {rank} {args.steps} step(s), weights in sync across ranks: {in_sync}", flush=True)
    ok = value.item() == expected and in_sync
    del model, optimizer  # DDP's reducer holds the process group
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # Leave without interpreter teardown. A gloo worker thread can still hold the last collective's
    # work (here the all_gather's tensors) when Python starts finalising; dropping it then frees
    # their Python objects, which needs the GIL, and Python ends a thread that asks for the GIL while
    # finalising, inside the work's destructor: std::terminate, "terminate called without an active
    # exception", and SLURM marks the finished job FAILED (README, "Command mode"). Everything this
    # script writes is printed and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
