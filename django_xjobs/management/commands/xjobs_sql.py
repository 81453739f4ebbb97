"""``manage.py xjobs_sql [NAME]``: print the engine's statements, like ``sqlmigrate``.

Each statement is printed as a ``PREPARE`` an operator can paste into psql, with its reason;
then the functions, the aggregate and the triggers the statements rely on, each as the
definition the migrations leave in the database (``Engine.routines``). A NAME is a
statement's or one of those objects' (an overloaded function prints every form).
"""

from __future__ import annotations

from typing import Any

from ...engines import Routine, Statement, get_engine, numbered
from .. import cli


def as_prepare(stmt: Statement) -> str:
    """``%(name)s`` placeholders become ``$n`` in order of first use; ``%%`` becomes ``%``."""
    body, order = numbered(stmt.sql.strip())
    params = ", ".join(f"${i + 1} = {name}" for i, name in enumerate(order))
    header = f"-- {stmt.name}" + (f"  ({params})" if params else "")
    if not order:
        return f"{header}\n{body};"
    return f"{header}\nprepare {stmt.name} as\n{body};"


def as_definition(routine: Routine) -> str:
    """The definition as psql takes it, verbatim (a function body's ``%`` is no placeholder)."""
    header = f"-- {routine.signature}  ({routine.kind}, migration {routine.migration})"
    return f"{header}\n{routine.sql.strip()};"


class Command(cli.XJobsCommand):
    help = ("Print the SQL statements django-xjobs runs, and the functions and triggers they rely"
            " on (all, or one by name), with their reasons.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", nargs="?",
                            help="a statement's, function's or trigger's name (default: all)")
        parser.add_argument("--why", action="store_true", help="also print why it is written so")

    def handle(self, *args: Any, **options: Any) -> None:
        statements = get_engine().statements()
        routines = get_engine().routines()
        name = options["name"]
        if name is None:
            chosen = [statements[k] for k in sorted(statements)]
            defined = list(routines)
        else:
            chosen = [statements[name]] if name in statements else []
            defined = [routine for routine in routines if routine.name == name]
            if not chosen and not defined:
                known = sorted({*statements, *(routine.name for routine in routines)})
                raise cli.usage_error(f"no statement {name!r}; known: {', '.join(known)}")
        explain = bool(options["why"] or name)
        for stmt in chosen:
            if explain:
                self._why(stmt.why)
            self.stdout.write(as_prepare(stmt) + "\n")
        for routine in defined:
            if explain:
                self._why(routine.why)
            self.stdout.write(as_definition(routine) + "\n")

    def _why(self, why: str) -> None:
        for line in why.strip().splitlines():
            self.stdout.write(f"-- {line}".rstrip())
