"""The operations console through Django's test client, on real rows in every state.

Every page renders; each action changes exactly what it says, only after its confirmation, only
for a user with its permission, and is logged with the user; a tenant scope hides and protects
other tenants' rows; the job list never counts a big table row by row.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse
from django.utils import timezone

from django_xjobs import api
from django_xjobs.console import actions as console_actions
from django_xjobs.console import paginator as console_paginator
from django_xjobs.exceptions import ConfigurationError
from django_xjobs.models import Job, JobStep
from django_xjobs.records import QueueDepth, QueueStats
from tests.console_data import STATES, job_in_state, jobs_in_every_state, other_rows, steps_for
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_xjobs_job_changelist")
DASHBOARD = reverse("admin:django_xjobs_dashboard")
HEALTH = reverse("admin:django_xjobs_health")
CHECKBOX = "_selected_action"


def detail(job_id) -> str:
    return reverse("admin:django_xjobs_job_change", args=[job_id])


def row(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def ids_listed(response) -> set[str]:
    """The job ids of the list's rows (each row links to its detail page)."""
    return set(re.findall(r'/django_xjobs/job/([0-9a-f-]{36})/change/', response.content.decode()))


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="django_xjobs",
                                      codename__in=codenames)
    assert perms.count() == len(codenames), codenames
    user.user_permissions.add(*perms)
    return user


@pytest.fixture
def one_of_each():
    """A job in every state (and a running one whose lease expired), on one queue."""
    handles = jobs_in_every_state("console-q", tenant_id="acme")
    steps_for(handles["suspended"].run_id)
    return handles


def post_action(client, action: str, ids, *, confirm: bool = True, **extra):
    data = {"action": action, CHECKBOX: [str(i) for i in ids], **extra}
    if confirm:
        data["post"] = "yes"
    return client.post(JOBS, data)


# ------------------------------------------------------------------------------ every page --


def test_every_console_page_renders_with_jobs_in_every_state(admin_client, one_of_each):
    others = other_rows(tenant_id="acme")
    pages = [reverse("admin:index"), reverse("admin:app_list", args=["django_xjobs"]),
             DASHBOARD, HEALTH, JOBS]
    pages += [f"{JOBS}?state={s}" for s in (*STATES, "lapsed")]
    pages += [f"{JOBS}?queue=console-q", f"{JOBS}?name=testapp.record", f"{JOBS}?tenant=acme"]
    for model in ("jobstep", "jobevent", "outboxentry", "joblease", "schedulerleader",
                  "schedulerstate", "backfill"):
        pages.append(reverse(f"admin:django_xjobs_{model}_changelist"))
    pages += [detail(h.id) for h in one_of_each.values()]
    pages += [reverse("admin:django_xjobs_job_history", args=[one_of_each["dead"].id])]
    step = JobStep.objects.filter(run_id=one_of_each["suspended"].run_id).first()
    pages += [
        reverse("admin:django_xjobs_jobstep_change", args=[step.pk]),
        reverse("admin:django_xjobs_jobevent_change", args=[others["event"].id]),
        reverse("admin:django_xjobs_outboxentry_change", args=[others["outbox"].pk]),
        reverse("admin:django_xjobs_joblease_change", args=[others["lease"].pk]),
        reverse("admin:django_xjobs_schedulerleader_change", args=[others["leader"].pk]),
        reverse("admin:django_xjobs_schedulerstate_change", args=[others["state"].pk]),
        reverse("admin:django_xjobs_backfill_change", args=[others["backfill"].pk]),
    ]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, (url, response.status_code)


def test_the_jobs_list_shows_badges_attempts_tenant_and_enqueuer(admin_client, one_of_each):
    page = admin_client.get(f"{JOBS}?queue=console-q").content.decode()
    for state in STATES:
        assert f'class="xjobs-badge xjobs-{state}"' in page
    assert "1/3" in page and "acme" in page and "testapp.record" in page
    assert ids_listed(admin_client.get(f"{JOBS}?queue=console-q")) == {
        str(h.id) for h in one_of_each.values()}


def test_each_state_filter_lists_exactly_the_jobs_in_that_state(admin_client, one_of_each):
    for state in STATES:
        expected = {str(one_of_each[state].id)}
        if state == "running":
            expected.add(str(one_of_each["lapsed"].id))
        listed = ids_listed(admin_client.get(f"{JOBS}?queue=console-q&state={state}"))
        assert listed == expected, state
    lapsed = ids_listed(admin_client.get(f"{JOBS}?state=lapsed"))
    assert lapsed == {str(one_of_each["lapsed"].id)}


def test_queue_name_and_tenant_filters_take_any_typed_value(admin_client):
    mine = testapp_jobs.record.using(queue="typed-queue", tenant_id="t-typed").enqueue()
    testapp_jobs.noop.using(queue="other-queue", tenant_id="t-other").enqueue()
    assert ids_listed(admin_client.get(f"{JOBS}?queue=typed-queue")) == {str(mine.id)}
    assert ids_listed(admin_client.get(f"{JOBS}?tenant=t-typed")) == {str(mine.id)}
    assert str(mine.id) not in ids_listed(admin_client.get(f"{JOBS}?name=testapp.noop"))
    page = admin_client.get(JOBS).content.decode()
    assert 'name="queue"' in page and 'name="tenant"' in page  # the text boxes


def test_the_date_range_filters_narrow_by_created_at_and_run_at(admin_client):
    due = testapp_jobs.record.enqueue(tag="due now")
    later = testapp_jobs.record.using(delay=timedelta(days=3)).enqueue(tag="in three days")
    when = timezone.now() + timedelta(days=2)
    run_after = (f"run_at__range__gte_0={when:%Y-%m-%d}&run_at__range__gte_1="
                 f"{when:%H:%M:%S}")
    assert ids_listed(admin_client.get(f"{JOBS}?{run_after}")) == {str(later.id)}
    yesterday = timezone.now() - timedelta(days=1)
    created_before = (f"created_at__range__lte_0={yesterday:%Y-%m-%d}&"
                      f"created_at__range__lte_1=00:00:00")
    assert ids_listed(admin_client.get(f"{JOBS}?{created_before}")) == set()
    today = timezone.now()
    created_today = (f"created_at__range__gte_0={today:%Y-%m-%d}&created_at__range__gte_1="
                     "00:00:00")
    assert {str(due.id), str(later.id)} <= ids_listed(admin_client.get(
        f"{JOBS}?{created_today}"))


def test_search_finds_a_job_by_id_run_id_or_idempotency_key(admin_client):
    keyed = testapp_jobs.record.using(idempotency_key="charge:42").enqueue()
    other = testapp_jobs.record.enqueue()
    for term in (keyed.id, keyed.run_id, "charge:42"):
        assert ids_listed(admin_client.get(JOBS, {"q": str(term)})) == {str(keyed.id)}, term
    assert ids_listed(admin_client.get(JOBS, {"q": "charge:4"})) == set()  # exact only
    assert ids_listed(admin_client.get(JOBS, {"q": str(uuid.uuid4())})) == set()
    assert ids_listed(admin_client.get(JOBS, {"q": str(other.id)})) == {str(other.id)}


def test_search_by_run_id_stays_on_the_primary_key_for_api_jobs(admin_client):
    handle = testapp_jobs.record.enqueue()
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(JOBS, {"q": str(handle.run_id)})
    assert ids_listed(response) == {str(handle.id)}
    by_run = [q["sql"] for q in queries if '"x_jobs"."run_id" =' in q["sql"]]
    assert by_run and all('"x_jobs"."id" >=' in sql for sql in by_run), by_run


def test_search_by_run_id_finds_a_hand_written_row_with_random_ids(admin_client):
    Job.objects.bulk_create([Job(name="testapp.record", idempotency_key="hand-1",
                                 id=uuid.uuid4(), run_id=uuid.uuid4())])
    hand = Job.objects.get(idempotency_key="hand-1")
    assert ids_listed(admin_client.get(JOBS, {"q": str(hand.run_id)})) == {str(hand.id)}


def test_a_malformed_selection_does_not_break_the_list(admin_client):
    response = post_action(admin_client, "cancel_jobs", ["not-a-uuid"], confirm=False)
    assert response.status_code == 200  # the list again: nothing valid was selected


def test_the_job_detail_is_read_only_with_pretty_json_error_steps_and_diagnosis(
        admin_client, one_of_each):
    page = admin_client.get(detail(one_of_each["dead"].id)).content.decode()
    assert '<pre class="xjobs-json">{\n  &quot;tag&quot;: &quot;dead&quot;\n}</pre>' in page
    assert '<pre class="xjobs-error">Traceback (most recent call last):' in page
    assert "Why it is dead" in page and "Retry gives it a fresh set of attempts" in page
    assert 'type="submit" value="Save' not in page and 'name="_save"' not in page
    suspended = admin_client.get(detail(one_of_each["suspended"].id)).content.decode()
    assert "Steps of run" in suspended
    for name in ("fetch-profile", "charge", "wait-verified"):
        assert name in suspended
    assert "RuntimeError: gateway timeout" in suspended
    assert "ada@example.com" in suspended
    lapsed = admin_client.get(detail(one_of_each["lapsed"].id)).content.decode()
    assert "Its lease expired" in lapsed and "tests:console stopped renewing it" in lapsed


def test_a_workflows_steps_come_before_the_long_fieldsets_and_only_open_ones_wake(
        admin_client, one_of_each):
    handle = one_of_each["suspended"]
    now = timezone.now()
    # An invoke step keeps the time-out it had while it waited for its child.
    JobStep.objects.create(run_id=handle.run_id, name="child", status="completed", kind="invoke",
                           completed_at=now, wake_at=now + timedelta(minutes=4))
    page = admin_client.get(detail(handle.id)).content.decode()
    # Right after the why and the attempts, not below the timing, run, input and result.
    assert (page.index('id="xjobs-diagnosis"') < page.index('id="xjobs-attempts"')
            < page.index('id="xjobs-steps"') < page.index(">Timing</h2>")), "order"
    rows = dict(re.findall(r'<tr class="xjobs-step" data-status="\w+">\s*<td>([\w-]+)</td>.*?'
                           r'<td class="xjobs-step-wake">(.*?)</td>', page, re.S))
    assert rows["child"] == "-" and rows["fetch-profile"] == "-"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(in .+\)", rows["wait-verified"])
    # A job without steps shows no steps panel at all.
    assert 'id="xjobs-steps"' not in admin_client.get(
        detail(one_of_each["ready"].id)).content.decode()


def test_the_detail_shows_the_traceparent(admin_client):
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    handle = testapp_jobs.record.using(traceparent=traceparent).enqueue()
    assert traceparent in admin_client.get(detail(handle.id)).content.decode()


def test_an_unknown_job_id_is_a_404(admin_client):
    assert admin_client.get(detail(uuid.uuid4())).status_code == 404
    history = reverse("admin:django_xjobs_job_history", args=[uuid.uuid4()])
    assert admin_client.get(history).status_code == 404


def test_no_page_offers_to_add_change_or_delete_rows(admin_client, one_of_each):
    other_rows()
    for model in ("job", "jobstep", "jobevent", "outboxentry", "joblease", "schedulerleader",
                  "schedulerstate", "backfill"):
        assert admin_client.get(reverse(f"admin:django_xjobs_{model}_add")).status_code == 403
    job = one_of_each["dead"].id
    assert admin_client.post(detail(job), {"state": "ready"}).status_code == 403
    delete = reverse("admin:django_xjobs_job_delete", args=[job])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert row(job).state == "dead"
    assert "delete_selected" not in admin_client.get(JOBS).content.decode()


# --------------------------------------------------------------------------------- dashboard --


def test_the_dashboard_shows_buckets_last_24h_outbox_scheduler_workers_failures(
        admin_client, one_of_each):
    other_rows()
    response = admin_client.get(DASHBOARD)
    board = response.context["board"]
    (q,) = [r for r in board.queues if r.queue == "console-q"]
    assert (q.ready, q.delayed, q.running, q.suspended, q.blocked) == (1, 1, 2, 1, 0)
    assert q.oldest_ready_age is not None and q.oldest_ready_age >= 0
    assert (q.done_24h, q.failed_24h, q.dead_24h, q.cancelled_24h) == (1, 1, 1, 1)
    assert board.outbox_pending == 1
    assert [leader.holder for leader in board.leaders] == ["w1:1"]
    assert [s.task for s in board.schedules] == ["nightly-report"]
    assert board.workers == []  # no worker process ran: the claims were the test's own
    assert [f.id for f in board.failures] == [one_of_each["dead"].id]
    page = response.content.decode()
    assert "RuntimeError: card declined" in page and "nightly-report" in page
    assert '<meta http-equiv="refresh"' not in page  # it updates in place: live.js


def test_the_pages_update_in_place_at_the_configured_interval_or_not_at_all(
        admin_client, settings, one_of_each):
    pages = [DASHBOARD, HEALTH, JOBS, f"{JOBS}?state=dead", detail(one_of_each["dead"].id),
             reverse("admin:django_xjobs_queue", args=["console-q"])]
    for url in pages:
        page = admin_client.get(url).content.decode()
        assert 'id="xjobs-live" data-interval="5000"' in page, url
        assert "django_xjobs/live.js" in page, url
    settings.XJOBS = {**settings.XJOBS, "CONSOLE_REFRESH": "30s"}
    assert 'data-interval="30000"' in admin_client.get(DASHBOARD).content.decode()
    settings.XJOBS = {**settings.XJOBS, "CONSOLE_REFRESH": None}
    for url in pages:
        page = admin_client.get(url).content.decode()
        assert 'id="xjobs-live"' not in page and "live.js" not in page, url


def test_a_live_update_leaves_the_messages_for_the_page_a_person_opens(admin_client, one_of_each):
    # The action's message waits in the session for the page its redirect opens; a live
    # update of another tab fetching in between must not take it.
    post_action(admin_client, "cancel_jobs", [one_of_each["ready"].id])
    live = admin_client.get(JOBS, headers={"X-XJobs-Live": "1"}).content.decode()
    assert "Cancelled 1 job" not in live and 'id="result_list"' in live
    for url in (DASHBOARD, detail(one_of_each["dead"].id)):
        assert "Cancelled 1 job" not in admin_client.get(
            url, headers={"X-XJobs-Live": "1"}).content.decode()
    assert "Cancelled 1 job" in admin_client.get(JOBS).content.decode()


def test_the_dashboard_buckets_are_the_engines_queue_depth_and_the_counters(
        admin_client, one_of_each):
    from django_xjobs import counters
    from django_xjobs.engines import get_engine

    board = admin_client.get(DASHBOARD).context["board"]
    depth = {d.queue: d for d in get_engine().queue_depth()}
    day = counters.chart("day")
    stats = {s.queue: s for s in get_engine().queue_stats()}
    assert {q.queue for q in board.queues} >= set(depth) | set(day.series)
    for q in board.queues:
        d = depth.get(q.queue) or QueueDepth(queue=q.queue)  # a configured queue, still empty
        assert (q.ready, q.delayed, q.running, q.suspended, q.blocked) == (
            d.ready, d.delayed, d.running, d.suspended, d.blocked)
        t = day.total(q.queue)
        assert (q.done_24h, q.failed_24h, q.dead_24h, q.cancelled_24h) == (
            t.done, t.failed, t.dead, t.cancelled)
        # The same live buckets as the exact (full-table) statement, read without the history.
        s = stats.get(q.queue) or QueueStats(queue=q.queue)
        assert (q.ready, q.delayed, q.running, q.suspended, q.blocked) == (
            s.ready, s.delayed, s.running, s.suspended, s.blocked)


def test_the_health_panel_shows_lapsed_leases_rescues_tables_and_old_transactions(
        admin_client, one_of_each):
    response = admin_client.get(HEALTH)
    health = response.context["health"]
    assert health.lapsed_count == 1
    assert [j.id for j in health.lapsed] == [one_of_each["lapsed"].id]
    assert {t.health.table for t in health.tables} >= {"x_jobs", "x_job_steps", "x_outbox"}
    assert all(t.health.xid_age > 0 for t in health.tables)
    assert health.verdict in ("warn", "bad")  # a lapsed lease at least
    page = response.content.decode()
    assert "Running jobs whose lease expired (1)" in page
    assert "What holds VACUUM back" in page


def test_the_health_panel_counts_rescued_jobs(admin_client):
    from django_xjobs.engines import get_engine

    handle = job_in_state("lapsed", queue="rescue-q")
    # The next claim of the queue rescues the lapsed job.
    (claimed,) = get_engine().jobs_claim(wants={"rescue-q": 1}, worker_id="tests:rescuer",
                                         lease_ms=60_000)
    assert claimed.id == str(handle.id)
    rescues = admin_client.get(HEALTH).context["health"].rescues
    assert (rescues.live_jobs, rescues.live_rescues) == (1, 1)
    assert rescues.by_name == [("testapp.record", 1)]


# ----------------------------------------------------------------------------------- actions --


def test_an_action_first_asks_for_confirmation_and_changes_nothing(admin_client, one_of_each):
    running = one_of_each["running"].id
    response = post_action(admin_client, "cancel_jobs", [running], confirm=False)
    assert response.status_code == 200
    page = response.content.decode()
    assert "are you sure" in page and 'name="reason"' in page
    assert "1 job will be cancelled" in page
    assert row(running).state == "running"


def test_cancel_stops_exactly_the_selected_jobs_and_records_reason_and_user(
        admin_client, one_of_each):
    chosen = [one_of_each[s].id for s in ("running", "ready", "done")]
    response = post_action(admin_client, "cancel_jobs", chosen, reason="customer asked")
    assert response.status_code == 302
    for state in ("running", "ready"):
        job = row(one_of_each[state].id)
        assert job.state == "cancelled"
        assert job.last_error == "cancelled: customer asked (admin:admin)"
        assert job.lease_token is None
    assert row(one_of_each["done"].id).state == "done"
    untouched = {s: row(one_of_each[s].id).state for s in ("delayed", "suspended", "lapsed")}
    assert untouched == {"delayed": "delayed", "suspended": "suspended", "lapsed": "running"}
    entries = LogEntry.objects.filter(action_flag=CHANGE)
    assert {e.object_id for e in entries} == {str(one_of_each[s].id) for s in ("running", "ready")}
    assert {e.user.username for e in entries} == {"admin"}
    assert {e.change_message for e in entries} == {"Cancelled by admin:admin: customer asked"}
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert message == "Cancelled 2 jobs. Skipped 1: already done."


def test_retry_gives_dead_and_cancelled_jobs_a_fresh_attempt_by_the_admin(
        admin_client, one_of_each):
    chosen = [one_of_each[s].id for s in ("dead", "cancelled", "running")]
    response = post_action(admin_client, "retry_jobs", chosen)
    for state in ("dead", "cancelled"):
        job = row(one_of_each[state].id)
        assert (job.state, job.attempt, job.enqueued_by) == ("ready", 0, "admin:admin")
        assert job.run_id == one_of_each[state].run_id
    assert row(one_of_each["running"].id).state == "running"
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert message.startswith("Retried 2 jobs. Skipped 1: is running")
    assert LogEntry.objects.filter(change_message="Retried now by admin:admin").count() == 2


def test_retry_skips_a_job_whose_key_a_live_job_holds_and_names_it(admin_client):
    dead = job_in_state("dead", idempotency_key="invoice:7")
    live = testapp_jobs.record.using(idempotency_key="invoice:7").enqueue()
    assert live.created and live.id != dead.id
    response = post_action(admin_client, "retry_jobs", [dead.id])
    assert row(dead.id).state == "dead"
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert "Retried 0 jobs. Skipped 1: a live job holds its idempotency key" in message
    assert str(live.id) in message
    assert not LogEntry.objects.exists()


def test_run_now_makes_delayed_and_suspended_jobs_due(admin_client, one_of_each):
    chosen = [one_of_each[s].id for s in ("delayed", "suspended", "done")]
    post_action(admin_client, "run_jobs_now", chosen)
    now = timezone.now()
    delayed, suspended = row(one_of_each["delayed"].id), row(one_of_each["suspended"].id)
    assert delayed.state == "ready" and delayed.run_at <= now
    assert suspended.state == "suspended" and suspended.run_at <= now
    assert row(one_of_each["done"].id).state == "done"
    assert LogEntry.objects.filter(change_message="Made due now by admin:admin").count() == 2


def test_delete_finished_removes_finished_jobs_and_their_steps_only(admin_client, one_of_each):
    steps_for(one_of_each["done"].run_id)
    chosen = [one_of_each[s].id for s in ("done", "dead", "ready")]
    response = post_action(admin_client, "delete_finished_jobs", chosen)
    assert not Job.objects.filter(id__in=[one_of_each["done"].id, one_of_each["dead"].id]).exists()
    assert not JobStep.objects.filter(run_id=one_of_each["done"].run_id).exists()
    assert row(one_of_each["ready"].id).state == "ready"
    assert JobStep.objects.filter(run_id=one_of_each["suspended"].run_id).count() == 3
    deletions = LogEntry.objects.filter(action_flag=DELETION)
    assert {e.object_id for e in deletions} == {str(one_of_each[s].id) for s in ("done", "dead")}
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert message.startswith("Deleted 2 jobs. Skipped 1: ready (only finished jobs are deleted)")


def test_an_action_from_the_detail_page_returns_to_it(admin_client, one_of_each):
    dead = one_of_each["dead"].id
    page = admin_client.get(detail(dead)).content.decode()
    assert 'value="retry_jobs"' in page and 'value="delete_finished_jobs"' in page
    assert 'value="cancel_jobs"' not in page and 'value="run_jobs_now"' not in page
    response = post_action(admin_client, "retry_jobs", [dead], _next=detail(dead))
    assert response.status_code == 302 and response["Location"] == detail(dead)
    assert row(dead).state == "ready"


def test_select_all_is_handled_in_bounded_rounds(admin_client, monkeypatch):
    """Run now has no action over a filter (docs/console.md, "Acting on thousands"): its
    "select all" takes the first ACTION_LIMIT jobs, and says so."""
    monkeypatch.setattr(console_actions, "ACTION_LIMIT", 3)
    handles = [testapp_jobs.record.using(queue="bulk-q", delay=timedelta(hours=1)).enqueue()
               for _ in range(5)]
    response = admin_client.post(f"{JOBS}?queue=bulk-q", {
        "action": "run_jobs_now", CHECKBOX: [str(handles[0].id)], "select_across": "1",
        "index": "0"})
    assert response.status_code == 200
    assert "this round handles the first 3" in response.content.decode()
    chosen = response.context["chosen"]
    assert len(chosen) == 3
    response = admin_client.post(f"{JOBS}?queue=bulk-q", {
        "action": "run_jobs_now", CHECKBOX: [str(j.id) for j in chosen], "post": "yes"})
    assert Job.objects.filter(queue="bulk-q", state="ready").count() == 3


# ------------------------------------------------------------------------------ permissions --


def test_a_viewer_sees_the_console_but_no_action(client, one_of_each):
    client.force_login(staff("viewer", "view_job"))
    page = client.get(JOBS).content.decode()
    assert client.get(JOBS).status_code == 200
    for action in console_actions.ACTIONS:
        assert f'value="{action}"' not in page
    assert client.get(DASHBOARD).status_code == 200
    dead_page = client.get(detail(one_of_each["dead"].id)).content.decode()
    assert 'class="xjobs-actions"' not in dead_page
    for action, state in (("cancel_jobs", "running"), ("retry_jobs", "dead"),
                          ("run_jobs_now", "delayed"), ("delete_finished_jobs", "done")):
        for confirm in (False, True):
            response = post_action(client, action, [one_of_each[state].id], confirm=confirm)
            assert response.status_code == 403, (action, confirm)
        assert row(one_of_each[state].id).state == state
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(("codename", "action", "state"), [
    ("cancel_job", "cancel_jobs", "running"),
    ("retry_job", "retry_jobs", "dead"),
    ("run_job_now", "run_jobs_now", "delayed"),
    ("purge_job", "delete_finished_jobs", "done"),
])
def test_each_action_needs_its_own_permission(client, one_of_each, codename, action, state):
    client.force_login(staff("operator", "view_job", codename))
    page = client.get(JOBS).content.decode()
    assert f'value="{action}"' in page
    for other in set(console_actions.ACTIONS) - {action}:
        assert f'value="{other}"' not in page
        assert post_action(client, other, [one_of_each["dead"].id]).status_code == 403
    post_action(client, action, [one_of_each[state].id], reason="r")
    assert row(one_of_each[state].id).state != state if action != "delete_finished_jobs" else \
        not Job.objects.filter(id=one_of_each[state].id).exists()


def test_a_user_without_view_permission_gets_no_console(client):
    client.force_login(staff("nobody"))
    for url in (JOBS, DASHBOARD, HEALTH):
        assert client.get(url).status_code == 403


# ------------------------------------------------------------------------------ tenant scope --


def acme_scope(request):
    """The scope the tenant tests configure: user "ops" sees every tenant, others only acme."""
    return None if request.user.get_username() == "ops" else {"acme"}


def broken_scope(request):
    return "acme"


SCOPED = override_settings(XJOBS={"ADMIN_TENANT_SCOPE":
                                  "tests.integration.test_console_admin.acme_scope"})


@pytest.fixture
def two_tenants():
    mine = jobs_in_every_state("tenant-q-acme", lapsed=False, tenant_id="acme")
    theirs = jobs_in_every_state("tenant-q-globex", lapsed=False, tenant_id="globex")
    steps_for(mine["suspended"].run_id)
    steps_for(theirs["suspended"].run_id)
    other_rows(tenant_id="globex")
    return mine, theirs


@SCOPED
def test_a_tenant_scope_shows_only_that_tenants_jobs_everywhere(admin_client, two_tenants):
    mine, theirs = two_tenants
    assert ids_listed(admin_client.get(JOBS)) == {str(h.id) for h in mine.values()}
    assert ids_listed(admin_client.get(f"{JOBS}?tenant=globex")) == set()
    assert ids_listed(admin_client.get(JOBS, {"q": str(theirs["dead"].id)})) == set()
    assert ids_listed(admin_client.get(JOBS, {"q": str(theirs["dead"].run_id)})) == set()
    assert admin_client.get(detail(mine["dead"].id)).status_code == 200
    assert admin_client.get(detail(theirs["dead"].id)).status_code == 404
    history = reverse("admin:django_xjobs_job_history", args=[theirs["dead"].id])
    assert admin_client.get(history).status_code == 404
    board = admin_client.get(DASHBOARD).context["board"]
    assert [q.queue for q in board.queues] == ["tenant-q-acme"]
    (q,) = board.queues
    # Read from this tenant's rows: the counters count every tenant's jobs.
    assert (q.ready, q.running, q.dead_24h, q.done_24h, q.failed_24h) == (1, 1, 1, 1, None)
    assert board.outbox_pending == 0  # the staged entry is globex's
    assert board.leaders == [] and board.schedules == []
    health = admin_client.get(HEALTH).context["health"]
    assert health.tables == [] and health.holders == []
    steps = admin_client.get(reverse("admin:django_xjobs_jobstep_changelist"))
    assert {s.run_id for s in steps.context["cl"].result_list} == {mine["suspended"].run_id}
    foreign_step = JobStep.objects.filter(run_id=theirs["suspended"].run_id).first()
    assert admin_client.get(reverse("admin:django_xjobs_jobstep_change",
                                    args=[foreign_step.pk])).status_code == 404
    outbox = admin_client.get(reverse("admin:django_xjobs_outboxentry_changelist"))
    assert list(outbox.context["cl"].result_list) == []


@SCOPED
def test_a_tenant_scope_hides_the_tables_without_a_tenant(admin_client, two_tenants):
    app = admin_client.get(reverse("admin:app_list", args=["django_xjobs"])).content.decode()
    for model in ("jobevent", "joblease", "schedulerleader", "schedulerstate", "backfill"):
        assert admin_client.get(
            reverse(f"admin:django_xjobs_{model}_changelist")).status_code == 403, model
        assert f"/django_xjobs/{model}/" not in app
    assert "/django_xjobs/job/" in app


@SCOPED
def test_actions_under_a_tenant_scope_cannot_touch_another_tenants_jobs(
        admin_client, two_tenants):
    mine, theirs = two_tenants
    for action, state in (("cancel_jobs", "running"), ("retry_jobs", "dead"),
                          ("run_jobs_now", "delayed"), ("delete_finished_jobs", "done")):
        post_action(admin_client, action, [theirs[state].id, mine[state].id])
        assert row(theirs[state].id).state == state, action
    assert row(mine["running"].id).state == "cancelled"
    assert row(mine["dead"].id).state == "ready"
    assert row(mine["delayed"].id).state == "ready"
    assert not Job.objects.filter(id=mine["done"].id).exists()
    assert not LogEntry.objects.filter(object_id__in=[str(h.id) for h in theirs.values()])


@SCOPED
def test_a_scope_returning_none_shows_every_tenant(client, two_tenants):
    user = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    mine, theirs = two_tenants
    assert client.get(detail(theirs["dead"].id)).status_code == 200
    listed = ids_listed(client.get(JOBS))
    assert listed == {str(h.id) for h in (*mine.values(), *theirs.values())}


@override_settings(XJOBS={"ADMIN_TENANT_SCOPE":
                          "tests.integration.test_console_admin.broken_scope"})
def test_a_scope_that_returns_a_string_is_a_configuration_error(admin_client):
    with pytest.raises(ConfigurationError, match="set of tenant id strings"):
        admin_client.get(JOBS)


@override_settings(XJOBS={"ADMIN_TENANT_SCOPE": "tests.integration.nowhere.scope"})
def test_a_scope_that_cannot_be_imported_is_a_configuration_error(admin_client):
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        admin_client.get(DASHBOARD)


def test_a_callable_scope_works_as_well_as_a_dotted_path(admin_client, two_tenants):
    mine, theirs = two_tenants
    with override_settings(XJOBS={"ADMIN_TENANT_SCOPE": lambda request: {"globex"}}):
        assert admin_client.get(detail(mine["dead"].id)).status_code == 404
        assert admin_client.get(detail(theirs["dead"].id)).status_code == 200


# ------------------------------------------------------------------------------------ scale --


def test_a_big_list_is_estimated_not_counted(admin_client, monkeypatch):
    monkeypatch.setattr(console_paginator, "EXACT_COUNT_LIMIT", 20)
    api.enqueue_many(("testapp.noop", {"n": i}, {"queue": "big-q"}) for i in range(60))
    with connection.cursor() as cursor:
        cursor.execute("analyze x_jobs")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(f"{JOBS}?queue=big-q")
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT 21" in sql for sql in counts), counts
    assert any(q["sql"].startswith("EXPLAIN") for q in queries)
    assert response.context["cl"].paginator.estimated
    assert "about " in response.content.decode()


def test_a_small_list_is_counted_exactly(admin_client):
    for _ in range(3):
        testapp_jobs.noop.using(queue="small-q").enqueue()
    response = admin_client.get(f"{JOBS}?queue=small-q")
    assert response.context["cl"].result_count == 3
    assert not response.context["cl"].paginator.estimated


def test_the_jobs_list_is_in_primary_key_order_descending_and_not_sortable(admin_client):
    # UUIDv7: a later millisecond sorts later, so this is newest first (within one millisecond
    # the order is the ids' random bits).
    handles = [testapp_jobs.noop.using(queue="order-q").enqueue() for _ in range(3)]
    response = admin_client.get(f"{JOBS}?queue=order-q")
    assert [j.id for j in response.context["cl"].result_list] == sorted(
        (h.id for h in handles), reverse=True)
    assert 'class="sortable' not in response.content.decode()


def test_json_columns_of_the_other_pages_are_shown_once_pretty_printed(admin_client):
    handle = job_in_state("suspended", queue="pretty-q")
    steps_for(handle.run_id)
    step = JobStep.objects.get(run_id=handle.run_id, name="fetch-profile")
    page = admin_client.get(reverse("admin:django_xjobs_jobstep_change",
                                    args=[step.pk])).content.decode()
    assert page.count("ada@example.com") == 1
    assert '<pre class="xjobs-json">' in page


def test_the_slots_page_shows_the_limit_each_slot_was_taken_under(admin_client):
    from tests.console_data import slot_held_by_a_run

    slot_held_by_a_run("page")
    response = admin_client.get(reverse("admin:django_xjobs_joblease_changelist"))
    page = response.content.decode()
    assert '<td class="field-limit">2</td>' in page
    (lease,) = response.context["cl"].result_list
    detail_page = admin_client.get(reverse("admin:django_xjobs_joblease_change",
                                           args=[lease.pk])).content.decode()
    assert "field-limit" in detail_page


def breadcrumbs(page: str) -> list[str]:
    """The tags and classes of a page's breadcrumbs bar, in order (no text, no hrefs)."""
    nav = page.split('<nav aria-label="Breadcrumbs">', 1)[1].split("</nav>", 1)[0]
    return re.findall(r"<(\w+)(?: class=\"([^\"]*)\")?", nav)


def crumb_texts(page: str) -> list[str]:
    """The crumbs' texts, without their separators: "›" between list items (Django 6.1),
    "&rsaquo;" in the text between links (5.2)."""
    nav = page.split('<nav aria-label="Breadcrumbs">', 1)[1].split("</nav>", 1)[0]
    texts = (re.sub(r"\s+", " ", re.sub(r"&rsaquo;|›", " ", t)).strip()
             for t in re.findall(r">([^<>]*[^<>\s][^<>]*)<", nav))
    return [t for t in texts if t]


def test_the_consoles_own_pages_use_the_installed_admins_breadcrumbs(admin_client, one_of_each):
    # The console's pages sit beside the models' lists: the stock jobs list has their depth,
    # Home > app > this page ("Home › Jobs › Jobs › Jobs dashboard" read as nonsense).
    stock = breadcrumbs(admin_client.get(JOBS).content.decode())
    assert stock[0][1] == "breadcrumbs"
    queue = reverse("admin:django_xjobs_queue", args=["console-q"])
    for url, last in ((DASHBOARD, "Dashboard"), (HEALTH, "Health panel"),
                      (queue, "Queue console-q")):
        page = admin_client.get(url).content.decode()
        assert breadcrumbs(page) == stock, url
        assert crumb_texts(page) == ["Home", "Jobs", last], url
    paused = admin_client.post(reverse("admin:django_xjobs_pause"),
                               {"op": "pause", "kind": "queue", "name": "console-q"})
    assert breadcrumbs(paused.content.decode()) == stock
    assert crumb_texts(paused.content.decode()) == ["Home", "Jobs", "Pause queue console-q"]
    # An action's confirmation is under the list it was chosen from, as a job's page is.
    form = breadcrumbs(admin_client.get(detail(one_of_each["dead"].id)).content.decode())
    confirm = post_action(admin_client, "cancel_jobs", [one_of_each["ready"].id], confirm=False)
    assert breadcrumbs(confirm.content.decode()) == form
    assert crumb_texts(confirm.content.decode())[:3] == ["Home", "Jobs", "Jobs"]
