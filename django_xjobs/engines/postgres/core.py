"""What every operation of the PostgreSQL engine stands on: sending one named statement.

Statements run on ``django.db.connections[alias]`` of the calling thread, so they join the
caller's transaction (enqueue inside ``atomic()`` commits or rolls back with the caller's
writes) and share Django's connection handling (``CONN_MAX_AGE``, health checks, pooling).
The dedicated connections are the exception: the LISTEN connection and the scheduler's
advisory session (sessions.py), opened with the parameters of ``XJOBS["LISTEN_DATABASE"]``
when it is set (a direct connection beside a transaction pooler). Wherever it runs, every
statement goes through one wrapper, instrumentation.py: fault points, timing, the DEBUG log.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import psycopg
from django.db import DatabaseError, ProgrammingError, connections

from ..base import Engine, Statement, numbered
from .errors import isolation_refused, schema_missing
from .instrumentation import instrumented


def _preparing_cursor_class(base: type) -> type:
    class PreparingCursor(base):  # type: ignore[misc, valid-type]
        """Server-side binding, and every statement prepared on first use (per connection)."""

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = True,
                    binary: bool | None = None) -> Any:
            return super().execute(query, params, prepare=prepare, binary=binary)

    return PreparingCursor


# Named parameters, where Django's cursor wrapper logs the statement (DEBUG and the like).
_PreparingCursor: Any = _preparing_cursor_class(psycopg.Cursor)
# Positional ones ($1, $2 ...: see positional()), everywhere else.
_PreparingRawCursor: Any = _preparing_cursor_class(psycopg.RawCursor)


@functools.lru_cache(maxsize=1024)
def positional(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """A statement's text with numbered placeholders (:func:`~django_xjobs.engines.base.numbered`)
    and its parameters' names in their order, once per process.

    psycopg makes that conversion itself for named parameters, but it keeps its result only for
    texts under 4 KB with at most 50 parameters: the claim's 24 KB were split again on every
    claim, about a third of the client's time in a claim of one job (docs/performance.md).
    """
    text, names = numbered(sql)
    return text.encode(), names


_NEVER = 2**31 - 1


def _fetch(cursor: Any, fetch: str) -> Any:
    if fetch == "all":
        return cursor.fetchall()
    if fetch == "one":
        return cursor.fetchone()
    return cursor.rowcount


class PostgresCore(Engine):
    """The plumbing the families of operations (operations/) share: :meth:`_run` sends one
    named statement, :meth:`_purge` a bounded delete until it comes back short."""

    # Set by PostgresEngine.__init__ (engine.py).
    notify: bool
    prepared: bool
    listen_alias: str

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
            refused = isolation_refused(exc)
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
                cursor = _PreparingRawCursor(self._prepared_connection(conn))
                try:
                    query, names = positional(stmt.sql)
                    cursor.execute(query, [params[name] for name in names])
                    return _fetch(cursor, fetch)
                finally:
                    cursor.close()
        except ProgrammingError as exc:
            raise schema_missing(exc, stmt, self.alias) or exc

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
                raise schema_missing(exc, stmt, self.alias) or exc
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
