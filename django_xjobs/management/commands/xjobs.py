"""``manage.py xjobs``: queue stats and operator actions, each with ``--json`` for scripts.

    manage.py xjobs                       stats per queue (a bucket per state: each job in
                                          exactly one, blocked included)
    manage.py xjobs show ID               one job, its error and result, its progress (with
                                          an ETA) and its attempt history
    manage.py xjobs cancel ID [--reason]  stop a job (a running one stops at its next heartbeat)
    manage.py xjobs retry ID              dead/cancelled -> a fresh set of attempts, due now
    manage.py xjobs retry|cancel|delete --filter 'state=dead&queue=q' [--yes]
                                          every job a console filter matches (management/
                                          bulk_cli.py); without --yes, only the count
    manage.py xjobs run-now ID            delayed/suspended -> due now
    manage.py xjobs events [--name N]     recent published events
    manage.py xjobs purge --older-than 7d [--state done ...]
    manage.py xjobs slots [--key K]       concurrency slots held now: holder, expiry
    manage.py xjobs schedule [pause|resume|trigger NAME]   cron tasks and the leader
    manage.py xjobs pause QUEUE [--for 30m | --until ISO] [--reason R]   stop claiming a queue
    manage.py xjobs resume ID | QUEUE     a dead workflow once its cause is fixed (a job id,
                                          a UUID: repair_cli.py), or a paused queue
    manage.py xjobs pause-key KEY (--for 10m | --until ISO) [--reason R]
    manage.py xjobs resume-key KEY        and hand back the jobs blocked on KEY
    manage.py xjobs pauses                the pauses in force
    manage.py xjobs maintenance           run the retention deletes once
    manage.py xjobs check-deploy [--job NAME] [--limit N]   replay the suspended durable runs
                                          against this code; exit 1 if any would diverge
    manage.py xjobs fleet [--finish-upgrade | --compatible-with 0.1]   old and new versions
                                          side by side (docs/deployment.md, "Mixed versions")

and the operations console's views (``management/console_cli.py``): dashboard, health,
workers, jobs, why, steps, outbox, slots, backfills, scheduler, delete.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ... import api, conf, outbox, shards, slots
from ...console.reads import json_columns
from ...console.reads.jobs import job_row, run_children, run_steps
from ...console.reads.json_columns import shown_json
from ...console.reads.tables import event_rows, key_limits, slot_limits
from ...console.reads.text import error_summary
from ...engines import get_engine
from ...exceptions import ConfigurationError
from ...records import (
    TERMINAL_STATES,
    AttemptRecord,
    ChangeResult,
    ProgressRecord,
    SlotRecord,
    SlotUsage,
    attempt_history,
    progress_from_json,
)
from ...values import parse_duration
from .. import (
    bulk_cli,
    cli,
    console_cli,
    deploy_cli,
    fleet_cli,
    pauses_cli,
    repair_cli,
    schedule_cli,
)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f", oldest {seconds:.1f}s"
    if seconds < 7200:
        return f", oldest {seconds / 60:.0f}m"
    return f", oldest {seconds / 3600:.1f}h"


class Command(cli.XJobsCommand):
    help = "Job queue stats and operator actions (show, cancel, retry, run-now, purge)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--primary", action="store_true", help=console_cli.PRIMARY_HELP)
        cli.add_shard_flag(parser, top=True)
        sub = parser.add_subparsers(dest="action", metavar="ACTION")
        show = sub.add_parser("show", help="show one job")
        show.add_argument("job_id")
        cancel = sub.add_parser("cancel", help="cancel a job, or every job a --filter matches")
        cancel.add_argument("job_id", nargs="?")
        cancel.add_argument("--reason", help="recorded in last_error")
        bulk_cli.add_filter_arguments(cancel)
        retry = sub.add_parser("retry", help="retry a dead or cancelled job now, or every one "
                                             "a --filter matches")
        retry.add_argument("job_id", nargs="?")
        bulk_cli.add_filter_arguments(retry)
        run_now = sub.add_parser("run-now", help="make a delayed or suspended job due now")
        run_now.add_argument("job_id")
        events = sub.add_parser("events", help="recent published events, newest first")
        events.add_argument("--name", help="only events of this name")
        events.add_argument("--limit", type=int, default=50)
        purge = sub.add_parser("purge", help="delete finished jobs past an age")
        purge.add_argument("--older-than", required=True, help="e.g. 7d, 12h")
        purge.add_argument("--state", action="append", choices=TERMINAL_STATES,
                           help="finished state to delete (repeatable; default all three)")
        slots_cmd = sub.add_parser("slots", help="concurrency slots held now, per key")
        slots_cmd.add_argument("--key", help="only the slots of this key")
        slots_cmd.add_argument("--limit", type=int, default=1000)
        # The console's subcommands (dashboard, health, jobs, why, ...).
        console_parsers = console_cli.add_parsers(sub)
        for p in (show, cancel, retry, run_now, events, purge, slots_cmd, *console_parsers,
                  *schedule_cli.add_arguments(sub), *pauses_cli.add_arguments(sub),
                  *deploy_cli.add_arguments(sub),
                  *fleet_cli.add_arguments(sub)):
            cli.add_json_flag(p)
            cli.add_shard_flag(p)
        console_cli.add_primary_flags(sub)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options.get("action")
        as_json = options["json"]
        _refuse_nul(options)
        cli.check_job_ids(options)
        with cli.command_errors(), cli.on_shard(_shard(action, options)), \
                console_cli.report_reads(self, action, options):
            if action is None:
                self._stats(as_json)
            elif action == "show":
                self._show(job_row(options["job_id"], limit=None), as_json)
            elif action in bulk_cli.ACTIONS and bulk_cli.wants_filter(options):
                bulk_cli.handle(self, action, options, as_json)
            elif action == "cancel":
                # Who cancelled, as the console records it: the worker's log line names them.
                who, reason = bulk_cli.operator(), options["reason"]
                self._change("cancel", api.cancel(
                    options["job_id"], reason=f"{reason} ({who})" if reason else f"by {who}"),
                    as_json)
            elif action == "retry":
                self._change("retry", api.retry(options["job_id"]), as_json)
            elif action == "run-now":
                self._change("run-now", api.run_now(options["job_id"]), as_json)
            elif action == "events":
                self._events(event_rows(name=options["name"], limit=options["limit"]),
                             as_json)
            elif action == "purge":
                self._purge(options, as_json)
            elif action == "slots":
                if options["limit"] < 1:
                    raise cli.usage_error("--limit must be at least 1")
                self._slots(get_engine().slots_list(slot_key=options["key"],
                                                    limit=options["limit"]), as_json)
            elif action in schedule_cli.ACTIONS:
                schedule_cli.handle(self, options, as_json)
            elif action == "resume" and repair_cli.names_job(options["queue"]):
                repair_cli.handle(self, options, as_json)
            elif action in pauses_cli.ACTIONS:
                pauses_cli.handle(self, action, options, as_json)
            elif action in deploy_cli.ACTIONS:
                deploy_cli.handle(self, options, as_json)
            elif action in fleet_cli.ACTIONS:
                fleet_cli.handle(self, options, as_json)
            elif action in console_cli.ACTIONS:
                console_cli.run(self, action, options, as_json)

    # ---------------------------------------------------------------------------------------
    def _stats(self, as_json: bool) -> None:
        engine = get_engine()
        rows = engine.queue_stats()
        outbox = self._outbox_pending()
        pending, oldest = outbox["pending"], outbox["oldest_pending_seconds"]
        held = engine.slots_usage(limit=STATS_SLOT_KEYS + 1)
        limits = key_limits(u.slot_key for u in held[:STATS_SLOT_KEYS])
        settings = conf.get()
        if as_json:
            cli.emit(self, {
                **({"shard": settings.jobs_database} if settings.shards else {}),
                "queues": [{"queue": r.queue, **{c: getattr(r, c) for c in STATS_BUCKETS}}
                           for r in rows],
                "outbox": outbox,
                "slots": _slot_usage_json(held, limits),
            })
            return
        if settings.shards:
            self.stdout.write(f"shard {settings.jobs_database} (the shards: "
                              f"{', '.join(settings.shards)}; --shard ALIAS for another)\n")
        columns = ("queue", *STATS_BUCKETS)
        table = [columns] + [
            (r.queue, *(str(getattr(r, c)) for c in columns[1:])) for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
        for n, row in enumerate(table):
            self.stdout.write("  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ))
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))
        if not rows:
            self.stdout.write("(no jobs)")
        self.stdout.write(f"\noutbox: {pending} pending{_age(oldest)}")
        if len(outbox["databases"]) > 1:
            for alias, entry in outbox["databases"].items():
                self.stdout.write(f"  {alias}: {entry['pending']} pending"
                                  f"{_age(entry['oldest_pending_seconds'])}")
        self._slot_usage(held, limits)

    @staticmethod
    def _outbox_pending() -> dict[str, Any]:
        """Pending stagings over every outbox alias (XJOBS["OUTBOX"]["DATABASES"])."""

        summary = outbox.pending()
        return {"pending": summary.count, "oldest_pending_seconds": summary.oldest_seconds,
                "databases": {alias: {"pending": n, "oldest_pending_seconds": age}
                              for alias, (n, age) in summary.by_alias.items()}}

    def _show(self, job: Any, as_json: bool) -> None:
        """One job, read like its console page (JSON columns as text: a value Python cannot
        decode is printed as stored, with a note, instead of ending the command), then its
        progress and its attempt history (docs/observability.md)."""
        steps = run_steps(job.run_id, limit=None)
        children = run_children(job.run_id, limit=CHILDREN_SHOWN)
        attempts = attempt_history(job.attempts, state=job.state, attempt=job.attempt,
                                   worker=job.claimed_by, started_at=_aware(job.started_at),
                                   finished_at=_aware(job.finished_at))
        progress = progress_from_json(job.progress)
        now = get_engine().db_now()
        # An ETA only for the run that is under way and reported since it started.
        eta = progress.eta(_aware(job.started_at)) if (
            progress is not None and job.state == "running") else None
        if as_json:
            cli.emit(self, {
                **json_columns.as_json(job), "steps": json_columns.as_json(steps),
                "children": [{"step": step, "id": str(c.pk), "name": c.name, "state": c.state}
                             for step, c in children.shown],
                "children_total": children.total,
                "attempts": [{**cli.record_dict(a), "duration": a.duration} for a in attempts],
                "progress": None if progress is None else {
                    **cli.record_dict(progress), "fraction": progress.fraction,
                    "eta": cli.jsonable(eta),
                    "eta_seconds": (eta - now).total_seconds() if eta is not None else None,
                },
            })
            return
        fields = ("id", "name", "queue", "state", "attempt", "max_attempts", "priority",
                  "run_at", "created_at", "updated_at", "started_at", "finished_at",
                  "claimed_by", "tenant_id", "idempotency_key", "run_id", "enqueued_by",
                  "traceparent", "rescues", "concurrency_key", "parent_id", "parent_step")
        for name in fields:
            self.stdout.write(f"{name:>16}: {cli.jsonable(getattr(job, name))}")
        shown = shown_json(job, "input", limit=None)
        self.stdout.write(f"{'input':>16}: {console_cli.block(shown)}")
        result = shown_json(job, "result", limit=None)
        if result.text is not None:
            self.stdout.write(f"{'result':>16}: {console_cli.block(result)}")
        for line in repair_cli.dead_lines(job, steps):  # what failed, and what resumes it
            self.stdout.write(line)
        if job.last_error:
            self.stdout.write(f"{'last_error':>16}:\n{job.last_error}")
        if steps:
            self.stdout.write(f"\nsteps ({len(steps)}):")
            for step in steps:
                when = cli.jsonable(step.completed_at or step.wake_at or step.started_at)
                detail = ""
                if step.status == "completed":
                    detail = console_cli.preview(shown_json(step, "output", limit=None))
                elif step.status == "invoking":
                    detail = f"waiting for {step.pending} child job(s)"
                elif step.status in ("sleeping", "waiting"):
                    detail = f"until {cli.jsonable(step.wake_at)}" + (
                        f" for event {step.event!r}" if step.event else "")
                elif step.error:
                    detail = step.error.strip().splitlines()[-1]
                self.stdout.write(f"  {step.name:<24} {step.status:<10} attempts {step.attempts}"
                                  f"  {when}  {detail}")
        if children.total:
            self.stdout.write(f"\nchildren ({children.total}):")
            for step, child in children.shown:
                self.stdout.write(f"  {step:<24} {child.pk}  {child.state:<10} {child.name}")
            if children.total > len(children.shown):
                self.stdout.write(f"  ... {children.total - len(children.shown)} more")
        if progress is not None:
            self.stdout.write(f"\n{'progress':>16}: {_progress_text(progress)}")
            if eta is not None:
                left = (eta - now).total_seconds()
                self.stdout.write(f"{'eta':>16}: {_moment(eta)} "
                                  f"({'in ' + cli.duration(left) if left > 0 else 'due now'})")
        if attempts:
            self.stdout.write(f"\nattempts ({len(attempts)} kept):")
            self.stdout.write("\n".join(_timeline(attempts)))

    def _change(self, action: str, result: ChangeResult, as_json: bool) -> None:
        job = result.job
        assert job is not None
        if as_json:
            cli.emit(self, {"action": action, "changed": result.changed, "reason": result.reason,
                        "job": cli.record_dict(job)})
            return
        if result.changed:
            self.stdout.write(f"{action}: job {job.id} ({job.name}) is now {job.state}")
        else:
            self.stdout.write(f"{action}: job {job.id} ({job.name}) unchanged: {result.reason}")

    def _events(self, events: list[Any], as_json: bool) -> None:
        if as_json:
            cli.emit(self, json_columns.as_json(events))
            return
        if not events:
            self.stdout.write("(no events)")
        for e in events:
            key = f" key={e.correlation_key}" if e.correlation_key else ""
            self.stdout.write(f"{cli.jsonable(e.published_at)}  #{e.id} {e.name}{key}  "
                              f"{console_cli.preview(shown_json(e, 'payload', limit=None))}")

    def _purge(self, options: dict[str, Any], as_json: bool) -> None:
        try:
            age = parse_duration(options["older_than"], what="--older-than")
        except ConfigurationError as exc:
            raise cli.usage_error(str(exc)) from None
        states = tuple(options["state"] or TERMINAL_STATES)
        deleted = api.purge(older_than=timedelta(seconds=age), states=states)
        if as_json:
            cli.emit(self, {"deleted": deleted, "states": list(states), "older_than_seconds": age})
        else:
            self.stdout.write(f"purged {deleted} finished job(s) ({', '.join(states)}) older "
                              f"than {options['older_than']}")

    # ---------------------------------------------------------------- concurrency slots --
    def _slot_usage(self, held: list[SlotUsage], limits: dict[str, list[int]]) -> None:
        if not held:
            self.stdout.write("slots: none held")
            return
        self.stdout.write("\nslots held (key, held / limit: XJOBS['CONCURRENCY_LIMITS'], else the "
                          "job's Concurrency(limit=...)):")
        for usage in held[:STATS_SLOT_KEYS]:
            self.stdout.write(f"  {usage.slot_key}  {usage.held} / "
                              f"{_limit_text(limits.get(usage.slot_key, []))}")
        if len(held) > STATS_SLOT_KEYS:
            self.stdout.write("  ... more keys: manage.py xjobs slots")

    def _slots(self, records: list[SlotRecord], as_json: bool) -> None:
        limits = slot_limits((r.slot_key, r.holder) for r in records)
        if as_json:
            cli.emit(self, [_slot_json(r, limits[(r.slot_key, r.holder)]) for r in records])
            return
        if not records:
            self.stdout.write("(no slots held)")
            return
        table = [("key", "slot", "limit", "job", "worker", "expires in")] + [
            (r.slot_key, str(r.slot), _limit_text([limits[(r.slot_key, r.holder)]]),
             *slots.parse_holder(r.holder)[::2], f"{r.expires_in:.1f}s")
            for r in records
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for n, row in enumerate(table):
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths,
                                                                         strict=True)))
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))


STATS_SLOT_KEYS = 20  # keys the stats list; `xjobs slots` lists them all
# The stats' columns and JSON keys: a bucket per state, live ones first, each job in exactly one
# (docs/guarantees.md); the dashboard and the metrics count the live ones alike.
STATS_BUCKETS = ("ready", "delayed", "running", "suspended", "blocked", "dead", "done",
                 "cancelled")
CHILDREN_SHOWN = 50  # child jobs `xjobs show` lists; --json and the console say how many in all


def _shard(action: str | None, options: dict[str, Any]) -> str | None:
    """The shard the command works on: --shard; else, with the jobs sharded, the one holding
    the job a subcommand names (show, why, cancel ID, ...); else the home shard. The schedule's
    commands act on the home shard, where it fires."""
    settings = conf.get()
    given = cli.checked_shard(options.get("shard"))
    if action in schedule_cli.ACTIONS:
        if given not in (None, settings.home_database):
            raise cli.usage_error(f"--shard {given}: the schedule fires on the home shard "
                                  f"({settings.home_database}) only; its commands act there")
        return given
    job_id = options.get("job_id")
    if given is None and settings.shards and isinstance(job_id, str):
        return shards.locate(job_id)
    return given


def _aware(moment: datetime | None) -> datetime | None:
    """A time of the ORM's (naive in TIME_ZONE with USE_TZ = False) comparable with the aware
    times of the JSON columns."""
    if moment is None or timezone.is_aware(moment):
        return moment
    return timezone.make_aware(moment, timezone.get_default_timezone())


def _moment(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(sep=" ", timespec="seconds")


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def _progress_text(progress: ProgressRecord) -> str:
    """``40 of 100 (40.0%): copying rows, reported 2026-12-04 15:10:50+00:00``."""
    text = _number(progress.done)
    if progress.total is not None:
        text += f" of {_number(progress.total)}"
    if progress.fraction is not None:
        text += f" ({progress.fraction:.1%})"
    if progress.message:
        text += f": {progress.message}"
    return f"{text}, reported {_moment(progress.at)}"


def _timeline(attempts: list[AttemptRecord]) -> list[str]:
    """One line per kept run: its number and attempt (a run that suspended, snoozed or was
    handed back keeps its attempt: the next run has the same one), outcome, worker, start,
    duration, and the line of its error a person reads first (the console's). Only the first
    and the newest 20 runs are kept: a gap says so, and its runs have no number ("?")."""
    lines = []
    for n, a in enumerate(attempts):
        if n == 1 and a.run is None:
            lines.append("  ... runs not kept: only the first and the newest 20 are")
        error = error_summary(a.error, 120) or ""
        took = "-" if a.duration is None else (
            f"{a.duration:.2f}s" if a.duration < 10 else cli.duration(a.duration))
        run = "?" if a.run is None else a.run
        lines.append(f"  run {run:<3} attempt {a.attempt:<3} {a.outcome:<11} {a.worker or '-'}  "
                     f"{_moment(a.started_at)}  {took:>6}  {error}".rstrip())
    return lines


def _refuse_nul(options: dict[str, Any]) -> None:
    """PostgreSQL refuses NUL in text: an argument with one (possible through call_command,
    not a shell) is a clear error before any statement, not a database error mid-command."""
    for name, value in options.items():
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, str) and "\x00" in v for v in values):
            raise cli.usage_error(f"{name.replace('_', ' ')}: {value!r:.60} contains a NUL "
                                  "character, which no stored text can contain")


def _limit_text(limits: Iterable[int | None]) -> str:
    """``2``, ``2 or 3`` (jobs with different limits share the key), ``-`` (none known)."""
    known = sorted({n for n in limits if n is not None})
    return " or ".join(str(n) for n in known) if known else "-"


def _slot_json(record: SlotRecord, limit: int | None) -> dict[str, Any]:
    job_id, token, worker = slots.parse_holder(record.holder)
    return {"key": record.slot_key, "slot": record.slot, "limit": limit,
            "holder": record.holder, "job_id": job_id, "lease_token": token, "worker_id": worker,
            "expires_at": record.expires_at.isoformat(), "expires_in_seconds": record.expires_in}


def _slot_usage_json(held: list[SlotUsage],
                     limits: dict[str, list[int]]) -> list[dict[str, Any]]:
    # "limit": the one limit of the key's live slots (None: several, or none known);
    # "limits": all of them.
    out = []
    for u in held[:STATS_SLOT_KEYS]:
        found = limits.get(u.slot_key, [])
        out.append({"key": u.slot_key, "held": u.held, "limit": found[0] if len(found) == 1
                    else None, "limits": found, "next_expiry": u.next_expiry.isoformat()})
    return out
