# mypy: warn-unused-ignores
"""What a type checker makes of the public API: checked by mypy, never imported or run.

``make lint`` runs mypy on this file and tests/unit/test_typing.py runs it in the test suite.
Every call without a comment must type-check. Every call with a ``# type: ignore[code]``
comment must be an error of exactly that code: mypy runs with ``warn_unused_ignores``, so a
wrong call the checker stopped catching fails the run ("unused type: ignore"), and an error of
another code is not silenced by the comment.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal, assert_type
from uuid import UUID

from django_xjobs import (
    Concurrency,
    JobContext,
    JobHandle,
    StagedJob,
    aenqueue,
    enqueue,
    enqueue_on_commit,
    get_job,
    job,
)
from django_xjobs.decorator import BoundJob
from django_xjobs.records import JobRecord

# ------------------------------------------------------------------------- declarations --


@job
def add(ctx: JobContext, a: int, b: int = 0) -> int:
    return a + b


@job(queue="emails", max_attempts=5, timeout=timedelta(minutes=2), priority=-1,
     retry_base="1s", retry_cap=60.0, name="emails.send")
def send(ctx: JobContext, user_id: int, *, template: str = "welcome") -> None:
    return None


@job(cron="0 3 * * *", timezone="Europe/Paris", misfire="skip")
def nightly(ctx: JobContext) -> None:
    return None


@job(concurrency=Concurrency(key="export:{account_id}", limit=2))
async def export(ctx: JobContext, account_id: int) -> dict[str, int]:
    return {"account_id": account_id}


@job
def anything(ctx: JobContext, **input: object) -> None:
    return None



def direct_call(ctx: JobContext) -> None:
    assert_type(add(ctx, 1, b=2), int)  # calling the job calls the function (tests)
    add(ctx, "one")  # type: ignore[arg-type]

# ----------------------------------------------------------------------- accepted calls --

assert_type(add.enqueue(a=1, b=2), JobHandle)
assert_type(add.enqueue(1), JobHandle)  # stored as {"a": 1}
assert_type(send.enqueue(user_id=42, template="reset"), JobHandle)
assert_type(export.enqueue(account_id=7), JobHandle)
assert_type(anything.enqueue(x=1, y="two"), JobHandle)

bound = send.using(
    idempotency_key="welcome:42", delay=timedelta(seconds=30), tenant_id="acme", priority=5,
    queue="urgent", max_attempts=2, enqueued_by="me", concurrency_key="smtp",
    traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
)
assert_type(bound, BoundJob[[int, str], None])  # type: ignore[assert-type]
assert_type(bound.enqueue(user_id=42), JobHandle)
assert_type(bound.using(run_at=datetime(2030, 1, 1, tzinfo=UTC)).enqueue(user_id=1), JobHandle)
assert_type(send.using(idempotency_key="k", debounce=timedelta(seconds=5),
                       debounce_max_wait="1m").enqueue(user_id=42), JobHandle)
assert_type(enqueue("emails.send", {"user_id": 42}, idempotency_key="k", debounce=2.5),
            JobHandle)
assert_type(send.using(delay=2.5).enqueue_on_commit(user_id=42), StagedJob)
assert_type(send.enqueue_on_commit(user_id=42), StagedJob)
assert_type(add.bulk_enqueue([{"a": 1}, {"a": 2, "b": 3}], priority=1), list[JobHandle])

assert_type(enqueue("emails.send", {"user_id": 42}, idempotency_key="k", delay=5), JobHandle)
assert_type(enqueue_on_commit("emails.send", {"user_id": 42}, using="default"), StagedJob)


async def from_async_code() -> None:
    assert_type(await add.aenqueue(a=1), JobHandle)
    assert_type(await send.using(tenant_id="acme").aenqueue(user_id=42), JobHandle)
    assert_type(await aenqueue("emails.send", {"user_id": 42}, priority=1), JobHandle)


handle = add.enqueue(a=1)
assert_type(handle.id, UUID)
assert_type(handle.created, bool)
assert_type(handle.cancel(), bool)
record = handle.wait(timeout=5)
assert_type(record, JobRecord)
assert_type(get_job(handle.id), JobRecord)
assert_type(record.state, Literal["ready", "delayed", "running", "suspended", "blocked",
                                  "done", "dead", "cancelled"])
assert_type(record.attempt, int)
assert_type(record.finished_at, datetime | None)
assert_type(record.input, dict[str, Any])

# ------------------------------------------------------------------------ refused calls --

add.enqueue(c=1)  # type: ignore[call-arg]
add.enqueue(a="one")  # type: ignore[arg-type]
add.enqueue(1, 2, 3)  # type: ignore[call-arg]
send.enqueue(42, "reset")  # type: ignore[call-arg]
send.using(tenant_id="acme").enqueue(user=42)  # type: ignore[call-arg]
send.using(dealy=5)  # type: ignore[call-arg]
send.using(delay="5s")  # type: ignore[arg-type]
send.using(priority=None)  # type: ignore[arg-type]
send.using(idempotency_key="k", debounce=[5])  # type: ignore[arg-type]
send.using(idempotency_key="k", debounce_max_wiat=60)  # type: ignore[call-arg]
send.enqueue_on_commit(template="reset")  # type: ignore[call-arg]
export.enqueue(account_id="7")  # type: ignore[arg-type]
enqueue("emails.send", {"user_id": 42}, dealy=5)  # type: ignore[call-arg]
enqueue("emails.send", {"user_id": 42}, run_at="tomorrow")  # type: ignore[arg-type]
finished = record.state == "finished"  # type: ignore[comparison-overlap]


async def refused_from_async_code() -> None:
    await add.aenqueue(c=1)  # type: ignore[call-arg]
    await send.using(queue="q").aenqueue(user_id="42")  # type: ignore[arg-type]
    await aenqueue("emails.send", {}, tenant=1)  # type: ignore[call-arg]


@job(queue=5)  # type: ignore[call-overload]
def bad_queue(ctx: JobContext) -> None:
    return None


@job(misfire="sometimes")  # type: ignore[call-overload]
def bad_misfire(ctx: JobContext) -> None:
    return None


@job(crom="0 3 * * *")  # type: ignore[call-overload]
def misspelt_option(ctx: JobContext) -> None:
    return None


@job  # type: ignore[arg-type]
def no_context() -> None:
    return None


@job(queue="q")  # type: ignore[arg-type]
def context_of_the_wrong_type(ctx: int) -> None:
    return None
