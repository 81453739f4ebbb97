"""What operators (and the admin console) ask of the scheduler: describe, pause, resume,
trigger. Each runs on the caller's connection, like every operator action (api.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .. import api, clock, conf
from ..engines import get_engine
from ..exceptions import UnknownTask
from ..records import LeaderRecord, SchedulerStateRecord
from . import cron, interval, leadership
from .schedule import Task, configured


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskInfo:
    """One task as operators see it. ``configured`` False: a state row whose task is no longer
    declared (its watermark is kept; a task of that name declared again resumes from it)."""

    name: str
    job: str | None
    cron: str | None  # None: an interval task (every), or not configured
    timezone: str | None  # a cron task's
    misfire: str | None
    source: str | None  # "job" | "settings"
    configured: bool
    paused: bool
    watermark: datetime | None  # occurrences up to here have been handled
    next_fire_at: datetime | None  # None: paused, or not configured
    updated_at: datetime | None
    # Overlap (docs/scheduling.md, "Overlap"): the policy, how many occurrences it did not
    # enqueue (skipped, dropped behind a buffered run, superseded), and the latest of them.
    overlap: str | None = None
    overlap_skipped: int = 0
    overlap_skipped_at: datetime | None = None
    # An interval task's period in seconds (docs/scheduling.md, "Intervals"), and either kind
    # as an operator reads it: the cron expression, or "every 45s".
    every: float | None = None
    schedule: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleOverview:
    tasks: list[TaskInfo]
    leader: LeaderRecord | None  # None: nobody leads (no scheduler running)
    mode: str  # XJOBS["LEADER"]
    now: datetime | None = None  # the moment the next fires are counted from


def _info(task: Task | None, name: str, state: SchedulerStateRecord | None,
          now: datetime) -> TaskInfo:
    paused = bool(state and state.paused)
    watermark = state.last_fired_at if state else None
    next_fire = None
    if task is not None and not paused:
        next_fire = task.schedule.next_after(max(now, watermark) if watermark else now)
    cron_schedule = task.schedule if task and isinstance(task.schedule, cron.CronSchedule) \
        else None
    every = task.schedule if task and isinstance(task.schedule, interval.IntervalSchedule) \
        else None
    return TaskInfo(
        name=name, job=task.job if task else None,
        cron=cron_schedule.expression if cron_schedule else None,
        timezone=cron_schedule.timezone if cron_schedule else None,
        every=every.every.total_seconds() if every else None,
        schedule=task.schedule.text if task else None,
        misfire=task.misfire if task else None, source=task.source if task else None,
        configured=task is not None, paused=paused, watermark=watermark,
        next_fire_at=next_fire, updated_at=state.updated_at if state else None,
        overlap=task.overlap if task else None,
        overlap_skipped=state.overlap_skipped if state else 0,
        overlap_skipped_at=state.overlap_skipped_at if state else None,
    )


def describe(*, now: datetime | None = None) -> ScheduleOverview:
    """Every task (configured, or with a state row) and the current leader; the next fires
    from ``now``, by default the database's (the rounds' clock, not this machine's)."""
    engine = get_engine()
    now = now or engine.db_now()
    tasks = configured()
    states = {s.task_name: s for s in engine.scheduler_states_list()}
    names = sorted(set(tasks) | set(states))
    mode = conf.get().leader
    return ScheduleOverview(
        tasks=[_info(tasks.get(n), n, states.get(n), now) for n in names],
        leader=leadership.current_leader(engine, mode), mode=mode, now=now,
    )


def task(name: str) -> Task:
    tasks = configured()
    try:
        return tasks[name]
    except KeyError:
        raise UnknownTask(
            f"no cron task named {name!r}; configured: {sorted(tasks) or 'none'}"
        ) from None


def _set_paused(name: str, paused: bool) -> TaskInfo:
    found = task(name)
    # On the database's clock, the rounds' (docs/scheduling.md, "Operating"): the statement
    # moves the watermark to its now(), which it returns as updated_at.
    state = get_engine().scheduler_state_set_paused(name, paused)
    return _info(found, name, state, state.updated_at)


def pause(name: str) -> TaskInfo:
    """Stop firing ``name``. Rounds keep moving its watermark, so nothing is owed later."""
    return _set_paused(name, True)


def resume(name: str) -> TaskInfo:
    """Fire ``name`` again from now on; the paused stretch is never replayed."""
    return _set_paused(name, False)


def trigger(name: str, *, enqueued_by: str | None = None) -> api.JobHandle:
    """Enqueue ``name``'s job now, beside its schedule (its watermark is not touched).

    Keyed ``cron:<task>:trigger:<now ISO>``; ``enqueued_by`` defaults to ``cron:<task>`` (the
    console passes ``admin:<username>``).
    """
    found = task(name)
    at = clock.now()
    key = cron.occurrence_key(f"{name}:trigger", at)
    return api.enqueue(found.job, dict(found.input), idempotency_key=key,
                       enqueued_by=enqueued_by or found.enqueued_by, **found.enqueue_options)
