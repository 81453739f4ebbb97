"""A dry run: a few batches of a backfill run here, each in a transaction that is rolled back.

``manage.py xjobs_backfill start NAME --dry-run`` reports what they returned and how long they
took; nothing is written (no job, no pass, none of the batches' writes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..api import acting_as
from ..engines import get_engine
from ..exceptions import DryRunFailed
from .definition import (
    MAX_BATCH_SIZE,
    BackfillContext,
    check_alias,
    positive_int,
    validate_batch,
)
from .registry import get


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunBatch:
    cursor: Any
    next_cursor: Any
    processed: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunReport:
    name: str
    batch_size: int
    batches: list[DryRunBatch]
    finished: bool  # the last batch returned next_cursor None
    stalled: bool  # a batch returned the cursor it was given (see dry_run)

    @property
    def rows(self) -> int:
        return sum(b.processed for b in self.batches)


class _RollBack(Exception):
    """Undo a dry run's batch."""


def dry_run(name: str, *, batch_size: int | None = None, batches: int = 1) -> DryRunReport:
    """Run up to ``batches`` batches of ``name`` here, each in a transaction that is rolled
    back: nothing is written (no job, no pass, none of the batches' writes).

    Stops early at the last batch, or when a batch returns the cursor it was given: its
    writes were undone, so a backfill that finds its rows by what it already changed (rather
    than by a keyset cursor) would see the same rows again.
    """
    definition = get(name)
    check_alias(definition)
    size = definition.batch_size if batch_size is None else positive_int(
        "batch size", batch_size, MAX_BATCH_SIZE)
    count = positive_int("batches", batches, MAX_BATCH_SIZE)
    engine = get_engine()
    ctx = BackfillContext(name=definition.name, run_id=None, job_id=None, attempt=0,
                          batch_size=size, dry_run=True)
    done: list[DryRunBatch] = []
    cursor: Any = None
    finished = stalled = False
    for n in range(1, count + 1):
        started = time.perf_counter()
        outcome: tuple[Any, int, str | None] | None = None
        try:
            with engine.atomic(), acting_as(f"backfill:{definition.name}"):
                outcome = validate_batch(definition, definition.func(ctx, cursor))
                raise _RollBack
        except _RollBack:
            pass
        except Exception as exc:
            raise DryRunFailed(
                f"dry run of {definition.name}: batch {n} (cursor {cursor!r}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        assert outcome is not None
        next_cursor, processed, _ = outcome
        done.append(DryRunBatch(cursor=cursor, next_cursor=next_cursor, processed=processed,
                                seconds=time.perf_counter() - started))
        if next_cursor is None:
            finished = True
            break
        if next_cursor == cursor:
            stalled = True
            break
        cursor = next_cursor
    return DryRunReport(name=definition.name, batch_size=size, batches=done, finished=finished,
                        stalled=stalled)
