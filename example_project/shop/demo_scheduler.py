"""The scheduler's part of `make demo`: shop.count_orders fires every 3 seconds in the demo's
worker (every worker runs a scheduler; one of them leads)."""

from __future__ import annotations

import time

from django.core.management import call_command
from django.core.management.color import color_style
from django.db import connection

TASK = "shop.count_orders"


def show(stdout, timeout: float = 90.0, occurrences: int = 3) -> None:
    from django_xjobs.models import Job

    style = color_style()
    stdout.write(style.MIGRATE_HEADING(
        f'\na scheduled job ({TASK}: @job(cron="*/3 * * * * *"))'))
    since = Job.objects.filter(enqueued_by=f"cron:{TASK}").order_by("-created_at").first()
    after = since.created_at if since else None
    deadline = time.monotonic() + timeout
    while True:
        fired = Job.objects.filter(enqueued_by=f"cron:{TASK}", state="done")
        if after is not None:
            fired = fired.filter(created_at__gt=after)
        runs = list(fired.order_by("idempotency_key")[:occurrences])
        if len(runs) >= occurrences:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out after {timeout}s waiting for {TASK} to fire")
        time.sleep(0.2)
        connection.close()  # a fresh snapshot each poll
    for run in runs:
        stdout.write(f"  {run.idempotency_key}  {run.state}: {run.result}")
    stdout.write("  one job per occurrence, keyed cron:<task>:<occurrence>; the leader's "
                 "watermark moves forward with each round\n")
    call_command("xjobs", "schedule", stdout=stdout)
