"""A shop's jobs: a receipt, and a follow-up that waits for the payment (docs/testing.md)."""

from datetime import timedelta

from django.core.mail import send_mail
from django.db import transaction

from django_xjobs import job


@job(max_attempts=5)
def send_receipt(ctx, order_id: int, email: str) -> dict:
    send_mail(f"Your order {order_id}", "Thank you!", "shop@example.com", [email])
    return {"mailed": email}


@job
def follow_up(ctx, order_id: int, email: str) -> str:
    paid = ctx.step.wait_for_event("paid", event="order.paid", correlation_key=str(order_id),
                                   timeout=timedelta(days=3))
    if paid is None:
        send_mail("Still interested?", "Your cart misses you.", "shop@example.com", [email])
        return "reminded"
    ctx.step.sleep("settle", timedelta(days=1))
    ctx.step.run("review", lambda: send_mail("How was it?", "Tell us.", "shop@example.com",
                                             [email]))
    return "asked for a review"


def place_order(order_id: int, email: str) -> None:
    """The code under test: its jobs commit (or roll back) with the order."""
    with transaction.atomic():
        # Order.objects.create(...) would be here.
        send_receipt.enqueue(order_id=order_id, email=email)
        follow_up.enqueue(order_id=order_id, email=email)
