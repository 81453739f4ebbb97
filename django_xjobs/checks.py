"""System checks: a bad ``XJOBS`` setting stops ``runserver``, ``migrate`` and ``xjobs_worker``
at startup with a message that names the key, instead of surfacing in a worker at 3 a.m.

Every hint says the fix in words and links the published documentation (``conf.DOCS_URL``): a
project that installed the package from PyPI has no ``docs/`` directory to look in
(tests/integration/test_checks.py::test_every_hint_says_the_fix_and_links_the_published_docs).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks
from django.db import connections

from . import conf, registry, slots
from .backfills.definition import check_alias
from .backfills.registry import all_backfills
from .conf import DOCS_URL
from .exceptions import ConfigurationError
from .scheduler.schedule import collect

POSTGRESQL = "django.db.backends.postgresql"


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    # One error per bad key: all of them at once, not one per edit-and-rerun
    # (tests/integration/test_checks.py::test_manage_py_check_lists_every_bad_xjobs_key).
    problems = conf.validate(_raw())
    if problems:
        return [checks.Error(
            problem,
            hint="Fix the value named above in the XJOBS dict of your settings (every key is "
                 "optional: removing one restores its default). Every key with its default: "
                 f"{DOCS_URL}guide.md#settings",
            id="xjobs.E001",
        ) for problem in problems]
    settings = conf.build(_raw())
    errors: list[checks.CheckMessage] = []
    if settings.database not in connections.settings:
        errors.append(checks.Error(
            f'XJOBS["DATABASE"] = {settings.database!r} is not in DATABASES',
            hint=f"Set XJOBS[\"DATABASE\"] to one of {sorted(connections.settings)}, or add "
                 f"{settings.database!r} to DATABASES. See "
                 f"{DOCS_URL}transactional-enqueue.md#a-separate-jobs-database-the-router",
            id="xjobs.E002",
        ))
    else:
        engine = connections.settings[settings.database].get("ENGINE", "")
        if "postgresql" not in engine and "postgis" not in engine:
            errors.append(checks.Error(
                f'XJOBS["DATABASE"] = {settings.database!r} uses {engine!r}; django-xjobs '
                "needs PostgreSQL for the job tables",
                hint=f'Point XJOBS["DATABASE"] at an alias whose ENGINE is "{POSTGRESQL}" '
                     f"(PostgreSQL 14 or later). See {DOCS_URL}guide.md#install",
                id="xjobs.E003",
            ))
    errors.extend(_check_listen_database(settings))
    errors.extend(_check_outbox(settings))
    errors.extend(_check_read_router(settings))
    errors.extend(_check_replica_feedback(settings, kwargs.get("databases")))
    return errors


def _check_listen_database(settings: conf.XJobsSettings) -> list[checks.CheckMessage]:
    """XJOBS["LISTEN_DATABASE"], when set, names PostgreSQL aliases of DATABASES."""
    errors: list[checks.CheckMessage] = []
    for jobs_alias, alias in settings.listen_databases.items():
        hint = (f"Set XJOBS[\"LISTEN_DATABASE\"] to an alias of DATABASES that connects "
                f"straight to PostgreSQL, to the database of {jobs_alias!r}, or remove it (the "
                f"dedicated sessions then use {jobs_alias!r}). See "
                f"{DOCS_URL}deployment.md#pgbouncer-and-other-connection-poolers")
        errors.extend(_check_alias(alias, 'XJOBS["LISTEN_DATABASE"]',
                                   "the LISTEN connections and the advisory session need "
                                   "PostgreSQL", hint, ("xjobs.E005", "xjobs.E006")))
    return errors


def _check_alias(alias: str, key: str, why: str, hint: str,
                 ids: tuple[str, str]) -> list[checks.CheckMessage]:
    """``alias`` (named by ``key``) is a PostgreSQL alias of DATABASES."""
    if alias not in connections.settings:
        return [checks.Error(f"{key} = {alias!r} is not in DATABASES "
                             f"(aliases: {sorted(connections.settings)})", hint=hint, id=ids[0])]
    engine = connections.settings[alias].get("ENGINE", "")
    if "postgresql" not in engine and "postgis" not in engine:
        return [checks.Error(f"{key} = {alias!r} uses {engine!r}; {why}", hint=hint, id=ids[1])]
    return []


# How long `check` waits for a replica to accept a connection (seconds): a replica that is down
# must not hang the command.
REPLICA_CONNECT_TIMEOUT = 3


def _check_replica_feedback(settings: conf.XJobsSettings,
                            databases: Any) -> list[checks.CheckMessage]:
    """xjobs.W030: a replica of XJOBS["READ_DATABASE"] with hot_standby_feedback on.

    It is asked only when Django runs the checks that query databases, and for it or its jobs
    alias (``manage.py check --database ALIAS``, ``migrate``), as Django's own checks that
    query a database are; on a connection of its own with a short connect timeout. A replica
    that cannot be asked is xjobs.W032, a warning too: ``check`` neither fails nor hangs on a
    replica that is down, and says it did not look."""
    found: list[checks.CheckMessage] = []
    for jobs_alias, alias in settings.read_databases.items():
        if not databases or (alias not in databases and jobs_alias not in databases):
            continue
        if alias not in connections.settings:
            continue  # xjobs.E030 says so
        wrapper = connections[alias]
        try:
            feedback = _show(wrapper, "hot_standby_feedback")
        except wrapper.Database.Error as exc:
            found.append(checks.Warning(
                f'XJOBS["READ_DATABASE"] {alias!r} could not be asked whether '
                f"hot_standby_feedback is on: {str(exc).strip() or type(exc).__name__}",
                hint=f"Run manage.py check --database {alias} again once the replica is up "
                     "(meanwhile the console, the metrics and the reports read the primary). "
                     f"See {DOCS_URL}scaling.md#reads-on-a-replica",
                id="xjobs.W032"))
            continue
        if feedback == "on":
            found.append(checks.Warning(
                f'XJOBS["READ_DATABASE"] {alias!r} has hot_standby_feedback = on: the '
                f"replica's longest query then holds the vacuum horizon of {jobs_alias!r}, "
                "the primary, so dead x_jobs tuples pile up and the claim slows exactly as "
                "under a long transaction on the primary",
                hint="Leave hot_standby_feedback off on the replica and bound the console's "
                     "queries there with max_standby_streaming_delay instead (a console query "
                     "that replay cancels is retried by the page's next refresh). See "
                     f"{DOCS_URL}scaling.md#reads-on-a-replica",
                id="xjobs.W030"))
    return found


def _check_read_router(settings: conf.XJobsSettings) -> list[checks.CheckMessage]:
    """xjobs.E033: XJOBS["READ_DATABASE"] without the router, which alone sends the console's
    ORM reads (its lists, a job's page) to the replica."""
    if not settings.read_databases:
        return []
    named = {r if isinstance(r, str) else f"{type(r).__module__}.{type(r).__qualname__}"
             for r in getattr(django_settings, "DATABASE_ROUTERS", [])}
    if ROUTER in named:
        return []
    return [checks.Error(
        f'XJOBS["READ_DATABASE"] is set but {ROUTER} is not in DATABASE_ROUTERS: the '
        "console's lists and job pages would read the primary while saying they read the "
        "replica",
        hint=f'Add DATABASE_ROUTERS = ["{ROUTER}"] to your settings (it routes only '
             f"django-xjobs' models). See {DOCS_URL}scaling.md#reads-on-a-replica",
        id="xjobs.E033")]


def _show(wrapper: Any, setting: str) -> str:
    """``show <setting>`` on a connection of its own to ``wrapper``'s database (never one Django
    keeps, nor its pool), opened with :data:`REPLICA_CONNECT_TIMEOUT` at most."""
    params = dict(wrapper.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("pool", None)
    given = params.get("connect_timeout")
    params["connect_timeout"] = min(int(given), REPLICA_CONNECT_TIMEOUT) if given \
        else REPLICA_CONNECT_TIMEOUT
    params["application_name"] = "xjobs check"
    with wrapper.Database.connect(**params, autocommit=True) as conn:
        (value,) = conn.execute(f"show {setting}").fetchone()
    return str(value)


def _check_shards(settings: conf.XJobsSettings, routers: set[str]) -> list[checks.CheckMessage]:
    """XJOBS["SHARDS"]: PostgreSQL aliases of DATABASES, routed by the router; the replicas of
    XJOBS["READ_DATABASE"] too."""
    errors: list[checks.CheckMessage] = []
    hint = ("List in XJOBS[\"SHARDS\"] only aliases of DATABASES that connect to PostgreSQL "
            f"databases of their own. See {DOCS_URL}scaling.md#sharding-by-tenant")
    for alias in settings.shards[1:]:
        errors.extend(_check_alias(alias, 'XJOBS["SHARDS"]', "every shard needs PostgreSQL",
                                   hint, ("xjobs.E007", "xjobs.E008")))
    for jobs_alias, alias in settings.read_databases.items():
        errors.extend(_check_alias(
            alias, 'XJOBS["READ_DATABASE"]', "the replica must be PostgreSQL's",
            f"Name a streaming replica of {jobs_alias!r} in DATABASES, or remove "
            f"XJOBS[\"READ_DATABASE\"]. See {DOCS_URL}scaling.md#reads-on-a-replica",
            ("xjobs.E030", "xjobs.E031")))
    if settings.shards and ROUTER not in routers:
        errors.append(checks.Error(
            f'XJOBS["SHARDS"] is set but {ROUTER} is not in DATABASE_ROUTERS: migrate would '
            "not create the job tables on the shards, and the console would read one database",
            hint=f'Add DATABASE_ROUTERS = ["{ROUTER}"] to your settings. See {DOCS_URL}'
                 "scaling.md#sharding-by-tenant",
            id="xjobs.E009",
        ))
    return errors


def check_console(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The console's jobs list filters dates with django-admin-rangefilter, whose templates
    Django finds only when "rangefilter" is an installed app: without it the page fails with
    TemplateDoesNotExist. Only the admin needs it, so only the admin's checks run this (the
    worker, which runs the django_xjobs checks alone, starts without it)."""

    if not apps.is_installed("django.contrib.admin") or apps.is_installed("rangefilter"):
        return []
    return [checks.Error(
        '"rangefilter" is not in INSTALLED_APPS: the jobs list of the django-xjobs console '
        "(the Django admin) fails with TemplateDoesNotExist",
        hint='Add "rangefilter" to INSTALLED_APPS (django-admin-rangefilter is installed with '
             f'django-xjobs): INSTALLED_APPS += ["rangefilter", "django_xjobs"]. See '
             f"{DOCS_URL}console.md#turning-it-on",
        id="xjobs.E004",
    )]


# ---------------------------------------------------------------------------------- outbox --

ROUTER = "django_xjobs.routers.XJobsRouter"


def _check_outbox(settings: conf.XJobsSettings) -> list[checks.CheckMessage]:
    """Every outbox alias exists and is PostgreSQL; job tables off "default" need a router."""

    errors: list[checks.CheckMessage] = []
    for alias in settings.outbox.databases:
        if alias not in connections.settings:
            errors.append(checks.Error(
                f'XJOBS["OUTBOX"]["DATABASES"] names {alias!r}, which is not in DATABASES',
                hint=f"Remove {alias!r} from XJOBS[\"OUTBOX\"][\"DATABASES\"], or add it to "
                     f"DATABASES. See {DOCS_URL}transactional-enqueue.md#the-relay",
                id="xjobs.E020",
            ))
            continue
        engine = connections.settings[alias].get("ENGINE", "")
        if "postgresql" not in engine and "postgis" not in engine:
            errors.append(checks.Error(
                f'XJOBS["OUTBOX"]["DATABASES"] names {alias!r}, which uses {engine!r}; the '
                "outbox needs PostgreSQL",
                hint=f"List only PostgreSQL aliases (ENGINE \"{POSTGRESQL}\") in "
                     f'XJOBS["OUTBOX"]["DATABASES"]. See {DOCS_URL}transactional-enqueue.md'
                     "#the-relay",
                id="xjobs.E021",
            ))
    routers = getattr(django_settings, "DATABASE_ROUTERS", [])
    named = {r if isinstance(r, str) else f"{type(r).__module__}.{type(r).__qualname__}"
             for r in routers}
    errors.extend(_check_shards(settings, named))
    if (settings.database != "default" and settings.database in connections.settings
            and ROUTER not in named and not settings.shards):
        errors.append(checks.Warning(
            f'XJOBS["DATABASE"] = {settings.database!r} but {ROUTER} is not in '
            "DATABASE_ROUTERS: migrate will not put the job tables (only) there, and the "
            "admin and ORM reads of them will go to 'default'",
            hint=f'Add DATABASE_ROUTERS = ["{ROUTER}"] to your settings. See {DOCS_URL}'
                 "transactional-enqueue.md#a-separate-jobs-database-the-router",
            id="xjobs.W020",
        ))
    return errors


# ------------------------------------------------------------------------------ end outbox --


def _raw() -> Any:
    return getattr(django_settings, "XJOBS", None)


# ------------------------------------------------------------------------ concurrency slots --


def check_concurrency(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A job declared with ``Concurrency(limit=None)`` needs XJOBS["CONCURRENCY_LIMITS"] to give
    every key its template can make a limit, or its every enqueue would be refused."""

    try:
        settings = conf.build(_raw())
    except ConfigurationError:
        return []  # check_settings reports it
    errors: list[checks.CheckMessage] = []
    for name, definition in sorted(registry.all_jobs().items()):
        concurrency = slots.concurrency_of(definition)
        if concurrency is None or concurrency.limit is not None:
            continue
        # Every key of the template starts with its literal prefix; a settings prefix covers
        # them all only if it is a prefix of that.
        if not any(concurrency.prefix.startswith(p) for p, _ in settings.concurrency_limits):
            errors.append(checks.Error(
                f"job {name!r}: Concurrency(key={concurrency.key!r}) has no limit, and no "
                f'prefix of XJOBS["CONCURRENCY_LIMITS"] covers its keys (they start with '
                f"{concurrency.prefix!r})",
                hint="Give it Concurrency(..., limit=N), or add a prefix of "
                     f'{concurrency.prefix!r} to XJOBS["CONCURRENCY_LIMITS"]. See '
                     f"{DOCS_URL}concurrency.md#limits-from-settings",
                id="xjobs.E040",
            ))
    return errors


# ------------------------------------------------------------------------------ scheduler --


def check_schedule(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Scheduled tasks: every XJOBS["SCHEDULE"] entry parses (a cron expression in its
    timezone, or an interval), names a registered job (the registry is complete by now:
    AppConfig.ready imported every jobs.py) and has a JSON input that fits it, positional
    ``args`` included; no name is taken twice. ``@job(cron=...)`` and ``@job(every=...)`` are
    judged when decorated."""
    try:
        conf.build(_raw())
    except ConfigurationError:
        return []  # check_settings reports it

    _, problems = collect()
    return [checks.Error(p.message, hint=SCHEDULE_HINTS[p.id], id=p.id) for p in problems]


# The fix for each kind of schedule mistake (the ids of scheduler/schedule.py).
SCHEDULE_HINTS = {
    "xjobs.E010": "Use 5 fields (minute hour day-of-month month day-of-week, e.g. \"0 3 * * *\"), "
                  "6 with the seconds first, or @yearly, @monthly, @weekly, @daily, @hourly. See "
                  f"{DOCS_URL}scheduling.md#cron-syntax",
    "xjobs.E011": 'Use an IANA timezone name such as "Europe/Paris" or "UTC". See '
                  f"{DOCS_URL}scheduling.md#timezones-and-daylight-saving-time",
    "xjobs.E012": 'Name a registered job: "<app label>.<function name>" of a @job in an '
                  "installed app's jobs.py, or the name given to @job(name=...). See "
                  f"{DOCS_URL}guide.md#jobs",
    "xjobs.E013": 'Give "input" as a dict of the job\'s keyword arguments that JSON can encode, '
                  f'within XJOBS["MAX_PAYLOAD_BYTES"]. See {DOCS_URL}scheduling.md',
    "xjobs.E014": 'Give the XJOBS["SCHEDULE"] entry another name, or remove cron= (or every=) '
                  f"from the @job. See {DOCS_URL}scheduling.md",
    "xjobs.E015": 'Give "every" as a timedelta, seconds or a string such as "45s", from 1 second '
                  f"to 366 days. See {DOCS_URL}scheduling.md#intervals",
}


def check_job_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """With XJOBS["QUEUES"] given, a job whose queue it does not list runs only on a worker
    started with --queue for it: say so at startup rather than let its jobs wait unseen."""
    try:
        settings = conf.build(_raw())
    except ConfigurationError:
        return []  # check_settings reports it

    by_queue: dict[str, list[str]] = {}
    for name, queue in registry.unworked_jobs(settings).items():
        by_queue.setdefault(queue, []).append(name)
    return [
        checks.Warning(
            f"queue {queue!r} (jobs {', '.join(names)}) is not in XJOBS['QUEUES'] "
            f"{list(settings.queues)}: a worker started without --queue never runs these jobs",
            hint=f"Add {queue!r} to XJOBS['QUEUES'], or run xjobs_worker --queue {queue}. "
                 f"See {DOCS_URL}guide.md#the-worker",
            id="xjobs.W010",
        )
        for queue, names in sorted(by_queue.items())
    ]


def register() -> None:
    checks.register(check_settings, "django_xjobs")
    checks.register(check_console, checks.Tags.admin)
    checks.register(check_job_queues, "django_xjobs")
    checks.register(check_concurrency, "django_xjobs")
    checks.register(check_schedule, "django_xjobs")
    checks.register(check_backfills, "django_xjobs")


# ------------------------------------------------------------------------------ backfills --


def check_backfills(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A backfill's batches commit with their progress row in one transaction, so a backfill
    must write to the alias of the job tables. One that does not is a warning, not an error: it
    cannot run (start and run refuse it, writing nothing), but the rest of the project can."""
    try:
        settings = conf.build(_raw())
    except ConfigurationError:
        return []  # check_settings reports it
    if settings.database not in connections.settings:
        return []  # check_settings reports that first (xjobs.E002)

    errors: list[checks.CheckMessage] = []
    for _name, definition in sorted(all_backfills().items()):
        try:
            check_alias(definition)
        except ConfigurationError as exc:
            errors.append(checks.Warning(
                str(exc),
                hint="A backfill must write where the job tables are: set "
                     f'XJOBS["DATABASE"] to {definition.using!r} (the x_ tables move there), '
                     f"or declare it with @backfill(..., using={settings.database!r}). See "
                     f"{DOCS_URL}backfills.md#options",
                id="xjobs.W050",
            ))
    return errors

