"""The inline test mode: ``XJOBS["TEST_MODE"] = "inline"`` runs each job at enqueue.

A job runs when the transaction that enqueued it commits (``transaction.on_commit`` on the jobs'
database), at once when there is none, in the caller's thread and on its connection. It goes
through what a worker does to it: a claim that writes a lease token
(``job_claim_if_due``), ``worker/executor.py`` running the code, and the fenced statement of its
outcome (``worker/settle.py``'s ``write_outcome``, or the acknowledgement). So retries, ``dead``,
results and durable steps read as they would after a worker ran the job.

One attempt per enqueue: a failed attempt is retried after its backoff, as in production, so
the job waits in ``delayed``; :func:`django_xjobs.testing.travel` makes it due and
:func:`django_xjobs.testing.drain` runs it (inline, in this mode). A delayed enqueue does not run
until it is due. Jobs that a running job enqueues run after it, one at a time, in order.

In a ``TestCase`` (every test in one transaction) the on-commit runs happen when
``captureOnCommitCallbacks(execute=True)`` ends, and the run joins the test's transaction: it
runs in a savepoint, so a database error in the job rolls back the job's writes only, and a
durable sleep or event wait may suspend the job in the test's transaction (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.core.signals import setting_changed
from django.db import connections, transaction

from .. import api, conf, registry
from ..context import JobContext, StopSignal, until_free
from ..decorator import child_params
from ..engines import Engine, get_engine
from ..exceptions import ConfigurationError, RowBusy
from ..outbox import relay_pending
from ..records import ClaimedJob, Completion, Fence, RunOwner
from ..steps import AsyncSteps, Steps
from ..worker import executor
from ..worker.executor import Done, Outcome, Retry
from ..worker.settle import announce, announcing, write_outcome

log = logging.getLogger("django_xjobs.testing")

# claimed_by and worker_ids of inline runs: a test (or the console) can tell them from a worker's.
WORKER_ID = f"inline:{socket.gethostname()}:{os.getpid()}"

_local = threading.local()


def install() -> None:
    """Keep ``api.inline_runner`` in step with ``XJOBS["TEST_MODE"]``, now and whenever the
    setting changes (``override_settings``, pytest-django's ``settings``); the app's
    ``ready()`` calls this. Off, an enqueue pays nothing for the mode."""
    setting_changed.connect(_on_setting_changed, dispatch_uid="django_xjobs.testing.inline")
    _sync()


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "XJOBS":
        conf.reset()  # whichever receiver runs first, this one reads the new value
        _sync()


def _sync() -> None:
    try:
        on = conf.get().test_mode == "inline"
    except ConfigurationError:
        on = False  # the system checks report the setting (xjobs.E001)
    api.inline_runner = run_enqueued if on else None


def run_enqueued(job_id: UUID, staged_on: str | None) -> None:
    """The enqueue hook (``api.inline_runner``): run the new job once the enqueuing transaction
    commits. A staging (``enqueue_on_commit``) is relayed first, as the relay would."""
    if staged_on is None:
        transaction.on_commit(lambda: run_job(job_id), using=conf.get().database)
    else:
        transaction.on_commit(lambda: _relay_then_run(staged_on, job_id), using=staged_on)


def _relay_then_run(alias: str, job_id: UUID) -> None:
    relay_pending((alias,))
    run_job(job_id)


def run_job(job_id: UUID | str) -> None:
    """Run this job now if it is waiting and due (else nothing): one attempt."""

    def claim_and_run() -> None:
        engine = get_engine()
        claimed = engine.job_claim_if_due(str(job_id), worker_id=WORKER_ID,
                                          lease_ms=round(conf.get().lease * 1000))
        if claimed is not None:
            run_claimed(engine, claimed)

    in_turn(claim_and_run)


def in_turn(work: Callable[[], None]) -> None:
    """Run ``work`` and then what it queued, in order; inside a turn already under way on this
    thread, queue it behind. A job that enqueues a job thus finishes (and is settled) before
    the new one starts, as with a worker, instead of running it halfway through its own code."""
    pending: deque[Callable[[], None]] | None = getattr(_local, "pending", None)
    if pending is not None:
        pending.append(work)
        return
    _local.pending = pending = deque([work])
    try:
        while pending:
            pending.popleft()()
    finally:
        _local.pending = None


def run_claimed(engine: Engine, claimed: ClaimedJob) -> str:
    """Run a claimed job in this thread and write its outcome; the state it went to (as a
    worker counts it: done, ready, delayed, dead, requeued, unknown_job, suspended, or lost)."""
    settings = conf.get()
    definition = registry.lookup(claimed.name)
    ctx = JobContext(
        job_id=claimed.id, run_id=claimed.run_id, name=claimed.name, queue=claimed.queue,
        attempt=claimed.attempt, max_attempts=claimed.max_attempts,
        tenant_id=claimed.tenant_id, traceparent=claimed.traceparent,
        lease_token=claimed.lease_token,
        # The worker's write (worker/runs.py, Run), on this thread's connection.
        progress_writer=lambda done, total, message: engine.job_progress_if_owned(
            claimed.claim, done=done, total=total, message=message),
    )
    owner = RunOwner(claim=claimed.claim, run_id=claimed.run_id)
    outcome: Outcome
    try:
        if definition is None:
            outcome = executor.unknown_job(claimed, settings)
        elif definition.is_async:
            # Its database work runs in threads of its own (context.in_thread), on their own
            # connections, as in a worker.
            ctx.step_factory = lambda c: AsyncSteps(Steps(engine, owner, c,
                                                          child_params=child_params))
            outcome = asyncio.run(executor.execute_async(definition, claimed, ctx, settings))
        else:
            outcome = _execute_sync(engine, definition, claimed, ctx, owner)
    except BaseException as exc:  # as the worker: a run always gets an outcome
        log.exception("job %s (%s): no outcome", claimed.id, claimed.name)
        outcome = executor.internal_error(exc, definition, claimed, settings)
    return _settle(engine, claimed, outcome)


def _execute_sync(engine: Engine, definition: registry.JobDefinition, claimed: ClaimedJob,
                  ctx: JobContext, owner: RunOwner) -> Outcome:
    conn = connections[engine.alias]
    # Inside the caller's transaction (a TestCase's), a savepoint: a database error in the job
    # rolls back to it (Django marks the block for rollback) and leaves the transaction usable
    # for the settle and the test. Outside one, the job's statements autocommit as in a worker.
    scope = transaction.atomic(using=engine.alias) if conn.in_atomic_block else (
        contextlib.nullcontext())
    with scope:
        depth = len(conn.atomic_blocks)
        ctx.step_factory = lambda c: Steps(_RunEngine(engine, depth), owner, c,
                                           child_params=child_params)
        return executor.execute(definition, claimed, ctx, conf.get(), cleanup=False)


class _RunEngine:
    """The engine as an inline run's steps see it. A transaction the run started inside (the
    test's) is not one the job opened, so a durable sleep or event wait may suspend the job in
    it: unwinding the job's code does not roll it back. An ``atomic()`` block of the job's own
    still refuses a suspension, as in a worker (steps.SuspendInTransaction)."""

    def __init__(self, engine: Engine, depth: int) -> None:
        self._engine = engine
        self._depth = depth

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def in_transaction(self) -> bool:
        return len(connections[self._engine.alias].atomic_blocks) > self._depth


def _settle(engine: Engine, claimed: ClaimedJob, outcome: Outcome) -> str:
    def write() -> tuple[Fence, str]:
        if isinstance(outcome, Done):
            report = engine.jobs_complete_if_owned([Completion(
                claim=claimed.claim, result_json=outcome.result_json)])
            fence, state = report.outcome(claimed.lease_token), "done"
        else:
            fence, state = write_outcome(engine, claimed, outcome)
        if fence is Fence.BUSY:  # another session holds the job's row: as a worker, write again
            raise RowBusy(f"job {claimed.id}: its row is held by another transaction")
        return fence, state

    fence, state = until_free(write, StopSignal(), lambda: None)
    if announcing():
        announce(engine, claimed, registry.lookup(claimed.name) or claimed.name, outcome, fence,
                 state)
    if fence is Fence.LOST:
        log.warning("job %s (%s) attempt %d: result discarded, this run no longer owns the job "
                    "(cancelled meanwhile?)", claimed.id, claimed.name, claimed.attempt)
        return "lost"
    if isinstance(outcome, Retry):
        log.warning("job %s (%s) attempt %d/%d failed -> %s: %s", claimed.id, claimed.name,
                    claimed.attempt, claimed.max_attempts, state,
                    outcome.error.splitlines()[-1])
    return state
