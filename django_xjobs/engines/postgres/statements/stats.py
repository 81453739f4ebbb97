"""x_stat_deltas and x_stats: the counters (docs/observability.md, "Counters").

The statements that change a job's state insert their deltas themselves (fragments.count_sql);
these fold the deltas into per-minute, per-hour, per-day and all-time rows, prune the old
buckets, and read them. Every read adds the deltas not folded yet, in the same snapshot, so it
is exact whenever the rollup last ran.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import COUNTER_COLUMNS, histogram_ctes

# The counter columns, in the order every read returns them.
COUNTERS = ", ".join(COUNTER_COLUMNS)

_SUMS = f"""{", ".join(f"sum({c})::bigint" for c in COUNTER_COLUMNS)},
       sum(wait_ms_sum)::bigint, sum(run_ms_sum)::bigint"""
# The same, each named as its column.
_SUMS_AS = ", ".join(f"sum({c})::bigint as {c}"
                     for c in (*COUNTER_COLUMNS, "wait_ms_sum", "run_ms_sum"))

# The upsert's update of a bucket: every count and sum added to.
_ADDED = ",\n           ".join(
    f"{c} = s.{c} + excluded.{c}" for c in (*COUNTER_COLUMNS, "wait_ms_sum", "run_ms_sum"))

STATS_ROLLUP = Statement(
    "stats_rollup",
    why="""
Fold up to `batch` deltas (oldest first, past id `after_id`: a worker's rollups start past the
deltas it folded last, so a held horizon's dead deltas are not walked again and again,
counters.RollupFloor) into the minute, hour, day and all-time rows of their queue and job name,
and delete them, in one statement: a delta is counted once, in every grain,
or not yet. One rollup at a time (a transaction-scoped advisory lock, tried, not waited for:
every worker runs this duty, and two would only queue behind each other's row locks on the
same buckets). A delta inserted while this runs is not in its snapshot and waits for the next
round. Buckets are UTC (date_trunc at 'UTC'), whatever the session's time zone. The waits and
run times become histograms here (fragments.histogram_ctes): one bucket number and one hashed
count per value, never a function call per row. The answer is how many deltas were
folded, and the last id folded.
""",
    sql=f"""
with gate as (
    select pg_try_advisory_xact_lock(hashtextextended('xjobs:stats:rollup', 0)) as ok
), folded as (
    delete from x_stat_deltas d
     where d.id = any(array(select id from x_stat_deltas
                             where (select ok from gate) and id > %(after_id)s
                             order by id limit %(batch)s))
    returning d.*
), minute_rows as (
    select date_trunc('minute', at, 'UTC') as at, queue, name, wait_ms, run_ms
      from folded
), {histogram_ctes("waits", "minute_rows", "at, queue, name", "wait_ms")},
{histogram_ctes("runs", "minute_rows", "at, queue, name", "run_ms")}, minutes as (
    -- Each minute's counts, sums and histograms: the values are unnested once, here.
    select m.at, m.queue, m.name, {_SUMS_AS}, w.hist as wait_hist, r.hist as run_hist
      from (select date_trunc('minute', at, 'UTC') as at, queue, name, {COUNTERS},
                   wait_ms_sum, run_ms_sum
              from folded) m
      left join waits w using (at, queue, name)
      left join runs r using (at, queue, name)
     group by m.at, m.queue, m.name, w.hist, r.hist
), summed as (
    -- Every grain from the minutes: an hour, a day and all time add up their histograms.
    select g.grain,
           case when g.grain = 'total' then 'epoch'::timestamptz
                else date_trunc(g.grain, m.at, 'UTC') end as at,
           m.queue, m.name, {_SUMS},
           xjobs_hist_sum(m.wait_hist) as wait_hist, xjobs_hist_sum(m.run_hist) as run_hist
      from minutes m
      cross join (values ('minute'), ('hour'), ('day'), ('total')) as g(grain)
     group by 1, 2, m.queue, m.name
), stored as (
    insert into x_stats as s (grain, at, queue, name, {COUNTERS}, wait_ms_sum, run_ms_sum,
                              wait_hist, run_hist)
    select * from summed order by grain, at, queue, name
    on conflict (grain, at, queue, name) do update
       set {_ADDED},
           wait_hist   = xjobs_hist_add(s.wait_hist, excluded.wait_hist),
           run_hist    = xjobs_hist_add(s.run_hist, excluded.run_hist)
    returning 1
)
select (select count(*) from folded), (select count(*) from stored), (select max(id) from folded)
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
delta. Counts and sums only (the charts draw means; the histograms are stats_totals'): a
delta's sums were written with it, so no array is unnested here. Reads a handful of rows per
queue and bucket however big x_jobs is. Under a queue filter (`queue` not null) that queue.
""",
    sql=f"""
select at, queue, {_SUMS}, null::bigint[], null::bigint[]
  from (select at, queue, {COUNTERS}, wait_ms_sum, run_ms_sum
          from x_stats
         where grain = %(grain)s and at >= date_trunc(%(grain)s, %(since)s::timestamptz, 'UTC')
           and (%(queue)s::text is null or queue = %(queue)s::text)
        union all
        select date_trunc(%(grain)s, at, 'UTC'), queue, {COUNTERS}, wait_ms_sum, run_ms_sum
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
the `total` rows plus the deltas not folded yet, in one snapshot, their waits and run times
turned into histograms as stats_rollup does (one bucket number and one hashed count per value).
They only grow: retention deletes old minute, hour and day buckets, never these.
""",
    sql=f"""
with pending as (
    select queue, name, {COUNTERS}, wait_ms_sum, run_ms_sum, wait_ms, run_ms
      from x_stat_deltas
), {histogram_ctes("waits", "pending", "queue, name", "wait_ms")},
{histogram_ctes("runs", "pending", "queue, name", "run_ms")}
select queue, name, {_SUMS}, xjobs_hist_sum(wait_hist), xjobs_hist_sum(run_hist)
  from (select queue, name, {COUNTERS}, wait_ms_sum, run_ms_sum, wait_hist, run_hist
          from x_stats
         where grain = 'total'
        union all
        select queue, name, {COUNTERS}, wait_ms_sum, run_ms_sum, null, null
          from pending
        union all
        select queue, name, 0, 0, 0, 0, 0, 0, 0, 0, hist, null from waits
        union all
        select queue, name, 0, 0, 0, 0, 0, 0, 0, 0, null, hist from runs) s
 group by queue, name
 order by queue, name
""",
)
