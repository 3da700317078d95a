"""The ``handle`` of the entrypoint's notification bodies on each backend
(:func:`jobgen.events.notifier.job_handle`), from the environment a rank sees: on hosts over ssh,
the job's tag (:data:`jobgen.jobdir.SSH_JOB_ENV`, ``<handle>#node-<rank>``) that every process a
launch starts inherits; hostile values of it give ``null``, never a traceback. The real launches
carrying the tag: tests/integration/ssh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen import api
from jobgen.backends.ssh.launch import handle_for, job_tag
from jobgen.events.notifier import Notifier, job_handle
from jobgen.jobdir import SSH_JOB_ENV
from tests.conftest import EXAMPLES, site_profile


@pytest.fixture(scope="module")
def ssh_plan(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("notify-handle")
    spec = tmp_path / "quickstart.yaml"
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text() + "notify: {command: [cat]}\n")
    return api.plan_job(spec, str(site_profile(tmp_path / "site", "ssh-2node")))


@pytest.mark.parametrize("rank", [0, 1, 12])
def test_an_ssh_ranks_body_carries_the_handle_submit_printed(ssh_plan, rank):
    """Every node's tag holds the handle before ``#node-<rank>``: each node's rank zero names the
    job as ``jobgen submit`` printed it (what ``jobgen status`` takes)."""
    handle = handle_for(ssh_plan.resolved.launch.ssh, "quickstart")
    environ = {SSH_JOB_ENV: job_tag(handle, rank)}
    assert job_handle(ssh_plan.resolved, Path("/run"), environ) == str(handle) == "ssh://node1.example.org/srv/jobgen-runs/quickstart"
    body = Notifier(ssh_plan.resolved.spec.notify, ssh_plan.resolved, "/run", environ).body("started")
    assert json.loads(json.dumps(body))["handle"] == str(handle)


def test_the_tag_the_launch_sets_gives_back_the_handle_whatever_the_workdir(ssh_plan):
    """The tag as :func:`jobgen.backends.ssh.launch.job_tag` writes it for run directories with
    blanks, quotes, ``#node-`` inside and non-ASCII letters (a workdir takes any characters but
    newlines): the part before the last ``#node-<rank>`` is the handle."""
    from jobgen.specs.profile import SshSettings

    for workdir in ("/srv/runs with 'quotes' and \"double\"", "/srv/a#node-3/runs", "~/jöbs\tand tabs", "/" + "x" * 300):
        settings = SshSettings(hosts=("node1.example.org", "node2"), workdir=workdir)
        handle = handle_for(settings, "quickstart")
        for rank in (0, 1):
            assert job_handle(ssh_plan.resolved, Path("/run"), {SSH_JOB_ENV: job_tag(handle, rank)}) == str(handle), workdir


@pytest.mark.parametrize("value", [
    "",  # empty
    "ssh://node1/srv/runs/quickstart",  # no #node- suffix
    "ssh://node1/srv/runs/quickstart#node-",  # no rank
    "ssh://node1/srv/runs/quickstart#node-x1",
    "ssh://node1/srv/runs/quickstart#node-1 ",
    "#node-0",  # nothing before the suffix
    "ssh://#node-0",
    "local:///srv/runs/quickstart#node-0",  # another backend's scheme
    "slurm://lab/42#node-0",
    "not a handle at all#node-0",
    "ssh://node1/srv/runs\nquickstart#node-0",  # a line break: no workdir holds one
    "ssh://node1/srv/runs/\x00#node-0",
    "ssh://node1/srv/runs/\udcff\udcfe#node-0",  # non-UTF-8 bytes, as os.environ decodes them
    "ssh://node 1/srv/runs#node-0",  # a host name never holds a blank
    "ssh://" + "x" * 300 + "#node-0",  # no run directory
])
def test_a_tag_that_is_not_an_ssh_jobs_gives_null(ssh_plan, value):
    environ = {SSH_JOB_ENV: value}
    assert job_handle(ssh_plan.resolved, Path("/run"), environ) is None
    body = Notifier(ssh_plan.resolved.spec.notify, ssh_plan.resolved, "/run", environ).body("started")
    assert body["handle"] is None
    json.dumps(body)  # the body is sent as JSON


def test_without_the_tag_an_ssh_body_has_no_handle_and_other_backends_ignore_it(ssh_plan, tmp_path):
    assert job_handle(ssh_plan.resolved, Path("/run"), {}) is None
    spec = tmp_path / "quickstart.yaml"
    spec.write_text((EXAMPLES / "quickstart.yaml").read_text())
    local = api.plan_job(spec, "local")
    tag = {SSH_JOB_ENV: "ssh://node1/srv/runs/quickstart#node-0"}
    assert job_handle(local.resolved, tmp_path / "run", tag) == f"local://{tmp_path / 'run'}"
