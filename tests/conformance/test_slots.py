"""Concurrency slots through the engine seam: acquire, renew, release, list, usage, and the
batch hand-back of refused claims (django_xjobs/slots.py has the protocol).

Rows are set up through the seam, or through the ORM where a test needs a state no statement
makes on demand (a slot another holder took over); nothing here speaks SQL.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_xjobs.models import Job, JobLease
from django_xjobs.records import Claim, Failure, Requeue, SlotHold, SlotRequest
from tests.conformance.conftest import claim, closing_connections, enqueue
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TTL_MS = 60_000


def holder(name: str = "") -> str:
    return f"{uuid.uuid4()}/{uuid.uuid4()}/worker-{name or 'x'}"


def request(key: str, limit: int, who: str | None = None) -> SlotRequest:
    return SlotRequest(slot_key=key, limit=limit, holder=who or holder())


def acquire_one(engine, key: str, limit: int, *, ttl_ms: int = TTL_MS) -> SlotHold | None:
    granted = engine.slots_acquire([request(key, limit)], ttl_ms)
    assert len(granted) <= 1
    return granted[0] if granted else None


def live_slots(engine, key: str) -> dict[int, str]:
    return {r.slot: r.holder for r in engine.slots_list(slot_key=key)}


def wait_slot_lapsed(engine, hold: SlotHold) -> None:
    """Until ``hold`` is no longer live on the database clock."""
    wait_until(lambda: live_slots(engine, hold.slot_key).get(hold.slot) != hold.holder,
               timeout=15, interval=0.005, message=f"slot {hold} to lapse")


# ------------------------------------------------------------------------------- acquire --


def test_an_acquire_takes_the_lowest_free_slot(engine):
    first = acquire_one(engine, "k", 3)
    second = acquire_one(engine, "k", 3)
    assert (first.slot, second.slot) == (0, 1)
    assert engine.slots_release_if_held([first]) == (1, [])

    again = acquire_one(engine, "k", 3)

    assert again.slot == 0
    assert live_slots(engine, "k") == {0: again.holder, 1: second.holder}


def test_no_slot_is_granted_past_the_limit(engine):
    granted = [acquire_one(engine, "k", 2) for _ in range(4)]

    assert [g.slot if g else None for g in granted] == [0, 1, None, None]
    assert len(live_slots(engine, "k")) == 2


def test_a_refused_request_writes_nothing(engine):
    acquire_one(engine, "k", 1)
    before = list(JobLease.objects.values_list("lease_key", "slot", "holder", "expires_at"))

    assert acquire_one(engine, "k", 1) is None

    assert list(JobLease.objects.values_list("lease_key", "slot", "holder",
                                             "expires_at")) == before


def test_one_batch_grants_distinct_slots_of_one_key_up_to_the_limit(engine):
    requests = [request("k", 3) for _ in range(5)]

    granted = engine.slots_acquire(requests, TTL_MS)

    assert sorted(g.slot for g in granted) == [0, 1, 2]
    assert {g.holder for g in granted} <= {r.holder for r in requests}
    # The earliest requests of the batch are the ones served.
    assert {g.holder for g in granted} == {r.holder for r in requests[:3]}
    assert live_slots(engine, "k") == {g.slot: g.holder for g in granted}


def test_one_batch_fills_the_gaps_between_held_slots(engine):
    held = [acquire_one(engine, "k", 4) for _ in range(4)]
    engine.slots_release_if_held([held[0], held[2]])

    granted = engine.slots_acquire([request("k", 4) for _ in range(3)], TTL_MS)

    assert sorted(g.slot for g in granted) == [0, 2]


def test_one_batch_keeps_each_keys_limit_on_its_own(engine):
    requests = [request("one", 1) for _ in range(3)] + [request("three", 3) for _ in range(4)]

    granted = engine.slots_acquire(requests, TTL_MS)

    per_key: dict[str, list[int]] = {}
    for g in granted:
        per_key.setdefault(g.slot_key, []).append(g.slot)
    assert {k: sorted(v) for k, v in per_key.items()} == {"one": [0], "three": [0, 1, 2]}


def test_a_request_never_gets_a_slot_at_or_above_its_own_limit(engine):
    # Another job of the same key runs under a higher limit and holds slot 0.
    acquire_one(engine, "shared", 5)
    low, high = request("shared", 1), request("shared", 3)

    granted = engine.slots_acquire([high, low], TTL_MS)

    assert [(g.holder, g.slot) for g in granted] == [(high.holder, 1)]


def greedy(held: set[int], limits: list[int]) -> dict[int, int]:
    """The reference grant of one key's batch: requests by (limit, order), each taking the
    lowest slot still free if it is below its own limit. Request index -> slot."""
    taken, granted = set(held), {}
    for i in sorted(range(len(limits)), key=lambda i: (limits[i], i)):
        slot = next(s for s in range(max(limits) + max(held, default=0) + 2) if s not in taken)
        if slot < limits[i]:
            granted[i] = slot
            taken.add(slot)
    return granted


@hsettings(max_examples=40, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(held=st.sets(st.integers(0, 5), max_size=4),
       limits=st.lists(st.integers(1, 6), min_size=1, max_size=7))
def test_a_batch_grants_exactly_what_one_request_at_a_time_would(engine, held, limits):
    JobLease.objects.all().delete()
    for slot in sorted(held):  # pre-held slots, whatever their limit was
        JobLease.objects.create(lease_key="p", slot=slot, holder=holder("old"),
                                expires_at=engine.db_now() + timedelta(minutes=1))
    requests = [request("p", limit) for limit in limits]

    granted = engine.slots_acquire(requests, TTL_MS)

    by_holder = {g.holder: g.slot for g in granted}
    assert {i: by_holder[r.holder] for i, r in enumerate(requests)
            if r.holder in by_holder} == greedy(held, limits)


def test_a_lapsed_slot_is_taken_over_by_the_next_acquire(engine):
    stale = acquire_one(engine, "k", 1, ttl_ms=50)
    wait_slot_lapsed(engine, stale)

    fresh = acquire_one(engine, "k", 1)

    assert fresh is not None and fresh.slot == 0 and fresh.holder != stale.holder
    assert list(JobLease.objects.filter(lease_key="k").values_list("holder", flat=True)) == [
        fresh.holder
    ]


def test_a_live_slot_is_never_taken_over(engine):
    held = acquire_one(engine, "k", 1)

    assert acquire_one(engine, "k", 1) is None
    assert live_slots(engine, "k") == {0: held.holder}


def test_an_empty_batch_acquires_nothing(engine):
    assert engine.slots_acquire([], TTL_MS) == []


@pytest.mark.parametrize("round_", range(3))
def test_sixteen_threads_racing_for_the_last_slot_exactly_one_wins(engine, round_):
    key = f"race-{round_}"
    acquire_one(engine, key, 3)
    acquire_one(engine, key, 3)
    barrier = threading.Barrier(16)
    results: list[list] = []
    errors: list[BaseException] = []

    @closing_connections
    def contend() -> None:
        mine = engine  # one engine for every thread; each thread has its own connection
        mine.db_now()  # connected before the start line, so the race is the statement itself
        barrier.wait()
        try:
            results.append(mine.slots_acquire([request(key, 3)], TTL_MS))
        except BaseException as exc:  # a thread's failure must fail the test, not vanish
            errors.append(exc)

    threads = [threading.Thread(target=contend) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == []
    winners = [g for granted in results for g in granted]
    assert len(results) == 16
    assert len(winners) == 1
    assert winners[0].slot == 2
    assert len(live_slots(engine, key)) == 3


def test_sixteen_threads_racing_for_four_free_slots_never_get_more_than_four(engine):
    barrier = threading.Barrier(16)
    results: list = []

    @closing_connections
    def contend() -> None:
        mine = engine
        mine.db_now()
        barrier.wait()
        results.extend(mine.slots_acquire([request("wide", 4), request("wide", 4)], TTL_MS))

    threads = [threading.Thread(target=contend) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    slots = [g.slot for g in results]
    assert len(slots) == len(set(slots))
    assert 1 <= len(slots) <= 4
    assert set(slots) <= {0, 1, 2, 3}
    assert live_slots(engine, "wide") == {g.slot: g.holder for g in results}


# --------------------------------------------------------------------------------- renew --


def test_a_renewal_extends_a_held_slot(engine):
    held = acquire_one(engine, "k", 1, ttl_ms=5_000)
    before = JobLease.objects.get(lease_key="k").expires_at

    renewed = engine.slots_renew_if_held([held], TTL_MS)

    assert renewed.renewed == {held.holder}
    assert JobLease.objects.get(lease_key="k").expires_at > before


def test_a_lapsed_slot_is_not_revived_by_its_own_holder(engine):
    held = acquire_one(engine, "k", 1, ttl_ms=50)
    wait_slot_lapsed(engine, held)
    before = JobLease.objects.get(lease_key="k").expires_at

    renewed = engine.slots_renew_if_held([held], TTL_MS)

    assert renewed.held == frozenset()
    assert JobLease.objects.get(lease_key="k").expires_at == before
    assert live_slots(engine, "k") == {}


def test_a_renewal_of_a_slot_another_run_took_over_is_refused(engine):
    stale = acquire_one(engine, "k", 1, ttl_ms=50)
    wait_slot_lapsed(engine, stale)
    fresh = acquire_one(engine, "k", 1)

    assert engine.slots_renew_if_held([stale], TTL_MS).held == frozenset()
    assert live_slots(engine, "k") == {0: fresh.holder}


def test_a_renewal_by_another_holder_changes_nothing(engine):
    held = acquire_one(engine, "k", 1, ttl_ms=5_000)
    before = JobLease.objects.get(lease_key="k").expires_at
    impostor = SlotHold(slot_key="k", slot=held.slot, holder=holder("impostor"))

    assert engine.slots_renew_if_held([impostor], TTL_MS).held == frozenset()
    assert JobLease.objects.get(lease_key="k").expires_at == before


def test_one_renewal_answers_for_every_slot_of_the_batch(engine):
    kept = [acquire_one(engine, f"k{i}", 1) for i in range(5)]
    lapsed = acquire_one(engine, "short", 1, ttl_ms=50)
    wait_slot_lapsed(engine, lapsed)

    renewed = engine.slots_renew_if_held([*kept, lapsed], TTL_MS)

    assert renewed.renewed == {h.holder for h in kept} and renewed.kept == frozenset()


# ------------------------------------------------------------------------------- release --


def test_a_release_frees_the_slot_for_the_next_acquire(engine):
    held = acquire_one(engine, "k", 1)

    assert engine.slots_release_if_held([held]) == (1, [])

    assert live_slots(engine, "k") == {}
    assert acquire_one(engine, "k", 1).slot == 0


def test_a_release_by_another_holder_leaves_the_slot_held(engine):
    held = acquire_one(engine, "k", 1)
    impostor = SlotHold(slot_key="k", slot=0, holder=holder("impostor"))

    assert engine.slots_release_if_held([impostor]) == (0, [])
    assert live_slots(engine, "k") == {0: held.holder}


def test_a_holder_may_release_its_own_lapsed_row(engine):
    held = acquire_one(engine, "k", 1, ttl_ms=50)
    wait_slot_lapsed(engine, held)

    assert engine.slots_release_if_held([held]) == (1, [])
    assert not JobLease.objects.filter(lease_key="k").exists()


def test_a_late_release_never_frees_the_slot_of_the_run_that_took_it_over(engine):
    stale = acquire_one(engine, "k", 1, ttl_ms=50)
    wait_slot_lapsed(engine, stale)
    fresh = acquire_one(engine, "k", 1)

    assert engine.slots_release_if_held([stale]) == (0, [])
    assert live_slots(engine, "k") == {0: fresh.holder}


def test_releasing_nothing_is_free(engine):
    assert engine.slots_release_if_held([]) == (0, [])
    assert engine.slots_renew_if_held([], TTL_MS).held == frozenset()


# ------------------------------------------------------------------------- list, usage --


def test_the_list_shows_live_slots_with_holder_and_expiry(engine):
    a0 = acquire_one(engine, "a", 2, ttl_ms=TTL_MS)
    a1 = acquire_one(engine, "a", 2, ttl_ms=TTL_MS)
    b0 = acquire_one(engine, "b", 2, ttl_ms=TTL_MS)
    gone = acquire_one(engine, "c", 1, ttl_ms=50)
    wait_slot_lapsed(engine, gone)

    listed = engine.slots_list()

    assert [(r.slot_key, r.slot, r.holder) for r in listed] == [
        ("a", 0, a0.holder), ("a", 1, a1.holder), ("b", 0, b0.holder),
    ]
    assert all(0 < r.expires_in <= TTL_MS / 1000 for r in listed)
    assert all(r.expires_at > engine.db_now() for r in listed)
    assert [r.slot for r in engine.slots_list(slot_key="a")] == [0, 1]
    assert len(engine.slots_list(limit=1)) == 1


def test_usage_counts_live_slots_per_key_busiest_first(engine):
    for _ in range(3):
        acquire_one(engine, "busy", 5)
    acquire_one(engine, "calm", 5)
    gone = acquire_one(engine, "gone", 1, ttl_ms=50)
    wait_slot_lapsed(engine, gone)

    usage = engine.slots_usage()

    assert [(u.slot_key, u.held) for u in usage] == [("busy", 3), ("calm", 1)]
    assert all(u.next_expiry > engine.db_now() for u in usage)


# ------------------------------------------------------------- refused claims handed back --


def refused(claimed, delay_ms: int = 0) -> list[Requeue]:
    return [Requeue(claim=c.claim, delay_ms=delay_ms,
                    spent_attempt=not c.resumed, resumed=c.resumed) for c in claimed]


def test_a_batch_requeue_gives_back_the_attempts_the_claims_counted(engine):
    ids = {str(enqueue(engine).id) for _ in range(3)}
    claimed = claim(engine, n=3)
    assert {c.attempt for c in claimed} == {1}

    report = engine.jobs_requeue_if_owned(refused(claimed))

    assert report.owned == {c.lease_token for c in claimed}
    rows = Job.objects.filter(id__in=ids)
    assert {(r.state, r.attempt, tuple(r.worker_ids)) for r in rows} == {("ready", 0, ())}


def test_a_batch_requeue_makes_the_jobs_due_after_the_delay(engine):
    enqueue(engine)
    claimed = claim(engine, n=1)

    engine.jobs_requeue_if_owned(refused(claimed, delay_ms=60_000))

    row = Job.objects.get(id=claimed[0].id)
    assert row.state == "delayed"
    assert row.run_at > engine.db_now()
    assert claim(engine, n=1) == []


def test_a_job_refused_ten_times_still_runs_as_attempt_one(engine):
    enqueue(engine)
    for _ in range(10):
        engine.jobs_requeue_if_owned(refused(claim(engine, n=1)))

    final = claim(engine, n=1)

    assert final[0].attempt == 1
    assert Job.objects.get(id=final[0].id).worker_ids == ["worker-1"]


def test_a_batch_requeue_of_a_resumed_job_returns_it_to_suspended(engine):
    enqueue(engine)
    first = claim(engine, n=1)[0]
    Job.objects.filter(id=first.id).update(state="suspended", lease_token=None)
    resumed = claim(engine, n=1)[0]
    assert resumed.resumed and resumed.attempt == 1

    engine.jobs_requeue_if_owned(refused([resumed]))

    row = Job.objects.get(id=resumed.id)
    assert (row.state, row.attempt) == ("suspended", 1)


def test_a_batch_requeue_is_fenced_per_run(engine):
    from django_xjobs import api

    for _ in range(3):
        enqueue(engine)
    claimed = claim(engine, n=3)
    api.cancel(claimed[1].id)

    report = engine.jobs_requeue_if_owned(refused(claimed))

    assert report.owned == {claimed[0].lease_token, claimed[2].lease_token}
    assert report.lost == {claimed[1].lease_token}
    assert Job.objects.get(id=claimed[1].id).state == "cancelled"


def test_a_batch_requeue_retried_after_its_commit_reads_as_already_applied(engine):
    enqueue(engine)
    claimed = claim(engine, n=1)
    engine.jobs_requeue_if_owned(refused(claimed))

    again = engine.jobs_requeue_if_owned(refused(claimed))

    assert again.already_applied == {claimed[0].lease_token}
    assert Job.objects.get(id=claimed[0].id).attempt == 0  # not given back twice


# ------------------------------------------------------------------ refused jobs woken up --


def refs(claimed) -> list:

    return [c.claim for c in claimed]


def test_a_refused_job_is_woken_due_now(engine):
    enqueue(engine)
    claimed = claim(engine, n=1)
    engine.jobs_requeue_if_owned(refused(claimed, delay_ms=60_000))
    assert claim(engine, n=1) == []

    assert engine.jobs_wake_refused(refs(claimed)) == 1

    again = claim(engine, n=1)
    assert [c.id for c in again] == [claimed[0].id]
    assert again[0].attempt == 1


def test_a_job_claimed_since_its_refusal_is_not_woken(engine):
    enqueue(engine)
    first = claim(engine, n=1)
    engine.jobs_requeue_if_owned(refused(first, delay_ms=50))
    wait_until(lambda: claim(engine, n=1, worker="worker-2"), message="the job to be due")
    # Claimed again by worker-2, which failed it into a long backoff.
    row = Job.objects.get(id=first[0].id)

    engine.job_fail_if_owned(Failure(
        claim=Claim(job_id=str(row.id), lease_token=str(row.lease_token)),
                                     error="boom", retry_delay_ms=60_000))
    before = Job.objects.get(id=row.id).run_at

    assert engine.jobs_wake_refused(refs(first)) == 0

    assert Job.objects.get(id=row.id).run_at == before


def test_waking_touches_only_jobs_still_waiting(engine):
    for _ in range(3):
        enqueue(engine)
    claimed = claim(engine, n=3)
    engine.jobs_requeue_if_owned(refused(claimed[:1], delay_ms=60_000))  # waiting
    engine.jobs_requeue_if_owned(refused(claimed[1:2], delay_ms=0))  # already due
    # claimed[2] is still running under its claim.

    assert engine.jobs_wake_refused(refs(claimed)) == 1
    assert Job.objects.get(id=claimed[2].id).state == "running"


def test_a_refused_resume_is_woken_and_stays_a_resume(engine):
    enqueue(engine)
    first = claim(engine, n=1)[0]
    Job.objects.filter(id=first.id).update(state="suspended", lease_token=None)
    resumed = claim(engine, n=1)[0]
    engine.jobs_requeue_if_owned(refused([resumed], delay_ms=60_000))

    assert engine.jobs_wake_refused(refs([resumed])) == 1

    again = claim(engine, n=1)[0]
    assert again.resumed and again.attempt == 1
