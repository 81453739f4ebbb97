"""``manage.py xjobs check-deploy`` as a deploy runs it: a real worker suspends a durable run
with version A of its code, then the check, a process of its own, replays that run against
other versions (docs/durable.md, "The deploy check")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

from .conftest import effects, wait_effect, wait_state

pytestmark = pytest.mark.acceptance


def check_deploy(version: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py xjobs check-deploy ARGS`` in a process of its own, with the code of
    ``version`` installed (XJOBS_TEST_FLOW_VERSION picks the code of tests/testapp/jobs.py's
    deploy_flow)."""
    from django.db import connection

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT),
               XJOBS_TEST_DB_NAME=connection.settings_dict["NAME"],
               XJOBS_TEST_FLOW_VERSION=version)
    return subprocess.run([sys.executable, "-m", "django", "xjobs", "check-deploy", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_deploy_that_renames_a_recorded_step_fails_the_check_and_one_that_changes_only_the_tail_passes(  # noqa: E501
    start_worker,
):
    from django_xjobs.models import Job, JobStep
    from tests.testapp import jobs

    start_worker("deploy-a", env={"XJOBS_TEST_FLOW_VERSION": "A"})
    handle = jobs.deploy_flow.enqueue(nap=3600)
    wait_effect(handle.id, "step")  # step "a" ran...
    row = wait_state(handle.id, "suspended")  # ...and the run sleeps in "nap"
    recorded = list(JobStep.objects.filter(run_id=row.run_id).order_by("id")
                    .values_list("name", "status", "kind", "output"))
    assert recorded == [("a", "completed", "run", {"n": 1}), ("nap", "sleeping", "sleep", None)]

    renamed = check_deploy("B")
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    assert (f"DIVERGES  job {handle.id} (testapp.deploy_flow): step 1: recorded 'a' (run), "
            "the code reached 'a-renamed' (run)") in renamed.stdout

    as_json = check_deploy("B", "--json")
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert (report["checked"], report["diverging"]) == (1, 1)
    [verdict] = report["runs"]
    assert (verdict["job_id"], verdict["name"], verdict["position"], verdict["expected"],
            verdict["reached"]) == (str(handle.id), "testapp.deploy_flow", 1, "a", "a-renamed")

    tail = check_deploy("C")  # changes only what comes after "nap", and writes between steps
    assert tail.returncode == 0, tail.stdout + tail.stderr
    assert "none would take a different path" in tail.stdout

    unchanged = check_deploy("A")
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr

    # The replays changed nothing: the run still sleeps with the same record, step "a" ran
    # once (in the worker), and version C's write and enqueue between steps were rolled back.
    after = Job.objects.get(pk=handle.id)
    assert (after.state, after.run_at, after.attempt) == ("suspended", row.run_at, row.attempt)
    assert list(JobStep.objects.filter(run_id=row.run_id).order_by("id")
                .values_list("name", "status", "kind", "output")) == recorded
    assert [e.kind for e in effects(handle.id)] == ["step"]
    assert not Job.objects.filter(name="testapp.record").exists()


def test_a_parent_waiting_for_its_child_in_a_real_worker_passes_the_check(start_worker):
    from django_xjobs.models import JobStep
    from tests.testapp import jobs

    start_worker("deploy-parent", "--concurrency", "2")
    handle = jobs.parent_invoke.enqueue(n=3, seconds=60)
    row = wait_state(handle.id, "suspended")  # its child runs for a minute
    [waiting] = JobStep.objects.filter(run_id=row.run_id)
    assert (waiting.name, waiting.status, waiting.kind) == ("square", "invoking", "invoke")

    result = check_deploy("A", "--json", "--job", "testapp.parent_invoke")
    assert result.returncode == 0, result.stdout + result.stderr
    [verdict] = json.loads(result.stdout)["runs"]
    assert (verdict["job_id"], verdict["diverges"], verdict["recorded"]) == \
        (str(handle.id), False, 1)
