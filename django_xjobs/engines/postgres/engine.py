"""The PostgreSQL engine: one method -> one named statement, rows -> records, errors -> ours.

:class:`PostgresEngine` is one class, the seam's every operation (``engines/base.py``), built
from one class per family of operations, each in a module of its own under ``operations/``::

    enqueue.py      job_enqueue, jobs_enqueue, debounce, idempotency windows
    runs.py         a worker's claim and the fenced writes of its runs, renewals, progress
    steps.py        a durable run's steps, its child jobs, events
    operators.py    an operator's cancel, retry, run now and delete of one job
    reads.py        the figures the console, the commands and the metrics read
    maintenance.py  the bounded purges, the archive into history tables, the counters' rollup
    backfills.py    a backfill's passes
    outbox.py       the outbox and its relay
    flow.py         concurrency slots, rate budgets, pauses
    workers.py      the workers' heartbeats and the fleet's compatibility
    scheduler.py    leader election, cron watermarks, a cron task's live runs
    connections.py  this thread's connection: its transactions, its name, its errors
    testing.py      what django_xjobs.testing asks of the engine

Each family builds on :class:`~.core.PostgresCore`, which sends a statement through the one
instrumentation wrapper (core.py, instrumentation.py); rows become records in rows.py, records
become parameters in params.py, and database errors become ours in errors.py. The statements
themselves, each with its why, are the package ``statements/``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Statement
from ..features import Features
from ..routines import Routine
from . import statements as S
from .operations.backfills import Backfills
from .operations.connections import Connections
from .operations.enqueue import Enqueue
from .operations.flow import FlowControl
from .operations.maintenance import Maintenance
from .operations.operators import Operators
from .operations.outbox import Outbox
from .operations.reads import Reads
from .operations.runs import Runs
from .operations.scheduler import Scheduler
from .operations.steps import Steps
from .operations.testing import Testing
from .operations.workers import Workers


class PostgresEngine(Enqueue, Runs, Steps, Operators, Reads, Maintenance, Backfills, Outbox,
                     FlowControl, Workers, Scheduler, Connections, Testing):
    features = Features(
        skip_locked=True, listen_notify=True, transactional_enqueue=True, advisory_locks=True
    )

    def __init__(self, alias: str, *, notify: bool = True, prepared: bool = True,
                 listen_alias: str | None = None) -> None:
        super().__init__(alias)
        self.notify = notify
        self.prepared = prepared
        # Whose connection parameters the dedicated sessions use (XJOBS["LISTEN_DATABASE"]):
        # a direct connection to the same database when the alias goes through a pooler.
        self.listen_alias = listen_alias or alias

    def statements(self) -> Mapping[str, Statement]:
        return S.ALL

    def routines(self) -> tuple[Routine, ...]:
        return S.ROUTINES
