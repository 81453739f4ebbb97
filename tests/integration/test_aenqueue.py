"""``aenqueue``: enqueue from async code, in the async caller's connection and transaction.

Each scenario is a coroutine run the way Django runs async code under a sync caller
(``async_to_sync``): database work that asgiref runs thread-sensitively (Django's own async ORM
methods, and ``aenqueue``) happens on this test's thread, on its connection. An enqueue run on
any other thread would use another connection, outside the transaction the scenario opened.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections, transaction

from django_xjobs import aenqueue
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db(transaction=True)

record = testapp_jobs.record
flaky = testapp_jobs.flaky


def committed(job_id) -> bool:
    """Whether a fresh connection sees the job (i.e. it was committed)."""
    import threading

    seen: list[bool] = []

    def look() -> None:
        try:
            seen.append(Job.objects.filter(id=job_id).exists())
        finally:
            connections.close_all()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    return seen[0]


def test_aenqueue_joins_the_async_callers_transaction_and_rolls_back_with_it():
    async def scenario():
        await sync_to_async(transaction.set_autocommit)(False)
        try:
            handles = [
                await record.aenqueue(tag="job"),
                await record.using(tenant_id="acme").aenqueue(tag="bound"),
                await aenqueue("testapp.record", {"tag": "by name"}, priority=4),
            ]
            # Django's async ORM sees them: the same connection, inside the open transaction.
            inside = [await Job.objects.filter(id=h.id).aexists() for h in handles]
            elsewhere = [await sync_to_async(committed)(h.id) for h in handles]
            await sync_to_async(transaction.rollback)()
        finally:
            await sync_to_async(transaction.set_autocommit)(True)
        return handles, inside, elsewhere

    handles, inside, elsewhere = async_to_sync(scenario)()

    assert inside == [True, True, True]
    assert elsewhere == [False, False, False]  # not committed while the transaction was open
    assert not Job.objects.filter(id__in=[h.id for h in handles]).exists()  # rolled back


def test_aenqueue_outside_a_transaction_commits_and_stores_what_enqueue_stores():
    async def scenario():
        job_handle = await record.aenqueue(tag="plain")
        bound_handle = await record.using(tenant_id="acme", priority=2).aenqueue(tag="bound")
        name_handle = await aenqueue("testapp.record", {"tag": "by name"}, delay=60)
        return job_handle, bound_handle, name_handle

    job_handle, bound_handle, name_handle = async_to_sync(scenario)()

    assert all(committed(h.id) for h in (job_handle, bound_handle, name_handle))
    assert job_handle.created and job_handle.get().input == {"tag": "plain"}
    bound = bound_handle.get()
    assert (bound.input, bound.tenant_id, bound.priority) == ({"tag": "bound"}, "acme", 2)
    assert name_handle.get().state == "delayed"


def test_aenqueue_refuses_bad_input_like_enqueue_and_writes_nothing():
    async def scenario():
        errors = []
        for call in (lambda: flaky.aenqueue(fail_time=2),  # flaky(ctx, fail_times=1)
                     lambda: flaky.using(priority=1).aenqueue(3, 4),
                     lambda: aenqueue("testapp.flaky", {"fail_time": 2}),
                     lambda: aenqueue("testapp.flaky", {}, dealy=5)):
            try:
                await call()
            except InvalidJobInput as exc:
                errors.append(str(exc))
        return errors

    errors = async_to_sync(scenario)()

    assert len(errors) == 4
    assert "unexpected argument(s) 'fail_time'" in errors[0]
    assert "takes 1 argument(s) by position" in errors[1]
    assert "unknown enqueue option(s) ['dealy']" in errors[3]
    assert not Job.objects.exists()


def test_the_sync_enqueue_called_from_a_coroutine_is_refused_by_django():
    # What aenqueue exists for (docs/guide.md): Django refuses database work on the event loop.
    from django.core.exceptions import SynchronousOnlyOperation

    async def scenario():
        with pytest.raises(SynchronousOnlyOperation):
            record.enqueue(tag="on the event loop")

    async_to_sync(scenario)()
    assert not Job.objects.exists()
