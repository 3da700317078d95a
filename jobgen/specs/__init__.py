"""What a user writes: the training spec and cluster profile models, their loading, the project file and sweeps."""
