"""Connections: statements that set up a session or ask the server, and touch no table.

A worker's own connection is labelled (session_label), a dedicated connection subscribes to
enqueue wake-ups (listen), and db_now reads the clock every lease is measured on.
"""

from __future__ import annotations

from ...base import Statement
from .fragments import CHANNEL

SESSION_LABEL = Statement(
    "session_label",
    why="""
Set up a worker's own connection (its loop, heartbeat and duties; engine.session_label), whose
name, `application_name`, was given when it connected: a name set here, on the session, would
stay on a pooler's server connection after this client's transaction and name the next client
that set none (docs/deployment.md, "PgBouncer and other connection poolers"). Only with Django's
own connection pool, whose connections are made once for every thread, is the name set here.
`jit` off: the claim's generic plan on a big table is costed high enough to be JIT-compiled, and
compiling costs far more than executing it (docs/performance.md, "What the simpler forms cost").
`plan_cache_mode` force_generic_plan: the worker's statements are prepared once per connection,
and PostgreSQL's default (auto) kept planning the claim afresh for most executions, since its
custom plans cost less on paper than the generic one: 3.3 ms of planning for 1 ms of work. The
generic plan walks the same indexes (tests/conformance/test_flow_plans.py checks both plans at a
million jobs) and a claim of one job takes a quarter of the time (docs/performance.md, "Where a
job's time goes"). `enable_seqscan` and `enable_bitmapscan` off: every statement of a worker
is written for its index walks, and the planner, which costs a walk by its index's size, chose
a sequential scan of x_jobs or a bitmap scan of the console's BRIN index instead on a table a
long hold had left (its indexes grown, the heap cut back, a few live rows), reading every page
of the range at every claim (docs/performance.md, "Under a held horizon";
tests/conformance/test_plans_after_a_hold.py). A table no index serves is still read whole.
`jit` and `plan_cache_mode` stay on a pooler's server connection, where they change no plan of
a Django client (Django prepares no statement on the server); the two scans would change the
plans of the next client's queries, so they are set only where the worker's sessions are its
own (`pin`: no pooler named by `LISTEN_DATABASE`, NOTIFY on). The answer is the isolation level
the session's statements run at: the worker's must be READ COMMITTED (docs/guarantees.md,
"Isolation levels").
""",
    sql="""select case when %(label)s::text is not null
                   then set_config('application_name', %(label)s, false) end,
       set_config('jit', 'off', false),
       set_config('plan_cache_mode', 'force_generic_plan', false),
       case when %(pin)s then set_config('enable_seqscan', 'off', false) end,
       case when %(pin)s then set_config('enable_bitmapscan', 'off', false) end,
       current_setting('transaction_isolation')""",
)

LISTEN = Statement(
    "listen",
    why="""
Subscribe a dedicated connection to enqueue wake-ups. NOTIFY is a latency hint, never the source
of truth: notifications sent while this session is gone are lost, so the worker polls as well
and re-LISTENs after every reconnect.
""",
    sql=f"listen {CHANNEL}",
)

DB_NOW = Statement(
    "db_now",
    why="The database clock, the one every lease is measured on.",
    sql="select now()",
)
