"""The fenced write that settles one run, from the outcome its execution mapped to.

Shared by the worker loop (which acknowledges ``Done`` outcomes in batches itself) and the inline
test mode (django_xjobs/testing/inline.py), so a test sees the statements a worker sends.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .. import signals
from ..engines import Engine
from ..pauses import MAX_REASON
from ..records import ClaimedJob, Failure, Fence, KeyPauseRequeue, Requeue, UnknownGiveBack
from .executor import Discard, Done, GiveBack, KeyPaused, Outcome, Retry, Suspended, UnknownName

log = logging.getLogger("django_xjobs.worker")


def write_outcome(engine: Engine, job: ClaimedJob, outcome: Outcome) -> tuple[Fence, str]:
    """The fenced write of one outcome other than ``Done`` (acknowledged in batches by
    ``Worker._settle``); the fence's verdict and the state the job went to. Also the inline
    test mode's settle (django_xjobs/testing), so a test sees the statements a worker sends."""
    if isinstance(outcome, Retry):
        report, state = engine.job_fail_if_owned(Failure(
            claim=job.claim, error=outcome.error,
            # Rounded up: a backoff drawn under half a millisecond still makes the retry wait
            # (`delayed`), instead of reading as no backoff at all.
            retry_delay_ms=math.ceil(outcome.delay * 1000), permanent=outcome.permanent,
            outcome=outcome.outcome,
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
