"""``manage.py xjobs_sql [NAME]``: print the engine's statements, like ``sqlmigrate``.

Each statement is printed as a ``PREPARE`` an operator can paste into psql, with its reason.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...engines import Statement, get_engine

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def as_prepare(stmt: Statement) -> str:
    """``%(name)s`` placeholders become ``$n`` in order of first use; ``%%`` becomes ``%``."""
    order: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    body = _PLACEHOLDER.sub(number, stmt.sql.strip()).replace("%%", "%")
    params = ", ".join(f"${i + 1} = {name}" for i, name in enumerate(order))
    header = f"-- {stmt.name}" + (f"  ({params})" if params else "")
    if not order:
        return f"{header}\n{body};"
    return f"{header}\nprepare {stmt.name} as\n{body};"


class Command(BaseCommand):
    help = "Print the SQL statements django-xjobs runs (all, or one by name), with their reasons."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", nargs="?", help="statement name (default: list them all)")
        parser.add_argument("--why", action="store_true", help="also print why it is written so")

    def handle(self, *args: Any, **options: Any) -> None:
        statements = get_engine().statements()
        name = options["name"]
        if name is not None and name not in statements:
            raise CommandError(f"no statement {name!r}; known: {', '.join(sorted(statements))}")
        chosen = [statements[name]] if name else [statements[k] for k in sorted(statements)]
        for stmt in chosen:
            if options["why"] or name:
                for line in stmt.why.strip().splitlines():
                    self.stdout.write(f"-- {line}".rstrip())
            self.stdout.write(as_prepare(stmt) + "\n")
