"""Settings of the benchmark's throw-away project (bench/run.py and bench/xjobs_adapter.py).

The database URL comes from XJOBS_BENCH_DATABASE_URL. Worker knobs come from XJOBS_BENCH_*
variables so one project serves every variant.
"""

import os

from tests import devdb

SECRET_KEY = "xjobs-bench-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_xjobs", "xbench_project.benchjobs"]
_db = devdb.settings_from_url(os.environ["XJOBS_BENCH_DATABASE_URL"])
_db["CONN_MAX_AGE"] = None  # persistent connections, as any worker process wants
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
_prefetch = os.environ.get("XJOBS_BENCH_PREFETCH", "auto")
XJOBS = {
    "CONCURRENCY": int(os.environ.get("XJOBS_BENCH_CONCURRENCY", "10")),
    "PREFETCH": _prefetch if _prefetch == "auto" else int(_prefetch),
    "NOTIFY": os.environ.get("XJOBS_BENCH_NOTIFY", "1") == "1",
    "POLL_INTERVAL": os.environ.get("XJOBS_BENCH_POLL", "1s"),
}
if os.environ.get("XJOBS_BENCH_KEEP_HISTORY") == "1":
    # bench/scale.py's "history in x_jobs itself" row: finished jobs stay in x_jobs.
    XJOBS["ARCHIVE_AFTER"] = None
if os.environ.get("XJOBS_BENCH_FAIR") == "1":
    # W11's workers only (bench/run.py sets the variable): the same jobs in a queue that shares
    # its claims between tenants and in one that takes them in order.
    XJOBS["QUEUES"] = {"default": {}, "fair": {"fair_by": "tenant"}, "plain": {}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler",
                            "formatter": "timed"}},
    "formatters": {"timed": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # bench/horizon.py's workers log at INFO (the floors turned on and off, with the time).
    "loggers": {"django_xjobs": {"handlers": ["stderr"],
                                 "level": os.environ.get("XJOBS_BENCH_LOG_LEVEL", "WARNING")}},
}
