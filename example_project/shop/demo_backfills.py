"""The demo's backfill part (called by ``manage.py demo`` while its worker runs).

Some orders get e-mails in capitals, as an old import might have left them; then a pass of
``shop.normalize_order_emails`` walks every order in batches, each batch committed with its
progress, and the demo shows it with ``xjobs_backfill --list`` and ``show``.
"""

from __future__ import annotations

import json
import time
from io import StringIO

from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Upper


def show(stdout, style, timeout: float) -> None:
    from django_xjobs.models import Backfill
    from shop.models import Order

    def say(text: str = "") -> None:
        stdout.write(text)
        stdout.flush()

    say(style.MIGRATE_HEADING("\na resumable backfill (shop.normalize_order_emails)"))
    shouting = Order.objects.filter(pk__in=list(
        Order.objects.order_by("pk").values_list("pk", flat=True)[::3]))
    shouting.update(email=Upper("email"))
    capitals = Order.objects.exclude(email__regex=r"^[^A-Z]*$").count()
    say(f"  {capitals} of {Order.objects.count()} orders have e-mails in capitals")
    out = StringIO()
    call_command("xjobs_backfill", "start", "shop.normalize_order_emails", "--batch-size", "10",
                 "--throttle", "50ms", "--json", stdout=out)
    started = json.loads(out.getvalue())
    say(f"  $ manage.py xjobs_backfill start shop.normalize_order_emails --batch-size 10 "
        f"--throttle 50ms\n  run {started['run_id']} (job {started['job_id']})")

    deadline = time.monotonic() + timeout
    while Backfill.objects.get(pk=started["run_id"]).status not in ("completed", "failed"):
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out after {timeout}s waiting for the backfill")
        time.sleep(0.1)
        connection.close()  # a fresh snapshot each poll
    left = Order.objects.exclude(email__regex=r"^[^A-Z]*$").count()
    say(f"  done: {left} orders with capitals left\n")
    for args in (["--list", "--name", "shop.normalize_order_emails", "--limit", "3"],
                 ["show", started["run_id"]]):
        listing = StringIO()
        call_command("xjobs_backfill", *args, stdout=listing)
        say(f"  $ manage.py xjobs_backfill {' '.join(args)}")
        for line in listing.getvalue().splitlines():
            say(f"    {line}")
