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
    return errors


def _raw() -> Any:
    from django.conf import settings

    return getattr(settings, "XJOBS", None)


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


def register() -> None:
    checks.register(check_settings, "django_xjobs")
    checks.register(check_schedule, "django_xjobs")
