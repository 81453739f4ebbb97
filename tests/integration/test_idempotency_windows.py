"""Idempotency windows (docs/durable.md, "Idempotency windows"): with ``unique_for``, a job of
the key that finished less than the window ago dedupes like the live one; "forever" never frees
the key. The key's row in x_job_keys decides, never a check (job_enqueue_windowed says why).

Real PostgreSQL; jobs are finished by ``drain`` (done, dead) or ``cancel``; a window's expiry
is waited for by polling the database's clock, never by a timed assertion.
tests/acceptance/test_idempotency_window_race.py races sixteen threads against a worker.
"""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_xjobs import api, enqueue, enqueue_many, enqueue_on_commit
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.maintenance import pruner
from django_xjobs.models import Job, JobKey, OutboxEntry
from django_xjobs.testing import drain
from tests.conftest import in_threads, wait_until
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db(transaction=True)

record = testapp_jobs.record


def key_row(key: str, tenant: str = "") -> JobKey:
    return JobKey.objects.get(name="testapp.record", tenant=tenant, key=key)


def jobs_of(key: str, name: str = "testapp.record") -> list[Job]:
    return list(Job.objects.filter(name=name, idempotency_key=key).order_by("created_at"))


def wait_until_window_ended(key: str, tenant: str = "", timeout: float = 30.0) -> None:
    """Poll the database until the holder of ``key`` finished more than its window ago."""
    def ended() -> bool:
        with connection.cursor() as cur:
            cur.execute(
                "select finished_at < now() - unique_for_ms * interval '1 millisecond'"
                "  from x_job_keys where name = 'testapp.record' and tenant = %s and key = %s",
                [tenant, key])
            row = cur.fetchone()
        return row is not None and row[0]

    wait_until(ended, timeout=timeout, interval=0.05, message=f"the window of {key!r} to end")


# ------------------------------------------------------------------------------ dedupe --


def test_a_key_whose_job_finished_done_inside_the_window_returns_that_job():
    bound = record.using(idempotency_key="w:done", unique_for=timedelta(hours=24))
    first = bound.enqueue(tag="1")
    assert first.created
    drain()
    assert first.get().state == "done"
    again = bound.enqueue(tag="2")
    assert (again.id, again.run_id, again.created) == (first.id, first.run_id, False)
    assert len(jobs_of("w:done")) == 1
    assert key_row("w:done").job_id == first.id
    assert key_row("w:done").finished_at is not None


def test_a_windowed_enqueue_is_two_statements_and_a_duplicate_one_that_locks_nothing():
    bound = record.using(idempotency_key="w:cost", unique_for="1h")
    with CaptureQueriesContext(connection) as made:
        bound.enqueue()
    drain()
    with CaptureQueriesContext(connection) as found:
        bound.enqueue()
    # Outside the caller's transaction it opens one of its own (BEGIN, COMMIT): a key given
    # back must never be seen taken.
    assert statements(made) == ["BEGIN", "job_key_held", "job_enqueue_windowed", "COMMIT"]
    assert statements(found) == ["BEGIN", "job_key_held", "COMMIT"]
    with transaction.atomic(), CaptureQueriesContext(connection) as inside:
        bound.enqueue()
        # The duplicate read took no lock on the key's row: another session can write it now
        # (as the holder's acknowledgement does, through its trigger).
        touched: list[int] = []
        other = threading.Thread(target=_touch_key_row, args=("w:cost", touched))
        other.start()
        other.join(timeout=10)
        assert touched == [1], "the key's row stayed locked by a duplicate enqueue"
    assert statements(inside) == ["job_key_held"]


def _touch_key_row(key: str, touched: list[int]) -> None:
    """Update the key's row from a connection of this thread's own, with a short lock timeout;
    ``touched`` gets the rows updated (none when the lock timed out)."""
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("set lock_timeout = '3s'")
            cursor.execute("update x_job_keys set created_at = created_at where key = %s", [key])
            touched.append(cursor.rowcount)
    finally:
        connections["default"].close()


def statements(captured: CaptureQueriesContext) -> list[str]:
    """The statement names (or BEGIN / COMMIT) of the queries ``captured``, in order."""
    return [re.sub(r"^/\* (\w+) \*/.*", r"\1", q["sql"], flags=re.S) for q in captured]


def test_a_dead_job_holds_its_window_too():
    bound = testapp_jobs.permanent.using(idempotency_key="w:dead", unique_for="1h")
    first = bound.enqueue()
    drain()
    assert first.get().state == "dead"
    again = bound.enqueue()
    assert (again.id, again.created) == (first.id, False)
    assert len(jobs_of("w:dead", "testapp.permanent")) == 1


def test_a_cancelled_job_holds_its_window_too():
    bound = record.using(idempotency_key="w:cancel", unique_for=3600)
    first = bound.enqueue()
    first.cancel()
    assert first.get().state == "cancelled"
    again = bound.enqueue()
    assert (again.id, again.created) == (first.id, False)


def test_the_live_job_of_a_windowed_key_is_returned_while_it_runs():
    bound = record.using(idempotency_key="w:live", unique_for="1h")
    first = bound.enqueue()
    again = bound.enqueue()
    assert (again.id, again.created) == (first.id, False)
    assert key_row("w:live").finished_at is None


def test_after_the_window_the_key_makes_a_new_job_and_the_row_names_it():
    bound = record.using(idempotency_key="w:expire", unique_for=1)
    first = bound.enqueue()
    drain()
    wait_until_window_ended("w:expire")
    second = bound.enqueue()
    assert second.created and second.id != first.id
    row = key_row("w:expire")
    assert (row.job_id, row.finished_at) == (second.id, None)
    assert bound.enqueue().id == second.id  # the new one holds it now


def test_forever_never_frees_the_key():
    bound = record.using(idempotency_key="w:forever", unique_for="forever")
    first = bound.enqueue()
    drain()
    with connection.cursor() as cur:  # as if it had finished a year ago
        cur.execute("update x_job_keys set finished_at = now() - interval '365 days'"
                    " where key = 'w:forever'")
    assert key_row("w:forever").unique_for_ms is None
    assert Job.objects.get(id=first.id).unique_for_ms == -1
    again = record.using(idempotency_key="w:forever", unique_for=1).enqueue()
    assert (again.id, again.created) == (first.id, False)  # the holder's forever wins
    assert pruner.run_once().keys == 0
    assert key_row("w:forever").job_id == first.id


def test_the_longer_of_the_holders_and_the_callers_window_applies():
    first = record.using(idempotency_key="w:longer", unique_for=1).enqueue()
    drain()
    wait_until_window_ended("w:longer")
    again = record.using(idempotency_key="w:longer", unique_for="1h").enqueue()
    assert (again.id, again.created) == (first.id, False)


def test_windows_are_scoped_by_tenant():
    a = record.using(idempotency_key="w:t", unique_for="1h", tenant_id="a").enqueue()
    drain()
    b = record.using(idempotency_key="w:t", unique_for="1h", tenant_id="b").enqueue()
    none = record.using(idempotency_key="w:t", unique_for="1h").enqueue()
    assert b.created and none.created and len({a.id, b.id, none.id}) == 3
    assert record.using(idempotency_key="w:t", unique_for="1h",
                        tenant_id="a").enqueue().id == a.id
    assert {r.tenant for r in JobKey.objects.filter(key="w:t")} == {"a", "b", ""}


def test_an_enqueue_without_unique_for_ignores_the_window():
    first = record.using(idempotency_key="w:plain", unique_for="1h").enqueue()
    drain()
    plain = record.using(idempotency_key="w:plain").enqueue()
    assert plain.created and plain.id != first.id


def test_a_live_job_enqueued_without_a_window_wins_and_the_key_row_is_given_back():
    plain = record.using(idempotency_key="w:mixed").enqueue()
    windowed = record.using(idempotency_key="w:mixed", unique_for="1h").enqueue()
    assert (windowed.id, windowed.created) == (plain.id, False)
    assert not JobKey.objects.filter(key="w:mixed").exists()
    drain()
    third = record.using(idempotency_key="w:mixed", unique_for="1h").enqueue()
    assert third.created and key_row("w:mixed").job_id == third.id


def test_a_windowed_enqueue_rolled_back_leaves_no_key():
    with pytest.raises(RuntimeError), transaction.atomic():
        record.using(idempotency_key="w:rollback", unique_for="1h").enqueue()
        raise RuntimeError("roll back")
    assert not JobKey.objects.filter(key="w:rollback").exists()
    assert record.using(idempotency_key="w:rollback", unique_for="1h").enqueue().created


def test_a_debounced_enqueue_returns_a_windowed_run_under_way_and_its_window_still_closes():
    first = record.using(idempotency_key="w:deb", unique_for="1h").enqueue(tag="first")
    Job.objects.filter(id=first.id).update(state="running")  # as a claim leaves it
    debounced = record.using(idempotency_key="w:deb", debounce=5).enqueue(tag="second")
    assert (debounced.id, debounced.created) == (first.id, False)
    assert Job.objects.get(id=first.id).idempotency_key == "w:deb"  # not set aside
    Job.objects.filter(id=first.id).update(state="ready")
    drain()
    assert key_row("w:deb").finished_at is not None
    again = record.using(idempotency_key="w:deb", unique_for="1h").enqueue()
    assert (again.id, again.created) == (first.id, False)


# ----------------------------------------------------------------------- retry, history --


def test_retrying_a_finished_windowed_job_reopens_its_window():
    bound = record.using(idempotency_key="w:retry", unique_for=1)
    first = bound.enqueue()
    first.cancel()
    assert key_row("w:retry").finished_at is not None
    api.retry(first.id)
    assert key_row("w:retry").finished_at is None  # live again: no window runs
    assert bound.enqueue().id == first.id
    drain()
    assert first.get().state == "done"
    assert key_row("w:retry").finished_at is not None
    wait_until_window_ended("w:retry")
    assert bound.enqueue().id != first.id


def test_an_archived_holder_still_dedupes_and_is_found():
    bound = record.using(idempotency_key="w:archived", unique_for="1h")
    first = bound.enqueue()
    drain()
    engine = get_engine()
    moved = engine.jobs_archive(state="done", finished_before=engine.db_now() + timedelta(1))
    assert moved >= 1
    with connection.cursor() as cur:
        cur.execute("select count(*) from only x_jobs where id = %s", [first.id])
        assert cur.fetchone()[0] == 0  # in a history table now
    again = bound.enqueue()
    assert (again.id, again.run_id, again.created) == (first.id, first.run_id, False)
    assert again.get().state == "done"
    record.using(idempotency_key="w:archived-2", unique_for="1h").enqueue().cancel()
    cancelled = JobKey.objects.get(key="w:archived-2").job_id
    engine.jobs_archive(state="cancelled", finished_before=engine.db_now() + timedelta(1))
    api.retry(cancelled)  # moved back out of the history table, live again: its window reopens
    assert JobKey.objects.get(key="w:archived-2").finished_at is None


def test_a_purged_holder_is_still_named_by_its_id():
    bound = record.using(idempotency_key="w:purged", unique_for="1h")
    first = bound.enqueue()
    drain()
    api.purge(older_than=timedelta(0))
    assert not Job.objects.filter(id=first.id).exists()
    again = bound.enqueue()
    assert (again.id, again.created) == (first.id, False)


# ------------------------------------------------------------------------ other paths --


def test_enqueue_by_name_and_enqueue_many_take_unique_for():
    first = enqueue("testapp.record", {"tag": "x"}, idempotency_key="w:name", unique_for="1h")
    drain()
    again = enqueue("testapp.record", {"tag": "y"}, idempotency_key="w:name", unique_for="1h")
    assert (again.id, again.created) == (first.id, False)
    options = {"idempotency_key": "w:many", "unique_for": "1h"}
    handles = enqueue_many([("testapp.record", {"tag": "1"}, options),
                            ("testapp.record", {"tag": "2"}, options),
                            ("testapp.record", {"tag": "3"}, {"idempotency_key": "w:name",
                                                              "unique_for": "1h"}),
                            ("testapp.record", {"tag": "4"})])
    assert handles[0].created and (handles[1].id, handles[1].created) == (handles[0].id, False)
    assert (handles[2].id, handles[2].created) == (first.id, False)
    assert handles[3].created
    assert key_row("w:many").job_id == handles[0].id


def test_enqueue_on_commit_carries_the_window_through_the_outbox():
    first = record.using(idempotency_key="w:outbox", unique_for="1h").enqueue()
    drain()
    with transaction.atomic():
        staged = enqueue_on_commit("testapp.record", {"tag": "o"}, idempotency_key="w:outbox",
                                   unique_for="1h")
    assert OutboxEntry.objects.get(id=staged.id).unique_for_ms == 3_600_000
    drain()
    assert staged.job_id() == first.id  # relayed into the finished holder, no new job
    assert len(jobs_of("w:outbox")) == 1
    with transaction.atomic():
        fresh = enqueue_on_commit("testapp.record", {}, idempotency_key="w:outbox2",
                                  unique_for="forever")
    drain()
    job = Job.objects.get(id=fresh.job_id())
    assert job.unique_for_ms == -1 and key_row("w:outbox2").unique_for_ms is None


# --------------------------------------------------------------------------- maintenance --


def test_maintenance_deletes_the_rows_whose_window_ended_and_keeps_the_others():
    record.using(idempotency_key="w:old", unique_for=1).enqueue()
    record.using(idempotency_key="w:young", unique_for="1h").enqueue()
    record.using(idempotency_key="w:ever", unique_for="forever").enqueue()
    for n in range(5):  # more than one batch
        record.using(idempotency_key=f"w:batch{n}", unique_for=1).enqueue()
    drain()
    # A live holder (due in an hour, so drain leaves it) is never purged, whatever its window.
    record.using(idempotency_key="w:live", unique_for=1, delay=3600).enqueue()
    for key in ("w:old", *(f"w:batch{n}" for n in range(5))):
        wait_until_window_ended(key)
    assert get_engine().job_keys_purge_expired(batch_size=2) == 6
    assert set(JobKey.objects.values_list("key", flat=True)) == {"w:young", "w:live", "w:ever"}
    assert pruner.run_once().keys == 0
    # A key whose row was purged is free: the next windowed enqueue makes a job.
    assert record.using(idempotency_key="w:old", unique_for=1).enqueue().created


# --------------------------------------------------------------------------- bad input --


@pytest.mark.parametrize(("options", "message"), [
    ({"unique_for": "1h"}, "unique_for needs idempotency_key"),
    ({"idempotency_key": "k", "unique_for": 0}, "more than zero"),
    ({"idempotency_key": "k", "unique_for": "0s"}, "more than zero"),
    ({"idempotency_key": "k", "unique_for": timedelta(microseconds=100)}, "more than zero"),
    ({"idempotency_key": "k", "unique_for": -5}, "must not be negative"),
    ({"idempotency_key": "k", "unique_for": "soon"}, "is not a duration"),
    ({"idempotency_key": "k", "unique_for": "Forever"}, "is not a duration"),
    ({"idempotency_key": "k", "unique_for": True}, "expected a duration"),
    ({"idempotency_key": "k", "unique_for": float("inf")}, "finite"),
    ({"idempotency_key": "k", "unique_for": timedelta(days=40000)}, "more than 100 years"),
    ({"idempotency_key": "k", "unique_for": "1h", "debounce": 5}, "not both"),
])
def test_a_bad_unique_for_is_refused_before_anything_is_written(options, message):
    for attempt in (lambda: record.using(**options).enqueue(),
                    lambda: enqueue("testapp.record", {}, **options),
                    lambda: enqueue_many([("testapp.record", {}, options)]),
                    lambda: enqueue_on_commit("testapp.record", {}, **options)):
        with transaction.atomic():
            with pytest.raises(InvalidJobInput, match=message):
                attempt()
            # the caller's transaction is still usable
            assert not Job.objects.exists()
    assert not JobKey.objects.exists() and not OutboxEntry.objects.exists()


# ------------------------------------------------------------------------------ race --


def test_sixteen_threads_racing_on_a_finished_windowed_key_make_no_second_job():
    """Sixteen connections enqueue the same key at once, first while its job is live, then
    after it finished inside the window, then after the window ended: one job per window."""
    key = "w:race"

    def race() -> set:
        ids: list = []
        in_threads(lambda: ids.append(
            record.using(idempotency_key=key, unique_for=1).enqueue().id))
        return set(ids)

    first = race()
    assert len(first) == 1
    drain()
    assert race() == first  # finished inside the window
    wait_until_window_ended(key)
    second = race()
    assert len(second) == 1 and second != first
    assert len(jobs_of(key)) == 2
