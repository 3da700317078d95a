"""A tiny LightningCLI script for jobgen's command mode (``entrypoint.lightning_cli: true``).

jobgen appends ``--trainer.num_nodes``, ``--trainer.devices``, ``--trainer.accelerator``,
``--trainer.strategy`` and ``--trainer.precision`` from the world it launches, so the script
itself says nothing about the cluster:

    python examples/scripts/lightning_cli.py fit --config examples/scripts/lightning_cli.yaml
    jobgen submit examples/command-lightning-cli.yaml --profile local

The model is Lightning's BoringModel (a 32 -> 2 linear layer on random data); the run prints
the world the Trainer sees from every rank. Outputs go to ``$RUN_DIR`` (the job's run directory,
set by jobgen) or the working directory.
"""

from __future__ import annotations

import os
import sys

import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel


class WorldReportingModel(BoringModel):
    """BoringModel that prints the Trainer's world when fitting starts."""

    def on_fit_start(self) -> None:
        t = self.trainer
        print(f"lightning: global rank {t.global_rank} of world size {t.world_size}, num_nodes {t.num_nodes}, "
              f"devices {t.num_devices}, strategy {type(t.strategy).__name__}, precision {t.precision}, "
              f"environment {type(t.strategy.cluster_environment).__name__}", flush=True)

    def on_fit_end(self) -> None:
        print(f"lightning: global rank {self.trainer.global_rank} finished at step {self.trainer.global_step}", flush=True)


def main() -> None:
    LightningCLI(WorldReportingModel, BoringDataModule, save_config_callback=None,
                 trainer_defaults={"default_root_dir": os.environ.get("RUN_DIR", ".")})
    # Lightning leaves the process group up after fit: take it down while Python is still whole.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without interpreter teardown: a gloo worker thread that drops its last collective's
    # tensors while Python finalises ends in std::terminate ("terminate called without an active
    # exception") after a complete run (README, "Command mode"; examples/scripts/ddp_allreduce.py).
    # Lightning has closed its loggers and checkpoints when fit returns; an exception above still
    # exits the normal way, with its traceback and exit code 1.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
