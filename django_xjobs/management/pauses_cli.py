"""``manage.py xjobs pause|resume|pause-key|resume-key|pauses``: the pauses' part of the
``xjobs`` command (docs/flow-control.md, "Pause and circuit breakers").

    manage.py xjobs pause QUEUE [--for 30m | --until ISO] [--reason R]
    manage.py xjobs resume QUEUE         (a UUID instead: a dead workflow, repair_cli.py)
    manage.py xjobs pause-key KEY (--for 10m | --until ISO) [--reason R]
    manage.py xjobs resume-key KEY       also hands back the jobs blocked on KEY
    manage.py xjobs pauses               the pauses in force

Every argument is checked before anything is written; a bad one ends the command with its
message and exit code 1.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime

from ..exceptions import ConfigurationError
from ..pauses import describe, parse_length, pause, pauses, resume_key, resume_queue
from ..records import PauseRecord
from . import cli

ACTIONS = ("pause", "resume", "pause-key", "resume-key", "pauses")


def add_arguments(sub: Any) -> list[Any]:
    """Add the subcommands; return the parsers that take ``--json``."""
    pause = sub.add_parser("pause", help="stop claiming from a queue (running jobs finish)")
    pause.add_argument("queue")
    pause_key = sub.add_parser("pause-key", help="hold back the jobs of a concurrency or "
                                                 "rate-limit key")
    pause_key.add_argument("key")
    for p, required in ((pause, False), (pause_key, True)):
        when = p.add_mutually_exclusive_group(required=required)
        when.add_argument("--for", dest="for_", metavar="DURATION",
                          help="how long, e.g. 30m, 2h (default for a queue: until resumed)")
        when.add_argument("--until", metavar="ISO",
                          help="until this ISO date-time with a time zone")
        p.add_argument("--reason", help="shown with the pause")
    resume = sub.add_parser(
        "resume", help="resume a dead workflow (a job id) or a paused queue",
        description="resume ID: a dead workflow, once the cause of its failure is fixed: its "
                    "failed child gets a fresh set of attempts and the workflow goes on from "
                    "its recorded steps (docs/durable.md). resume QUEUE: claim from a paused "
                    "queue again. An argument that reads as a UUID is a job id.")
    resume.add_argument("queue", metavar="ID_OR_QUEUE",
                        help="a dead workflow's job id (a UUID), or a paused queue's name")
    resume_key = sub.add_parser("resume-key", help="end a key's pause and hand back its "
                                                   "blocked jobs")
    resume_key.add_argument("key")
    listing = sub.add_parser("pauses", help="the pauses in force")
    listing.add_argument("--limit", type=int, default=1000)
    return [pause, pause_key, resume, resume_key, listing]


def handle(command: Any, action: str, options: dict[str, Any], as_json: bool) -> None:
    if action == "pauses":
        if options["limit"] < 1:
            raise cli.usage_error("--limit must be at least 1")
        _list(command, pauses(limit=options["limit"]), as_json)
    elif action == "pause":
        record = pause("queue", options["queue"], until=_until(options),
                              for_=_for(options), reason=options["reason"])
        _paused(command, record, as_json)
    elif action == "pause-key":
        record = pause("key", options["key"], until=_until(options),
                              for_=_for(options), reason=options["reason"])
        _paused(command, record, as_json)
    elif action == "resume":
        was = resume_queue(options["queue"])
        if as_json:
            cli.emit(command, {"action": "resume", "queue": options["queue"], "was_paused": was})
        else:
            command.stdout.write(f"resume: queue {options['queue']} "
                                 + ("resumed" if was else "was not paused (a dead workflow "
                                    "is resumed by its job id, a UUID)"))
    elif action == "resume-key":
        was, handed_back = resume_key(options["key"])
        if as_json:
            cli.emit(command, {"action": "resume-key", "key": options["key"], "was_paused": was,
                               "unblocked": handed_back})
        else:
            command.stdout.write(f"resume-key: key {options['key']} "
                                 + ("resumed" if was else "was not paused")
                                 + f"; {handed_back} blocked job(s) handed back")


def _for(options: dict[str, Any]) -> timedelta | None:
    """``--for`` as a duration (like ``purge --older-than``); more than zero."""
    if options.get("for_") is None:
        return None
    try:
        return timedelta(seconds=parse_length(options["for_"], what="--for"))
    except ConfigurationError as exc:
        raise cli.usage_error(str(exc)) from None


def _until(options: dict[str, Any]) -> datetime | None:
    """``--until`` as an aware datetime."""
    if options.get("until") is None:
        return None
    parsed = parse_datetime(options["until"])
    if parsed is None or parsed.tzinfo is None:
        raise cli.usage_error(f"--until: {options['until']!r} is not an ISO date-time with a "
                              "time zone (e.g. 2026-12-01T02:00:00Z)")
    return parsed


def pause_json(record: PauseRecord) -> dict[str, Any]:
    return cli.record_dict(record)


def _paused(command: Any, record: PauseRecord, as_json: bool) -> None:
    if as_json:
        cli.emit(command, {"action": "pause" if record.kind == "queue" else "pause-key",
                           "pause": pause_json(record)})
        return
    command.stdout.write(f"{'pause' if record.kind == 'queue' else 'pause-key'}: "
                         f"{record.kind} {record.key} is paused {describe(record)}")


def _list(command: Any, records: list[PauseRecord], as_json: bool) -> None:
    if as_json:
        cli.emit(command, [pause_json(r) for r in records])
        return
    if not records:
        command.stdout.write("(no pauses in force)")
        return
    table = [("kind", "queue or key", "until", "blocked jobs", "paused at", "reason")] + [
        (r.kind, r.key, r.until.isoformat(timespec="seconds") if r.until else "resumed",
         str(r.blocked) if r.kind == "key" else "-",
         r.paused_at.isoformat(timespec="seconds") if r.paused_at else "-", r.reason or "-")
        for r in records
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for n, row in enumerate(table):
        command.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths,
                                                                  strict=True)).rstrip())
        if n == 0:
            command.stdout.write("  ".join("-" * w for w in widths))
