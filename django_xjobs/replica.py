"""Reads on a streaming replica (docs/scaling.md, "Reads on a replica").

``XJOBS["READ_DATABASE"]`` names a hot standby of a jobs database. What only looks (the
console's pages, the metrics' scrapes, the reports of ``manage.py xjobs``) reads there, so an
operator's refreshing dashboard and Prometheus' scrapes add no scans to the server the workers
claim from. What changes something (every console action, every command that acts) stays on the
primary, and so does what judges the primary's own state (the health panel, ``xjobs health``,
``xjobs why``): which session holds VACUUM back, how many dead rows a table has, who holds an
advisory lock are in the primary's ``pg_stat_*`` views and lock table, which a standby does not
replicate.

:func:`reads` decides for a block of reads whether the replica may serve it. It may while it
answers, is a standby (not promoted), and is no further behind than ``XJOBS["READ_MAX_LAG"]``;
otherwise the block reads the primary and says why, in words a page or a command prints. A
replica that cannot be asked is a fallback, never an error of the page.

**The lag.** The probe asks the primary where its WAL ends (``pg_current_wal_lsn()``), then the
replica how far it has replayed (``pg_last_wal_replay_lsn()``) and the commit time of the last
transaction it replayed (``pg_last_xact_replay_timestamp()``). Once the replay position has
reached the primary's, the replica shows everything the primary had committed when asked: its
lag is 0. Only while it is behind is the time since that last replayed commit the lag: the
replica shows the primary as of that commit. The timestamp alone misleads on an idle primary:
nothing commits there, so the last replayed commit gets older by the second although the
replica has replayed everything, and an idle system's console would read its primary, saying
the replica is hours behind. (While behind, the measure can overstate the lag, when the WAL not
replayed yet holds no commit; an overstated lag sends reads to the primary, the safe side. The
two servers' clocks meet in that subtraction: a replica whose clock runs ahead of the
primary's reads as further behind by as much.)

**The cost.** One tiny statement on each server (:data:`PRIMARY_PROBE`, :data:`REPLICA_PROBE`),
on the thread's Django connections of the two aliases: the ones the page then reads on, so the
probe also proves the connection that will serve it. A verdict is kept by the process for
:data:`PROBE_TTL` (1 s) per replica: a page with many reads, a burst of live refreshes from
several tabs and a scrape pay for one probe a second at most. An unreachable replica is asked
again after :data:`UNREACHABLE_TTL` only, so one whose connections time out costs the console
one timeout every few seconds, not one per page (give the replica's alias a small
``connect_timeout`` in DATABASES: docs/scaling.md).

**Reading your own writes.** After an operator's change the next page must not show the state
before it. The console (console/databases.py) keeps in the session the primary's WAL position
after each POST (:func:`written_position`) and hands it to :func:`reads` as ``after_lsn``: the
replica serves again only once it has replayed that far. (The position is where the primary's
WAL has been written: under ``synchronous_commit = off`` a change's commit may still be waiting
for the WAL writer when asked, and a page may show the state before it for that long, a
``wal_writer_delay`` at most.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import Error as DatabaseError
from django.db import connections

from . import clock, conf

T = TypeVar("T")

# How long a verdict stands (seconds, per process and replica); an unreachable replica's longer.
PROBE_TTL = 1.0
UNREACHABLE_TTL = 5.0

PRIMARY_PROBE = "select pg_current_wal_lsn()::text"
# The seconds since the last replayed commit, on the replica's clock: clock_timestamp(), not
# now(), which inside a transaction is when the transaction began.
REPLICA_PROBE = ("select pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, extract(epoch"
                 " from clock_timestamp() - pg_last_xact_replay_timestamp())::float8")

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def parse_lsn(text: str | None) -> int | None:
    """A ``pg_lsn`` as PostgreSQL prints it (``16/B374D848``) as a number; None for None or
    anything else."""
    match = _LSN.match(text or "")
    if match is None:
        return None
    return int(match.group(1), 16) << 32 | int(match.group(2), 16)


def seconds_text(seconds: float) -> str:
    """A lag as a line says it: ``0 s``, ``0.4 s``, ``45 s``, ``12 min``, ``3.2 h``."""
    if seconds <= 0:
        return "0 s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True, slots=True)
class Probe:
    """What one probe of ``replica`` found; ``error`` in words when it could not say
    (``unreachable``: the replica's side failed)."""

    replica: str
    at: float  # clock.monotonic() when it was taken
    error: str | None = None
    unreachable: bool = False
    standby: bool = True
    primary_lsn: int = 0
    replay_lsn: int | None = None
    since_replay: float | None = None  # seconds since the last replayed commit

    @property
    def lag(self) -> float | None:
        """Seconds the replica is behind (module docstring); None when unknown."""
        if self.error is not None or not self.standby or self.replay_lsn is None:
            return None
        if self.replay_lsn >= self.primary_lsn:
            return 0.0
        if self.since_replay is None:
            return None
        return max(0.0, self.since_replay)  # a replica's clock behind the primary's

    def refusal(self, *, max_lag: float, after_lsn: int | None = None) -> str | None:
        """Why the replica may not serve a read now, in words; None when it may. ``after_lsn``:
        a position it must have replayed (the reader's own last change)."""
        if self.error is not None:
            return self.error
        name = self.replica
        if not self.standby:
            return (f"replica {name} is not a standby (pg_is_in_recovery() is false: was it "
                    "promoted?)")
        lag = self.lag
        if lag is None:
            return (f"replica {name} is behind the primary and has replayed no transaction "
                    "since it started: how far behind is unknown")
        if lag > max_lag:
            return (f"replica {name} is {seconds_text(lag)} behind, over "
                    f'XJOBS["READ_MAX_LAG"] {max_lag:g} s')
        if after_lsn is not None and (self.replay_lsn or 0) < after_lsn:
            return f"replica {name} has not replayed your last change yet"
        return None


@dataclass(frozen=True, slots=True)
class ReadSource:
    """Where a block's reads went: ``alias`` (the replica's when ``on_replica``), how far the
    replica was behind (``lag``, seconds, None when unknown or not measured) and, when they went
    to the primary although a replica is configured (``replica``), why (``reason``):
    ``fell_back`` when the replica was wanted and could not serve."""

    alias: str
    on_replica: bool = False
    lag: float | None = None
    reason: str | None = None
    fell_back: bool = False
    replica: str | None = None

    @property
    def line(self) -> str:
        """What a page says of it ("" when no replica is configured)."""
        if self.replica is None:
            return ""
        if self.on_replica:
            return f"Read from replica {self.alias}, {seconds_text(self.lag or 0.0)} behind"
        return "Read from the primary" + (f": {self.reason}" if self.reason else "")


_probes: dict[tuple[str, str], Probe] = {}


def forget() -> None:
    """Drop every kept verdict: the next :func:`reads` asks the servers again."""
    _probes.clear()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _one(alias: str, sql: str) -> tuple[Any, ...]:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    assert row is not None
    return tuple(row)


def _close(alias: str) -> None:
    """Drop the thread's connection of ``alias`` after a failure: the next probe connects
    afresh."""
    try:
        connections[alias].close()
    except DatabaseError:
        pass


def measure(primary: str, replica: str) -> Probe:
    """Probe ``replica`` against ``primary`` now (module docstring): the primary first, so a
    replica that has replayed up to that position has everything committed before the probe."""
    at = clock.monotonic()
    try:
        (position,) = _one(primary, PRIMARY_PROBE)
    except DatabaseError as exc:
        return Probe(replica, at, error=f"the primary's WAL position could not be read: "
                                        f"{first_line(exc)}")
    try:
        standby, replayed, since = _one(replica, REPLICA_PROBE)
    except DatabaseError as exc:
        _close(replica)
        return Probe(replica, at, error=f"replica {replica} is unreachable: {first_line(exc)}",
                     unreachable=True)
    return Probe(replica, at, standby=bool(standby), primary_lsn=parse_lsn(str(position)) or 0,
                 replay_lsn=parse_lsn(replayed),
                 since_replay=None if since is None else float(since))


def probe(primary: str, replica: str) -> Probe:
    """The kept verdict on ``replica`` if it is fresh enough, else a new :func:`measure`."""
    key = (primary, replica)
    kept = _probes.get(key)
    now = clock.monotonic()
    if kept is not None and now - kept.at < (UNREACHABLE_TTL if kept.unreachable else PROBE_TTL):
        return kept
    found = _probes[key] = measure(primary, replica)
    return found


@contextmanager
def reads(*, enabled: bool = True, after_lsn: str | None = None,
          primary_because: str | None = None) -> Iterator[ReadSource]:
    """The block's reads on the replica of the jobs alias in use when it may serve them (module
    docstring), else on the primary; yields where they go.

    ``enabled=False``: the primary, no probe (a change, or a page about the primary itself,
    ``primary_because`` saying which). ``after_lsn``: a WAL position of the primary (as
    :func:`written_position` gave it) the replica must have replayed to serve: the reader's own
    last change. Without a replica configured: the jobs alias, no probe, nothing to say.
    """
    settings = conf.get()
    primary, replica = settings.database, settings.read_database
    if replica is None:
        yield ReadSource(alias=primary)
        return
    if not enabled:
        yield ReadSource(alias=primary, reason=primary_because, replica=replica)
        return
    found = probe(primary, replica)
    reason = found.refusal(max_lag=settings.read_max_lag, after_lsn=parse_lsn(after_lsn))
    if reason is not None:
        yield ReadSource(alias=primary, lag=found.lag, reason=reason, fell_back=True,
                         replica=replica)
        return
    with conf.using_database(replica):
        yield ReadSource(alias=replica, on_replica=True, lag=found.lag, replica=replica)


def read(fn: Callable[[], T], *, errors: tuple[type[BaseException], ...] = (DatabaseError,)
         ) -> tuple[T, ReadSource]:
    """``fn()`` in :func:`reads`, and where it read. Should it fail on the replica with one of
    ``errors`` (the replica went away since the probe, or replay cancelled the query), it runs
    again on the primary, the source saying why: for a reader that can start over (a scrape),
    not one that has printed half its answer."""
    with reads() as source:
        if not source.on_replica:
            return fn(), source
        try:
            return fn(), source
        except errors as exc:
            failed = exc
    _close(source.alias)
    _probes.pop((conf.get().database, source.alias), None)  # ask again next time
    retry = ReadSource(alias=conf.get().database, lag=source.lag, fell_back=True,
                       replica=source.alias,
                       reason=f"replica {source.alias} failed during the read: "
                              f"{first_line(failed)}")
    return fn(), retry


def written_position(primary: str | None = None) -> str | None:
    """The primary's WAL position now (``pg_current_wal_lsn()``) when ``primary`` (default: the
    jobs alias in use) has a replica: recorded after a change, the position :func:`reads` then
    waits for (``after_lsn``). None without a replica, or when the primary cannot say."""
    settings = conf.get()
    primary = primary or settings.database
    if primary not in settings.read_databases:
        return None
    try:
        (position,) = _one(primary, PRIMARY_PROBE)
    except DatabaseError:
        return None
    return str(position)
