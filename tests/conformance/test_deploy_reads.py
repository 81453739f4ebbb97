"""The deploy check's reads (docs/durable.md, "The deploy check"): which runs wait, and their
steps in the order they were recorded."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_xjobs.models import JobStep
from django_xjobs.records import RunOwner, Suspension

from .conftest import claim_one, enqueue, make_row


@pytest.mark.django_db
def test_the_steps_of_a_run_come_in_recorded_order_without_the_per_event_rows(engine):
    enqueue(engine)
    job = claim_one(engine)
    run = RunOwner(claim=job.claim, run_id=job.run_id)
    assert engine.step_complete_if_owned(run, "zeta", '{"n": 1}')
    assert engine.step_complete_if_owned(run, "alpha", None)
    engine.step_park_if_owned(run, "race", status="waiting", duration_ms=60_000,
                              kind="event_any")
    engine.step_park_if_owned(run, "race#a", status="waiting", duration_ms=60_000, event="a",
                              kind="event")
    engine.job_suspend_if_owned(Suspension(claim=job.claim,
                                           wake_at=engine.db_now() + timedelta(hours=1)))

    steps = engine.steps_of_run_in_order(str(job.run_id))
    assert [(s.name, s.status, s.kind, s.output) for s in steps] == [
        ("zeta", "completed", "run", {"n": 1}), ("alpha", "completed", "run", None),
        ("race", "waiting", "event_any", None)]
    assert [str(r.id) for r in engine.runs_suspended_list()] == [job.id]


@pytest.mark.django_db
def test_the_runs_that_wait_are_the_suspended_and_held_back_ones_with_steps(engine):
    rows = {
        "suspended": make_row(engine, state="suspended"),
        "held back": make_row(engine, state="blocked", blocked_resume=True),
        "blocked": make_row(engine, state="blocked"),
        "ready": make_row(engine, state="ready"),
        "no steps": make_row(engine, state="suspended"),
        "other job": make_row(engine, state="suspended", name="other.job"),
    }
    for label, row in rows.items():
        if label != "no steps":
            JobStep.objects.create(run_id=row.run_id, name="a", status="sleeping", kind="sleep")
    waiting = sorted(str(rows[k].id) for k in ("suspended", "held back", "other job"))
    assert [str(r.id) for r in engine.runs_suspended_list()] == waiting
    assert [str(r.id) for r in engine.runs_suspended_list(after_id=waiting[0], limit=1)] == \
        waiting[1:2]
    assert [r.name for r in engine.runs_suspended_list(name="other.job")] == ["other.job"]
