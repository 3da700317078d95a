"""The bundled training entrypoint: ``python -m jobgen.train --spec spec.json``.

Modules (torch and Lightning are imported only by the ones marked *):

- ``__main__``: command line, input checks, exit codes, launch lines per topology.
- ``resolved``: the resolved spec file (TrainingSpec + launch facts) and its checks.
- ``sources``: training files -> ``train.bin`` / ``val.bin`` (deterministic block split).
- ``data`` *: byte-window datasets and the LightningDataModule.
- ``model`` *: the byte-level GPT and its LightningModule.
- ``checkpoints`` *, ``callbacks`` *: resume discovery, step checkpoints, progress, throughput.
- ``run`` *: Trainer construction, fit, final validation, ``summary.json``.
"""
