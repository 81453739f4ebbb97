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


def register() -> None:
    checks.register(check_settings, "django_xjobs")
