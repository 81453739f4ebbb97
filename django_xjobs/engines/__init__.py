"""Engine lookup: services call :func:`get_engine` and never import a concrete engine.

The engine for an alias is chosen by capability of the alias's Django backend; today the
PostgreSQL one (the seam is ``engines/base.py``, a second engine passes ``tests/conformance/``).
"""

from __future__ import annotations

import threading

from django.db import connections

from .. import conf
from ..exceptions import EngineUnavailable, ListenerLost, SessionLost
from .base import AdvisorySession, Engine, Listener, Statement, numbered
from .features import Features
from .routines import Routine

__all__ = [
    "AdvisorySession", "Engine", "Features", "Listener", "ListenerLost", "Routine",
    "SessionLost", "Statement", "get_engine", "numbered",
]

_engines: dict[tuple[str, bool, bool, str | None], Engine] = {}
_lock = threading.Lock()


def get_engine(alias: str | None = None) -> Engine:
    """The engine for ``alias`` (default: the jobs alias in use, ``XJOBS["DATABASE"]`` unless a
    shard or a replica was chosen: ``conf.using_database``).

    The engine of a jobs alias opens its dedicated sessions (LISTEN, the advisory lock) with
    the parameters of its ``XJOBS["LISTEN_DATABASE"]`` when that is set; an engine of another
    alias (an outbox database, a replica) with its own."""

    settings = conf.get()
    alias = alias or settings.database
    listen_alias = settings.listen_databases.get(alias)
    key = (alias, settings.notify, settings.prepared_statements, listen_alias)
    engine = _engines.get(key)
    if engine is not None:
        return engine
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _build(alias, notify=settings.notify,
                            prepared=settings.prepared_statements, listen_alias=listen_alias)
            _engines[key] = engine
    return engine


def _build(alias: str, *, notify: bool, prepared: bool, listen_alias: str | None) -> Engine:
    try:
        vendor = connections[alias].vendor
    except Exception as exc:
        raise EngineUnavailable(f"database alias {alias!r} is not configured: {exc}") from exc
    if vendor == "postgresql":
        # A concrete engine, and its driver (psycopg), is imported when an alias first needs it.
        from .postgres.engine import PostgresEngine

        return PostgresEngine(alias, notify=notify, prepared=prepared, listen_alias=listen_alias)
    raise EngineUnavailable(
        f"database alias {alias!r} uses {vendor!r}; django-xjobs needs PostgreSQL "
        "(XJOBS['DATABASE'] names the alias that holds the job tables)"
    )
