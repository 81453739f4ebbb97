"""This thread's connection for the engine's alias: its transactions, its name in
``pg_stat_activity``, the dedicated LISTEN connection, and what its errors mean."""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db import transaction as db_transaction

from ...base import Listener
from ..core import PostgresCore
from ..sessions import PostgresListener
from ..statements.connections import DB_NOW, SESSION_LABEL

_READ_COMMITTED = psycopg.IsolationLevel.READ_COMMITTED


def _isolation_level(conn: Any) -> Any:
    """The isolation level Django opens the connection's transactions at (its OPTIONS
    "isolation_level"), None for the server's default (which a worker checks at start)."""
    level = (conn.settings_dict.get("OPTIONS") or {}).get("isolation_level")
    return None if level is None else psycopg.IsolationLevel(level)


# A failed connect (connection_refused), read in libpq's text: the server answered and turned
# this client away (the last one is libpq's own, a password the server asks for and the
# settings lack) ...
_REFUSALS = ("authentication failed", "no pg_hba.conf entry", "pg_hba.conf rejects",
             "does not exist", "is not permitted to log in", "permission denied for database",
             "no password supplied")
# ... or it answered that it takes no connection now (SQLSTATE 57P03: starting up, shutting
# down, in recovery; 53300: no slot left), which passes like a server that is down.
_NOT_YET = ("the database system is", "too many clients", "connection slots are reserved")


class Connections(PostgresCore):
    """The seam's transaction and connection operations."""

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
        # Behind a transaction pooler (a direct LISTEN_DATABASE, or NOTIFY off) the session's
        # settings outlive this client's transaction: the scans stay as the server has them.
        pin = self.notify and self.listen_alias == self.alias
        row = self._run(SESSION_LABEL, {"label": None if named else label[:63], "pin": pin},
                        fetch="one")
        return str(row[-1])

    def listener(self, channel_label: str) -> Listener:
        return PostgresListener(self.listen_alias, channel_label)

    def db_now(self) -> datetime:
        return self._run(DB_NOW, {}, fetch="one")[0]

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
