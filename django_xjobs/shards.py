"""Jobs sharded by tenant over several databases (docs/scaling.md, "Sharding by tenant").

``XJOBS["SHARDS"]`` lists the aliases that hold the job tables, ``XJOBS["DATABASE"]`` (the home
shard) first; ``XJOBS["TENANT_SHARDS"]`` places tenants on them. Each shard is a whole
django-xjobs database: its own ``x_`` tables, workers, leases, scheduler leader, maintenance and
counters. Nothing crosses shards: a job, its runs, steps and children, its events, its
concurrency slots and rate-limit buckets all live on one. The services never name a shard:
they use the jobs alias in use (``conf.get().database``), which a worker pins for its process
(``xjobs_worker --shard``) and this module chooses per call:

* an enqueue goes to its tenant's shard (:func:`for_enqueue`), a child job to its parent's (the
  worker's engine writes it), an outbox row to its tenant's when the relay publishes it;
* an operation on a job id (``get_job``, ``cancel``, ``retry``...) finds the shard holding the
  job (:func:`locate`): the id says nothing of its shard, so each shard is asked in turn, the
  one in use first, until one has the row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from uuid import UUID

from django.db import DatabaseError

from . import conf
from .engines import get_engine

T = TypeVar("T")


def sharded() -> bool:
    """Whether the jobs are sharded (``XJOBS["SHARDS"]`` is set)."""
    return bool(conf.get().shards)


def all_shards() -> tuple[str, ...]:
    """Every jobs alias: the shards, home first, or the one database."""
    return conf.get().job_databases


@contextmanager
def for_tenant(tenant_id: str | None) -> Iterator[str]:
    """Within the block the jobs alias in use is ``tenant_id``'s shard (no change when the
    jobs are not sharded); yields it."""
    settings = conf.get()
    if not settings.shards:
        yield settings.database
        return
    alias = conf.shard_for_tenant(tenant_id)
    with conf.using_database(alias):
        yield alias


def locate(job_id: UUID | str) -> str | None:
    """The shard holding job ``job_id`` (in ``x_jobs`` or its history tables), or None. Not
    sharded: the one database, unread."""
    settings = conf.get()
    if not settings.shards:
        return settings.database
    found = first(lambda: get_engine().job_get(str(job_id)))
    return found[0] if found else None


def first(call: Callable[[], T | None]) -> tuple[str, T] | None:
    """``call()`` on each shard in turn, the one in use first, until one returns something:
    that shard and what it returned; None when none did. A shard that cannot be read is passed
    over: its error is raised only if no other shard had the answer (the job may be there)."""
    settings = conf.get()
    current = settings.database if settings.database in settings.shards else None
    order = ([current] if current else []) + [a for a in settings.shards if a != current]
    unreadable: DatabaseError | None = None
    for alias in order:
        try:
            with conf.using_database(alias):
                result = call()
        except DatabaseError as exc:
            unreadable = unreadable or exc
            continue
        if result is not None:
            return alias, result
    if unreadable is not None:
        raise unreadable
    return None


def each_shard(call: Callable[[], T]) -> dict[str, T]:
    """``call()`` once per shard (once on the one database when not sharded), with that shard
    in use: alias -> result. A shard that fails stops the loop with its error: the calls made
    so far are done (each is its own transaction)."""
    results: dict[str, T] = {}
    for alias in all_shards():
        with conf.using_database(alias):
            results[alias] = call()
    return results


def group_by_shard(items: list[Any], tenant_of: Callable[[Any], str | None]
                   ) -> dict[str, list[int]]:
    """The positions of ``items`` per shard of their tenant, in order (one group, the alias in
    use, when not sharded)."""
    settings = conf.get()
    if not settings.shards:
        return {settings.database: list(range(len(items)))}
    groups: dict[str, list[int]] = {}
    for n, item in enumerate(items):
        groups.setdefault(conf.shard_for_tenant(tenant_of(item)), []).append(n)
    return groups
