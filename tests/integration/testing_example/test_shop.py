from datetime import timedelta

import pytest

from django_xjobs import publish_event
from django_xjobs.testing import assert_enqueued, drain, enqueued_jobs, make_context, travel

from .jobs import follow_up, place_order, send_receipt


def test_placing_an_order_enqueues_its_jobs(db):
    place_order(7, "ada@example.com")

    assert_enqueued(send_receipt, order_id=7)
    [job] = enqueued_jobs(follow_up)
    assert job.input == {"order_id": 7, "email": "ada@example.com"}


def test_the_receipt_is_mailed_once_the_order_commits(
        db, inline_jobs, django_capture_on_commit_callbacks, mailoutbox):
    with django_capture_on_commit_callbacks(execute=True):  # "commits" the test's transaction
        place_order(7, "ada@example.com")

    assert [m.subject for m in mailoutbox] == ["Your order 7"]
    [waiting] = enqueued_jobs(follow_up)
    assert waiting.state == "suspended"  # until the payment, or three days


def test_a_paid_order_gets_a_review_request_a_day_later(
        db, inline_jobs, django_capture_on_commit_callbacks, mailoutbox):
    with django_capture_on_commit_callbacks(execute=True):
        place_order(7, "ada@example.com")

    publish_event("order.paid", {"amount": 42}, correlation_key="7")
    drain()  # the follow-up wakes, and sleeps a day
    assert len(mailoutbox) == 1
    travel(timedelta(days=1))
    drain()

    assert enqueued_jobs(follow_up, state="done")[0].result == "asked for a review"
    assert mailoutbox[-1].subject == "How was it?"


@pytest.mark.django_db(transaction=True)
def test_an_unpaid_order_gets_a_reminder(mailoutbox):
    place_order(8, "bob@example.com")
    stats = drain()  # the real worker loop, in threads: the rows must be committed
    assert (stats["done"], stats["suspended"]) == (1, 1)

    travel(timedelta(days=3))
    drain()

    assert [m.subject for m in mailoutbox] == ["Your order 8", "Still interested?"]


def test_the_follow_up_on_its_own(mailoutbox):  # no database, no worker
    ctx = make_context(follow_up, events={"order.paid": {"amount": 42}})

    assert follow_up(ctx, order_id=7, email="ada@example.com") == "asked for a review"
    assert ctx.step.sleeps == [("settle", timedelta(days=1))]
    assert [m.subject for m in mailoutbox] == ["How was it?"]
