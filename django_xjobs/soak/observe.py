"""What the soak watches while it runs (docs/soak.md, "The invariants"): samples of the live
tables every fifth of a second, for the invariants that only hold at a moment.

* one live job per (tenant, idempotency key) of the soak's queue;
* no concurrency key with more unexpired slots, or more running jobs whose lease is unexpired,
  than its limit;
* every grant of the soak's rate-limit key (``x_rate_units`` keeps a grant for one period, so a
  sample every fifth of a second sees each one; the windows are checked after the run);
* no worker session of the soak in a transaction for longer than a lease (unless its process
  was stopped by the chaos lately), and no advisory lock held by a session outside a
  transaction.

A session is followed across samples by its backend (pid and backend start), not by its
``application_name``: behind a transaction pooler a name set with SET stays on the server
connection and names whoever uses it next. The name still says which worker and role the
session serves; a finding is about one backend, with what it waits on and who blocks it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import Any

from django.db import connections
from django.db.models import Count
from django.db.models.functions import Now

from ..models import Job, JobLease, RateUnit
from ..records import LIVE_STATES
from . import jobs, tables

INTERVAL = 0.2
STATEMENT_CHARS = 80  # of a statement, in a finding


def statement(text: str) -> str:
    """A statement as a finding quotes it: on one line, cut at STATEMENT_CHARS."""
    flat = " ".join(text.split())
    return flat if len(flat) <= STATEMENT_CHARS else flat[:STATEMENT_CHARS - 3] + "..."


@dataclass(frozen=True)
class Backend:
    """One server session: its pid together with when it started, so that a pid the server
    hands out again later is another session."""

    pid: int
    started: datetime


@dataclass(frozen=True)
class Blocker:
    """A session holding a lock that a flagged session waits for (``pg_blocking_pids``)."""

    pid: int  # 0: a prepared transaction
    name: str | None  # its application_name; None: gone before the sample read it
    state: str
    transaction: float | None  # seconds its transaction has been open; None: in none
    query: str  # its current statement, or its last one when idle

    def text(self) -> str:
        if self.pid == 0:
            return "a prepared transaction"
        if self.name is None:
            return f"pid {self.pid} (gone)"
        held = ("no transaction" if self.transaction is None
                else f"transaction open {self.transaction:.1f}s")
        return (f"pid {self.pid} (application_name {self.name!r}, {self.state or 'no state'}, "
                f"{held}: {statement(self.query)!r})")


@dataclass(frozen=True)
class SessionSample:
    """One sample of a soak session in a transaction past a lease, as pg_stat_activity showed
    it."""

    backend: Backend
    name: str  # application_name: which worker and role it serves, if a pooler did not lend it
    state: str
    xact_start: datetime
    transaction: float  # seconds its transaction has been open
    wait_type: str  # wait_event_type and wait_event, '' when not waiting
    wait: str
    query: str  # its current statement, or its last one when idle
    since_query: float  # seconds since that statement began
    since_state: float  # seconds in its state
    wrote: bool  # its transaction has an xid
    blockers: tuple[Blocker, ...] = ()
    namesakes: tuple[int, ...] = ()  # pids of other sessions with its name in the same sample

    @property
    def worker_id(self) -> str:
        return self.name.split(":")[1] if self.name.count(":") >= 2 else self.name

    def doing(self) -> str:
        """Idle in its transaction (its client has not sent the next statement), or running a
        statement: waiting on a lock, on something else, or not waiting."""
        if self.state != "active":
            return self.state
        if self.wait_type == "Lock":
            return f"waiting on a lock ({self.wait_type}/{self.wait})"
        if self.wait_type:
            return f"active, waiting on {self.wait_type}/{self.wait}"
        return "active"


@dataclass
class SessionFinding:
    """One backend of the soak seen in a transaction past a lease, over every sample that saw
    it: told as the sample in which its transaction was oldest."""

    worst: SessionSample
    samples: int = 1
    transactions: set[datetime] = field(default_factory=set)
    names: list[str] = field(default_factory=list)  # every application_name it had, in order

    def __post_init__(self) -> None:
        self.transactions.add(self.worst.xact_start)
        if self.worst.name not in self.names:
            self.names.append(self.worst.name)

    def add(self, sample: SessionSample) -> None:
        self.samples += 1
        self.transactions.add(sample.xact_start)
        if sample.name not in self.names:
            self.names.append(sample.name)
        if sample.transaction >= self.worst.transaction:
            self.worst = sample

    @property
    def listen(self) -> bool:
        """A LISTEN session's (``:listen``, ``:relay-listen``) under every name it had."""
        return all(name.endswith("listen") for name in self.names)

    def text(self) -> str:
        s = self.worst
        which = "statement" if s.state == "active" else "last statement"
        parts = [f"{s.name} (pid {s.backend.pid}) {s.doing()}, transaction open "
                 f"{s.transaction:.1f}s ({which} {statement(s.query)!r}, begun "
                 f"{s.since_query:.1f}s ago; state since {s.since_state:.1f}s; "
                 f"{'wrote' if s.wrote else 'no writes'})"]
        if s.blockers:
            parts.append("blocked by " + ", ".join(b.text() for b in s.blockers))
        if self.samples > 1:
            over = (f" over {len(self.transactions)} transactions"
                    if len(self.transactions) > 1 else "")
            parts.append(f"seen in {self.samples} samples{over}")
        others = [name for name in self.names if name != s.name]
        if others:
            parts.append("the same backend also named " + ", ".join(map(repr, others)))
        if s.namesakes:
            parts.append("its name also on pid " + ", ".join(map(str, s.namesakes)))
        return "; ".join(parts)


@dataclass
class Observations:
    samples: int = 0
    live_key_duplicates: dict[str, set[str]] = field(default_factory=dict)  # key -> job ids
    slot_excess: list[str] = field(default_factory=list)
    grants: dict[int, tuple[datetime, int]] = field(default_factory=dict)  # id -> (at, cost)
    sessions: dict[Backend, SessionFinding] = field(default_factory=dict)
    advisory_outside: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def record(self, sample: SessionSample) -> None:
        """A sample of a session in a transaction past a lease, added to its backend's
        finding."""
        finding = self.sessions.get(sample.backend)
        if finding is None:
            self.sessions[sample.backend] = SessionFinding(sample)
        else:
            finding.add(sample)

    def long_transactions(self) -> list[str]:
        """The findings of worker sessions: failures."""
        return [f.text() for f in self.sessions.values() if not f.listen]

    def listen_transactions(self) -> list[str]:
        """The same of LISTEN sessions: reported, not failures (docs/soak.md, "The
        invariants")."""
        return [f.text() for f in self.sessions.values() if f.listen]


# A session of the soak in a transaction open longer than a lease, idle in it or not: a worker's
# transactions are single statements or a claim's or settle's few. With what tells a stalled
# client from a transaction left open and from a statement waiting on a lock: since when its
# last statement began and its state holds, whether it wrote (has an xid), its wait event, the
# other sessions bearing its name, and one row per session blocking it (pg_blocking_pids, which
# takes the lock manager's locks for a moment, so it runs only for the sessions found).
SESSIONS = """
select a.pid, a.backend_start, a.application_name, coalesce(a.state, ''), a.xact_start,
       extract(epoch from now() - a.xact_start),
       coalesce(a.wait_event_type, ''), coalesce(a.wait_event, ''),
       coalesce(left(a.query, 400), ''),
       coalesce(extract(epoch from now() - a.query_start), 0),
       coalesce(extract(epoch from now() - a.state_change), 0),
       a.backend_xid is not null,
       array(select n.pid from pg_stat_activity n
              where n.application_name = a.application_name and n.pid <> a.pid
                and n.pid <> pg_backend_pid()
              order by n.pid),
       b.pid, o.application_name, coalesce(o.state, ''),
       extract(epoch from now() - o.xact_start), coalesce(left(o.query, 400), '')
  from pg_stat_activity a
  left join lateral unnest(pg_blocking_pids(a.pid)) as b(pid) on true
  left join pg_stat_activity o on o.pid = b.pid
 where a.application_name like %s and now() - a.xact_start > make_interval(secs => %s)
 order by a.pid, b.pid
"""


class Observer(threading.Thread):
    def __init__(self, soak: str, queue: str, lease: float, stop: threading.Event,
                 excused: Callable[[str], bool] = lambda worker_id: False) -> None:
        super().__init__(name="xjobs-soak-observer", daemon=True)
        self.excused = excused  # a worker whose sessions may hold a transaction: it was stopped
        self.soak = soak
        self.queue = queue
        self.lease = lease
        self.stop = stop
        self.seen = Observations()
        # (name, pid) of the sessions idle with an advisory lock at the last sample.
        self._idle_with_advisory: set[tuple[str, int]] = set()

    def run(self) -> None:
        tables.name_session(self.soak, "observer")
        try:
            while not self.stop.wait(INTERVAL):
                try:
                    self.sample()
                except Exception as exc:  # a fault injected elsewhere must not end the watch
                    self.seen.errors[type(exc).__name__] += 1
                    connections[tables.alias()].close()
        finally:
            connections.close_all()

    def sample(self) -> None:
        seen = self.seen
        alias = tables.alias()
        live = Job.objects.using(alias).filter(queue=self.queue, state__in=LIVE_STATES)
        for row in (live.values("tenant_id", "idempotency_key")
                    .annotate(n=Count("id")).filter(n__gt=1)):
            key = f"{row['tenant_id']}/{row['idempotency_key']}"
            ids = live.filter(tenant_id=row["tenant_id"], idempotency_key=row["idempotency_key"])
            seen.live_key_duplicates.setdefault(key, set()).update(
                str(i) for i in ids.values_list("id", flat=True))
        prefix = f"xjobs_soak:{self.soak}:slot:"
        for row in (JobLease.objects.using(alias)
                    .filter(lease_key__startswith=prefix, expires_at__gt=Now())
                    .values("lease_key").annotate(n=Count("id"))
                    .filter(n__gt=jobs.SLOT_LIMIT)):
            seen.slot_excess.append(f"{row['lease_key']}: {row['n']} unexpired slots")
        for row in (live.filter(state="running", concurrency_key__startswith=prefix,
                                visible_at__gt=Now())
                    .values("concurrency_key").annotate(n=Count("id"))
                    .filter(n__gt=jobs.SLOT_LIMIT)):
            seen.slot_excess.append(f"{row['concurrency_key']}: {row['n']} running jobs "
                                    f"with unexpired leases")
        for unit_id, at, cost in (RateUnit.objects.using(alias)
                                  .filter(key=f"xjobs_soak:{self.soak}:rate")
                                  .values_list("id", "at", "cost")):
            seen.grants[unit_id] = (at, cost)
        self._sessions(alias)
        seen.samples += 1

    def _sessions(self, alias: str) -> None:
        label = f"xjobs:{self.soak}-%"
        with connections[alias].cursor() as cur:
            cur.execute(SESSIONS, [label, self.lease])
            for _, rows in groupby(cur.fetchall(), key=lambda row: row[0]):
                sample = session_sample(list(rows))
                if not self.excused(sample.worker_id):
                    self.seen.record(sample)
            cur.execute(
                "select a.application_name, a.pid from pg_locks l"
                " join pg_stat_activity a on a.pid = l.pid"
                " where l.locktype = 'advisory' and l.granted and a.state = 'idle'"
                " and a.application_name like %s", [label])
            # pg_locks and pg_stat_activity are read at two moments: a claim that took a slot's
            # transaction-level lock and committed between them reads as idle with the lock.
            # A lock held outside a transaction is still there at the next sample.
            idle = {(name, pid) for name, pid in cur.fetchall()}
            for name, pid in sorted(idle & self._idle_with_advisory):
                self.seen.advisory_outside.append(f"{name} (pid {pid})")
            self._idle_with_advisory = idle


def session_sample(rows: Sequence[Sequence[Any]]) -> SessionSample:
    """The rows of SESSIONS for one session (one a blocker, or one with no blocker) as a
    sample."""
    (pid, started, name, state, xact_start, age, wait_type, wait, query, since_query,
     since_state, wrote, namesakes) = rows[0][:13]
    blockers = tuple(
        Blocker(pid=b_pid, name=b_name, state=b_state,
                transaction=None if b_age is None else float(b_age), query=b_query)
        for b_pid, b_name, b_state, b_age, b_query in (row[13:] for row in rows)
        if b_pid is not None)
    return SessionSample(
        backend=Backend(pid, started), name=name, state=state, xact_start=xact_start,
        transaction=float(age), wait_type=wait_type, wait=wait, query=query,
        since_query=float(since_query), since_state=float(since_state), wrote=wrote,
        blockers=blockers, namesakes=tuple(namesakes))


def grants_over_limit(grants: dict[int, tuple[datetime, int]], limit: int,
                      period_seconds: float) -> list[str]:
    """Windows of ``period_seconds`` in which the grants seen cost more than ``limit``: the
    worst window starting at each grant."""
    ordered = sorted(grants.values())
    over = []
    for i, (start, _) in enumerate(ordered):
        spent = sum(cost for at, cost in ordered[i:]
                    if (at - start).total_seconds() < period_seconds)
        if spent > limit:
            over.append(f"{spent} units from {start.isoformat()} within {period_seconds:g}s")
    return over


