"""django-xjobs adapter for the peers' benchmark harness, used by `make bench-peers` (the
Makefile target says how it runs the harness; docs/performance.md, "Beside the peers").

The project under test is bench/xbench_project (two jobs: bench.noop, bench.lat). Workers are
`python -m django xjobs_worker` processes; enqueue uses the public API (`noop.enqueue(i=...)`,
one autocommit transaction per call; `enqueue_many` for W2, one statement per 1,000 jobs).

This file is imported by the harness (which puts its own directory on sys.path), never by the
project's test suite.
"""

from __future__ import annotations

import os
from pathlib import Path

from adapters.base import Adapter, Client, WorkerSpec, dist_version
from common import url

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # holds tests/devdb.py, which xbench_project/settings.py imports
DB = "xb_django_xjobs"
CONCURRENCY = int(os.environ.get("XBENCH_XJOBS_CONCURRENCY", "10"))
PREFETCH = os.environ.get("XBENCH_XJOBS_PREFETCH", "auto")


class XJobsAdapter(Adapter):
    name = "django-xjobs"
    label = "django-xjobs"
    dbname = DB
    # Where the workers and the client import the project (xbench_project) and the package
    # (django_xjobs, tests/devdb.py) from: this checkout (xjobs_baseline_adapter.py: another).
    project_dir = HERE
    source_dir = ROOT
    defaults = {"concurrency": CONCURRENCY, "prefetch": PREFETCH}
    notes = [
        "`xjobs_worker`: claims up to concurrency + prefetch - in-flight jobs per statement "
        "(lateral scan per queue, FOR UPDATE SKIP LOCKED, fresh lease token per claim), runs "
        "sync jobs in `concurrency` threads, acknowledges finished jobs in one fenced statement "
        "per batch, renews all leases in one statement per heartbeat; LISTEN/NOTIFY wake-ups "
        "with a 1 s poll fallback; finished jobs stay in x_jobs (state done) until the "
        "maintenance moves them to the history tables, 10 s after they finish.",
    ]

    def unavailable_reason(self):
        try:
            import django_xjobs  # noqa: F401
        except ImportError:
            return "django_xjobs is not installed in the bench venv (set XBENCH_EXTRA_PIP)"
        return None

    def versions(self):
        return {"Django": dist_version("Django"), "django-xjobs": dist_version("django-xjobs"),
                "psycopg": dist_version("psycopg")}

    def env(self) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": "xbench_project.settings",
            "XJOBS_BENCH_DATABASE_URL": url(self.dbname),
            "XJOBS_BENCH_CONCURRENCY": str(self.opts["concurrency"]),
            "XJOBS_BENCH_PREFETCH": str(self.opts["prefetch"]),
            "PYTHONPATH": os.pathsep.join(
                [str(self.project_dir), str(self.source_dir),
                 *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }

    def worker_description(self):
        return (
            f"{self.n_workers} x `django-admin xjobs_worker` (concurrency "
            f"{self.opts['concurrency']} threads, prefetch {self.opts['prefetch']}, lease 30 s, "
            "heartbeat 10 s, LISTEN/NOTIFY + 1 s poll, WARNING logging, CONN_MAX_AGE=None)"
        )

    def install(self, env):
        e = dict(env)
        e.update(self.env())
        self.run_cmd([self.py(), "-m", "django", "migrate", "-v", "0"], e)

    def queue_tables(self):
        return ["x_jobs", "x_job_steps"]

    def enqueued_sql(self):
        return "SELECT count(*) FROM x_jobs"

    def remaining_sql(self):
        return "SELECT count(*) FROM x_jobs WHERE state <> 'done'"

    def succeeded_sql(self):
        return "SELECT count(*) FROM x_jobs WHERE state = 'done'"

    def span_sql(self):
        return ("SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at))"
                " FROM x_jobs WHERE state = 'done'")

    def worker_spec(self, idx):
        return WorkerSpec([self.py(), "-m", "django", "xjobs_worker", "--worker-id",
                           f"xbench-w{idx}"], self.env())

    def make_client(self):
        os.environ.update(self.env())
        import sys

        sys.path[:0] = [str(self.project_dir), str(self.source_dir)]
        return XJobsClient()


class XJobsClient(Client):
    def open(self):
        import django

        django.setup()
        from django.db import connection
        from xbench_project.benchjobs import jobs

        self.jobs = jobs
        self.connection = connection
        connection.ensure_connection()

    def close(self):
        self.connection.close()

    def enqueue_single(self, n):
        noop = self.jobs.noop
        for i in range(n):  # autocommit: one INSERT (+ NOTIFY) transaction per enqueue
            noop.enqueue(i=i)

    def enqueue_bulk(self, n, chunk):
        from django_xjobs import enqueue_many

        for start in range(0, n, chunk):
            enqueue_many([("bench.noop", {"i": i}) for i in range(start, min(n, start + chunk))])

    def enqueue_latency(self, i, t):
        self.jobs.lat.enqueue(i=i, t=t)


ADAPTER = XJobsAdapter
