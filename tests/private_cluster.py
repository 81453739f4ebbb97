"""A PostgreSQL cluster of the test's own, for faults that hit the whole server (a restart).

The shared server the rest of the suite uses must never be restarted, so a test that crashes
PostgreSQL runs ``initdb`` under a temporary directory, starts that cluster with ``pg_ctl`` on
127.0.0.1 at a free port (trust authentication, ``fsync`` on as in production), creates a
database, migrates it with ``manage.py migrate`` on the tests' settings, and removes it all at
the end. Worker subprocesses reach it with ``env=cluster.worker_env()`` (``DATABASE_URL`` and
``XJOBS_TEST_DB_NAME``, read by tests/settings.py); the test process itself talks to it with
psycopg (:meth:`PrivateCluster.sql`) and runs Django code on it in a child (:meth:`run`).

``initdb`` refuses to run as root, so as root the binaries run as the ``postgres`` OS user
(``runuser``), owning the temporary directory. The binaries are found on ``PATH``, then in
``pg_config --bindir``, then in ``/usr/lib/postgresql/*/bin`` (Debian); :func:`find_bindir`
says why not when they are absent, and the tests skip with that reason.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import ROOT

DBNAME = "xjobs_private"


def find_bindir() -> tuple[Path | None, str]:
    """The directory holding ``initdb`` and ``pg_ctl``, or None and why."""
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.strip()
            candidates.append(Path(out))
        except (OSError, subprocess.SubprocessError):
            pass
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=lambda p: int(p.split("/")[-2])
                                           if p.split("/")[-2].isdigit() else 0, reverse=True)]
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir, ""
    return None, ("no initdb/pg_ctl on PATH, in pg_config --bindir or under "
                  "/usr/lib/postgresql/*/bin: the private-cluster tests need PostgreSQL's "
                  "server binaries")


def _as_postgres() -> tuple[list[str], str]:
    """The prefix that runs a command as the cluster's owner, or ('', why not)."""
    if os.geteuid() != 0:
        return [], ""
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return [], "running as root and there is no 'postgres' OS user to run initdb as"
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--"], ""
    return [], "running as root and there is no runuser to run initdb as 'postgres'"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """One temporary cluster: :meth:`start` it, :meth:`restart` it, :meth:`destroy` it."""

    def __init__(self, bindir: Path, prefix: list[str]) -> None:
        self.bindir = bindir
        self.prefix = prefix
        self.root = Path(tempfile.mkdtemp(prefix="xjobs-pg-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/{DBNAME}"
        if prefix:  # the cluster's files are its owner's
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o700)

    def _pg(self, tool: str, *args: str, timeout: float = 60) -> str:
        done = subprocess.run([*self.prefix, str(self.bindir / tool), *args],
                              capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}\n{done.stderr}\n{self.server_log()}")
        return done.stdout

    def server_log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self) -> None:
        # --no-sync only spares initdb's own flushes; the running server keeps fsync on.
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                 "--no-sync", "-E", "UTF8", "--locale=C")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.root}'\nfsync = on\n"
                       "shared_buffers = 32MB\nmax_connections = 60\n")
        self._pg("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.logfile))
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            conn.execute(f"create database {DBNAME}")
        self.run_command("migrate", "--noinput", "-v", "0")

    def restart(self, mode: str) -> None:
        """``pg_ctl restart -m <mode>``: ``immediate`` is a crash (recovery at start-up)."""
        self._pg("pg_ctl", "restart", "-w", "-m", mode, "-D", str(self.data),
                 "-l", str(self.logfile))

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: the server is gone (connections to its port are refused)
        until :meth:`resume`."""
        self._pg("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))

    def resume(self) -> None:
        """Start the stopped server again, on the same port and data."""
        self._pg("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.logfile))

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._pg("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.data))
            except (RuntimeError, subprocess.SubprocessError):
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    # ---------------------------------------------------------------------- clients --
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def worker_env(self) -> dict[str, str]:
        """What a child on the tests' settings needs to use this cluster's database."""
        return {"DATABASE_URL": self.url, "XJOBS_TEST_DB_NAME": DBNAME,
                "XJOBS_DATABASE_SOURCE": "private cluster"}

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One statement on a connection of its own (autocommit); its rows."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.worker_env(), DJANGO_SETTINGS_MODULE="tests.settings",
                   PYTHONPATH=str(ROOT))
        env.pop("XJOBS_FAULTS", None)
        return env

    def run_command(self, *args: str) -> str:
        """``manage.py <args>`` on this cluster's database."""
        done = subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT,
                              env=self._child_env(), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def run(self, code: str) -> str:
        """Python ``code`` in a child with Django set up on this cluster's database; its
        stdout (the enqueues of a test go through the public API this way)."""
        script = "import django\ndjango.setup()\n" + code
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=self._child_env(),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"child failed:\n{done.stdout}{done.stderr}")
        return done.stdout
