"""``XJobsRouter``: the job tables on ``XJOBS["DATABASE"]``, the outbox beside the app's data.

List it when the job tables live on an alias of their own::

    DATABASES = {"default": {...}, "jobs": {...}}
    DATABASE_ROUTERS = ["django_xjobs.routers.XJobsRouter"]
    XJOBS = {"DATABASE": "jobs"}

then ``manage.py migrate`` (for "default") and ``manage.py migrate --database jobs``. Each of
django-xjobs' tables is created where it belongs and nowhere else:

* ``x_outbox`` on every alias of ``XJOBS["OUTBOX"]["DATABASES"]`` (default: "default"), because
  ``enqueue_on_commit`` must write it in the same transaction as the business data;
* the seven job tables (``x_jobs``, steps, events, leases, scheduler, backfills) on
  ``XJOBS["DATABASE"]`` only, or on every alias of ``XJOBS["SHARDS"]`` when the jobs are
  sharded by tenant (``manage.py migrate --database <shard>`` for each: docs/scaling.md).
  Operations of django-xjobs' migrations that name no model (the ``RunSQL`` that tunes
  autovacuum on ``x_jobs``) concern the job tables, and go there too.

ORM reads and writes (the admin) of those models go to the jobs alias in use: the home one,
or the shard (or replica) the console chose for this request (``conf.using_database``). The
router has no opinion on any other app (it returns None), so it combines with a project's own
routers; put it first when another router would claim every model. It only routes: queue
writes never go through the ORM, they are the engine's statements on the alias the engine was
built for.
"""

from __future__ import annotations

from typing import Any

from . import conf

APP_LABEL = "django_xjobs"
OUTBOX_MODEL = "outboxentry"


def _settings() -> Any:
    return conf.get()


class XJobsRouter:
    """Routes django-xjobs' models: see the module docstring."""

    def _alias_of(self, model_name: str) -> str:
        settings = _settings()
        if model_name == OUTBOX_MODEL:
            return str(settings.outbox.databases[0])
        return str(settings.database)

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if model._meta.app_label != APP_LABEL:
            return None
        if model._meta.model_name == OUTBOX_MODEL:
            instance = hints.get("instance")
            db = getattr(getattr(instance, "_state", None), "db", None)
            if db in _settings().outbox.databases:
                return str(db)  # a row read from one outbox alias is saved back to it
        return self._alias_of(model._meta.model_name)

    db_for_write = db_for_read

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None  # django-xjobs' models have no relations

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None,
                      **hints: Any) -> bool | None:
        if app_label != APP_LABEL:
            return None
        settings = _settings()
        if model_name == OUTBOX_MODEL:
            return db in settings.outbox.databases
        return db in settings.job_databases
