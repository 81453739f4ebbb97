"""The private topologies fault tests build on (tests/private_cluster.py), proven on the servers
themselves before a test trusts them: a streaming replica that lags on demand, three shards made
for about the price of one cluster, and a child process that sees them all as aliases.

* A row committed on the primary is on the replica once the replica's replay has reached the
  primary's WAL position: the wait is on the LSN, never on the clock.
* With replay paused, the replica has *received* that WAL and still does not show the row (so
  its absence is the pause's doing, not slowness); once replay resumes it does.
* The three shards are three servers with storage of their own, each migrated (``x_jobs``).
* A child on ``env_for``'s environment (tests/settings.py, ``XJOBS_TEST_EXTRA_DATABASES``)
  reaches each alias at its own server and gets the XJOBS settings it was given.
"""

from __future__ import annotations

import json

import pytest

from tests.private_cluster import PrivateCluster, env_for, run_child

pytestmark = pytest.mark.acceptance


def insert(cluster: PrivateCluster) -> int:
    """A new row of a migrated table, committed; its id."""
    [(row,)] = cluster.sql(
        "insert into testapp_counted (hits, poison) values (0, false) returning id")
    return int(row)


def present(cluster: PrivateCluster, row: int) -> bool:
    return cluster.sql("select exists (select from testapp_counted where id = %s)", [row])[0][0]


def test_the_replica_replays_what_the_primary_committed(replica_pair):
    primary, replica = replica_pair
    assert primary.sql("select pg_is_in_recovery()") == [(False,)]
    assert replica.sql("select pg_is_in_recovery()") == [(True,)]
    row = insert(primary)
    replica.wait_caught_up()
    assert present(replica, row)


def test_paused_replay_hides_a_new_row_until_it_resumes(replica_pair):
    primary, replica = replica_pair
    replica.pause_replay()
    try:
        row = insert(primary)
        target = replica.wait_received()  # the WAL of the insert is on the replica, unapplied
        assert present(primary, row)
        assert not present(replica, row)
        assert replica.sql("select pg_last_wal_replay_lsn() < %s::pg_lsn", [target]) == [(True,)]
        with pytest.raises(RuntimeError, match="replay is paused"):
            replica.wait_caught_up()  # fails at once rather than at its deadline
    finally:
        replica.resume_replay()
    replica.wait_caught_up()
    assert present(replica, row)


def test_three_shards_are_three_migrated_servers(three_shards):
    assert len({shard.port for shard in three_shards}) == 3
    assert len({shard.data for shard in three_shards}) == 3
    for shard in three_shards:
        assert shard.sql("select inet_server_port(), to_regclass('x_jobs') is not null") \
            == [(shard.port, True)]
    row = insert(three_shards[1])
    assert [present(shard, row) for shard in three_shards] == [False, True, False]


def test_a_child_sees_each_cluster_as_an_alias(three_shards, replica_pair):
    a, b, c = three_shards
    _, replica = replica_pair
    env = env_for(a, extra={"shard_b": b, "shard_c": c, "replica": replica},
                  xjobs={"POLL_INTERVAL": "7s"})
    out = run_child(
        "import json\nfrom django.conf import settings\nfrom django.db import connections\n"
        "seen = {}\n"
        "for alias in ('default', 'shard_b', 'shard_c', 'replica'):\n"
        "    with connections[alias].cursor() as cur:\n"
        "        cur.execute('select inet_server_port(), pg_is_in_recovery(),'\n"
        "                    ' current_database(), to_regclass(%s) is not null', ['x_jobs'])\n"
        "        seen[alias] = list(cur.fetchone())\n"
        "print(json.dumps({'seen': seen, 'poll': settings.XJOBS['POLL_INTERVAL']}))\n", env)
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer == {"poll": "7s", "seen": {
        "default": [a.port, False, "xjobs_private", True],
        "shard_b": [b.port, False, "xjobs_private", True],
        "shard_c": [c.port, False, "xjobs_private", True],
        "replica": [replica.port, True, "xjobs_private", True],
    }}
