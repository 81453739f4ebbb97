"""The PostgreSQL engine: one method -> one named statement, rows -> records, errors -> ours.

Statements run on ``django.db.connections[alias]`` of the calling thread, so they join the
caller's transaction (enqueue inside ``atomic()`` commits or rolls back with the caller's
writes) and share Django's connection handling (``CONN_MAX_AGE``, health checks, pooling).
The dedicated connections are the exception: the LISTEN connection and the scheduler's
advisory session (sessions.py), opened with the parameters of ``XJOBS["LISTEN_DATABASE"]``
when it is set (a direct connection beside a transaction pooler). Wherever it runs, every
statement goes through one wrapper, instrumentation.py: fault points, timing, the DEBUG log.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    connections,
)
from django.db import transaction as db_transaction

from ...exceptions import (
    IsolationLevelRefused,
    LiveJobExists,
    RowBusy,
    SchemaMissing,
    StepNameReused,
    UndecodableValue,
    fail_for_good,
)
from ...records import (
    UNIQUE_FOREVER,
    BackfillRecord,
    ChangeResult,
    ChildState,
    Claim,
    ClaimBatch,
    ClaimedJob,
    ClaimFlow,
    Completion,
    Counters,
    CronRun,
    EnqueueParams,
    EnqueueResult,
    EventRecord,
    Failure,
    FenceReport,
    FleetRecord,
    FlowFacts,
    HistoryTable,
    InvokeStep,
    JobRecord,
    KeyPauseRequeue,
    LeaderFence,
    LeaderRecord,
    LockedStates,
    OutboxRow,
    OutboxStatus,
    ParkedStep,
    PauseRecord,
    QueueDepth,
    QueueStats,
    RateRequest,
    RateWindow,
    Renewal,
    Requeue,
    RunOwner,
    SchedulerStateRecord,
    SlotHold,
    SlotRecord,
    SlotRequest,
    SlotUsage,
    StepRecord,
    Suspension,
    TableHealth,
    UnknownGiveBack,
    UnknownWait,
    WorkerRecord,
    XminHolder,
    attempt_history,
    decode_stored_json,
    progress_from_json,
    stall_reason,
)
from ..base import AdvisorySession, Engine, Listener, Statement
from ..features import Features
from . import statements as S
from .instrumentation import instrumented
from .sessions import PostgresAdvisorySession, PostgresListener, advisory_key


def _preparing_cursor_class() -> type:
    class PreparingCursor(psycopg.Cursor):  # type: ignore[type-arg]
        """Server-side binding, and every statement prepared on first use (per connection)."""

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = True,
                    binary: bool | None = None) -> Any:
            return super().execute(query, params, prepare=prepare, binary=binary)

    return PreparingCursor


_PreparingCursor: Any = _preparing_cursor_class()
_NEVER = 2**31 - 1


def _decode_json(value: Any) -> Any:
    # Django registers a jsonb loader that returns the text (JSONField decodes it itself), so
    # jsonb arrives here as str on Django's connections.
    if isinstance(value, str):
        return json.loads(value)
    return value


def _try_decode_json(value: Any) -> tuple[Any, str | None]:
    """:func:`records.decode_stored_json` for a column psycopg may already have decoded."""
    if not isinstance(value, str):
        return value, None
    return decode_stored_json(value)


class _Unchanged(Exception):
    """Rolls back an operator's change that turned out to change nothing (its savepoint)."""


def _decode_json_for_run(value: Any, what: str) -> Any:
    """A JSON column a run cannot go on without (a step's output, an event's payload), decoded;
    or, when Python cannot decode it, an error raised in the job that fails it for good and
    says which value, instead of a bare ValueError or RecursionError."""
    decoded, problem = _try_decode_json(value)
    if problem is not None:
        raise fail_for_good(UndecodableValue(f"{what} cannot be decoded: {problem}"))
    return decoded


def _job_record(row: Sequence[Any]) -> JobRecord:
    """A whole row; an input or result Python cannot decode is reported in ``input_error`` /
    ``result_error`` instead of failing the read (the action that returned the row is done)."""
    (id_, name, queue, input_, key, run_id, attempt, max_attempts, state, run_at, visible_at,
     claimed_by, last_error, tenant_id, traceparent, enqueued_by, created_at, updated_at,
     priority, result, lease_token, concurrency_key, started_at, finished_at, rescues,
     worker_ids, attempts, progress, parent_id, parent_step, unique_for_ms) = row[:31]
    decoded_input, input_error = _try_decode_json(input_)
    decoded_result, result_error = _try_decode_json(result)
    return JobRecord(
        id=id_, name=name, queue=queue, input={} if input_error else decoded_input,
        idempotency_key=key, run_id=run_id, attempt=attempt, max_attempts=max_attempts,
        state=state, run_at=run_at, visible_at=visible_at, claimed_by=claimed_by,
        last_error=last_error, tenant_id=tenant_id, traceparent=traceparent,
        enqueued_by=enqueued_by, created_at=created_at, updated_at=updated_at,
        priority=priority, result=decoded_result, lease_token=lease_token,
        concurrency_key=concurrency_key, started_at=started_at, finished_at=finished_at,
        rescues=rescues, worker_ids=list(_decode_json(worker_ids) or []),
        input_error=input_error, result_error=result_error,
        attempts=attempt_history(_decode_json(attempts), state=state, attempt=attempt,
                                 worker=claimed_by, started_at=started_at,
                                 finished_at=finished_at),
        progress=progress_from_json(_decode_json(progress)),
        parent_id=parent_id, parent_step=parent_step, unique_for_ms=unique_for_ms,
    )


def _claimed_job(r: Sequence[Any]) -> ClaimedJob:
    """A row of jobs_claim or job_claim_if_due (the same columns, in this order).

    Each row is decoded on its own: an input Python cannot decode becomes ``input_error`` on
    that job alone (the worker buries it), never an error that loses the whole claimed batch.
    """
    decoded, problem = _try_decode_json(r[4])
    return ClaimedJob(
        id=r[0], lease_token=r[1], name=r[2], queue=r[3], input=decoded, run_id=r[5],
        attempt=r[6], max_attempts=r[7], tenant_id=r[8], traceparent=r[9],
        concurrency_key=r[10], resumed=r[11], input_error=problem,
        slot=r[12] if len(r) > 12 else None, slot_limit=r[13] if len(r) > 13 else None,
        parent_id=r[17] if len(r) > 17 else None,
    )


def _counters(queue: str, name: str | None, at: datetime | None,
              figures: Sequence[Any]) -> Counters:
    """A row of stats_series / stats_totals: the six counts, the two sums, the two histograms."""
    (enqueued, started, done, failed, dead, cancelled, wait_sum, run_sum, wait_hist,
     run_hist) = figures
    return Counters(queue=queue, name=name, at=at, enqueued=enqueued or 0,
                    started=started or 0, done=done or 0, failed=failed or 0, dead=dead or 0,
                    cancelled=cancelled or 0, wait_ms_sum=wait_sum or 0,
                    run_ms_sum=run_sum or 0, wait_hist=tuple(wait_hist or ()),
                    run_hist=tuple(run_hist or ()))


def _pause_record(row: Sequence[Any]) -> PauseRecord:
    kind, key, until, reason, paused_at = row[:5]
    return PauseRecord(kind=kind, key=key, until=until, reason=reason, paused_at=paused_at,
                       blocked=int(row[5]) if len(row) > 5 else 0)


def _backfill_record(row: Sequence[Any]) -> BackfillRecord:
    """A row in the order of statements.BACKFILL_COLUMNS, maybe followed by job state, attempt."""
    (run_id, name, status, rows_processed, last_cursor, checksum, app_version, started_at,
     completed_at, updated_at, error, job_id, code_changes) = row[:13]
    job_state, job_attempt = (row[13], row[14]) if len(row) > 13 else (None, None)
    return BackfillRecord(
        run_id=run_id, name=name, status=status, rows_processed=int(rows_processed),
        last_cursor=_decode_json(last_cursor), checksum=checksum, app_version=app_version,
        started_at=started_at, completed_at=completed_at, updated_at=updated_at, error=error,
        job_id=job_id, code_changes=list(_decode_json(code_changes) or []),
        job_state=job_state, job_attempt=job_attempt,
    )


def _fence(claim: Claim) -> dict[str, str]:
    """The parameters a fenced single-job statement matches on: ``%(id)s`` and ``%(token)s``."""
    return {"id": claim.job_id, "token": claim.lease_token}


def _claims(claims: Iterable[Claim]) -> dict[str, str]:
    """The parameters a fenced batch statement matches on: ``%(ids)s`` and ``%(tokens)s``, the
    job ids and lease tokens of the claims, pair n at position n."""
    pairs = list(claims)
    return {"ids": _uuid_array(c.job_id for c in pairs),
            "tokens": _uuid_array(c.lease_token for c in pairs)}


def _in_lock_order(batch: Sequence[Any]) -> list[Any]:
    """A batch of fenced writes (each with a ``claim``) in the order its statement locks the
    rows: by job id (docs/design.md, "Lock order")."""
    return sorted(batch, key=lambda item: item.claim.job_id)


def _uuid_array(values: Iterable[Any]) -> str:
    """A uuid[] literal. Built with one join instead of psycopg's per-element list dumper
    (docs/performance.md, "What the simpler forms cost"); uuids need no quoting."""
    return "{" + ",".join(map(str, values)) + "}"


def _as_uuid(value: Any) -> UUID | None:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        return None


def _fetch(cursor: Any, fetch: str) -> Any:
    if fetch == "all":
        return cursor.fetchall()
    if fetch == "one":
        return cursor.fetchone()
    return cursor.rowcount


def _isolation_refused(exc: DatabaseError) -> IsolationLevelRefused | None:
    """xjobs_require_read_committed's refusal (SQLSTATE XJ001, migration 0010) as ours."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) != "XJ001":
        return None
    diag = cause.diag  # type: ignore[union-attr]
    return IsolationLevelRefused(f"{diag.message_primary} {diag.message_hint or ''}".strip())


def _schema_missing(exc: ProgrammingError, stmt: Statement, alias: str) -> SchemaMissing | None:
    """A missing table means `migrate` was not run: say so instead of a driver traceback."""
    if exc.__cause__ is not None and type(exc.__cause__).__name__ == "UndefinedTable":
        error = SchemaMissing(
            f"{stmt.name}: the django-xjobs tables are missing from database alias {alias!r} "
            f"({exc.__cause__}); run `manage.py migrate`"
        )
        error.__cause__ = exc
        return error
    return None


_READ_COMMITTED = psycopg.IsolationLevel.READ_COMMITTED


def _isolation_level(conn: Any) -> Any:
    """The isolation level Django opens the connection's transactions at (its OPTIONS
    "isolation_level"), None for the server's default (which a worker checks at start)."""
    level = (conn.settings_dict.get("OPTIONS") or {}).get("isolation_level")
    return None if level is None else psycopg.IsolationLevel(level)


class _LostAttempt(Exception):
    """A windowed enqueue's attempt at its key inserted no job: roll its transaction back."""

    def __init__(self, taken: bool) -> None:
        super().__init__("the attempt inserted no job")
        self.taken = taken


def _key(p: EnqueueParams) -> str:
    return p.idempotency_key if p.idempotency_key is not None else str(p.id)


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern matching names that start with ``prefix`` literally."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _tenants(tenant_ids: Iterable[str] | None) -> list[str] | None:
    return None if tenant_ids is None else list(tenant_ids)


# Which states a fenced write leaves behind, to recognise its own earlier commit.
_APPLIED_STATES = {
    "complete": frozenset({"done"}),
    "fail": frozenset({"ready", "delayed", "dead"}),
    "requeue": frozenset({"ready", "delayed", "suspended"}),
    "suspend": frozenset({"suspended"}),
}

# A failed connect (connection_refused), read in libpq's text: the server answered and turned
# this client away (the last one is libpq's own, a password the server asks for and the
# settings lack) ...
_REFUSALS = ("authentication failed", "no pg_hba.conf entry", "pg_hba.conf rejects",
             "does not exist", "is not permitted to log in", "permission denied for database",
             "no password supplied")
# ... or it answered that it takes no connection now (SQLSTATE 57P03: starting up, shutting
# down, in recovery; 53300: no slot left), which passes like a server that is down.
_NOT_YET = ("the database system is", "too many clients", "connection slots are reserved")


class PostgresEngine(Engine):
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

    # ------------------------------------------------------------------------- plumbing --
    def _run(self, stmt: Statement, params: Mapping[str, Any], *, fetch: str = "all") -> Any:
        """Execute one named statement on this thread's connection, instrumented
        (instrumentation.py).

        The statement runs on the thread's Django connection for the alias, so it joins the
        caller's transaction. With prepared statements on (the default), parameters are bound
        on the server and each statement is prepared once per connection.

        When Django watches queries (DEBUG, assertNumQueries, an execute wrapper such as a
        tracing integration), the cursor goes through Django's wrapper like any other query.
        Otherwise it runs on the bare psycopg cursor, keeping what matters of the wrapper:
        Django's error classes (and its errors_occurred bookkeeping, which retires a broken
        connection) and the refusal to run inside a broken atomic block. The wrapper costs a
        sixth of an enqueue's client time on this path (docs/performance.md).
        """
        try:
            return instrumented(stmt, self._execute, stmt, params, fetch)
        except DatabaseError as exc:
            refused = _isolation_refused(exc)
            if refused is None:
                raise
            raise refused from exc

    def _execute(self, stmt: Statement, params: Mapping[str, Any], fetch: str) -> Any:
        conn = connections[self.alias]
        if not self.prepared or conn.queries_logged or conn.execute_wrappers:
            return self._execute_wrapped(conn, stmt, params, fetch)
        conn.close_if_health_check_failed()
        conn.ensure_connection()
        try:
            with conn.wrap_database_errors:
                conn.validate_no_broken_transaction()
                cursor = _PreparingCursor(self._prepared_connection(conn))
                try:
                    cursor.execute(stmt.sql, params)
                    return _fetch(cursor, fetch)
                finally:
                    cursor.close()
        except ProgrammingError as exc:
            raise _schema_missing(exc, stmt, self.alias) or exc

    def _execute_wrapped(self, conn: Any, stmt: Statement, params: Mapping[str, Any],
                         fetch: str) -> Any:
        if self.prepared:
            conn.close_if_health_check_failed()
            conn.ensure_connection()
            with conn.wrap_database_errors:
                conn.validate_thread_sharing()
                raw = _PreparingCursor(self._prepared_connection(conn))
                cursor = conn.make_debug_cursor(raw) if conn.queries_logged else (
                    conn.make_cursor(raw)
                )
        else:
            cursor = conn.cursor()
        with cursor:
            try:
                cursor.execute(stmt.sql, params)
            except ProgrammingError as exc:
                raise _schema_missing(exc, stmt, self.alias) or exc
            if conn.queries_logged and conn.queries_log:
                # Name the statement in Django's query log, as in ours. Django renders a
                # server-bound query only with server_side_binding set in OPTIONS (else None,
                # or "QUERY = ... - PARAMS = ..." depending on the version): keep what it
                # rendered, or the statement's text.
                entry = conn.queries_log[-1]
                entry["sql"] = f"/* {stmt.name} */ {(entry['sql'] or stmt.sql).strip()}"
            return _fetch(cursor, fetch)

    @staticmethod
    def _prepared_connection(conn: Any) -> Any:
        raw = conn.connection
        if raw.prepare_threshold is None:
            # Django turns automatic preparation off, and psycopg then ignores even an
            # explicit prepare=True. A threshold no statement reaches restores the explicit
            # form only: Django's own cursors bind on the client and never prepare.
            raw.prepare_threshold = _NEVER
        return raw

    def _purge(self, stmt: Statement, params: Mapping[str, Any], batch_size: int) -> int:
        """Run a bounded delete (``%(batch)s`` rows at most) until a batch comes back short; how
        many rows went in all. Each batch is a statement of its own, so outside a caller's
        transaction each commits on its own and no purge holds its locks for longer than one
        batch."""
        total = 0
        while True:
            deleted = self._run(stmt, {**params, "batch": batch_size}, fetch="count")
            total += deleted
            if deleted < batch_size:
                return total

    # -------------------------------------------------------------------------- enqueue --
    def _enqueue_args(self, params: EnqueueParams) -> dict[str, Any]:
        """The parameters of job_enqueue / job_enqueue_unkeyed for one job."""
        return {
            "id": params.id, "name": params.name, "queue": params.queue,
            "input": params.input_json, "key": params.idempotency_key, "run_id": params.run_id,
            "max_attempts": params.max_attempts, "priority": params.priority,
            "run_at": params.run_at, "delay_ms": params.delay_ms, "tenant_id": params.tenant_id,
            "traceparent": params.traceparent, "enqueued_by": params.enqueued_by,
            "concurrency_key": params.concurrency_key, "rate_key": params.rate_key,
            "notify": self.notify,
        }

    def job_enqueue(self, params: EnqueueParams) -> EnqueueResult:
        if params.unique_for_ms is not None:
            return self._enqueue_windowed(params)
        args = self._enqueue_args(params)
        if params.idempotency_key is None:
            id_, run_id, state, _notified = self._run(S.JOB_ENQUEUE_UNKEYED, args, fetch="one")
            return EnqueueResult(id=id_, run_id=run_id, created=True, state=state)
        key = params.idempotency_key
        # The live job we conflicted with can finish before we read it; insert again then.
        for _ in range(20):
            rows = self._run(S.JOB_ENQUEUE, args)
            if rows:
                id_, run_id, state, _notified = rows[0]
                return EnqueueResult(id=id_, run_id=run_id, created=True, state=state)
            found = self.job_find_live_by_key(params.name, params.tenant_id, key)
            if found is not None:
                return found
        raise DatabaseError(  # pragma: no cover - needs a key finishing 20 times in a row
            f"enqueue of {params.name!r} kept conflicting with a live job that finished"
        )

    def jobs_enqueue(self, batch: Sequence[EnqueueParams]) -> list[EnqueueResult]:
        results: list[EnqueueResult | None] = [None] * len(batch)
        copied = [i for i, p in enumerate(batch)
                  if p.idempotency_key is None and p.run_at is None and p.delay_ms == 0]
        if copied:
            self._copy_jobs([batch[i] for i in copied])
            for i in copied:
                p = batch[i]
                results[i] = EnqueueResult(id=p.id, run_id=p.run_id, created=True,
                                           state="ready")
        unkeyed = [i for i, p in enumerate(batch)
                   if p.idempotency_key is None and results[i] is None]
        if unkeyed:
            items = [batch[i] for i in unkeyed]
            states = dict(self._run(S.JOBS_ENQUEUE_UNKEYED, self._batch_args(items)))
            for i in unkeyed:
                p = batch[i]
                results[i] = EnqueueResult(id=p.id, run_id=p.run_id, created=True,
                                           state=states[p.id])
        pending = [i for i, p in enumerate(batch)
                   if p.idempotency_key is not None and p.unique_for_ms is None]
        # The same race in bulk: an item that conflicted with a job which finished before the
        # read-back is inserted again with the next round.
        for _ in range(20):
            if not pending:
                break
            items = [batch[i] for i in pending]
            inserted = dict(self._run(S.JOBS_ENQUEUE, self._batch_args(items)))
            missing: list[int] = []
            for i in pending:
                state = inserted.get(batch[i].id)
                if state is None:
                    missing.append(i)
                else:
                    results[i] = EnqueueResult(
                        id=batch[i].id, run_id=batch[i].run_id, created=True, state=state
                    )
            if missing:
                rows = self._run(S.JOBS_FIND_LIVE_BY_KEYS, {
                    "names": [batch[i].name for i in missing],
                    "tenant_ids": [batch[i].tenant_id for i in missing],
                    "keys": [_key(batch[i]) for i in missing],
                })
                for ord_, id_, run_id, state in rows:
                    results[missing[ord_ - 1]] = EnqueueResult(
                        id=id_, run_id=run_id, created=False, state=state
                    )
            pending = [i for i in missing if results[i] is None]
        if pending:  # pragma: no cover - needs keys finishing 20 times in a row
            raise DatabaseError("bulk enqueue kept conflicting with live jobs that finished")
        # Items with an idempotency window, one at a time after the rest (so a key given with
        # and without a window in one batch still names one job): each is the upsert of its
        # key's row and the insert, which no batch statement can do for two items of one key.
        for i, p in enumerate(batch):
            if p.unique_for_ms is not None:
                results[i] = self._enqueue_windowed(p)
        return [r for r in results if r is not None]

    def _copy_jobs(self, batch: Sequence[EnqueueParams]) -> int:
        """jobs_copy and its NOTIFY, in one transaction (the caller's, or a new one),
        instrumented as one statement; how many rows."""
        return instrumented(S.JOBS_COPY, self._copy, batch)

    def _copy(self, batch: Sequence[EnqueueParams]) -> int:
        conn = connections[self.alias]
        stmt = S.JOBS_COPY
        started = time.perf_counter()
        # Inside the caller's transaction the two statements simply join it; otherwise they
        # get one of their own, so the rows and their NOTIFY commit together.
        with (contextlib.nullcontext() if conn.in_atomic_block
              else db_transaction.atomic(using=self.alias)):
            conn.ensure_connection()
            with conn.wrap_database_errors:
                conn.validate_no_broken_transaction()
                with conn.connection.cursor() as cur, cur.copy(stmt.sql) as copy:
                    for p in batch:
                        copy.write_row((
                            p.id, p.name, p.queue, p.input_json, str(p.id), p.run_id,
                            p.max_attempts, p.priority, p.tenant_id, p.traceparent,
                            p.enqueued_by, p.concurrency_key, p.rate_key,
                        ))
            if conn.queries_logged:  # COPY bypasses Django's cursor: count it all the same
                conn.queries_log.append({
                    "sql": f"{stmt.sql.strip()} -- {len(batch)} rows",
                    "time": f"{time.perf_counter() - started:.3f}",
                })
            counts = collections.Counter((p.queue, p.name) for p in batch)
            self._run(S.JOBS_NOTIFY_QUEUES, {
                "queues": [q for q, _ in counts], "names": [n for _, n in counts],
                "counts": list(counts.values()), "notify": self.notify,
            }, fetch="one")
        return len(batch)

    def _batch_args(self, batch: Sequence[EnqueueParams]) -> dict[str, Any]:
        """jobs_enqueue's parameters: the rows' columns as one JSON array (one C-level dumps
        call), their inputs (already JSON text) as another, joined as strings."""
        meta = json.dumps([
            [str(p.id), p.name, p.queue, p.idempotency_key, str(p.run_id), p.max_attempts,
             p.priority, p.run_at.isoformat() if p.run_at is not None else None, p.delay_ms,
             p.tenant_id, p.traceparent, p.enqueued_by, p.concurrency_key, p.rate_key]
            for p in batch
        ])
        inputs = "[" + ",".join(p.input_json for p in batch) + "]"
        return {"meta": meta, "inputs": inputs, "notify": self.notify}

    def job_find_live_by_key(
        self, name: str, tenant_id: str | None, idempotency_key: str
    ) -> EnqueueResult | None:
        row = self._run(
            S.JOB_FIND_LIVE_BY_KEY,
            {"name": name, "tenant_id": tenant_id, "key": idempotency_key},
            fetch="one",
        )
        if row is None:
            return None
        return EnqueueResult(id=row[0], run_id=row[1], created=False, state=row[2])

    def job_enqueue_debounced(self, params: EnqueueParams, *, debounce_ms: int,
                              max_wait_ms: int | None) -> EnqueueResult:
        key = params.idempotency_key
        assert key is not None, "api.py refuses debounce without an idempotency key"
        insert = {**self._enqueue_args(params), "run_at": None, "delay_ms": debounce_ms}
        live = {
            "name": params.name, "tenant_id": params.tenant_id, "key": key,
            "input": params.input_json, "debounce_ms": debounce_ms, "max_wait_ms": max_wait_ms,
            "concurrency_key": params.concurrency_key, "traceparent": params.traceparent,
            "enqueued_by": params.enqueued_by, "notify": self.notify,
        }
        # One transaction: a run set aside from the key and its follow-up commit together, or
        # neither does. Inside the caller's transaction this joins it (no savepoint).
        with db_transaction.atomic(using=self.alias, savepoint=False):
            # Another enqueue can take the key between the two statements (a first insert that
            # won the race, a follow-up): the next round finds and moves it.
            for _ in range(20):
                row = self._run(S.JOB_DEBOUNCE_LIVE, live, fetch="one")
                if row is not None and row[0] in ("moved", "held"):  # held: a windowed run
                    return EnqueueResult(id=row[1], run_id=row[2], created=False, state=row[3])
                rows = self._run(S.JOB_ENQUEUE, insert)
                if rows:
                    id_, run_id, state, _notified = rows[0]
                    return EnqueueResult(id=id_, run_id=run_id, created=True, state=state)
        raise DatabaseError(  # pragma: no cover - needs the key to change hands 20 times
            f"debounced enqueue of {params.name!r} kept losing its key to other enqueues"
        )

    # --------------------------------------------------------------- idempotency windows --
    def _enqueue_windowed(self, params: EnqueueParams) -> EnqueueResult:
        """job_enqueue with ``params.unique_for_ms`` (docs/durable.md, "Idempotency windows"),
        in one transaction (the caller's, or its own): job_enqueue_windowed says why the key's
        row, not a check, decides."""
        key = params.idempotency_key
        assert key is not None, "api.py refuses unique_for without an idempotency key"
        forever = params.unique_for_ms == UNIQUE_FOREVER
        args = {**self._enqueue_args(params), "job_unique_for_ms": params.unique_for_ms,
                "unique_for_ms": None if forever else params.unique_for_ms}
        where = {"name": params.name, "tenant_id": params.tenant_id, "key": key}
        # One transaction (the caller's, or its own), and no lock kept by an attempt that
        # inserted no job: the upsert locks the key's row even when it does not take it, and a
        # losing enqueue in a request that stays open must not hold that lock (the holder's
        # acknowledgement writes the row); a row taken for a job that was not inserted goes
        # back too (job_enqueue_windowed says more). In the caller's transaction each attempt
        # is a savepoint, rolled back when it lost; in a transaction of its own, a lost attempt
        # rolls that transaction back and the next round opens another.
        in_caller = connections[self.alias].in_atomic_block
        for _ in range(20):
            try:
                with db_transaction.atomic(using=self.alias, savepoint=False):
                    found = self._windowed_round(params, args, where, in_caller)
            except _LostAttempt as lost:
                found = self._after_lost_attempt(params, where, taken=lost.taken)
            if found is not None:
                return found
        raise DatabaseError(  # pragma: no cover - needs the key to change hands 20 times
            f"windowed enqueue of {params.name!r} kept losing its key to other enqueues"
        )

    def _windowed_round(self, params: EnqueueParams, args: Mapping[str, Any],
                        where: Mapping[str, Any], in_caller: bool) -> EnqueueResult | None:
        """One round of a windowed enqueue: the job that answers it, or None to go again;
        _LostAttempt when its attempt at the key inserted no job and was rolled back."""
        held = self._run(S.JOB_KEY_HELD, {**where, "unique_for_ms": args["unique_for_ms"]},
                         fetch="one")
        if held is not None and held[1] is not None:
            return EnqueueResult(id=held[0], run_id=held[1], created=False, state=held[2])
        if held is not None:  # held by a job no longer in x_jobs itself: read with the history
            return self._after_lost_attempt(params, where, taken=False)
        point = db_transaction.savepoint(using=self.alias) if in_caller else None
        taken, id_, run_id, state, _notified = self._run(S.JOB_ENQUEUE_WINDOWED, args,
                                                         fetch="one")
        if id_ is not None:
            if point is not None:
                db_transaction.savepoint_commit(point, using=self.alias)
            return EnqueueResult(id=id_, run_id=run_id, created=True, state=state)
        if point is None:
            raise _LostAttempt(taken)  # rolls this enqueue's own transaction back
        db_transaction.savepoint_rollback(point, using=self.alias)
        return self._after_lost_attempt(params, where, taken=taken)

    def _after_lost_attempt(self, params: EnqueueParams, where: Mapping[str, Any], *,
                            taken: bool) -> EnqueueResult | None:
        """The answer of an attempt that inserted no job (rolled back): the live job of the key
        enqueued without a window (``taken``), or the key's holder; None to go again."""
        if taken:
            return self.job_find_live_by_key(params.name, params.tenant_id,
                                             params.idempotency_key or "")
        holder = self._run(S.JOB_KEY_HOLDER, where, fetch="one")
        if holder is None:
            return None
        job_id, run_id, state = holder
        # A holder deleted by retention has no row left to read: its id still answers, with
        # the id for run_id and "purged" for state.
        return EnqueueResult(id=job_id, run_id=run_id or job_id, created=False,
                             state=state or "purged")

    def job_keys_purge_expired(self, *, batch_size: int = 1000) -> int:
        return self._purge(S.JOB_KEYS_PURGE_EXPIRED, {}, batch_size)

    # ----------------------------------------------------------------------- worker side --
    def jobs_claim(
        self, *, wants: Mapping[str, int], worker_id: str, lease_ms: int,
        flow: ClaimFlow | None = None, cursors: Mapping[str, str] | None = None,
    ) -> ClaimBatch:
        queues = [q for q, n in wants.items() if n > 0]
        batch = ClaimBatch()
        if not queues:
            return batch
        flow = flow or ClaimFlow(slot_ttl_ms=lease_ms)
        cursors = cursors or {}
        rows = self._run(S.JOBS_CLAIM, {
            "queues": queues,
            "limits": [wants[q] for q in queues],
            "fair": [q in flow.fair_queues for q in queues],
            "cursors": [cursors.get(q, "") for q in queues],
            "worker_id": worker_id,
            "lease_ms": lease_ms,
            "slot_ttl_ms": flow.slot_ttl_ms,
            "limit_names": list(flow.limit_names), "limit_values": list(flow.limit_values),
            "prefixes": list(flow.prefixes), "prefix_limits": list(flow.prefix_limits),
            "rate_names": list(flow.rate_names), "rate_limits": list(flow.rate_limits),
            "rate_periods": list(flow.rate_periods_ms), "rate_costs": list(flow.rate_costs),
            "weight_queues": list(flow.weight_queues),
            "weight_tenants": list(flow.weight_tenants),
            "weight_values": list(flow.weight_values),
            "park": flow.park, "hold_ms": flow.hold_ms,
        })
        # The inputs of the batch decoded in one json.loads (a thousand small calls cost twice
        # as much); any surprise (a value the batch cannot decode, an input decoding to a str,
        # which _claimed_job would decode again) and each row is decoded on its own.
        inputs = [r[4] for r in rows if r[0] is not None]
        decoded: Any = None
        if len(inputs) > 1 and all(type(v) is str for v in inputs):
            try:
                decoded = json.loads("[" + ",".join(inputs) + "]")
            except (ValueError, RecursionError):
                decoded = None
            if decoded is not None and any(type(v) is str for v in decoded):
                decoded = None
        k = 0
        for r in rows:
            if r[0] is None:
                batch.retry_at, batch.held, batch.now = r[14], int(r[15]), r[16]
            elif decoded is not None:
                batch.append(_claimed_job((*r[:4], decoded[k], *r[5:])))
                k += 1
            else:
                batch.append(_claimed_job(r))
        return batch

    def _fence_check(self, kind: str, claims: Sequence[Claim]) -> FenceReport:
        rows = self._run(S.JOBS_FENCE_CHECK, {
            "ids": [c.job_id for c in claims], "tokens": [c.lease_token for c in claims],
        })
        applied_states = _APPLIED_STATES[kind]
        states = {
            token: state for token, state, same_token in rows
            if same_token and state in applied_states
        }
        already = frozenset(states)
        lost = frozenset(c.lease_token for c in claims) - already
        return FenceReport(already_applied=already, lost=lost, states=states)

    def _batch_report(self, kind: str, claims: Sequence[Claim],
                      rows: Sequence[Sequence[Any]]) -> FenceReport:
        """The report of a fenced batch write whose answer is ``rows`` of (lease token,
        landed): landed, or busy (another transaction holds its row); the other claims are
        told apart by jobs_fence_check (already applied, or lost)."""
        owned = frozenset(token for token, landed in rows if landed)
        busy = frozenset(token for token, landed in rows if not landed)
        if len(owned) + len(busy) == len(claims):
            return FenceReport(owned=owned, busy=busy)
        rest = self._fence_check(kind, [c for c in claims
                                        if c.lease_token not in owned | busy])
        return FenceReport(owned=owned, busy=busy, already_applied=rest.already_applied,
                           lost=rest.lost, states=rest.states)

    def _one_report(self, kind: str, claim: Claim, row: Sequence[Any] | None) -> FenceReport:
        """The report of a fenced write of one run whose answer is ``row`` (its first column
        `busy` when another transaction holds the job's row)."""
        if row is not None and row[0] == "busy":
            return FenceReport(busy=frozenset({claim.lease_token}))
        if row is not None:
            return FenceReport(owned=frozenset({claim.lease_token}))
        return self._fence_check(kind, [claim])

    def jobs_complete_if_owned(self, batch: Sequence[Completion]) -> FenceReport:
        if not batch:
            return FenceReport()
        batch = _in_lock_order(batch)
        rows = self._run(S.JOBS_COMPLETE_IF_OWNED, {
            **_claims(c.claim for c in batch),
            "results": "[" + ",".join(c.result_json or "null" for c in batch) + "]",
        })
        return self._batch_report("complete", [c.claim for c in batch], rows)

    def job_fail_if_owned(self, failure: Failure) -> tuple[FenceReport, str | None]:
        row = self._run(S.JOB_FAIL_IF_OWNED, {
            **_fence(failure.claim), "error": failure.error,
            "delay_ms": failure.retry_delay_ms, "permanent": failure.permanent,
            "outcome": failure.outcome,
        }, fetch="one")
        report = self._one_report("fail", failure.claim, row)
        if report.owned:
            return report, row[0]
        return report, report.states.get(failure.claim.lease_token)

    def job_requeue_if_owned(self, requeue: Requeue) -> FenceReport:
        row = self._run(S.JOB_REQUEUE_IF_OWNED, {
            **_fence(requeue.claim), "delay_ms": requeue.delay_ms,
            "spent": requeue.spent_attempt, "resumed": requeue.resumed, "note": requeue.note,
            "outcome": requeue.outcome,
        }, fetch="one")
        return self._one_report("requeue", requeue.claim, row)

    def job_give_back_unknown_if_owned(self, give_back: UnknownGiveBack) -> FenceReport:
        row = self._run(S.JOB_GIVE_BACK_UNKNOWN_IF_OWNED, {
            **_fence(give_back.claim), "spent": give_back.spent_attempt,
            "resumed": give_back.resumed, "note": give_back.note,
            "max_ms": give_back.max_delay_ms,
        }, fetch="one")
        return self._one_report("requeue", give_back.claim, row)

    def jobs_unknown_waiting(self, *, names: Iterable[str] | None = None,
                             tenant_ids: Iterable[str] | None = None) -> list[UnknownWait]:
        rows = self._run(S.JOBS_UNKNOWN_WAITING, {
            "names": list(names) if names is not None else None,
            "tenant_ids": _tenants(tenant_ids),
        })
        return [UnknownWait(queue=r[0], name=r[1], count=r[2], since=r[3], waited=r[4],
                            cron_tasks=tuple(sorted(r[5]))) for r in rows]

    def job_suspend_if_owned(self, suspension: Suspension) -> FenceReport:
        row = self._run(S.JOB_SUSPEND_IF_OWNED, {
            **_fence(suspension.claim), "wake_at": suspension.wake_at,
        }, fetch="one")
        return self._one_report("suspend", suspension.claim, row)

    def jobs_renew_if_owned(self, claims: Sequence[Claim], lease_ms: int) -> Renewal:
        if not claims:
            return Renewal()
        rows = self._run(S.JOBS_RENEW_IF_OWNED, {
            **_claims(sorted(claims, key=lambda c: c.job_id)),
            "lease_ms": lease_ms,
        })
        return Renewal(renewed=frozenset(token for token, on_row in rows if on_row),
                       kept=frozenset(token for token, on_row in rows if not on_row))

    # ----------------------------------------------------------------------------- steps --
    @contextlib.contextmanager
    def atomic(self) -> Any:
        """A transaction of django-xjobs's own (a step's, a batch's, a scheduler round's), or a
        savepoint in the caller's. Opened at READ COMMITTED whatever the connection's default
        (DATABASES OPTIONS "isolation_level"): the rendezvous of events, the fences and the
        rate budgets need each statement's snapshot to follow the locks it took
        (docs/guarantees.md, "Isolation levels"). Inside the caller's transaction its level is
        the caller's, and what needs READ COMMITTED refuses any other."""
        conn = connections[self.alias]
        outermost = not conn.in_atomic_block
        with db_transaction.atomic(using=self.alias):
            if outermost and _isolation_level(conn) not in (None, _READ_COMMITTED):
                with conn.cursor() as cursor:
                    cursor.execute("set transaction isolation level read committed")
            yield

    def in_transaction(self) -> bool:
        return connections[self.alias].in_atomic_block

    def steps_of_run(self, run_id: str) -> list[StepRecord]:
        return [
            StepRecord(
                name=r[0], status=r[1],
                output=_decode_json_for_run(r[2], f"output of step {r[0]!r}"),
                attempts=r[3], error=r[4],
                started_at=r[5], completed_at=r[6], wake_at=r[7], event=r[8],
                correlation_key=r[9], event_id=r[10], event_published_at=r[11], due=r[12],
                kind=r[13],
            )
            for r in self._run(S.STEPS_OF_RUN, {"run_id": run_id})
        ]

    # ---- deploy check ----
    def runs_suspended_list(self, *, name: str | None = None, after_id: str | None = None,
                            limit: int = 500) -> list[JobRecord]:
        return [_job_record(r) for r in self._run(
            S.RUNS_SUSPENDED_LIST, {"name": name, "after_job_id": after_id, "limit": limit})]

    def steps_of_run_in_order(self, run_id: str) -> list[StepRecord]:
        return [
            StepRecord(
                name=r[0], status=r[1],
                output=_decode_json_for_run(r[2], f"output of step {r[0]!r}"),
                attempts=r[3], error=r[4], started_at=r[5], completed_at=r[6], wake_at=r[7],
                event=r[8], correlation_key=r[9], event_id=r[10], event_published_at=r[11],
                kind=r[12],
            )
            for r in self._run(S.STEPS_OF_RUN_IN_ORDER, {"run_id": run_id})
        ]
    # ---- end deploy check ----

    @staticmethod
    def _owner(owner: RunOwner) -> dict[str, Any]:
        return {"job_id": owner.claim.job_id, "token": owner.claim.lease_token,
                "run_id": owner.run_id}

    @staticmethod
    def _unless_busy(row: Sequence[Any], what: str) -> Sequence[Any]:
        """The answer of a step write, whose last column says whether it found the job's row
        held by another transaction: RowBusy then (nothing was written)."""
        if row[-1]:
            raise RowBusy(f"{what}: the job's row is held by another transaction")
        return row

    def step_complete_if_owned(
        self, owner: RunOwner, name: str, output_json: str | None, *,
        event: str | None = None, correlation_key: str | None = None,
        event_id: int | None = None, event_published_at: datetime | None = None,
        kind: str = "run",
    ) -> bool:
        row = self._unless_busy(self._run(S.STEP_COMPLETE_IF_OWNED, {
            **self._owner(owner), "name": name, "output": output_json, "event": event,
            "kind": kind,
            "correlation_key": correlation_key, "event_id": event_id,
            "event_published_at": event_published_at,
        }, fetch="one"), f"step {name!r}")
        return row[0] is not None

    def step_fail_if_owned(self, owner: RunOwner, name: str, error: str) -> int | None:
        row = self._unless_busy(self._run(S.STEP_FAIL_IF_OWNED, {
            **self._owner(owner), "name": name, "error": error}, fetch="one"), f"step {name!r}")
        return row[0]

    def step_park_if_owned(
        self, owner: RunOwner, name: str, *, status: str, wake_at: datetime | None = None,
        duration_ms: int = 0, event: str | None = None, correlation_key: str | None = None,
        kind: str | None = None,
    ) -> ParkedStep | None:
        row = self._unless_busy(self._run(S.STEP_PARK_IF_OWNED, {
            **self._owner(owner), "name": name, "status": status, "wake_at": wake_at,
            "kind": kind or ("sleep" if status == "sleeping" else "event"),
            "duration_ms": duration_ms, "event": event, "correlation_key": correlation_key,
        }, fetch="one"), f"step {name!r}")
        if row[0] is None:
            return None
        return ParkedStep(started_at=row[0], wake_at=row[1], due=row[2])

    def step_cancel_siblings(self, owner: RunOwner, prefix: str) -> None:
        self._unless_busy(self._run(S.STEP_CANCEL_SIBLINGS, {
            **self._owner(owner), "prefix": _like_prefix(prefix)}, fetch="one"),
            f"the waits of {prefix!r}")

    # -------------------------------------------------------------------------- children --
    def step_invoke_open_if_owned(self, owner: RunOwner, name: str, *, children: Sequence[str],
                                  timeout_ms: int | None) -> InvokeStep | None:
        row = self._unless_busy(self._run(S.STEP_INVOKE_OPEN_IF_OWNED, {
            **self._owner(owner), "name": name, "children": json.dumps(list(children)),
            "pending": len(children), "timeout_ms": timeout_ms,
        }, fetch="one"), f"step {name!r}")
        output, opened, due, park_at, _busy = row
        if opened is None:
            return None
        recorded = _decode_json_for_run(output, f"output of step {name!r}")
        if not isinstance(recorded, dict) or not isinstance(recorded.get("children"), list):
            raise StepNameReused(
                f"step {name!r} of this run was recorded as another kind of step (a deploy "
                "renamed it?); give the invoke or gather a name of its own")
        return InvokeStep(children=list(recorded["children"]), opened=opened, due=due,
                          park_at=park_at)

    def step_invoke_pending_if_owned(self, owner: RunOwner, name: str, pending: int) -> bool:
        row = self._unless_busy(self._run(S.STEP_INVOKE_PENDING_IF_OWNED, {
            **self._owner(owner), "name": name, "pending": pending}, fetch="one"),
            f"step {name!r}")
        return row[0] is not None

    def jobs_enqueue_children(self, batch: Sequence[EnqueueParams], *, parent_id: UUID,
                              parent_step: str) -> None:
        self._run(S.JOBS_ENQUEUE_CHILDREN, {
            **self._batch_args(batch), "parent_id": parent_id, "parent_step": parent_step,
        }, fetch="count")

    def jobs_children(self, ids: Sequence[str]) -> list[ChildState]:
        rows = self._run(S.JOBS_CHILDREN, {"ids": list(ids)})
        if any(r[2] is None for r in rows):  # one was archived (or purged): look further
            rows = self._run(S.JOBS_CHILDREN_ARCHIVED, {"ids": list(ids)})
        return [ChildState(id=r[0], name=r[1], state=r[2],
                           result=_decode_json_for_run(r[3], f"result of child job {r[0]}"),
                           error=r[4]) for r in rows]

    def jobs_cancel_tree(self, *, ids: Sequence[str] = (), parents: Sequence[str] = (),
                         reason: str | None, wait: bool = True) -> int:
        stmt = S.JOBS_CANCEL_TREE if wait else S.JOBS_CANCEL_TREE_FREE
        cancelled, _left = self._run(stmt, {
            "ids": list(ids), "parents": list(parents), "reason": reason}, fetch="one")
        return int(cancelled)

    # ---------------------------------------------------------------------------- events --
    def event_lock(self, names: Sequence[str]) -> None:
        self._run(S.EVENT_LOCK, {"names": list(names)}, fetch="one")

    def event_publish(
        self, name: str, payload_json: str, correlation_key: str | None, ttl_ms: int
    ) -> EventRecord:
        id_, published_at, expires_at = self._run(S.EVENT_PUBLISH, {
            "name": name, "payload": payload_json, "correlation_key": correlation_key,
            "ttl_ms": ttl_ms,
        }, fetch="one")
        return EventRecord(id=id_, name=name, payload=_decode_json(payload_json),
                           correlation_key=correlation_key, published_at=published_at,
                           expires_at=expires_at)

    def event_wake_waiters(self, name: str, correlation_key: str | None) -> int:
        woken, _queues = self._run(S.EVENT_WAKE_WAITERS, {
            "name": name, "correlation_key": correlation_key,
        }, fetch="one")
        return int(woken)

    def event_next(
        self, names: Sequence[str], correlation_key: str | None, after_at: datetime,
        after_id: int,
    ) -> EventRecord | None:
        stmt = S.EVENT_NEXT if correlation_key is None else S.EVENT_NEXT_KEYED
        row = self._run(stmt, {
            "names": list(names), "correlation_key": correlation_key, "after_at": after_at,
            "after_id": after_id,
        }, fetch="one")
        if row is None:
            return None
        payload = _decode_json_for_run(row[2], f"payload of event {row[1]!r} #{row[0]}")
        return EventRecord(id=row[0], name=row[1], payload=payload, published_at=row[3])

    def events_list(self, name: str | None = None, limit: int = 100) -> list[EventRecord]:
        return [
            EventRecord(id=r[0], name=r[1], payload=_decode_json(r[2]), correlation_key=r[3],
                        published_at=r[4], expires_at=r[5])
            for r in self._run(S.EVENTS_LIST, {"name": name, "limit": limit})
        ]

    def events_purge(self, batch_size: int = 1000) -> int:
        return self._purge(S.EVENTS_PURGE, {}, batch_size)

    # ------------------------------------------------------------------------- operators --
    def job_get(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> JobRecord | None:
        job_uuid = _as_uuid(job_id)
        if job_uuid is None:
            return None
        row = self._run(S.JOB_GET, {"id": job_uuid, "tenant_ids": _tenants(tenant_ids)},
                        fetch="one")
        return _job_record(row) if row is not None else None

    def _change_result(self, row: Sequence[Any] | None, job_id: str,
                       tenant_ids: Iterable[str] | None, *, unchanged: str) -> ChangeResult:
        """An operator's action answered: the job as the statement changed it, or, when it
        matched no row, the job as it is now with the reason ``unchanged`` (``{state}`` filled
        in), or "not found" (also for a job outside the tenant scope)."""
        if row is not None:
            return ChangeResult(job=_job_record(row), changed=True)
        current = self.job_get(job_id, tenant_ids=tenant_ids)
        if current is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        return ChangeResult(job=current, changed=False,
                            reason=unchanged.format(state=current.state))

    def job_cancel(
        self, job_id: str, *, reason: str | None, tenant_ids: Iterable[str] | None = None
    ) -> ChangeResult:
        job_uuid = _as_uuid(job_id)
        if job_uuid is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        # A savepoint: the job's move back from its history table, its live children's cancel
        # and its own are one. The children go first (jobs_cancel_tree says why); when the job
        # itself cannot be cancelled (finished, another tenant's), neither are they.
        try:
            with db_transaction.atomic(using=self.alias):
                self._unarchive(job_uuid, tenant_ids)
                self.jobs_cancel_tree(parents=[str(job_uuid)], reason=reason)
                row = self._run(S.JOB_CANCEL, {
                    "id": job_uuid, "reason": reason, "tenant_ids": _tenants(tenant_ids),
                }, fetch="one")
                if row is None:
                    raise _Unchanged
                # Children a parent inserted while the first pass ran were not visible to it;
                # the cancel above waited for that parent's transaction, so this statement's
                # snapshot sees them.
                self.jobs_cancel_tree(parents=[str(job_uuid)], reason=reason)
        except _Unchanged:
            row = None
        return self._change_result(row, job_id, tenant_ids, unchanged="already {state}")

    def _unarchive(self, job_uuid: UUID, tenant_ids: Iterable[str] | None) -> None:
        """Move a finished job (and its steps) back from its history table into x_jobs, if it
        is in one, so that an operator's change to it can run on x_jobs (job_unarchive)."""
        self._run(S.JOB_UNARCHIVE, {"id": job_uuid, "tenant_ids": _tenants(tenant_ids)},
                  fetch="count")

    def job_retry(self, job_id: str, *, tenant_ids: Iterable[str] | None = None,
                  enqueued_by: str | None = None) -> ChangeResult:
        job_uuid = _as_uuid(job_id)
        if job_uuid is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        try:
            # A savepoint, so a refused retry inside the caller's transaction leaves it usable.
            with db_transaction.atomic(using=self.alias):
                self._unarchive(job_uuid, tenant_ids)
                row = self._run(S.JOB_RETRY, {
                    "id": job_uuid, "tenant_ids": _tenants(tenant_ids), "notify": self.notify,
                    "enqueued_by": enqueued_by,
                }, fetch="one")
        except IntegrityError:
            current = self.job_get(job_id, tenant_ids=tenant_ids)
            live = None
            if current is not None:
                live = self.job_find_live_by_key(
                    current.name, current.tenant_id, current.idempotency_key
                )
            raise LiveJobExists(
                f"job {job_id} was not retried: live job {live.id if live else '?'} holds its "
                f"idempotency key",
                live_job_id=str(live.id) if live else None,
            ) from None
        return self._change_result(
            row, job_id, tenant_ids,
            unchanged="is {state}, only dead or cancelled jobs can be retried",
        )

    def job_run_now(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> ChangeResult:
        job_uuid = _as_uuid(job_id)
        if job_uuid is None:
            return ChangeResult(job=None, changed=False, reason="not found")
        row = self._run(S.JOB_RUN_NOW, {
            "id": job_uuid, "tenant_ids": _tenants(tenant_ids), "notify": self.notify,
        }, fetch="one")
        return self._change_result(row, job_id, tenant_ids, unchanged="is {state} and due")

    def jobs_purge(
        self, *, states: Sequence[str], finished_before: datetime, batch_size: int = 1000,
        history: bool = False,
    ) -> int:
        return self._purge(S.JOBS_PURGE_ALL if history else S.JOBS_PURGE,
                           {"states": list(states), "before": finished_before}, batch_size)

    def jobs_archive(self, *, state: str, finished_before: datetime, batch_size: int = 1000,
                     keep_going: Callable[[], bool] = lambda: True) -> int:
        total = 0
        while keep_going():
            moved = self._run(S.JOBS_ARCHIVE, {
                "state": state, "before": finished_before, "batch": batch_size,
            }, fetch="one")[0]
            total += moved
            if moved == 0:
                return total
        return total

    def history_drop(self, *, state: str, finished_before: datetime) -> list[str]:
        return [r[0] for r in self._run(S.HISTORY_DROP, {
            "state": state, "before": finished_before,
        })]

    def history_tables(self) -> list[HistoryTable]:
        return [HistoryTable(table=r[0], rows=max(int(r[1]), 0), size_bytes=int(r[2]))
                for r in self._run(S.HISTORY_TABLES, {})]

    def queue_stats(self, *, tenant_ids: Iterable[str] | None = None) -> list[QueueStats]:
        return [
            QueueStats(queue=r[0], ready=r[1], delayed=r[2], running=r[3], suspended=r[4],
                       blocked=r[5], dead=r[6], done=r[7], cancelled=r[8])
            for r in self._run(S.QUEUE_STATS, {"tenant_ids": _tenants(tenant_ids)})
        ]

    def outbox_pending(
        self, *, tenant_ids: Iterable[str] | None = None
    ) -> tuple[int, float | None]:
        count, age = self._run(S.OUTBOX_PENDING, {"tenant_ids": _tenants(tenant_ids)},
                               fetch="one")
        return int(count), age

    # ---------------------------------------------------------------------- observability --
    def queue_depth(self, *, tenant_ids: Iterable[str] | None = None) -> list[QueueDepth]:
        return [
            QueueDepth(queue=r[0], ready=r[1], delayed=r[2], running=r[3], suspended=r[4],
                       blocked=r[5], oldest_ready_age=r[6])
            for r in self._run(S.QUEUE_DEPTH, {"tenant_ids": _tenants(tenant_ids)})
        ]

    def job_progress_if_owned(self, claim: Claim, *, done: float, total: float | None,
                              message: str | None) -> bool:
        row = self._run(S.JOB_PROGRESS_IF_OWNED, {
            **_fence(claim), "done": done, "total": total, "message": message,
        }, fetch="one")
        return row is not None

    def stats_rollup(self, batch_size: int = 10_000) -> int:
        folded, _stored = self._run(S.STATS_ROLLUP, {"batch": batch_size}, fetch="one")
        return int(folded)

    def stats_prune(self, *, minute_keep: float, hour_keep: float, day_keep: float,
                    batch_size: int = 1000) -> int:
        return self._purge(S.STATS_PRUNE, {
            "minute_ms": round(minute_keep * 1000), "hour_ms": round(hour_keep * 1000),
            "day_ms": round(day_keep * 1000),
        }, batch_size)

    def stats_series(self, grain: str, since: datetime, *,
                     queue: str | None = None) -> list[Counters]:
        if grain not in ("minute", "hour", "day"):
            raise ValueError(f"grain must be minute, hour or day, not {grain!r}")
        rows = self._run(S.STATS_SERIES, {"grain": grain, "since": since, "queue": queue})
        return [_counters(r[1], None, r[0], r[2:]) for r in rows]

    def stats_totals(self) -> list[Counters]:
        return [_counters(r[0], r[1], None, r[2:]) for r in self._run(S.STATS_TOTALS, {})]

    # ---------------------------------------------------------- why a job is not running --
    def why_job(self, job_id: str, *, tenant_ids: Iterable[str] | None = None) -> FlowFacts | None:
        job_uuid = _as_uuid(job_id)
        if job_uuid is None:
            return None
        r = self._run(S.WHY_JOB, {"id": job_uuid, "tenant_ids": _tenants(tenant_ids)},
                      fetch="one")
        if r is None:
            return None
        pauses = tuple(
            PauseRecord(kind=kind, key=key,
                        until=datetime.fromisoformat(until) if until is not None else None,
                        reason=reason)
            for kind, key, until, reason in json.loads(r[11])
        )
        return FlowFacts(
            id=r[0], name=r[1], queue=r[2], state=r[3], run_at=r[4], attempt=r[5],
            last_error=r[6], concurrency_key=r[7], rate_key=r[8], blocked_on=r[9], now=r[10],
            pauses=pauses, holders=tuple(r[12]), worker_seen=r[13], unknown_since=r[14],
            unknown_workers=tuple(json.loads(r[15])) if r[15] else (), enqueued_by=r[16],
        )

    def why_rate_window(self, key: str, *, limit: int, period_ms: int, cost: int) -> RateWindow:
        spent, next_at = self._run(S.WHY_RATE_WINDOW, {
            "key": key, "limit": limit, "period_ms": period_ms, "cost": cost,
        }, fetch="one")
        return RateWindow(key=key, spent=int(spent), next_at=next_at)

    # ------------------------------------------------------------------------- backfills --
    def backfill_create(self, *, run_id: str, name: str, job_id: str, checksum: str,
                        app_version: str) -> bool:
        created = self._run(S.BACKFILL_CREATE, {
            "run_id": run_id, "name": name, "job_id": job_id, "checksum": checksum,
            "app_version": app_version,
        }, fetch="count")
        return bool(created)

    def _backfill_write(self, stmt: Statement, owner: RunOwner,
                        params: Mapping[str, Any]) -> Sequence[Any] | None:
        """A backfill write (fenced by a lock on the job's row taken SKIP LOCKED): its answer,
        None when it wrote nothing (the run lost its job, or the pass is not running), RowBusy
        when another transaction holds the job's row."""
        row = self._unless_busy(self._run(stmt, {**self._owner(owner), **params}, fetch="one"),
                                stmt.name)
        return None if row[0] is None else row[:-1]

    def backfill_start_if_owned(self, owner: RunOwner, *, name: str, checksum: str,
                                app_version: str) -> BackfillRecord | None:
        row = self._backfill_write(S.BACKFILL_START_IF_OWNED, owner, {
            "name": name, "checksum": checksum, "app_version": app_version})
        return _backfill_record(row) if row is not None else None

    def backfill_progress_if_owned(self, owner: RunOwner, *, processed: int,
                                   cursor_json: str) -> int | None:
        row = self._backfill_write(S.BACKFILL_PROGRESS_IF_OWNED, owner, {
            "processed": processed, "cursor": cursor_json})
        return int(row[0]) if row is not None else None

    def backfill_complete_if_owned(self, owner: RunOwner, *, processed: int) -> int | None:
        row = self._backfill_write(S.BACKFILL_COMPLETE_IF_OWNED, owner,
                                   {"processed": processed})
        return int(row[0]) if row is not None else None

    def backfill_fail_if_owned(self, owner: RunOwner, *, error: str) -> bool:
        return self._backfill_write(S.BACKFILL_FAIL_IF_OWNED, owner, {"error": error}) is not None

    def backfill_cancel(self, run_id: str) -> BackfillRecord | None:
        run_uuid = _as_uuid(run_id)
        if run_uuid is None:
            return None
        row = self._run(S.BACKFILL_CANCEL, {"run_id": run_uuid}, fetch="one")
        return _backfill_record(row) if row is not None else None

    def backfills_list(self, *, name: str | None = None, status: str | None = None,
                       run_id: str | None = None, limit: int = 50) -> list[BackfillRecord]:
        run_uuid = None
        if run_id is not None:
            run_uuid = _as_uuid(run_id)
            if run_uuid is None:
                return []
        rows = self._run(S.BACKFILLS_LIST, {
            "name": name, "status": status, "run_id": run_uuid, "limit": limit,
        })
        return [_backfill_record(r) for r in rows]

    def backfill_get(self, run_id: str) -> BackfillRecord | None:
        found = self.backfills_list(run_id=run_id, limit=1)
        return found[0] if found else None

    # ---------------------------------------------------------------------------- outbox --
    def outbox_stage(self, row: OutboxRow) -> None:
        self._run(S.OUTBOX_STAGE, {
            "id": row.id, "name": row.name, "queue": row.queue, "input": row.input_json,
            "key": row.idempotency_key, "max_attempts": row.max_attempts,
            "run_at": row.run_at, "delay_ms": row.delay_ms, "priority": row.priority,
            "tenant_id": row.tenant_id, "traceparent": row.traceparent,
            "enqueued_by": row.enqueued_by, "concurrency_key": row.concurrency_key,
            "rate_key": row.rate_key, "unique_for_ms": row.unique_for_ms,
            "notify": self.notify,
        }, fetch="one")

    def outbox_claim(self, batch_size: int) -> list[OutboxRow]:
        return [
            OutboxRow(
                id=r[0], name=r[1], queue=r[2], input_json=r[3], idempotency_key=r[4],
                max_attempts=r[5], run_at=r[6], priority=r[7], tenant_id=r[8],
                traceparent=r[9], enqueued_by=r[10], concurrency_key=r[11], rate_key=r[12],
                unique_for_ms=r[13],
            )
            for r in self._run(S.OUTBOX_CLAIM, {"batch": batch_size})
        ]

    def outbox_mark_published(self, published: Mapping[UUID, UUID]) -> int:
        if not published:
            return 0
        return int(self._run(S.OUTBOX_MARK_PUBLISHED, {
            "ids": _uuid_array(published), "job_ids": _uuid_array(published.values()),
        }, fetch="count"))

    def outbox_status(self, outbox_id: UUID | str) -> OutboxStatus | None:
        outbox_uuid = _as_uuid(outbox_id)
        if outbox_uuid is None:
            return None
        row = self._run(S.OUTBOX_STATUS, {"id": outbox_uuid}, fetch="one")
        if row is None:
            return None
        return OutboxStatus(id=row[0], name=row[1], staged_at=row[2], published_at=row[3],
                            job_id=row[4], input=_decode_json(row[5]))

    def jobs_find_by_ids(self, ids: Sequence[UUID]) -> list[EnqueueResult]:
        if not ids:
            return []
        return [
            EnqueueResult(id=r[0], run_id=r[1], created=False, state=r[2])
            for r in self._run(S.JOBS_FIND_BY_IDS, {"ids": _uuid_array(ids)})
        ]

    def outbox_listener(self, channel_label: str) -> Listener:
        return PostgresListener(self.listen_alias, channel_label, listen=S.OUTBOX_LISTEN)

    # ----------------------------------------------------------------- concurrency slots --
    def slots_acquire(self, requests: Sequence[SlotRequest], ttl_ms: int) -> list[SlotHold]:
        if not requests:
            return []
        rows = self._run(S.SLOTS_ACQUIRE, {
            "keys": [r.slot_key for r in requests], "limits": [r.limit for r in requests],
            "holders": [r.holder for r in requests], "ttl_ms": ttl_ms,
        })
        limits = {r.holder: r.limit for r in requests}
        return [SlotHold(slot_key=r[0], slot=r[1], holder=r[2], limit=limits[r[2]])
                for r in rows]

    @staticmethod
    def _holds(holds: Sequence[SlotHold]) -> dict[str, Any]:
        # Sorted by (key, slot), the order the statements lock them in (docs/design.md, "Lock
        # order"); they lock SKIP LOCKED, so this is for the reader of a log.
        ordered = sorted(holds, key=lambda h: (h.slot_key, h.slot))
        return {"keys": [h.slot_key for h in ordered], "slots": [h.slot for h in ordered],
                "holders": [h.holder for h in ordered]}

    def slots_renew_if_held(self, holds: Sequence[SlotHold], ttl_ms: int) -> Renewal:
        if not holds:
            return Renewal()
        rows = self._run(S.SLOTS_RENEW_IF_HELD, {**self._holds(holds), "ttl_ms": ttl_ms})
        return Renewal(renewed=frozenset(holder for holder, landed in rows if landed),
                       kept=frozenset(holder for holder, landed in rows if not landed))

    def slots_release_if_held(self, holds: Sequence[SlotHold]) -> tuple[int, list[SlotHold]]:
        if not holds:
            return 0, []
        ordered = sorted(holds, key=lambda h: (h.slot_key, h.slot))
        released, _woken, busy = self._run(S.SLOTS_RELEASE_IF_HELD, {
            **self._holds(ordered), "limits": [h.limit for h in ordered], "notify": self.notify,
        }, fetch="one")
        held = set(busy or ())
        return int(released), [h for h in ordered if h.holder in held]

    def worker_seen(self, worker_id: str, host: str, pid: int, queues: Sequence[str], *,
                    version: str, concurrency: int, running: int, finished: int,
                    claimed_age: float | None, loop_age: float | None) -> None:
        self._run(S.WORKER_SEEN, {
            "worker_id": worker_id, "host": host, "pid": pid, "queues": json.dumps(list(queues)),
            "version": version, "concurrency": concurrency, "running": running,
            "finished": finished,
            "claimed_age_ms": None if claimed_age is None else round(claimed_age * 1000),
            "loop_age_ms": None if loop_age is None else round(loop_age * 1000),
        }, fetch="count")

    def workers_list(self, *, max_stall: float) -> list[WorkerRecord]:
        return [
            WorkerRecord(
                id=r[0], host=r[1], pid=r[2], queues=tuple(r[3]), version=r[4],
                concurrency=r[5], running=r[6], finished=r[7], started_at=r[8], seen_at=r[9],
                claimed_at=r[10], loop_at=r[11],
                stalled=None if r[12] is None else stall_reason(r[12], float(r[13]) / 1000,
                                                                r[14], r[15]),
            )
            for r in self._run(S.WORKERS_LIST, {"stall_ms": round(max_stall * 1000)})
        ]

    def worker_gone(self, worker_id: str, stale_after: float = 86_400.0) -> None:
        self._run(S.WORKER_GONE, {"worker_id": worker_id,
                                  "stale_ms": round(stale_after * 1000)}, fetch="count")

    # ----------------------------------------------------------------------- fleet --
    def fleet_get(self) -> FleetRecord:
        row = self._run(S.FLEET_GET, {}, fetch="one")
        return FleetRecord() if row is None else FleetRecord(
            compatible_with=row[0], changed_at=row[1], changed_by=row[2])

    def fleet_set(self, *, compatible_with: str | None, changed_by: str) -> FleetRecord:
        row = self._run(S.FLEET_SET, {"compatible_with": compatible_with,
                                      "changed_by": changed_by}, fetch="one")
        return FleetRecord(compatible_with=row[0], changed_at=row[1], changed_by=row[2])

    # ---------------------------------------------------------------- flow control --
    def jobs_unblock(self, flow: ClaimFlow, batch: int = 1000) -> int:
        woken, _notified = self._run(S.JOBS_UNBLOCK, {
            "prefixes": list(flow.prefixes), "prefix_limits": list(flow.prefix_limits),
            "limit_names": list(flow.limit_names), "limit_values": list(flow.limit_values),
            "batch": batch, "park": flow.park, "notify": self.notify,
        }, fetch="one")
        return int(woken)

    def rate_take(self, requests: Sequence[RateRequest]) -> list[datetime | None]:
        if not requests:
            return []
        rows = self._run(S.RATE_TAKE, {
            "keys": [r.key for r in requests], "limits": [r.limit for r in requests],
            "periods": [r.period_ms for r in requests], "costs": [r.cost for r in requests],
        })
        found = {int(n): next_at for n, next_at in rows}
        return [found.get(i + 1) for i in range(len(requests))]

    def slots_list(self, *, slot_key: str | None = None, limit: int = 1000) -> list[SlotRecord]:
        return [
            SlotRecord(slot_key=r[0], slot=r[1], holder=r[2], expires_at=r[3],
                       expires_in=r[4] / 1000)
            for r in self._run(S.SLOTS_LIST, {"key": slot_key, "limit": limit})
        ]

    def slots_usage(self, limit: int = 1000) -> list[SlotUsage]:
        return [
            SlotUsage(slot_key=r[0], held=r[1], next_expiry=r[2])
            for r in self._run(S.SLOTS_USAGE, {"limit": limit})
        ]

    def jobs_wake_refused(self, refused: Sequence[Claim]) -> int:
        if not refused:
            return 0
        woken, _notified = self._run(S.JOBS_WAKE_REFUSED, {
            **_claims(refused), "notify": self.notify,
        }, fetch="one")
        return int(woken)

    def jobs_requeue_if_owned(self, batch: Sequence[Requeue]) -> FenceReport:
        if not batch:
            return FenceReport()
        batch = _in_lock_order(batch)
        rows = self._run(S.JOBS_REQUEUE_IF_OWNED, {
            **_claims(r.claim for r in batch),
            "delays_ms": [r.delay_ms for r in batch],
            "spent": [r.spent_attempt for r in batch],
            "resumed": [r.resumed for r in batch],
            "notes": [r.note for r in batch],
            "outcomes": [r.outcome for r in batch],
        })
        return self._batch_report("requeue", [r.claim for r in batch], rows)

    # ---------------------------------------------------------------------------- pauses --
    def pause_upsert(self, kind: str, key: str, *, until: datetime | None, for_ms: int | None,
                     reason: str | None) -> PauseRecord | None:
        row = self._run(S.PAUSE_UPSERT, {
            "kind": kind, "key": key, "until": until, "for_ms": for_ms, "reason": reason,
        }, fetch="one")
        return None if row is None else _pause_record(row)

    def pause_resume_queue(self, queue: str) -> bool:
        in_force, _notified = self._run(S.PAUSE_RESUME_QUEUE, {
            "queue": queue, "notify": self.notify,
        }, fetch="one")
        return bool(in_force)

    def pause_resume_key(self, key: str) -> tuple[bool, int]:
        in_force, unblocked, _notified = self._run(S.PAUSE_RESUME_KEY, {
            "key": key, "notify": self.notify,
        }, fetch="one")
        return bool(in_force), int(unblocked)

    def pauses_list(self, *, kind: str | None = None, limit: int = 1000) -> list[PauseRecord]:
        return [_pause_record(r) for r in self._run(S.PAUSES_LIST, {"kind": kind,
                                                                     "limit": limit})]

    def job_pause_key_if_owned(self, requeue: KeyPauseRequeue) -> tuple[FenceReport,
                                                                         datetime | None]:
        row = self._run(S.JOB_PAUSE_KEY_IF_OWNED, {
            **_fence(requeue.claim), "key": requeue.key, "for_ms": requeue.for_ms,
            "reason": requeue.reason, "delay_ms": 0, "spent": requeue.spent_attempt,
            "resumed": requeue.resumed, "note": requeue.note, "outcome": "handed_back",
        }, fetch="one")
        report = self._one_report("requeue", requeue.claim, row)
        return report, row[1] if report.owned else None

    # ------------------------------------------------------------------------- scheduler --
    def leader_attempt_elect(self, lock_key: str, holder: str, lease_ms: int) -> datetime | None:
        row = self._run(S.LEADER_ATTEMPT_ELECT, {
            "lock_key": lock_key, "holder": holder, "lease_ms": lease_ms,
        }, fetch="one")
        return row[0] if row is not None else None

    def leader_resign(self, lock_key: str, holder: str) -> bool:
        return bool(self._run(S.LEADER_RESIGN, {"lock_key": lock_key, "holder": holder},
                              fetch="count"))

    def leader_get(self, lock_key: str) -> LeaderRecord | None:
        row = self._run(S.LEADER_GET, {"lock_key": lock_key}, fetch="one")
        if row is None:
            return None
        return LeaderRecord(lock_key=row[0], mode="lease", holder=row[1], expires_at=row[2],
                            live=bool(row[3]))

    def leader_advisory_session(self, lock_key: str, label: str) -> AdvisorySession:
        return PostgresAdvisorySession(self.listen_alias, lock_key, label)

    def leader_advisory_holder(self, lock_key: str) -> LeaderRecord | None:
        row = self._run(S.LEADER_ADVISORY_HOLDER, advisory_key(lock_key), fetch="one")
        if row is None:
            return None
        return LeaderRecord(lock_key=lock_key, mode="advisory", holder=row[1] or f"pid {row[0]}",
                            pid=row[0])

    @staticmethod
    def _leader_fence(fence: LeaderFence) -> dict[str, Any]:
        return {"lock_key": fence.lock_key, "holder": fence.holder,
                "margin_ms": fence.margin_ms, "advisory_pid": fence.advisory_pid,
                **advisory_key(fence.lock_key)}

    def scheduler_states_ensure(self, names: Sequence[str], at: datetime,
                                fence: LeaderFence) -> int:
        if not names:
            return 0
        return int(self._run(S.SCHEDULER_STATES_ENSURE, {
            "names": list(names), "at": at, **self._leader_fence(fence),
        }, fetch="count"))

    def scheduler_states_lock_if_leading(self, names: Sequence[str],
                                         fence: LeaderFence) -> LockedStates:
        rows = self._run(S.SCHEDULER_STATES_LOCK_IF_LEADING, {
            "names": list(names), **self._leader_fence(fence),
        })
        locked = [r for r in rows if r[1] is not None]
        return LockedStates(leading=bool(rows[0][0]),
                            watermarks={r[1]: r[2] for r in locked},
                            paused=frozenset(r[1] for r in locked if r[3]))

    def scheduler_states_mark_if_leading(self, names: Sequence[str], at: datetime,
                                         fence: LeaderFence) -> dict[str, datetime]:
        if not names:
            return {}
        return dict(self._run(S.SCHEDULER_STATES_MARK_IF_LEADING, {
            "names": list(names), "at": at, **self._leader_fence(fence),
        }))

    def scheduler_states_list(self) -> list[SchedulerStateRecord]:
        return [
            SchedulerStateRecord(task_name=r[0], last_fired_at=r[1], paused=r[2],
                                 updated_at=r[3], overlap_skipped=r[4],
                                 overlap_skipped_at=r[5])
            for r in self._run(S.SCHEDULER_STATES_LIST, {})
        ]

    def scheduler_state_set_paused(self, name: str, paused: bool) -> SchedulerStateRecord:
        r = self._run(S.SCHEDULER_STATE_SET_PAUSED, {"name": name, "paused": paused},
                      fetch="one")
        return SchedulerStateRecord(task_name=r[0], last_fired_at=r[1], paused=r[2],
                                    updated_at=r[3])

    # ---------------------------------------------------------------------- cron overlap --
    # docs/scheduling.md, "Overlap"; the scheduler round calls these inside its transaction.
    def cron_runs_live(self, enqueued_by: Sequence[str], *, lock: bool) -> list[CronRun]:
        if not enqueued_by:
            return []
        stmt = S.CRON_RUNS_LOCK_LIVE if lock else S.CRON_RUNS_LIVE
        return [CronRun(enqueued_by=r[0], id=r[1], state=r[2], blocked_on=r[3], held=r[4])
                for r in self._run(stmt, {"enqueued_by": list(enqueued_by)})]

    def cron_runs_release(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            return []
        return [r[0] for r in self._run(S.CRON_RUNS_RELEASE, {"ids": [str(i) for i in ids]})]

    def cron_runs_hold(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            return []
        return [r[0] for r in self._run(S.CRON_RUNS_HOLD, {"ids": [str(i) for i in ids]})]

    def scheduler_states_note_skips_if_leading(
        self, skips: Mapping[str, tuple[int, datetime]], fence: LeaderFence
    ) -> list[str]:
        if not skips:
            return []
        names = list(skips)
        return [r[0] for r in self._run(S.SCHEDULER_STATES_NOTE_SKIPS_IF_LEADING, {
            "names": names, "counts": [skips[n][0] for n in names],
            "ats": [skips[n][1] for n in names], **self._leader_fence(fence),
        })]

    # ----------------------------------------------------------------------- maintenance --
    def outbox_purge_published(self, *, published_before: datetime,
                               batch_size: int = 1000) -> int:
        return self._purge(S.OUTBOX_PURGE_PUBLISHED, {"before": published_before}, batch_size)

    def slots_purge_expired(self, *, grace_ms: int, batch_size: int = 1000) -> int:
        return self._purge(S.SLOTS_PURGE_EXPIRED, {"grace_ms": grace_ms}, batch_size)

    def lease_extensions_purge(self, *, batch_size: int = 1000) -> int:
        return self._purge(S.LEASE_EXTENSIONS_PURGE, {}, batch_size)

    # --------------------------------------------------------------------------- console --
    def jobs_delete_finished(
        self, ids: Sequence[str], *, tenant_ids: Iterable[str] | None = None
    ) -> int:
        uuids = [u for u in (_as_uuid(i) for i in ids) if u is not None]
        if not uuids:
            return 0
        return self._run(S.JOBS_DELETE_FINISHED, {
            "ids": _uuid_array(uuids), "tenant_ids": _tenants(tenant_ids),
        }, fetch="count")

    def tables_health(self) -> list[TableHealth]:
        return [
            TableHealth(table=r[0], live_tuples=r[1], dead_tuples=r[2], last_vacuum=r[3],
                        last_analyze=r[4], xid_age=r[5], freeze_max_age=r[6], size_bytes=r[7])
            for r in self._run(S.TABLES_HEALTH, {})
        ]

    def xmin_horizon(self, limit: int = 10) -> list[XminHolder]:
        return [
            XminHolder(kind=r[0], name=r[1], pid=r[2], state=r[3], started_at=r[4],
                       age_seconds=r[5], xmin_age=r[6], query=r[7])
            for r in self._run(S.XMIN_HORIZON, {"limit": limit})
        ]

    # ---------------------------------------------------------------------- test support --
    def job_claim_if_due(self, job_id: str, *, worker_id: str,
                         lease_ms: int) -> ClaimedJob | None:
        job_uuid = _as_uuid(job_id)
        if job_uuid is None:
            return None
        r = self._run(S.JOB_CLAIM_IF_DUE, {
            "id": job_uuid, "worker_id": worker_id, "lease_ms": lease_ms,
        }, fetch="one")
        return _claimed_job(r) if r is not None else None

    def jobs_shift_due(self, shift_ms: int) -> int:
        return int(self._run(S.JOBS_SHIFT_DUE, {"shift_ms": shift_ms}, fetch="one")[0])

    def jobs_list(self, *, name: str | None = None, queue: str | None = None,
                  states: Sequence[str] | None = None, tenant_id: str | None = None,
                  limit: int | None = None) -> list[JobRecord]:
        return [_job_record(r) for r in self._run(S.JOBS_LIST, {
            "name": name, "queue": queue, "states": None if states is None else list(states),
            "tenant_id": tenant_id, "limit": limit,
        })]

    # ----------------------------------------------------------------------- connections --
    def name_session(self, label: str) -> bool:
        """Name this thread's connection when it connects (its OPTIONS, on this thread's
        wrapper only: other threads keep theirs); an open connection with another name is
        closed, and the next statement connects named. With Django's own connection pool
        (OPTIONS "pool") the connections are made once for every thread: False, and
        session_label names the session instead."""
        conn = connections[self.alias]
        options = conn.settings_dict.get("OPTIONS") or {}
        if options.get("pool"):
            return False
        if options.get("application_name") != label[:63]:
            if not hasattr(conn, "_xjobs_unnamed"):
                conn._xjobs_unnamed = conn.settings_dict  # for forget_session_name
            conn.settings_dict = {**conn.settings_dict,
                                  "OPTIONS": {**options, "application_name": label[:63]}}
            if conn.connection is not None and not conn.in_atomic_block:
                conn.close()
        return True

    def forget_session_name(self) -> None:
        """Give this thread's connection back its own name (a worker run in a thread that
        goes on after it: ``testing.drain()``); it takes effect at its next connect."""
        conn = connections[self.alias]
        unnamed = getattr(conn, "_xjobs_unnamed", None)
        if unnamed is not None:
            conn.settings_dict = unnamed
            del conn._xjobs_unnamed

    def session_label(self, label: str) -> str:
        named = self.name_session(label)
        row = self._run(S.SESSION_LABEL, {"label": None if named else label[:63]}, fetch="one")
        return str(row[-1])

    def listener(self, channel_label: str) -> Listener:
        return PostgresListener(self.listen_alias, channel_label)

    def db_now(self) -> datetime:
        return self._run(S.DB_NOW, {}, fetch="one")[0]

    def reset_connection(self) -> None:
        conn = connections[self.alias]
        try:
            conn.close()
        except DatabaseError:
            # close() on a broken connection can raise; what matters is that it is dropped.
            conn.connection = None

    def is_connection_error(self, exc: BaseException) -> bool:
        if isinstance(exc, InterfaceError):
            return True
        if not isinstance(exc, OperationalError):
            return False
        raw = connections[self.alias].connection
        return raw is None or raw.closed or bool(getattr(raw, "broken", False)) or (
            isinstance(exc.__cause__, Exception) and "connection" in str(exc).lower()
        )

    def connection_refused(self, exc: BaseException) -> bool:
        # libpq gives no SQLSTATE for a failed connect, only its text. Whether the server asked
        # for a password is known whatever the server's language; the other refusals are read
        # in English (a server with another lc_messages reads as unreachable for them).
        cause = exc.__cause__ if isinstance(exc.__cause__, psycopg.Error) else exc
        pgconn = getattr(cause, "pgconn", None)
        text = str(exc)
        if any(marker in text for marker in _NOT_YET):
            return False
        return bool(pgconn is not None and (pgconn.needs_password or pgconn.used_password)) or (
            any(marker in text for marker in _REFUSALS))
