"""Operator actions over a filter: every job the console's filters (or ``manage.py xjobs retry
--filter ...``) match, not only the rows of one page (docs/console.md, "Acting on thousands").

The jobs are counted first (the confirmation says how many), then read newest first ten batches
at a time (:func:`.reads.search.newest_per_table`: each table read by its own plan) and changed
by one set-based statement per batch, the API's: :func:`~django_xjobs.api.retry_many`,
:func:`~django_xjobs.api.cancel_many`, :func:`~django_xjobs.api.delete_finished`. Each batch
is its own transaction, so a long run holds no lock for long and a failure midway keeps what
is done; the next batch starts below the last id read, so every job is met once even while
the action moves the ones it changed. The console writes one admin log entry per job changed,
as its single actions do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import api
from ..models import Job
from ..records import LIVE_STATES, TERMINAL_STATES
from .reads.search import count_per_table, newest_per_table

# Jobs per statement, and the most one action over a filter takes on: past it, narrow the
# filter (a retry of millions of jobs is a deploy's business, not a click's).
BATCH = 1000
LIMIT = 1_000_000
# Batches whose ids one read of the tables finds.
READ_BATCHES = 10


@dataclass(frozen=True)
class BulkAction:
    """An action over a filter: the states it applies to and its batch's statement."""

    name: str  # retry, cancel, delete
    states: tuple[str, ...]
    done_word: str


BULK_ACTIONS = {a.name: a for a in (
    BulkAction("retry", ("dead", "cancelled"), "retried"),
    BulkAction("cancel", tuple(LIVE_STATES), "cancelled"),
    BulkAction("delete", tuple(TERMINAL_STATES), "deleted"),
)}


@dataclass
class BulkReport:
    """What an action over a filter did: how many jobs it met (of the states it applies to),
    how many it changed, how many it left (changed meanwhile, held by another transaction, a
    live job holding the key), in how many batches and how long."""

    action: str
    met: int = 0
    changed: int = 0
    batches: int = 0
    seconds: float = 0.0
    changed_ids: list[Any] = field(default_factory=list, repr=False)

    @property
    def left(self) -> int:
        return self.met - self.changed


def applicable(queryset: Any, action: str) -> Any:
    """The jobs of ``queryset`` that ``action`` applies to."""
    return queryset.filter(state__in=BULK_ACTIONS[action].states)


def count(queryset: Any, action: str, *, cap: int = LIMIT + 1) -> int:
    """How many jobs of ``queryset`` ``action`` applies to, counted up to ``cap`` (table by
    table: :func:`.reads.search.count_per_table`)."""
    return count_per_table(applicable(queryset, action), cap=cap)


def run(queryset: Any, action: str, *, tenant_ids: Any = None, reason: str | None = None,
        batch: int = BATCH,
        on_batch: Callable[[list[tuple[Any, str]], list[Any]], None] | None = None,
        ) -> BulkReport:
    """``action`` on every job of ``queryset`` it applies to, ``batch`` jobs per statement.
    ``on_batch(jobs, changed_ids)`` is called after each batch with the batch's ``(id,
    name)`` pairs and the ids it changed (the console writes its log entries there). Call it
    inside :func:`~django_xjobs.api.acting_as` to record who acted."""
    if action not in BULK_ACTIONS:
        raise ValueError(f"unknown action {action!r}; one of {sorted(BULK_ACTIONS)}")
    report = BulkReport(action=action)
    started = time.perf_counter()
    narrowed = applicable(queryset, action)
    below: Any = None
    while True:
        # The ids of READ_BATCHES batches in one read of every table, then a statement per
        # batch: each read evaluates the filter over what is left below the last id.
        part = narrowed if below is None else narrowed.filter(id__lt=below)
        jobs = list(newest_per_table(part, limit=batch * READ_BATCHES).order_by("-id")
                    .values_list("id", "name"))
        if not jobs:
            break
        below = jobs[-1][0]
        for start in range(0, len(jobs), batch):
            chunk = jobs[start:start + batch]
            changed = _apply(action, [job_id for job_id, _ in chunk], tenant_ids=tenant_ids,
                             reason=reason)
            report.met += len(chunk)
            report.changed += len(changed)
            report.changed_ids.extend(changed)
            report.batches += 1
            if on_batch is not None:
                on_batch(chunk, changed)
        if len(jobs) < batch * READ_BATCHES:
            break
    report.seconds = time.perf_counter() - started
    return report


def _apply(action: str, ids: list[Any], *, tenant_ids: Any, reason: str | None) -> list[Any]:
    """One batch's statement; the ids it changed."""
    if action == "retry":
        retried = set(api.retry_many(ids, tenant_ids=tenant_ids))
        return [i for i in ids if str(i) in retried]
    if action == "cancel":
        if not api.cancel_many(ids, reason=reason):
            return []
        return list(Job.objects.filter(id__in=ids, state="cancelled")
                    .values_list("id", flat=True))
    api.delete_finished(ids, tenant_ids=tenant_ids)
    remaining = set(Job.objects.filter(id__in=ids).values_list("id", flat=True))
    return [i for i in ids if i not in remaining]
