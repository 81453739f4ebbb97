"""Settling: the fenced writes that record how a worker's runs ended (step 1 of the loop,
worker/loop.py), from the outcomes their executions mapped to.

Finished runs are written back with fenced statements: every ``Done`` of the iteration in ONE
``jobs_complete_if_owned`` (children of several parents included: it locks their rows and their
parents' step rows SKIP LOCKED, in one order, so no two batches, and no batch and the heartbeat,
ever wait on each other), other outcomes one statement each (:func:`write_outcome`).

* A write that matches no row means the run lost the job: logged, result discarded, never
  raised.
* A write whose connection died is retried as is at the next settle; if the first try had
  committed, the fence check recognises it as already applied (the ambiguous commit).
* No write waits on a row lock: a run whose row another transaction holds is answered busy, set
  aside, and written again at a later settle (after BUSY_RETRY_FIRST, doubling up to
  BUSY_RETRY_MAX; logged at INFO only once the row stays held past BUSY_NOTICE), while the
  heartbeat keeps its lease; the other runs of the batch settle at once (docs/design.md, "Lock
  order").
* The slots of the settled runs are released in ONE statement per settle, however the runs
  ended: with the acknowledgement of the ``Done`` runs that held them
  (``jobs_complete_release_if_owned``), else ``slots_release_if_held``; the release hands each
  freed slot to the next job blocked on its key that this worker can start, and wakes the
  others fleet-wide (worker/flow.py).

:func:`write_outcome` is shared with the inline test mode (django_xjobs/testing/inline.py), so a
test sees the statements a worker sends.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from .. import clock, signals
from ..context import BUSY_NOTICE, BUSY_RETRY_FIRST, BUSY_RETRY_MAX, busy_pause
from ..engines import Engine
from ..pauses import MAX_REASON
from ..records import (
    ClaimedJob,
    Completion,
    Failure,
    Fence,
    KeyPauseRequeue,
    Requeue,
    UnknownGiveBack,
)
from .executor import Discard, Done, GiveBack, KeyPaused, Outcome, Retry, Suspended, UnknownName
from .flow import Flow
from .runs import SETTLED, Run, Runs
from .unknown import UnknownNames

log = logging.getLogger("django_xjobs.worker")


class Settler:
    """Settles the finished runs of one worker, on the loop thread (see the module docstring).
    A database error goes to ``db_error`` (the loop's: it logs, and pauses before the loop goes
    on); the runs it left unsettled are written again at the next settle."""

    def __init__(self, *, engine: Engine, runs: Runs, flow: Flow, stats: Counter[str],
                 unknown: UnknownNames, db_error: Callable[[str, BaseException], None]) -> None:
        self.engine = engine
        self.runs = runs
        self.flow = flow
        self.stats = stats
        self.unknown = unknown
        self._db_error = db_error
        self._woke = False  # the release sent with this settle's acknowledgement woke jobs

    def due(self, now: float) -> list[Run]:
        """The runs to settle now: set-aside ones whose retry is due, then every finished run."""
        runs = self.runs
        retried = [r for r in runs.busy if r.retry_at <= now] if runs.busy else []
        if not runs.finished and not retried:
            return retried
        if retried:
            runs.busy = [r for r in runs.busy if r.retry_at > now]
        batch: list[Run] = retried
        while runs.finished:
            batch.append(runs.finished.popleft())
        return batch

    def settle(self, batch: list[Run]) -> bool:
        """Write ``batch`` back and release the slots of the runs it settled (an empty batch:
        only the slots a held row turned away before); whether the release woke jobs blocked
        on its keys (for the next claim)."""
        if not batch:
            return self._release(())
        self._woke = False
        done = [r for r in batch if isinstance(r.outcome, Done)]
        others = [r for r in batch if not isinstance(r.outcome, Done)]
        unsettled: list[Run] = []
        if done:
            unsettled.extend(self._acknowledge(done))
        for i, r in enumerate(others):
            try:
                assert r.outcome is not None
                fence, state = write_outcome(self.engine, r.job, r.outcome)
            except Exception as exc:
                if self.engine.is_connection_error(exc):
                    # The others would fail the same way, each after a longer pause.
                    self._db_error("settle", exc)
                    unsettled.extend(others[i:])
                    break
                self._db_error("settle", exc)
                unsettled.append(r)
                continue
            if fence is Fence.BUSY:
                self._set_aside(r)
            else:
                self._settled(r, fence, state)
        if unsettled:
            with self.runs.lock:
                self.runs.finished.extendleft(reversed(unsettled))
        if self.flow.holding:
            return self._release(r for r in batch if r.phase == SETTLED) or self._woke
        return self._woke

    def _release(self, settled: Iterable[Run]) -> bool:
        """Release the slots of settled runs (and those a held row turned away before);
        whether it woke blocked jobs for the claims (what it handed to this worker is not)."""
        try:
            return self.flow.release(settled) > 0
        except Exception as exc:
            self._db_error("slot release", exc)
            return False

    def _set_aside(self, run: Run) -> None:
        """A settle that found the run's row held by another transaction: nothing was written
        and nothing waited. Write it again at a later settle, the pause doubling up to
        BUSY_RETRY_MAX; the heartbeat keeps the run's lease meanwhile."""
        now = clock.monotonic()
        run.busy_pause = busy_pause(run.busy_pause)
        run.retry_at = now + run.busy_pause
        if run.held_since is None:
            run.held_since = now
        if run.busy_pause == BUSY_RETRY_FIRST:
            self.stats["settles_set_aside"] += 1
            log.debug("job %s (%s) attempt %d: its row is held; its outcome is written again "
                      "in %gs", run.job.id, run.job.name, run.job.attempt, run.busy_pause)
        elif not run.held_told and now - run.held_since >= BUSY_NOTICE:
            run.held_told = True
            log.info("job %s (%s) attempt %d: its row is held by another transaction; its "
                     "outcome is written once the row is free (tried again at most every %gs)",
                     run.job.id, run.job.name, run.job.attempt, BUSY_RETRY_MAX)
        self.runs.busy.append(run)

    def _acknowledge(self, done: list[Run]) -> list[Run]:
        """One ``jobs_complete_if_owned`` for these runs, or, when some hold slots, one
        ``jobs_complete_release_if_owned``, which releases those slots and hands them over in
        the same statement; returns the runs when it failed (a database error: the next settle
        writes them again), else nothing."""
        completions = [Completion(claim=r.job.claim,
                                  result_json=r.outcome.result_json)  # type: ignore[union-attr]
                       for r in done]
        holds = [r.slot for r in done if r.slot is not None]
        try:
            if holds:
                report, release = self.engine.jobs_complete_release_if_owned(
                    completions, holds, self.flow.hand_over(len(done)))
                if self.flow.released_with(done, report.busy, release):
                    self._woke = True
            else:
                report = self.engine.jobs_complete_if_owned(completions)
        except Exception as exc:
            self._db_error("acknowledge", exc)
            return done
        else:
            if (len(report.owned) == len(done) and not log.isEnabledFor(logging.DEBUG)
                    and not announcing() and not any(r.held_told for r in done)):
                # The usual case: every run still owned its job (and none has a hold to close
                # in the log). Settle them in one go.
                self.runs.all_settled(done)
                for r in done:
                    r.let_go_of_ctx()  # a Done run's code has returned
                self.stats["done"] += len(done)
            else:
                for r in done:
                    fence = report.outcome(r.job.lease_token)
                    if fence is Fence.BUSY:
                        self._set_aside(r)
                    else:
                        self._settled(r, fence, "done")
        return []

    def _settled(self, run: Run, fence: Fence, state: str) -> None:
        self.runs.settled(run)
        job = run.job
        if run.held_since is not None:
            log.log(logging.INFO if run.held_told else logging.DEBUG,
                    "job %s (%s): settled %.3fs after another transaction first held its row",
                    job.id, job.name, clock.monotonic() - run.held_since)
        if announcing():
            assert run.outcome is not None
            announce(self.engine, job, run.definition or job.name, run.outcome, fence, state)
        if fence is Fence.LOST:
            self.stats["lost"] += 1
            reason = run.outcome.reason if isinstance(run.outcome, Discard) else (
                "the job was cancelled or re-claimed after its lease lapsed"
            )
            log.warning("job %s (%s) attempt %d: result discarded, this run no longer owns the "
                        "job: %s", job.id, job.name, job.attempt, reason)
            return
        if fence is Fence.ALREADY_APPLIED:
            self.stats["already_applied"] += 1
            log.info("job %s (%s): %s had already been recorded (the connection died after the "
                     "commit)", job.id, job.name, state)
        self.stats[state] += 1
        outcome = run.outcome
        if isinstance(outcome, UnknownName):
            try:
                self.unknown.gave_back(job.name)
            except Exception as exc:  # a report is not worth failing the settle for
                log.warning("job %s (%s): the wait of its name not read: %s", job.id, job.name,
                            exc)
        if isinstance(outcome, Retry):
            # The error as recorded on the row: its class, then the traceback of the run (the
            # exception itself stayed with the executor thread that caught it).
            level = logging.ERROR if state == "dead" else logging.WARNING
            error = outcome.error.rstrip()
            log.log(level, "job %s (%s) attempt %d/%d failed -> %s: %s\n%s", job.id, job.name,
                    job.attempt, job.max_attempts, state, error.splitlines()[-1], error)
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("job %s (%s) attempt %d -> %s", job.id, job.name, job.attempt, state)


def write_outcome(engine: Engine, job: ClaimedJob, outcome: Outcome) -> tuple[Fence, str]:
    """The fenced write of one outcome other than ``Done`` (acknowledged in batches by
    ``Settler._acknowledge``); the fence's verdict and the state the job went to. Also the inline
    test mode's settle (django_xjobs/testing), so a test sees the statements a worker sends."""
    if isinstance(outcome, Retry):
        report, state = engine.job_fail_if_owned(Failure(
            claim=job.claim, error=outcome.error,
            # Rounded up: a backoff drawn under half a millisecond still makes the retry wait
            # (`delayed`), instead of reading as no backoff at all.
            retry_delay_ms=math.ceil(outcome.delay * 1000), permanent=outcome.permanent,
            outcome=outcome.outcome, max_attempts=outcome.max_attempts,
        ))
        return report.outcome(job.lease_token), state or "lost"
    if isinstance(outcome, GiveBack):
        report = engine.job_requeue_if_owned(Requeue(
            claim=job.claim, delay_ms=round(outcome.delay * 1000),
            spent_attempt=not job.resumed, resumed=job.resumed, note=outcome.note,
            outcome=outcome.outcome,
        ))
        return report.outcome(job.lease_token), "requeued"
    if isinstance(outcome, UnknownName):
        report = engine.job_give_back_unknown_if_owned(UnknownGiveBack(
            claim=job.claim, spent_attempt=not job.resumed, resumed=job.resumed,
            note=outcome.note, max_delay_ms=max(1, round(outcome.max_delay * 1000)),
        ))
        return report.outcome(job.lease_token), "unknown_job"
    if isinstance(outcome, KeyPaused):
        report, _until = engine.job_pause_key_if_owned(KeyPauseRequeue(
            claim=job.claim, key=outcome.key, for_ms=max(1, round(outcome.seconds * 1000)),
            reason=_cut(outcome.reason), spent_attempt=not job.resumed, resumed=job.resumed,
            note=f"PauseKey: paused key {outcome.key!r} for {outcome.seconds:g}s"
                 + (f" ({_cut(outcome.reason)})" if outcome.reason else ""),
        ))
        return report.outcome(job.lease_token), "requeued"
    if isinstance(outcome, Suspended):
        return Fence.OWNED, "suspended"
    assert isinstance(outcome, Discard)
    return Fence.LOST, "discarded"


def _cut(reason: str | None) -> str | None:
    """A PauseKey reason as stored: at most as long as an operator's (pauses.MAX_REASON)."""
    if reason is None or len(reason) <= MAX_REASON:
        return reason
    return reason[:MAX_REASON - 3] + "..."


def announcing() -> bool:
    """Whether a settled run has receivers to tell (:func:`announce`): one read per settle
    batch when nobody listens."""
    return bool(signals.job_finished.receivers or signals.job_dead.receivers)


def announce(engine: Engine, job: ClaimedJob, sender: Any, outcome: Outcome, fence: Fence,
             state: str) -> None:
    """``job_finished`` for a settled run, and ``job_dead`` when its write made the job dead
    (docs/observability.md, "Signals"). ``sender`` is the job's definition, or its name when
    none is registered here."""
    if signals.job_finished.receivers:
        signals.send(signals.job_finished, sender, job=job, attempt=job.attempt,
                     outcome=attempt_outcome(engine, job, outcome, fence),
                     exception=getattr(outcome, "exception", None))
    if (signals.job_dead.receivers and state == "dead" and fence is not Fence.LOST
            and isinstance(outcome, Retry)):
        signals.send(signals.job_dead, sender, job=job, error=outcome.error)


def attempt_outcome(engine: Engine, job: ClaimedJob, outcome: Outcome, fence: Fence) -> str:
    """How the run ended, in the words of its attempt history (``records.ATTEMPT_OUTCOMES``)."""
    if fence is Fence.LOST:
        # Cancel and a lapsed lease look alike to the run (the fence no longer matches); the
        # row tells them apart: a cancel leaves it cancelled. Read only for a run that lost
        # its job, and only when someone listens.
        try:
            record = engine.job_get(job.id)
        except Exception:  # a signal's detail is not worth failing the settle for
            log.debug("job %s: state not read for job_finished", job.id, exc_info=True)
            return "lost"
        cancelled = record is not None and record.state == "cancelled"
        return "cancelled" if cancelled else "lost"
    if isinstance(outcome, Done):
        return "done"
    if isinstance(outcome, Retry | GiveBack):
        return outcome.outcome
    if isinstance(outcome, KeyPaused):
        return "handed_back"  # as job_pause_key_if_owned records it
    if isinstance(outcome, UnknownName):
        return "unknown_job"
    if isinstance(outcome, Suspended):
        return "suspended"
    return "lost"
