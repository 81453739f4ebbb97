"""PostgreSQL clusters of the test's own, for faults that hit a whole server (a restart, a lagging
replica) and for topologies of several servers (shards).

The shared server the rest of the suite uses must never be restarted, so a test that crashes
PostgreSQL runs ``initdb`` under a temporary directory, starts that cluster with ``pg_ctl`` on
127.0.0.1 at a free port (trust authentication, ``fsync`` on as in production), creates a
database, migrates it with ``manage.py migrate`` on the tests' settings, and removes it all at
the end. Worker subprocesses reach it with ``env=cluster.worker_env()`` (``DATABASE_URL`` and
``XJOBS_TEST_DB_NAME``, read by tests/settings.py); the test process itself talks to it with
psycopg (:meth:`PrivateCluster.sql`) and runs Django code on it in a child (:meth:`run`).

Beyond one cluster:

* :meth:`PrivateCluster.replica` makes a hot standby of a running cluster (``pg_basebackup -R``
  streaming from a physical replication slot, so the primary keeps the WAL a stopped replica
  still needs). A test makes it lag by pausing its replay (:meth:`Replica.pause_replay`: it
  still receives WAL, it does not apply it) and waits on LSNs, never on the clock:
  :meth:`Replica.wait_received` and :meth:`Replica.wait_caught_up` poll the replica until its
  received or replayed position reaches the primary's current one.
* :func:`start_primaries` makes N migrated primaries for about the price of one: ``initdb`` and
  ``migrate`` (a child process setting Django up) are most of a cluster's start-up, so the first
  cluster is made and stopped cleanly, and the others start on copies of its data directory
  (``cp -a``: the files stay the ``postgres`` OS user's), each on a port and socket directory of
  its own. The copies are separate servers with separate storage, but they share the first
  one's *system identifier* (``pg_control_system()``) and database OIDs: a test that tells
  clusters apart by those needs clusters each started with :meth:`PrivateCluster.start`.
* :func:`env_for` builds the environment of a child that sees several clusters at once: one as
  ``default``, the others as further aliases (``XJOBS_TEST_EXTRA_DATABASES``, read by
  tests/settings.py); :func:`run_child` runs Python code under it.

``initdb`` refuses to run as root, so as root the binaries run as the ``postgres`` OS user
(``runuser``), owning the temporary directories. The binaries are found on ``PATH``, then in
``pg_config --bindir``, then in ``/usr/lib/postgresql/*/bin`` (Debian); :func:`find_bindir`
says why not when they are absent, and the tests skip with that reason. Every cluster is kept
small (32MB of shared buffers, 60 connections): the machine has two cores and a test may run
four servers beside the shared one. A cluster lives under the system's temporary directory,
or under ``where`` (:func:`scratch_dir`: in memory, where a cluster's start costs about half).
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import ROOT

DBNAME = "xjobs_private"
# A deadline for waits on a replica: it bounds a failing test, it is not a measurement.
CATCH_UP = 30.0


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


def scratch_dir(room: int = 1 << 30) -> Path | None:
    """``/dev/shm`` where it is a tmpfs with ``room`` bytes free, else None (the system's
    temporary directory, on disk).

    Under the suite's load a cluster's files on disk cost seconds: ``initdb`` and copying a data
    directory are thousands of small files, and the other pytest-xdist process writes to the
    same disk. In memory they cost a fraction of that; ``fsync`` stays on but costs nothing, so
    a test whose point is the price of a durable commit keeps its cluster on disk. A container's
    /dev/shm is often 64MB: too small, hence the check.
    """
    shm = Path("/dev/shm")
    try:
        with open("/proc/mounts") as mounts:
            tmpfs = any(line.split()[1:3] == [str(shm), "tmpfs"] for line in mounts)
        free = shutil.disk_usage(shm).free
    except OSError:
        return None
    return shm if tmpfs and free >= room and os.access(shm, os.W_OK | os.X_OK) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------- children --
def _child(argv: list[str], env: Mapping[str, str], timeout: float) -> str:
    """Run ``argv`` from the checkout's root on the tests' settings, ``env`` over this process's
    environment (without its faults); its stdout, or RuntimeError with its output."""
    full = dict(os.environ)
    full.pop("XJOBS_FAULTS", None)
    full.update(DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    full.update(env)
    done = subprocess.run(argv, cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"child {argv[1:3]} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return done.stdout


def run_child(code: str, env: Mapping[str, str], timeout: float = 120) -> str:
    """Python ``code`` in a child with Django set up under ``env`` (see :func:`env_for`); its
    stdout."""
    return _child([sys.executable, "-c", "import django\ndjango.setup()\n" + code], env, timeout)


def manage(*args: str, env: Mapping[str, str], timeout: float = 120) -> str:
    """``manage.py <args>`` in a child under ``env``; its stdout."""
    return _child([sys.executable, "-m", "django", *args], env, timeout)


def env_for(default: PrivateCluster, extra: Mapping[str, PrivateCluster | str] | None = None,
            xjobs: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The environment of a child on the tests' settings whose ``default`` database is
    ``default``'s and whose further aliases are the clusters (or postgres:// URLs) of ``extra``.

    For :func:`run_child`, :func:`manage` and ``spawn_worker(..., env=...)``, which lay it over
    the test process's environment. ``xjobs`` becomes ``XJOBS_TEST_SETTINGS`` (merged into
    ``settings.XJOBS``); left out when None, because with ``spawn_worker`` it would replace the
    ``settings=`` the worker is given: there pass the XJOBS settings to ``spawn_worker``.
    """
    urls = {alias: where if isinstance(where, str) else where.url
            for alias, where in (extra or {}).items()}
    if "default" in urls:
        raise ValueError("'default' is the default= cluster, not an extra alias")
    env = {**default.worker_env(), "XJOBS_TEST_EXTRA_DATABASES": json.dumps(urls),
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    if xjobs is not None:
        env["XJOBS_TEST_SETTINGS"] = json.dumps(dict(xjobs))
    return env


# ------------------------------------------------------------------------- clusters --
class PrivateCluster:
    """One temporary cluster: :meth:`start` it, :meth:`restart` it, :meth:`destroy` it."""

    def __init__(self, bindir: Path, prefix: list[str], where: Path | None = None) -> None:
        """``where``: the directory to make the cluster's own in (the system's temporary
        directory when None; :func:`scratch_dir` for a faster one)."""
        self.bindir = bindir
        self.prefix = prefix
        self.root = Path(tempfile.mkdtemp(prefix="xjobs-pg-", dir=where))
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

    @property
    def name(self) -> str:
        """``cluster_name``: in its processes' titles (``ps``), and a standby's
        ``application_name`` in its primary's ``pg_stat_replication``."""
        return f"xjobs_{self.port}"

    def _own_address(self) -> None:
        """This cluster's port, socket directory and name, over whatever postgresql.conf said
        before (a copy's or a base backup's says its source's: the last setting wins)."""
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {self.port}\nunix_socket_directories = '{self.root}'\n"
                       f"cluster_name = '{self.name}'\n")

    def start(self) -> None:
        # --no-sync only spares initdb's own flushes; the running server keeps fsync on.
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                 "--no-sync", "-E", "UTF8", "--locale=C")
        # wal_level replica (15's default) and initdb's "host replication all 127.0.0.1/32
        # trust" are what replica() needs; nothing here takes them away.
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\nlisten_addresses = '127.0.0.1'\nfsync = on\n"
                       "shared_buffers = 32MB\nmax_connections = 60\n")
        self._own_address()
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

    def replica(self) -> Replica:
        """A hot standby of this running cluster, started (:class:`Replica`)."""
        made = Replica(self)
        try:
            made.start()
        except BaseException:
            made.destroy()
            raise
        return made

    def _copy_of(self, source: PrivateCluster) -> None:
        """This cluster's data: a copy of ``source``'s, which must be stopped (a clean shutdown
        leaves nothing to recover). Not started."""
        subprocess.run(["cp", "-a", str(source.data), str(self.data)], check=True, timeout=120)
        # The copy's command line names the source's directory; the server writes its own.
        (self.data / "postmaster.opts").unlink(missing_ok=True)
        self._own_address()

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

    def wal_lsn(self) -> str:
        """Where this server's WAL ends now (``pg_current_wal_lsn()``; a primary's)."""
        [(lsn,)] = self.sql("select pg_current_wal_lsn()::text")
        return str(lsn)

    def run_command(self, *args: str) -> str:
        """``manage.py <args>`` on this cluster's database."""
        return manage(*args, env=self.worker_env())

    def run(self, code: str) -> str:
        """Python ``code`` in a child with Django set up on this cluster's database; its
        stdout (the enqueues of a test go through the public API this way)."""
        return run_child(code, self.worker_env())


class Replica(PrivateCluster):
    """A streaming hot standby of ``primary``, in a directory and on a port of its own.

    :meth:`start` takes the base backup (``pg_basebackup -R -X stream -c fast``, creating the
    physical slot it then streams from) and starts it; :meth:`stop`, :meth:`resume` and
    :meth:`restart` are the cluster's. It serves reads of the same database name, ``url``.
    """

    def __init__(self, primary: PrivateCluster) -> None:
        super().__init__(primary.bindir, primary.prefix, where=primary.root.parent)
        self.primary = primary
        self.slot = self.name  # its physical replication slot on the primary

    @property
    def name(self) -> str:
        return f"xjobs_replica_{self.port}"

    def start(self) -> None:
        if not (self.bindir / "pg_basebackup").is_file():
            raise RuntimeError(f"no pg_basebackup in {self.bindir}")
        # -N: the backup's own flushes only, as initdb's --no-sync; the standby keeps fsync on.
        self._pg("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port),
                 "-U", "postgres", "-D", str(self.data), "-R", "-X", "stream",
                 "-c", "fast", "-C", "-S", self.slot, "-N", timeout=120)
        self._own_address()
        self._pg("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.logfile))

    def destroy(self) -> None:
        super().destroy()
        # The primary would keep WAL for the slot as long as it lives: drop the slot once the
        # walsender of the stopped standby has let go of it. A primary already stopped or gone
        # keeps nothing for it.
        def dropped() -> bool:
            rows = self.primary.sql("select active from pg_replication_slots"
                                    " where slot_name = %s", [self.slot])
            if rows and not rows[0][0]:
                self.primary.sql("select pg_drop_replication_slot(%s)", [self.slot])
            return not rows or not rows[0][0]

        deadline = time.monotonic() + 10
        try:
            while not dropped() and time.monotonic() < deadline:
                time.sleep(0.02)  # the poll interval
        except psycopg.Error:
            pass

    # ------------------------------------------------------------------------ replay --
    def _paused_query(self) -> str:
        [(version,)] = self.sql("select current_setting('server_version_num')::int")
        return ("select pg_get_wal_replay_pause_state() = 'paused'" if version >= 140000
                else "select pg_is_wal_replay_paused()")

    def pause_replay(self, timeout: float = CATCH_UP) -> None:
        """Stop applying WAL (``pg_wal_replay_pause()``) and wait until the standby says it is
        paused; it keeps receiving WAL. A restart of the standby resumes replay."""
        self.sql("select pg_wal_replay_pause()")
        query = self._paused_query()
        self._wait(lambda: self.sql(query)[0][0], timeout, "replay to pause")

    def resume_replay(self) -> None:
        """Apply WAL again (``pg_wal_replay_resume()``)."""
        self.sql("select pg_wal_replay_resume()")

    def replay_lsn(self) -> str | None:
        """Where replay has got to (``pg_last_wal_replay_lsn()``)."""
        [(lsn,)] = self.sql("select pg_last_wal_replay_lsn()::text")
        return lsn

    def wait_received(self, timeout: float = CATCH_UP) -> str:
        """Wait until the standby has received (and flushed) all the WAL the primary has
        written so far, replayed or not; that position."""
        target = self.primary.wal_lsn()
        self._wait(lambda: self.sql("select pg_last_wal_receive_lsn() >= %s::pg_lsn",
                                    [target])[0][0], timeout, f"WAL received up to {target}")
        return target

    def wait_caught_up(self, timeout: float = CATCH_UP) -> str:
        """Wait until the standby has replayed all the WAL the primary has written so far (what
        the primary committed before the call is visible on it); that position. Fails at once
        while replay is paused."""
        target = self.primary.wal_lsn()
        paused = self._paused_query()

        def replayed() -> bool:
            [(done,)] = self.sql("select pg_last_wal_replay_lsn() >= %s::pg_lsn", [target])
            if not done and self.sql(paused)[0][0]:
                raise RuntimeError(f"replay is paused short of {target}: resume_replay() first")
            return bool(done)

        self._wait(replayed, timeout, f"WAL replayed up to {target}")
        return target

    def _wait(self, reached: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not reached():
            if time.monotonic() >= deadline:
                state = self.sql("select pg_last_wal_receive_lsn()::text,"
                                 " pg_last_wal_replay_lsn()::text")
                raise RuntimeError(f"timed out after {timeout}s waiting for {what} on the"
                                   f" replica (received, replayed: {state}):\n"
                                   f"{self.server_log()}")
            time.sleep(0.02)  # the poll interval


def start_primaries(bindir: Path, prefix: list[str], n: int,
                    where: Path | None = None) -> list[PrivateCluster]:
    """``n`` migrated primaries, running, for about the price of one: the first is made with
    :meth:`PrivateCluster.start` and stopped, the others start on copies of its data (same
    system identifier, see the module's docstring). On failure none is left behind."""
    made = [PrivateCluster(bindir, prefix, where)]
    try:
        made[0].start()
        if n > 1:
            made[0].stop()
            for _ in range(n - 1):
                made.append(PrivateCluster(bindir, prefix, where))
                made[-1]._copy_of(made[0])
            for cluster in made:
                cluster.resume()
    except BaseException:
        for cluster in made:
            cluster.destroy()
        raise
    return made
