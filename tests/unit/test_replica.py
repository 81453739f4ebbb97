"""The replica's verdict (django_xjobs/replica.py; docs/scaling.md, "Reads on a replica"): how a
probe's answers become a lag, whether the replica may serve, and the words a page and a command
print. The probe itself, on real servers: tests/acceptance/test_replica_reads.py."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_xjobs import replica
from django_xjobs.replica import Probe, ReadSource, parse_lsn, seconds_text

PRIMARY_AT = parse_lsn("0/3000100")


def probe(**fields) -> Probe:
    return Probe(**{"replica": "jobs_replica", "at": 0.0, "primary_lsn": PRIMARY_AT, **fields})


def test_an_lsn_is_read_as_postgresql_prints_it():
    assert parse_lsn("0/0") == 0
    assert parse_lsn("16/B374D848") == 0x16 << 32 | 0xB374D848
    assert parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")  # not a comparison of text
    for bad in (None, "", "16", "16/", "x/1", "0/3000100; drop table"):
        assert parse_lsn(bad) is None


def test_a_replica_that_has_replayed_the_primarys_position_is_not_behind_however_idle():
    # An idle primary: its last commit is an hour old, and the replica has everything.
    caught_up = probe(replay_lsn=PRIMARY_AT, since_replay=3600.0)
    assert caught_up.lag == 0.0
    assert caught_up.refusal(max_lag=30.0) is None


def test_behind_the_primary_the_lag_is_the_age_of_the_last_replayed_commit():
    behind = probe(replay_lsn=PRIMARY_AT - 1, since_replay=0.4)
    assert behind.lag == 0.4
    assert behind.refusal(max_lag=30.0) is None
    assert probe(replay_lsn=PRIMARY_AT - 1, since_replay=-2.0).lag == 0.0  # clocks apart
    far = probe(replay_lsn=PRIMARY_AT - 1, since_replay=45.0)
    assert far.refusal(max_lag=30.0) == (
        'replica jobs_replica is 45 s behind, over XJOBS["READ_MAX_LAG"] 30 s')


def test_every_refusal_says_why_in_words():
    unknown = probe(replay_lsn=PRIMARY_AT - 1, since_replay=None)
    assert unknown.lag is None
    assert "how far behind is unknown" in unknown.refusal(max_lag=30.0)
    promoted = probe(standby=False, replay_lsn=None)
    assert "not a standby" in promoted.refusal(max_lag=30.0)
    down = probe(error="replica jobs_replica is unreachable: connection refused",
                 unreachable=True)
    assert down.lag is None
    assert down.refusal(max_lag=30.0) == "replica jobs_replica is unreachable: connection refused"


def test_the_readers_own_change_must_be_replayed_before_the_replica_serves_them():
    caught_up = probe(replay_lsn=PRIMARY_AT, since_replay=0.0)
    assert caught_up.refusal(max_lag=30.0, after_lsn=PRIMARY_AT) is None
    assert caught_up.refusal(max_lag=30.0, after_lsn=PRIMARY_AT + 1) == (
        "replica jobs_replica has not replayed your last change yet")


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0 s"), (0.42, "0.4 s"), (9.94, "9.9 s"), (45.2, "45 s"), (600.0, "10 min"),
    (3 * 3600.0, "3.0 h"),
])
def test_a_lag_reads_as_an_operator_reads_it(seconds, text):
    assert seconds_text(seconds) == text


def test_the_line_of_each_source():
    assert ReadSource(alias="jobs").line == ""  # no replica: nothing to say
    assert ReadSource(alias="jobs_replica", on_replica=True, lag=0.42,
                      replica="jobs_replica").line == "Read from replica jobs_replica, 0.4 s behind"
    fell_back = ReadSource(alias="jobs", fell_back=True, replica="jobs_replica",
                           reason="replica jobs_replica is unreachable: connection refused")
    assert fell_back.line == ("Read from the primary: replica jobs_replica is unreachable: "
                              "connection refused")


def test_without_a_replica_or_for_a_change_reads_asks_no_server():
    # No database is reachable from a unit test: a probe here would fail the test.
    with replica.reads() as source:
        assert source == ReadSource(alias="default")
    with override_settings(XJOBS={"READ_DATABASE": "jobs"}), \
            replica.reads(enabled=False, primary_because="a change is made on the primary") \
            as source:
        assert (source.alias, source.on_replica, source.fell_back) == ("default", False, False)
        assert source.line == "Read from the primary: a change is made on the primary"


def test_a_replica_without_the_router_is_an_error_and_check_asks_no_server_unasked():
    from django.core import checks

    def ids(**overrides) -> list[str]:
        with override_settings(**overrides):
            return [m.id for m in checks.run_checks(tags=["django_xjobs"])
                    if m.id.startswith("xjobs.E03") or m.id.startswith("xjobs.W03")]

    router = "django_xjobs.routers.XJobsRouter"
    # "jobs" is an alias of the tests' DATABASES; without --database no server is asked
    # (W030 and W032 need one), and only the missing router is reported.
    assert ids(XJOBS={"READ_DATABASE": "jobs"}, DATABASE_ROUTERS=[]) == ["xjobs.E033"]
    assert ids(XJOBS={"READ_DATABASE": "jobs"}, DATABASE_ROUTERS=[router]) == []
    assert ids(XJOBS={}, DATABASE_ROUTERS=[]) == []
