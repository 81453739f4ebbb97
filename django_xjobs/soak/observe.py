"""What the soak watches while it runs (docs/soak.md, "The invariants"): samples of the live
tables every fifth of a second, for the invariants that only hold at a moment.

* one live job per (tenant, idempotency key) of the soak's queue;
* no concurrency key with more unexpired slots, or more running jobs whose lease is unexpired,
  than its limit;
* every grant of the soak's rate-limit key (``x_rate_units`` keeps a grant for one period, so a
  sample every fifth of a second sees each one; the windows are checked after the run);
* no worker session of the soak in a transaction for longer than a lease (unless its process
  was stopped by the chaos lately), and no advisory lock held by a session outside a
  transaction.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections
from django.db.models import Count
from django.db.models.functions import Now

from ..models import Job, JobLease, RateUnit
from ..records import LIVE_STATES
from . import jobs, tables

INTERVAL = 0.2


@dataclass
class Observations:
    samples: int = 0
    live_key_duplicates: dict[str, set[str]] = field(default_factory=dict)  # key -> job ids
    slot_excess: list[str] = field(default_factory=list)
    grants: dict[int, tuple[datetime, int]] = field(default_factory=dict)  # id -> (at, cost)
    idle_in_transaction: list[str] = field(default_factory=list)
    # The same seen on a LISTEN session: reported, not a failure (docs/soak.md, "The invariants")
    listen_in_transaction: list[str] = field(default_factory=list)
    advisory_outside: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


class Observer(threading.Thread):
    def __init__(self, soak: str, queue: str, lease: float, stop: threading.Event,
                 excused: Callable[[str], bool] = lambda worker_id: False) -> None:
        super().__init__(name="xjobs-soak-observer", daemon=True)
        self.excused = excused  # a worker whose sessions may hold a transaction: it was stopped
        self.soak = soak
        self.queue = queue
        self.lease = lease
        self.stop = stop
        self.seen = Observations()

    def run(self) -> None:
        try:
            while not self.stop.wait(INTERVAL):
                try:
                    self.sample()
                except Exception as exc:  # a fault injected elsewhere must not end the watch
                    self.seen.errors[type(exc).__name__] += 1
                    connections[tables.alias()].close()
        finally:
            connections.close_all()

    def sample(self) -> None:
        seen = self.seen
        alias = tables.alias()
        live = Job.objects.using(alias).filter(queue=self.queue, state__in=LIVE_STATES)
        for row in (live.values("tenant_id", "idempotency_key")
                    .annotate(n=Count("id")).filter(n__gt=1)):
            key = f"{row['tenant_id']}/{row['idempotency_key']}"
            ids = live.filter(tenant_id=row["tenant_id"], idempotency_key=row["idempotency_key"])
            seen.live_key_duplicates.setdefault(key, set()).update(
                str(i) for i in ids.values_list("id", flat=True))
        prefix = f"xjobs_soak:{self.soak}:slot:"
        for row in (JobLease.objects.using(alias)
                    .filter(lease_key__startswith=prefix, expires_at__gt=Now())
                    .values("lease_key").annotate(n=Count("id"))
                    .filter(n__gt=jobs.SLOT_LIMIT)):
            seen.slot_excess.append(f"{row['lease_key']}: {row['n']} unexpired slots")
        for row in (live.filter(state="running", concurrency_key__startswith=prefix,
                                visible_at__gt=Now())
                    .values("concurrency_key").annotate(n=Count("id"))
                    .filter(n__gt=jobs.SLOT_LIMIT)):
            seen.slot_excess.append(f"{row['concurrency_key']}: {row['n']} running jobs "
                                    f"with unexpired leases")
        for unit_id, at, cost in (RateUnit.objects.using(alias)
                                  .filter(key=f"xjobs_soak:{self.soak}:rate")
                                  .values_list("id", "at", "cost")):
            seen.grants[unit_id] = (at, cost)
        self._sessions(alias)
        seen.samples += 1

    def _sessions(self, alias: str) -> None:
        label = f"xjobs:{self.soak}-%"
        with connections[alias].cursor() as cur:
            # A transaction open longer than a lease, idle in it or not: a worker's transactions
            # are single statements or a claim's or settle's few. With what tells a stalled
            # client from a transaction left open: since when its last statement began and its
            # state holds, and whether it wrote (has an xid).
            cur.execute(
                "select application_name, pid, state, extract(epoch from now() - xact_start),"
                " coalesce(wait_event, ''), left(query, 60),"
                " coalesce(extract(epoch from now() - query_start), 0),"
                " coalesce(extract(epoch from now() - state_change), 0),"
                " backend_xid is not null"
                " from pg_stat_activity where application_name like %s"
                " and now() - xact_start > make_interval(secs => %s)", [label, self.lease])
            for name, pid, state, age, wait, query, since_query, since_state, wrote in (
                    cur.fetchall()):
                worker_id = name.split(":")[1] if name.count(":") >= 2 else name
                if self.excused(worker_id):
                    continue
                finding = (f"{name} (pid {pid}) {state} in a transaction of {age:.1f}s "
                           f"(waiting on {wait or 'nothing'}; last statement {query!r}, "
                           f"begun {since_query:.1f}s ago; state since {since_state:.1f}s; "
                           f"{'wrote' if wrote else 'no writes'})")
                if name.endswith("listen"):
                    self.seen.listen_in_transaction.append(finding)
                else:
                    self.seen.idle_in_transaction.append(finding)
            cur.execute(
                "select a.application_name, a.pid from pg_locks l"
                " join pg_stat_activity a on a.pid = l.pid"
                " where l.locktype = 'advisory' and l.granted and a.state = 'idle'"
                " and a.application_name like %s", [label])
            for name, pid in cur.fetchall():
                self.seen.advisory_outside.append(f"{name} (pid {pid})")


def grants_over_limit(grants: dict[int, tuple[datetime, int]], limit: int,
                      period_seconds: float) -> list[str]:
    """Windows of ``period_seconds`` in which the grants seen cost more than ``limit``: the
    worst window starting at each grant."""
    ordered = sorted(grants.values())
    over = []
    for i, (start, _) in enumerate(ordered):
        spent = sum(cost for at, cost in ordered[i:]
                    if (at - start).total_seconds() < period_seconds)
        if spent > limit:
            over.append(f"{spent} units from {start.isoformat()} within {period_seconds:g}s")
    return over


