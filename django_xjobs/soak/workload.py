"""The soak's producers (docs/soak.md, "The workload").

Two producer threads enqueue a seeded mix of the soak's jobs for the first part of the run and
record each enqueue in the ledger inside the enqueue's own transaction, so the ledger holds
exactly the enqueues that committed. Rolled-back enqueues are recorded after their rollback, and
cancels after the cancel committed (the ledger row's time is then no earlier than the cancel's).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import InterfaceError, OperationalError, connections, transaction

from .. import api, conf
from . import jobs, tables

# What a producer does on each step, and how often (weights, in per cent).
MIX: tuple[tuple[str, int], ...] = (
    ("plain", 61),
    ("slow", 4),
    ("steps", 8),
    ("slot", 7),  # a burst of 3 to 6 on one of three slot keys
    ("rate", 3),  # a burst of 2 to 4 on the one rate key
    ("duplicate", 5),  # the same idempotency key from both producers
    ("cancel", 4),  # cancelled from outside at a random moment
    ("poison", 3),
    ("rollback", 2),  # enqueued in a transaction that rolls back
    ("on_commit", 3),  # staged with enqueue_on_commit, published by a relay
)
DUPLICATE_KEYS = 6


class Rollback(Exception):
    """Raised inside a producer's transaction to roll it back."""


@dataclass
class Workload:
    """What the producers share: the soak's tag and queue, the rate of enqueues, errors."""

    soak: str
    queue: str
    per_second: float
    on_commit: bool  # False when the job tables' database is not an outbox database
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    enqueued: int = 0
    connections_lost: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, n: int = 1) -> None:
        with self._lock:
            self.enqueued += n

    def count_lost(self) -> None:
        with self._lock:
            self.connections_lost += 1


class Producer(threading.Thread):
    """One producer: a seeded sequence of enqueues, paced to its share of ``per_second``."""

    def __init__(self, workload: Workload, seed: int, index: int, share: float) -> None:
        super().__init__(name=f"xjobs-soak-producer-{index}", daemon=True)
        self.w = workload
        self.rng = random.Random(seed * 1000 + index)
        self.interval = 1.0 / max(workload.per_second * share, 0.1)
        self.cancels: list[tuple[float, Any]] = []  # (when, job id), due times on monotonic
        kinds = [k for k, _ in MIX if k != "on_commit" or workload.on_commit]
        self.kinds = kinds
        self.weights = [w for k, w in MIX if k in kinds]

    def run(self) -> None:
        tables.name_session(self.w.soak, self.name)
        try:
            next_at = time.monotonic()
            while not self.w.stop.is_set():
                self._attempt("cancel", self._cancel_due)
                kind = self.rng.choices(self.kinds, self.weights)[0]
                self._attempt(kind, getattr(self, f"_make_{kind}"))
                next_at += self.interval
                self.w.stop.wait(max(0.0, next_at - time.monotonic()))
            for _, job_id in self.cancels:  # the cancels still due are made now
                self._attempt("cancel", functools.partial(self._cancel, job_id))
        finally:
            connections.close_all()

    def _attempt(self, what: str, action: Callable[[], None]) -> None:
        """Run one producer action. A lost connection is the chaos's doing (behind a pooler its
        ``pg_terminate_backend`` may hit a server session a producer is using): the action's
        transaction, ledger row included, rolled back or committed whole, so nothing is
        inconsistent; it is counted and the producer goes on. Any other error is a finding."""
        try:
            action()
        except (OperationalError, InterfaceError):
            connections[tables.alias()].close()
            self.w.count_lost()
        except Exception as exc:
            self.w.errors.append(f"{self.name}: {what}: {exc!r}")

    # ------------------------------------------------------------------------------ kinds --
    def _enqueue(self, definition: Any, kind: str, *, count: int = 1,
                 options: dict[str, Any] | None = None, **input: Any) -> list[Any]:
        """Enqueue ``count`` runs of ``definition`` in one transaction with their ledger rows."""
        bound = definition.using(queue=self.w.queue, **(options or {}))
        ids = []
        with transaction.atomic(using=tables.alias()):
            for _ in range(count):
                handle = bound.enqueue(soak=self.w.soak, **input)
                tables.ledger(self.w.soak, handle.id, kind, "committed")
                ids.append(handle.id)
        self.w.count(count)
        return ids

    def _make_plain(self) -> None:
        self._enqueue(jobs.plain, "plain", seconds=round(self.rng.uniform(0.01, 0.1), 3))

    def _make_slow(self) -> None:
        self._enqueue(jobs.slow, "slow", seconds=round(self.rng.uniform(2.5, 4.0), 3))

    def _make_steps(self) -> None:
        self._enqueue(jobs.steps, "steps")

    def _make_slot(self) -> None:
        self._enqueue(jobs.slot, "slot", count=self.rng.randint(3, 6),
                      slot=self.rng.randrange(3), seconds=round(self.rng.uniform(0.05, 0.3), 3))

    def _make_rate(self) -> None:
        self._enqueue(jobs.rate, "rate", count=self.rng.randint(2, 4))

    def _make_poison(self) -> None:
        self._enqueue(jobs.poison, "poison")

    def _make_duplicate(self) -> None:
        key = f"{self.w.soak}:dup:{self.rng.randrange(DUPLICATE_KEYS)}"
        self._enqueue(jobs.plain, "duplicate", options={"idempotency_key": key},
                      seconds=round(self.rng.uniform(0.05, 0.5), 3))

    def _make_cancel(self) -> None:
        [job_id] = self._enqueue(jobs.slow, "cancel", seconds=round(self.rng.uniform(0.3, 2), 3))
        self.cancels.append((time.monotonic() + self.rng.uniform(0.0, 2.5), job_id))

    def _make_rollback(self) -> None:
        job_id = None
        try:
            with transaction.atomic(using=tables.alias()):
                job_id = jobs.plain.using(queue=self.w.queue).enqueue(soak=self.w.soak).id
                raise Rollback
        except Rollback:
            pass
        tables.ledger(self.w.soak, job_id, "rollback", "rolled_back")

    def _make_on_commit(self) -> None:
        alias = tables.alias()
        rolled_back = self.rng.random() < 0.25
        staged_id = None
        try:
            with transaction.atomic(using=alias):
                staged = api.stage_job(jobs.plain, {"soak": self.w.soak},
                                       {"queue": self.w.queue}, using=alias)
                staged_id = staged.id
                if rolled_back:
                    raise Rollback
                tables.ledger(self.w.soak, staged.id, "on_commit", "staged")
        except Rollback:
            tables.ledger(self.w.soak, staged_id, "on_commit", "rolled_back")
            return
        self.w.count()

    # ---------------------------------------------------------------------------- cancels --
    def _cancel_due(self) -> None:
        now = time.monotonic()
        due = [c for c in self.cancels if c[0] <= now]
        self.cancels = [c for c in self.cancels if c[0] > now]
        for _, job_id in due:
            self._cancel(job_id)

    def _cancel(self, job_id: Any) -> None:
        result = api.cancel(job_id, reason="xjobs_soak")
        attempt = result.job.attempt if result.job is not None else None
        tables.ledger(self.w.soak, job_id, "cancel", "cancel_requested", changed=result.changed,
                      attempt=attempt)


def outbox_usable() -> bool:
    """Whether on-commit enqueues can share the ledger's transaction (the job tables' database
    is one whose outbox the relays read)."""
    settings = conf.get()
    return settings.database in settings.outbox.databases


def start(workload: Workload, seed: int, producers: int = 2) -> list[Producer]:
    threads = [Producer(workload, seed, i, 1.0 / producers) for i in range(producers)]
    for t in threads:
        t.start()
    return threads

