"""The soak's two tables, the only SQL of its own (docs/soak.md, "What it leaves behind").

``x_soak_ledger`` is what the producers believe they did: every enqueue they committed, rolled
back or staged, written in the same transaction as the enqueue (a rolled-back one after its
rollback), and every cancel with the database time of its request. ``x_soak_effects`` is what
the job bodies did, written in autocommit at the start and end of every run, so a run's evidence
survives the loss of its acknowledgement. Both carry the soak's tag; the soak deletes its rows
when it ends and drops the tables when no other soak's rows are left. Everything else the checks
read is the queue's own tables, through their models.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from .. import conf

CREATE = (
    """create table if not exists x_soak_ledger (
        id bigserial primary key,
        soak text not null,
        job_id uuid not null,
        kind text not null,
        outcome text not null,
        changed boolean,
        attempt integer,
        at timestamptz not null default clock_timestamp())""",
    """create table if not exists x_soak_effects (
        id bigserial primary key,
        soak text not null,
        job_id uuid not null,
        attempt integer not null,
        kind text not null,
        tag text not null,
        pid integer not null,
        at timestamptz not null default clock_timestamp())""",
    "create index if not exists x_soak_effects_job_idx on x_soak_effects (job_id)",
    # A table left by an older soak killed outright (they are dropped when unused).
    "alter table x_soak_ledger add column if not exists attempt integer",
)


def name_session(soak: str, role: str) -> None:
    """Name this thread's connection ``xjobs_soak:<soak>:<role>`` when it connects (as a
    worker's are): behind a transaction pooler a client that sets no name gets whatever name the
    server connection it is lent carries, a worker's say, and the chaos, which finds a worker's
    sessions by name, would terminate it (docs/soak.md, "The invariants")."""
    from ..engines import get_engine  # a soak thread's, at its start

    get_engine().name_session(f"xjobs_soak:{soak}:{role}")


def alias() -> str:
    """The database of the job tables (``XJOBS["DATABASE"]``): the ledger shares the enqueue's
    transaction there."""
    return conf.get().database


def _execute(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connections[alias()].cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []


def create() -> None:
    for sql in CREATE:
        _execute(sql)


def drop_unless_used(soak: str) -> bool:
    """Delete ``soak``'s rows; drop both tables when no other soak has rows left. True when
    dropped."""
    _execute("delete from x_soak_ledger where soak = %s", [soak])
    _execute("delete from x_soak_effects where soak = %s", [soak])
    others = _execute("select exists (select 1 from x_soak_ledger) "
                      "or exists (select 1 from x_soak_effects)")[0][0]
    if not others:
        _execute("drop table if exists x_soak_ledger, x_soak_effects")
    return not others


def effect(soak: str, job_id: Any, attempt: int, kind: str, tag: str, pid: int) -> None:
    """A job body's evidence, in autocommit on the body's thread's connection."""
    _execute("insert into x_soak_effects (soak, job_id, attempt, kind, tag, pid)"
             " values (%s, %s, %s, %s, %s, %s)", [soak, str(job_id), attempt, kind, tag, pid])


def ledger(soak: str, job_id: Any, kind: str, outcome: str, changed: bool | None = None,
           attempt: int | None = None) -> None:
    """A producer's record; inside the enqueue's transaction when there is one. A cancel's
    row says whether it changed the job and the job's attempt right after it."""
    _execute("insert into x_soak_ledger (soak, job_id, kind, outcome, changed, attempt)"
             " values (%s, %s, %s, %s, %s, %s)",
             [soak, str(job_id), kind, outcome, changed, attempt])


def ledger_rows(soak: str) -> list[tuple[Any, ...]]:
    """(job_id, kind, outcome, changed, attempt, at) of every ledger row, in order."""
    return _execute("select job_id, kind, outcome, changed, attempt, at from x_soak_ledger"
                    " where soak = %s order by id", [soak])


def effect_rows(soak: str) -> list[tuple[Any, ...]]:
    """(job_id, attempt, kind, tag, pid, at) of every effect, in order."""
    return _execute("select job_id, attempt, kind, tag, pid, at from x_soak_effects"
                    " where soak = %s order by id", [soak])
