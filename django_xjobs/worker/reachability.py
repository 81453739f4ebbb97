"""Whether this process reaches its database: one warning when it stops, one INFO line when it
is back.

Every thread of a worker (the loop, the heartbeat, the scheduler, the relay) retries on its own
when a database call fails. While the server is down, each of those attempts fails to connect,
and a warning per attempt would drown the log. So a failure to CONNECT is reported here instead:
the first one since the database was last reached logs "database unreachable", the others only
at DEBUG, and the first success after that logs "database reachable again" (INFO: nothing is
left to do) with how long the outage lasted and how many attempts failed. A connection that
breaks under a thread (a server restart, a terminated backend) is still that thread's own line:
its next attempt reconnects, or reports here. So each thread says at most one line per outage
(the loop, the heartbeat, the scheduler, its leader election and its maintenance, the relay, the
counters' rollup: each goes through :func:`connection_error`). The LISTEN threads, whose
connections are their own (not Django's), log the first failure of a row of reconnects and are
quiet for the rest (docs/observability.md, "Logs").
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Literal

from django.db import connections

from .. import clock

if TYPE_CHECKING:
    from ..engines import Engine

log = logging.getLogger("django_xjobs.worker")

LOST: Literal["lost"] = "lost"
UNREACHABLE: Literal["unreachable"] = "unreachable"


class Reachability:
    """The process-wide state (module-level :data:`database`); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self.failures = 0  # failed attempts to connect since the database was last reached

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, who: str, exc: BaseException) -> None:
        """A thread could not connect (``who`` names it in the log)."""
        with self._lock:
            self.failures += 1
            first = self._down_since is None
            if first:
                self._down_since = clock.monotonic()
        reason = " ".join(str(exc).split())  # libpq's messages span lines
        if first:
            log.warning("database unreachable (%s: %s); retrying with backoff, and logging "
                        "again once it is reachable", who, reason)
        else:
            log.debug("database still unreachable (%s: %s)", who, reason)

    def reached(self) -> None:
        """A database call of any thread succeeded (cheap when nothing was down)."""
        if self._down_since is None:
            return
        with self._lock:
            since, failures = self._down_since, self.failures
            if since is None:
                return
            self._down_since, self.failures = None, 0
        log.info("database reachable again after %.1fs (%d failed attempts to connect)",
                 clock.monotonic() - since, failures)


database = Reachability()


def connect_failed(alias: str) -> bool:
    """After a connection error on this thread's Django connection of ``alias`` (and before
    any reset): whether the connect itself failed, i.e. there is no connection at all."""
    return connections[alias].connection is None


def connection_error(exc: BaseException, who: str,
                     *engines: Engine) -> Literal["lost", "unreachable"] | None:
    """What a thread does first when a database call on ``engines`` raised ``exc``.

    None: not a connection error; nothing was done, the caller logs it its own way. Otherwise
    the engines' connections of this thread are reset (the next call reconnects) and the answer
    says which: :data:`UNREACHABLE` when the connect itself failed, already reported to
    :data:`database` (one line per outage, ``who`` naming the thread), or :data:`LOST` when an
    open connection broke, which the caller logs as its own line.
    """
    if not any(engine.is_connection_error(exc) for engine in engines):
        return None
    # Asked before the reset, which drops the connection in either case.
    unreachable = any(connect_failed(engine.alias) for engine in engines)
    for engine in engines:
        engine.reset_connection()
    if unreachable:
        database.failed(who, exc)
        return UNREACHABLE
    return LOST
