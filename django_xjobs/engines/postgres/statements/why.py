"""Why a job is not running: the reads behind ``manage.py xjobs why``, ``JobRecord.blocked_by``
and the console's "Why it is not running" panel (django_xjobs/why.py decides; these read).

Both only read. Pauses, slots and workers are compared with ``now()``, the clock the claim that
honours them uses, so the answer is the claim's own view of the job at that moment.
"""

from __future__ import annotations

from ...base import Statement

WHY_JOB = Statement(
    "why_job",
    why="""
One job's row as it is now, with every flow-control row that can hold it back, in one
statement so they are one snapshot: the pauses in force (until NULL or later than now()) for
its queue and for its concurrency and rate-limit keys, the live holders of its concurrency
key's slots (a lapsed slot is free, whoever it names), and whether any worker that serves its
queue was seen in the last 5 minutes (x_workers.queues holds the queue names as a JSON list),
and, while it waits for a worker that knows its name, since when and which workers gave it back
(job_give_back_unknown_if_owned).
Under a tenant scope a job of another tenant is not found, like job_get.
""",
    sql="""
select j.id, j.name, j.queue, j.state, j.run_at, j.attempt, j.last_error, j.concurrency_key,
       j.rate_key, j.blocked_on, now(),
       coalesce((select jsonb_agg(jsonb_build_array(p.kind, p.key, p.until, p.reason)
                                  order by p.kind desc, p.key)
                   from x_flow_pauses p
                  where (p.until is null or p.until > now())
                    and ((p.kind = 'queue' and p.key = j.queue)
                      or (p.kind = 'key' and p.key in (j.concurrency_key, j.rate_key)))),
                '[]'::jsonb)::text,
       coalesce((select array_agg(l.holder order by l.slot)
                   from x_job_leases l
                  where l.lease_key = j.concurrency_key and l.expires_at > now()),
                '{}'::text[]),
       exists (select 1 from x_workers w
                where w.queues ? j.queue and w.seen_at > now() - interval '5 minutes'),
       case when j.attempts->-1->>'outcome' = 'unknown_job' then j.unknown_since end,
       case when j.attempts->-1->>'outcome' = 'unknown_job'
            then (j.attempts->-1->'workers')::text end,
       j.enqueued_by
  from x_jobs j
 where j.id = %(id)s
   and (%(tenant_ids)s::text[] is null or j.tenant_id = any(%(tenant_ids)s::text[]))
""",
)

WHY_RATE_WINDOW = Statement(
    "why_rate_window",
    why="""
A rate-limit key's spending over the last period and, when `cost` more does not fit under
`limit`, the moment it will: the unit (oldest first) whose leaving the window frees enough, plus
one period. The same arithmetic as xjobs_rate_take's refusal, without its lock and without
recording anything: units granted after this snapshot can only move that moment later.
next_at is NULL when the cost fits now, or never fits (a cost above the limit).
""",
    sql="""
with u as (
    select at, sum(cost) over (order by at, id) as freed
      from x_rate_units
     where key = %(key)s and at > now() - %(period_ms)s::bigint * interval '1 millisecond'
), spent as (
    select coalesce(max(freed), 0) as total from u
)
select s.total,
       case when s.total + %(cost)s::int <= %(limit)s::int then null
            else (select min(u.at) from u where s.total - u.freed + %(cost)s::int <= %(limit)s::int)
                 + %(period_ms)s::bigint * interval '1 millisecond'
       end
  from spent s
""",
)
