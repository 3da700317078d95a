"""The README is a contract: its test command is what CI runs, its reference is current."""

from __future__ import annotations

import re

from jobgen.reference import splice
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def fenced_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in fenced_commands() if "pytest" in c)
    assert test_command in (REPO / ".ci" / "run").read_text().splitlines()


def test_quickstart_command_pins_cpu_torch_and_runs_the_local_job():
    main = fenced_commands()[0]
    assert "torch==2.13.0" in main and "jobgen submit examples/quickstart.yaml --profile local" in main


def test_reference_is_current():
    assert splice(README) == README, "run: python -m jobgen.reference --write README.md"


def test_shipped_profiles_are_listed_in_readme():
    for profile in (REPO / "cluster_profiles").glob("*.yaml"):
        assert f"`{profile.stem}`" in README
