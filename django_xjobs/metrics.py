"""Metrics for Prometheus and OpenTelemetry, read from the database at each scrape
(docs/observability.md, "Metrics: Prometheus and OpenTelemetry").

Every figure is the fleet's, not a process's: the all-time counters (``engine.stats_totals``),
the live depth (``engine.queue_depth``), the outbox and the workers' rows. So any process can
serve them, and all serve the same: the view ``django_xjobs.views.metrics``, ``xjobs_worker
--metrics-port``, or a project's own registry holding :class:`XJobsCollector`.

One scrape takes one :func:`snapshot` (six reads, each through live rows, the counters'
buckets or the workers' rows, never the history). A scrape while the database cannot be read
logs why and exposes ``xjobs_up 0`` alone, so Prometheus can alert on it and the serving
thread lives on.

With a replica (``XJOBS["READ_DATABASE"]``) the snapshot reads there while it may serve
(:mod:`django_xjobs.replica`), and again on the primary should the replica fail during the
read; ``xjobs_replica_lag_seconds`` and ``xjobs_replica_fallback`` say how far behind it was
and whether this scrape read the primary instead (docs/scaling.md, "Reads on a replica").

``prometheus_client`` (``django-xjobs[prometheus]``) and ``opentelemetry-api``
(``django-xjobs[otel]``) are optional: they are imported when a collector is built or
:func:`install_otel` is called, with an error naming the extra when missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import Error as DatabaseError
from django.db import connections
from django.db.models.functions import Now

from . import conf, outbox, replica
from .engines import get_engine
from .exceptions import EngineUnavailable
from .models import WorkerRow
from .records import (
    DEFAULT_MAX_STALL,
    HISTOGRAM_BOUNDS_MS,
    Counters,
    QueueDepth,
    UnknownWait,
    WorkerRecord,
)

log = logging.getLogger("django_xjobs.metrics")

# A worker counts in xjobs_workers while its row was refreshed this recently (seconds): three
# rounds of its heartbeat's x_workers refresh (XJOBS["WORKER_SEEN_INTERVAL"], 10 s by default),
# at least a minute, so one late refresh does not make a live worker vanish.
WORKERS_SEEN_ROUNDS = 3
WORKERS_SEEN_AT_LEAST = 60.0

# The histograms' bucket bounds in seconds, as Prometheus labels them ("le").
BOUNDS_SECONDS = tuple(bound / 1000 for bound in HISTOGRAM_BOUNDS_MS)

DEPTH_STATES = ("ready", "delayed", "running", "suspended", "blocked")
OUTCOMES = ("done", "failed", "dead", "cancelled")

# What one scrape can fail on and still answer: the database down or unreachable, the tables
# not migrated.
READ_ERRORS = (DatabaseError, EngineUnavailable)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape exposes: the all-time counters per queue and job name, the live depth
    per queue, the outbox's pending rows over every outbox alias (and the oldest one's age, in
    seconds), and per queue how many workers serving it were seen lately."""

    totals: list[Counters] = field(default_factory=list)
    depth: list[QueueDepth] = field(default_factory=list)
    outbox_pending: int = 0
    outbox_oldest_age: float | None = None
    workers: dict[str, int] = field(default_factory=dict)
    stalled: dict[str, int] = field(default_factory=dict)
    # Jobs waiting for a worker that knows their name, per queue and name (docs/deployment.md).
    unknown: list[UnknownWait] = field(default_factory=list)
    # Where the figures were read (None: not read, the families' description).
    reads: replica.ReadSource | None = None

    def queues(self) -> list[str]:
        """Every queue the figures name: a queue keeps its series (at 0) once its last job has
        finished, rather than vanishing from the depth and workers gauges."""
        names = {c.queue for c in self.totals} | {d.queue for d in self.depth}
        return sorted(names | set(self.workers))


def snapshot() -> Snapshot:
    """Read the figures now, on the replica when it may serve (module docstring). Leaves this
    thread's database connections as it found them: a scrape on a server's own thread opens one
    and closes it, so idle connections do not pile up; a scrape inside a request uses the
    request's."""
    with _connections_as_found():
        figures, source = replica.read(_figures, errors=READ_ERRORS)
        return dataclasses.replace(figures, reads=source)


def _figures() -> Snapshot:
    engine = get_engine()
    pending = outbox.pending()
    return Snapshot(totals=engine.stats_totals(), depth=engine.queue_depth(),
                    outbox_pending=pending.count, outbox_oldest_age=pending.oldest_seconds,
                    workers=_workers_per_queue(),
                    stalled=_stalled_per_queue(engine.workers_list(
                        max_stall=DEFAULT_MAX_STALL)),
                    unknown=engine.jobs_unknown_waiting())


def _stalled_per_queue(workers: Iterable[WorkerRecord]) -> dict[str, int]:
    """Per queue, the workers serving it that read as stalled (records.DEFAULT_MAX_STALL)."""
    counts: dict[str, int] = {}
    for w in workers:
        if w.stalled is not None:
            for queue in w.queues:
                counts[queue] = counts.get(queue, 0) + 1
    return counts


def _workers_per_queue() -> dict[str, int]:
    settings = conf.get()
    within = max(WORKERS_SEEN_AT_LEAST, WORKERS_SEEN_ROUNDS * settings.worker_seen_interval)
    seen = (WorkerRow.objects.using(settings.database)
            .filter(seen_at__gte=Now() - timedelta(seconds=within))
            .values_list("queues", flat=True))
    counts: dict[str, int] = {}
    for queues in seen:
        for queue in queues or ():
            counts[queue] = counts.get(queue, 0) + 1
    return counts


@contextlib.contextmanager
def _connections_as_found() -> Iterator[None]:
    closed = [alias for alias in connections if connections[alias].connection is None]
    try:
        yield
    finally:
        for alias in closed:
            connections[alias].close()


def read_or_none() -> Snapshot | None:
    """:func:`snapshot`, or None (logged) when the database cannot be read."""
    try:
        return snapshot()
    except READ_ERRORS as exc:
        log.warning("metrics: the database could not be read, xjobs_up is 0: %s", exc)
        return None


def _cumulative(hist: tuple[int, ...]) -> list[int]:
    """Counts per bucket (the last one above every bound) as Prometheus's cumulative "le"
    buckets, +Inf last; all zeros for an empty histogram."""
    counts = list(hist) or [0] * (len(HISTOGRAM_BOUNDS_MS) + 1)
    running, out = 0, []
    for n in counts:
        running += n
        out.append(running)
    return out


# ---------------------------------------------------------------------------- Prometheus --

def _prometheus() -> Any:
    try:
        # Optional (django-xjobs[prometheus]): only processes that export metrics need it.
        import prometheus_client.core
    except ImportError:
        raise ImproperlyConfigured(
            "Prometheus metrics need prometheus_client: pip install 'django-xjobs[prometheus]'"
        ) from None
    return prometheus_client.core


class XJobsCollector:
    """A ``prometheus_client`` collector of the figures of :func:`snapshot`, read once per
    scrape. The view and ``--metrics-port`` serve it from a registry of their own; a project
    that wants it beside its own metrics registers it::

        prometheus_client.REGISTRY.register(XJobsCollector())
    """

    def __init__(self) -> None:
        self._core = _prometheus()

    def describe(self) -> Iterable[Any]:
        """The metric families without samples: a registry checks the names without reading
        the database (on registration, at start-up)."""
        return self._families(Snapshot())

    def collect(self) -> Iterable[Any]:
        figures = read_or_none()
        if figures is None:
            return [self._up(False)]
        return self._families(figures)

    def _up(self, up: bool) -> Any:
        return self._core.GaugeMetricFamily(
            "xjobs_up", "1 when the job tables could be read for this scrape, 0 when not",
            value=1 if up else 0)

    def _families(self, s: Snapshot) -> list[Any]:
        core = self._core
        jobs = core.CounterMetricFamily(
            "xjobs_jobs", "Jobs that ended in each outcome (failed: failed runs, retried or not)",
            labels=["queue", "name", "outcome"])
        enqueued = core.CounterMetricFamily("xjobs_jobs_enqueued", "Jobs enqueued",
                                            labels=["queue", "name"])
        started = core.CounterMetricFamily("xjobs_jobs_started", "Runs started",
                                           labels=["queue", "name"])
        wait = core.HistogramMetricFamily(
            "xjobs_job_wait_seconds", "Wait from due to start of each run",
            labels=["queue", "name"])
        run = core.HistogramMetricFamily(
            "xjobs_job_run_seconds", "Run time of each finished run", labels=["queue", "name"])
        for c in s.totals:
            labels = [c.queue, c.name or ""]
            for outcome in OUTCOMES:
                jobs.add_metric([*labels, outcome], getattr(c, outcome))
            enqueued.add_metric(labels, c.enqueued)
            started.add_metric(labels, c.started)
            wait.add_metric(labels, _buckets(c.wait_hist), c.wait_ms_sum / 1000)
            run.add_metric(labels, _buckets(c.run_hist), c.run_ms_sum / 1000)

        depth = core.GaugeMetricFamily("xjobs_queue_depth", "Live jobs per queue and state",
                                       labels=["queue", "state"])
        oldest = core.GaugeMetricFamily(
            "xjobs_oldest_ready_age_seconds",
            "How long the oldest due job of the queue has waited (0 when none is due)",
            labels=["queue"])
        workers = core.GaugeMetricFamily(
            "xjobs_workers", "Worker processes serving the queue, seen lately",
            labels=["queue"])
        stalled = core.GaugeMetricFamily(
            "xjobs_workers_stalled",
            "Worker processes serving the queue that read as stalled (no heartbeat, a wedged "
            "loop, or no claim while a job was due, for 5 minutes)", labels=["queue"])
        by_queue = {d.queue: d for d in s.depth}
        for queue in s.queues():
            d = by_queue.get(queue) or QueueDepth(queue=queue)
            for state in DEPTH_STATES:
                depth.add_metric([queue, state], getattr(d, state))
            oldest.add_metric([queue], d.oldest_ready_age or 0.0)
            workers.add_metric([queue], s.workers.get(queue, 0))
            stalled.add_metric([queue], s.stalled.get(queue, 0))

        pending = core.GaugeMetricFamily(
            "xjobs_outbox_pending", "Staged jobs (enqueue_on_commit) not relayed yet",
            value=s.outbox_pending)
        pending_age = core.GaugeMetricFamily(
            "xjobs_outbox_oldest_age_seconds",
            "Age of the oldest staged job not relayed yet (0 when none)",
            value=s.outbox_oldest_age or 0.0)
        unknown = core.GaugeMetricFamily(
            "xjobs_jobs_unknown", "Jobs waiting for a worker that knows their name (no worker "
            "that claimed them does)", labels=["queue", "name"])
        unknown_age = core.GaugeMetricFamily(
            "xjobs_jobs_unknown_oldest_age_seconds",
            "How long the oldest job of the name has waited for a worker that knows it",
            labels=["queue", "name"])
        for u in s.unknown:
            unknown.add_metric([u.queue, u.name], u.count)
            unknown_age.add_metric([u.queue, u.name], u.waited)
        return [self._up(True), jobs, enqueued, started, wait, run, depth, oldest, workers,
                stalled, pending, pending_age, unknown, unknown_age, *self._replica(s)]

    def _replica(self, s: Snapshot) -> list[Any]:
        """The replica's families, when XJOBS["READ_DATABASE"] gives the jobs alias one."""
        if conf.get().read_database is None:
            return []
        lag = self._core.GaugeMetricFamily(
            "xjobs_replica_lag_seconds", REPLICA_LAG_HELP, labels=["replica"])
        fallback = self._core.GaugeMetricFamily(
            "xjobs_replica_fallback", REPLICA_FALLBACK_HELP, labels=["replica"])
        if s.reads is not None and s.reads.replica is not None:
            lag.add_metric([s.reads.replica], _lag(s.reads))
            fallback.add_metric([s.reads.replica], 1 if s.reads.fell_back else 0)
        return [lag, fallback]


REPLICA_LAG_HELP = ("How far the replica of XJOBS['READ_DATABASE'] was behind the primary when "
                    "this scrape chose where to read, in seconds (NaN when unknown: unreachable)")
REPLICA_FALLBACK_HELP = ("1 when this scrape read the primary because the replica could not "
                         "serve (unreachable, too far behind, failed during the read), 0 when it "
                         "read the replica")


def _lag(source: replica.ReadSource) -> float:
    return math.nan if source.lag is None else source.lag


def _buckets(hist: tuple[int, ...]) -> list[tuple[str, float]]:
    cumulative = _cumulative(hist)
    les = [repr(bound) for bound in BOUNDS_SECONDS] + ["+Inf"]
    return list(zip(les, cumulative, strict=True))


def registry() -> Any:
    """A ``prometheus_client`` registry holding only :class:`XJobsCollector` (never the global
    ``REGISTRY``: a project's own metrics stay its own)."""
    reg = _prometheus().CollectorRegistry()
    reg.register(XJobsCollector())
    return reg


def serve(port: int, addr: str = "") -> Callable[[], None]:
    """Serve :func:`registry` over HTTP on ``port`` (every interface unless ``addr``), each
    scrape on a thread of the server's; the function that stops the server. Raises OSError
    when the port cannot be bound (in use, no permission)."""
    reg = registry()
    # Optional (django-xjobs[prometheus]); registry() said which extra when it is missing.
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=addr or "0.0.0.0", registry=reg)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


# ------------------------------------------------------------------------- OpenTelemetry --

# The instruments' callbacks of one collection run one after another: they share a snapshot
# taken at most this long before (seconds), so one collection reads the database once.
OTEL_SNAPSHOT_MAX_AGE = 1.0


class _Shared:
    """The latest snapshot (or None: the read failed), reused for OTEL_SNAPSHOT_MAX_AGE."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: float | None = None
        self._figures: Snapshot | None = None

    def get(self) -> Snapshot | None:
        with self._lock:
            now = time.monotonic()
            if self._at is None or now - self._at > OTEL_SNAPSHOT_MAX_AGE:
                self._figures = read_or_none()
                self._at = now
            return self._figures


def install_otel(meter_provider: Any = None) -> None:
    """Register the same figures as OpenTelemetry observable instruments on ``meter_provider``
    (default: the global one), under the Prometheus names. Call it once, where the project sets
    up its MeterProvider.

    Histograms cannot be observed in OpenTelemetry (an observable instrument reports a value,
    not a distribution), so the wait and run times are their sums and counts:
    ``xjobs_job_wait_seconds_sum`` / ``_count`` and ``xjobs_job_run_seconds_sum`` / ``_count``.
    """
    try:
        # Optional (django-xjobs[otel]): only a project that exports OpenTelemetry needs it.
        from opentelemetry import metrics as otel
    except ImportError:
        raise ImproperlyConfigured(
            "OpenTelemetry metrics need opentelemetry-api: pip install 'django-xjobs[otel]'"
        ) from None
    meter = (meter_provider or otel.get_meter_provider()).get_meter("django_xjobs")
    shared = _Shared()

    def observe(figures: Callable[[Snapshot], Iterable[tuple[float, dict[str, str]]]]
                ) -> Callable[[Any], list[Any]]:
        def callback(_options: Any) -> list[Any]:
            s = shared.get()
            if s is None:
                return []
            return [otel.Observation(value, attributes) for value, attributes in figures(s)]
        return callback

    def per_name(value: Callable[[Counters], float]) -> Callable[[Snapshot], Iterable[Any]]:
        return lambda s: ((value(c), {"queue": c.queue, "name": c.name or ""})
                          for c in s.totals)

    def per_queue(value: Callable[[Snapshot, str], float]) -> Callable[[Snapshot], Any]:
        return lambda s: ((value(s, q), {"queue": q}) for q in s.queues())

    def depth_of(s: Snapshot, queue: str) -> QueueDepth:
        return next((d for d in s.depth if d.queue == queue), QueueDepth(queue=queue))

    meter.create_observable_gauge(
        "xjobs_up", description="1 when the job tables could be read, 0 when not",
        callbacks=[lambda _o: [otel.Observation(0 if shared.get() is None else 1)]])
    meter.create_observable_counter(
        "xjobs_jobs_total", description="Jobs that ended in each outcome (failed: failed runs)",
        callbacks=[observe(lambda s: (
            (getattr(c, outcome), {"queue": c.queue, "name": c.name or "", "outcome": outcome})
            for c in s.totals for outcome in OUTCOMES))])
    meter.create_observable_counter(
        "xjobs_jobs_enqueued_total", description="Jobs enqueued",
        callbacks=[observe(per_name(lambda c: c.enqueued))])
    meter.create_observable_counter(
        "xjobs_jobs_started_total", description="Runs started",
        callbacks=[observe(per_name(lambda c: c.started))])
    for metric in ("wait", "run"):
        meter.create_observable_counter(
            f"xjobs_job_{metric}_seconds_sum", unit="s",
            description=f"Sum of the {metric} times of the runs",
            callbacks=[observe(per_name(_seconds_sum(metric)))])
        meter.create_observable_counter(
            f"xjobs_job_{metric}_seconds_count",
            description=f"How many runs the {metric} time sum adds up",
            callbacks=[observe(per_name(_count(metric)))])
    meter.create_observable_gauge(
        "xjobs_queue_depth", description="Live jobs per queue and state",
        callbacks=[observe(lambda s: (
            (getattr(depth_of(s, q), state), {"queue": q, "state": state})
            for q in s.queues() for state in DEPTH_STATES))])
    meter.create_observable_gauge(
        "xjobs_oldest_ready_age_seconds", unit="s",
        description="How long the oldest due job has waited (0 when none is due)",
        callbacks=[observe(per_queue(lambda s, q: depth_of(s, q).oldest_ready_age or 0.0))])
    meter.create_observable_gauge(
        "xjobs_workers", description="Worker processes serving the queue, seen lately",
        callbacks=[observe(per_queue(lambda s, q: s.workers.get(q, 0)))])
    meter.create_observable_gauge(
        "xjobs_workers_stalled", description="Worker processes serving the queue that read as "
                                             "stalled",
        callbacks=[observe(per_queue(lambda s, q: s.stalled.get(q, 0)))])
    meter.create_observable_gauge(
        "xjobs_jobs_unknown", description="Jobs waiting for a worker that knows their name",
        callbacks=[observe(lambda s: ((u.count, {"queue": u.queue, "name": u.name})
                                      for u in s.unknown))])
    meter.create_observable_gauge(
        "xjobs_jobs_unknown_oldest_age_seconds", unit="s",
        description="How long the oldest job of the name has waited for a worker that knows it",
        callbacks=[observe(lambda s: ((u.waited, {"queue": u.queue, "name": u.name})
                                      for u in s.unknown))])
    meter.create_observable_gauge(
        "xjobs_outbox_pending", description="Staged jobs not relayed yet",
        callbacks=[observe(lambda s: [(s.outbox_pending, {})])])
    meter.create_observable_gauge(
        "xjobs_outbox_oldest_age_seconds", unit="s",
        description="Age of the oldest staged job not relayed yet (0 when none)",
        callbacks=[observe(lambda s: [(s.outbox_oldest_age or 0.0, {})])])
    if conf.get().read_database is not None:
        def reads(value: Callable[[replica.ReadSource], float]) -> Callable[[Snapshot], Any]:
            return lambda s: [] if s.reads is None or s.reads.replica is None else [
                (value(s.reads), {"replica": s.reads.replica})]

        meter.create_observable_gauge(
            "xjobs_replica_lag_seconds", unit="s", description=REPLICA_LAG_HELP,
            callbacks=[observe(reads(_lag))])
        meter.create_observable_gauge(
            "xjobs_replica_fallback", description=REPLICA_FALLBACK_HELP,
            callbacks=[observe(reads(lambda r: 1 if r.fell_back else 0))])


def _seconds_sum(metric: str) -> Callable[[Counters], float]:
    """The sum of the ``metric`` (wait, run) times of a row's runs, in seconds."""
    return lambda c: getattr(c, f"{metric}_ms_sum") / 1000


def _count(metric: str) -> Callable[[Counters], float]:
    """How many runs a row's ``metric`` (wait, run) histogram counts."""
    return lambda c: sum(getattr(c, f"{metric}_hist"))
