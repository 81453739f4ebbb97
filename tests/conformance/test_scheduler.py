"""Scheduler operations: the leader lease, the advisory lock, the cron watermark.

Written against the seam (engines/base.py); rows are put into states through the ORM models.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import transaction

from django_xjobs.engines import SessionLost
from django_xjobs.models import SchedulerLeader, SchedulerState
from django_xjobs.records import LeaderFence, LockedStates
from tests.conftest import wait_until

from .conftest import closing_connections

KEY = "scheduler"
LONG = 60_000


def fence(holder: str = "a", margin_ms: int = 0, pid: int | None = None) -> LeaderFence:
    return LeaderFence(lock_key=KEY, holder=holder, margin_ms=margin_ms, advisory_pid=pid)


def lapse(engine, lock_key: str = KEY) -> None:
    """Let the lease of ``lock_key`` run out: its expiry moves a second into the past (the
    database clock does not move inside a test's transaction)."""
    SchedulerLeader.objects.filter(lock_key=lock_key).update(
        expires_at=engine.db_now() - timedelta(seconds=1))


def state(name: str) -> SchedulerState:
    return SchedulerState.objects.get(task_name=name)


# ------------------------------------------------------------------------- the lease --


@pytest.mark.django_db
def test_an_unheld_lease_is_acquired_with_its_expiry_on_the_database_clock(engine):
    before = engine.db_now()

    expires_at = engine.leader_attempt_elect(KEY, "a", 30_000)

    assert expires_at is not None
    assert timedelta(seconds=29) < expires_at - before < timedelta(seconds=31)
    row = SchedulerLeader.objects.get(lock_key=KEY)
    assert (row.holder, row.expires_at) == ("a", expires_at)


@pytest.mark.django_db
def test_the_holder_renews_its_own_live_lease(engine):
    first = engine.leader_attempt_elect(KEY, "a", 1_000)

    renewed = engine.leader_attempt_elect(KEY, "a", LONG)

    assert renewed is not None and first is not None and renewed > first
    assert SchedulerLeader.objects.get(lock_key=KEY).expires_at == renewed


@pytest.mark.django_db
def test_another_holder_is_refused_while_the_lease_is_live(engine):
    engine.leader_attempt_elect(KEY, "a", LONG)

    assert engine.leader_attempt_elect(KEY, "b", LONG) is None
    assert SchedulerLeader.objects.get(lock_key=KEY).holder == "a"


@pytest.mark.django_db
def test_a_lapsed_lease_is_taken_over_by_another_holder(engine):
    engine.leader_attempt_elect(KEY, "a", LONG)
    lapse(engine)

    assert engine.leader_attempt_elect(KEY, "b", LONG) is not None
    assert SchedulerLeader.objects.get(lock_key=KEY).holder == "b"
    # ...and the old holder's renewal is now refused: it does not take the lease back.
    assert engine.leader_attempt_elect(KEY, "a", LONG) is None


@pytest.mark.django_db
def test_lock_keys_are_independent_leaderships(engine):
    assert engine.leader_attempt_elect("db-1", "a", LONG) is not None
    assert engine.leader_attempt_elect("db-2", "b", LONG) is not None


@pytest.mark.django_db
def test_only_the_holder_can_resign(engine):
    engine.leader_attempt_elect(KEY, "a", LONG)

    assert engine.leader_resign(KEY, "b") is False
    assert SchedulerLeader.objects.filter(lock_key=KEY, holder="a").exists()
    assert engine.leader_resign(KEY, "a") is True
    assert not SchedulerLeader.objects.exists()
    # Resigned: the next attempt of anyone wins at once, without waiting for a lapse.
    assert engine.leader_attempt_elect(KEY, "b", LONG) is not None


@pytest.mark.django_db
def test_a_late_resign_of_a_former_holder_leaves_the_new_leaders_lease(engine):
    engine.leader_attempt_elect(KEY, "a", LONG)
    lapse(engine)
    engine.leader_attempt_elect(KEY, "b", LONG)

    assert engine.leader_resign(KEY, "a") is False
    assert SchedulerLeader.objects.get(lock_key=KEY).holder == "b"


@pytest.mark.django_db
def test_leader_get_reports_the_holder_and_whether_the_lease_is_live(engine):
    assert engine.leader_get(KEY) is None
    engine.leader_attempt_elect(KEY, "a", LONG)

    record = engine.leader_get(KEY)
    assert record is not None and (record.holder, record.mode) == ("a", "lease")
    lapse(engine)
    record = engine.leader_get(KEY)
    assert record is not None and record.holder == "a" and record.live is False


# ---------------------------------------------------------------------- advisory lock --


@pytest.fixture
def sessions(engine):
    if not engine.features.advisory_locks:
        pytest.skip("engine has no session advisory locks")
    opened = []

    def open_session(label: str = "xjobs:tests:leader", lock_key: str = KEY):
        session = engine.leader_advisory_session(lock_key, label)
        opened.append((lock_key, session))
        return session

    yield open_session
    for _, session in opened:
        session.close()
    # A closed session's backend ends a moment later, and its lock with it: wait for every key
    # a session of this test held, or the next test may still see one of them held (it did, on
    # a loaded machine: the managers variant of a test found the postgres variant's "db-1").
    closed = {getattr(session, "backend_pid", None) for _, session in opened}

    def released():
        holders = (engine.leader_advisory_holder(key) for key in {key for key, _ in opened})
        return all(holder is None or holder.pid not in closed for holder in holders)

    wait_until(released, timeout=15, message="the closed sessions' advisory lock to go")


@pytest.mark.django_db
def test_one_advisory_session_holds_the_lock_and_another_is_refused(engine, sessions):
    a, b = sessions(), sessions()

    assert a.try_lock() is True
    assert b.try_lock() is False
    assert (a.holds(), b.holds()) == (True, False)


@pytest.mark.django_db
def test_unlocking_or_closing_the_session_releases_the_advisory_lock(engine, sessions):
    a, b, c = sessions(), sessions(), sessions()
    a.try_lock()
    a.unlock()
    assert b.try_lock() is True

    b.close()  # the session ends: the server releases its locks with it

    assert wait_until(c.try_lock, timeout=15, message="the lock of a closed session to free")


@pytest.mark.django_db
def test_a_closed_session_reports_itself_lost(engine, sessions):
    a = sessions()
    a.close()

    with pytest.raises(SessionLost):
        a.holds()


@pytest.mark.django_db
def test_the_advisory_holder_is_named_by_its_sessions_application_name(engine, sessions):
    assert engine.leader_advisory_holder(KEY) is None
    a = sessions(label="xjobs:worker-7:leader")
    a.try_lock()

    record = engine.leader_advisory_holder(KEY)

    assert record is not None
    assert (record.mode, record.holder, record.pid) == ("advisory", "xjobs:worker-7:leader",
                                                        a.backend_pid)


@pytest.mark.django_db
def test_advisory_locks_of_other_keys_do_not_interfere(engine, sessions):
    assert sessions(lock_key="db-1").try_lock() and sessions(lock_key="db-2").try_lock()


# ---------------------------------------------------------------------- state rows --


@pytest.mark.django_db
def test_ensure_creates_missing_rows_at_the_given_time_and_leaves_existing_ones(engine):
    now = engine.db_now()
    old = now - timedelta(days=3)
    SchedulerState.objects.create(task_name="existing", last_fired_at=old)
    engine.leader_attempt_elect(KEY, "a", LONG)

    created = engine.scheduler_states_ensure(["existing", "new"], now, fence())

    assert created == 1
    assert state("existing").last_fired_at == old
    assert state("new").last_fired_at == now and state("new").paused is False


@pytest.mark.django_db
def test_ensure_by_a_process_that_does_not_lead_creates_nothing(engine):
    engine.leader_attempt_elect(KEY, "a", LONG)

    assert engine.scheduler_states_ensure(["new"], engine.db_now(), fence("b")) == 0
    assert not SchedulerState.objects.exists()


def lock(engine, names, f: LeaderFence | None = None) -> LockedStates:
    return engine.scheduler_states_lock_if_leading(names, f or fence())


def mark(engine, names, at, f: LeaderFence | None = None) -> dict:
    return engine.scheduler_states_mark_if_leading(names, at, f or fence())


@pytest.mark.django_db
def test_the_leader_locks_the_due_tasks_and_reads_their_watermarks(engine):
    at = engine.db_now() - timedelta(minutes=1)
    SchedulerState.objects.create(task_name="t", last_fired_at=at, paused=True)
    SchedulerState.objects.create(task_name="u", last_fired_at=at - timedelta(hours=1))
    SchedulerState.objects.create(task_name="other", last_fired_at=at)
    engine.leader_attempt_elect(KEY, "a", LONG)

    with engine.atomic():
        locked = lock(engine, ["t", "u", "missing"])

    assert locked == LockedStates(leading=True, paused=frozenset({"t"}),
                                  watermarks={"t": at, "u": at - timedelta(hours=1)})


@pytest.mark.django_db
def test_a_process_that_does_not_lead_locks_nothing(engine):
    SchedulerState.objects.create(task_name="t", last_fired_at=engine.db_now())
    engine.leader_attempt_elect(KEY, "a", LONG)

    with engine.atomic():
        assert lock(engine, ["t"], fence("b")) == LockedStates(leading=False)


@pytest.mark.django_db
def test_the_fence_fails_when_less_than_the_margin_of_the_lease_is_left(engine):
    SchedulerState.objects.create(task_name="t", last_fired_at=engine.db_now())
    engine.leader_attempt_elect(KEY, "a", 10_000)

    with engine.atomic():
        assert lock(engine, ["t"], fence(margin_ms=5_000)).leading
        assert not lock(engine, ["t"], fence(margin_ms=20_000)).leading


@pytest.mark.django_db
def test_a_lapsed_lease_fences_its_holder_out(engine):
    SchedulerState.objects.create(task_name="t", last_fired_at=engine.db_now())
    engine.leader_attempt_elect(KEY, "a", LONG)
    lapse(engine)

    with engine.atomic():
        assert lock(engine, ["t"]).leading is False


@pytest.mark.django_db(transaction=True)
def test_tasks_locked_by_another_round_are_skipped_not_waited_for(engine):
    if not engine.features.skip_locked:
        pytest.skip("engine does not skip locked rows")
    at = engine.db_now()
    SchedulerState.objects.create(task_name="held", last_fired_at=at)
    SchedulerState.objects.create(task_name="free", last_fired_at=at)
    engine.leader_attempt_elect(KEY, "a", LONG)
    locked, release, gave_up = threading.Event(), threading.Event(), threading.Event()

    @closing_connections
    def other_round():
        with transaction.atomic():
            assert lock(engine, ["held"]).watermarks == {"held": at}
            locked.set()
            if not release.wait(timeout=20):
                gave_up.set()

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(other_round)
        assert locked.wait(timeout=20)
        try:
            with engine.atomic():
                ours = lock(engine, ["free", "held"])
            assert not gave_up.is_set(), "the lock waited for the other round"
        finally:
            release.set()
            holder.result(timeout=30)

    assert ours == LockedStates(leading=True, watermarks={"free": at})
    with engine.atomic():
        assert lock(engine, ["free", "held"]).watermarks == {"free": at, "held": at}


@pytest.mark.django_db
def test_mark_moves_the_watermarks_forward(engine):
    start = engine.db_now() - timedelta(hours=1)
    for name in ("t", "u"):
        SchedulerState.objects.create(task_name=name, last_fired_at=start)
    engine.leader_attempt_elect(KEY, "a", LONG)
    later = start + timedelta(minutes=30)

    assert mark(engine, ["t", "u"], later) == {"t": later, "u": later}
    assert state("t").last_fired_at == later == state("u").last_fired_at
    assert mark(engine, [], later) == {}


@pytest.mark.django_db
def test_an_older_round_never_rewinds_the_watermark(engine):
    # Two rounds overlapping across a rolling restart: the newer one commits first.
    newer = engine.db_now()
    older = newer - timedelta(minutes=5)
    SchedulerState.objects.create(task_name="t", last_fired_at=older - timedelta(minutes=1))
    SchedulerState.objects.create(task_name="u", last_fired_at=older - timedelta(minutes=1))
    engine.leader_attempt_elect(KEY, "a", LONG)
    mark(engine, ["t"], newer)

    assert mark(engine, ["t", "u"], older) == {"t": newer, "u": older}
    assert state("t").last_fired_at == newer


@pytest.mark.django_db
def test_mark_by_a_process_that_does_not_lead_writes_nothing(engine):
    start = engine.db_now() - timedelta(hours=1)
    SchedulerState.objects.create(task_name="t", last_fired_at=start)
    engine.leader_attempt_elect(KEY, "a", LONG)

    assert mark(engine, ["t"], engine.db_now(), fence("b")) == {}
    assert state("t").last_fired_at == start


@pytest.mark.django_db
def test_the_advisory_fence_passes_only_for_the_session_that_holds_the_lock(engine, sessions):
    start = engine.db_now() - timedelta(hours=1)
    SchedulerState.objects.create(task_name="t", last_fired_at=start)
    a, b = sessions(), sessions()
    a.try_lock()
    now = engine.db_now()

    assert mark(engine, ["t"], now, fence(pid=b.backend_pid)) == {}
    assert mark(engine, ["t"], now, fence(pid=a.backend_pid)) == {"t": now}
    with engine.atomic():
        assert lock(engine, ["t"], fence(pid=a.backend_pid)).leading
    a.close()
    wait_until(lambda: engine.leader_advisory_holder(KEY) is None, timeout=15,
               message="the closed session's lock to free")
    assert mark(engine, ["t"], now + timedelta(seconds=1), fence(pid=a.backend_pid)) == {}


@pytest.mark.django_db
def test_states_list_returns_every_row_by_name(engine):
    now = engine.db_now()
    SchedulerState.objects.create(task_name="b", last_fired_at=now, paused=True)
    SchedulerState.objects.create(task_name="a", last_fired_at=now - timedelta(minutes=1))

    rows = engine.scheduler_states_list()

    assert [(r.task_name, r.paused) for r in rows] == [("a", False), ("b", True)]
    assert rows[0].last_fired_at == now - timedelta(minutes=1)


@pytest.mark.django_db
def test_pausing_a_task_that_never_ran_creates_its_row_from_now(engine):
    now = engine.db_now()  # the test's transaction: the database clock stands still

    record = engine.scheduler_state_set_paused("t", True)

    assert (record.task_name, record.paused, record.last_fired_at) == ("t", True, now)
    assert record.updated_at == now


@pytest.mark.django_db
def test_pause_keeps_the_watermark_and_resume_moves_it_to_now_never_back(engine):
    now = engine.db_now()  # the test's transaction: the database clock stands still
    old = now - timedelta(hours=2)
    SchedulerState.objects.create(task_name="t", last_fired_at=old)

    paused = engine.scheduler_state_set_paused("t", True)
    assert (paused.paused, paused.last_fired_at) == (True, old)
    resumed = engine.scheduler_state_set_paused("t", False)
    assert (resumed.paused, resumed.last_fired_at, resumed.updated_at) == (False, now, now)
    # A watermark already past now (a round's, on its carried-forward clock) is not rewound.
    later = now + timedelta(seconds=30)
    SchedulerState.objects.filter(task_name="t").update(last_fired_at=later)
    again = engine.scheduler_state_set_paused("t", False)
    assert again.last_fired_at == later
