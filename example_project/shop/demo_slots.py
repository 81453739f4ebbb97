"""The concurrency-slots part of ``manage.py demo``: six partner-API calls of one tenant, at most
two at a time across the fleet, whatever the worker's concurrency (docs/concurrency.md)."""

from __future__ import annotations

import time
from typing import Any


def run(stdout: Any, timeout: float = 60.0) -> None:
    from django_xjobs.engines import get_engine
    from django_xjobs.models import Job
    from shop.jobs import sync_partner

    def say(text: str = "") -> None:
        stdout.write(text)
        stdout.flush()

    say("\nconcurrency slots (shop.sync_partner, Concurrency(key='partner-api:{tenant_id}', "
        "limit=2))")
    handles = [sync_partner.using(tenant_id="acme").enqueue(n=i) for i in range(6)]
    say("  enqueued 6 calls for tenant acme (key 'partner-api:acme'), each 0.3 s")
    seen_held = 0
    deadline = time.monotonic() + timeout
    ids = [h.id for h in handles]
    while Job.objects.filter(id__in=ids).exclude(state__in=("done", "dead")).exists():
        seen_held = max(seen_held, len(get_engine().slots_list(slot_key="partner-api:acme")))
        if time.monotonic() > deadline:
            say("  (gave up waiting for the calls)")
            return
        time.sleep(0.02)
    spans = sorted((j.result["started"], j.result["ended"])
                   for j in Job.objects.filter(id__in=ids, state="done"))
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    say(f"  all {len(spans)} done in {spans[-1][1] - spans[0][0]:.1f}s; at most {peak} ran at "
        f"once (slots seen held at once: {seen_held}); the calls that found the key full "
        "waited blocked, then got a slot as a run ended, without spending an attempt (attempts: "
        f"{sorted({j.attempt for j in Job.objects.filter(id__in=ids)})})")
