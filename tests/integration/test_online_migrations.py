"""The migrations change a live job table without stalling its writers (docs/deployment.md,
"Migrations on deploy").

* The SQL ``sqlmigrate`` prints for every migration after the first passes squawk, a linter of
  PostgreSQL migrations (the ``test`` extra installs it): no index built without CONCURRENTLY,
  no constraint added without NOT VALID, no strong lock without a lock_timeout, no step that
  cannot be run again. 0001 is exempt: it creates its tables, empty at the first install. A
  migration Django would write plainly (an index, a CHECK) is caught, so the lint can fail.
* ``run_ddl`` (django_xjobs/migrations/_online.py) tries again when another session holds the
  table, and gives up after its retries with a message naming that session; in a transaction
  a try that gave up leaves the transaction usable.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, migrations, models
from django.db.migrations.loader import MigrationLoader

from django_xjobs.migrations._online import LockRetriesExhausted, run_ddl
from tests.conftest import raw_connection, wait_until

# Rules left out, with the reason. prefer-bigint-over-int: a column's type is the model's
# design, not a lock. require-statement-timeout: a concurrent index build or a constraint's
# validation runs as long as the table is big, under a lock no writer waits for; a statement
# timeout would cancel it.
EXCLUDED_RULES = "prefer-bigint-over-int,require-statement-timeout"
OLDEST_SUPPORTED_POSTGRES = "14"


def squawk(paths: list[Path]) -> list[dict[str, Any]]:
    """squawk's findings over ``paths`` (its JSON report)."""
    exe = shutil.which("squawk", path=str(Path(sys.executable).parent)) or shutil.which("squawk")
    if exe is None:
        pytest.fail("squawk is not installed: pip install -e '.[test]' (the squawk-cli package)")
    done = subprocess.run(
        [exe, "--reporter", "json", f"--pg-version={OLDEST_SUPPORTED_POSTGRES}",
         f"--exclude={EXCLUDED_RULES}", *map(str, paths)],
        capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip().startswith("["):
        pytest.fail(f"squawk failed: {done.stderr or done.stdout}")
    return json.loads(done.stdout)


def findings_text(findings: list[dict[str, Any]]) -> str:
    return "\n".join(f"{Path(f['file']).name}:{f['line']}: {f['rule_name']}: {f['message']}"
                     for f in findings)


@pytest.mark.django_db(transaction=True)  # sqlmigrate of a CONCURRENTLY step: no transaction
def test_every_migration_after_the_first_passes_the_online_lint(tmp_path):
    names = sorted(name for app, name in MigrationLoader(None, ignore_no_migrations=True)
                   .disk_migrations if app == "django_xjobs")
    assert names[0] == "0001_initial"
    paths = []
    for name in names[1:]:
        out = StringIO()
        call_command("sqlmigrate", "django_xjobs", name, stdout=out)
        paths.append(tmp_path / f"{name}.sql")
        paths[-1].write_text(out.getvalue(), encoding="utf-8")
    findings = squawk(paths)
    assert findings == [], f"migrations that are not online-safe:\n{findings_text(findings)}"


@pytest.mark.django_db
def test_the_lint_finds_an_index_and_a_check_added_the_plain_way(tmp_path):
    loader = MigrationLoader(connection)
    state = loader.project_state(("django_xjobs", loader.graph.leaf_nodes("django_xjobs")[0][1]))
    plain = migrations.Migration("9999_plain", "django_xjobs")
    plain.operations = [
        migrations.AddIndex("job", models.Index(fields=["priority"], name="x_jobs_plain_idx")),
        migrations.AddConstraint("job", models.CheckConstraint(
            condition=models.Q(priority__gte=-100), name="x_jobs_plain_check")),
    ]
    with connection.schema_editor(collect_sql=True, atomic=True) as editor:
        plain.apply(state, editor, collect_sql=True)
    path = tmp_path / "9999_plain.sql"
    path.write_text("BEGIN;\n" + "\n".join(editor.collected_sql) + "\nCOMMIT;\n", encoding="utf-8")
    rules = {f["rule_name"] for f in squawk([path])}
    assert {"require-concurrent-index-creation", "constraint-missing-not-valid",
            "require-lock-timeout"} <= rules, rules


@pytest.fixture
def probe_table():
    """A table of this test's own, committed, that another session can hold."""
    with raw_connection(autocommit=True) as admin:
        admin.execute("drop table if exists x_online_probe")
        admin.execute("create table x_online_probe (id int)")
    yield "x_online_probe"
    with raw_connection(autocommit=True) as admin:
        admin.execute("drop table if exists x_online_probe")


def columns(table: str) -> list[str]:
    with raw_connection(autocommit=True) as other:
        return [r[0] for r in other.execute(
            "select attname from pg_attribute where attrelid = %s::regclass and attnum > 0"
            " and not attisdropped order by attnum", [table])]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "atomic"])
def test_a_statement_held_off_past_its_retries_names_the_holder_and_changes_nothing(
        probe_table, monkeypatch, in_transaction):
    monkeypatch.setenv("XJOBS_MIGRATE_LOCK_TIMEOUT", "100ms")
    monkeypatch.setenv("XJOBS_MIGRATE_LOCK_RETRIES", "1")
    holder = raw_connection(application_name="a long report")
    try:
        holder.execute(f"select count(*) from {probe_table}")  # ACCESS SHARE, kept open
        with connection.schema_editor(atomic=in_transaction) as editor:
            with pytest.raises(LockRetriesExhausted) as raised:
                run_ddl(editor, f"alter table {probe_table} add column c int")
            if in_transaction:  # the savepoint rolled back: the transaction goes on
                with connection.cursor() as cursor:
                    cursor.execute("select 1")
    finally:
        holder.rollback()
        holder.close()
    message = str(raised.value)
    assert "waited 2 times for 100ms" in message
    assert "application_name 'a long report'" in message
    assert f"select count(*) from {probe_table}" in message
    assert columns(probe_table) == ["id"]
    with connection.cursor() as cursor:
        cursor.execute("show lock_timeout")
        assert cursor.fetchone()[0] == "0"  # the session's own setting, restored


@pytest.mark.django_db(transaction=True)
def test_a_statement_tries_again_while_held_and_runs_once_the_holder_is_gone(
        probe_table, monkeypatch):
    monkeypatch.setenv("XJOBS_MIGRATE_LOCK_TIMEOUT", "100ms")
    monkeypatch.setenv("XJOBS_MIGRATE_LOCK_RETRIES", "1000")
    holder = raw_connection(application_name="a long report")
    holder.execute(f"select count(*) from {probe_table}")
    errors: list[BaseException] = []

    def migrate() -> None:
        from django.db import connection as own  # this thread's connection

        try:
            with own.schema_editor(atomic=False) as editor:
                run_ddl(editor, f"alter table {probe_table} add column c int")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            own.close()

    thread = threading.Thread(target=migrate)
    thread.start()
    starts: set[Any] = set()

    def tried_twice() -> bool:
        with raw_connection(autocommit=True) as watcher:
            row = watcher.execute(
                "select query_start from pg_stat_activity where wait_event_type = 'Lock'"
                " and query like %s", [f"alter table {probe_table}%"]).fetchone()
        if row:
            starts.add(row[0])
        return len(starts) >= 2

    try:
        wait_until(tried_twice, message="the ALTER to time out and wait again")
    finally:
        holder.rollback()
        holder.close()
        thread.join()
    assert errors == []
    assert columns(probe_table) == ["id", "c"]


def test_a_bad_lock_timeout_setting_is_refused_with_the_variables_name(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from django_xjobs.migrations._online import lock_retries, lock_timeout

    monkeypatch.setenv("XJOBS_MIGRATE_LOCK_TIMEOUT", "soon")
    with pytest.raises(ImproperlyConfigured, match="XJOBS_MIGRATE_LOCK_TIMEOUT='soon'"):
        lock_timeout()
    monkeypatch.setenv("XJOBS_MIGRATE_LOCK_TIMEOUT", "1min")
    assert lock_timeout() == ("1min", 60_000)
    monkeypatch.setenv("XJOBS_MIGRATE_LOCK_RETRIES", "-1")
    with pytest.raises(ImproperlyConfigured, match="XJOBS_MIGRATE_LOCK_RETRIES='-1'"):
        lock_retries()


SCHEMA_SQL = """
select 'column', attrelid::regclass::text || '.' || attname || ' '
       || format_type(atttypid, atttypmod)
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || case when attnotnull then ' not null' else '' end
  from pg_attribute a left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
 where attrelid::regclass::text like 'x\\_%' and attnum > 0 and not attisdropped
union all
select 'index', pg_get_indexdef(indexrelid) || case when indisvalid then '' else ' INVALID' end
  from pg_index where indrelid::regclass::text like 'x\\_%'
union all
select 'constraint', conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
       || case when convalidated then '' else ' NOT VALID' end
  from pg_constraint where conrelid::regclass::text like 'x\\_%'
union all
select 'trigger', pg_get_triggerdef(oid) from pg_trigger
 where tgrelid::regclass::text like 'x\\_%' and not tgisinternal
order by 1, 2
"""


def schema() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(SCHEMA_SQL)
        return cursor.fetchall()


@pytest.mark.django_db(transaction=True)
def test_every_migration_run_again_on_its_own_result_changes_nothing():
    """What ``migrate`` does when it resumes a migration that stopped midway: each step it
    already ran is skipped or a no-op (IF [NOT] EXISTS, done_if), none fails."""
    before = schema()
    loader = MigrationLoader(connection)
    names = sorted(name for app, name in loader.disk_migrations if app == "django_xjobs")
    for name in names[1:]:
        migration = loader.get_migration("django_xjobs", name)
        state = loader.project_state(("django_xjobs", name), at_end=False)
        with connection.schema_editor(atomic=migration.atomic) as editor:
            migration.apply(state, editor)
    assert schema() == before
