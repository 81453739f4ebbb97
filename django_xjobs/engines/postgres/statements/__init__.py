"""THE WIRE FORMAT: every statement the PostgreSQL engine runs, as a named constant.

Rules of this package:

* Nothing else in django-xjobs writes queue SQL. The engine runs these by name, logs the name,
  and ``manage.py xjobs_sql NAME`` prints the text (as a ``PREPARE`` an operator can paste into
  psql).
* Each statement's ``why`` says why its filters exist: most of them guard against a real
  failure (a lost update, a double fire, a stranger's row) that a looser filter allows.
* Parameters are ``%(name)s`` placeholders bound by psycopg, never formatted into the text.
* Time is the database's: every lease and due-time comparison uses ``now()``, so a worker with
  a wrong clock cannot stretch or shrink a lease.

Fencing (docs/design.md, "Fencing"): a claim writes a fresh ``lease_token``
(``gen_random_uuid()``, never reused); every write a worker makes about a run carries ``id``,
``state = 'running'`` AND that token. ``state = 'running'`` alone, a fence on the state only,
also matches the row after another worker re-claimed a lapsed lease. A finished row keeps the
token of the run that finished it, so a write retried after an ambiguous commit is recognised by
:data:`JOBS_FENCE_CHECK` as already applied. An outside actor that ends a run (cancel, the claim
that buries a lapsed job) clears the token: that run did not finish the job, and its late writes
must read as lost.

One module per table family, each statement declared once, as a ``Statement`` constant of the
module a maintainer of that family opens; the engine imports it by name from there
(``from ..statements.claim import JOBS_CLAIM``). ``ALL`` maps every
name to its statement, collected from the family modules (``FAMILIES``, in the order of this
list; within a module, in the order it declares them), so a new statement is written in one
place and listed nowhere by hand:

* ``enqueue``: x_jobs: the enqueue of one job and many, keyed and unkeyed, by COPY, and the read
  of the live job behind a key's conflict.
* ``claim``: x_jobs: the claim, composed from its named stages (what each decides, the locks it
  takes), and the test kit's claim of one job.
* ``jobs``: x_jobs from the claim to the fenced settlement: the fenced writes and the heartbeat,
  the fence check, an operator's actions, the queue counts, the early wake-up of jobs handed
  back, and the test kit's shift of due times.
* ``debounce``: x_jobs: a debounced enqueue's move of the pending job of its key, or the setting
  aside of the run under way for a follow-up.
* ``steps``: x_job_steps and x_job_events: durable steps, sleeps, event waits and publishing.
* ``outbox``: x_outbox: staging, the relay's claim and mark, its wake-up channel.
* ``slots``: x_job_leases: concurrency slots, the purge of expired ones included; the release
  wakes the jobs the claim blocked on its key.
* ``workers``: x_workers: the worker processes seen lately, what their heartbeats report,
  which of them are stalled.
* ``fleet``: x_fleet: the oldest release still allowed to share the tables (mixed-version
  fleets during a deploy).
* ``stats``: x_stat_deltas and x_stats: the counters' rollup, retention and reads (the deltas
  themselves are written by the statements that change job state).
* ``flow``: flow control beyond slots: the periodic wake-up of blocked jobs, rate budgets spent
  from ordinary code.
* ``pauses``: x_flow_pauses: pauses of queues and keys, the resume of a key with the unblock of
  its jobs, and the settle of a run that raised PauseKey.
* ``scheduler``: x_scheduler_leader and x_scheduler_state: leader election, cron watermarks.
* ``backfills``: x_backfills: the progress of resumable passes.
* ``history``: the history tables of finished jobs: the move out of x_jobs, the drop of a
  day past retention, their list, and the move back of one job an operator retries or cancels.
* ``maintenance``: retention deletes (finished jobs, expired events, relayed outbox rows), the
  console's delete of finished jobs, the health of the tables and what holds VACUUM back.
* ``reads``: whole job rows for people: one by id (job_get), a filtered listing (jobs_list).
* ``why``: what holds a waiting job back (why_job) and a rate-limit key's window
  (why_rate_window), for ``manage.py xjobs why``.
* ``windows``: x_job_keys: idempotency windows: the windowed enqueue, the read of a key's
  holder, and the purge of ended windows.
* ``deploy``: x_jobs and x_job_steps, read only: the suspended runs the deploy check replays
  and their steps in recorded order.
* ``connections``: no table: a connection's label, LISTEN on the job channel, the clock.
* ``fragments``: SQL text several statements share (``CHANNEL``, ``LIVE``, ``JOB_COLUMNS``, the
  enqueue's insert); it declares no statement.
* ``routines``: no statement either: the functions, the aggregate and the triggers the
  statements rely on, as the migrations leave them today; ``ROUTINES`` lists them, each before
  what calls it.
"""

from __future__ import annotations

from types import ModuleType
from typing import TypeVar

from ...base import Statement
from ...routines import Routine
from . import (
    backfills,
    claim,
    connections,
    debounce,
    deploy,
    enqueue,
    fleet,
    flow,
    history,
    jobs,
    maintenance,
    outbox,
    pauses,
    reads,
    routines,
    scheduler,
    slots,
    stats,
    steps,
    why,
    windows,
    workers,
)

# The family modules, in the order of the list above.
FAMILIES = (enqueue, claim, jobs, debounce, steps, outbox, slots, workers, fleet, stats, flow,
            pauses, scheduler, backfills, history, maintenance, reads, why, windows, deploy,
            connections)


_T = TypeVar("_T")


def _declared(module: ModuleType, kind: type[_T]) -> list[_T]:
    """The ``kind`` constants ``module`` declares, in the order it declares them."""
    return [value for value in vars(module).values() if isinstance(value, kind)]


# Every statement by name: what FAMILIES declare, family by family. A family module that is not
# in FAMILIES and a statement declared in two modules each fail
# tests/unit/test_statement_lint.py.
ALL: dict[str, Statement] = {
    stmt.name: stmt for family in FAMILIES for stmt in _declared(family, Statement)}

# Every function, aggregate and trigger of the schema, in the order routines.py declares them.
ROUTINES: tuple[Routine, ...] = tuple(_declared(routines, Routine))
