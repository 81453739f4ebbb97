"""The models' managers: the engine's claim, fenced writes, lease renewal, slot and leader
statements as methods of ``Job.objects``, ``JobLease.objects`` and ``SchedulerLeader.objects``.

A thin facade for ``manage.py shell``, scripts and one-off maintenance (docs/managers.md).
Each method resolves the engine of the manager's database and calls one engine method (named
in its docstring), which runs the statement of the same name: the SQL stays in the engine
(``manage.py xjobs_sql`` prints it), and what goes in and comes out are the engine's records
(:mod:`django_xjobs.records`). Everything else about these managers is Django's:
``Job.objects.filter(...)`` is the default queryset.

The database is the manager's: ``Job.objects.db_manager("jobs").claim(...)`` runs on "jobs";
without ``db_manager()`` it is where the routers write the model (with
``django_xjobs.routers.XJobsRouter``, ``XJOBS["DATABASE"]``; with no router, "default").
Like every engine method, a call joins the transaction open on that alias in this thread, or
is its own transaction (``engines/base.py``).

Durations (a lease, a slot's time to live) are seconds, a ``timedelta`` or a string such as
``"30s"`` (as in the settings, django_xjobs/values.py), at least a millisecond; the engine takes
whole milliseconds. The batch methods take one record or an iterable of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import models, router

from . import values
from .engines import Engine, get_engine
from .exceptions import ConfigurationError
from .records import (
    Claim,
    ClaimedJob,
    Completion,
    Failure,
    FenceReport,
    LeaderRecord,
    Requeue,
    SlotHold,
    SlotRecord,
    SlotRequest,
    SlotUsage,
    Suspension,
)

Duration = float | timedelta | str


def milliseconds(value: Duration, *, what: str) -> int:
    """``value`` (seconds, a timedelta or ``"30s"``) in whole milliseconds, at least one.

    Raises ``ValueError`` naming ``what`` for anything else: a negative, zero or non-finite
    duration, a bool, text that is not a duration."""
    try:
        seconds = values.parse_duration(value, what=what)
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"{what}: must be at least 1ms, got {value!r}")
    return ms


def _records(value: Any, kinds: tuple[type, ...], *, method: str) -> list[Any]:
    """One record or an iterable of them, as a list; a clear TypeError for anything else."""
    items = [value] if isinstance(value, kinds) else value
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        items = [items]
    items = list(items)
    for item in items:
        if not isinstance(item, kinds):
            names = ", ".join(k.__name__ for k in kinds)
            raise TypeError(f"{method}() takes {names} records (one or an iterable), "
                            f"got {type(item).__name__}: {item!r}")
    return items


def _one(value: Any, kind: type, *, method: str) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"{method}() takes one {kind.__name__} record, "
                        f"got {type(value).__name__}: {value!r}")
    return value


def _claims(value: Any, *, method: str) -> list[Claim]:
    """Claims from ``Claim`` or ``ClaimedJob`` records (a claimed job carries its claim)."""
    return [c.claim if isinstance(c, ClaimedJob) else c
            for c in _records(value, (Claim, ClaimedJob), method=method)]


def _count(value: Any, *, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what}: expected a whole number of jobs, 0 or more, got {value!r}")
    return value


class EngineManager(models.Manager):
    """A model's default manager that also reaches the engine of its database."""

    @property
    def alias(self) -> str:
        """The database the engine methods run on: ``db_manager(alias)``'s, else the routers'
        choice for writing this model."""
        return str(self._db or router.db_for_write(self.model, **self._hints))

    def engine(self) -> Engine:
        """The engine of :attr:`alias` (one per alias, shared with the worker in this process)."""
        return get_engine(self.alias)


class JobManager(EngineManager):
    """``Job.objects``: the worker's statements on ``x_jobs``, one method each.

    Fenced writes answer with a :class:`~django_xjobs.records.FenceReport` keyed by lease token:
    ``report.outcome(job.lease_token)`` is OWNED (this call wrote), ALREADY_APPLIED (an earlier
    try of the same write had committed) or LOST (the run no longer owns the job; nothing was
    written). See docs/design.md, "Fencing".
    """

    def claim(self, queues: str | Iterable[str] | Mapping[str, int], *, worker_id: str,
              lease: Duration, limit: int | None = None) -> list[ClaimedJob]:
        """Lease due jobs to ``worker_id`` for ``lease``, each under a fresh lease token
        (``Engine.jobs_claim``): up to ``limit`` (default 1) of each queue named, or
        ``{queue: how many}``; lapsed ``running`` jobs of those queues are taken over too.

        The jobs are now running: settle each with :meth:`complete`, :meth:`fail`,
        :meth:`requeue` or :meth:`suspend`, or its lease lapses and another claim takes it.
        """
        if isinstance(queues, Mapping):
            if limit is not None:
                raise TypeError("claim(): give either {queue: how many} or limit=, not both")
            wants = {str(q): _count(n, what=f"claim({q!r})") for q, n in queues.items()}
        else:
            names = [queues] if isinstance(queues, str) else list(queues)
            n = _count(1 if limit is None else limit, what="claim(limit=)")
            wants = dict.fromkeys(names, n)
        return self.engine().jobs_claim(wants=wants, worker_id=worker_id,
                                        lease_ms=milliseconds(lease, what="claim(lease=)"))

    def complete(self, completions: Completion | Claim | ClaimedJob
                 | Iterable[Completion | Claim | ClaimedJob]) -> FenceReport:
        """Mark runs done, each fenced on its claim (``Engine.jobs_complete_if_owned``, one
        statement for the batch). A ``Claim`` or ``ClaimedJob`` completes with no result; a
        ``Completion`` carries the result as JSON text."""
        batch = [c if isinstance(c, Completion) else
                 Completion(claim=c.claim if isinstance(c, ClaimedJob) else c, result_json=None)
                 for c in _records(completions, (Completion, Claim, ClaimedJob),
                                   method="complete")]
        return self.engine().jobs_complete_if_owned(batch)

    def fail(self, failure: Failure) -> tuple[FenceReport, str | None]:
        """A run that raised: retry after ``failure.retry_delay_ms``, or bury it when its
        attempts are used up or ``failure.permanent`` (``Engine.job_fail_if_owned``). Returns
        the report and the state the job went to (None if the run had lost it)."""
        return self.engine().job_fail_if_owned(_one(failure, Failure, method="fail"))

    def requeue(self, requeues: Requeue | Iterable[Requeue]) -> FenceReport:
        """Give jobs back without spending an attempt (a snooze, a shutdown, a lost slot).
        One ``Requeue`` runs ``Engine.job_requeue_if_owned``; an iterable of them
        ``Engine.jobs_requeue_if_owned``, one statement for the batch."""
        if isinstance(requeues, Requeue):
            return self.engine().job_requeue_if_owned(requeues)
        return self.engine().jobs_requeue_if_owned(
            _records(requeues, (Requeue,), method="requeue"))

    def suspend(self, suspension: Suspension) -> FenceReport:
        """Park a run's job until ``suspension.wake_at``; its resume spends no attempt
        (``Engine.job_suspend_if_owned``)."""
        return self.engine().job_suspend_if_owned(_one(suspension, Suspension, method="suspend"))

    def renew(self, claims: Claim | ClaimedJob | Iterable[Claim | ClaimedJob], *,
              lease: Duration) -> frozenset[str]:
        """Extend the lease of each run that still owns its job to ``lease`` from now
        (``Engine.jobs_renew_if_owned``, one statement): the lease tokens whose lease holds,
        renewed on the job's row or, when another transaction holds that row, kept beside it.
        A token missing from the answer is a run that lost its job."""
        return self.engine().jobs_renew_if_owned(
            _claims(claims, method="renew"), milliseconds(lease, what="renew(lease=)")).held

    def wake_refused(self, claims: Claim | ClaimedJob | Iterable[Claim | ClaimedJob]) -> int:
        """Make due now each job still waiting since its claim was refused a concurrency slot
        and requeued, unless it was claimed since (``Engine.jobs_wake_refused``); how many."""
        return self.engine().jobs_wake_refused(_claims(claims, method="wake_refused"))


class SlotManager(EngineManager):
    """``JobLease.objects``: the concurrency slot statements (django_xjobs/slots.py).

    A slot is free when its row is missing or lapsed; renewals and releases are fenced on the
    holder, and a renewal on expiry as well (a lapsed slot is never revived).
    """

    def acquire(self, requests: SlotRequest | Iterable[SlotRequest], *,
                ttl: Duration) -> list[SlotHold]:
        """Grant each request the lowest free slot of its key below its limit, for ``ttl``
        (``Engine.slots_acquire``): the slots granted; a request missing from the answer was
        refused. A live slot is never granted twice."""
        return self.engine().slots_acquire(
            _records(requests, (SlotRequest,), method="acquire"),
            milliseconds(ttl, what="acquire(ttl=)"))

    def renew(self, holds: SlotHold | Iterable[SlotHold], *, ttl: Duration) -> frozenset[str]:
        """Extend each slot still held by its holder and not yet lapsed to ``ttl`` from now
        (``Engine.slots_renew_if_held``): the holders that still hold their slot, renewed or,
        when another transaction holds the slot's row this moment, not renewed this time (ask
        again). A holder missing from the answer lost its slot."""
        return self.engine().slots_renew_if_held(
            _records(holds, (SlotHold,), method="renew"),
            milliseconds(ttl, what="renew(ttl=)")).held

    def release(self, holds: SlotHold | Iterable[SlotHold]) -> int:
        """Free each slot its holder still has, lapsed or not (``Engine.slots_release_if_held``);
        how many rows went (a slot row another transaction holds this moment is not waited
        for: release it again)."""
        released, _held = self.engine().slots_release_if_held(
            _records(holds, (SlotHold,), method="release"))
        return released

    def live(self, *, slot_key: str | None = None, limit: int = 1000) -> list[SlotRecord]:
        """The live slots (of ``slot_key``), by key then slot, with the seconds each has left
        on the database clock (``Engine.slots_list``)."""
        return self.engine().slots_list(slot_key=slot_key, limit=limit)

    def usage(self, limit: int = 1000) -> list[SlotUsage]:
        """Live slots per key, busiest key first (``Engine.slots_usage``)."""
        return self.engine().slots_usage(limit)


class LeaderManager(EngineManager):
    """``SchedulerLeader.objects``: the scheduler's leader lease (docs/scheduling.md)."""

    def elect(self, lock_key: str, holder: str, *, lease: Duration) -> datetime | None:
        """Take the lease of ``lock_key`` if it is unheld or lapsed, or renew it if ``holder``
        holds it, in one statement (``Engine.leader_attempt_elect``): the new expiry on the
        database clock, or None while another holder's lease is live."""
        return self.engine().leader_attempt_elect(lock_key, holder,
                                                  milliseconds(lease, what="elect(lease=)"))

    def resign(self, lock_key: str, holder: str) -> bool:
        """Give up the lease, only if ``holder`` holds it (``Engine.leader_resign``); whether
        it did."""
        return self.engine().leader_resign(lock_key, holder)

    def current(self, lock_key: str) -> LeaderRecord | None:
        """The lease of ``lock_key``, live or lapsed (``record.live``), or None
        (``Engine.leader_get``)."""
        return self.engine().leader_get(lock_key)
