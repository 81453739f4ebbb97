"""Jobs the test suite runs in real workers. Each records what happened in ``Effect`` rows."""

import asyncio
import logging
import os
import time
import uuid
from datetime import timedelta

from django.db.models import F

from django_xjobs import (
    Batch,
    ChildFailed,
    Concurrency,
    PauseKey,
    PermanentError,
    Retry,
    Snooze,
    backfill,
    job,
)

from .models import Counted, Effect


def _effect(ctx, kind, tag=""):
    Effect.objects.create(job_id=ctx.job_id, name=ctx.name, attempt=ctx.attempt,
                          pid=os.getpid(), kind=kind, tag=str(tag))


@job
def noop(ctx, **kwargs):
    return None


@job
def record(ctx, tag="", **kwargs):
    _effect(ctx, "start", tag)
    return {"tag": tag, "attempt": ctx.attempt}


@job
def sleepy(ctx, seconds=1.0, tag=""):
    _effect(ctx, "start", tag)
    time.sleep(seconds)  # the job's work: it runs for `seconds`
    _effect(ctx, "end", tag)
    return {"slept": seconds}


@job
def sleepy_polite(ctx, seconds=1.0, tag=""):
    """Sleeps, but returns early when asked to stop."""
    _effect(ctx, "start", tag)
    ctx.cancelled.wait(seconds)
    _effect(ctx, "end", tag)
    return {"stopped": ctx.cancelled.is_set()}


@job(max_attempts=5)
def flaky(ctx, fail_times=1):
    _effect(ctx, "start")
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"succeeded_on": ctx.attempt}


@job(max_attempts=2)
def always_fails(ctx):
    _effect(ctx, "start")
    raise ValueError("this job always fails")


@job
def permanent(ctx):
    _effect(ctx, "start")
    raise PermanentError("no point retrying")


@job
def snoozer(ctx, times=1):
    _effect(ctx, "start")
    if Effect.objects.filter(job_id=ctx.job_id).count() <= times:
        raise Snooze(0.05)
    return {"attempt": ctx.attempt}


@job(max_attempts=3)
def crash(ctx):
    _effect(ctx, "start")
    os._exit(1)


@job(timeout=0.5, max_attempts=2)
def too_slow(ctx):
    _effect(ctx, "start")
    time.sleep(3)  # the job's work, past its timeout
    _effect(ctx, "end")


@job
def bad_result(ctx):
    return {"when": object()}


class Unprintable:
    """A value whose repr() raises (a model whose __str__ reads a deleted row, say)."""

    def __repr__(self):
        raise RuntimeError("repr exploded")


@job
def unprintable_result(ctx):
    return {"x": Unprintable()}


@job
async def async_unprintable_result(ctx):
    return {"x": Unprintable()}


@job
async def async_record(ctx, tag=""):
    await asyncio.sleep(0.01)
    return {"tag": tag, "async": True}


@job(timeout=0.3, max_attempts=1)
async def async_too_slow(ctx):
    await asyncio.sleep(5)


@job(queue="other")
def on_other_queue(ctx):
    return "other"


@job
def sleepy_tagged(ctx, seconds=1.0, later=None):
    """Like ``sleepy``, but each run draws a nonce, records it in its Effect rows and returns it:
    the job's stored result then says which run's acknowledgement was written. ``later``, when
    given, is how long every run after the job's first one sleeps (a rescue need not be slow)."""
    run = uuid.uuid4().hex
    _effect(ctx, "start", run)
    first = Effect.objects.filter(job_id=ctx.job_id, kind="start").count() == 1
    time.sleep(seconds if later is None or first else later)  # the job's work
    _effect(ctx, "end", run)
    return {"run": run}


@job(max_attempts=3)
def held_transaction(ctx, seconds=1.0):
    """Holds a transaction open for ``seconds`` between two Effect rows (autocommit): behind a
    transaction pooler, one server connection is this run's all along (tests/acceptance/
    test_pooler.py terminates it)."""
    from django.db import connection, transaction

    _effect(ctx, "start")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("select 1")  # the transaction has begun on the server
        time.sleep(seconds)  # the job's work, its transaction open
    _effect(ctx, "end")
    return {"held": seconds}


@job(max_attempts=3, retry_base="30s", retry_cap="60s")
def fails_with_long_backoff(ctx):
    """Fails every time, with a backoff long enough that the retry is still delayed afterwards."""
    _effect(ctx, "start")
    raise RuntimeError(f"failure on attempt {ctx.attempt}")


@job
def trace_probe(ctx):
    """Reports the trace context the worker gave this run."""
    from django_xjobs import tracing

    return {"traceparent": ctx.traceparent, "inside": tracing.current_traceparent()}


# ---------------------------------------------------------------------------- durable steps --


@job(max_attempts=5)
def three_steps(ctx, fail_third_times=2):
    """Steps 1 and 2 always succeed; step 3 fails on the first ``fail_third_times`` attempts."""
    first = ctx.step.run("first", lambda: _effect(ctx, "step", "first") or {"n": 1})
    second = ctx.step.run("second", lambda: _effect(ctx, "step", "second") or {"n": 2})

    def third():
        _effect(ctx, "step", "third")
        if ctx.attempt <= fail_third_times:
            raise RuntimeError(f"third step fails on attempt {ctx.attempt}")
        return {"n": 3}

    return [first, second, ctx.step.run("third", third)]


@job(max_attempts=1)
def dead_then_done(ctx):
    """A durable step, then the first run fails for good (the job goes dead); a run after an
    operator's retry finds the step's memo and finishes. Every run records its start."""
    first = not Effect.objects.filter(job_id=ctx.job_id, kind="start").exists()
    _effect(ctx, "start")
    charged = ctx.step.run("charge", lambda: _effect(ctx, "step", "charge") or {"charged": 1})
    if first:
        raise PermanentError("the first run fails after its step")
    return {"charged": charged, "attempt": ctx.attempt}


@job
def sleeper(ctx, seconds=1.0, tag=""):
    ctx.step.run("before", lambda: _effect(ctx, "before", tag))
    ctx.step.sleep("nap", seconds)
    ctx.step.run("after", lambda: _effect(ctx, "after", tag))
    return {"slept": seconds}


@job(max_attempts=1)
def many_naps(ctx, naps=50):
    for i in range(naps):
        ctx.step.sleep(f"nap-{i}", 0.001)
    return {"naps": naps, "attempt": ctx.attempt}


@job
def waiter(ctx, event="order.paid", key=None, timeout=30.0):
    payload = ctx.step.wait_for_event("wait", event=event, correlation_key=key, timeout=timeout)
    _effect(ctx, "resumed", key or "")
    return {"payload": payload}


@job
def two_waits(ctx, event="order.paid", key=None, timeout=30.0):
    first = ctx.step.wait_for_event("first", event=event, correlation_key=key, timeout=timeout)
    second = ctx.step.wait_for_event("second", event=event, correlation_key=key, timeout=timeout)
    return [first, second]


@job
def any_waiter(ctx, events=("a", "b"), key=None, timeout=30.0):
    won = ctx.step.wait_for_any("race", events=list(events), correlation_key=key,
                                timeout=timeout)
    return None if won is None else {"event": won.event, "payload": won.payload}


@job(max_attempts=3)
def step_then_hang(ctx, seconds=30.0):
    """Step 1 commits, then the run hangs (a test kills its worker here)."""
    ctx.step.run("first", lambda: _effect(ctx, "step", "first") or {"done": "first"})
    if ctx.attempt == 1:
        time.sleep(seconds)  # the first run's work: its worker is killed here
    ctx.step.run("second", lambda: _effect(ctx, "step", "second") or {"done": "second"})
    return {"attempt": ctx.attempt}


@job(max_attempts=3)
def two_steps(ctx):
    """Two steps with an effect each. Every run records when its code is through ("exit"), a
    stopped run too: a test knows when a resumed run has done all it was going to do."""
    try:
        ctx.step.run("first", lambda: _effect(ctx, "step", "first") or {"done": "first"})
        ctx.step.run("second", lambda: _effect(ctx, "step", "second") or {"done": "second"})
        return {"attempt": ctx.attempt}
    finally:
        _effect(ctx, "exit")


@job(max_attempts=3)
async def async_two_steps(ctx):
    """``two_steps`` as an ``async def`` job."""
    def body(tag):
        async def step():
            await asyncio.to_thread(_effect, ctx, "step", tag)
            return {"done": tag}
        return step

    try:
        await ctx.step.run("first", body("first"))
        await ctx.step.run("second", body("second"))
        return {"attempt": ctx.attempt}
    finally:
        # Shielded: a stopped run's task is cancelled, and the record must be written anyway.
        await asyncio.shield(asyncio.to_thread(_effect, ctx, "exit"))


@job
async def async_record_effect(ctx, tag=""):
    await asyncio.to_thread(_effect, ctx, "start", tag)
    return {"tag": tag, "attempt": ctx.attempt}


@job
def big_result(ctx, size=0):
    return {"blob": "x" * size}


@job(max_attempts=2)
def big_step_output(ctx, size=0):
    ctx.step.run("small", lambda: _effect(ctx, "step", "small") or {"n": 1})
    ctx.step.run("fetch", lambda: _effect(ctx, "step", "fetch") or {"blob": "x" * size})
    return {"size": size}


@job
def reused_step_name(ctx):
    ctx.step.run("same", lambda: 1)
    ctx.step.run("same", lambda: 2)


@job
def non_json_step(ctx):
    ctx.step.run("bad", lambda: object())


@job
async def async_steps(ctx, event="async.go", key=None):
    async def fetch():
        await asyncio.sleep(0)
        return {"fetched": True}

    fetched = await ctx.step.run("fetch", fetch)
    await ctx.step.sleep("pause", 0.2)
    got = await ctx.step.wait_for_event("go", event=event, correlation_key=key, timeout=30)
    return {"fetched": fetched, "got": got}


@job
async def async_one_step(ctx, n=0):
    return {"v": await ctx.step.run("one", lambda: n)}


@job
def sleep_in_atomic(ctx):
    from django.db import transaction

    ctx.step.run("before", lambda: 1)
    with transaction.atomic():
        ctx.step.sleep("nap", 60)


@job
def wait_in_atomic(ctx):
    from django.db import transaction

    with transaction.atomic():
        ctx.step.wait_for_event("wait", event="never.sent", timeout=60)


@job
def step_loop(ctx, steps=100, pause=0.05):
    for i in range(steps):
        ctx.step.run(f"s{i}", lambda i=i: time.sleep(pause) or i)  # each step's work
    return {"steps": steps}


# -------------------------------------------------------------------------------- backfills --


def count_batch(ctx, cursor):
    """A keyset batch over Counted: hits + 1 on the next ctx.batch_size rows after the cursor.
    Not idempotent on purpose: a batch committed twice shows as hits = 2."""
    ids = list(Counted.objects.filter(pk__gt=cursor or 0).order_by("pk")
               .values_list("pk", flat=True)[: ctx.batch_size])
    Counted.objects.filter(pk__in=ids).update(hits=F("hits") + 1)
    poisoned = Counted.objects.filter(pk__in=ids, poison=True).values_list("pk", flat=True)
    if poisoned:  # raised after the update: the rollback must undo it
        raise ValueError(f"poisoned row {poisoned[0]} in the batch after cursor {cursor}")
    return Batch(ids[-1] if len(ids) == ctx.batch_size else None, len(ids))


@backfill("testapp.count_rows", batch_size=100, max_attempts=10)
def count_rows(ctx, cursor):
    return count_batch(ctx, cursor)


@count_rows.total
def count_rows_total():
    return Counted.objects.count()


@backfill("testapp.count_rows_once", batch_size=100, max_attempts=1)
def count_rows_once(ctx, cursor):
    """count_rows whose pass goes dead at its first failure."""
    return count_batch(ctx, cursor)


@backfill("testapp.bad_batch", max_attempts=1)
def bad_batch(ctx, cursor):
    Counted.objects.update(hits=F("hits") + 1)
    return {"next": None}  # not a Batch


@backfill("testapp.enqueue_per_batch", batch_size=50, max_attempts=1)
def enqueue_per_batch(ctx, cursor):
    """Enqueues one job per batch inside the batch: it commits (or not) with the batch."""
    batch = count_batch(ctx, cursor)
    record.enqueue(tag=f"after:{cursor}")
    return batch
# ---- outbox ----
@job
def stage_child(ctx, tag=""):
    """Stages a `record` job with enqueue_on_commit: relayed once this run's work commits."""
    _effect(ctx, "start", tag)
    return {"staged": str(record.enqueue_on_commit(tag=f"child of {tag}").id)}


# ---------------------------------------------------------------------------------- pauses --


@job(concurrency=Concurrency(key="partner:{partner}", limit=5))
def partner_call(ctx, partner, trip=False, pause_seconds=60.0):
    """Calls a partner: with ``trip``, its first run answers as if the partner returned 429 and
    pauses the partner's key (a circuit breaker); every other run returns."""
    _effect(ctx, "start", partner)
    first = Effect.objects.filter(job_id=ctx.job_id, kind="start").count() == 1
    if trip and first:
        raise PauseKey(f"partner:{partner}", for_=timedelta(seconds=pause_seconds),
                       reason="429 from partner")
    return {"partner": partner, "attempt": ctx.attempt}


# ------------------------------------------------------------------------ concurrency slots --


@job(concurrency=Concurrency(key="slot:{group}", limit=2))
def slotted(ctx, group, seconds=0.2, later=None):
    """Records its start and end (tag "<group>|<run nonce>") and returns the nonce, so the
    stored result says which run's acknowledgement was written. ``later``, when given, is how
    long every run after the job's first one sleeps."""
    run = uuid.uuid4().hex
    _effect(ctx, "start", f"{group}|{run}")
    first = Effect.objects.filter(job_id=ctx.job_id, kind="start").count() == 1
    time.sleep(seconds if later is None or first else later)  # the job's work
    _effect(ctx, "end", f"{group}|{run}")
    return {"run": run, "attempt": ctx.attempt}


@job(concurrency=Concurrency(key="tenant:{tenant_id}", limit=2))
def per_tenant(ctx, n=0):
    return {"tenant": ctx.tenant_id, "n": n}


@job(concurrency=Concurrency(key="nap:{group}", limit=1))
def slotted_sleeper(ctx, group, seconds=0.5):
    """Holds its key's only slot, then sleeps durably (releasing it), then finishes."""
    ctx.step.run("before", lambda: _effect(ctx, "before", group))
    ctx.step.sleep("nap", seconds)
    ctx.step.run("after", lambda: _effect(ctx, "after", group))
    return {"group": group}


@job(concurrency=Concurrency(key="slowslot:{group}", limit=1))
def slotted_polite(ctx, group, seconds=30.0):
    """Holds its slot until asked to stop; records why it stopped."""
    _effect(ctx, "start", group)
    ctx.cancelled.wait(seconds)
    _effect(ctx, "end", ctx.stop_reason or "")
    try:
        ctx.check_cancelled()
    except Exception as exc:
        _effect(ctx, "raised", type(exc).__name__)
        raise
    return {"stopped": False}


@job(concurrency=Concurrency(key="outcome:{group}", limit=1), timeout=1.0, max_attempts=2)
def slotted_outcome(ctx, group, outcome="done"):
    """Ends its run the way ``outcome`` says: done, fail, permanent, snooze (once), timeout."""
    _effect(ctx, "start", outcome)
    if outcome == "fail":
        raise RuntimeError("slotted failure")
    if outcome == "permanent":
        raise PermanentError("slotted permanent failure")
    if outcome == "snooze" and Effect.objects.filter(job_id=ctx.job_id).count() == 1:
        raise Snooze(0.05)
    if outcome == "timeout":
        time.sleep(3)  # the job's work, past its timeout
    return {"outcome": outcome}


@job(concurrency=Concurrency(key="stepslot:{group}", limit=1))
def slotted_step(ctx, group, seconds=1.0):
    """One durable step, slow on its first execution only."""

    def work():
        first = not Effect.objects.filter(job_id=ctx.job_id, kind="work").exists()
        time.sleep(seconds if first else 0)  # the step's work, slow the first time
        _effect(ctx, "work", group)
        return {"worked": True}

    return ctx.step.run("work", work)


# ------------------------------------------------------------ flow control under faults --
# tests/acceptance/test_flow_fleet.py: every run records its start and end (tag
# "<group>|<run nonce>") and returns its nonce, so the stored result says which run was kept.


from django_xjobs import RateLimit  # noqa: E402


def _timed_run(ctx, group, seconds, later):
    run = uuid.uuid4().hex
    _effect(ctx, "start", f"{group}|{run}")
    first = Effect.objects.filter(job_id=ctx.job_id, kind="start").count() == 1
    time.sleep(seconds if later is None or first else later)  # the run's work
    _effect(ctx, "end", f"{group}|{run}")
    return {"run": run, "attempt": ctx.attempt}


@job(concurrency=Concurrency(key="fleetslot:{group}", limit=2), max_attempts=20)
def fleet_slotted(ctx, group, seconds=0.2, later=None):
    """Like ``slotted``, with attempts to spare for the crashes the fleet tests inflict."""
    return _timed_run(ctx, group, seconds, later)


@job(concurrency=Concurrency(key="handover:{group}", limit=1))
def fleet_handover(ctx, group, seconds=0.05):
    """One at a time per group: each run's end hands the key's only slot to the next job."""
    time.sleep(seconds)  # the run's work, holding the key's slot
    return {"group": group}


@job(rate_limit=RateLimit(key="partner", limit=50, period=timedelta(seconds=1)))
def fleet_rated(ctx, n=0):
    """Does nothing: only when it starts matters (at most 50 a second, fleet-wide)."""
    return None


@job(rate_limit=RateLimit(key="slowpartner", limit=2, period=timedelta(seconds=1)),
     max_attempts=5)
def fleet_rated_slow(ctx, group, seconds=0.1, later=None):
    """A rate-limited run that can be made to hang on its first run (``later``)."""
    return _timed_run(ctx, group, seconds, later)


# -------------------------------------------------------------------------------- progress --


@job
def reports_progress(ctx, items=60, pause=0.1):
    """Works through ``items`` items, ``pause`` seconds each, reporting after each one."""
    for i in range(1, items + 1):
        time.sleep(pause)  # the work on one item
        ctx.progress(i, items, f"item {i} of {items}")
    return {"items": items}


# ------------------------------------------------------------------------------ child jobs --
# docs/durable.md, "Child jobs".


@job(max_attempts=2)
def child_square(ctx, n, fail=False, seconds=0.0):
    """A child: n squared, after ``seconds``; raises when ``fail`` (up to its attempts)."""
    _effect(ctx, "child", n)
    if seconds:
        ctx.cancelled.wait(seconds)
    if fail:
        raise RuntimeError(f"child {n} failed")
    return {"n": n, "square": n * n}


@job(max_attempts=1)
def parent_invoke(ctx, n=3, fail=False, seconds=0.0, timeout=None):
    """Invokes one child and returns what it gave, or the ChildFailed it raised."""
    _effect(ctx, "parent", "start")
    try:
        got = ctx.step.invoke("square", child_square, {"n": n, "fail": fail, "seconds": seconds},
                              timeout=timeout)
    except ChildFailed as exc:
        _effect(ctx, "parent", "failed")
        return {"failed": str(exc), "child_id": exc.child_id, "state": exc.state,
                "error": exc.error}
    after = ctx.step.run("after", lambda: got["square"] + 1)
    return {"got": got, "after": after, "tenant": ctx.tenant_id}


@job(max_attempts=1)
def parent_gather(ctx, count=5, fail_at=None, queue=None):
    """Fans out ``count`` children and returns their squares in order."""
    calls = [(child_square, {"n": i, "fail": i == fail_at},
              {"queue": queue} if queue else {}) for i in range(count)]
    results = ctx.step.gather("fan", calls)
    return {"squares": [r["square"] for r in results]}


@job(max_attempts=1)
async def parent_gather_async(ctx, count=3):
    results = await ctx.step.gather("fan", [(child_square, {"n": i}) for i in range(count)])
    return {"squares": [r["square"] for r in results]}


@job(max_attempts=1)
def charge_card(ctx, order):
    """A child that fails for good while its order's flag row exists (an Effect of kind
    "decline" tagged with the order): the cause an operator fixes before resuming."""
    _effect(ctx, "charge", order)
    if Effect.objects.filter(kind="decline", tag=str(order)).exists():
        raise PermanentError("amount over the card limit")
    return {"charged": order}


@job(max_attempts=2)
def checkout(ctx, order, orders=()):
    """A workflow (docs/durable.md, "Repairing a dead workflow"): a step, a child (or, with
    ``orders``, a gather of one child per order), a step."""
    ctx.step.run("reserve", lambda: _effect(ctx, "step", "reserve") or {"reserved": order})
    if orders:
        charged = ctx.step.gather("charge", [(charge_card, {"order": o}) for o in orders])
    else:
        charged = ctx.step.invoke("charge", charge_card, {"order": order})
    ctx.step.run("ship", lambda: _effect(ctx, "step", "ship") or {"shipped": order})
    return {"charged": charged}


@job(max_attempts=1)
def checkout_batch(ctx, order):
    """A workflow whose child is a workflow (checkout): a resume goes down to the grandchild."""
    return ctx.step.invoke("checkout", checkout, {"order": order})


@job(max_attempts=1)
def parent_of_parent(ctx):
    """A parent whose child is itself a parent (cancel reaches the grandchild)."""
    return ctx.step.invoke("inner", parent_invoke, {"n": 2, "seconds": 30.0})


# ---- deploy check ---- (tests/*/test_deploy_check.py)
# The code of these jobs is picked by XJOBS_TEST_FLOW_VERSION, read at every call: a worker runs
# version A until the run suspends, then `manage.py xjobs check-deploy` replays it against
# another version, as a deploy of new code would.


def _flow_version():
    return os.environ.get("XJOBS_TEST_FLOW_VERSION", "A")


@job
def deploy_flow(ctx, nap=3600.0):
    version = _flow_version()
    if version == "B":  # step "a" renamed
        ctx.step.run("a-renamed", lambda: {"n": 1})
    elif version == "kind":  # step "a" is now a sleep
        ctx.step.sleep("a", 1)
    else:
        first = ctx.step.run("a", lambda: _effect(ctx, "step", "a") or {"n": 1})
        if first != {"n": 1}:  # the recorded output is handed back, so never taken
            ctx.step.run("a-was-not-replayed", lambda: None)
    if version == "early":
        return "early"
    if version == "raise":
        raise ValueError("the new code breaks before the nap")
    if version == "C":  # writes between steps (a replay rolls them back) and changes the tail
        _effect(ctx, "outside", "C")
        record.enqueue(tag="from-the-replay")
    ctx.step.sleep("nap", nap)
    if version == "C":
        ctx.step.run("after-v2", lambda: _effect(ctx, "step", "after-v2"))
        ctx.step.run("extra", lambda: None)
    else:
        ctx.step.run("after", lambda: _effect(ctx, "step", "after"))
    return version


@job
async def async_deploy_flow(ctx):
    if _flow_version() == "B":
        await ctx.step.run("a-renamed", lambda: {"n": 1})
    else:
        await ctx.step.run("a", lambda: {"n": 1})
    await ctx.step.sleep("nap", 3600)
    return "done"


@job
def deploy_children(ctx):
    """Child jobs replayed: the path to the later steps depends on what invoke and gather hand
    back, so a replay that handed back something else would diverge."""
    one = ctx.step.invoke("one", record, {"tag": "one"})
    try:
        many = ctx.step.gather("many", [(record, {"tag": "x"}), (record, {"tag": "y"})])
        label = "all-" + "-".join(str(r) for r in many)
    except ChildFailed as exc:
        label = f"failed-{exc.index}-{exc.state}-{exc.child_id}"
    ctx.step.run(f"got-{one}-{label}", lambda: None)
    if _flow_version() == "kind":
        ctx.step.sleep("last", 1)
    else:
        ctx.step.invoke("last", record, {"tag": "last"})
    return "done"


@job
def deploy_loose(ctx):
    """Catches everything, the end of a replay included: the verdict still stands."""
    for name in ("first", "second"):
        try:
            ctx.step.run(name, lambda: None)
        except BaseException:  # what the test is about: even the end of the replay
            pass
    return "done"
# ---- end deploy check ----


# ------------------------------------------------------------------- inside a live application --
# tests/acceptance/test_live_application.py: many short runs, some under a slot, some children.


@job
def nap(ctx, ms=10):
    """Sleeps ``ms`` milliseconds and writes nothing: the stress's plain job."""
    time.sleep(ms / 1000)  # the job's work
    return ms


@job(concurrency=Concurrency(key="napslot:{group}", limit=2))
def slotted_nap(ctx, group, ms=10):
    """``nap`` under a slot of its group (limit 2)."""
    time.sleep(ms / 1000)  # the job's work, holding its slot
    return ms


@job(max_attempts=1)
def nap_parent(ctx, count=10, ms=10):
    """Gathers ``count`` naps as children."""
    return sum(ctx.step.gather("naps", [(nap, {"ms": ms}) for _ in range(count)]))


# ------------------------------------------------------------------------- worker recycling --
# tests/acceptance/test_worker_recycling.py: a job whose process keeps what it allocated.

_HOARD = []  # lives as long as the worker process, as a leak would


@job
def hoard(ctx, mib=0):
    """Keeps ``mib`` MiB more in this process (written, so resident), then records its run."""
    _HOARD.append(b"x" * (mib * 1024 * 1024))
    _effect(ctx, "start", mib)
    return {"pid": os.getpid()}


# --------------------------------------------------------------------------------- logging --
# tests/acceptance/test_worker_logs.py: what a job's lines, and the worker's about it, carry.

module_log = logging.getLogger(__name__)


@job(max_attempts=2)
def logs_then_retries(ctx, order_id=0):
    """Logs through ctx.logger and through its module's logger, then fails, asking for its
    next attempt in ten minutes (a delay of its own: the retry line's is known)."""
    ctx.logger.info("charging order %s", order_id)
    module_log.info("order %s: card service called", order_id)
    raise Retry(600) from RuntimeError(f"card service down on attempt {ctx.attempt}")
