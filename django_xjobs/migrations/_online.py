"""Migration operations that change a live job table without stalling its writers
(docs/deployment.md, "Migrations on deploy").

A DDL statement that needs a strong lock (``ALTER TABLE``, ``CREATE TRIGGER``, ``DROP INDEX``)
first waits in the table's lock queue behind every transaction that touched the table, and
every enqueue, claim and ack that arrives meanwhile waits behind IT. So each statement here runs
under a short ``lock_timeout``: when the lock is not granted in time the statement gives up,
the writers behind it go on, and it tries again after a pause, a bounded number of times. When
the last try fails, the error names the sessions that held it off, for the operator to stop.

* ``RunDDL``: one statement (or several run in one implicit transaction), each try bounded by
  the lock timeout. ``done_if`` (a query returning one boolean) skips it when it already ran: a
  non-atomic migration that failed midway is resumed by running ``migrate`` again, and its
  finished steps must not fail then. A ``create index concurrently if not exists`` first drops
  an INVALID index of that name, left by an interrupted build.
* ``Once``: Django's own operations (new tables) run in one transaction unless ``done_if``.

The bound and the number of tries are the environment's ``XJOBS_MIGRATE_LOCK_TIMEOUT``
(PostgreSQL's syntax: ``2s``, ``500ms``; default 2s) and ``XJOBS_MIGRATE_LOCK_RETRIES``
(default 10), read when a statement runs. In an atomic migration a retry rolls back to a
savepoint, but the locks taken earlier in that transaction stay held while it waits: the
migrations of the ``x_`` tables are non-atomic, one statement per transaction.
tests/integration/test_online_migrations.py pins the retry, the give-up message and the lint.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.core.exceptions import ImproperlyConfigured
from django.db import migrations, router, transaction
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.utils import OperationalError

ENV_TIMEOUT = "XJOBS_MIGRATE_LOCK_TIMEOUT"
ENV_RETRIES = "XJOBS_MIGRATE_LOCK_RETRIES"
DEFAULT_TIMEOUT = "2s"
DEFAULT_RETRIES = 10
BACKOFF_CAP = 10.0  # seconds between two tries, at most
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|min)?\s*$")
_MS = {"ms": 1, "s": 1000, "min": 60_000, None: 1}
_CONCURRENT_INDEX = re.compile(
    r"create\s+(?:unique\s+)?index\s+concurrently\s+if\s+not\s+exists\s+\"?(\w+)\"?", re.I)

# The sessions that hold what a waiting backend wants (its pg_blocking_pids), for the message.
BLOCKERS_SQL = """
select pid, coalesce(application_name, ''), coalesce(state, ''),
       coalesce(extract(epoch from now() - xact_start), 0)::float8, left(query, 200)
  from pg_stat_activity
 where pid = any(pg_blocking_pids(%s))
 order by xact_start nulls last
"""
DROP_INVALID_INDEX_SQL = """
select format('drop index concurrently if exists %%I.%%I', n.nspname, c.relname)
  from pg_index i join pg_class c on c.oid = i.indexrelid
  join pg_namespace n on n.oid = c.relnamespace
 where c.relname = %s and not i.indisvalid and pg_table_is_visible(c.oid)
"""


class LockRetriesExhausted(OperationalError):
    """A migration statement did not get its lock within the retries: the message names the
    sessions that held it off."""


def lock_timeout() -> tuple[str, int]:
    """The environment's lock timeout: (PostgreSQL's text for SET, milliseconds)."""
    raw = os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT)
    match = _DURATION.match(raw)
    if not match or int(match.group(1)) <= 0:
        raise ImproperlyConfigured(
            f"{ENV_TIMEOUT}={raw!r}: expected a positive duration such as 2s, 500ms or 1min")
    ms = int(match.group(1)) * _MS[match.group(2)]
    return f"{match.group(1)}{match.group(2) or 'ms'}", ms


def lock_retries() -> int:
    """The environment's number of tries after the first."""
    raw = os.environ.get(ENV_RETRIES, str(DEFAULT_RETRIES))
    if not raw.strip().isdigit():
        raise ImproperlyConfigured(f"{ENV_RETRIES}={raw!r}: expected a whole number, 0 or more")
    return int(raw)


def _is_lock_timeout(error: BaseException) -> bool:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) == "55P03" or getattr(cause, "pgcode", None) == "55P03"


class _BlockerWatch:
    """Reads, from a connection of its own, who blocks ``pid`` once it has waited half the
    lock timeout: by the time the statement gives up, its wait (and pg_blocking_pids) is gone."""

    def __init__(self, connection: Any, pid: int, after: float) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(connection, pid, after),
                                        name="xjobs-migrate-blockers", daemon=True)
        self._thread.start()

    def _run(self, connection: Any, pid: int, after: float) -> None:
        if self._done.wait(after):
            return
        watcher = type(connection)(dict(connection.settings_dict), connection.alias)
        try:
            with watcher.cursor() as cursor:
                cursor.execute(BLOCKERS_SQL, [pid])
                self.rows = list(cursor.fetchall())
        except Exception as error:  # any failure to look: the message says so
            self.rows = [(None, "", "", 0.0, f"(could not read the blockers: {error})")]
        finally:
            watcher.close()

    def stop(self) -> list[tuple[Any, ...]]:
        self._done.set()
        self._thread.join()
        return self.rows


def _describe(rows: Sequence[tuple[Any, ...]]) -> str:
    if not rows:
        return "  (none seen: the lock was held only briefly at each try)"
    return "\n".join(
        f"  pid {pid} application_name {name!r} {state or 'no state'}, in a transaction for "
        f"{age:.1f}s: {query}" for pid, name, state, age, query in rows)


def run_ddl(schema_editor: BaseDatabaseSchemaEditor, sql: str, *, guarded: bool = False) -> None:
    """Run one DDL statement under the lock timeout, retrying with backoff on a lock timeout;
    in a transaction each try is a savepoint. sqlmigrate shows the SET around it, and, for a
    statement a ``done_if`` guards, tells the linter it can be run again."""
    text, ms = lock_timeout()
    if schema_editor.collect_sql:
        schema_editor.execute(f"SET lock_timeout = '{text}'")
        if guarded:  # one directive: the linter reads only the line above a statement
            prefix = "-- squawk-ignore "
            sql = (prefix + "prefer-robust-stmts, " + sql[len(prefix):]
                   if sql.startswith(prefix) else prefix + "prefer-robust-stmts\n" + sql)
        schema_editor.execute(sql, params=None)
        schema_editor.execute("RESET lock_timeout")
        return
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute("select pg_backend_pid(), current_setting('lock_timeout')")
        pid, before = cursor.fetchone()
    retries = lock_retries()
    seen: list[tuple[Any, ...]] = []
    for attempt in range(retries + 1):
        watch = _BlockerWatch(connection, pid, ms / 2000)
        try:
            savepoint = (transaction.atomic(connection.alias) if connection.in_atomic_block
                         else nullcontext())
            with savepoint, connection.cursor() as cursor:
                cursor.execute("select set_config('lock_timeout', %s, false)", [text])
                cursor.execute(sql)
            return
        except OperationalError as error:
            if not _is_lock_timeout(error):
                raise
            seen = watch.stop() or seen
            if attempt == retries:
                raise LockRetriesExhausted(
                    f"django-xjobs: a migration statement waited {retries + 1} times for "
                    f"{text} for its lock and gave up, leaving the table as it was:\n"
                    f"  {' '.join(sql.split())[:300]}\n"
                    f"The sessions that held it off (end them or wait for them, then run "
                    f"migrate again; {ENV_TIMEOUT} and {ENV_RETRIES} set the bound):\n"
                    f"{_describe(seen)}") from error
            # Jittered exponential backoff: writers queued behind the try drain meanwhile.
            # The pause between two tries, doubling with jitter: the writers queued behind the
            # DDL go on meanwhile (no wait for anything: the next try is the check).
            time.sleep(min(BACKOFF_CAP, 0.25 * 2 ** attempt) * random.uniform(0.5, 1.0))
        finally:
            watch.stop()
            if not connection.needs_rollback:
                with connection.cursor() as cursor:
                    cursor.execute("select set_config('lock_timeout', %s, false)", [before])


def _done(schema_editor: BaseDatabaseSchemaEditor, done_if: str | None) -> bool:
    if done_if is None or schema_editor.collect_sql:
        return False
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(done_if)
        return bool(cursor.fetchone()[0])


def _drop_invalid_index(schema_editor: BaseDatabaseSchemaEditor, sql: str) -> None:
    match = _CONCURRENT_INDEX.search(sql)
    if match is None or schema_editor.collect_sql:
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(DROP_INVALID_INDEX_SQL, [match.group(1)])
        drops = [row[0] for row in cursor.fetchall()]
    for drop in drops:
        run_ddl(schema_editor, drop)


class RunDDL(migrations.RunSQL):
    """``RunSQL`` whose statements each run under the lock timeout with retries (run_ddl); a
    list runs one statement per item, a string as one. ``done_if``/``reverse_done_if``: a
    query whose true skips the whole direction (it already ran)."""

    def __init__(self, sql: str | Sequence[str], reverse_sql: str | Sequence[str] | None = None,
                 *, done_if: str | None = None, reverse_done_if: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(sql, reverse_sql, **kwargs)
        self.done_if = done_if
        self.reverse_done_if = reverse_done_if

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        name, args, kwargs = super().deconstruct()
        for key in ("done_if", "reverse_done_if"):
            if getattr(self, key) is not None:
                kwargs[key] = getattr(self, key)
        return name, args, kwargs

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                          from_state: Any, to_state: Any) -> None:
        if not self._here(app_label, schema_editor) or _done(schema_editor, self.done_if):
            return  # another database's tables (the router), or already run
        self._guarded = self.done_if is not None
        super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                           from_state: Any, to_state: Any) -> None:
        if not self._here(app_label, schema_editor) or _done(schema_editor,
                                                              self.reverse_done_if):
            return
        self._guarded = self.reverse_done_if is not None
        super().database_backwards(app_label, schema_editor, from_state, to_state)

    def _here(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor) -> bool:
        return router.allow_migrate(schema_editor.connection.alias, app_label, **self.hints)

    def _run_sql(self, schema_editor: BaseDatabaseSchemaEditor,
                 sqls: str | Sequence[str]) -> None:
        for sql in [sqls] if isinstance(sqls, str) else sqls:
            if sql is not migrations.RunSQL.noop:
                _drop_invalid_index(schema_editor, sql)
                run_ddl(schema_editor, sql, guarded=getattr(self, "_guarded", False))


class Once(migrations.SeparateDatabaseAndState):
    """Django operations run in one transaction (also in a non-atomic migration) unless
    ``done_if`` finds them done: the new tables of a migration whose later steps may fail."""

    atomic = True

    def __init__(self, operations: list[Any], *, done_if: str) -> None:
        super().__init__(database_operations=operations, state_operations=operations)
        self.done_if = done_if

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [], {
            "operations": self.database_operations, "done_if": self.done_if}

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                          from_state: Any, to_state: Any) -> None:
        if _done(schema_editor, self.done_if):
            return
        if schema_editor.collect_sql:  # it runs in a transaction of its own
            schema_editor.collected_sql.append("BEGIN;")
        # New tables lock only themselves; the bound is there in case a name is taken.
        schema_editor.execute(f"SET LOCAL lock_timeout = '{lock_timeout()[0]}'")
        deferred = len(schema_editor.deferred_sql)
        super().database_forwards(app_label, schema_editor, from_state, to_state)
        # The SQL Django defers to the migration's end (a text key's pattern index) runs in
        # this transaction: a migration that fails later and is run again skips this step.
        for sql in schema_editor.deferred_sql[deferred:]:
            schema_editor.execute(sql)
        del schema_editor.deferred_sql[deferred:]
        if schema_editor.collect_sql:
            schema_editor.collected_sql.append("COMMIT;")


def _collect(schema_editor: BaseDatabaseSchemaEditor, run: Any) -> list[str]:
    """The statements Django's own operation would execute, collected instead of run."""
    saved = schema_editor.collect_sql, getattr(schema_editor, "collected_sql", None)
    schema_editor.collect_sql, schema_editor.collected_sql = True, []
    try:
        run()
        return [sql.rstrip(";") for sql in schema_editor.collected_sql]
    finally:
        schema_editor.collect_sql = saved[0]
        if saved[1] is None:
            del schema_editor.collected_sql
        else:
            schema_editor.collected_sql = saved[1]


class AddFieldOnline(migrations.AddField):
    """``AddField`` whose ``ADD COLUMN IF NOT EXISTS`` runs under the lock timeout: for a
    nullable column or a constant default, which PostgreSQL adds without rewriting the table."""

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                          from_state: Any, to_state: Any) -> None:
        sqls = _collect(schema_editor, lambda: super(AddFieldOnline, self).database_forwards(
            app_label, schema_editor, from_state, to_state))
        for sql in sqls:
            run_ddl(schema_editor, re.sub(r"\bADD COLUMN\b", "ADD COLUMN IF NOT EXISTS", sql,
                                          count=1))

    def database_backwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                           from_state: Any, to_state: Any) -> None:
        sqls = _collect(schema_editor, lambda: super(AddFieldOnline, self).database_backwards(
            app_label, schema_editor, from_state, to_state))
        for sql in sqls:
            run_ddl(schema_editor, re.sub(r"\bDROP COLUMN\b", "DROP COLUMN IF EXISTS", sql,
                                          count=1))


def _create_indexes(schema_editor: BaseDatabaseSchemaEditor, sqls: list[str]) -> None:
    """CREATE INDEX CONCURRENTLY statements made resumable: ``IF NOT EXISTS``, an INVALID
    leftover of an interrupted build dropped first, each under the lock timeout."""
    for sql in sqls:
        sql = re.sub(r"\bINDEX CONCURRENTLY\b", "INDEX CONCURRENTLY IF NOT EXISTS", sql, count=1)
        _drop_invalid_index(schema_editor, sql)
        run_ddl(schema_editor, sql)


def _drop_indexes(schema_editor: BaseDatabaseSchemaEditor, sqls: list[str]) -> None:
    """DROP INDEX CONCURRENTLY statements made resumable: ``IF EXISTS``, each under the lock
    timeout."""
    for sql in sqls:
        run_ddl(schema_editor, re.sub(r"\bCONCURRENTLY IF EXISTS\b|\bCONCURRENTLY\b",
                                      "CONCURRENTLY IF EXISTS", sql, count=1))


class AddIndexOnline(AddIndexConcurrently):
    """``AddIndexConcurrently`` made resumable (:func:`_create_indexes`, :func:`_drop_indexes`)."""

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                          from_state: Any, to_state: Any) -> None:
        _create_indexes(schema_editor, _collect(
            schema_editor, lambda: super(AddIndexOnline, self).database_forwards(
                app_label, schema_editor, from_state, to_state)))

    def database_backwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                           from_state: Any, to_state: Any) -> None:
        _drop_indexes(schema_editor, _collect(
            schema_editor, lambda: super(AddIndexOnline, self).database_backwards(
                app_label, schema_editor, from_state, to_state)))


class RemoveIndexOnline(RemoveIndexConcurrently):
    """``RemoveIndexConcurrently`` made resumable; backwards, the index built as
    ``AddIndexOnline`` builds it."""

    def database_forwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                          from_state: Any, to_state: Any) -> None:
        _drop_indexes(schema_editor, _collect(
            schema_editor, lambda: super(RemoveIndexOnline, self).database_forwards(
                app_label, schema_editor, from_state, to_state)))

    def database_backwards(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor,
                           from_state: Any, to_state: Any) -> None:
        _create_indexes(schema_editor, _collect(
            schema_editor, lambda: super(RemoveIndexOnline, self).database_backwards(
                app_label, schema_editor, from_state, to_state)))
