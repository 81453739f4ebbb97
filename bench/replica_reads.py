"""How much of the console's reading a streaming replica takes off the primary
(``make bench-replica``).

    python bench/replica_reads.py [--jobs 1000000] [--repeat 7]

Starts a PostgreSQL cluster of its own (the tests' helper, tests/private_cluster.py; needs
PostgreSQL's server binaries), fills it with ``--jobs`` jobs as ``make bench-admin`` does (the
finished ones in the history tables, 30,000 live ones in ``x_jobs``), takes a streaming replica
of it (``pg_basebackup -R``) and waits until the replica has replayed everything. Then it
renders console pages with Django's test client as a superuser, first with every read on the
primary, then with ``XJOBS["READ_DATABASE"]`` naming the replica: a dashboard refresh (the page
as its live update fetches it) and the jobs list. For each render it counts the SQL statements
each server ran and the time they took (measured around each statement, on the client), and
prints the median of ``--repeat`` renders. The replica's freshness probe is not cached between
renders here (it is for a second in production), so each render pays for it, as a refresh
every five seconds does. Figures depend on the machine; nothing here is a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import admin_pages  # noqa: E402

from tests.private_cluster import PrivateCluster, _as_postgres, find_bindir  # noqa: E402

urlpatterns: list = []
PAGES = [("dashboard refresh", "/_x/", {"HTTP_X_XJOBS_LIVE": "1"}),
         ("jobs list", "/_x/django_xjobs/job/", {})]


def urlpatterns_for_console() -> list:
    from django.urls import include, path

    return [path("_x/", include("django_xjobs.urls"))]


def measure(client: Any, url: str, headers: dict[str, str], repeat: int) -> dict[str, Any]:
    """Per server: median statements and statement time per render; the median render."""
    from django.db import connections

    from django_xjobs import replica

    per_render: list[dict[str, list[float]]] = []
    walls = []
    client.get(url, **headers)  # warm-up: templates, prepared statements, caches
    for _ in range(repeat):
        replica._probes.clear()  # each render probes, as a refresh five seconds later does
        spent: dict[str, list[float]] = defaultdict(list)

        def timed(execute: Any, sql: str, params: Any, many: bool, context: Any,
                  alias: str = "", spent: dict[str, list[float]] = spent) -> Any:
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                spent[alias].append((time.perf_counter() - started) * 1000)

        wrappers = [connections[a].execute_wrapper(
            lambda *args, a=a: timed(*args, alias=a)) for a in ("default", "replica")]
        started = time.perf_counter()
        for wrapper in wrappers:
            wrapper.__enter__()
        try:
            response = client.get(url, **headers)
        finally:
            for wrapper in reversed(wrappers):
                wrapper.__exit__(None, None, None)
        walls.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}")
        per_render.append(spent)
    return {alias: (statistics.median(len(r[alias]) for r in per_render),
                    statistics.median(sum(r[alias]) for r in per_render))
            for alias in ("default", "replica")} | {"wall": statistics.median(walls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    bindir, why = find_bindir()
    prefix, why_not = _as_postgres()
    if bindir is None or why_not:
        raise SystemExit(why or why_not)
    primary = PrivateCluster(bindir, prefix)
    replica_cluster = None
    try:
        primary.start()
        admin_pages.configure(primary.url)  # ROOT_URLCONF: this module's urlpatterns
        global urlpatterns
        urlpatterns = urlpatterns_for_console()
        from django.db import connection

        admin_pages.fill(args.jobs)
        with connection.cursor() as cur:
            for statement in admin_pages.FILL_COUNTERS:
                cur.execute(statement, {})
        replica_cluster = primary.replica()
        replica_cluster.wait_caught_up(timeout=600)
        rows = run_pages(replica_cluster.url, args.repeat)
    finally:
        if replica_cluster is not None:
            replica_cluster.destroy()
        primary.destroy()
    print(f"\nconsole reads at {args.jobs:,} jobs, per render (median of {args.repeat}): "
          "statements and time spent in them on each server\n")
    print("| page | reads | primary | replica | render |")
    print("|---|---|---:|---:|---:|")
    for label, mode, r in rows:
        (pn, pt), (rn, rt) = r["default"], r["replica"]
        print(f"| {label} | {mode} | {pn:.0f} statements, {pt:.1f} ms | "
              f"{rn:.0f} statements, {rt:.1f} ms | {r['wall']:.0f} ms |")


def run_pages(replica_url: str, repeat: int) -> list[tuple[str, str, dict[str, Any]]]:
    from django.conf import settings as django_settings
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.test import Client, override_settings

    from tests import devdb

    # The replica exists only now (a copy of the filled primary): its alias joins the settings
    # before anything opens a connection to it.
    connections.settings["replica"] = {**devdb.settings_from_url(replica_url),
                                       "CONN_MAX_AGE": None}
    connections.settings = connections.configure_settings(connections.settings)
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    base = dict(django_settings.XJOBS)
    rows = []
    for mode, xjobs in (("all on the primary", base),
                        ("READ_DATABASE", {**base, "READ_DATABASE": "replica"})):
        with override_settings(XJOBS=xjobs,
                               DATABASE_ROUTERS=["django_xjobs.routers.XJobsRouter"]):
            for label, url, headers in PAGES:
                rows.append((label, mode, measure(client, url, headers, repeat)))
    return rows


if __name__ == "__main__":
    main()
