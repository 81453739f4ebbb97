"""The fenced write that settles one run, from the outcome its execution mapped to.

Shared by the worker loop (which acknowledges ``Done`` outcomes in batches itself) and the inline
test mode (django_xjobs/testing/inline.py), so a test sees the statements a worker sends.
"""

from __future__ import annotations

from ..engines import Engine
from ..records import ClaimedJob, Failure, Fence, Requeue
from .executor import Discard, GiveBack, Outcome, Retry, Suspended


def write_outcome(engine: Engine, job: ClaimedJob, outcome: Outcome) -> tuple[Fence, str]:
    """The fenced write of one outcome other than ``Done`` (acknowledged in batches by
    ``Worker._settle``); the fence's verdict and the state the job went to. Also the inline
    test mode's settle (django_xjobs/testing), so a test sees the statements a worker sends."""
    if isinstance(outcome, Retry):
        report, state = engine.job_fail_if_owned(Failure(
            claim=job.claim, error=outcome.error,
            retry_delay_ms=round(outcome.delay * 1000), permanent=outcome.permanent,
        ))
        return report.outcome(job.lease_token), state or "lost"
    if isinstance(outcome, GiveBack):
        report = engine.job_requeue_if_owned(Requeue(
            claim=job.claim, delay_ms=round(outcome.delay * 1000),
            spent_attempt=not job.resumed, resumed=job.resumed, note=outcome.note,
        ))
        return report.outcome(job.lease_token), "requeued"
    if isinstance(outcome, Suspended):
        return Fence.OWNED, "suspended"
    assert isinstance(outcome, Discard)
    return Fence.LOST, "discarded"
