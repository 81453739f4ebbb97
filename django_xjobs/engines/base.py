"""THE SEAM: every database operation django-xjobs performs, one method each.

Services (api, worker, scheduler, ...) call these methods through :func:`engines.get_engine` and
never build SQL. An engine turns each method into one named statement of its wire format
(``engines/<engine>/statements.py``) and decodes rows into :mod:`django_xjobs.records`.

Names are noun-first and carry their guard: ``jobs_complete_if_owned`` may only change rows whose
``lease_token`` is the caller's; a plural noun means the method takes a batch.

Every engine must pass ``tests/conformance/`` unchanged; behaviour an engine cannot offer is
declared in :class:`Features`, and tests skip by flag, never by vendor.

Transactions: every method runs on the Django connection of the engine's alias *in the current
thread*, so inside ``transaction.atomic()`` it joins the caller's transaction, and outside one
it is its own (autocommit) transaction.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import LiteralString

from ..records import (
    ChangeResult,
    ClaimedJob,
    Completion,
    EnqueueParams,
    EnqueueResult,
    EventRecord,
    Failure,
    FenceReport,
    JobRecord,
    LeaseRef,
    ParkedStep,
    QueueStats,
    Requeue,
    RunOwner,
    StepRecord,
    Suspension,
    TableHealth,
    XminHolder,
)


@dataclass(frozen=True, slots=True)
class Statement:
    """One named statement of an engine's wire format.

    ``sql`` uses ``%(name)s`` placeholders (bound by the driver, never formatted into the text);
    ``why`` says why its filters exist, and is printed by ``manage.py xjobs_sql``.
    """

    name: str
    sql: LiteralString
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Features:
    """What an engine can do. Tests and services branch on these, never on the vendor."""

    skip_locked: bool = False  # concurrent claims never block each other
    listen_notify: bool = False  # wake-ups pushed by the database on commit
    transactional_enqueue: bool = True  # enqueue joins the caller's transaction
    advisory_locks: bool = False


class Listener(abc.ABC):
    """A dedicated connection that receives enqueue wake-ups (the queue names)."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> list[str]:
        """Block up to ``timeout`` seconds; return the queue names notified (may be empty).

        Raises :class:`ListenerLost` when the connection is gone; the caller reconnects.
        """

    @abc.abstractmethod
    def close(self) -> None: ...


class ListenerLost(Exception):
    """The LISTEN connection dropped; notifications sent meanwhile are lost (poll covers them)."""


class Engine(abc.ABC):
    """The operations. See the module docstring for the transaction rule."""

    features: Features = Features()

    def __init__(self, alias: str) -> None:
        self.alias = alias

    # -------------------------------------------------------------------- statements --
    @abc.abstractmethod
    def statements(self) -> Mapping[str, Statement]:
        """Every statement of this engine by name (``manage.py xjobs_sql``, statement lint)."""

    # ----------------------------------------------------------------------- enqueue --
    @abc.abstractmethod
    def job_enqueue(self, params: EnqueueParams) -> EnqueueResult:
        """Insert one job, or return the live job holding ``(name, tenant, key)``."""

    @abc.abstractmethod
    def jobs_enqueue(self, batch: Sequence[EnqueueParams]) -> list[EnqueueResult]:
        """Insert many jobs in one statement; results in input order. Keys dedupe within the
        batch too: two items with one key give one job, and both results name it."""

    @abc.abstractmethod
    def job_find_live_by_key(
        self, name: str, tenant_id: str | None, idempotency_key: str
    ) -> EnqueueResult | None: ...

    # ------------------------------------------------------------------ worker side --
    @abc.abstractmethod
    def jobs_claim(
        self, *, wants: Mapping[str, int], worker_id: str, lease_ms: int
    ) -> list[ClaimedJob]:
        """Lease up to ``wants[queue]`` due jobs of each queue, plus lapsed ``running`` jobs."""

    @abc.abstractmethod
    def jobs_complete_if_owned(self, batch: Sequence[Completion]) -> FenceReport: ...

    @abc.abstractmethod
    def job_fail_if_owned(self, failure: Failure) -> tuple[FenceReport, str | None]:
        """Retry or bury; returns the report (keyed by lease token) and the state the job went
        to, also when an earlier try had already applied it (None if lost)."""

    @abc.abstractmethod
    def job_requeue_if_owned(self, requeue: Requeue) -> FenceReport: ...

    @abc.abstractmethod
    def job_suspend_if_owned(self, suspension: Suspension) -> FenceReport: ...

    @abc.abstractmethod
    def jobs_renew_if_owned(self, leases: Sequence[LeaseRef], lease_ms: int) -> frozenset[str]:
        """Extend every lease still owned; return the lease TOKENS renewed (a missing token =
        that run lost the job)."""

    # ------------------------------------------------------------------------- steps --
    @abc.abstractmethod
    def atomic(self) -> AbstractContextManager[object]:
        """A transaction (or savepoint) on this thread's connection for the engine's alias."""

    @abc.abstractmethod
    def steps_of_run(self, run_id: str) -> list[StepRecord]: ...

    @abc.abstractmethod
    def step_complete_if_owned(
        self, owner: RunOwner, name: str, output_json: str | None, *,
        event: str | None = None, correlation_key: str | None = None,
        event_id: int | None = None, event_published_at: datetime | None = None,
    ) -> bool:
        """Record a step's output; False if the run no longer owns its job (nothing written)."""

    @abc.abstractmethod
    def step_fail_if_owned(self, owner: RunOwner, name: str, error: str) -> int | None:
        """Record a step's failure; the step's attempts, or None if the run lost its job."""

    @abc.abstractmethod
    def step_park_if_owned(
        self, owner: RunOwner, name: str, *, status: str, wake_at: datetime | None = None,
        duration_ms: int = 0, event: str | None = None, correlation_key: str | None = None,
    ) -> ParkedStep | None:
        """Open (or find) a sleep or event wait; None if the run lost its job."""

    @abc.abstractmethod
    def step_cancel_siblings(self, owner: RunOwner, prefix: str) -> None:
        """Close the open waits whose names start with ``prefix`` (wait_for_any's losers)."""

    # ------------------------------------------------------------------------ events --
    @abc.abstractmethod
    def event_lock(self, names: Sequence[str]) -> None:
        """Take the event rendezvous lock(s) until the end of the current transaction."""

    @abc.abstractmethod
    def event_publish(
        self, name: str, payload_json: str, correlation_key: str | None, ttl_ms: int
    ) -> EventRecord: ...

    @abc.abstractmethod
    def event_wake_waiters(self, name: str, correlation_key: str | None) -> int:
        """Make suspended jobs waiting for this event due now; how many were woken."""

    @abc.abstractmethod
    def event_next(
        self, names: Sequence[str], correlation_key: str | None, after_at: datetime,
        after_id: int,
    ) -> EventRecord | None: ...

    @abc.abstractmethod
    def events_list(self, name: str | None = None, limit: int = 100) -> list[EventRecord]: ...

    @abc.abstractmethod
    def events_purge(self, batch_size: int = 1000) -> int:
        """Delete expired events in bounded batches; how many."""

    # ------------------------------------------------------------------- operators --
    @abc.abstractmethod
    def job_get(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> JobRecord | None:
        ...

    @abc.abstractmethod
    def job_cancel(
        self, job_id: str, *, reason: str | None, tenant_ids: Iterable[str] | None = None
    ) -> ChangeResult:
        """Any state but ``done``/``cancelled`` becomes ``cancelled``."""

    @abc.abstractmethod
    def job_retry(self, job_id: str, *, tenant_ids: Iterable[str] | None = None,
                  enqueued_by: str | None = None) -> ChangeResult:
        """``dead``/``cancelled`` -> ``ready`` with a fresh attempt budget, same run_id;
        ``enqueued_by``, when given, records who retried it.

        Raises :class:`~django_xjobs.exceptions.LiveJobExists` when another live job holds the
        key."""

    @abc.abstractmethod
    def job_run_now(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> ChangeResult:
        """A ``delayed`` or ``suspended`` job (or a ready one due later) becomes due now."""

    @abc.abstractmethod
    def jobs_purge(
        self, *, states: Sequence[str], finished_before: datetime, batch_size: int = 1000
    ) -> int:
        """Delete finished jobs (and their steps) in bounded batches; return how many."""

    @abc.abstractmethod
    def queue_stats(self, *, tenant_ids: Iterable[str] | None = None) -> list[QueueStats]: ...

    @abc.abstractmethod
    def outbox_pending(
        self, *, tenant_ids: Iterable[str] | None = None
    ) -> tuple[int, float | None]:
        """Staged outbox rows not yet relayed, and the age in seconds of the oldest."""

    # ----------------------------------------------------------------------- console --
    @abc.abstractmethod
    def jobs_delete_finished(
        self, ids: Sequence[str], *, tenant_ids: Iterable[str] | None = None
    ) -> int:
        """Delete these jobs (and their steps) if finished; live or locked ones are skipped.
        Returns how many were deleted."""

    @abc.abstractmethod
    def tables_health(self) -> list[TableHealth]:
        """Dead tuples and transaction-id age of the job tables."""

    @abc.abstractmethod
    def xmin_horizon(self, limit: int = 10) -> list[XminHolder]:
        """What keeps VACUUM from removing dead rows, the oldest holder first."""

    # ---------------------------------------------------------------- connections --
    @abc.abstractmethod
    def session_label(self, label: str) -> None:
        """Name this thread's connection (``application_name``) so operators and fault tests
        can find it in ``pg_stat_activity``."""

    @abc.abstractmethod
    def listener(self, channel_label: str) -> Listener:
        """Open a dedicated connection that receives enqueue wake-ups."""

    @abc.abstractmethod
    def db_now(self) -> datetime: ...

    @abc.abstractmethod
    def reset_connection(self) -> None:
        """Drop this thread's connection after an error so the next call reconnects."""

    @abc.abstractmethod
    def is_connection_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the connection is gone (the outcome of the call is unknown)."""
