"""The console on rows it must not choke on: JSON that Python cannot decode, JSON too big to
put on a page, and filter values PostgreSQL refuses (a NUL byte).

Each such row is written with raw SQL (tests/console_data.py): the API and the ORM would not
write it, but a database holds what it holds, and the console is where one goes to look.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.urls import reverse

from django_xjobs.models import Job, JobEvent, JobStep, OutboxEntry
from tests.console_data import (
    DEEP_ARRAY_SQL,
    HUGE_INT_SQL,
    job_in_state,
    other_rows,
    steps_for,
    undecodable,
)

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_xjobs_job_changelist")
DASHBOARD = reverse("admin:django_xjobs_dashboard")
HEALTH = reverse("admin:django_xjobs_health")
NOTE = "could not be decoded"


def detail(job_id) -> str:
    return reverse("admin:django_xjobs_job_change", args=[job_id])


def run(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def bad_rows():
    """A dead job whose input holds a 5,000-digit integer and whose result nests arrays 5,000
    deep; a suspended one with such a step output; an event payload and an outbox input."""
    dead = job_in_state("dead", queue="bad-q")
    undecodable("x_jobs", dead.id, input=HUGE_INT_SQL, result=DEEP_ARRAY_SQL)
    suspended = job_in_state("suspended", queue="bad-q")
    steps_for(suspended.run_id)
    step = JobStep.objects.get(run_id=suspended.run_id, name="fetch-profile")
    undecodable("x_job_steps", step.pk, output=DEEP_ARRAY_SQL)
    others = other_rows()
    undecodable("x_job_events", others["event"].id, payload=HUGE_INT_SQL)
    undecodable("x_outbox", others["outbox"].pk, input=DEEP_ARRAY_SQL)
    undecodable("x_backfills", others["backfill"].pk, last_cursor=HUGE_INT_SQL)
    return {"dead": dead, "suspended": suspended, "step": step, **others}


# ------------------------------------------------------------------- undecodable JSON --


def test_every_page_renders_rows_whose_json_python_cannot_decode(admin_client, bad_rows):
    pages = [JOBS, f"{JOBS}?state=dead", f"{JOBS}?queue=bad-q", DASHBOARD, HEALTH,
             detail(bad_rows["dead"].id), detail(bad_rows["suspended"].id),
             reverse("admin:django_xjobs_job_history", args=[bad_rows["dead"].id])]
    for model, pk in (("jobstep", bad_rows["step"].pk), ("jobevent", bad_rows["event"].id),
                      ("outboxentry", bad_rows["outbox"].pk),
                      ("backfill", bad_rows["backfill"].pk)):
        pages += [reverse(f"admin:django_xjobs_{model}_changelist"),
                  reverse(f"admin:django_xjobs_{model}_change", args=[pk])]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, (url, response.status_code)


def test_the_job_page_shows_undecodable_json_as_stored_text_with_a_note(admin_client, bad_rows):
    page = admin_client.get(detail(bad_rows["dead"].id)).content.decode()
    assert "Why it is dead" in page
    assert page.count(NOTE) == 2  # the input and the result
    assert '{&quot;n&quot;: 9999999999' in page  # the stored text, as text
    assert "[[[[[[[[[[" in page
    for field in ("input", "result"):
        raw_url = reverse("admin:django_xjobs_job_json", args=[bad_rows["dead"].id, field])
        assert f'href="{raw_url}"' in page
    longer = job_in_state("dead", queue="longer-q")
    undecodable("x_jobs", longer.id, input="""('{"n": ' || repeat('8', 30000) || '}')::jsonb""")
    page = admin_client.get(detail(longer.id)).content.decode()
    assert "8" * 9000 in page and "8" * 11000 not in page
    assert "Shortened to its first 10,000 of 30,007 characters" in page
    suspended = admin_client.get(detail(bad_rows["suspended"].id)).content.decode()
    assert NOTE in suspended and "fetch-profile" in suspended
    for model, pk in (("jobstep", bad_rows["step"].pk), ("jobevent", bad_rows["event"].id),
                      ("outboxentry", bad_rows["outbox"].pk),
                      ("backfill", bad_rows["backfill"].pk)):
        page = admin_client.get(reverse(f"admin:django_xjobs_{model}_change",
                                        args=[pk])).content.decode()
        assert NOTE in page, model


def test_the_dead_list_and_the_dashboard_list_a_job_with_undecodable_input(admin_client,
                                                                           bad_rows):
    listed = admin_client.get(f"{JOBS}?state=dead").content.decode()
    assert str(bad_rows["dead"].id) in listed
    board = admin_client.get(DASHBOARD).context["board"]
    assert bad_rows["dead"].id in [f.id for f in board.failures]


def test_the_console_commands_survive_undecodable_json(bad_rows):
    dead = str(bad_rows["dead"].id)
    assert dead in run("jobs")
    assert dead in run("dashboard")
    assert "running jobs whose lease expired" in run("health")
    shown = run("show", dead)
    assert NOTE in shown and '{"n": 99999' in shown and "9" * 5000 not in shown
    assert "Dead after" in run("why", dead)
    assert "fetch-profile" in run("show", str(bad_rows["suspended"].id))
    for command in ("steps", "outbox", "backfills", "events", "dashboard", "health"):
        assert run(command).strip(), command


def test_the_json_output_marks_undecodable_values_and_keeps_their_text(bad_rows):
    dead = str(bad_rows["dead"].id)
    (row,) = [j for j in json.loads(run("jobs", "--json")) if j["id"] == dead]
    assert row["input"]["undecodable"] and row["input"]["text"] == '{"n": ' + "9" * 5000 + "}"
    assert row["result"]["chars"] == 10_000
    shown = json.loads(run("show", dead, "--json"))
    assert shown["input"]["text"].startswith('{"n": 999')
    steps = json.loads(run("show", str(bad_rows["suspended"].id), "--json"))["steps"]
    (step,) = [s for s in steps if s["name"] == "fetch-profile"]
    assert step["output"]["undecodable"]
    (event,) = json.loads(run("events", "--json"))
    assert event["payload"]["undecodable"]
    (entry,) = json.loads(run("outbox", "--json"))
    assert entry["input"]["undecodable"]


# --------------------------------------------------------------------------- big JSON --


def test_a_big_input_is_truncated_on_the_page_with_a_link_to_the_whole(admin_client):
    blob = "x" * (512 * 1024)
    handle = job_in_state("done", queue="big-json-q")
    Job.objects.filter(id=handle.id).update(input={"blob": blob})
    page = admin_client.get(detail(handle.id)).content.decode()
    assert blob not in page and "x" * 5000 in page
    assert len(page) < 100_000
    raw_url = reverse("admin:django_xjobs_job_json", args=[handle.id, "input"])
    assert f'href="{raw_url}"' in page
    whole = admin_client.get(raw_url)
    assert whole.status_code == 200 and whole["Content-Type"].startswith("application/json")
    assert json.loads(whole.content) == {"blob": blob}


def test_the_whole_of_an_undecodable_value_is_served_as_stored(admin_client, bad_rows):
    dead = bad_rows["dead"].id
    raw = admin_client.get(reverse("admin:django_xjobs_job_json", args=[dead, "input"]))
    assert raw.content.decode() == '{"n": ' + "9" * 5000 + "}"
    deep = admin_client.get(reverse("admin:django_xjobs_job_json", args=[dead, "result"]))
    assert deep.content.decode() == "[" * 5000 + "]" * 5000
    step = admin_client.get(reverse("admin:django_xjobs_jobstep_json",
                                    args=[bad_rows["step"].pk, "output"]))
    assert step.status_code == 200 and step.content.decode().startswith("[[[")
    for model, pk, field in (("jobevent", bad_rows["event"].id, "payload"),
                             ("outboxentry", bad_rows["outbox"].pk, "input")):
        response = admin_client.get(reverse(f"admin:django_xjobs_{model}_json",
                                            args=[pk, field]))
        assert response.status_code == 200, model


def test_the_whole_value_view_checks_permission_scope_and_field(client, admin_client):
    from django.contrib.auth.models import User
    from django.test.utils import override_settings

    handle = job_in_state("done", queue="raw-q", tenant_id="globex")
    url = reverse("admin:django_xjobs_job_json", args=[handle.id, "input"])
    assert admin_client.get(url).status_code == 200
    assert admin_client.get(reverse("admin:django_xjobs_job_json",
                                    args=[handle.id, "last_error"])).status_code == 404
    assert admin_client.get(reverse("admin:django_xjobs_job_json",
                                    args=["not-a-uuid", "input"])).status_code == 404
    client.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert client.get(url).status_code == 403
    with override_settings(XJOBS={"ADMIN_TENANT_SCOPE": lambda request: {"acme"}}):
        assert admin_client.get(url).status_code == 404


def test_big_step_output_event_payload_and_outbox_input_are_truncated(admin_client):
    blob = "y" * (300 * 1024)
    handle = job_in_state("suspended", queue="big-steps-q")
    step = JobStep.objects.create(run_id=handle.run_id, name="big", status="completed",
                                  output={"blob": blob}, attempts=1)
    others = other_rows()
    JobEvent.objects.filter(id=others["event"].id).update(payload={"blob": blob})
    OutboxEntry.objects.filter(pk=others["outbox"].pk).update(input={"blob": blob})
    pages = [detail(handle.id),
             reverse("admin:django_xjobs_jobstep_change", args=[step.pk]),
             reverse("admin:django_xjobs_jobevent_change", args=[others["event"].id]),
             reverse("admin:django_xjobs_outboxentry_change", args=[others["outbox"].pk])]
    for url in pages:
        page = admin_client.get(url).content.decode()
        assert blob not in page and "y" * 5000 in page, url
        assert "/json/" in page, url


# --------------------------------------------------------------------------- NUL bytes --


def test_a_nul_byte_in_a_filter_or_the_search_is_a_normal_page(admin_client):
    job_in_state("ready", queue="nul-q", tenant_id="acme")
    for query in ({"tenant": "a\x00b"}, {"queue": "nul\x00"}, {"name": "\x00"},
                  {"q": "key\x00"}, {"q": "\x00", "state": "dead"}):
        response = admin_client.get(JOBS, query)
        assert response.status_code == 200, query
        assert list(response.context["cl"].result_list) == [], query
    date = {"created_at__range__gte_0": "2026\x00", "created_at__range__gte_1": "0"}
    assert admin_client.get(JOBS, date).status_code == 200
    response = admin_client.get(JOBS, {"tenant": "a\x00b"})
    assert list(response.context["cl"].result_list) == []
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert "NUL" in message


def test_a_nul_byte_in_the_other_lists_and_in_an_object_id_is_no_server_error(admin_client):
    other_rows()
    for model, query in (("jobevent", {"name": "user\x00"}), ("jobevent", {"q": "4\x002"}),
                         ("joblease", {"q": "tenant:\x00"}), ("backfill", {"q": "a\x00"}),
                         ("jobstep", {"q": "\x00"}), ("outboxentry", {"pending": "\x00"})):
        response = admin_client.get(reverse(f"admin:django_xjobs_{model}_changelist"), query)
        assert response.status_code == 200, (model, query)
    for model in ("schedulerstate", "schedulerleader", "job", "jobevent"):
        url = reverse(f"admin:django_xjobs_{model}_change", args=["nightly\x00report"])
        assert admin_client.get(url).status_code == 404, model


def test_a_nul_byte_in_a_command_argument_is_a_clear_error():
    from django.core.management import CommandError

    job_in_state("ready", queue="nul-cli-q")
    for args in (("jobs", "--tenant", "a\x00"), ("jobs", "--queue", "\x00"),
                 ("events", "--name", "user\x00"), ("slots", "--key", "k\x00"),
                 ("show", "\x00"), ("cancel", "0190a1b2-0000-7000-8000-000000000000\x00")):
        with pytest.raises(CommandError, match="NUL"):
            run(*args)
    assert Job.objects.filter(queue="nul-cli-q", state="ready").count() == 1
