"""Why is a job not running? ``get_job(id).blocked_by``, ``manage.py xjobs why ID [--json]`` and
the console's job page, each situation built directly in the tables the claim reads
(docs/flow-control.md, "Why is a job not running?")."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_xjobs import RateLimit, get_job, registry
from django_xjobs.models import FlowPause, Job, JobLease, RateUnit, WorkerRow
from django_xjobs.records import BlockedBy
from django_xjobs.registry import JobDefinition
from django_xjobs.slots import Concurrency
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def db_now() -> datetime:
    """now() of the test's transaction: the clock every statement of the test compares with."""
    with connection.cursor() as cursor:
        cursor.execute("select now()")
        return cursor.fetchone()[0]


def new_job(**columns):
    """A ready ``testapp.record`` job on a queue of its own, its columns then set as given, and
    a worker seen just now serving that queue (so no test sees ``no_worker`` by accident)."""
    queue = columns.pop("queue", f"why-{uuid.uuid4().hex[:8]}")
    worker = columns.pop("worker", True)
    handle = testapp_jobs.record.using(queue=queue).enqueue(tag="why")
    if columns:
        Job.objects.filter(id=handle.id).update(**columns)
    if worker:
        WorkerRow.objects.create(id=f"w-{queue}", host="h", pid=1, queues=["other", queue],
                                 seen_at=db_now())
    return handle.id


def run(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", "why", *args, stdout=out)
    return out.getvalue()


def run_json(job_id) -> dict:
    return json.loads(run(str(job_id), "--json"))


@pytest.fixture
def limited_job():
    """A registered job with a concurrency limit of 2 and a rate limit of 3 units a minute
    costing 2 a run."""

    def limited(ctx, account=1):
        return account

    definition = JobDefinition.build(
        limited, name="tests.why_limited",
        concurrency=Concurrency(key="acct:{account}", limit=2),
        rate_limit=RateLimit(key="api:{account}", limit=3, period=timedelta(minutes=1), cost=2))
    registry.register(definition)
    yield definition
    registry.unregister(definition.name)


# ------------------------------------------------------------------------------ no reason --


def test_a_ready_due_job_is_held_back_by_nothing():
    job_id = new_job()
    assert get_job(job_id).blocked_by == ()
    text = run(str(job_id))
    assert text.splitlines()[0] == f"job {job_id} (testapp.record): ready: the next claim takes it"
    assert run_json(job_id)["blocked_by"] == []


def test_running_and_finished_jobs_have_no_reasons_and_say_what_they_do():
    running = new_job(state="running", claimed_by="w-7", started_at=db_now(), attempt=1)
    done = new_job(state="done", finished_at=db_now())
    assert get_job(running).blocked_by == () and get_job(done).blocked_by == ()
    assert "running on worker w-7 since" in run(str(running)).splitlines()[0]
    assert run(str(done)).splitlines()[0].endswith(": finished as done")
    data = run_json(done)
    assert (data["id"], data["state"], data["blocked_by"]) == (str(done), "done", [])


def test_reading_a_job_costs_no_statement_more_until_blocked_by_is_read():
    job_id = new_job(state="delayed", run_at=db_now() + HOUR)
    with CaptureQueriesContext(connection) as plain:
        record = get_job(job_id)
    assert len(plain.captured_queries) == 1
    with CaptureQueriesContext(connection) as first:
        assert [r.kind for r in record.blocked_by] == ["delayed"]
    assert len(first.captured_queries) == 1
    with CaptureQueriesContext(connection) as again:
        assert [r.kind for r in record.blocked_by] == ["delayed"]
    assert again.captured_queries == []


# ------------------------------------------------------------------------- each reason --


def test_a_plain_delay_is_delayed_until_its_run_at():
    at = db_now() + HOUR
    job_id = new_job(state="delayed", run_at=at)
    assert get_job(job_id).blocked_by == (BlockedBy(kind="delayed", until=at),)
    assert f"  delayed until {at.isoformat(sep=' ', timespec='seconds')}" in run(str(job_id))


def test_a_delay_after_a_failed_attempt_is_a_retry_backoff():
    at = db_now() + timedelta(minutes=3)
    job_id = new_job(state="delayed", run_at=at, attempt=2, last_error="RuntimeError: boom")
    assert get_job(job_id).blocked_by == (BlockedBy(kind="backoff", until=at),)
    (reason,) = run_json(job_id)["blocked_by"]
    assert reason["kind"] == "backoff" and reason["until"] == at.isoformat()
    assert reason["text"].startswith("retry backoff until ")


def test_a_paused_queue_holds_its_jobs_with_the_pause_end_and_reason():
    job_id = new_job()
    queue = get_job(job_id).queue
    until = db_now() + HOUR
    FlowPause.objects.create(kind="queue", key=queue, until=until, reason="db migration")
    FlowPause.objects.create(kind="queue", key="another-queue", reason="not this one")
    (reason,) = get_job(job_id).blocked_by
    assert reason == BlockedBy(kind="queue_paused", queue=queue, until=until,
                               reason="db migration")
    assert reason.text == (f"queue {queue} paused (until "
                           f"{until.isoformat(sep=' ', timespec='seconds')}, db migration)")


@pytest.mark.parametrize("worker", [True, False])
def test_why_of_a_job_in_a_paused_queue_advises_the_resume_never_a_worker(worker):
    """With no worker as well, the pause binds first: a worker started would not take the job,
    so the diagnosis says how the pause ends, and nothing about starting a worker."""
    job_id = new_job(worker=worker)
    queue = get_job(job_id).queue
    until = db_now() + HOUR
    FlowPause.objects.create(kind="queue", key=queue, until=until, reason="db migration")
    at = until.isoformat(sep=" ", timespec="seconds")
    text = run(str(job_id))
    assert f"  queue {queue} paused (until {at}, db migration)" in text.splitlines()[1:3]
    assert f"manage.py xjobs resume {queue}" in text
    assert f"the pause ends by itself at {at}" in text
    assert "xjobs_worker" not in text and "start one" not in text
    assert "Waiting for a worker" not in text
    (line,) = [d for d in run_json(job_id)["diagnosis"] if "paused" in d]
    assert line.startswith(f"Due, but held: queue '{queue}' is paused (db migration)")
    # Once the pause is lifted, the advice is about workers again.
    FlowPause.objects.filter(kind="queue", key=queue).delete()
    assert "Waiting for a worker" in run(str(job_id))


def test_a_pause_that_has_ended_holds_nothing():
    job_id = new_job()
    FlowPause.objects.create(kind="queue", key=get_job(job_id).queue,
                             until=db_now() - timedelta(seconds=1))
    assert get_job(job_id).blocked_by == ()


def test_a_paused_concurrency_or_rate_key_holds_the_job_until_resumed():
    job_id = new_job(state="blocked", concurrency_key="acct:9", rate_key="api:9",
                     blocked_on="acct:9")
    FlowPause.objects.create(kind="key", key="acct:9", reason="provider down")
    FlowPause.objects.create(kind="key", key="api:9", until=db_now() + HOUR)
    FlowPause.objects.create(kind="queue", key="acct:9")  # a queue of that name: not its queue
    reasons = get_job(job_id).blocked_by
    assert [(r.kind, r.key, r.reason) for r in reasons] == [
        ("key_paused", "acct:9", "provider down"), ("key_paused", "api:9", None)]
    assert reasons[0].text == "key acct:9 paused (until resumed, provider down)"


def test_a_full_concurrency_key_names_its_live_holders_and_the_limit(limited_job):
    job_id = new_job(name=limited_job.name, state="blocked", concurrency_key="acct:1",
                     blocked_on="acct:1")
    later = db_now() + HOUR
    JobLease.objects.create(lease_key="acct:1", slot=0, holder="j0/t0/w0", expires_at=later)
    JobLease.objects.create(lease_key="acct:1", slot=1, holder="j1/t1/w1",
                            expires_at=db_now() - timedelta(seconds=1))  # lapsed: free
    assert get_job(job_id).blocked_by == ()  # one live holder of two slots
    out = run(str(job_id))
    assert "blocked on acct:1, which holds it back no more" in out
    JobLease.objects.filter(slot=1).update(holder="j2/t2/w2", expires_at=later)
    (reason,) = get_job(job_id).blocked_by
    assert reason == BlockedBy(kind="slot_full", key="acct:1", holders=("j0/t0/w0", "j2/t2/w2"),
                               limit=2)
    assert reason.text == "slot full: key acct:1 has all 2 slot(s) held (j0/t0/w0, j2/t2/w2)"


def test_a_key_with_no_known_limit_is_full_with_one_holder():
    job_id = new_job(concurrency_key="smtp")
    JobLease.objects.create(lease_key="smtp", slot=0, holder="j/t/w", expires_at=db_now() + HOUR)
    (reason,) = get_job(job_id).blocked_by
    assert (reason.kind, reason.limit, reason.holders) == ("slot_full", 1, ("j/t/w",))


def test_a_spent_rate_budget_says_when_the_next_unit_frees(limited_job):
    job_id = new_job(name=limited_job.name, rate_key="api:1")
    now = db_now()
    RateUnit.objects.create(key="api:1", at=now - timedelta(minutes=5), cost=3)  # out of window
    assert get_job(job_id).blocked_by == ()
    first = now - timedelta(seconds=20)
    RateUnit.objects.create(key="api:1", at=first, cost=1)
    assert get_job(job_id).blocked_by == ()  # 1 spent + 2 fits under 3
    RateUnit.objects.create(key="api:1", at=now - timedelta(seconds=10), cost=1)
    RateUnit.objects.create(key="other", at=now, cost=100)
    # 2 spent + 2 > 3: room comes when the first unit leaves the window.
    (reason,) = get_job(job_id).blocked_by
    assert reason == BlockedBy(kind="rate_limit", key="api:1", until=first + timedelta(minutes=1),
                               limit=3)
    assert reason.text.startswith("rate limit of key api:1 (next unit at ")
    (shown,) = run_json(job_id)["blocked_by"]
    assert (shown["kind"], shown["key"], shown["limit"]) == ("rate_limit", "api:1", 3)


def test_no_worker_seen_lately_for_its_queue():
    job_id = new_job(worker=False)
    queue = get_job(job_id).queue
    WorkerRow.objects.create(id="stale", host="h", pid=2, queues=[queue],
                             seen_at=db_now() - timedelta(minutes=6))
    WorkerRow.objects.create(id="elsewhere", host="h", pid=3, queues=["default"],
                             seen_at=db_now())
    (reason,) = get_job(job_id).blocked_by
    assert reason == BlockedBy(kind="no_worker", queue=queue)
    assert reason.text == f"no worker serving queue {queue} in the last 5 minutes"
    WorkerRow.objects.filter(id="stale").update(seen_at=db_now())
    assert get_job(job_id).blocked_by == ()


# ------------------------------------------------------------------- several at once --


def test_every_reason_is_listed_most_binding_first(limited_job):
    now = db_now()
    job_id = new_job(name=limited_job.name, state="delayed", run_at=now + timedelta(minutes=5),
                     concurrency_key="acct:1", rate_key="api:1", worker=False)
    queue = get_job(job_id).queue
    FlowPause.objects.create(kind="queue", key=queue, until=now + HOUR, reason="maintenance")
    FlowPause.objects.create(kind="key", key="api:1")
    for slot in (0, 1):
        JobLease.objects.create(lease_key="acct:1", slot=slot, holder=f"j{slot}/t/w",
                                expires_at=now + HOUR)
    RateUnit.objects.create(key="api:1", at=now, cost=3)
    reasons = get_job(job_id).blocked_by
    # Open-ended first (a pause until resumed, no worker, a full key), then the latest end.
    assert [r.kind for r in reasons] == ["key_paused", "no_worker", "slot_full",
                                         "queue_paused", "delayed", "rate_limit"]
    out = run(str(job_id)).splitlines()
    assert out[0] == f"job {job_id} ({limited_job.name}): delayed, not running: 6 reason(s), " \
                     "most binding first"
    assert out[1:7] == [f"  {r.text}" for r in reasons]
    data = run_json(job_id)
    assert (data["id"], data["state"]) == (str(job_id), "delayed")
    assert [r["kind"] for r in data["blocked_by"]] == [r.kind for r in reasons]
    assert data["blocked_by"][2]["holders"] == ["j0/t/w", "j1/t/w"]
    assert data["blocked_by"][3]["until"] == (now + HOUR).isoformat()


# ---------------------------------------------------------------- command and console --


def test_an_unknown_or_malformed_id_is_a_command_error():
    with pytest.raises(CommandError, match="no job with id"):
        run("0190a1b2-0000-7000-8000-000000000000")
    with pytest.raises(CommandError, match="is not a job id"):
        run("not-a-uuid", "--json")


def test_the_job_page_shows_the_reasons_panel_only_when_something_holds_it_back(admin_client):
    free = new_job()
    page = admin_client.get(reverse("admin:django_xjobs_job_change", args=[free]))
    assert page.status_code == 200 and b"xjobs-blocked-by" not in page.content
    held = new_job(state="delayed", run_at=db_now() + HOUR)
    FlowPause.objects.create(kind="queue", key=get_job(held).queue, reason="<b>deploy</b>")
    page = admin_client.get(reverse("admin:django_xjobs_job_change", args=[held]))
    html = page.content.decode()
    assert "Why it is not running" in html
    for reason in get_job(held).blocked_by:
        assert f'<li class="xjobs-blocked-{reason.kind}">' in html
    assert "&lt;b&gt;deploy&lt;/b&gt;" in html and "<b>deploy</b>" not in html


def test_a_job_gone_since_it_was_read_has_no_reasons():
    record = get_job(new_job(state="delayed", run_at=db_now() + HOUR))
    Job.objects.filter(id=record.id).delete()
    assert record.blocked_by == ()

