"""The rendered tree under manifests/: desired state vs disk, render --all/--check, committing."""
