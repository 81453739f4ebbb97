"""x_workers: the worker processes seen lately (docs/flow-control.md, "Why is a job not
running?"). A worker writes its row when it starts and with its heartbeat, and deletes it when
it stops; a crashed worker's row just ages.
"""

from __future__ import annotations

from ...base import Statement

WORKER_SEEN = Statement(
    "worker_seen",
    why="""
Upsert a worker's row: it is alive and serves these queues now (the database clock). Sent at
start and then every few heartbeat rounds, never per job, so the table is one row per process
and its writes are a handful per minute. `xjobs why` reads it to say that no worker served a
job's queue lately.
""",
    sql="""
insert into x_workers (id, host, pid, queues, started_at, seen_at)
values (%(worker_id)s, %(host)s, %(pid)s::int, %(queues)s::jsonb, now(), now())
on conflict (id) do update
   set queues = excluded.queues, seen_at = now()
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
