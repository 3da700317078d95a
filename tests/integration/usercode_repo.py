"""The user-code project the user-code lab tests submit: the example package
``examples/usercode/tinychar`` (not jobgen's) and a spec naming its classes, committed to a
temporary git repository, so a code snapshot does not depend on the jobgen checkout's state."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
           "PATH": "/usr/bin:/bin"}

#: The user's spec: examples/usercode.yaml's classes, shrunk for 2 CPU ranks on 2 shared cores.
USER_SPEC = """\
name: {name}
code: {{python_path: usercode}}          # tinychar lives in <repo>/usercode
model:
  class_path: tinychar.CharModel
  init_args: {{d_model: 32, n_layer: 1, lr: 0.003}}
data:
  class_path: tinychar.CharDataModule
  init_args: {{block_size: 32}}
trainer: {{strategy: ddp, precision: 32-true, micro_batch_size: 8, max_steps: {max_steps}, val_check_interval: {every},
          limit_val_batches: 2, log_every_n_steps: 10}}
checkpoint: {{every_n_steps: {every}}}
resources: {{nodes: 2}}
"""


def git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout.strip()


def user_repo(root: Path, name: str, *, max_steps: int, every: int) -> tuple[Path, Path, str]:
    """A git repository holding the tinychar package (``usercode/``) and a spec naming its
    classes, committed; returns (repo, spec, HEAD)."""
    repo = root / "userrepo"
    shutil.copytree(REPO / "examples" / "usercode", repo / "usercode", ignore=shutil.ignore_patterns("__pycache__"))
    spec = repo / f"{name}.yaml"
    spec.write_text(USER_SPEC.format(name=name, max_steps=max_steps, every=every))
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tinychar and its spec")
    return repo, spec, git(repo, "rev-parse", "HEAD")
