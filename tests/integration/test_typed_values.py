"""Typed values (datetime, date, time, UUID, Decimal) through every way in and out of a job, on
PostgreSQL (docs/guide.md, "Values: a job's input and result").

Every path enqueues, ``drain()`` runs the job in the real worker loop in this process (the
worker's claim, ``jobs_claim``, and its executor), and the test checks what the function
received (``RECEIVED``, written by the job) and what is read back, with ``exactly``: same type,
same value, same zone, fold, digits. The encoding alone, without a database:
tests/unit/test_typed_values.py.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, transaction

from django_xjobs import (
    Batch,
    Concurrency,
    RateLimit,
    backfill,
    enqueue,
    enqueue_many,
    get_job,
    job,
    publish_event,
)
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job, OutboxEntry
from django_xjobs.testing import assert_enqueued, drain, travel
from tests.unit.test_typed_values import exactly

pytestmark = pytest.mark.django_db(transaction=True)

PARIS = ZoneInfo("Europe/Paris")
ACCOUNT = UUID("0b6c6e62-3f0e-4bb3-9c2a-5d1f6c0e7a11")
VALUES: dict[str, Any] = {
    "naive": datetime(2024, 5, 1, 12, 0, 0, 123456),
    "aware": datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=-5))),
    "utc": datetime(2024, 5, 1, 12, tzinfo=UTC),
    "zoned": datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=PARIS),  # the second 02:30 of the night
    "day": date(2024, 2, 29),
    "at": time(9, 30, 15, 500),
    "at_offset": time(9, 30, tzinfo=timezone(timedelta(hours=2))),
    "account": ACCOUNT,
    "amount": Decimal("1.10"),
    "nested": {"rows": [{"price": Decimal("0.00"), "on": date(2024, 1, 1)}], "plain": [1, "x"]},
}

# What each run's function received, by job id (drain runs the jobs in this process).
RECEIVED: dict[str, Any] = {}


@job(name="typed.echo")
def echo(ctx, **values):
    RECEIVED[str(ctx.job_id)] = values
    return values


@job(name="typed.parent")
def parent(ctx, **values):
    invoked = ctx.step.invoke("one", echo, values)
    gathered = ctx.step.gather("two", [(echo, {"amount": values["amount"]}),
                                       (echo, {"account": values["account"]})])
    RECEIVED[str(ctx.job_id)] = {"invoked": invoked, "gathered": gathered}
    return {"invoked": invoked, "gathered": gathered}


@job(name="typed.steps")
def stepper(ctx, amount):
    out = ctx.step.run("price", lambda: {"amount": amount, "on": date(2024, 1, 1)})
    ctx.step.sleep("nap", timedelta(hours=1))  # the next run replays "price" from its row
    RECEIVED[str(ctx.job_id)] = out
    return out


@job(name="typed.waiter")
def waiter(ctx):
    payload = ctx.step.wait_for_event("paid", event="typed.paid", timeout=3600)
    RECEIVED[str(ctx.job_id)] = payload
    return payload


@job(name="typed.keyed",
     concurrency=Concurrency(key="acct:{account}", limit=1),
     rate_limit=RateLimit(key="day:{day}", limit=100, period=timedelta(seconds=1)))
def keyed(ctx, account, day):
    RECEIVED[str(ctx.job_id)] = {"account": account, "day": day}
    return {"account": account, "day": day}


@job(name="typed.bad_result")
def bad_result(ctx):
    return {"meta": {"$xjobs": "not ours"}}


def ran_with(job_id: Any, expected: Any, input: Any = None) -> None:
    """The job is done, its input (default: ``expected``) reads back exactly, its function
    received ``expected`` and its result reads back as it."""
    record = get_job(str(job_id))
    assert record.state == "done", record.last_error
    assert exactly(record.input, expected if input is None else input)
    assert exactly(RECEIVED[str(job_id)], expected)
    assert exactly(record.result, expected)


# ------------------------------------------------------------------------- enqueue paths --


def test_job_enqueue_round_trips_typed_arguments_and_result():
    handle = echo.enqueue(**VALUES)
    assert_enqueued(echo, amount=Decimal("1.10"), account=ACCOUNT, zoned=VALUES["zoned"])
    drain()
    ran_with(handle.id, VALUES)
    assert exactly(handle.get().result, VALUES)


def test_enqueue_by_name_and_enqueue_many_and_bulk_enqueue_round_trip():
    one = enqueue("typed.echo", VALUES)
    many = enqueue_many([("typed.echo", {"amount": Decimal("2.50")}),
                         ("typed.echo", VALUES, {"priority": 5})])
    bulk = echo.bulk_enqueue([{"day": date(2024, 1, 1)}, {"at": time(23, 59, 59, 999999)}])
    drain()
    ran_with(one.id, VALUES)
    ran_with(many[0].id, {"amount": Decimal("2.50")})
    ran_with(many[1].id, VALUES)
    ran_with(bulk[0].id, {"day": date(2024, 1, 1)})
    ran_with(bulk[1].id, {"at": time(23, 59, 59, 999999)})


def test_enqueue_on_commit_and_its_relay_round_trip():
    with transaction.atomic():
        staged = echo.enqueue_on_commit(**VALUES)
        # The staged row reads back typed too (its status, before any relay).
        assert exactly(staged.status().input, VALUES)
    stats = drain()  # relays the committed staging, then runs the job
    assert stats["relayed"] == 1
    ran_with(staged.job_id(), VALUES)


def test_a_child_gets_typed_input_and_its_parent_a_typed_result():
    handle = parent.enqueue(**VALUES)
    drain()
    expected = {"invoked": VALUES,
                "gathered": [{"amount": VALUES["amount"]}, {"account": VALUES["account"]}]}
    ran_with(handle.id, expected, input=VALUES)
    children = Job.objects.filter(parent_id=handle.id)
    assert children.count() == 3
    for child in children:
        assert get_job(str(child.id)).state == "done"
        assert exactly(RECEIVED[str(child.id)], get_job(str(child.id)).input)


def test_a_step_output_replayed_from_its_row_is_typed():
    handle = stepper.enqueue(amount=Decimal("9.90"))
    drain()
    assert get_job(str(handle.id)).state == "suspended"  # in its sleep, "price" stored
    travel(timedelta(hours=1))
    drain()
    record = get_job(str(handle.id))
    assert record.state == "done", record.last_error
    expected = {"amount": Decimal("9.90"), "on": date(2024, 1, 1)}
    assert exactly(RECEIVED[str(handle.id)], expected)  # as the second run read the step's row
    assert exactly(record.result, expected)


def test_an_event_payload_reaches_its_waiter_typed():
    handle = waiter.enqueue()
    drain()
    payload = {"paid_at": VALUES["zoned"], "amount": Decimal("19.90"), "order": ACCOUNT}
    event = publish_event("typed.paid", payload)
    assert exactly(event.payload, payload)
    drain()
    record = get_job(str(handle.id))
    assert record.state == "done", record.last_error
    assert exactly(RECEIVED[str(handle.id)], payload) and exactly(record.result, payload)


def test_key_templates_write_typed_values_with_str():
    handle = keyed.enqueue(account=ACCOUNT, day=date(2024, 5, 1))
    row = Job.objects.get(pk=handle.id)
    assert row.concurrency_key == f"acct:{ACCOUNT}"
    assert row.rate_key == "day:2024-05-01"
    drain()
    ran_with(handle.id, {"account": ACCOUNT, "day": date(2024, 5, 1)})


# --------------------------------------------------------------- the worker's claim path --


def test_a_claimed_batch_decodes_typed_and_plain_inputs_each_exactly():
    """The worker decodes a claimed batch's inputs in one call (engines/postgres/operations/
    runs.py); drain claims one job per queue at a time, so the batch is claimed here."""
    plain = [echo.using(queue="typed-claim").enqueue(n=n, s="x") for n in range(2)]
    typed = echo.using(queue="typed-claim").enqueue(**VALUES)
    claimed = get_engine().jobs_claim(wants={"typed-claim": 10}, worker_id="tests:typed",
                                      lease_ms=60_000)
    inputs = {str(c.id): c.input for c in claimed}
    assert len(inputs) == 3
    assert [inputs[str(h.id)] for h in plain] == [{"n": 0, "s": "x"}, {"n": 1, "s": "x"}]
    assert exactly(inputs[str(typed.id)], VALUES)


def test_a_marked_value_this_release_cannot_read_fails_the_job_without_running_it():
    handle = echo.enqueue(n=1)
    # A value a newer release might write (a type this one does not know), put there by SQL.
    Job.objects.filter(pk=handle.id).update(
        input={"n": 1, "every": {"$xjobs": "timedelta", "value": "P1D"}})
    drain()
    record = get_job(str(handle.id))
    assert record.state == "dead" and str(handle.id) not in RECEIVED
    assert "input cannot be decoded" in record.last_error
    assert "written by a newer django-xjobs?" in record.last_error
    assert record.input == {} and "timedelta" in record.input_error


# ------------------------------------------------------------------ stored, and refused --


def test_the_stored_form_is_tagged_json_that_sql_reads():
    handle = echo.enqueue(**VALUES)
    with connection.cursor() as cursor:
        cursor.execute(
            "select input->'amount'->>'value', (input->'amount'->>'value')::numeric,"
            " (input->'aware'->>'value')::timestamptz, input->'zoned'->>'zone',"
            " (input->'account'->>'value')::uuid from x_jobs where id = %s", [handle.id])
        text, amount, aware, zone, account = cursor.fetchone()
    assert (text, amount, zone, account) == ("1.10", Decimal("1.10"), "Europe/Paris", ACCOUNT)
    assert aware == VALUES["aware"]
    # The ORM's JSONField (and the console) show the stored form.
    assert Job.objects.get(pk=handle.id).input["day"] == {"$xjobs": "date",
                                                          "value": "2024-02-29"}


def test_a_dict_with_the_reserved_key_is_refused_at_enqueue_and_nothing_is_written():
    with pytest.raises(InvalidJobInput, match=r"typed\.echo\['meta'\] has the key '\$xjobs'"):
        echo.enqueue(meta={"$xjobs": "mine"})
    with pytest.raises(InvalidJobInput, match="reserves"):
        echo.enqueue_on_commit(rows=[{"$xjobs": 1}])
    with pytest.raises(InvalidJobInput, match="reserves"):
        enqueue_many([("typed.echo", {"n": 1}), ("typed.echo", {"m": {"$xjobs": 1}})])
    assert Job.objects.count() == 0 and OutboxEntry.objects.count() == 0


def test_a_result_with_the_reserved_key_kills_the_job_with_a_clear_error():
    handle = bad_result.enqueue()
    drain()
    record = get_job(str(handle.id))
    assert record.state == "dead" and record.attempt == 1  # re-running cannot fix it
    assert "result of typed.bad_result['meta'] has the key '$xjobs'" in record.last_error


# ------------------------------------------------------------------------------ backfills --

CURSORS: list[Any] = []


@backfill("typed.by_day", max_attempts=3)
def by_day(ctx, cursor):
    CURSORS.append(cursor)
    if cursor is None:
        return Batch(date(2024, 1, 1), 1)
    if len(CURSORS) == 2:
        raise RuntimeError("once: the retry resumes from the stored cursor")
    return Batch(None, 1)


def test_a_backfill_resumes_from_a_typed_cursor_read_back_from_its_row():
    CURSORS.clear()
    started = by_day.start()
    drain(queues=["backfills"])  # the first batch commits its cursor, the second raises
    travel(timedelta(minutes=1))  # the retry's backoff
    drain(queues=["backfills"])
    assert get_job(str(started.job_id)).state == "done"
    assert exactly(CURSORS, [None, date(2024, 1, 1), date(2024, 1, 1)])


# ---------------------------------------------------------------- the django.tasks backend --

try:
    from django.tasks import TaskResultStatus

    from tests.testapp import tasks
except ImportError:  # Django 5.2: no django.tasks
    tasks = None

needs_tasks = pytest.mark.skipif(tasks is None, reason="django.tasks needs Django 6.0+")
ARGS = [VALUES["zoned"], Decimal("1.10"), (ACCOUNT, date(2024, 1, 1))]
KWARGS = {"at": time(9, 30, tzinfo=PARIS), "naive": VALUES["naive"]}
CALL = {"args": [VALUES["zoned"], Decimal("1.10"), [ACCOUNT, date(2024, 1, 1)]], "kwargs": KWARGS}


@needs_tasks
def test_a_task_gets_typed_arguments_and_its_return_value_reads_back_typed():
    # echo_call returns its call as it received it: only exact arguments return exactly CALL.
    result = tasks.echo_call.enqueue(*ARGS, **KWARGS)
    assert exactly({"args": result.args, "kwargs": result.kwargs}, CALL)  # tuples: lists
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert exactly(result.return_value, CALL)
    again = tasks.echo_call.get_result(result.id)
    assert exactly({"args": again.args, "kwargs": again.kwargs}, CALL)
    price = tasks.echo_value.enqueue(Decimal("12.30"))
    drain()
    assert exactly(tasks.echo_value.get_result(price.id).return_value, Decimal("12.30"))


@needs_tasks
def test_a_task_enqueued_on_commit_reads_back_typed_before_and_after_its_relay():
    with transaction.atomic():
        staged = tasks.echo_call.enqueue_on_commit(*ARGS, **KWARGS)
    pending = tasks.echo_call.get_result(staged.id)  # committed, not relayed: from the outbox
    assert pending.status == TaskResultStatus.READY
    assert exactly({"args": pending.args, "kwargs": pending.kwargs}, CALL)
    drain()
    done = tasks.echo_call.get_result(staged.id)
    assert done.status == TaskResultStatus.SUCCESSFUL, done.errors
    assert exactly(done.return_value, CALL)


@needs_tasks
def test_a_task_argument_still_refused_names_what_is_accepted():
    with pytest.raises(TypeError, match=r"Unsupported type.*uuid\.UUID, decimal\.Decimal"):
        tasks.echo_call.enqueue({1, 2})
    assert Job.objects.count() == 0
