"""The console's subcommands of ``manage.py xjobs``: everything the admin console shows, for a
terminal or a script (``--json``). The data comes from :mod:`django_xjobs.console.reads`, the
read model the admin pages render, so the two never disagree.

    manage.py xjobs dashboard              queues (live buckets + last 24 h), outbox,
                                           scheduler, workers, latest failures
    manage.py xjobs health [--queue Q ...] [--max-stall 5m]
                                           whether the workers make progress (exit status 1
                                           when not, 3 when the database is unreachable:
                                           management/workers_cli.py), then lapsed leases,
                                           rescues, table bloat and xid age, what holds
                                           VACUUM back
    manage.py xjobs workers [--max-stall 5m]
                                           the worker processes (x_workers), stalled or not
    manage.py xjobs jobs [--state S] [--queue Q] [--name N] [--tenant T]
                         [--created-after T] [--created-before T] [--run-after T]
                         [--run-before T] [--limit N]
    manage.py xjobs why ID                 what holds a job back now (every reason, most
                                           binding first), why it is where it is, what to do
    manage.py xjobs steps [--run-id ID] [--status S] [--limit N]
    manage.py xjobs outbox [--pending | --published] [--limit N]
    manage.py xjobs slots                  concurrency slots
    manage.py xjobs backfills              backfill passes with progress
    manage.py xjobs scheduler              the leader lease and every task's watermark
    manage.py xjobs delete ID [ID ...]     delete finished jobs (the console's delete action)

With a replica (``XJOBS["READ_DATABASE"]``) the reports (:data:`REPORTS`) read there while it
may serve, like the console's pages (:func:`report_reads`), and say on stderr where they read;
``--primary`` reads the primary. Every action stays on the primary, and so do ``why`` (it
decides before an action), ``health`` and ``workers`` (a liveness verdict: the workers' rows as
the primary has them now), ``schedule`` (an advisory leader is a lock of the primary's) and
``outbox`` (the outbox databases have no replica).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import DatabaseError
from django.utils.dateparse import parse_datetime

from .. import api, replica, why
from ..console.reads import json_columns
from ..console.reads.dashboard import Dashboard, LeaderRow, ScheduleRow, dashboard
from ..console.reads.health import BAD, Health, health
from ..console.reads.jobs import diagnose, job_row, jobs, run_steps
from ..console.reads.json_columns import ShownJson, shown_json, with_json_text
from ..console.reads.tables import backfill_rate, backfill_rows, outbox_entries
from ..console.reads.text import ago, db_now, error_summary, humanize_seconds
from ..models import JobStep
from ..records import ALL_STATES, BlockedBy, WorkerRecord
from . import bulk_cli, cli, workers_cli

# `xjobs slots` and `xjobs schedule` (the slots' and the scheduler's own commands) show the
# console's slot and scheduler pages.
ACTIONS = ("dashboard", "health", "workers", "jobs", "why", "steps", "outbox", "backfills",
           "delete")
# The subcommands of `manage.py xjobs` that only report, read on the replica when there is one
# (module docstring); None is the stats table of `manage.py xjobs` alone.
REPORTS = (None, "show", "events", "slots", "pauses", "dashboard", "jobs", "steps", "backfills")
PRIMARY_HELP = ("read the primary even when XJOBS['READ_DATABASE'] names a replica (the reports "
                "read the replica while it is no further behind than XJOBS['READ_MAX_LAG'])")


def add_primary_flags(sub: Any) -> None:
    """``--primary`` after each report's name too (``xjobs jobs --primary``), beside the
    command's own (``xjobs --primary jobs``)."""
    for name in REPORTS:
        if name is not None and name in sub.choices:
            sub.choices[name].add_argument("--primary", action="store_true",
                                           default=argparse.SUPPRESS, help=PRIMARY_HELP)


@contextmanager
def report_reads(command: Any, action: str | None, options: dict[str, Any]) -> Iterator[None]:
    """A report (:data:`REPORTS`) read on the replica of the jobs alias in use while it may
    serve (:func:`django_xjobs.replica.reads`), saying on stderr where it read; anything else,
    and any report with ``--primary``, on the primary. Silent without a replica."""
    if action not in REPORTS:
        yield
        return
    with replica.reads(enabled=not options.get("primary"),
                       primary_because="--primary") as source:
        if source.replica is not None:
            # Not in the error colour stderr has by default: a note, a warning when it fell back.
            command.stderr.write(source.line[:1].lower() + source.line[1:],
                                 style_func=command.style.WARNING if source.fell_back
                                 else lambda text: text)
        yield


def _when(value: str) -> datetime:
    parsed = parse_datetime(value)
    if parsed is None or parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO date-time with a time zone (e.g. 2026-12-01T02:00:00Z)")
    return parsed


def add_parsers(sub: Any) -> list[Any]:
    dashboard = sub.add_parser("dashboard", help="the console's dashboard")
    health = sub.add_parser(
        "health", help="exit 0 when the workers make progress, 1 with the reasons when not, 3 "
                       "when the database is unreachable; then the console's health panel",
        description="Whether the workers make progress (no worker stalled, every queue asked "
                    "with a worker that is not), then the console's health panel; 'overall' "
                    "is bad whenever the verdict is unhealthy.",
        epilog=workers_cli.EXIT_STATUS)
    workers_cli.add_health_arguments(health)
    workers = sub.add_parser("workers", help="the worker processes and whether they are "
                                             "stalled")
    workers_cli.add_workers_arguments(workers)
    parsers = [dashboard, health, workers]
    jobs = sub.add_parser("jobs", help="list jobs, newest first")
    jobs.add_argument("--state", choices=ALL_STATES)
    jobs.add_argument("--queue")
    jobs.add_argument("--name")
    jobs.add_argument("--tenant")
    jobs.add_argument("--worker", help="the worker that ran it last: its id, or a host")
    jobs.add_argument("--error", help="words of the last error (card declined)")
    jobs.add_argument("--search", metavar="TEXT",
                      help="what the console's search box takes: a job id, run id or key, "
                           "a value in the input (order_id=42), words of the input or error")
    for flag in ("--created-after", "--created-before", "--run-after", "--run-before"):
        jobs.add_argument(flag, type=_when, help="ISO date-time with a time zone")
    jobs.add_argument("--limit", type=int, default=50)
    why_cmd = sub.add_parser("why", help="what holds a job back now, why it is where it is, and "
                                         "what to do about it")
    why_cmd.add_argument("job_id")
    steps = sub.add_parser("steps", help="durable step records, newest first")
    steps.add_argument("--run-id")
    steps.add_argument("--status", choices=("completed", "failed", "sleeping", "waiting",
                                            "invoking", "cancelled"))
    steps.add_argument("--limit", type=int, default=50)
    outbox = sub.add_parser("outbox", help="staged outbox entries")
    which = outbox.add_mutually_exclusive_group()
    which.add_argument("--pending", action="store_true", help="only entries not relayed yet")
    which.add_argument("--published", action="store_true", help="only relayed entries")
    outbox.add_argument("--limit", type=int, default=50)
    delete = sub.add_parser("delete", help="delete finished jobs by id, or every one a "
                                           "--filter matches (live ones are kept)")
    delete.add_argument("job_ids", nargs="*")
    bulk_cli.add_filter_arguments(delete)
    parsers += [jobs, why_cmd, steps, outbox, delete,
                sub.add_parser("backfills", help="backfill passes and their progress")]
    return parsers


def run(command: Any, action: str, options: dict[str, Any], as_json: bool) -> None:
    out = _Out(command, as_json)
    if action == "dashboard":
        board = dashboard()
        out.emit(board, lambda: _print_dashboard(out, board))
    elif action == "health":
        _health(out, options)
    elif action == "workers":
        workers_cli.workers(out, options)
    elif action == "jobs":
        if options["limit"] < 1:
            raise cli.usage_error("--limit must be at least 1")
        listed = jobs(
            limit=options["limit"], state=options["state"], queue=options["queue"],
            name=options["name"], tenant_id=options["tenant"], worker=options["worker"],
            error=options["error"], search=options["search"],
            created_after=options["created_after"], created_before=options["created_before"],
            run_after=options["run_after"], run_before=options["run_before"])
        out.emit(listed, lambda: out.table(
            ("id", "state", "name", "queue", "attempt", "run_at", "updated_at", "tenant",
             "enqueued_by"),
            [(j.id, j.state, j.name, j.queue, f"{j.attempt}/{j.max_attempts}", j.run_at,
              j.updated_at, j.tenant_id, j.enqueued_by) for j in listed], empty="(no jobs)"))
    elif action == "why":
        _why(out, options["job_id"])
    elif action == "steps":
        qs = with_json_text(JobStep.objects.order_by("-id"), limit=None)
        if options["run_id"]:
            qs = qs.filter(run_id=_uuid(options["run_id"]))
        if options["status"]:
            qs = qs.filter(status=options["status"])
        steps_rows = list(qs[: options["limit"]])
        out.emit(steps_rows, lambda: out.table(
            ("run_id", "step", "status", "attempts", "started_at", "completed_at", "wake_at",
             "error"),
            [(s.run_id, s.name, s.status, s.attempts, s.started_at, s.completed_at, s.wake_at,
              error_summary(s.error, 60)) for s in steps_rows], empty="(no steps)"))
    elif action == "outbox":
        pending = True if options["pending"] else False if options["published"] else None
        entries = outbox_entries(pending=pending, limit=options["limit"])
        out.emit(entries, lambda: out.table(
            ("staged_at", "job", "queue", "published_at", "became job", "tenant"),
            [(o.staged_at, o.job, o.queue, o.published_at, o.job_id, o.tenant_id)
             for o in entries], empty="(no outbox entries)"))
    elif action == "backfills":
        backfills = backfill_rows()
        now = db_now()
        data = [{**json_columns.as_json(b), "rows_per_second": backfill_rate(b, now)}
                for b in backfills]
        out.emit(data, lambda: out.table(
            ("name", "status", "rows", "rows/s", "started_at", "completed_at", "last_cursor"),
            [(b.name, b.status, b.rows_processed, _rate(backfill_rate(b, now)),
              b.started_at, b.completed_at,
              preview(shown_json(b, "last_cursor", limit=None), 200))
             for b in backfills], empty="(no backfills)"))
    elif action == "delete" and bulk_cli.wants_filter(options):
        bulk_cli.handle(out.command, "delete", options, as_json)
    elif action == "delete":
        ids = [str(_uuid(i)) for i in options["job_ids"]]
        deleted = api.delete_finished(ids)
        out.emit({"deleted": deleted, "asked": len(ids)},
                 lambda: out.line(f"deleted {deleted} of {len(ids)} job(s); live jobs, and "
                                  "ids that match no job, are left alone"))


def _health(out: _Out, options: dict[str, Any]) -> None:
    """``xjobs health``: the workers' verdict (``--json``: under ``probe``), then the panel,
    whose workers are judged with the same ``--max-stall``; exit status 1 when the verdict is
    not healthy, 3 when the database is unreachable (workers_cli.EXIT_STATUS)."""
    max_stall = options["max_stall"]
    try:
        verdict = workers_cli.verdict(options["queues"], max_stall)
        panel = health(max_stall=max_stall)
    except DatabaseError as exc:
        missing = workers_cli.no_database(exc, max_stall)
        if missing is None:
            raise
        out.emit(missing.as_json(), lambda: None)  # the one line is the CommandError's
        missing.exit()
        return
    # The panel's own verdict (tables, VACUUM, lapsed leases, every worker) changes no exit
    # status; an unhealthy verdict makes the overall one bad, so the two never disagree.
    overall = panel.verdict if verdict.healthy else BAD

    def human() -> None:
        out.lines(verdict.lines())
        out.line()
        _print_health(out, panel, overall)

    out.emit({**json_columns.as_json(panel), "overall": overall, "probe": verdict.as_json()}, human)
    verdict.exit()


def _why(out: _Out, job_id: str) -> None:
    """``xjobs why ID``: what the job does now, one line per reason that holds it back (most
    binding first), then the console's reading of the row. ``--json``: ``{id, state,
    blocked_by, summary, job, diagnosis}``."""
    job = job_row(job_id, limit=None)
    reasons = why.for_job(job.id)
    now = db_now()
    steps = run_steps(job.run_id, limit=None)
    lines = diagnose(job, steps, now, reasons=reasons)
    doing = why.summary(job, reasons, now)
    head = f"job {job.id} ({job.name}): {doing}"
    out.emit({"id": job.id, "state": job.state,
              "blocked_by": [reason_json(r) for r in reasons],
              "summary": doing, "job": job, "diagnosis": lines},
             lambda: out.lines([head, *(f"  {r.text}" for r in reasons), "", *lines]))


def reason_json(reason: BlockedBy) -> dict[str, Any]:
    """One reason for ``--json``: its fields and its sentence."""
    return {**json_columns.as_json(reason), "text": reason.text}


def _uuid(value: str) -> Any:
    try:
        return UUID(value)
    except ValueError:
        raise cli.usage_error(f"{value!r} is not a job id (a UUID)") from None


def preview(shown: ShownJson, limit: int = 60) -> str:
    """A JSON column on one line of a table: compact, cut at ``limit`` characters."""
    if shown.text is None:
        return "null"
    if not shown.decoded:
        return f"(could not be decoded: {shown.problem}) {shown.text[:limit]}..."
    text = json.dumps(shown.value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# How much of a JSON value Python cannot decode `xjobs show` prints (the whole is in --json).
RAW_JSON_CHARS = 1_000


def block(shown: ShownJson) -> str:
    """A JSON column as ``xjobs show`` prints it: indented, or the stored text (its first
    :data:`RAW_JSON_CHARS` characters) with a note when Python cannot decode it."""
    if shown.text is None:
        return "null"
    if shown.decoded:
        return shown.text
    part = (f"; its first {RAW_JSON_CHARS:,} of {shown.chars:,} characters as stored, the "
            "whole with --json" if shown.chars > RAW_JSON_CHARS else "; as stored")
    return f"(could not be decoded: {shown.problem}{part})\n{shown.text[:RAW_JSON_CHARS]}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


class _Out:
    def __init__(self, command: Any, as_json: bool) -> None:
        self.command = command
        self.as_json = as_json

    def emit(self, data: Any, human: Any) -> None:
        if self.as_json:
            self.command.stdout.write(json.dumps(json_columns.as_json(data), indent=2,
                                                 default=str))
        else:
            human()

    def lines(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.line(text)

    def line(self, text: str = "") -> None:
        self.command.stdout.write(text)

    # Columns left-aligned, two spaces apart, None as "-": what scripts and
    # tests/integration/test_console_commands.py read. tabulate pads columns differently even
    # when told to align left; rich sizes tables to the terminal.
    def table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
              empty: str = "(none)") -> None:
        cells = [[_cell(v) for v in row] for row in rows]
        if not cells:
            self.line(empty)
            return
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        self.line("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
        self.line("  ".join("-" * w for w in widths))
        for r in cells:
            self.line("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)


def _print_dashboard(out: _Out, board: Dashboard) -> None:
    now = board.now
    out.line(f"as of {_cell(now)} (database clock)\n")
    out.table(("queue", "ready", "delayed", "running", "suspended", "blocked", "oldest due",
               "done 24h", "failed 24h", "died 24h", "cancelled 24h"),
              [(q.queue, q.ready, q.delayed, q.running, q.suspended, q.blocked,
                humanize_seconds(q.oldest_ready_age), q.done_24h, q.failed_24h,
                q.dead_24h, q.cancelled_24h) for q in board.queues],
              empty="(no jobs)")
    age = board.outbox_oldest_seconds
    out.line(f"\noutbox: {board.outbox_pending} pending"
             + (f", oldest {humanize_seconds(age)}" if age is not None else ""))
    out.line("")
    _print_scheduler(out, board.leaders, board.schedules, now)
    out.line("")
    _print_workers(out, board.workers, now)
    out.line("\nlatest failures:")
    out.table(("died", "id", "name", "queue", "attempt", "error"),
              [(ago(f.at, now), f.id, f.name, f.queue, f"{f.attempt}/{f.max_attempts}",
                f.error) for f in board.failures], empty="(no dead jobs)")


def _print_scheduler(out: _Out, leaders: Sequence[LeaderRow],
                     tasks: Sequence[ScheduleRow], now: datetime) -> None:
    for leader in leaders:
        state = "leading" if leader.live else "EXPIRED"
        out.line(f"scheduler leader ({leader.lock_key}): {leader.holder}, lease "
                 f"{ago(leader.expires_at, now)} ({state})")
    if not leaders:
        out.line("scheduler leader: none yet")
    out.table(("task", "schedule", "last fired (watermark)", "next fire", "paused"),
              [(t.task, t.schedule or "-", t.last_fired_at, t.next_fire_at,
                "yes" if t.paused else "no")
               for t in tasks], empty="(no cron tasks)")


def _print_workers(out: _Out, rows: Sequence[WorkerRecord], now: datetime) -> None:
    out.line("workers (x_workers):")
    out.table(("worker", "queues", "running", "finished", "heartbeat", "last claim", "status"),
              [(w.id, ",".join(w.queues), f"{w.running}/{w.concurrency}", w.finished,
                ago(w.seen_at, now), ago(w.claimed_at, now),
                f"STALLED: {w.stalled}" if w.stalled else "ok") for w in rows],
              empty="(no worker seen in the last day)")


def _print_health(out: _Out, health: Health, overall: str) -> None:
    now = health.now
    out.line(f"overall: {overall}\n")
    out.line(f"running jobs whose lease expired: {health.lapsed_count}")
    out.table(("expired", "id", "name", "queue", "worker", "attempt"),
              [(ago(j.at, now), j.id, j.name, j.queue, j.claimed_by,
                f"{j.attempt}/{j.max_attempts}") for j in health.lapsed], empty="")
    out.line(f"\njobs no worker knows (waiting for a worker that knows their name): "
             f"{sum(u.wait.count for u in health.unknown)}")
    out.table(("name", "queue", "jobs", "waiting since", "verdict", "expected as"),
              [(u.wait.name, u.wait.queue, u.wait.count, ago(u.wait.since, now),
                u.verdict, u.expected) for u in health.unknown], empty="")
    r = health.rescues
    out.line(f"\nrescues: {r.live_jobs} live job(s) rescued ({r.live_rescues} rescues); "
             f"{r.finished_jobs} finished in the last hour after a rescue "
             f"({r.finished_rescues} rescues, {r.lease_lost_dead} died of a lost lease)")
    for name, n in r.by_name:
        out.line(f"  {name}: {n}")
    out.line("\ntables:")
    out.table(("table", "live", "dead", "dead %", "last vacuum", "xid age", "of freeze max",
               "verdict"),
              [(t.health.table, t.health.live_tuples, t.health.dead_tuples,
                f"{t.health.dead_ratio:.0%}", ago(t.health.last_vacuum, now),
                t.health.xid_age, f"{t.health.xid_age / t.health.freeze_max_age:.0%}",
                f"{t.verdict} {t.advice}".strip()) for t in health.tables])
    c = health.compatibility
    if c is not None and health.held_back:
        out.line(f"\nmixed versions: the fleet is kept compatible with {c.compatible_with} "
                 f"(set {ago(c.changed_at, now)} by {c.changed_by}); held back until "
                 "`manage.py xjobs fleet --finish-upgrade`:")
        for line in health.held_back:
            out.line(f"  - {line}")
    out.line("\nhistory tables (finished jobs, newest day first):")
    out.table(("table", "rows (estimate)", "size"),
              [(h.table, h.rows, f"{h.size_bytes // 1024:,} kB") for h in health.history],
              empty="(none yet: finished jobs are still in x_jobs)")
    out.line("\nwhat holds VACUUM back (oldest first):")
    out.table(("kind", "who", "pid", "state", "open for", "xmin age", "verdict"),
              [(h.holder.kind, h.holder.name, h.holder.pid, h.holder.state,
                humanize_seconds(h.holder.age_seconds), h.holder.xmin_age,
                f"{h.verdict} {h.advice}".strip()) for h in health.holders],
              empty="(nothing holds an old snapshot)")
    if health.horizon_cost:
        out.line(f"  what it costs the queue now: {health.horizon_cost}")
