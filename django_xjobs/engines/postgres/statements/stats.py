"""x_stat_deltas and x_stats: the counters (docs/observability.md, "Counters").

The statements that change a job's state insert their deltas themselves (fragments.count_sql);
these fold the deltas into per-minute, per-hour, per-day and all-time rows, prune the old
buckets, and read them. Every read adds the deltas not folded yet, in the same snapshot, so it
is exact whenever the rollup last ran.
"""

from __future__ import annotations

from ...base import Statement

# The counter columns, in the order every read returns them.
COUNTERS = "enqueued, started, done, failed, dead, cancelled"

# Each delta row with its sums and histograms worked out once (a folded or pending delta).
_DELTA_FIGURES = f"""{COUNTERS},
           (select coalesce(sum(v), 0) from unnest(wait_ms) as v)::bigint as wait_ms_sum,
           (select coalesce(sum(v), 0) from unnest(run_ms) as v)::bigint as run_ms_sum,
           xjobs_hist(wait_ms) as wait_hist, xjobs_hist(run_ms) as run_hist"""

_SUMS = """sum(enqueued)::bigint, sum(started)::bigint, sum(done)::bigint, sum(failed)::bigint,
       sum(dead)::bigint, sum(cancelled)::bigint, sum(wait_ms_sum)::bigint,
       sum(run_ms_sum)::bigint, xjobs_hist_sum(wait_hist), xjobs_hist_sum(run_hist)"""

STATS_ROLLUP = Statement(
    "stats_rollup",
    why="""
Fold up to `batch` deltas (oldest first) into the minute, hour, day and all-time rows of their
queue and job name, and delete them, in one statement: a delta is counted once, in every grain,
or not yet. One rollup at a time (a transaction-scoped advisory lock, tried, not waited for:
every worker runs this duty, and two would only queue behind each other's row locks on the
same buckets). A delta inserted while this runs is not in its snapshot and waits for the next
round. Buckets are UTC (date_trunc at 'UTC'), whatever the session's time zone. The answer is
how many deltas were folded.
""",
    sql=f"""
with gate as (
    select pg_try_advisory_xact_lock(hashtextextended('xjobs:stats:rollup', 0)) as ok
), folded as (
    delete from x_stat_deltas d
     where d.id = any(array(select id from x_stat_deltas
                             where (select ok from gate)
                             order by id limit %(batch)s))
    returning d.*
), figures as (
    select at, queue, name, {_DELTA_FIGURES}
      from folded
), bucketed as (
    select g.grain,
           case when g.grain = 'total' then 'epoch'::timestamptz
                else date_trunc(g.grain, f.at, 'UTC') end as at,
           f.queue, f.name, f.enqueued, f.started, f.done, f.failed, f.dead, f.cancelled,
           f.wait_ms_sum, f.run_ms_sum, f.wait_hist, f.run_hist
      from figures f
      cross join (values ('minute'), ('hour'), ('day'), ('total')) as g(grain)
), stored as (
    insert into x_stats as s (grain, at, queue, name, {COUNTERS}, wait_ms_sum, run_ms_sum,
                              wait_hist, run_hist)
    select grain, at, queue, name, {_SUMS}
      from bucketed
     group by grain, at, queue, name
     order by grain, at, queue, name
    on conflict (grain, at, queue, name) do update
       set enqueued    = s.enqueued + excluded.enqueued,
           started     = s.started + excluded.started,
           done        = s.done + excluded.done,
           failed      = s.failed + excluded.failed,
           dead        = s.dead + excluded.dead,
           cancelled   = s.cancelled + excluded.cancelled,
           wait_ms_sum = s.wait_ms_sum + excluded.wait_ms_sum,
           run_ms_sum  = s.run_ms_sum + excluded.run_ms_sum,
           wait_hist   = xjobs_hist_add(s.wait_hist, excluded.wait_hist),
           run_hist    = xjobs_hist_add(s.run_hist, excluded.run_hist)
    returning 1
)
select (select count(*) from folded), (select count(*) from stored)
""",
)

STATS_PRUNE = Statement(
    "stats_prune",
    why="""
Delete the buckets older than their grain's retention (minutes, hours, days; the all-time rows
stay), one bounded batch per call (the caller loops). Through the (grain, at, ...) unique index.
""",
    sql="""
delete from x_stats
 where id = any(array(
           select s.id
             from (values ('minute', %(minute_ms)s::bigint), ('hour', %(hour_ms)s::bigint),
                          ('day', %(day_ms)s::bigint)) as k(grain, keep_ms)
             cross join lateral (
                 select id from x_stats
                  where grain = k.grain and at < now() - k.keep_ms * interval '1 millisecond'
                  limit %(batch)s) s
            limit %(batch)s))
""",
)

STATS_SERIES = Statement(
    "stats_series",
    why="""
The counters of each queue per bucket of `grain` (minute, hour or day) from `since` on: the
console's charts and its queue table's finished counts. The folded rows plus the deltas not
folded yet, summed in one snapshot, so a rollup running meanwhile neither hides nor doubles a
delta. Reads a handful of rows per queue and bucket however big x_jobs is. Under a queue filter
(`queue` not null) only that queue.
""",
    sql=f"""
select at, queue, {_SUMS}
  from (select at, queue, {COUNTERS}, wait_ms_sum, run_ms_sum, wait_hist, run_hist
          from x_stats
         where grain = %(grain)s and at >= date_trunc(%(grain)s, %(since)s::timestamptz, 'UTC')
           and (%(queue)s::text is null or queue = %(queue)s::text)
        union all
        select date_trunc(%(grain)s, at, 'UTC'), queue, {_DELTA_FIGURES}
          from x_stat_deltas
         where at >= date_trunc(%(grain)s, %(since)s::timestamptz, 'UTC')
           and (%(queue)s::text is null or queue = %(queue)s::text)) s
 group by at, queue
 order by at, queue
""",
)

STATS_TOTALS = Statement(
    "stats_totals",
    why="""
The all-time counters per queue and job name (what Prometheus counters and histograms read):
the `total` rows plus the deltas not folded yet, in one snapshot. They only grow: retention
deletes old minute, hour and day buckets, never these.
""",
    sql=f"""
select queue, name, {_SUMS}
  from (select queue, name, {COUNTERS}, wait_ms_sum, run_ms_sum, wait_hist, run_hist
          from x_stats
         where grain = 'total'
        union all
        select queue, name, {_DELTA_FIGURES}
          from x_stat_deltas) s
 group by queue, name
 order by queue, name
""",
)
