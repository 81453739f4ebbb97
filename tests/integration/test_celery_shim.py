"""django_xjobs.celery (docs/from-celery.md): Celery's calls onto jobs, run by the real worker
loop on PostgreSQL. The worked example's port, with a worker subprocess, is
tests/acceptance/test_celery_port.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from django_xjobs import registry
from django_xjobs.celery import (
    AsyncResult,
    Celery,
    NotSupported,
    TaskFailed,
    TaskRevokedError,
    TimeoutError,
    chain,
    chord,
    group,
    shared_task,
    states,
)
from django_xjobs.celery.base import META_KEY
from django_xjobs.exceptions import ConfigurationError, InvalidJobInput
from django_xjobs.models import Job
from django_xjobs.testing import drain
from tests.integration.test_steps import running_worker

pytestmark = pytest.mark.django_db(transaction=True)


class Declined(Exception):
    pass


@shared_task(name="shim.add")
def add(x, y=0):
    return x + y


@shared_task(name="shim.mul")
def mul(x, y):
    return x * y


@shared_task(name="shim.total")
def total(values):
    return sum(values)


@shared_task(name="shim.collect")
def collect(*values, sep="+"):
    return sep.join(str(v) for v in values)


@shared_task(name="shim.flaky", bind=True, max_retries=5, default_retry_delay=0)
def flaky(self, fail_times):
    if self.request.retries < fail_times:
        raise self.retry(exc=ConnectionError(f"busy {self.request.retries}"), countdown=0)
    return {"id": self.request.id, "retries": self.request.retries}


@shared_task(name="shim.capped", bind=True, max_retries=10)
def capped(self):
    raise self.retry(exc=ConnectionError("429"), countdown=0, max_retries=1)


@shared_task(name="shim.declines")
def declines():
    raise Declined("over the card limit")


def _local_failure():
    class Local(Exception):  # a class no module defines: not rebuilt
        pass

    raise Local("from a closure")


@shared_task(name="shim.local")
def local():
    _local_failure()


@shared_task(name="shim.autoretry", bind=True, autoretry_for=(ConnectionError,),
             max_retries=2, default_retry_delay=0, retry_kwargs={"countdown": 0})
def autoretry(self, error):
    raise {"connection": ConnectionError, "value": ValueError}[error](f"try {self.request.retries}")


def result_of(result: AsyncResult, timeout: float = 30.0):
    return result.get(timeout=timeout)


def test_delay_stores_positional_arguments_by_name_and_runs_the_task():
    result = add.delay(2, 3)
    assert Job.objects.get(pk=result.id).input == {"x": 2, "y": 3}
    assert result.status == states.PENDING
    with running_worker():
        assert result_of(result) == 5
    assert result.status == states.SUCCESS and result.ready() and result.successful()
    assert AsyncResult(result.id).result == 5


def test_apply_async_maps_countdown_queue_priority_and_expires():
    before = datetime.now(UTC)
    result = add.apply_async((1,), {"y": 2}, countdown=60, queue="math", priority=7,
                             expires=3600)
    row = Job.objects.get(pk=result.id)
    assert (row.queue, row.priority, row.state) == ("math", 7, "delayed")
    assert row.run_at >= before + timedelta(seconds=59)
    assert datetime.fromisoformat(row.input[META_KEY]["expires"]) > before
    assert row.input["x"] == 1 and row.input["y"] == 2


def test_a_task_past_its_expiry_is_not_run_and_reads_revoked():
    result = add.apply_async((1, 2), expires=datetime.now(UTC) - timedelta(seconds=1))
    with running_worker():
        with pytest.raises(TaskRevokedError, match="expired"):
            result_of(result)
    assert result.status == states.REVOKED


def test_varargs_travel_after_the_named_arguments():
    result = collect.delay(1, 2, 3, sep="-")
    with running_worker():
        assert result_of(result) == "1-2-3"


def test_self_retry_spends_an_attempt_each_time_and_request_says_so():
    result = flaky.delay(2)
    with running_worker():
        value = result_of(result)
    assert value == {"id": result.id, "retries": 2}
    row = Job.objects.get(pk=result.id)
    assert row.attempt == 3 and row.max_attempts == 6


def test_self_retry_past_its_max_retries_fails_with_the_exception_it_retried_on():
    result = capped.delay()
    with running_worker():
        with pytest.raises(ConnectionError, match="429"):
            result_of(result)
    row = Job.objects.get(pk=result.id)
    assert (row.state, row.attempt) == ("dead", 2)
    assert result.status == states.FAILURE and result.failed()
    assert "ConnectionError: 429" in result.traceback


def test_an_exception_not_in_autoretry_for_fails_at_once_as_in_celery():
    with running_worker():
        with pytest.raises(Declined, match="over the card limit"):
            result_of(declines.delay())
        dead = autoretry.delay("value")
        with pytest.raises(ValueError, match="try 0"):
            result_of(dead)
        spent = autoretry.delay("connection")
        with pytest.raises(ConnectionError, match="try 2"):
            result_of(spent)
    assert Job.objects.get(pk=dead.id).attempt == 1
    assert Job.objects.get(pk=spent.id).attempt == 3


def test_get_times_out_and_propagate_false_returns_the_exception():
    result = add.apply_async((1, 1), countdown=3600)
    with pytest.raises(TimeoutError):
        result.get(timeout=0.1)
    with running_worker():
        failure = declines.delay().get(timeout=30, propagate=False)
    assert isinstance(failure, Declined)


def test_an_exception_class_that_cannot_be_rebuilt_is_raised_as_task_failed():
    with running_worker():
        with pytest.raises(TaskFailed, match="Local: from a closure"):
            result_of(local.delay())


def test_an_unknown_id_is_pending_and_revoke_cancels():
    assert AsyncResult("00000000-0000-0000-0000-000000000000").status == states.PENDING
    result = add.apply_async((1, 1), countdown=3600)
    result.revoke()
    assert result.status == states.REVOKED
    with pytest.raises(TaskRevokedError):
        result.get(timeout=1)


def test_a_chain_passes_each_result_first_to_the_next_and_si_does_not():
    flow = chain(add.s(2, 3), mul.s(10), add.si(100, 1), add.s(0))
    assert isinstance(add.s(1) | mul.s(2), chain)
    with running_worker(concurrency=4):
        assert result_of(flow.delay()) == 101
        assert result_of((add.s(1, 1) | mul.s(5)).delay()) == 10


def test_a_group_returns_its_results_in_order_and_a_chord_calls_its_body_with_them():
    with running_worker(concurrency=4):
        assert result_of(group(add.s(i, i) for i in range(5)).delay()) == [0, 2, 4, 6, 8]
        assert result_of(chord([add.s(1, 1), mul.s(3, 3)])(total.s())) == 11
        nested = chain(group(add.s(1, 1), add.s(2, 2)), total.s(), mul.s(2))
        assert result_of(nested.delay()) == 12


def test_a_failing_task_fails_its_chain():
    with running_worker(concurrency=4):
        result = chain(add.s(1, 1), declines.si(), add.s(1)).delay()
        with pytest.raises(Declined, match="over the card limit"):  # the task's, as in Celery
            result_of(result)
        nested = chain(add.s(1, 1), group(add.s(1), declines.si())).delay()
        with pytest.raises(Declined):
            result_of(nested)
    assert result.status == states.FAILURE
    assert Job.objects.get(pk=result.id).last_error.startswith(
        "exception-class: django_xjobs.exceptions.ChildFailed")


def test_calling_a_task_runs_it_here_and_a_bound_task_sees_a_direct_request():
    assert add(2, 2) == 4
    assert flaky(0) == {"id": None, "retries": 0}


def test_bad_calls_get_clear_errors():
    with pytest.raises(InvalidJobInput, match="takes 2 positional argument"):
        add.delay(1, 2, 3)
    with pytest.raises(InvalidJobInput, match=r"shim\.mul\(\): missing a required argument: 'y'"):
        mul.delay(1)
    with pytest.raises(NotSupported, match="idempotency_key"):
        add.apply_async((1,), task_id="mine")
    with pytest.raises(NotSupported, match="chain"):
        add.apply_async((1,), link=mul.s(2))
    with pytest.raises(InvalidJobInput, match="unknown option"):
        add.apply_async((1,), countdwn=3)
    with pytest.raises(NotSupported, match="signals"):
        shared_task(name="shim.based", base=object)(lambda: None)
    with pytest.raises(ConfigurationError, match="rate"):
        shared_task(name="shim.rated", rate_limit="fast")(lambda: None)
    with pytest.raises(NotSupported, match="outside a worker"):
        flaky.retry()


def test_options_that_mean_nothing_here_are_taken_with_one_warning(caplog):
    caplog.set_level(logging.WARNING, logger="django_xjobs.celery")

    @shared_task(name="shim.warned", serializer="json", acks_late=True, ignore_result=True)
    def warned():
        return None

    try:
        messages = [r.getMessage() for r in caplog.records]
        assert any("serializer=" in m for m in messages)
        assert any("ignore_result=" in m for m in messages)
        assert not any("acks_late=" in m for m in messages)
    finally:
        registry.unregister("shim.warned")


def test_celery_options_map_onto_the_job():
    @shared_task(name="shim.mapped", max_retries=None, retry_backoff=5, retry_backoff_max=60,
                 retry_jitter=False, time_limit=30, rate_limit="10/m", queue="mapped")
    def mapped():
        return None

    try:
        definition = mapped.job
        assert definition.max_attempts == 2**31 - 1
        assert (definition.retry.base, definition.retry.cap, definition.retry.jitter) == (
            5, 60, False)
        assert definition.retry.on == ()
        assert definition.timeout == 30 and definition.queue == "mapped"
        limit = definition.options["rate_limit"]
        assert (limit.limit, limit.period) == (10, timedelta(minutes=1))
    finally:
        registry.unregister("shim.mapped")


def test_delay_inside_atomic_joins_the_transaction_and_delay_on_commit_uses_the_outbox():
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = add.delay(1, 1)
        raise RuntimeError("the request failed")
    assert not Job.objects.filter(pk=rolled_back.id).exists()
    with transaction.atomic():
        assert add.delay_on_commit(2, 2) is None
        assert not Job.objects.filter(name="shim.add").exists()  # staged, not enqueued yet
    assert drain()["relayed"] == 1
    staged = Job.objects.get(name="shim.add")
    assert (staged.state, AsyncResult(staged.pk).get(timeout=1)) == ("done", 4)


def test_the_app_object_sends_tasks_by_name():
    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()
    with running_worker():
        assert result_of(app.send_task("shim.add", args=(40, 2))) == 42
        assert app.AsyncResult(app.send_task("shim.mul", kwargs={"x": 6, "y": 7}).id).get(
            timeout=30) == 42
    with pytest.raises(NotSupported, match="by keyword"):
        app.send_task("django_xjobs.celery.chain", args=(1,))
