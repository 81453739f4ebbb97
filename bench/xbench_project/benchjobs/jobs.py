"""The two benchmark jobs: ``noop(i)`` does nothing; ``lat(i, t)`` records its start time."""

import os
import time

from django_xjobs import Concurrency, job

try:  # inside the shared harness (../shared/bench): its recorder and file layout
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
def lat(ctx, i, t):
    record_start(i, t)


@job
def wait_lat(ctx, i):
    """W5: the time from publish_event to the step after the wait (payload["t"] = publish)."""
    payload = ctx.step.wait_for_event("go", event="bench.go", correlation_key=str(i),
                                      timeout=120)
    record_start(i, payload["t"])


@job
def three_steps(ctx, i):
    """W6: a multi-step job: three durable steps, each a stored output."""
    a = ctx.step.run("a", lambda: i)
    b = ctx.step.run("b", lambda: a + 1)
    return ctx.step.run("c", lambda: b + 1)


@job(concurrency=Concurrency(key="bench:{k}", limit=2))
def keyed(ctx, i, k):
    """W8: a no-op under a concurrency slot (at most 2 runs per key ``k`` fleet-wide)."""
    return None
