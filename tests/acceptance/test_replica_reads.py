"""Reads on a streaming replica (docs/scaling.md, "Reads on a replica"), on a private primary
and a hot standby of it (tests/private_cluster.py, the ``replica_pair`` fixture).

Children on the tests' settings see the primary as ``default`` (the jobs database) and the
standby as ``replica`` (``XJOBS["READ_DATABASE"]``); the console's pages go through Django's
test client in the child, logged in as a superuser made on the primary. A read is proved to
come from the replica by what only the replica lacks: with its replay paused, a job enqueued on
the primary is on no page, report or metric that read the replica, and on those that read the
primary. Each wait is on the servers' own state (a replay position, a replayed commit's age, a
setting's value), never on the clock.

Three children, to keep the module short: one makes the superuser and a job on both servers;
then one with the replica up and its replay paused (the pages, the metrics, the reports and
``check`` on the replica; a lag over the bound; an action and the pages after it), and one with
the replica stopped (every reader falls back and says so; ``check`` neither fails nor hangs).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_until
from tests.private_cluster import env_for, run_child

pytestmark = pytest.mark.acceptance

READS = {"READ_DATABASE": "replica", "READ_MAX_LAG": "1h"}

# What both children share: the client, the line a page says, a report's two streams, `check`.
PRELUDE = r'''
import html, io, json, re, time
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import Client, override_settings
from django.urls import reverse
from django_xjobs import replica
from django_xjobs.console.databases import WRITTEN_KEY

out = {}
client = Client()
client.force_login(User.objects.get(username="op"))

def url(name, *args):
    return reverse(f"xjobs_console:{name}", args=args)

def get(page):
    response = client.get(page)
    assert response.status_code == 200, (page, response.status_code)
    return response.content.decode()

def said(text):
    """(the line's class, whether on the replica, its words) of a page's reads line."""
    found = re.search(r'<li class="(\w+)" id="xjobs-reads" data-on-replica="(\d)">([^<]*)</li>',
                      text)
    return None if found is None else [found.group(1), found.group(2) == "1",
                                       html.unescape(found.group(3))]

def report(*args):
    stdout, stderr = io.StringIO(), io.StringIO()
    call_command("xjobs", *args, stdout=stdout, stderr=stderr)
    return stdout.getvalue(), stderr.getvalue().strip()

def checked():
    stdout, stderr = io.StringIO(), io.StringIO()
    started = time.monotonic()
    call_command("check", "--database", "replica", stdout=stdout, stderr=stderr)
    return stdout.getvalue() + stderr.getvalue(), time.monotonic() - started

def scrape():
    """Every sample of a scrape of the metrics view: {name{labels}: value}."""
    samples = {}
    for line in get("/metrics").splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = value
    return samples
'''

REPLICA_UP = PRELUDE + r'''
only_primary = str(noop.enqueue(tag="only-on-primary").id)  # replay is paused: not on the replica
out["only_primary"] = only_primary
shared = SHARED

# (a) the pages read the replica, and say so
jobs = get(url("django_xjobs_job_changelist"))
out["list"] = [said(jobs), shared in jobs, only_primary in jobs]
out["dashboard"] = said(get("/_x/"))
# Every page shown with GET, on the standby, which refuses any write.
jobs_list = url("django_xjobs_job_changelist")
pages = [url("django_xjobs_job_change", shared), url("django_xjobs_queue", "default"),
         jobs_list + "?q=on-both", jobs_list + "?state=dead", "/_x/?window=week",
         *(url(f"django_xjobs_{model}_changelist") for model in
           ("jobstep", "jobevent", "joblease", "schedulerleader", "schedulerstate", "backfill"))]
out["pages"] = [said(get(page)) for page in pages]
out["health"] = said(get(url("django_xjobs_health")))
out["outbox"] = said(get(url("django_xjobs_outboxentry_changelist")))
out["metrics"] = scrape()

# (e) the reports read the replica unless --primary; an action reads and writes the primary
out["report"] = report("jobs")
out["report_primary"] = [report("--primary", "jobs"), report("jobs", "--primary")]
out["cancel"] = report("cancel", only_primary)

# (f) hot_standby_feedback = on, set on the replica by the test
out["check"] = checked()[0]

# (c) further behind than READ_MAX_LAG: the primary, and the page says why
replica_cursor = connections["replica"].cursor()
def behind_by():
    replica_cursor.execute("select extract(epoch from now() - pg_last_xact_replay_timestamp())")
    return replica_cursor.fetchone()[0]
while behind_by() <= 0.5:  # the replica's own measure reaching the bound below
    time.sleep(0.02)  # the poll interval
with override_settings(XJOBS={**settings.XJOBS, "READ_MAX_LAG": 0.5}):
    replica.forget()
    jobs = get(url("django_xjobs_job_changelist"))
    out["lagging"] = [said(jobs), only_primary in jobs, scrape()]
replica.forget()

# (d) an action, then the pages after it: its result, even with replay paused
response = client.post(url("django_xjobs_job_changelist"), {
    "action": "cancel_jobs", "_selected_action": [shared], "post": "yes"})
assert response.status_code == 302, response.status_code
written = client.session[WRITTEN_KEY]["default"]
page = get(url("django_xjobs_job_change", shared))
out["after_action"] = [said(page), "Why it is cancelled" in page]
# Replay again, until the replica has passed the action: the replica serves once more.
replica_cursor.execute("select pg_wal_replay_resume()")
def passed():
    replica_cursor.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", [written])
    return replica_cursor.fetchone()[0]
while not passed():
    time.sleep(0.02)  # the poll interval
replica.forget()
page = get(url("django_xjobs_job_change", shared))
out["replayed"] = [said(page), "Why it is cancelled" in page,
                   WRITTEN_KEY in client.session and "default" in client.session[WRITTEN_KEY]]
print(json.dumps(out))
'''

REPLICA_DOWN = PRELUDE + r'''
out["list"] = said(get(url("django_xjobs_job_changelist")))
out["dashboard"] = said(get("/_x/"))
out["metrics"] = scrape()
out["report"] = report("jobs")
out["check"] = checked()
print(json.dumps(out))
'''

SETUP = r'''
import json
from django.contrib.auth.models import User
from tests.testapp.jobs import noop
User.objects.create_superuser("op", "op@example.com", "not-a-secret")
print(json.dumps(str(noop.enqueue(tag="on-both").id)))
'''


def child(code: str, env: dict[str, str]) -> dict:
    return json.loads(run_child(code, env).strip().splitlines()[-1])


def set_feedback(replica, value: str) -> None:
    """hot_standby_feedback on the standby (ALTER SYSTEM and a reload), waited for."""
    if value == "reset":
        replica.sql("alter system reset hot_standby_feedback")
    else:
        replica.sql(f"alter system set hot_standby_feedback = {value}")
    replica.sql("select pg_reload_conf()")
    wanted = "off" if value == "reset" else value
    wait_until(lambda: replica.sql("show hot_standby_feedback")[0][0] == wanted, timeout=10,
               interval=0.02, message=f"hot_standby_feedback = {wanted} on the replica")


@pytest.fixture(scope="module")
def console(replica_pair):
    """The children's environment, once the superuser "op" and a job on both servers exist;
    that job's id."""
    primary, replica = replica_pair
    # XJobsRouter (XJOBS_TEST_ROUTERS): it alone sends the console's ORM reads to the replica.
    env = {**env_for(primary, {"replica": replica}, xjobs=READS), "XJOBS_TEST_ROUTERS": "1"}
    shared = child(SETUP, env)
    replica.wait_caught_up()
    return env, shared


READY = 'xjobs_queue_depth{queue="default",state="ready"}'
FALLBACK = 'xjobs_replica_fallback{replica="replica"}'
LAG = 'xjobs_replica_lag_seconds{replica="replica"}'


def cancelled_total(samples: dict[str, str]) -> float:
    return sum(float(v) for k, v in samples.items()
               if k.startswith("xjobs_jobs_total{") and 'outcome="cancelled"' in k)


def test_the_console_metrics_and_reports_read_the_replica_until_it_lags_or_you_act(
        replica_pair, console):
    _primary, replica = replica_pair
    env, shared = console
    replica.pause_replay()
    set_feedback(replica, "on")
    try:
        got = child("from tests.testapp.jobs import noop\n"
                    f"SHARED = {shared!r}\n" + REPLICA_UP, env)
    finally:
        replica.resume_replay()
        set_feedback(replica, "reset")
    only_primary = got["only_primary"]

    # (a) the replica served the pages: the job enqueued after the pause is on none of them.
    line, has_shared, has_only_primary = got["list"]
    assert line[:2] == ["debug", True]
    assert line[2].startswith("Read from replica replica, ") and line[2].endswith(" behind")
    assert has_shared and not has_only_primary
    assert got["dashboard"][:2] == ["debug", True]
    assert all(p is not None and p[:2] == ["debug", True] for p in got["pages"]), got["pages"]
    # The health panel is the primary's own state: read there by design, not as a warning.
    # The outbox's pages read the outbox databases and say nothing.
    assert got["health"][:2] == ["debug", False]
    assert got["health"][2].startswith("Read from the primary: the health panel shows")
    assert got["outbox"] is None
    # The metrics too: the replica has one ready job, the primary two.
    assert got["metrics"][READY] == "1.0" and cancelled_total(got["metrics"]) == 0
    assert got["metrics"][FALLBACK] == "0.0" and float(got["metrics"][LAG]) >= 0

    # (e) a report reads the replica and says so on stderr; --primary (before or after the
    # report's name) reads the primary; an action acts on the primary and says nothing.
    stdout, stderr = got["report"]
    assert stderr.startswith("read from replica replica, ") and stderr.endswith(" behind")
    assert shared in stdout and only_primary not in stdout
    for stdout, stderr in got["report_primary"]:
        assert stderr == "read from the primary: --primary"
        assert only_primary in stdout
    stdout, stderr = got["cancel"]
    assert stdout.startswith(f"cancel: job {only_primary} ") and "is now cancelled" in stdout
    assert stderr == ""

    # (f) check warns of hot_standby_feedback, and says what it costs.
    assert "xjobs.W030" in got["check"] and "vacuum horizon" in got["check"]

    # (c) further behind than READ_MAX_LAG: the primary, with a warning that says how far.
    line, has_only_primary, metrics = got["lagging"]
    assert line[:2] == ["warning", False]
    assert line[2].startswith("Read from the primary: replica replica is ")
    assert line[2].endswith(' behind, over XJOBS["READ_MAX_LAG"] 0.5 s')
    assert has_only_primary
    assert metrics[FALLBACK] == "1.0" and float(metrics[LAG]) > 0.5
    assert cancelled_total(metrics) == 1  # the report's cancel: on the primary only

    # (d) after the action, its result at once, from the primary until the replica has
    # replayed it; then from the replica again, the session no longer holding it back.
    line, cancelled = got["after_action"]
    assert cancelled
    assert line == ["warning", False,
                    "Read from the primary: replica replica has not replayed your last change yet"]
    line, cancelled, still_held = got["replayed"]
    assert cancelled and line[:2] == ["debug", True] and not still_held


def test_a_stopped_replica_sends_every_reader_to_the_primary_and_check_does_not_hang(
        replica_pair, console):
    _primary, replica = replica_pair
    env, shared = console
    replica.stop()
    try:
        got = child(REPLICA_DOWN, env)
    finally:
        replica.resume()
        replica.wait_caught_up()
    unreachable = "Read from the primary: replica replica is unreachable: "
    for line in (got["list"], got["dashboard"]):
        assert line[:2] == ["warning", False] and line[2].startswith(unreachable), line
    assert got["metrics"][FALLBACK] == "1.0" and got["metrics"][LAG] == "NaN"
    assert "xjobs_up 1.0" in [f"{k} {v}" for k, v in got["metrics"].items()]
    stdout, stderr = got["report"]
    assert stderr.startswith(unreachable[0].lower() + unreachable[1:])
    assert shared in stdout
    output, took = got["check"]
    assert "xjobs.W032" in output and "could not be asked" in output
    assert took < 10  # refused at once; the connect timeout bounds it at 3 s anyway


# The replica fails in the middle of a page: the verdict of the page before is kept (as it is
# for a second in production), then the standby's search_path stops every query of the
# console's from finding its tables, as a replica that dies or cancels a query would fail it.
MID_PAGE = PRELUDE + r'''
import psycopg
replica.PROBE_TTL = 3600.0
jobs_list = url("django_xjobs_job_changelist")
out["before"] = said(get(jobs_list))
db = settings.DATABASES["replica"]
with psycopg.connect(host=db["HOST"], port=db["PORT"], dbname=db["NAME"], user=db["USER"],
                     autocommit=True) as conn:
    conn.execute("alter system set search_path = 'nowhere'")
    conn.execute("select pg_reload_conf()")
    while psycopg.connect(host=db["HOST"], port=db["PORT"], dbname=db["NAME"], user=db["USER"]
                          ).execute("show search_path").fetchone()[0] != "nowhere":
        pass  # the reload is seen by new sessions once the postmaster has read it
    try:
        page = get(jobs_list)
        out["during"] = [said(page), SHARED in page]
    finally:
        conn.execute("alter system reset search_path")
        conn.execute("select pg_reload_conf()")
print(json.dumps(out))
'''


def test_a_replica_failing_during_a_page_makes_it_read_the_primary(replica_pair, console):
    env, shared = console
    got = child(f"SHARED = {shared!r}\n" + MID_PAGE, env)
    assert got["before"][:2] == ["debug", True]
    line, listed = got["during"]
    assert line[:2] == ["warning", False]
    assert line[2].startswith("Read from the primary: replica replica failed during the page: ")
    assert listed  # the page, whole, from the primary
