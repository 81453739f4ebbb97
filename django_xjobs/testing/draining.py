"""``drain()``: run what is due until nothing is, in this process.

By default it runs the real worker loop (``Worker`` in burst mode, in threads of this process),
so a test exercises the same claim, execution and fenced acknowledgement as production::

    from django_xjobs.testing import drain

    def test_signup_sends_welcome(transactional_db):
        signup("ada@example.com")
        stats = drain()
        assert stats["done"] == 1

Jobs run in worker threads with their own database connections, so the rows they need must be
committed: use pytest-django's ``transactional_db`` (or ``TransactionTestCase``).

With ``XJOBS["TEST_MODE"] = "inline"`` it runs the due jobs in the caller's thread instead, on
its connection (``testing/inline.py``): the claim, the executor and the fenced writes are the
worker's, one job at a time, and it works inside a ``TestCase``'s transaction.

Jobs staged with ``enqueue_on_commit`` are relayed first, as a relay in production would once
the staging committed; a job that stages more jobs gets those relayed and run too::

    def test_checkout_charges_the_order(transactional_db):
        with transaction.atomic():
            order = Order.objects.create(...)
            charge.enqueue_on_commit(order_id=order.pk)
        stats = drain()          # relays the committed staging, then runs the job
        assert stats["relayed"] == 1 and stats["done"] == 1

Only committed stagings are relayed (the relay runs on a connection of its own): a staging
inside a transaction that is still open, or rolled back, never becomes a job, in a test as in
production.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from django.db import connections
from django.db.transaction import TransactionManagementError

from .. import conf, registry
from ..engines import get_engine
from ..outbox import relay_pending
from ..worker.loop import Worker
from ..worker.options import WorkerOptions
from .inline import WORKER_ID, in_turn, run_claimed


def drain(
    queues: Iterable[str] | None = None,
    *,
    concurrency: int = 2,
    prefetch: int = 0,
    relay: bool = True,
) -> Counter[str]:
    """Run due jobs of ``queues`` (default: all configured) until none is left; return counts.

    Jobs that become due later (a retry's backoff, a delay) are left for a later call
    (:func:`~django_xjobs.testing.travel` makes them due now). With ``relay`` (the default),
    committed ``enqueue_on_commit`` stagings are relayed before the jobs run and again after,
    until a round relays nothing; ``stats["relayed"]`` counts them. In the inline test mode the
    jobs run in this thread, one at a time (``concurrency`` and ``prefetch`` do not apply).
    """

    inline = conf.get().test_mode == "inline"
    if not inline:
        _refuse_inside_atomic()
    queues = tuple(queues) if queues is not None else None
    totals: Counter[str] = Counter()
    relayed = _relay_committed() if relay else 0
    while True:
        totals.update(_drain_inline(queues) if inline else
                      _drain_once(queues, concurrency=concurrency, prefetch=prefetch))
        more = _relay_committed() if relay else 0
        relayed += more
        if not more:
            break
    if relayed:
        totals["relayed"] = relayed
    return totals


def _refuse_inside_atomic() -> None:
    """drain() commits what its jobs do and closes this thread's connections when it ends:
    inside ``atomic()`` that would end the caller's transaction behind its back."""


    settings = conf.get()
    for alias in {settings.database, *settings.outbox.databases}:
        if connections[alias].in_atomic_block:
            raise TransactionManagementError(
                f"drain() cannot run inside transaction.atomic() (database {alias!r}): the "
                "jobs run on other connections and see committed rows only. Commit first; "
                "in tests use transactional_db / TransactionTestCase"
            )


def _relay_committed() -> int:
    """Relay what is committed in the outbox, from a thread with connections of its own."""


    result: list[int] = []
    error: list[BaseException] = []

    def relay() -> None:
        try:
            result.append(relay_pending())
        except BaseException as exc:  # re-raised in the caller's thread below
            error.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=relay, name="xjobs-drain-relay")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _drain_once(queues: Iterable[str] | None, *, concurrency: int,
                prefetch: int) -> Counter[str]:
    options = WorkerOptions.from_settings(
        queues=tuple(queues) if queues is not None else None,
        concurrency=concurrency,
        prefetch=prefetch,
        burst=True,
        install_signals=False,
        notify=False,
        # No duty threads: drain relays the outbox itself, between runs of the loop.
        duties=(),
    )
    worker = Worker(options)
    worker.run()
    return worker.stats


def _drain_inline(queues: Iterable[str] | None) -> Counter[str]:
    """Claim (``jobs_claim``, one job per queue at a time) and run in this thread until a claim
    finds nothing; what the runs enqueue runs in turn (testing/inline.py)."""

    settings = conf.get()
    engine = get_engine()
    wants = {q: 1 for q in (queues if queues is not None else registry.worked_queues(settings))}
    stats: Counter[str] = Counter()

    def rounds() -> None:
        while True:
            claimed = engine.jobs_claim(wants=wants, worker_id=WORKER_ID,
                                        lease_ms=round(settings.lease * 1000))
            if not claimed:
                return
            stats["claimed"] += len(claimed)
            for job in claimed:
                stats[run_claimed(engine, job)] += 1

    in_turn(rounds)
    return stats
