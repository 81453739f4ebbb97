"""The benchmark jobs: ``noop(i)`` does nothing; ``sleep_ms(i, ms)`` waits ``ms``
milliseconds; ``lat(i, t)`` records its start time; the others serve one workload each
(bench/run.py, bench/capacity.py)."""

import os
import time
from datetime import timedelta

from django_xjobs import Batch, Concurrency, backfill, job

try:
    from django_xjobs import RateLimit
except ImportError:  # a checkout without flow control: W12 says so, the rest runs
    RateLimit = None

try:  # inside the peers' harness (make bench-peers): its recorder and file layout
    from common import record_start
except ImportError:  # bench/run.py: the same record, "i t_enqueue t_start" per line
    _fd = None

    def record_start(i, t):
        global _fd
        t_start = time.time()
        if _fd is None:
            d = os.environ["XJOBS_BENCH_LAT_DIR"]
            _fd = os.open(os.path.join(d, f"{os.getpid()}.txt"),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(_fd, f"{int(i)} {float(t):.6f} {t_start:.6f}\n".encode())


@job
def noop(ctx, i):
    return None


@job
def sleep_ms(ctx, i, ms=10):
    """bench/capacity.py: a job that waits ``ms`` milliseconds without touching the database
    (the shape of a job that calls out to something else)."""
    time.sleep(ms / 1000)


@job
def lat(ctx, i, t):
    record_start(i, t)


@job
def wait_lat(ctx, i):
    """W5: the time from publish_event to the step after the wait (payload["t"] = publish)."""
    payload = ctx.step.wait_for_event("go", event="bench.go", correlation_key=str(i),
                                      timeout=120)
    record_start(i, payload["t"])


@job
def fan(ctx, n):
    """W14: fan out n no-op children and fan their results back in."""
    ctx.step.gather("fan", [(noop, {"i": i}) for i in range(n)])


@job
def three_steps(ctx, i):
    """W6: a multi-step job: three durable steps, each a stored output."""
    a = ctx.step.run("a", lambda: i)
    b = ctx.step.run("b", lambda: a + 1)
    return ctx.step.run("c", lambda: b + 1)


# ------------------------------------------------------------------------------- backfills --


@backfill("bench.touch_rows", batch_size=1000)
def touch_rows(ctx, cursor):
    """W9: a keyset batch over bench_rows (made by bench/run.py): val + 1 on the next rows."""
    from django.db import connection

    with connection.cursor() as cur:
        # `= any(array(...))` reaches the rows through the primary key; a join with the batch's
        # ids lets the planner hash the whole table instead (a sequential scan per batch).
        cur.execute(
            "with touched as (update bench_rows set val = val + 1"
            "                  where id = any(array(select id from bench_rows where id > %s"
            "                                        order by id limit %s))"
            "                 returning id)"
            " select count(*), max(id) from touched",
            [cursor or 0, ctx.batch_size],
        )
        count, last = cur.fetchone()
    return Batch(last if count == ctx.batch_size else None, count)


# ------------------------------------------------------------------------------ flow control --


@job(concurrency=Concurrency(key="bench:{k}", limit=2))
def keyed(ctx, i, k):
    """W8: a no-op under a concurrency slot (at most 2 runs per key ``k`` fleet-wide)."""
    return None


# W11 (fair share) drains ``noop`` with .using(tenant_id=..., queue="fair" or "plain"): the
# queues' settings are in settings.py, so the same job runs with and without fairness.

# W12: the budget, in starts per second; bench/run.py passes its --rate-limit to the workers.
RATE_LIMIT = int(os.environ.get("XJOBS_BENCH_RATE_LIMIT", "2000"))

if RateLimit is not None:

    @job(rate_limit=RateLimit(key="partner", limit=RATE_LIMIT, period=timedelta(seconds=1)))
    def rated(ctx, i):
        """W12: a no-op under one shared rate limit (RATE_LIMIT starts per second)."""
        return None


@job(concurrency=Concurrency(key="bench:handover", limit=1))
def handover(ctx, i):
    """W13: one slot for every run, held for about 20 ms: each start waits for a release."""
    time.sleep(0.02)
