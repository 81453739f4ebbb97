"""Leader election: at most one scheduler per database acts, and it knows when to stop.

Every worker runs a scheduler (and ``manage.py xjobs_scheduler`` runs one alone); only the
leader fires cron occurrences and runs maintenance. Two ways to elect it (``XJOBS["LEADER"]``):

``"lease"`` (the default): a row in ``x_scheduler_leader`` (``lock_key``, ``holder``,
``expires_at``), taken and renewed by ONE statement (``leader_attempt_elect``) on any
connection, pooled or not. The database is authoritative: the row names the leader until its
``expires_at`` passes on the database clock.

``"advisory"``: a session advisory lock on a DEDICATED connection (never a pooled one). A
crashed node's lock frees itself the moment its session ends, but behind a transaction pooler
(PgBouncer) the session is not the client's: the lock is released when the pooler resets the
server connection, or inherited by whichever client gets that connection next
(tests/integration/test_leader_pooling.py). Use it only with direct connections.

States and transitions (one Leadership per process; ``tick()`` attempts every ``renew``)::

                  refused (another holder's lease is live), or an error
                 +-----+
                 |     v
    start ---> FOLLOWER <-------------------------------------------+
                 |                                                  |
                 | attempt won                                      | renewal refused, or
                 v                                                  | no renewal before the
               LEADER ---+ renewed: the deadline moves to           | deadline (self-fence),
                 |  ^    | sent + L - R                             | or a fenced statement
                 |  +----+                                          | of a round matched
                 |                                                  | nothing: lost()
                 +--------------------------------------------------+
                 |
                 | stop
                 v
              RESIGNED: resign() deletes the lease row (only if it is ours), or unlocks

Which timeout bounds which (``XJOBS["LEADER_LEASE"]`` = L, ``XJOBS["LEADER_RENEW"]`` = R,
L >= 3R, checked by conf.py):

* the lease runs L from the moment the DATABASE ran the statement; the leader measures its
  own deadline on its monotonic clock from the moment it SENT it, so its belief never outlives
  the database's: it acts only until ``sent + L - R``, that is while more than one renewal
  interval of lease is left (:meth:`Leadership.is_leader`);
* the same margin R is in the database-side fence every write of a round carries
  (``LeaderFence.margin_ms``): a leader whose renewals stall stops writing while it still
  holds the lease, before any other node can be elected;
* a follower tries every R, so a crashed leader is replaced within L + R; a leader that stops
  cleanly resigns, and the next one takes over at its next attempt (within R);
* advisory mode re-checks that its session holds the lock every R and trusts a check for
  L - R, like a lease.

Leadership alone does not make firing exactly-once: two processes can both believe they lead
for a moment (a leader frozen past its lease, then resumed). The round's transaction does: it
locks the due tasks' state rows and reads their watermarks under the lock, so overlapping
rounds serialise and the second computes nothing the first fired (scheduler/runner.py).
"""

from __future__ import annotations

import abc
import logging
import math

from .. import clock
from ..engines import AdvisorySession, Engine, SessionLost
from ..records import LeaderFence, LeaderRecord
from ..worker import reachability

log = logging.getLogger("django_xjobs.scheduler")

LOCK_KEY = "scheduler"  # one scheduler leader per database
FOLLOWER, LEADER = "follower", "leader"


class Leadership(abc.ABC):
    """One process's view of who leads; see the module docstring for the protocol."""

    mode = "lease"

    def __init__(self, *, engine: Engine, holder: str, lease: float, renew: float,
                 lock_key: str = LOCK_KEY) -> None:
        self.engine = engine
        self.holder = holder
        self.lock_key = lock_key
        self.lease = lease
        self.renew = renew
        self.state = FOLLOWER
        self._deadline = -math.inf  # monotonic: act as leader only before this
        self._next_attempt = -math.inf
        self.terms = 0  # how often this process became leader (a test signal)

    # ------------------------------------------------------------------------ queries --
    def is_leader(self) -> bool:
        """Whether this process may act as leader now (thread-safe: the maintenance thread
        asks it between batches)."""
        return self.state == LEADER and clock.monotonic() < self._deadline

    def next_tick_in(self) -> float:
        return max(0.0, self._next_attempt - clock.monotonic())

    @abc.abstractmethod
    def fence(self) -> LeaderFence:
        """What the round's statements check in the database to be sure we still lead."""

    # -------------------------------------------------------------------- transitions --
    def tick(self) -> bool:
        """Acquire or renew when due; whether this process leads now."""
        now = clock.monotonic()
        if now >= self._next_attempt:
            self._next_attempt = now + self.renew
            self._attempt(now)
        if self.state == LEADER and now >= self._deadline:
            self._demote("no successful renewal before the deadline (self-fence)")
        return self.is_leader()

    @abc.abstractmethod
    def _attempt(self, sent: float) -> None:
        """One election attempt (or renewal), sent at monotonic time ``sent``."""

    def _won(self, sent: float) -> None:
        self._deadline = sent + self.lease - self.renew
        if self.state != LEADER:
            self.state = LEADER
            self.terms += 1
            log.info("scheduler %s is now the leader (%s)", self.holder, self.mode)

    def _demote(self, why: str) -> None:
        if self.state == LEADER:
            log.warning("scheduler %s is no longer the leader: %s", self.holder, why)
        self.state = FOLLOWER
        self._deadline = -math.inf

    def lost(self, why: str) -> None:
        """The database said we no longer lead (a fenced statement matched nothing)."""
        self._demote(why)
        self._next_attempt = clock.monotonic()  # find out who leads at the next tick

    def _error(self, what: str, exc: BaseException, *, reported: bool = False) -> None:
        # Keep the deadline: the lease may still be ours, and is_leader() ends it in time.
        # Retry soon, not a whole renewal interval later.
        self._next_attempt = min(self._next_attempt, clock.monotonic() + min(self.renew, 1.0))
        if not reported:  # ``reported``: could not connect at all, logged once per outage
            log.warning("scheduler %s: %s failed (%s); retrying", self.holder, what, exc)

    @abc.abstractmethod
    def resign(self) -> None:
        """Step down on a clean stop so the next leader need not wait for a lapse."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the leadership holds beyond the thread's Django connection."""


class LeaseLeadership(Leadership):
    """``XJOBS["LEADER"] = "lease"``: the lease row, renewed on the thread's connection."""

    mode = "lease"

    def fence(self) -> LeaderFence:
        return LeaderFence(lock_key=self.lock_key, holder=self.holder,
                           margin_ms=round(self.renew * 1000))

    def _attempt(self, sent: float) -> None:
        try:
            expires_at = self.engine.leader_attempt_elect(
                self.lock_key, self.holder, round(self.lease * 1000))
        except Exception as exc:
            lost = reachability.connection_error(exc, "scheduler leader election", self.engine)
            self._error("leader election", exc, reported=lost == reachability.UNREACHABLE)
            return
        reachability.database.reached()
        if expires_at is None:
            self._demote("another scheduler holds a live lease")
        else:
            self._won(sent)

    def resign(self) -> None:
        was_leader = self.state == LEADER
        self.state, self._deadline = FOLLOWER, -math.inf
        try:
            if self.engine.leader_resign(self.lock_key, self.holder) and was_leader:
                log.info("scheduler %s resigned the leadership", self.holder)
        except Exception as exc:  # the lease then lapses by itself
            log.warning("scheduler %s: resigning failed (%s); the lease will lapse",
                        self.holder, exc)

    def close(self) -> None:
        """Nothing to release: the lease lives in a row, on the thread's own connection."""


class AdvisoryLeadership(Leadership):
    """``XJOBS["LEADER"] = "advisory"``: a session advisory lock on a dedicated connection."""

    mode = "advisory"

    _session: AdvisorySession | None = None

    def fence(self) -> LeaderFence:
        pid = self._session.backend_pid if self._session is not None else -1
        return LeaderFence(lock_key=self.lock_key, holder=self.holder, advisory_pid=pid)

    def _attempt(self, sent: float) -> None:
        try:
            if self._session is None:
                self._session = self.engine.leader_advisory_session(
                    self.lock_key, f"xjobs:{self.holder}:leader")
            # Re-taking a lock this session holds would stack a second hold: ask instead.
            held = self._session.holds() if self.state == LEADER else self._session.try_lock()
        except SessionLost as exc:
            self._drop_session()
            self._demote(f"the advisory session was lost ({exc})")
            self._error("advisory lock", exc)
            return
        if held:
            self._won(sent)
        else:
            self._demote("another scheduler holds the advisory lock")

    def _drop_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def resign(self) -> None:
        was_leader = self.state == LEADER
        self.state, self._deadline = FOLLOWER, -math.inf
        if self._session is not None and was_leader:
            try:
                self._session.unlock()
                log.info("scheduler %s released the advisory lock", self.holder)
            except SessionLost:
                pass  # the session is gone, and the lock with it
        self._drop_session()

    def close(self) -> None:
        self._drop_session()


def build(*, engine: Engine, holder: str, mode: str, lease: float, renew: float) -> Leadership:
    cls = AdvisoryLeadership if mode == "advisory" else LeaseLeadership
    return cls(engine=engine, holder=holder, lease=lease, renew=renew)


def current_leader(engine: Engine, mode: str, lock_key: str = LOCK_KEY) -> LeaderRecord | None:
    """Who leads now as the database sees it (for ``describe()``); None if nobody does."""
    if mode == "advisory":
        return engine.leader_advisory_holder(lock_key)
    return engine.leader_get(lock_key)
