"""Fixtures shared by every layer of the suite.

Everything runs against a real PostgreSQL (see tests/settings.py); nothing is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


# The acceptance modules whose tests run fleets of worker processes under faults: one group,
# run one test at a time (see pytest_xdist_make_scheduler). test_upgrade's fleets are not in
# it: their 30 s lease and their waits on rows do not depend on timely heartbeats, and the
# group is the suite's longest path.
FLEET_MODULES = frozenset(f"tests/acceptance/{name}.py" for name in (
    "test_soak", "test_worker_faults", "test_pooler", "test_postgres_restart",
    "test_worker_clock", "test_flow_fleet", "test_slots_fleet", "test_scheduler_fleet",
    "test_lease_proof", "test_worker_health", "test_worker_processes", "test_backfills",
    "test_worker_signals", "test_history_fleet", "test_children_faults",
    "test_live_application",
    # Not a fleet under faults, but it balances the two processes: the fleet group and the
    # rest of the suite each take about half of it (docs/development.md).
    "test_outbox_relay",
))
FLEET = "fleet"


def group_of(nodeid: str) -> str:
    """The group of a test: ``fleet`` for the fleet modules, else its module."""
    module = nodeid.split("::", 1)[0]
    return FLEET if module in FLEET_MODULES else module


def grouped(config: Any) -> bool:
    """Whether the run shares its tests out by group (``make test``: ``--dist loadgroup``).

    Asked in the controller, which schedules, and in each pytest-xdist process, which collects:
    there pytest-xdist sets ``dist`` to ``no`` and keeps ``loadgroup`` (True) instead.
    """
    if not config.pluginmanager.hasplugin("xdist"):
        return False
    return config.getvalue("dist") == "loadgroup" or getattr(config.option, "loadgroup", False)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """The fleet group first (see pytest_xdist_make_scheduler), then the other acceptance
    modules, the rest in file order.

    The scheduler hands the groups out in the order the processes collected them, so this is
    the order they start in: the long fleet group at once in one process; the other process
    takes the other subprocess-heavy modules (each a group of its own, and long) while the
    fleet runs, and the many short modules last, so both processes run out of work at about
    the same time rather than one waiting for the other's last long module.
    """
    if grouped(config):
        items.sort(key=lambda item: (group_of(item.nodeid) != FLEET,
                                     not item.nodeid.startswith("tests/acceptance/")))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """How ``make test`` shares the suite between its pytest-xdist processes (``-n 2 --dist
    loadgroup``; docs/development.md, "Running the tests").

    The tests that run fleets of worker processes under faults are one group, run one at a time
    in one process: two such fleets on two cores would starve each other's heartbeats into false
    lease lapses. The group goes first, so its long run starts at once while the other process
    takes everything else. Every other module is a group of its own, so a module-scoped fixture
    (the million rows of the plan tests) is built once.

    The groups are decided here, from each test's id, rather than by ``xdist_group`` marks:
    pytest-xdist 3.8 passes a mark to its scheduler by appending it to the test's id, which
    pytest 9.2 no longer lets it change, and every test then went out on its own.
    """
    if not grouped(config):
        return None
    from xdist.scheduler import LoadScopeScheduling  # pytest-xdist is a test extra

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    # In collection order (the fleet first), not the largest group first.
    config.option.loadscopereorder = False
    return ByGroup(config, log)


def pytest_report_header(config: Any) -> str:
    from django.conf import settings

    return f"database: {settings.DATABASE_SOURCE}"


# Tables whose rows migrate writes (post_migrate) and no test changes: kept between tests.
MIGRATED_ROWS = frozenset({"django_content_type", "auth_permission"})


def _empty_the_tables_the_test_wrote(self: Any) -> None:
    """``TransactionTestCase._fixture_teardown`` (transactional_db) in one statement per database.

    Django's flush truncates every table and then writes the content types and permissions
    again (post_migrate): about 0.2 s after each of the suite's 900 committing tests, most of
    it spent making new files for tables the test never touched. Here one statement finds the
    tables that hold rows and one TRUNCATE empties them (no dead rows left for a later test's
    plans to read); the content types and permissions migrate wrote stay as they are.
    """
    from django.db import connections  # Django's, configured by the time a test ends

    for alias in self._databases_names(include_mirrors=False):
        connection = connections[alias]
        quote = connection.ops.quote_name
        tables = [t for t in connection.introspection.django_table_names(
                      only_existing=True, include_views=False) if t not in MIGRATED_ROWS]
        if not tables:
            continue
        with connection.cursor() as cursor:
            cursor.execute(" union all ".join(
                f"select {i} from (select from {quote(t)} limit 1) s"
                for i, t in enumerate(tables)))
            written = [tables[i] for (i,) in cursor.fetchall()]
            if written:
                # cascade: a table other tables reference (auth_user) goes with them
                cursor.execute(f"truncate {', '.join(map(quote, written))} cascade")


def pytest_configure(config: Any) -> None:
    from django.test import TransactionTestCase  # imported once pytest-django set Django up

    teardown = _empty_the_tables_the_test_wrote
    TransactionTestCase._fixture_teardown = teardown  # type: ignore[method-assign]


def raw_connection(**options: Any) -> Any:
    """A psycopg connection of its own (not Django's) to the test database, with ``options``
    over Django's parameters (``autocommit=True``, ``application_name=...``, ``dbname=...``)."""
    import psycopg  # the driver; Django is set up by the time a test calls this
    from django.db import connection

    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    return psycopg.connect(**{**params, **options})


def burn_transaction_ids(n: int) -> None:
    """Move the database cluster's transaction counter on by ``n``: one transaction id per
    statement, each its own transaction (a Sync after each, pipelined)."""
    with raw_connection(autocommit=True) as conn, conn.pipeline() as pipeline:
        for _ in range(n):
            conn.execute("select txid_current()")
            pipeline.sync()


def in_threads(body: Callable[[], Any], n: int = 16) -> None:
    """Run ``body`` in ``n`` threads let go at once (a barrier), each on database connections
    of its own, closed when it ends; fail the test with the first exception one raised."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def run() -> None:
        from django.db import connections  # Django's, configured by the time a test runs

        try:
            barrier.wait()
            body()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02,
               message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)  # the poll interval


@pytest.fixture(scope="session", autouse=True)
def _close_stray_sessions_before_teardown(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Let pytest-django drop the test databases at the end of the run.

    Threads that tests start (relays, executors, sync_to_async) open their own Django
    connections; one left open makes ``DROP DATABASE`` fail ("being accessed by other users")
    and leaves the database behind. They die with this process anyway, so end them first.
    """
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for alias in connections:
            conn = connections[alias]
            if conn.vendor != "postgresql":
                continue
            name = conn.settings_dict["NAME"]
            if name != conn.creation._get_test_db_name():
                continue  # not set up by this run: never touch a real database's sessions
            with conn.cursor() as cursor:  # the main thread's own connection stays out of it
                cursor.execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity"
                    " where datname = %s and pid <> pg_backend_pid()", [name])
            conn.close()


# Every history table of finished jobs (docs/design.md, "History tables"), jobs and steps:
# the archive creates them as jobs finish, and flushing the database empties them but keeps them.
DROP_HISTORY_TABLES = """
select xjobs_history_drop(s.state, 'infinity')
  from unnest(array['done', 'dead', 'cancelled']) as s(state)
"""


@pytest.fixture(autouse=True)
def _drop_history_tables_a_committing_test_made(request, django_db_blocker) -> Iterator[None]:
    """A test whose writes commit (transactional_db: worker subprocesses, other sessions) may
    leave history tables behind when its workers archived finished jobs; the next test of this
    database would plan its queries over them. A test in a rolled-back transaction leaves
    none."""
    yield
    marker = request.node.get_closest_marker("django_db")
    if not ("transactional_db" in request.fixturenames
            or (marker is not None and marker.kwargs.get("transaction"))):
        return
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(DROP_HISTORY_TABLES)


@pytest.fixture
def engine():
    """The engine under test (the conformance suite runs once per engine)."""
    from django_xjobs.engines import get_engine

    return get_engine()


class WorkerProcess:
    """A real ``manage.py xjobs_worker`` subprocess on the test database."""

    new_session = False  # started in a process group of its own (killed as a group at stop)

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path,
                 command: str = "xjobs_worker", new_session: bool = False) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", command, *args],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )
        self.new_session = new_session

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.new_session:  # whatever it started is in its process group
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()


@pytest.fixture
def spawn_worker(transactional_db, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker subprocesses on the test database; all are killed at teardown.

    ``spawn_worker("--concurrency", "2", settings={"LEASE": "2s"}, faults="...")``; another
    command of the worker family with ``command="xjobs_scheduler"``; ``env`` adds to (or
    overrides) the child's environment, e.g. ``DATABASE_URL`` to point it at another server;
    ``new_session=True`` starts it in a session and process group of its own (``os.killpg``
    then signals it and every process it started, as a terminal or a service manager does).
    """
    from django.db import connection

    started: list[WorkerProcess] = []

    def spawn(*args: str, settings: dict[str, Any] | None = None, faults: str | None = None,
              log_level: str = "INFO", command: str = "xjobs_worker",
              env: dict[str, str] | None = None, new_session: bool = False) -> WorkerProcess:
        extra = env or {}
        env = dict(os.environ)
        env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
        env["XJOBS_TEST_DB_NAME"] = connection.settings_dict["NAME"]
        env["XJOBS_TEST_SETTINGS"] = json.dumps(settings or {})
        env["XJOBS_LOG_LEVEL"] = log_level
        env["PYTHONPATH"] = str(ROOT)
        env.pop("XJOBS_FAULTS", None)
        if faults:
            env["XJOBS_FAULTS"] = faults
        env.update(extra)
        worker = WorkerProcess(list(args), env, tmp_path / f"worker-{len(started)}.log",
                               command=command, new_session=new_session)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.stop()
