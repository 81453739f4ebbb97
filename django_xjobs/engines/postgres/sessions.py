"""The PostgreSQL engine's dedicated connections: the LISTEN connection and the scheduler's
advisory session.

Every other statement runs on Django's connection of the calling thread (core.py). These two
cannot: a connection that LISTENs must not be shared with the statements of the thread that
waits on it, and a session advisory lock lives exactly as long as its session, which no pool
may lend to anyone else. Their statements go through the same instrumentation as the rest
(instrumentation.py). The engine passes the alias whose parameters they use: the jobs' own, or
``XJOBS["LISTEN_DATABASE"]``, a direct connection to the same database beside a transaction
pooler (docs/deployment.md).
"""

from __future__ import annotations

import select
import zlib
from collections.abc import Mapping
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from ...exceptions import ListenerLost, SessionLost
from ..base import AdvisorySession, Listener, Statement
from .instrumentation import instrumented
from .statements.connections import LISTEN
from .statements.scheduler import (
    ADVISORY_LOCK_CLASS,
    LEADER_ADVISORY_HELD,
    LEADER_ADVISORY_LOCK_TRY,
    LEADER_ADVISORY_UNLOCK,
)


def advisory_key(lock_key: str) -> dict[str, int]:
    """The (class, id) pair of the scheduler's advisory lock for ``lock_key``: a fixed class
    and a 31-bit CRC of the key, both positive so they read the same in pg_locks' oids."""
    return {"lock_class": ADVISORY_LOCK_CLASS,
            "lock_id": zlib.crc32(lock_key.encode()) & 0x7FFF_FFFF}


def _dedicated_connection(alias: str, label: str) -> Any:
    """A psycopg connection of its own (autocommit) with the alias's parameters, outside
    Django's connection handling and any pool Django manages: the LISTEN connection and the
    scheduler's advisory session, whose state (a subscription, a lock) is the session's."""

    params = dict(connections[alias].get_connection_params())
    params.pop("cursor_factory", None)
    # Never a pooled connection, whatever OPTIONS say: Django leaves its pool options out of
    # these parameters, and they must not reach psycopg.connect as a libpq option either.
    params.pop("pool", None)
    params["application_name"] = label[:63]
    # A peer that vanished without a FIN (host gone) is noticed by keepalives, not by reads.
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 10)
    params.setdefault("keepalives_interval", 5)
    params.setdefault("keepalives_count", 3)
    return psycopg.connect(**params, autocommit=True)


def _execute_dedicated(conn: Any, stmt: Statement, params: Mapping[str, Any] | None) -> Any:
    """Run ``stmt`` on a dedicated connection: its rows, or the row count of a statement that
    returns none."""
    cursor = conn.execute(stmt.sql, params)
    return cursor.fetchall() if cursor.description is not None else cursor.rowcount


class _DedicatedSession:
    """A connection of its own (:func:`_dedicated_connection`). Its statements are instrumented
    like every other (instrumentation.py), and its errors, the connection's own or a fault
    injected at one of its statements, surface as ``lost``: whatever the session held (a
    subscription, a lock) is gone with it, and the caller opens a new one."""

    lost: type[Exception]

    def __init__(self, alias: str, label: str) -> None:
        try:
            self._conn = _dedicated_connection(alias, label)
        except psycopg.Error as exc:
            raise self.lost(str(exc)) from exc

    def _send(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> Any:
        try:
            return instrumented(stmt, _execute_dedicated, self._conn, stmt, params)
        except (psycopg.Error, DatabaseError) as exc:
            raise self.lost(str(exc)) from exc

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:  # closing a broken connection may raise; it is gone either way
            pass


class PostgresAdvisorySession(_DedicatedSession, AdvisorySession):
    """The scheduler's advisory lock on a dedicated connection (see AdvisorySession).

    Errors of the connection surface as :class:`SessionLost`: the server released the lock when
    the session ended, so the caller is no longer leader and opens a new session to try again.
    """

    lost = SessionLost

    def __init__(self, alias: str, lock_key: str, label: str) -> None:
        self._key = advisory_key(lock_key)
        super().__init__(alias, label)
        self.backend_pid = self._conn.info.backend_pid

    def _scalar(self, stmt: Statement) -> Any:
        rows = self._send(stmt, self._key)
        return rows[0][0] if rows else None

    def try_lock(self) -> bool:
        return bool(self._scalar(LEADER_ADVISORY_LOCK_TRY))

    def holds(self) -> bool:
        return bool(self._scalar(LEADER_ADVISORY_HELD))

    def unlock(self) -> None:
        self._scalar(LEADER_ADVISORY_UNLOCK)


class PostgresListener(_DedicatedSession, Listener):
    """A dedicated autocommit connection that LISTENs on the job channel (fragments.CHANNEL).

    The payload of a notification is a queue name. A relay's listener LISTENs on the outbox's
    channel instead (``listen=OUTBOX_LISTEN``, statements/outbox.py), whose payload is empty.
    Connection errors surface as :class:`ListenerLost`; the worker reconnects (and LISTENs
    again) with backoff.
    ``wait`` sends no statement (it reads the socket), so it has no fault point or timing.
    """

    lost = ListenerLost

    def __init__(self, alias: str, label: str, *, listen: Statement = LISTEN) -> None:
        super().__init__(alias, label)
        try:
            self._send(listen)
        except BaseException:
            # Connected but not listening: this object is never returned, so nobody else
            # would close the connection (whoever holds the exception would keep it open).
            self._conn.close()
            raise

    def backend_pid(self) -> int:
        return self._conn.info.backend_pid

    def wait(self, timeout: float) -> list[str]:
        try:
            # Block on the socket ourselves so the wait is bounded and cheap; then drain.
            ready, _, _ = select.select([self._conn.fileno()], [], [], timeout)
            if not ready:
                return []
            # Reading the socket also surfaces an error or EOF (backend terminated) as an
            # exception, which is how a dropped listener is noticed.
            return [n.payload for n in self._conn.notifies(timeout=0)]
        except (psycopg.Error, OSError, ValueError) as exc:
            raise ListenerLost(str(exc)) from exc
