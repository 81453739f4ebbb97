"""Billing: a shop's payment tasks, written for Celery (docs/from-celery.md, "A worked example").

tasks_celery.py is the Celery original, never imported (Celery is not installed here); tasks.py
is the same module with its imports changed to django_xjobs.celery, and
tests/acceptance/test_celery_port.py checks that nothing else differs.
"""

from datetime import datetime
from decimal import Decimal

from celery import chain, chord, group, shared_task
from celery.result import AsyncResult

PRICES = {"tea": Decimal("4.20"), "cup": Decimal("12.50"), "pot": Decimal("31.00")}
CARD_LIMIT = Decimal("100.00")


class CardDeclined(Exception):
    pass


@shared_task
def price(sku: str, quantity: int) -> Decimal:
    return PRICES[sku] * quantity


@shared_task
def add_up(prices: list) -> Decimal:
    return sum(prices, Decimal("0"))


@shared_task(bind=True, max_retries=3, default_retry_delay=0.2, time_limit=30)
def charge(self, amount: Decimal, order_id: int, at: datetime) -> dict:
    if amount > CARD_LIMIT:
        raise CardDeclined(f"order {order_id}: {amount} is over the card limit")
    if self.request.retries < 2:  # the partner answers 429 twice
        raise self.retry(exc=ConnectionError("429 from the card partner"), countdown=0.2)
    return {"order": order_id, "amount": amount, "at": at, "tries": self.request.retries + 1}


@shared_task(bind=True, autoretry_for=(ConnectionError,), retry_backoff=1, max_retries=2,
             rate_limit="100/m", acks_late=True)
def receipt(self, charged: dict, email: str) -> str:
    if self.request.retries == 0:
        raise ConnectionError("the mail server is not answering")
    return f"receipt for order {charged['order']} ({charged['amount']}) sent to {email}"


def checkout(order_id: int, items: list, email: str, at: datetime) -> AsyncResult:
    """Price each item at once, add them up, charge the total, then send the receipt."""
    priced = chord(group(price.s(sku, n) for sku, n in items), add_up.s())
    return chain(priced, charge.s(order_id, at), receipt.s(email)).apply_async()


def status(result_id: str) -> str:
    return AsyncResult(result_id).status
