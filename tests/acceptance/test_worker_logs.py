"""What a worker's log says about a job, read as an alerting pipeline reads it
(docs/observability.md, "Logs"). One worker whose log is JSON lines (``XJOBS_TEST_LOG_JSON``,
tests/settings.py), so each line's level, logger and attributes are read, not guessed:

* a ``ctx.logger`` line starts with ``job <id> (<name>) attempt <n>:`` and carries ``job_id``,
  ``job_name`` and ``attempt``; a line of the job's own module logger gets them from
  ``JobLogFilter``, its text unchanged; the worker's own lines about the job carry them too;
* a retry's line says when the next attempt is due (the row's run_at) and in how long;
* an operator's cancel in the console is one INFO line with the reason and who, as the row
  records them, and no warning about a lost lease.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_xjobs import api
from tests.conftest import wait_until
from tests.testapp.logs import JOB_ATTRIBUTES, records

from .conftest import SETTLE, job_row, wait_effect

pytestmark = pytest.mark.acceptance


def wait_line(worker, job_id, text: str) -> dict:
    """The first line about the job whose message contains ``text``."""
    def found():
        return next((r for r in records(worker.log())
                     if r.get("job_id") == str(job_id) and text in r["message"]), None)

    return wait_until(found, timeout=SETTLE, interval=0.05, message=f"{text!r} in the log")


def attributes(line: dict) -> dict:
    return {key: line.get(key) for key in JOB_ATTRIBUTES}


def test_a_jobs_lines_carry_the_job_a_retry_says_when_and_a_cancel_says_who(
        start_worker, admin_client):
    from tests.testapp.jobs import logs_then_retries, sleepy_polite

    worker = start_worker("logs", "--concurrency", "2", env={"XJOBS_TEST_LOG_JSON": "1"})
    handle = logs_then_retries.enqueue(order_id=42)
    about = f"job {handle.id} (testapp.logs_then_retries) attempt"
    first = {"job_id": str(handle.id), "job_name": "testapp.logs_then_retries", "attempt": 1}

    retry = wait_line(worker, handle.id, " failed -> ")
    row = job_row(handle.id)
    assert row.state == "delayed"
    lines = [r for r in records(worker.log()) if r.get("job_id") == str(handle.id)]
    # ctx.logger: the job in the text, and as attributes.
    [own] = [r for r in lines if r["logger"] == "django_xjobs.job"]
    assert (own["level"], own["message"]) == ("INFO", f"{about} 1: charging order 42")
    assert attributes(own) == first
    # The job's module logger: the attributes from JobLogFilter; its text as the job wrote it.
    [module] = [r for r in lines if r["logger"] == "tests.testapp.jobs"]
    assert (module["message"], attributes(module)) == ("order 42: card service called", first)
    # The worker's retry line: when the next attempt is due, on the database's clock, as the
    # row holds it, and in how long (the job asked for ten minutes).
    due = row.run_at.isoformat(sep=" ", timespec="milliseconds")
    assert (retry["level"], attributes(retry)) == ("WARNING", first)
    assert retry["message"].startswith(
        f"{about} 1/2 failed -> delayed: RuntimeError: card service down on attempt 1; next "
        f"attempt due at {due} (in 10m00s)\n"), retry["message"]
    # A line about no job has no job attributes.
    [started] = [r for r in records(worker.log()) if " started: " in r["message"]]
    assert attributes(started) == dict.fromkeys(JOB_ATTRIBUTES)

    # Its last attempt, made due now: dead, at ERROR, with no next attempt to announce.
    assert api.run_now(handle.id).changed
    dead = wait_line(worker, handle.id, " failed -> dead")
    assert (dead["level"], attributes(dead)) == ("ERROR", {**first, "attempt": 2})
    assert dead["message"].startswith(
        f"{about} 2/2 failed -> dead: RuntimeError: card service down on attempt 2\n")

    # An operator cancels a running job in the console: the reason and who, at INFO.
    running = sleepy_polite.enqueue(seconds=60)
    wait_effect(running.id, "start")
    response = admin_client.post(reverse("admin:django_xjobs_job_changelist"), {
        "action": "cancel_jobs", "_selected_action": [str(running.id)], "post": "yes",
        "reason": "customer asked"})
    assert response.status_code == 302
    recorded = job_row(running.id).last_error
    assert "customer asked" in recorded and "admin" in recorded, recorded
    cancel = wait_line(worker, running.id, "result discarded")
    assert (cancel["level"], cancel["message"]) == (
        "INFO", f"job {running.id} (testapp.sleepy_polite) attempt 1: {recorded}; the run is "
                "stopped, its result discarded")
    wait_effect(running.id, "end")  # the run saw ctx.cancelled and returned
    louder = [r for r in records(worker.log()) if r.get("job_id") == str(running.id)
              and r["level"] in ("WARNING", "ERROR")]
    assert louder == []
