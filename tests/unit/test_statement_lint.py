"""The wire format is a set of named, commented statements, each declared once in the module
of its table family, and ``manage.py xjobs_sql`` prints each one as text an operator can paste
into psql, then the functions and triggers the statements rely on (routines.py).

No database: these tests read the statements package and the command's output only.
(That the printed PREPAREs are accepted by PostgreSQL is checked in
tests/integration/test_commands.py.)
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_xjobs.engines import Routine, Statement, get_engine, numbered
from django_xjobs.engines.postgres import engine as postgres_engine
from django_xjobs.engines.postgres import instrumentation
from django_xjobs.engines.postgres import statements as S
from django_xjobs.engines.postgres.core import positional

PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# The engine's modules (engine.py, core.py, operations/, sessions.py, ...), the statements
# package aside.
ENGINE_PACKAGE = Path(postgres_engine.__file__).parent
ENGINE_SOURCE = "\n".join(
    path.read_text() for path in sorted(ENGINE_PACKAGE.rglob("*.py"))
    if "statements" not in path.relative_to(ENGINE_PACKAGE).parts
)
STATEMENTS = sorted(S.ALL.items())
# The modules of the statements package that declare no statement.
NOT_FAMILIES = ("fragments", "routines")
IDS = [name for name, _ in STATEMENTS]


def placeholders(stmt: Statement) -> list[str]:
    """Distinct placeholder names in order of first use."""
    seen: list[str] = []
    for name in PLACEHOLDER.findall(stmt.sql):
        if name not in seen:
            seen.append(name)
    return seen


def sql_command(*args: str) -> str:
    out = StringIO()
    call_command("xjobs_sql", *args, stdout=out)
    return out.getvalue()


def test_there_are_statements_and_the_engine_serves_exactly_these():
    assert len(S.ALL) >= 15
    assert dict(get_engine().statements()) == S.ALL


@pytest.mark.parametrize(("key", "stmt"), STATEMENTS, ids=IDS)
def test_each_statement_is_filed_under_its_own_name(key, stmt):
    assert isinstance(stmt, Statement)
    assert stmt.name == key
    assert re.fullmatch(r"[a-z][a-z0-9_]*", stmt.name), "names are snake_case, noun first"


def test_every_family_module_is_collected_into_all_in_the_documented_order():
    # ALL is collected from S.FAMILIES: a family module left out of it would declare statements
    # the engine could run but xjobs_sql would never show. Its order is the package docstring's.
    package = Path(S.__file__).parent
    modules = {path.stem for path in package.glob("*.py")} - {"__init__", *NOT_FAMILIES}
    assert {m.__name__.rpartition(".")[2] for m in S.FAMILIES} == modules
    documented = re.findall(r"^\* ``(\w+)``:", S.__doc__ or "", re.MULTILINE)
    assert [m.__name__.rpartition(".")[2] for m in S.FAMILIES] == [
        name for name in documented if name not in NOT_FAMILIES]
    in_order = [stmt.name for module in S.FAMILIES for stmt in vars(module).values()
                if isinstance(stmt, Statement)]
    assert list(S.ALL) == in_order


def test_each_statement_is_declared_in_one_family_module_and_listed_in_all():
    # ALL is collected from what the family modules declare: a statement declared in two
    # modules would be run by one name and shown by xjobs_sql under another, and one missing
    # from ALL would not be shown at all.
    package = Path(S.__file__).parent
    declared: dict[str, list[str]] = {}
    for path in sorted(package.glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(f"{S.__name__}.{path.stem}")
        for value in vars(module).values():
            if isinstance(value, Statement):
                declared.setdefault(value.name, []).append(path.stem)
                assert S.ALL.get(value.name) is value, f"{path.stem}.{value.name} is not in ALL"
    twice = {name: modules for name, modules in declared.items() if len(modules) > 1}
    assert twice == {}, f"declared in more than one module: {twice}"
    assert set(declared) == set(S.ALL), set(declared) ^ set(S.ALL)
    assert "fragments" not in {m for modules in declared.values() for m in modules}


def test_every_statement_constant_is_in_all_under_the_constants_name():
    # ALL is keyed by Statement.name: two constants that share a name would silently collapse
    # into one entry, and the engine would run a statement xjobs_sql never shows.
    constants = {k: v for family in S.FAMILIES for k, v in vars(family).items()
                 if isinstance(v, Statement)}
    assert len(constants) == len(S.ALL)
    for constant, stmt in constants.items():
        assert constant == stmt.name.upper(), f"{constant} is named {stmt.name!r}"
        assert S.ALL[stmt.name] is stmt


@pytest.mark.parametrize(("key", "stmt"), STATEMENTS, ids=IDS)
def test_each_statement_says_why(key, stmt):
    why = stmt.why.strip()
    assert why, f"{key} has no why"
    assert len(why) >= 30, f"{key}: a why must give a reason, not a label: {why!r}"
    assert why.lower() != key.replace("_", " ")


@pytest.mark.parametrize(("key", "stmt"), STATEMENTS, ids=IDS)
def test_each_statement_uses_only_named_placeholders(key, stmt):
    rest = PLACEHOLDER.sub("", stmt.sql).replace("%%", "")
    assert "%" not in rest, f"{key}: a bare % (a positional %s, or an unescaped literal %)"
    assert not re.search(r"\{[A-Za-z_]+\}", stmt.sql), f"{key}: an unformatted {{NAME}}"
    assert stmt.sql.strip(), f"{key} has no SQL"


def test_numbered_placeholders_keep_one_number_per_name_and_unescape_percent_signs():
    assert numbered("select %(a)s, %(b)s::int, %(a)s, '100%%'") == (
        "select $1, $2::int, $1, '100%'", ("a", "b"))
    assert numbered("select 1") == ("select 1", ())


@pytest.mark.parametrize("text", ["select %s", "select %(a)d", "select '5%'", "select %"])
def test_numbered_refuses_a_percent_sign_that_is_no_placeholder(text):
    with pytest.raises(ValueError, match="is not a placeholder"):
        numbered(text)


@pytest.mark.parametrize(("key", "stmt"), STATEMENTS, ids=IDS)
def test_the_engine_sends_each_statement_once_numbered_with_its_parameters_in_order(key, stmt):
    text, names = positional(stmt.sql)
    assert names == tuple(placeholders(stmt))
    assert text == numbered(stmt.sql)[0].encode()
    assert positional(stmt.sql) is positional(stmt.sql), "converted once per process"


@pytest.mark.parametrize(("key", "stmt"), STATEMENTS, ids=IDS)
def test_each_statement_is_a_single_statement(key, stmt):
    assert ";" not in stmt.sql, f"{key}: one constant, one statement"


@pytest.mark.parametrize(
    ("key", "stmt"), [(k, s) for k, s in STATEMENTS if k.endswith("_if_owned")],
    ids=[k for k in IDS if k.endswith("_if_owned")],
)
def test_each_if_owned_write_is_fenced_on_the_token_and_running(key, stmt):
    # Every write a worker makes about a run matches (id, running, token): docs/architecture.md,
    # "Fencing". The batch writes lock each run's row by its pair (p.id, p.token) first
    # (fragments.free_runs_sql), the single ones by the run's own parameters.
    sql = " ".join(stmt.sql.split())
    assert re.search(r"lease_token = (%\(token\)s(::uuid)?|[vp]\.token)", sql), key
    assert re.search(r"state = 'running'", sql), key
    assert re.search(r"\bid = (%\(id\)s|%\(job_id\)s::uuid|[vp]\.id)", sql), key


def _statements_the_engine_imports() -> dict[str, str]:
    """``{constant: family}`` of every statement the engine's modules import by name from a
    family module (``from ..statements.claim import JOBS_CLAIM``): how the engine runs one."""
    imported: dict[str, str] = {}
    for path in sorted(ENGINE_PACKAGE.rglob("*.py")):
        if "statements" in path.relative_to(ENGINE_PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and ".statements." in f".{node.module}":
                family = importlib.import_module(f"{S.__name__}.{node.module.rpartition('.')[2]}")
                for alias in node.names:
                    if isinstance(getattr(family, alias.name, None), Statement):
                        imported[alias.name] = family.__name__.rpartition(".")[2]
    return imported


def test_the_engine_runs_every_statement_and_names_each_by_its_family():
    # ruff's unused-import rule keeps every imported statement in use; this keeps every
    # declared one imported, from the module that declares it.
    imported = _statements_the_engine_imports()
    declared = {stmt.name: (name, family.__name__.rpartition(".")[2])
                for family in S.FAMILIES for name, stmt in vars(family).items()
                if isinstance(stmt, Statement)}
    assert {constant: family for constant, family in declared.values()} == imported


def test_the_engine_instruments_every_statement_in_one_place():
    # Fault points, timing and the DEBUG log of every statement, on Django's connection, in the
    # COPY of a bulk enqueue and on the dedicated connections (LISTEN, the advisory session),
    # are instrumentation.instrumented's alone.
    wrapper = inspect.getsource(instrumentation.instrumented)
    assert ENGINE_SOURCE.count("faults.hit(") == wrapper.count("faults.hit(") == 2
    assert ENGINE_SOURCE.count("log.debug(") == wrapper.count("log.debug(") == 1


# ----------------------------------------------------------------------------- xjobs_sql --


def test_xjobs_sql_prints_every_statement_with_its_name():
    out = sql_command()
    for name, stmt in STATEMENTS:
        assert f"-- {name}" in out
        if placeholders(stmt):
            assert f"prepare {name} as\n" in out, f"{name} is not printed as a PREPARE"
    assert "%(" not in out
    assert "%%" not in out
    assert out.count("\n-- ") + out.startswith("-- ") >= len(S.ALL)


@pytest.mark.parametrize(("key", "stmt"), STATEMENTS, ids=IDS)
def test_xjobs_sql_name_prints_one_statement_with_its_why(key, stmt):
    out = sql_command(key)
    why_lines = [f"-- {line}".rstrip() for line in stmt.why.strip().splitlines()]
    for line in why_lines:
        assert line in out.splitlines()
    headers = [line for line in out.splitlines()
               if line.startswith("--") and line not in why_lines]
    assert len(headers) == 1, "exactly one statement is printed"
    assert re.fullmatch(rf"-- {key}(  \(.*\))?", headers[0])

    names = placeholders(stmt)
    if names:
        assert f"prepare {key} as\n" in out
        header = next(line for line in out.splitlines() if line.startswith(f"-- {key}"))
        for i, name in enumerate(names, start=1):
            assert f"${i} = {name}" in header
    numbers = {int(n) for n in re.findall(r"\$(\d+)", out)}
    assert numbers == set(range(1, len(names) + 1))
    assert "%(" not in out


def test_a_repeated_placeholder_keeps_one_number():
    out = sql_command("job_enqueue_unkeyed")
    assert "$1 = id" in out
    assert "$4::jsonb, $1::uuid::text" in out  # %(id)s again, as the key: still $1
    assert out.count("= id,") == 1


def test_doubled_percent_signs_print_as_one():
    out = sql_command("jobs_claim")
    assert "format('lease lost %s times" in out


def test_xjobs_sql_why_prints_the_reasons_of_all_statements():
    out = sql_command("--why")
    for _, stmt in STATEMENTS:
        first = stmt.why.strip().splitlines()[0]
        assert f"-- {first}".rstrip() in out
    assert len(out) > len(sql_command())


def test_xjobs_sql_of_an_unknown_name_lists_the_known_ones():
    with pytest.raises(CommandError, match="no statement 'job_explode'") as info:
        sql_command("job_explode")
    assert "jobs_claim" in str(info.value)
    assert "xjobs_rate_take" in str(info.value)
    assert info.value.returncode == 2  # bad usage (docs/reference/commands.md)


# ------------------------------------------------------- functions, aggregate and triggers --
# engines/postgres/statements/routines.py; tests/integration/test_sql_routines.py checks them
# against the migrated database.

ROUTINE_IDS = [r.signature for r in S.ROUTINES]


def printed(routine: Routine) -> str:
    return (f"-- {routine.signature}  ({routine.kind}, migration {routine.migration})\n"
            f"{routine.sql.strip()};\n")


@pytest.mark.parametrize("routine", S.ROUTINES, ids=ROUTINE_IDS)
def test_each_function_and_trigger_is_named_as_its_definition_names_it_and_says_why(routine):
    assert re.fullmatch(r"x(jobs)?_[a-z0-9_]+", routine.name), "ours are named x_ or xjobs_"
    create = {"function": "create or replace function", "aggregate": "create or replace aggregate",
              "trigger": "create trigger"}[routine.kind]
    assert routine.sql.strip().startswith(f"{create} {routine.name}")
    assert routine.name not in S.ALL, "a statement and a function share a name"
    why = routine.why.strip()
    assert len(why) >= 30, f"{routine.signature}: a why must give a reason, not a label"
    assert not routine.sql.strip().endswith(";"), "xjobs_sql adds the semicolon"


def test_xjobs_sql_prints_every_function_and_trigger_after_the_statements():
    out = sql_command()
    last_statement = max(out.index(f"-- {name}") for name in S.ALL)
    for routine in S.ROUTINES:
        assert printed(routine) in out
        assert out.index(printed(routine)) > last_statement
    assert len(S.ROUTINES) >= 10


@pytest.mark.parametrize("name", sorted({r.name for r in S.ROUTINES}))
def test_xjobs_sql_name_prints_a_function_or_trigger_with_its_why(name):
    out = sql_command(name)
    forms = [r for r in S.ROUTINES if r.name == name]
    for routine in forms:
        assert printed(routine) in out
        for line in routine.why.strip().splitlines():
            assert f"-- {line}".rstrip() in out.splitlines()
    headers = [line for line in out.splitlines() if line.startswith(f"-- {name}")]
    assert len(headers) == len(forms), "every form of the name, and nothing else"
    assert "prepare " not in out


def test_xjobs_sql_prints_both_forms_of_the_rate_take_and_bodies_verbatim():
    # A body's % is PL/pgSQL's (a RAISE's placeholder, a LIKE pattern), not a placeholder of ours.
    assert sql_command("xjobs_rate_take").count("create or replace function xjobs_rate_take(") == 2
    out = sql_command("xjobs_require_read_committed")
    assert "'django-xjobs: % needs READ COMMITTED, and this transaction is %'" in out
    assert "like 'cron:%'" in sql_command("x_jobs_cron_overlap")
