"""Celery's semantics that django_xjobs.celery keeps where a port would otherwise change
meaning (docs/from-celery.md): each test states Celery's (or the guide's) behaviour. Task names
are "review.*" so nothing clashes with tests/integration/test_celery_shim.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from django_xjobs import conf, enqueue, registry
from django_xjobs.celery import AsyncResult, chain, group, shared_task, signature
from django_xjobs.celery.canvas import CHAIN
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job
from django_xjobs.worker.executor import backoff_for
from tests.integration.test_steps import running_worker

pytestmark = pytest.mark.django_db(transaction=True)


@shared_task(name="review.add")
def add(x, y=0):
    return x + y


# Celery: a call's max_retries= overrides the task's (default 3): retries 0..3 retry again,
# the run with retries == 4 returns.
@shared_task(name="review.retry_more", bind=True)
def retry_more(self):
    if self.request.retries < 4:
        raise self.retry(exc=ConnectionError("busy"), countdown=0, max_retries=5)
    return self.request.retries


# Celery: dont_autoretry_for is consulted by the autoretry wrapper only; self.retry() always
# retries.
@shared_task(name="review.dont", bind=True, max_retries=3, dont_autoretry_for=(Exception,))
def dont(self):
    if self.request.retries < 1:
        raise self.retry(exc=ConnectionError("busy"), countdown=0)
    return "ok"


def test_self_retry_max_retries_above_the_tasks_own_is_honoured():
    result = retry_more.delay()
    with running_worker():
        assert result.get(timeout=30) == 4  # dies at attempt 4 with ConnectionError instead
    assert Job.objects.get(pk=result.id).attempt == 5


def test_dont_autoretry_for_does_not_turn_self_retry_into_a_failure():
    result = dont.delay()
    with running_worker():
        assert result.get(timeout=30) == "ok"  # dead at attempt 1 instead


def test_an_eta_on_a_signature_inside_a_chain_works():
    eta = datetime.now(UTC) + timedelta(seconds=1)
    flow = chain(add.s(1, 1), add.s(1).set(eta=eta)).delay()
    with running_worker(concurrency=4):
        # The orchestrator gets InvalidJobInput "run_at must be a datetime" (eta was stored
        # as text by _portable) after add(1, 1) ran, and dies.
        assert flow.get(timeout=60) == 3


def test_a_signature_takes_expires_like_the_task():
    add.apply_async((1, 2), expires=60)  # works
    add.s(1, 2).apply_async(expires=60)  # InvalidJobInput: unknown option(s) ['expires']


def test_a_canvas_takes_expires_or_refuses_it_with_a_true_message():
    with pytest.raises(Exception) as raised:
        chain(add.s(1, 1), add.s(1)).apply_async(expires=60)
    # The message says it takes expires while refusing it.
    assert "takes countdown, eta, expires" not in str(raised.value)


def test_an_empty_group_first_in_a_chain_gets_a_clear_error():
    with pytest.raises(InvalidJobInput):  # IndexError from _first_queue instead
        chain(group(), add.s(1, 1)).delay()


def test_an_empty_group_later_in_a_chain_is_refused_at_enqueue():
    with pytest.raises(InvalidJobInput):  # accepted; the orchestrator then fails in a worker
        chain(add.s(1, 1), group()).delay()


def test_a_chain_naming_an_unregistered_task_is_refused_at_enqueue():
    with pytest.raises(InvalidJobInput):  # accepted; fails in the worker, after add ran
        chain(add.s(1, 1), signature("review.no_such_task")).delay()


def test_shared_task_accepts_the_job_options_its_error_message_lists():
    # job_options() lets @job's own options through ("ours"), but retry_on / retry_base /
    # retry_cap collide with the mapped ones: TypeError "got multiple values for keyword".
    try:
        @shared_task(name="review.own_retry_on", retry_on=(ConnectionError,))
        def own_retry_on():
            return None

        @shared_task(name="review.own_retry_base", retry_base=5)
        def own_retry_base():
            return None
    finally:
        registry.unregister("review.own_retry_on")
        registry.unregister("review.own_retry_base")


def test_a_task_with_a_parameter_named_ctx_registers():
    try:
        @shared_task(name="review.ctx_param")  # ValueError: duplicate parameter name: 'ctx'
        def ctx_param(ctx, x):
            return x
    finally:
        registry.unregister("review.ctx_param")


def test_default_retry_delay_zero_retries_at_once_as_in_celery():
    @shared_task(name="review.zero_delay", autoretry_for=(ConnectionError,), max_retries=10,
                 default_retry_delay=0)
    def zero_delay():
        raise ConnectionError

    try:
        with override_settings(XJOBS={"RETRY_BASE": "2s", "RETRY_CAP": "3600s"}):
            # falls back to XJOBS' exponential backoff: up to 2 * 2**8 = 512 s here
            assert backoff_for(zero_delay.job, 9, conf.get()) == 0
    finally:
        registry.unregister("review.zero_delay")


def test_a_task_declaring_routing_key_is_taken_with_a_warning_as_the_docs_say():
    # docs/from-celery.md, "What does not port": routing_key, exchange, retry_policy ... "are
    # taken with one warning each"; shared_task raises ConfigurationError (unknown option).
    try:
        @shared_task(name="review.routed", routing_key="billing", exchange="billing")
        def routed():
            return None
    finally:
        registry.unregister("review.routed")


def test_a_canvas_that_cannot_run_fails_for_good_without_retrying_its_orchestrator():
    # A canvas is checked at enqueue; one that cannot run in the worker all the same (its task
    # unknown there: a deploy removed it) fails for good: a retry of the orchestrator could
    # not change it.
    with pytest.raises(InvalidJobInput, match="no Celery-style task"):
        chain(add.s(1, 1), signature("review.no_such_task")).delay()
    data = {"kind": "chain", "tasks": [add.s(1, 1).data(), signature("review.gone").data()]}
    handle = enqueue(CHAIN, {"canvas": data, "args": [], "kwargs": {}})
    with running_worker(concurrency=4):
        with pytest.raises(InvalidJobInput, match="no Celery-style task"):
            AsyncResult(handle.id).get(timeout=60)
    row = Job.objects.get(pk=handle.id)
    assert Job.objects.filter(name="review.add", state="done").exists()  # the first task ran
    assert (row.state, row.attempt) == ("dead", 1)
