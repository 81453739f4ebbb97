"""Jobs whose name no worker that claimed them knows (docs/deployment.md, "New job types before
their workers"): what `xjobs why`, the console's job page and health panel, `xjobs health` and
the metrics say about them.

The waiting row is made by a real give-back (``drain`` of a worker that does not know the
name); its wait is then moved an hour back, as an hour of give-backs would leave it, to pass
XJOBS["UNKNOWN_JOB_REPORT_AFTER"] without waiting for it.
"""

from __future__ import annotations

import json
from io import StringIO
from uuid import uuid4

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from django_xjobs import registry, why
from django_xjobs.console.reads.health import health, unknown_jobs
from django_xjobs.models import Job
from django_xjobs.testing import drain
from django_xjobs.worker.unknown import UnknownNames

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "billing.tasks.charge_later"  # a django.tasks module path: expected in a tasks.py


@pytest.fixture
def waiting() -> Job:
    row = Job.objects.create(name=NAME, idempotency_key=str(uuid4()), max_attempts=1,
                             queue="web-first", enqueued_by="cron:nightly-charge")
    drain(queues=["web-first"])
    row.refresh_from_db()
    assert (row.state, row.attempt) == ("delayed", 0), row.last_error
    return row


def age_the_wait(row: Job) -> None:
    with connection.cursor() as cur:
        cur.execute("update x_jobs set unknown_since = unknown_since - interval '1 hour' "
                    "where id = %s", [row.id])


def test_why_names_the_workers_the_wait_and_where_the_name_was_expected(waiting, admin_client):
    reasons = why.for_job(waiting.id)  # the drain's worker has gone: no_worker too
    assert [r.kind for r in reasons] == ["no_worker", "unknown_job"]  # not "delayed": this wait
    reason = reasons[1]
    worker = waiting.attempts[-1]["worker"]
    assert reason.kind == "unknown_job" and reason.workers == (worker,)
    assert reason.until == waiting.run_at and reason.since == waiting.unknown_since
    text = reason.text
    assert text.startswith(f"no worker that knows job '{NAME}' has claimed it: workers "
                           f"{worker} do not know it (deployed to web before the workers?); "
                           "waiting since ")
    assert ", next try at " in text
    assert "function 'charge_later' in module 'billing.tasks' (an app's tasks.py)" in text
    assert """enqueued by XJOBS["SCHEDULE"]['nightly-charge']""" in text

    out = StringIO()
    call_command("xjobs", "why", str(waiting.id), stdout=out)
    assert f"no worker that knows job '{NAME}' has claimed it" in out.getvalue()
    out = StringIO()
    call_command("xjobs", "why", str(waiting.id), "--json", stdout=out)
    answer = json.loads(out.getvalue())
    unknown = [r for r in answer["blocked_by"] if r["kind"] == "unknown_job"]
    assert unknown and unknown[0]["workers"] == [worker]
    assert unknown[0]["since"] == waiting.unknown_since.isoformat()
    page = admin_client.get(reverse("admin:django_xjobs_job_change", args=[waiting.id]))
    assert f"no worker that knows job &#x27;{NAME}&#x27; has claimed it" in page.content.decode()


def test_health_lists_the_wait_and_calls_it_bad_past_the_bound(waiting, admin_client):
    (row,) = health().unknown
    assert (row.wait.name, row.wait.queue, row.wait.count, row.verdict) == (
        NAME, "web-first", 1, "ok")  # a rolling deploy may still bring the code
    assert row.wait.cron_tasks == ("nightly-charge",)

    age_the_wait(waiting)
    report = health()
    assert [u.verdict for u in report.unknown] == ["bad"] and report.verdict == "bad"
    out = StringIO()
    # The exit status stays the workers' (a liveness probe): a job's wait is no reason to
    # restart them. The panel's overall verdict says it.
    call_command("xjobs", "health", stdout=out)
    assert "overall: bad" in out.getvalue()
    assert "jobs no worker knows (waiting for a worker that knows their name): 1" in (
        out.getvalue())
    assert NAME in out.getvalue()
    panel = admin_client.get(reverse("admin:django_xjobs_health")).content.decode()
    panel = panel.split('id="xjobs-unknown"', 1)[1].split("</div>", 1)[0]
    assert NAME in panel and "web-first" in panel and "tasks.py" in panel


def test_the_metrics_count_the_waiting_jobs_and_age_the_oldest(waiting, client):
    age_the_wait(waiting)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(client.get("/metrics")
                                                             .content.decode())
               for s in family.samples}
    labels = (("name", NAME), ("queue", "web-first"))
    assert samples[("xjobs_jobs_unknown", labels)] == 1
    assert samples[("xjobs_jobs_unknown_oldest_age_seconds", labels)] >= 3600


def test_a_job_that_ran_since_its_wait_is_no_longer_counted(waiting):
    # A worker that knows the name ran it and failed it: the last entry is no longer the wait's.
    Job.objects.filter(id=waiting.id).update(
        attempts=[*waiting.attempts, {"outcome": "failed"}])
    assert unknown_jobs() == []
    assert [r.kind for r in why.for_job(waiting.id)] == ["no_worker", "delayed"]


def test_the_worker_reports_a_wait_past_the_bound_once_per_interval(waiting, engine, caplog):
    report = UnknownNames(engine, report_after=600)
    report.gave_back(NAME)
    assert report.reported == 0  # ten minutes not reached
    age_the_wait(waiting)
    report.gave_back(NAME)
    assert report.reported == 0  # checked less than a minute ago: not read again

    report = UnknownNames(engine, report_after=600)
    with caplog.at_level("ERROR", logger="django_xjobs.worker"):
        report.gave_back(NAME)
        report.gave_back(NAME)
    assert report.reported == 1
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"1 job(s) named '{NAME}' on queue 'web-first' have waited since " in message
    assert "tasks.py" in message and "keep waiting, spending no attempt" in message


@pytest.mark.parametrize(("name", "by", "expected"), [
    ("shop.tasks.send", None, "function 'send' in module 'shop.tasks' (an app's tasks.py)"),
    ("shop.send", None, "function 'send' in the jobs.py of app 'shop'"),
    ("send", None, """jobs.py, a django.tasks task in an app's tasks.py (named by its module """
                   """path), or the job of an XJOBS["SCHEDULE"] entry"""),
    ("shop.send", "cron:hourly", """enqueued by XJOBS["SCHEDULE"]['hourly']"""),
])
def test_the_hint_names_where_the_code_was_expected(name, by, expected):
    assert expected in registry.expected_home(name, by)


def test_the_report_of_the_health_command_is_json_too(waiting):
    out = StringIO()
    call_command("xjobs", "health", "--json", stdout=out)
    (row,) = json.loads(out.getvalue())["unknown"]
    assert row["wait"]["name"] == NAME and row["verdict"] == "ok"
