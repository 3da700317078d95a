"""jobgen: cluster profile + training spec -> ready-to-run distributed training jobs.

Importing the package is cheap (no torch, lightning, deepspeed or kubernetes): the render
path must start fast.
"""

__version__ = "0.1.0"
