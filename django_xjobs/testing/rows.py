"""What a test reads and moves in the job table: ``enqueued_jobs``, ``assert_enqueued``,
``travel``.

All three run on the caller's connection for ``XJOBS["DATABASE"]``, so inside a ``TestCase``
(or pytest-django's ``db``) they see and change the test's own uncommitted rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from .. import registry, values
from ..decorator import BoundJob
from ..engines import get_engine
from ..exceptions import InvalidJobInput
from ..records import ALL_STATES, JobRecord

# Jobs listed by a failing assert_enqueued: enough to see what happened, not a wall of text.
REPORT_ROWS = 20
# Values equal to another only of their own type (_same).
_SAME_TYPE_ONLY = (bool, *values.TYPED_TYPES)


def enqueued_jobs(job: Any = None, *, queue: str | None = None,
                  state: str | Iterable[str] | None = None,
                  tenant_id: str | None = None) -> list[JobRecord]:
    """The jobs in the table, oldest first, in any state unless ``state`` says (one state or
    several); ``job`` is a registered job (the ``@job`` function) or its name. Every filter is
    optional; ``tenant_id=None`` means any tenant."""
    name = job_name(job) if job is not None else None
    if queue is not None:
        values.check_name("queue", queue)
    if tenant_id is not None:
        values.check_text("tenant_id", tenant_id)
    return get_engine().jobs_list(name=name, queue=queue, states=_states(state),
                                  tenant_id=tenant_id)


def assert_enqueued(job: Any, /, **input: Any) -> JobRecord:
    """Pass when a job of ``job`` (a registered job or its name) exists, in any state, whose
    input includes ``input``: every given keyword is in the job's input with an equal JSON
    value (other keywords of the job are not compared; nested values are compared whole).
    Returns the oldest such job. Fails with an ``AssertionError`` that lists what IS there.

    Any state, not only live ones: in the inline test mode, and after ``drain()``, the job has
    already run by the time the test asks."""
    name = job_name(job)
    # Compared as stored: a tuple is a list in JSON, and a value JSON cannot hold is an error
    # in the test, not a mismatch.
    expected = values.decode_json(values.encode_json(input, what=f"expected input of {name}",
                                                     limit=None))
    engine = get_engine()
    same_name = engine.jobs_list(name=name)
    for record in same_name:
        if isinstance(record.input, dict) and _includes(record.input, expected):
            return record
    wanted = f"with input including {_json(expected)}" if expected else "(any input)"
    if same_name:
        lines = [f"assert_enqueued: no job {name} {wanted}; its jobs ({len(same_name)}):"]
        lines += [f"  {r.state:<9} {_json(r.input)}" for r in same_name[:REPORT_ROWS]]
    else:
        others = engine.jobs_list(limit=REPORT_ROWS + 1)
        lines = [f"assert_enqueued: no job {name} {wanted}; "
                 + ("other jobs:" if others else "no job is enqueued at all")]
        lines += [f"  {r.name} {r.state:<9} {_json(r.input)}" for r in others[:REPORT_ROWS]]
        if len(others) > REPORT_ROWS:
            lines.append("  ...")
    if len(same_name) > REPORT_ROWS:
        lines.append("  ...")
    raise AssertionError("\n".join(lines))


def travel(delta: timedelta | float) -> int:
    """Make waiting jobs due as if ``delta`` (a timedelta or seconds) had passed: delays,
    retry backoffs, snoozes, and the wake-ups and timeouts of durable sleeps and event waits
    all come ``delta`` earlier. No clock is touched; the rows the claim reads move (the claim
    compares them with the database clock). Returns how many jobs moved. Nothing runs here:
    :func:`~django_xjobs.testing.drain` runs what is due."""
    return get_engine().jobs_shift_due(values.milliseconds_of(delta, "travel delta"))


# ------------------------------------------------------------------------------- helpers --


def job_name(job: Any) -> str:
    """The registered name of ``job``: a ``@job`` function, ``my_job.using(...)``, or a name
    (which must be registered: a typo fails here instead of matching nothing)."""
    if isinstance(job, registry.JobDefinition):
        return job.name
    if isinstance(job, BoundJob):
        return job.definition.name
    if isinstance(job, str):
        return registry.get(job).name
    raise InvalidJobInput(
        f"expected a registered job (the @job function) or its name, got {values.safe_repr(job)}"
    )


def _states(state: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if state is None:
        return None
    states = (state,) if isinstance(state, str) else tuple(state)
    bad = [s for s in states if s not in ALL_STATES]
    if bad or not states:
        raise InvalidJobInput(
            f"state must be one of {', '.join(ALL_STATES)} (or several of them), got {state!r}"
        )
    return states


def _includes(actual: dict[str, Any], expected: dict[str, Any]) -> bool:
    return all(key in actual and _same(actual[key], value) for key, value in expected.items())


def _same(a: Any, b: Any) -> bool:
    """JSON equality: unlike ``==``, ``True`` is not ``1``, nor ``Decimal(1)``, nor a
    datetime a date."""
    if isinstance(a, _SAME_TYPE_ONLY) or isinstance(b, _SAME_TYPE_ONLY):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _json(value: Any) -> str:
    # A typed value (a datetime, a Decimal, ...) as its repr: what the test would write.
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)
