"""System checks: a bad ``XJOBS`` setting stops ``runserver``, ``migrate`` and ``xjobs_worker``
at startup with a message that names the key, instead of surfacing in a worker at 3 a.m."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import connections

from . import conf
from .exceptions import ConfigurationError


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        settings = conf.build(_raw())
    except ConfigurationError as exc:
        return [checks.Error(
            str(exc), hint="See the Settings section of docs/guide.md", id="xjobs.E001"
        )]
    errors: list[checks.CheckMessage] = []
    if settings.database not in connections.settings:
        errors.append(checks.Error(
            f'XJOBS["DATABASE"] = {settings.database!r} is not in DATABASES',
            id="xjobs.E002",
        ))
    else:
        engine = connections.settings[settings.database].get("ENGINE", "")
        if "postgresql" not in engine and "postgis" not in engine:
            errors.append(checks.Error(
                f'XJOBS["DATABASE"] = {settings.database!r} uses {engine!r}; django-xjobs '
                "needs PostgreSQL for the job tables",
                id="xjobs.E003",
            ))
    errors.extend(_check_outbox(settings))
    return errors


# ---------------------------------------------------------------------------------- outbox --

ROUTER = "django_xjobs.routers.XJobsRouter"


def _check_outbox(settings: conf.XJobsSettings) -> list[checks.CheckMessage]:
    """Every outbox alias exists and is PostgreSQL; job tables off "default" need a router."""
    from django.conf import settings as django_settings

    errors: list[checks.CheckMessage] = []
    for alias in settings.outbox.databases:
        if alias not in connections.settings:
            errors.append(checks.Error(
                f'XJOBS["OUTBOX"]["DATABASES"] names {alias!r}, which is not in DATABASES',
                id="xjobs.E020",
            ))
            continue
        engine = connections.settings[alias].get("ENGINE", "")
        if "postgresql" not in engine and "postgis" not in engine:
            errors.append(checks.Error(
                f'XJOBS["OUTBOX"]["DATABASES"] names {alias!r}, which uses {engine!r}; the '
                "outbox needs PostgreSQL",
                id="xjobs.E021",
            ))
    routers = getattr(django_settings, "DATABASE_ROUTERS", [])
    named = {r if isinstance(r, str) else f"{type(r).__module__}.{type(r).__qualname__}"
             for r in routers}
    if (settings.database != "default" and settings.database in connections.settings
            and ROUTER not in named):
        errors.append(checks.Warning(
            f'XJOBS["DATABASE"] = {settings.database!r} but {ROUTER} is not in '
            "DATABASE_ROUTERS: migrate will not put the job tables (only) there, and the "
            "admin and ORM reads of them will go to 'default'",
            hint=f'DATABASE_ROUTERS = ["{ROUTER}"]; see docs/transactional-enqueue.md',
            id="xjobs.W020",
        ))
    return errors


# ------------------------------------------------------------------------------ end outbox --


def _raw() -> Any:
    from django.conf import settings

    return getattr(settings, "XJOBS", None)


# ------------------------------------------------------------------------ concurrency slots --


def check_concurrency(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A job declared with ``Concurrency(limit=None)`` needs XJOBS["CONCURRENCY_LIMITS"] to give
    every key its template can make a limit, or its every enqueue would be refused."""
    from . import registry, slots

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
                     "docs/concurrency.md",
                id="xjobs.E040",
            ))
    return errors


# ------------------------------------------------------------------------------ scheduler --


def check_schedule(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Cron tasks: every XJOBS["SCHEDULE"] entry parses in its timezone, names a registered
    job (the registry is complete by now: AppConfig.ready imported every jobs.py) and has a
    JSON input; no name is taken twice. ``@job(cron=...)`` is judged when decorated."""
    try:
        conf.build(_raw())
    except ConfigurationError:
        return []  # check_settings reports it
    from .scheduler.tasks import collect

    _, problems = collect()
    return [checks.Error(p.message, hint="See docs/scheduling.md", id=p.id) for p in problems]


def check_job_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """With XJOBS["QUEUES"] given, a job whose queue it does not list runs only on a worker
    started with --queue for it: say so at startup rather than let its jobs wait unseen."""
    try:
        settings = conf.build(_raw())
    except ConfigurationError:
        return []  # check_settings reports it
    from . import registry

    by_queue: dict[str, list[str]] = {}
    for name, queue in registry.unworked_jobs(settings).items():
        by_queue.setdefault(queue, []).append(name)
    return [
        checks.Warning(
            f"queue {queue!r} (jobs {', '.join(names)}) is not in XJOBS['QUEUES'] "
            f"{list(settings.queues)}: a worker started without --queue never runs these jobs",
            hint=f"Add {queue!r} to XJOBS['QUEUES'], or run xjobs_worker --queue {queue}.",
            id="xjobs.W010",
        )
        for queue, names in sorted(by_queue.items())
    ]


def register() -> None:
    checks.register(check_settings, "django_xjobs")
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
    from . import backfills

    errors: list[checks.CheckMessage] = []
    for _name, definition in sorted(backfills.all_backfills().items()):
        try:
            backfills.check_alias(definition)
        except ConfigurationError as exc:
            errors.append(checks.Warning(str(exc), hint="See docs/backfills.md",
                                         id="xjobs.W050"))
    return errors

