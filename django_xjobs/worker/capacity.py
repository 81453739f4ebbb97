"""How much a worker claims, and from which of its queues. No database here: the loop asks
these questions before each claim (worker/loop.py, step 3).

* **Free capacity**: concurrency + prefetch - runs not yet settled (worker/runs.py). Prefetch
  is fixed (``XJOBS["PREFETCH"]``) or adaptive (``"auto"``): about PREFETCH_WINDOW seconds of
  work claimed ahead of the threads, judged by the average run time the executor threads
  report (:meth:`Capacity.ran`), never more than PREFETCH_MAX jobs. A process that recycles
  after N jobs holds no more runs than it may still count (worker/recycling.py).
* **The split**: the free slots are split over the queues that have room
  (``XJOBS["QUEUE_CONCURRENCY"]`` caps a queue's runs, prefetch included), starting at the queue
  after the last one that got a share the time before (a rotation), so every queue makes
  progress even with fewer free slots than queues.
* **The sweep**: every queue asked once since the last claim that found something. While a
  sweep that found nothing has not asked every queue, the loop claims again at once (one
  statement when the free slots cover the queues, ``ceil(queues / free)`` otherwise); a sweep
  that asked them all and found nothing is :attr:`Capacity.dry`, which is how burst mode knows
  nothing is due (docs/guide.md, "The worker").
* **Refills**: when more jobs are likely, the loop claims again at once if a quarter of the
  capacity is free (:meth:`Capacity.refill_at`) or no run waits to start; the executor threads
  wake it when no more than :attr:`Capacity.low_water` runs wait to start.
"""

from __future__ import annotations

from collections import Counter

from .options import WorkerOptions
from .recycling import Recycling
from .runs import Runs

# Adaptive prefetch (XJOBS["PREFETCH"] = "auto"): keep about this many seconds of work claimed
# ahead of the threads, judged by the average run time, and never more than PREFETCH_MAX jobs.
# Short jobs get big batches (one claim and one ack statement per hundreds of jobs); long jobs
# get almost none, so they are not hoarded by one worker while others idle.
PREFETCH_WINDOW = 0.05
PREFETCH_MAX = 1000


class Capacity:
    """One worker's claim sizes and queue rotation (the loop thread's; executor threads write
    :attr:`avg_run` and read :attr:`low_water`, plain attribute accesses)."""

    def __init__(self, options: WorkerOptions, runs: Runs,
                 recycling: Recycling | None = None) -> None:
        self.queues = options.queues
        self.concurrency = options.concurrency
        self.fixed_prefetch = options.prefetch  # None: adaptive
        self.caps = options.queue_concurrency
        self._runs = runs
        self._budget = recycling  # what it may still count bounds what it claims
        self.avg_run: float | None = None  # EWMA of sync run durations (s), for auto prefetch
        self.low_water = 1  # wake the loop when no more than this many runs wait to start
        self._next_queue = 0  # where the next split of free slots over the queues starts
        self.unswept = set(options.queues)  # queues not asked since the sweep began
        self.dry = False  # the last sweep asked every queue and found nothing

    # ------------------------------------------------------------------- how much --
    def prefetch(self) -> int:
        """Runs to hold claimed beyond the threads: fixed, or sized to PREFETCH_WINDOW of work."""
        if self.fixed_prefetch is not None:
            return self.fixed_prefetch
        avg = self.avg_run
        if avg is None:
            return self.concurrency
        return min(PREFETCH_MAX, int(self.concurrency * PREFETCH_WINDOW / max(avg, 1e-6)))

    def free(self) -> int:
        free = self.concurrency + self.prefetch() - len(self._runs)
        if self._budget is None:
            return free
        room = self.budget_room()
        return free if room is None else min(free, room)

    def budget_room(self) -> int | None:
        """With --max-jobs-per-process, how many more runs this process may take: it leaves
        once it has counted that many, and claims none it would hand back (each run it holds
        may count: worker/recycling.py). None: no bound."""
        left = None if self._budget is None else self._budget.jobs_left
        return None if left is None else left - len(self._runs)

    def refill_at(self) -> int:
        # Claim again once a quarter of the capacity is free: batches stay big, and threads
        # still have queued work while the claim is on the wire.
        return max(1, (self.concurrency + self.prefetch()) // 4)

    def claimed(self) -> None:
        """After a claim: the executor threads wake the loop once no more than half the
        capacity waits to start."""
        self.low_water = max(1, (self.concurrency + self.prefetch()) // 2)

    def ran(self, seconds: float) -> None:
        """A sync run took ``seconds`` (an executor thread reports it)."""
        avg = self.avg_run
        self.avg_run = seconds if avg is None else 0.9 * avg + 0.1 * seconds

    # --------------------------------------------------------------- which queues --
    def wants(self, free: int) -> dict[str, int]:
        """``free`` slots split over the queues that have room, starting at the queue after
        the last one that got a share the time before (the rotation)."""
        queues = self.queues
        start = self._next_queue % len(queues)
        order = queues[start:] + queues[:start]
        caps = self.caps
        in_queue = self._runs.per_queue() if caps else Counter()
        room = {q: caps[q] + self.prefetch() - in_queue[q] for q in order if q in caps}
        # A queue at its cap cannot be claimed from now: it counts as asked in this sweep.
        self.unswept.difference_update(q for q, n in room.items() if n <= 0)
        open_queues = [q for q in order if room.get(q, free) > 0]
        if not open_queues:
            return {}
        share, extra = divmod(free, len(open_queues))
        wants: dict[str, int] = {}
        for i, q in enumerate(open_queues):
            n = min(share + (1 if i < extra else 0), room.get(q, free))
            if n > 0:
                wants[q] = n
        # The next split starts after the last queue that got one more than the others.
        last = open_queues[extra - 1] if extra else open_queues[0]
        self._next_queue = (start + order.index(last) + 1) % len(queues)
        return wants

    def swept(self, wants: dict[str, int], claimed: int) -> bool:
        """After a claim that asked for ``wants`` and got ``claimed`` jobs (or held them back):
        whether to claim again at once, a sweep that found nothing so far not having asked
        every queue yet."""
        if claimed:
            self.new_sweep(dry=False)
            return False
        self.unswept.difference_update(wants)
        if self.unswept:
            self.dry = False
            return True
        self.new_sweep(dry=True)
        return False

    def new_sweep(self, *, dry: bool) -> None:
        """Every queue is to be asked again; ``dry``: the sweep just ended found nothing."""
        self.unswept = set(self.queues)
        self.dry = dry
