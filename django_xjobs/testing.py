"""Helpers for testing code that enqueues jobs.

``drain()`` runs the real worker loop in this process until nothing is due, so a test exercises
the same claim, execution and fenced acknowledgement as production::

    from django_xjobs.testing import drain

    def test_signup_sends_welcome(transactional_db):
        signup("ada@example.com")
        stats = drain()
        assert stats["done"] == 1

Jobs run in worker threads with their own database connections, so the rows they need must be
committed: use pytest-django's ``transactional_db`` (or ``TransactionTestCase``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .worker.loop import Worker, WorkerOptions


def drain(
    queues: Iterable[str] | None = None,
    *,
    concurrency: int = 2,
    prefetch: int = 0,
) -> Counter[str]:
    """Run due jobs of ``queues`` (default: all configured) until none is left; return counts.

    Jobs that become due later (a retry's backoff, a delay) are left for a later call.
    """
    options = WorkerOptions.from_settings(
        queues=tuple(queues) if queues is not None else None,
        concurrency=concurrency,
        prefetch=prefetch,
        burst=True,
        install_signals=False,
        notify=False,
        duties=(),  # no scheduler or relay threads: a test drains exactly what it enqueued
    )
    worker = Worker(options)
    worker.run()
    return worker.stats
