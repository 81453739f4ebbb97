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
Set up a worker's own connection. `application_name` names it, so `pg_stat_activity` shows which
worker and which role (loop, heartbeat, listener) a backend serves, and fault tests can find it.
`jit` off: the claim's generic plan on a big table is costed high enough to be JIT-compiled, and
compiling costs far more than executing it (docs/performance.md, "What the simpler forms cost").
`plan_cache_mode` force_generic_plan: the worker's statements are prepared once per connection,
and PostgreSQL's default (auto) kept planning the claim afresh for most executions, since its
custom plans cost less on paper than the generic one: 3.3 ms of planning for 1 ms of work. The
generic plan walks the same indexes (tests/conformance/test_flow_plans.py checks both plans at a
million jobs) and a claim of one job takes a quarter of the time (docs/performance.md, "Where a
job's time goes").
""",
    sql="""select set_config('application_name', %(label)s, false), set_config('jit', 'off', false),
       set_config('plan_cache_mode', 'force_generic_plan', false)""",
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
