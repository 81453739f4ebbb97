"""The worker's side of flow control (docs/flow-control.md): what it tells the claim, and the
concurrency slots its runs hold from the claim to their release.

The claim decides (``jobs_claim``): pauses, rate budgets and slots are applied in the statement
that claims, so every run the worker gets may start, and a run of a slot-limited job arrives
already holding its slot. What is left for the worker:

* **tell the claim** its job definitions' limits and rate limits, the settings' limits, the
  fair queues and their weights (a :class:`~django_xjobs.records.ClaimFlow`, built once), and
  per fair queue the last tenant it served (the cursor the next claim starts after);
* **claim again** when the budget of a rate-limited job it could not take frees (the claim
  answers that time);
* **renew** its runs' slots with the heartbeat (``slots_renew_if_held``, fenced on the holder
  and on expiry: a lapsed slot is never revived) and report the runs whose slot was lost;
* **release** the slots of settled runs in one statement per settle, which hands each freed
  slot to the next job blocked on its key that this worker can start itself (the hand-over:
  the release leases it to the worker, as a claim would, and the loop starts it), and wakes
  the others blocked on those keys, anywhere in the fleet;
* once per poll interval, **wake** blocked jobs that no release woke (``jobs_unblock``: their
  holders crashed, or their key's pause ended).

A run that cannot prove it still holds its slot (its renewal refused, or none for a whole
SLOT_TTL: :meth:`Flow.slot_lapsed`) is stopped with ``X_JOB_SLOT_LOST`` and its job handed back
(django_xjobs/slots.py has the protocol and its timeouts).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from .. import clock, registry, slots, versions
from ..conf import XJobsSettings
from ..context import busy_pause, log_extra, log_prefix
from ..engines import Engine
from ..exceptions import SLOT_LOST
from ..ratelimits import rate_limit_of
from ..records import (
    ClaimBatch,
    ClaimedJob,
    ClaimFlow,
    HandOver,
    Renewal,
    SlotHold,
    SlotRelease,
)
from .executor import GiveBack
from .floors import Floors

log = logging.getLogger("django_xjobs.worker")


class SlotRun(Protocol):
    """What this module needs of a run (worker/runs.py's ``Run``)."""

    job: ClaimedJob
    slot: SlotHold | None
    slot_renewed_at: float
    slot_ttl: float


R = TypeVar("R", bound=SlotRun)

# How often a worker reads the fleet's compatibility (x_fleet): a `--finish-upgrade` or a
# `--compatible-with` reaches every worker within this time.
FLEET_REFRESH = 5.0


def claim_flow(settings: XJobsSettings, definitions: Iterable[registry.JobDefinition],
               queues: Sequence[str]) -> ClaimFlow:
    """The flow-control arrays a worker's claims carry, from its job definitions and settings."""
    limits: dict[str, int] = {}
    rates: dict[str, tuple[int, int, int]] = {}
    for definition in definitions:
        concurrency = slots.concurrency_of(definition)
        if concurrency is not None and concurrency.limit is not None:
            limits[definition.name] = concurrency.limit
        rate = rate_limit_of(definition)
        if rate is not None:
            rates[definition.name] = (rate.limit, rate.period_ms, rate.cost)
    weights = [(q, tenant, w) for q in queues
               for tenant, w in settings.queue_weights.get(q, {}).items()]
    return ClaimFlow(
        slot_ttl_ms=round(settings.slot_ttl * 1000),
        limit_names=tuple(limits), limit_values=tuple(limits.values()),
        prefixes=tuple(p for p, _ in settings.concurrency_limits),
        prefix_limits=tuple(n for _, n in settings.concurrency_limits),
        rate_names=tuple(rates), rate_limits=tuple(r[0] for r in rates.values()),
        rate_periods_ms=tuple(r[1] for r in rates.values()),
        rate_costs=tuple(r[2] for r in rates.values()),
        fair_queues=frozenset(q for q in queues if q in settings.fair_queues),
        weight_queues=tuple(w[0] for w in weights), weight_tenants=tuple(w[1] for w in weights),
        weight_values=tuple(w[2] for w in weights),
    )


class Flow:
    """Flow control for one worker: its claims' parameters, its slots, its wake-ups."""

    def __init__(self, *, engine: Engine, settings: XJobsSettings, worker_id: str,
                 queues: Sequence[str], poll_interval: float, stats: Counter[str]) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.stats = stats
        self.poll_interval = poll_interval
        self.params = dataclasses.replace(
            claim_flow(settings, registry.all_jobs().values(), queues),
            hold_ms=round(poll_interval * 1000))
        self.slot_ttl = settings.slot_ttl
        self._weights = settings.queue_weights
        # The hand-over (release): how many runs the worker can start now, given how many
        # places the runs being settled free (set by the loop; None or 0: none), the lease it
        # gives them, the queues they may come from (served, not fair and not capped: a fair
        # queue's turns and a queue's cap are the claim's to decide), and the jobs the last
        # releases started for the loop to run (take_started).
        self.offer: Callable[[int], int] | None = None
        self.lease_ms = 0
        self._hand_over_queues = tuple(q for q in queues if q not in self.params.fair_queues
                                       and q not in settings.queue_concurrency)
        self._started: list[ClaimedJob] = []
        # Per fair queue, the tenant its last claim served last ('' = the NULL tenant).
        self.cursors: dict[str, str] = {}
        # When (monotonic) a job the claim held back for its rate budget is due again.
        self.retry_at: float | None = None
        self._holding = 0  # runs holding a slot not yet handed to a release
        self._releases: list[SlotHold] = []  # slots of settled runs, released at the next try
        # Slots a release found held by another transaction: released again then (monotonic),
        # the pause doubling as the loop's set-aside settles do.
        self.release_retry_at: float | None = None
        self._release_pause = 0.0
        # The first claim's round runs it: a worker starting (a burst run, a restart after a
        # crash) wakes at once what waits on keys with room.
        self._next_unblock = clock.monotonic()
        self._fleet_read_at: float | None = None  # when x_fleet was last read (monotonic)
        # Where the claims start while the database's horizon is held (floors.py); None: a
        # burst run, whose claims always scan from the start.
        self.floors: Floors | None = None

    # ------------------------------------------------------------------ the claim --
    def claim(self, wants: Mapping[str, int], lease_ms: int) -> ClaimBatch:
        """Claim under flow control (one statement), and note what the answer says for the
        next claim: the fair queues' cursors, when a rate-limited job is due again."""
        sent_at = clock.monotonic()
        self._read_fleet(sent_at)
        floors = self.floors.for_claim(wants, sent_at) if self.floors is not None else None
        if floors is not None and (floors.queues or floors.lapsed):
            self.stats["floored"] += 1  # a claim that started from floors (floors.py)
        batch = self.engine.jobs_claim(wants=wants, worker_id=self.worker_id, lease_ms=lease_ms,
                                       flow=self.params, cursors=self.cursors, floors=floors)
        if self.floors is not None:
            self.floors.claimed(wants, batch, sent=sent_at, done=clock.monotonic())
        if self.params.fair_queues:
            self._advance_cursors(batch)
        if batch.retry_at is not None:
            # On the database's clock: a worker whose wall clock is ahead would claim again
            # and again until then, one behind would wait until its next poll.
            now = batch.now or clock.now()
            wait = max(0.0, (batch.retry_at - now).total_seconds())
            self.retry_at = clock.monotonic() + wait
            self.stats["rate_held"] += 1
        return batch

    def _read_fleet(self, now: float) -> None:
        """Read the fleet's compatibility at most once per FLEET_REFRESH (before the first
        claim, then with the unblock round): whether the claim may park jobs in `blocked`."""
        if self._fleet_read_at is not None and now < self._fleet_read_at + FLEET_REFRESH:
            return
        record = self.engine.fleet_get()
        first = self._fleet_read_at is None
        self._fleet_read_at = now
        park = versions.writes("blocked", record)
        if park == self.params.park and not first:
            return
        self.params = dataclasses.replace(self.params, park=park)
        if not park:
            log.info("the fleet is kept compatible with %s (set by %s): a job without a free "
                     "slot is not parked in `blocked` until `manage.py xjobs fleet "
                     "--finish-upgrade` (docs/deployment.md, \"Mixed versions\")",
                     record.compatible_with, record.changed_by or "x_fleet")
        elif not first:
            log.info("the fleet's upgrade is finished: a job without a free slot is parked in "
                     "`blocked` again")

    def _advance_cursors(self, batch: ClaimBatch) -> None:
        """The next claim of a fair queue starts after the tenant this one served last.

        The claim visits the tenants after the cursor, then wraps round to those up to it, and
        gives each up to its weight per round (jobs_claim); the last job of the batch is in the
        latest round, at the last tenant of the visit that reached that round.
        """
        served: dict[str, Counter[str]] = {}
        for job in batch:
            if job.queue in self.params.fair_queues:
                served.setdefault(job.queue, Counter())[job.tenant_id or ""] += 1
        for queue, counts in served.items():
            cursor = self.cursors.get(queue, "")
            rounds = {t: (n - 1) // self._weight(queue, t) for t, n in counts.items()}
            last = max(rounds.values())
            self.cursors[queue] = max((t for t, r in rounds.items() if r == last),
                                      key=lambda t: (t <= cursor, t))

    def _weight(self, queue: str, tenant: str) -> int:
        return self._weights.get(queue, {}).get(tenant, 1)

    def claim_due(self, now: float) -> bool:
        """Whether a rate-limited job held back by an earlier claim is due again."""
        if self.retry_at is not None and now >= self.retry_at:
            self.retry_at = None
            return True
        return False

    def wait_limit(self, now: float) -> float | None:
        """Seconds until a held-back rate-limited job is due (None: none is)."""
        return None if self.retry_at is None else max(0.0, self.retry_at - now)

    # ---------------------------------------------------------------------- slots --
    def attach(self, run: SlotRun, sent_at: float) -> None:
        """A claimed run that took a slot in its claim holds it from ``sent_at``: the claim
        was sent then, and the database set the slot's expiry at or after that moment."""
        job = run.job
        if job.slot is None or job.concurrency_key is None:
            return
        run.slot = SlotHold(slot_key=job.concurrency_key, slot=job.slot,
                            holder=slots.holder(job, self.worker_id),
                            limit=job.slot_limit or 1)
        run.slot_renewed_at = sent_at
        run.slot_ttl = self.slot_ttl
        self._holding += 1

    @property
    def holding(self) -> bool:
        return bool(self._holding or self._releases)

    def release(self, settled: Iterable[SlotRun]) -> int:
        """Release the slots of settled runs (and any left from a failed release) in one
        statement, which hands what it can to this worker (:meth:`take_started`) and wakes the
        other jobs blocked on their keys; how many it woke. A failure raises, and the
        release is retried with the next settle (at worst the slots free themselves at
        expiry); a slot row another transaction holds this moment is not waited for, and is
        released again a moment later (release_due)."""
        for run in settled:
            hold = run.slot
            if hold is not None:
                run.slot = None
                self._holding -= 1
                self._releases.append(hold)
        if not self._releases:
            return 0
        pending, self._releases = self._releases, []
        return self._released(self.engine.slots_release_hand_over(pending, self.hand_over(0)))

    def hand_over(self, freeing: int) -> HandOver | None:
        """What the release about to be sent may hand this worker (None: nothing), when the
        runs it settles free ``freeing`` places beyond the worker's free capacity."""
        take = self.offer(freeing) if self.offer is not None else 0
        if take <= 0:
            return None
        return HandOver(worker_id=self.worker_id, lease_ms=self.lease_ms, take=take,
                        queues=self._hand_over_queues, flow=self.params)

    def released_with(self, runs: Iterable[SlotRun], busy: Iterable[str],
                      release: SlotRelease) -> int:
        """The release sent with the acknowledgement of ``runs`` (jobs_complete_release_if_
        owned): each run whose row was not held elsewhere (its lease token not in ``busy``)
        let go of its slot; how many blocked jobs it woke."""
        held = set(busy)
        for run in runs:
            if run.slot is not None and run.job.lease_token not in held:
                run.slot = None
                self._holding -= 1
        return self._released(release)

    def _released(self, release: SlotRelease) -> int:
        """Note what a release did: the slots whose row another transaction held, released
        again a moment later (release_due); the jobs it handed over (take_started)."""
        self._releases.extend(release.busy)
        if release.started:
            self._started.extend(release.started)
            self.stats["handed_over"] += len(release.started)
        if self._releases:
            self._release_pause = busy_pause(self._release_pause)
            self.release_retry_at = clock.monotonic() + self._release_pause
        else:
            self._release_pause, self.release_retry_at = 0.0, None
        return release.woken

    def take_started(self) -> list[ClaimedJob]:
        """The jobs the releases since the last call handed to this worker (each leased to
        it, holding its slot), for the loop to start."""
        started, self._started = self._started, []
        return started

    def release_due(self, now: float) -> bool:
        """Whether slots a held row turned away are due to be released again."""
        return self.release_retry_at is not None and now >= self.release_retry_at

    def slot_lapsed(self, run: SlotRun, now: float) -> bool:
        """Whether ``run`` can no longer prove it holds its slot: no renewal for a SLOT_TTL."""
        return run.slot is not None and now - run.slot_renewed_at >= self.slot_ttl

    def renewed(self, runs: Sequence[R], renewal: Renewal, sent_at: float) -> list[R]:
        """A heartbeat's slot answer (per holder): move the renewed runs' clocks; a slot whose
        row another transaction held this moment keeps its clock (renewed at the next round,
        or lost after a whole SLOT_TTL: slot_lapsed); the runs whose slot was neither lost it
        (it lapsed, and may have been taken)."""
        lost = []
        for run in runs:
            hold = run.slot
            if hold is None:
                continue
            if hold.holder in renewal.renewed:
                run.slot_renewed_at = sent_at
            elif hold.holder not in renewal.kept:
                lost.append(run)
        return lost

    def lost(self, why: str) -> GiveBack:
        """The outcome of a run that lost its slot (``why``): handed back after a poll
        interval with its attempt given back, its result discarded."""
        self.stats["slot_lost"] += 1
        return GiveBack(delay=self.poll_interval,
                        note=f"{SLOT_LOST}: run stopped and job re-queued: {why}",
                        outcome="slot_lost")

    @staticmethod
    def log_lost(run: SlotRun, why: str) -> None:
        hold = run.slot
        where = f"slot {hold.slot_key!r}#{hold.slot}" if hold is not None else "its slot"
        job = run.job
        log.error("%s: %s: lost %s: %s; the run is stopped, its result discarded, and the job "
                  "re-queued", log_prefix(job.id, job.name, job.attempt), SLOT_LOST, where, why,
                  extra=log_extra(job.id, job.name, job.attempt))

    # -------------------------------------------------------------- the safety net --
    def unblock_due(self, now: float) -> int:
        """Once per poll interval: wake the blocked jobs no release woke (one statement); how
        many it woke."""
        if now < self._next_unblock:
            return 0
        self._next_unblock = now + self.poll_interval
        self._read_fleet(now)
        woken = self.engine.jobs_unblock(self.params)
        if woken:
            self.stats["unblocked"] += woken
            self.sweep_soon()
        return woken

    def sweep_soon(self) -> None:
        """The safety net woke blocked jobs: they keep their run_at, so the next claim scans
        every queue from the start (floors.py). A release's wake-ups need none: the queues of
        keyed jobs are not floored."""
        if self.floors is not None:
            self.floors.sweep_soon()
