"""The soak's invariant checks catch what they are for: each is fed evidence with one
violation of its kind (and the same evidence without it), built in memory, no database. And
the report says what it found: a failed check's offenders, a session's finding.

The soak itself runs in tests/acceptance/test_soak.py; these show that a green soak means
something: a check that passed whatever it was given would pass there too. The session samples
are read from real sessions in tests/integration/test_soak_observer.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from django_xjobs.models import Job, JobStep, OutboxEntry
from django_xjobs.soak import invariants as inv
from django_xjobs.soak import jobs
from django_xjobs.soak.observe import (
    Backend,
    Blocker,
    Observations,
    SessionSample,
    grants_over_limit,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Build:
    """Evidence of a soak in which everything went right, to spoil one way per test."""

    def __init__(self) -> None:
        self.ledger: list[tuple] = []
        self.effects: list[tuple] = []
        self.rows: dict[str, Job] = {}
        self.steps: dict[str, list[JobStep]] = {}
        self.outbox: dict[str, OutboxEntry] = {}
        self.seen = Observations(samples=10)
        self.transitions: int | None = None

    def job(self, kind: str, *, state: str = "done", attempt: int = 1, max_attempts: int = 25,
            start: float = 0.0, end: float = 1.0, key: str | None = None,
            idempotency_key: str | None = None, outcome: str = "committed") -> str:
        job_id = str(uuid.uuid4())
        nonce = uuid.uuid4().hex
        self.rows[job_id] = Job(id=job_id, name=f"xjobs_soak.{kind}", queue="q", state=state,
                                attempt=attempt, max_attempts=max_attempts,
                                result={"nonce": nonce} if state == "done" else None,
                                concurrency_key=key, run_id=uuid.uuid4(),
                                idempotency_key=idempotency_key or job_id)
        self.ledger.append((job_id, kind, outcome, None, None, at(start)))
        self.effects.append((job_id, attempt, "start", kind, 1, at(start)))
        if state == "done":
            self.effects.append((job_id, attempt, "end", nonce, 1, at(end)))
        return job_id

    def evidence(self) -> inv.Evidence:
        finished = sum(1 for j in self.rows.values() if j.state in ("done", "dead", "cancelled"))
        return inv.Evidence("s", "q", self.ledger, self.effects, self.rows, self.steps,
                            self.outbox, finished if self.transitions is None
                            else self.transitions, self.seen)


def test_a_clean_soak_holds_every_invariant():
    b = Build()
    b.job("plain")
    b.job("poison", state="dead", attempt=3, max_attempts=3)
    verdicts = inv.check_all(b.evidence(), [])
    assert [v.name for v in verdicts if not v.held] == []
    assert len(verdicts) == 11


def test_a_committed_enqueue_without_its_job_is_lost():
    b = Build()
    lost = b.job("plain")
    del b.rows[lost]
    v = inv.nothing_lost(b.evidence())
    assert not v.held and v.offenders == [lost]


def test_a_rolled_back_enqueue_that_exists_is_caught():
    b = Build()
    ghost = b.job("plain")
    b.ledger[-1] = (ghost, "rollback", "rolled_back", None, None, at(0))
    assert not inv.nothing_lost(b.evidence()).held


def test_a_live_job_after_the_drain_is_unfinished():
    b = Build()
    stuck = b.job("plain", state="running")
    v = inv.everything_finished(b.evidence())
    assert not v.held and v.offenders == [stuck]


def test_a_second_final_transition_shows_in_the_counters():
    b = Build()
    b.job("plain")
    b.transitions = 2
    assert not inv.one_terminal_transition(b.evidence()).held


def test_a_done_job_settled_by_a_stale_run_is_caught():
    b = Build()
    job_id = b.job("plain", attempt=2)
    # The result is the nonce of the first run's end, not of the run that holds the row.
    nonce = b.rows[job_id].result["nonce"]
    b.effects = [e if e[2] != "end" else (job_id, 1, "end", nonce, 1, at(1)) for e in b.effects]
    assert not inv.one_terminal_transition(b.evidence()).held


@pytest.mark.parametrize("spoil", ["over", "poison_alive", "plain_dead", "ran_above"])
def test_attempts_out_of_bounds_are_caught(spoil):
    b = Build()
    if spoil == "over":
        b.job("plain", attempt=26, max_attempts=25)
    elif spoil == "poison_alive":
        b.job("poison", state="dead", attempt=2, max_attempts=3)
    elif spoil == "plain_dead":
        b.job("plain", state="dead", attempt=25)
    else:
        job_id = b.job("plain", attempt=1)
        b.effects.append((job_id, 2, "start", "plain", 1, at(2)))
    assert not inv.attempts_within_bounds(b.evidence()).held


def _steps_job(b: Build, *, first_effects: list[float], second_at: float) -> str:
    job_id = b.job("steps")
    run_id = str(b.rows[job_id].run_id)
    b.steps[run_id] = [
        JobStep(run_id=run_id, name="first", status="completed", completed_at=at(1)),
        JobStep(run_id=run_id, name="nap", status="completed", completed_at=at(3),
                wake_at=at(3)),
        JobStep(run_id=run_id, name="second", status="completed", completed_at=at(5)),
    ]
    for t in first_effects:
        b.effects.append((job_id, 1, "step", "first", 1, at(t)))
    b.effects.append((job_id, 1, "step", "second", 1, at(second_at)))
    return job_id


def test_steps_run_once_and_after_their_wake_time_hold():
    b = Build()
    _steps_job(b, first_effects=[0.5, 0.9], second_at=4)  # a re-run before the memo is allowed
    assert inv.steps_never_rerun(b.evidence()).held


def test_a_step_body_after_its_memo_is_caught():
    b = Build()
    _steps_job(b, first_effects=[0.5, 2.0], second_at=4)
    assert not inv.steps_never_rerun(b.evidence()).held


def test_a_step_before_its_wake_time_is_caught():
    b = Build()
    _steps_job(b, first_effects=[0.5], second_at=2.5)
    assert not inv.steps_never_rerun(b.evidence()).held


def test_three_settled_runs_of_a_two_slot_key_at_once_are_caught():
    b = Build()
    for i in range(jobs.SLOT_LIMIT):
        b.job("slot", key="k", start=i * 0.1, end=5)
    assert inv.slots_respected(b.evidence()).held
    b.job("slot", key="k", start=1, end=2)
    assert not inv.slots_respected(b.evidence()).held


def test_back_to_back_slot_runs_are_not_overlap():
    b = Build()
    b.job("slot", key="k", start=0, end=1)
    b.job("slot", key="k", start=0, end=1)
    b.job("slot", key="k", start=1, end=2)  # starts when the others end
    assert inv.slots_respected(b.evidence()).held


def test_a_sampled_slot_excess_fails_the_check():
    b = Build()
    b.seen.slot_excess.append("k: 3 unexpired slots")
    assert not inv.slots_respected(b.evidence()).held


def test_rate_windows():
    limit, period = jobs.RATE_LIMIT, 1.0
    inside = {i: (at(i * 0.2), 1) for i in range(limit)}
    assert grants_over_limit(inside, limit, period) == []
    assert grants_over_limit({**inside, 99: (at(0.9), 1)}, limit, period)
    spread = {i: (at(i * 0.25), 1) for i in range(limit + 3)}  # 4 per second
    assert grants_over_limit(spread, limit, period) == []
    b = Build()
    b.seen.grants = {**inside, 99: (at(0.9), 1)}
    assert not inv.rate_respected(b.evidence()).held


def test_two_live_jobs_of_a_key_fail_the_check():
    b = Build()
    b.seen.live_key_duplicates["t/k"] = {"a", "b"}
    assert not inv.one_live_job_per_key(b.evidence()).held


def _staged(b: Build, *, published: bool, job_id_same: bool = True) -> str:
    job_id = b.job("plain")
    b.ledger[-1] = (job_id, "on_commit", "staged", None, None, at(0))
    b.outbox[job_id] = OutboxEntry(id=job_id, job="xjobs_soak.plain",
                                   published_at=at(1) if published else None,
                                   job_id=job_id if job_id_same else uuid.uuid4())
    return job_id


def test_outbox_exactly_once():
    b = Build()
    _staged(b, published=True)
    assert inv.outbox_exactly_once(b.evidence()).held
    _staged(b, published=False)
    assert not inv.outbox_exactly_once(b.evidence()).held


def test_a_staging_published_as_another_job_is_caught():
    b = Build()
    _staged(b, published=True, job_id_same=False)
    assert not inv.outbox_exactly_once(b.evidence()).held


def test_a_cancelled_job_that_ran_again_is_caught():
    b = Build()
    job_id = b.job("cancel", state="cancelled")
    b.ledger.append((job_id, "cancel", "cancel_requested", True, 1, at(0.5)))
    # The run claimed before the cancel may write its start after it: not a new run.
    b.effects.append((job_id, 1, "start", "slow", 1, at(0.6)))
    assert inv.cancels_stick(b.evidence()).held
    b.effects.append((job_id, 2, "start", "slow", 1, at(0.7)))  # claimed again
    assert not inv.cancels_stick(b.evidence()).held


def test_a_cancelled_job_that_finished_otherwise_is_caught():
    b = Build()
    job_id = b.job("cancel", state="done")
    b.ledger.append((job_id, "cancel", "cancel_requested", True, 1, at(0.5)))
    assert not inv.cancels_stick(b.evidence()).held


def test_hygiene_findings_fail_the_check():
    b = Build()
    assert inv.hygiene(b.evidence(), []).held
    assert not inv.hygiene(b.evidence(), ["w0 exited 1 on SIGTERM"]).held
    b.seen.advisory_outside.append("xjobs:s-w0.1:loop (pid 1)")
    assert not inv.hygiene(b.evidence(), []).held


def test_a_failed_verdict_prints_its_offenders():
    v = inv.verdict("x", [f"id{i}" for i in range(12)], "fine", "{n} bad")
    lines = v.lines()
    assert "FAIL" in lines[0] and "12 bad" in lines[0]
    assert "and 2 more" in lines[1]


def test_sentence_offenders_print_one_a_line():
    v = inv.verdict("x", [f"xjobs:s-w0.1:loop (pid {i}) idle in transaction" for i in range(12)]
                    + ["w0 exited 1 on SIGTERM"], "fine", "{n} findings")
    head, first, *rest = v.lines()
    assert "13 findings" in head
    assert first == "        offending: w0 exited 1 on SIGTERM"
    assert rest[0] == "                   xjobs:s-w0.1:loop (pid 0) idle in transaction"
    assert len(rest) == 10 and rest[-1] == "                   and 3 more"


def sample(pid: int = 7, started: float = 0.0, *, name: str = "xjobs:s-w0.1:heartbeat",
           state: str = "idle in transaction", opened: float = 0.0, transaction: float = 2.5,
           **details) -> SessionSample:
    """A session of the soak seen in a transaction past a lease: backend ``pid`` started at
    ``started``, its transaction opened at ``opened`` (seconds after T0)."""
    values = dict(wait_type="", wait="", query="select 1", since_query=2.0, since_state=2.0,
                  wrote=False)
    return SessionSample(backend=Backend(pid, at(started)), name=name, state=state,
                         xact_start=at(opened), transaction=transaction,
                         **{**values, **details})


def test_samples_of_one_backend_are_one_finding_told_at_its_oldest_transaction():
    seen = Observations()
    seen.record(sample(transaction=2.1, query="select 1"))
    seen.record(sample(transaction=2.6, query="select 2", since_query=0.1, since_state=0.1,
                       wrote=True))
    seen.record(sample(transaction=2.2, opened=5, query="select 3"))
    assert seen.long_transactions() == [
        "xjobs:s-w0.1:heartbeat (pid 7) idle in transaction, transaction open 2.6s (last "
        "statement 'select 2', begun 0.1s ago; state since 0.1s; wrote); seen in 3 samples "
        "over 2 transactions"]


def test_two_samples_of_one_pid_with_different_backend_starts_are_two_sessions():
    """The server gave the pid again to a new session, here even under the same name (the
    worker's loop reconnected): two findings, each about its own."""
    seen = Observations()
    seen.record(sample(7, started=0, name="xjobs:s-w0.1:loop", query="select 'before'"))
    seen.record(sample(7, started=60, name="xjobs:s-w0.1:loop", query="select 'after'"))
    first, second = seen.long_transactions()
    assert first.startswith("xjobs:s-w0.1:loop (pid 7) ") and "'before'" in first
    assert second.startswith("xjobs:s-w0.1:loop (pid 7) ") and "'after'" in second
    assert "samples" not in first + second


def test_a_finding_tells_a_lock_wait_and_names_who_blocks_it():
    seen = Observations()
    seen.record(sample(
        state="active", wait_type="Lock", wait="transactionid",
        query="update x_jobs\n   set visible_at = now() + $1\n where id = any($2)" + " " * 80,
        blockers=(
            Blocker(456, "request", "idle in transaction", 9.14,
                    "select * from x_jobs where id = $1 for update"),
            Blocker(457, "", "active", 3.0, "lock table x_jobs in exclusive mode; " * 4),
            Blocker(458, None, "", None, ""),
            Blocker(0, None, "", None, ""),
        )))
    [finding] = seen.long_transactions()
    assert finding == (
        "xjobs:s-w0.1:heartbeat (pid 7) waiting on a lock (Lock/transactionid), transaction "
        "open 2.5s (statement 'update x_jobs set visible_at = now() + $1 where id = any($2)', "
        "begun 2.0s ago; state since 2.0s; no writes); blocked by pid 456 (application_name "
        "'request', idle in transaction, transaction open 9.1s: 'select * from x_jobs where "
        "id = $1 for update'), pid 457 (application_name '', active, transaction open 3.0s: "
        "'lock table x_jobs in exclusive mode; lock table x_jobs in exclusive mode; loc...'), "
        "pid 458 (gone), a prepared transaction")


def test_a_session_running_or_waiting_on_other_than_a_lock_says_so():
    for details, doing in (({}, "active"),
                           ({"wait_type": "IO", "wait": "DataFileRead"},
                            "active, waiting on IO/DataFileRead")):
        seen = Observations()
        seen.record(sample(state="active", **details))
        [finding] = seen.long_transactions()
        assert finding.startswith(f"xjobs:s-w0.1:heartbeat (pid 7) {doing}, transaction open "
                                  f"2.5s (statement 'select 1', ")


def test_session_findings_fail_the_hygiene_check_and_listen_sessions_are_notes():
    b = Build()
    b.seen.record(sample(1, name="xjobs:s-w0.1:listen"))
    b.seen.record(sample(2, name="xjobs:s-w0.1:relay-listen"))
    assert inv.hygiene(b.evidence(), []).held
    assert len(b.seen.listen_transactions()) == 2
    b.seen.record(sample(2, name="xjobs:s-w0.1:relay"))  # the same backend, lent by a pooler
    b.seen.record(sample(3))
    v = inv.hygiene(b.evidence(), [])
    assert not v.held and v.detail == "2 findings"
    assert [o.split(" (pid")[0] for o in v.offenders] == ["xjobs:s-w0.1:heartbeat",
                                                          "xjobs:s-w0.1:relay"]
    [note] = b.seen.listen_transactions()
    assert note.startswith("xjobs:s-w0.1:listen (pid 1) ")
