"""``manage.py xjobs_backfill``: start, watch, cancel and resume backfill passes.

    manage.py xjobs_backfill start NAME [--batch-size N] [--throttle 100ms]
    manage.py xjobs_backfill start NAME --dry-run [--batches N]   run here, roll back, report
    manage.py xjobs_backfill --list [--name N] [--status S] [--run-id ID] [--limit N]
    manage.py xjobs_backfill show RUN_ID       progress, rate, and an ETA with a total() hook
    manage.py xjobs_backfill cancel RUN_ID     stop after the current batch (cursor kept)
    manage.py xjobs_backfill retry RUN_ID      resume a failed or cancelled pass from its cursor

Every form takes ``--json``. Thin: the work is in ``django_xjobs/backfills/``.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from ... import backfills, registry
from ...backfills.definition import count_total, parse_throttle
from ...backfills.registry import get as get_backfill
from ...exceptions import ConfigurationError
from ...records import BACKFILL_STATUSES, BackfillRecord
from .. import cli

LIST_ONLY = ("name", "status", "run_id", "limit")


def _preview(value: Any, limit: int = 24) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _throttle(value: str) -> float:
    try:
        return parse_throttle("--throttle", value)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(cli.XJobsCommand):
    help = "Backfill passes: start (or --dry-run), --list, show, cancel, retry."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--list", action="store_true",
                            help="list passes, newest first (also what no action does)")
        parser.add_argument("--name", help="--list: only passes of this backfill")
        parser.add_argument("--status", choices=BACKFILL_STATUSES,
                            help="--list: only passes in this status")
        parser.add_argument("--run-id", help="--list: only the pass with this run id")
        parser.add_argument("--limit", type=int, help="--list: at most this many (default 50)")
        sub = parser.add_subparsers(dest="action", metavar="ACTION")
        start = sub.add_parser("start", help="start a pass of a backfill")
        start.add_argument("backfill", metavar="NAME")
        start.add_argument("--batch-size", type=int, help="rows per batch (ctx.batch_size)")
        start.add_argument("--throttle", type=_throttle,
                           help="pause between batches, e.g. 100ms (default: the backfill's, "
                                "else XJOBS['BACKFILL_THROTTLE'])")
        start.add_argument("--dry-run", action="store_true",
                           help="run batches in this process and roll each one back: nothing "
                                "is written")
        start.add_argument("--batches", type=int, default=1,
                           help="--dry-run: how many batches to run (default 1)")
        show = sub.add_parser("show", help="one pass: progress, rate, ETA")
        show.add_argument("run", metavar="RUN_ID")
        cancel = sub.add_parser("cancel", help="cancel a pass (it stops after its current batch)")
        cancel.add_argument("run", metavar="RUN_ID")
        retry = sub.add_parser("retry", help="resume a failed or cancelled pass from its cursor")
        retry.add_argument("run", metavar="RUN_ID")
        for p in (start, show, cancel, retry):
            cli.add_json_flag(p)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options.get("action")
        as_json = options["json"]
        if action is not None:
            given = [f"--{k.replace('_', '-')}" for k in LIST_ONLY if options.get(k) is not None]
            if options["list"] or given:
                raise cli.usage_error(
                    f"{', '.join(given) or '--list'} only go(es) with --list, not with {action}"
                )
        with cli.command_errors():
            if action is None:
                self._list(options, as_json)
            elif action == "start":
                self._start(options, as_json)
            elif action == "show":
                self._show(backfills.get_pass(options["run"]), as_json)
            elif action == "cancel":
                self._cancel(backfills.cancel(options["run"]), as_json)
            elif action == "retry":
                self._retry(backfills.retry(options["run"]), as_json)

    # ---------------------------------------------------------------------------------------
    def _start(self, options: dict[str, Any], as_json: bool) -> None:
        name = options["backfill"]
        if options["dry_run"]:
            if options["throttle"] is not None:
                raise cli.usage_error("--throttle has no meaning for --dry-run")
            report = backfills.dry_run(name, batch_size=options["batch_size"],
                                       batches=options["batches"])
            self._dry_run(report, as_json)
            return
        if options["batches"] != 1:
            raise cli.usage_error("--batches only goes with --dry-run")
        handle = backfills.start(name, batch_size=options["batch_size"],
                                 throttle=options["throttle"])
        definition = get_backfill(name)
        queues = registry.worked_queues()
        if as_json:
            cli.emit(self, {"name": handle.name, "run_id": handle.run_id, "job_id": handle.job_id,
                        "created": handle.created, "queue": definition.queue,
                        "queue_in_settings": definition.queue in queues})
            return
        if handle.created:
            self.stdout.write(f"started backfill {name}: run {handle.run_id} (job "
                              f"{handle.job_id}, queue {definition.queue!r})")
        else:
            self.stdout.write(f"a pass of {name} is already live: run {handle.run_id} (job "
                              f"{handle.job_id}); nothing was started")
        self.stdout.write(f"  follow it: manage.py xjobs_backfill show {handle.run_id}")
        if definition.queue not in queues:
            self.stdout.write(
                f"  note: queue {definition.queue!r} is not in XJOBS['QUEUES'] "
                f"{list(queues)}: the pass runs only on a worker started with "
                f"--queue {definition.queue}"
            )

    def _dry_run(self, report: backfills.DryRunReport, as_json: bool) -> None:
        total, total_error = count_total(get_backfill(report.name))
        seconds = sum(b.seconds for b in report.batches)
        if as_json:
            cli.emit(self, {"name": report.name, "batch_size": report.batch_size,
                        "rows": report.rows, "finished": report.finished,
                        "stalled": report.stalled, "total": total,
                        "total_error": total_error, "seconds": seconds,
                        "batches": [{"cursor": b.cursor, "next_cursor": b.next_cursor,
                                     "processed": b.processed, "seconds": b.seconds}
                                    for b in report.batches]})
            return
        self.stdout.write(f"dry run of {report.name} (batch size {report.batch_size}); every "
                          "batch was rolled back, nothing was written:")
        for n, b in enumerate(report.batches, start=1):
            self.stdout.write(f"  batch {n}: cursor {_preview(b.cursor)} -> "
                              f"{_preview(b.next_cursor)}, {b.processed} rows, "
                              f"{b.seconds * 1000:.1f} ms")
        rate = f", {report.rows / seconds:,.0f} rows/s" if seconds > 0 and report.rows else ""
        self.stdout.write(f"  {len(report.batches)} batch(es), {report.rows} rows{rate}")
        if report.finished:
            self.stdout.write("  the pass would end with the last of these batches")
        elif report.stalled:
            self.stdout.write(
                "  stopped: a batch returned the cursor it was given. In a dry run the writes "
                "are undone, so a backfill that finds its rows by what it already changed sees "
                "the same rows again; a keyset cursor (the last id) does not have this problem"
            )
        else:
            self.stdout.write("  more batches to go (--batches N runs more)")
        if total is not None:
            self.stdout.write(f"  total(): {total:,} rows")
        elif total_error:
            self.stdout.write(f"  total(): unavailable: {total_error}")

    def _list(self, options: dict[str, Any], as_json: bool) -> None:
        rows = backfills.list_passes(name=options["name"], status=options["status"],
                                     run_id=options["run_id"],
                                     limit=50 if options["limit"] is None else options["limit"])
        if as_json:
            cli.emit(self, [cli.record_dict(r) for r in rows])
            return
        if not rows:
            self.stdout.write("(no backfill passes)")
            return
        header = ("run_id", "name", "status", "rows", "cursor", "started", "finished", "job")
        table = [header] + [
            (str(r.run_id), r.name, r.status, f"{r.rows_processed:,}", _preview(r.last_cursor),
             _when(r.started_at), _when(r.completed_at),
             f"{r.job_state} #{r.job_attempt}" if r.job_state else "gone")
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for n, row in enumerate(table):
            self.stdout.write("  ".join(
                cell.rjust(w) if header[i] == "rows" else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip())
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))

    def _show(self, record: BackfillRecord, as_json: bool) -> None:
        progress = backfills.progress(record)
        if as_json:
            cli.emit(self, {**cli.record_dict(record), "progress": cli.record_dict(progress)})
            return
        job = (f"{record.job_id} ({record.job_state}, attempt {record.job_attempt})"
               if record.job_state else f"{record.job_id} (gone)")
        lines = [
            ("run_id", str(record.run_id)), ("name", record.name), ("status", record.status),
            ("rows_processed", f"{record.rows_processed:,}"),
        ]
        if progress.total is not None:
            share = f" ({progress.fraction:.1%})" if progress.fraction is not None else ""
            lines.append(("total", f"{progress.total:,}{share}"))
        elif progress.total_error:
            lines.append(("total", f"unavailable: {progress.total_error}"))
        if progress.rate is not None:
            lines.append(("rate", f"{progress.rate:,.0f} rows/s (average since the pass "
                                  "began)"))
        if progress.eta is not None:
            at = f" (about {_when(progress.eta_at)})" if progress.eta_at else ""
            lines.append(("eta", f"{cli.duration(progress.eta)}{at}"))
        lines += [
            ("last_cursor", json.dumps(record.last_cursor, default=str)),
            ("started_at", _when(record.started_at)),
            ("updated_at", _when(record.updated_at)),
            ("completed_at", _when(record.completed_at)),
            ("job", job),
            ("checksum", (record.checksum or "-")[:16]),
            ("app_version", record.app_version or "-"),
        ]
        for key, value in lines:
            self.stdout.write(f"{key:>16}: {value}")
        for change in record.code_changes:
            self.stdout.write(
                f"{'code changed':>16}: at {change.get('at')}, after "
                f"{change.get('rows_processed')} rows: checksum "
                f"{str(change.get('checksum'))[:16]}, app version {change.get('app_version')!r}"
            )
        if record.error:
            self.stdout.write(f"{'error':>16}:\n{record.error}")

    def _cancel(self, change: backfills.PassChange, as_json: bool) -> None:
        record = change.record
        if as_json:
            cli.emit(self, {"action": "cancel", "changed": change.changed, "reason": change.reason,
                        "pass": cli.record_dict(record)})
            return
        if change.changed:
            self.stdout.write(
                f"cancel: pass {record.run_id} ({record.name}) is now cancelled at "
                f"{record.rows_processed:,} rows; a running pass stops after its current batch "
                f"(resume it: manage.py xjobs_backfill retry {record.run_id})"
            )
        else:
            self.stdout.write(f"cancel: pass {record.run_id} ({record.name}) unchanged: "
                              f"{change.reason}")

    def _retry(self, handle: backfills.PassHandle, as_json: bool) -> None:
        record = backfills.get_pass(handle.run_id)
        if as_json:
            cli.emit(self, {"action": "retry", "run_id": handle.run_id, "job_id": handle.job_id,
                        "changed": handle.created, "pass": cli.record_dict(record)})
            return
        self.stdout.write(
            f"retry: pass {record.run_id} ({record.name}) resumes from cursor "
            f"{json.dumps(record.last_cursor, default=str)} at {record.rows_processed:,} rows "
            f"(job {handle.job_id})"
        )
