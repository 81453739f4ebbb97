"""A private PgBouncer in transaction mode in front of the test's PostgreSQL, for tests that run
workers behind a pooler (tests/acceptance/test_pooler.py; docs/deployment.md, "PgBouncer").

The session-scoped ``pgbouncer`` fixture starts Debian's ``pgbouncer`` once per test run on a
free loopback port and stops it at the end. Its API::

    pgbouncer.url             postgres:// URL of the test database through the pooler
    pgbouncer.direct_url      the same database on the PostgreSQL server itself
    pgbouncer.worker_env()    the env a worker subprocess needs to go through the pooler:
                              spawn_worker(..., env=pgbouncer.worker_env())
    pgbouncer.worker_env(listen_direct=True)
                              and a "direct" alias (tests/settings.py) straight to the server,
                              for XJOBS["LISTEN_DATABASE"] = "direct"
    pgbouncer.server_pids()   the PostgreSQL backend pids the pooler holds now (SHOW SERVERS):
                              a backend not in it is a direct connection
    pgbouncer.show("pools")   any SHOW command of the admin console, as a list of dicts
    pgbouncer.log()           its log, for a failing test's message

Configuration (``pgbouncer.ini`` in a temporary directory, with its log and pid file):
``pool_mode = transaction``, the wildcard database ``* = host=... port=...`` of the test's
server (so every database name passes through, the test database included), ``auth_type =
trust`` with an ``auth_file`` naming the test's user (the test server trusts it; a password in
the URL is passed on), ``max_client_conn = 400`` and ``default_pool_size = 20`` (about six
workers of a few threads each: in transaction mode a client holds a server connection only for
the length of a transaction). PgBouncer refuses to run as root: as root it is started with
``-u postgres``.

Where pgbouncer is not installed or cannot start, the tests that use the fixture skip and say
why; ``XJOBS_REQUIRE_POOLER=1`` (CI) makes that a failure. ``make pooler`` (part of ``make
test``) installs Debian's package where it may.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

# About six workers of a few threads each, plus the test's own checks.
MAX_CLIENT_CONN = 400
DEFAULT_POOL_SIZE = 20
RUN_AS = "postgres"  # the OS user pgbouncer switches to when started as root


def unavailable(reason: str) -> None:
    """Skip the test (and say why), or fail it under XJOBS_REQUIRE_POOLER=1."""
    if os.environ.get("XJOBS_REQUIRE_POOLER") == "1":
        pytest.fail(f"XJOBS_REQUIRE_POOLER=1 but {reason}")
    pytest.skip(reason)


def executable() -> str | None:
    found = shutil.which("pgbouncer")
    if found is None and Path("/usr/sbin/pgbouncer").exists():
        found = "/usr/sbin/pgbouncer"  # Debian's, outside a non-root user's PATH
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _url(user: str, password: str, host: str, port: int | str, dbname: str) -> str:
    auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
    return f"postgres://{auth}@{quote(str(host), safe='')}:{port}/{quote(dbname, safe='')}"


class PgBouncer:
    """One pgbouncer process in transaction mode in front of ``server`` (a DATABASES entry:
    HOST, PORT, USER, PASSWORD), serving ``dbname`` (and any other database of that server).
    ``start()`` / ``stop()``, or use it as a context manager."""

    def __init__(self, server: dict[str, Any], dbname: str, workdir: Path | None = None) -> None:
        self.host = server.get("HOST") or "127.0.0.1"
        self.server_port = int(server.get("PORT") or 5432)
        self.user = server.get("USER") or "postgres"
        self.password = server.get("PASSWORD") or ""
        self.dbname = dbname
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="xjobs-pgbouncer-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------------------- API --
    @property
    def url(self) -> str:
        return _url(self.user, self.password, "127.0.0.1", self.port, self.dbname)

    @property
    def direct_url(self) -> str:
        return _url(self.user, self.password, self.host, self.server_port, self.dbname)

    def worker_env(self, *, listen_direct: bool = False) -> dict[str, str]:
        """The environment of a worker subprocess (spawn_worker's ``env``): its DATABASE_URL is
        the pooler; with ``listen_direct`` tests/settings.py also defines the alias "direct",
        the server itself, for ``XJOBS["LISTEN_DATABASE"] = "direct"``."""
        env = {"DATABASE_URL": self.url}
        if listen_direct:
            env["XJOBS_TEST_LISTEN_URL"] = self.direct_url
        return env

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW <what>`` on the admin console (``servers``, ``clients``, ``pools``, ...)."""
        admin = _url(self.user, self.password, "127.0.0.1", self.port, "pgbouncer")
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(f"SHOW {what}")
            names = [d.name for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def server_pids(self) -> set[int]:
        """The backend pids of the server connections the pooler holds now."""
        return {int(s["remote_pid"]) for s in self.show("servers") if s.get("remote_pid")}

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --------------------------------------------------------------------------- process --
    def _write_config(self) -> Path:
        ini = self.dir / "pgbouncer.ini"
        users = self.dir / "users.txt"
        users.write_text(f'"{self.user}" "{self.password}"\n')
        ini.write_text(f"""\
[databases]
* = host={self.host} port={self.server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = {users}
admin_users = {self.user}
max_client_conn = {MAX_CLIENT_CONN}
default_pool_size = {DEFAULT_POOL_SIZE}
ignore_startup_parameters = extra_float_digits
logfile = {self.dir / "pgbouncer.log"}
pidfile = {self.dir / "pgbouncer.pid"}
""")
        return ini

    def start(self, timeout: float = 15.0) -> PgBouncer:
        binary = executable()
        if binary is None:
            raise RuntimeError("no pgbouncer on this machine (make pooler installs Debian's, "
                               "as root)")
        command = [binary]
        if os.geteuid() == 0:  # pgbouncer refuses root: it drops to RUN_AS itself
            try:
                account = pwd.getpwnam(RUN_AS)
            except KeyError:
                raise RuntimeError(f"running as root and there is no {RUN_AS!r} OS user for "
                                   "pgbouncer to run as") from None
            os.chown(self.dir, account.pw_uid, account.pw_gid)
            command += ["-u", RUN_AS]
        self.port = _free_port()
        ini = self._write_config()
        if os.geteuid() == 0:
            for path in self.dir.iterdir():
                os.chown(path, account.pw_uid, account.pw_gid)
        self.proc = subprocess.Popen([*command, str(ini)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}:\n{self.log()}")
            try:
                self.show("version")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not answer:\n{self.log()}") from None
                time.sleep(0.05)  # the poll interval, until pgbouncer answers

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: immediate shutdown, server connections closed
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the test database (see the module's
    docstring for its API), one per test run; stopped at the end of the session. Its directory
    is a fresh one under the system's temporary directory, which the unprivileged user it runs
    as can reach (pytest's own are private to root), removed at the end."""
    from django.db import connections

    if executable() is None:
        unavailable("no pgbouncer on this machine (make pooler installs Debian's, as root)")
    settings = connections["default"].settings_dict  # the test database, set up by now
    bouncer = PgBouncer(settings, settings["NAME"])
    try:
        bouncer.start()
    except RuntimeError as exc:
        shutil.rmtree(bouncer.dir, ignore_errors=True)
        unavailable(str(exc))
    try:
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(bouncer.dir, ignore_errors=True)
