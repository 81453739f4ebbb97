"""The demo's outbox part: enqueue_on_commit in a transaction that rolls back (no job, ever)
and in one that commits (exactly one job, relayed by the running worker and run)."""

from __future__ import annotations

import time

from django.core.management.color import color_style
from django.db import connection, transaction

from django_xjobs.models import Job, OutboxEntry

from .jobs import send_receipt
from .models import Order


class _PaymentDeclined(Exception):
    pass


def run(stdout, batch: str, timeout: float = 60.0) -> None:
    """Needs a worker running (its relay duty publishes the staged job)."""
    stdout.write(color_style().MIGRATE_HEADING(
        "\nthe transactional outbox (shop.send_receipt.enqueue_on_commit)"))

    try:
        with transaction.atomic():
            order = Order.objects.create(batch=batch, email="declined@example.com",
                                         sku="SKU-700", total_cents=700)
            dropped = send_receipt.enqueue_on_commit(order_id=order.pk)
            raise _PaymentDeclined
    except _PaymentDeclined:
        pass
    stdout.write(f"  rolled back: order and staging {dropped.id} are gone "
                 f"(order exists: {Order.objects.filter(pk=order.pk).exists()}, "
                 f"outbox row exists: {OutboxEntry.objects.filter(pk=dropped.id).exists()})")

    with transaction.atomic():
        order = Order.objects.create(batch=batch, email="paid@example.com", sku="SKU-701",
                                     total_cents=701)
        kept = send_receipt.enqueue_on_commit(order_id=order.pk)
    stdout.write(f"  committed: order {order.pk} and its staged receipt job {kept.id}")

    deadline = time.monotonic() + timeout
    while True:
        job = Job.objects.filter(pk=kept.id).first()
        if job is not None and job.state in ("done", "dead"):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: the staged receipt job was not relayed and run in {timeout}s")
        time.sleep(0.1)
        connection.close()  # a fresh snapshot each poll
    entry = OutboxEntry.objects.get(pk=kept.id)
    order.refresh_from_db()
    waited = (entry.published_at - entry.staged_at).total_seconds() * 1000
    stdout.write(f"  the worker's relay published it {waited:.0f} ms after staging; job "
                 f"{job.id} is {job.state} (enqueued_by {job.enqueued_by!r}); "
                 f"order timeline: {order.timeline}")
    stdout.write(f"  jobs for the rolled-back staging: "
                 f"{Job.objects.filter(pk=dropped.id).count()}")
