"""Database errors as django-xjobs's own exceptions, translated at the engine boundary: an
isolation level the database refused, a schema never migrated, and the answer of a write that
found the job's row held by another transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, ProgrammingError

from ...exceptions import IsolationLevelRefused, RowBusy, SchemaMissing
from ..base import Statement


def isolation_refused(exc: DatabaseError) -> IsolationLevelRefused | None:
    """xjobs_require_read_committed's refusal (SQLSTATE XJ001, migration 0010) as ours."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) != "XJ001":
        return None
    diag = cause.diag  # type: ignore[union-attr]
    return IsolationLevelRefused(f"{diag.message_primary} {diag.message_hint or ''}".strip())


def schema_missing(exc: ProgrammingError, stmt: Statement, alias: str) -> SchemaMissing | None:
    """A missing table means `migrate` was not run: say so instead of a driver traceback."""
    if exc.__cause__ is not None and type(exc.__cause__).__name__ == "UndefinedTable":
        error = SchemaMissing(
            f"{stmt.name}: the django-xjobs tables are missing from database alias {alias!r} "
            f"({exc.__cause__}); run `manage.py migrate`"
        )
        error.__cause__ = exc
        return error
    return None


def unless_busy(row: Sequence[Any], what: str) -> Sequence[Any]:
    """The answer of a step or backfill write, whose last column says whether it found the
    job's row held by another transaction: RowBusy then (nothing was written)."""
    if row[-1]:
        raise RowBusy(f"{what}: the job's row is held by another transaction")
    return row
