"""Jobs sharded by tenant over three PostgreSQL servers (docs/scaling.md, "Sharding by tenant").

Three private primaries (tests/private_cluster.py) are the aliases "default", "shard_b" and
"shard_c" of ``XJOBS["SHARDS"]``; tenant "acme" lives on shard_b, "globex" on shard_c, every
other job on the home shard. Everything is run as a project runs it: the public API and the
commands in child processes, real ``xjobs_worker`` processes, and the rows read on each server:

* enqueue, ``enqueue_many``, ``enqueue_on_commit`` (the outbox on "default", relayed to the
  tenant's shard), a child job (its parent's shard) and an event (its tenant's shard) land where
  the setting says, and nowhere else; ``get_job`` finds a job on whichever shard holds it;
* one ``xjobs_worker`` (no --shard) works every shard, a process per shard, each electing its
  own scheduler leader (the schedule fires on the home shard only); ``xjobs --shard`` reports
  one shard, and refuses an alias that is not one; the console shows every shard, and a job's
  page finds the shard holding it;
* faults: a worker SIGKILLed on one shard and another shard's server crashed (``pg_ctl restart
  -m immediate``) mid-drain: the third shard's worker never notices, the crashed shard's worker
  reconnects and finishes, and the killed worker's job runs again on its shard once its lease
  lapses, fenced (one run of it completes).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

from tests.conftest import wait_until
from tests.private_cluster import env_for, manage, run_child

from .conftest import FAST, SETTLE, SHORT_LEASE, STARTUP, wait_exit, wait_started, worker_id

pytestmark = pytest.mark.acceptance

# ARCHIVE_AFTER None: the finished jobs stay in x_jobs, where the test counts them.
SHARDING = {"SHARDS": ["default", "shard_b", "shard_c"],
            "TENANT_SHARDS": {"acme": "shard_b", "globex": "shard_c"}, "ARCHIVE_AFTER": None}
HOME, B, C = 0, 1, 2


def _env(shards, xjobs=None):
    env = env_for(shards[HOME], {"shard_b": shards[B], "shard_c": shards[C]},
                  xjobs=xjobs)
    env["XJOBS_TEST_ROUTERS"] = "1"
    return env


def _child(shards, code: str, settings: dict | None = None):
    out = run_child(code, _env(shards, {**FAST, **SHARDING, **(settings or {})}))
    return json.loads(out.strip().splitlines()[-1])


def _on(shard, ids: list[str]) -> set[str]:
    """The ids of ``ids`` in shard's x_jobs."""
    return {str(r[0]) for r in shard.sql("select id from x_jobs where id = any(%s::uuid[])",
                                         [ids])}


def test_jobs_children_outbox_and_events_follow_their_tenant_and_one_fleet_drains_all(
        three_shards):
    shards = three_shards
    made = _child(shards, """
import json
from django.db import transaction
from django_xjobs import enqueue, enqueue_many, enqueue_on_commit
from tests.testapp.jobs import noop, parent_invoke, waiter
out = {"home": [], "acme": [], "globex": []}
for tenant, key in ((None, "home"), ("acme", "acme"), ("globex", "globex")):
    h = noop.using(tenant_id=tenant).enqueue()
    out[key].append((str(h.id), h.shard))
many = enqueue_many([("testapp.noop", {}, {"tenant_id": t}) for t in ("acme", None, "globex")])
out["acme"].append((str(many[0].id), many[0].shard))
out["home"].append((str(many[1].id), many[1].shard))
out["globex"].append((str(many[2].id), many[2].shard))
with transaction.atomic():
    staged = enqueue_on_commit("testapp.noop", {}, tenant_id="globex")
out["staged"] = str(staged.id)
out["parent"] = str(parent_invoke.using(tenant_id="acme").enqueue(n=4).id)
out["waiter"] = str(waiter.using(tenant_id="acme").enqueue(event="paid", key="o1").id)
print(json.dumps(out))
""")
    # Each job on its tenant's shard, the handle saying which, and on no other shard.
    assert {s for _, s in made["home"]} == {"default"}
    assert {s for _, s in made["acme"]} == {"shard_b"}
    assert {s for _, s in made["globex"]} == {"shard_c"}
    for key, where in (("home", HOME), ("acme", B), ("globex", C)):
        ids = [i for i, _ in made[key]]
        assert _on(shards[where], ids) == set(ids)
        assert all(not _on(shards[n], ids) for n in (HOME, B, C) if n != where)
    assert _on(shards[B], [made["parent"], made["waiter"]]) == {made["parent"],
                                                                made["waiter"]}
    # The staging waits in the outbox of "default" until a relay publishes it.
    assert shards[HOME].sql("select count(*) from x_outbox where published_at is null") == [(1,)]

    # One command, every shard: a process per shard, each draining its own.
    env = _env(shards)
    done = subprocess.run(
        [*_manage_argv(), "xjobs_worker", "--burst", "--concurrency", "2"],
        env={**_base_env(env), "XJOBS_TEST_SETTINGS": json.dumps({**FAST, **SHARDING}),
             "XJOBS_LOG_LEVEL": "INFO"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    for alias in ("default", "shard_b", "shard_c"):
        assert f"shard={alias}" in done.stderr  # each process names its shard
    # The relay put the staged job on globex's shard; the child lives on its parent's.
    assert _on(shards[C], [made["staged"]]) == {made["staged"]}
    child = shards[B].sql("select id, state from x_jobs where parent_id = %s",
                          [made["parent"]])
    assert [state for _, state in child] == ["done"]
    assert shards[HOME].sql("select count(*) from x_jobs where parent_id = %s",
                            [made["parent"]]) == [(0,)]
    # get_job finds every job wherever it is; the waiter waits on shard_b for its event.
    every = [i for key in ("home", "acme", "globex") for i, _ in made[key]]
    states = _child(shards, f"""
import json
from django_xjobs import get_job, publish_event
ids = {json.dumps([*every, made["staged"], made["parent"], made["waiter"]])}
before = {{i: get_job(i).state for i in ids}}
publish_event("paid", {{"ok": 1}}, correlation_key="o1", tenant_id="acme")
print(json.dumps(before))
""")
    waiter = states.pop(made["waiter"])
    assert waiter == "suspended"
    assert set(states.values()) == {"done"}, states
    assert shards[B].sql("select count(*) from x_job_events where name = 'paid'") == [(1,)]
    assert shards[HOME].sql("select count(*) from x_job_events where name = 'paid'") == [(0,)]
    subprocess.run([*_manage_argv(), "xjobs_worker", "--burst", "--shard", "shard_b"],
                   env={**_base_env(env),
                        "XJOBS_TEST_SETTINGS": json.dumps({**FAST, **SHARDING})},
                   capture_output=True, text=True, timeout=120, check=True)
    assert shards[B].sql("select state from x_jobs where id = %s", [made["waiter"]]) == [
        ("done",)]

    # The report of one shard, and a clear refusal of an alias that is none.
    xjobs_env = _env(shards, {**FAST, **SHARDING})
    report = json.loads(manage("xjobs", "--shard", "shard_c", "--json", env=xjobs_env))
    assert report["shard"] == "shard_c"
    assert sum(q["done"] for q in report["queues"]) == shards[C].sql(
        "select count(*) from x_jobs where state = 'done'")[0][0]
    assert sum(q["done"] for q in report["queues"]) != shards[B].sql(
        "select count(*) from x_jobs where state = 'done'")[0][0]
    bad = subprocess.run([*_manage_argv(), "xjobs", "jobs", "--shard", "nosuch"],
                         env={**_base_env(xjobs_env)}, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2
    assert "--shard nosuch: not a shard; the shards are default, shard_b, shard_c" in bad.stderr


def _manage_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "django"]


def _base_env(env: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **env}


def _count(shard, state: str, tag: str) -> int:
    return shard.sql("select count(*) from x_jobs where state = %s and input->>'tag' = %s",
                     [state, tag])[0][0]


def test_a_worker_killed_on_one_shard_and_a_shard_crashed_leave_the_others_draining(
        three_shards, spawn_worker):
    shards = three_shards
    tag = "faults"
    _child(shards, f"""
import json
from django_xjobs import enqueue_many
items = [("testapp.sleepy", {{"seconds": 0.2, "tag": "{tag}"}}, {{"tenant_id": t}})
         for t in ("acme", "globex", None) for _ in range(12)]
enqueue_many(items)
print(json.dumps(len(items)))
""")
    env = _env(shards)
    settings = {**FAST, **SHORT_LEASE, **SHARDING,
                "SCHEDULE": {"tick": {"job": "testapp.noop", "every": 1}}}
    ids = {alias: worker_id(alias) for alias in ("default", "shard_b", "shard_c")}
    workers = {alias: spawn_worker("--worker-id", wid, "--shard", alias, "--concurrency", "2",
                                   settings=settings, env=env) for alias, wid in ids.items()}
    for worker in workers.values():
        wait_started(worker, timeout=STARTUP)
    # Each shard elects a scheduler leader of its own: its worker.
    for alias, shard in zip(("default", "shard_b", "shard_c"), shards, strict=True):
        wait_until(lambda shard=shard: shard.sql("select holder from x_scheduler_leader"),
                   timeout=SETTLE, interval=0.05, message=f"a leader on {alias}")
        assert shard.sql("select holder from x_scheduler_leader") == [(ids[alias],)]

    # shard_b's worker dies with a job in its hands; shard_c's server crashes under its worker.
    wait_until(lambda: _count(shards[B], "running", tag) >= 1, timeout=SETTLE, interval=0.01,
               message="a job running on shard_b")
    workers["shard_b"].signal(signal.SIGKILL)
    killed = shards[B].sql("select id from x_jobs where state = 'running' and input->>'tag' = %s",
                           [tag])
    assert killed
    wait_until(lambda: _count(shards[C], "done", tag) >= 2, timeout=SETTLE, interval=0.01,
               message="shard_c draining")
    shards[C].restart("immediate")

    # The home shard never noticed; shard_c's worker reconnected and finished its jobs.
    for where in (HOME, C):
        wait_until(lambda where=where: _count(shards[where], "done", tag) == 12, timeout=SETTLE,
                   interval=0.05, message=f"every job of shard {where} done")
    assert workers["default"].proc.poll() is None and workers["shard_c"].proc.poll() is None
    assert _count(shards[B], "done", tag) < 12  # nobody works shard_b now

    # A new worker on shard_b takes the killed worker's jobs back once their leases lapse.
    spawn_worker("--worker-id", worker_id("shard_b-2"), "--shard", "shard_b", "--concurrency",
                 "2", settings=settings, env=env)
    wait_until(lambda: _count(shards[B], "done", tag) == 12, timeout=SETTLE, interval=0.05,
               message="every job of shard_b done")
    for (job_id,) in killed:
        attempt, = shards[B].sql("select attempt from x_jobs where id = %s", [job_id])[0]
        assert attempt == 2  # the killed run's lease lapsed; the second run completed it
    # The schedule fires on the home shard only (the other shards' leaders run maintenance).
    assert shards[HOME].sql("select count(*) from x_jobs where enqueued_by = 'cron:tick'")[0][0]
    for where in (B, C):
        assert shards[where].sql(
            "select count(*) from x_jobs where enqueued_by = 'cron:tick'") == [(0,)]
    for worker in workers.values():
        if worker.proc.poll() is None:
            worker.signal(signal.SIGTERM)
            assert wait_exit(worker) == 0


def test_the_console_shows_every_shard_and_finds_a_job_on_its_shard(three_shards):
    shards = three_shards
    pages = _child(shards, """
import json
from django.contrib.auth.models import User
from django.test import Client
from django_xjobs import enqueue
user, _ = User.objects.get_or_create(username="shard-op", is_staff=True, is_superuser=True)
client = Client()
client.force_login(user)
acme = enqueue("testapp.noop", {}, tenant_id="acme", run_at=None)
out = {}
board = client.get("/_x/")
out["board"] = board.content.decode()
page = client.get(f"/_x/django_xjobs/job/{acme.id}/change/")
out["redirect"] = [page.status_code, page.get("Location")]
chosen = client.get(page["Location"])
out["chosen"] = [chosen.status_code, chosen.get("Location")]
out["job"] = client.get(chosen["Location"]).status_code
out["list"] = client.get("/_x/django_xjobs/job/").content.decode()
out["nosuch"] = client.get("/_x/?shard=nosuch", follow=True).content.decode()
out["acme"] = str(acme.id)
out["metrics"] = client.get("/metrics?shard=shard_b").content.decode()
out["metrics_nosuch"] = client.get("/metrics?shard=nosuch").status_code
# A tab still showing shard_b posts a pause after another tab chose shard_c: it acts on b.
client.get("/_x/?shard=shard_c")
posted = client.post("/_x/django_xjobs/job/pause/", {
    "op": "pause", "kind": "queue", "name": "stale-tab", "post": "yes",
    "_xjobs_shard": "shard_b"})
out["posted"] = posted.status_code
print(json.dumps(out))
""")
    board = pages["board"]
    assert 'id="xjobs-shards"' in board
    for alias in ("default", "shard_b", "shard_c"):
        assert f">{alias}<" in board
    assert "all shards" in board
    # The job's page, opened on the home shard, chooses the job's shard and shows it.
    assert pages["redirect"] == [302, f"/_x/django_xjobs/job/{pages['acme']}/change/"
                                      "?shard=shard_b"]
    assert pages["chosen"] == [302, f"/_x/django_xjobs/job/{pages['acme']}/change/"]
    assert pages["job"] == 200
    assert pages["acme"] in pages["list"]  # the list now shows shard_b's jobs
    assert "No shard &#x27;nosuch&#x27;" in pages["nosuch"]
    # One metrics scrape per shard: ?shard= reads that shard's figures.
    ready = re.search(r'^xjobs_queue_depth\{queue="default",state="ready"\} (\S+)$',
                      pages["metrics"], re.M)
    assert ready and float(ready.group(1)) == shards[B].sql(
        "select count(*) from x_jobs where state = 'ready'")[0][0] >= 1
    assert pages["metrics_nosuch"] == 400
    assert pages["posted"] == 302
    pause_rows = "select count(*) from x_flow_pauses where key = 'stale-tab'"
    assert shards[B].sql(pause_rows) == [(1,)]
    assert shards[C].sql(pause_rows) == [(0,)]

    # A shard that is down is a row saying so; the page still renders. Jobs on the other
    # shards are found by id, and the relay publishes their stagings; the down shard's wait.
    shards[C].stop()
    try:
        down = _child(shards, f"""
import json
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django_xjobs import enqueue_on_commit, get_job
from django_xjobs.outbox import relay_pending
client = Client()
client.force_login(User.objects.get(username="shard-op"))
response = client.get("/_x/")
with transaction.atomic():
    home = enqueue_on_commit("testapp.noop", {{}})
    globex = enqueue_on_commit("testapp.noop", {{}}, tenant_id="globex")
relay_pending()
print(json.dumps([response.status_code, response.content.decode(),
                  get_job("{pages['acme']}").state, get_job(home.id).state,
                  str(globex.id)]))
""")
    finally:
        shards[C].resume()
    status, board, acme_state, home_state, globex_id = down
    assert status == 200
    assert "cannot be read" in board
    assert (acme_state, home_state) == ("ready", "ready")
    assert shards[HOME].sql("select published_at is null from x_outbox where id = %s",
                            [globex_id]) == [(True,)]  # left pending until shard_c is back
