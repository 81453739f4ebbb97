"""Running a pass: one attempt of a pass's job, batch by batch, each batch fenced.

A **pass** is one walk from the start (cursor None) to a batch whose ``next_cursor`` is None. It
runs as a job (job name ``backfill:<name>``, idempotency key ``backfill:<name>``: one live pass
per backfill), and its progress lives in one ``x_backfills`` row keyed by the job's ``run_id``,
which the job keeps across every retry. The database is authoritative for ownership (the job's
lease token) and for progress (the row); the worker holds nothing that a crash could lose.

States of a pass (``x_backfills.status``) and what moves it::

    start ─▶ pending ─(a worker claims the job; backfill_start_if_owned)─▶ running
    running ─(the final batch's transaction)──────────────────────────────▶ completed
    running ─(a batch raised; its transaction rolled back)────────────────▶ failed
    pending/running/failed ─(xjobs_backfill cancel)────────────────────────▶ cancelled
    failed/cancelled ─(the job is retried, and claimed; start adopts it)───▶ running
    running ─(worker killed: the lease lapses, another worker re-claims)───▶ running

What commits with what (each line is one transaction):

1. ``start`` (:mod:`.operations`): the pass's job is enqueued and its row recorded ``pending``.
2. The worker opens the row (``backfill_start_if_owned``): a retried or re-claimed pass ADOPTS
   its row, keeping started_at, checksum, app_version and its progress, and clearing
   completed_at. A completed row is left completed and the job simply ends (its ack was lost).
3. Every batch: the backfill function's writes AND the progress update (rows_processed + n,
   last_cursor = next_cursor), or for the final batch the completion (cursor cleared). The
   progress statement locks the job's row and requires (id, running, lease_token): a run that
   lost its job matches nothing, and the batch is rolled back. So a crash at any moment
   resumes exactly after the last committed batch, and no batch commits twice.
4. A batch that raised: after its rollback, ``failed`` with the error; the cursor stays at the
   last committed batch. The job then fails by its own policy (retries with backoff, or dead).
5. ``cancel`` (:mod:`.operations`): the job is cancelled and the row marked ``cancelled``.

Timeouts: the lease (``XJOBS["LEASE"]``) bounds how long a killed worker's pass waits before
another worker resumes it. The worker's heartbeat thread renews the lease every
``XJOBS["HEARTBEAT"]`` whatever a batch does, so a batch may run longer than a lease; a worker
that cannot renew for a whole lease stops the run itself, and the batch in flight then fails
its fence and rolls back. A cancel reaches the pass at the next heartbeat (the run is told to
stop) or at its next batch's fence, whichever comes first; between batches the pass checks
``ctx.cancelled`` and waits out its throttle on it, so neither a cancel nor a shutdown waits
for a throttle to end.

Fault points (``django_xjobs.faults``, for crash tests): ``backfill:before-progress`` (the
batch's writes done, its progress not yet written), ``backfill:after-commit`` and
``backfill:completed`` (after the final batch's commit, before the job's ack).

One transaction needs one database: the user's writes and ``x_backfills`` must share an alias.
A backfill declares the alias it writes to (``using=``, default ``"default"``), and a backfill
whose alias is not ``XJOBS["DATABASE"]`` is reported at startup (system check ``xjobs.W050``)
and refused when it is started or run (:func:`.definition.check_alias`).
"""

from __future__ import annotations

import logging
from typing import Any

from .. import conf, faults
from ..api import acting_as
from ..context import JobContext, until_free
from ..engines import Engine, get_engine
from ..exceptions import ConfigurationError, JobCancelled, PermanentError, Snooze
from ..records import Claim, RunOwner
from ..values import format_error
from .definition import (
    MAX_BATCH_SIZE,
    BackfillContext,
    BackfillDefinition,
    check_alias,
    count_total,
    parse_throttle,
    positive_int,
    validate_batch,
)
from .provenance import app_version

log = logging.getLogger("django_xjobs.backfill")


class _NotOwned(Exception):
    """The batch's fenced progress write matched nothing: roll the batch back."""


class Pass:
    """One attempt of a pass, inside its job (see the module docstring)."""

    def __init__(self, definition: BackfillDefinition, ctx: JobContext, *,
                 batch_size: int | None, throttle: float | None) -> None:
        self.definition = definition
        self.ctx = ctx
        self.batch_size = definition.batch_size if batch_size is None else batch_size
        if throttle is None:
            throttle = definition.throttle
        self.throttle = conf.get().backfill_throttle if throttle is None else throttle

    def run(self) -> dict[str, Any]:
        definition, ctx = self.definition, self.ctx
        try:
            check_alias(definition)
            positive_int("batch_size", self.batch_size, MAX_BATCH_SIZE)
            parse_throttle("throttle", self.throttle)
        except ConfigurationError as exc:
            raise PermanentError(str(exc)) from None
        if ctx.lease_token is None:
            raise PermanentError(f"backfill {definition.name}: a pass runs only in a worker")
        engine = get_engine()
        owner = RunOwner(claim=Claim(job_id=ctx.job_id, lease_token=ctx.lease_token),
                         run_id=ctx.run_id)
        version = app_version(definition.func)
        record = until_free(lambda: engine.backfill_start_if_owned(
            owner, name=definition.name, checksum=definition.checksum, app_version=version,
        ), ctx.cancelled, ctx.check_cancelled)
        if record is None:
            raise JobCancelled("backfill pass not opened: this run no longer owns its job")
        if record.status == "completed":
            log.info("backfill %s run %s: already completed (%d rows); nothing to do",
                     definition.name, ctx.run_id, record.rows_processed)
            return self._result("completed", record.rows_processed, 0)
        if record.checksum != definition.checksum:
            log.warning(
                "backfill %s run %s resumed under different code: checksum %s when the pass "
                "began (app version %r), %s now (%r), at %d rows; recorded in code_changes",
                definition.name, ctx.run_id, (record.checksum or "?")[:12], record.app_version,
                definition.checksum[:12], version, record.rows_processed,
            )
        log.info("backfill %s run %s attempt %d: %s at %d rows (cursor %r), batch size %d, "
                 "throttle %gs", definition.name, ctx.run_id, ctx.attempt,
                 "resuming" if record.last_cursor is not None else "starting",
                 record.rows_processed, record.last_cursor, self.batch_size, self.throttle)
        bctx = BackfillContext(
            name=definition.name, run_id=ctx.run_id, job_id=ctx.job_id, attempt=ctx.attempt,
            batch_size=self.batch_size, cancelled=ctx.cancelled, job_name=ctx.name,
        )
        cursor = record.last_cursor
        rows = record.rows_processed
        batches = 0
        # The job's progress (docs/observability.md, "Progress"): rows since the pass began, of
        # the total hook's count, read once per attempt (a hook that fails, or counts nothing,
        # leaves the progress without a total and so without an ETA).
        total, _ = count_total(definition)
        while True:
            # Between batches: a lost lease, a cancel seen by the heartbeat, a shutdown past
            # its grace period. The next batch's fence would refuse it anyway; this saves the
            # batch's work.
            ctx.check_cancelled()
            next_cursor, rows = self._batch(engine, owner, bctx, cursor)
            batches += 1
            ctx.progress(rows, total or None, f"{rows:,} rows, {batches} batches this attempt")
            if next_cursor is None:
                log.info("backfill %s run %s completed: %d rows (%d batches in this attempt)",
                         definition.name, ctx.run_id, rows, batches)
                return self._result("completed", rows, batches)
            cursor = next_cursor
            if self.throttle > 0:
                ctx.cancelled.wait(self.throttle)

    @staticmethod
    def _result(status: str, rows: int, batches: int) -> dict[str, Any]:
        return {"status": status, "rows_processed": rows, "batches": batches}

    def _batch(self, engine: Engine, owner: RunOwner, bctx: BackfillContext,
               cursor: Any) -> tuple[Any, int]:
        """One batch and its progress in ONE transaction; (next_cursor, rows_processed)."""
        definition = self.definition
        try:
            with engine.atomic():
                # Jobs the batch enqueues join its transaction and name the backfill.
                with acting_as(f"backfill:{definition.name}"):
                    result = definition.func(bctx, cursor)
                next_cursor, processed, cursor_json = validate_batch(definition, result)
                if faults.armed:
                    faults.hit("backfill:before-progress")
                # A job row another transaction holds is waited for here, polling inside the
                # batch's transaction (its writes stay uncommitted meanwhile), never in the
                # lock queue (docs/design.md, "Lock order").
                if cursor_json is None:
                    rows = until_free(
                        lambda: engine.backfill_complete_if_owned(owner, processed=processed),
                        self.ctx.cancelled, self.ctx.check_cancelled)
                else:
                    rows = until_free(
                        lambda: engine.backfill_progress_if_owned(
                            owner, processed=processed, cursor_json=cursor_json),
                        self.ctx.cancelled, self.ctx.check_cancelled)
                if rows is None:
                    raise _NotOwned
        except _NotOwned:
            raise JobCancelled(self._lost_reason(engine)) from None
        except (JobCancelled, Snooze):
            raise  # a stop or a pause, not a failure: the batch rolled back, the pass stays
        except Exception as exc:
            if not self.ctx.cancelled.is_set():
                self._record_failure(engine, owner, exc)
            raise
        if faults.armed:
            faults.hit("backfill:after-commit")
            if next_cursor is None:
                faults.hit("backfill:completed")
        return next_cursor, rows

    def _lost_reason(self, engine: Engine) -> str:
        record = engine.backfill_get(self.ctx.run_id)
        if record is not None and record.status != "running":
            return (f"backfill pass {record.status}: the batch in flight was rolled back and "
                    "the pass stops")
        return ("this run no longer owns its job (cancelled, or re-claimed after its lease "
                "lapsed): the batch in flight was rolled back")

    def _record_failure(self, engine: Engine, owner: RunOwner, exc: BaseException) -> None:
        try:
            recorded = engine.backfill_fail_if_owned(owner, error=format_error(exc))
        except Exception as write_exc:
            # The batch's error is what the job reports; the pass's row then stays `running`
            # and the job's retry adopts it from the last committed batch all the same.
            if engine.is_connection_error(write_exc):
                engine.reset_connection()
            log.warning("backfill %s run %s: the failure could not be recorded (%s)",
                        self.definition.name, self.ctx.run_id, write_exc)
            return
        if not recorded:
            raise JobCancelled(
                "backfill failure not recorded: this run no longer owns its job"
            ) from exc
