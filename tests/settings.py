"""Settings for the test suite: a real PostgreSQL (DATABASE_URL, else 127.0.0.1:5432, else the
embedded pgserver; see devdb.py). Worker subprocesses started by acceptance tests
use these settings too, with XJOBS_TEST_DB_NAME naming the test database pytest-django made."""

import os

from tests import devdb

_url, DATABASE_SOURCE = devdb.resolve()  # printed in pytest's header (tests/conftest.py)
if "DATABASE_URL" not in os.environ:
    os.environ["DATABASE_URL"] = _url  # child processes use the same server
    os.environ[devdb.ENV_SOURCE] = DATABASE_SOURCE

SECRET_KEY = "xjobs-tests-not-secret"
# Django's stock hasher (PBKDF2, 1.5 million rounds) spends most of a second of CPU on each
# password: every test that makes an admin (pytest-django's admin_client) or logs in paid it,
# about two minutes over the suite. The tests check who may see and do what in the console,
# never how a password is stored.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the live server of the console's browser test serves them
    "rangefilter",
    "django_xjobs",
    "tests.testapp",
]

_db = devdb.settings_from_url(_url)
if os.environ.get("XJOBS_TEST_DB_NAME"):  # a worker subprocess: use the test database directly
    _db["NAME"] = os.environ["XJOBS_TEST_DB_NAME"]
_db["CONN_MAX_AGE"] = 0
_db["TEST"] = {"NAME": os.environ.get("XJOBS_TEST_DB", "test_xjobs")}
DATABASES = {"default": _db}

# ---- outbox: a second database for the two-database tests (test_outbox_two_databases.py) ----
# Created by pytest-django only when a collected test asks for it (databases=[..., "jobs"]);
# its test name derives from the default's, so each engineer's run has its own. The job tables
# go on it when a test sets XJOBS["DATABASE"] = "jobs" (override_settings, or
# XJOBS_TEST_SETTINGS for subprocesses); XJOBS_TEST_ROUTERS=1 lists XJobsRouter.
_jobs_db = dict(_db)
_jobs_db["TEST"] = {"NAME": f"{_db['TEST']['NAME']}_jobs"}
if os.environ.get("XJOBS_TEST_JOBS_DB_NAME"):  # a subprocess: the jobs test database directly
    _jobs_db["NAME"] = os.environ["XJOBS_TEST_JOBS_DB_NAME"]
DATABASES["jobs"] = _jobs_db
if os.environ.get("XJOBS_TEST_ROUTERS"):
    DATABASE_ROUTERS = ["django_xjobs.routers.XJobsRouter"]
# ---- end outbox ----

# ---- a direct connection beside a pooler (tests/acceptance/test_pooler.py): a worker whose
# DATABASE_URL is a PgBouncer gets the server itself as "direct" (XJOBS_TEST_LISTEN_URL), for
# XJOBS["LISTEN_DATABASE"] = "direct"; same database name as "default".
if os.environ.get("XJOBS_TEST_LISTEN_URL"):
    DATABASES["direct"] = devdb.settings_from_url(
        os.environ["XJOBS_TEST_LISTEN_URL"], NAME=_db["NAME"], CONN_MAX_AGE=0,
        TEST={"MIRROR": "default"})

# ---- several servers at once (tests/private_cluster.py, env_for): a child of a test on private
# clusters (shards, a replica) sees each of them as an alias, given as JSON {"alias":
# "postgres://..."} in XJOBS_TEST_EXTRA_DATABASES (an alias here, "jobs" included, is replaced).
# Only children get it; should the test process have it, MIRROR keeps pytest-django from making
# test databases for these aliases (it points them at the default's test database instead).
if os.environ.get("XJOBS_TEST_EXTRA_DATABASES"):
    import json

    for _alias, _extra_url in json.loads(os.environ["XJOBS_TEST_EXTRA_DATABASES"]).items():
        if _alias == "default":
            raise ValueError("XJOBS_TEST_EXTRA_DATABASES: 'default' comes from DATABASE_URL")
        DATABASES[_alias] = devdb.settings_from_url(_extra_url, CONN_MAX_AGE=0,
                                                    TEST={"MIRROR": "default"})

XJOBS = {
    "LEASE": "30s",
    "HEARTBEAT": "5s",
    "POLL_INTERVAL": "0.2s",
    "RETRY_BASE": "0.05s",
    "RETRY_CAP": "0.2s",
    "SHUTDOWN_GRACE": "5s",
}
if os.environ.get("XJOBS_TEST_SETTINGS"):  # acceptance tests pass worker timings this way
    import json

    XJOBS.update(json.loads(os.environ["XJOBS_TEST_SETTINGS"]))

# ---- django.tasks backend (read by Django 6+ only; tests/integration/test_django_tasks.py) ----
TASKS = {
    "default": {
        "BACKEND": "django_xjobs.tasks.XJobsBackend",
        "QUEUES": ["default", "other"],
    },
    # A second backend of another kind: its tasks must never run in an xjobs worker.
    "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_xjobs.middleware.EnqueuedByMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
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
STATIC_URL = "/static/"
# Django 6.1+ sends mail through MAILERS (earlier versions ignore it); tests get locmem either
# way. Mailed by the example of docs/testing.md (tests/integration/testing_example/).
MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_xjobs": {"handlers": ["stderr"], "level": os.environ.get(
        "XJOBS_LOG_LEVEL", "WARNING")}},
}
if os.environ.get("XJOBS_TEST_LOG_JSON"):  # a worker whose log a test reads line by line
    # One JSON object a line (tests/testapp/logs.py), the job's attributes added by the filter
    # docs/observability.md ("Logs") shows, also to the lines of the test jobs' own logger.
    LOGGING["formatters"] = {"json": {"()": "tests.testapp.logs.JSONLines"}}
    LOGGING["filters"] = {"job": {"()": "django_xjobs.context.JobLogFilter"}}
    LOGGING["handlers"]["stderr"].update(formatter="json", filters=["job"])
    LOGGING["loggers"]["tests.testapp"] = {"handlers": ["stderr"], "level": "INFO"}
