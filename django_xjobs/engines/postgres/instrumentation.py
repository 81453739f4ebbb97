"""The one wrapper every statement of the PostgreSQL engine goes through.

Fault points for the fault tests (django_xjobs/faults.py: ``before:<statement>`` and
``after:<statement>``), and each statement's name, time and rows in the DEBUG log of
``django_xjobs.engine``. Unarmed and with DEBUG off, it costs two flag tests, a clock read
and a level check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from ... import faults
from ..base import Statement

log = logging.getLogger("django_xjobs.engine")
_P = ParamSpec("_P")
_T = TypeVar("_T")


def instrumented(stmt: Statement, send: Callable[_P, _T], *args: _P.args,
                 **kwargs: _P.kwargs) -> _T:
    """``send(*args, **kwargs)``, which sends ``stmt``, between the fault points
    ``before:<name>`` and ``after:<name>``, with its time and rows in the DEBUG log. Every
    statement the engine sends goes through here: on the thread's Django connection
    (core.py: ``_run``; operations/enqueue.py: the COPY of a bulk enqueue) and on the
    dedicated ones (sessions.py: the LISTEN, the advisory session's statements). An error
    skips the log and the ``after`` point: the statement did not complete."""
    if faults.armed:
        faults.hit(f"before:{stmt.name}")
    started = time.perf_counter()
    result = send(*args, **kwargs)
    if log.isEnabledFor(logging.DEBUG):
        rows = len(result) if isinstance(result, list) else result
        log.debug("%s: %.2f ms, %s rows", stmt.name, (time.perf_counter() - started) * 1e3, rows)
    if faults.armed:
        faults.hit(f"after:{stmt.name}")
    return result
