"""``xjobs_worker --metrics-port``: a real worker serves the Prometheus exposition over HTTP,
scraped with urllib and parsed with prometheus_client's own parser (docs/observability.md,
"Metrics: Prometheus and OpenTelemetry")."""

from __future__ import annotations

import signal
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until

from .conftest import FAST, SETTLE, wait_exit, wait_state

pytestmark = pytest.mark.acceptance


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float] | None:
    """The samples by name and labels, or None while nothing answers on the port yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            text = r.read().decode()
    except (ConnectionError, urllib.error.URLError):
        return None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def figure(samples, metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


def scrape_connections() -> list:
    """Backends left behind by a scrape: idle ones whose last statement was its workers read."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("select pid from pg_stat_activity where datname = current_database()"
                    " and pid <> pg_backend_pid() and query like %s",
                    ['%"x_workers"."queues"%'])
        return cur.fetchall()


def test_a_worker_serves_its_metrics_and_closes_each_scrapes_connection(start_worker):
    from tests.testapp import jobs

    port = free_port()
    worker = start_worker("metrics", "--metrics-port", str(port))
    handles = [jobs.record.enqueue(tag=str(i)) for i in range(5)]
    handles.append(jobs.permanent.enqueue())
    for handle in handles[:5]:
        wait_state(handle.id, "done")
    wait_state(handles[5].id, "dead")

    labels = {"queue": "default", "name": "testapp.record"}

    def settled():
        samples = scrape(port)
        if samples is None or figure(samples, "xjobs_workers", queue="default") != 1:
            return None
        done = figure(samples, "xjobs_jobs_total", **labels, outcome="done")
        return samples if done == 5 else None

    samples = wait_until(settled, timeout=SETTLE, interval=0.2,
                         message="the scrape to show the five jobs done and the worker")
    assert figure(samples, "xjobs_up") == 1
    assert figure(samples, "xjobs_jobs_started_total", **labels) == 5
    assert figure(samples, "xjobs_job_run_seconds_count", **labels) == 5
    assert figure(samples, "xjobs_jobs_total", queue="default", name="testapp.permanent",
                  outcome="dead") == 1
    assert figure(samples, "xjobs_queue_depth", queue="default", state="ready") == 0

    # Each scrape ran on a thread of the server's with a connection of its own: closed after.
    for _ in range(5):
        assert scrape(port) is not None
    wait_until(lambda: scrape_connections() == [], timeout=SETTLE,
               message="no backend left behind by the scrapes")

    worker.signal(signal.SIGTERM)
    assert wait_exit(worker) == 0
    assert scrape(port) is None  # the port is closed with the worker


def test_under_processes_the_supervisor_serves_the_metrics(spawn_worker):
    port = free_port()
    supervisor = spawn_worker("--processes", "2", "--metrics-port", str(port), settings=FAST)

    def two_workers():
        samples = scrape(port)
        return samples if samples and figure(samples, "xjobs_workers",
                                             queue="default") == 2 else None

    samples = wait_until(two_workers, timeout=SETTLE, interval=0.2,
                         message="the supervisor's scrape to count both worker processes")
    assert figure(samples, "xjobs_up") == 1
    # Only the supervisor listens: a child given the port would have failed to bind it and
    # been restarted over and over.
    assert "cannot listen there" not in supervisor.log()
    assert "restarting" not in supervisor.log()
    supervisor.signal(signal.SIGTERM)
    assert wait_exit(supervisor) == 0
