"""The shop's jobs: each does visible work on an Order."""


from django.db import transaction
from django.db.models import F
from django.db.models.functions import Lower

from django_xjobs import Batch, Concurrency, PermanentError, backfill, job

from .models import Order

# SKUs the (pretend) warehouse does not know: fulfilment can never succeed.
DISCONTINUED = {"SKU-0000"}


@job(queue="payments", max_attempts=4)
def charge_order(ctx, order_id: int) -> dict:
    """Charge an order. The payment gateway is flaky: every third order fails its first try."""
    Order.objects.filter(pk=order_id).update(charge_attempts=F("charge_attempts") + 1)
    if order_id % 3 == 0 and ctx.attempt == 1:
        raise ConnectionError(f"payment gateway timed out charging order {order_id}")
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        if order.status == "new":
            order.status = "charged"
            order.save(update_fields=["status", "updated_at"])
    # Charged: ship it. A key per order makes a re-run of this job enqueue no second shipment.
    ship_order.using(idempotency_key=f"ship:{order_id}").enqueue(order_id=order_id)
    return {"order": order_id, "charged_on_attempt": ctx.attempt}


@job(max_attempts=3)
def ship_order(ctx, order_id: int) -> dict:
    order = Order.objects.get(pk=order_id)
    if order.sku in DISCONTINUED:
        order.status = "rejected"
        order.save(update_fields=["status", "updated_at"])
        raise PermanentError(f"{order.sku} is discontinued; order {order_id} cannot ship")
    order.status = "shipped"
    order.save(update_fields=["status", "updated_at"])
    return {"order": order_id, "shipped": True}


@job
def order_status(ctx, order_id: int) -> dict:
    """One order's status: a child job of send_digest."""
    return {"order": order_id, "status": Order.objects.get(pk=order_id).status}


@job
async def send_digest(ctx, batch: str) -> dict:
    """An async job that fans out: one child job per order of the batch (ctx.step.gather), its
    worker free while they run; the results come back in order once the last child finished."""

    async def order_ids():
        return [pk async for pk in Order.objects.filter(batch=batch).order_by("pk")
                .values_list("pk", flat=True)]

    ids = await ctx.step.run("orders", order_ids)
    statuses = await ctx.step.gather("statuses", [(order_status, {"order_id": pk}) for pk in ids])
    counts = {}
    for child in statuses:
        counts[child["status"]] = counts.get(child["status"], 0) + 1
    return {"batch": batch, "orders": counts, "children": len(statuses)}


def _note(order_id: int, entry: str) -> None:
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        order.timeline = [*order.timeline, entry]
        order.save(update_fields=["timeline", "updated_at"])


@job(max_attempts=3)
def fulfil_order(ctx, order_id: int) -> dict:
    """A durable workflow: reserve stock, wait for the payment provider's event, wait for the
    next warehouse pickup, ship. Each step runs once however often the job is resumed."""
    ctx.step.run("reserve-stock", lambda: _note(order_id, "stock reserved"))
    payment = ctx.step.wait_for_event(
        "payment", event="payment.captured", correlation_key=str(order_id), timeout=60
    )
    if payment is None:
        ctx.step.run("release-stock", lambda: _note(order_id, "no payment: stock released"))
        return {"order": order_id, "shipped": False}
    ctx.step.run("record-payment", lambda: _note(order_id, f"paid {payment['amount']}"))
    ctx.step.sleep("next-pickup", 1.0)
    ctx.step.run("ship", lambda: _note(order_id, "handed to the carrier"))
    Order.objects.filter(pk=order_id).update(status="shipped")
    return {"order": order_id, "shipped": True, "paid": payment["amount"]}


# --------------------------------------------------------------------------------- backfills --


@backfill("shop.normalize_order_emails", batch_size=500, queue="default")
def normalize_order_emails(ctx, cursor):
    """Lower-case every order's e-mail (an old import left some in capitals).

    A keyset cursor (the last primary key of the batch) and an idempotent write: each batch
    touches only the rows that still need it, and commits with its progress.
    """
    pks = list(Order.objects.filter(pk__gt=cursor or 0).order_by("pk")
               .values_list("pk", flat=True)[: ctx.batch_size])
    Order.objects.filter(pk__in=pks).exclude(email=Lower("email")).update(email=Lower("email"))
    return Batch(pks[-1] if len(pks) == ctx.batch_size else None, len(pks))


@normalize_order_emails.total
def orders_to_normalize():
    return Order.objects.count()


# ---------------------------------------------------------------- outbox (shop/demo_outbox.py) --


@job
def send_receipt(ctx, order_id: int) -> dict:
    """Staged with enqueue_on_commit when an order is placed: it exists only if the order does."""
    _note(order_id, "receipt sent")
    return {"order": order_id, "receipt": True}


# ------------------------------------------------------------------ concurrency slots (demo) --


@job(queue="payments", concurrency=Concurrency(key="partner-api:{tenant_id}", limit=2))
def sync_partner(ctx, n: int) -> dict:
    """Calls a partner API that allows two connections per tenant: at most two of these run at
    once per tenant, across every worker."""
    import time

    started = time.time()
    time.sleep(0.3)
    return {"n": n, "started": started, "ended": time.time()}


# ---------------------------------------------------------- scheduler (shop/demo_scheduler.py) --


@job(cron="*/3 * * * * *", misfire="skip", overlap="skip")
def count_orders(ctx) -> dict:
    """A scheduled job: every 3 seconds (six fields: seconds first), whichever worker leads the
    scheduler enqueues one run, keyed by its occurrence. `misfire="skip"`: while no worker runs,
    nothing piles up; `overlap="skip"`: while a run is still going, the next is not started."""
    return {"orders": Order.objects.count(),
            "shipped": Order.objects.filter(status="shipped").count()}
