"""Reads of whole job rows for people: one job by id, and a filtered listing.

job_get serves the console, the commands and the API's job handle (and tells an operator's
refused action what the job is now); jobs_list serves the test kit's enqueued_jobs() and
assert_enqueued(). Both decode into a JobRecord through JOB_COLUMNS.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import JOB_COLUMNS

JOB_GET = Statement(
    "job_get",
    why="""
One job by id. Under a tenant scope (the console's ADMIN_TENANT_SCOPE) a job of another tenant
is simply not found, so its existence is not revealed either.
""",
    sql=f"""
select {JOB_COLUMNS}
  from x_jobs
 where id = %(id)s
   and (%(tenant_ids)s::text[] is null or tenant_id = any(%(tenant_ids)s::text[]))
""",
)

JOBS_LIST = Statement(
    "jobs_list",
    why="""
Jobs of any state, filtered by name, queue, states and tenant (each filter optional), oldest
first, for enqueued_jobs() and assert_enqueued()'s report of what IS enqueued. A test's table is
small; `limit` (NULL = no limit) bounds it anyway. A NULL tenant filter means any tenant.
""",
    sql=f"""
select {JOB_COLUMNS}
  from x_jobs
 where (%(name)s::text is null or name = %(name)s::text)
   and (%(queue)s::text is null or queue = %(queue)s::text)
   and (%(states)s::text[] is null or state = any(%(states)s::text[]))
   and (%(tenant_id)s::text is null or tenant_id = %(tenant_id)s::text)
 order by created_at, id
 limit %(limit)s::bigint
""",
)
