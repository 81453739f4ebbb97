"""Inside a live application (docs/design.md, "Lock order"): real worker processes among the
application's own transactions never wait on a lock they do not own and never deadlock.

* The stress: thousands of short runs on two workers of tens of threads with 2 s leases, slots
  and children in the mix: PostgreSQL counts no deadlock and no run is handed back.
"""

from __future__ import annotations

import os
import random
import threading

from tests.conftest import wait_until

from .conftest import wait_started, wait_state

# The stress's size: XJOBS_STRESS_JOBS=20000 gives the figures of docs/performance.md.
STRESS_JOBS = int(os.environ.get("XJOBS_STRESS_JOBS", "3000"))


def deadlocks() -> int:
    """The deadlocks PostgreSQL has counted in this database (flushed first)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select pg_stat_force_next_flush()")
        cursor.execute("select deadlocks from pg_stat_database where datname = current_database()")
        return cursor.fetchone()[0]


def live_jobs() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select count(*) from only x_jobs"
                       " where state in ('ready', 'delayed', 'running', 'suspended', 'blocked')")
        return cursor.fetchone()[0]


def test_a_stress_of_short_runs_slots_and_children_has_no_deadlock_and_hands_nothing_back(
        start_worker):
    from django_xjobs import enqueue_many
    from django_xjobs.models import Job

    rng = random.Random(28)
    items: list[tuple[str, dict]] = []
    for n in range(STRESS_JOBS):
        ms = rng.randint(5, 120)
        if n % 10 == 0:
            items.append(("testapp.slotted_nap", {"group": n % 7, "ms": ms}))
        elif n % 100 == 1:
            items.append(("testapp.nap_parent", {"count": 20, "ms": rng.randint(5, 40)}))
        else:
            items.append(("testapp.nap", {"ms": ms}))
    before = deadlocks()
    workers = [start_worker(role, "--concurrency", "32", settings={"LEASE": "2s"}, wait=False)
               for role in ("one", "two")]
    for worker in workers:
        wait_started(worker)
    enqueue_many(items)
    wait_until(lambda: live_jobs() == 0, timeout=300, interval=0.2,
               message="every job of the stress to finish")
    logs = "\n".join(w.log() for w in workers)
    rows = Job.objects.values_list("state", "attempt", "rescues", "attempts")
    # A parent's suspensions are in its attempt history too; nothing else may be.
    handed_back = [(a, r, h) for _, a, r, h in rows
                   if a != 1 or r or any(e["outcome"] != "suspended" for e in h or ())]
    figures = {
        "jobs": len(rows), "deadlocks": deadlocks() - before,
        "deadlock lines": logs.count("deadlock detected"), "handed back": len(handed_back),
        "leases lost": logs.count("lease lost"),
    }
    print(f"\nstress figures: {figures}")
    assert figures["deadlocks"] == 0 and figures["deadlock lines"] == 0, figures
    assert {state for state, *_ in rows} == {"done"}
    assert handed_back == [], figures
    for marker in ("lease lost", "lease not proven", "no lease renewal", "handing it back"):
        assert marker not in logs


# ---------------------------------------------------------------------- a row held elsewhere --
# One worker runs a job J and three long jobs; another transaction then holds J's row for longer
# than the lease: a request's lock (a debounce of J's key, a select for update), an operator's
# cancel not committed yet, a windowed enqueue that lost to J. The worker's other runs, and
# jobs enqueued meanwhile, must not notice; J must run once.

HELD_LEASE = 3.0  # seconds; the long jobs nap 2.5 leases


def worker_waits_on_a_lock(worker_id: str) -> list[tuple]:
    """The worker's sessions that wait on a lock now (pg_stat_activity), with what they run."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "select pid, application_name, wait_event, query from pg_stat_activity"
            " where application_name like %s and wait_event_type = 'Lock'",
            [f"xjobs:{worker_id}:%"])
        return cursor.fetchall()


def db_now():
    from django_xjobs.engines import get_engine

    return get_engine().db_now()


def starts(job_id) -> list:
    from tests.testapp.models import Effect

    return list(Effect.objects.filter(job_id=str(job_id), kind="start")
                .values_list("attempt", flat=True))


# The four transactions held at once, each on a job J of its own (key "held-<kind>").
HOLDS = ("request", "debounce", "operator", "windowed")


def _enqueue_held(how: str):
    """J: a keyed job (with an idempotency window for the windowed kind)."""
    from tests.testapp import jobs

    options = {"idempotency_key": f"held-{how}",
               **({"unique_for": "1h"} if how == "windowed" else {})}
    return jobs.sleepy.using(**options).enqueue(seconds=HELD_LEASE, tag=f"held-{how}")


def _hold(how: str, held: list, locked: threading.Event, release: threading.Event) -> None:
    """In a transaction of its own, on a thread of its own, left open until ``release``: take
    J's row (``held[0]``) the way ``how`` says. ``windowed``: a windowed enqueue of J's key
    that loses the race for it to J: J is enqueued (and committed, by another session) between
    this enqueue's read of the key and its attempt to take it, so the attempt meets J's row."""
    from django.db import connections, transaction

    from django_xjobs import api, faults
    from django_xjobs.models import Job
    from tests.testapp import jobs

    def enqueue_j_first(point):
        enqueuer = threading.Thread(target=lambda: (held.append(_enqueue_held(how)),
                                                    connections.close_all()))
        enqueuer.start()
        enqueuer.join(30)

    try:
        with transaction.atomic():
            if how == "request":  # a view that locks the job it is about to change
                Job.objects.select_for_update().get(id=held[0].id)
            elif how == "debounce":  # a request that debounces the key of the running job
                jobs.sleepy.using(idempotency_key="held-debounce", debounce=60).enqueue(
                    seconds=0.01)
            elif how == "operator":  # an operator's cancel, not committed yet
                api.cancel(held[0].id, reason="operator, still in a transaction")
            elif how == "windowed":
                faults.inject_hook("before:job_enqueue_windowed", enqueue_j_first)
                lost = jobs.sleepy.using(idempotency_key="held-windowed", unique_for="1h"
                                         ).enqueue(seconds=HELD_LEASE, tag="lost")
                assert (lost.id, lost.created) == (held[0].id, False)
            else:
                raise AssertionError(how)
            locked.set()
            assert release.wait(120), "the test never released the transaction"
    finally:
        connections.close_all()


def test_transactions_held_open_past_the_lease_stall_nothing_else(start_worker):
    """Four transactions, held open at once past the lease: a request's select_for_update of a
    running job J, a debounce of another J's key, an operator's cancel of a third, a windowed
    enqueue that lost its key to a fourth."""
    from django_xjobs.models import Job
    from tests.testapp import jobs

    worker = start_worker("held", "--concurrency", "12",
                          settings={"LEASE": f"{HELD_LEASE}s", "HEARTBEAT": "1s"})
    others = [jobs.sleepy.enqueue(seconds=2.5 * HELD_LEASE, tag=f"long-{n}") for n in range(3)]
    found: dict[str, list] = {how: [] if how == "windowed" else [_enqueue_held(how)]
                              for how in HOLDS}
    started = [*others, *(job for jobs_of in found.values() for job in jobs_of)]
    wait_until(lambda: all(starts(j.id) for j in started),
               message="the Js and the long jobs to start")
    holders = {how: (threading.Event(), threading.Event()) for how in HOLDS}
    threads = [threading.Thread(target=_hold, args=(how, found[how], *holders[how]))
               for how in HOLDS]
    for thread in threads:
        thread.start()
    meanwhile: list = []
    try:
        for how, (locked, _release) in holders.items():
            assert locked.wait(30), how
        held = {how: found[how][0] for how in HOLDS}
        waits: list[tuple] = []

        def finished_meanwhile(ids):
            waits.extend(worker_waits_on_a_lock(worker.id))
            return Job.objects.filter(id__in=ids, state="done").count() == len(ids)

        wait_until(lambda: finished_meanwhile([o.id for o in others]), timeout=60,
                   message="the long jobs to finish while the transactions are open")
        meanwhile += [jobs.sleepy.enqueue(seconds=0.05, tag=f"new-{n}") for n in range(5)]
        wait_until(lambda: finished_meanwhile([m.id for m in meanwhile]), timeout=60,
                   message="the jobs enqueued meanwhile to finish while they are open")
        # A losing windowed enqueue holds nothing of its J's: that J was acknowledged meanwhile.
        wait_until(lambda: finished_meanwhile([held["windowed"].id]), timeout=60,
                   message="J to finish while the losing enqueue is open")
        # The other Js' rows are held: their runs went on, their leases kept beside the rows.
        for how in ("request", "debounce", "operator"):
            assert Job.objects.get(id=held[how].id).state == "running", how
        assert worker.log().count("its row is held by another transaction") >= 3
        assert waits == []  # no session of the worker ever waited on a lock
    finally:
        for _locked, release in holders.values():
            release.set()
        for thread in threads:
            thread.join(30)
        released = db_now()
    for how in HOLDS:
        expected = "cancelled" if how == "operator" else "done"
        assert wait_state(held[how].id, "done", "cancelled", "dead").state == expected, how
    pickups = [(j.started_at - j.created_at).total_seconds() * 1000
               for j in Job.objects.filter(id__in=[m.id for m in meanwhile])]
    settles = [(Job.objects.get(id=held[how].id).finished_at - released).total_seconds() * 1000
               for how in ("request", "debounce")]
    print(f"\nheld figures: the slowest pick-up of the jobs enqueued meanwhile "
          f"{max(pickups):.0f} ms; the held Js settled {max(settles):+.0f} ms after the "
          "transactions ended")
    for job in [*held.values(), *others, *meanwhile]:
        row = Job.objects.get(id=job.id)
        assert (row.attempt, row.rescues) == (1, 0), (job.id, row.attempts)
        assert starts(job.id) == [1]  # ran once
    log = worker.log()
    assert "deadlock detected" not in log
    lost = [line for line in log.splitlines() if "lease lost" in line]
    assert all(str(held["operator"].id) in line for line in lost), lost  # the cancel, only

