"""A settled run lets go of its context (worker/runs.py, ``Run.let_go_of_ctx``): the pair is
freed at once, without the garbage collector, unless the job's code kept the context, which
then still reaches its run and the run it (docs/performance.md, "Where a job's time goes")."""

from __future__ import annotations

import gc
import weakref

import pytest

from django_xjobs.records import ClaimedJob
from django_xjobs.worker.runs import Run


def make_run() -> Run:
    job = ClaimedJob(id="j1", lease_token="t1", name="app.job", queue="default", input={},
                     run_id="r1", attempt=1, max_attempts=3, tenant_id=None, traceparent=None,
                     concurrency_key=None, resumed=False)
    return Run(job, None, 0.0, budget=1e9, on_unproven=lambda run, what: None)


@pytest.fixture
def no_collector():
    """Whatever is freed here is freed by its reference count alone."""
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()


def test_a_settled_run_and_its_context_are_freed_without_the_collector(no_collector):
    run = make_run()
    ctx = weakref.ref(run.ctx)

    run.let_go_of_ctx()

    # Nothing else held the context: it went at once, and with it its references to the run
    # (its callbacks), so the run is left to its own reference count.
    assert ctx() is None


def test_a_context_the_code_kept_still_reaches_its_run_and_the_run_it(no_collector):
    run = make_run()
    kept = run.ctx

    run.let_go_of_ctx()

    assert run.ctx is kept
    kept.prove_lease()  # the run's lease proof, through the context: still there
    run.ctx.stop("stopped after its settle")
    assert kept.cancelled.is_set() and kept.stop_reason == "stopped after its settle"


def test_without_letting_go_the_pair_waits_for_the_collector(no_collector):
    # Why let_go_of_ctx exists: the context's callbacks are the run's methods.
    run = make_run()
    ctx = weakref.ref(run.ctx)

    del run

    assert ctx() is not None
    gc.collect()
    assert ctx() is None
