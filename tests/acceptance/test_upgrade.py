"""The upgrade test at CI's size (tests/upgrade/run.py; ``make upgrade-check`` runs it at
1,000,000 rows): the baseline of tests/upgrade/baselines.py, migrated to this tree while its
workers and a producer run, both versions' fleets side by side, the old one stopped, the
upgrade finished. Everything it asserts is read from the database and the processes' logs.

The overlap is counted in jobs (each version's workers run 15 jobs the other version enqueued),
not in seconds, so a slow machine runs longer rather than less.
"""

from __future__ import annotations

import os

import psycopg
import pytest
from psycopg import sql

from tests import devdb
from tests.upgrade import run as upgrade

pytestmark = pytest.mark.acceptance

OVERLAP = 15


def test_an_upgrade_under_load_loses_nothing_and_runs_nothing_twice() -> None:
    database = f"{os.environ.get('XJOBS_TEST_DB', 'test_xjobs')}_upgrade"
    try:
        report = upgrade.run(["--rows", "20000", "--overlap", str(OVERLAP),
                              "--database", database])
    finally:
        with psycopg.connect(devdb.resolve()[0], autocommit=True) as server:
            server.execute(sql.SQL("drop database if exists {} with (force)").format(
                sql.Identifier(database)))
    print(report.text())  # the figures, in the test's output
    assert report.problems() == [], report.text()
    assert report.cross.get("new ran old's", 0) >= OVERLAP
    assert report.cross.get("old ran new's", 0) >= OVERLAP
    assert report.durable_suspended_old > 0
    assert report.durable_resumed_new == report.durable_suspended_old
