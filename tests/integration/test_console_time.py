"""Times on the console: in the project's time zone with seconds, with durations where they
help, and with ``USE_TZ = False`` as well as with ``True``."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import override_settings
from django.urls import reverse

from tests.console_data import jobs_in_every_state, other_rows, steps_for

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_xjobs_job_changelist")
DASHBOARD = reverse("admin:django_xjobs_dashboard")
HEALTH = reverse("admin:django_xjobs_health")
NAIVE = override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris")


def run(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def one_of_each():
    handles = jobs_in_every_state("tz-q", tenant_id="acme")
    steps_for(handles["suspended"].run_id)
    other_rows(tenant_id="acme")
    return handles


@pytest.fixture
def naive_connection(transactional_db):
    """``USE_TZ = False`` on a connection opened under it, as in a project configured so:
    Django then registers its time-zone loader on the connection (not per cursor, as on a
    connection opened before the setting changed), and the engine's own cursor follows it."""
    connections.close_all()
    with NAIVE:
        yield
        connections.close_all()  # the next test must not inherit this connection's loader


def every_page_renders(client, handles) -> None:
    from django_xjobs.engines import get_engine
    from django_xjobs.models import Job

    # A worker process's row, for the workers on the dashboard and the health panel.
    get_engine().worker_seen("tz-worker", "host-tz", 9, ["tz-q"], version="1", concurrency=2,
                             running=0, finished=1, claimed_age=1.0, loop_age=0.1)
    pages = [DASHBOARD, HEALTH, JOBS, f"{JOBS}?state=dead", f"{JOBS}?state=lapsed",
             f"{JOBS}?created_at__range__gte_0=2020-01-01&created_at__range__gte_1=00:00:00"]
    # The console's own site: its dashboard, and a queue's page, in each chart window.
    queue = reverse("xjobs_console:django_xjobs_queue", args=["tz-q"])
    pages += [f"{page}?window={window}" for page in ("/_x/", queue)
              for window in ("hour", "day", "week")]
    pages += [reverse("admin:django_xjobs_job_change", args=[h.id]) for h in handles.values()]
    for model in ("jobstep", "jobevent", "outboxentry", "joblease", "schedulerleader",
                  "schedulerstate", "backfill"):
        pages.append(reverse(f"admin:django_xjobs_{model}_changelist"))
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    listed = client.get(f"{JOBS}?queue=tz-q").context["cl"].result_list
    assert {j.id for j in listed} == {h.id for h in handles.values()}
    assert Job.objects.filter(queue="tz-q").count() == len(handles)


def every_command_runs(handles) -> None:
    assert str(handles["dead"].id) in run("dashboard")
    assert "running jobs whose lease expired: 1" in run("health")
    assert str(handles["dead"].id) in run("jobs", "--created-after", "2020-01-01T00:00:00Z")
    assert run_json_ids("jobs", "--run-after", "2999-01-01T00:00:00Z") == set()
    assert "Its lease expired" in run("why", str(handles["lapsed"].id))
    for command in ("workers", "steps", "outbox", "backfills", "events"):
        assert run(command).strip(), command


@NAIVE
def test_every_page_works_without_time_zone_support(admin_client, one_of_each):
    every_page_renders(admin_client, one_of_each)


@NAIVE
def test_the_commands_work_without_time_zone_support(one_of_each):
    every_command_runs(one_of_each)


@pytest.mark.django_db(transaction=True)
def test_pages_and_commands_work_on_a_connection_opened_without_time_zone_support(
        naive_connection, admin_client, one_of_each):
    every_page_renders(admin_client, one_of_each)
    every_command_runs(one_of_each)


def run_json_ids(*args: str) -> set[str]:
    return {j["id"] for j in json.loads(run(*args, "--json"))}


SECONDS = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def field(page: str, name: str) -> str:
    """The text of one read-only field of a job's page."""
    import re

    found = re.search(rf'<div class="[^"]*field-{name}\b.*?<div class="readonly">(.*?)</div>',
                      page, re.S)
    assert found, name
    return found.group(1)


def test_the_job_page_shows_times_to_the_second_and_the_durations(admin_client, one_of_each):
    import re
    from datetime import timedelta

    from django_xjobs.models import Job

    done = one_of_each["done"].id
    row = Job.objects.get(id=done)
    # A run of 83.4 s that waited 2.5 s for a worker after it was due.
    Job.objects.filter(id=done).update(run_at=row.started_at - timedelta(seconds=2.5),
                                       finished_at=row.started_at + timedelta(seconds=83.4))
    page = admin_client.get(reverse("admin:django_xjobs_job_change", args=[done])).content
    page = page.decode()
    for name in ("created", "due", "started", "finished", "updated"):
        assert re.search(SECONDS, field(page, name)), name
    assert field(page, "ran_for") == "1 min 23 s (attempt 1)"
    assert field(page, "waited") == "2.5 s: from due to the start of attempt 1"
    assert " UTC (" in field(page, "started")

    running = admin_client.get(reverse("admin:django_xjobs_job_change",
                                       args=[one_of_each["running"].id])).content.decode()
    assert re.fullmatch(rf"{SECONDS} UTC \(expires in (\d+ min \d+ s|[\d.]+ s)\)",
                        field(running, "lease"))
    assert "so far (attempt 1)" in field(running, "ran_for")
    lapsed = admin_client.get(reverse("admin:django_xjobs_job_change",
                                      args=[one_of_each["lapsed"].id])).content.decode()
    assert re.search(r"\(expired [\d.]+ (ms|s) ago\)", field(lapsed, "lease"))
    ready = admin_client.get(reverse("admin:django_xjobs_job_change",
                                     args=[one_of_each["ready"].id])).content.decode()
    assert "so far: due, no worker has taken it yet" in field(ready, "waited")


@NAIVE
def test_without_time_zone_support_times_are_shown_in_time_zone(admin_client, one_of_each):
    import re

    page = admin_client.get(reverse("admin:django_xjobs_job_change",
                                    args=[one_of_each["done"].id])).content.decode()
    assert re.search(rf"{SECONDS} CES?T \(", field(page, "finished"))


@pytest.mark.parametrize(("seconds", "text"), [
    (0.85, "850 ms"), (12.34, "12.3 s"), (59.9, "59.9 s"), (83.4, "1 min 23 s"),
    (3599.6, "1 h 0 min"), (11_520, "3 h 12 min"), (183_600, "2 d 3 h"), (None, "-"),
])
def test_durations_read_to_the_second(seconds, text):
    from django_xjobs.console.reads.text import duration_text

    assert duration_text(seconds) == text
