"""``@job``: names, validation at decoration time, duplicates, async detection (registry.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_xjobs import api, job, registry
from django_xjobs.exceptions import (
    ConfigurationError,
    DuplicateJobName,
    InvalidJobInput,
    UnknownJob,
)
from tests.testapp import jobs as testapp_jobs


@pytest.fixture(autouse=True)
def isolated_registry():
    """Whatever a test registers is forgotten afterwards; the test app's jobs stay as they were."""
    before = registry.all_jobs()
    yield
    for name in set(registry.all_jobs()) - set(before):
        registry.unregister(name)
    for name, definition in before.items():
        if registry.lookup(name) is not definition:
            registry.unregister(name)
            registry.register(definition)


# ---------------------------------------------------------------------------------- names --


def test_a_job_in_an_installed_app_is_named_app_label_dot_function():
    assert testapp_jobs.record.name == "testapp.record"
    assert testapp_jobs.async_record.name == "testapp.async_record"
    assert registry.get("testapp.record") is testapp_jobs.record


def test_autodiscovery_registered_the_test_apps_jobs():
    names = set(registry.all_jobs())
    assert {"testapp.noop", "testapp.flaky", "testapp.on_other_queue"} <= names


def test_a_job_outside_any_installed_app_is_named_by_its_module_path():
    @job
    def stray(ctx):
        return None

    assert stray.name == f"{__name__}.stray"
    assert __name__ == "tests.unit.test_registry"  # no installed app contains this module
    assert registry.lookup(f"{__name__}.stray") is stray


def test_an_explicit_name_wins():
    @job(name="billing.charge-card:v2")
    def charge(ctx):
        return None

    assert charge.name == "billing.charge-card:v2"
    assert registry.lookup("billing.charge-card:v2") is charge
    assert registry.lookup(f"{__name__}.charge") is None


def test_decorator_options_are_recorded():
    @job(name="t.options", queue="emails", max_attempts=7, timeout=timedelta(minutes=2),
         priority=-3, retry_base="500ms", retry_cap="1m")
    def f(ctx):
        return None

    assert (f.queue, f.max_attempts, f.timeout, f.priority) == ("emails", 7, 120.0, -3)
    assert (f.retry.base, f.retry.cap) == (0.5, 60.0)


def test_defaults_defer_to_the_settings():
    @job(name="t.defaults")
    def f(ctx):
        return None

    assert (f.queue, f.max_attempts, f.timeout, f.priority) == ("default", None, None, 0)
    assert (f.retry.base, f.retry.cap) == (None, None)


def test_calling_the_job_calls_the_function():
    @job(name="t.callable")
    def add(ctx, a, b):
        return (ctx, a + b)

    assert add("ctx", a=1, b=2) == ("ctx", 3)


def test_the_longest_valid_name_is_accepted():
    @job(name="a" * 200)
    def f(ctx):
        return None

    assert f.name == "a" * 200


@pytest.mark.parametrize(
    "name", ["", "has space", "a" * 201, "émile.job", "a/b", "a;drop table", "a\x00b", 123, b"x"]
)
def test_an_invalid_name_is_refused_at_decoration(name):
    with pytest.raises(ConfigurationError, match="Job name"):
        @job(name=name)
        def f(ctx):
            return None
    if isinstance(name, str):
        assert registry.lookup(name) is None


@pytest.mark.parametrize(("option", "value"), [("name", "t.newline\n"), ("queue", "emails\n")])
def test_a_trailing_newline_does_not_slip_past_the_name_pattern(option, value):
    # Python's "$" also matches before a final newline; a queue "emails\n" would hold jobs
    # that no worker of "emails" ever claims.
    with pytest.raises(ConfigurationError):
        @job(**{"name": "t.newline", option: value})
        def f(ctx):
            return None


@pytest.mark.parametrize("queue", ["", "bad queue", "q" * 201, "q/1", 5])
def test_an_invalid_queue_is_refused_at_decoration(queue):
    with pytest.raises(ConfigurationError, match="Queue name"):
        @job(name="t.bad_queue", queue=queue)
        def f(ctx):
            return None
    assert registry.lookup("t.bad_queue") is None


@pytest.mark.parametrize("max_attempts", [0, -1, True, 1.5, "3"])
def test_an_invalid_max_attempts_is_refused_at_decoration(max_attempts):
    with pytest.raises(ConfigurationError, match="max_attempts"):
        @job(name="t.bad_attempts", max_attempts=max_attempts)
        def f(ctx):
            return None
    assert registry.lookup("t.bad_attempts") is None


@pytest.mark.parametrize("timeout", [0, "0s", -1, "-5s", "soon", True, timedelta(seconds=-1)])
def test_an_invalid_timeout_is_refused_at_decoration(timeout):
    with pytest.raises(ConfigurationError, match="timeout"):
        @job(name="t.bad_timeout", timeout=timeout)
        def f(ctx):
            return None
    assert registry.lookup("t.bad_timeout") is None


@pytest.mark.parametrize(
    "options",
    [{"priority": "high"}, {"priority": True}, {"retry_base": "soon"},
     {"retry_base": "10s", "retry_cap": "1s"}, {"retry_cap": -1}],
)
def test_an_invalid_priority_or_retry_policy_is_refused_at_decoration(options):
    with pytest.raises(ConfigurationError):
        @job(name="t.bad_policy", **options)
        def f(ctx):
            return None
    assert registry.lookup("t.bad_policy") is None


@pytest.mark.parametrize("option", ["priority", "max_attempts"])
def test_a_value_every_enqueue_would_refuse_is_refused_at_decoration(option):
    # Enqueue refuses priority/max_attempts beyond a 32-bit int (the column type). A definition
    # carrying such a default can never be enqueued; that must fail at import, not at 3 a.m.
    with pytest.raises(InvalidJobInput, match=option):
        api.build_params(testapp_jobs.noop, {}, {option: 2**31})
    with pytest.raises(ConfigurationError, match=option):
        @job(name="t.too_big", **{option: 2**31})
        def f(ctx):
            return None


def test_decorating_something_not_callable_is_refused():
    with pytest.raises(ConfigurationError, match="function"):
        job(name="t.not_callable")(42)


@pytest.mark.parametrize("option", ["queues", "retries", "max_retries", "cron_expr"])
def test_an_unknown_option_is_refused(option):
    with pytest.raises(ConfigurationError, match=option):
        @job(name="t.unknown_option", **{option: 1})
        def f(ctx):
            return None
    assert registry.lookup("t.unknown_option") is None


def test_a_function_no_worker_could_call_is_refused_at_decoration():
    # A worker calls func(ctx, **input).
    with pytest.raises(ConfigurationError, match="does not take the job context"):
        @job(name="t.no_ctx")
        def no_ctx():
            return None
    with pytest.raises(ConfigurationError, match="does not take the job context"):
        @job(name="t.keyword_ctx")
        def keyword_ctx(*, ctx):
            return None
    with pytest.raises(ConfigurationError, match=r"\(ctx, a, /\): 'a' is positional-only"):
        @job(name="t.positional_only")
        def positional_only(ctx, a, /):
            return None
    assert not {"t.no_ctx", "t.keyword_ctx", "t.positional_only"} & set(registry.all_jobs())

    @job(name="t.fine")
    def fine(ctx, a=1, /, *args, b, **kwargs):  # an unreachable positional-only default is fine
        return None

    @job(name="t.star")
    def star(*args, **kwargs):  # ctx lands in *args
        return None

    assert registry.lookup("t.fine") is fine and registry.lookup("t.star") is star


def test_a_cron_job_whose_function_requires_input_is_refused_at_decoration():
    # The scheduler enqueues @job(cron=...) with no input: every occurrence would fail.
    with pytest.raises(ConfigurationError,
                       match=r"t\.cron_needs_input: cron= runs .* requires a, b"):
        @job(name="t.cron_needs_input", cron="0 3 * * *")
        def needs(ctx, a, b, c=3):
            return None
    assert registry.lookup("t.cron_needs_input") is None

    @job(name="t.cron_defaults", cron="0 3 * * *")
    def defaults(ctx, a=1, **more):
        return None

    assert registry.lookup("t.cron_defaults") is defaults


def test_positional_enqueue_arguments_are_stored_by_parameter_name():
    # Job.enqueue has the function's own parameters for a type checker (ParamSpec), so
    # add.enqueue(1, b=2) type-checks; it is stored as keyword input {"a": 1, "b": 2}.
    @job(name="t.positional")
    def add(ctx, a, b, *, c=0):
        return a + b + c

    shape = add.shape
    assert shape.positional == ("a", "b")
    assert shape.merge(add.name, (1,), {"b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(InvalidJobInput, match=r"takes 2 argument\(s\) by position .* got 3"):
        add.enqueue(1, 2, 3)
    with pytest.raises(InvalidJobInput, match=r"multiple values for argument\(s\) 'a'"):
        add.using(tenant_id="t").enqueue(1, 2, a=1)
    with pytest.raises(InvalidJobInput, match="takes 0 argument"):
        testapp_jobs.noop.enqueue(1)  # noop(ctx, **kwargs): nothing to store a position under


EARLY = """
from django_xjobs import job
from django_xjobs.exceptions import ConfigurationError
import tests.testapp.early_jobs as early

assert early.nightly.options == {"cron": "0 3 * * *", "timezone": "Europe/Paris",
                                 "misfire": "skip", "overlap": "allow"}, early.nightly.options
assert early.export.options["concurrency"].limit == 1
try:
    @job(name="early.bad", cron="61 * * * *")
    def bad(ctx):
        return None
except ConfigurationError as exc:
    print("refused:", exc)
import django
django.setup()
from django_xjobs.scheduler import schedule
assert "tests.testapp.early_jobs.nightly" in schedule.collect()[0], schedule.collect()
print("declared")
"""


def test_every_option_is_known_before_django_setup():
    # A module imported before the app registry is ready (by a settings module, or an app's
    # __init__) declares jobs with every documented option; cron= used to be known only once
    # apps.py had run.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", EARLY], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "refused: early.bad: cron: " in output and "not a valid cron expression" in output
    assert "declared" in done.stdout


# ------------------------------------------------------------------------------ duplicates --


def test_a_second_function_under_the_same_name_is_refused():
    @job(name="t.dup")
    def first(ctx):
        return 1

    with pytest.raises(DuplicateJobName, match=r"t\.dup") as info:
        @job(name="t.dup")
        def second(ctx):
            return 2

    assert "first" in str(info.value)  # names the function that holds the name
    assert isinstance(info.value, ConfigurationError)
    assert registry.get("t.dup") is first  # the original registration is intact


def test_a_function_from_another_module_cannot_take_a_test_app_name():
    with pytest.raises(DuplicateJobName):
        @job(name="testapp.record")
        def record(ctx, tag=""):
            return None

    assert registry.get("testapp.record") is testapp_jobs.record


def test_registering_the_same_function_again_is_allowed():
    # Re-importing a module (autoreload, a test importing it twice) re-decorates the same
    # function: same module and qualname, so it is not a conflict.
    def make():
        @job(name="t.same")
        def same(ctx):
            return None

        return same

    one = make()
    two = make()
    assert one is not two
    assert registry.get("t.same") is two


# ----------------------------------------------------------------------------------- async --


def test_async_functions_are_detected():
    @job(name="t.async")
    async def a(ctx):
        return None

    @job(name="t.sync")
    def s(ctx):
        return None

    assert a.is_async is True
    assert s.is_async is False
    assert testapp_jobs.async_record.is_async is True
    assert testapp_jobs.record.is_async is False


# ------------------------------------------------------------------------------------ get --


def test_get_of_an_unknown_name_raises_unknown_job_naming_it():
    with pytest.raises(UnknownJob, match=r"'nobody\.knows'"):
        registry.get("nobody.knows")
    assert registry.lookup("nobody.knows") is None


def test_unregister_forgets_a_job():
    @job(name="t.forget_me")
    def f(ctx):
        return None

    registry.unregister("t.forget_me")
    assert registry.lookup("t.forget_me") is None


# ------------------------------------------------------------------------ worked queues --


def test_without_a_queues_setting_workers_work_default_and_every_queue_a_job_names():
    from django_xjobs import conf

    @job(name="tests.to_mail", queue="emails")
    def to_mail(ctx):
        return None

    worked = registry.worked_queues(conf.build({}))
    assert worked[0] == "default"  # first, then the others in name order
    assert {"emails", "other"} <= set(worked)
    assert registry.unworked_jobs(conf.build({})) == {}


def test_a_queues_setting_is_taken_as_given_and_the_jobs_it_leaves_out_are_named():
    from django_xjobs import conf

    @job(name="tests.to_mail", queue="emails")
    def to_mail(ctx):
        return None

    given = conf.build({"QUEUES": ["default", "other"]})
    assert registry.worked_queues(given) == ("default", "other")
    assert registry.unworked_jobs(given)["tests.to_mail"] == "emails"
    assert "testapp.noop" not in registry.unworked_jobs(given)
