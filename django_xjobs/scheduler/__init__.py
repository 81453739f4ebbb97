"""The scheduler: cron expressions and intervals (docs/scheduling.md).

* ``cron.py`` — occurrences, misfire policies, DST (pure);
* ``interval.py`` — interval occurrences, ``every=``, anchored at the Unix epoch (pure);
* ``leadership.py`` — leader election, lease row or advisory lock (its docstring: the protocol);
* ``runner.py`` — the round, the worker duty, and maintenance on the leader;
* ``schedule.py`` — the configured tasks (``@job(cron=...)`` and ``XJOBS["SCHEDULE"]``);
* ``options.py`` — the ``@job`` options; ``operations.py`` — what operators call;
* ``celery_beat.py`` — a Celery beat schedule as ``XJOBS["SCHEDULE"]`` entries, and ``crontab``.

The operator API, importable from here::

    from django_xjobs import scheduler

    scheduler.describe()          # ScheduleOverview: tasks (next fire, watermark, paused), leader
    scheduler.pause("nightly"); scheduler.resume("nightly"); scheduler.trigger("nightly")

and, for a settings module, ``from_celery_beat`` and ``crontab``::

    from django_xjobs.scheduler import crontab, from_celery_beat

    XJOBS = {"SCHEDULE": from_celery_beat({"nightly": {
        "task": "shop.tasks.report", "schedule": crontab(minute=0, hour=3)}})}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .celery_beat import crontab, from_celery_beat
    from .operations import ScheduleOverview, TaskInfo, describe, pause, resume, trigger

__all__ = ["ScheduleOverview", "TaskInfo", "crontab", "describe", "from_celery_beat", "pause",
           "resume", "trigger"]
_CELERY_BEAT = ("crontab", "from_celery_beat")


def __getattr__(name: str) -> Any:
    if name in _CELERY_BEAT:
        # Imported on first use, as operations is: most processes never read a beat schedule.
        from . import celery_beat

        return getattr(celery_beat, name)
    if name in __all__:
        # Imported on first use: operations imports croniter (tens of milliseconds), and every
        # process imports this package for the @job options (scheduler/options.py).
        from . import operations

        return getattr(operations, name)
    raise AttributeError(f"module 'django_xjobs.scheduler' has no attribute {name!r}")
