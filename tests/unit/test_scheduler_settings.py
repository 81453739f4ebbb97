"""The scheduler's settings (conf.py) and ``@job(cron=...)`` (scheduler/options.py). No database."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_xjobs import conf, job, registry
from django_xjobs.exceptions import ConfigurationError


@pytest.fixture(autouse=True)
def isolated_registry():
    before = registry.all_jobs()
    yield
    for name in set(registry.all_jobs()) - set(before):
        registry.unregister(name)


# ---------------------------------------------------------------------------- settings --


def test_the_defaults_give_a_lease_leader_and_a_grace_covering_a_handover():
    s = conf.build({})

    assert (s.leader, s.leader_lease, s.leader_renew) == ("lease", 15.0, 5.0)
    assert s.cron_misfire_grace == s.leader_lease + s.leader_renew
    assert (s.cron_max_catchup, s.maintenance_interval, s.maintenance_batch) == (100, 60.0, 1000)
    assert s.outbox_retention == 86400.0
    assert s.slot_purge_grace == s.lease  # the worker lease
    assert s.schedule == {}


def test_durations_and_modes_are_parsed():
    s = conf.build({"LEADER": "advisory", "LEADER_LEASE": "30s", "LEADER_RENEW": "5s",
                    "CRON_MISFIRE_GRACE": "2m", "CRON_MAX_CATCHUP": 7,
                    "MAINTENANCE_INTERVAL": "5m", "MAINTENANCE_BATCH": 50,
                    "OUTBOX_RETENTION": "2d", "SLOT_PURGE_GRACE": 0})

    assert (s.leader, s.leader_lease, s.leader_renew, s.cron_misfire_grace) == (
        "advisory", 30.0, 5.0, 120.0)
    assert (s.cron_max_catchup, s.maintenance_interval, s.maintenance_batch) == (7, 300.0, 50)
    assert (s.outbox_retention, s.slot_purge_grace) == (172800.0, 0.0)


def test_the_renew_interval_defaults_to_a_third_of_the_lease():
    assert conf.build({"LEADER_LEASE": "9s"}).leader_renew == 3.0


def test_maintenance_can_be_switched_off():
    assert conf.build({"MAINTENANCE_INTERVAL": None}).maintenance_interval is None


def test_finished_jobs_move_to_the_history_tables_after_ten_seconds_unless_told():
    assert conf.build({}).archive_after == 10.0
    assert conf.build({"ARCHIVE_AFTER": "2m"}).archive_after == 120.0
    assert conf.build({"ARCHIVE_AFTER": 0}).archive_after == 0.0
    assert conf.build({"ARCHIVE_AFTER": None}).archive_after is None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"LEADER": "advisory-lock"}, 'XJOBS["LEADER"] must be "lease"'),
        ({"LEADER": None}, 'XJOBS["LEADER"]'),
        ({"LEADER_LEASE": "10s", "LEADER_RENEW": "5s"}, "at least 3 x"),
        ({"LEADER_LEASE": 0}, 'XJOBS["LEADER_LEASE"] must be greater than zero'),
        ({"LEADER_RENEW": -1}, "must not be negative"),
        ({"CRON_MISFIRE_GRACE": "soon"}, 'XJOBS["CRON_MISFIRE_GRACE"]'),
        ({"CRON_MAX_CATCHUP": 0}, 'XJOBS["CRON_MAX_CATCHUP"] must be a positive integer'),
        ({"CRON_MAX_CATCHUP": "100"}, "CRON_MAX_CATCHUP"),
        ({"MAINTENANCE_INTERVAL": 0}, 'XJOBS["MAINTENANCE_INTERVAL"] must be greater than zero'),
        ({"MAINTENANCE_BATCH": 0}, "MAINTENANCE_BATCH"),
        ({"OUTBOX_RETENTION": "forever"}, "OUTBOX_RETENTION"),
        ({"SLOT_PURGE_GRACE": -5}, "SLOT_PURGE_GRACE"),
        ({"ARCHIVE_AFTER": "soon"}, 'XJOBS["ARCHIVE_AFTER"]'),
        ({"ARCHIVE_AFTER": -5}, 'XJOBS["ARCHIVE_AFTER"]: must not be negative'),
    ],
)
def test_a_bad_scheduler_setting_names_its_key(raw, fragment):
    with pytest.raises(ConfigurationError) as info:
        conf.build(raw)
    assert fragment in str(info.value)


GOOD = {"job": "testapp.noop", "cron": "0 3 * * *"}


def test_a_schedule_entry_gets_its_defaults():
    s = conf.build({"SCHEDULE": {"nightly": GOOD}})

    assert s.schedule == {"nightly": {"job": "testapp.noop", "cron": "0 3 * * *",
                                      "every": None, "timezone": "UTC", "input": {}, "args": [],
                                      "misfire": "latest", "overlap": "allow", "queue": None,
                                      "priority": None}}


@pytest.mark.parametrize("every", [timedelta(seconds=45), "45s", 45, 45.0])
def test_an_interval_entry_takes_a_timedelta_a_string_or_seconds_and_has_no_timezone(every):
    s = conf.build({"SCHEDULE": {"poll": {"job": "testapp.record", "every": every,
                                          "input": {"tag": "p"}, "args": ["x"],
                                          "queue": "polls", "priority": 5}}})

    assert s.schedule["poll"] == {"job": "testapp.record", "cron": None, "every": 45.0,
                                  "timezone": None, "input": {"tag": "p"}, "args": ["x"],
                                  "misfire": "latest", "overlap": "allow", "queue": "polls",
                                  "priority": 5}


@pytest.mark.parametrize(
    ("schedule", "fragment"),
    [
        ([GOOD], "must be a dict of task name"),
        ({"bad name": GOOD}, "task name 'bad name' is not valid"),
        ({3: GOOD}, "task name 3 is not valid"),
        ({"t": "0 3 * * *"}, "must be a dict with"),
        ({"t": {"cron": "0 3 * * *"}}, 'needs a "job"'),
        ({"t": {"job": "testapp.noop"}}, 'needs a "cron"'),
        ({"t": {**GOOD, "when": "daily"}}, "unknown key"),
        ({"t": {**GOOD, "job": "no spaces allowed"}}, '"job"'),
        ({"t": {**GOOD, "job": None}}, '"job"'),
        ({"t": {**GOOD, "cron": ""}}, '"cron"'),
        ({"t": {**GOOD, "cron": ["0", "3"]}}, '"cron"'),
        ({"t": {**GOOD, "timezone": 1}}, '"timezone"'),
        ({"t": {**GOOD, "input": [1, 2]}}, '"input"'),
        ({"t": {**GOOD, "misfire": "never"}}, '"misfire"'),
        ({"t": {**GOOD, "overlap": "queue"}},
         '["overlap"] must be one of \'allow\', \'skip\', \'buffer_one\', \'cancel_previous\''),
        ({"t": {**GOOD, "overlap": "Skip"}}, "got str 'Skip'"),
        ({"t": {**GOOD, "overlap": None}}, "got NoneType None"),
        ({"t": {**GOOD, "overlap": ["skip"]}}, "got list ['skip']"),
        ({"t": {**GOOD, "overlap": True}}, "got bool True"),
        ({"t": {**GOOD, "every": "45s"}}, 'needs a "cron" or an "every" (a cron expression, '
                                          'or an interval such as "45s"), one of them, not both'),
        ({"t": {"job": "testapp.noop", "every": "45s", "timezone": "UTC"}},
         '["timezone"] goes with "cron" only'),
        ({"t": {"job": "testapp.noop", "every": "soon"}}, '["every"]: \'soon\' is not a duration'),
        ({"t": {"job": "testapp.noop", "every": -1}}, '["every"]: must not be negative'),
        ({"t": {"job": "testapp.noop", "every": None}}, '["every"]: expected a duration'),
        ({"t": {**GOOD, "args": "abc"}}, '["args"] must be a list of positional arguments'),
        ({"t": {**GOOD, "args": {"a": 1}}}, '["args"] must be a list'),
        ({"t": {**GOOD, "queue": "no spaces"}}, 'queue name \'no spaces\' is not valid'),
        ({"t": {**GOOD, "priority": "high"}}, '["priority"] must be a 32-bit integer'),
        ({"t": {**GOOD, "priority": True}}, '["priority"] must be a 32-bit integer'),
        ({"t": {**GOOD, "priority": 2**31}}, '["priority"] must be a 32-bit integer'),
    ],
)
def test_a_malformed_schedule_entry_is_refused_naming_the_entry(schedule, fragment):
    with pytest.raises(ConfigurationError, match="SCHEDULE") as info:
        conf.build({"SCHEDULE": schedule})
    assert fragment in str(info.value)


# ------------------------------------------------------------------------- @job(cron=) --


def test_job_takes_cron_timezone_and_misfire_and_stores_them_normalised():
    @job(name="tests.cron_job", cron="  */5  * * * * ", timezone="Europe/Paris", misfire="all")
    def cron_job(ctx):
        return None

    assert cron_job.options == {"cron": "*/5 * * * *", "timezone": "Europe/Paris",
                                "misfire": "all", "overlap": "allow"}


@pytest.mark.parametrize("policy", ["allow", "skip", "buffer_one", "cancel_previous"])
def test_job_takes_each_overlap_policy(policy):
    @job(name=f"tests.cron_overlap_{policy}", cron="0 3 * * *", overlap=policy)
    def cron_overlap(ctx):
        return None

    assert cron_overlap.options["overlap"] == policy


def test_a_schedule_entry_takes_an_overlap_policy():
    s = conf.build({"SCHEDULE": {"nightly": {**GOOD, "overlap": "cancel_previous"}}})

    assert s.schedule["nightly"]["overlap"] == "cancel_previous"


def test_job_cron_defaults_to_utc_and_latest():
    @job(name="tests.cron_defaults", cron="0 3 * * *")
    def cron_defaults(ctx):
        return None

    assert cron_defaults.options == {"cron": "0 3 * * *", "timezone": "UTC",
                                     "misfire": "latest", "overlap": "allow"}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"cron": "61 * * * *"}, "not a valid cron expression"),
        ({"cron": "* * *"}, "has 3 fields"),
        ({"cron": "0 3 * * *", "timezone": "Europe/Atlantis"}, "unknown timezone"),
        ({"cron": "0 3 * * *", "misfire": "twice"}, "misfire must be one of"),
        ({"timezone": "Europe/Paris"}, "timezone= needs cron="),
        ({"misfire": "all"}, "misfire= needs cron="),
        ({"cron": "0 3 * * *", "overlap": "buffer"},
         "overlap must be one of 'allow', 'skip', 'buffer_one', 'cancel_previous', "
         "got str 'buffer'"),
        ({"cron": "0 3 * * *", "overlap": 1}, "got int 1"),
        ({"cron": "0 3 * * *", "overlap": None}, "got NoneType None"),
        ({"overlap": "skip"}, "overlap= needs cron="),
    ],
)
def test_job_refuses_bad_cron_options_when_decorated(options, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        @job(name="tests.bad_cron", **options)
        def bad_cron(ctx):
            return None

    assert registry.lookup("tests.bad_cron") is None


# ------------------------------------------------------------------------ @job(every=) --


@pytest.mark.parametrize(("every", "stored"), [
    (timedelta(seconds=45), timedelta(seconds=45)), ("45s", timedelta(seconds=45)),
    (90, timedelta(seconds=90)), ("1.5s", timedelta(seconds=1.5)), ("2h", timedelta(hours=2)),
])
def test_job_takes_every_as_a_timedelta_seconds_or_a_string_and_stores_a_timedelta(every, stored):
    @job(name="tests.every_job", every=every, misfire="all", overlap="skip")
    def every_job(ctx):
        return None

    assert every_job.options == {"every": stored, "misfire": "all", "overlap": "skip"}


def test_job_every_defaults_to_latest_and_allow_and_takes_no_timezone():
    @job(name="tests.every_defaults", every="10s")
    def every_defaults(ctx):
        return None

    assert every_defaults.options == {"every": timedelta(seconds=10), "misfire": "latest",
                                      "overlap": "allow"}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"cron": "0 3 * * *", "every": "1h"},
         "cron= and every= are two ways to give a schedule; give one"),
        ({"every": "1h", "timezone": "Europe/Paris"}, "timezone= goes with cron= only"),
        ({"every": "999ms"}, "shorter than the shortest interval, 1s"),
        ({"every": 0}, "shorter than the shortest interval"),
        ({"every": timedelta(days=367)}, "longer than the longest interval, 366d"),
        ({"every": "soon"}, "'soon' is not a duration"),
        ({"every": -5}, "must not be negative"),
        ({"every": [45]}, "expected a duration"),
        ({"misfire": "all"}, "misfire= needs cron= or every="),
        ({"every": "1m", "misfire": "twice"}, "misfire must be one of"),
        ({"every": "1m", "overlap": "queue"}, "overlap must be one of"),
    ],
)
def test_job_refuses_bad_every_options_when_decorated(options, fragment):
    with pytest.raises(ConfigurationError, match=r"tests\.bad_every") as info:
        @job(name="tests.bad_every", **options)
        def bad_every(ctx):
            return None

    assert fragment in str(info.value)
    assert registry.lookup("tests.bad_every") is None


def test_job_every_refuses_a_function_with_required_arguments():
    with pytest.raises(ConfigurationError, match=r"every= runs needs_input\(ctx, account\) with no "
                                                 r"input, but it requires account"):
        @job(name="tests.every_needs_input", every="1m")
        def needs_input(ctx, account):
            return account
