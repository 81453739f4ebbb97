"""x_fleet: what the processes sharing the tables can read (docs/deployment.md, "Mixed
versions"). One row at most; no row means every process runs this version or a newer one."""

from __future__ import annotations

from ...base import Statement

FLEET_GET = Statement(
    "fleet_get",
    why="""
The fleet's compatibility: the oldest release series still allowed to run against these tables
(NULL: none older than this version), when and by whom it was set. Read by each worker once
per FLEET_REFRESH (worker/flow.py) and by the maintenance round before it moves finished jobs
into the history tables: a plain read of a one-row table, never locked by a worker.
""",
    sql="""
select compatible_with, changed_at, changed_by from x_fleet where id
""",
)

FLEET_SET = Statement(
    "fleet_set",
    why="""
Set the fleet's compatibility (`manage.py xjobs fleet`): NULL once every process runs this
version (`--finish-upgrade`), a release series before a rollback to it
(`--compatible-with`). An upsert of the one row; the workers see it at their next refresh.
""",
    sql="""
insert into x_fleet (id, compatible_with, changed_at, changed_by)
values (true, %(compatible_with)s, now(), %(changed_by)s)
on conflict (id) do update
   set compatible_with = excluded.compatible_with, changed_at = now(),
       changed_by = excluded.changed_by
returning compatible_with, changed_at, changed_by
""",
)
