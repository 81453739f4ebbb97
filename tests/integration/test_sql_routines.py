"""The functions, the aggregate and the triggers of engines/postgres/statements/routines.py are
what the migrations leave in the database, and the database holds none of ours the module leaves
out.

Each kept definition is created in a scratch schema put first on the search path (in the
test's transaction, rolled back), and PostgreSQL's own reconstruction of it (pg_get_functiondef,
pg_get_triggerdef, an aggregate's catalog row) must equal its reconstruction of the object
``migrate`` made: the database does the normalising (the header's spelling of types and
options), and a body must match byte for byte, as PostgreSQL keeps a body's text as written.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from django.db import connection

from django_xjobs.engines import Routine
from django_xjobs.engines.postgres.statements import ROUTINES

pytestmark = pytest.mark.django_db

MIGRATIONS = Path(__file__).resolve().parents[2] / "django_xjobs" / "migrations"
SCRATCH = "xjobs_kept_definitions"
# Our objects in the schema: functions and the aggregate are named xjobs_*, triggers x_jobs_*;
# the pattern takes any x_ or xjobs_ name, so one named otherwise by mistake is found too.
OURS = r"^x(jobs)?_"

AGGREGATE = """
select format('%%s(%%s) sfunc %%s stype %%s finalfunc %%s combinefunc %%s mstype %%s'
              ' initcond %%s kind %%s parallel %%s volatile %%s',
              p.proname, pg_get_function_identity_arguments(p.oid),
              (select proname from pg_proc where oid = a.aggtransfn),
              format_type(a.aggtranstype, null),
              coalesce((select proname from pg_proc where oid = a.aggfinalfn), '-'),
              coalesce((select proname from pg_proc where oid = a.aggcombinefn), '-'),
              format_type(nullif(a.aggmtranstype, 0), null),
              coalesce(a.agginitval, '-'), a.aggkind, p.proparallel, p.provolatile)
  from pg_aggregate a join pg_proc p on p.oid = a.aggfnoid
 where a.aggfnoid = to_regprocedure(%s)
"""


def schema_of_the_tables(cursor) -> str:
    cursor.execute("select relnamespace::regnamespace::text from pg_class"
                   " where oid = 'x_jobs'::regclass")
    return cursor.fetchone()[0]


def described(cursor, routine: Routine, schema: str) -> str:
    """PostgreSQL's reconstruction of ``routine`` as it stands in ``schema``, the schema's name
    left out of its header (the body, which PostgreSQL keeps as written, untouched)."""
    if routine.kind == "function":
        cursor.execute("select pg_get_functiondef(to_regprocedure(%s))",
                       [f"{schema}.{routine.signature}"])
    elif routine.kind == "aggregate":
        cursor.execute(AGGREGATE, [f"{schema}.{routine.signature}"])
    else:
        cursor.execute("select pg_get_triggerdef(t.oid) from pg_trigger t"
                       " where t.tgname = %s and t.tgrelid = to_regclass(%s)",
                       [routine.name, f"{schema}.{routine.of}"])
    row = cursor.fetchone()
    assert row is not None and row[0] is not None, f"{routine.signature} is not in {schema}"
    header, newline, body = row[0].partition("\n")
    return re.sub(rf"\b{re.escape(schema)}\.", "", header) + newline + body


def kept_in_scratch(cursor, routines: tuple[Routine, ...], schema: str) -> None:
    """Every definition of ``routines``, in order, created in an empty schema of its own that
    the search path names first (with an empty copy of x_jobs for the triggers)."""
    cursor.execute(f"create schema {SCRATCH}")
    cursor.execute(f"set local search_path to {SCRATCH}, {schema}")
    cursor.execute(f"create table {SCRATCH}.x_jobs (like {schema}.x_jobs)")
    for routine in routines:
        cursor.execute(routine.sql)


def kept_and_migrated(routine: Routine, routines: tuple[Routine, ...] = ROUTINES):
    with connection.cursor() as cursor:
        schema = schema_of_the_tables(cursor)
        migrated = described(cursor, routine, schema)
        kept_in_scratch(cursor, routines, schema)
        return described(cursor, routine, SCRATCH), migrated


@pytest.mark.parametrize("routine", ROUTINES, ids=[r.signature for r in ROUTINES])
def test_each_kept_definition_is_what_the_migrations_leave_in_the_database(routine):
    kept, migrated = kept_and_migrated(routine)
    assert kept == migrated


def test_the_database_holds_no_function_or_trigger_of_ours_the_module_leaves_out():
    with connection.cursor() as cursor:
        schema = schema_of_the_tables(cursor)
        cursor.execute(
            "select case p.prokind when 'a' then 'aggregate' else 'function' end, p.proname,"
            "       oidvectortypes(p.proargtypes)"
            "  from pg_proc p"
            " where p.pronamespace = %s::regnamespace and p.proname ~ %s",
            [schema, OURS])
        functions = set(cursor.fetchall())
        cursor.execute(
            "select 'trigger', t.tgname, c.relname from pg_trigger t"
            "  join pg_class c on c.oid = t.tgrelid"
            " where c.relnamespace = %s::regnamespace and not t.tgisinternal"
            "   and (t.tgname ~ %s or c.relname ~ %s)",
            [schema, OURS, OURS])
        triggers = set(cursor.fetchall())
    listed = {(r.kind, r.name, r.of) for r in ROUTINES}
    assert functions | triggers == listed
    assert len(listed) == len(ROUTINES), "a definition listed twice"


@pytest.mark.parametrize(("name", "old", "new"), [
    ("xjobs_cron_overlap_release", "    return null;", "  return null;"),
    ("x_jobs_cron_overlap", "'cancelled'", "'dead'"),
    ("xjobs_hist_sum", "stype = bigint[]", "stype = bigint[], initcond = '{}'"),
])
def test_a_definition_that_differs_from_the_database_is_told_apart(name, old, new):
    # The check above can fail: a body's indentation (a function), a word of the WHEN clause (a
    # trigger), an option (the aggregate) changed make PostgreSQL's reconstructions differ.
    [routine] = [r for r in ROUTINES if r.name == name]
    changed = dataclasses.replace(routine, sql=routine.sql.replace(old, new, 1))
    assert changed.sql != routine.sql
    routines = tuple(changed if r is routine else r for r in ROUTINES)
    kept, migrated = kept_and_migrated(changed, routines)
    assert kept != migrated


# --------------------------------------------------------------------------- which migration --


@pytest.mark.parametrize("routine", ROUTINES, ids=[r.signature for r in ROUTINES])
def test_each_definition_names_the_last_migration_that_wrote_it(routine):
    # `migration` is the one whose text the definition is: a later migration that replaces the
    # object (its CREATE OR REPLACE, a new CREATE TRIGGER) must come with the new text here.
    # A function's forms (an overload) are told apart by how many arguments they take.
    create = {"function": "create or replace function", "aggregate": "create or replace aggregate",
              "trigger": "create trigger"}[routine.kind]
    writes = re.compile(rf"{create} {re.escape(routine.name)}\b\s*(?:\(([^)]*)\))?",
                        re.IGNORECASE)
    arity = len(routine.of.split(",")) if routine.of.strip() else 0

    def writes_it(text: str) -> bool:
        return any(routine.kind != "function" or len(
            [a for a in (m.group(1) or "").split(",") if a.strip()]) == arity
            for m in writes.finditer(text))

    writers = [path.stem for path in sorted(MIGRATIONS.glob("0*.py"))
               if writes_it(path.read_text(encoding="utf-8"))]
    assert writers and writers[-1] == routine.migration, writers
    assert routine.sql.strip() in (MIGRATIONS / f"{routine.migration}.py").read_text("utf-8")
