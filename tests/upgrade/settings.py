"""Settings of every process the upgrade driver (run.py) starts, old version and new alike:
the database it names in XJOBS_UPGRADE_DB on the suite's server (tests/devdb.py), django_xjobs
(from whichever version is first on PYTHONPATH) and the jobs of tests/upgrade/app."""

import os

from tests import devdb

_url, _source = devdb.resolve()
SECRET_KEY = "xjobs-upgrade-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_xjobs",
                  "tests.upgrade.app"]
DATABASES = {"default": devdb.settings_from_url(
    _url, NAME=os.environ.get("XJOBS_UPGRADE_DB", "xjobs_upgrade"), CONN_MAX_AGE=0)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
XJOBS = {
    "LEASE": "30s",
    "HEARTBEAT": "5s",
    "POLL_INTERVAL": "0.2s",
    "SHUTDOWN_GRACE": "10s",
}
# Warnings and errors of django_xjobs (and anything else) on stderr, which the driver keeps in
# a log file per process and reads for ERROR and Traceback.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {"django_xjobs": {"level": "INFO"}},
}
