"""``@backfill`` declarations: validated when decorated, registered with the job that runs them.

No database: a bad declaration fails at import time, in the module that declares it.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_xjobs import Batch, backfill, registry
from django_xjobs.backfills import registry as backfill_registry
from django_xjobs.backfills.definition import count_total
from django_xjobs.backfills.provenance import checksum_of
from django_xjobs.checks import check_backfills
from django_xjobs.exceptions import ConfigurationError, UnknownBackfill


@pytest.fixture
def forget():
    names: list[str] = []
    yield names.append
    for name in names:
        backfill_registry.unregister(name)


def test_a_backfill_registers_the_job_that_runs_its_passes(forget):
    forget("unit.touch")

    @backfill("unit.touch", batch_size=250, queue="slow", max_attempts=7, throttle="100ms")
    def touch(ctx, cursor):
        return Batch(None, 0)

    assert backfill_registry.get("unit.touch") is touch
    assert (touch.batch_size, touch.queue, touch.max_attempts, touch.throttle) == (
        250, "slow", 7, 0.1)
    job = registry.get("backfill:unit.touch")
    assert (job.queue, job.max_attempts, job.timeout, job.is_async) == ("slow", 7, None, False)
    assert touch(None, None) == Batch(None, 0)  # the definition calls the function


def test_a_bare_backfill_is_named_like_a_job_and_runs_on_the_backfills_queue(forget):
    @backfill
    def tidy(ctx, cursor):
        return Batch(None, 0)

    forget(tidy.name)
    assert tidy.name == f"{__name__}.tidy"
    assert (tidy.queue, tidy.batch_size, tidy.using) == ("backfills", 1000, "default")
    assert registry.lookup(f"backfill:{tidy.name}") is not None


def test_unregister_forgets_the_backfill_and_its_job():
    @backfill("unit.gone")
    def gone(ctx, cursor):
        return Batch(None, 0)

    backfill_registry.unregister("unit.gone")

    assert registry.lookup("backfill:unit.gone") is None
    with pytest.raises(UnknownBackfill, match=r"No backfill named 'unit\.gone'"):
        backfill_registry.get("unit.gone")


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"batch_size": 0}, "batch_size must be an integer from 1"),
    ({"batch_size": True}, "batch_size must be an integer from 1"),
    ({"batch_size": 10_000_001}, "batch_size must be an integer from 1"),
    ({"batch_size": "100"}, "batch_size must be an integer from 1"),
    ({"queue": "no spaces"}, "Queue name 'no spaces' is not valid"),
    ({"throttle": "soon"}, "is not a duration"),
    ({"throttle": -1}, "must not be negative"),
    ({"throttle": "2h"}, "at most 3600s"),
    ({"max_attempts": 0}, "max_attempts must be an integer from 1"),
    ({"using": ""}, "using must be a database alias"),
    ({"total": 42}, "total must be a function"),
    ({"retries": 3}, "unknown option"),
])
def test_a_bad_declaration_is_refused_and_registers_nothing(kwargs, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        @backfill("unit.bad", **kwargs)
        def bad(ctx, cursor):
            return Batch(None, 0)

    assert backfill_registry.lookup("unit.bad") is None
    assert registry.lookup("backfill:unit.bad") is None


@pytest.mark.parametrize("name", ["", "has space", "x" * 192, "semi;colon"])
def test_a_bad_name_is_refused(name):
    with pytest.raises(ConfigurationError, match=r"Backfill name .* is not valid"):
        @backfill(name)
        def bad(ctx, cursor):
            return Batch(None, 0)


def test_a_name_of_191_characters_still_makes_a_valid_job_name(forget):
    name = "x" * 191
    forget(name)

    @backfill(name)
    def longest(ctx, cursor):
        return Batch(None, 0)

    assert registry.lookup("backfill:" + name) is not None


def test_an_async_backfill_is_refused():
    with pytest.raises(ConfigurationError, match="not async def"):
        @backfill("unit.async")
        async def run(ctx, cursor):
            return Batch(None, 0)


def test_a_name_that_is_not_a_string_is_refused():
    with pytest.raises(ConfigurationError, match="takes a name"):
        backfill(42)


def test_two_functions_cannot_share_a_backfill_name(forget):
    forget("unit.twice")

    @backfill("unit.twice")
    def first(ctx, cursor):
        return Batch(None, 0)

    with pytest.raises(ConfigurationError, match="already registered by"):
        @backfill("unit.twice")
        def second(ctx, cursor):
            return Batch(None, 1)

    assert backfill_registry.get("unit.twice") is first


def test_a_backfill_on_another_database_than_the_job_tables_is_a_system_check_warning(forget):
    forget("unit.elsewhere")

    @backfill("unit.elsewhere", using="replica")  # declared: importing its module still works
    def elsewhere(ctx, cursor):
        return Batch(None, 0)

    errors = [e for e in check_backfills() if "unit.elsewhere" in e.msg]
    assert [e.id for e in errors] == ["xjobs.W050"]
    assert "writes to database alias 'replica'" in errors[0].msg
    assert "XJOBS['DATABASE'] = 'default'" in errors[0].msg
    with override_settings(XJOBS={"DATABASE": "replica"}):
        assert not [e for e in check_backfills() if "unit.elsewhere" in e.msg]


def test_writing_to_the_job_tables_alias_is_accepted(forget):
    forget("unit.jobs_db")
    with override_settings(XJOBS={"DATABASE": "jobs"}):
        @backfill("unit.jobs_db", using="jobs")
        def on_jobs(ctx, cursor):
            return Batch(None, 0)

    assert on_jobs.using == "jobs"


def test_the_total_hook_is_declared_by_decorator_or_option(forget):
    forget("unit.counted")
    forget("unit.counted_too")

    @backfill("unit.counted")
    def counted(ctx, cursor):
        return Batch(None, 0)

    @counted.total
    def how_many():
        return 12

    @backfill("unit.counted_too", total=lambda: 3)
    def counted_too(ctx, cursor):
        return Batch(None, 0)

    assert count_total(counted) == (12, None)
    assert count_total(counted_too) == (3, None)


def test_a_total_hook_that_fails_or_lies_gives_no_total(forget):
    forget("unit.no_total")

    @backfill("unit.no_total")
    def no_total(ctx, cursor):
        return Batch(None, 0)

    assert count_total(no_total) == (None, None)
    no_total.total(lambda: -1)
    assert count_total(no_total) == (None, "total() returned -1, not an integer >= 0")
    no_total.total(lambda: {}["missing"])
    total, error = count_total(no_total)
    assert total is None and error.startswith("KeyError")


def _one(ctx, cursor):
    return Batch(None, 1)


def _two(ctx, cursor):
    return Batch(None, 2)


def test_the_checksum_is_the_hash_of_the_function_source():
    assert checksum_of(_one) == checksum_of(_one)
    assert checksum_of(_one) != checksum_of(_two)
    assert len(checksum_of(_one)) == 64


def test_a_function_without_source_still_gets_a_checksum_of_its_code():
    namespace: dict = {}
    exec("def f(ctx, cursor):\n    return 1\n", namespace)
    exec("def g(ctx, cursor):\n    return 2\n", namespace)

    assert checksum_of(namespace["f"]) != checksum_of(namespace["g"])


def test_batch_takes_its_fields_by_position_and_is_frozen():
    batch = Batch(100, 100)

    assert (batch.next_cursor, batch.processed) == (100, 100)
    with pytest.raises(AttributeError):
        batch.processed = 1  # type: ignore[misc]
