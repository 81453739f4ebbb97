"""The console in a real browser, against a real worker: the on-call engineer's path.

Debian's chromium, driven by Playwright's Python package (its own driver, never a downloaded
browser: ``executable_path``). Without a browser the test skips and says why; with
``XJOBS_REQUIRE_BROWSER=1`` (CI) a missing browser is a failure. The Makefile's test set-up
installs chromium where it can (``make browser``).

Scenario: log in; the dashboard; filter the jobs list by a date range; open a job that died in
a real worker and retry it (the worker runs it again); cancel a job that is running in the
worker (the worker stops it at its next heartbeat). And: the console's own pages draw their
breadcrumbs exactly like a stock admin page. The console's own site at ``/_x/``: its dashboard
charts a real worker's runs (in the light and the dark theme), a job that failed twice then
succeeded shows its three attempts, and the health panel flags a worker stopped with SIGSTOP.
Live updates: the dashboard, a queue's page, the filtered jobs list and a job's page show what
changed in the database without a reload, keep a checked job and an opened traceback, fetch
nothing while the tab is hidden and back off when the server stops answering (the page's clock
under the test's control: no test waits on the wall clock).
Screenshots of the dashboard (with and without charts), the jobs list, the job detail and its
attempts, the health panel (and a stalled worker) and an action's confirmation go to
``XJOBS_SCREENSHOT_DIR`` (``make screenshots`` points it at docs/img), else to the test's
temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_xjobs import api
from django_xjobs.engines import get_engine
from django_xjobs.maintenance import pruner
from django_xjobs.models import Job
from tests.acceptance.conftest import (
    FAST,
    effects,
    job_row,
    wait_effect,
    wait_started,
    wait_state,
)
from tests.conftest import wait_until
from tests.leases import quiet
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.acceptance

CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PASSWORD = "correct horse battery staple"


def _chromium() -> str | None:
    found = os.environ.get("XJOBS_CHROMIUM") or shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    return found


def _unavailable(reason: str) -> None:
    if os.environ.get("XJOBS_REQUIRE_BROWSER") == "1":
        pytest.fail(f"XJOBS_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def page(monkeypatch, tmp_path):
    """A fresh chromium page (a new profile each time)."""
    executable = _chromium()
    if executable is None:
        _unavailable("no chromium on this machine (make browser installs Debian's, as root)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[test]')")
    # Playwright's sync API keeps an asyncio loop on this thread; the ORM calls the test makes
    # between browser steps are ordinary blocking calls, not calls from a coroutine.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    profile = tempfile.mkdtemp(prefix="xjobs-chromium-", dir=tmp_path)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1680, "height": 1000},
        )
        try:
            tab = context.new_page()
            tab.set_default_timeout(30_000)
            yield tab
        finally:
            context.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    target = Path(os.environ.get("XJOBS_SCREENSHOT_DIR") or tmp_path / "screenshots")
    target.mkdir(parents=True, exist_ok=True)
    return target


def test_on_call_finds_retries_and_cancels_jobs_in_the_browser(
        live_server, spawn_worker, page, shots, django_user_model):
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", PASSWORD)
    # History and live work for the pages to show, all run by a real worker.
    for i in range(6):
        testapp_jobs.record.using(tenant_id="acme").enqueue(tag=f"order {i}")
    failed = testapp_jobs.always_fails.using(tenant_id="acme").enqueue()
    running = testapp_jobs.sleepy_polite.using(tenant_id="globex").enqueue(seconds=300)
    waiting = testapp_jobs.waiter.enqueue(event="payment.captured", key="42", timeout=3600)
    testapp_jobs.record.using(delay=timedelta(hours=2)).enqueue(tag="later")
    worker = spawn_worker("--concurrency", "4", settings=FAST)
    wait_started(worker)
    wait_state(failed.id, "dead")
    wait_state(running.id, "running")
    wait_state(waiting.id, "suspended")
    wait_until(lambda: job_row(running.id).started_at is not None, message="the sleeper to run")
    runs_before_retry = len(effects(failed.id, "start"))

    # Log in.
    page.goto(f"{live_server.url}/admin/login/?next=/admin/django_xjobs/")
    page.fill("#id_username", "oncall")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("text=Operations console")

    # The dashboard: the dead job among the latest failures, the worker among those seen.
    page.click("text=Dashboard")
    page.wait_for_selector("#xjobs-queues")
    assert "this job always fails" in page.inner_text("#xjobs-failures")
    assert worker_id_shown(page)
    page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

    # The jobs list, filtered by a date range through the range filter's own form.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/")
    today = timezone.localdate()
    form = page.locator(".admindatefilter").first  # "created"
    form.locator("input[name='created_at__range__gte_0']").fill(f"{today - timedelta(days=1)}")
    form.locator("input[name='created_at__range__gte_1']").fill("00:00:00")
    form.locator("input[name='created_at__range__lte_0']").fill(f"{today + timedelta(days=1)}")
    form.locator("input[name='created_at__range__lte_1']").fill("23:59:59")
    form.locator("input[type=submit]").first.click()
    page.wait_for_url("**created_at__range__gte_0=*")
    assert page.locator("#result_list tbody tr").count() == 10
    page.screenshot(path=str(shots / "job_list.png"), full_page=True)
    # At 1280 px the list, its last error column included, fits beside the filters (the
    # navigation sidebar starts closed on a screen that narrow).
    page.set_viewport_size({"width": 1280, "height": 1000})
    page.reload()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    right = page.evaluate("document.querySelector('#result_list').getBoundingClientRect().right")
    assert right <= page.evaluate(
        "document.querySelector('#changelist-filter').getBoundingClientRect().left")
    assert "this job always fails" in page.inner_text("#result_list .xjobs-error-line")
    page.set_viewport_size({"width": 1680, "height": 1000})
    page.goto(page.url + f"&created_at__range__lte_0={today - timedelta(days=2)}")
    assert page.locator("#result_list tbody tr").count() == 0

    # Open the failed job from the list of dead jobs; it says why it died.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/?state=dead")
    page.click(f"a[href$='/{failed.id}/change/']")
    page.wait_for_selector("#xjobs-diagnosis")
    assert "Dead after attempt 2 of 2" in page.inner_text("#xjobs-diagnosis")
    assert "ValueError: this job always fails" in page.inner_text(".field-error")
    page.screenshot(path=str(shots / "job_detail.png"), full_page=True)

    # Retry it: confirmation, then back on its page; the worker runs it again.
    page.click("#xjobs-action-retry_jobs")
    page.wait_for_selector("#xjobs-confirm")
    page.click("#xjobs-confirm")
    page.wait_for_selector("text=Retried 1 job.")
    assert page.url.endswith(f"/{failed.id}/change/")
    assert job_row(failed.id).enqueued_by == "admin:oncall"
    wait_effect(failed.id, "start", count=runs_before_retry + 1)

    # Cancel the running job from the list: select it, pick the action, give a reason.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/?state=running")
    page.check(f"input[name='_selected_action'][value='{running.id}']")
    page.select_option("select[name=action]", "cancel_jobs")
    page.locator(".actions button[type=submit]").first.click()
    page.wait_for_selector("#xjobs-confirm")
    page.fill("#id_reason", "stuck for the customer, restarting by hand")
    page.click("#xjobs-confirm")
    page.wait_for_selector("text=Cancelled 1 job.")
    row = job_row(running.id)
    assert row.state == "cancelled"
    assert row.last_error == "cancelled: stuck for the customer, restarting by hand (admin:oncall)"
    # The worker learns at its next heartbeat and stops the run; the job stays cancelled.
    wait_effect(running.id, "end")
    assert job_row(running.id).state == "cancelled"
    # Find a job by words of its error in the search box: the list shows its error line.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/")
    page.fill("#searchbar", "always fails")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=always*")
    assert page.locator(f"#result_list a[href$='/{failed.id}/change/']").count() == 1
    assert page.locator("#result_list tbody tr").count() == 1
    assert "this job always fails" in page.inner_text("#result_list .xjobs-error-line")
    from django.contrib.admin.models import LogEntry

    logged = {(e.object_id, e.user.username) for e in LogEntry.objects.all()}
    assert {(str(failed.id), "oncall"), (str(running.id), "oncall")} <= logged


def worker_id_shown(page) -> bool:
    """The dashboard lists a worker process (x_workers), not stalled."""
    rows = page.locator("#xjobs-workers tr.xjobs-worker")
    return rows.count() >= 1 and "ok" in rows.first.inner_text()


# What makes a breadcrumbs bar look like the admin's: the element and its class, and how the
# browser draws it and its links (Django 6.1 styles only <ol class="breadcrumbs">; a console
# page that copied 5.2's <div class="breadcrumbs"> got no background, padding or link colour).
BREADCRUMBS_LOOK = """() => {
  const nav = document.querySelector('nav[aria-label="Breadcrumbs"]');
  if (!nav || !nav.firstElementChild) return null;
  const bar = nav.firstElementChild;
  const style = getComputedStyle(bar);
  const link = bar.querySelector('a');
  const items = [...bar.children].map(c => [c.tagName, getComputedStyle(c).display,
                                            getComputedStyle(c, '::after').content]);
  return {
    element: bar.tagName, class: bar.className, background: style.backgroundColor,
    color: style.color, padding: style.padding, margin: style.margin,
    fontSize: style.fontSize, height: Math.round(bar.getBoundingClientRect().height),
    linkColor: link && getComputedStyle(link).color,
    linkFontSize: link && getComputedStyle(link).fontSize,
    items: items.slice(0, -1),  // the current page's own crumb is its title, compared below
    trail: [...bar.querySelectorAll('a')].map(a => a.textContent.trim()),
  };
}"""


def login(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/django_xjobs/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("text=Operations console")


def test_console_pages_have_the_breadcrumbs_of_the_stock_admin(
        live_server, transactional_db, page, shots, django_user_model):
    django_user_model.objects.create_superuser("crumbs", "crumbs@example.com", PASSWORD)
    ready = testapp_jobs.record.enqueue(tag="for the confirmation page")
    login(page, live_server, "crumbs")

    # The reference of an action's confirmation: a stock admin page with the same depth (Home >
    # app > Jobs > a job).
    page.goto(f"{live_server.url}/admin/django_xjobs/job/{ready.id}/change/")
    stock = page.evaluate(BREADCRUMBS_LOOK)
    assert stock is not None and stock["trail"][0] == "Home"
    assert stock["background"] not in ("rgba(0, 0, 0, 0)", "transparent")

    # A day of history, so the health panel lists a history table: all 25 rows on one UTC day
    # (yesterday noon), whatever the time of day the test runs at.
    engine = get_engine()
    noon = engine.db_now().astimezone(UTC).replace(hour=12, minute=0) - timedelta(days=1)
    Job.objects.bulk_create([
        Job(name="testapp.record", idempotency_key=f"done-{i}", state="done",
            finished_at=noon - timedelta(minutes=i)) for i in range(25)])
    pruner.archive()
    # (The statistics count the archive's inserts once its backend reports them: within 1 s.)
    [history] = wait_until(lambda: [t for t in engine.history_tables() if t.rows == 25],
                           message="the history table's row estimate")

    # The console's own pages sit beside the models' lists: Home > app > the page, drawn like
    # the stock jobs list's (Home > app > Jobs).
    page.goto(f"{live_server.url}/admin/django_xjobs/job/")
    beside = page.evaluate(BREADCRUMBS_LOOK)
    assert beside is not None and beside["trail"] == ["Home", stock["trail"][1]]
    pages = {"Dashboard": "/admin/django_xjobs/job/dashboard/",
             "Health panel": "/admin/django_xjobs/job/health/"}
    for name, url in pages.items():
        page.goto(live_server.url + url)
        assert page.evaluate(BREADCRUMBS_LOOK) == beside, name
        current = page.locator('nav[aria-label="Breadcrumbs"] [aria-current="page"]')
        assert current.count() == 0 or current.inner_text().strip() == name
        assert page.locator('nav[aria-label="Breadcrumbs"]').inner_text().strip().endswith(name)
    assert history.table in page.locator("#xjobs-history").inner_text()
    page.screenshot(path=str(shots / "health.png"), full_page=True)  # the dashboard's: above

    # An action's confirmation page, reached as an operator reaches it.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/")
    page.check(f"input[name='_selected_action'][value='{ready.id}']")
    page.select_option("select[name=action]", "cancel_jobs")
    page.locator(".actions button[type=submit]").first.click()
    page.wait_for_selector("#xjobs-confirm")
    assert page.evaluate(BREADCRUMBS_LOOK) == stock
    page.screenshot(path=str(shots / "action_confirm.png"), full_page=True)


def test_on_call_sees_why_a_job_waits_and_pauses_and_resumes_a_queue_in_the_browser(
        live_server, spawn_worker, page, shots, django_user_model):
    from django_xjobs.engines import get_engine
    from django_xjobs.records import SlotRequest

    django_user_model.objects.create_superuser("flow", "flow@example.com", PASSWORD)
    # Both slots of key slot:busy held from outside, as by a run on another worker: the job the
    # real worker picks is blocked on its key, not run.
    get_engine().slots_acquire([SlotRequest(slot_key="slot:busy", limit=2, holder=f"other-{i}")
                                for i in range(2)], 600_000)
    waiting = testapp_jobs.slotted.enqueue(group="busy", seconds=0)
    worker = spawn_worker("--concurrency", "2", settings=FAST)
    wait_started(worker)
    wait_state(waiting.id, "blocked")
    login(page, live_server, "flow")

    # The job's page says why it is not running: its key's slots are all held.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/{waiting.id}/change/")
    page.wait_for_selector("#xjobs-blocked-by")
    why = page.inner_text("#xjobs-blocked-by")
    assert "slot:busy" in why and "other-0" in why, why
    assert "Held back by flow control on key 'slot:busy'" in page.inner_text("#xjobs-diagnosis")
    page.screenshot(path=str(shots / "job_why.png"), full_page=True)

    # The dashboard counts it as blocked; pause the queue for 30 minutes with a reason.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/dashboard/")
    row = page.locator("#xjobs-queues tbody tr", has_text="default").first
    assert "blocked" in page.inner_text("#xjobs-queues thead").lower()
    row.locator("input[type=submit][value='Pause…']").click()
    page.wait_for_selector("#xjobs-pause-form")
    page.fill("#id_duration", "30m")
    page.fill("#id_reason", "partner outage")
    page.click("#xjobs-confirm")
    page.wait_for_selector("#xjobs-queues")
    row = page.locator("#xjobs-queues tbody tr", has_text="default").first
    assert "partner outage" in row.inner_text()
    page.screenshot(path=str(shots / "dashboard_paused.png"), full_page=True)

    # A job enqueued now waits: the worker claims nothing of a paused queue.
    paused = testapp_jobs.record.enqueue(tag="while paused")
    page.goto(f"{live_server.url}/admin/django_xjobs/job/{paused.id}/change/")
    assert "queue default paused" in page.inner_text("#xjobs-blocked-by")
    assert job_row(paused.id).state == "ready"

    # Resume from the dashboard: the worker runs it.
    page.goto(f"{live_server.url}/admin/django_xjobs/job/dashboard/")
    row = page.locator("#xjobs-queues tbody tr", has_text="default").first
    row.locator("input[type=submit][value='Resume']").click()
    page.wait_for_selector("#xjobs-queues")
    wait_state(paused.id, "done")


def luminance(css_colour: str) -> float:
    """0 (black) to 1 (white), of an ``rgb(r, g, b)`` the browser computed."""
    r, g, b = (float(v) for v in re.findall(r"[\d.]+", css_colour)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


# Each point of a chart, as the browser has it: its series and the value its title gives.
CHART_POINTS = """(chart) => [...document.querySelectorAll(`svg#${chart} g.xjobs-series`)].map(
  g => [g.dataset.series, [...g.querySelectorAll('circle')].map(
    c => parseFloat(c.querySelector('title').textContent.split(': ').pop()))])"""


def test_the_console_at_x_charts_a_real_workers_runs_and_shows_each_attempt(
        live_server, spawn_worker, page, shots, django_user_model):
    django_user_model.objects.create_superuser("charts", "charts@example.com", PASSWORD)
    for i in range(8):
        testapp_jobs.record.using(queue="default").enqueue(tag=f"order {i}")
    for i in range(3):
        testapp_jobs.record.using(queue="mail").enqueue(tag=f"mail {i}")
    flaky = testapp_jobs.flaky.enqueue(fail_times=2)
    dead = testapp_jobs.always_fails.enqueue()
    # Retries a fraction of a second apart: the test does not wait out the default backoff.
    worker = spawn_worker("--concurrency", "2", "--queue", "default", "--queue", "mail",
                          settings={**FAST, "RETRY_BASE": "0.1s", "RETRY_CAP": "0.5s"})
    wait_started(worker)
    wait_state(flaky.id, "done")
    wait_state(dead.id, "dead")

    # Log in to the console's own site: its index is the dashboard.
    page.goto(f"{live_server.url}/_x/")
    page.fill("#id_username", "charts")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#xjobs-charts svg.xjobs-chart")
    assert page.url == f"{live_server.url}/_x/"
    charts = {c: dict(page.evaluate(CHART_POINTS, f"xjobs-chart-{c}"))
              for c in ("throughput", "failures", "wait")}
    assert len(charts["throughput"]["default"]) == 60
    assert sum(charts["throughput"]["default"]) == 9  # eight records and the flaky job
    assert sum(charts["throughput"]["mail"]) == 3
    assert sum(charts["failures"]["default"]) == 4  # two failed runs each
    assert charts["wait"]["default"]  # minutes in which jobs started
    # Drawn, not just present: the lines have a size on the page.
    box = page.locator("#xjobs-chart-throughput polyline").first.bounding_box()
    assert box is not None and box["width"] > 100
    page.screenshot(path=str(shots / "dashboard_charts.png"), full_page=True)
    # The admin's dark theme: the axes and texts follow its text colour (light on dark).
    page.emulate_media(color_scheme="dark")
    fill = page.evaluate("() => getComputedStyle(document.querySelector("
                         "'#xjobs-chart-throughput .xjobs-axis text')).fill")
    assert luminance(fill) > 0.5, fill
    page.emulate_media(color_scheme="light")
    fill = page.evaluate("() => getComputedStyle(document.querySelector("
                         "'#xjobs-chart-throughput .xjobs-axis text')).fill")
    assert luminance(fill) < 0.5, fill

    # The queue table links to the queue's page, with its own charts.
    page.click("#xjobs-queues a:text-is('mail')")
    page.wait_for_selector("#xjobs-queue")
    assert page.url.endswith("/_x/django_xjobs/job/queue/mail/")
    assert list(dict(page.evaluate(CHART_POINTS, "xjobs-chart-throughput"))) == ["mail"]

    # The job that failed twice, then succeeded: three attempts, each with its worker.
    page.goto(f"{live_server.url}/_x/django_xjobs/job/{flaky.id}/change/")
    rows = page.locator("#xjobs-attempts tr.xjobs-attempt")
    assert rows.count() == 3
    outcomes = [rows.nth(i).get_attribute("data-outcome") for i in range(3)]
    assert outcomes == ["failed", "failed", "done"]
    history = api.get_job(flaky.id).attempts
    for i in range(3):
        assert history[i].worker in rows.nth(i).inner_text()
    assert "RuntimeError: flaky failure on attempt 1" in rows.nth(0).inner_text()
    assert "RuntimeError: flaky failure on attempt 2" in rows.nth(1).inner_text()
    whole = rows.nth(0).locator("details pre")
    assert not whole.is_visible()
    rows.nth(0).locator("summary").click()
    assert "Traceback" in whole.inner_text()
    page.screenshot(path=str(shots / "job_attempts.png"))  # the top: the why and attempts


def test_the_health_panel_flags_a_stopped_worker_in_the_browser(
        live_server, start_worker, page, shots, django_user_model):
    import signal

    from django.db import connection

    django_user_model.objects.create_superuser("health", "health@example.com", PASSWORD)
    # Two real workers refreshing their x_workers row every half second; one is stopped.
    steady = start_worker("steady", settings={"WORKER_SEEN_INTERVAL": "0.5s"})
    stuck = start_worker("stuck", settings={"WORKER_SEEN_INTERVAL": "0.5s"})
    testapp_jobs.record.enqueue(tag="before the stop")

    def seen(wid: str):
        with connection.cursor() as cursor:
            cursor.execute("select now() - seen_at from x_workers where id = %s", [wid])
            row = cursor.fetchone()
        return row is not None and row[0] < timedelta(seconds=5)

    wait_until(lambda: seen(steady.id) and seen(stuck.id), timeout=30, message="both rows")
    stuck.signal(signal.SIGSTOP)
    try:
        quiet(stuck)  # a heartbeat statement sent just before the stop lands first
        # Its last heartbeat, moved ten minutes back: what the console's 5-minute max stall
        # would see had the process stayed stopped that long (the test does not wait it out).
        with connection.cursor() as cursor:
            cursor.execute("update x_workers set seen_at = now() - interval '10 minutes', "
                           "loop_at = now() - interval '10 minutes' where id = %s", [stuck.id])
        login(page, live_server, "health")
        page.goto(f"{live_server.url}/_x/django_xjobs/job/health/")
        panel = page.locator("#xjobs-health-workers")
        stalled = panel.locator(f"tr.xjobs-worker[data-worker='{stuck.id}']")
        assert "xjobs-stalled" in stalled.get_attribute("class")
        assert "stalled" in stalled.inner_text() and "no heartbeat for 10m" in stalled.inner_text()
        fine = panel.locator(f"tr.xjobs-worker[data-worker='{steady.id}']")
        assert "xjobs-stalled" not in fine.get_attribute("class")
        assert "ok" in fine.inner_text()
        assert "1 stalled" in panel.locator("h2").inner_text()
        assert "bad" in page.inner_text("#xjobs-verdict")
        page.screenshot(path=str(shots / "health_stalled.png"))
        # The dashboard lists it first, stalled.
        page.goto(f"{live_server.url}/_x/")
        first = page.locator("#xjobs-workers tr.xjobs-worker").first
        assert first.get_attribute("data-worker") == stuck.id
    finally:
        stuck.signal(signal.SIGCONT)
    # Running again, its heartbeat refreshes the row: the panel says ok.
    wait_until(lambda: seen(stuck.id), timeout=30, message="the heartbeat after SIGCONT")
    page.goto(f"{live_server.url}/_x/django_xjobs/job/health/")
    row = page.locator(f"#xjobs-health-workers tr.xjobs-worker[data-worker='{stuck.id}']")
    assert "xjobs-stalled" not in row.get_attribute("class")


# The live-update indicator's counters (live.js): fetches started, answers put in place, and
# fetches that failed.
LIVE = "#xjobs-live"

# Tells the page its tab is hidden or shown again, as the browser does when the tab changes.
VISIBILITY = """(state) => {
  Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => state});
  Object.defineProperty(document, 'hidden', {configurable: true, get: () => state === 'hidden'});
  document.dispatchEvent(new Event('visibilitychange'));
}"""


def test_the_console_updates_in_place_and_rests_while_the_tab_is_hidden(
        live_server, transactional_db, page, settings, django_user_model):
    from django.core.signals import request_started
    from playwright.sync_api import expect  # the page fixture skips without playwright

    from django_xjobs.testing import drain

    settings.XJOBS = {**settings.XJOBS, "CONSOLE_REFRESH": "1s",
                      "RETRY_BASE": "1h", "RETRY_CAP": "1h"}
    django_user_model.objects.create_superuser("live", "live@example.com", PASSWORD)
    fetched: list[str] = []  # the live updates that reached the server, with their query

    def count(sender, environ, **kwargs):
        if environ.get("HTTP_X_XJOBS_LIVE"):
            fetched.append(f"{environ['PATH_INFO']}?{environ.get('QUERY_STRING', '')}")

    request_started.connect(count)
    try:
        page.clock.install()  # the page's timers run as usual until the test pauses them
        login(page, live_server, "live")
        box = page.locator(LIVE)

        # The dashboard: a queue that shows up, without a reload (the marker survives one
        # document only).
        page.goto(f"{live_server.url}/admin/django_xjobs/job/dashboard/")
        page.evaluate("window.__marker = 1")
        expect(box).to_contain_text("live · updated")
        assert "live-q" not in page.inner_text("#xjobs-queues")
        one = testapp_jobs.record.using(queue="live-q").enqueue(tag="one")
        row = page.locator("#xjobs-queues tbody tr", has_text="live-q")
        expect(row.locator("td").nth(1)).to_have_text("1")  # ready
        assert page.evaluate("window.__marker") == 1

        # The queue's page.
        page.goto(f"{live_server.url}/admin/django_xjobs/job/queue/live-q/")
        page.evaluate("window.__marker = 2")
        ready = page.locator("#xjobs-queue tbody td").first
        expect(ready).to_have_text("1")
        two = testapp_jobs.record.using(queue="live-q").enqueue(tag="two")
        expect(ready).to_have_text("2")
        assert page.evaluate("window.__marker") == 2

        # The jobs list, filtered: it keeps its filter, and a checked job stays checked.
        page.goto(f"{live_server.url}/admin/django_xjobs/job/?queue=live-q")
        page.evaluate("window.__marker = 3")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(2)
        checkbox = "input[name='_selected_action'][value='{}']"
        page.check(checkbox.format(one.id))
        counter = page.locator("span.action-counter").first
        expect(counter).to_have_text("1 of 2 selected")
        three = testapp_jobs.record.using(queue="live-q").enqueue(tag="three")
        api.cancel(one.id, reason="changed under the operator")
        # The row shown changes in place; the new job waits while one is checked.
        expect(rows.filter(has=page.locator(checkbox.format(one.id)))).to_contain_text(
            "cancelled")
        expect(box).to_contain_text("new rows wait while jobs are selected")
        expect(rows).to_have_count(2)
        assert page.is_checked(checkbox.format(one.id))
        expect(counter).to_have_text("1 of 2 selected")
        page.uncheck(checkbox.format(one.id))
        expect(rows).to_have_count(3)
        # The admin's own selection counts the checkbox of the row that came in.
        page.check(checkbox.format(three.id))
        expect(counter).to_have_text("1 of 3 selected")
        assert page.evaluate("window.__marker") == 3
        assert "/admin/django_xjobs/job/?queue=live-q" in fetched
        assert two.id  # (shown in the list above)

        # A job's page: the traceback an operator opened stays open as its attempts grow.
        flaky = testapp_jobs.flaky.using(queue="live-job").enqueue(fail_times=5)
        drain(["live-job"])  # its first attempt fails; the next is an hour away
        page.goto(f"{live_server.url}/admin/django_xjobs/job/{flaky.id}/change/")
        page.evaluate("window.__marker = 4")
        attempts = page.locator("#xjobs-attempts tr.xjobs-attempt")
        expect(attempts).to_have_count(1)
        attempts.first.locator("summary").click()
        opened = attempts.first.locator("details")
        assert opened.evaluate("d => d.open")
        api.run_now(flaky.id)
        drain(["live-job"])  # the second attempt fails too
        expect(attempts).to_have_count(2)
        expect(page.locator("#xjobs-diagnosis")).to_contain_text("failure on attempt 2")
        assert attempts.first.locator("details").evaluate("d => d.open")
        assert not attempts.nth(1).locator("details").evaluate("d => d.open")
        assert "Traceback" in attempts.first.locator("pre").inner_text()
        assert page.evaluate("window.__marker") == 4

        # Hidden, it fetches nothing however long; shown again, it fetches at once. The page's
        # clock is paused: a minute of it passes when the test says so.
        page.clock.pause_at(page.evaluate("Date.now()") / 1000 + 0.5)
        started = box.get_attribute("data-fetches")
        expect(box).to_have_attribute("data-updates", started)  # none in flight
        before = len(fetched)
        page.evaluate(VISIBILITY, "hidden")
        expect(box).to_have_attribute("data-state", "hidden")
        expect(box).to_contain_text("paused while the tab is hidden")
        page.clock.run_for(60_000)
        assert box.get_attribute("data-fetches") == started
        page.evaluate(VISIBILITY, "visible")
        expect(box).to_have_attribute("data-updates", str(int(started) + 1))
        assert len(fetched) == before + 1  # the one fetch on showing, none while hidden

        # Signed out, the server answers with its login page: the page says it is stale and
        # tries again after 2 s, then 4 s, not every second.
        page.context.clear_cookies()
        page.clock.run_for(1_000)
        expect(box).to_have_attribute("data-failures", "1")
        expect(box).to_have_attribute("data-state", "stale")
        expect(box).to_contain_text("stale since")
        expect(box).to_contain_text("signed out?")
        tries = int(box.get_attribute("data-fetches"))
        page.clock.run_for(1_000)
        assert int(box.get_attribute("data-fetches")) == tries
        page.clock.run_for(1_000)
        expect(box).to_have_attribute("data-failures", "2")
        page.clock.run_for(3_000)
        assert int(box.get_attribute("data-fetches")) == tries + 1
        page.clock.run_for(1_000)
        expect(box).to_have_attribute("data-failures", "3")
        assert page.evaluate("window.__marker") == 4

        # The toggle stops it, on every console page, until the operator resumes it.
        page.locator(f"{LIVE} button").click()
        expect(box).to_have_attribute("data-state", "stopped")
        tries = int(box.get_attribute("data-fetches"))
        page.clock.run_for(600_000)
        assert int(box.get_attribute("data-fetches")) == tries
    finally:
        request_started.disconnect(count)
