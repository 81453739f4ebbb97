"""The claim's floors: where a worker's claims start their scans while the database's horizon
is held (docs/performance.md, "Under a held horizon").

A backup, a long report or a replica's feedback holds the oldest snapshot open; while it does,
the index entries of every job claimed since cannot be removed or marked dead, and a scan from
the start of the claim's ranges walks all of them before it finds a live row (an empty queue's
claim walked every one). The claim is told where to start instead: per queue and priority,
where its last claims found the due jobs, ``MARGIN`` back for a transaction that enqueued
before it and commits late, and per queue, where they found the lapsed leases,
``LAPSED_MARGIN`` back. So a claim reads the entries of the last few seconds, however long the
horizon has been held.

What a floor cannot see is claimed by a sweep, a claim of the queue without floors, every
``SWEEP`` seconds per queue while they are on (longer once a sweep costs more than
``SWEEP_SHARE`` of that: it reads every entry pinned since the horizon was held, so an hour's
hold would otherwise spend the worker's loop on it), and at once after the safety net woke
blocked jobs: a job made due with an older run_at (enqueued with a run_at in the past or by a
transaction open longer than the margin, woken from ``blocked``, or a cron job woken by its
predecessor's end), a job another transaction held locked when a claim passed it, a priority
the worker has not met yet. A queue whose due scans meet a job with a concurrency or rate key
is not floored (a job woken from ``blocked`` keeps its run_at), nor is a fair queue's due scan
(its walk is per tenant); their rescue scans are. Burst runs never use floors.

When the horizon moves on, the entries pinned by the hold become removable, but the first scan
from the start still walks them all (marking them dead as it goes, or finding them gone once
VACUUM has run). Every worker reads the horizon within a heartbeat of the others, so if each
turned its floors off at once they would all make that walk together, and nobody would pick up
a job while they did (two seconds after a 30-minute hold). So a queue whose last sweep took
longer than ``RELEASE_WALK`` keeps its floors until its next sweep, on the schedule the hold
gave it, has made the walk; the others scan from the start at once.

The floors follow what the claim's scans found (``ClaimBatch.scans``: rows taken before flow
control held any back or a burial took its place), never the jobs it answered. The heartbeat
thread reads the horizon (``engine.horizon_age``) with the worker's row and sets ``held``; the
loop's thread does everything else, the floors' turning on and off included.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from ..records import ClaimBatch, ClaimFloors

log = logging.getLogger("django_xjobs.worker")

# Floors are on while the horizon is held this many transaction ids back: about what a
# worker's claims and acknowledgements spend in half a minute at a few hundred jobs a second,
# and the point from which an unfloored claim of an empty queue reads thousands of entries.
HORIZON_XIDS = 10_000
# How far behind where its claims found jobs a due floor stays: an enqueue whose transaction
# began up to this long before it committed is still claimed at once (its run_at is the
# transaction's start). Each claim reads the index entries of this window (and a rescue floor's).
MARGIN = timedelta(seconds=2)
# The rescue floor's: a lease's expiry is written by the claim or the renewal that holds the
# row, never behind the database's clock, so only a claim's own duration needs covering.
LAPSED_MARGIN = timedelta(seconds=1)
# Seconds between sweeps (claims without floors) while floors are on, at the least.
SWEEP = 30.0
# The share of the loop's time a queue's sweeps may take: the next one waits the longer of
# SWEEP and the last one's duration over this share.
SWEEP_SHARE = 0.01
# Seconds: a queue whose last sweep took longer keeps its floors after the horizon moves on, until
# its next sweep has walked what the hold left (a claim's ordinary cost is a few milliseconds).
RELEASE_WALK = 0.05


class Floors:
    """One worker's floors (the loop's thread; ``held`` is set by the heartbeat's)."""

    def __init__(self, *, priorities: Iterable[int], fair: Iterable[str] = ()) -> None:
        self.held = False  # the heartbeat's: the horizon is held
        self.age = 0  # the heartbeat's: how far back (transaction ids)
        self._on = False  # the claims start from floors
        # The horizon moved on: the queues that keep their floors until their next sweep.
        self._releasing: set[str] | None = None
        self._start = frozenset(priorities) | {0}
        self._fair = frozenset(fair)
        self._known: dict[str, set[int]] = {}
        self._due: dict[str, dict[int, datetime]] = {}
        self._lapsed: dict[str, datetime] = {}
        self._unfloored: set[str] = set()
        self._next_sweep: dict[str, float] = {}  # per queue (monotonic); none yet: at once
        self._walk: dict[str, float] = {}  # per queue, its last sweep's duration (seconds)
        self._sweeping: frozenset[str] = frozenset()  # the queues the last claim swept
        self.sweeps = 0  # claims of a queue without floors while they were on

    def horizon(self, age: int) -> None:
        """The heartbeat's reading of the horizon (transaction ids)."""
        self.age = age
        self.held = age >= HORIZON_XIDS

    def sweep_soon(self) -> None:
        """Blocked jobs were woken (they keep their run_at): every queue's next claim sweeps."""
        self._next_sweep.clear()

    def _turn(self) -> bool:
        """Turn the floors on or off after the heartbeat's reading; whether they are on."""
        if self.held:
            self._releasing = None
            if not self._on:
                self._on = True
                log.info("the database's horizon is held %d transaction ids back: claims start "
                         "from floors", self.age)
            return True
        if not self._on:
            return False
        if self._releasing is None:
            self._releasing = {q for q, took in self._walk.items() if took > RELEASE_WALK}
            if self._releasing:
                log.info("the database's horizon moved on (%d transaction ids back): claims "
                         "keep their floors until the next sweep of %s (the last took up to "
                         "%.1f s), so that the workers do not all walk what the hold left at "
                         "once", self.age, ", ".join(sorted(self._releasing)),
                         max(self._walk[q] for q in self._releasing))
        if self._releasing:
            return True
        self._on = False
        self._releasing = None
        self._due.clear()
        self._lapsed.clear()
        self._unfloored.clear()
        self._next_sweep.clear()
        self._walk.clear()
        log.info("the database's horizon moved on (%d transaction ids back): claims scan from "
                 "the start again", self.age)
        return False

    def for_claim(self, wants: Mapping[str, int], now: float) -> ClaimFloors | None:
        """The floors of the next claim (none for a queue due a sweep, or let go after the
        horizon moved on); None while they are off."""
        if not self._turn():
            self._sweeping = frozenset()
            return None
        kept = self._releasing
        floored = frozenset(q for q in wants if kept is None or q in kept)
        sweeping = frozenset(q for q in floored if now >= self._next_sweep.get(q, 0.0))
        for q in sweeping:
            self._next_sweep[q] = now + SWEEP
        self._sweeping = sweeping
        self.sweeps += len(sweeping)
        queues = frozenset(q for q in floored if q not in sweeping and q not in self._fair
                           and q not in self._unfloored)
        fq: list[str] = []
        fp: list[int] = []
        fv: list[datetime | None] = []
        for q in sorted(queues):
            floors = self._due.get(q, {})
            for p in sorted(self._known.get(q, self._start), reverse=True):
                fq.append(q)
                fp.append(p)
                fv.append(floors.get(p))
        lapsed = {q: self._lapsed[q] for q in floored if q not in sweeping and q in self._lapsed}
        return ClaimFloors(queues=queues, floor_queues=tuple(fq), floor_priorities=tuple(fp),
                           floor_values=tuple(fv), lapsed=lapsed)

    def claimed(self, wants: Mapping[str, int], batch: ClaimBatch, *, sent: float = 0.0,
                done: float = 0.0) -> None:
        """Move the floors to where this claim's scans stopped (a sweep's too); ``sent`` and
        ``done``: when the claim was sent and answered (monotonic), a sweep's cost."""
        if self._sweeping:
            wait = max(SWEEP, (done - sent) / SWEEP_SHARE)
            for q in self._sweeping:
                self._next_sweep[q] = sent + wait
                self._walk[q] = done - sent
            if self._releasing is not None:  # walked since the horizon moved on: let go
                self._releasing -= self._sweeping
            self._sweeping = frozenset()
        scans = batch.scans
        if not self._on or batch.now is None or scans is None:
            return
        back = batch.now - MARGIN
        for q, n in wants.items():
            if q not in scans.queues:  # paused: not scanned, nothing learnt
                continue
            if scans.lapsed.get(q, 0) < n:  # the rescue scan ran dry
                self._lapsed[q] = batch.now - LAPSED_MARGIN
            else:  # it stopped at n: from the start until it runs dry
                self._lapsed.pop(q, None)
            found = [d for d in scans.due if d.queue == q]
            known = self._known.setdefault(q, set(self._start))
            known.update(d.priority for d in found)
            if any(d.keyed for d in found):
                # A job of this queue may be held back and woken later with its run_at: scan
                # it whole.
                self._unfloored.add(q)
            share = max(n - scans.taken.get(q, 0), 0)
            if q in self._fair or q in self._unfloored or share == 0:
                continue
            floors = self._due.setdefault(q, {})
            if sum(d.found for d in found) < share:  # every priority ran dry
                for p in known:
                    floors[p] = back
                continue
            # The share filled up in the lowest priority found; those above it ran dry.
            last = min(d.priority for d in found)
            for p in known:
                if p > last:
                    floors[p] = back
            deepest = max(d.last for d in found if d.priority == last)
            floors[last] = min(deepest - MARGIN, back)
