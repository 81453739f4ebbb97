"""The upgrade test's jobs, written against the API every version in tests/upgrade/baselines.py
has (``@job``, ``Concurrency(key, limit)``, ``ctx.step.run`` and ``ctx.step.wait_for_event``).

Each records every execution in ``Execution`` (models.py) so the driver can tell a job or a
step body run twice from one run once.
"""

import os
import time

from django_xjobs import Concurrency, job

from .models import Execution

SIDE_ENV = "XJOBS_UPGRADE_SIDE"  # "old" or "new": set by the driver on each process it starts
RESUME_EVENT = "upgrade.resume"  # published by the driver once every durable run is suspended


def _record(ctx, what, by):
    Execution.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, what=what, by=by,
                             side=os.environ.get(SIDE_ENV, "?"), pid=os.getpid())


@job(queue="upgrade")
def plain(ctx, by, n):
    _record(ctx, "run", by)
    return {"n": n}


@job(queue="upgrade", concurrency=Concurrency(key="upgrade:{group}", limit=1))
def limited(ctx, by, n, group):
    """One run at a time per group: more ready than the limit allows, so claims skip or park
    them. The short sleep is the job's work, which keeps its slot taken."""
    _record(ctx, "run", by)
    time.sleep(0.01)  # the job's work: its slot stays taken while more of its group wait
    return {"n": n}


@job(queue="upgrade")
def durable(ctx, by, n):
    """A step, a wait for the driver's event (the run suspends), a step after it."""
    ctx.step.run("before", lambda: _record(ctx, "step:before", by))
    ctx.step.wait_for_event("resume", event=RESUME_EVENT, timeout=3600)
    ctx.step.run("after", lambda: _record(ctx, "step:after", by))
    return {"n": n}
