"""A schema object an engine keeps in its database for its statements: a function, an aggregate
or a trigger, by name, with its definition and its reason.

An engine's statements may call such objects (a function does what one statement cannot: read
after a lock in a fresh snapshot, name a table it computes; a trigger follows a row's change
whichever statement makes it). The migrations create and replace them; the engine keeps each
one's current definition beside its statements (the PostgreSQL engine's are in
``engines/postgres/statements/routines.py``), and ``manage.py xjobs_sql`` prints them
(:meth:`Engine.routines <django_xjobs.engines.base.Engine.routines>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True, kw_only=True)
class Routine:
    """One function, aggregate or trigger of the schema, as the last migration to touch it left
    it: ``sql`` creates it in an empty schema (once what it calls exists) and ``why`` says why it
    exists and what relies on it."""

    kind: Literal["function", "aggregate", "trigger"]
    name: str  # its SQL name
    of: str  # a function's argument types (with its name, its identity), a trigger's table
    migration: str  # the migration that last created or replaced it
    why: str
    sql: str

    @property
    def signature(self) -> str:
        """``xjobs_rate_take(text[], ..., boolean)``, or ``x_jobs_transition on x_jobs``."""
        return f"{self.name} on {self.of}" if self.kind == "trigger" else f"{self.name}({self.of})"
