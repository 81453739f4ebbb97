"""x_jobs and x_job_steps, read only: the deploy check (docs/durable.md, "The deploy check").

``manage.py xjobs check-deploy`` replays every suspended durable run against the code now
installed; these are its two reads. Nothing here writes.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import JOB_COLUMNS

RUNS_SUSPENDED_LIST = Statement(
    "runs_suspended_list",
    why="""
One page of the durable runs the deploy check replays: suspended jobs, and blocked jobs whose
blocked_resume says a suspended run's resume is what flow control holds back (a blocked job
that never started has no run to replay). A job without step rows has not taken a step, so it
has no recorded path to compare and is left out. Paged by id (after_job_id) so a long list is
read in bounded pieces, each an ordinary snapshot; a job that changes state between pages is
simply checked or not: the check is advisory and takes no lock.
""",
    sql=f"""
select {JOB_COLUMNS}
  from only x_jobs j
 where (j.state = 'suspended' or (j.state = 'blocked' and j.blocked_resume))
   and (%(name)s::text is null or j.name = %(name)s::text)
   and j.id > coalesce(%(after_job_id)s::uuid, '00000000-0000-0000-0000-000000000000'::uuid)
   and exists (select 1 from only x_job_steps s where s.run_id = j.run_id)
 order by j.id
 limit %(limit)s
""",
)

STEPS_OF_RUN_IN_ORDER = Statement(
    "steps_of_run_in_order",
    why="""
A run's steps in the order it recorded them (id order: every step inserts its row when it is
first reached, a retry updates that row in place), which is the path the deploy check replays
the code against. The per-event rows of wait_for_any (names with '#', which no step name may
contain) belong to their main row and are not steps of their own. Unlike steps_of_run it keeps
the order and leaves out the wake-up comparison, which a replay does not need.
""",
    sql="""
select name, status, output, attempts, error, started_at, completed_at, wake_at, event,
       correlation_key, event_id, event_published_at, kind
  from only x_job_steps
 where run_id = %(run_id)s::uuid and strpos(name, '#') = 0
 order by id
""",
)
