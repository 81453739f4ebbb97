"""Never stalled by the application (docs/design.md, "Lock order"): no worker statement waits on
a row lock another transaction holds, and every multi-row statement locks in one order.

* ``x_lease_extensions``: a running job's lease kept beside its row while another transaction
  holds the row (the heartbeat skips a locked row instead of waiting for it); the claim takes no
  lapsed lease whose extension still runs.
* ``xjobs_require_read_committed(what)``: refuses, with a message naming the level, a call that
  is exact only under READ COMMITTED (a rate budget's spending, an event's rendezvous) inside a
  REPEATABLE READ or SERIALIZABLE transaction (docs/guarantees.md, "Isolation levels").
* ``xjobs_rate_take(keys, limits, periods, costs, wait)``: the claim's spending (``wait`` false)
  takes a key's lock only if it is free, and gives the jobs of a key another transaction is
  spending a due time a tenth of a second on instead of waiting; ordinary code still waits. The
  four-argument form (what 0003 made, and what a worker of the previous release calls) is now
  the waiting form of this one.
* The triggers ``x_jobs_transition`` and ``x_jobs_cron_overlap`` wake a parent, or release a
  buffered cron run, only if no other transaction holds its row: they skip it rather than make
  the settling statement wait, and ``jobs_unblock`` wakes what they skipped. The rows they count
  down or record (a parent's step row, a window's key row) are locked by the worker's statement
  before it changes the job, SKIP LOCKED (fragments.settle_locks_sql).
"""

import importlib

from django.db import migrations, models

from django_xjobs.migrations._online import Once, RunDDL

REQUIRE_READ_COMMITTED = r"""
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
$fn$;
"""

# xjobs_rate_take as migration 0003 made it (docs/flow-control.md, "Rate limits"), with `p_wait`
# and the isolation check. The lock of a key is an advisory lock for the rest of the
# transaction, keys in sorted order; a claim (p_wait false) only tries it.
RATE_TAKE = r"""
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
$fn$;

create or replace function xjobs_rate_take(
    p_keys text[], p_limits int[], p_periods_ms bigint[], p_costs int[])
returns table (ord bigint, next_at timestamptz)
language sql volatile as $fn$
    select * from xjobs_rate_take(p_keys, p_limits, p_periods_ms, p_costs, true)
$fn$;
"""

# The reverse of each: the text the earlier migration installed (and, for the rate take, the
# five-argument form dropped first).
def _earlier(migration: str, name: str) -> str:
    return getattr(importlib.import_module(f"django_xjobs.migrations.{migration}"), name)


RATE_TAKE_REVERSE = ("drop function if exists xjobs_rate_take(text[], int[], bigint[], int[],"
                     " boolean);\n" + _earlier("0003_flow_control", "RATE_TAKE") + ";")

# x_jobs_transition as migration 0007 made it, the parent's wake-up skipping a parent row
# another transaction holds.
TRANSITION = r"""
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
$fn$;
"""

TRANSITION_REVERSE = _earlier("0007_durable_further", "TRANSITION")

# x_jobs_cron_overlap as migration 0009 made it, the release skipping a buffered run another
# transaction holds (jobs_unblock releases it then).
RELEASE = r"""
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
$fn$;
"""

RELEASE_REVERSE = _earlier("0009_cron_overlap", "RELEASE")


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('django_xjobs', '0009_cron_overlap'),
    ]

    operations = [
        Once([
            migrations.CreateModel(
                name='LeaseExtension',
                fields=[
                    ('lease_token', models.UUIDField(primary_key=True, serialize=False)),
                    ('job_id', models.UUIDField()),
                    ('until', models.DateTimeField()),
                ],
                options={
                    'verbose_name': 'lease extension',
                    'db_table': 'x_lease_extensions',
                },
            ),
        ], done_if="select to_regclass('x_lease_extensions') is not null"),
        RunDDL(sql=REQUIRE_READ_COMMITTED,
                          reverse_sql="drop function if exists xjobs_require_read_committed(text);",
                          hints={"model_name": "job"}),
        RunDDL(sql=RATE_TAKE, reverse_sql=RATE_TAKE_REVERSE,
                          hints={"model_name": "job"}),
        RunDDL(sql=TRANSITION, reverse_sql=TRANSITION_REVERSE,
                          hints={"model_name": "job"}),
        RunDDL(sql=RELEASE, reverse_sql=RELEASE_REVERSE,
                          hints={"model_name": "job"}),
    ]
