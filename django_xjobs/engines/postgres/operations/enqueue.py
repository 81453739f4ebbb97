"""Enqueue: one job, a batch (COPY when nothing in it needs more), a debounced job, and jobs
with an idempotency window (docs/durable.md, "Idempotency windows"), on the caller's
connection, so that an enqueue commits or rolls back with the caller's transaction."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError, connections
from django.db import transaction as db_transaction

from ....records import UNIQUE_FOREVER, EnqueueParams, EnqueueResult
from ..core import PostgresCore
from ..instrumentation import instrumented
from ..params import batch_args, enqueue_args
from ..statements.debounce import JOB_DEBOUNCE_LIVE
from ..statements.enqueue import (
    JOB_ENQUEUE,
    JOB_ENQUEUE_UNKEYED,
    JOB_FIND_LIVE_BY_KEY,
    JOBS_COPY,
    JOBS_ENQUEUE,
    JOBS_ENQUEUE_UNKEYED,
    JOBS_FIND_LIVE_BY_KEYS,
    JOBS_NOTIFY_QUEUES,
)
from ..statements.windows import JOB_ENQUEUE_WINDOWED, JOB_KEY_HELD, JOB_KEY_HOLDER

# Django 6.1 renamed transaction.savepoint() to savepoint_create() and warns on the old name;
# Django 5.2 has only the old one.
_savepoint_create = getattr(db_transaction, "savepoint_create", None) or db_transaction.savepoint


class _LostAttempt(Exception):
    """A windowed enqueue's attempt at its key inserted no job: roll its transaction back."""

    def __init__(self, taken: bool) -> None:
        super().__init__("the attempt inserted no job")
        self.taken = taken


def _key(p: EnqueueParams) -> str:
    return p.idempotency_key if p.idempotency_key is not None else str(p.id)


class Enqueue(PostgresCore):
    """The seam's enqueue and idempotency-window operations (engines/base.py)."""

    def job_enqueue(self, params: EnqueueParams) -> EnqueueResult:
        if params.unique_for_ms is not None:
            return self._enqueue_windowed(params)
        args = enqueue_args(params, notify=self.notify)
        if params.idempotency_key is None:
            id_, run_id, state, _notified = self._run(JOB_ENQUEUE_UNKEYED, args, fetch="one")
            return EnqueueResult(id=id_, run_id=run_id, created=True, state=state)
        key = params.idempotency_key
        # The live job we conflicted with can finish before we read it; insert again then.
        for _ in range(20):
            rows = self._run(JOB_ENQUEUE, args)
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
            states = dict(self._run(JOBS_ENQUEUE_UNKEYED, batch_args(items, notify=self.notify)))
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
            inserted = dict(self._run(JOBS_ENQUEUE, batch_args(items, notify=self.notify)))
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
                rows = self._run(JOBS_FIND_LIVE_BY_KEYS, {
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
        return instrumented(JOBS_COPY, self._copy, batch)

    def _copy(self, batch: Sequence[EnqueueParams]) -> int:
        conn = connections[self.alias]
        stmt = JOBS_COPY
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
            self._run(JOBS_NOTIFY_QUEUES, {
                "queues": [q for q, _ in counts], "names": [n for _, n in counts],
                "counts": list(counts.values()), "notify": self.notify,
            }, fetch="one")
        return len(batch)

    def job_find_live_by_key(
        self, name: str, tenant_id: str | None, idempotency_key: str
    ) -> EnqueueResult | None:
        row = self._run(
            JOB_FIND_LIVE_BY_KEY,
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
        insert = {**enqueue_args(params, notify=self.notify), "run_at": None,
                  "delay_ms": debounce_ms}
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
                row = self._run(JOB_DEBOUNCE_LIVE, live, fetch="one")
                if row is not None and row[0] in ("moved", "held"):  # held: a windowed run
                    return EnqueueResult(id=row[1], run_id=row[2], created=False, state=row[3])
                rows = self._run(JOB_ENQUEUE, insert)
                if rows:
                    id_, run_id, state, _notified = rows[0]
                    return EnqueueResult(id=id_, run_id=run_id, created=True, state=state)
        raise DatabaseError(  # pragma: no cover - needs the key to change hands 20 times
            f"debounced enqueue of {params.name!r} kept losing its key to other enqueues"
        )

    def _enqueue_windowed(self, params: EnqueueParams) -> EnqueueResult:
        """job_enqueue with ``params.unique_for_ms`` (docs/durable.md, "Idempotency windows"),
        in one transaction (the caller's, or its own): job_enqueue_windowed says why the key's
        row, not a check, decides."""
        key = params.idempotency_key
        assert key is not None, "api.py refuses unique_for without an idempotency key"
        forever = params.unique_for_ms == UNIQUE_FOREVER
        args = {**enqueue_args(params, notify=self.notify),
                "job_unique_for_ms": params.unique_for_ms,
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
        held = self._run(JOB_KEY_HELD, {**where, "unique_for_ms": args["unique_for_ms"]},
                         fetch="one")
        if held is not None and held[1] is not None:
            return EnqueueResult(id=held[0], run_id=held[1], created=False, state=held[2])
        if held is not None:  # held by a job no longer in x_jobs itself: read with the history
            return self._after_lost_attempt(params, where, taken=False)
        point = _savepoint_create(using=self.alias) if in_caller else None
        taken, id_, run_id, state, _notified = self._run(JOB_ENQUEUE_WINDOWED, args,
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
        holder = self._run(JOB_KEY_HOLDER, where, fetch="one")
        if holder is None:
            return None
        job_id, run_id, state = holder
        # A holder deleted by retention has no row left to read: its id still answers, with
        # the id for run_id and "purged" for state.
        return EnqueueResult(id=job_id, run_id=run_id or job_id, created=False,
                             state=state or "purged")
