"""x_workers: the worker processes seen lately (docs/flow-control.md, "Why is a job not
running?"; docs/observability.md, "Workers and health probes"). A worker writes its row when it
starts and with its heartbeat, and deletes it when it stops; a crashed worker's row just ages.
"""

from __future__ import annotations

from ...base import Statement

WORKER_SEEN = Statement(
    "worker_seen",
    why="""
Upsert a worker's row: it is alive and serves these queues now (the database clock). Sent at
start and then every XJOBS["WORKER_SEEN_INTERVAL"] from the heartbeat thread, never per job, so
the table is one row per process and its writes are a handful per minute. `xjobs why` reads it
to say that no worker served a job's queue lately; `xjobs workers` and `xjobs health` read what
it reports. The moments of the loop's last claim and last round arrive as ages in milliseconds
(the worker's monotonic clock) and become times here, on the database clock: a worker whose
wall clock is wrong cannot make itself look healthy or stalled. A NULL age (it never claimed)
stays NULL.
""",
    sql="""
insert into x_workers (id, host, pid, queues, started_at, seen_at, version, concurrency,
                       running, finished, claimed_at, loop_at)
values (%(worker_id)s, %(host)s, %(pid)s::int, %(queues)s::jsonb, now(), now(), %(version)s,
        %(concurrency)s::int, %(running)s::int, %(finished)s::bigint,
        now() - %(claimed_age_ms)s::bigint * interval '1 millisecond',
        now() - %(loop_age_ms)s::bigint * interval '1 millisecond')
on conflict (id) do update
   set queues = excluded.queues, seen_at = now(), version = excluded.version,
       concurrency = excluded.concurrency, running = excluded.running,
       finished = excluded.finished, claimed_at = excluded.claimed_at,
       loop_at = excluded.loop_at
""",
)

WORKER_GONE = Statement(
    "worker_gone",
    why="""
Delete a worker's row when it stops cleanly, so a queue it no longer serves reads as unserved
at once rather than five minutes later. Rows of crashed workers age out of every read (they
look at seen_at) and are deleted by this same statement's `stale_ms` clause on the next clean
stop of any worker.
""",
    sql="""
delete from x_workers
 where id = %(worker_id)s
    or seen_at < now() - %(stale_ms)s::bigint * interval '1 millisecond'
""",
)

WORKERS_LIST = Statement(
    "workers_list",
    why="""
Every worker seen in the last day, with whether it is stalled, judged on the database clock
against `stall_ms` in this order (the first that holds is the reason):

- `heartbeat`: its row is older than stall_ms: the process stopped (SIGSTOP, a frozen VM) or
  its heartbeat thread hangs;
- `loop`: at its last heartbeat its loop had not gone round for stall_ms (seen_at - loop_at:
  the worker measured that age itself, so the time since the row was written is not counted
  twice): the loop is wedged while the heartbeat thread still runs;
- `claim`: it had room (running < concurrency), claimed nothing for stall_ms (since it started,
  if it never claimed) while one of its queues had a job due for stall_ms. Due as the claim
  reads it: ready, delayed or suspended with run_at passed, in a queue no pause holds (held
  jobs are blocked or delayed into the future, so they are not due). The oldest due job of a
  queue is found as the claim finds jobs: per priority (a skip scan of x_jobs_claim_idx), the
  first run_at of each, never a walk over every due row; once per queue, not per worker.

Rows older than a day are left out: their workers are gone (a clean stop deletes its row;
worker_gone deletes the rest).
""",
    sql="""
with w as (
    select id, host, pid, queues, version, concurrency, running, finished, started_at,
           seen_at, claimed_at, loop_at
      from x_workers
     where seen_at > now() - interval '1 day'
), due as (
    select q.queue, d.since
      from (select distinct jsonb_array_elements_text(queues) as queue from w) q
      cross join lateral (
          with recursive prio(p) as (
              (select priority from only x_jobs
                where queue = q.queue and state in ('ready', 'delayed', 'suspended')
                order by priority desc limit 1)
              union all
              select (select priority from only x_jobs
                       where queue = q.queue and state in ('ready', 'delayed', 'suspended')
                         and priority < prio.p
                       order by priority desc limit 1)
                from prio where prio.p is not null)
          select min(f.run_at) as since
            from prio
            cross join lateral (
                select run_at from only x_jobs
                 where queue = q.queue and state in ('ready', 'delayed', 'suspended')
                   and priority = prio.p
                 order by run_at limit 1) f
           where prio.p is not null
      ) d
     where d.since <= now() - %(stall_ms)s::bigint * interval '1 millisecond'
       and not exists (select 1 from x_flow_pauses p
                        where p.kind = 'queue' and p.key = q.queue
                          and (p.until is null or p.until > now()))
)
select w.id, w.host, w.pid, array(select jsonb_array_elements_text(w.queues)), w.version,
       w.concurrency, w.running, w.finished, w.started_at, w.seen_at, w.claimed_at, w.loop_at,
       s.kind, s.age_ms, s.queue, s.since
  from w
  left join lateral (
      select 1 as rank, 'heartbeat' as kind,
             extract(epoch from now() - w.seen_at) * 1000 as age_ms,
             null::text as queue, null::timestamptz as since
       where w.seen_at < now() - %(stall_ms)s::bigint * interval '1 millisecond'
      union all
      select 2, 'loop', extract(epoch from now() - w.loop_at) * 1000, null, null
       where w.seen_at - w.loop_at > %(stall_ms)s::bigint * interval '1 millisecond'
      union all
      (select 3, 'claim', extract(epoch from now() - coalesce(w.claimed_at, w.started_at)) * 1000,
              d.queue, d.since
         from due d
        where w.running < w.concurrency
          and coalesce(w.claimed_at, w.started_at)
              < now() - %(stall_ms)s::bigint * interval '1 millisecond'
          and w.queues ? d.queue
        order by d.since, d.queue
        limit 1)
      order by rank
      limit 1
  ) s on true
 order by w.host, w.pid, w.id
""",
)


HORIZON_AGE = Statement(
    "horizon_age",
    why="""
How far back this database's horizon is held, in transaction ids: the oldest snapshot or
transaction id of this database's backends (autovacuum's own left out: PostgreSQL ignores them
for the horizon), of a replica's feedback (pg_stat_replication.backend_xmin), of a replication
slot and of a prepared transaction. Every transaction id younger than it may have left row
versions and index entries that cannot be removed or marked dead yet, and a scan from the start
of the claim's ranges walks them; a worker's claims start from floors while it is large
(worker/floors.py; docs/performance.md, "Under a held horizon"). Every role sees every
session's backend_xmin and backend_xid; the backend type of another role's session only with
pg_read_all_stats (NULL otherwise, so an autovacuum worker then counts too).
""",
    sql="""
select greatest(
    (select max(greatest(age(a.backend_xmin), age(a.backend_xid)))
       from pg_stat_activity a
      where a.datname = current_database()
        and coalesce(a.backend_type, '') not like 'autovacuum%%'),
    (select max(age(r.backend_xmin)) from pg_stat_replication r),
    (select max(age(s.xmin)) from pg_replication_slots s
      where s.xmin is not null and (s.database is null or s.database = current_database())),
    (select max(age(p.transaction)) from pg_prepared_xacts p
      where p.database = current_database()),
    0)::bigint
""",
)
