"""Pauses of queues and keys and the PauseKey circuit breaker (docs/flow-control.md, "Pause and
circuit breakers"): the API, the ``xjobs`` commands, the console's actions, bad input of each
(a clear error, nothing written), and the settle of a run that raised PauseKey."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from io import StringIO
from uuid import uuid4

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse

from django_xjobs import (
    PauseKey,
    conf,
    pause_key,
    pause_queue,
    pauses,
    registry,
    resume_key,
    resume_queue,
)
from django_xjobs.engines import get_engine
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import FlowPause, Job
from django_xjobs.records import Fence, KeyPauseRequeue
from django_xjobs.testing import drain
from django_xjobs.worker.flow import claim_flow
from tests.conftest import wait_until
from tests.testapp import jobs as testapp_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = reverse("admin:django_xjobs_dashboard")
PAUSE = reverse("admin:django_xjobs_pause")


def db_now() -> datetime:
    return get_engine().db_now()


def xjobs(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


def blocked_job(key: str, *, resume: bool = False, queue: str = "default"):
    """A job the claim blocked on ``key`` (written as the claim writes it)."""
    handle = testapp_jobs.record.using(queue=queue).enqueue(tag=key)
    Job.objects.filter(id=handle.id).update(state="blocked", blocked_on=key,
                                            blocked_resume=resume)
    return handle


def wait_past(moment: datetime) -> None:
    """Until the database clock is past ``moment`` (a pause's end)."""
    wait_until(lambda: db_now() > moment, timeout=30, message=f"the database clock past {moment}")


def unblock() -> int:
    """The pass every worker runs once per poll interval (worker/flow.py): wakes the jobs
    blocked on a key whose pause ended. A drain() ends before its first interval does."""
    return get_engine().jobs_unblock(claim_flow(conf.get(), registry.all_jobs().values(),
                                                conf.get().queues))


def started(handle) -> list[int]:
    """The attempt of every run of the job that got as far as its first line."""
    return list(Effect.objects.filter(job_id=str(handle.id), kind="start")
                .order_by("id").values_list("attempt", flat=True))


# ------------------------------------------------------------------------------------ API --


def test_a_queue_pause_is_recorded_listed_changed_and_resumed():
    until = db_now() + timedelta(hours=1)
    record = pause_queue("default", until=until, reason="migration")
    assert (record.kind, record.key, record.until, record.reason) == (
        "queue", "default", until, "migration")
    assert [(p.kind, p.key, p.reason) for p in pauses()] == [("queue", "default", "migration")]

    later = until + timedelta(hours=1)
    again = pause_queue("default", until=later, reason="longer migration")
    assert (again.until, again.reason, again.paused_at) == (later, "longer migration",
                                                            record.paused_at)
    assert FlowPause.objects.count() == 1

    assert pause_queue("default").until is None  # until resumed
    assert resume_queue("default") is True
    assert pauses() == []
    assert resume_queue("default") is False


def test_a_key_pause_for_a_duration_ends_on_the_database_clock():
    before = db_now()
    record = pause_key("partner:acme", for_=timedelta(minutes=10), reason="429")
    after = db_now()
    assert before + timedelta(minutes=10) <= record.until <= after + timedelta(minutes=10)
    assert pause_key("partner:globex").until is None
    assert [(p.kind, p.key) for p in pauses(kind="key")] == [("key", "partner:acme"),
                                                             ("key", "partner:globex")]
    assert pauses(kind="queue") == []


def test_an_expired_pause_is_not_listed_and_a_new_one_replaces_it():
    pause_key("k", for_=timedelta(minutes=1))
    FlowPause.objects.filter(key="k").update(until=db_now() - timedelta(seconds=1))
    assert pauses() == []
    first_paused_at = FlowPause.objects.get(key="k").paused_at
    before = db_now()
    renewed = pause_key("k", for_=timedelta(minutes=5), reason="again")
    assert renewed.paused_at >= before > first_paused_at  # a new pause, not the old one's
    assert [p.reason for p in pauses()] == ["again"]


@pytest.mark.parametrize("call, message", [
    (lambda: pause_queue("bad queue!"), "queue 'bad queue!' is not valid"),
    (lambda: pause_queue(""), "queue '' is not valid"),
    (lambda: pause_queue("default", until=datetime(2030, 1, 1)), "naive"),
    (lambda: pause_queue("default", until="2030-01-01T00:00:00Z"), "aware datetime"),
    (lambda: pause_queue("default", until=db_now() - timedelta(seconds=1)),
     "is not in the future"),
    (lambda: pause_queue("default", reason="a\x00b"), "reason"),
    (lambda: pause_key("", for_=timedelta(minutes=1)), "key must be a non-empty string"),
    (lambda: pause_key("k" * 501, for_=timedelta(minutes=1)), "at most 500"),
    (lambda: pause_key("k", until=db_now() + timedelta(hours=1), for_=timedelta(minutes=1)),
     "not both"),
    (lambda: pause_key("k", for_=timedelta(0)), "positive"),
    (lambda: pause_key("k", for_=timedelta(seconds=-5)), "must not be negative"),
    (lambda: pause_key("k", for_=60), "must be a timedelta"),
    (lambda: pause_key("k", reason="x" * 1001), "at most 1000"),
    (lambda: resume_key(""), "key must be a non-empty string"),
    (lambda: resume_queue("a b"), "queue 'a b' is not valid"),
    (lambda: pauses(kind="tenant"), "kind must be"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(call, message):
    with pytest.raises(InvalidJobInput, match=message.replace("(", r"\(")):
        call()
    assert FlowPause.objects.count() == 0


def test_resuming_a_key_hands_back_its_blocked_jobs_and_wakes_their_queues():
    pause_key("partner:acme")
    ready = blocked_job("partner:acme", queue="q-acme-1")
    resuming = blocked_job("partner:acme", resume=True, queue="q-acme-2")
    other = blocked_job("partner:globex", queue="q-globex")
    listener = get_engine().listener("tests-pauses-listen")  # after the enqueues' NOTIFYs
    try:
        listener.wait(0.05)
        assert resume_key("partner:acme") == (True, 2)
        rows = {j.id: j for j in Job.objects.filter(id__in=[ready.id, resuming.id, other.id])}
        assert (rows[ready.id].state, rows[ready.id].blocked_on) == ("ready", None)
        assert (rows[resuming.id].state, rows[resuming.id].blocked_resume) == ("suspended",
                                                                               False)
        assert (rows[other.id].state, rows[other.id].blocked_on) == ("blocked", "partner:globex")
        heard: set[str] = set()
        wait_until(lambda: heard.update(listener.wait(0.2)) or {"q-acme-1", "q-acme-2"} <= heard,
                   message="a NOTIFY for each queue of the jobs handed back")
        assert "q-globex" not in heard
    finally:
        listener.close()
    assert FlowPause.objects.count() == 0
    # A key that is not paused: its blocked jobs are handed back all the same.
    assert resume_key("partner:globex") == (False, 1)


def test_resuming_a_queue_wakes_its_workers():
    listener = get_engine().listener("tests-pauses-listen")
    try:
        listener.wait(0.05)
        pause_queue("other")
        assert resume_queue("other") is True
        heard: set[str] = set()
        wait_until(lambda: heard.update(listener.wait(0.2)) or "other" in heard,
                   message="a NOTIFY of the resumed queue")
    finally:
        listener.close()


def test_the_pauses_list_counts_the_jobs_blocked_on_a_key():
    pause_key("partner:acme", for_=timedelta(minutes=5))
    blocked_job("partner:acme")
    blocked_job("partner:acme")
    (record,) = pauses()
    assert record.blocked == 2


# -------------------------------------------------------------------------- PauseKey --


@pytest.mark.parametrize("args, kwargs, error", [
    (("",), {"for_": 1}, TypeError),
    ((5,), {"for_": 1}, TypeError),
    (("k",), {"for_": "10m"}, TypeError),
    (("k",), {"for_": 0}, ValueError),
    (("k",), {"for_": timedelta(seconds=-1)}, ValueError),
    (("k",), {"for_": float("inf")}, ValueError),
    (("k",), {"for_": 1, "reason": 5}, TypeError),
])
def test_pause_key_refuses_bad_arguments(args, kwargs, error):
    with pytest.raises(error):
        PauseKey(*args, **kwargs)


def test_a_job_raising_pause_key_is_requeued_without_spending_an_attempt_and_pauses_its_key():
    handle = testapp_jobs.partner_call.enqueue(partner="acme", trip=True, pause_seconds=60)
    before = db_now()
    stats = drain()
    assert stats["requeued"] == 1
    drain()  # a claim since the job went back (the first drain may end before its next one)
    row = handle.get()
    pause = FlowPause.objects.get(kind="key", key="partner:acme")
    assert pause.reason == "429 from partner"
    assert before + timedelta(seconds=60) <= pause.until <= db_now() + timedelta(seconds=60)
    assert (row.state, row.attempt, row.worker_ids) == ("blocked", 0, [])  # held back
    assert "PauseKey: paused key 'partner:acme' for 60s (429 from partner)" in row.last_error
    assert started(handle) == [1]


def test_a_run_that_lost_its_job_pauses_nothing():
    engine = get_engine()
    handle = testapp_jobs.partner_call.enqueue(partner="acme")
    claimed = engine.job_claim_if_due(str(handle.id), worker_id="tests", lease_ms=30_000)
    assert claimed is not None
    Job.objects.filter(id=handle.id).update(lease_token=uuid4())  # re-claimed by another run
    report, until = engine.job_pause_key_if_owned(KeyPauseRequeue(
        claim=claimed.claim, key="partner:acme", for_ms=60_000, reason="429",
        spent_attempt=True, resumed=False))
    assert (report.outcome(claimed.lease_token), until) == (Fence.LOST, None)
    assert FlowPause.objects.count() == 0
    assert handle.get().state == "running"


def test_a_pause_key_never_shortens_a_pause_in_force():
    engine = get_engine()
    pause_key("partner:acme", reason="by hand")  # until resumed
    pause_key("partner:globex", for_=timedelta(hours=2))
    for partner in ("acme", "globex"):
        handle = testapp_jobs.partner_call.enqueue(partner=partner)
        claimed = engine.job_claim_if_due(str(handle.id), worker_id="tests", lease_ms=30_000)
        report, _until = engine.job_pause_key_if_owned(KeyPauseRequeue(
            claim=claimed.claim, key=f"partner:{partner}", for_ms=60_000, reason="429",
            spent_attempt=True, resumed=False))
        assert report.outcome(claimed.lease_token) is Fence.OWNED
        row = handle.get()
        assert (row.state, row.attempt, row.worker_ids) == ("ready", 0, [])
    by_key = {p.key: p for p in pauses()}
    assert by_key["partner:acme"].until is None
    assert by_key["partner:globex"].until > db_now() + timedelta(hours=1)
    assert by_key["partner:acme"].reason == "429"


# ------------------------------------------------------------------------------ commands --


def test_the_commands_pause_list_and_resume():
    out = xjobs("pause", "default", "--for", "30m", "--reason", "deploy")
    assert out.startswith("pause: queue default is paused until ") and "(deploy)" in out
    (queue_pause,) = pauses()
    assert timedelta(minutes=29) < queue_pause.until - db_now() <= timedelta(minutes=30)
    xjobs("pause-key", "partner:acme", "--for", "10m", "--reason", "429")
    until = (db_now() + timedelta(hours=3)).isoformat()
    xjobs("pause", "other", "--until", until)
    listing = xjobs("pauses")
    assert "default" in listing and "partner:acme" in listing and "429" in listing
    data = json.loads(xjobs("pauses", "--json"))
    assert [(d["kind"], d["key"]) for d in data] == [
        ("key", "partner:acme"), ("queue", "default"), ("queue", "other")]
    assert xjobs("resume", "default").strip() == "resume: queue default resumed"
    blocked_job("partner:acme")
    assert xjobs("resume-key", "partner:acme").strip() == (
        "resume-key: key partner:acme resumed; 1 blocked job(s) handed back")
    assert json.loads(xjobs("resume", "default", "--json"))["was_paused"] is False
    assert [p.key for p in pauses()] == ["other"]


@pytest.mark.parametrize("args, message", [
    (("pause", "bad queue!"), "is not valid"),
    (("pause", "default", "--for", "soon"), "is not a duration"),
    (("pause", "default", "--for", "0s"), "more than zero"),
    (("pause", "default", "--for=-5m"), "is not a duration"),
    (("pause", "default", "--until", "2030-01-01T00:00:00"), "with a time zone"),
    (("pause", "default", "--until", "tomorrow"), "is not an ISO date-time"),
    (("pause", "default", "--until", "2001-01-01T00:00:00Z"), "is not in the future"),
    (("pause", "default", "--for", "5m", "--until", "2030-01-01T00:00:00Z"),
     "not allowed with argument"),
    (("pause-key", "partner:acme"), "one of the arguments --for --until is required"),
    (("pause-key", "", "--for", "5m"), "key must be a non-empty string"),
    (("pause-key", "k", "--for", "5m", "--reason", "x" * 1001), "at most 1000"),
    (("resume", "a b"), "is not valid"),
    (("pauses", "--limit", "0"), "--limit must be at least 1"),
])
def test_bad_command_input_is_a_clear_error_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=message):
        xjobs(*args)
    assert FlowPause.objects.count() == 0


# ------------------------------------------------------------------------------- console --


def pauser(username: str = "pauser", *, change: bool = True) -> User:
    """A staff user who sees the console (view_job) and, with ``change``, may pause."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    codenames = ["view_job"] + (["change_flowpause"] if change else [])
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_xjobs",
                                                        codename__in=codenames))
    return user


def test_the_console_pauses_a_queue_after_a_form_and_resumes_it(client):
    testapp_jobs.record.enqueue(tag="x")
    client.force_login(pauser())
    page = client.get(DASHBOARD).content.decode()
    assert 'value="Pause…"' in page and "No queue or key is paused." in page

    form = client.post(PAUSE, {"op": "pause", "kind": "queue", "name": "default"})
    assert form.status_code == 200 and 'name="duration"' in form.content.decode()
    assert FlowPause.objects.count() == 0  # the form alone writes nothing

    done = client.post(PAUSE, {"op": "pause", "kind": "queue", "name": "default",
                               "post": "yes", "duration": "30m", "reason": "deploy"})
    assert done.status_code == 302 and done["Location"] == DASHBOARD
    (pause,) = pauses()
    assert (pause.kind, pause.key, pause.reason) == ("queue", "default", "deploy (admin:pauser)")
    assert timedelta(minutes=29) < pause.until - db_now() <= timedelta(minutes=30)
    page = client.get(DASHBOARD).content.decode()
    assert "paused</span> until " in page and "(deploy (admin:pauser))" in page
    assert 'value="Resume"' in page

    resumed = client.post(PAUSE, {"op": "resume", "kind": "queue", "name": "default"})
    assert resumed.status_code == 302
    assert pauses() == []


def test_the_console_lists_key_pauses_and_resumes_one(client):
    pause_key("partner:acme", for_=timedelta(minutes=10), reason="429 from partner")
    handle = blocked_job("partner:acme")
    client.force_login(pauser())
    page = client.get(DASHBOARD).content.decode()
    assert "partner:acme" in page and "429 from partner" in page
    response = client.post(PAUSE, {"op": "resume", "kind": "key", "name": "partner:acme"},
                           follow=True)
    assert "1 blocked job handed back" in response.content.decode()
    assert pauses() == [] and handle.get().state == "ready"


def test_a_bad_duration_shows_the_form_again_and_writes_nothing(client):
    client.force_login(pauser())
    response = client.post(PAUSE, {"op": "pause", "kind": "queue", "name": "default",
                                   "post": "yes", "duration": "soon"})
    assert response.status_code == 200
    assert "is not a duration" in response.content.decode()
    bad_name = client.post(PAUSE, {"op": "pause", "kind": "queue", "name": "bad queue!",
                                   "post": "yes"}, follow=True)
    assert "is not valid" in bad_name.content.decode()
    nul_key = client.post(PAUSE, {"op": "resume", "kind": "key", "name": "a\x00b"},
                          follow=True)
    assert "without NUL" in nul_key.content.decode()
    unknown = client.post(PAUSE, {"op": "stop", "kind": "queue", "name": "default"},
                          follow=True)
    assert "Unknown pause action." in unknown.content.decode()
    assert FlowPause.objects.count() == 0


def test_pausing_needs_the_change_permission_and_a_post(client):
    pause_queue("default", reason="deploy")
    client.force_login(pauser("viewer", change=False))
    page = client.get(DASHBOARD).content.decode()
    assert "(deploy)" in page  # a viewer sees the pause ...
    assert 'value="Resume"' not in page and 'value="Pause…"' not in page  # ... not the buttons
    for op in ("pause", "resume"):
        denied = client.post(PAUSE, {"op": op, "kind": "queue", "name": "default", "post": "yes"})
        assert denied.status_code == 403
    assert [p.reason for p in pauses()] == ["deploy"]

    client.force_login(pauser())
    assert client.get(PAUSE).status_code == 405


def tenant_scope(request):
    return {"acme"}


@override_settings(XJOBS={"ADMIN_TENANT_SCOPE": "tests.integration.test_pauses.tenant_scope"})
def test_an_operator_scoped_to_tenants_cannot_pause(client):
    pause_key("partner:globex", reason="secret partner")
    client.force_login(pauser())
    page = client.get(DASHBOARD).content.decode()
    assert "partner:globex" not in page
    response = client.post(PAUSE, {"op": "pause", "kind": "queue", "name": "default",
                                   "post": "yes"})
    assert response.status_code == 403
    assert [p.key for p in pauses()] == ["partner:globex"]


# ------------------------------------------------------------------- the claim honours them --


def test_a_worker_claims_nothing_of_a_paused_queue_until_its_end():
    handle = testapp_jobs.record.enqueue(tag="held")
    pause = pause_queue("default", until=db_now() + timedelta(seconds=1), reason="deploy")
    other = testapp_jobs.record.using(queue="other").enqueue(tag="other queue")
    stats = drain()
    assert stats["done"] == 1 and other.get().state == "done"  # only the other queue ran
    row = handle.get()
    assert (row.state, row.attempt) == ("ready", 0)
    wait_past(pause.until)
    assert drain()["done"] == 1
    assert (handle.get().state, handle.get().attempt) == ("done", 1)


def test_resuming_a_queue_takes_effect_at_the_next_claim():
    pause_queue("default")  # until resumed
    handle = testapp_jobs.record.enqueue(tag="held")
    assert drain()["done"] == 0
    assert handle.get().state == "ready"
    assert resume_queue("default") is True
    assert drain()["done"] == 1
    assert handle.get().state == "done"


def test_pause_key_holds_back_its_key_until_the_pause_ends_and_spends_no_attempt():
    tripper = testapp_jobs.partner_call.enqueue(partner="acme", trip=True, pause_seconds=2)
    assert drain()["requeued"] == 1
    drain()  # a claim since the job went back (the first drain may end before its next one)
    pause = FlowPause.objects.get(kind="key", key="partner:acme")
    row = Job.objects.get(id=tripper.id)
    # Given back due now, then held back by the claim: blocked on its key, no attempt spent.
    assert (row.state, row.blocked_on, row.attempt, row.worker_ids) == (
        "blocked", "partner:acme", 0, [])
    sibling = testapp_jobs.partner_call.enqueue(partner="acme")
    globex = testapp_jobs.partner_call.enqueue(partner="globex")
    assert drain()["done"] == 1  # another key's job runs
    assert globex.get().state == "done"
    assert (sibling.get().state, sibling.get().attempt) == ("blocked", 0)
    assert started(sibling) == []
    assert unblock() == 0  # the pause is in force: the periodic pass wakes nothing
    wait_past(pause.until)
    assert unblock() == 2  # once it ended, the pass every worker runs wakes both
    assert drain()["done"] == 2
    assert started(tripper) == [1, 1]  # one attempt: the tripped run gave its own back
    row = tripper.get()
    assert (row.attempt, len(row.worker_ids), row.result) == (
        1, 1, {"partner": "acme", "attempt": 1})
    assert started(sibling) == [1]


def test_resuming_a_key_lets_its_blocked_jobs_run_at_the_next_claim():
    tripper = testapp_jobs.partner_call.enqueue(partner="acme", trip=True, pause_seconds=600)
    drain()
    sibling = testapp_jobs.partner_call.enqueue(partner="acme")
    drain()
    assert tripper.get().state == sibling.get().state == "blocked"
    assert resume_key("partner:acme") == (True, 2)
    assert drain()["done"] == 2
    assert tripper.get().attempt == 1 and sibling.get().attempt == 1
