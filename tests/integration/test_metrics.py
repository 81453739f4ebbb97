"""Metrics for Prometheus and OpenTelemetry (docs/observability.md, "Metrics: Prometheus and
OpenTelemetry").

A mix of jobs is drained (done, failed then dead, dead at once, cancelled) and a few are left
waiting; the view's body, parsed by prometheus_client's own parser, and the OpenTelemetry
instruments, read by the SDK's in-memory reader, must say what the rows say.
"""

from __future__ import annotations

import math
import socket
import sys
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from django_xjobs import api, metrics
from django_xjobs.models import Job, WorkerRow
from django_xjobs.records import HISTOGRAM_BOUNDS_MS, AttemptRecord
from django_xjobs.testing import drain, travel
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "metered"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, by name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples[(metric, tuple(sorted(labels.items())))]


def scrape(client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    return parse(response.content.decode())


def drain_all() -> None:
    for _ in range(40):
        drain(queues=[QUEUE])
        if not Job.objects.filter(queue=QUEUE, state__in=("ready", "delayed", "running")).exists():
            return
        travel(timedelta(seconds=5))
    pytest.fail("jobs still live after draining")


def run_mix() -> None:
    """Drained: two done, one failed twice (dead), one dead at its first failure, one cancelled;
    then left: one due for 90 s, one delayed, and a staged job not relayed."""
    on = {"queue": QUEUE}
    testapp_jobs.record.using(**on).enqueue(tag="a")
    testapp_jobs.record.using(**on).enqueue(tag="b")
    testapp_jobs.always_fails.using(**on).enqueue()
    testapp_jobs.permanent.using(**on).enqueue()
    api.cancel(testapp_jobs.record.using(**on).enqueue(tag="not needed").id)
    drain_all()
    due = testapp_jobs.record.using(**on).enqueue(tag="due")
    with connection.cursor() as cur:
        cur.execute("update x_jobs set run_at = now() - interval '90 seconds' where id = %s",
                    [due.id])
    testapp_jobs.record.using(**on, delay=3600).enqueue(tag="later")
    testapp_jobs.record.using(**on).enqueue_on_commit(tag="staged")


def entries(*outcomes: str) -> list[AttemptRecord]:
    return [e for job in Job.objects.filter(queue=QUEUE) for e in api.get_job(job.id).attempts
            if e.outcome in outcomes]


def run_ms(entry: AttemptRecord) -> int:
    """A run's time as the counters count it: from its start to its end, rounded up."""
    assert entry.duration is not None
    return max(0, math.ceil(entry.duration * 1000))


def test_the_view_exposes_what_the_rows_say(client):
    run_mix()
    WorkerRow.objects.create(id="live", host="h", pid=1, queues=[QUEUE, "other"])
    WorkerRow.objects.create(id="gone", host="h", pid=2, queues=[QUEUE])
    WorkerRow.objects.filter(id="gone").update(seen_at=datetime.now().astimezone()
                                               - timedelta(minutes=10))

    samples = scrape(client)

    assert value(samples, "xjobs_up") == 1
    rows = list(Job.objects.filter(queue=QUEUE))
    by_name: dict[str, Counter[str]] = {}
    for job in rows:
        tally = by_name.setdefault(job.name, Counter())
        tally["enqueued"] += 1
        tally[job.state] += 1
        for entry in api.get_job(job.id).attempts:
            tally["started"] += 1
            tally["failed"] += entry.outcome == "failed"
    assert set(by_name) == {"testapp.record", "testapp.always_fails", "testapp.permanent"}
    for name, tally in by_name.items():
        labels = {"queue": QUEUE, "name": name}
        for outcome in metrics.OUTCOMES:
            assert value(samples, "xjobs_jobs_total", **labels, outcome=outcome) == \
                tally[outcome], (name, outcome)
        assert value(samples, "xjobs_jobs_enqueued_total", **labels) == tally["enqueued"]
        assert value(samples, "xjobs_jobs_started_total", **labels) == tally["started"]
        # Every start waited in the queue; every run that ended has its run time.
        assert value(samples, "xjobs_job_wait_seconds_count", **labels) == tally["started"]
        assert value(samples, "xjobs_job_run_seconds_count", **labels) == tally["started"]
    assert by_name["testapp.always_fails"]["failed"] == 2
    assert by_name["testapp.always_fails"]["dead"] == 1

    # The run-time histogram, bucket by bucket, from the runs' own start and end times.
    runs = [run_ms(e) for e in entries("done", "failed")]
    got_sum = sum(value(samples, "xjobs_job_run_seconds_sum", queue=QUEUE, name=name)
                  for name in by_name)
    assert got_sum == pytest.approx(sum(runs) / 1000, abs=0.001 * len(runs))
    for bound in HISTOGRAM_BOUNDS_MS:
        got = sum(value(samples, "xjobs_job_run_seconds_bucket", queue=QUEUE, name=name,
                        le=repr(bound / 1000)) for name in by_name)
        assert got == sum(ms <= bound for ms in runs), bound
    for name in by_name:
        labels = {"queue": QUEUE, "name": name}
        for metric in ("xjobs_job_wait_seconds", "xjobs_job_run_seconds"):
            buckets = [value(samples, f"{metric}_bucket", **labels, le=repr(b / 1000))
                       for b in HISTOGRAM_BOUNDS_MS]
            inf = value(samples, f"{metric}_bucket", **labels, le="+Inf")
            assert buckets == sorted(buckets) and buckets[-1] <= inf
            assert inf == value(samples, f"{metric}_count", **labels)

    depth = {state: value(samples, "xjobs_queue_depth", queue=QUEUE, state=state)
             for state in metrics.DEPTH_STATES}
    assert depth == {"ready": 1, "delayed": 1, "running": 0, "suspended": 0, "blocked": 0}
    assert 90 <= value(samples, "xjobs_oldest_ready_age_seconds", queue=QUEUE) < 600
    assert value(samples, "xjobs_outbox_pending") == 1
    assert value(samples, "xjobs_outbox_oldest_age_seconds") >= 0
    assert value(samples, "xjobs_workers", queue=QUEUE) == 1  # "gone" was last seen 10 min ago
    assert value(samples, "xjobs_workers", queue="other") == 1
    # "gone" reads as stalled (no heartbeat for 10 min); "live" does not
    assert value(samples, "xjobs_workers_stalled", queue=QUEUE) == 1
    assert value(samples, "xjobs_workers_stalled", queue="other") == 0


def test_a_queue_whose_jobs_all_finished_keeps_its_series_at_zero(client):
    testapp_jobs.record.using(queue=QUEUE).enqueue(tag="only")
    drain_all()
    samples = scrape(client)
    assert value(samples, "xjobs_jobs_total", queue=QUEUE, name="testapp.record",
                 outcome="done") == 1
    for state in metrics.DEPTH_STATES:
        assert value(samples, "xjobs_queue_depth", queue=QUEUE, state=state) == 0
    assert value(samples, "xjobs_oldest_ready_age_seconds", queue=QUEUE) == 0
    assert value(samples, "xjobs_workers", queue=QUEUE) == 0


def test_openmetrics_when_the_scraper_asks_for_it(client):
    testapp_jobs.record.using(queue=QUEUE).enqueue(tag="x")
    response = client.get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().endswith("# EOF\n")
    assert client.post("/metrics").status_code == 405


def test_a_scrape_the_database_cannot_answer_says_xjobs_up_0(caplog):
    """A scrape on a thread whose connection goes to a port where no server listens (the
    database down): the scrape still answers, with xjobs_up 0 alone, and says why in the log."""
    import threading

    from django.db import connections
    from prometheus_client import generate_latest

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    bodies: list[bytes] = []

    def scrape_with_the_database_down() -> None:
        wrapper = connections["default"]
        wrapper.settings_dict = {**wrapper.settings_dict, "HOST": "127.0.0.1",
                                 "PORT": str(dead_port)}
        bodies.append(generate_latest(metrics.registry()))

    thread = threading.Thread(target=scrape_with_the_database_down)
    thread.start()
    thread.join()
    assert parse(bodies[0].decode()) == {("xjobs_up", ()): 0.0}
    assert "the database could not be read" in caplog.text


def test_a_scrape_leaves_no_connection_open_on_its_thread():
    import threading

    from django.db import connections

    opened: list[bool] = []

    def scrape_on_a_thread() -> None:
        metrics.snapshot()
        opened.append(connections["default"].connection is not None)

    thread = threading.Thread(target=scrape_on_a_thread)
    thread.start()
    thread.join()
    assert opened == [False]
    # A thread that had its connection open keeps it.
    connection.ensure_connection()
    metrics.snapshot()
    assert connection.connection is not None


def test_without_prometheus_client_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "prometheus_client.core", None)
    with pytest.raises(ImproperlyConfigured, match=r"django-xjobs\[prometheus\]"):
        metrics.XJobsCollector()
    with pytest.raises(CommandError, match=r"django-xjobs\[prometheus\]"):
        call_command("xjobs_worker", "--metrics-port", "9", "--burst")


def test_otel_instruments_carry_the_same_figures(client):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    run_mix()
    WorkerRow.objects.create(id="live", host="h", pid=1, queues=[QUEUE])
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.install_otel(meter_provider=provider)
    data = reader.get_metrics_data()
    provider.shutdown()
    otel: Samples = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    otel[(metric.name, tuple(sorted(point.attributes.items())))] = point.value
    prom = scrape(client)

    assert otel[("xjobs_up", ())] == 1
    shared = {key for key in otel if key[0] != "xjobs_up"}
    assert shared, otel
    for key in shared:
        # The ages grow between the two reads.
        slack = 5.0 if "age" in key[0] else 1e-9
        assert otel[key] == pytest.approx(prom[key], abs=slack), key
    # Every figure of the exposition but the histograms' buckets is an instrument.
    assert {k for k in prom if not k[0].endswith(("_bucket", "_created"))} == set(otel)


@pytest.mark.parametrize("port", ["0", "65536", "abc", "-1"])
def test_metrics_port_must_be_a_port_number(port):
    with pytest.raises(CommandError, match="must be a TCP port number, 1 to 65535"):
        call_command("xjobs_worker", "--metrics-port", port, "--burst")


def test_metrics_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"--metrics-port {port}: cannot listen there: "
                                               "Address already in use"):
            call_command("xjobs_worker", "--metrics-port", str(port), "--burst")
