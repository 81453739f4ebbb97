"""The functions, the aggregate and the triggers the statements rely on, as they are today.

The migrations create these objects (``django_xjobs/migrations/``), and a later migration may
replace what an earlier one made; a migration is the record of that change, this module is
where to read what runs now. Each definition is the text of the migration that last created or
replaced it (``migration``), and tests/integration/test_sql_routines.py checks it against what
``migrate`` leaves in the database (``pg_get_functiondef``, ``pg_get_triggerdef``), and that the
database holds no object of ours this module leaves out. Functions and the aggregate are named
``xjobs_*``, triggers ``x_jobs_*`` (on ``x_jobs``).

A change to one of them is a new migration that replaces it, and the new text here: the
migrations keep their own copies (a migration runs the text of its time, never this module's).
``manage.py xjobs_sql`` prints them after the statements, and ``manage.py xjobs_sql NAME`` one
of them (every form of an overloaded function).

Why functions at all: each does what one statement cannot. A statement reads through the
snapshot taken when it began, while each statement inside a VOLATILE plpgsql function takes a
fresh one (the rate budget, read after its lock); a statement cannot name a table it computes
(the history tables); a trigger follows a job's settle whichever statement makes it (an ack, a
burial, a cancel, an operator's retry).
"""

from __future__ import annotations

from ...routines import Routine

# ------------------------------------------------------------------------------- isolation --


XJOBS_REQUIRE_READ_COMMITTED = Routine(
    kind="function",
    name="xjobs_require_read_committed",
    of="text",
    migration="0010_never_stalled",
    why="""
Refuses, with SQLSTATE XJ001 and a message naming the level, a call that is exact only under
READ COMMITTED when it is made inside a REPEATABLE READ or SERIALIZABLE transaction
(docs/guarantees.md, "Isolation levels"). There the whole transaction reads one snapshot,
taken before any lock it then waits for, so a rate budget's spending could miss the units the
lock's previous holder recorded, and an event's rendezvous could miss a publish. Called by
xjobs_rate_take and event_lock; the engine turns XJ001 into IsolationLevelRefused.
""",
    sql=r"""
create or replace function xjobs_require_read_committed(p_what text) returns void
language plpgsql volatile as $fn$
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception 'django-xjobs: % needs READ COMMITTED, and this transaction is %',
                        p_what, upper(current_setting('transaction_isolation'))
              using errcode = 'XJ001',
                    hint = 'Call it outside the REPEATABLE READ or SERIALIZABLE transaction, or '
                           'in one at READ COMMITTED (docs/guarantees.md, "Isolation levels").';
    end if;
end
$fn$
""",
)


# ------------------------------------------------------------------------------ rate limits --


XJOBS_RATE_TAKE = Routine(
    kind="function",
    name="xjobs_rate_take",
    of="text[], integer[], bigint[], integer[], boolean",
    migration="0010_never_stalled",
    why="""
Spends rate-limit budget (docs/flow-control.md, "Rate limits"): request n is (key, limit,
period in ms, cost), the requests in the order given; one row per request, next_at NULL when
granted (a unit of `cost` recorded at now()), else the earliest time the key's spending in the
window leaves room for it. A function, not a statement, because it reads each key's spending
AFTER taking that key's lock: a statement reads through the snapshot taken when it began, so
units granted meanwhile by the lock's previous holder would be invisible to it, while each
statement of a VOLATILE plpgsql function takes a fresh snapshot.

Each key is locked for the rest of the transaction (an advisory lock on its hash), keys in
sorted order, so two spenders of one key are serialised and never deadlock, and the budget is
exact: a grant counts every unit recorded after now() - period, those stamped later than its
own now() included, so no window of one period ever holds more than `limit`. now() is the start
of each spender's transaction, so units are deleted only a minute after they left the window
(a transaction older than that when it spends is not exact).

`p_wait` false is the claim's (jobs_claim): a key's lock is only tried, and a key another
transaction is spending (a request's try_acquire, another claim) gives its requests a due time
a tenth of a second on instead of a wait (docs/design.md, "Lock order"). True waits for it.
""",
    sql=r"""
create or replace function xjobs_rate_take(
    p_keys text[], p_limits int[], p_periods_ms bigint[], p_costs int[], p_wait boolean)
returns table (ord bigint, next_at timestamptz)
language plpgsql volatile as $fn$
declare
    k text;
    lim int;
    per interval;
    used bigint;
    r record;
    u record;
    freed bigint;
begin
    perform xjobs_require_read_committed('spending a rate limit''s budget');
    for k in select distinct x from unnest(p_keys) as x where x is not null order by 1 loop
        if p_wait then
            perform pg_advisory_xact_lock(hashtextextended('xjobs:rate:' || k, 0));
        elsif not pg_try_advisory_xact_lock(hashtextextended('xjobs:rate:' || k, 0)) then
            -- Another transaction is spending this key (a request's try_acquire, another
            -- claim): not waited for; its jobs are due again a tenth of a second on.
            for r in select q.n from unnest(p_keys) with ordinality as q(key, n)
                      where q.key = k order by q.n loop
                ord := r.n; next_at := now() + interval '100 milliseconds';
                return next;
            end loop;
            continue;
        end if;
        select min(q.lim), max(q.per) * interval '1 millisecond' into lim, per
          from unnest(p_keys, p_limits, p_periods_ms) as q(key, lim, per) where q.key = k;
        delete from x_rate_units
         where key = k and at <= now() - per - interval '1 minute';
        select coalesce(sum(cost), 0) into used
          from x_rate_units where key = k and at > now() - per;
        for r in select q.n, q.cost
                   from unnest(p_keys, p_costs) with ordinality as q(key, cost, n)
                  where q.key = k order by q.n loop
            if used + r.cost <= lim then
                insert into x_rate_units (key, at, cost) values (k, now(), r.cost);
                used := used + r.cost;
                ord := r.n; next_at := null;
            else
                -- The unit that, once out of the window, leaves room for this cost.
                freed := 0; next_at := 'infinity';
                for u in select at, cost from x_rate_units
                          where key = k and at > now() - per order by at loop
                    freed := freed + u.cost;
                    if used - freed + r.cost <= lim then
                        next_at := u.at + per;
                        exit;
                    end if;
                end loop;
                ord := r.n;
            end if;
            return next;
        end loop;
    end loop;
end
$fn$
""",
)


XJOBS_RATE_TAKE_WAITING = Routine(
    kind="function",
    name="xjobs_rate_take",
    of="text[], integer[], bigint[], integer[]",
    migration="0010_never_stalled",
    why="""
The four-argument form, the one migration 0003 made: the waiting form of the five-argument
one. Ordinary code spends through it (rate_take: RateLimit.try_acquire and acquire wait for a
key another transaction is spending), and so does the claim of a worker of the previous
release while the fleet is mixed (docs/deployment.md, "Mixed versions").
""",
    sql=r"""
create or replace function xjobs_rate_take(
    p_keys text[], p_limits int[], p_periods_ms bigint[], p_costs int[])
returns table (ord bigint, next_at timestamptz)
language sql volatile as $fn$
    select * from xjobs_rate_take(p_keys, p_limits, p_periods_ms, p_costs, true)
$fn$
""",
)


# ---------------------------------------------------------------------------- observability --


XJOBS_ATTEMPT_PUSH = Routine(
    kind="function",
    name="xjobs_attempt_push",
    of="jsonb, jsonb",
    migration="0004_observability",
    why="""
Appends one entry to a job's attempt history, keeping the first entry and the newest 20
(docs/observability.md, "Attempt history"), so a job retried or given back without end keeps a
bounded row. The statements that end a run call it in their SET (fragments.attempt_entry_sql).
Immutable and parallel safe: it reads only its arguments.
""",
    sql=r"""
create or replace function xjobs_attempt_push(p_attempts jsonb, p_entry jsonb)
returns jsonb language sql immutable parallel safe as $fn$
    select case when jsonb_array_length(a) <= 21 then a
                else jsonb_build_array(a -> 0)
                     || (select jsonb_agg(e order by n)
                           from jsonb_array_elements(a) with ordinality as t(e, n)
                          where n > jsonb_array_length(a) - 20) end
      from (select coalesce(p_attempts, '[]'::jsonb) || jsonb_build_array(p_entry) as a) s
$fn$
""",
)


XJOBS_HIST_ADD = Routine(
    kind="function",
    name="xjobs_hist_add",
    of="bigint[], bigint[]",
    migration="0004_observability",
    why="""
Adds two histograms bucket by bucket (counts per bucket, not cumulative; NULL is the empty
histogram, docs/observability.md, "Counters"): the rollup's upsert of a minute's waits and run
times into x_stats (stats_rollup), and the step of xjobs_hist_sum.
""",
    sql=r"""
create or replace function xjobs_hist_add(p_a bigint[], p_b bigint[])
returns bigint[] language sql immutable parallel safe as $fn$
    select case when p_a is null then p_b when p_b is null then p_a
                else array(select x + y from unnest(p_a, p_b) with ordinality as t(x, y, n)
                            order by n) end
$fn$
""",
)


XJOBS_HIST_SUM = Routine(
    kind="aggregate",
    name="xjobs_hist_sum",
    of="bigint[]",
    migration="0004_observability",
    why="""
The sum of the histograms of a group of rows, bucket by bucket (xjobs_hist_add): the deltas a
rollup folds into one minute (stats_rollup), and a window's buckets when the counters are read
(stats_totals).
""",
    sql=r"""
create or replace aggregate xjobs_hist_sum(bigint[]) (sfunc = xjobs_hist_add, stype = bigint[])
""",
)


# --------------------------------------------------------------------------- history tables --
# docs/design.md, "History tables". The engine calls them by the statements of history.py.


XJOBS_HISTORY_TABLE = Routine(
    kind="function",
    name="xjobs_history_table",
    of="text, date",
    migration="0016_history_search",
    why="""
The history table of a finished state and a UTC day, x_jobs_<state>_<yyyymmdd> (a child of
x_jobs by table inheritance) with its steps' table, created on first use with the indexes a
reader of finished jobs needs (by id, by key, by run id, finished order; the console's filters
by queue, name, tenant and worker, newest first; the words of the input and the error for its
search; a step's status), and no claim index, since no row in it is live. Returns the job
table's name. A function because a statement cannot name a table it computes; two archivers
creating one day at once are serialised by an advisory lock on the table's name, and the second
finds it made.
""",
    sql=r"""
create or replace function xjobs_history_table(p_state text, p_day date) returns text
language plpgsql as $fn$
declare
    v_jobs  text := format('x_jobs_%s_%s', p_state, to_char(p_day, 'YYYYMMDD'));
    v_steps text := format('x_job_steps_%s_%s', p_state, to_char(p_day, 'YYYYMMDD'));
begin
    if p_state not in ('done', 'dead', 'cancelled') then
        raise exception 'xjobs_history_table: % is not a finished state', p_state;
    end if;
    if to_regclass(v_jobs) is not null then
        return v_jobs;
    end if;
    -- Two archivers creating the same day at once: one waits here, then finds the table.
    perform pg_advisory_xact_lock(hashtext('xjobs_history_table'), hashtext(v_jobs));
    if to_regclass(v_jobs) is not null then
        return v_jobs;
    end if;
    execute format($ddl$
        create table %1$I (check (state = %2$L)) inherits (x_jobs);
        alter table %1$I add primary key (id);
        create index %3$I on %1$I (finished_at);
        create index %4$I on %1$I (idempotency_key)
            where idempotency_key <> (id)::text;
        create index %5$I on %1$I (run_id)
            where left((run_id)::text, 13) <> left((id)::text, 13);
        create index %6$I on %1$I using brin
            (name text_bloom_ops(n_distinct_per_range = 100),
             queue text_bloom_ops(n_distinct_per_range = 100),
             tenant_id text_bloom_ops(n_distinct_per_range = 1000),
             created_at timestamptz_minmax_multi_ops, run_at timestamptz_minmax_multi_ops);
        create index %9$I on %1$I (queue, id);
        create index %10$I on %1$I (name text_pattern_ops, id);
        create index %11$I on %1$I (tenant_id, id);
        create index %12$I on %1$I (claimed_by text_pattern_ops, id);
        create index %13$I on %1$I using gin
            (jsonb_to_tsvector('simple'::regconfig, input, '["string", "numeric"]'::jsonb));
        create index %15$I on %1$I using gin (to_tsvector('simple'::regconfig, last_error))
            where last_error is not null;
        alter table %1$I set (autovacuum_vacuum_insert_scale_factor = 0.02);
        create table %7$I () inherits (x_job_steps);
        alter table %7$I add primary key (id);
        create index %8$I on %7$I (run_id);
        create index %14$I on %7$I (status, id);
        $ddl$,
        v_jobs, p_state, v_jobs || '_finished_idx', v_jobs || '_key_idx',
        v_jobs || '_run_apart_idx', v_jobs || '_brin', v_steps, v_steps || '_run_idx',
        v_jobs || '_queue_idx', v_jobs || '_name_idx', v_jobs || '_tenant_idx',
        v_jobs || '_worker_idx', v_jobs || '_input_words_idx', v_steps || '_status_idx',
        v_jobs || '_error_words_idx');
    return v_jobs;
end
$fn$
""",
)


XJOBS_ARCHIVE = Routine(
    kind="function",
    name="xjobs_archive",
    of="text, timestamp with time zone, integer",
    migration="0014_archive_floor",
    why="""
The archive without a floor (the form below with a null one): what a worker of the release
before 0014 calls, during a rolling deploy.
""",
    sql=r"""
create or replace function xjobs_archive(p_state text, p_before timestamptz, p_batch integer)
returns integer
language sql as $fn$
    select xjobs_archive(p_state, p_before, p_batch, null::timestamptz)
$fn$
""",
)


XJOBS_ARCHIVE_FROM = Routine(
    kind="function",
    name="xjobs_archive",
    of="text, timestamp with time zone, integer, timestamp with time zone",
    migration="0014_archive_floor",
    why="""
Moves one batch of a state's finished jobs, finished before p_before (and at or after p_from
when it is not null), from x_jobs into the history table of their day, with their runs' steps;
returns how many moved (jobs_archive). One day per call, the oldest, ordered by finished_at, so
history tables fill in order. SKIP LOCKED: a row an operator or a late worker write holds is
left for the next batch. A run's steps stay while another row of x_jobs has the same run id (a
resumed backfill pass reuses it). The floor: each row moved leaves a dead entry at the head of
x_jobs_finished_idx, which no vacuum removes while a long transaction holds the horizon back,
and a scan from the start of the day read them all at every batch; the maintenance passes where
its last complete pass ended, and no floor once an interval, for the rows it could not see then
(django_xjobs/maintenance/pruner.py).
""",
    sql=r"""
create or replace function xjobs_archive(p_state text, p_before timestamptz, p_batch integer,
                                         p_from timestamptz)
returns integer
language plpgsql as $fn$
declare
    v_first timestamptz;
    v_day   date;
    v_from  timestamptz;
    v_to    timestamptz;
    v_jobs  text;
    v_moved integer;
begin
    select finished_at into v_first
      from only x_jobs
     where state = p_state and state in ('done', 'dead', 'cancelled')
       and finished_at >= coalesce(p_from, '-infinity') and finished_at < p_before
     order by finished_at
     limit 1;
    if v_first is null then
        return 0;
    end if;
    v_day := (v_first at time zone 'UTC')::date;
    v_from := greatest(v_day::timestamp at time zone 'UTC', p_from);
    v_to := least(p_before, (v_day + 1)::timestamp at time zone 'UTC');
    v_jobs := xjobs_history_table(p_state, v_day);
    execute format($move$
        with victims as (
            select id, run_id
              from only x_jobs
             where state = $1 and state in ('done', 'dead', 'cancelled')
               and finished_at >= $2 and finished_at < $3
             order by finished_at
             limit $4
               for update skip locked
        ), steps_moved as (
            delete from only x_job_steps s
             where s.run_id = any(array(select v.run_id from victims v
                                         where not exists (
                                             select 1 from only x_jobs o
                                              where o.run_id = v.run_id and o.id <> v.id
                                                and (o.id between
                                                       (left(v.run_id::text, 13)
                                                        || '-0000-0000-000000000000')::uuid
                                                   and (left(v.run_id::text, 13)
                                                        || '-ffff-ffff-ffffffffffff')::uuid
                                                     or left(o.run_id::text, 13)
                                                        <> left(o.id::text, 13)))))
            returning s.*
        ), steps_kept as (
            insert into %2$I select * from steps_moved
        ), moved as (
            delete from only x_jobs j
             where j.id = any(array(select id from victims))
            returning j.*
        )
        insert into %1$I select * from moved
        $move$,
        v_jobs, replace(v_jobs, 'x_jobs_', 'x_job_steps_'))
    using p_state, v_from, v_to, p_batch;
    get diagnostics v_moved = row_count;
    return v_moved;
end
$fn$
""",
)


XJOBS_HISTORY_DROP = Routine(
    kind="function",
    name="xjobs_history_drop",
    of="text, timestamp with time zone",
    migration="0006_history",
    why="""
Drops the history tables of a state whose whole day ended before p_before, jobs and steps, one
DROP per table (history_drop): retention costs one statement per day, however many rows it
held. A short lock_timeout: a DROP waits for the readers of the table (a console page, get_job)
and, while it waits, queues the next ones; a day it cannot take at once is left for the next
run. Returns the names dropped.
""",
    sql=r"""
create or replace function xjobs_history_drop(p_state text, p_before timestamptz)
returns setof text
language plpgsql as $fn$
declare
    v_table text;
    v_steps text;
begin
    perform set_config('lock_timeout', '200ms', true);
    for v_table in
        select c.relname::text
          from pg_inherits i
          join pg_class c on c.oid = i.inhrelid
         where i.inhparent = 'x_jobs'::regclass
           and c.relname::text ~ ('^x_jobs_' || p_state || '_[0-9]{8}$')
           and (to_date(right(c.relname::text, 8), 'YYYYMMDD') + 1)::timestamp
               at time zone 'UTC' <= p_before
         order by c.relname
    loop
        v_steps := replace(v_table, 'x_jobs_', 'x_job_steps_');
        begin
            execute format('drop table if exists %I, %I', v_table, v_steps);
        exception when lock_not_available then
            continue;
        end;
        return next v_table;
    end loop;
end
$fn$
""",
)


# --------------------------------------------------------------------------------- triggers --
# A trigger follows a job's settle whichever statement makes it. Its WHEN clause reads the row
# alone, so the settles of every other job pay one test of a column or two. What it writes is
# locked first, SKIP LOCKED, by the worker's statement that fires it (fragments.settle_locks_sql),
# in the one lock order of docs/design.md, "Lock order".


XJOBS_JOB_TRANSITION = Routine(
    kind="function",
    name="xjobs_job_transition",
    of="",
    migration="0010_never_stalled",
    why="""
x_jobs_transition's body, run when a job with a parent or an idempotency window enters or
leaves a finished state (docs/durable.md, "Child jobs"), in the transaction that moved it:
- a child job: its parent's invoke step counts one child fewer (one more, on a retry); the
  last one makes the suspended parent due now and NOTIFYs its queue, so the parent resumes at
  once rather than at a poll;
- a job with a window: its key's row in x_job_keys records when it finished (NULL again on a
  retry); the window runs from there.
Locks: the parent's step row, then the parent's row, in that order; the parent's row only if no
other transaction holds it (SKIP LOCKED): a parent held elsewhere is woken by jobs_unblock at
its next poll (x_job_steps_fanin_idx). The wake is a statement of its own so that its snapshot,
taken after the wait for the step row, sees the parent's suspension committed.
""",
    sql=r"""
create or replace function xjobs_job_transition() returns trigger
language plpgsql as $fn$
declare
    v_finished boolean := new.state in ('done', 'dead', 'cancelled');
    v_pending integer;
    v_queue text;
begin
    if new.unique_for_ms is not null then
        -- A worker's statement locked this row first (SKIP LOCKED): no wait there.
        update x_job_keys
           set finished_at = case when v_finished then coalesce(new.finished_at, now()) end
         where name = new.name and tenant = coalesce(new.tenant_id, '')
           and key = new.idempotency_key and job_id = new.id;
    end if;
    if new.parent_id is not null then
        -- A worker's statement locked the step row first (SKIP LOCKED); an operator's waits
        -- while the parent holds it (checking its children), then counts.
        update only x_job_steps s
           set pending = s.pending + case when v_finished then -1 else 1 end
          from only x_jobs p
         where p.id = new.parent_id and s.run_id = p.run_id
           and s.name = new.parent_step and s.status = 'invoking'
        returning s.pending into v_pending;
        -- A statement of its own: its snapshot is taken after that wait, so it sees the
        -- parent's suspension committed. In the same statement as the count, the parent's row
        -- would be judged by the older snapshot (still running) and never woken. SKIP LOCKED:
        -- a parent row another transaction holds (a request, an operator) is not waited for;
        -- jobs_unblock wakes that parent at its next poll (x_job_steps_fanin_idx).
        if v_pending <= 0 then
            update only x_jobs
               set run_at = now(), updated_at = now()
             where id = (select id from only x_jobs
                          where id = new.parent_id and state = 'suspended'
                            for no key update skip locked)
            returning queue into v_queue;
            if v_queue is not null then
                perform pg_notify('xjobs', v_queue);
            end if;
        end if;
    end if;
    return null;
end
$fn$
""",
)


X_JOBS_TRANSITION = Routine(
    kind="trigger",
    name="x_jobs_transition",
    of="x_jobs",
    migration="0007_durable_further",
    why="""
Runs xjobs_job_transition after a job with a parent or an idempotency window enters or leaves a
finished state, whichever statement moved it (an ack, a burial, a cancel, an operator's retry).
""",
    sql=r"""
create trigger x_jobs_transition
    after update of state on x_jobs
    for each row
    when ((old.state in ('done', 'dead', 'cancelled'))
              is distinct from (new.state in ('done', 'dead', 'cancelled'))
          and (new.parent_id is not null or new.unique_for_ms is not null))
    execute function xjobs_job_transition()
""",
)


XJOBS_CRON_OVERLAP_RELEASE = Routine(
    kind="function",
    name="xjobs_cron_overlap_release",
    of="",
    migration="0010_never_stalled",
    why="""
x_jobs_cron_overlap's body (docs/scheduling.md, "Overlap"): a run buffered by
overlap="buffer_one" waits `blocked` on its task's enqueued_by; when a run of that task
finishes and no other run of the task is live but the buffered one, the buffered one is made
ready (or suspended, for a durable resume) and its queue NOTIFYed, in the transaction that
finished the run. The live-run probe repeats x_jobs_cron_live_idx's predicate, so it is that
index. A buffered run another transaction holds is skipped (SKIP LOCKED), never waited for:
jobs_unblock releases it at its next poll.
""",
    sql=r"""
create or replace function xjobs_cron_overlap_release() returns trigger
language plpgsql as $fn$
declare
    v_woken int;
begin
    if exists (select 1 from only x_jobs
                where enqueued_by = old.enqueued_by and enqueued_by like 'cron:%'
                  and state in ('ready', 'delayed', 'running', 'suspended', 'blocked')
                  and not (state = 'blocked' and blocked_on = enqueued_by)) then
        return null;
    end if;
    with woken as (
        update only x_jobs
           set state = case when blocked_resume then 'suspended' else 'ready' end,
               blocked_on = null, blocked_resume = false, updated_at = now()
         where id = any(array(
                   select id from only x_jobs
                    where enqueued_by = old.enqueued_by and enqueued_by like 'cron:%'
                      and state = 'blocked' and blocked_on = old.enqueued_by
                      for no key update skip locked))
           and state = 'blocked'
        returning queue
    )
    select count(pg_notify('xjobs', q.queue)) into v_woken
      from (select distinct queue from woken) q;
    return null;
end
$fn$
""",
)


X_JOBS_CRON_OVERLAP = Routine(
    kind="trigger",
    name="x_jobs_cron_overlap",
    of="x_jobs",
    migration="0009_cron_overlap",
    why="""
Runs xjobs_cron_overlap_release after a live run of a cron task (enqueued_by 'cron:...') enters
done, dead or cancelled, whichever statement finished it.
""",
    sql=r"""
create trigger x_jobs_cron_overlap
    after update of state on x_jobs
    for each row
    when (old.state in ('ready', 'delayed', 'running', 'suspended', 'blocked')
          and new.state in ('done', 'dead', 'cancelled')
          and old.enqueued_by like 'cron:%')
    execute function xjobs_cron_overlap_release()
""",
)
