"""The other tables as the console and ``manage.py xjobs`` list them: events, outbox entries,
concurrency slots with the limits they were taken under, backfill passes with their rates."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models.functions import Now

from ... import conf, registry, slots
from ...models import Backfill, Job, JobEvent, JobLease, OutboxEntry
from .json_columns import with_json_text
from .scope import TenantScope, scoped


def event_rows(*, name: str | None = None, limit: int = 50) -> list[Any]:
    """Published events, newest first (the order of the engine's ``events_list``), payloads
    as text."""

    qs = JobEvent.objects.all() if name is None else JobEvent.objects.filter(name=name)
    return list(with_json_text(qs, limit=None).order_by("-published_at", "-id")[:limit])


def outbox_entries(*, tenants: TenantScope = None, pending: bool | None = None,
                   limit: int = 50) -> list[Any]:

    qs = with_json_text(scoped(OutboxEntry.objects.all(), tenants), limit=None)
    if pending is True:
        return list(qs.filter(published_at=None).order_by("staged_at")[:limit])
    if pending is False:
        qs = qs.exclude(published_at=None)
    return list(qs.order_by("-staged_at")[:limit])


def slot_limits(held: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int | None]:
    """The limit each held slot was asked under, per ``(key, holder)``: the one a run of the
    holder's job asks for (:func:`slots.limit_for`: ``XJOBS["CONCURRENCY_LIMITS"]`` first,
    else the job's own ``Concurrency(limit=...)``). The holder names the job by id; a holder
    whose job is gone (or was never a job) gets the settings limit, or None."""

    pairs = list(held)
    job_ids: dict[str, UUID] = {}
    for _, holder in pairs:
        job_id = slots.parse_holder(holder)[0]
        try:
            job_ids[job_id] = UUID(job_id)
        except ValueError:
            continue
    names = {str(i): n for i, n in Job.objects.filter(id__in=job_ids.values())
             .values_list("id", "name")}
    settings = conf.get()
    return {(key, holder): slots.limit_for(
                key, registry.lookup(names.get(slots.parse_holder(holder)[0], "")), settings)
            for key, holder in pairs}


def key_limits(keys: Iterable[str]) -> dict[str, list[int]]:
    """The limits that apply to the live slots of each key, smallest first (several when jobs
    with different limits share a key; none when no holder's limit is known)."""

    keys = list(keys)
    live = JobLease.objects.filter(lease_key__in=keys, expires_at__gt=Now())
    found: dict[str, set[int]] = {k: set() for k in keys}
    for (key, _), limit in slot_limits(live.values_list("lease_key", "holder")).items():
        if limit is not None:
            found[key].add(limit)
    return {k: sorted(v) for k, v in found.items()}


def backfill_rows(limit: int = 100) -> list[Any]:
    return list(with_json_text(Backfill.objects.all(), limit=None).order_by("-started_at")[:limit])


def backfill_rate(b: Any, now: datetime) -> float | None:
    """Rows per second over the pass so far (to its end, for a finished one)."""
    end = b.completed_at or now
    seconds = (end - b.started_at).total_seconds() if b.started_at else 0
    return b.rows_processed / seconds if seconds > 0 else None
