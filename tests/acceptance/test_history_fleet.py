"""History tables under faults, with real worker processes (docs/design.md, "History tables").

The scheduler leader's maintenance thread moves finished jobs out of ``x_jobs`` into
``x_jobs_<state>_<day>`` every second (``ARCHIVE_AFTER`` is 0 s or 2 s here, so it moves them
while the fleet drains): the leader is SIGKILLed, its archiving backend terminated mid-batch,
the leader frozen past its lease and resumed, and an archived dead job retried. What each test
checks, from the database (``assert_history``): every job exists once across ``x_jobs`` and its
children, ended in the state it should, and sits in the history table of its state and day with
its steps in the matching ``x_job_steps_*`` table; every body and durable step ran once.

"Once", exactly: a worker killed or frozen while it ran jobs leaves them to be rescued after
their lease (at least once, docs/guarantees.md). A run of the faulted process may therefore be
followed by one more run of the same thing, on a rescued job; no other repetition is allowed,
and a process the test left alone runs each body and each step at most once.
"""

from __future__ import annotations

import os
import signal
from collections import defaultdict

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now

from django_xjobs import api
from django_xjobs.models import SchedulerLeader
from tests.conftest import wait_until
from tests.leases import lapse_leader, lapse_worker
from tests.testapp.jobs import dead_then_done, sleepy, two_steps
from tests.testapp.models import Effect

from .conftest import (
    FAST,
    LEADER,
    SETTLE,
    STARTUP,
    backends,
    terminate_backend,
    wait_exit,
    wait_started,
)

pytestmark = pytest.mark.acceptance

# Leadership moves when the test lapses the leader's long lease (tests/leases.py); finished jobs
# move at the next archive tick; a small batch (the archive moves ten times MAINTENANCE_BATCH
# per statement: 30), so a tick sends several archive statements while the fleet drains.
FLEET = {**FAST, **LEADER, "MAINTENANCE_INTERVAL": "2s", "ARCHIVE_AFTER": "0s",
         "MAINTENANCE_BATCH": 3}

RECORD = "testapp.record"
TWO_STEPS = "testapp.two_steps"
SLEEPY = "testapp.sleepy"


# ------------------------------------------------------------------------------ helpers --


def enqueue_fleet(n: int, tag: str) -> list[str]:
    """n jobs: every fifth a durable ``two_steps``, the others ``record``, half of them keyed."""
    items: list[tuple] = []
    for i in range(n):
        if i % 5 == 4:
            items.append((TWO_STEPS, {}))
        elif i % 2:
            items.append((RECORD, {"tag": f"{tag}-{i}"}, {"idempotency_key": f"{tag}-{i}"}))
        else:
            items.append((RECORD, {"tag": f"{tag}-{i}"}))
    return [str(h.id) for h in api.enqueue_many(items)]


def rows(sql: str, params: list | dict | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def lease_holder() -> str | None:
    return (SchedulerLeader.objects.filter(lock_key="scheduler", expires_at__gt=Now())
            .values_list("holder", flat=True).first())


def still_hot(ids: list[str]) -> int:
    """How many of ``ids`` are not done yet, or done and still in ``x_jobs`` itself."""
    return rows("select count(*) from x_jobs where id = any(%s::uuid[])"
                " and (state <> 'done' or tableoid = 'x_jobs'::regclass)", [ids])[0][0]


def archived(ids: list[str]) -> int:
    return rows("select count(*) from x_jobs where id = any(%s::uuid[])"
                " and tableoid <> 'x_jobs'::regclass", [ids])[0][0]


def wait_archived(ids: list[str], timeout: float = SETTLE) -> None:
    wait_until(lambda: still_hot(ids) == 0, timeout=timeout, interval=0.1,
               message=f"{len(ids)} jobs done and moved into the history tables")


def archiving(label: str, waiting_on_lock: bool = False) -> int | None:
    """The pid of the backend named ``label`` while it runs an archive statement."""
    found = rows("select pid from pg_stat_activity where datname = current_database()"
                 " and application_name = %s and state = 'active'"
                 " and query like '%%jobs_archive%%'"
                 " and (not %s or wait_event_type = 'Lock')", [label, waiting_on_lock])
    return found[0][0] if found else None


def last_statement(label: str) -> str:
    """The statement the backend named ``label`` runs, or ran last once it is idle."""
    found = rows("select state || ': ' || query from pg_stat_activity"
                 " where datname = current_database() and application_name = %s", [label])
    assert len(found) == 1, f"one backend named {label}: {found}"
    return found[0][0]


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def assert_history(ids: list[str], *, faulted: frozenset[int] = frozenset()) -> None:
    """The invariants of the module docstring, for the jobs ``ids`` (all expected done);
    ``faulted``: the pids whose runs a fault may have cut short."""
    assert rows("select id from x_jobs group by id having count(*) > 1") == [], "a job doubled"
    located = rows("select id::text, state, tableoid::regclass::text, run_id::text, name,"
                   " rescues, to_char(finished_at at time zone 'UTC', 'YYYYMMDD'),"
                   " coalesce(input->>'tag', '') from x_jobs where id = any(%s::uuid[])", [ids])
    assert sorted(r[0] for r in located) == sorted(ids), "every job exactly once"
    assert rows("select count(*) from only x_jobs where id = any(%s::uuid[])", [ids]) == [(0,)]
    wrong = [r for r in located if (r[1], r[2]) != ("done", f"x_jobs_done_{r[6]}")]
    assert wrong == [], "every job done, in the history table of its day"

    steps: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for run_id, name, table in rows(
            "select run_id::text, name, tableoid::regclass::text from x_job_steps"
            " where run_id = any(%s::uuid[])", [[r[3] for r in located]]):
        steps[run_id].append((name, table))
    for job_id, _, table, run_id, name, *_ in located:
        steps_table = table.replace("x_jobs_", "x_job_steps_")
        expected = [("first", steps_table), ("second", steps_table)] if name == TWO_STEPS else []
        assert sorted(steps.get(run_id, [])) == expected, f"the steps of {job_id}"

    runs: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for job_id, kind, tag, pid in Effect.objects.filter(job_id__in=ids).values_list(
            "job_id", "kind", "tag", "pid"):
        runs[(job_id, kind, tag)].append(pid)
    for job_id, _, _, _, name, rescues, _, tag in located:
        # Each body (its start, or its exit) and each durable step: what one run leaves.
        wanted = {TWO_STEPS: [("step", "first"), ("step", "second"), ("exit", "")],
                  SLEEPY: [("start", tag), ("end", tag)]}.get(name, [("start", tag)])
        assert {(k, t) for (j, k, t) in runs if j == job_id} == set(wanted), job_id
        for kind, what in wanted:
            pids = runs[(job_id, kind, what)]
            cut_short = [p for p in pids if p in faulted]
            assert len(pids) - len(cut_short) <= 1, (
                f"{job_id}: {kind} {what!r} ran {len(pids)} times, pids {pids}")
            assert len(pids) == 1 or (rescues >= 1 and len(pids) == 2 and cut_short), (
                f"{job_id}: {kind} {what!r} ran {len(pids)} times though no fault cut its "
                f"run short (pids {pids}, rescues {rescues})")


# -------------------------------------------------------------------------------- tests --


def test_the_archiving_leader_sigkilled_mid_batch_loses_nor_doubles_anything(start_worker):
    a = start_worker("a", settings=FLEET)
    wait_until(lambda: lease_holder() == a.id, timeout=SETTLE, message="A to lead")
    b = start_worker("b", settings=FLEET)
    first = enqueue_fleet(300, "kill-1")

    # Killed while an archive statement of its maintenance thread is on the server, once it
    # has moved some of the fleet's jobs: the statement commits or not as a whole, whichever
    # way the server ends it. Should the fleet be through before the test sees one, another
    # wave keeps A archiving.
    polls = 0

    def in_archive() -> int | None:
        nonlocal polls
        polls += 1
        if polls % 200 == 0 and still_hot(first) == 0:
            first.extend(enqueue_fleet(100, f"kill-1-{polls}"))
        pid = archiving(f"xjobs:{a.id}:maintenance")
        return pid if pid and archived(first) else None

    wait_until(in_archive, timeout=SETTLE, interval=0.002,
               message="A's maintenance thread in an archive statement")
    os.kill(a.pid, signal.SIGKILL)
    a.wait(timeout=30)
    lapse_leader(a)
    lapse_worker(a, none_ok=True)  # the runs it was in, if any
    second = enqueue_fleet(60, "kill-2")
    wait_until(lambda: lease_holder() == b.id, timeout=SETTLE, interval=0.05,
               message="B to take the leadership over")
    restarted = start_worker("a-again", settings=FLEET)
    third = enqueue_fleet(60, "kill-3")

    wait_archived(first + second + third)
    for w in (b, restarted):
        w.signal(signal.SIGTERM)
    assert [wait_exit(w) for w in (b, restarted)] == [0, 0]
    assert_history(first + second + third, faulted=frozenset({a.pid}))


def test_a_terminated_archive_batch_moves_nothing_and_the_next_tick_moves_it_all(
        start_worker):
    # One batch takes every job finished two seconds ago; the test holds a row lock on one
    # step of the first job, so the batch, which moves that step too, waits on it: a batch
    # under way, its jobs locked, nothing of it committed. Then its backend is terminated.
    settings = {**FLEET, "ARCHIVE_AFTER": "2s", "MAINTENANCE_BATCH": 100_000}
    a = start_worker("a", settings=settings)
    wait_until(lambda: lease_holder() == a.id, timeout=SETTLE, message="A to lead")
    b = start_worker("b", settings=settings)
    blocker = two_steps.enqueue()
    wait_until(lambda: rows("select state from only x_jobs where id = %s",
                            [str(blocker.id)]) == [("done",)],
               timeout=SETTLE, interval=0.02, message="the first job done, not yet archived")
    db = connection.settings_dict
    holder = psycopg.connect(dbname=db["NAME"], user=db["USER"],
                             host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432,
                             password=db["PASSWORD"] or None, autocommit=False)
    try:
        locked = holder.execute("select id from only x_job_steps where run_id = %s for update",
                                [blocker.run_id]).fetchall()
        assert len(locked) == 2, "the first job's steps, not yet archived"
        ids = [str(blocker.id), *enqueue_fleet(250, "term")]

        label = f"xjobs:{a.id}:maintenance"
        pid = wait_until(lambda: archiving(label, waiting_on_lock=True), timeout=SETTLE,
                         interval=0.05, message="A's archive batch waiting on the step lock")
        # Under way: its jobs are locked (a SKIP LOCKED reader misses them), yet every job is
        # still where it was, once, for every other session. One statement reads both sides
        # with one snapshot: B finishes more of the fleet between two statements.
        assert rows("with seen as (select id from only x_jobs where state = 'done'"
                    "  and id = any(%(ids)s::uuid[])),"
                    " free as (select id from only x_jobs where state = 'done'"
                    "  and id = any(%(ids)s::uuid[]) for update skip locked)"
                    " select %(first)s::uuid in (select id from seen),"
                    " %(first)s::uuid in (select id from free)",
                    {"ids": ids, "first": str(blocker.id)}) == [(True, False)]
        assert rows("select count(*) from x_jobs where id = any(%s::uuid[])", [ids]) == [
            (len(ids),)]
        assert terminate_backend(pid)
    finally:
        holder.rollback()
        holder.close()

    wait_archived(ids)
    assert [p for p, _ in backends(label)] not in ([], [pid]), "a new maintenance connection"
    assert "maintenance failed" in a.log()
    for w in (a, b):
        w.signal(signal.SIGTERM)
    assert [wait_exit(w) for w in (a, b)] == [0, 0]
    assert_history(ids)


def test_a_leader_frozen_in_its_archive_is_replaced_and_its_late_batch_moves_nothing_twice(
        start_worker):
    # A claims these first and is in their bodies when it freezes: B rescues them.
    ids = [str(sleepy.enqueue(seconds=2.0, tag=f"slow-{i}").id) for i in range(4)]
    ids += enqueue_fleet(150, "stop")
    # A stops itself right before its first archive statement, so that statement goes out
    # late, after SIGCONT, with the cutoff A computed before it froze; and again right after
    # it, so the test sees that statement sent before A's round moves on to the next one.
    a = start_worker("a", settings=FLEET, wait=False,
                     faults="before:jobs_archive=stop*1;after:jobs_archive=stop*1")
    wait_until(lambda: stopped(a.pid), timeout=STARTUP + SETTLE, interval=0.02,
               message="A frozen at its first archive batch")
    # Only a leader archives; its lease, lapsed now, is the last one taken.
    assert list(SchedulerLeader.objects.values_list("holder", flat=True)) == [a.id]
    lapse_leader(a)
    lapse_worker(a, none_ok=True)  # the runs it was in, if any
    b = start_worker("b", settings=FLEET)
    wait_until(lambda: lease_holder() == b.id, timeout=SETTLE, interval=0.05,
               message="B to take the leadership over")

    # B drains the rest (A's claimed jobs, their leases lapsed) and archives everything.
    wait_archived(ids)
    assert stopped(a.pid), "B archived it all while A was frozen"
    label = f"xjobs:{a.id}:maintenance"
    assert "jobs_archive" not in last_statement(label), "A's archive statement not sent yet"
    os.kill(a.pid, signal.SIGCONT)
    # The late batch goes out (A checked its leadership before it froze), and finds nothing
    # of what B moved: a job is in x_jobs or in its history table, and only x_jobs is read.
    # A stops again right after it, before its round sends anything else on that connection
    # (polling for the statement could miss it: the round's next one follows at once).
    wait_until(lambda: stopped(a.pid), timeout=SETTLE, interval=0.02,
               message="A stopped after its late archive batch")
    assert "jobs_archive" in last_statement(label), "A's late archive batch"
    os.kill(a.pid, signal.SIGCONT)
    more = enqueue_fleet(30, "stop-after")
    wait_archived(more)
    for w in (a, b):
        w.signal(signal.SIGTERM)
    # A stopping joins its maintenance thread: its late batch is over.
    assert [wait_exit(w) for w in (a, b)] == [0, 0]
    assert "is no longer the leader" in a.log()
    assert_history(ids + more, faulted=frozenset({a.pid}))


def test_an_archived_dead_job_retried_while_the_fleet_runs_runs_once_more_and_is_filed_again(
        start_worker):
    a, b = (start_worker(role, settings=FLEET, wait=False) for role in ("a", "b"))
    for worker in (a, b):  # started side by side
        wait_started(worker)
    job = dead_then_done.enqueue()
    job_id, run_id = str(job.id), str(job.run_id)

    def tables() -> tuple[set[str], set[str]]:
        return ({t for (t,) in rows("select tableoid::regclass::text from x_jobs"
                                    " where id = %s", [job_id])},
                {t for (t,) in rows("select tableoid::regclass::text from x_job_steps"
                                    " where run_id = %s", [run_id])})

    def filed(state: str) -> bool:
        jobs, steps = tables()
        return (len(jobs) == 1 and next(iter(jobs)).startswith(f"x_jobs_{state}_")
                and steps == {next(iter(jobs)).replace("x_jobs_", "x_job_steps_")})

    wait_until(lambda: filed("dead"), timeout=SETTLE, interval=0.05,
               message="the dead job and its step in the history tables")
    background = enqueue_fleet(100, "retry")
    call_command("xjobs", "retry", job_id)  # while the fleet drains and archives

    wait_until(lambda: filed("done"), timeout=SETTLE, interval=0.05,
               message="the retried job done and filed again")
    wait_archived(background)
    for w in (a, b):
        w.signal(signal.SIGTERM)
    assert [wait_exit(w) for w in (a, b)] == [0, 0]
    assert rows("select count(*) from x_jobs where id = %s", [job_id]) == [(1,)]
    assert api.get_job(job_id).result == {"charged": {"charged": 1}, "attempt": 1}
    kinds = sorted(Effect.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert kinds == ["start", "start", "step"], "the body twice, the completed step once"
    assert_history(background)
