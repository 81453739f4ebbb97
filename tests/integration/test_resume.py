"""The resume of a dead workflow (docs/durable.md, "Repairing a dead workflow"): from the
console (its permission, confirmation, message and admin log), down a tree of workflows, and
what it refuses. Jobs run through ``drain()``, the worker loop in this process; the resume
with a worker subprocess and ``manage.py xjobs resume ID`` is tests/acceptance/test_resume.py.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from django_xjobs import api, conf
from django_xjobs.console.reads.jobs import diagnose, run_steps
from django_xjobs.console.reads.text import db_now, error_summary
from django_xjobs.exceptions import JobNotFound
from django_xjobs.maintenance import pruner
from django_xjobs.models import Job, JobStep
from django_xjobs.testing import drain
from django_xjobs.values import error_line
from tests.console_data import job_in_state
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = reverse("admin:django_xjobs_job_changelist")


def row(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def decline(*orders) -> None:
    """The cause the operator fixes: while its flag row exists, an order's charge fails."""
    for order in orders:
        Effect.objects.create(job_id="flag", name="flag", attempt=0, pid=0, kind="decline",
                              tag=str(order))


def fix(*orders) -> None:
    Effect.objects.filter(kind="decline", tag__in=[str(o) for o in orders]).delete()


def ran(kind: str, tag) -> int:
    return Effect.objects.filter(kind=kind, tag=str(tag)).count()


def children(parent_id) -> list[Job]:
    return list(Job.objects.filter(parent_id=parent_id).order_by("input__order"))


def in_x_jobs(ids) -> int:
    """How many of the jobs ``ids`` are in x_jobs itself (not in a history table)."""
    with connection.cursor() as cursor:
        cursor.execute("select count(*) from only x_jobs where id = any(%s)", [list(ids)])
        return cursor.fetchone()[0]


def user_with(client, *codenames: str) -> User:
    user = User.objects.create_user(f"ops-{uuid.uuid4().hex[:6]}", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_xjobs", codename__in=["view_job", *codenames]))
    client.force_login(user)
    return user


def test_the_console_resumes_a_dead_gather_for_a_user_with_its_permission(client):
    decline(1, 3)
    parent = jobs.checkout.enqueue(order=9, orders=[1, 2, 3])
    drain()
    dead = row(parent.id)
    one, two, three = children(parent.id)
    assert (dead.state, one.state, two.state, three.state) == ("dead", "dead", "done", "dead")
    # The parent's page names its own exception, the step and the first failed child, linked.
    user_with(client)
    page = client.get(reverse("admin:django_xjobs_job_change", args=[parent.id])).content.decode()
    assert (f"Dead after attempt 1 of 2: ChildFailed in step &#x27;charge&#x27;: child 0 "
            f'(testapp.charge_card <a href="../../{one.id}/change/" class="xjobs-child">'
            f"{one.id}</a>) ended dead: django_xjobs.exceptions.PermanentError: amount over the "
            "card limit") in page
    assert "Resume workflow (`manage.py xjobs resume" in page

    # Without its own permission (retry's is not it) the action is refused; nothing changes.
    data = {"action": "resume_workflows", "_selected_action": [str(parent.id)], "post": "yes"}
    user_with(client, "retry_job")
    assert client.post(JOBS, data).status_code == 403
    assert row(parent.id).state == "dead"

    fix(1, 3)
    user = user_with(client, "resume_job")
    page = client.get(reverse("admin:django_xjobs_job_change", args=[parent.id])).content.decode()
    assert 'value="Resume workflow…" id="xjobs-action-resume_workflows"' in page
    confirm = client.post(JOBS, {k: v for k, v in data.items() if k != "post"})
    assert "the failed invoke or gather step waits for it again" in confirm.content.decode()
    assert row(parent.id).state == "dead"  # the confirmation page changes nothing
    response = client.post(JOBS, data)
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert message == "Resumed 1 job."
    who = f"admin:{user.username}"
    (entry,) = LogEntry.objects.filter(object_id=str(parent.id))
    assert (entry.user_id, entry.action_flag, entry.change_message) == (
        user.pk, CHANGE, f"Workflow resumed by {who}")
    resumed = row(parent.id)
    assert (resumed.state, resumed.attempt, resumed.enqueued_by) == ("ready", 0, who)
    assert [(c.state, c.attempt) for c in children(parent.id)] == [
        ("ready", 0), ("done", 1), ("ready", 0)]
    step = JobStep.objects.get(run_id=dead.run_id, name="charge")
    assert (step.status, step.pending, step.output) == (
        "invoking", 2, {"children": [str(c.id) for c in (one, two, three)]})

    drain()
    done = row(parent.id)
    assert done.state == "done", done.last_error
    assert done.result == {"charged": [{"charged": 1}, {"charged": 2}, {"charged": 3}]}
    # the failed children ran again, the one that had succeeded did not, nor did either step
    assert (ran("charge", 1), ran("charge", 2), ran("charge", 3)) == (2, 1, 2)
    assert Effect.objects.filter(job_id=str(parent.id), kind="step").count() == 2


def test_a_resume_goes_down_to_a_child_that_is_a_dead_workflow_itself_archived_or_not():
    decline(7)
    top = jobs.checkout_batch.enqueue(order=7)
    drain()
    (middle,) = children(top.id)
    (leaf,) = children(middle.id)
    assert [row(j.id).state for j in (top, middle, leaf)] == ["dead", "dead", "dead"]
    # The error a person reads first is the parent's own ChildFailed, naming the child's.
    assert error_summary(row(top.id).last_error).startswith(
        "django_xjobs.exceptions.ChildFailed: child 0 of step 'checkout'")
    line = error_line(row(top.id).last_error)
    assert line.startswith("django_xjobs.exceptions.ChildFailed: child 0 of step 'checkout' "
                           f"(testapp.checkout {middle.id}) ended dead: ")
    assert line.endswith(f"ended dead: django_xjobs.exceptions.ChildFailed: child 0 of step "
                         f"'charge' (testapp.charge_card {leaf.id}) ended dead: "
                         "django_xjobs.exceptions.PermanentError: amount over the card limit")

    # The family finished an hour ago and moved to the history tables (docs/design.md, "History
    # tables"): the resume brings back what it changes.
    Job.objects.filter(id__in=[top.id, middle.id, leaf.id]).update(
        finished_at=db_now() - timedelta(hours=1))
    family = [top.id, middle.id, leaf.id]
    assert pruner.archive(settings=conf.build({**settings.XJOBS, "ARCHIVE_AFTER": "1m"})) == 3
    assert in_x_jobs(family) == 0

    fix(7)
    result = api.resume(top.id)
    assert result.changed
    assert [(r.job_id, r.step, r.retried) for r in result.reopened] == [
        (top.id, "checkout", (middle.id,)), (middle.id, "charge", (leaf.id,))]
    assert in_x_jobs(family) == 3  # back in x_jobs, steps and all
    drain()
    assert row(top.id).state == "done"
    assert row(top.id).result == {"charged": {"charged": 7}}
    assert (ran("charge", 7), ran("step", "reserve"), ran("step", "ship")) == (2, 1, 1)


def test_resume_refuses_what_is_not_a_dead_workflow():
    out = StringIO()
    unknown = uuid.uuid4()
    with pytest.raises(JobNotFound):
        api.resume(unknown)
    with pytest.raises(CommandError, match=f"no job with id {unknown} .resume takes a dead "
                                           "workflow's job id .a UUID. or a paused queue"):
        call_command("xjobs", "resume", str(unknown))

    done = jobs.record.enqueue(tag="done")
    drain()
    result = api.resume(done.id)
    assert (result.changed, result.reason) == (
        False, "is done: only a dead workflow can be resumed")
    with pytest.raises(CommandError, match=r"resume: job .* \(testapp.record\) was not resumed: "
                                           "it is done: only a dead workflow can be resumed"):
        call_command("xjobs", "resume", str(done.id))

    stepless = job_in_state("dead")  # dead, but it recorded no step: no workflow to resume
    result = api.resume(stepless.id)
    assert not result.changed and "recorded no durable step" in result.reason
    assert row(stepless.id).state == "dead"
    lines = diagnose(row(stepless.id), run_steps(stepless.run_id), db_now())
    assert lines[-1] == "Retry gives it a fresh set of attempts, due now; completed steps are kept."

    call_command("xjobs", "resume", "no-such-queue", stdout=out)  # a name: the queue's resume
    assert out.getvalue().strip() == ("resume: queue no-such-queue was not paused (a dead "
                                      "workflow is resumed by its job id, a UUID)")
