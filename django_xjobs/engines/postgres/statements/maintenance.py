"""Retention deletes and the health of the tables and of the server.

The bounded purges the pruner loops over (finished jobs, expired events, relayed outbox rows),
the console's one queue write (deleting finished jobs an operator picked), and its monitoring
reads of the tables and of what holds VACUUM back.
"""

from __future__ import annotations

from ...base import Statement

# ------------------------------------------------------------------------------- retention --

def _purge_sql(table: str) -> str:
    """The text of jobs_purge on ``only x_jobs`` or, for jobs_purge_all, ``x_jobs`` and its
    history tables."""
    return f"""
with victims as (
    select j.id, j.run_id
      from unnest(%(states)s::text[]) as s(state)
      cross join lateral (
          select id, run_id, finished_at
            from {table}
           where state = s.state and state in ('done', 'dead', 'cancelled')
             and finished_at < %(before)s
           order by finished_at
           limit %(batch)s
             for update skip locked
      ) j
     order by j.finished_at
     limit %(batch)s
), steps as (
    delete from x_job_steps s where s.run_id = any(array(select run_id from victims))
)
delete from {table} j where j.id = any(array(select id from victims))
"""


JOBS_PURGE = Statement(
    "jobs_purge",
    why="""
Delete finished jobs of the given states that finished before a cutoff from x_jobs itself (not
its history tables, which retention drops a day at a time: history_drop), one bounded batch per
call (the caller loops), so retention never holds long locks on the hot table. Driven by the
partial index on finished rows; SKIP LOCKED so it never waits behind a worker. The run's steps go
with it (steps are keyed by run_id, which a job keeps for life).

One ordered scan of the (state, finished_at) index per state: `state = any(...)` over the index
cannot return rows in finished_at order, and the planner would read and sort every finished
row for each batch (docs/performance.md, "What the simpler forms cost"). The deletes reach their
rows through arrays of keys, so no plan can hash-join the whole tables. Up to `batch` rows per state
are locked while a batch is chosen; the unchosen ones are released at commit.
""",
    sql=_purge_sql("only x_jobs"),
)

JOBS_PURGE_ALL = Statement(
    "jobs_purge_all",
    why="""
jobs_purge over x_jobs AND its history tables: `manage.py xjobs purge --older-than` and
`api.purge`, an operator's exact cut at any moment (retention drops whole days instead). Each
history table orders its rows by its finished_at index, so the batch is a merge of one ordered
index scan per table.
""",
    sql=_purge_sql("x_jobs"),
)

EVENTS_PURGE = Statement(
    "events_purge",
    why="Delete expired events, one bounded batch per call (the caller loops).",
    sql="""
delete from x_job_events
 where id = any(array(select id from x_job_events where expires_at <= now()
                       order by expires_at limit %(batch)s))
""",
)

OUTBOX_PURGE_PUBLISHED = Statement(
    "outbox_purge_published",
    why="""
Delete relayed outbox rows published before a cutoff, one bounded batch per call (the caller
loops), so retention never holds long locks on a table every enqueue_on_commit writes. Driven
by the partial index on published rows; pending rows (published_at null) are never touched.
SKIP LOCKED: a row the relay still holds is left for the next batch.
""",
    sql="""
delete from x_outbox
 where id = any(array(select id from x_outbox
                       where published_at is not null and published_at < %(before)s
                       order by published_at
                       limit %(batch)s
                         for update skip locked))
""",
)

LEASE_EXTENSIONS_PURGE = Statement(
    "lease_extensions_purge",
    why="""
Delete the leases kept beside held rows (x_lease_extensions, written by jobs_renew_if_owned)
that ended more than a minute ago, one bounded batch per call (the caller loops). An ended
extension protects nothing: the claim reads only those still running, and the minute leaves a
claim whose transaction began earlier no reason to find one gone. The table holds a row per run
whose row was held at a heartbeat, so it is small; SKIP LOCKED, a row a heartbeat is writing is
left for the next batch.
""",
    sql="""
delete from x_lease_extensions
 where lease_token = any(array(select lease_token from x_lease_extensions
                                where until < now() - interval '1 minute'
                                limit %(batch)s
                                  for update skip locked))
""",
)

# --------------------------------------------------------------------------------- console --
# The operations console (django_xjobs/console/): its one queue write and the health reads of
# its dashboard.

JOBS_DELETE_FINISHED = Statement(
    "jobs_delete_finished",
    why="""
The console's "delete finished jobs" on rows an operator picked: only `done`, `dead` and
`cancelled` rows go (a live job is a worker's business: cancel it first), with their steps.
The state test is re-checked on the locked row, so a job retried while the operator confirmed
is not deleted. SKIP LOCKED: a row a retry or a worker holds is skipped, never waited for.
Under a tenant scope another tenant's ids match nothing.
""",
    sql="""
with victims as (
    select id, run_id
      from x_jobs
     where id = any(%(ids)s::uuid[])
       and state in ('done', 'dead', 'cancelled')
       and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
       for update skip locked
), steps as (
    delete from x_job_steps s using victims v where s.run_id = v.run_id
)
delete from x_jobs j using victims v where j.id = v.id
""",
)

TABLES_HEALTH = Statement(
    "tables_health",
    why="""
Dead tuples and transaction-id age of the eight x_ tables: what takes a PostgreSQL queue down.
Every claim and ack leaves a dead row version; when VACUUM cannot keep up (or an old snapshot
stops it, see xmin_horizon) claims scan ever more dead index entries and slow down. xid age is
age(relfrozenxid) of the table or its TOAST table, whichever is older: at
autovacuum_freeze_max_age an anti-wraparound vacuum starts, and near 2^31 the server refuses
writes. Names go through to_regclass so a table that is missing reads as absent, not an error.
""",
    sql="""
select t.name, coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       greatest(s.last_vacuum, s.last_autovacuum), greatest(s.last_analyze, s.last_autoanalyze),
       greatest(age(c.relfrozenxid), coalesce(age(toast.relfrozenxid), 0)),
       current_setting('autovacuum_freeze_max_age')::bigint,
       pg_total_relation_size(c.oid)
  from unnest(array['x_jobs', 'x_job_steps', 'x_job_events', 'x_outbox', 'x_job_leases',
                    'x_scheduler_leader', 'x_scheduler_state', 'x_backfills']) as t(name)
  join pg_class c on c.oid = to_regclass(t.name)
  left join pg_class toast on toast.oid = c.reltoastrelid
  left join pg_stat_user_tables s on s.relid = c.oid
 order by t.name
""",
)

XMIN_HORIZON = Statement(
    "xmin_horizon",
    why="""
What holds back VACUUM on this database, oldest first: open transactions (an `idle in
transaction` session, a long report, a stuck migration), replication slots whose xmin does not
move (a standby or a consumer that went away), and forgotten prepared transactions. While one of
them holds an old snapshot, no dead row version younger than it can be removed, however often
autovacuum runs, and the queue tables bloat. Only this database's backends count (PostgreSQL 14+
ignores other databases' snapshots for our tables); the console's own backend is left out.
A transaction's horizon is the older of its snapshot (backend_xmin, none between statements
of a read-committed transaction) and its own transaction id (backend_xid, once it wrote).
""",
    sql="""
select * from (
    select 'transaction' as kind,
           coalesce(nullif(a.application_name, ''), a.usename::text, 'backend') as name,
           a.pid, a.state, a.xact_start,
           extract(epoch from now() - a.xact_start)::float8 as age_seconds,
           greatest(age(a.backend_xmin), age(a.backend_xid))::bigint as xmin_age,
           left(a.query, 500) as query
      from pg_stat_activity a
     where a.datname = current_database() and a.pid <> pg_backend_pid()
       and (a.xact_start is not null or a.backend_xmin is not null
            or a.backend_xid is not null)
    union all
    select 'replication slot', r.slot_name::text, r.active_pid,
           case when r.active then 'active' else 'inactive' end, null, null,
           age(r.xmin)::bigint, null
      from pg_replication_slots r
     where r.xmin is not null and (r.database is null or r.database = current_database())
    union all
    select 'prepared transaction', p.gid, null, 'prepared', p.prepared,
           extract(epoch from now() - p.prepared)::float8, age(p.transaction)::bigint, null
      from pg_prepared_xacts p
     where p.database = current_database()
) h
 order by h.xmin_age desc nulls last, h.age_seconds desc nulls last
 limit %(limit)s
""",
)
