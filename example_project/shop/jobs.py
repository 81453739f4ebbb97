"""The shop's jobs: each does visible work on an Order."""

import asyncio

from django.db import transaction
from django.db.models import F

from django_xjobs import PermanentError, job

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
async def send_digest(ctx, batch: str) -> dict:
    """An async job: summarise a batch once its orders are processed."""
    await asyncio.sleep(0.05)
    counts = {}
    async for order in Order.objects.filter(batch=batch):
        counts[order.status] = counts.get(order.status, 0) + 1
    return {"batch": batch, "orders": counts}
