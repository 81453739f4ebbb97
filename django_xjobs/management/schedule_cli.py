"""``manage.py xjobs schedule [pause|resume|trigger NAME]`` and ``manage.py xjobs maintenance``:
the scheduler's part of the ``xjobs`` command (kept here so that command stays one screen)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .. import clock, scheduler
from ..maintenance import pruner
from . import cli

ACTIONS = ("schedule", "maintenance")


def add_arguments(sub: Any) -> list[Any]:
    """Add the subcommands; return the parsers that take ``--json``."""
    schedule = sub.add_parser("schedule", help="scheduled tasks (cron and every): next fire "
                                               "time, watermark, leader; pause / resume / "
                                               "trigger one")
    actions = schedule.add_subparsers(dest="schedule_action", metavar="ACTION")
    parsers = [schedule]
    for name, text in (("pause", "stop firing a task (its watermark keeps moving)"),
                       ("resume", "fire a paused task again, from now on"),
                       ("trigger", "enqueue a task's job now, beside its schedule")):
        p = actions.add_parser(name, help=text)
        p.add_argument("task")
        parsers.append(p)
    parsers.append(sub.add_parser(
        "maintenance", help="run the retention deletes once (finished jobs, expired events, "
                            "published outbox rows, expired slots)"))
    return parsers


def handle(command: Any, options: dict[str, Any], as_json: bool) -> None:
    if options["action"] == "maintenance":
        _maintenance(command, as_json)
        return

    action = options.get("schedule_action")
    if action is None:
        _list(command, scheduler.describe(), as_json)
        return
    if action == "trigger":
        handle_ = scheduler.trigger(options["task"])
        if as_json:
            cli.emit(command, {"action": "trigger", "task": options["task"],
                           "job_id": str(handle_.id), "created": handle_.created})
        else:
            command.stdout.write(f"trigger: task {options['task']} enqueued job {handle_.id}")
        return
    info = scheduler.pause(options["task"]) if action == "pause" else scheduler.resume(
        options["task"])
    if as_json:
        cli.emit(command, {"action": action, "task": _task_dict(info)})
    else:
        state = ("paused" if info.paused
                 else f"active; next fire {_when(info.next_fire_at)}")
        command.stdout.write(f"{action}: task {info.name} is now {state}")


def _task_dict(info: Any) -> dict[str, Any]:
    return {name: getattr(info, name) for name in info.__dataclass_fields__}


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).isoformat(timespec="seconds")


def _skipped(info: Any) -> str:
    """How many occurrences the task's overlap policy did not enqueue, and the latest."""
    if not info.overlap_skipped:
        return "-"
    return f"{info.overlap_skipped} ({_when(info.overlap_skipped_at)})"


def _list(command: Any, overview: Any, as_json: bool) -> None:
    leader = overview.leader
    if as_json:
        cli.emit(command, {
            "mode": overview.mode,
            "leader": None if leader is None else {
                name: getattr(leader, name) for name in leader.__dataclass_fields__},
            "tasks": [_task_dict(t) for t in overview.tasks],
        })
        return
    # "schedule": a cron task's expression (in its timezone), an interval task's "every 45s".
    columns = ("task", "job", "schedule", "timezone", "misfire", "overlap", "state", "watermark",
               "next fire", "skipped (last)")
    rows = [columns] + [
        (t.name, t.job or "-", t.schedule or "-", t.timezone or "-", t.misfire or "-",
         t.overlap or "-",
         "paused" if t.paused else ("active" if t.configured else "not configured"),
         _when(t.watermark), _when(t.next_fire_at), _skipped(t))
        for t in overview.tasks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for n, row in enumerate(rows):
        command.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths,
                                                                       strict=True)).rstrip())
        if n == 0:
            command.stdout.write("  ".join("-" * w for w in widths))
    if not overview.tasks:
        command.stdout.write("(no cron tasks)")
    if leader is None:
        command.stdout.write(f"\nleader ({overview.mode}): none (no scheduler is running)")
    elif leader.mode == "advisory":
        command.stdout.write(f"\nleader (advisory): {leader.holder} (backend pid {leader.pid})")
    else:
        # On the database's clock, as the lease is (describe() read it).
        now = overview.now or clock.now()
        left = (leader.expires_at - now).total_seconds() if leader.expires_at else 0
        status = f"lease expires in {left:.1f}s" if leader.live else "lease EXPIRED"
        command.stdout.write(f"\nleader (lease): {leader.holder} ({status})")


def _maintenance(command: Any, as_json: bool) -> None:
    report = pruner.run_once()
    if as_json:
        cli.emit(command, {"jobs": dict(report.jobs), "archived": report.archived,
                           "history_tables_dropped": list(report.days),
                           "events": report.events, "outbox": report.outbox,
                           "slots": report.slots})
    else:
        command.stdout.write(f"maintenance: {report.summary()}")
