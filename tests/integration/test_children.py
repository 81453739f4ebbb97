"""Child jobs (ctx.step.invoke / gather) with the real worker loop on PostgreSQL.

The crash cases with worker subprocesses are in tests/acceptance/test_children_faults.py.
"""

from __future__ import annotations

import json
import re
import threading
from io import StringIO
from uuid import UUID

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_xjobs import api, cancel, faults
from django_xjobs.console.reads.jobs import diagnose, run_children, run_steps
from django_xjobs.console.reads.text import db_now
from django_xjobs.exceptions import InvalidJobInput, JobNotFound
from django_xjobs.models import Job, JobStep
from tests.conftest import raw_connection, wait_until
from tests.integration.test_steps import running_worker as steps_worker
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def running_worker(concurrency: int = 4, **options):
    """The steps tests' in-process worker with a short shutdown grace: children left running
    by a test (cancelled ones learn it at a heartbeat) do not hold its end for the default."""
    return steps_worker(concurrency, shutdown_grace=0.5, **options)


def row(handle_or_id) -> Job:
    return Job.objects.get(pk=getattr(handle_or_id, "id", handle_or_id))


def finished(handle, timeout=30.0) -> Job:
    return wait_until(lambda: (r := row(handle)).state in ("done", "dead", "cancelled") and r,
                      timeout=timeout, message=f"job {handle.id} to finish")


def children_of(handle) -> list[Job]:
    """The parent's children in the order its step recorded them (their ids, made in one
    millisecond, need not sort in that order)."""
    rows = {j.pk: j for j in Job.objects.filter(parent_id=handle.id)}
    order = [UUID(c) for s in JobStep.objects.filter(run_id=row(handle).run_id, kind="invoke")
             .order_by("id") for c in (s.output or {}).get("children", ())]
    return [rows[c] for c in order if c in rows]


def test_invoke_returns_the_childs_result_and_the_child_names_its_parent():
    parent = jobs.parent_invoke.using(tenant_id="acme").enqueue(n=4)
    with running_worker():
        done = finished(parent)
    assert done.state == "done", done.last_error
    assert done.result == {"got": {"n": 4, "square": 16}, "after": 17, "tenant": "acme"}
    [child] = children_of(parent)
    assert child.state == "done" and child.parent_step == "square"
    assert child.tenant_id == "acme"  # inherited
    assert child.enqueued_by == f"job:{parent.id}"
    step = JobStep.objects.get(run_id=done.run_id, name="square")
    assert step.kind == "invoke" and step.status == "completed"
    assert step.output["children"] == [str(child.id)]
    # the parent ran twice (before and after its child), its step's child once
    assert Effect.objects.filter(job_id=parent.id, kind="parent", tag="start").count() == 2
    assert Effect.objects.filter(kind="child").count() == 1


def test_the_parent_is_suspended_and_frees_its_worker_while_the_child_runs():
    parent = jobs.parent_invoke.enqueue(n=2, seconds=1.5)
    with running_worker(concurrency=2):
        wait_until(lambda: row(parent).state == "suspended", message="the parent to suspend")
        child = wait_until(lambda: (c := children_of(parent)) and c[0].state == "running"
                           and c[0], message="the child to run")
        assert row(parent).state == "suspended"
        step = JobStep.objects.get(run_id=row(parent).run_id, name="square")
        assert (step.status, step.pending) == ("invoking", 1)
        diagnosis = " ".join(diagnose(row(parent), run_steps(step.run_id), db_now()))
        assert "waiting for 1 child job(s) of step 'square'" in diagnosis
        done = finished(parent)
    assert done.state == "done"
    # woken by the child's settle, not by the hour's re-check
    assert done.finished_at < row(child.id).finished_at.replace(year=9999)
    assert (done.finished_at - row(child.id).finished_at).total_seconds() < 20


def test_a_child_that_dies_raises_child_failed_in_the_parent_after_its_attempts():
    parent = jobs.parent_invoke.enqueue(n=3, fail=True)
    with running_worker():
        done = finished(parent)
    [child] = children_of(parent)
    assert child.state == "dead" and child.attempt == 2  # the child's own max_attempts
    assert done.state == "done"
    assert done.result["state"] == "dead"
    assert done.result["child_id"] == str(child.id)
    assert "child 3 failed" in done.result["error"]
    assert "ended dead" in done.result["failed"]


def test_gather_fans_out_and_returns_results_in_order():
    parent = jobs.parent_gather.enqueue(count=12)
    with running_worker(concurrency=6):
        done = finished(parent)
    assert done.state == "done", done.last_error
    assert done.result == {"squares": [i * i for i in range(12)]}
    assert len(children_of(parent)) == 12


def test_gather_raises_child_failed_naming_the_first_failed_child():
    parent = jobs.parent_gather.enqueue(count=4, fail_at=2)
    with running_worker():
        done = finished(parent)
    assert done.state == "dead"  # ChildFailed is permanent: not caught by this parent
    assert "child 2 of step 'fan'" in done.last_error and "ended dead" in done.last_error


def test_an_async_parent_gathers_too():
    parent = jobs.parent_gather_async.enqueue(count=3)
    with running_worker():
        done = finished(parent)
    assert done.state == "done", done.last_error
    assert done.result == {"squares": [0, 1, 4]}


def test_a_timeout_cancels_the_children_still_running_and_fails_the_step():
    parent = jobs.parent_invoke.enqueue(n=5, seconds=30.0, timeout=1.0)
    with running_worker():
        done = finished(parent)
    [child] = children_of(parent)
    assert child.state == "cancelled"
    assert done.result["state"] == "timeout"
    assert "timed out" in (child.last_error or "")


def test_cancelling_the_parent_cancels_its_live_children_and_grandchildren():
    top = jobs.parent_of_parent.enqueue()
    with running_worker():
        middle = wait_until(lambda: (c := children_of(top)) and c[0], message="the child")
        grandchild = wait_until(lambda: (c := children_of(middle)) and c[0].state == "running"
                                and c[0], message="the grandchild to run")
        assert cancel(top.id, reason="no longer needed").changed
        for job in (top, middle, grandchild):
            wait_until(lambda job=job: row(job).state == "cancelled",
                       message=f"{job.id} to be cancelled")
    assert "no longer needed" in row(grandchild.id).last_error


def test_a_cancel_outside_the_callers_tenants_leaves_the_children_alone():
    parent = jobs.parent_invoke.using(tenant_id="acme").enqueue(n=2, seconds=30.0)
    with running_worker():
        child = wait_until(lambda: (c := children_of(parent)) and c[0], message="the child")
        with pytest.raises(JobNotFound):
            cancel(parent.id, tenant_ids=["globex"])
        assert row(parent).state == "suspended"
        assert row(child.id).state in ("ready", "running")
        assert cancel(parent.id, tenant_ids=["acme"]).changed
        assert row(child.id).state == "cancelled"


def test_bad_children_are_refused_before_anything_is_written():
    from django_xjobs.testing import make_context  # the test kit's context has no children
    ctx = make_context(jobs.parent_invoke)
    with pytest.raises(InvalidJobInput, match="need a worker"):
        ctx.step.invoke("x", jobs.child_square, {"n": 1})
    assert not Job.objects.filter(name=jobs.child_square.name).exists()


def test_the_console_links_a_parent_and_its_children_both_ways(admin_client):
    parent = jobs.parent_gather.using(tenant_id="acme").enqueue(count=3)
    with running_worker():
        done = finished(parent)
    kids = children_of(parent)
    page = admin_client.get(f"/admin/django_xjobs/job/{parent.id}/change/").content.decode()
    linked = re.findall(r'href="[^"]*/job/([0-9a-f-]{36})/change/" class="xjobs-child"', page)
    assert linked == [str(k.id) for k in kids] and done.state == "done"
    child_page = admin_client.get(f"/admin/django_xjobs/job/{kids[0].id}/change/")
    assert re.search(rf'href="[^"]*/job/{parent.id}/change/" class="xjobs-parent"',
                     child_page.content.decode())
    # another tenant's child of the same parent is left out for a scoped viewer
    Job.objects.filter(pk=kids[1].id).update(tenant_id="globex")
    with override_settings(XJOBS={"ADMIN_TENANT_SCOPE": lambda request: {"acme"}}):
        page = admin_client.get(f"/admin/django_xjobs/job/{parent.id}/change/").content.decode()
    linked = re.findall(r'/job/([0-9a-f-]{36})/change/" class="xjobs-child"', page)
    assert linked == [str(kids[0].id), str(kids[2].id)]
    assert "more</li>" not in page  # nor counted
    assert run_children(done.run_id, tenants={"acme"}, limit=1).total == 2


def test_xjobs_show_lists_the_children_and_names_the_parent():
    parent = jobs.parent_gather.enqueue(count=2)
    with running_worker():
        finished(parent)
    kids = children_of(parent)
    out = StringIO()
    call_command("xjobs", "show", str(parent.id), stdout=out)
    assert "children (2):" in out.getvalue()
    assert all(str(k.id) in out.getvalue() for k in kids)
    out = StringIO()
    call_command("xjobs", "show", str(kids[0].id), "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["parent_id"] == str(parent.id) and shown["parent_step"] == "fan"


def wait_blocked(pids: list[int], what: str) -> None:
    """Until the backend whose pid another thread puts in ``pids`` waits on a lock: read on a
    connection of its own, for the caller's is in the transaction that holds the lock (and
    pg_stat_activity stands still within a transaction)."""
    with raw_connection(autocommit=True) as watcher:
        def blocked() -> bool:
            found = pids and watcher.execute(
                "select wait_event_type from pg_stat_activity where pid = %s", [pids[0]]
            ).fetchone()
            return bool(found) and found[0] == "Lock"

        wait_until(blocked, message=what)


def test_a_child_finishing_between_the_parents_read_and_its_suspension_still_wakes_it():
    """The race of the rendezvous (docs/durable.md, "Child jobs"): the parent read its child as
    live and is about to suspend again when the child finishes. The child's settle waits for
    the parent's step row, then finds the parent suspended and wakes it at once."""
    parent = jobs.parent_gather.enqueue(count=1, queue="elsewhere")  # no worker runs the child
    settled = threading.Event()
    pids: list[int] = []

    def finish_the_child(point):
        def settle():
            with connections["default"].cursor() as cursor:  # its own connection, autocommit
                cursor.execute("select pg_backend_pid()")
                pids.append(cursor.fetchone()[0])
                cursor.execute("update x_jobs set state = 'done', result = '{\"square\": 0}', "
                               "finished_at = now() where parent_id = %s", [parent.id])
            connections["default"].close()
            settled.set()
        threading.Thread(target=settle, daemon=True).start()
        wait_blocked(pids, "the settle to wait for the parent's step row")
        assert not settled.is_set()

    with running_worker(queues=("default",)):
        wait_until(lambda: row(parent).state == "suspended", message="the parent to suspend")
        faults.inject_hook("step:children-read", finish_the_child)
        api.run_now(parent.id)  # resumed early: it reads its child, still live

        done = finished(parent, timeout=30)
    assert settled.is_set()
    assert done.state == "done" and done.result == {"squares": [0]}
    faults.clear()


def test_the_test_kits_drain_runs_the_children_and_resumes_the_parent():
    from django_xjobs.testing import drain  # the test kit, as a user's test calls it

    parent = jobs.parent_gather.enqueue(count=3)
    drain()
    done = row(parent)
    assert done.state == "done", done.last_error
    assert done.result == {"squares": [0, 1, 4]}


def test_the_inline_test_mode_runs_the_children_and_resumes_the_parent(settings):
    from django_xjobs.testing import drain  # the test kit, as a user's test calls it

    settings.XJOBS = {**getattr(settings, "XJOBS", {}), "TEST_MODE": "inline"}
    parent = jobs.parent_gather.enqueue(count=3)  # runs now, and suspends on its children
    assert row(parent).state == "suspended"
    drain()  # the children, then the parent they woke
    done = row(parent)
    assert done.state == "done", done.last_error
    assert done.result == {"squares": [0, 1, 4]}


def test_a_child_inherits_the_parents_trace_and_a_cancelled_child_fails_the_step():
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    parent = jobs.parent_invoke.using(traceparent=trace).enqueue(n=2, seconds=30.0)
    with running_worker():
        child = wait_until(lambda: (c := children_of(parent)) and c[0], message="the child")
        # The parent's trace; its parent span is the parent job's own span when tracing is on
        # in this process (another test may have set a tracer provider), else the traceparent
        # the parent was enqueued with.
        version, trace_id, _, flags = child.traceparent.split("-")
        assert [version, trace_id, flags] == [trace.split("-")[i] for i in (0, 1, 3)]
        cancel(child.id, reason="operator says no")
        done = finished(parent)
    assert done.result["state"] == "cancelled"
    assert "operator says no" in done.result["error"]


def test_an_invoke_reusing_the_name_of_a_recorded_run_step_fails_the_job_for_good():
    from django_xjobs.models import JobStep as Step  # the row a deploy left under that name

    parent = jobs.parent_invoke.enqueue(n=2)
    Step.objects.create(run_id=parent.run_id, name="square", status="failed", kind="run",
                        error="boom")
    with running_worker():
        done = finished(parent)
    assert done.state == "dead"
    assert "recorded as another kind of step" in done.last_error
    assert children_of(parent) == []


def test_a_completed_run_step_under_the_invokes_name_fails_the_job_for_good():
    parent = jobs.parent_invoke.enqueue(n=2)
    JobStep.objects.create(run_id=parent.run_id, name="square", status="completed", kind="run",
                           output={"n": 2})
    with running_worker():
        done = finished(parent)
    assert done.state == "dead"
    assert "recorded as another kind of step" in done.last_error


def test_a_timeout_recorded_when_the_step_opened_holds_whatever_the_code_passes_later():
    """A deploy that drops the timeout does not make a step past its recorded timeout re-park
    in a loop: the step decides by the timeout it recorded."""
    parent = jobs.parent_invoke.enqueue(n=5, seconds=30.0, timeout=3600)
    with running_worker(queues=("default",)):
        wait_until(lambda: row(parent).state == "suspended", message="the parent to suspend")
        JobStep.objects.filter(run_id=row(parent).run_id, name="square").update(
            wake_at=row(parent).created_at)  # the recorded timeout has passed
        Job.objects.filter(pk=parent.id).update(input={"n": 5, "seconds": 30.0})  # no timeout now
        api.run_now(parent.id)
        done = finished(parent)
    assert done.result["state"] == "timeout"
    assert children_of(parent)[0].state == "cancelled"


def test_a_cancel_racing_the_parents_enqueue_of_its_children_cancels_them_too():
    """The cancel's first pass over the children runs while the parent's transaction that
    inserts them is still open (it sees none); the cancel of the parent then waits for that
    transaction. The children must not outlive their cancelled parent."""
    parent = jobs.parent_gather.enqueue(count=3, queue="elsewhere")  # no worker runs a child
    cancelled = threading.Event()
    pids: list[int] = []

    def cancel_meanwhile(point):
        def run():
            with connections["default"].cursor() as cursor:  # the cancel's connection
                cursor.execute("select pg_backend_pid()")
                pids.append(cursor.fetchone()[0])
            cancel(parent.id, reason="racing")
            connections["default"].close()
            cancelled.set()
        threading.Thread(target=run, daemon=True).start()
        wait_blocked(pids, "the cancel to wait for the parent's row")
        assert not cancelled.is_set()

    faults.inject_hook("step:children-enqueued", cancel_meanwhile)
    try:
        with running_worker(queues=("default",)):
            wait_until(cancelled.is_set, message="the cancel to return")
    finally:
        faults.clear()
    assert row(parent).state == "cancelled"
    kids = list(Job.objects.filter(parent_id=parent.id))
    assert len(kids) == 3 and {k.state for k in kids} == {"cancelled"}
