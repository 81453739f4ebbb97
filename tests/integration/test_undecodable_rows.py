"""Rows whose JSON PostgreSQL accepts but Python's ``json`` module cannot decode (an integer of
5,000 digits, arrays nested 5,000 deep): a claim batch holding one still runs the others, the
job itself goes ``dead`` at once with a clear error, a bad step output or event payload fails
its job clearly, the operator paths read such rows, and enqueue refuses to write one.

The rows are made by SQL (``tests/console_data.undecodable``): neither the ORM nor the API
writes a value Python cannot read back.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_xjobs import api, publish_event
from django_xjobs.exceptions import InvalidJobInput
from django_xjobs.models import Job, JobEvent, JobStep
from django_xjobs.testing import drain, travel
from tests.console_data import DEEP_ARRAY_SQL, HUGE_INT_SQL, job_in_state, undecodable
from tests.testapp import jobs as testapp_jobs

transactional = pytest.mark.django_db(transaction=True)
in_a_transaction = pytest.mark.django_db

DIGITS = "Exceeds the limit (4300 digits) for integer string conversion"


@pytest.fixture
def inline(settings):
    settings.XJOBS = {**settings.XJOBS, "TEST_MODE": "inline"}


def state(job_id) -> dict:
    """The columns a test asserts on, read without decoding the row's JSON (the ORM would)."""
    return Job.objects.filter(id=job_id).values("state", "attempt", "last_error").get()


def good_and_bad_jobs() -> tuple[list, list]:
    """Good jobs on two queues and, among them, one with a 5,000-digit integer in its input
    and one (on the other queue) with arrays nested 5,000 deep; all due now."""
    record, other = testapp_jobs.record, testapp_jobs.on_other_queue
    good = [record.enqueue(tag="a"), other.enqueue(), record.enqueue(tag="b"),
            testapp_jobs.async_record.enqueue(tag="c"), other.enqueue()]
    bad = [record.enqueue(tag="bad"), other.enqueue(), testapp_jobs.async_record.enqueue()]
    undecodable("x_jobs", bad[0].id, input=HUGE_INT_SQL)
    undecodable("x_jobs", bad[1].id, input=DEEP_ARRAY_SQL)
    undecodable("x_jobs", bad[2].id, input=HUGE_INT_SQL)
    return good, bad


def assert_bad_ones_dead_at_once(bad: list) -> None:
    for handle, why in zip(bad, (DIGITS, "nested too deeply", DIGITS), strict=True):
        row = state(handle.id)
        assert (row["state"], row["attempt"]) == ("dead", 1), row
        assert row["last_error"].startswith(f"input cannot be decoded: {why}"), row


# ------------------------------------------------------------------------- claim batches --


@transactional
def test_drain_runs_a_batch_holding_undecodable_rows_and_buries_those_at_once():
    good, bad = good_and_bad_jobs()

    stats = drain(concurrency=4, prefetch=8)

    assert {state(h.id)["state"] for h in good} == {"done"}
    assert_bad_ones_dead_at_once(bad)
    assert (stats["done"], stats["dead"]) == (len(good), len(bad))


@in_a_transaction
def test_drain_inline_runs_the_others_and_buries_undecodable_rows_at_once(inline):
    # Delayed, so the inline mode does not run them at enqueue: the input is changed first.
    later = timedelta(hours=1)
    record, other = testapp_jobs.record.using(delay=later), testapp_jobs.on_other_queue
    good = [record.enqueue(tag="a"), other.using(delay=later).enqueue(),
            testapp_jobs.async_record.using(delay=later).enqueue(tag="c")]
    bad = [record.enqueue(tag="bad"), other.using(delay=later).enqueue(),
           testapp_jobs.async_record.using(delay=later).enqueue()]
    undecodable("x_jobs", bad[0].id, input=HUGE_INT_SQL)
    undecodable("x_jobs", bad[1].id, input=DEEP_ARRAY_SQL)
    undecodable("x_jobs", bad[2].id, input=HUGE_INT_SQL)
    travel(later)

    stats = drain()

    assert {state(h.id)["state"] for h in good} == {"done"}
    assert_bad_ones_dead_at_once(bad)
    assert (stats["done"], stats["dead"]) == (3, 3)


@in_a_transaction
def test_inline_mode_buries_a_job_whose_input_cannot_be_decoded(
        inline, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        handle = testapp_jobs.record.enqueue(tag="bad")
        undecodable("x_jobs", handle.id, input=HUGE_INT_SQL)

    row = state(handle.id)
    assert (row["state"], row["attempt"]) == ("dead", 1)
    assert row["last_error"].startswith(f"input cannot be decoded: {DIGITS}")


# ------------------------------------------------------------- step outputs, event payloads --


@transactional
def test_a_step_output_that_cannot_be_decoded_fails_its_job_for_good_with_a_clear_error(settings):
    # A backoff the drain cannot outlast: with the suite's 0.05 s base, a retry drawn near 0 s
    # came due while the drain still ran, and attempt 2 finished before the output was spoilt.
    settings.XJOBS = {**settings.XJOBS, "RETRY_BASE": "10m", "RETRY_CAP": "10m"}
    handle = testapp_jobs.three_steps.enqueue(fail_third_times=1)
    assert drain()["delayed"] == 1  # steps first and second stored, third failed once
    step = JobStep.objects.only("pk").get(run_id=handle.run_id, name="second")
    undecodable("x_job_steps", step.pk, output=HUGE_INT_SQL)
    travel(timedelta(hours=1))

    assert drain()["dead"] == 1

    row = state(handle.id)
    assert (row["state"], row["attempt"]) == ("dead", 2)
    assert "UndecodableValue: output of step 'second' cannot be decoded: " + DIGITS in (
        row["last_error"])


@transactional
def test_an_event_payload_that_cannot_be_decoded_fails_the_waiting_job_with_a_clear_error():
    handle = testapp_jobs.waiter.enqueue(event="bad.payload")
    assert drain()["suspended"] == 1
    event = publish_event("bad.payload", {"ok": 1})
    undecodable("x_job_events", event.id, payload=DEEP_ARRAY_SQL)

    assert drain()["dead"] == 1

    row = state(handle.id)
    assert row["state"] == "dead"
    assert (f"UndecodableValue: payload of event 'bad.payload' #{event.id} cannot be "
            "decoded: nested too deeply") in row["last_error"]
    assert JobEvent.objects.filter(id=event.id).exists()


# --------------------------------------------------------------------------- reading rows --


@in_a_transaction
def test_get_job_reads_a_row_whose_input_and_result_cannot_be_decoded():
    handle = job_in_state("done", queue="bad-q")
    undecodable("x_jobs", handle.id, input=HUGE_INT_SQL, result=DEEP_ARRAY_SQL)

    record = api.get_job(handle.id)

    assert (record.state, record.input, record.result) == ("done", {}, None)
    assert record.input_error is not None and record.input_error.startswith(DIGITS)
    assert record.result_error == "nested too deeply for Python's json module"
    good = api.get_job(job_in_state("done", queue="bad-q").id)
    assert (good.input_error, good.result_error, good.result) == (None, None, {"ok": True})


def command(*args: str) -> str:
    out = StringIO()
    call_command("xjobs", *args, stdout=out)
    return out.getvalue()


@in_a_transaction
def test_xjobs_cancel_retry_run_now_and_show_handle_undecodable_rows():
    ready, dead, delayed = (job_in_state(s) for s in ("ready", "dead", "delayed"))
    for handle in (ready, dead, delayed):
        undecodable("x_jobs", handle.id, input=HUGE_INT_SQL)

    assert "is now cancelled" in command("cancel", str(ready.id))
    assert "is now ready" in command("retry", str(dead.id))
    done = json.loads(command("run-now", str(delayed.id), "--json"))
    assert (done["changed"], done["job"]["state"], done["job"]["input"]) == (True, "ready", {})
    assert done["job"]["input_error"].startswith(DIGITS)
    again = json.loads(command("cancel", str(ready.id), "--json"))
    assert (again["changed"], again["job"]["state"]) == (False, "cancelled")
    shown = command("show", str(dead.id))
    assert "could not be decoded" in shown and "9999" in shown
    assert json.loads(command("show", str(dead.id), "--json"))["input"]["undecodable"]
    assert [state(h.id)["state"] for h in (ready, dead, delayed)] == ["cancelled", "ready",
                                                                      "ready"]


@in_a_transaction
def test_console_actions_change_undecodable_rows(admin_client):
    jobs_url = reverse("admin:django_xjobs_job_changelist")
    ready, dead, delayed = (job_in_state(s) for s in ("ready", "dead", "delayed"))
    for handle in (ready, dead, delayed):
        undecodable("x_jobs", handle.id, input=DEEP_ARRAY_SQL, result=HUGE_INT_SQL)

    for action, handle, after in (("cancel_jobs", ready, "cancelled"),
                                  ("retry_jobs", dead, "ready"),
                                  ("run_jobs_now", delayed, "ready")):
        confirm = admin_client.post(jobs_url, {"action": action,
                                               "_selected_action": [str(handle.id)]})
        assert confirm.status_code == 200, action
        done = admin_client.post(jobs_url, {"action": action, "post": "yes",
                                            "_selected_action": [str(handle.id)]})
        assert done.status_code == 302, (action, done.status_code)
        assert state(handle.id)["state"] == after, action
        page = admin_client.get(reverse("admin:django_xjobs_job_change", args=[handle.id]))
        assert page.status_code == 200 and "could not be decoded" in page.content.decode()


# ------------------------------------------------------------------------------- enqueue --


@pytest.fixture
def int_digits():
    """Set the interpreter's digit limit for the test, as a producer might."""
    before = sys.get_int_max_str_digits()
    yield sys.set_int_max_str_digits
    sys.set_int_max_str_digits(before)


@in_a_transaction
@pytest.mark.parametrize("limit", [0, 10_000])
def test_enqueue_refuses_an_integer_python_cannot_read_back(int_digits, limit):
    int_digits(limit)
    before = Job.objects.count()
    fine = 10**4300 - 1  # 4,300 digits: the default limit still reads it

    with pytest.raises(InvalidJobInput, match=r"\[.tag.\]\[1\] is an integer of more than 4300 "
                                              r"digits"):
        testapp_jobs.record.enqueue(tag=[1, -(10**4999)])
    with pytest.raises(InvalidJobInput, match="4300"):
        api.enqueue_many([(testapp_jobs.record.name, {"tag": "ok"}),
                          (testapp_jobs.record.name, {"tag": {"n": 10**4300}})])
    assert Job.objects.count() == before

    handle = testapp_jobs.record.enqueue(tag=fine)
    assert api.get_job(handle.id).input == {"tag": fine}


@in_a_transaction
def test_enqueue_with_the_default_limit_refuses_a_huge_integer_naming_the_field():
    with pytest.raises(InvalidJobInput, match=r"\['tag'\]\['n'\] is an integer of more than "
                                              r"4300 digits"):
        testapp_jobs.record.enqueue(tag={"n": 10**5000})
