"""Job and run ids: UUIDv7s (RFC 9562), time-ordered, minted by the caller."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from uuid import UUID


def new_id() -> UUID:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then randomness.

    Time-ordered ids keep the primary-key b-tree append-mostly (a random uuid4 key touches a
    random leaf page per insert, which costs full-page writes on a busy queue table) and make
    "newest first" an index scan on the primary key.
    """
    return new_ids(1)[0]


def new_ids(n: int) -> list[UUID]:
    """``n`` UUIDv7s from one read of the clock and one of the system's randomness (one
    syscall, not n).

    One clock read gives every id of the call the same millisecond: a job's id and run id are
    minted together, and the console finds a job by its run id within the primary-key range of
    that millisecond (``console.jobs.run_id_match``). The standard library's ``uuid.uuid7()``
    (Python 3.14 on; we support 3.11) and the ``uuid6`` package take no timestamp, so a pair
    made with them can straddle a millisecond; ``uuid-utils`` takes one, but is a compiled
    dependency for these few lines. Their counter within a millisecond buys nothing here:
    nothing orders jobs by id within a millisecond (claims order by ``run_at``).
    """
    ms = (time.time_ns() // 1_000_000) & 0xFFFF_FFFF_FFFF
    return _v7([ms] * n)


def run_ids_for(ids: Sequence[UUID]) -> list[UUID]:
    """A fresh UUIDv7 in the millisecond of each of ``ids``: run ids for jobs whose ids were
    minted earlier (the outbox stages a job's id, the relay mints its run id later), so the
    console finds them by run id on the primary key like the API's jobs
    (``console.jobs.run_id_match``; a run id in another millisecond puts its row in
    ``x_jobs_run_apart_idx``)."""
    return _v7([i.int >> 80 for i in ids])


def _v7(millis: Sequence[int]) -> list[UUID]:
    pool = os.urandom(10 * len(millis))
    ids = []
    for i, ms in enumerate(millis):
        head = (ms << 80) | (0x7 << 76) | (0b10 << 62)  # timestamp, version 7, RFC 4122 variant
        rand = int.from_bytes(pool[10 * i : 10 * i + 10], "big")
        # rand_a: 12 bits above the variant; rand_b: the 62 bits below it.
        rand_a, rand_b = (rand >> 62) & 0x0FFF, rand & 0x3FFF_FFFF_FFFF_FFFF
        ids.append(UUID(int=head | (rand_a << 64) | rand_b))
    return ids
