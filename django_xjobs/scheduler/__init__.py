"""The cron scheduler (docs/scheduling.md).

* ``cron.py`` — occurrences, misfire policies, DST (pure);
* ``leadership.py`` — leader election, lease row or advisory lock (its docstring: the protocol);
* ``runner.py`` — the round, the worker duty, and maintenance on the leader;
* ``schedule.py`` — the configured tasks (``@job(cron=...)`` and ``XJOBS["SCHEDULE"]``);
* ``options.py`` — the ``@job`` options; ``operations.py`` — what operators call.

The operator API, importable from here::

    from django_xjobs import scheduler

    scheduler.describe()          # ScheduleOverview: tasks (next fire, watermark, paused), leader
    scheduler.pause("nightly"); scheduler.resume("nightly"); scheduler.trigger("nightly")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .operations import ScheduleOverview, TaskInfo, describe, pause, resume, trigger

__all__ = ["ScheduleOverview", "TaskInfo", "describe", "pause", "resume", "trigger"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # Imported on first use: operations imports croniter (tens of milliseconds), and every
        # process imports this package for the @job options (scheduler/options.py).
        from . import operations

        return getattr(operations, name)
    raise AttributeError(f"module 'django_xjobs.scheduler' has no attribute {name!r}")
