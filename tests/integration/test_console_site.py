"""The console at ``/_x/`` (django_xjobs.urls): its own admin site with the same pages and
permissions as the project's admin, the charts drawn from the counters, the queue page, the
job page's attempts and progress, and a dashboard that never scans ``x_jobs``
(docs/console.md)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.test.utils import override_settings
from django.urls import reverse

from django_xjobs import api
from django_xjobs.engines import get_engine
from django_xjobs.models import Job
from django_xjobs.testing import drain, travel
from tests.console_data import jobs_in_every_state, other_rows, steps_for
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db(transaction=True)

SITES = ("admin", "xjobs_console")
QUEUE = "site-q"


def url(site: str, name: str, *args) -> str:
    return reverse(f"{site}:{name}", args=args)


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_xjobs", codename__in=codenames))
    return user


def drain_all(queues=(QUEUE,)) -> None:
    """Run every job of ``queues`` to its end, retries included (made due at once)."""
    for _ in range(20):
        drain(queues=list(queues))
        if not Job.objects.filter(queue__in=queues,
                                  state__in=("ready", "delayed", "running")).exists():
            return
        travel(timedelta(minutes=5))
    pytest.fail("jobs still live after draining")


@pytest.fixture
def drained():
    """Work that went through real claims on QUEUE: five done, one done on its third attempt
    after two failures, one dead after two."""
    for i in range(5):
        testapp_jobs.record.using(queue=QUEUE).enqueue(tag=f"r{i}")
    flaky = testapp_jobs.flaky.using(queue=QUEUE).enqueue(fail_times=2)
    dead = testapp_jobs.always_fails.using(queue=QUEUE).enqueue()
    drain_all()
    return {"flaky": flaky, "dead": dead}


def console_pages(site: str, handles: dict) -> list[str]:
    job = handles["flaky"].id
    return [
        url(site, "index"), url(site, "django_xjobs_dashboard"),
        url(site, "django_xjobs_dashboard") + "?window=week",
        url(site, "django_xjobs_health"), url(site, "django_xjobs_queue", QUEUE),
        url(site, "django_xjobs_queue", QUEUE) + "?window=day",
        url(site, "django_xjobs_job_changelist"), url(site, "django_xjobs_job_change", job),
        url(site, "django_xjobs_job_history", job), url(site, "app_list", "django_xjobs"),
        url(site, "django_xjobs_jobstep_changelist"),
        url(site, "django_xjobs_outboxentry_changelist"),
    ]


# ------------------------------------------------------------------------------- the site --


def test_the_console_is_mounted_at_x_and_its_index_is_the_dashboard(admin_client, drained):
    assert reverse("xjobs_console:index") == "/_x/"
    response = admin_client.get("/_x/")
    assert response.status_code == 200
    assert response.templates[0].name == "admin/django_xjobs/dashboard.html"
    assert response.context["board"].queues
    # The project's admin keeps the models and its own index.
    assert admin_client.get("/admin/django_xjobs/job/").status_code == 200
    assert "django_xjobs" in admin_client.get("/admin/").content.decode()


@pytest.mark.parametrize("site", SITES)
def test_every_console_page_renders_under_both_sites_and_links_within_its_own(
        admin_client, drained, site):
    other_rows()
    prefix = "/_x/" if site == "xjobs_console" else "/admin/"
    other = "/admin/" if site == "xjobs_console" else "/_x/"
    for page in console_pages(site, drained):
        assert page.startswith(prefix), page
        response = admin_client.get(page)
        assert response.status_code == 200, page
        links = re.findall(r'href="(/[^"]*)"', response.content.decode())
        assert any(link.startswith(prefix) for link in links), page
        stray = [link for link in links if link.startswith(other)]
        assert stray == [], (page, stray)


@pytest.mark.parametrize("site", SITES)
def test_the_same_permissions_guard_both_sites(client, drained, site):
    pages = console_pages(site, drained)
    # Anonymous: every page sends to the site's own login page.
    for page in pages:
        response = client.get(page)
        assert response.status_code == 302, page
        assert response["Location"].startswith(url(site, "login")), page
    # Staff without the jobs' view permission: refused like the admin refuses it.
    client.force_login(staff("nobody"))
    for page in pages:
        if page in (url(site, "index"), url(site, "app_list", "django_xjobs")):
            continue  # the admin's own index and app pages answer without a model
        assert client.get(page).status_code in (403, 404), page
    assert client.get(url(site, "django_xjobs_dashboard")).status_code == 403
    if site == "xjobs_console":
        assert client.get("/_x/").status_code == 403  # the index is the dashboard
    # view_job (and view_jobstep, view_outboxentry for their pages) open every one.
    client.force_login(staff("support", "view_job", "view_jobstep", "view_outboxentry"))
    for page in pages:
        assert client.get(page).status_code == 200, page


def test_actions_and_pauses_from_the_console_return_to_the_console(admin_client, drained):
    dead = drained["dead"]
    response = admin_client.post(url("xjobs_console", "django_xjobs_job_changelist"), {
        "action": "retry_jobs", "_selected_action": [str(dead.id)], "post": "yes",
        "_next": url("xjobs_console", "django_xjobs_job_change", dead.id)})
    assert response.status_code == 302
    assert response["Location"] == url("xjobs_console", "django_xjobs_job_change", dead.id)
    assert Job.objects.get(pk=dead.id).state == "ready"
    paused = admin_client.post(url("xjobs_console", "django_xjobs_pause"), {
        "op": "pause", "kind": "queue", "name": QUEUE, "post": "yes", "duration": "5m"})
    assert paused["Location"] == url("xjobs_console", "django_xjobs_dashboard")
    admin_client.post(url("xjobs_console", "django_xjobs_pause"),
                      {"op": "resume", "kind": "queue", "name": QUEUE})


# ------------------------------------------------------------------------------ the charts --


def series_points(page: str, chart: str) -> dict[str, list[str]]:
    """Per series of one chart of a page: the text of each point (``queue, time: value``)."""
    svg = re.search(rf'<svg[^>]*id="{chart}".*?</svg>', page, re.S)
    assert svg, chart
    found: dict[str, list[str]] = {}
    for name, body in re.findall(r'<g class="xjobs-series" data-series="([^"]*)"[^>]*>(.*?)</g>',
                                 svg.group(0), re.S):
        found[name] = re.findall(r"<title>([^<]*)</title>", body)
    return found


def test_the_dashboard_charts_show_what_a_drain_did(admin_client, drained):
    page = admin_client.get("/_x/").content.decode()
    done = series_points(page, "xjobs-chart-throughput")[QUEUE]
    assert len(done) == 60  # one point per minute of the hour
    assert sum(int(p.rsplit(": ", 1)[1].split()[0]) for p in done) == 6
    failed = series_points(page, "xjobs-chart-failures")[QUEUE]
    # Two failed runs of the flaky job, two of the job that died of its second.
    assert sum(int(p.rsplit(": ", 1)[1].split()[0]) for p in failed) == 4
    assert series_points(page, "xjobs-chart-wait")[QUEUE]  # some minute had starts
    (q,) = [r for r in admin_client.get("/_x/").context["board"].queues if r.queue == QUEUE]
    assert (q.done_24h, q.failed_24h, q.dead_24h) == (6, 4, 1)
    for window, buckets in (("day", 24), ("week", 28)):
        page = admin_client.get(f"/_x/?window={window}").content.decode()
        assert len(series_points(page, "xjobs-chart-throughput")[QUEUE]) == buckets


def test_a_bad_window_says_so_and_shows_the_hour(admin_client, drained):
    response = admin_client.get("/_x/?window=fortnight")
    assert response.status_code == 200
    page = response.content.decode()
    assert "There is no chart window &#x27;fortnight&#x27;: choose hour, day or week" in page
    assert response.context["window"] == "hour"
    assert len(series_points(page, "xjobs-chart-throughput")[QUEUE]) == 60
    queue_page = admin_client.get(
        url("xjobs_console", "django_xjobs_queue", QUEUE) + "?window=%00x")
    assert queue_page.status_code == 200 and queue_page.context["window"] == "hour"


def test_the_queue_page_has_its_live_buckets_and_its_three_charts(admin_client, drained):
    testapp_jobs.record.using(queue=QUEUE).enqueue(tag="waiting")
    dashboard = admin_client.get("/_x/").content.decode()
    queue_url = url("xjobs_console", "django_xjobs_queue", QUEUE)
    assert f'href="{queue_url}"' in dashboard  # the queue table links to it
    response = admin_client.get(queue_url)
    q = response.context["q"]
    assert (q.ready, q.done_24h, q.dead_24h) == (1, 6, 1)
    page = response.content.decode()
    for chart in ("throughput", "failures", "wait"):
        assert list(series_points(page, f"xjobs-chart-{chart}")) == [QUEUE], chart
    assert admin_client.get(url("xjobs_console", "django_xjobs_queue", "no-such-q")
                            ).status_code == 200  # an idle queue: zeros, flat charts
    assert admin_client.get("/_x/django_xjobs/job/queue/bad%20name/").status_code == 404


def test_a_queue_name_is_escaped_in_the_charts(admin_client):
    # Queue names are [A-Za-z0-9_.:-]: nothing to escape there; the labels and the legend go
    # through the same escaping the unit tests pin (tests/unit/test_charts.py).
    api.enqueue("testapp.record", {"tag": "x"}, queue="a.b:c-d_e")
    drain_all(["a.b:c-d_e"])
    page = admin_client.get("/_x/").content.decode()
    assert "a.b:c-d_e" in series_points(page, "xjobs-chart-throughput")


@override_settings(XJOBS={"ADMIN_TENANT_SCOPE": lambda request: {"acme"}})
def test_no_chart_under_a_tenant_scope(admin_client, drained):
    for page in ("/_x/", url("xjobs_console", "django_xjobs_queue", QUEUE)):
        text = admin_client.get(page).content.decode()
        assert 'class="xjobs-chart"' not in text and "xjobs-series" not in text
        assert "counters behind them count every tenant" in text


# ------------------------------------------------------------------------ the job's page --


def test_the_job_page_shows_each_attempt_with_its_worker_and_error(admin_client, drained):
    page = admin_client.get(url("xjobs_console", "django_xjobs_job_change",
                                drained["flaky"].id)).content.decode()
    panel = page.split('id="xjobs-attempts"', 1)[1].split("</fieldset>", 1)[0]
    rows = re.findall(r'<tr class="xjobs-attempt" data-outcome="(\w+)">(.*?)</tr>', panel, re.S)
    assert [outcome for outcome, _ in rows] == ["failed", "failed", "done"]
    history = api.get_job(drained["flaky"].id).attempts
    for n, (_outcome, row) in enumerate(rows, start=1):
        assert f'<td class="num">{n}</td>' in row
        assert f"<td>{history[n - 1].worker}</td>" in row  # the worker that ran it
    assert "<summary><code>RuntimeError: flaky failure on attempt 1</code>" in rows[0][1]
    assert "<details" in rows[0][1] and "Traceback" in rows[0][1]
    assert "<details" not in rows[2][1]


def test_the_job_page_shows_progress_and_an_eta_while_running(admin_client):
    engine = get_engine()
    handle = testapp_jobs.record.using(queue="progress-q").enqueue(tag="long")
    (claimed,) = engine.jobs_claim(wants={"progress-q": 1}, worker_id="tests:progress",
                                   lease_ms=60_000)
    with connection.cursor() as cursor:  # the run started 10 s ago, as a long run would have
        cursor.execute("update x_jobs set started_at = now() - interval '10 seconds' "
                       "where id = %s", [handle.id])
    assert engine.job_progress_if_owned(claimed.claim, done=25, total=100,
                                        message="copying rows")
    page = admin_client.get(url("xjobs_console", "django_xjobs_job_change",
                                handle.id)).content.decode()
    panel = page.split('id="xjobs-progress"', 1)[1].split("</fieldset>", 1)[0]
    assert 'value="0.2500"' in panel and "25%" in panel and "25 of 100" in panel
    assert "copying rows" in panel and "it ends around" in panel
    assert "No run has ended yet." in page


# ------------------------------------------------------------------------------ at scale --


def plans_scanning_x_jobs(statements: list[tuple[str, object]]) -> list[str]:
    """The statements among ``statements`` whose plan reads ``x_jobs`` with a sequential scan,
    planned with sequential scans made as costly as PostgreSQL allows (``enable_seqscan =
    off``), so a small test table plans like a big one: a scan that remains is one no index
    can replace."""
    scanning = []
    for sql, params in statements:
        if "x_jobs" not in sql or not sql.lstrip().lower().startswith(("select", "with")):
            continue
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("set local enable_seqscan = off")
            cursor.execute(f"explain (format json) {sql}", params)
            plan = cursor.fetchone()[0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
        nodes = [plan[0]["Plan"]]
        while nodes:
            node = nodes.pop()
            if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") == "x_jobs":
                scanning.append(sql)
            nodes.extend(node.get("Plans", []))
    return scanning


def statements_of(action) -> list[tuple[str, object]]:
    seen: list[tuple[str, object]] = []

    def capture(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        action()
    return seen


def test_the_dashboard_reads_no_job_table_scan(admin_client, drained):
    jobs_in_every_state("scan-q", tenant_id="acme")
    steps_for(Job.objects.filter(queue="scan-q", state="suspended").get().run_id)
    other_rows()
    statements = statements_of(lambda: admin_client.get("/_x/"))
    assert any("queue_depth" in sql or "count(*) filter" in sql for sql, _ in statements)
    assert plans_scanning_x_jobs(statements) == []
    # The check finds a scan where there is one: the exact statistics read the whole table.
    exact = statements_of(lambda: get_engine().queue_stats())
    assert plans_scanning_x_jobs(exact) != []


# ----------------------------------------------------------------------------- the workers --


def test_the_health_panel_and_the_dashboard_list_the_workers_and_flag_a_stalled_one(
        admin_client):
    from django_xjobs.console.reads.health import WORKER_MAX_STALL
    from django_xjobs.management import workers_cli

    assert WORKER_MAX_STALL == workers_cli.DEFAULT_MAX_STALL  # the console judges alike
    engine = get_engine()
    engine.worker_seen("host-a:1:ok", "host-a", 1, [QUEUE], version="1.0", concurrency=4,
                       running=1, finished=20, claimed_age=1.0, loop_age=0.1)
    # A loop that has not gone round for an hour while the heartbeat thread still runs.
    engine.worker_seen("host-b:2:wedged", "host-b", 2, [QUEUE], version="1.0", concurrency=4,
                       running=4, finished=3, claimed_age=3600.0, loop_age=3600.0)
    for site in SITES:
        health = admin_client.get(url(site, "django_xjobs_health"))
        assert [w.id for w in health.context["health"].stalled] == ["host-b:2:wedged"]
        assert health.context["health"].verdict == "bad"
        page = health.content.decode()
        panel = page.split('id="xjobs-health-workers"', 1)[1].split("</div>", 1)[0]
        rows = {worker: stalled for stalled, worker in re.findall(
            r'<tr class="xjobs-worker( xjobs-stalled)?" data-worker="([^"]+)"', panel)}
        assert rows == {"host-b:2:wedged": " xjobs-stalled", "host-a:1:ok": ""}
        assert "loop has not gone round for" in panel and "1 stalled" in panel
        board = admin_client.get(url(site, "django_xjobs_dashboard")).context["board"]
        assert [w.id for w in board.workers] == ["host-b:2:wedged", "host-a:1:ok"]
    with override_settings(XJOBS={"ADMIN_TENANT_SCOPE": lambda request: {"acme"}}):
        assert admin_client.get("/_x/").context["board"].workers == []
        page = admin_client.get(url("xjobs_console", "django_xjobs_health")).content.decode()
        assert "host-b" not in page


def test_the_console_site_is_importable_from_the_console_package_as_documented():
    # docs/console.md names django_xjobs.console.site; the package loads it on first use.
    import django_xjobs.console
    from django_xjobs.console import sites

    assert django_xjobs.console.site is sites.site
    assert (sites.site.name, reverse("xjobs_console:index")) == ("xjobs_console", "/_x/")
    with pytest.raises(AttributeError):
        django_xjobs.console.no_such_name  # noqa: B018
