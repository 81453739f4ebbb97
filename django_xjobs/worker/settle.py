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
from datetime import datetime
from typing import Any

from .. import clock, signals
from ..context import (
    BUSY_NOTICE,
    BUSY_RETRY_FIRST,
    BUSY_RETRY_MAX,
    busy_pause,
    log_extra,
    log_prefix,
)
from ..engines import Engine
from ..pauses import MAX_REASON
from ..records import (
    ClaimedJob,
    Completion,
    Failure,
    Fence,
    JobRecord,
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
                fence, state, due = _write(self.engine, r.job, r.outcome)
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
                self._settled(r, fence, state, due)
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
            log.debug("%s: its row is held; its outcome is written again in %gs",
                      _about(run.job), run.busy_pause, extra=_extra(run.job))
        elif not run.held_told and now - run.held_since >= BUSY_NOTICE:
            run.held_told = True
            log.info("%s: its row is held by another transaction; its outcome is written once "
                     "the row is free (tried again at most every %gs)", _about(run.job),
                     BUSY_RETRY_MAX, extra=_extra(run.job))
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

    def _settled(self, run: Run, fence: Fence, state: str, due: datetime | None = None) -> None:
        self.runs.settled(run)
        job = run.job
        if run.held_since is not None:
            log.log(logging.INFO if run.held_told else logging.DEBUG,
                    "%s: settled %.3fs after another transaction first held its row",
                    _about(job), clock.monotonic() - run.held_since, extra=_extra(job))
        # A run that lost its job: the row tells an operator's cancel from a lapsed lease (one
        # read, for the log line and for job_finished's outcome).
        now = self._row_of_lost(job) if fence is Fence.LOST else None
        if announcing():
            assert run.outcome is not None
            announce(self.engine, job, run.definition or job.name, run.outcome, fence, state,
                     lost_state=now.state if now is not None else None)
        if fence is Fence.LOST:
            self.stats["lost"] += 1
            log_lost(job, now)
            return
        if fence is Fence.ALREADY_APPLIED:
            self.stats["already_applied"] += 1
            log.info("%s: %s had already been recorded (the connection died after the commit)",
                     _about(job), state, extra=_extra(job))
        self.stats[state] += 1
        outcome = run.outcome
        if isinstance(outcome, UnknownName):
            try:
                self.unknown.gave_back(job.name)
            except Exception as exc:  # a report is not worth failing the settle for
                log.warning("%s: the wait of its name not read: %s", _about(job), exc,
                            extra=_extra(job))
        if isinstance(outcome, Retry):
            # The error as recorded on the row: its class, then the traceback of the run (the
            # exception itself stayed with the executor thread that caught it).
            level = logging.ERROR if state == "dead" else logging.WARNING
            error = outcome.error.rstrip()
            log.log(level, "%s/%d failed -> %s: %s%s\n%s", _about(job), job.max_attempts, state,
                    error.splitlines()[-1], next_attempt(state, due, outcome.delay), error,
                    extra=_extra(job))
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("%s -> %s", _about(job), state, extra=_extra(job))

    def _row_of_lost(self, job: ClaimedJob) -> JobRecord | None:
        """The job's row as it is now, for a run that lost it (None: gone, or not read)."""
        try:
            return self.engine.job_get(job.id)
        except Exception as exc:  # the line says less; the settle goes on
            log.debug("%s: its row not read (%s)", _about(job), exc, extra=_extra(job))
            return None


def _about(job: ClaimedJob) -> str:
    return log_prefix(job.id, job.name, job.attempt)


def _extra(job: ClaimedJob) -> dict[str, Any]:
    return log_extra(job.id, job.name, job.attempt)


def log_lost(job: ClaimedJob, now: JobRecord | None) -> None:
    """The one line of a run that lost its job (docs/observability.md, "Logs"): an operator's
    cancel at INFO, with its reason and who as the row records them (``last_error``); a lapsed
    lease, or a job that is gone, at WARNING."""
    if now is not None and now.state == "cancelled":
        log.info("%s: %s; the run is stopped, its result discarded", _about(job),
                 now.last_error or "cancelled", extra=_extra(job))
        return
    if now is None:
        why = "cancelled, or re-claimed after its lease lapsed (its row was not read)"
    else:
        on = f" on {now.claimed_by}" if now.state == "running" and now.claimed_by else ""
        why = f"lease lost (the job is now {now.state}, attempt {now.attempt}{on})"
    log.warning("%s: result discarded, this run no longer owns the job: %s", _about(job), why,
                extra=_extra(job))


def next_attempt(state: str, due: datetime | None, delay: float) -> str:
    """What a retry's line says of the next attempt: when it is due, as run_at holds it (on the
    database's clock), and in how long; nothing for a job that is dead."""
    if state not in ("delayed", "ready"):
        return ""
    wait = math.ceil(delay * 1000) / 1000  # as written (write_outcome)
    when = f"in {_span(wait)}" if wait > 0 else "now"
    if due is None:  # an earlier try wrote it (the connection died after the commit)
        return f"; next attempt due {when}"
    return f"; next attempt due at {due.isoformat(sep=' ', timespec='milliseconds')} ({when})"


def _span(seconds: float) -> str:
    """``850ms``, ``12.3s``, ``4m12s``, ``3h12m``, ``2d3h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 59.95:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600}h"


def write_outcome(engine: Engine, job: ClaimedJob, outcome: Outcome) -> tuple[Fence, str]:
    """The fenced write of one outcome other than ``Done`` (acknowledged in batches by
    ``Settler._acknowledge``); the fence's verdict and the state the job went to. Also the inline
    test mode's settle (django_xjobs/testing), so a test sees the statements a worker sends."""
    fence, state, _due = _write(engine, job, outcome)
    return fence, state


def _write(engine: Engine, job: ClaimedJob,
           outcome: Outcome) -> tuple[Fence, str, datetime | None]:
    """:func:`write_outcome`, and for a retried failure the job's new run_at (None otherwise)."""
    if isinstance(outcome, Retry):
        report, state = engine.job_fail_if_owned(Failure(
            claim=job.claim, error=outcome.error,
            # Rounded up: a backoff drawn under half a millisecond still makes the retry wait
            # (`delayed`), instead of reading as no backoff at all.
            retry_delay_ms=math.ceil(outcome.delay * 1000), permanent=outcome.permanent,
            outcome=outcome.outcome, max_attempts=outcome.max_attempts,
        ))
        return (report.outcome(job.lease_token), state or "lost",
                report.run_at.get(job.lease_token))
    if isinstance(outcome, GiveBack):
        report = engine.job_requeue_if_owned(Requeue(
            claim=job.claim, delay_ms=round(outcome.delay * 1000),
            spent_attempt=not job.resumed, resumed=job.resumed, note=outcome.note,
            outcome=outcome.outcome,
        ))
        return report.outcome(job.lease_token), "requeued", None
    if isinstance(outcome, UnknownName):
        report = engine.job_give_back_unknown_if_owned(UnknownGiveBack(
            claim=job.claim, spent_attempt=not job.resumed, resumed=job.resumed,
            note=outcome.note, max_delay_ms=max(1, round(outcome.max_delay * 1000)),
        ))
        return report.outcome(job.lease_token), "unknown_job", None
    if isinstance(outcome, KeyPaused):
        report, _until = engine.job_pause_key_if_owned(KeyPauseRequeue(
            claim=job.claim, key=outcome.key, for_ms=max(1, round(outcome.seconds * 1000)),
            reason=_cut(outcome.reason), spent_attempt=not job.resumed, resumed=job.resumed,
            note=f"PauseKey: paused key {outcome.key!r} for {outcome.seconds:g}s"
                 + (f" ({_cut(outcome.reason)})" if outcome.reason else ""),
        ))
        return report.outcome(job.lease_token), "requeued", None
    if isinstance(outcome, Suspended):
        return Fence.OWNED, "suspended", None
    assert isinstance(outcome, Discard)
    return Fence.LOST, "discarded", None


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
             state: str, *, lost_state: str | None = None) -> None:
    """``job_finished`` for a settled run, and ``job_dead`` when its write made the job dead
    (docs/observability.md, "Signals"). ``sender`` is the job's definition, or its name when
    none is registered here. ``lost_state``: the state of the row of a job the run lost, when
    the caller read it already."""
    if signals.job_finished.receivers:
        signals.send(signals.job_finished, sender, job=job, attempt=job.attempt,
                     outcome=attempt_outcome(engine, job, outcome, fence, lost_state=lost_state),
                     exception=getattr(outcome, "exception", None))
    if (signals.job_dead.receivers and state == "dead" and fence is not Fence.LOST
            and isinstance(outcome, Retry)):
        signals.send(signals.job_dead, sender, job=job, error=outcome.error)


def attempt_outcome(engine: Engine, job: ClaimedJob, outcome: Outcome, fence: Fence, *,
                    lost_state: str | None = None) -> str:
    """How the run ended, in the words of its attempt history (``records.ATTEMPT_OUTCOMES``)."""
    if fence is Fence.LOST:
        # Cancel and a lapsed lease look alike to the run (the fence no longer matches); the
        # row tells them apart: a cancel leaves it cancelled. Read only for a run that lost
        # its job, and only when someone listens (the worker's settle has read it already).
        if lost_state is not None:
            return "cancelled" if lost_state == "cancelled" else "lost"
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
