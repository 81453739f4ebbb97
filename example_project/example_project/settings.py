"""Settings of the example project: a shop whose orders are charged and shipped by jobs.

Database: DATABASE_URL if set; else the PostgreSQL on 127.0.0.1:5432 (database `xjobs_demo`,
created by `manage.py demo`); else an embedded PostgreSQL under ../.pgdata (pgserver).
"""

import os
from pathlib import Path

from tests import devdb

BASE_DIR = Path(__file__).resolve().parent.parent

_url, DATABASE_SOURCE = devdb.resolve()
if "DATABASE_URL" not in os.environ:
    # Not the server's default database: a database of its own for the demo, created by
    # `manage.py demo`. Exported so the worker subprocess uses the very same database.
    _url = devdb.with_database(_url, "xjobs_demo")
    os.environ["DATABASE_URL"] = _url
    os.environ[devdb.ENV_SOURCE] = DATABASE_SOURCE
DATABASES = {"default": devdb.settings_from_url(_url)}

SECRET_KEY = "django-insecure-example-project-only"
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_xjobs",
    "shop",
    # A payment module written for Celery and ported by its imports (docs/from-celery.md).
    "billing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_xjobs.middleware.EnqueuedByMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "example_project.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

XJOBS = {
    "QUEUES": ["default", "payments"],
    "CONCURRENCY": 4,
    # Short retries so the demo shows a failed-then-retried job within seconds.
    "RETRY_BASE": "0.5s",
    "RETRY_CAP": "2s",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"short": {"format": "%(asctime)s %(levelname)-7s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "short"}},
    "loggers": {"django_xjobs": {"handlers": ["console"], "level": "INFO"}},
}
