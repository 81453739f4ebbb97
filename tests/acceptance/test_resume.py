"""A dead workflow repaired with a real worker process (docs/durable.md, "Repairing a dead
workflow"): its child fails for good, the parent dies of ChildFailed and says so; the cause is
fixed, ``manage.py xjobs resume ID`` runs the child again and the parent goes on from its
recorded steps. The console's action and the refusals: tests/integration/test_resume.py."""

from __future__ import annotations

import json
from io import StringIO

import pytest

from .conftest import effects, wait_log, wait_state

pytestmark = pytest.mark.acceptance


def test_a_workflow_dead_of_its_child_is_resumed_once_the_cause_is_fixed(start_worker):
    from django.core.management import call_command

    from django_xjobs.models import Job
    from tests.testapp import jobs
    from tests.testapp.models import Effect

    Effect.objects.create(job_id="flag", name="flag", attempt=0, pid=0, kind="decline", tag="42")
    parent = jobs.checkout.enqueue(order=42)
    worker = start_worker("one")
    dead = wait_state(parent.id, "dead")
    (child,) = Job.objects.filter(parent_id=parent.id)
    assert child.state == "dead"
    told = f"ChildFailed in step 'charge': child 0 (testapp.charge_card {child.id}) ended dead: " \
           "django_xjobs.exceptions.PermanentError: amount over the card limit"
    # The worker's ERROR line, `xjobs show` and `xjobs why` name the parent's own ChildFailed.
    said = "django_xjobs.exceptions.ChildFailed: child 0 of step 'charge' (testapp.charge_card"
    assert any(str(parent.id) in line and said in line  # the line, not only its traceback
               for line in wait_log(worker, said).splitlines())
    shown = StringIO()
    call_command("xjobs", "show", str(parent.id), stdout=shown)
    assert f"diagnosis: Dead after attempt 1 of 2: {told}" in shown.getvalue()
    why = StringIO()
    call_command("xjobs", "why", str(parent.id), "--json", stdout=why)
    assert json.loads(why.getvalue())["diagnosis"][0] == f"Dead after attempt 1 of 2: {told}"

    Effect.objects.filter(kind="decline").delete()  # the cause, fixed
    out = StringIO()
    call_command("xjobs", "resume", str(parent.id), stdout=out)
    assert out.getvalue().splitlines()[1:] == [
        f"  step 'charge' waits again; child job(s) retried: {child.id}"]

    done = wait_state(parent.id, "done")
    assert done.result == {"charged": {"charged": 42}}
    assert (done.run_id, wait_state(child.id, "done").attempt) == (dead.run_id, 1)
    # the child ran again; the parent's steps ran once each, the one before the child included
    assert len(effects(child.id, "charge")) == 2
    assert [e.tag for e in effects(parent.id, "step")] == ["reserve", "ship"]
