"""The SLURM backend: :class:`~jobgen.backends.slurm.backend.SlurmBackend` submits a rendered
``job.sbatch`` with sbatch and reads a job's status, output and failures from squeue, accounting,
the job-completion log and its output file. The batch script is planned in
:mod:`~jobgen.backends.slurm.script` (a sweep as a job array: :mod:`~jobgen.backends.slurm.array`);
``jobgen profiles detect`` reads the cluster in :mod:`~jobgen.backends.slurm.detect`.

Modules are imported only when used: importing this package imports none of them.
"""
