"""The transactional outbox: stage a job in the caller's transaction, relay it after commit.

Protocol (the guarantees are in docs/transactional-enqueue.md)::

    caller's transaction (alias A = enqueue_on_commit(using=))      relay (any process)
    ------------------------------------------------------------    -------------------------
    business writes ...
    outbox_stage: INSERT x_outbox (pending), NOTIFY xjobs_outbox
    on_commit(wake in-process relays)
    COMMIT  -> the row becomes visible, the NOTIFY is delivered  -> woken (or its poll comes)
    (ROLLBACK -> no row, no NOTIFY, no callback: no job ever)       relay_batch(A):

States of an outbox row: ``pending`` (``published_at`` null) -> ``published`` (``published_at``
set, ``job_id`` = the job it became). Nothing else changes a row; deleting published rows past
retention is maintenance's (the scheduler's) business.

One relay round on alias A, with J = ``XJOBS["DATABASE"]``:

* **A == J (one database), exactly once.** One transaction on A: ``outbox_claim`` (FOR UPDATE
  SKIP LOCKED, so concurrent relays split the rows), ``jobs_enqueue`` of the batch, and
  ``outbox_mark_published``. The jobs and the marks commit together or not at all: a relay that
  dies anywhere in between leaves no job and the rows pending, and the next relay takes them.
* **A != J (a separate jobs database), at least once, deduplicated.** A transaction on A holds
  the claimed rows' locks while a transaction on J publishes them and commits; then the marks
  commit on A. A relay that dies after J's commit and before A's leaves the rows pending with
  their jobs made: the next relay publishes them again. Each job's id is its outbox row's id,
  and the relay first asks J which of the batch's ids exist already (``jobs_find_by_ids``):
  those are marked, not made again, whatever their state. So a row becomes two jobs only if its
  first job was purged by retention before the row was re-relayed (see the docs page). While
  the job is live, the live-key index dedupes as well when the stager gave an idempotency key.

What bounds what: the claim's row locks last only as long as the relay's transaction on A; a
relay that dies releases them when PostgreSQL notices the connection is gone (immediately for a
process exit, after TCP keepalives for a vanished host). Wake-ups are hints: a relay polls every
``XJOBS["OUTBOX"]["POLL_INTERVAL"]`` whatever happens to its NOTIFY connection.

The job's id being the row's id is also what a :class:`StagedJob` handle relies on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from django.db import DatabaseError, transaction

from . import conf, registry, signals
from .engines import Engine, get_engine
from .records import EnqueueParams, EnqueueResult, OutboxRow, OutboxStatus, run_ids_for
from .replica import first_line

log = logging.getLogger("django_xjobs.outbox")

# Per outbox alias, the rows the last relay round of this process left pending because their
# shard could not take them (docs/scaling.md, "Where each thing goes"); the next claim asks for
# that many more, up to this many batches.
_held_back: dict[str, int] = {}
HELD_BACK_MAX = 10

DEFAULT_ENQUEUED_BY = "outbox"

# Relays running in this process, woken when a staging commits here (on_commit): a job that
# stages another job in a worker, or a test, gets it relayed without waiting for a NOTIFY, and
# also where NOTIFY is switched off.
_wakers: set[Callable[[], None]] = set()
_wakers_lock = threading.Lock()


def add_waker(wake: Callable[[], None]) -> None:
    with _wakers_lock:
        _wakers.add(wake)


def remove_waker(wake: Callable[[], None]) -> None:
    with _wakers_lock:
        _wakers.discard(wake)


def wake_local_relays() -> None:
    """The ``transaction.on_commit`` callback of every staging."""
    with _wakers_lock:
        wakers = list(_wakers)
    for wake in wakers:
        wake()


# ------------------------------------------------------------------------------- staging --


@dataclass(frozen=True, slots=True)
class StagedJob:
    """What ``enqueue_on_commit`` returns: the staged row, and the job it will be.

    ``id`` is the outbox row's id, which the job gets when the relay publishes it (unless an
    idempotency key named a live job, whose id :meth:`job_id` then reports). Before the
    caller's transaction commits, only the caller's own connection sees the row.
    """

    id: UUID
    using: str

    def status(self) -> OutboxStatus | None:
        """The row now (None: rolled back, or pruned after publication)."""
        return get_engine(self.using).outbox_status(self.id)

    def job_id(self) -> UUID | None:
        """The job this staging became, once relayed; None while pending (or rolled back)."""
        status = self.status()
        return status.job_id if status is not None else None


def stage(params: EnqueueParams, *, using: str, enqueued_by: str | None) -> StagedJob:
    """Stage validated ``params`` in the current transaction of ``using`` (api.enqueue_on_commit
    validated everything before this is called). ``enqueued_by`` None = "outbox" at relay time.
    """

    row = OutboxRow(
        id=params.id, name=params.name, queue=params.queue, input_json=params.input_json,
        idempotency_key=params.idempotency_key, max_attempts=params.max_attempts,
        priority=params.priority, run_at=params.run_at, delay_ms=params.delay_ms,
        tenant_id=params.tenant_id, traceparent=params.traceparent, enqueued_by=enqueued_by,
        concurrency_key=params.concurrency_key, rate_key=params.rate_key,
        unique_for_ms=params.unique_for_ms,
    )
    get_engine(using).outbox_stage(row)
    # Registered after the insert succeeded: a failed staging wakes nobody. Inside a savepoint
    # that rolls back, Django drops the callback with it.
    transaction.on_commit(wake_local_relays, using=using)
    return StagedJob(id=row.id, using=using)


# -------------------------------------------------------------------------------- relaying --


def _job_params(rows: list[OutboxRow], default_max_attempts: int) -> list[EnqueueParams]:
    run_ids = run_ids_for([row.id for row in rows])
    return [
        EnqueueParams(
            id=row.id, run_id=run_id, name=row.name, queue=row.queue, input_json=row.input_json,
            idempotency_key=row.idempotency_key,
            max_attempts=row.max_attempts or default_max_attempts, priority=row.priority,
            run_at=row.run_at, delay_ms=0, tenant_id=row.tenant_id,
            traceparent=row.traceparent, enqueued_by=row.enqueued_by or DEFAULT_ENQUEUED_BY,
            concurrency_key=row.concurrency_key, rate_key=row.rate_key,
            unique_for_ms=row.unique_for_ms,
        )
        for row, run_id in zip(rows, run_ids, strict=True)
    ]


def relay_batch(outbox: Engine, jobs: Engine | None = None, *,
                batch_size: int | None = None) -> int:
    """Publish up to ``batch_size`` pending rows of ``outbox``'s alias into ``jobs``' (default
    ``XJOBS["DATABASE"]``); return how many rows were marked published. See the module
    docstring for the two protocols. Database errors propagate: nothing is half-applied on
    the outbox side, and the caller retries later; with the jobs sharded, a shard that cannot
    be reached leaves its rows pending and the others are published (:func:`_publish_to_shards`).
    """
    settings = conf.get()
    jobs = jobs if jobs is not None else get_engine()
    size = batch_size or settings.outbox.batch_size
    # Rows left pending last round (their shard could not take them) come first again: claim
    # that many more, so that they do not hold back the rows staged after them.
    held = min(_held_back.get(outbox.alias, 0), HELD_BACK_MAX * size)
    with outbox.atomic():
        rows = outbox.outbox_claim(size + held)
        if not rows:
            return 0
        params = _job_params(rows, settings.max_attempts)
        results: Sequence[EnqueueResult | None]
        if settings.shards:  # each row to its tenant's shard (docs/scaling.md)
            results = _publish_to_shards(outbox, params)
            _held_back[outbox.alias] = sum(1 for r in results if r is None)
        elif jobs.alias == outbox.alias:
            results = jobs.jobs_enqueue(params)
        else:
            with jobs.atomic():
                results = _publish_elsewhere(jobs, params)
            # J committed here; if this process dies before A commits below, the rows stay
            # pending and the next relay finds their jobs by id (tests/acceptance/
            # test_outbox_two_databases.py).
        published = {row.id: result.id for row, result in zip(rows, results, strict=True)
                     if result is not None}
        marked = outbox.outbox_mark_published(published) if published else 0
        if signals.job_enqueued.receivers:
            made = [row for row, result in zip(rows, results, strict=True)
                    if result is not None and result.created]
            alias = outbox.alias
            # Once both sides committed (on A, the last): never for a round that rolled back.
            transaction.on_commit(lambda: _announce(made, alias), using=alias)
        return marked


def _announce(made: list[OutboxRow], alias: str) -> None:
    """``job_enqueued`` for each job a relay round made, in the relay's process; the handle is
    the :class:`StagedJob` ``enqueue_on_commit`` returned (docs/observability.md, "Signals")."""
    for row in made:
        sender = registry.lookup(row.name) or row.name
        signals.send(signals.job_enqueued, sender, handle=StagedJob(id=row.id, using=alias))


def _publish_to_shards(outbox: Engine, params: list[EnqueueParams]
                       ) -> list[EnqueueResult | None]:
    """Enqueue each row on its tenant's shard: in the outbox's transaction on the shard that is
    the outbox's database, committed shard by shard on the others (as on a separate jobs
    database: a relay that dies before the outbox commits finds those jobs by id next time).

    A row whose tenant cannot be placed (``TENANT_SHARDS``' function failed) and the rows of a
    shard that cannot be reached are left pending (None), said in the log, and tried again next
    round: one shard down holds back its own tenants' jobs only."""
    results: list[EnqueueResult | None] = [None] * len(params)
    groups: dict[str, list[int]] = {}
    for n, p in enumerate(params):
        try:
            alias = conf.shard_for_tenant(p.tenant_id)
        except Exception as exc:  # the project's placement function: any error it raises
            log.error("outbox relay: job %s (%s) of tenant %r left pending: %s", p.id, p.name,
                      p.tenant_id, exc)
            continue
        groups.setdefault(alias, []).append(n)
    for alias, positions in groups.items():
        jobs, group = get_engine(alias), [params[n] for n in positions]
        if alias == outbox.alias:  # its errors are the outbox's: the round fails as a whole
            made = jobs.jobs_enqueue(group)
        else:
            try:
                with jobs.atomic():
                    made = _publish_elsewhere(jobs, group)
            except DatabaseError as exc:
                log.warning("outbox relay: %d job(s) for shard %s left pending, it cannot be "
                            "reached: %s", len(group), alias, first_line(exc))
                continue
        for n, result in zip(positions, made, strict=True):
            results[n] = result
    return results


def _publish_elsewhere(jobs: Engine, params: list[EnqueueParams]) -> list[EnqueueResult]:
    """Enqueue on a jobs database other than the outbox's: skip the rows whose job exists."""
    existing = {r.id: r for r in jobs.jobs_find_by_ids([p.id for p in params])}
    fresh = [p for p in params if p.id not in existing]
    if existing:
        log.info("outbox relay: %d of %d rows were published before (their jobs exist); "
                 "marking them without enqueuing again", len(existing), len(params))
    made = iter(jobs.jobs_enqueue(fresh)) if fresh else iter(())
    return [existing[p.id] if p.id in existing else next(made) for p in params]


@dataclass(frozen=True, slots=True)
class Pending:
    """Stagings not relayed yet over every outbox alias: a growing ``oldest_seconds`` means no
    relay is running. ``by_alias``: alias -> (pending, oldest age in seconds or None)."""

    count: int
    oldest_seconds: float | None
    by_alias: dict[str, tuple[int, float | None]]


def pending() -> Pending:
    """What ``manage.py xjobs`` and the console show about the outbox. Each alias's x_outbox is
    read on that alias: with a separate jobs database, the jobs' engine has none."""
    by_alias = {alias: get_engine(alias).outbox_pending()
                for alias in conf.get().outbox.databases}
    ages = [age for _, age in by_alias.values() if age is not None]
    return Pending(count=sum(n for n, _ in by_alias.values()),
                   oldest_seconds=max(ages) if ages else None, by_alias=by_alias)


def relay_pending(aliases: tuple[str, ...] | None = None) -> int:
    """Relay every committed pending row of ``aliases`` (default: all outbox aliases) until none
    is left; how many. Runs on this thread's connections: call it outside ``atomic()`` (or
    from another thread, as :func:`django_xjobs.testing.drain` does) so that the rows a
    caller's open transaction staged are not relayed before that transaction commits."""
    settings = conf.get()
    jobs = get_engine()
    total = 0
    for alias in aliases or settings.outbox.databases:
        outbox = get_engine(alias)
        while True:
            moved = relay_batch(outbox, jobs)
            total += moved
            if moved < settings.outbox.batch_size:
                break
    return total
