"""Why is a job not running? Every reason that holds a waiting job back now, with its expiry
where it has one (docs/flow-control.md, "Why is a job not running?").

``manage.py xjobs why ID``, ``get_job(id).blocked_by`` and the console's job page read the same
list from here. The facts come from the engine in one statement (``why_job``: the row, the
pauses in force, the slot holders, the workers seen) plus one for a rate-limited job
(``why_rate_window``); this module only judges them:

* ``delayed`` / ``backoff``: not due yet; a backoff when the wait follows a failed attempt
  (``attempt > 0`` and ``last_error`` set), a plain delay otherwise.
* ``queue_paused`` / ``key_paused``: a pause in force for its queue, or for its concurrency or
  rate-limit key.
* ``slot_full``: its concurrency key has as many live holders as the limit its run would ask
  under (``slots.limit_for``, else 1: a key with no known limit runs one at a time).
* ``rate_limit``: its rate-limit key's spending over the period leaves no room for its cost.
* ``no_worker``: no worker that serves its queue was seen in the last 5 minutes.
* ``unknown_job``: the workers that claimed it do not know its name, and gave it back to wait
  for one that does (docs/deployment.md, "New job types before their workers"); it replaces the
  ``delayed`` / ``backoff`` reason of that wait.

A running or finished job has none; nor has a ready, due job nothing holds back (the next claim
of its queue takes it). A ``blocked`` job none of whose reasons holds any more waits for the
round that unblocks jobs, which the summary says.

Most binding first: reasons that end only when something happens (a resume, a slot freed, a
worker started) before those that end by themselves, and of these the one that ends last first.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from . import conf, records, registry, slots
from .engines import get_engine
from .exceptions import JobNotFound
from .records import BLOCKED_KINDS, BlockedBy, FlowFacts, JobRecord

__all__ = ["blocked_by", "for_job", "read_blocked_by", "summary"]

# Between two reasons with the same end (both open-ended, or both ending at T): an operator's
# pause binds more than a missing worker, which binds more than a slot that frees when a run ends.
_KIND_ORDER = {kind: n for n, kind in enumerate(BLOCKED_KINDS)}


def for_job(job_id: Any, *, tenant_ids: Iterable[str] | None = None) -> tuple[BlockedBy, ...]:
    """Every reason job ``job_id`` is not running now, most binding first;
    :class:`JobNotFound` when there is no such job (or it is another tenant's)."""
    tenants = list(tenant_ids) if tenant_ids is not None else None
    facts = get_engine().why_job(str(job_id), tenant_ids=tenants)
    if facts is None:
        raise JobNotFound(f"no job with id {job_id}")
    return blocked_by(facts)


def blocked_by(facts: FlowFacts) -> tuple[BlockedBy, ...]:
    """The reasons ``facts`` (the engine's ``why_job``) hold, most binding first."""
    if facts.state not in records.WAITING_STATES:
        return ()
    found = [*_waits(facts), *_unknown(facts), *_pauses(facts), *_slot(facts), *_rate(facts),
             *_worker(facts)]
    return tuple(sorted(found, key=_binding))


def _binding(reason: BlockedBy) -> tuple[int, float, int]:
    # An unknown name's next try ends nothing by itself: a worker that knows it must come.
    if reason.until is None or reason.kind == "unknown_job":
        return (0, 0.0, _KIND_ORDER[reason.kind])
    return (1, -reason.until.timestamp(), _KIND_ORDER[reason.kind])


def _waits(facts: FlowFacts) -> list[BlockedBy]:
    if (facts.state not in ("ready", "delayed") or facts.run_at <= facts.now
            or facts.unknown_since is not None):
        return []
    failed = facts.attempt > 0 and facts.last_error is not None
    return [BlockedBy(kind="backoff" if failed else "delayed", until=facts.run_at)]


def _unknown(facts: FlowFacts) -> list[BlockedBy]:
    if facts.unknown_since is None:
        return []
    return [BlockedBy(kind="unknown_job", name=facts.name, queue=facts.queue,
                      since=facts.unknown_since, until=facts.run_at,
                      workers=facts.unknown_workers,
                      reason=registry.expected_home(facts.name, facts.enqueued_by))]


def _pauses(facts: FlowFacts) -> list[BlockedBy]:
    out = []
    for pause in facts.pauses:
        if pause.kind == "queue":
            out.append(BlockedBy(kind="queue_paused", queue=pause.key, until=pause.until,
                                 reason=pause.reason))
        else:
            out.append(BlockedBy(kind="key_paused", key=pause.key, until=pause.until,
                                 reason=pause.reason))
    return out


def _slot(facts: FlowFacts) -> list[BlockedBy]:
    key = facts.concurrency_key
    if key is None:
        return []
    limit = slots.limit_for(key, registry.lookup(facts.name), conf.get()) or 1
    if len(facts.holders) < limit:
        return []
    return [BlockedBy(kind="slot_full", key=key, holders=facts.holders, limit=limit)]


def _rate(facts: FlowFacts) -> list[BlockedBy]:
    rate = _rate_limit(facts.name)
    if facts.rate_key is None or rate is None:
        return []
    limit, period_ms, cost = rate
    window = get_engine().why_rate_window(facts.rate_key, limit=limit, period_ms=period_ms,
                                          cost=cost)
    if window.spent + cost <= limit:
        return []
    return [BlockedBy(kind="rate_limit", key=facts.rate_key, until=window.next_at, limit=limit)]


def _rate_limit(name: str) -> tuple[int, int, int] | None:
    """(limit, period in milliseconds, cost) of the job's ``@job(rate_limit=RateLimit(...))``,
    read by its attributes; None when it has none (or not one this can read)."""
    definition = registry.lookup(name)
    value = definition.options.get("rate_limit") if definition is not None else None
    if value is None:
        return None
    limit, period, cost = (getattr(value, a, None) for a in ("limit", "period", "cost"))
    if isinstance(period, timedelta):
        period = period.total_seconds()
    if not isinstance(limit, int) or not isinstance(period, int | float) or period <= 0:
        return None
    return limit, round(period * 1000), cost if isinstance(cost, int) else 1


def _worker(facts: FlowFacts) -> list[BlockedBy]:
    return [] if facts.worker_seen else [BlockedBy(kind="no_worker", queue=facts.queue)]


def read_blocked_by(record: JobRecord) -> tuple[BlockedBy, ...]:
    """``JobRecord.blocked_by`` (the package's ``__init__`` installs it as
    ``records.jobs.blocked_by_reader``): the job's reasons now, none when it has gone since."""
    facts = get_engine().why_job(str(record.id))
    return blocked_by(facts) if facts is not None else ()


# ---------------------------------------------------------------------------------- summary --


def summary(job: Any, reasons: tuple[BlockedBy, ...], now: datetime) -> str:
    """What the job is doing instead, in one line: the head of ``xjobs why``.

    ``job`` is a JobRecord or a Job model instance; ``now`` the database clock.
    """
    state = job.state
    if state == "running":
        since = f" since {_at(job.started_at)}" if job.started_at is not None else ""
        return f"running on worker {job.claimed_by}{since}"
    if state in records.TERMINAL_STATES:
        return f"finished as {state}"
    if state == "blocked" and _buffered_cron_run(job):
        return (f"blocked: waits behind the live run of cron task {job.blocked_on[5:]} "
                "(overlap=buffer_one), released when the task's earlier runs have finished "
                "(docs/scheduling.md, \"Overlap\")")
    if reasons:
        return f"{state}, not running: {len(reasons)} reason(s), most binding first"
    if state == "blocked":
        key = getattr(job, "blocked_on", None) or "its key"
        return (f"blocked on {key}, which holds it back no more: the round that unblocks jobs "
                "releases it")
    if job.run_at > now:
        return f"{state} until {_at(job.run_at)}"
    if state == "suspended":
        return "suspended and due: the next claim resumes it"
    return f"{state}: the next claim takes it"


def _buffered_cron_run(job: Any) -> bool:
    """A run that ``overlap="buffer_one"`` holds behind its task's live run: blocked on its own
    ``enqueued_by``, ``cron:<task>`` (scheduler/runner.py)."""
    by = getattr(job, "enqueued_by", None)
    return (isinstance(by, str) and by.startswith("cron:")
            and getattr(job, "blocked_on", None) == by)


def _at(moment: datetime) -> str:
    return moment.isoformat(sep=" ", timespec="seconds")
